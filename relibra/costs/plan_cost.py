"""PlanCost and cost_plan: the phases of relibra.costs.phases assembled into one training step."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from relibra.cluster import ModelShape, Topology
from relibra.costs import overheads, phases
from relibra.costs.pipeline import (boundary_crosses_nodes, interleaved_seconds, layer_stages, p2p_blocking,
                                    sends_on_device, stage_layer_counts)
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
        seq_len), "planner_charge" (none, table, measured, fixed), "dp_size", "policy", "pipeline".
    layer_stage: int64 [layers] the pipeline chunk (stage, or virtual stage) of each MoE layer, chunk c on
        device c % pipeline_devices; None: one stage holds every layer (no pipeline).
    stage_extra_forward / stage_extra_backward: [chunks, micro_batches] the non-MoE parts by chunk (leading
        dense layers where they sit, the LM head on the last); None without a pipeline.
    planner_step_s: the post-rollout planner's exposed seconds, once per step (spread evenly over the
        forward "planner" cells in the rows; taken out of the per-micro-batch work of the pipeline).
    stage_send_forward / stage_send_backward: [chunks, M] seconds of each chunk's stage-to-stage send after
        its forward (activation) and backward (input gradient); None without a pipeline. p2p_blocking: the
        sends hold their stage (Megatron's plain 1F1B) or only delay their receiver (interleaved).
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
    layer_stage: np.ndarray | None = None
    stage_extra_forward: np.ndarray | None = None
    stage_extra_backward: np.ndarray | None = None
    pipeline_devices: int = 1
    planner_step_s: float = 0.0
    stage_send_forward: np.ndarray | None = None
    stage_send_backward: np.ndarray | None = None
    p2p_blocking: bool = True

    @property
    def microbatch_seconds(self) -> np.ndarray:
        """[micro_batches] forward + backward seconds of each micro-batch (all layers)."""
        fwd = sum(v.sum(axis=1) for v in self.forward.values())
        bwd = sum(v.sum(axis=1) for v in self.backward.values())
        return fwd + bwd + self.extra_forward + self.extra_backward

    def stage_seconds(self) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) seconds of each pipeline chunk for each micro-batch: float64 [chunks, M] each
        (one chunk without a pipeline); the post-rollout planner (planner_step_s) is not in them."""
        m, l = self.gpu_tokens.shape[:2]
        spread = self.planner_step_s / (m * l)
        if self.layer_stage is None:
            fwd = sum(v.sum(axis=1) for v in self.forward.values()) + self.extra_forward - spread * l
            bwd = sum(v.sum(axis=1) for v in self.backward.values()) + self.extra_backward
            return fwd[None, :], bwd[None, :]
        chunks = self.stage_extra_forward.shape[0]
        fwd = by_stage(sum(self.forward.values()), self.layer_stage, chunks) + self.stage_extra_forward
        fwd -= spread * np.bincount(self.layer_stage, minlength=chunks)[:, None]
        bwd = by_stage(sum(self.backward.values()), self.layer_stage, chunks) + self.stage_extra_backward
        return fwd, bwd

    def pipeline_seconds(self) -> tuple[float, float]:
        """(the micro-batches' time under the pipeline schedule, its bubble): the 1F1B (interleaved where
        chunks > devices) step of stage_seconds, and that minus the busiest device's own work. Without a
        pipeline: (the sum of every micro-batch, 0)."""
        if self.layer_stage is None:
            return float(self.microbatch_seconds.sum() - self.planner_step_s), 0.0
        fwd, bwd = self.stage_seconds()
        total = interleaved_seconds(fwd, bwd, self.pipeline_devices, self.stage_send_forward,
                                    self.stage_send_backward, self.p2p_blocking)
        return total, total - float(self._device_work().max())

    def _device_sends(self) -> np.ndarray:
        """[devices] seconds each pipeline device is held by its stage-to-stage sends (0 where they overlap)."""
        if self.stage_send_forward is None or not self.p2p_blocking:
            return np.zeros(self.pipeline_devices)
        return sends_on_device(self.stage_send_forward, self.stage_send_backward, self.pipeline_devices)

    def _device_work(self) -> np.ndarray:
        """[devices] forward + backward seconds of each pipeline device over the step (its chunks summed), with
        the sends that hold it."""
        fwd, bwd = self.stage_seconds()
        return np.bincount(np.arange(fwd.shape[0]) % self.pipeline_devices, weights=(fwd + bwd).sum(axis=1),
                           minlength=self.pipeline_devices) + self._device_sends()

    @property
    def step_seconds(self) -> float:
        """Whole step: every micro-batch (through the pipeline schedule where there is one), the exposed
        post-rollout planner, migration and the optimizer step."""
        if self.layer_stage is None:
            return float(self.microbatch_seconds.sum() + self.migration_s + self.optimizer_s)
        return float(self.pipeline_seconds()[0] + self.planner_step_s + self.migration_s + self.optimizer_s)

    def totals(self) -> dict:
        """{component: seconds over the step} on the critical path, plus pipeline_send, pipeline_bubble and
        step_total.

        With a pipeline the per-micro-batch components are those of the busiest device (the stage that
        sets the pace), pipeline_send its blocking stage-to-stage sends, and pipeline_bubble the schedule's
        time beyond that device's own work, so the components add up to step_total; without one, every
        layer's, and the send and bubble are 0."""
        out: dict[str, float] = {}
        keep = None
        if self.layer_stage is not None:
            busiest = int(np.argmax(self._device_work()))
            keep = (self.layer_stage % self.pipeline_devices) == busiest
        for phase in (self.forward, self.backward):
            for comp, arr in phase.items():
                out[comp] = out.get(comp, 0.0) + float((arr if keep is None else arr[:, keep]).sum())
        if keep is None:
            out["dense_compute"] += float(self.extra_forward.sum() + self.extra_backward.sum())
        else:
            mine = (np.arange(self.stage_extra_forward.shape[0]) % self.pipeline_devices) == busiest
            out["dense_compute"] += float(self.stage_extra_forward[mine].sum() + self.stage_extra_backward[mine].sum())
            m, l = self.gpu_tokens.shape[:2]
            out["planner"] += self.planner_step_s * (1.0 - float(keep.sum()) / l)  # the rest of the once-per-step part
        out["pipeline_send"] = 0.0 if keep is None else float(self._device_sends()[busiest])
        out["pipeline_bubble"] = self.pipeline_seconds()[1]
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
        bubble = [] if self.layer_stage is None else [("pipeline_send", self.totals()["pipeline_send"], 0),
                                                      ("pipeline_bubble", self.pipeline_seconds()[1], 0)]
        step_rows = bubble + [("migration", self.migration_s, 0), ("optimizer", self.optimizer_s, 0),
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


def by_stage(per_layer: np.ndarray, layer_stage: np.ndarray, chunks: int) -> np.ndarray:
    """Seconds [M, L] summed over each pipeline chunk's layers: float64 [chunks, M]."""
    onehot = np.zeros((len(layer_stage), chunks))
    onehot[np.arange(len(layer_stage)), layer_stage] = 1.0
    return (np.asarray(per_layer, dtype=np.float64) @ onehot).T


def pipeline_layout(model: ModelShape, params: CostParams) -> tuple[np.ndarray, np.ndarray, int, str] | None:
    """(chunk of each MoE layer int64 [L], chunk of each leading dense layer int64 [D], devices, split) of the
    pipeline params asks for, or None for one stage. Chunks = pipeline_stages x virtual_stages, in pipeline
    order over the decoder's D + L layers. split "megatron": relibra.costs.pipeline.stage_layer_counts
    (Megatron's split; with virtual stages an even split over the chunks); "near-even": the model's layers
    do not take that split (a model cut to fewer layers than its recipe splits), so near-equal runs cut at
    the rounded multiples of layers / chunks. A set-up card refuses a split its own model does not take."""
    p, v = params.pipeline_stages, params.virtual_stages
    if p == 1 and v == 1:
        return None
    decoder = model.num_dense_layers + model.num_layers
    if v > 1 and params.last_stage_layers is not None:
        raise PlanError("pipeline: virtual stages with an uneven last stage are not modelled")
    if decoder < p * v:
        raise PlanError(f"pipeline: {decoder} decoder layers cannot fill {p * v} pipeline chunks")
    last = params.last_stage_layers
    if last is not None and last >= decoder or (last is None and decoder % (p * v)) or \
            (last is not None and (decoder - last) % (p - 1)):
        # a model cut to fewer layers (relibra.studies.case.scaled_model) than the recipe's split names:
        # its layers in near-equal runs, cut at the rounded multiples of layers / chunks (info["pipeline"]["split"])
        counts = tuple(int(x) for x in np.diff(np.linspace(0, decoder, p * v + 1).round().astype(np.int64)))
        return (*layer_stages(counts, model.num_dense_layers, model.num_layers), p, "near-even")
    counts = stage_layer_counts(decoder, p * v, last)
    return (*layer_stages(counts, model.num_dense_layers, model.num_layers), p, "megatron")


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
    expert_raw = phases.expert_seconds_per_gpu(gpu_tokens, copies, model, topology)
    expert_gpu = overheads.gemm_floor_seconds(expert_raw, gpu_tokens, params.overheads.gemm_call_floor_s)
    expert = expert_gpu.max(axis=2)
    floor_fwd_s = float((expert - expert_raw.max(axis=2)).sum())

    # dense parts (the overlap window), replicas, run-time planner
    attention, other = phases.dense_seconds(src_tokens, model, topology, params, seq_lens)
    attention_b, other_b = phases.dense_seconds(src_tokens, model, topology, params, seq_lens, backward=True)
    dense = np.broadcast_to((attention + other).max(axis=1)[:, None], (m, l)).copy()
    dense_b = np.broadcast_to((attention_b + other_b).max(axis=1)[:, None], (m, l)).copy()
    zeros = np.zeros((m, l))
    replicas = {"push_forward": zeros, "push_backward": zeros, "pull_backward": zeros, "unhidden_s": 0.0}
    contention = (zeros, zeros)
    if (plan.replica_expert >= 0).any():
        push_gpu, pull_gpu = phases.replica_transfer_seconds(plan, model, topology, params)
        replicas = phases.replica_seconds(plan, push_gpu, pull_gpu, attention, other, params, attention_b, other_b)
        if params.overheads.copy_a2a_contention > 0 and not plan.transfers_on_critical_path \
                and params.overlap_transfers:
            contention = overheads.copy_contention_seconds(push_gpu, pull_gpu, params.overheads.copy_a2a_contention,
                                                           phases.pushes_again_for_backward(plan, params))
    planner_fwd, planner_charge = phases.planner_seconds(
        plan, topology, params, planner_s if critical_planner_s is None else critical_planner_s)
    extra = phases.non_moe_seconds(src_tokens, model, topology, params, seq_lens)
    extra_b = phases.non_moe_seconds(src_tokens, model, topology, params, seq_lens, backward=True)

    # the plan's metadata reaches the GPUs before the micro-batch's first layer
    broadcast = overheads.plan_broadcast_seconds(plan, params.overheads, topology)
    planner_fwd = planner_fwd.copy()
    planner_fwd[:, 0] += broadcast
    # the copies' contention slows the all-to-all it meets, so it is charged to that exchange (dispatch),
    # not to the copies: the copies' own exposed seconds stay at most their transfer time
    forward = {"dispatch": a2a + contention[0], "expert_compute": expert, "combine": a2a.copy(), "dense_compute": dense,
               "replica_push": replicas["push_forward"], "replica_grad": zeros.copy(),
               "planner": planner_fwd}
    # Backward mirrors the exchanges (combine's gradient goes out like dispatch and back like combine;
    # the per-GPU time is the same under the transpose) at twice the FLOPs, the attention core at
    # CostParams.attention_backward_factor (FlashAttention's backward recomputes Q K^T).
    backward = {"dispatch": a2a + contention[1], "expert_compute": 2 * expert, "combine": a2a.copy(),
                "dense_compute": dense_b, "replica_push": replicas["push_backward"],
                "replica_grad": replicas["pull_backward"], "planner": zeros.copy()}
    layout = pipeline_layout(model, params)
    stage_fwd = stage_bwd = None
    forward_pass_s = None
    if layout is not None:
        layer_stage, dense_stage, devices, split_rule = layout
        chunks = int(max(layer_stage.max(initial=0), dense_stage.max(initial=0))) + 1
        no_head = dataclasses.replace(params, include_lm_head=False)
        dense_f = phases.non_moe_seconds(src_tokens, model, topology, no_head, seq_lens)
        dense_b = phases.non_moe_seconds(src_tokens, model, topology, no_head, seq_lens, backward=True)
        share = np.bincount(dense_stage, minlength=chunks)[:, None] / max(model.num_dense_layers, 1)
        stage_fwd, stage_bwd = share * dense_f[None], share * dense_b[None]
        stage_fwd[-1] += np.maximum(extra - dense_f, 0.0)  # the LM head on the last stage
        stage_bwd[-1] += np.maximum(extra_b - dense_b, 0.0)
        # each chunk's activation goes to the next chunk's GPUs, its input gradient back (the same bytes)
        crosses = boundary_crosses_nodes(chunks, devices, params.stage_gpus or ep, topology.gpus_per_node)
        send_f = phases.stage_send_seconds(src_tokens, model, topology, crosses)
        send_b = np.vstack([np.zeros((1, m)), send_f[:-1]])
        blocking = p2p_blocking(params.virtual_stages)
        # the post-rollout window is a forward-only pass through the pipeline
        forward_pass_s = interleaved_seconds(by_stage(sum(forward.values()), layer_stage, chunks) + stage_fwd,
                                             np.zeros_like(stage_fwd), devices, send_f, None, blocking)
    # with a pipeline each device plans its own stages' layers, all devices at once
    planner_layers = None if layout is None else int(np.bincount(layer_stage % devices, minlength=devices).max())
    own = charge_overheads(plan, model, topology, params, forward, backward, extra, src_tokens, seq_lens,
                           forward_pass_s, planner_layers)
    recompute_extra = own.pop("recompute_extra_backward")
    cells = own.pop("_cells")
    # the floor is paid by forward, backward and (with recomputation) the recomputed forward
    floor_factor = 4 if params.overheads.activation_recompute else 3
    cells.update({"gemm_floor_s": floor_factor * (expert - expert_raw.max(axis=2)),
                  "copy_contention_s": contention[0] + contention[1]})
    own.update({"gemm_floor_s": floor_fwd_s * floor_factor,
                "copy_contention_s": float(contention[0].sum() + contention[1].sum()),
                "plan_broadcast_s": float(broadcast.sum())})
    extra_b = extra_b + recompute_extra
    if layout is not None:
        stage_bwd = stage_bwd + share * recompute_extra[None]

    # once per step; with a pipeline each stage's GPUs move and update their own layers at the same time
    route = phases.route_of(topology, params)

    def host_leg_s(prev, new) -> float:  # offloaded optimizer state's PCIe leg, overlapped with the link transfer
        return offload_migration_seconds(prev, new, ep, model, topology.pcie_GBps, dp,
                                         params.optimizer_offload_fraction)[0]

    homes_lg = plan.homes_per_gpu()  # [L, ep]
    homes = int(homes_lg.max())

    def optimizer_of(mine, dense_params) -> dict:  # the Adam step of one device's layers (phases.optimizer_parts)
        copies = int(homes_lg[mine].sum(axis=0).max(initial=0))  # the GPU homing the most of them
        return phases.optimizer_parts(model, homes, ep, topology, dp, None, dense_params,
                                      params.optimizer_offload_fraction, params.host_adam_params_per_s,
                                      params.overheads.main_grad_bytes_per_param, expert_copies=copies)

    if layout is None:
        migration_s, migration_bytes = phases.migration_seconds(prev_home, plan.home, ep, gpn, model, topology, dp,
                                                                route)
        migration_s = max(migration_s, host_leg_s(prev_home, plan.home))
        optimizer = optimizer_of(np.ones(l, dtype=bool), None)
    else:
        migration_bytes = {"intra_node": 0, "inter_node": 0, "experts_moved": 0}
        per_device_mig, per_device_host = np.zeros(devices), np.zeros(devices)
        for c in range(chunks):
            mine = layer_stage == c
            if prev_home is not None:
                sec, nbytes = phases.migration_seconds(np.asarray(prev_home)[mine], plan.home[mine], ep, gpn, model,
                                                       topology, dp, route)
                per_device_mig[c % devices] += sec
                per_device_host[c % devices] += host_leg_s(np.asarray(prev_home)[mine], plan.home[mine])
                migration_bytes = {k: migration_bytes[k] + nbytes[k] for k in migration_bytes}
        migration_s = float(np.maximum(per_device_mig, per_device_host).max())
        # every device steps its own chunks at once, after the pipeline's flush; the busiest one sets the step
        steps = [optimizer_of((layer_stage % devices) == d,
                              model.dense_params / chunks * int((np.arange(chunks) % devices == d).sum()))
                 for d in range(devices)]
        optimizer = max(steps, key=lambda o: o["seconds"])
    optimizer_s = optimizer["seconds"]
    slots_per_layer = plan.num_replicas().max(axis=(0, 2)) if plan.replica_slots else np.zeros(l)
    buffer = "autograd" if plan.transfers_on_critical_path else params.replica_buffer
    memory = phases.replica_memory(model, ep, slots_per_layer, buffer, homes, params.grad_bytes_per_param)
    attention_note = "trace seq_lens" if seq_lens is not None else f"assumed seq_len={params.seq_len}"
    cost = PlanCost(forward=forward, backward=backward, extra_forward=extra, extra_backward=extra_b,
                    expert_seconds_per_gpu=expert_gpu, gpu_tokens=gpu_tokens, migration_s=migration_s,
                    migration_bytes=migration_bytes, optimizer_s=optimizer_s, planner_s=float(planner_s),
                    tokens=int(round(float(src_tokens.sum()))), memory=memory,
                    replica_transfer_s=replicas["unhidden_s"],
                    info={"exposed_planner": planner_charge != "none", "planner_charge": planner_charge,
                          "attention": attention_note, "dp_size": dp, "policy": plan.policy, "overheads": own,
                          "optimizer": optimizer,
                          "pipeline": None if layout is None else
                          {"stages": params.pipeline_stages, "virtual_stages": params.virtual_stages,
                           "moe_layers_per_chunk": np.bincount(layout[0], minlength=chunks).tolist(),
                           "split": layout[3]}},
                    layer_stage=None if layout is None else layout[0], stage_extra_forward=stage_fwd,
                    stage_extra_backward=stage_bwd, pipeline_devices=1 if layout is None else layout[2],
                    planner_step_s=float(own["planner_exposed_s"]),
                    stage_send_forward=None if layout is None else send_f,
                    stage_send_backward=None if layout is None else send_b,
                    p2p_blocking=True if layout is None else blocking)
    if layout is not None:  # the per-cell overheads of the stage whose time the breakdown shows (PlanCost.totals)
        keep = (layer_stage % devices) == int(np.argmax(cost._device_work()))
        mine = (np.arange(chunks) % devices) == int(np.argmax(cost._device_work()))
        for key, arr in cells.items():
            own[key] = float(np.asarray(arr)[:, keep].sum())
        own["recompute_s"] += float((share[mine].sum() * recompute_extra).sum())
        own["plan_broadcast_s"] = float(broadcast.sum()) if keep[0] else 0.0
        own["per_stage"] = "busiest"
    return cost


def charge_overheads(plan: StepPlan, model: ModelShape, topology: Topology, params: CostParams, forward: dict,
                     backward: dict, extra: np.ndarray, src_tokens: np.ndarray, seq_lens,
                     forward_pass_s: float | None = None, planner_layers: int | None = None) -> dict:
    """Add params.overheads' terms (relibra.costs.overheads) to the step's phases, in place.

    forward / backward: {component: [M, L]} as cost_plan built them (the transfers already at the overlap
    efficiency). Activation recomputation adds each layer's forward (dense, dispatch, experts, combine)
    to its backward components, and the leading dense layers' forward (not the LM head) to the
    micro-batch's backward extra; replica gradient adds go to backward "replica_grad"; the post-rollout
    planner beyond its window (the planner of planner_layers MoE layers, a pipeline device's; None: all) to
    forward "planner", spread evenly over the cells. Returns what was
    charged, in seconds over the step: {"activation_recompute", "transfer_overlap_efficiency", "recompute_s", "grad_add_s", "planner_s", "planner_window_s",
    "planner_exposed_s", "recompute_extra_backward" ([M], for the caller to add)}.
    """
    ov = params.overheads
    m, l = forward["dispatch"].shape
    recompute_extra = np.zeros(m)
    recompute_s = 0.0
    recompute_cells = grad_add = np.zeros((m, l))
    if ov.activation_recompute:
        for comp in ("dispatch", "combine", "expert_compute", "dense_compute"):
            backward[comp] = backward[comp] + forward[comp]
        recompute_extra = phases.non_moe_seconds(src_tokens, model, topology,
                                                 dataclasses.replace(params, include_lm_head=False), seq_lens)
        recompute_cells = sum(forward[c] for c in ("dispatch", "combine", "expert_compute", "dense_compute"))
        recompute_s = float(recompute_cells.sum() + recompute_extra.sum())
    grad_add_s = 0.0
    if ov.replica_grad_add and (plan.replica_expert >= 0).any():
        adds = overheads.grad_adds_per_home(plan, phases.replica_buffer_of(plan, params))
        grad_add = overheads.replica_grad_add_seconds(adds, model, topology, params.grad_bytes_per_param,
                                                      ov.main_grad_bytes_per_param)
        backward["replica_grad"] = backward["replica_grad"] + grad_add
        grad_add_s = float(grad_add.sum())
    # the window: one forward pass of the step (through the pipeline schedule where there is one)
    forward_s = float(sum(v.sum() for v in forward.values()) + extra.sum()) if forward_pass_s is None \
        else float(forward_pass_s)
    planner = overheads.post_rollout_planner(plan, forward_s, ov, planner_layers)
    if planner["exposed_s"] > 0:
        forward["planner"] = forward["planner"] + planner["exposed_s"] / (m * l)
    return {"activation_recompute": ov.activation_recompute, "transfer_overlap_efficiency": ov.transfer_overlap_efficiency,
            "recompute_s": recompute_s, "grad_add_s": grad_add_s, "planner_s": planner["planner_s"],
            "planner_window_s": planner["window_s"], "planner_exposed_s": planner["exposed_s"],
            "planner_rated": planner["rated"],
            "recompute_extra_backward": recompute_extra, "_cells": {"recompute_s": recompute_cells,
                                                                    "grad_add_s": grad_add}}
