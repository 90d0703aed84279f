"""Model shapes and cluster topologies, kept as data (presets) plus validated constructors.

Units are in the field names: bytes, GB/s (1e9 bytes per second, one direction), TFLOP/s.
Model shapes come from the public configs of each model; hardware figures from datasheets and
DeepEP's published measurements (see docs/cost-model.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relibra.errors import ConfigError


# The largest value of each ModelShape field the kit accepts: several times the largest published MoE
# (Kimi-K2: 61 layers, 384 experts, hidden 7168, 64 heads, vocabulary 163840; DeepSeek-V3: 256 experts,
# dense FFN 18432), so that a typo (an extra digit or three) is refused before any array is sized by it.
MODEL_LIMITS = {"num_layers": 1024, "num_experts": 65536, "top_k": 1024, "hidden": 131072, "moe_ffn": 262144,
                "num_shared_experts": 64, "num_dense_layers": 1024, "dense_ffn": 262144,
                "num_attention_heads": 1024, "num_kv_heads": 1024, "head_dim": 2048, "vocab_size": 2**24,
                "bytes_per_param": 16, "optimizer_bytes_per_param": 64}


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
        if not isinstance(self.name, str) or not self.name or not self.name.isprintable():
            raise ConfigError(f"model name {self.name!r}: must be a non-empty string of printable characters "
                              f"(no control characters such as ESC, CR or LF)")
        for field in ("num_layers", "num_experts", "top_k", "hidden", "moe_ffn", "num_attention_heads",
                      "num_kv_heads", "head_dim", "vocab_size", "bytes_per_param", "optimizer_bytes_per_param",
                      "num_shared_experts", "num_dense_layers", "dense_ffn"):
            value = getattr(self, field)
            low = 0 if field in ("num_shared_experts", "num_dense_layers", "dense_ffn") else 1
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ConfigError(f"model {self.name!r}: {field} must be an integer >= {low}, got {value!r}")
        if self.top_k > self.num_experts:
            raise ConfigError(f"model {self.name!r}: top_k={self.top_k} exceeds num_experts={self.num_experts}")
        for field, most in MODEL_LIMITS.items():
            if getattr(self, field) > most:
                raise ConfigError(f"model {self.name!r}: {field}={getattr(self, field)} is over the kit's bound of "
                                  f"{most} (relibra.cluster.MODEL_LIMITS)")
        if self.num_attention_heads % self.num_kv_heads:
            raise ConfigError(f"model {self.name!r}: num_kv_heads={self.num_kv_heads} must divide "
                              f"num_attention_heads={self.num_attention_heads} (each KV head serves a whole group "
                              f"of query heads)")

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

    # ---- per-token FLOPs and per-expert bytes: the one definition the cost model and planners use ----
    @property
    def expert_flops_per_token(self) -> float:
        """Forward FLOPs of one routed expert per token (gate, up and down GEMMs): 6 * hidden * moe_ffn."""
        return 2.0 * self.expert_params

    @property
    def expert_train_flops_per_token(self) -> float:
        """Forward + backward FLOPs of one routed expert per token (backward = 2 x forward): 18 * hidden * moe_ffn."""
        return 3.0 * self.expert_flops_per_token

    def expert_state_bytes(self, dp_size: int = 1) -> float:
        """Bytes one EP rank sends when an expert changes home: its weights, plus its optimizer state
        sharded over `dp_size` data-parallel ranks (a distributed optimizer; 1 = unsharded)."""
        if dp_size <= 0:
            raise ConfigError(f"model {self.name!r}: dp_size must be positive, got {dp_size}")
        return self.expert_params * (self.bytes_per_param + self.optimizer_bytes_per_param / dp_size)

    @property
    def attention_projection_flops_per_token(self) -> float:
        """Forward FLOPs per token of one layer's Q, K, V and output projections."""
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return 2.0 * self.hidden * (q + 2 * kv) + 2.0 * q * self.hidden

    def attention_core_flops(self, seq_lens) -> np.ndarray:
        """Forward FLOPs of one layer's causal attention core (Q K^T and A V) over sequences of these lengths.

        seq_lens: int array [..., sequences] (0 = padding). Token i of a sequence attends to i + 1
        positions, so a sequence of n tokens costs 2 * 2 * heads * head_dim * n (n + 1) / 2 FLOPs.
        Returns float64 [...] (the last axis summed).
        """
        n = np.asarray(seq_lens, dtype=np.float64)
        q = self.num_attention_heads * self.head_dim
        return (2.0 * q * n * (n + 1.0)).sum(axis=-1)

    @property
    def moe_layer_dense_flops_per_token(self) -> float:
        """Forward FLOPs per token of an MoE layer's non-attention dense parts: router and shared experts."""
        return 2.0 * self.hidden * self.num_experts + self.num_shared_experts * 2.0 * self.expert_params

    @property
    def dense_params(self) -> int:
        """Parameters every EP rank holds whole (no tensor or pipeline parallelism): attention, router,
        shared experts, dense layers, embedding and LM head (untied)."""
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden
        moe_layer = attention + self.hidden * self.num_experts + self.num_shared_experts * self.expert_params
        dense_layer = attention + 3 * self.hidden * self.dense_ffn
        return (self.num_layers * moe_layer + self.num_dense_layers * dense_layer
                + 2 * self.vocab_size * self.hidden)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelShape":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"model shape: unknown fields {sorted(unknown)}")
        return cls(**d)


# The paper's three models (128 routed experts, top-8 each), the grid of the headline, map, overheads and
# calibration figures; spelled here only.
PAPER_MODELS = ("qwen3-30b-a3b", "glm-4.5-air", "qwen3-235b-a22b")

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
        # The CPU runtime's expert-dominated shape (docs/runtime.md): few layers, wide experts, thin
        # attention, small vocabulary, so routed experts take most of a step as in the paper's models
        # on GPUs; fp32 weights with AdamW m and v (no master copy).
        ModelShape("moe-cpu", num_layers=2, num_experts=8, top_k=2, hidden=256, moe_ffn=1024,
                   num_attention_heads=2, num_kv_heads=2, head_dim=16, vocab_size=256, bytes_per_param=4,
                   optimizer_bytes_per_param=8),
        # The policy of the real RL workload (relibra.rl, docs/rl.md), fp32 with Adam m and v.
        ModelShape("rl-tiny", num_layers=4, num_experts=32, top_k=4, hidden=64, moe_ffn=128,
                   num_attention_heads=4, num_kv_heads=4, head_dim=16, vocab_size=68, bytes_per_param=4,
                   optimizer_bytes_per_param=8),
        # Beyond the paper's scale (docs/scale.md). Both use multi-head latent attention (MLA), which the
        # GQA-shaped fields here approximate: 128 (DeepSeek-V3) or 64 (Kimi-K2) query heads of head_dim 128
        # (MLA's value head dim; its query-key dim is 128 + 64 rope = 192) and one KV head, standing for
        # MLA's compressed KV path. Against MLA as trained (no weight absorption) this charges the attention
        # core about 20% less (128 instead of 160 mean of QK and V head dims) and the projections about 25%
        # more (DeepSeek-V3: 237M instead of 187M parameters per layer). Shapes from the models' config.json.
        ModelShape("deepseek-v3", num_layers=58, num_experts=256, top_k=8, hidden=7168, moe_ffn=2048,
                   num_shared_experts=1, num_dense_layers=3, dense_ffn=18432,
                   num_attention_heads=128, num_kv_heads=1, head_dim=128, vocab_size=129280),
        ModelShape("kimi-k2", num_layers=60, num_experts=384, top_k=8, hidden=7168, moe_ffn=2048,
                   num_shared_experts=1, num_dense_layers=1, dense_ffn=18432,
                   num_attention_heads=64, num_kv_heads=1, head_dim=128, vocab_size=163840),
    ]
}


def get_model(name: str) -> ModelShape:
    """The preset called `name`, or a shape spec with '=' items (see parse_model); a ConfigError lists the
    known presets otherwise."""
    if isinstance(name, str) and "=" in name:
        return parse_model(name)
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; known: {', '.join(MODEL_PRESETS)} "
                          f"(or a shape spec such as 'deepseek-v3,layers=4' or "
                          f"'layers=8,experts=64,top_k=4,hidden=1024,moe_ffn=512')") from None


# Short names accepted by parse_model for the ModelShape fields.
_MODEL_ALIASES = {"layers": "num_layers", "experts": "num_experts", "topk": "top_k", "ffn": "moe_ffn",
                  "shared": "num_shared_experts", "dense_layers": "num_dense_layers", "heads": "num_attention_heads",
                  "kv_heads": "num_kv_heads", "vocab": "vocab_size"}
_MODEL_REQUIRED = ("num_layers", "num_experts", "top_k", "hidden", "moe_ffn")


def parse_model(spec: str) -> ModelShape:
    """A model shape from a preset name, a preset with changes, or a full custom description.

    spec: comma-separated items, as parse_topology's: an optional preset name first, then field=value
    (ModelShape field names, or the aliases layers, experts, topk, ffn, shared, dense_layers, heads,
    kv_heads, vocab). Examples: "deepseek-v3"; "deepseek-v3,layers=4";
    "layers=8,experts=64,top_k=4,hidden=1024,moe_ffn=512". Without a preset num_layers, num_experts,
    top_k, hidden and moe_ffn are required. The name is the spec itself unless name=... is given.
    Every problem is a ConfigError naming the item.
    """
    spec = (spec or "").strip()
    if not spec:
        raise ConfigError(f"empty model description; give a preset name ({', '.join(MODEL_PRESETS)}) "
                          f"or field=value items")
    items = [item.strip() for item in spec.split(",")]
    base: ModelShape | None = None
    changes: dict = {}
    fields = {f.name for f in dataclasses.fields(ModelShape)}
    for i, item in enumerate(items):
        if not item:
            raise ConfigError(f"model {spec!r}: empty item at position {i}")
        if "=" not in item:
            if i != 0:
                raise ConfigError(f"model {spec!r}: preset name {item!r} must come first")
            if item not in MODEL_PRESETS:
                raise ConfigError(f"model {spec!r}: unknown preset {item!r}; known: {', '.join(MODEL_PRESETS)}")
            base = MODEL_PRESETS[item]
            continue
        key, _, raw = (part.strip() for part in item.partition("="))
        key = _MODEL_ALIASES.get(key, key)
        if key not in fields:
            known = sorted(fields | set(_MODEL_ALIASES))
            raise ConfigError(f"model {spec!r}: unknown field {key!r}; known: {', '.join(known)}")
        if key in changes:
            raise ConfigError(f"model {spec!r}: field {key!r} given twice")
        if key == "name":
            changes[key] = raw
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"model {spec!r}: field {key!r} must be an integer, got {raw!r}") from None
        if value < 0:
            raise ConfigError(f"model {spec!r}: field {key!r} must be >= 0, got {value}")
        changes[key] = value
    name = changes.pop("name", spec if (base is None or changes) else base.name)
    if base is not None:
        return dataclasses.replace(base, name=name, **changes)
    missing = [f for f in _MODEL_REQUIRED if f not in changes]
    if missing:
        raise ConfigError(f"model {spec!r}: a custom model needs {', '.join(missing)} "
                          f"(or start from a preset, e.g. 'deepseek-v3,{missing[0]}=...')")
    return ModelShape(name=name, **changes)


DISPATCHERS = ("deepep", "alltoall")


@dataclass(frozen=True)
class Topology:
    """A cluster of identical nodes. Bandwidths are per GPU and per direction.

    matmul_tflops is the large-GEMM rate of one GPU; a GEMM of t rows takes as long as t +
    gemm_half_tokens rows at that rate (relibra.costs.flops.gemm_seconds), so it reaches half the
    rate at gemm_half_tokens rows.
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
    pcie_GBps: float = 64.0  # host link per GPU and direction (PCIe Gen5 x16: 32 GT/s x 16 lanes = 64 GB/s)

    def __post_init__(self):
        for field in ("num_nodes", "gpus_per_node"):
            if getattr(self, field) <= 0:
                raise ConfigError(f"topology {self.name!r}: {field} must be a positive integer, got {getattr(self, field)}")
        for field in ("nvlink_GBps", "rdma_GBps", "matmul_tflops", "gemm_half_tokens", "memory_GBps", "hbm_bytes",
                      "pcie_GBps"):
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

    # ---- rates in base units: the one definition the cost model and planners use --------------------
    @property
    def matmul_flops_per_s(self) -> float:
        """Large-GEMM rate of one GPU in FLOP/s."""
        return self.matmul_tflops * 1e12

    @property
    def nvlink_bytes_per_s(self) -> float:
        """NVLink bytes per second, one direction per GPU."""
        return self.nvlink_GBps * 1e9

    @property
    def rdma_bytes_per_s(self) -> float:
        """RDMA bytes per second, one direction per GPU."""
        return self.rdma_GBps * 1e9

    @property
    def memory_bytes_per_s(self) -> float:
        """HBM bytes per second of one GPU."""
        return self.memory_GBps * 1e9

    def dp_size(self, ep: int) -> int:
        """Data-parallel ranks per EP rank when the whole cluster trains one model with EP groups of
        `ep` GPUs (expert data parallelism): num_gpus // ep, at least 1."""
        return max(1, self.num_gpus // ep)

    def _with_nodes(self, nodes: int) -> str:
        """This topology's spec with `nodes` nodes (its own nodes= item replaced), for error messages."""
        items = [i for i in self.name.split(",") if i.split("=")[0].strip() not in ("nodes", "num_nodes")]
        return ",".join(items + [f"nodes={nodes}"])

    def ep_layout(self, ep: int) -> tuple[int, int]:
        """(nodes, GPUs used per node) of one EP group of `ep` GPUs, packed node by node.

        The group spans the fewest nodes n that hold it with the same number of GPUs in each: the
        smallest n >= ceil(ep / gpus_per_node) that divides ep. A node need not be filled: EP64 on one
        72-GPU NVLink domain uses 64 of its GPUs (1, 64); EP128 on 72-GPU racks uses 64 GPUs of each of
        2 racks (2, 64); EP16 on 8-GPU nodes is (2, 8) as before.
        """
        if isinstance(ep, bool) or not isinstance(ep, (int, np.integer)) or ep <= 0:
            raise ConfigError(f"EP size must be a positive integer, got {ep!r}")
        ep = int(ep)
        if ep > self.num_gpus:
            raise ConfigError(f"EP size {ep} exceeds the {self.num_gpus} GPUs of topology {self.name!r} "
                              f"({self.num_nodes} nodes x {self.gpus_per_node}); add nodes, e.g. "
                              f"{self._with_nodes(-(-ep // self.gpus_per_node))!r}")
        nodes = -(-ep // self.gpus_per_node)
        while ep % nodes:
            nodes += 1
        if nodes > self.num_nodes:
            raise ConfigError(f"EP size {ep} cannot spread evenly over at most {self.num_nodes} nodes of "
                              f"{self.gpus_per_node} GPUs of topology {self.name!r} (it needs {nodes} nodes of "
                              f"{ep // nodes} GPUs)")
        return nodes, ep // nodes

    def with_changes(self, **changes) -> "Topology":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


TOPOLOGY_PRESETS: dict[str, Topology] = {
    t.name: t
    for t in [
        # The paper's cluster, 20 x 8 Hopper with full NVLink, at rates measured by DeepEP and re-counted the way
        # relibra.costs.links counts bytes (off-GPU NVLink bytes, off-node RDMA bytes): NVLink 337.35 x 7/8 on H20
        # (deepseek-ai/DeepEP#16), RDMA 58 x 0.75 at EP 32 (DeepEP README). The values and sources are the set-up
        # card's (data/setups/token-budget-tp1.toml, relibra.setups; the expert GEMM rate and half-saturation fitted
        # to data/device/expert_gemm.json, one H200); tests/test_setups.py keeps the two equal.
        Topology("paper", num_nodes=20, gpus_per_node=8, nvlink_GBps=295.2, rdma_GBps=43.5, matmul_tflops=585.0,
                 gemm_half_tokens=409.0),
        # The same cluster at datasheet rates: NVLink 900 GB/s both ways = 450 each way; 400 Gb/s NIC = 50 GB/s.
        Topology("paper-datasheet", num_nodes=20, gpus_per_node=8, nvlink_GBps=450.0, rdma_GBps=50.0,
                 matmul_tflops=790.0),
        # H800 nodes (8 GPUs, reduced NVLink, 8 x 400 Gb/s NICs) at DeepEP's README rates measured there, counted
        # as the cost model counts bytes: intranode 155 GB/s x 7/8 (its test counts a GPU's own rows too), internode
        # 58 GB/s x 0.75 at EP 32 (its test counts the sender's own node too); 32 nodes so that EP256 fits. Dense
        # bf16 rate as `paper`; HBM3 80 GB at 3.35 TB/s (datasheet).
        Topology("h800", num_nodes=32, gpus_per_node=8, nvlink_GBps=135.6, rdma_GBps=43.5, matmul_tflops=790.0,
                 memory_GBps=3350.0, hbm_bytes=80e9),
        # H100 SXM nodes at datasheet rates: NVLink 4 900 GB/s both ways = 450 each way, 8 x 400 Gb/s NICs
        # (50 GB/s per GPU), 989 dense bf16 TFLOP/s, HBM3 80 GB at 3.35 TB/s; 32 nodes so that EP256 fits.
        Topology("h100", num_nodes=32, gpus_per_node=8, nvlink_GBps=450.0, rdma_GBps=50.0, matmul_tflops=989.0,
                 memory_GBps=3350.0, hbm_bytes=80e9),
        # One NVLink domain of 72 GPUs (GB200 NVL72 class), 900 GB/s each way per GPU.
        Topology("nvl72", num_nodes=1, gpus_per_node=72, nvlink_GBps=900.0, rdma_GBps=50.0, matmul_tflops=2250.0,
                 memory_GBps=8000.0),
        # GB200 NVL72 (datasheet): 72 Blackwell GPUs in one NVLink 5 domain, 1.8 TB/s both ways = 900 each
        # way per GPU; 2.25-2.5 PFLOP/s dense bf16 per GPU (2250 taken); HBM3e 186 GB at 8 TB/s; one
        # 400 Gb/s ConnectX-7 NIC per GPU (50 GB/s) to other racks. EP64 uses 64 of the 72 GPUs.
        Topology("gb200-nvl72", num_nodes=1, gpus_per_node=72, nvlink_GBps=900.0, rdma_GBps=50.0,
                 matmul_tflops=2250.0, memory_GBps=8000.0, hbm_bytes=186e9),
        # Four such racks joined by RDMA (one NIC per GPU): EP128 spans 2 racks x 64, EP256 4 racks x 64.
        Topology("gb200-nvl72x4", num_nodes=4, gpus_per_node=72, nvlink_GBps=900.0, rdma_GBps=50.0,
                 matmul_tflops=2250.0, memory_GBps=8000.0, hbm_bytes=186e9),
        # This machine running the gloo runtime (2 simulated nodes x 2 ranks, one thread per rank), measured
        # by relibra.bench.cpu_preset into data/cpu_gloo_calibration.json: the `tiny` expert's forward +
        # backward fit, and gloo's all-to-all over loopback (one shared link, no relay). The expert fit was
        # taken by one rank alone; the runtime runs 4 ranks on this machine's 2 cores, so each rank gets
        # half a core: the preset's rate is the single-rank fit x 2 cores / 4 ranks.
        Topology("cpu-gloo", num_nodes=2, gpus_per_node=2, nvlink_GBps=0.417, rdma_GBps=0.417,
                 matmul_tflops=0.0538 * 2 / 4,
                 gemm_half_tokens=21.8, memory_GBps=10.0, collective_latency_s=6.8e-4, hbm_bytes=24e9,
                 dispatcher="alltoall", shared_link=True),
    ]
}


FITTED_CPU_PRESET = Path(__file__).resolve().parent.parent / "data" / "cpu_gloo_fit.json"


MAX_PRESET_FILE_BYTES = 1 << 20  # data/cpu_gloo_fit.json is about 3 kB


def read_preset_file(path: str, where: str | None = None) -> Topology:
    """The Topology in the "preset" entry of a fit file (`relibra calibrate` writes data/cpu_gloo_fit.json,
    scripts/device_check.sh data/device/<gpu>_preset.json). Fitted presets are loaded only by this call
    or by a --cluster spec that names the file; the preset list never depends on which files exist.
    Any problem (unreadable JSON, no "preset", an unknown or mistyped field) is a ConfigError naming
    the file (and `where`, e.g. the environment variable that pointed to it)."""
    name = f"{where}={path}" if where else str(path)
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_PRESET_FILE_BYTES + 1)
        if len(text) > MAX_PRESET_FILE_BYTES:
            raise ConfigError(f"{name}: larger than {MAX_PRESET_FILE_BYTES} bytes; a preset file is a few kB")
        doc = json.loads(text)
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{name}: cannot read a preset file ({type(exc).__name__}: {exc})") from None
    preset = doc.get("preset") if isinstance(doc, dict) else None
    if not isinstance(preset, dict):
        raise ConfigError(f"{name}: expected a JSON object with a \"preset\" object (relibra calibrate --out)")
    known = {f.name for f in dataclasses.fields(Topology)}
    unknown = sorted(set(preset) - known)
    if unknown:
        raise ConfigError(f"{name}: preset field {unknown[0]!r} is unknown (fields: {', '.join(sorted(known))})")
    try:
        return Topology(**preset)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: {exc}") from None


def get_topology(name: str) -> Topology:
    """The preset called `name`; a ConfigError lists the known ones otherwise."""
    try:
        return TOPOLOGY_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown cluster preset {name!r}; known: {', '.join(TOPOLOGY_PRESETS)} (a fitted preset is "
                          f"named by its file: --cluster data/cpu_gloo_fit.json)") from None


# Short names accepted by parse_topology for the Topology fields.
_TOPOLOGY_ALIASES = {"nodes": "num_nodes", "gpus": "gpus_per_node", "nvlink": "nvlink_GBps", "rdma": "rdma_GBps",
                     "tflops": "matmul_tflops", "half_tokens": "gemm_half_tokens", "latency_s": "collective_latency_s"}
_TOPOLOGY_REQUIRED = ("num_nodes", "gpus_per_node", "nvlink_GBps", "rdma_GBps", "matmul_tflops")


def resolve_topology(topology: "Topology | str") -> Topology:
    """A Topology as given, or parsed from a preset name / spec string (see parse_topology)."""
    return topology if isinstance(topology, Topology) else parse_topology(topology)


def parse_topology(spec: str) -> Topology:
    """A topology from a preset name, a preset with changes, or a full custom description.

    spec: comma-separated items. An item without '=' names a preset to start from (at most one, first),
    or a fitted-preset file ending in .json (read_preset_file);
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
            base = read_preset_file(item) if item.endswith(".json") else get_topology(item)
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
