"""Synthetic RL routing workloads: paper-scale routing traces from a small generative model.

What the model reproduces (the facts ReLibra builds on):
- Each task domain has its own hot experts in every layer: expert logits are a shared per-layer
  part plus a per-(domain, layer) part.
- A sequence (prompt + response) concentrates its tokens on few experts: it is a mixture of one or
  two *topics* of its domain (Dirichlet weights with a small concentration), and a topic's expert
  distribution is the domain's plus a strong topic-specific part (log-normal weights, so a handful
  of experts take most of a topic's tokens).
- Micro-batches hold different sequences, and RL responses are long-tailed (log-normal lengths),
  so each (micro-batch, EP rank) slot holds only a few sequences: its hot experts move from one
  micro-batch to the next while the step total, over hundreds of sequences, is steadier.
- The policy drifts slowly: every logit follows a stationary AR(1) walk across steps.

Sampling. Every (micro-batch, EP rank) slot holds exactly `tokens_per_rank` tokens: the step's
prompt groups (GRPO-style, `responses_per_prompt` responses each) are packed back to back in slot
order (by default micro-batch major, as Megatron's data sampler deals a global batch) and a sequence
longer than the room left continues in the next slot. A slot's per-layer expert distribution p is the token-weighted mixture
of its sequences' topic distributions. Top-k picks k distinct experts per token, so an expert's
inclusion probability is at most 1: `water_fill` turns p into inclusion probabilities min(1, c*p)
summing to k; experts at 1 take every token of the slot, the others share the remaining
tokens * (k - saturated) slots by one multinomial draw (numpy Generator.multinomial, vectorized over
rows). A rare draw above `tokens` for one expert (it can hold at most one slot per token) has its
excess redrawn over the experts with room, so each layer of a slot sums to exactly tokens * top_k.

With `token_level=True` (small configs) every token instead draws its own top-k from its
sequence's mixture by successive sampling without replacement (Gumbel top-k), and the trace keeps
the token-level ids.

Defaults are calibrated (docs/traces.md) so static contiguous placement has mean rank skewness
above 2 at EP16 and EP32, growing with EP, for the three paper models.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from relibra.cluster import ModelShape, get_model
from relibra.errors import ConfigError
from relibra.trace import RoutingTrace, loads_from_tokens

WORKLOADS = ("math", "science", "instruct", "code", "mixed")
DOMAINS = ("math", "science", "instruct", "code")


@dataclass(frozen=True)
class DomainProfile:
    """Sequence lengths of one task domain, in tokens. Lengths are log-normal: median * exp(sigma * z)."""

    name: str
    prompt_tokens_median: float
    prompt_tokens_sigma: float
    response_tokens_median: float
    response_tokens_sigma: float


# Long chain-of-thought responses for math (DAPO-Math-17k), shorter ones for multiple-choice
# science QA (GPQA) and instruction following (IFBench); code (CodeForces) has long statements.
DOMAIN_PROFILES: dict[str, DomainProfile] = {
    "math": DomainProfile("math", 180, 0.5, 3000, 0.9),
    "science": DomainProfile("science", 350, 0.5, 1800, 0.8),
    "instruct": DomainProfile("instruct", 160, 0.7, 700, 0.9),
    "code": DomainProfile("code", 600, 0.5, 2500, 0.9),
}


@dataclass(frozen=True)
class WorkloadConfig:
    """Knobs of the generator. Logit standard deviations are in natural-log units of expert weight.

    tokens_per_rank: tokens of one micro-batch on one EP rank (before top-k), 8192 by default,
        a typical token budget per GPU and micro-batch in RL training with packed sequences.
    max_sequence_tokens: cap on prompt + response (DAPO-style 20k-token limit).
    length_scale: multiplies every sequence length (and the cap); below 1 for small test configs
        whose tokens_per_rank is far below 8192, so a slot still holds a few sequences.
    shared_logit_std: per-layer expert popularity common to every domain.
    domain_logit_std: per-(domain, layer) popularity: each domain's own hot experts.
    topic_logit_std: per-(topic, layer) part: how strongly one sequence concentrates on few experts.
    topics_per_domain: topics one domain's sequences are mixtures of.
    topic_prior_std: spread of log topic frequencies inside a domain (some topics are common).
    topic_concentration: Dirichlet concentration of a sequence's topic mixture (x topics_per_domain
        x topic frequency); small values give one or two dominant topics per sequence.
    drift_per_step: 1 - correlation of every logit between consecutive steps (AR(1), stationary).
    mixed_domain_weights: share of sequences from (math, science, instruct, code) in `mixed`.
    """

    tokens_per_rank: int = 8192
    max_sequence_tokens: int = 20480
    length_scale: float = 1.0
    shared_logit_std: float = 0.7
    domain_logit_std: float = 0.7
    topic_logit_std: float = 2.2
    topics_per_domain: int = 16
    topic_prior_std: float = 1.0
    topic_concentration: float = 0.2
    drift_per_step: float = 0.01
    responses_per_prompt: int = 16
    slot_order: str = "microbatch-major"
    mixed_domain_weights: tuple[float, float, float, float] = (0.25, 0.25, 0.25, 0.25)

    def __post_init__(self):
        if self.slot_order not in ("rank-major", "microbatch-major"):
            raise ConfigError(f"workload config: slot_order must be 'rank-major' or 'microbatch-major', got {self.slot_order!r}")
        for name in ("tokens_per_rank", "max_sequence_tokens", "topics_per_domain", "responses_per_prompt"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"workload config: {name} must be positive, got {getattr(self, name)}")
        for name in ("shared_logit_std", "domain_logit_std", "topic_logit_std", "topic_prior_std"):
            if getattr(self, name) < 0:
                raise ConfigError(f"workload config: {name} must be >= 0, got {getattr(self, name)}")
        if not self.length_scale > 0:
            raise ConfigError(f"workload config: length_scale must be positive, got {self.length_scale}")
        if not self.topic_concentration > 0:
            raise ConfigError(f"workload config: topic_concentration must be positive, got {self.topic_concentration}")
        if not 0 <= self.drift_per_step <= 1:
            raise ConfigError(f"workload config: drift_per_step must lie in [0, 1], got {self.drift_per_step}")
        w = np.asarray(self.mixed_domain_weights, dtype=np.float64)
        if w.shape != (len(DOMAINS),) or (w < 0).any() or not w.sum() > 0:
            raise ConfigError(f"workload config: mixed_domain_weights must be {len(DOMAINS)} non-negative "
                              f"weights, got {self.mixed_domain_weights}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---- pure functions ------------------------------------------------------------------------------
def water_fill(p: np.ndarray, k: int) -> np.ndarray:
    """Inclusion probabilities of top-k sampling without replacement, min(1, c * p) summing to k.

    p: float [..., E], rows summing to 1 with at least k non-zero entries. Returns float64 [..., E]:
    experts whose share k*p would exceed 1 are capped at 1 and the rest rescaled to fill k.
    """
    pi = np.asarray(p, dtype=np.float64) * k
    rows = np.nonzero((pi > 1.0).any(axis=-1).reshape(-1))[0]
    if rows.size == 0:
        return pi
    flat = pi.reshape(-1, pi.shape[-1])
    sub = flat[rows] / k
    saturated = np.zeros(sub.shape, dtype=bool)
    while True:  # each pass saturates at least one more expert, so at most k + 1 passes
        rest = np.where(saturated, 0.0, sub)
        rest_sum = rest.sum(axis=-1)
        free_slots = k - saturated.sum(axis=-1)
        scaled = rest * (free_slots / np.where(rest_sum > 0, rest_sum, 1.0))[:, None]
        newly = (scaled >= 1.0) & ~saturated
        if not newly.any():
            break
        saturated |= newly
    flat[rows] = np.where(saturated, 1.0, scaled)
    return flat.reshape(pi.shape)


def sample_topk_counts(rng: np.random.Generator, p: np.ndarray, tokens: int, k: int) -> np.ndarray:
    """Tokens per expert when `tokens` tokens each pick k distinct experts with shares p.

    p: float [rows, E] (rows sum to 1). Returns int64 [rows, E]: every row sums to tokens * k and
    no entry exceeds `tokens`. Saturated experts (inclusion 1 after `water_fill`) take every token;
    the other slots are one multinomial draw; an over-full draw is redrawn over experts with room.
    """
    pi = water_fill(p, k)
    saturated = pi >= 1.0
    free = np.where(saturated, 0.0, pi)
    free_sum = free.sum(axis=-1, keepdims=True)
    free = free / np.where(free_sum > 0, free_sum, 1.0)
    slots = tokens * (k - saturated.sum(axis=-1))
    counts = rng.multinomial(slots, free)
    counts[saturated] = tokens
    over_rows = np.nonzero((counts > tokens).any(axis=-1))[0]
    while over_rows.size:  # rare: redraw the excess over the experts that still have room
        sub = counts[over_rows]
        excess = np.maximum(sub - tokens, 0)
        sub -= excess
        room = np.where(sub < tokens, free[over_rows], 0.0)
        room /= room.sum(axis=-1, keepdims=True)
        sub += rng.multinomial(excess.sum(axis=-1), room)
        counts[over_rows] = sub
        over_rows = over_rows[(sub > tokens).any(axis=-1)]
    return counts


def pack_sequences(lengths: np.ndarray, slot_tokens: int, num_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lay sequences back to back into `num_slots` slots of `slot_tokens` tokens each.

    lengths: int [n] tokens per sequence, summing to at least slot_tokens * num_slots.
    Returns (slot, sequence, tokens) of every piece, int64 [pieces]: a sequence crossing a slot
    boundary is cut into pieces; the last sequence is cut at the end of the last slot.
    """
    total = slot_tokens * num_slots
    ends = np.cumsum(lengths, dtype=np.int64)
    if ends[-1] < total:
        raise ConfigError(f"pack_sequences: {int(ends[-1])} tokens cannot fill {num_slots} slots of {slot_tokens}")
    starts = ends - lengths
    cuts = np.unique(np.concatenate([starts[starts < total], np.arange(0, total + 1, slot_tokens)]))
    piece_start = cuts[:-1]
    piece_tokens = np.diff(cuts)
    sequence = np.searchsorted(ends, piece_start, side="right")
    return piece_start // slot_tokens, sequence, piece_tokens


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


# ---- the generator -------------------------------------------------------------------------------
class _WorkloadState:
    """Logits of every (domain, topic, layer, expert) and of topic frequencies, walked across steps.

    All are unit-variance Gaussians scaled by the config's standard deviations when used, so the
    AR(1) walk keeps their spread (and the calibrated skew) stationary over long traces.
    """

    def __init__(self, rng: np.random.Generator, model: ModelShape, cfg: WorkloadConfig):
        d, t, l, e = len(DOMAINS), cfg.topics_per_domain, model.num_layers, model.num_experts
        self.rng, self.cfg = rng, cfg
        self.shared = rng.standard_normal((l, e))
        self.domain = rng.standard_normal((d, l, e))
        self.topic = rng.standard_normal((d, t, l, e))
        self.topic_prior = rng.standard_normal((d, t))

    def advance(self) -> None:
        """One step of policy drift: x <- rho * x + sqrt(1 - rho^2) * noise."""
        rho = 1.0 - self.cfg.drift_per_step
        if rho == 1.0:
            return
        sd = np.sqrt(1.0 - rho * rho)
        for name in ("shared", "domain", "topic", "topic_prior"):
            x = getattr(self, name)
            setattr(self, name, rho * x + sd * self.rng.standard_normal(x.shape))

    def topic_distributions(self) -> np.ndarray:
        """Expert shares of every topic: float64 [domains * topics, layers, experts]."""
        c = self.cfg
        logits = (c.shared_logit_std * self.shared[None, None] + c.domain_logit_std * self.domain[:, None]
                  + c.topic_logit_std * self.topic)
        d, t, l, e = logits.shape
        return _softmax(logits).reshape(d * t, l, e)

    def topic_frequencies(self) -> np.ndarray:
        """Share of each topic inside its domain: float64 [domains, topics]."""
        return _softmax(self.cfg.topic_prior_std * self.topic_prior)


def _draw_sequences(rng: np.random.Generator, domains: np.ndarray, weights: np.ndarray, min_tokens: int,
                    cfg: WorkloadConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw prompt groups (one prompt, `responses_per_prompt` responses) until they hold `min_tokens`.

    domains: indices into DOMAINS the workload draws from, with `weights`. Returns, per sequence in
    batch order (a group's responses are adjacent, as RL frameworks lay out a rollout batch):
    (prompt group index, domain index, length in tokens = prompt + response), int64 [n] each.
    """
    prof = [DOMAIN_PROFILES[DOMAINS[i]] for i in domains]
    g = cfg.responses_per_prompt
    scale = cfg.length_scale
    mean_len = scale * sum(w * (p.prompt_tokens_median + p.response_tokens_median) for w, p in zip(weights, prof))
    doms, lens, total = [], [], 0
    while total < min_tokens:
        n = int((min_tokens - total) / (max(mean_len, 2.0) * g) * 1.2) + 1  # prompts
        which = rng.choice(len(domains), size=n, p=weights)
        pm, ps, rm, rs = (np.array([getattr(p, f) for p in prof])[which] for f in
                          ("prompt_tokens_median", "prompt_tokens_sigma", "response_tokens_median", "response_tokens_sigma"))
        prompt = scale * pm * np.exp(ps * rng.standard_normal(n))
        response = scale * rm[:, None] * np.exp(rs[:, None] * rng.standard_normal((n, g)))
        cap = max(2, int(round(scale * cfg.max_sequence_tokens)))
        length = np.clip(np.rint(prompt[:, None] + response).astype(np.int64), 2, cap)
        doms.append(np.repeat(domains[which], g))
        lens.append(length.ravel())
        total += int(length.sum())
    seq_domain, seq_len = np.concatenate(doms), np.concatenate(lens)
    return np.arange(len(seq_len)) // g, seq_domain, seq_len


def _topic_weights(rng: np.random.Generator, domain: np.ndarray, freq: np.ndarray, cfg: WorkloadConfig) -> np.ndarray:
    """Topic mixture of each prompt: float64 [n, domains * topics], non-zero only in its domain."""
    d, t = freq.shape
    alpha = cfg.topic_concentration * t * freq[domain]  # [n, t]: Dirichlet via normalized gammas
    gam = rng.standard_gamma(alpha)
    g_sum = gam.sum(axis=1, keepdims=True)
    # A row of all-zero gammas (possible at tiny alpha) falls back to the topic frequencies.
    gam = np.where(g_sum > 0, gam / np.where(g_sum > 0, g_sum, 1.0), freq[domain])
    out = np.zeros((len(domain), d * t))
    np.put_along_axis(out, domain[:, None] * t + np.arange(t)[None], gam, axis=1)
    return out


def generate_trace(model: str | ModelShape, workload: str, ep: int, steps: int, seed: int = 0,
                   micro_batches: int = 32, tokens_per_rank: int | None = None, progress: bool = False,
                   config: WorkloadConfig | None = None, token_level: bool = False) -> RoutingTrace:
    """A synthetic RL routing trace: loads int32 [steps, micro_batches, layers, ep, experts].

    model: preset name or ModelShape; workload: one of WORKLOADS; ep: EP size (divides experts);
    tokens_per_rank: tokens per (micro-batch, EP rank), default config.tokens_per_rank (8192);
    config: generator knobs (WorkloadConfig()); token_level: also keep per-token top-k ids
    (successive sampling per token; only for small configs). Same arguments, same trace.
    """
    shape = get_model(model) if isinstance(model, str) else model
    cfg = config or WorkloadConfig()
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    for name, value in (("ep", ep), ("steps", steps), ("micro_batches", micro_batches)):
        if not isinstance(value, (int, np.integer)) or value <= 0:
            raise ConfigError(f"generate_trace: {name} must be a positive integer, got {value!r}")
    if shape.num_experts % ep:
        raise ConfigError(f"generate_trace: ep={ep} does not divide the {shape.num_experts} experts of {shape.name!r}")
    tokens = int(tokens_per_rank if tokens_per_rank is not None else cfg.tokens_per_rank)
    if tokens <= 0:
        raise ConfigError(f"generate_trace: tokens_per_rank must be positive, got {tokens}")
    l, e, k = shape.num_layers, shape.num_experts, shape.top_k
    if token_level and steps * micro_batches * ep * tokens * l * e > 4e8:
        raise ConfigError("generate_trace: token_level is for small configs (steps x micro_batches x ep x "
                          "tokens_per_rank x layers x experts <= 4e8)")

    if workload == "mixed":
        domains = np.arange(len(DOMAINS))
        weights = np.asarray(cfg.mixed_domain_weights, dtype=np.float64)
        domains, weights = domains[weights > 0], weights[weights > 0] / weights.sum()
    else:
        domains, weights = np.array([DOMAINS.index(workload)]), np.array([1.0])

    rng = np.random.default_rng(seed)
    state = _WorkloadState(rng, shape, cfg)
    num_slots = micro_batches * ep
    loads = np.empty((steps, micro_batches, l, ep, e), dtype=np.int32)
    token_experts = token_src = None
    if token_level:
        token_experts = np.empty((steps, micro_batches, ep * tokens, l, k), dtype=np.int16)
        token_src = np.broadcast_to(np.repeat(np.arange(ep, dtype=np.int16), tokens),
                                    (steps, micro_batches, ep * tokens)).copy()
    step_iter = range(steps)
    if progress:
        from tqdm.auto import tqdm
        step_iter = tqdm(step_iter, desc=f"{shape.name} {workload} EP{ep}", unit="step")
    for s in step_iter:
        if s:
            state.advance()
        topic_p = state.topic_distributions()  # [D*T, L, E]
        seq_group, seq_domain, seq_len = _draw_sequences(rng, domains, weights, num_slots * tokens, cfg)
        group_domain = seq_domain[:: cfg.responses_per_prompt]
        group_topics = _topic_weights(rng, group_domain, state.topic_frequencies(), cfg)
        stream_slot, seq, piece_tokens = pack_sequences(seq_len, tokens, num_slots)
        slot = _slot_index(stream_slot, micro_batches, ep, cfg.slot_order)  # -> m * ep + r
        piece_topics = group_topics[seq_group[seq]]
        used = np.nonzero(piece_topics.any(axis=0))[0]  # topics present this step
        piece_topics = piece_topics[:, used]
        topic_flat = topic_p[used].reshape(len(used), l * e)
        if token_level:
            order = np.argsort(slot, kind="stable")  # tokens grouped by micro-batch, then rank
            ids = _sample_token_ids(rng, piece_topics[order] @ topic_flat, piece_tokens[order], l, e, k)
            token_experts[s] = ids.reshape(micro_batches, ep * tokens, l, k)
            continue
        slot_mix = np.zeros((num_slots, len(used)))
        np.add.at(slot_mix, slot, piece_topics * (piece_tokens / tokens)[:, None])
        # One matrix product for the whole step: many small ones wake BLAS threads over and over,
        # which costs more than the product itself on a shared machine.
        slot_p = (slot_mix @ topic_flat).reshape(micro_batches, ep * l, e)  # float64 [M, ep*L, E]
        for m in range(micro_batches):
            counts = sample_topk_counts(rng, slot_p[m], tokens, k).reshape(ep, l, e)
            loads[s, m] = counts.transpose(1, 0, 2)
    if token_level:
        loads = loads_from_tokens(token_experts, token_src, ep, e)
    provenance = {"generator": "relibra.workloads", "workload": workload, "seed": int(seed),
                  "tokens_per_rank": tokens, "token_level": bool(token_level), "config": cfg.to_dict()}
    return RoutingTrace(loads, shape, ep, ep * tokens, provenance, token_experts, token_src)


def _slot_index(stream_slot: np.ndarray, micro_batches: int, ep: int, order: str) -> np.ndarray:
    """Map the j-th slot of the batch stream to micro_batch * ep + rank.

    rank-major: rank r takes the r-th contiguous chunk of the batch and cuts it into its micro-batches
    (how Megatron and verl split a global batch over data-parallel ranks); microbatch-major: the
    micro-batch is the outer loop and its ranks take consecutive sequences.
    """
    if order == "rank-major":
        rank, mb = np.divmod(stream_slot, micro_batches)
    else:
        mb, rank = np.divmod(stream_slot, ep)
    return mb * ep + rank


def _sample_token_ids(rng: np.random.Generator, piece_p: np.ndarray, piece_tokens: np.ndarray, l: int, e: int,
                      k: int) -> np.ndarray:
    """Top-k ids of every token by Gumbel top-k (successive sampling without replacement).

    piece_p: float [pieces, L*E] expert shares of each piece's sequence; piece_tokens: int [pieces].
    Returns int16 [sum(piece_tokens), L, k], tokens in piece order.
    """
    p = np.repeat(piece_p.reshape(-1, l, e), piece_tokens, axis=0)  # [tokens, L, E]
    with np.errstate(divide="ignore"):
        keys = np.log(p) + rng.gumbel(size=p.shape)
    return np.argpartition(-keys, k - 1, axis=-1)[..., :k].astype(np.int16)


def benchmark_generate(model: str = "qwen3-235b-a22b", workload: str = "mixed", ep: int = 32, steps: int = 1,
                       seed: int = 0, micro_batches: int = 32, tokens_per_rank: int | None = None) -> dict:
    """Time `generate_trace` once and report seconds per step, cells and tokens per second.

    seconds is wall-clock time; cpu_seconds is this process's CPU time (all its threads), which
    shows the generator's own cost when other work shares the machine.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    trace = generate_trace(model, workload, ep, steps, seed, micro_batches, tokens_per_rank)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    cells = trace.loads.size
    tokens = steps * micro_batches * trace.tokens_per_microbatch
    return {
        "model": trace.model.name, "workload": workload, "ep": ep, "steps": steps,
        "micro_batches": micro_batches, "tokens_per_rank": trace.tokens_per_microbatch // ep,
        "seconds": seconds, "seconds_per_step": seconds / steps,
        "cpu_seconds": cpu_seconds, "cpu_seconds_per_step": cpu_seconds / steps,
        "load_cells": int(cells), "cells_per_second": cells / seconds,
        "tokens_per_second": tokens / seconds,
        "static_skewness": trace.static_skewness(),
    }


SHIFT_KEYS = ("mb_hot_overlap", "mb_corr", "mb_vs_step_hot_overlap", "step_hot_overlap", "step_corr",
              "history_hot_overlap", "history_mb_hot_overlap")


def calibration_table(models: tuple[str, ...] = ("qwen3-30b-a3b", "glm-4.5-air", "qwen3-235b-a22b"),
                      workloads: tuple[str, ...] = ("mixed",), eps: tuple[int, ...] = (8, 16, 32, 64),
                      steps: int = 4, micro_batches: int = 32, seed: int = 0, tokens_per_rank: int | None = None,
                      config: WorkloadConfig | None = None, progress: bool = False) -> list[dict]:
    """Static-placement skewness and shift statistics of generated traces, one row per (model, workload, EP).

    Each row: model, workload, ep, static_skewness (mean over micro-batches and layers of max/mean
    tokens per rank under static contiguous placement), static_skewness_p95, the SHIFT_KEYS of
    `relibra.trace.shift_stats`, and seconds (generation time of the whole trace).
    """
    grid = [(m, w, ep) for m in models for w in workloads for ep in eps]
    if progress:
        from tqdm.auto import tqdm
        grid = tqdm(grid, desc="calibration", unit="trace")
    rows = []
    for model, workload, ep in grid:
        t0 = time.perf_counter()
        trace = generate_trace(model, workload, ep, steps, seed, micro_batches, tokens_per_rank, config=config)
        seconds = time.perf_counter() - t0
        st = trace.stats()
        rows.append({"model": model, "workload": workload, "ep": ep,
                     "static_skewness": st["static_skewness"], "static_skewness_p95": st["static_skewness_p95"],
                     **{key: st[key] for key in SHIFT_KEYS}, "seconds": seconds})
    return rows
