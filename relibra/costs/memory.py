"""Per-GPU memory of a training set-up, and whether it fits the GPU's HBM.

Pure functions over a model shape and a `MemoryLayout` (what the set-up card says about one GPU's share
of the model and batch). Units are in the names: _params (parameters), _bytes, _GB (1e9 bytes).

Bytes per parameter (bf16 training with fp32 main gradients and Adam, Megatron's mixed-precision
(distributed) optimizer; NVIDIA/Megatron-LM docs/user-guide/features/dist_optimizer.md:19 at d98e8a64:
"bf16 parameters, fp32 gradients: 18 bytes per parameter, 6 + 12 / d distributed"):

  weights    ModelShape.bytes_per_param (2, bf16), every parameter the GPU holds
  gradients  main_grad_bytes_per_param (4: Megatron keeps main_grad in fp32 under
             --accumulate-allreduce-grads-in-fp32), every parameter (the grad buffer is not sharded)
  optimizer  ModelShape.optimizer_bytes_per_param (12: fp32 master copy, Adam m and v), sharded by the
             distributed optimizer over the data-parallel ranks of each parameter: dense parameters over
             DP x CP (Megatron's data-parallel group with context parallelism), expert parameters over the
             expert data-parallel group DP x CP x TP / EP (expert TP 1); the share
             `optimizer_offload_fraction` lives in host memory (Megatron's --optimizer-cpu-offload with
             --optimizer-offload-fraction), the rest in HBM.

What one GPU holds (`stage_params`): pipeline stage s holds `stage_layers(L, PP)[s]` layers (Megatron's even
split, the last stage taking the remainder, as slime's --decoder-last-pipeline-num-layers 22 does for 94
layers at PP 4); attention and shared experts split over TP; the router whole; routed experts split over EP
(expert TP 1); the embedding (vocab / TP rows) on the first stage, the untied LM head on the last.

Activations per micro-batch (`activation_bytes`; an assumption, see `layer_activation_bytes_per_token`):
every GPU holds `tokens_per_gpu` token rows of each layer's hidden state (tokens per EP rank: sequence
parallelism splits the rows over TP, context parallelism over CP). Under full recompute (Megatron's
--recompute-granularity full --recompute-method uniform --recompute-num-layers 1) a layer keeps only its
bf16 input (2 x hidden bytes per token) and one layer at a time is live with all of its activations; without
recompute every layer keeps all of them. Under 1F1B the first stage holds min(PP, M) micro-batches in
flight, the last one. The last stage also holds the fp32 logits of its micro-batch (tokens x vocab x 4
bytes; vocab-parallel: TP ranks split the vocabulary and gather the sequence, so tokens_per_gpu x vocab).

The routed experts' activations (`expert_activation_bytes`) are those of the busiest GPU: its token-expert
rows per layer are `expert_rows_per_gpu` (`busiest_expert_rows` of a step's plans or of a trace's static
placement: under recompute the busiest (micro-batch, layer, GPU), the one live layer; without it the busiest
(micro-batch, GPU) per layer of its stage), or tokens_per_gpu x top_k (the mean) where not given.

Replica slots (`replica_bytes`): `spare_slots` expert weights (bf16) and replica gradients (bf16) per slot,
once (layer-shared buffer) or per layer of the stage (per-layer buffer). Dispatcher buffers: the card's
assumed size (DeepEP's registered NVLink / RDMA buffers; Megatron's alltoall dispatcher permutes into the
expert activations, counted there). CUDA context and NCCL buffers (`context_bytes`): the card's assumed size,
apart from everything above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from relibra.cluster import ModelShape
from relibra.errors import ConfigError

GB = 1e9
LOGIT_BYTES = 4  # fp32 logits of the loss (vocab-parallel cross entropy / log-probabilities in fp32)


@dataclass(frozen=True)
class MemoryLayout:
    """What a set-up card says about one GPU's share of model and batch.

    tp, pp, cp, ep, dp: tensor, pipeline, context, expert and data-parallel sizes (expert TP 1).
    distributed_optimizer: shard optimizer state over data-parallel ranks (Megatron's distributed optimizer).
    optimizer_offload_fraction: share of the optimizer state kept in host memory, in [0, 1].
    recompute: full activation recomputation, one layer at a time.
    tokens_per_gpu: token rows one GPU holds per micro-batch (tokens per EP rank per micro-batch).
    micro_batches: micro-batches per step (bounds the micro-batches in flight under 1F1B); None = PP.
    main_grad_bytes_per_param: bytes of one gradient-buffer element (4: fp32 main_grad).
    replica_grad_bytes_per_param: bytes of one replica-gradient element (2: bf16).
    spare_slots: replica slots per GPU per layer; replica_buffer: "layer-shared" or "per-layer".
    dispatcher_buffer_bytes: the token dispatcher's own buffers per GPU.
    activation_scale: factor on the activation bytes (the formula's assumption, swept over its range).
    hbm_bytes: the GPU's HBM.
    expert_rows_per_gpu: routed token-expert rows per MoE layer of the busiest GPU (see the module); None:
        tokens_per_gpu x top_k, the mean.
    context_bytes: the CUDA context, kernel images and NCCL's communicator buffers per GPU.
    """

    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    distributed_optimizer: bool
    optimizer_offload_fraction: float
    recompute: bool
    tokens_per_gpu: float
    hbm_bytes: float
    micro_batches: int | None = None
    main_grad_bytes_per_param: int = 4
    replica_grad_bytes_per_param: int = 2
    spare_slots: int = 0
    replica_buffer: str = "layer-shared"
    dispatcher_buffer_bytes: float = 0.0
    activation_scale: float = 1.0
    expert_rows_per_gpu: float | None = None
    context_bytes: float = 0.0

    def __post_init__(self):
        for name in ("tp", "pp", "cp", "ep", "dp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"memory layout: {name} must be a positive integer, got {v!r}")
        f = self.optimizer_offload_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
            raise ConfigError(f"memory layout: optimizer_offload_fraction must lie in [0, 1], got {f!r}")
        if not (self.tokens_per_gpu >= 0 and math.isfinite(self.tokens_per_gpu)):
            raise ConfigError(f"memory layout: tokens_per_gpu must be >= 0, got {self.tokens_per_gpu!r}")
        if not (self.activation_scale > 0 and math.isfinite(self.activation_scale)):
            raise ConfigError(f"memory layout: activation_scale must be positive, got {self.activation_scale!r}")
        rows = self.expert_rows_per_gpu
        if rows is not None and not (rows >= 0 and math.isfinite(rows)):
            raise ConfigError(f"memory layout: expert_rows_per_gpu must be None or >= 0, got {rows!r}")
        if not (self.context_bytes >= 0 and math.isfinite(self.context_bytes)):
            raise ConfigError(f"memory layout: context_bytes must be >= 0, got {self.context_bytes!r}")
        if not (self.hbm_bytes > 0 and math.isfinite(self.hbm_bytes)):
            raise ConfigError(f"memory layout: hbm_bytes must be positive, got {self.hbm_bytes!r}")
        if self.replica_buffer not in ("layer-shared", "per-layer"):
            raise ConfigError(f"memory layout: replica_buffer must be layer-shared or per-layer, "
                              f"got {self.replica_buffer!r}")

    @property
    def dense_dp(self) -> int:
        """Ranks the optimizer state of a dense parameter is sharded over: DP x CP (1 without a distributed
        optimizer)."""
        return self.dp * self.cp if self.distributed_optimizer else 1

    @property
    def expert_dp(self) -> int:
        """Ranks the optimizer state of an expert parameter is sharded over: the expert data-parallel size
        DP x CP x TP / EP (at least 1; 1 without a distributed optimizer)."""
        return max(1, self.dp * self.cp * self.tp // self.ep) if self.distributed_optimizer else 1


def stage_layers(num_layers: int, pp: int) -> list[int]:
    """Layers of each pipeline stage: ceil(L / PP) on every stage but the last, the rest on the last
    (94 layers at PP 4: [24, 24, 24, 22]). int list [pp]."""
    first = -(-num_layers // pp)
    last = num_layers - first * (pp - 1)
    if last < 1:
        raise ConfigError(f"{num_layers} layers cannot be split over {pp} pipeline stages (the last would hold "
                          f"{last})")
    return [first] * (pp - 1) + [last]


def stage_params(model: ModelShape, layout: MemoryLayout, stage: int) -> tuple[float, float]:
    """(dense_params, expert_params) one GPU of pipeline stage `stage` holds.

    Dense per layer: attention projections / TP, shared experts / TP, the router whole, the dense FFN of
    a leading dense layer / TP (dense layers counted on the first stages, as the model's first layers);
    embedding vocab x hidden / TP on stage 0, the LM head likewise on the last stage. Experts: the routed
    experts of each layer / EP (expert TP 1).
    """
    layers = stage_layers(model.num_layers + model.num_dense_layers, layout.pp)
    if not 0 <= stage < layout.pp:
        raise ConfigError(f"stage {stage} is outside the {layout.pp} pipeline stages")
    start = sum(layers[:stage])
    n = layers[stage]
    dense_here = max(0, min(model.num_dense_layers, start + n) - start)
    moe_here = n - dense_here
    q = model.num_attention_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    attention = model.hidden * (q + 2 * kv) + q * model.hidden
    moe_dense = attention / layout.tp + model.hidden * model.num_experts + (
        model.num_shared_experts * model.expert_params / layout.tp)
    dense_layer = (attention + 3 * model.hidden * model.dense_ffn) / layout.tp
    dense = moe_here * moe_dense + dense_here * dense_layer
    embedding = model.vocab_size * model.hidden / layout.tp
    dense += embedding * ((stage == 0) + (stage == layout.pp - 1))
    experts = moe_here * model.num_experts * model.expert_params / layout.ep
    return float(dense), float(experts)


def expert_row_bytes(model: ModelShape) -> float:
    """Bytes one routed token-expert row keeps for backward (bf16): the permuted input 2h, gate and up outputs
    2 x 2f, the activation output 2f, the down output 2h: 4h + 6f (layer_activation_bytes_per_token)."""
    return float(4 * model.hidden + 6 * model.moe_ffn)


def layer_token_bytes(model: ModelShape) -> float:
    """Bytes of one MoE layer's activations per source token outside the routed experts: attention, the MoE's
    layer-norm output and router, and the shared experts (layer_activation_bytes_per_token less top_k rows)."""
    return layer_activation_bytes_per_token(model) - model.top_k * expert_row_bytes(model)


def layer_activation_bytes_per_token(model: ModelShape) -> float:
    """Bytes one token keeps for the backward pass of one MoE layer, all activations live (no recompute),
    with FlashAttention (no s^2 term) and no dropout (the recipes set it to 0). bf16 (2 bytes) unless noted:

      attention  layer-norm output and QKV input 2 x 2h, Q, K, V 2 (q + 2 kv), core output 2q, the
                 softmax statistics 4 x heads (fp32): 2 (2h + 2q + 2kv) + 4 heads
      MoE        layer-norm output 2h, router probabilities 2 x 4E (fp32 logits and probabilities), and
                 per routed copy (top_k, plus each shared expert): permuted input 2h, gate and up output
                 2 x 2f, activation output 2f, down output 2h: (top_k + shared) (4h + 6f)

    After Korthikanti et al. 2022 (arXiv 2205.05198, section 4.1: 34 s b h bytes per dense layer with
    flash attention), re-counted for GQA and top-k MoE. An assumption: fused kernels save less, allocator
    fragmentation and temporary buffers add more (docs/cost-model.md gives the range).
    """
    h, f = model.hidden, model.moe_ffn
    q = model.num_attention_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    attention = 2 * (2 * h + 2 * q + 2 * kv) + 4 * model.num_attention_heads
    moe = 2 * h + 8 * model.num_experts + (model.top_k + model.num_shared_experts) * (4 * h + 6 * f)
    return float(attention + moe)



def activation_bytes(model: ModelShape, layout: MemoryLayout, stage: int) -> float:
    """Activation bytes outside the routed experts one GPU of `stage` holds at its peak: micro-batches in flight
    x (layers x kept bytes per layer) + one live layer under recompute; plus the last stage's fp32 logits."""
    n, in_flight = _stage_span(model, layout, stage)
    tokens = layout.tokens_per_gpu
    if layout.recompute:
        total = in_flight * n * 2.0 * model.hidden * tokens + layer_token_bytes(model) * tokens  # bf16 inputs
    else:
        total = in_flight * n * layer_token_bytes(model) * tokens
    if stage == layout.pp - 1:
        total += tokens * model.vocab_size * LOGIT_BYTES
    return float(total * layout.activation_scale)


def expert_activation_bytes(model: ModelShape, layout: MemoryLayout, stage: int) -> float:
    """The routed experts' activations of the busiest GPU of `stage`: expert_rows(model, layout) rows per layer,
    expert_row_bytes each; one live layer under recompute, every layer of every micro-batch in flight without
    it."""
    n, in_flight = _stage_span(model, layout, stage)
    rows = expert_rows(model, layout)
    layers = 1 if layout.recompute else in_flight * n
    return float(layers * rows * expert_row_bytes(model) * layout.activation_scale)


def _stage_span(model: ModelShape, layout: MemoryLayout, stage: int) -> tuple[int, int]:
    """(layers of `stage`, micro-batches it holds in flight under 1F1B: PP - stage, at most the step's)."""
    n = stage_layers(model.num_layers + model.num_dense_layers, layout.pp)[stage]
    in_flight = layout.pp - stage
    if layout.micro_batches is not None:
        in_flight = min(in_flight, layout.micro_batches)
    return n, in_flight


def expert_rows(model: ModelShape, layout: MemoryLayout) -> float:
    """Routed token-expert rows per MoE layer of the busiest GPU: layout.expert_rows_per_gpu, else the mean
    tokens_per_gpu x top_k."""
    return float(layout.tokens_per_gpu * model.top_k if layout.expert_rows_per_gpu is None
                 else layout.expert_rows_per_gpu)


def busiest_expert_rows(gpu_tokens: np.ndarray, recompute: bool, layer_stage: np.ndarray | None = None) -> float:
    """Routed token-expert rows per layer of the busiest GPU, as MemoryLayout.expert_rows_per_gpu reads them.

    gpu_tokens: int [M, L, ep] rows each GPU computes (PlanCost.gpu_tokens); layer_stage: int [L] the pipeline
    stage of each layer (None: one stage). Under recompute one layer is live: the largest (micro-batch, layer,
    GPU); without it a GPU keeps every layer of its stage: the largest (micro-batch, GPU) mean over a stage's
    layers.
    """
    rows = np.asarray(gpu_tokens, dtype=np.float64)
    if rows.size == 0:
        return 0.0
    if recompute:
        return float(rows.max())
    stages = np.zeros(rows.shape[1], dtype=np.int64) if layer_stage is None else np.asarray(layer_stage)
    return max(float(rows[:, stages == s].mean(axis=1).max()) for s in np.unique(stages))


def replica_bytes(model: ModelShape, layout: MemoryLayout, stage: int) -> float:
    """Replica-slot bytes one GPU holds: spare_slots x (bf16 weights + replica gradient) per slot, once for a
    layer-shared buffer, per layer of the stage for a per-layer one."""
    per_slot = model.expert_params * (model.bytes_per_param + layout.replica_grad_bytes_per_param)
    layers = 1 if layout.replica_buffer == "layer-shared" else stage_layers(
        model.num_layers + model.num_dense_layers, layout.pp)[stage]
    return float(layout.spare_slots * layers * per_slot)


def stage_budget(model: ModelShape, layout: MemoryLayout, stage: int) -> dict[str, float]:
    """Bytes per term one GPU of `stage` holds in HBM, plus the optimizer bytes it keeps in host memory:
    {"weights", "gradients", "optimizer", "activations", "expert_activations", "replica_slots",
    "dispatcher_buffers", "cuda_context_nccl", "optimizer_host"} (bytes)."""
    dense, experts = stage_params(model, layout, stage)
    state = model.optimizer_bytes_per_param * (dense / layout.dense_dp + experts / layout.expert_dp)
    f = float(layout.optimizer_offload_fraction)
    return {"weights": (dense + experts) * model.bytes_per_param,
            "gradients": (dense + experts) * layout.main_grad_bytes_per_param,
            "optimizer": state * (1.0 - f),
            "activations": activation_bytes(model, layout, stage),
            "expert_activations": expert_activation_bytes(model, layout, stage),
            "replica_slots": replica_bytes(model, layout, stage),
            "dispatcher_buffers": float(layout.dispatcher_buffer_bytes),
            "cuda_context_nccl": float(layout.context_bytes),
            "optimizer_host": state * f}


HBM_TERMS = ("weights", "gradients", "optimizer", "activations", "expert_activations", "replica_slots",
             "dispatcher_buffers", "cuda_context_nccl")


@dataclass(frozen=True)
class MemoryBudget:
    """The busiest GPU's memory: its stage, bytes per term (HBM_TERMS, plus optimizer_host in host memory),
    the total in HBM, the HBM, and whether it fits."""

    model: str
    stage: int
    terms: dict
    hbm_bytes: float
    expert_rows: float = 0.0
    mean_rows: float = 0.0

    @property
    def total_bytes(self) -> float:
        return float(sum(self.terms[t] for t in HBM_TERMS))

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.hbm_bytes

    @property
    def headroom_bytes(self) -> float:
        """HBM left (negative: the bytes missing)."""
        return self.hbm_bytes - self.total_bytes

    def lines(self) -> list[str]:
        """The budget line by line, GB per term, total vs HBM and the verdict."""
        out = [f"{t:<20} {self.terms[t] / GB:8.1f} GB" + (
            f" (the busiest GPU: {self.expert_rows:,.0f} routed rows a layer, {self.expert_rows / self.mean_rows:.2f}x "
            f"the mean)" if t == "expert_activations" and self.mean_rows else "") for t in HBM_TERMS]
        out.append(f"{'total':<20} {self.total_bytes / GB:8.1f} GB of {self.hbm_bytes / GB:.0f} GB HBM "
                   f"(pipeline stage {self.stage}): "
                   + ("fits" if self.fits else f"does NOT fit ({-self.headroom_bytes / GB:.1f} GB over)"))
        if self.terms["optimizer_host"]:
            out.append(f"{'optimizer in host':<20} {self.terms['optimizer_host'] / GB:8.1f} GB (CPU offload, "
                       "not in HBM)")
        return out

    def to_dict(self) -> dict:
        return {"model": self.model, "stage": self.stage, "expert_rows": self.expert_rows,
                **{f"{k}_GB": v / GB for k, v in self.terms.items()},
                "total_GB": self.total_bytes / GB, "hbm_GB": self.hbm_bytes / GB, "fits": self.fits}


def memory_budget(model: ModelShape, layout: MemoryLayout) -> MemoryBudget:
    """The budget of the GPU that needs the most HBM over the pipeline stages (ties: the first)."""
    budgets = [stage_budget(model, layout, s) for s in range(layout.pp)]
    stage = max(range(layout.pp), key=lambda s: (sum(budgets[s][t] for t in HBM_TERMS), -s))
    return MemoryBudget(model.name, stage, budgets[stage], float(layout.hbm_bytes), expert_rows(model, layout),
                        float(layout.tokens_per_gpu * model.top_k))


# ---- optimizer state in host memory: what migration pays over PCIe --------------------------------------
def offload_migration_seconds(prev_home, home, ep: int, model: ModelShape, pcie_GBps: float, dp_size: int,
                              offload_fraction: float) -> tuple[float, int]:
    """Seconds and bytes of the host-memory leg of migration when the optimizer state is offloaded.

    prev_home, home: int [layers, experts] home GPU of each expert (None prev_home: nothing moves). The
    offloaded share of each moved expert's optimizer-state shard (expert_params x optimizer_bytes_per_param
    / dp_size x offload_fraction bytes) leaves the old home's host memory over its PCIe link (host to GPU)
    and enters the new home's over its PCIe link (GPU to host). PCIe is full duplex, so a GPU's leg takes
    max(bytes up, bytes down) / pcie_GBps; the busiest GPU sets it. Returns (seconds, bytes that busiest GPU
    moves one way). The caller overlaps it with the link transfer (the recipes' --overlap-cpu-optimizer-d2h-h2d
    pipelines host copies with the rest): migration takes the longer of the two.
    """
    if prev_home is None or not offload_fraction:
        return 0.0, 0
    prev_home, home = np.asarray(prev_home), np.asarray(home)
    moved = prev_home != home
    if not moved.any():
        return 0.0, 0
    per_expert = model.expert_params * model.optimizer_bytes_per_param / dp_size * float(offload_fraction)
    out = np.bincount(prev_home[moved].ravel(), minlength=ep)
    into = np.bincount(home[moved].ravel(), minlength=ep)
    busiest = float(np.maximum(out, into).max()) * per_expert
    return busiest / (pcie_GBps * GB), int(round(busiest))
