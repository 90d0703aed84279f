"""Small dataclasses that configure one runtime launch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from relibra.cluster import ModelShape, get_model
from relibra.errors import ConfigError


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
        import torch

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
