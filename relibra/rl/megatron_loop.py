"""GRPO with the policy trained as a megatron-core GPTModel under megatron's DDP and optimizer, and
the balancer in the loop: rollout -> plan -> train, on `ep` gloo ranks (EP = every rank).

One GRPO step of one balancing policy, on every rank in lock step:
1. weight sync: the trained model's logical weights (dense parts, and every expert gathered from its
   home rank over the EP group) go into the rollout engine, a stock megatron-core GPTModel built from
   megatron's own local layer spec with EP 1 (every expert local) and megatron's RouterReplay on its
   routers;
2. rollout: `prompts_per_step` x `group_size` sampled responses (float32; no KV cache: each new token
   re-runs the packed sequences), rewards from the task verifiers, GRPO advantages; then one forward
   over the full sequences with every router in RouterReplay RECORD gives each input token's experts.
   Every rank runs the whole rollout from the same generator (a rollout engine replicated per rank),
   so every rank holds every token's routing without a gather;
3. planning: the recorded routing of the step, laid out as relibra.rl.capture lays it out (micro-batch
   m on rank g: sequences m * N/M + g * N/(M ep) ...), extends the run's RoutingTrace, and the
   balancing policy plans the step from it (relibra.policies; `megatron` = static placement);
4. training: the hook executes the plan (migration, replicas) and replays the recorded routing
   (before_microbatch with the record); each rank trains its sequences of each micro-batch, packed
   into one sequence with a block-diagonal causal mask; the loss is PPO's clipped surrogate against
   the rollout's log-probabilities, averaged over all response tokens of the step; then megatron's
   finish_grad_sync and optimizer step.
Both policies start from the same seed (same weights, prompts, samples), so as long as their training
steps agree their rollouts do too: rewards equal, losses equal within float32 reduction order (a
replica's gradient is added to its home's instead of summed with it in one GEMM).

No auxiliary load-balancing loss (megatron's router runs with load balancing type "none") and no
greedy evaluation; the supervised warm-up trains the same model under the static placement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from relibra.errors import ConfigError
from relibra.rl.capture import build_trace
from relibra.rl.grpo import RLConfig, group_advantages
from relibra.rl.tasks import EOS_ID, PAD_ID, decode, encode, reward, sample_tasks

TRAINERS = ("torch", "megatron")


@dataclass
class _MicroBatch:
    """This rank's sequences of one micro-batch, packed: ids / targets int [T], lengths per sequence,
    replay int [L, T, K], response mask bool [T], old log-probabilities float [T], advantages [T]."""

    ids: np.ndarray
    targets: np.ndarray
    lengths: list
    replay: np.ndarray | None
    response: np.ndarray
    old_logp: np.ndarray
    advantage: np.ndarray


def _model_config(cfg: RLConfig, replica_slots: int):
    from relibra.runtime.config import ModelConfig

    shape = cfg.policy.model_shape()
    return ModelConfig(shape, shape.num_layers, replica_slots, cfg.seed, "float32")


def _rollout_model(model_cfg, pgc_solo, max_tokens: int):
    """A stock megatron-core GPTModel (megatron's local layer spec, EP 1) of the logical model."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    from relibra.runtime import compat
    from relibra.runtime.model import transformer_config

    compat.apply()
    if parallel_state._GLOBAL_MEMORY_BUFFER is None:
        parallel_state._set_global_memory_buffer()
    spec = get_gpt_layer_local_spec(num_experts=model_cfg.num_experts, normalization="RMSNorm")
    return GPTModel(transformer_config(model_cfg), spec, vocab_size=model_cfg.shape.vocab_size,
                    max_sequence_length=max_tokens, position_embedding_type="rope", pg_collection=pgc_solo)


def _moe_layers(model) -> list:
    from megatron.core.transformer.moe.moe_layer import MoELayer

    return [m for m in model.modules() if isinstance(m, MoELayer)]


@torch.no_grad()
def sync_weights(trainer, rollout) -> None:
    """Logical weights of the trained model into the rollout engine: dense parameters by name, each
    expert from its home rank (an all-gather over the EP group)."""
    target = dict(rollout.named_parameters())
    for name, p in trainer.model.named_parameters():
        if "local_experts" not in name:
            target[name].copy_(p)
    hook = trainer.hook
    slots = hook.slots
    mine = hook.logical_expert_state("param")  # {(layer, expert): flat fc1 + fc2}
    keys = sorted(mine)
    flat = torch.tensor(np.stack([mine[k] for k in keys]), dtype=torch.float32)
    ids = torch.tensor([k[1] for k in keys], dtype=torch.int64)
    group = trainer.ep_group
    flats = [torch.empty_like(flat) for _ in range(group.size())]
    all_ids = [torch.empty_like(ids) for _ in range(group.size())]
    dist.all_gather(flats, flat, group=group)
    dist.all_gather(all_ids, ids, group=group)
    layers = _moe_layers(rollout)
    per_layer = slots.homes_per_rank
    for rank_flat, rank_ids in zip(flats, all_ids):
        for row, (vec, expert) in enumerate(zip(rank_flat, rank_ids.tolist())):
            mlp = layers[row // per_layer].experts.local_experts[expert]
            fc1, fc2 = mlp.linear_fc1.weight, mlp.linear_fc2.weight
            fc1.copy_(vec[: fc1.numel()].view_as(fc1))
            fc2.copy_(vec[fc1.numel():].view_as(fc2))


def _routers(model) -> list:
    return [m.router for m in _moe_layers(model)]


@torch.no_grad()
def rollout(model, prompts: list[str], cfg: RLConfig, generator: torch.Generator, chunk: int = 32):
    """Sample responses and record routing. Returns (sequences: list of int lists (prompt + response),
    prompt_len, old_logp: per sequence float [len - 1] (0 on prompt positions), routing: per sequence
    int [len - 1, L, K] recorded by megatron's RouterReplay, rewards float [N])."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    from relibra.runtime.megatron_train import packed_forward

    seqs = [encode(p) for p in prompts]
    prompt_len = [len(s) for s in seqs]
    logps = [[0.0] * (n - 1) for n in prompt_len]
    active = list(range(len(seqs)))
    for _ in range(cfg.max_new_tokens):
        if not active:
            break
        still = []
        for c in range(0, len(active), chunk):
            part = active[c: c + chunk]
            lengths = [len(seqs[i]) for i in part]
            logits = packed_forward(model, np.concatenate([seqs[i] for i in part]), lengths).double()
            last = logits[np.cumsum(lengths) - 1] / cfg.temperature  # [n, V]
            last[:, PAD_ID] = -1e9  # PAD is never a response token
            logp = torch.log_softmax(last, dim=-1)
            tokens = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
            for i, tok, row in zip(part, tokens.tolist(), logp):
                seqs[i].append(tok)
                logps[i].append(float(row[tok]))
                if tok != EOS_ID and len(seqs[i]) - prompt_len[i] < cfg.max_new_tokens:
                    still.append(i)
        active = still
    routers = _routers(model)
    routing = []
    for c in range(0, len(seqs), chunk):
        part = seqs[c: c + chunk]
        for r in routers:
            r.router_replay.clear_indices()
            r.router_replay.set_router_replay_action(RouterReplayAction.RECORD)
        lengths = [len(s) - 1 for s in part]
        packed_forward(model, np.concatenate([s[:-1] for s in part]), lengths)
        recorded = np.stack([r.router_replay.get_recorded_indices().cpu().numpy() for r in routers], axis=1)
        for r in routers:
            r.router_replay.clear_indices()
            r.router_replay.clear_router_replay_action()
        routing += np.split(recorded, np.cumsum(lengths)[:-1])  # [len - 1, L, K] each
    rewards = np.array([reward(p, decode(s[n:])) for p, s, n in zip(prompts, seqs, prompt_len)])
    return seqs, prompt_len, logps, routing, rewards


def _layout(cfg: RLConfig, ep: int) -> np.ndarray:
    """Sequence index of [micro_batch, rank, i]: micro-batch m holds N/M consecutive sequences, rank g
    the g-th block of N/(M ep) of them."""
    n = cfg.sequences_per_step
    return np.arange(n).reshape(cfg.micro_batches, ep, n // (cfg.micro_batches * ep))


def _micro_batches(cfg, ep, rank, seqs, prompt_len, logps, routing, advantages) -> list[_MicroBatch]:
    out = []
    for idx in _layout(cfg, ep)[:, rank]:
        ids = np.concatenate([seqs[i][:-1] for i in idx])
        targets = np.concatenate([seqs[i][1:] for i in idx])
        lengths = [len(seqs[i]) - 1 for i in idx]
        response = np.concatenate([np.arange(len(seqs[i]) - 1) >= prompt_len[i] - 1 for i in idx])
        old = np.concatenate([logps[i] for i in idx])
        adv = np.concatenate([np.full(len(seqs[i]) - 1, advantages[i]) for i in idx])
        replay = np.concatenate([routing[i] for i in idx]).astype(np.int64).transpose(1, 0, 2)
        out.append(_MicroBatch(ids, targets, lengths, np.ascontiguousarray(replay), response, old, adv))
    return out


def _captured(cfg, ep, routing) -> list[tuple[np.ndarray, np.ndarray]]:
    """The step's routing as relibra.rl.capture.build_trace takes it, per micro-batch."""
    out = []
    for idx in _layout(cfg, ep):
        experts = np.concatenate([routing[i] for rank in idx for i in rank])
        src = np.concatenate([np.full(len(routing[i]), g) for g, rank in enumerate(idx) for i in rank])
        out.append((experts, src))
    return out


def _surrogate_loss(trainer, cfg: RLConfig, total_response: int, world: int):
    from relibra.runtime.megatron_train import packed_forward

    def loss(m: int, mb: _MicroBatch) -> torch.Tensor:
        logits = packed_forward(trainer.ddp, mb.ids, mb.lengths).float()
        logits[:, PAD_ID] = -1e9
        logp = torch.log_softmax(logits, dim=-1).gather(1, torch.as_tensor(mb.targets)[:, None])[:, 0]
        ratio = torch.exp(logp - torch.as_tensor(mb.old_logp, dtype=torch.float32))
        a = torch.as_tensor(mb.advantage, dtype=torch.float32)
        surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * a)
        # x world: megatron's DDP averages gradients over the ranks; the step's gradient is the sum's
        return -(surrogate * torch.as_tensor(mb.response)).sum() / total_response * world

    return loss


def _warmup(trainer, cfg: RLConfig, rng: np.random.Generator, ep: int, rank: int) -> float:
    """Supervised steps on reference responses under the static placement; mean loss of the last 20."""
    from relibra.runtime.megatron_train import packed_forward
    from relibra.runtime.plans import static_plan

    L, E = cfg.policy.num_layers, cfg.policy.num_experts
    trainer.set_lr(cfg.warmup_lr)
    losses = []
    for _ in range(cfg.warmup_steps):
        tasks = sample_tasks(rng, cfg.warmup_batch, cfg.domains)
        seqs = [encode(t.prompt) + encode(t.reference) + [EOS_ID] for t in tasks]
        plen = [len(t.prompt) for t in tasks]
        mine = np.array_split(np.arange(len(seqs)), ep)[rank]
        total = sum(len(s) - p for s, p in zip(seqs, plen))
        mb = _MicroBatch(np.concatenate([seqs[i][:-1] for i in mine]), np.concatenate([seqs[i][1:] for i in mine]),
                         [len(seqs[i]) - 1 for i in mine], None,
                         np.concatenate([np.arange(len(seqs[i]) - 1) >= plen[i] - 1 for i in mine]), None, None)

        def loss(m, mb):
            logits = packed_forward(trainer.ddp, mb.ids, mb.lengths).float()
            ce = torch.nn.functional.cross_entropy(logits, torch.as_tensor(mb.targets), reduction="none")
            return (ce * torch.as_tensor(mb.response)).sum() / total * ep

        plan = static_plan(np.zeros((1, L, ep, E), dtype=np.int64), ep, home=trainer.home)
        out = trainer.run(plan, [mb], loss)
        value = torch.tensor([out["loss"] / ep], dtype=torch.float64)
        dist.all_reduce(value)
        losses.append(float(value.item()))
    trainer.set_lr(cfg.lr)
    return float(np.mean(losses[-20:])) if losses else float("nan")


def _policy_run(name: str, cfg: RLConfig, replica_slots: int, pgc, pgc_solo, rank: int, ep: int,
                progress) -> tuple[list[dict], list, float]:
    from relibra.cluster import get_topology
    from relibra.policies import get_policy
    from relibra.runtime.megatron_train import MegatronSetup, MegatronTrainer

    seeds = np.random.SeedSequence(cfg.seed).spawn(6)
    sample_gen = torch.Generator().manual_seed(int(seeds[1].generate_state(1)[0]))
    warm_rng, prompt_rng = (np.random.default_rng(s) for s in seeds[2:4])
    slots = replica_slots if name != "megatron" else 0
    model_cfg = _model_config(cfg, slots)
    max_tokens = 64 * cfg.policy.max_seq_len
    trainer = MegatronTrainer(model_cfg, MegatronSetup(dtype="float32", lr=cfg.lr, weight_decay=0.0,
                                                       clip_grad=cfg.grad_clip), pgc, max_tokens)
    engine = _rollout_model(_model_config(cfg, 0), pgc_solo, max_tokens)
    warmup_loss = _warmup(trainer, cfg, warm_rng, ep, rank)
    policy = get_policy(name, **policy_params(name, replica_slots, cfg.seed))
    topology = get_topology("cpu-gloo").with_changes(num_nodes=1, gpus_per_node=ep)
    shape = cfg.policy.model_shape()
    steps, history = [], []
    for step in progress(range(cfg.steps), desc=f"GRPO {name}"):
        t0 = time.perf_counter()
        sync_weights(trainer, engine)
        tasks = sample_tasks(prompt_rng, cfg.prompts_per_step, cfg.domains)
        prompts = [t.prompt for t in tasks for _ in range(cfg.group_size)]
        seqs, plen, logps, routing, rewards = rollout(engine, prompts, cfg, sample_gen)
        adv = group_advantages(rewards, cfg.group_size)
        t1 = time.perf_counter()
        steps.append(_captured(cfg, ep, routing))
        trace = build_trace(steps, shape, ep, {"generator": "relibra.rl (megatron trainer)"})
        plan = policy.plan(trace, step, topology, trainer.home)
        t2 = time.perf_counter()
        total_response = int(sum(len(s) - p for s, p in zip(seqs, plen)))
        mbs = _micro_batches(cfg, ep, rank, seqs, plen, logps, routing, adv)
        out = trainer.run(plan, mbs, _surrogate_loss(trainer, cfg, total_response, ep))
        t3 = time.perf_counter()
        loss = torch.tensor([out["loss"] / ep], dtype=torch.float64)
        dist.all_reduce(loss)
        history.append({"step": step, "reward": float(rewards.mean()), "loss": float(loss.item()),
                        "grad_norm": out["grad_norm"], "experts_moved": int(out["experts_moved"]),
                        "replicas": int((plan.replica_expert >= 0).sum()),
                        "replica_tokens": int(plan.occupied_replica_tokens().sum()),
                        "rollout_s": t1 - t0, "planning_s": t2 - t1, "training_s": t3 - t2})
    return history, steps, warmup_loss


def megatron_rl_worker(rank: int, world: int, cfg: RLConfig, policies: list[str], replica_slots: int,
                       out_path: str | None, show_progress: bool = True) -> dict:
    """Every policy's GRPO run on this rank (EP = world). Rank 0 writes the first policy's routing trace
    to out_path and returns {"history": {policy: rows}, "warmup_loss": {policy: float},
    "routing_identical": bool}."""
    from relibra.progress import progress
    from relibra.runtime.config import NodeLayout
    from relibra.runtime.groups import build_groups
    from relibra.runtime.megatron_train import megatron_grid

    torch.manual_seed(cfg.seed)
    pgc = megatron_grid(world)
    solo = build_groups(NodeLayout(world, 1))
    pgc_solo = solo.collection(ep_group=solo.solo)
    show = (lambda it, desc: progress(it, desc=desc, leave=False)) if rank == 0 and show_progress else (lambda it, desc: it)
    histories, traces, warm = {}, {}, {}
    for name in policies:
        histories[name], traces[name], warm[name] = _policy_run(name, cfg, replica_slots, pgc, pgc_solo, rank,
                                                                world, show)
    if rank != 0:
        return {}
    first = traces[policies[0]]
    identical = all(all(np.array_equal(a[0], b[0]) for sa, sb in zip(first, traces[p]) for a, b in zip(sa, sb))
                    for p in policies[1:])
    if out_path:
        provenance = {"generator": "relibra.rl", "trainer": "megatron", "policy": policies[0], "seed": cfg.seed,
                      "description": "routing recorded by GRPO rollouts (megatron-core GPTModel, RouterReplay "
                                     "RECORD) and replayed in training", "config": cfg.to_dict(),
                      "reward_per_step": [round(h["reward"], 6) for h in histories[policies[0]]],
                      "micro_batch_layout": "contiguous sequences per micro-batch, then contiguous blocks of "
                                            "sequences per src rank"}
        build_trace(first, cfg.policy.model_shape(), world, provenance).save(out_path)
    return {"history": histories, "warmup_loss": warm, "routing_identical": bool(identical)}


def policy_params(name: str, replica_slots: int, seed: int) -> dict:
    """Parameters a balancing policy is built with: the static `megatron` none, the others their spare
    slots per rank and the seed."""
    return {} if name == "megatron" else {"spare_slots_per_gpu": replica_slots, "seed": seed}


def check_megatron_config(cfg: RLConfig, nproc: int, policies: list[str], replica_slots: int = 2) -> None:
    """Refuse a megatron-trainer run its layout or policies cannot hold, before any rank starts."""
    from relibra.policies import POLICY_NAMES, get_policy

    if cfg.ep != nproc:
        raise ConfigError(f"rl --trainer megatron: EP is every rank, so --ep must equal --nproc ({nproc}), got {cfg.ep}")
    if not policies:
        raise ConfigError("rl --trainer megatron: --policies names at least one balancing policy")
    for p in policies:
        if p not in POLICY_NAMES:
            raise ConfigError(f"rl --trainer megatron: unknown policy {p!r}; known: {', '.join(POLICY_NAMES)}")
        get_policy(p, **policy_params(p, replica_slots, cfg.seed))  # its parameters, checked here
    if cfg.rollout_dtype != "float32":
        raise ConfigError("rl --trainer megatron: the rollout engine runs in float32 (--rollout-dtype float32)")
