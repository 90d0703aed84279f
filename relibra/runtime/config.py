"""Small dataclasses that configure one runtime launch, torchtitan-style: RunOptions nests the model,
parallelism, measurement and fault options (the same on every rank); ModelConfig and TrainConfig are
what one engine is built from."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from relibra.cluster import ModelShape, get_model
from relibra.errors import ConfigError


def _positive_int(value, flag: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{flag} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ModelOptions:
    """Which model trains and how: a relibra.cluster preset, parameter dtype, seed, AdamW rate.
    float64 makes multi-step comparisons independent of roundoff (the equivalence check)."""

    name: str = "tiny"
    dtype: str = "float32"
    seed: int = 0
    lr: float = 1e-3

    def validate(self) -> None:
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"--dtype must be float32 or float64, got {self.dtype!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ConfigError(f"--seed must be an integer in [0, 2^63), got {self.seed!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"--lr must be a finite positive number, got {self.lr!r}")


@dataclass(frozen=True)
class ParallelismOptions:
    """Expert parallelism over every rank, ranks grouped into `nodes` simulated nodes."""

    nodes: int = 1
    threads_per_rank: int = 1

    def validate(self) -> None:
        _positive_int(self.nodes, "--nodes")
        _positive_int(self.threads_per_rank, "--threads-per-rank")


@dataclass(frozen=True)
class MeasurementOptions:
    """Timing of a launch. Policies alternate step by step on the same data (megatron, relibra,
    megatron, ...); the first warmup_steps of each are trained but not recorded. split_waiting: a
    timed barrier before each all-to-all and replica transfer (waiting apart from own work).
    check_equivalence: also train the static placement on the same data and compare."""

    steps: int = 20
    warmup_steps: int = 2
    split_waiting: bool = True
    check_equivalence: bool = False

    def validate(self) -> None:
        _positive_int(self.steps, "--steps")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError(f"--warmup-steps must be >= 0, got {self.warmup_steps!r}")


@dataclass(frozen=True)
class FaultOptions:
    """collective_timeout_s: gloo/NCCL timeout of every collective, and how long a local launch's rank may go
    without a heartbeat (relibra.runtime.watchdog): a stalled rank ends the run after it;
    on_migration_failure: "continue" (keep the old placement, one warning line) or "stop"."""

    collective_timeout_s: float = 120.0
    on_migration_failure: str = "continue"

    def validate(self) -> None:
        if not (math.isfinite(self.collective_timeout_s) and self.collective_timeout_s > 0):
            raise ConfigError(f"--collective-timeout must be a finite positive number of seconds, got "
                              f"{self.collective_timeout_s!r}")
        if self.on_migration_failure not in ("continue", "stop"):
            raise ConfigError(f"--on-migration-failure must be continue or stop, got {self.on_migration_failure!r}")


@dataclass(frozen=True)
class RunOptions:
    """Everything the runtime needs besides the plans (the same on every rank)."""

    model: ModelOptions = field(default_factory=ModelOptions)
    parallelism: ParallelismOptions = field(default_factory=ParallelismOptions)
    measurement: MeasurementOptions = field(default_factory=MeasurementOptions)
    faults: FaultOptions = field(default_factory=FaultOptions)

    def validate(self) -> "RunOptions":
        """Raise ConfigError naming the first bad option."""
        for part in (self.model, self.parallelism, self.measurement, self.faults):
            part.validate()
        return self


@dataclass(frozen=True)
class NodeLayout:
    """Ranks grouped into simulated nodes: rank r sits on node r // ranks_per_node."""

    world_size: int
    num_nodes: int

    def __post_init__(self):
        if self.world_size <= 0 or self.num_nodes <= 0:
            raise ConfigError(f"world size {self.world_size} and nodes {self.num_nodes} must be positive")
        if self.world_size % self.num_nodes:
            raise ConfigError(f"{self.num_nodes} nodes do not divide {self.world_size} ranks")

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.num_nodes

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def node_ranks(self, node: int) -> list[int]:
        return list(range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node))


@dataclass(frozen=True)
class ModelConfig:
    """The small MoE transformer: a ModelShape preset plus runtime-only choices.

    num_layers: MoE layers actually built (<= the preset's; the trace must have as many).
    replica_slots: spare slots per rank, shared by all layers (the layer-shared replica buffer).
    dtype: parameter and activation dtype.
    """

    shape: ModelShape
    num_layers: int
    replica_slots: int = 0
    seed: int = 0
    dtype: str = "float32"  # "float64" makes multi-step AdamW comparisons independent of roundoff

    @classmethod
    def from_preset(cls, name: str, num_layers: int | None = None, replica_slots: int = 0, seed: int = 0,
                    dtype: str = "float32"):
        shape = get_model(name)
        return cls(shape, num_layers or shape.num_layers, replica_slots, seed, dtype)

    @property
    def torch_dtype(self):
        import torch  # here: the launcher's process and relibra.runtime.measure import this module without torch

        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"dtype must be float32 or float64, got {self.dtype!r}")
        return getattr(torch, self.dtype)

    @property
    def hidden(self) -> int:
        return self.shape.hidden

    @property
    def num_experts(self) -> int:
        return self.shape.num_experts


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer and loop settings (AdamW)."""

    steps: int = 2
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.01
    eps: float = 1e-8
    threads_per_rank: int = 1
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)
