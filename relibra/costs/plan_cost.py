"""PlanCost and cost_plan: the phases of relibra.costs.phases assembled into one training step."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from relibra.cluster import ModelShape, Topology
from relibra.costs import overheads, phases
from relibra.costs.params import CostParams
from relibra.costs.memory import offload_migration_seconds
from relibra.errors import PlanError
from relibra.metrics import METRIC_COLUMNS
from relibra.plan import StepPlan, gpu_tokens_from, home_tokens_of
from relibra.trace import skewness


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
    memory: replica buffer and parameter bytes per GPU (see phases.replica_memory).
    replica_transfer_s: the step's replica push and pull seconds (slowest GPU per (micro-batch,
        layer), summed) had none been hidden behind attention.
    info: how the step was charged: "attention" (the trace's sequence lengths or the assumed
        seq_len), "planner_charge" (none, table, measured, fixed), "dp_size", "policy".
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
    replica_transfer_s: float = 0.0
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
        """[micro_batches, layers] max / mean token-expert pairs per GPU (relibra.trace.skewness)."""
        return skewness(self.gpu_tokens)

    def balanced_compute(self) -> "PlanCost":
        """This cost with every GPU's routed-expert compute at the mean over GPUs (same routing, same
        all-to-all, transfers, dense parts, migration and optimizer): the `balanced-compute` reference,
        the best any placement could reach with these exchanges (docs/cost-model.md)."""
        mean_fwd = self.expert_seconds_per_gpu.mean(axis=2)
        # backward runs the experts twice, three times with the recomputed forward
        factor = 3 if self.info.get("overheads", {}).get("activation_recompute") else 2
        forward = {**self.forward, "expert_compute": mean_fwd}
        backward = {**self.backward, "expert_compute": factor * mean_fwd}
        mean_gpu = np.broadcast_to(mean_fwd[..., None], self.expert_seconds_per_gpu.shape).copy()
        mean_tokens = self.gpu_tokens.mean(axis=2, keepdims=True)
        return dataclasses.replace(self, forward=forward, backward=backward, expert_seconds_per_gpu=mean_gpu,
                                   gpu_tokens=np.broadcast_to(np.rint(mean_tokens).astype(np.int64),
                                                              self.gpu_tokens.shape).copy(),
                                   info={**self.info, "reference": "balanced-compute"})

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
        import pandas as pd  # only this table view needs pandas; the planners and the simulator do not


        defaults = {"source": "simulated", "hardware": "", "policy": "", "model": "", "workload": "", "ep": -1,
                    "step": -1}
        cols = self.rows(**{**defaults, **labels})
        return pd.DataFrame(cols)[METRIC_COLUMNS]


def check_seq_lens(seq_lens, src_tokens: np.ndarray) -> np.ndarray | None:
    """seq_lens as int64 [M, ep, max_seqs], checked against the step's shape; None passes through."""
    if seq_lens is None:
        return None
    arr = np.asarray(seq_lens)
    m, ep = src_tokens.shape
    if arr.ndim != 3 or arr.shape[:2] != (m, ep):
        raise PlanError(f"seq_lens must have shape [micro_batches, ep, max_seqs] = [{m}, {ep}, ...], got {arr.shape}")
    if arr.dtype.kind not in "iu" or (arr < 0).any():
        raise PlanError("seq_lens must hold non-negative integer sequence lengths")
    return arr.astype(np.int64)


def cost_plan(plan: StepPlan, model: ModelShape, topology: Topology, params: CostParams | None = None,
              prev_home: np.ndarray | None = None, planner_s: float = 0.0,
              critical_planner_s: float | None = None, seq_lens: np.ndarray | None = None) -> PlanCost:
    """Seconds of one training step run as `plan` on `topology` (relibra.costs.phases, in order).

    plan: a StepPlan whose ep and gpus_per_node fit the topology (topology.ep_layout(plan.ep)).
    prev_home: int [layers, experts] placement of the previous step; None = no migration.
    planner_s: measured seconds the policy took to make the plan (reported; what a run-time planner
        is charged on the critical path is set by CostParams.runtime_plan_s).
    critical_planner_s: the measured planner seconds CostParams.runtime_plan_s="measured" charges
        (default planner_s; the simulator passes the planner's CPU time).
    seq_lens: int [micro_batches, ep, max_seqs] lengths of the sequences on each source rank in each
        micro-batch (0-padded; RoutingTrace.seq_lens[step]); attention is charged from them. None:
        every sequence is CostParams.seq_len tokens long (PlanCost.info["attention"] says which).
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
    src_tokens = plan.loads[:, 0].sum(axis=2, dtype=np.int64) / model.top_k  # [M, ep] tokens before top-k
    seq_lens = check_seq_lens(seq_lens, src_tokens)
    dp = phases.dp_size_of(topology, params, ep)

    # token flow, exchanges and experts
    replica_tokens = plan.occupied_replica_tokens()
    expert_tokens = plan.loads.sum(axis=2, dtype=np.int64)
    home_tokens = home_tokens_of(expert_tokens, plan.replica_expert, replica_tokens)
    gpu_tokens = gpu_tokens_from(expert_tokens, plan.home, plan.replica_expert, replica_tokens)  # [M, L, ep]
    a2a = phases.dispatch_seconds(plan, model, topology, params, None, src_tokens)  # the flow layer by layer
    copies = phases.active_copies(plan, home_tokens, replica_tokens)
    expert_gpu = phases.expert_seconds_per_gpu(gpu_tokens, copies, model, topology)
    expert = expert_gpu.max(axis=2)

    # dense parts (the overlap window), replicas, run-time planner
    attention, other = phases.dense_seconds(src_tokens, model, topology, params, seq_lens)
    attention_b, other_b = phases.dense_seconds(src_tokens, model, topology, params, seq_lens, backward=True)
    dense = np.broadcast_to((attention + other).max(axis=1)[:, None], (m, l)).copy()
    dense_b = np.broadcast_to((attention_b + other_b).max(axis=1)[:, None], (m, l)).copy()
    zeros = np.zeros((m, l))
    replicas = {"push_forward": zeros, "push_backward": zeros, "pull_backward": zeros, "unhidden_s": 0.0}
    if (plan.replica_expert >= 0).any():
        push_gpu, pull_gpu = phases.replica_transfer_seconds(plan, model, topology, params)
        replicas = phases.replica_seconds(plan, push_gpu, pull_gpu, attention, other, params, attention_b, other_b)
    planner_fwd, planner_charge = phases.planner_seconds(
        plan, topology, params, planner_s if critical_planner_s is None else critical_planner_s)
    extra = phases.non_moe_seconds(src_tokens, model, topology, params, seq_lens)
    extra_b = phases.non_moe_seconds(src_tokens, model, topology, params, seq_lens, backward=True)

    forward = {"dispatch": a2a, "expert_compute": expert, "combine": a2a.copy(), "dense_compute": dense,
               "replica_push": replicas["push_forward"], "replica_grad": zeros.copy(), "planner": planner_fwd}
    # Backward mirrors the exchanges (combine's gradient goes out like dispatch and back like combine;
    # the per-GPU time is the same under the transpose) at twice the FLOPs, the attention core at
    # CostParams.attention_backward_factor (FlashAttention's backward recomputes Q K^T).
    backward = {"dispatch": a2a.copy(), "expert_compute": 2 * expert, "combine": a2a.copy(),
                "dense_compute": dense_b, "replica_push": replicas["push_backward"],
                "replica_grad": replicas["pull_backward"], "planner": zeros.copy()}
    own = charge_overheads(plan, model, topology, params, forward, backward, extra, src_tokens, seq_lens)
    extra_b = extra_b + own.pop("recompute_extra_backward")

    # once per step
    route = phases.route_of(topology, params)
    migration_s, migration_bytes = phases.migration_seconds(prev_home, plan.home, ep, gpn, model, topology, dp, route)
    # optimizer state in host memory: its PCIe leg, overlapped with the link transfer (relibra.costs.memory)
    host_s, _ = offload_migration_seconds(prev_home, plan.home, ep, model, topology.pcie_GBps, dp,
                                          params.optimizer_offload_fraction)
    migration_s = max(migration_s, host_s)
    homes = int(plan.homes_per_gpu().max())
    optimizer_s = phases.optimizer_seconds(model, homes, ep, topology, dp)
    slots_per_layer = plan.num_replicas().max(axis=(0, 2)) if plan.replica_slots else np.zeros(l)
    buffer = "autograd" if plan.transfers_on_critical_path else params.replica_buffer
    memory = phases.replica_memory(model, ep, slots_per_layer, buffer, homes, params.grad_bytes_per_param)
    attention_note = "trace seq_lens" if seq_lens is not None else f"assumed seq_len={params.seq_len}"
    return PlanCost(forward=forward, backward=backward, extra_forward=extra, extra_backward=extra_b,
                    expert_seconds_per_gpu=expert_gpu, gpu_tokens=gpu_tokens, migration_s=migration_s,
                    migration_bytes=migration_bytes, optimizer_s=optimizer_s, planner_s=float(planner_s),
                    tokens=int(round(float(src_tokens.sum()))), memory=memory,
                    replica_transfer_s=replicas["unhidden_s"],
                    info={"exposed_planner": planner_charge != "none", "planner_charge": planner_charge,
                          "attention": attention_note, "dp_size": dp, "policy": plan.policy, "overheads": own})


def charge_overheads(plan: StepPlan, model: ModelShape, topology: Topology, params: CostParams, forward: dict,
                     backward: dict, extra: np.ndarray, src_tokens: np.ndarray, seq_lens) -> dict:
    """Add params.overheads' terms (relibra.costs.overheads) to the step's phases, in place.

    forward / backward: {component: [M, L]} as cost_plan built them (the transfers already at the overlap
    efficiency). Activation recomputation adds each layer's forward (dense, dispatch, experts, combine)
    to its backward components, and the leading dense layers' forward (not the LM head) to the
    micro-batch's backward extra; replica gradient adds go to backward "replica_grad"; the post-rollout
    planner beyond its window to forward "planner", spread evenly over the cells. Returns what was
    charged, in seconds over the step: {"activation_recompute", "transfer_overlap_efficiency", "recompute_s", "grad_add_s", "planner_s", "planner_window_s",
    "planner_exposed_s", "recompute_extra_backward" ([M], for the caller to add)}.
    """
    ov = params.overheads
    m, l = forward["dispatch"].shape
    recompute_extra = np.zeros(m)
    recompute_s = 0.0
    if ov.activation_recompute:
        for comp in ("dispatch", "combine", "expert_compute", "dense_compute"):
            backward[comp] = backward[comp] + forward[comp]
        recompute_extra = phases.non_moe_seconds(src_tokens, model, topology,
                                                 dataclasses.replace(params, include_lm_head=False), seq_lens)
        recompute_s = float(sum(forward[c].sum() for c in ("dispatch", "combine", "expert_compute", "dense_compute"))
                            + recompute_extra.sum())
    grad_add_s = 0.0
    if ov.replica_grad_add and (plan.replica_expert >= 0).any():
        adds = overheads.grad_adds_per_home(plan, phases.replica_buffer_of(plan, params))
        grad_add = overheads.replica_grad_add_seconds(adds, model, topology, params.grad_bytes_per_param,
                                                      ov.main_grad_bytes_per_param)
        backward["replica_grad"] = backward["replica_grad"] + grad_add
        grad_add_s = float(grad_add.sum())
    forward_s = float(sum(v.sum() for v in forward.values()) + extra.sum())
    planner = overheads.post_rollout_planner(plan, forward_s, ov)
    if planner["exposed_s"] > 0:
        forward["planner"] = forward["planner"] + planner["exposed_s"] / (m * l)
    return {"activation_recompute": ov.activation_recompute, "transfer_overlap_efficiency": ov.transfer_overlap_efficiency,
            "recompute_s": recompute_s, "grad_add_s": grad_add_s, "planner_s": planner["planner_s"],
            "planner_window_s": planner["window_s"], "planner_exposed_s": planner["exposed_s"],
            "planner_rated": planner["rated"],
            "recompute_extra_backward": recompute_extra}
