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

Sampling. A step is one RL global batch: `global_batch_sequences` sequences (1024, the paper's),
drawn as GRPO-style prompt groups (`responses_per_prompt` responses each, adjacent in batch order), or,
when `tokens_per_rank` is given, as many as fill about that many tokens per (micro-batch, EP rank)
slot. A named batch layout (BATCH_LAYOUTS, `layout_slots`; docs/traces.md) deals the sequences to
(micro-batch, rank) slots as an RL framework's trainer does: whole sequences, so a slot holds what its
sequences hold (the `megatron` layout instead packs the stream into equal samples, cutting sequences).
The trace records each slot's sequence lengths (`seq_lens`). A slot's per-layer expert distribution p
is the token-weighted mixture of its sequences' topic distributions. Top-k picks k distinct experts per
token, so an expert's inclusion probability is at most 1: `water_fill` turns p into inclusion
probabilities min(1, c*p) summing to k; experts at 1 take every token of the slot, the others share
the remaining tokens * (k - saturated) slots by one multinomial draw (numpy Generator.multinomial,
vectorized over rows). A rare draw above `tokens` for one expert (it can hold at most one slot per
token) has its excess redrawn over the experts with room, so each layer of a slot sums to exactly
tokens * top_k.

Per-model routing: the generator's random stream is seeded by (seed, a hash of the model's name and
shape), so two models never share one routing, while the same (model, seed) always gives the same trace.

With `token_level=True` (small configs) every token instead draws its own top-k from its
sequence's mixture by successive sampling without replacement (Gumbel top-k), and the trace keeps
the token-level ids.

The routing knobs were calibrated (docs/traces.md) so static contiguous placement has mean rank
skewness above 2 at EP16 and EP32, growing with EP, for the three paper models.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
import zlib
from dataclasses import dataclass

import numpy as np

from relibra.analysis import trace_stats
from relibra.cluster import ModelShape, get_model
from relibra.errors import ConfigError
from relibra.trace import RoutingTrace, loads_from_tokens

WORKLOADS = ("math", "science", "instruct", "code", "mixed")
# How a step's sequences reach (micro-batch, rank) slots; see layout_slots and docs/traces.md.
BATCH_LAYOUTS = ("token-budget", "verl-balance", "verl", "verl-dynamic", "slime", "slime-dynamic", "megatron")
DEFAULT_BATCH_LAYOUT = "token-budget"
# The layouts that deal a fixed number of whole sequences to every (micro-batch, rank) slot; the paper's
# 32 micro-batches per step is their default count (token-budget derives its count from the budget).
FIXED_COUNT_MICRO_BATCHES = 32
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

    global_batch_sequences: sequences of one step (the paper's global batch, 1024), dealt over the
        EP group's ranks as data-parallel ranks; raised to one sequence per (micro-batch, rank) slot
        where ep x micro_batches exceeds it, and rounded up to a multiple of the slots.
    tokens_per_rank: None (default) = derived from the batch and the sequence lengths; a number =
        draw sequences until the step holds about that many tokens per slot (small test configs and
        the sensitivity knob), with as many whole sequences per slot as that takes. Under
        `token-budget` a number replaces tokens_per_microbatch as the budget.
    batch_layout: how sequences reach slots, one of BATCH_LAYOUTS (default "token-budget").
    tokens_per_microbatch: the `token-budget` layout's budget, tokens per GPU per micro-batch
        (slime's --max-tokens-per-gpu, verl's ppo_max_token_len_per_gpu); the sequence-parallel
        split over tensor-parallel ranks is the caller's (relibra.setups: budget / TP).
    data_parallel_size: data-parallel ranks the global batch is split over under `token-budget`
        (each EP rank is one of them and holds global_batch_sequences / data_parallel_size sequences
        per step); None = the EP size.
    max_sequence_tokens: cap on prompt + response (DAPO-style 20k-token limit).
    length_scale: multiplies every sequence length (and the cap); below 1 for small test configs
        with few tokens per slot, so a slot still holds whole sequences.
    shared_logit_std: per-layer expert popularity common to every domain.
    domain_logit_std: per-(domain, layer) popularity: each domain's own hot experts.
    topic_logit_std: per-(topic, layer) part: how strongly one sequence concentrates on few experts.
    topics_per_domain: topics one domain's sequences are mixtures of.
    topic_prior_std: spread of log topic frequencies inside a domain (some topics are common).
    topic_concentration: Dirichlet concentration of a sequence's topic mixture (x topics_per_domain
        x topic frequency); small values give one or two dominant topics per sequence.
    drift_per_step: 1 - correlation of every logit between consecutive steps (AR(1), stationary).
    mixed_domain_weights: share of sequences from (math, science, instruct, code) in `mixed`.
    domain_profiles: sequence lengths of (math, science, instruct, code); None = DOMAIN_PROFILES.
    """

    global_batch_sequences: int = 1024
    tokens_per_rank: int | None = None
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
    batch_layout: str = DEFAULT_BATCH_LAYOUT
    tokens_per_microbatch: int = 16384
    data_parallel_size: int | None = None
    domain_profiles: tuple[DomainProfile, ...] | None = None
    mixed_domain_weights: tuple[float, float, float, float] = (0.25, 0.25, 0.25, 0.25)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"workload config: {f.name} must be a finite number, got {value}")
        if not all(math.isfinite(x) for x in self.mixed_domain_weights):
            raise ConfigError(f"workload config: mixed_domain_weights must be finite, got {self.mixed_domain_weights}")
        if self.batch_layout not in BATCH_LAYOUTS:
            raise ConfigError(f"workload config: batch_layout must be one of {', '.join(BATCH_LAYOUTS)}, "
                              f"got {self.batch_layout!r}")
        if self.tokens_per_rank is not None and (not isinstance(self.tokens_per_rank, (int, np.integer))
                                                 or self.tokens_per_rank <= 0):
            raise ConfigError(f"workload config: tokens_per_rank must be None or a positive integer, "
                              f"got {self.tokens_per_rank!r}")
        for name in ("global_batch_sequences", "max_sequence_tokens", "topics_per_domain", "responses_per_prompt",
                     "tokens_per_microbatch"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"workload config: {name} must be positive, got {getattr(self, name)}")
        for name in ("shared_logit_std", "domain_logit_std", "topic_logit_std", "topic_prior_std"):
            if getattr(self, name) < 0:
                raise ConfigError(f"workload config: {name} must be >= 0, got {getattr(self, name)}")
        if self.data_parallel_size is not None and (isinstance(self.data_parallel_size, bool) or not isinstance(
                self.data_parallel_size, (int, np.integer)) or self.data_parallel_size <= 0):
            raise ConfigError(f"workload config: data_parallel_size must be None or a positive integer, "
                              f"got {self.data_parallel_size!r}")
        if not self.length_scale > 0:
            raise ConfigError(f"workload config: length_scale must be positive, got {self.length_scale}")
        if not self.topic_concentration > 0:
            raise ConfigError(f"workload config: topic_concentration must be positive, got {self.topic_concentration}")
        if not 0 <= self.drift_per_step <= 1:
            raise ConfigError(f"workload config: drift_per_step must lie in [0, 1], got {self.drift_per_step}")
        if self.domain_profiles is not None and (len(self.domain_profiles) != len(DOMAINS) or any(
                not isinstance(p, DomainProfile) or p.name != d for p, d in zip(self.domain_profiles, DOMAINS))):
            raise ConfigError(f"workload config: domain_profiles must be DomainProfiles of {', '.join(DOMAINS)} in order")
        w = np.asarray(self.mixed_domain_weights, dtype=np.float64)
        if w.shape != (len(DOMAINS),) or (w < 0).any() or not w.sum() > 0:
            raise ConfigError(f"workload config: mixed_domain_weights must be {len(DOMAINS)} non-negative "
                              f"weights, got {self.mixed_domain_weights}")

    def profile(self, domain: str) -> DomainProfile:
        """Sequence lengths of one task domain."""
        return DOMAIN_PROFILES[domain] if self.domain_profiles is None else self.domain_profiles[DOMAINS.index(domain)]

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


def sample_topk_counts(rng: np.random.Generator, p: np.ndarray, tokens, k: int) -> np.ndarray:
    """Tokens per expert when `tokens` tokens each pick k distinct experts with shares p.

    p: float [rows, E] (rows sum to 1); tokens: an int, or int [rows] per row. Returns int64 [rows, E]:
    every row sums to its tokens * k and no entry exceeds its tokens. Saturated experts (inclusion 1 after `water_fill`) take every token;
    the other slots are one multinomial draw; an over-full draw is redrawn over experts with room.
    """
    pi = water_fill(p, k)
    saturated = pi >= 1.0
    free = np.where(saturated, 0.0, pi)
    free_sum = free.sum(axis=-1, keepdims=True)
    free = free / np.where(free_sum > 0, free_sum, 1.0)
    tok = np.broadcast_to(np.asarray(tokens, dtype=np.int64), pi.shape[:-1])[:, None]  # [rows, 1]
    slots = tok[:, 0] * (k - saturated.sum(axis=-1))
    counts = rng.multinomial(slots, free)
    counts = np.where(saturated, tok, counts)
    over_rows = np.nonzero((counts > tok).any(axis=-1))[0]
    while over_rows.size:  # rare: redraw the excess over the experts that still have room
        sub = counts[over_rows]
        cap = tok[over_rows]
        excess = np.maximum(sub - cap, 0)
        sub -= excess
        room = np.where(sub < cap, free[over_rows], 0.0)
        room /= room.sum(axis=-1, keepdims=True)
        sub += rng.multinomial(excess.sum(axis=-1), room)
        counts[over_rows] = sub
        over_rows = over_rows[(sub > cap).any(axis=-1)]
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


def karmarkar_karp(lengths: np.ndarray, k: int, equal_size: bool) -> list[np.ndarray]:
    """Partition items into k parts of near-equal summed length by largest differencing (Karmarkar-Karp).

    lengths: int [n]. equal_size: every part gets n / k items (n must be a multiple of k); the items,
    sorted by (length, index), start as n / k states of k singletons; otherwise as n states of one
    item and k - 1 empty parts. The two states of largest spread (max - min part sum) are merged
    repeatedly, the largest part of one joining the smallest of the other, as verl's and slime's
    `get_seqlen_balanced_partitions` do. Returns k int64 index arrays, each sorted ascending, parts in
    decreasing order of sum (ties: more items first).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if k <= 0 or n < k:
        raise ConfigError(f"karmarkar_karp: {n} items cannot fill {k} parts")
    if equal_size and n % k:
        raise ConfigError(f"karmarkar_karp: {n} items do not split into {k} equal parts")
    order = np.lexsort((np.arange(n), lengths))  # ascending by (length, index)
    heap = []
    counter = 0

    def push(sums: list, items: list):
        nonlocal counter
        idx = sorted(range(k), key=lambda i: (sums[i], len(items[i])), reverse=True)
        sums, items = [sums[i] for i in idx], [items[i] for i in idx]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), -sums[0], counter, sums, items))
        counter += 1

    if equal_size:
        for off in range(0, n, k):
            chunk = order[off:off + k]
            push([int(lengths[i]) for i in chunk], [[int(i)] for i in chunk])
    else:
        for i in order:
            push([int(lengths[i])] + [0] * (k - 1), [[int(i)]] + [[] for _ in range(k - 1)])
    while len(heap) > 1:
        _, _, _, s0, i0 = heapq.heappop(heap)
        _, _, _, s1, i1 = heapq.heappop(heap)
        push([s0[j] + s1[k - 1 - j] for j in range(k)], [i0[j] + i1[k - 1 - j] for j in range(k)])
    parts = [np.sort(np.asarray(p, dtype=np.int64)) for p in heap[0][4]]
    if any(len(p) == 0 for p in parts):
        raise ConfigError(f"karmarkar_karp: a part came out empty ({n} items, {k} parts)")
    return parts


def first_fit_bins(lengths: np.ndarray, budget: int) -> list[list[int]]:
    """Pack sequences in their order into bins of at most `budget` tokens, first fit.

    lengths: int [n]. Each sequence goes into the first bin whose tokens plus its own stay within the
    budget, else opens a new bin; a sequence longer than the budget sits alone in its own bin (the
    contract of slime's `first_fit_pack`, slime/utils/seqlen_balancing.py). Returns the bins as lists
    of sequence indices, in opening order.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    room = np.empty(len(lengths), dtype=np.int64)  # free tokens of each open bin (at most n bins)
    bins: list[list[int]] = []
    for i, length in enumerate(lengths.tolist()):
        fits = np.flatnonzero(room[:len(bins)] >= length)
        if fits.size:
            j = int(fits[0])
            bins[j].append(i)
            room[j] -= length
        else:
            room[len(bins)] = budget - length  # negative for an over-long sequence: nothing else fits
            bins.append([i])
    return bins


def split_largest_bins(bins: list[list[int]], count: int, lengths: np.ndarray) -> list[list[int]]:
    """Split bins until there are `count`: the bin of most tokens holding two or more sequences (ties: the
    later bin) is cut where its running token sum first reaches half, its second part appended as a new
    bin (slime's expand_bins_by_splitting). Raises ConfigError when no bin can be split further."""
    lengths = np.asarray(lengths, dtype=np.int64)
    bins = [list(b) for b in bins]
    while len(bins) < count:
        sums = [(int(lengths[b].sum()), j) for j, b in enumerate(bins) if len(b) > 1]
        if not sums:
            raise ConfigError(f"token-budget layout: {len(bins)} micro-batches of single sequences cannot be "
                              f"split into {count}")
        total, j = max(sums)
        running = np.cumsum(lengths[bins[j]])
        cut = int(np.clip(np.searchsorted(running, total / 2) + 1, 1, len(bins[j]) - 1))
        bins.append(bins[j][cut:])
        bins[j] = bins[j][:cut]
    return bins


def token_budget_slots(bins: list[list[int]], weights: np.ndarray, ep: int) -> tuple[np.ndarray, np.ndarray]:
    """(rank, micro_batch) of every packed sequence: the bins dealt over `ep` data-parallel ranks.

    bins: len(bins) a multiple of ep; weights: int [n] estimated work of each sequence. The bins'
    summed work is partitioned by Karmarkar-Karp into ep parts of equal bin count (slime's
    --balance-data: `get_seqlen_balanced_partitions` on estimated FLOPs); part r runs on rank r,
    its bins in ascending order as micro-batches 0, 1, .... Sequences in no bin get rank -1.
    Returns int64 [n] each.
    """
    weights = np.asarray(weights, dtype=np.int64)
    if len(bins) % ep:
        raise ConfigError(f"token-budget layout: {len(bins)} micro-batches do not split over ep={ep} ranks")
    bin_work = np.array([int(weights[b].sum()) for b in bins], dtype=np.int64)
    rank = np.full(len(weights), -1, dtype=np.int64)
    mb = np.full(len(weights), -1, dtype=np.int64)
    for r, part in enumerate(karmarkar_karp(bin_work, ep, equal_size=True)):
        for m, j in enumerate(part.tolist()):
            rank[bins[j]] = r
            mb[bins[j]] = m
    return rank, mb


def layout_slots(lengths: np.ndarray, group: np.ndarray, ep: int, micro_batches: int, layout: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(rank, micro_batch) of every whole sequence of one step under a named batch layout.

    lengths: int [n] tokens per sequence in rollout order (a prompt group's responses adjacent);
    group: int [n] prompt group of each sequence. The EP group's ranks are the data-parallel ranks.
    n must be a multiple of ep (verl's DataProto.chunk and balance_batch, slime's strided split) and
    of ep x micro_batches for the fixed-size micro-batch layouts. Layouts (docs/traces.md says which
    code of each system this follows):
      verl          DataProto.chunk: rank r takes the r-th contiguous chunk; its micro-batches are
                    consecutive runs of ppo_micro_batch_size_per_gpu sequences.
      verl-balance  verl's trainer default (balance_batch=True): the Karmarkar-Karp partition of the
                    sequences by length into ep parts of equal count (equal_size=True), part r on
                    rank r, then fixed-size micro-batches as `verl`.
      verl-dynamic  balance_batch plus use_dynamic_bsz: each rank's sequences are split by
                    Karmarkar-Karp (equal_size=False) into micro_batches token-balanced micro-batches
                    (verl makes the count the DP-wide max of ceil(tokens / max_token_len)).
      slime         slime's default split val[dp_rank::dp_size] (a group's responses go to different
                    ranks), then consecutive runs of micro_batch_size sequences.
      slime-dynamic the strided split plus --use-dynamic-batch-size: Karmarkar-Karp into
                    micro_batches token-balanced micro-batches per rank.
    (`megatron` packs instead of dealing whole sequences; see pack_sequences.)
    Returns int64 [n] each.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if n % ep:
        raise ConfigError(f"layout {layout!r}: {n} sequences do not split over ep={ep} ranks")
    per_rank = n // ep
    if per_rank < micro_batches:
        raise ConfigError(f"layout {layout!r}: {per_rank} sequences per rank cannot fill {micro_batches} micro-batches")
    rank = np.empty(n, dtype=np.int64)
    mb = np.empty(n, dtype=np.int64)
    if layout in ("verl", "verl-balance", "verl-dynamic"):
        if layout == "verl":
            parts = np.arange(n).reshape(ep, per_rank)
        else:
            parts = karmarkar_karp(lengths, ep, equal_size=True)
    elif layout in ("slime", "slime-dynamic"):
        parts = [np.arange(r, n, ep) for r in range(ep)]
    else:
        raise ConfigError(f"unknown batch layout {layout!r} for whole sequences; known: "
                          f"{', '.join(b for b in BATCH_LAYOUTS if b != 'megatron')}")
    dynamic = layout.endswith("-dynamic")
    if not dynamic and per_rank % micro_batches:
        raise ConfigError(f"layout {layout!r}: {per_rank} sequences per rank do not split into {micro_batches} "
                          f"micro-batches of equal size")
    for r, part in enumerate(parts):
        rank[part] = r
        if dynamic:
            for m, sub in enumerate(karmarkar_karp(lengths[part], micro_batches, equal_size=False)):
                mb[part[sub]] = m
        else:
            mb[part] = np.arange(per_rank) // (per_rank // micro_batches)
    return rank, mb


def slot_seq_lens(slot: np.ndarray, tokens: np.ndarray, num_slots: int) -> np.ndarray:
    """Lengths of the pieces in each slot, 0-padded: int32 [num_slots, max pieces per slot].

    slot: int [pieces] slot of each piece, tokens: int [pieces] its length; pieces keep their order.
    """
    order = np.argsort(slot, kind="stable")
    counts = np.bincount(slot, minlength=num_slots)
    width = max(int(counts.max(initial=0)), 1)
    pos = np.arange(len(slot)) - np.repeat(np.cumsum(counts) - counts, counts)
    out = np.zeros((num_slots, width), dtype=np.int32)
    out[slot[order], pos] = tokens[order]
    return out


def model_seed(shape: ModelShape) -> int:
    """A stable 32-bit key of a model's name and routing shape, mixed into the generator's seed so that
    two models never share one routing (crc32 of "name|layers|experts|top_k")."""
    key = f"{shape.name}|{shape.num_layers}|{shape.num_experts}|{shape.top_k}"
    return zlib.crc32(key.encode())


def allowed_ep(num_experts: int, limit: int = 512) -> list[int]:
    """EP sizes up to `limit` that divide num_experts (every rank homes the same number of experts)."""
    return [d for d in range(1, min(num_experts, limit) + 1) if num_experts % d == 0]


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
                    cfg: WorkloadConfig, min_sequences: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw prompt groups (one prompt, `responses_per_prompt` responses) until they hold `min_tokens`
    tokens and at least `min_sequences` sequences.

    domains: indices into DOMAINS the workload draws from, with `weights`. Returns, per sequence in
    batch order (a group's responses are adjacent, as RL frameworks lay out a rollout batch):
    (prompt group index, domain index, length in tokens = prompt + response), int64 [n] each.
    """
    prof = [cfg.profile(DOMAINS[i]) for i in domains]
    g = cfg.responses_per_prompt
    scale = cfg.length_scale
    mean_len = scale * sum(w * (p.prompt_tokens_median + p.response_tokens_median) for w, p in zip(weights, prof))
    doms, lens, total = [], [], 0
    count = 0
    while total < min_tokens or count < min_sequences:
        n = max(int((min_tokens - total) / (max(mean_len, 2.0) * g) * 1.2),
                -(-(min_sequences - count) // g), 0) + 1  # prompts
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
        count += length.size
    seq_domain, seq_len = np.concatenate(doms), np.concatenate(lens)
    return np.arange(len(seq_len)) // g, seq_domain, seq_len


def _token_budget_batches(shape: ModelShape, cfg: WorkloadConfig, domains: np.ndarray, weights: np.ndarray, ep: int,
                          steps: int, seed: int, budget: int, micro_batches: int | None) -> tuple[list, int]:
    """Every step's batch under the `token-budget` layout, packed and dealt over the EP group's ranks.

    A step holds global_batch_sequences x ep / data_parallel_size sequences (each EP rank is one
    data-parallel rank), drawn as prompt groups from their own random stream (seed, model, 1), so the
    routing stream stays the generator's. They are packed first-fit into micro-batches of at most
    `budget` tokens (first_fit_bins); the trace's one micro-batch count per rank is the largest
    ceil(bins / ep) over its steps, and steps with fewer bins split their largest ones to reach it
    (split_largest_bins; slime splits likewise to reach a multiple of the DP size); the bins are dealt
    to ranks by Karmarkar-Karp on estimated forward FLOPs (token_budget_slots). micro_batches (a
    cut-down batch for small profiles): instead draw about micro_batches x ep x budget tokens and keep
    the first micro_batches x ep bins.
    Returns ([(group, domain, length, rank, micro_batch) int64 [n] each, per step], micro-batches per rank).
    """
    rng = np.random.default_rng([int(seed), model_seed(shape), 1])
    dp = cfg.data_parallel_size or ep
    sequences = -(-cfg.global_batch_sequences * ep // dp)
    if micro_batches is None and sequences < ep:
        raise ConfigError(f"token-budget layout: {sequences} sequences per step (global batch "
                          f"{cfg.global_batch_sequences} x ep {ep} / data_parallel_size {dp}) cannot give each of "
                          f"{ep} ranks a micro-batch")
    per_token = (shape.attention_projection_flops_per_token + shape.moe_layer_dense_flops_per_token
                 + shape.top_k * shape.expert_flops_per_token)
    drawn = []
    for _ in range(steps):
        if micro_batches is None:
            group, domain, length = (x[:sequences] for x in
                                     _draw_sequences(rng, domains, weights, 0, cfg, min_sequences=sequences))
        else:
            group, domain, length = _draw_sequences(rng, domains, weights, micro_batches * ep * budget, cfg,
                                                    min_sequences=micro_batches * ep)
        drawn.append((group, domain, length, first_fit_bins(length, budget)))
    if micro_batches is None:
        micro_batches = max(-(-len(bins) // ep) for *_, bins in drawn)
    out = []
    for group, domain, length, bins in drawn:
        bins = split_largest_bins(bins[:micro_batches * ep], micro_batches * ep, length)
        work = np.rint(length * per_token + shape.attention_core_flops(length[:, None])).astype(np.int64)
        rank, mb = token_budget_slots(bins, work, ep)
        out.append((group, domain, length, rank, mb))
    return out, micro_batches


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
                   micro_batches: int | None = None, tokens_per_rank: int | None = None, progress: bool = False,
                   config: WorkloadConfig | None = None, token_level: bool = False) -> RoutingTrace:
    """A synthetic RL routing trace: loads int32 [steps, micro_batches, layers, ep, experts], with seq_lens.

    model: preset name, shape spec or ModelShape; workload: one of WORKLOADS; ep: EP size (divides
    experts); micro_batches: per step; None = derived (token-budget: the packed count of the global
    batch, the largest over the steps; other layouts: FIXED_COUNT_MICRO_BATCHES); under token-budget a
    number sizes a cut-down batch that fills that many micro-batches per rank.
    tokens_per_rank: None = config.tokens_per_rank (None: derived from the global batch of
    config.global_batch_sequences sequences), else about that many tokens per (micro-batch, rank)
    (the budget, under token-budget);
    config: generator knobs (WorkloadConfig()), config.batch_layout says how sequences reach slots;
    token_level: also keep per-token top-k ids (successive sampling per token; only for small configs).
    The random stream is seeded by (seed, model_seed(model)): same arguments, same trace; two models
    never share one routing.
    """
    shape = get_model(model) if isinstance(model, str) else model
    cfg = config or WorkloadConfig()
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    layout = cfg.batch_layout
    budgeted = layout == "token-budget"
    if micro_batches is None and not budgeted:
        micro_batches = FIXED_COUNT_MICRO_BATCHES
    for name, value in (("ep", ep), ("steps", steps), ("micro_batches", micro_batches)):
        if name == "micro_batches" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ConfigError(f"generate_trace: {name} must be a positive integer, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"generate_trace: the seed must be an integer >= 0, got {seed!r}")
    if shape.num_experts % ep:
        near = [d for d in allowed_ep(shape.num_experts) if ep / 4 <= d <= ep * 4]
        raise ConfigError(f"generate_trace: ep={ep} does not divide the {shape.num_experts} experts of {shape.name!r} "
                          f"(every rank homes the same number of experts); EP sizes near it that do: "
                          f"{', '.join(map(str, near))}")
    target = tokens_per_rank if tokens_per_rank is not None else cfg.tokens_per_rank
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, np.integer)) or target <= 0):
        raise ConfigError(f"generate_trace: tokens_per_rank must be a positive integer, got {target!r}")
    l, e, k = shape.num_layers, shape.num_experts, shape.top_k
    if target is not None and (micro_batches or 1) * ep * target > np.iinfo(np.int32).max:
        # refused before any work: a micro-batch's tokens are counted in int32, and drawing them would
        # take memory in proportion
        raise ConfigError(f"generate_trace: {micro_batches or 1} micro-batches x {ep} ranks x {target} tokens per rank "
                          f"= {(micro_batches or 1) * ep * target} tokens per step, beyond the int32 counts of a trace "
                          f"({np.iinfo(np.int32).max})")
    if target is not None and target < mean_sequence_tokens(cfg, workload):
        # fewer tokens per slot than one mean sequence: shorten every sequence so a slot still holds about
        # one whole sequence (small test configs; the sensitivity knob below the derived size)
        cfg = dataclasses.replace(cfg, length_scale=cfg.length_scale * target / mean_sequence_tokens(cfg, workload))
    if workload == "mixed":
        domains = np.arange(len(DOMAINS))
        weights = np.asarray(cfg.mixed_domain_weights, dtype=np.float64)
        domains, weights = domains[weights > 0], weights[weights > 0] / weights.sum()
    else:
        domains, weights = np.array([DOMAINS.index(workload)]), np.array([1.0])
    budget_batches = None
    if budgeted:  # every step's batch first: they fix the trace's one micro-batch count
        budget = int(target) if target is not None else cfg.tokens_per_microbatch
        budget_batches, micro_batches = _token_budget_batches(shape, cfg, domains, weights, ep, steps, seed, budget,
                                                              micro_batches)
    num_slots = micro_batches * ep
    if target is None and not budgeted:
        sequences = num_slots * -(-cfg.global_batch_sequences // num_slots)
    else:
        sequences = None
    if token_level:
        est = (target if target is not None else cfg.tokens_per_microbatch if budgeted
               else sequences // num_slots * mean_sequence_tokens(cfg, workload))
        if steps * micro_batches * ep * est * l * e > 4e8:
            raise ConfigError("generate_trace: token_level is for small configs (steps x micro_batches x ep x "
                              "tokens per slot x layers x experts <= 4e8)")

    rng = np.random.default_rng([int(seed), model_seed(shape)])
    state = _WorkloadState(rng, shape, cfg)
    loads = np.empty((steps, micro_batches, l, ep, e), dtype=np.int32)
    step_lens, step_ids = [], []
    step_iter = range(steps)
    if progress:
        from relibra.progress import progress as tqdm
        step_iter = tqdm(step_iter, desc=f"{shape.name} {workload} EP{ep}", unit="step")
    slot_tokens_all = np.zeros((steps, num_slots), dtype=np.int64)
    for s in step_iter:
        if s:
            state.advance()
        topic_p = state.topic_distributions()  # [D*T, L, E]
        if budgeted:
            seq_group, seq_domain, seq_len, rank_i, mb_i = budget_batches[s]
            group_topics = _topic_weights(rng, seq_domain[:: cfg.responses_per_prompt], state.topic_frequencies(), cfg)
            seq = np.flatnonzero(rank_i >= 0)  # sequences a cut-down batch left out are in no slot
            slot, piece_tokens = mb_i[seq] * ep + rank_i[seq], seq_len[seq]
        else:
            seq_group, seq_domain, seq_len = _draw_sequences(
                rng, domains, weights, num_slots * target if target is not None else 0, cfg,
                min_sequences=sequences if sequences is not None else num_slots)
            group_domain = seq_domain[:: cfg.responses_per_prompt]
            group_topics = _topic_weights(rng, group_domain, state.topic_frequencies(), cfg)
            if layout == "megatron":
                # Megatron-LM's pretraining sampler: the stream packed into equal samples, one per slot, dealt
                # micro-batch major (micro-batch m's ranks take consecutive samples).
                if sequences is not None:
                    seq_group, seq_len = seq_group[:sequences], seq_len[:sequences]
                per_slot = target if target is not None else int(seq_len.sum()) // num_slots
                stream_slot, seq, piece_tokens = pack_sequences(seq_len, per_slot, num_slots)
                mb_i, rank_i = np.divmod(stream_slot, ep)
                slot = mb_i * ep + rank_i
            else:
                unit = ep if layout.endswith("-dynamic") else num_slots  # sequences must split evenly
                if sequences is not None:
                    n = sequences
                else:  # the fewest whole units of sequences that reach the token target
                    n = int(np.searchsorted(np.cumsum(seq_len), num_slots * target)) + 1
                    n = max(num_slots, unit * -(-n // unit))
                    if n > len(seq_len):
                        extra = _draw_sequences(rng, domains, weights, 0, cfg, min_sequences=n - len(seq_len))
                        seq_group = np.concatenate([seq_group, extra[0] + seq_group[-1] + 1])
                        seq_len = np.concatenate([seq_len, extra[2]])
                        group_topics = np.concatenate([group_topics, _topic_weights(
                            rng, extra[1][:: cfg.responses_per_prompt], state.topic_frequencies(), cfg)])
                seq_group, seq_len = seq_group[:n], seq_len[:n]
                rank_i, mb_i = layout_slots(seq_len, seq_group, ep, micro_batches, layout)
                seq = np.arange(n)
                slot, piece_tokens = mb_i * ep + rank_i, seq_len
        slot_tokens = np.bincount(slot, weights=piece_tokens, minlength=num_slots).astype(np.int64)
        slot_tokens_all[s] = slot_tokens
        step_lens.append(slot_seq_lens(slot, piece_tokens, num_slots))
        piece_topics = group_topics[seq_group[seq]]
        used = np.nonzero(piece_topics.any(axis=0))[0]  # topics present this step
        piece_topics = piece_topics[:, used]
        topic_flat = topic_p[used].reshape(len(used), l * e)
        if token_level:
            order = np.argsort(slot, kind="stable")  # tokens grouped by micro-batch, then rank
            ids = _sample_token_ids(rng, piece_topics[order] @ topic_flat, piece_tokens[order], l, e, k)
            mb_tokens = slot_tokens.reshape(micro_batches, ep).sum(axis=1)
            src = np.repeat(np.tile(np.arange(ep), micro_batches), slot_tokens)
            step_ids.append((np.split(ids, np.cumsum(mb_tokens)[:-1]), np.split(src, np.cumsum(mb_tokens)[:-1])))
            continue
        slot_mix = np.zeros((num_slots, len(used)))
        np.add.at(slot_mix, slot, piece_topics * (piece_tokens / slot_tokens[slot])[:, None])
        # One matrix product per step where it is small: many small ones wake BLAS threads over and over,
        # which costs more than the product itself on a shared machine; per micro-batch where it is large.
        whole = num_slots * l * e <= 2**24
        slot_p = (slot_mix @ topic_flat).reshape(micro_batches, ep * l, e) if whole else None
        row_tokens = np.repeat(slot_tokens.reshape(micro_batches, ep), l, axis=1)  # [M, ep*L]
        for m in range(micro_batches):
            p_m = slot_p[m] if whole else (slot_mix[m * ep:(m + 1) * ep] @ topic_flat).reshape(ep * l, e)
            counts = sample_topk_counts(rng, p_m, row_tokens[m], k).reshape(ep, l, e)
            loads[s, m] = counts.transpose(1, 0, 2)
    width = max(x.shape[1] for x in step_lens)
    seq_lens = np.zeros((steps, micro_batches, ep, width), dtype=np.int32)
    for s, x in enumerate(step_lens):
        seq_lens[s, :, :, :x.shape[1]] = x.reshape(micro_batches, ep, -1)
    token_experts = token_src = None
    if token_level:
        t_max = max(len(src) for _, srcs in step_ids for src in srcs)
        token_experts = np.full((steps, micro_batches, t_max, l, k), -1, dtype=np.int16)
        token_src = np.full((steps, micro_batches, t_max), -1, dtype=np.int16)
        for s, (ids_list, src_list) in enumerate(step_ids):
            for m, (ids, src) in enumerate(zip(ids_list, src_list)):
                token_experts[s, m, :len(src)] = ids
                token_src[s, m, :len(src)] = src
        loads = loads_from_tokens(token_experts, token_src, ep, e)
    mb_tokens = slot_tokens_all.reshape(steps, micro_batches, ep).sum(axis=2)
    tokens_per_mb = int(np.clip(round(float(mb_tokens.mean())), mb_tokens.min(), max(int(mb_tokens.max()), 1)))
    provenance = {"generator": "relibra.workloads", "workload": workload, "seed": int(seed),
                  "model_seed": model_seed(shape), "batch_layout": layout,
                  "sequences_per_step": int(np.count_nonzero(seq_lens[0])) if layout != "megatron" else None,
                  "tokens_per_rank": None if target is None else int(target),
                  "mean_tokens_per_slot": float(slot_tokens_all.mean()),
                  "token_level": bool(token_level), "config": cfg.to_dict()}
    return RoutingTrace(loads, shape, ep, tokens_per_mb, provenance, token_experts, token_src, seq_lens)


def mean_sequence_tokens(cfg: WorkloadConfig, workload: str) -> float:
    """Expected tokens of one sequence of a workload (log-normal means of prompt and response, before the cap)."""
    names = DOMAINS if workload == "mixed" else (workload,)
    w = np.asarray(cfg.mixed_domain_weights, dtype=np.float64) if workload == "mixed" else np.array([1.0])
    w = w / w.sum()
    profiles = [cfg.profile(d) for d in names]
    means = [p.prompt_tokens_median * np.exp(p.prompt_tokens_sigma ** 2 / 2)
             + p.response_tokens_median * np.exp(p.response_tokens_sigma ** 2 / 2) for p in profiles]
    return float(cfg.length_scale * np.dot(w, means))


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
                      steps: int = 4, micro_batches: int | None = None, seed: int = 0, tokens_per_rank: int | None = None,
                      config: WorkloadConfig | None = None, progress: bool = False) -> list[dict]:
    """Static-placement skewness and shift statistics of generated traces, one row per (model, workload, EP).

    Each row: model, workload, ep, static_skewness (mean over micro-batches and layers of max/mean
    tokens per rank under static contiguous placement), static_skewness_p95, the SHIFT_KEYS of
    `relibra.analysis.shift_stats`, and seconds (generation time of the whole trace).
    """
    grid = [(m, w, ep) for m in models for w in workloads for ep in eps]
    if progress:
        from relibra.progress import progress as tqdm
        grid = tqdm(grid, desc="calibration", unit="trace")
    rows = []
    for model, workload, ep in grid:
        t0 = time.perf_counter()
        trace = generate_trace(model, workload, ep, steps, seed, micro_batches, tokens_per_rank, config=config)
        seconds = time.perf_counter() - t0
        st = trace_stats(trace)
        rows.append({"model": model, "workload": workload, "ep": ep,
                     "static_skewness": st["static_skewness"], "static_skewness_p95": st["static_skewness_p95"],
                     **{key: st[key] for key in SHIFT_KEYS}, "seconds": seconds})
    return rows
