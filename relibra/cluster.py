"""Model shapes and cluster topologies, kept as data (presets) plus validated constructors.

Units are in the field names: bytes, GB/s (1e9 bytes per second, one direction), TFLOP/s.
Model shapes come from the public configs of each model; hardware figures from datasheets and
DeepEP's published measurements (see docs/cost-model.md).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from relibra.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """Shape of an MoE transformer, enough to size its routing and cost its compute.

    num_layers counts MoE layers only; num_dense_layers are extra leading layers with a dense FFN.
    """

    name: str
    num_layers: int
    num_experts: int
    top_k: int
    hidden: int
    moe_ffn: int
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    dense_ffn: int = 0
    num_attention_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 151936
    bytes_per_param: int = 2  # bf16 weights and activations
    optimizer_bytes_per_param: int = 12  # fp32 master copy + Adam m and v

    def __post_init__(self):
        for field in ("num_layers", "num_experts", "top_k", "hidden", "moe_ffn"):
            if getattr(self, field) <= 0:
                raise ConfigError(f"model {self.name!r}: {field} must be positive, got {getattr(self, field)}")
        if self.top_k > self.num_experts:
            raise ConfigError(f"model {self.name!r}: top_k={self.top_k} exceeds num_experts={self.num_experts}")

    @property
    def expert_params(self) -> int:
        """Parameters of one SwiGLU routed expert (gate, up and down projections)."""
        return 3 * self.hidden * self.moe_ffn

    @property
    def expert_bytes(self) -> int:
        """Weight bytes of one routed expert."""
        return self.expert_params * self.bytes_per_param

    @property
    def token_bytes(self) -> int:
        """Bytes of one token's hidden state as sent by dispatch or combine."""
        return self.hidden * self.bytes_per_param

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelShape":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"model shape: unknown fields {sorted(unknown)}")
        return cls(**d)


MODEL_PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in [
        ModelShape("qwen3-30b-a3b", num_layers=48, num_experts=128, top_k=8, hidden=2048, moe_ffn=768,
                   num_attention_heads=32, num_kv_heads=4, head_dim=128, vocab_size=151936),
        ModelShape("glm-4.5-air", num_layers=45, num_experts=128, top_k=8, hidden=4096, moe_ffn=1408,
                   num_shared_experts=1, num_dense_layers=1, dense_ffn=10944,
                   num_attention_heads=96, num_kv_heads=8, head_dim=128, vocab_size=151552),
        ModelShape("qwen3-235b-a22b", num_layers=94, num_experts=128, top_k=8, hidden=4096, moe_ffn=1536,
                   num_attention_heads=64, num_kv_heads=4, head_dim=128, vocab_size=151936),
        # Small shapes for tests, tutorials and the CPU runtime.
        ModelShape("tiny", num_layers=4, num_experts=16, top_k=2, hidden=64, moe_ffn=128,
                   num_attention_heads=4, num_kv_heads=4, head_dim=16, vocab_size=512, bytes_per_param=4),
        ModelShape("small", num_layers=8, num_experts=32, top_k=4, hidden=128, moe_ffn=256,
                   num_attention_heads=4, num_kv_heads=4, head_dim=32, vocab_size=1024, bytes_per_param=4),
        # The policy of the real RL workload (relibra.rl, docs/rl.md), fp32 with Adam m and v.
        ModelShape("rl-tiny", num_layers=4, num_experts=32, top_k=4, hidden=64, moe_ffn=128,
                   num_attention_heads=4, num_kv_heads=4, head_dim=16, vocab_size=68, bytes_per_param=4,
                   optimizer_bytes_per_param=8),
    ]
}


def get_model(name: str) -> ModelShape:
    """The preset called `name`; a ConfigError lists the known ones otherwise."""
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; known: {', '.join(MODEL_PRESETS)}") from None


DISPATCHERS = ("deepep", "alltoall")


@dataclass(frozen=True)
class Topology:
    """A cluster of identical nodes. Bandwidths are per GPU and per direction.

    matmul_tflops is the large-GEMM rate of one GPU; small GEMMs reach a fraction of it given by
    `gemm_efficiency(tokens)` in relibra.sim, whose half-saturation point is gemm_half_tokens.
    """

    name: str
    num_nodes: int
    gpus_per_node: int
    nvlink_GBps: float  # GB/s one direction per GPU, inside a node
    rdma_GBps: float  # GB/s one direction per GPU, across nodes
    matmul_tflops: float  # dense bf16 rate on large products, per GPU
    gemm_half_tokens: float = 512.0  # tokens per expert GEMM at which efficiency reaches one half
    memory_GBps: float = 4000.0  # HBM bandwidth, GB/s
    collective_latency_s: float = 20e-6  # fixed cost of one all-to-all launch
    hbm_bytes: float = 141e9
    attention_efficiency: float = 0.7  # share of matmul_tflops the attention core (flash attention) reaches
    dispatcher: str = "deepep"  # token exchange: "deepep" (rail route, one copy per token and node / GPU) or
    #                             "alltoall" (direct NIC to NIC, one row per token-expert pair); see relibra.costs
    shared_link: bool = False  # one link for all traffic (a single machine's loopback), at nvlink_GBps

    def __post_init__(self):
        for field in ("num_nodes", "gpus_per_node"):
            if getattr(self, field) <= 0:
                raise ConfigError(f"topology {self.name!r}: {field} must be a positive integer, got {getattr(self, field)}")
        for field in ("nvlink_GBps", "rdma_GBps", "matmul_tflops", "gemm_half_tokens", "memory_GBps", "hbm_bytes"):
            value = getattr(self, field)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"topology {self.name!r}: {field} must be positive and finite, got {value}")
        if self.dispatcher not in DISPATCHERS:
            raise ConfigError(f"topology {self.name!r}: dispatcher must be one of {DISPATCHERS}, got {self.dispatcher!r}")
        if not 0 < self.attention_efficiency <= 1:
            raise ConfigError(f"topology {self.name!r}: attention_efficiency must be in (0, 1], "
                              f"got {self.attention_efficiency}")
        if not (self.collective_latency_s >= 0 and math.isfinite(self.collective_latency_s)):
            raise ConfigError(f"topology {self.name!r}: collective_latency_s must be >= 0 and finite, "
                              f"got {self.collective_latency_s}")

    @property
    def route(self) -> str:
        """How bytes cross nodes by default: "rail" under DeepEP, "direct" under a plain all-to-all."""
        return "rail" if self.dispatcher == "deepep" else "direct"

    @property
    def dedup(self) -> bool:
        """Whether the dispatcher sends a token once per destination node / GPU (DeepEP) by default."""
        return self.dispatcher == "deepep"

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def ep_layout(self, ep: int) -> tuple[int, int]:
        """(nodes, gpus per node) spanned by one EP group of `ep` GPUs, packed node by node."""
        if ep <= 0:
            raise ConfigError(f"EP size must be positive, got {ep}")
        if ep > self.num_gpus:
            raise ConfigError(f"EP size {ep} exceeds the {self.num_gpus} GPUs of topology {self.name!r}")
        if ep <= self.gpus_per_node:
            if self.gpus_per_node % ep:
                raise ConfigError(f"EP size {ep} does not divide {self.gpus_per_node} GPUs per node of {self.name!r}")
            return 1, ep
        if ep % self.gpus_per_node:
            raise ConfigError(f"{self.gpus_per_node} GPUs per node of {self.name!r} do not divide EP size {ep}")
        return ep // self.gpus_per_node, self.gpus_per_node

    def with_changes(self, **changes) -> "Topology":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


TOPOLOGY_PRESETS: dict[str, Topology] = {
    t.name: t
    for t in [
        # The paper's cluster: 20 x 8 Hopper; NVLink 900 GB/s both ways = 450 each way; 8 x 400 Gb/s NICs.
        Topology("paper", num_nodes=20, gpus_per_node=8, nvlink_GBps=450.0, rdma_GBps=50.0, matmul_tflops=790.0),
        # DeepEP's measured effective all-to-all bandwidths on H800 (intranode ~155, internode ~50 GB/s).
        Topology("h800", num_nodes=20, gpus_per_node=8, nvlink_GBps=155.0, rdma_GBps=50.0, matmul_tflops=790.0),
        # One NVLink domain of 72 GPUs (GB200 NVL72 class), 900 GB/s each way per GPU.
        Topology("nvl72", num_nodes=1, gpus_per_node=72, nvlink_GBps=900.0, rdma_GBps=50.0, matmul_tflops=2250.0,
                 memory_GBps=8000.0),
        # This machine running the gloo runtime (2 simulated nodes x 2 ranks, one thread per rank), measured
        # by relibra.runtime.calibrate into data/cpu_gloo_calibration.json: the `tiny` expert's forward +
        # backward fit, and gloo's all-to-all over loopback (one shared link, no relay). The expert fit was
        # taken by one rank alone; the runtime runs 4 ranks on this machine's 2 cores, so each rank gets
        # half a core: the preset's rate is the single-rank fit x 2 cores / 4 ranks.
        Topology("cpu-gloo", num_nodes=2, gpus_per_node=2, nvlink_GBps=0.417, rdma_GBps=0.417,
                 matmul_tflops=0.0538 * 2 / 4,
                 gemm_half_tokens=21.8, memory_GBps=10.0, collective_latency_s=6.8e-4, hbm_bytes=24e9,
                 dispatcher="alltoall", shared_link=True),
    ]
}


def get_topology(name: str) -> Topology:
    """The preset called `name`; a ConfigError lists the known ones otherwise."""
    try:
        return TOPOLOGY_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown cluster preset {name!r}; known: {', '.join(TOPOLOGY_PRESETS)}") from None


# Short names accepted by parse_topology for the Topology fields.
_TOPOLOGY_ALIASES = {"nodes": "num_nodes", "gpus": "gpus_per_node", "nvlink": "nvlink_GBps", "rdma": "rdma_GBps",
                     "tflops": "matmul_tflops", "half_tokens": "gemm_half_tokens", "latency_s": "collective_latency_s"}
_TOPOLOGY_REQUIRED = ("num_nodes", "gpus_per_node", "nvlink_GBps", "rdma_GBps", "matmul_tflops")


def resolve_topology(topology: "Topology | str") -> Topology:
    """A Topology as given, or parsed from a preset name / spec string (see parse_topology)."""
    return topology if isinstance(topology, Topology) else parse_topology(topology)


def parse_topology(spec: str) -> Topology:
    """A topology from a preset name, a preset with changes, or a full custom description.

    spec: comma-separated items. An item without '=' names a preset to start from (at most one, first);
    the others are field=value (Topology field names, or the short aliases nodes, gpus, nvlink, rdma,
    tflops, half_tokens, latency_s). Examples: "paper"; "paper,rdma_GBps=25";
    "nodes=4,gpus_per_node=8,nvlink_GBps=450,rdma_GBps=50,matmul_tflops=790". Without a preset the
    fields num_nodes, gpus_per_node, nvlink_GBps, rdma_GBps and matmul_tflops are required. The name
    is the spec itself unless name=... is given. Every problem is a ConfigError naming the item.
    """
    spec = (spec or "").strip()
    if not spec:
        raise ConfigError("empty cluster description; give a preset name "
                          f"({', '.join(TOPOLOGY_PRESETS)}) or field=value items")
    items = [item.strip() for item in spec.split(",")]
    base: Topology | None = None
    changes: dict = {}
    fields = {f.name: f for f in dataclasses.fields(Topology)}
    for i, item in enumerate(items):
        if not item:
            raise ConfigError(f"cluster {spec!r}: empty item at position {i}")
        if "=" not in item:
            if i != 0:
                raise ConfigError(f"cluster {spec!r}: preset name {item!r} must come first")
            base = get_topology(item)
            continue
        key, _, raw = (part.strip() for part in item.partition("="))
        key = _TOPOLOGY_ALIASES.get(key, key)
        if key not in fields:
            known = sorted(set(fields) | set(_TOPOLOGY_ALIASES))
            raise ConfigError(f"cluster {spec!r}: unknown field {key!r}; known: {', '.join(known)}")
        if key in changes:
            raise ConfigError(f"cluster {spec!r}: field {key!r} given twice")
        if key == "name":
            changes[key] = raw
            continue
        if key == "dispatcher":
            changes[key] = raw
            continue
        if key == "shared_link":
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ConfigError(f"cluster {spec!r}: field 'shared_link' must be true or false, got {raw!r}")
            changes[key] = raw.lower() in ("true", "1")
            continue
        kind = int if key in ("num_nodes", "gpus_per_node") else float
        try:
            value = kind(raw)
        except ValueError:
            raise ConfigError(f"cluster {spec!r}: field {key!r} must be {'an integer' if kind is int else 'a number'}, "
                              f"got {raw!r}") from None
        changes[key] = value
    name = changes.pop("name", spec if (base is None or changes) else base.name)
    if base is not None:
        return base.with_changes(name=name, **changes)
    missing = [f for f in _TOPOLOGY_REQUIRED if f not in changes]
    if missing:
        raise ConfigError(f"cluster {spec!r}: a custom cluster needs {', '.join(missing)} "
                          f"(or start from a preset, e.g. 'paper,{missing[0]}=...')")
    return Topology(name=name, **changes)
