"""The cost model: seconds for one StepPlan on one cluster, per micro-batch, layer, phase and component.

Every policy is charged by the same functions below; a policy shows up only through its plan (homes,
replicas, token flow) and two flags (`transfers_on_critical_path`, `uniform_routing`). The model, in
the order one MoE layer runs for one micro-batch (docs/cost-model.md has the derivations):

  forward:  dense (attention, router, shared experts) | replica weight push, hidden behind attention
            -> dispatch all-to-all -> routed-expert GEMMs -> combine all-to-all
  backward: the same in reverse at twice the FLOPs; dispatch and combine mirrored; replica weights
            pushed again (layer-shared buffer) and replica gradients pulled to the home, each hidden
            behind a layer's attention backward

Per step: the sum over micro-batches and layers, the non-MoE parts (dense layers, embedding and LM
head), expert migration between placements (weights + optimizer state) and the optimizer step.

Conventions: compute counts token-expert pairs (a token routed to k experts is k GEMM rows);
exchanges follow the topology's dispatcher (`deepep`: the rail route and one copy of a token per
destination node / GPU, estimated by distinct_tokens; `alltoall`: the direct route and one row per
pair, as Megatron's alltoall dispatcher); bandwidths are GB/s = 1e9 bytes/s one direction per GPU;
a GPU's NVLink and RDMA links run at the same time, each full duplex, so its transfer time is the
largest of its four (link, direction) byte counts over that link's bandwidth; the slowest GPU sets
the time of every collective, and a collective pays `collective_latency_s` once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from relibra.cluster import ModelShape, Topology
from relibra.errors import ConfigError, PlanError
from relibra.plan import StepPlan

REPLICA_BUFFERS = ("layer-shared", "per-layer")
ROUTES = ("rail", "direct")
GB = 1e9
TFLOP = 1e12


@dataclass(frozen=True)
class CostParams:
    """Knobs of the cost model that belong to the training run rather than to the hardware.

    seq_len: tokens per sequence, for attention's quadratic part (mean causal context seq_len / 2).
    replica_buffer: "layer-shared" (one set of replica slots reused by every layer, so weights are
        pushed again for backward) or "per-layer" (slots per layer, kept from forward to backward;
        a replica is pushed only when its slot's content changes from the previous micro-batch and
        its gradient pulled when it leaves). Applies to every policy that overlaps its transfers;
        plans with `transfers_on_critical_path` (LLEP) keep fetched weights until backward (autograd
        holds them), so they push once per (micro-batch, layer) and never again for backward.
    grad_bytes_per_param: bytes of one replica gradient element pulled back to the home (bf16).
    include_lm_head: charge the embedding / LM-head GEMM (once per micro-batch, outside the layers).
    runtime_plan_s: planner seconds charged per (micro-batch, layer) on the critical path of plans
        that plan at run time (`transfers_on_critical_path`), on top of an all-gather of the expert
        counts. Default 30 us: LLEP's planner as measured here on one core (`relibra bench planner
        --policies llep`: ~0.09 s per Qwen3-235B EP32 step of 32 x 94 (micro-batch, layer)); fixed so
        that the same seed gives the same simulated numbers. None = charge the step's measured
        planner CPU seconds divided by micro-batches x layers instead.
    route: how bytes cross nodes in every exchange (see link_seconds): "rail" (DeepEP, the paper's
        dispatcher) or "direct"; None (default) = the topology's own `route`.
    dedup: send a token once per destination node (RDMA) and GPU (NVLink) as DeepEP does, with the
        distinct tokens estimated from counts (distinct_tokens), or (False) one row per token-expert
        pair as Megatron's alltoall dispatcher; None (default) = the topology's (`dispatcher`).
    """

    seq_len: int = 4096
    replica_buffer: str = "layer-shared"
    grad_bytes_per_param: int = 2
    include_lm_head: bool = True
    runtime_plan_s: float | None = 30e-6
    route: str | None = None
    dedup: bool | None = None

    def __post_init__(self):
        if self.seq_len <= 0:
            raise ConfigError(f"cost model: seq_len must be positive, got {self.seq_len}")
        if self.replica_buffer not in REPLICA_BUFFERS:
            raise ConfigError(f"cost model: replica_buffer must be one of {REPLICA_BUFFERS}, got {self.replica_buffer!r}")
        if self.grad_bytes_per_param <= 0:
            raise ConfigError(f"cost model: grad_bytes_per_param must be positive, got {self.grad_bytes_per_param}")
        if self.route is not None and self.route not in ROUTES:
            raise ConfigError(f"cost model: route must be one of {ROUTES}, got {self.route!r}")
        if self.runtime_plan_s is not None and not self.runtime_plan_s >= 0:
            raise ConfigError(f"cost model: runtime_plan_s must be >= 0, got {self.runtime_plan_s}")


# ---- GEMM efficiency ------------------------------------------------------------------------------
def gemm_efficiency(tokens: np.ndarray | float, half_tokens: float) -> np.ndarray:
    """Share of the large-GEMM rate a GEMM with `tokens` rows reaches: t / (t + half_tokens).

    With this curve a GEMM of t > 0 rows and f FLOPs per row takes f * (t + half_tokens) / rate
    seconds: a fixed cost worth half_tokens rows (weight reads, launch, tile waste) plus a linear part.
    """
    t = np.asarray(tokens, dtype=np.float64)
    return t / (t + half_tokens)


def gemm_seconds(tokens: np.ndarray, flops_per_token: float, topology: Topology) -> np.ndarray:
    """Seconds of GEMMs with `tokens` rows each (0 rows cost nothing), any shape in, same shape out."""
    t = np.asarray(tokens, dtype=np.float64)
    return np.where(t > 0, flops_per_token * (t + topology.gemm_half_tokens) / (topology.matmul_tflops * TFLOP), 0.0)


def fit_gemm_efficiency(tokens, seconds, flops_per_token: float) -> dict:
    """Fit the rate and half-saturation point of `gemm_efficiency` to measured GEMM times.

    tokens: rows of each measured GEMM (one expert's tokens); seconds: its measured time;
    flops_per_token: FLOPs per row (2 * expert_params for a SwiGLU expert forward).
    The curve makes seconds = a * tokens + b with a = flops_per_token / rate and b = a * half_tokens,
    so a non-negative least-squares line gives both. Returns {"matmul_tflops", "gemm_half_tokens",
    "rmse_s", "max_rel_err"}; pass the first two to Topology.with_changes.
    """
    from scipy.optimize import nnls

    t = np.asarray(tokens, dtype=np.float64).ravel()
    s = np.asarray(seconds, dtype=np.float64).ravel()
    if t.shape != s.shape or t.size < 2:
        raise ConfigError(f"fit_gemm_efficiency: need at least two (tokens, seconds) pairs of equal length, "
                          f"got {t.size} tokens and {s.size} seconds")
    if len(np.unique(t)) < 2:
        raise ConfigError("fit_gemm_efficiency: need at least two distinct token counts")
    if (t <= 0).any() or (s <= 0).any() or not np.isfinite(s).all():
        raise ConfigError("fit_gemm_efficiency: token counts and seconds must be positive and finite")
    if flops_per_token <= 0:
        raise ConfigError(f"fit_gemm_efficiency: flops_per_token must be positive, got {flops_per_token}")
    # Relative errors matter (times span orders of magnitude): weight each row by 1 / seconds.
    w = 1.0 / s
    (a, b), _ = nnls(np.stack([t * w, w], axis=1), s * w)
    if a <= 0:
        raise ConfigError("fit_gemm_efficiency: time does not grow with tokens; the measurements do not fit the curve")
    pred = a * t + b
    return {"matmul_tflops": flops_per_token / a / TFLOP, "gemm_half_tokens": max(b / a, 1e-9),
            "rmse_s": float(np.sqrt(np.mean((pred - s) ** 2))), "max_rel_err": float(np.max(np.abs(pred - s) / s))}


def measure_expert_gemm(hidden: int, ffn: int, token_counts, device: str = "cpu", dtype: str = "float32",
                        repeats: int = 5, threads: int | None = 1) -> dict:
    """Time one SwiGLU expert forward (x @ W_gate, x @ W_up, silu * , @ W_down) at several token counts.

    Returns {"tokens": [...], "seconds": [...] (median of `repeats`), "flops_per_token": 6 * hidden * ffn,
    "device", "dtype", "threads"}; feed it to fit_gemm_efficiency to calibrate a topology.
    """
    import time

    import torch

    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cpu").manual_seed(0)
    w_gate = torch.randn(hidden, ffn, generator=gen).to(device=device, dtype=dt)
    w_up = torch.randn(hidden, ffn, generator=gen).to(device=device, dtype=dt)
    w_down = torch.randn(ffn, hidden, generator=gen).to(device=device, dtype=dt)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    seconds = []
    for n in token_counts:
        x = torch.randn(int(n), hidden, generator=gen).to(device=device, dtype=dt)
        times = []
        for i in range(repeats + 1):
            sync()
            t0 = time.perf_counter()
            y = (torch.nn.functional.silu(x @ w_gate) * (x @ w_up)) @ w_down
            sync()
            if i:  # the first run warms caches and allocators
                times.append(time.perf_counter() - t0)
        del y
        seconds.append(float(np.median(times)))
    return {"tokens": [int(n) for n in token_counts], "seconds": seconds, "flops_per_token": 6 * hidden * ffn,
            "device": device, "dtype": dtype, "threads": threads}


# ---- links ---------------------------------------------------------------------------------------
def link_seconds(bytes_matrix: np.ndarray, gpus_per_node: int, topology: Topology, route: str | None = None,
                 node_bytes: np.ndarray | None = None) -> np.ndarray:
    """Per-GPU transfer seconds of a point-to-point exchange, without latency.

    bytes_matrix: float [..., ep_src, ep_dst] bytes from each GPU to each GPU (the diagonal stays local
    and is free). GPUs are packed gpus_per_node to a node; each has NVLink inside its node and one RDMA
    NIC; its four (link, direction) streams run at once, each full duplex.
    route: how a byte crosses nodes.
      "rail" (DeepEP's internode kernels, NCCL's rail-aligned path): from the sender's NIC to the NIC
        of the GPU with the sender's local index in the destination node, then over NVLink to the
        destination. The exchange that mirrors it (combine after dispatch, a gradient after its
        weight) takes the same links backwards, so it costs the same.
      "direct": from the sender's NIC straight to the destination's NIC.
      None: the topology's `route`. A topology with `shared_link` (one machine's loopback) has a single
        link per GPU at nvlink_GBps: its time is max(all bytes sent, all bytes received) / nvlink_GBps.
    node_bytes: optional float [..., ep_src, nodes] bytes each GPU sends over RDMA into each node on
        the rail route, when fewer than the per-GPU bytes (a token sent once per node, see
        distinct_tokens); default: bytes_matrix summed over each node's GPUs.
    Returns float64 [..., ep]: per GPU, the larger of max(send, recv) NVLink bytes / nvlink_GBps and
    max(send, recv) RDMA bytes / rdma_GBps.
    """
    route = topology.route if route is None else route
    if route not in ROUTES:
        raise ConfigError(f"route must be one of {ROUTES}, got {route!r}")
    x = np.asarray(bytes_matrix, dtype=np.float64)
    ep = x.shape[-1]
    g = gpus_per_node
    n = ep // g
    lead = x.shape[:-2]
    gpu = np.arange(ep)
    diag = x[..., gpu, gpu].reshape(*lead, n, g)
    x4 = x.reshape(*lead, n, g, n, g)  # [..., src node, src local, dst node, dst local]
    to_node = x4.sum(axis=-1)  # [..., Ns, Ls, Nd]
    own_to = np.diagonal(to_node, axis1=-3, axis2=-1)  # [..., Ls, N]: bytes kept inside the sender's node
    own_to = np.swapaxes(own_to, -1, -2)  # [..., Ns, Ls]
    intra_send = own_to - diag
    if node_bytes is not None and route == "rail":
        rail_to_node = np.asarray(node_bytes, dtype=np.float64).reshape(*lead, n, g, n)
        rail_own = np.diagonal(rail_to_node, axis1=-3, axis2=-1)  # [..., Ls, N]
        rdma_send = rail_to_node.sum(axis=-1) - np.swapaxes(rail_own, -1, -2)
    else:
        rail_to_node, rail_own = to_node, np.swapaxes(own_to, -1, -2)
        rdma_send = to_node.sum(axis=-1) - own_to  # [..., Ns, Ls]
    from_node = x4.sum(axis=-4)  # [..., Ls, Nd, Ld]: bytes arriving per (sender local, dst)
    own_from = np.moveaxis(np.diagonal(x4, axis1=-4, axis2=-2), -1, -2)  # [..., Ls, Nd, Ld] same-node part
    intra_recv = own_from.sum(axis=-3) - diag  # [..., Nd, Ld]
    cross = from_node - own_from  # [..., Ls, Nd, Ld]: cross-node bytes by sender local index
    if route == "direct":
        rdma_recv = cross.sum(axis=-3)
        nvl_send, nvl_recv = intra_send, intra_recv
    else:
        # NIC (Nd, Li) receives what every other node's local-i GPU sends into node Nd
        rdma_recv = np.swapaxes(rail_to_node.sum(axis=-3) - rail_own, -1, -2)  # [..., Nd, Li]
        # what arrives on the rail of the destination itself needs no NVLink hop
        on_own_rail = np.diagonal(cross, axis1=-3, axis2=-1)  # [..., Nd, L]
        relayed = cross.sum(axis=-3) - on_own_rail  # [..., Nd, Ld] NVLink bytes into each destination
        relay_out = np.swapaxes(cross.sum(axis=-1), -1, -2) - on_own_rail  # [..., Nd, Li] bytes each relay forwards
        nvl_send, nvl_recv = intra_send + relay_out, intra_recv + relayed
    if topology.shared_link:
        both = np.maximum(nvl_send + rdma_send, nvl_recv + rdma_recv)
        return (np.maximum(both, 0.0) / (topology.nvlink_GBps * GB)).reshape(*lead, ep)
    nvl = np.maximum(np.maximum(nvl_send, nvl_recv), 0.0) / (topology.nvlink_GBps * GB)
    rdma = np.maximum(np.maximum(rdma_send, rdma_recv), 0.0) / (topology.rdma_GBps * GB)
    return np.maximum(nvl, rdma).reshape(*lead, ep)


def collective_seconds(bytes_matrix: np.ndarray, gpus_per_node: int, topology: Topology,
                       route: str | None = None, node_bytes: np.ndarray | None = None) -> np.ndarray:
    """Seconds of one exchange set by its slowest GPU, plus the launch latency where anything moves.

    bytes_matrix: [..., ep, ep]; route, node_bytes: see link_seconds. Returns float64 [...] (0 where
    nothing crosses a link).
    """
    per_gpu = link_seconds(bytes_matrix, gpus_per_node, topology, route, node_bytes)
    slowest = per_gpu.max(axis=-1)
    return np.where(slowest > 0, slowest + topology.collective_latency_s, 0.0)


# ---- model FLOPs and parameters ------------------------------------------------------------------
def attention_flops_per_token(model: ModelShape, seq_len: int) -> tuple[float, float]:
    """(projection FLOPs, attention-core FLOPs) of one layer's attention forward for one token.

    Projections: Q, K, V and output GEMMs. Core: Q K^T and A V over a mean causal context of
    seq_len / 2, i.e. 2 * 2 * heads * head_dim * seq_len / 2.
    """
    q = model.num_attention_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    proj = 2.0 * model.hidden * (q + 2 * kv) + 2.0 * q * model.hidden
    core = 2.0 * q * seq_len
    return proj, core


def moe_layer_dense_flops_per_token(model: ModelShape) -> float:
    """Forward FLOPs per token of an MoE layer's non-attention dense parts: router and shared experts."""
    router = 2.0 * model.hidden * model.num_experts
    shared = model.num_shared_experts * 2.0 * model.expert_params
    return router + shared


def expert_flops_per_token(model: ModelShape) -> float:
    """Forward FLOPs of one routed expert per token (gate, up and down GEMMs): 6 * hidden * moe_ffn."""
    return 2.0 * model.expert_params


def dense_params_per_gpu(model: ModelShape) -> int:
    """Parameters every EP rank holds whole (no tensor or pipeline parallelism): attention, router,
    shared experts, dense layers, embedding and LM head (untied)."""
    q = model.num_attention_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    attention = model.hidden * (q + 2 * kv) + q * model.hidden
    moe_layer = attention + model.hidden * model.num_experts + model.num_shared_experts * model.expert_params
    dense_layer = attention + 3 * model.hidden * model.dense_ffn
    return (model.num_layers * moe_layer + model.num_dense_layers * dense_layer
            + 2 * model.vocab_size * model.hidden)


# ---- the cost of one plan ------------------------------------------------------------------------
@dataclass
class PlanCost:
    """Seconds of one StepPlan. Arrays are float64 seconds unless named otherwise.

    forward / backward: {component: [micro_batches, layers]} for dispatch, combine, expert_compute,
        dense_compute, replica_push, replica_grad, planner; slowest-GPU figures (exposed parts only
        for the transfers).
    extra_forward / extra_backward: [micro_batches] non-MoE dense parts (dense layers, embedding, LM head).
    expert_seconds_per_gpu: [micro_batches, layers, ep] forward routed-expert seconds of each GPU.
    gpu_tokens: int64 [micro_batches, layers, ep] token-expert pairs each GPU computes.
    migration_s, optimizer_s: whole-step costs; planner_s: measured planning seconds (reported; on the
        critical path only through forward["planner"]).
    tokens: tokens of the step (not token-expert pairs), the numerator of tokens per second.
    memory: replica buffer and parameter bytes per GPU (see `replica_memory`).
    """

    forward: dict
    backward: dict
    extra_forward: np.ndarray
    extra_backward: np.ndarray
    expert_seconds_per_gpu: np.ndarray
    gpu_tokens: np.ndarray
    migration_s: float
    migration_bytes: dict
    optimizer_s: float
    planner_s: float
    tokens: int
    memory: dict
    info: dict = field(default_factory=dict)

    @property
    def microbatch_seconds(self) -> np.ndarray:
        """[micro_batches] forward + backward seconds of each micro-batch (all layers)."""
        fwd = sum(v.sum(axis=1) for v in self.forward.values())
        bwd = sum(v.sum(axis=1) for v in self.backward.values())
        return fwd + bwd + self.extra_forward + self.extra_backward

    @property
    def step_seconds(self) -> float:
        """Whole step: every micro-batch, migration and the optimizer step (planner only where exposed)."""
        return float(self.microbatch_seconds.sum() + self.migration_s + self.optimizer_s)

    def totals(self) -> dict:
        """{component: seconds over the step} on the critical path, plus step_total."""
        out: dict[str, float] = {}
        for phase in (self.forward, self.backward):
            for comp, arr in phase.items():
                out[comp] = out.get(comp, 0.0) + float(arr.sum())
        out["dense_compute"] += float(self.extra_forward.sum() + self.extra_backward.sum())
        out["migration"] = self.migration_s
        out["optimizer"] = self.optimizer_s
        out["step_total"] = self.step_seconds
        return out

    def skewness(self) -> np.ndarray:
        """[micro_batches, layers] max / mean token-expert pairs per GPU (1 where a layer is empty)."""
        t = self.gpu_tokens.astype(np.float64)
        mean = t.mean(axis=-1)
        return np.where(mean > 0, t.max(axis=-1) / np.where(mean > 0, mean, 1.0), 1.0)

    def rows(self, **labels) -> dict[str, np.ndarray]:
        """Columns (dict of equal-length arrays) in relibra.metrics.METRIC_COLUMNS order, one row per
        (micro_batch, layer, phase, component) at rank -1, plus the whole-step rows. `labels` fills
        source, hardware, policy, model, workload, ep, step."""
        m, l = self.gpu_tokens.shape[:2]
        mb, layer = np.meshgrid(np.arange(m), np.arange(l), indexing="ij")
        max_tokens = self.gpu_tokens.max(axis=-1)
        parts = []  # (micro_batch, layer, phase, component, seconds, tokens) column blocks
        for phase, comps in (("forward", self.forward), ("backward", self.backward)):
            for comp, arr in comps.items():
                tok = max_tokens if comp == "expert_compute" else np.zeros_like(max_tokens)
                parts.append((mb.ravel(), layer.ravel(), phase, comp, arr.ravel(), tok.ravel()))
        for phase, arr in (("forward", self.extra_forward), ("backward", self.extra_backward)):
            parts.append((np.arange(m), np.full(m, -1), phase, "dense_compute", arr, np.zeros(m, dtype=np.int64)))
        step_rows = [("migration", self.migration_s, 0), ("optimizer", self.optimizer_s, 0),
                     ("planner", self.planner_s, 0), ("step_total", self.step_seconds, self.tokens)]
        for comp, sec, tok in step_rows:
            parts.append((np.array([-1]), np.array([-1]), "step", comp, np.array([sec]), np.array([tok])))
        n = sum(len(p[0]) for p in parts)
        cols = {k: np.full(n, v, dtype=object if isinstance(v, str) else None) for k, v in labels.items()}
        cols["micro_batch"] = np.concatenate([p[0] for p in parts]).astype(np.int64)
        cols["layer"] = np.concatenate([p[1] for p in parts]).astype(np.int64)
        cols["rank"] = np.full(n, -1, dtype=np.int64)
        cols["phase"] = np.concatenate([np.full(len(p[0]), p[2], dtype=object) for p in parts])
        cols["component"] = np.concatenate([np.full(len(p[0]), p[3], dtype=object) for p in parts])
        cols["seconds"] = np.concatenate([np.asarray(p[4], dtype=np.float64) for p in parts])
        cols["tokens"] = np.concatenate([np.asarray(p[5], dtype=np.int64) for p in parts])
        return cols

    def frame(self, **labels):
        """rows() as a DataFrame with exactly relibra.metrics.METRIC_COLUMNS."""
        import pandas as pd

        from relibra.metrics import METRIC_COLUMNS

        defaults = {"source": "simulated", "hardware": "", "policy": "", "model": "", "workload": "", "ep": -1,
                    "step": -1}
        cols = self.rows(**{**defaults, **labels})
        return pd.DataFrame(cols)[METRIC_COLUMNS]


def distinct_tokens(plan: StepPlan, home_onehot: np.ndarray, src_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Estimated distinct tokens each source sends each GPU and each node (a token routed to several
    expert copies there travels once, as DeepEP sends it).

    Every copy c of an expert takes a share pi_c = (tokens of this source it receives) / (the
    source's tokens) of the source's tokens; taking the copies' memberships as independent, a token
    reaches a set X of copies with probability 1 - prod_{c in X} (1 - pi_c). Exact when each set
    holds one copy; otherwise an estimate (top-k picks are in truth slightly anti-correlated).
    home_onehot: [L, E, ep]; src_tokens: [M, ep] tokens (not pairs) per source rank.
    Returns (per GPU float64 [M, L, ep_src, ep_dst], per node float64 [M, L, ep_src, nodes]).
    """
    m, l, ep, e = plan.loads.shape
    tokens = np.asarray(src_tokens, dtype=np.float64)
    inv = np.where(tokens > 0, 1.0 / np.where(tokens > 0, tokens, 1.0), 0.0).astype(np.float32)  # [M, ep]
    home_flow = plan.home_flow().astype(np.float32)  # float32 is exact for these counts
    mi, li, gi, ri = np.nonzero(plan.replica_expert >= 0)
    if len(mi):
        flows = plan.replica_flow[mi, li, :, gi, ri].astype(np.float32)  # [n, src]
        src = np.arange(ep)[None, :]
    one = np.float32(1.0 - 1e-6)
    share = home_flow * inv[:, None, :, None]
    np.minimum(share, one, out=share)
    np.log1p(-share, out=share)
    log_miss = np.matmul(share, home_onehot.astype(np.float32))  # [M, L, src, gpu]
    if len(mi):
        rep_share = np.minimum(flows * inv[mi], one)
        np.add.at(log_miss, (mi[:, None], li[:, None], src, gi[:, None]), np.log1p(-rep_share))
    gpn = plan.gpus_per_node
    log_miss = log_miss.astype(np.float64)
    tokens = tokens[:, None, :, None]
    per_gpu = tokens * -np.expm1(log_miss)
    per_node = tokens * -np.expm1(log_miss.reshape(m, l, ep, ep // gpn, gpn).sum(axis=-1))
    return per_gpu, per_node


def _replica_moves(plan: StepPlan, buffer: str) -> tuple[np.ndarray, np.ndarray]:
    """Replica weight pushes and gradient pulls: (pushes, pulls) int64 [M, L, ep_home, ep_dst] copies.

    layer-shared: every occupied slot is pushed and pulled at its own (micro_batch, layer).
    per-layer: an expert is pushed to a GPU only where it was not there at the previous micro-batch
    (same layer), and its gradient pulled at the last micro-batch of that stay.
    """
    m, l, ep, r = plan.replica_expert.shape
    e = plan.num_experts
    occupied = plan.replica_expert >= 0
    mi, li, gi, ri = np.nonzero(occupied)
    ex = plan.replica_expert[mi, li, gi, ri].astype(np.int64)
    if buffer == "per-layer":
        present = np.zeros((m + 2, l, ep, e), dtype=bool)  # padded with empty micro-batches on both sides
        present[mi + 1, li, gi, ex] = True
        arrive = present[1:-1] & ~present[:-2]
        leave = present[1:-1] & ~present[2:]
        keep_push = arrive[mi, li, gi, ex]
        keep_pull = leave[mi, li, gi, ex]
    else:
        keep_push = keep_pull = np.ones(len(mi), dtype=bool)
    home = plan.home[li, ex]
    out = []
    for keep in (keep_push, keep_pull):
        idx = ((mi[keep] * l + li[keep]) * ep + home[keep]) * ep + gi[keep]
        out.append(np.bincount(idx, minlength=m * l * ep * ep).reshape(m, l, ep, ep).astype(np.int64))
    return out[0], out[1]


def replica_transfer_seconds(plan: StepPlan, model: ModelShape, topology: Topology,
                             params: CostParams | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-GPU seconds of replica weight pushes and gradient pulls, before any overlap.

    Which copies move follows the buffer (see _replica_moves): the plan's own rule for critical-path
    plans (a fetch per micro-batch and layer), else params.replica_buffer. Gradients go back from each
    replica to its home along the pushes' links, reversed (same cost). Each GPU that moves anything
    pays one collective_latency_s. Returns (push, pull), float64 [micro_batches, layers, ep].
    """
    params = params or CostParams()
    route = topology.route if params.route is None else params.route
    gpn = plan.gpus_per_node
    buffer = "layer-shared" if plan.transfers_on_critical_path else params.replica_buffer
    pushes, pulls = _replica_moves(plan, buffer)
    push = link_seconds(pushes * float(model.expert_bytes), gpn, topology, route)
    pull = link_seconds(pulls * float(model.expert_params * params.grad_bytes_per_param), gpn, topology, route)
    lat = topology.collective_latency_s
    return np.where(push > 0, push + lat, 0.0), np.where(pull > 0, pull + lat, 0.0)


def replica_memory(model: ModelShape, ep: int, slots_per_layer, buffer: str,
                   homes_per_gpu: int | None = None, grad_bytes_per_param: int = 2) -> dict:
    """Replica buffer bytes per GPU and their share of the GPU's parameter bytes.

    slots_per_layer: int [layers] the most replicas one GPU holds in each layer (over micro-batches).
    layer-shared: max(slots_per_layer) weight slots and as many gradient slots, reused by every layer.
    per-layer: weight and gradient slots for every layer, sum(slots_per_layer) of each.
    autograd (plans that fetch on the critical path, LLEP): fetched weights of every layer stay until
        backward, sum(slots_per_layer); gradients leave right after each layer, max(slots_per_layer).
    Parameter bytes per GPU: the homed experts of every layer plus the dense parameters (no tensor
    or pipeline parallelism).
    """
    slots = np.asarray(slots_per_layer, dtype=np.int64).reshape(-1)
    homes = homes_per_gpu if homes_per_gpu is not None else model.num_experts // ep
    if buffer not in REPLICA_BUFFERS + ("autograd",):
        raise ConfigError(f"replica buffer must be one of {REPLICA_BUFFERS + ('autograd',)}, got {buffer!r}")
    weight_slots = int(slots.max(initial=0)) if buffer == "layer-shared" else int(slots.sum())
    grad_slots = int(slots.sum()) if buffer == "per-layer" else int(slots.max(initial=0))
    replica_slots = int(slots.max(initial=0))
    buffer_bytes = model.expert_params * (weight_slots * model.bytes_per_param + grad_slots * grad_bytes_per_param)
    param_bytes = (homes * model.num_layers * model.expert_params + dense_params_per_gpu(model)) * model.bytes_per_param
    return {"replica_buffer": buffer, "replica_slots": int(replica_slots), "replica_buffer_bytes": int(buffer_bytes),
            "param_bytes_per_gpu": int(param_bytes), "replica_memory_share": buffer_bytes / param_bytes}


def cost_plan(plan: StepPlan, model: ModelShape, topology: Topology, params: CostParams | None = None,
              prev_home: np.ndarray | None = None, planner_s: float = 0.0,
              critical_planner_s: float | None = None) -> PlanCost:
    """Seconds of one training step run as `plan` on `topology` (see the module docstring).

    plan: a StepPlan whose ep and gpus_per_node fit the topology (topology.ep_layout(plan.ep)).
    prev_home: int [layers, experts] placement of the previous step; None = no migration.
    planner_s: measured seconds the policy took to make the plan (reported; charged on the critical
        path only for plans with transfers_on_critical_path, see CostParams.runtime_plan_s).
    critical_planner_s: the planner seconds to charge there instead of planner_s (the simulator passes
        the planner's CPU time, which other processes on a shared machine inflate less than wall time).
    """
    params = params or CostParams()
    m, l, ep, e = plan.loads.shape
    if (l, e) != (model.num_layers, model.num_experts):
        raise PlanError(f"plan of policy {plan.policy!r} has {l} layers x {e} experts; model {model.name!r} has "
                        f"{model.num_layers} x {model.num_experts}")
    nodes, gpn = topology.ep_layout(ep)
    if plan.gpus_per_node != gpn:
        raise PlanError(f"plan of policy {plan.policy!r} assumes {plan.gpus_per_node} GPUs per node; EP {ep} on "
                        f"cluster {topology.name!r} spans {nodes} node(s) x {gpn} GPUs")
    rate = topology.matmul_tflops * TFLOP
    home_onehot = (plan.home[:, :, None] == np.arange(ep)).astype(np.float64)  # [L, E, ep]

    # -- token flow: dispatch and combine -----------------------------------------------------------
    matrix, home_tokens, replica_tokens = plan.flows()
    gpu_tokens = np.rint(matrix.sum(axis=2)).astype(np.int64)  # [M, L, ep]
    src_tokens = plan.loads[:, 0].sum(axis=2, dtype=np.int64) / model.top_k  # [M, ep] tokens before top-k
    route = topology.route if params.route is None else params.route
    if topology.dedup if params.dedup is None else params.dedup:
        per_gpu, per_node = distinct_tokens(plan, home_onehot, src_tokens)
        a2a_s = collective_seconds(per_gpu * model.token_bytes, gpn, topology, route,
                                   per_node * model.token_bytes)
    else:
        a2a_s = collective_seconds(matrix * model.token_bytes, gpn, topology, route)  # [M, L]

    # -- routed experts: one GEMM per active copy (home or replica) ----------------------------------
    active_homes = np.matmul((home_tokens > 0).astype(np.float32)[:, :, None, :],
                             home_onehot.astype(np.float32))[:, :, 0, :]  # [M, L, ep]
    active_copies = active_homes + (replica_tokens > 0).sum(axis=3)
    expert_fpt = expert_flops_per_token(model)
    expert_gpu_s = np.where(gpu_tokens > 0, expert_fpt * (gpu_tokens + topology.gemm_half_tokens * active_copies)
                            / rate, 0.0)  # [M, L, ep]
    expert_s = expert_gpu_s.max(axis=2)

    # -- dense parts per source rank: attention (the overlap window), router and shared experts -------
    proj_fpt, core_fpt = attention_flops_per_token(model, params.seq_len)
    attn_fwd = (gemm_seconds(src_tokens, proj_fpt, topology)
                + core_fpt * src_tokens / (rate * topology.attention_efficiency))  # [M, ep]
    other_fwd = gemm_seconds(src_tokens, moe_layer_dense_flops_per_token(model), topology)
    dense_fwd = (attn_fwd + other_fwd).max(axis=1)  # [M]

    # -- replica weights and gradients ---------------------------------------------------------------
    zeros = np.zeros((m, l))
    push_fwd, push_bwd, pull_bwd = zeros, zeros.copy(), zeros.copy()
    if (plan.replica_expert >= 0).any():
        critical = plan.transfers_on_critical_path
        push_gpu, pull_gpu = replica_transfer_seconds(plan, model, topology, params)
        if critical:
            push_fwd = push_gpu.max(axis=2)
            pull_bwd = pull_gpu.max(axis=2)
        else:
            def exposed(transfer_gpu, attn, other):
                # the slowest GPU's (max(attention, transfer) + rest) minus the dense time alone
                hidden = (np.maximum(attn[:, None, :], transfer_gpu) + other[:, None, :]).max(axis=2)
                return hidden - (attn + other).max(axis=1)[:, None]

            push_fwd = exposed(push_gpu, attn_fwd, other_fwd)
            if params.replica_buffer == "layer-shared":
                push_bwd = exposed(push_gpu, 2 * attn_fwd, 2 * other_fwd)
            pull_bwd = exposed(pull_gpu, 2 * attn_fwd, 2 * other_fwd)

    # -- planning on the critical path (run-time planners) -----------------------------------------------
    planner_fwd = zeros.copy()
    if plan.transfers_on_critical_path:
        counts = np.full((ep, ep), 4.0 * e)  # every rank all-gathers every rank's int32 expert counts
        gather = float(collective_seconds(counts, gpn, topology, route))
        if params.runtime_plan_s is not None:
            per_layer = gather + params.runtime_plan_s
        else:
            charged = planner_s if critical_planner_s is None else critical_planner_s
            per_layer = gather + charged / (m * l)
        planner_fwd = np.full((m, l), per_layer)

    # -- non-MoE dense parts per micro-batch -----------------------------------------------------------
    extra_fpt = model.num_dense_layers * (proj_fpt + 2.0 * 3 * model.hidden * model.dense_ffn)
    extra_core = model.num_dense_layers * core_fpt
    if params.include_lm_head:
        extra_fpt += 2.0 * model.hidden * model.vocab_size
    extra_fwd = (gemm_seconds(src_tokens, extra_fpt, topology) if extra_fpt else np.zeros_like(src_tokens)) \
        + extra_core * src_tokens / (rate * topology.attention_efficiency)
    extra_fwd = extra_fwd.max(axis=1)

    forward = {"dispatch": a2a_s, "expert_compute": expert_s, "combine": a2a_s.copy(),
               "dense_compute": np.broadcast_to(dense_fwd[:, None], (m, l)).copy(),
               "replica_push": push_fwd, "replica_grad": zeros.copy(), "planner": planner_fwd}
    # Backward mirrors the exchanges (combine's gradient goes out like dispatch and back like combine;
    # the per-GPU time is the same under the transpose) at twice the FLOPs.
    backward = {"dispatch": a2a_s.copy(), "expert_compute": 2 * expert_s, "combine": a2a_s.copy(),
                "dense_compute": 2 * forward["dense_compute"], "replica_push": push_bwd,
                "replica_grad": pull_bwd, "planner": zeros.copy()}

    # -- once per step: migration and optimizer ----------------------------------------------------------
    state_bytes = model.expert_params * (model.bytes_per_param + model.optimizer_bytes_per_param)
    migration_s, migration_bytes = 0.0, {"intra_node": 0, "inter_node": 0, "experts_moved": 0}
    if prev_home is not None:
        prev_home = np.asarray(prev_home)
        if prev_home.shape != plan.home.shape:
            raise PlanError(f"previous placement has shape {prev_home.shape}, plan of {plan.policy!r} {plan.home.shape}")
        moved = prev_home != plan.home
        if moved.any():
            moves = np.zeros((ep, ep))
            np.add.at(moves, (prev_home[moved], plan.home[moved]), 1.0)
            migration_s = float(collective_seconds(moves * state_bytes, gpn, topology, route))
            cross = (prev_home[moved] // gpn) != (plan.home[moved] // gpn)
            migration_bytes = {"intra_node": int((~cross).sum()) * state_bytes,
                               "inter_node": int(cross.sum()) * state_bytes, "experts_moved": int(moved.sum())}
    homes_per_gpu = int(max(np.bincount(plan.home[i], minlength=ep).max() for i in range(l)))
    params_per_gpu = homes_per_gpu * l * model.expert_params + dense_params_per_gpu(model)
    # Adam: read and write fp32 master, m and v; read the gradient; write the bf16 weight.
    optimizer_bytes = params_per_gpu * (2 * model.optimizer_bytes_per_param + 2 * model.bytes_per_param)
    optimizer_s = optimizer_bytes / (topology.memory_GBps * GB)

    slots_per_layer = (plan.replica_expert >= 0).sum(axis=3).max(axis=(0, 2)) if plan.replica_slots else np.zeros(l)
    buffer = "autograd" if plan.transfers_on_critical_path else params.replica_buffer
    memory = replica_memory(model, ep, slots_per_layer, buffer, homes_per_gpu, params.grad_bytes_per_param)
    tokens = int(round(float(src_tokens.sum())))
    return PlanCost(forward=forward, backward=backward, extra_forward=extra_fwd, extra_backward=2 * extra_fwd,
                    expert_seconds_per_gpu=expert_gpu_s, gpu_tokens=gpu_tokens, migration_s=migration_s,
                    migration_bytes=migration_bytes, optimizer_s=optimizer_s, planner_s=float(planner_s),
                    tokens=tokens, memory=memory,
                    info={"exposed_planner": bool(plan.transfers_on_critical_path), "policy": plan.policy})
