"""One function per phase of a training step, each returning seconds for one StepPlan.

In the order one MoE layer runs for one micro-batch:

  forward:  dense (attention, router, shared experts) | replica weight push, hidden behind attention
            -> [run-time planner] -> dispatch all-to-all -> routed-expert GEMMs -> combine all-to-all
  backward: the same in reverse at twice the FLOPs (the attention core at CostParams.attention_backward_factor
            times its forward); dispatch and combine mirrored; replica weights
            pushed again (layer-shared buffer) and replica gradients pulled to the home, each hidden
            behind a layer's attention backward

and once per step: the non-MoE parts (dense layers, embedding, LM head) per micro-batch, expert
migration between placements, and the optimizer step. relibra.costs.plan_cost assembles them.
Conventions: compute counts token-expert pairs (a token routed to k experts is k GEMM rows); the
slowest GPU sets the time of every phase.
"""

from __future__ import annotations

import numpy as np

from relibra.cluster import ModelShape, Topology
from relibra.costs.calibration import planner_seconds_per_cell
from relibra.costs.flops import attention_core_flops, attention_core_seconds, gemm_seconds
from relibra.costs.links import collective_seconds, layer_distinct_tokens, sparse_link_seconds
from relibra.costs.overheads import overlapped_seconds, recompute_push_window, replica_move_list
from relibra.costs.params import DISPATCHER_ROUTE, REPLICA_BUFFERS, CostParams
from relibra.errors import ConfigError, PlanError
from relibra.plan import StepPlan


def route_of(topology: Topology, params: CostParams) -> str:
    """The route every exchange takes: params.route, else the topology's."""
    return topology.route if params.route is None else params.route


def dispatch_rule_of(topology: Topology, params: CostParams) -> tuple[str, bool]:
    """(route, dedup) of the token exchange: params.route / params.dedup where given, else the card's
    dispatcher's (params.DISPATCHER_ROUTE), else the topology's. Replica transfers and migration take
    route_of (the balancer's own point-to-point copies, not the dispatcher's)."""
    rule = DISPATCHER_ROUTE.get(params.dispatcher, (topology.route, topology.dedup))
    route = rule[0] if params.route is None else params.route
    dedup = rule[1] if params.dedup is None else params.dedup
    return route, dedup


def dp_size_of(topology: Topology, params: CostParams, ep: int) -> int:
    """Data-parallel ranks that shard each EP rank's optimizer state: params.dp_size, else topology.dp_size(ep)."""
    return topology.dp_size(ep) if params.dp_size is None else params.dp_size


# ---- dispatch and combine ------------------------------------------------------------------------
def dispatch_seconds(plan: StepPlan, model: ModelShape, topology: Topology, params: CostParams,
                     token_matrix: np.ndarray | None, src_tokens: np.ndarray) -> np.ndarray:
    """Seconds of one dispatch exchange per (micro-batch, layer): float64 [M, L]. Combine sends the
    same bytes back along the same links, so it costs the same.

    token_matrix: float [M, L, ep_src, ep_dst] token-expert pairs (StepPlan.flows()[0]), or None to
    take them from the plan layer by layer (StepPlan.layer_token_matrices); src_tokens: [M, ep] tokens
    per source rank. The rule is the dispatcher's (dispatch_rule_of): under dedup (DeepEP) a token
    crosses to a GPU / node once (links.distinct_tokens); otherwise one row per pair (Megatron's alltoall
    dispatcher). Megatron's allgather dispatcher (params.dispatcher "allgather") sends every token of a
    source to every other EP rank whatever its experts (allgather_seconds): the same every layer.
    """
    route, dedup = dispatch_rule_of(topology, params)
    gpn = plan.gpus_per_node
    out = np.zeros((plan.num_microbatches, plan.num_layers))
    if params.dispatcher == "allgather":
        out[:] = allgather_seconds(np.asarray(src_tokens, dtype=np.float64) * model.token_bytes, gpn, topology,
                                   route)[:, None]
        return out
    if dedup:
        for layer, per_gpu, per_node in layer_distinct_tokens(plan, src_tokens, model.token_bytes):
            out[:, layer] = collective_seconds(per_gpu, gpn, topology, route, per_node)
        return out
    if token_matrix is not None:
        return collective_seconds(token_matrix * model.token_bytes, gpn, topology, route)
    for layer, matrix in plan.layer_token_matrices():
        out[:, layer] = collective_seconds(matrix * model.token_bytes, gpn, topology, route)
    return out


def allgather_seconds(src_bytes: np.ndarray, gpus_per_node: int, topology: Topology, route: str) -> np.ndarray:
    """Seconds of an all-gather of every rank's bytes to every other rank: float64 [M] (src_bytes [M, ep]).

    Rank s sends src_bytes[s] to each other GPU; on the rail route once per remote node (a node's GPUs
    forward it over NVLink, as NCCL's rail-aligned rings do), so each GPU receives the sum of the
    others' bytes. The reduce-scatter that combines costs the same bytes backwards.
    """
    x = np.asarray(src_bytes, dtype=np.float64)
    m, ep = x.shape
    matrix = np.broadcast_to(x[:, :, None], (m, ep, ep))
    nodes = ep // gpus_per_node
    node_bytes = np.broadcast_to(x[:, :, None], (m, ep, nodes))
    return collective_seconds(matrix, gpus_per_node, topology, route, node_bytes)


# ---- routed experts ------------------------------------------------------------------------------
def active_copies(plan: StepPlan, home_tokens: np.ndarray, replica_tokens: np.ndarray) -> np.ndarray:
    """Expert copies (homes and replicas) with at least one token on each GPU: int64 [M, L, ep].

    home_tokens: int [M, L, E]; replica_tokens: int [M, L, ep, R] (StepPlan.flows()).
    """
    m, l, e = home_tokens.shape
    ep = plan.ep
    bins = ((np.arange(m)[:, None, None] * l + np.arange(l)[None, :, None]) * ep + plan.home[None]).ravel()
    busy_homes = np.bincount(bins, weights=(home_tokens > 0).ravel(), minlength=m * l * ep)
    busy_homes = np.rint(busy_homes).astype(np.int64).reshape(m, l, ep)
    return busy_homes + (replica_tokens > 0).sum(axis=3)


def expert_seconds_per_gpu(gpu_tokens: np.ndarray, copies: np.ndarray, model: ModelShape,
                           topology: Topology) -> np.ndarray:
    """Forward routed-expert seconds of each GPU: float64 [M, L, ep] (backward is twice this).

    gpu_tokens: int [M, L, ep] token-expert pairs each GPU computes; copies: int [M, L, ep] its
    busy expert copies, each one GEMM paying the fixed cost (flops.gemm_seconds).
    """
    return gemm_seconds(gpu_tokens, model.expert_flops_per_token, topology, copies)


# ---- dense parts ---------------------------------------------------------------------------------
def dense_seconds(src_tokens: np.ndarray, model: ModelShape, topology: Topology, params: CostParams,
                  seq_lens: np.ndarray | None = None, backward: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of one MoE layer's dense parts on each source rank: (attention, router + shared experts),
    float64 [M, ep] each. Attention (projections and causal core) is the window replica transfers hide
    behind.

    seq_lens: int [M, ep, max_seqs] sequence lengths per (micro-batch, rank) from the trace, or None
    for params.seq_len (see flops.attention_core_flops). backward: the backward pass, GEMMs at twice
    their forward FLOPs and the attention core at params.attention_backward_factor times its own.
    """
    gemm_factor, core_factor = (2.0, params.attention_backward_factor) if backward else (1.0, 1.0)
    core = core_factor * attention_core_flops(model, src_tokens, params.seq_len, seq_lens, params.sequence_split)
    attention = gemm_seconds(src_tokens, gemm_factor * model.attention_projection_flops_per_token, topology) \
        + attention_core_seconds(core, topology)
    other = gemm_seconds(src_tokens, gemm_factor * model.moe_layer_dense_flops_per_token, topology)
    return attention, other


def non_moe_seconds(src_tokens: np.ndarray, model: ModelShape, topology: Topology, params: CostParams,
                    seq_lens: np.ndarray | None = None, backward: bool = False) -> np.ndarray:
    """Seconds of the parts outside the MoE layers per micro-batch (slowest rank): float64 [M].

    The num_dense_layers leading dense layers (attention + a dense SwiGLU FFN) and, with
    params.include_lm_head, the LM-head GEMM (2 * hidden * vocab FLOPs per token). backward: as in
    dense_seconds.
    """
    gemm_factor, core_factor = (2.0, params.attention_backward_factor) if backward else (1.0, 1.0)
    fpt = model.num_dense_layers * (model.attention_projection_flops_per_token + 2.0 * 3 * model.hidden * model.dense_ffn)
    if params.include_lm_head:
        fpt += 2.0 * model.hidden * model.vocab_size
    core = core_factor * model.num_dense_layers * attention_core_flops(model, src_tokens, params.seq_len, seq_lens,
                                                                       params.sequence_split)
    return (gemm_seconds(src_tokens, gemm_factor * fpt, topology) + attention_core_seconds(core, topology)).max(axis=1)


def stage_send_seconds(src_tokens: np.ndarray, model: ModelShape, topology: Topology,
                       crosses_nodes: np.ndarray) -> np.ndarray:
    """Seconds of each chunk's stage-to-stage send per micro-batch: float64 [chunks, M] (the activation
    forward; its gradient backward is the same size).

    src_tokens: [M, ep] tokens on each rank (already split over CP and TP: Megatron sends each rank's
    sequence-parallel piece, [seq / CP / TP, batch, hidden] in schedules.py get_tensor_shapes); each rank
    sends tokens x hidden x bytes_per_param to its peer in the next stage over RDMA where the boundary
    crosses nodes (crosses_nodes bool [chunks]), else NVLink; the slowest rank sets it, plus one
    collective_latency_s. The last chunk's row is 0.
    """
    nbytes = np.asarray(src_tokens, dtype=np.float64).max(axis=1) * model.hidden * model.bytes_per_param  # [M]
    rate = np.where(np.asarray(crosses_nodes), topology.rdma_bytes_per_s, topology.nvlink_bytes_per_s)  # [chunks]
    out = nbytes[None, :] / rate[:, None] + topology.collective_latency_s
    out[-1] = 0.0
    return out


# ---- replicas ------------------------------------------------------------------------------------
def replica_moves(plan: StepPlan, buffer: str) -> tuple[np.ndarray, np.ndarray]:
    """Replica weight pushes and gradient pulls: (pushes, pulls) int64 [M, L, ep_home, ep_dst] copies
    (replica_move_list counted per (micro_batch, layer, home, gpu))."""
    m, l, ep, _ = plan.replica_expert.shape
    moves = replica_move_list(plan, buffer)
    idx = ((moves["micro_batch"] * l + moves["layer"]) * ep + moves["home"]) * ep + moves["gpu"]
    return tuple(np.bincount(idx[moves[kind]], minlength=m * l * ep * ep).reshape(m, l, ep, ep).astype(np.int64)
                 for kind in ("push", "pull"))


def replica_buffer_of(plan: StepPlan, params: CostParams) -> str:
    """Which buffer rule moves a plan's replicas: plans with transfers on the critical path fetch per
    (micro-batch, layer) ("layer-shared" moves), others follow params.replica_buffer."""
    return "layer-shared" if plan.transfers_on_critical_path else params.replica_buffer


def replica_transfer_seconds(plan: StepPlan, model: ModelShape, topology: Topology,
                             params: CostParams | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-GPU seconds of replica weight pushes and gradient pulls, before any overlap.

    Gradients go back from each replica to its home along the pushes' links, reversed (same cost).
    Each GPU that moves anything pays one collective_latency_s. Returns (push, pull), float64
    [micro_batches, layers, ep].
    """
    params = params or CostParams()
    route = route_of(topology, params)
    m, l, ep, _ = plan.replica_expert.shape
    moves = replica_move_list(plan, replica_buffer_of(plan, params))
    cell = moves["micro_batch"] * l + moves["layer"]
    seconds = []
    for kind, nbytes in (("push", model.expert_bytes), ("pull", model.expert_params * params.grad_bytes_per_param)):
        keep = moves[kind]
        per_gpu = sparse_link_seconds(cell[keep], moves["home"][keep], moves["gpu"][keep], float(nbytes), m * l, ep,
                                      plan.gpus_per_node, topology, route)
        seconds.append(per_gpu.reshape(m, l, ep))
    push, pull = seconds
    lat = topology.collective_latency_s
    return np.where(push > 0, push + lat, 0.0), np.where(pull > 0, pull + lat, 0.0)


def pushes_again_for_backward(plan: StepPlan, params: CostParams) -> bool:
    """A layer-shared buffer is overwritten by later layers, so an overlapping plan pushes its replica
    weights again for backward; critical-path plans keep them (autograd holds them)."""
    return not plan.transfers_on_critical_path and params.replica_buffer == "layer-shared"


def exposed_seconds(transfer_gpu: np.ndarray, attention: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Seconds a transfer adds to a layer when it overlaps that layer's attention: float64 [M, L].

    transfer_gpu: [M, L, ep]; attention, other: [M, ep] the layer's dense parts. The slowest GPU's
    max(attention, transfer) + other, minus the dense time alone.
    """
    hidden = (np.maximum(attention[:, None, :], transfer_gpu) + other[:, None, :]).max(axis=2)
    return hidden - (attention + other).max(axis=1)[:, None]


def replica_seconds(plan: StepPlan, push_gpu: np.ndarray, pull_gpu: np.ndarray, attention: np.ndarray,
                    other: np.ndarray, params: CostParams, attention_backward: np.ndarray | None = None,
                    other_backward: np.ndarray | None = None) -> dict:
    """Replica transfers on the critical path: {"push_forward", "push_backward", "pull_backward"}, each
    float64 [M, L], plus "unhidden_s": the step's push and pull seconds if none were hidden.

    attention, other: [M, ep] the forward dense parts; attention_backward, other_backward: the backward
    ones (default: twice the forward). Critical-path plans (LLEP) pay the slowest GPU's push before
    the experts and its pull after backward; others overlap each with the layer's attention (forward
    and backward), unless params.overlap_transfers is False: then they pay every push and pull in line.
    params.overheads sets the overlap efficiency (overheads.overlapped_seconds) and, with activation
    recomputation, hides the backward push behind the recomputed forward's window instead.
    """
    attention_backward = 2 * attention if attention_backward is None else attention_backward
    other_backward = 2 * other if other_backward is None else other_backward
    ov = params.overheads
    critical = plan.transfers_on_critical_path
    # critical-path plans fetch again for a recomputed forward (autograd no longer holds the weights)
    again = pushes_again_for_backward(plan, params) or (critical and ov.activation_recompute)
    unhidden = (2 if again else 1) * push_gpu.max(axis=2).sum() + pull_gpu.max(axis=2).sum()
    zeros = np.zeros(push_gpu.shape[:2])
    if critical:
        return {"push_forward": push_gpu.max(axis=2), "push_backward": push_gpu.max(axis=2) if again else zeros,
                "pull_backward": pull_gpu.max(axis=2), "unhidden_s": float(unhidden)}
    if not params.overlap_transfers:
        return {"push_forward": push_gpu.max(axis=2), "push_backward": push_gpu.max(axis=2) if again else zeros,
                "pull_backward": pull_gpu.max(axis=2), "unhidden_s": float(unhidden)}
    eff = ov.transfer_overlap_efficiency
    window = recompute_push_window(attention, other, attention_backward, other_backward, ov.activation_recompute)
    push_bwd = overlapped_seconds(push_gpu, *window, eff) if again else zeros
    return {"push_forward": overlapped_seconds(push_gpu, attention, other, eff), "push_backward": push_bwd,
            "pull_backward": overlapped_seconds(pull_gpu, attention_backward, other_backward, eff),
            "unhidden_s": float(unhidden)}


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
    buffer_bytes = model.expert_params * (weight_slots * model.bytes_per_param + grad_slots * grad_bytes_per_param)
    param_bytes = (homes * model.num_layers * model.expert_params + model.dense_params) * model.bytes_per_param
    return {"replica_buffer": buffer, "replica_slots": int(slots.max(initial=0)), "replica_buffer_bytes": int(buffer_bytes),
            "param_bytes_per_gpu": int(param_bytes), "replica_memory_share": buffer_bytes / param_bytes}


# ---- run-time planner ----------------------------------------------------------------------------
def planner_on_critical_path(plan: StepPlan) -> bool:
    """Whether a plan's planner runs at run time, between routing and dispatch: the plan's
    `planner_on_critical_path`, or `transfers_on_critical_path` (a plan that fetches replica weights
    on the critical path decides them there too)."""
    return bool(plan.planner_on_critical_path or plan.transfers_on_critical_path)


def planner_seconds(plan: StepPlan, topology: Topology, params: CostParams,
                    measured_cpu_s: float = 0.0) -> tuple[np.ndarray, str]:
    """Forward seconds of a run-time planner per (micro-batch, layer): (float64 [M, L], how charged).

    Zero for plans made ahead of the step. Otherwise an all-gather of every rank's int32 expert
    counts (4 * experts bytes to every rank; LPLB's all-reduce of the same counts moves no more) plus
    the planner's own seconds per (micro-batch, layer) as params.runtime_plan_s says: the measured
    table (calibration.planner_seconds_per_cell at this EP size), this step's measured CPU seconds of
    the run-time part (plan.runtime_planner's cpu_seconds / cells when the policy times it apart,
    else measured_cpu_s over all cells), or a fixed number.
    """
    m, l, ep, e = plan.loads.shape
    if not planner_on_critical_path(plan):
        return np.zeros((m, l)), "none"
    counts = np.full((ep, ep), 4.0 * e)
    gather = float(collective_seconds(counts, plan.gpus_per_node, topology, route_of(topology, params)))
    charge = params.runtime_plan_s
    if charge == "table":
        per_cell = planner_seconds_per_cell(plan.policy, ep)
        if per_cell is not None:
            return np.full((m, l), gather + per_cell), "table"
        charge = "measured"
    if charge == "measured":
        # the run-time part the policy recorded (lplb+, llep), else all of the plan's measured time
        part = plan.runtime_planner
        runtime_cpu_s = float(measured_cpu_s if part is None else part.cpu_seconds)
        cells = m * l if part is None else part.cells
        return np.full((m, l), gather + runtime_cpu_s / cells), "measured"
    return np.full((m, l), gather + float(charge)), "fixed"


# ---- once per step -------------------------------------------------------------------------------
def migration_seconds(prev_home: np.ndarray | None, home: np.ndarray, ep: int, gpus_per_node: int, model: ModelShape,
                      topology: Topology, dp_size: int = 1, route: str | None = None) -> tuple[float, dict]:
    """Seconds and bytes of moving experts between two placements (before the step's first micro-batch).

    prev_home, home: int [layers, experts] home GPU of each expert; None prev_home = nothing moves.
    An expert that changes home sends ModelShape.expert_state_bytes(dp_size) from its old to its new
    GPU (weights, plus its optimizer-state shard: each of the dp_size data-parallel copies of the
    EP group moves its own shard at the same time, on its own GPUs). All moves form one exchange.
    Returns (seconds, {"intra_node", "inter_node": bytes one EP group moves, "experts_moved"}).
    """
    none = {"intra_node": 0, "inter_node": 0, "experts_moved": 0}
    if prev_home is None:
        return 0.0, none
    prev_home = np.asarray(prev_home)
    if prev_home.shape != home.shape:
        raise PlanError(f"previous placement has shape {prev_home.shape}, the plan's {home.shape}")
    moved = prev_home != home
    if not moved.any():
        return 0.0, none
    state_bytes = model.expert_state_bytes(dp_size)
    moves = np.zeros((ep, ep))
    np.add.at(moves, (prev_home[moved], home[moved]), 1.0)
    seconds = float(collective_seconds(moves * state_bytes, gpus_per_node, topology, route))
    cross = (prev_home[moved] // gpus_per_node) != (home[moved] // gpus_per_node)
    return seconds, {"intra_node": int(round(int((~cross).sum()) * state_bytes)),
                     "inter_node": int(round(int(cross.sum()) * state_bytes)), "experts_moved": int(moved.sum())}


def optimizer_parts(model: ModelShape, homes_per_gpu: int, ep: int, topology: Topology, dp_size: int = 1,
                    layers: int | None = None, dense_params: float | None = None, offload_fraction: float = 0.0,
                    host_adam_params_per_s: float = 4.0e8, grad_bytes_per_param: int = 4,
                    expert_copies: int | None = None) -> dict:
    """Seconds of the Adam step on the busiest GPU, by where it runs: {"params" (parameters the GPU's shard
    updates), "gpu_s", "host_s", "host_compute_s", "pcie_s", "seconds"}.

    A distributed optimizer updates 1 / dp_size of the GPU's experts (sharded over the expert-data-parallel
    ranks) and 1 / (ep x dp_size) of the dense parameters (sharded over every GPU); the all-gather of the
    updated weights is not charged (the same for every policy). layers, dense_params: one pipeline stage's
    MoE layers and dense parameters (default: the whole model's); expert_copies: the (layer, expert) homes the
    busiest GPU updates over those layers (default homes_per_gpu x layers).

    On the GPU ((1 - offload_fraction) of the parameters) the step is memory-bound: read and write the fp32
    master, m and v (2 x optimizer_bytes_per_param), read the gradient and write the weight (2 x
    bytes_per_param) at memory_GBps. The offloaded share runs on the host (Megatron-LM's
    HybridDeviceOptimizer: torch.optim.AdamW on the CPU copies) at host_adam_params_per_s, while its
    gradients go down (grad_bytes_per_param each: the fp32 main_grad) and its updated weights come back up
    (bytes_per_param each: a CPU-GPU copy converts on the CPU) over the GPU's PCIe link, both directions at
    once; with --overlap-cpu-optimizer-d2h-h2d the copies of one parameter overlap the CPU step of another,
    so the host part takes the longest of the three. The GPU part runs beside it (its kernels are queued
    before the CPU step starts): the step takes the longer of the two.
    """
    layers = model.num_layers if layers is None else layers
    dense = model.dense_params if dense_params is None else dense_params
    copies = homes_per_gpu * layers if expert_copies is None else expert_copies
    params = copies * model.expert_params / dp_size + dense / (ep * dp_size)
    f = float(offload_fraction)
    gpu_s = (1.0 - f) * params * (2 * model.optimizer_bytes_per_param + 2 * model.bytes_per_param) \
        / topology.memory_bytes_per_s
    host_compute_s = f * params / host_adam_params_per_s
    pcie_s = f * params * max(grad_bytes_per_param, model.bytes_per_param) / (topology.pcie_GBps * 1e9)
    host_s = max(host_compute_s, pcie_s)
    return {"params": float(params), "gpu_s": float(gpu_s), "host_s": float(host_s),
            "host_compute_s": float(host_compute_s), "pcie_s": float(pcie_s), "seconds": float(max(gpu_s, host_s))}


def optimizer_seconds(model: ModelShape, homes_per_gpu: int, ep: int, topology: Topology, dp_size: int = 1,
                      layers: int | None = None, dense_params: float | None = None, offload_fraction: float = 0.0,
                      host_adam_params_per_s: float = 4.0e8, grad_bytes_per_param: int = 4) -> float:
    """Seconds of the Adam step on the busiest GPU (optimizer_parts' "seconds"; all on the GPU by default)."""
    return optimizer_parts(model, homes_per_gpu, ep, topology, dp_size, layers, dense_params, offload_fraction,
                           host_adam_params_per_s, grad_bytes_per_param)["seconds"]
