"""Costs of replica balancing beyond the bytes of its transfers: the overlap efficiency of transfers with
attention, activation recomputation (and the replica pushes it needs again), the add of each replica's
gradient into its home's, the post-rollout planner beyond its window, and the host-side plan metadata.

Every term applies to every plan that has the mechanism (ReLibra, EPLB+, LPLB+, ... alike): a policy
shows up only through its plan. `Overheads()` (the default of CostParams.overheads) charges none of them;
the set-up card's [overheads] section says what the headline charges (relibra.setups, docs/cost-model.md).

  overlapped_seconds        a transfer beside attention at an overlap efficiency -> exposed seconds [M, L]
  replica_move_list         which replica slots push weights and pull gradients at which micro-batch
  replica_grad_add_seconds  the home GPU adding each pulled replica gradient into its own (HBM-bound)
  recompute_push_window     which dense window hides the backward push under activation recomputation
  post_rollout_planner      planner seconds beyond the post-rollout window, once per step
  plan_metadata             bytes and host-to-device seconds of one micro-batch's plan
  plan_broadcast_seconds    the plan's metadata copied to the GPUs and broadcast over the links, per micro-batch
  gemm_floor_seconds        a GPU's grouped expert GEMM call at least the measured per-call floor
  copy_contention_seconds   the share of replica copy time that shares NVLink with the all-to-all
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from relibra.cluster import ModelShape, Topology
from relibra.errors import ConfigError
from relibra.plan import StepPlan


@dataclass(frozen=True)
class Overheads:
    """Knobs of the overheads; the defaults charge nothing beyond the transfers' exposed bytes.

    transfer_overlap_efficiency: share of the shorter of (a layer's attention, a replica transfer) that
        runs hidden when both run together; 1 = perfect overlap (the transfer costs only what exceeds
        attention), 0 = serial. Below 1 stands for copy and NCCL kernels taking SMs and HBM bandwidth
        from attention. Applies to every plan whose transfers overlap (not critical-path plans).
    activation_recompute: full activation recomputation, one layer at a time (Megatron's
        --recompute-granularity full --recompute-method uniform --recompute-num-layers 1): backward
        re-runs each layer's forward (dense parts, dispatch, experts, combine; every policy pays it)
        just before the layer's backward, so a layer-shared buffer's second push must arrive before
        the recomputed forward's experts, hidden behind the forward attention window instead of the
        backward one; plans with transfers on the critical path fetch their weights again.
    replica_grad_add: charge the home GPU's add of each pulled replica gradient into its own gradient:
        read the pulled gradient (CostParams.grad_bytes_per_param) and read and write the home's
        accumulator (main_grad_bytes_per_param each) at the topology's memory rate, in backward, on
        the critical path of the home GPU (the slowest GPU sets the layer).
    main_grad_bytes_per_param: bytes of one element of the home's gradient accumulator (4: fp32, as
        Megatron's --accumulate-allreduce-grads-in-fp32 keeps it).
    planner_window_forward_passes: the post-rollout window the planner hides in, in forward passes of
        the step (the log-probability passes that run between rollout and training); None = the
        planner is not charged. Planner seconds beyond the window delay the step.
    planner_reorder_s_per_layer, planner_replication_s_per_cell: the planner's seconds per MoE layer
        (the once-per-step home search) and per (micro-batch, layer) (replication), for plans of the
        relibra family (policy names starting "relibra"); other plans' post-rollout planners (EPLB+:
        tens of milliseconds a step) are charged nothing. A model of measured seconds, not the step's
        own clock, so that the same seed gives the same results.
    planner_measured_experts: the experts per layer of the models the planner rates were measured on; a
        model with another count (the kit's small test models, 256-expert models) has no measured rate
        and its planner is not charged (post_rollout_planner says so). None: charge every model.
    host_to_device_GBps: the rate plan metadata is copied to the GPU at (plan_metadata).
    gemm_call_floor_s: forward + backward seconds below which one grouped expert GEMM call does not go (the
        flat part of data/device/expert_gemm.json below 4096 tokens: launch and host-sync bound). A GPU's
        routed experts of one (micro-batch, layer), homes and replicas, are one grouped call (megatron-core's
        --moe-grouped-gemm; TE's GroupedLinear takes any list of weights), so its expert seconds are at least
        the floor wherever it computes anything: a third forward, two thirds backward (gemm_floor_seconds).
        0: not charged.
    copy_a2a_contention: the share, in [0, 1], of each GPU's replica copy seconds (weight pushes and gradient
        pulls) that runs on NVLink at the same time as the layer's all-to-all and so adds to it
        (copy_contention_seconds). Applies to plans whose copies overlap (not critical-path plans).
    plan_metadata_charged: charge each micro-batch's plan metadata (plan_broadcast_seconds): the host-to-GPU
        copy and a broadcast over the EP group's links, in line before the micro-batch's first layer.
    """

    transfer_overlap_efficiency: float = 1.0
    activation_recompute: bool = False
    replica_grad_add: bool = False
    main_grad_bytes_per_param: int = 4
    planner_window_forward_passes: float | None = None
    planner_reorder_s_per_layer: float = 0.0
    planner_replication_s_per_cell: float = 0.0
    planner_measured_experts: int | None = None
    host_to_device_GBps: float = 25.0
    gemm_call_floor_s: float = 0.0
    copy_a2a_contention: float = 0.0
    plan_metadata_charged: bool = False

    def __post_init__(self):
        eff = self.transfer_overlap_efficiency
        if isinstance(eff, bool) or not isinstance(eff, (int, float)) or not 0.0 <= eff <= 1.0:
            raise ConfigError(f"overheads: transfer_overlap_efficiency must lie in [0, 1], got {eff!r}")
        for name in ("activation_recompute", "replica_grad_add", "plan_metadata_charged"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"overheads: {name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.main_grad_bytes_per_param, bool) or not isinstance(self.main_grad_bytes_per_param, int) \
                or self.main_grad_bytes_per_param <= 0:
            raise ConfigError(f"overheads: main_grad_bytes_per_param must be a positive integer, "
                              f"got {self.main_grad_bytes_per_param!r}")
        window = self.planner_window_forward_passes
        if window is not None and (isinstance(window, bool) or not isinstance(window, (int, float))
                                   or not math.isfinite(window) or window < 0):
            raise ConfigError(f"overheads: planner_window_forward_passes must be None or a number >= 0, got {window!r}")
        for name in ("planner_reorder_s_per_layer", "planner_replication_s_per_cell"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"overheads: {name} must be a number of seconds >= 0, got {v!r}")
        v = self.planner_measured_experts
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise ConfigError(f"overheads: planner_measured_experts must be None or a positive integer, got {v!r}")
        v = self.host_to_device_GBps
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"overheads: host_to_device_GBps must be a positive number, got {v!r}")
        v = self.gemm_call_floor_s
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"overheads: gemm_call_floor_s must be a number of seconds >= 0, got {v!r}")
        v = self.copy_a2a_contention
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise ConfigError(f"overheads: copy_a2a_contention must lie in [0, 1], got {v!r}")

    @property
    def charges_planner(self) -> bool:
        return self.planner_window_forward_passes is not None


# The set-up card's [overheads] entries: card key -> (Overheads field, the types its value may have).
CARD_ENTRIES: dict[str, tuple[str, type | tuple]] = {
    "overheads.transfer_overlap_efficiency": ("transfer_overlap_efficiency", (int, float)),
    "overheads.activation_recompute": ("activation_recompute", bool),
    "overheads.replica_grad_add": ("replica_grad_add", bool),
    "overheads.main_grad_bytes_per_param": ("main_grad_bytes_per_param", int),
    "overheads.planner_window_forward_passes": ("planner_window_forward_passes", (int, float)),
    "overheads.planner_reorder_s_per_layer": ("planner_reorder_s_per_layer", (int, float)),
    "overheads.planner_replication_s_per_cell": ("planner_replication_s_per_cell", (int, float)),
    "overheads.planner_measured_experts": ("planner_measured_experts", int),
    "overheads.host_to_device_GBps": ("host_to_device_GBps", (int, float)),
    "overheads.gemm_call_floor_s": ("gemm_call_floor_s", (int, float)),
    "overheads.copy_a2a_contention": ("copy_a2a_contention", (int, float)),
    "overheads.plan_metadata_charged": ("plan_metadata_charged", bool),
}
# Entries whose value may be 0 (a card checks the others are positive).
CARD_ZERO_ALLOWED = ("overheads.planner_window_forward_passes", "overheads.gemm_call_floor_s",
                     "overheads.copy_a2a_contention")


def overheads_from_values(values: dict) -> Overheads:
    """Overheads from {card key: value} (CARD_ENTRIES; missing keys keep the defaults); numbers made float."""
    fields = {}
    for key, value in values.items():
        if key not in CARD_ENTRIES:
            raise ConfigError(f"overheads: {key!r} is not an overheads entry; known: {', '.join(CARD_ENTRIES)}")
        name, _ = CARD_ENTRIES[key]
        fields[name] = float(value) if isinstance(value, int) and not isinstance(value, bool) and \
            name not in ("main_grad_bytes_per_param", "planner_measured_experts") else value
    return Overheads(**fields)


# ---- transfers beside attention ------------------------------------------------------------------
def overlapped_seconds(transfer_gpu: np.ndarray, attention: np.ndarray, other: np.ndarray,
                       efficiency: float = 1.0) -> np.ndarray:
    """Seconds a transfer adds to a layer when it runs beside that layer's attention: float64 [M, L].

    transfer_gpu: [M, L, ep] each GPU's transfer seconds; attention, other: [M, ep] the layer's dense
    parts. A GPU's overlapped time is max(attention, transfer) + (1 - efficiency) x min(attention,
    transfer) + other; the slowest GPU's, minus the dense time alone. efficiency 1 is
    relibra.costs.phases.exposed_seconds.
    """
    a = attention[:, None, :]
    both = np.maximum(a, transfer_gpu) + (1.0 - efficiency) * np.minimum(a, transfer_gpu)
    return (both + other[:, None, :]).max(axis=2) - (attention + other).max(axis=1)[:, None]


def recompute_push_window(attention: np.ndarray, other: np.ndarray, attention_backward: np.ndarray,
                          other_backward: np.ndarray, recompute: bool) -> tuple[np.ndarray, np.ndarray]:
    """The dense window the backward replica push hides behind: (attention, other), [M, ep] each.

    Without recomputation the push for backward runs beside the layer's attention backward; with it the
    replicas must be there for the recomputed forward's experts, which follow the recomputed forward
    attention, so the push hides behind the forward window. The same buffer then serves the layer's
    backward (one layer is recomputed at a time), so the count of pushes does not change.
    """
    return (attention, other) if recompute else (attention_backward, other_backward)


# ---- replica moves, and their gradients into the home ---------------------------------------------
def replica_move_list(plan: StepPlan, buffer: str) -> dict:
    """Replica weight pushes and gradient pulls as a list, one entry per occupied replica slot:
    {"micro_batch", "layer", "home", "gpu": int64 [n], "push", "pull": bool [n]} (whether that slot's
    weights are pushed from the home to the GPU, and its gradient pulled back, at its (micro_batch, layer)).

    layer-shared: every occupied slot is pushed and pulled at its own (micro_batch, layer).
    per-layer: an expert is pushed to a GPU only where it was not there at the previous micro-batch
    (same layer), and its gradient pulled at the last micro-batch of that stay.
    """
    m, l, ep, r = plan.replica_expert.shape
    e = plan.num_experts
    mi, li, gi, ri = np.nonzero(plan.replica_expert >= 0)
    ex = plan.replica_expert[mi, li, gi, ri].astype(np.int64)
    if buffer == "per-layer":
        # (layer, gpu, expert, micro_batch) keys with an empty micro-batch of padding on both sides
        key = ((li * ep + gi) * e + ex) * (m + 2) + mi + 1
        present = np.unique(key)

        def there(k):
            at = np.minimum(np.searchsorted(present, k), len(present) - 1)
            return present[at] == k

        push, pull = ~there(key - 1), ~there(key + 1)
    else:
        push = pull = np.ones(len(mi), dtype=bool)
    return {"micro_batch": mi, "layer": li, "home": plan.home[li, ex].astype(np.int64), "gpu": gi,
            "push": push, "pull": pull}


def grad_adds_per_home(plan: StepPlan, buffer: str) -> np.ndarray:
    """Replica gradients each home GPU adds into its own per (micro-batch, layer): int64 [M, L, ep]
    (one per pulled replica, counted at the home; replica_move_list says when a buffer pulls)."""

    m, l, ep, _ = plan.replica_expert.shape
    moves = replica_move_list(plan, buffer)
    keep = moves["pull"]
    idx = (moves["micro_batch"][keep] * l + moves["layer"][keep]) * ep + moves["home"][keep]
    return np.bincount(idx, minlength=m * l * ep).reshape(m, l, ep).astype(np.int64)


def replica_grad_add_seconds(adds_per_home: np.ndarray, model: ModelShape, topology: Topology,
                             grad_bytes_per_param: int, main_grad_bytes_per_param: int) -> np.ndarray:
    """Seconds the slowest home GPU spends adding replica gradients per (micro-batch, layer): float64 [M, L].

    adds_per_home: int [M, L, ep] (grad_adds_per_home). Each add reads the pulled gradient and reads and
    writes the home's accumulator: expert_params x (grad + 2 x main_grad bytes) at memory_GBps.
    """
    per_add = model.expert_params * (grad_bytes_per_param + 2 * main_grad_bytes_per_param) / topology.memory_bytes_per_s
    return np.asarray(adds_per_home, dtype=np.float64).max(axis=2) * per_add


# ---- the post-rollout planner --------------------------------------------------------------------
def planner_rated(plan: StepPlan, overheads: Overheads) -> bool:
    """Whether the overheads hold a planner rate for this plan: the relibra family, on a model with the
    expert count the rates were measured at (overheads.planner_measured_experts; None: any)."""
    measured = overheads.planner_measured_experts
    return plan.policy.startswith("relibra") and (measured is None or plan.num_experts == measured)


def planner_model_seconds(plan: StepPlan, overheads: Overheads, layers: int | None = None) -> float:
    """The post-rollout planner's seconds for this plan's step: reorder seconds x layers + replication
    seconds x micro-batches x layers where planner_rated, else 0. layers: the MoE layers one planner
    plans (a pipeline stage's, each stage planning its own at the same time); None: all of the plan's."""
    if not planner_rated(plan, overheads):
        return 0.0
    m, l = plan.num_microbatches, plan.num_layers if layers is None else layers
    return overheads.planner_reorder_s_per_layer * l + overheads.planner_replication_s_per_cell * m * l


def post_rollout_planner(plan: StepPlan, forward_s: float, overheads: Overheads, layers: int | None = None) -> dict:
    """The planner against its post-rollout window, once per step.

    forward_s: seconds of the step's forward pass (every micro-batch); layers: the most MoE layers one
    pipeline device plans (its stages' layers; the devices plan in parallel), None: every layer. Returns
    {"planner_s" (the modelled seconds of that planner), "window_s" (planner_window_forward_passes x
    forward_s), "exposed_s" (planner_s beyond the window; 0 when the planner is not charged or has no
    measured rate), "rated"}.
    """
    planner_s = planner_model_seconds(plan, overheads, layers)
    rated = planner_rated(plan, overheads)
    if not overheads.charges_planner:
        return {"planner_s": planner_s, "window_s": float("nan"), "exposed_s": 0.0, "rated": rated}
    window_s = overheads.planner_window_forward_passes * forward_s
    return {"planner_s": planner_s, "window_s": window_s, "exposed_s": max(0.0, planner_s - window_s), "rated": rated}


# ---- host-side plan metadata ---------------------------------------------------------------------
def plan_metadata(plan: StepPlan, overheads: Overheads, topology: Topology) -> dict:
    """What one micro-batch's plan takes to reach each GPU: every GPU needs every slot's (expert, start,
    tokens) of every layer to route its tokens (three int32 per replica slot) plus the homes once per step.

    Returns {"bytes_per_microbatch", "seconds_per_microbatch" (bytes at host_to_device_GBps plus one
    collective_latency_s), "home_bytes_per_step"}. plan_broadcast_seconds charges it with its broadcast.
    """
    _, l, ep, r = plan.replica_expert.shape
    nbytes = 3 * 4 * l * ep * r
    seconds = nbytes / (overheads.host_to_device_GBps * 1e9) + topology.collective_latency_s if nbytes else 0.0
    return {"bytes_per_microbatch": int(nbytes), "seconds_per_microbatch": float(seconds),
            "home_bytes_per_step": int(4 * plan.home.size)}


def plan_broadcast_seconds(plan: StepPlan, overheads: Overheads, topology: Topology) -> np.ndarray:
    """Seconds each micro-batch waits for its plan: float64 [M] (0 where the plan has no replica slots, or
    where overheads.plan_metadata_charged is off).

    The planner's host copies the micro-batch's metadata (plan_metadata: three int32 per replica slot of every
    layer; the first micro-batch also the homes, int32 per expert of every layer) to one GPU at
    host_to_device_GBps, which broadcasts it to the EP group: a pipelined broadcast moves the bytes once
    through every GPU, at the RDMA rate where the group spans nodes, else at the NVLink rate; two
    collective_latency_s (copy and broadcast).
    """
    m = plan.num_microbatches
    meta = plan_metadata(plan, overheads, topology)
    if not overheads.plan_metadata_charged or meta["bytes_per_microbatch"] == 0:
        return np.zeros(m)
    nbytes = np.full(m, float(meta["bytes_per_microbatch"]))
    nbytes[0] += meta["home_bytes_per_step"]
    link = topology.rdma_bytes_per_s if plan.ep > plan.gpus_per_node else topology.nvlink_bytes_per_s
    return nbytes / (overheads.host_to_device_GBps * 1e9) + nbytes / link + 2 * topology.collective_latency_s


def gemm_floor_seconds(expert_gpu: np.ndarray, gpu_tokens: np.ndarray, floor_s: float) -> np.ndarray:
    """Forward routed-expert seconds of each GPU with the per-call floor: float64 [M, L, ep].

    expert_gpu: [M, L, ep] forward seconds (phases.expert_seconds_per_gpu); gpu_tokens: [M, L, ep] its
    token-expert pairs. A GPU that computes anything runs one grouped call, forward + backward at least
    floor_s: its forward is at least floor_s / 3 (backward, twice the forward, the rest).
    """
    return np.where(np.asarray(gpu_tokens) > 0, np.maximum(expert_gpu, floor_s / 3.0), expert_gpu)


def copy_contention_seconds(push_gpu: np.ndarray, pull_gpu: np.ndarray, share: float,
                            push_backward: bool) -> tuple[np.ndarray, np.ndarray]:
    """Seconds replica copies add to the all-to-all they share NVLink with: (forward, backward) float64 [M, L].

    push_gpu, pull_gpu: [M, L, ep] each GPU's copy seconds (phases.replica_transfer_seconds); share: the
    contending share of them (Overheads.copy_a2a_contention). Forward: the pushes'; backward: the pulls' and,
    where the buffer pushes again for backward, those pushes'. The slowest GPU of each (micro-batch, layer).
    """
    backward = pull_gpu + (push_gpu if push_backward else 0.0)
    return share * push_gpu.max(axis=2), share * backward.max(axis=2)
