"""The RL loop: supervised warm-up, then GRPO with routing replay, writing a RoutingTrace.

One GRPO step:
1. rollout: `prompts_per_step` prompts, `group_size` sampled responses each, by a bf16 copy of the
   policy (the "inference engine"; `rollout_dtype`), routers in RECORD;
2. rewards from the task verifiers; advantages relative to each prompt's group,
   A = (r - mean_group) / (std_group + 1e-6) (0 for a group whose rewards are all equal);
3. training: the N sequences are cut into `micro_batches` micro-batches (gradient accumulation,
   one optimizer step per RL step); each micro-batch's forward replays the recorded expert ids
   (REPLAY_FORWARD) and the ids its routers dispatched with are checked, token by token, against
   the record (a ReplayMismatchError otherwise); the loss is PPO's clipped surrogate against the
   rollout's log-probabilities, averaged over all response tokens of the step, plus the
   load-balancing loss;
4. the step's recorded routing, per micro-batch and simulated source rank, goes into the trace.

No KL penalty and no reference model (as in DAPO); one policy update per rollout batch, so the
ratio differs from one only by rollout-versus-training numerics (bf16 rollout, fp32 training).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from relibra.errors import ConfigError
from relibra.progress import progress as tqdm
from relibra.progress import write as progress_write
from relibra.rl.capture import build_trace, src_rank_of_sequences
from relibra.rl.model import MoEPolicy, PolicyConfig
from relibra.rl.replay import (RouterReplayAction, check_replay, own_agreement, set_action, set_replay_data,
                               used_ids)
from relibra.rl.rollout import Rollout, generate
from relibra.rl.tasks import DOMAINS, EOS_ID, PAD_ID, check_domains, domain_of, encode, sample_tasks
from relibra.trace import RoutingTrace


ROLLOUT_DTYPES = ("bfloat16", "float32")


@dataclass(frozen=True)
class RLConfig:
    """Every knob of a run; the defaults are the shipped trace's run (except `steps`, see the CLI)."""

    steps: int = 40  # GRPO steps, each one step of the trace
    seed: int = 0
    domains: tuple[str, ...] = DOMAINS
    prompts_per_step: int = 32
    group_size: int = 8  # responses per prompt
    micro_batches: int = 8  # per step; must divide prompts_per_step x group_size
    ep: int = 4  # simulated EP source ranks; must divide sequences per micro-batch and num_experts
    warmup_steps: int = 300  # supervised steps before RL
    warmup_batch: int = 64
    warmup_lr: float = 3e-3
    lr: float = 5e-4
    clip_eps: float = 0.2
    aux_loss_coeff: float = 0.01
    max_new_tokens: int = 7  # longest response ("[ABCD]") plus EOS
    temperature: float = 1.0
    grad_clip: float = 1.0
    shuffle_sequences: bool = False  # permute a step's sequences before cutting micro-batches
    eval_prompts: int = 128  # greedy evaluation before and after RL (0 = none)
    rollout_dtype: str = "bfloat16"  # the rollout engine's copy of the policy: "bfloat16" or "float32"
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    @property
    def sequences_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    def validate(self) -> None:
        self.policy.validate()
        check_domains(self.domains)
        for name in ("steps", "prompts_per_step", "group_size", "micro_batches", "ep", "warmup_batch",
                     "max_new_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"rl: {name} must be positive, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_prompts"):
            if getattr(self, name) < 0:
                raise ConfigError(f"rl: {name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "warmup_lr", "temperature", "grad_clip", "clip_eps"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                raise ConfigError(f"rl: {name} must be positive and finite, got {getattr(self, name)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"rl: the seed must be an integer >= 0, got {self.seed!r}")
        if self.rollout_dtype not in ROLLOUT_DTYPES:
            raise ConfigError(f"rl: rollout_dtype must be one of {', '.join(ROLLOUT_DTYPES)}, got {self.rollout_dtype!r}")
        if self.aux_loss_coeff < 0:
            raise ConfigError(f"rl: aux_loss_coeff must be >= 0, got {self.aux_loss_coeff}")
        if self.group_size < 2:
            raise ConfigError("rl: group_size must be at least 2 (advantages are relative to the group)")
        n = self.sequences_per_step
        if n % self.micro_batches:
            raise ConfigError(f"rl: micro_batches={self.micro_batches} does not divide the {n} sequences of a step "
                              f"(prompts_per_step x group_size)")
        if (n // self.micro_batches) % self.ep:
            raise ConfigError(f"rl: ep={self.ep} does not divide the {n // self.micro_batches} sequences of a "
                              f"micro-batch")
        if self.policy.num_experts % self.ep:
            raise ConfigError(f"rl: ep={self.ep} does not divide num_experts={self.policy.num_experts}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["domains"] = list(self.domains)
        return d


@dataclass
class RLResult:
    """What a run produced: the trace, one metrics dict per GRPO step, and greedy evaluations."""

    trace: RoutingTrace
    history: list[dict]
    eval_before: dict
    eval_after: dict
    warmup_loss: float
    seconds: float


# ---- pieces --------------------------------------------------------------------------------------
def group_advantages(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """GRPO advantages: float [N] from rewards [N] laid out prompt-major (group_size per prompt)."""
    r = rewards.reshape(-1, group_size)
    adv = (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, keepdims=True) + 1e-6)
    return adv.reshape(-1)


def _pad_batch(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (inputs int64 [B, T], targets int64 [B, T], input mask bool [B, T]) for full sequences."""
    t = max(len(s) for s in seqs) - 1
    tokens = torch.full((len(seqs), t + 1), PAD_ID, dtype=torch.long)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) - 1 for s in seqs])
    return tokens[:, :-1], tokens[:, 1:], torch.arange(t)[None, :] < lengths[:, None]


def warmup(model: MoEPolicy, cfg: RLConfig, rng: np.random.Generator, progress: bool = True) -> float:
    """Supervised fine-tuning on reference responses so RL starts with rewards above zero.

    Returns the mean cross-entropy (nats per response token) of the last 20 steps.
    """
    if cfg.warmup_steps == 0:
        return float("nan")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.warmup_lr, weight_decay=0.0)
    set_action(model.replays, None)
    losses = []
    for _ in tqdm(range(cfg.warmup_steps), desc="warm-up", disable=not progress, leave=False):
        tasks = sample_tasks(rng, cfg.warmup_batch, cfg.domains)
        seqs = [encode(t.prompt) + encode(t.reference) + [EOS_ID] for t in tasks]
        inputs, targets, in_mask = _pad_batch(seqs)
        prompt_len = torch.tensor([len(t.prompt) for t in tasks])
        loss_mask = in_mask & (torch.arange(inputs.shape[1])[None, :] >= (prompt_len - 1)[:, None])
        logits, aux = model.forward_train(inputs, in_mask)
        ce = F.cross_entropy(logits[loss_mask], targets[loss_mask])
        opt.zero_grad()
        (ce + cfg.aux_loss_coeff * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(float(ce.detach()))
    return float(np.mean(losses[-20:]))


def evaluate(model: MoEPolicy, prompts: list[str], max_new_tokens: int) -> dict:
    """Greedy responses' mean reward, overall and per domain, and the share fully correct."""
    if not prompts:
        return {}
    ro = generate(model, prompts, max_new_tokens, greedy=True, record=False)
    domains = np.array([domain_of(p) for p in prompts])
    out = {"reward": float(ro.rewards.mean()), "solved": float((ro.rewards == 1.0).mean())}
    for d in dict.fromkeys(domains):
        out[f"reward_{d}"] = float(ro.rewards[domains == d].mean())
    return out


def micro_batch_order(cfg: RLConfig, rng: np.random.Generator) -> np.ndarray:
    """Sequence indices of each micro-batch: int64 [micro_batches, sequences per micro-batch]."""
    n = cfg.sequences_per_step
    order = rng.permutation(n) if cfg.shuffle_sequences else np.arange(n)
    return order.reshape(cfg.micro_batches, n // cfg.micro_batches)


def train_step(model: MoEPolicy, opt: torch.optim.Optimizer, ro: Rollout, advantages: np.ndarray,
               mb_sequences: np.ndarray, cfg: RLConfig, step: int) -> tuple[dict, list[tuple[np.ndarray, np.ndarray]]]:
    """One GRPO update with routing replay over the micro-batches `mb_sequences` [M, n_mb].

    Returns (metrics, per micro-batch (token_experts [tokens, L, K], token_src_rank [tokens])).
    """
    replays = model.replays
    in_mask_all = ro.input_mask
    resp_mask_all = ro.response_mask
    total_resp_tokens = int(resp_mask_all.sum())
    src_of_seq = src_rank_of_sequences(mb_sequences.shape[1], cfg.ep)
    adv = torch.from_numpy(advantages).float()
    captured, agree, gaps, clipped, auxes = [], [], [], [], []
    opt.zero_grad()
    for m, idx in enumerate(mb_sequences):
        length = int(ro.seq_len[idx].max()) - 1
        in_mask_np = in_mask_all[idx, :length]
        in_mask = torch.from_numpy(in_mask_np)
        resp_mask = torch.from_numpy(resp_mask_all[idx, :length])
        inputs = ro.sequences[idx, :length]
        targets = ro.sequences[idx, 1:length + 1]
        recorded = ro.routing[idx, :length][in_mask_np]  # [tokens, L, K], the order the forward routes them
        set_action(replays, RouterReplayAction.REPLAY_FORWARD)
        set_replay_data(replays, torch.from_numpy(recorded.astype(np.int64)))
        logits, aux = model.forward_train(inputs, in_mask)
        check_replay(recorded, used_ids(replays).numpy(), where=f"step {step} micro-batch {m}")
        agree.append(own_agreement(replays))
        set_action(replays, None)

        logp = torch.log_softmax(logits, dim=-1).gather(2, targets[..., None]).squeeze(2)
        old = ro.old_logprobs[idx, :length]
        ratio = torch.exp(logp - old)
        a = adv[idx][:, None]
        surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * a)
        pg_loss = -(surrogate * resp_mask).sum() / total_resp_tokens
        (pg_loss + cfg.aux_loss_coeff * aux / len(mb_sequences)).backward()
        with torch.no_grad():
            gaps.append(float((logp - old).abs()[resp_mask].max()))
            clipped.append(float(((ratio - 1).abs() > cfg.clip_eps)[resp_mask].float().mean()))
            auxes.append(float(aux.detach()))
        tokens_per_seq = ro.seq_len[idx] - 1
        captured.append((recorded, np.repeat(src_of_seq, tokens_per_seq)))
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
    opt.step()
    metrics = {"own_routing_agreement": float(np.mean(agree)), "max_logprob_gap": float(np.max(gaps)),
               "clip_fraction": float(np.mean(clipped)), "aux_loss": float(np.mean(auxes)), "grad_norm": grad_norm}
    return metrics, captured


def rollout_engine(model: MoEPolicy, dtype: str) -> MoEPolicy:
    """The policy as the rollout engine runs it: the training weights, synced into `dtype`.

    RL systems sample with an inference engine (vLLM, SGLang) in bf16 while training keeps fp32
    master weights, so the two can route a token differently; that is why routing is replayed.
    With "float32" the rollout uses the training model itself.
    """
    if dtype == "float32":
        return model
    return copy.deepcopy(model).to(getattr(torch, dtype))


# ---- the run -------------------------------------------------------------------------------------
def run_rl(cfg: RLConfig, progress: bool = True, log=None) -> RLResult:
    """Warm up, run `cfg.steps` GRPO steps, and return the trace and the metrics.

    Deterministic by `cfg.seed` (for a fixed torch thread count): the weights, the prompts, the
    samples and the micro-batch order each draw from their own generator seeded from it.
    `log(str)` receives one line per step (default: beside the progress bar when progress is on).
    """
    cfg.validate()
    start = time.perf_counter()
    if log is None:
        log = progress_write if progress else (lambda _line: None)
    seeds = np.random.SeedSequence(cfg.seed).spawn(6)
    init_gen = torch.Generator().manual_seed(int(seeds[0].generate_state(1)[0]))
    sample_gen = torch.Generator().manual_seed(int(seeds[1].generate_state(1)[0]))
    warm_rng, prompt_rng, eval_rng, order_rng = (np.random.default_rng(s) for s in seeds[2:])

    model = MoEPolicy(cfg.policy, generator=init_gen)
    warmup_loss = warmup(model, cfg, warm_rng, progress)
    eval_set = [t.prompt for t in sample_tasks(eval_rng, cfg.eval_prompts, cfg.domains)]
    eval_before = evaluate(model, eval_set, cfg.max_new_tokens)
    if eval_before:
        log(f"after warm-up (loss {warmup_loss:.3f}): greedy reward {eval_before['reward']:.3f}, "
            f"solved {eval_before['solved']:.3f}")

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    history, steps = [], []
    bar = tqdm(range(cfg.steps), desc="GRPO", disable=not progress)
    for step in bar:
        t0 = time.perf_counter()
        tasks = sample_tasks(prompt_rng, cfg.prompts_per_step, cfg.domains)
        prompts = [t.prompt for t in tasks for _ in range(cfg.group_size)]  # prompt-major groups
        ro = generate(rollout_engine(model, cfg.rollout_dtype), prompts, cfg.max_new_tokens, sample_gen,
                      cfg.temperature)
        adv = group_advantages(ro.rewards, cfg.group_size)
        metrics, captured = train_step(model, opt, ro, adv, micro_batch_order(cfg, order_rng), cfg, step)
        steps.append(captured)
        row = {"step": step, "reward": float(ro.rewards.mean()), "solved": float((ro.rewards == 1.0).mean()),
               "response_tokens": int(ro.response_mask.sum()), "routed_tokens": int(ro.input_mask.sum()),
               **metrics, "seconds": time.perf_counter() - t0}
        history.append(row)
        bar.set_postfix(reward=f"{row['reward']:.3f}")
        log(f"step {step:3d}  reward {row['reward']:.3f}  solved {row['solved']:.3f}  "
            f"routing agreement {row['own_routing_agreement']:.4f}  logprob gap {row['max_logprob_gap']:.1e}")
    eval_after = evaluate(model, eval_set, cfg.max_new_tokens)
    if eval_after:
        log(f"after RL: greedy reward {eval_after['reward']:.3f}, solved {eval_after['solved']:.3f}")

    provenance = {
        "generator": "relibra.rl",
        "description": "routing recorded by GRPO rollouts of a tiny MoE policy and replayed in training",
        "seed": cfg.seed,
        "config": cfg.to_dict(),
        "reward_per_step": [round(h["reward"], 6) for h in history],
        "own_routing_agreement_per_step": [round(h["own_routing_agreement"], 6) for h in history],
        "eval_before": eval_before,
        "eval_after": eval_after,
        "micro_batch_layout": "contiguous sequences per micro-batch, then contiguous blocks of "
                              "sequences per src rank" + (" (sequences shuffled first)" if cfg.shuffle_sequences else ""),
    }
    trace = build_trace(steps, cfg.policy.model_shape(), cfg.ep, provenance)
    return RLResult(trace, history, eval_before, eval_after, warmup_loss, time.perf_counter() - start)
