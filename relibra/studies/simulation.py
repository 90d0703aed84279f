"""The simulator over a trace's last steps: a summary row per policy (notebooks 03, 05, 09), or with plan-level
figures per (policy, step) (notebooks 04, 05, 07)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from relibra.cluster import ModelShape, Topology
from relibra.costs import dense_params_per_gpu
from relibra.progress import progress as tqdm
from relibra.setups import SetupCard
from relibra.sim import simulate
from relibra.trace import skewness


def history_steps(steps: int) -> int:
    """Steps simulated per trace of `steps` steps: all but the first, which only serves as history for `eplb`."""
    return max(1, steps - 1)


def _simulate(trace, topology, policies, card: SetupCard, steps: int, workload: str | None,
              policy_params: dict | None = None, **kwargs):
    """relibra.sim.simulate of `policies` on the last history_steps(steps) steps of `trace` with the set-up card's
    cost knobs and policy parameters (policy_params on top), and the labels of its rows (model, workload, ep,
    cluster)."""
    policies = list(policies)
    res = simulate(trace, topology, policies, steps=min(history_steps(steps), trace.num_steps),
                   policy_params={**card.policy_params(policies), **(policy_params or {})}, progress=False,
                   params=card.cost_params(trace.ep), workload=workload or None, **kwargs)
    return res, {"model": trace.model.name, "workload": res.config["workload"], "ep": trace.ep,
                 "cluster": res.config["cluster"]}


def _labelled(frame: pd.DataFrame, labels: dict) -> pd.DataFrame:
    for i, (k, v) in enumerate(labels.items()):
        frame.insert(i, k, v)
    return frame


def simulate_trace(trace, topology: Topology, policies, card: SetupCard, steps: int, workload: str | None = None,
                   policy_params: dict | None = None) -> pd.DataFrame:
    """One summary row per policy simulated on the trace's last steps (_simulate): relibra.sim's SUMMARY_COLUMNS
    plus model, workload, ep, cluster, layers, micro_batches."""
    res, labels = _simulate(trace, topology, policies, card, steps, workload, policy_params)
    summary = _labelled(res.summary.copy(), labels)
    summary["layers"] = trace.num_layers
    summary["micro_batches"] = trace.num_microbatches
    return summary


def plan_metrics(plan, gpus_per_node: int) -> dict:
    """Plan-level figures the simulator's summary does not carry: node_skewness, the mean over (micro_batch,
    layer) of max / mean tokens per node; gpu_skewness, the same per GPU; cross_node_share, the share of
    dispatched token-expert pairs sent to another node; replicas_per_gpu, mean occupied replica slots per GPU."""
    matrix = plan.flows()[0]  # the plan's one token flow
    gpu = np.rint(matrix.sum(axis=2)).astype(np.int64)  # [M, L, ep] tokens each GPU computes
    m, l, ep = gpu.shape
    nodes = ep // gpus_per_node
    node_tokens = gpu.reshape(m, l, nodes, gpus_per_node).sum(axis=3)
    node = np.arange(ep) // gpus_per_node
    cross = (node[:, None] != node[None, :])
    total = matrix.sum()
    return {
        "gpu_skewness": float(skewness(gpu).mean()),
        "node_skewness": float(skewness(node_tokens).mean()) if nodes > 1 else 1.0,
        "cross_node_share": float((matrix * cross).sum() / total) if total > 0 else 0.0,
        "replicas_per_gpu": float(plan.num_replicas().mean()),
    }


def simulate_with_plans(trace, topology: Topology, policies, card: SetupCard, steps: int,
                        workload: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trace's last steps simulated (_simulate) with plan-level figures per (policy, step): (per_step,
    summary). per_step: a row per (policy, step) with the simulator's step figures plus plan_metrics, migration
    bytes, forward seconds and replica-transfer seconds; summary: the simulator's with those averaged."""
    _, gpn = topology.ep_layout(trace.ep)

    def extras(plan, cost) -> dict:
        row = plan_metrics(plan, gpn)
        row["migration_gb"] = (cost.migration_bytes["intra_node"] + cost.migration_bytes["inter_node"]) / 1e9
        row["migration_inter_node_gb"] = cost.migration_bytes["inter_node"] / 1e9
        row["forward_s"] = float(sum(v.sum() for v in cost.forward.values()) + cost.extra_forward.sum())
        row["transfer_s"] = cost.replica_transfer_s  # pushes and pulls had none been hidden (relibra.costs)
        # the replica gradients' adds into their homes: charged with the exposed gradient pulls, but compute
        row["replica_grad_add_s"] = float(cost.info["overheads"].get("grad_add_s", 0.0))
        row["transfers_on_critical_path"] = float(bool(plan.transfers_on_critical_path))  # fetched in line (LLEP)
        return row

    result, labels = _simulate(trace, topology, policies, card, steps, workload, step_extras=extras)
    per_step = _labelled(result.per_step, labels)
    extra = per_step.groupby("policy")[["gpu_skewness", "node_skewness", "cross_node_share", "replicas_per_gpu",
                                        "migration_gb", "migration_inter_node_gb", "forward_s", "transfer_s",
                                        "exposed_transfer_s", "replica_grad_add_s",
                                        "transfers_on_critical_path"]].mean()
    summary = _labelled(result.summary.join(extra, on="policy"), labels)  # its speedup_vs_megatron: relibra.sim's
    tokens_per_s = per_step["tokens"] / per_step["step_s"]
    megatron = per_step["policy"] == "megatron"
    per_step["speedup_vs_megatron"] = tokens_per_s / per_step["step"].map(
        tokens_per_s[megatron].set_axis(per_step.loc[megatron, "step"]))
    return per_step, summary


def simulate_workloads(params, sizes, card: SetupCard, progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """simulate_with_plans of params.policies on params.model for every workload of the notebook's grid:
    (per_step, summary), each concatenated over workloads."""
    per_step, summary = [], []
    for workload in tqdm(params.workloads(sizes), desc="workloads", disable=not progress):
        trace = params.routing(workload, params.ep, sizes, card)
        steps, totals = simulate_with_plans(trace, params.cluster, params.policies, card, params.steps, workload)
        per_step.append(steps)
        summary.append(totals)
    return pd.concat(per_step, ignore_index=True), pd.concat(summary, ignore_index=True)


def full_model_memory_share(model: ModelShape, ep: int, simulated_layers: int, buffer_bytes,
                            per_layer_buffer) -> np.ndarray:
    """Replica buffer bytes per GPU as a share of the parameter bytes per GPU of the *whole* model, whatever
    layers were simulated: a layer-shared buffer does not grow with layers; a per-layer one (transfers on the
    critical path, LLEP) does."""
    param_bytes = ((model.num_experts // ep) * model.num_layers * model.expert_params
                   + dense_params_per_gpu(model)) * model.bytes_per_param
    scale = np.where(np.asarray(per_layer_buffer, dtype=bool), model.num_layers / simulated_layers, 1.0)
    return np.asarray(buffer_bytes, dtype=float) * scale / param_bytes
