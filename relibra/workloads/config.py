"""Knobs of the synthetic workload generator: the task domains, their sequence lengths, the batch layouts
and the routing model's logit spreads (WorkloadConfig); the per-model seed key and the EP sizes a model allows."""

from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass

import numpy as np

from relibra.cluster import ModelShape
from relibra.errors import ConfigError

WORKLOADS = ("math", "science", "instruct", "code", "mixed")
# How a step's sequences reach (micro-batch, rank) slots; see layout_slots and docs/traces.md.
BATCH_LAYOUTS = ("token-budget", "verl-balance", "verl", "verl-dynamic", "slime", "slime-dynamic", "megatron")
DEFAULT_BATCH_LAYOUT = "token-budget"
# The layouts that deal a fixed number of whole sequences to every (micro-batch, rank) slot; the paper's
# 32 micro-batches per step is their default count (token-budget derives its count from the budget).
FIXED_COUNT_MICRO_BATCHES = 32
DOMAINS = ("math", "science", "instruct", "code")
# The micro-batch shift (WorkloadConfig.microbatch_shift) a study sweeps, from the generator's default (no shift
# beyond the sequences a micro-batch holds) to the sharpest the routing data supports (docs/traces.md, "Routing
# against public data"): 0.3, where traces of qwen3-30b-a3b on the default card at EP 32 reach the kit's real RL
# trace's micro-batch correlations (consecutive 0.55, against the step 0.77; mixed at 0.23-0.25, math at
# 0.25-0.28). At that trace's own scale the generator already decorrelates more than it (0.45 at shift 0), so
# read at matched scale the data support no shift beyond 0.
MICROBATCH_SHIFT_RANGE = (0.0, 0.3)


@dataclass(frozen=True)
class DomainProfile:
    """Sequence lengths of one task domain, in tokens. Lengths are log-normal: median * exp(sigma * z)."""

    name: str
    prompt_tokens_median: float
    prompt_tokens_sigma: float
    response_tokens_median: float
    response_tokens_sigma: float


# Chain-of-thought responses for math (DAPO-Math-17k: median 1307, sigma 0.9, so the log-normal mean is the
# 1960 tokens volcengine/verl docs/perf/dpsk.md gives for that data set), shorter ones for multiple-choice
# science QA (GPQA) and instruction following (IFBench); code (CodeForces) has long statements. The set-up
# cards (data/setups/) hold the same values with their sources.
DOMAIN_PROFILES: dict[str, DomainProfile] = {
    "math": DomainProfile("math", 180, 0.5, 1307, 0.9),
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
    context_parallel, tensor_parallel: under `token-budget`, the CP x TP ranks every sequence is split over
        (Megatron's context parallelism: 2 x CP chunks, CP rank c taking chunks c and 2 CP - 1 - c;
        sequence parallelism: each CP share over the TP ranks). Bins then hold tokens_per_microbatch x CP x TP
        tokens (slime's max_tokens_per_gpu x CP), dealt over EP / (CP x TP) data-parallel slots, and EP rank
        (slot x CP + c) x TP + t holds its piece of every sequence of its slot's bin (layouts.split_pieces).
        1, 1 (default): whole sequences, as before.
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
    microbatch_shift: the micro-batch shift, a share in [0, 1] (MICROBATCH_SHIFT_RANGE): in every (step,
        micro-batch, layer) round(microbatch_shift x experts) experts, drawn at random, trade their shares by
        a random permutation among them, the same for every slot of the micro-batch. A micro-batch's hot
        experts then move away from its step's while every slot's load stays exactly as concentrated (a
        permutation of its shares): shift, not extra imbalance. The draws come from their own random stream
        (seed, model, 2); 0 (default) draws nothing and gives the same traces, byte for byte, as a generator
        without the knob. Under token-budget the batch has its own stream too, so moving the shift keeps
        every step's sequences; the sampling after the first shifted micro-batch draws other random numbers.
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
    microbatch_shift: float = 0.0
    responses_per_prompt: int = 16
    batch_layout: str = DEFAULT_BATCH_LAYOUT
    tokens_per_microbatch: int = 16384
    data_parallel_size: int | None = None
    context_parallel: int = 1
    tensor_parallel: int = 1
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
        for name in ("context_parallel", "tensor_parallel"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ConfigError(f"workload config: {name} must be a positive integer, got {v!r}")
        if not self.length_scale > 0:
            raise ConfigError(f"workload config: length_scale must be positive, got {self.length_scale}")
        if not self.topic_concentration > 0:
            raise ConfigError(f"workload config: topic_concentration must be positive, got {self.topic_concentration}")
        if not 0 <= self.microbatch_shift <= 1:
            raise ConfigError(f"workload config: microbatch_shift must lie in [0, 1], got {self.microbatch_shift}")
        if not 0 <= self.drift_per_step <= 1:
            raise ConfigError(f"workload config: drift_per_step must lie in [0, 1], got {self.drift_per_step}")
        if self.domain_profiles is not None and (len(self.domain_profiles) != len(DOMAINS) or any(
                not isinstance(p, DomainProfile) or p.name != d for p, d in zip(self.domain_profiles, DOMAINS))):
            raise ConfigError(f"workload config: domain_profiles must be DomainProfiles of {', '.join(DOMAINS)} in order")
        for p in self.domain_profiles or ():  # exp(sigma * z) of an infinite or negative knob is no length
            knobs = dataclasses.astuple(p)[1:]
            if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in knobs):
                raise ConfigError(f"workload config: domain profile {p.name!r} needs positive finite medians and "
                                  f"sigmas, got {knobs}")
        w = np.asarray(self.mixed_domain_weights, dtype=np.float64)
        if w.shape != (len(DOMAINS),) or (w < 0).any() or not w.sum() > 0:
            raise ConfigError(f"workload config: mixed_domain_weights must be {len(DOMAINS)} non-negative "
                              f"weights, got {self.mixed_domain_weights}")

    def profile(self, domain: str) -> DomainProfile:
        """Sequence lengths of one task domain."""
        return DOMAIN_PROFILES[domain] if self.domain_profiles is None else self.domain_profiles[DOMAINS.index(domain)]

    def to_dict(self) -> dict:
        """Every knob; the micro-batch shift only where it is not 0, so a trace made at the default has the bytes
        it had before the knob existed."""
        out = dataclasses.asdict(self)
        if out["microbatch_shift"] == 0:
            del out["microbatch_shift"]
        for name in ("context_parallel", "tensor_parallel"):  # likewise: whole sequences give the old bytes
            if out[name] == 1:
                del out[name]
        return out


def model_seed(shape: ModelShape) -> int:
    """A stable 32-bit key of a model's name and routing shape, mixed into the generator's seed so that
    two models never share one routing (crc32 of "name|layers|experts|top_k")."""
    key = f"{shape.name}|{shape.num_layers}|{shape.num_experts}|{shape.top_k}"
    return zlib.crc32(key.encode())


def allowed_ep(num_experts: int, limit: int = 512) -> list[int]:
    """EP sizes up to `limit` that divide num_experts (every rank homes the same number of experts)."""
    return [d for d in range(1, min(num_experts, limit) + 1) if num_experts % d == 0]
