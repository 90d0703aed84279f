"""The simulator over a config's steps: one summary row per policy (notebooks 02, 03, 05, 09), and with
plan-level figures per (policy, step) (notebooks 04, 05, 07)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from relibra.cluster import resolve_topology
from relibra.experiments.config import Config
from relibra.experiments.traces import make_trace
from relibra.policies import get_policy
from relibra.progress import progress as tqdm
from relibra.setups import load_card
from relibra.sim import simulate
from relibra.trace import skewness


def history_steps(cfg: Config) -> int:
    """Steps simulated per trace: all but the first, which only serves as history for `eplb`."""
    return max(1, cfg.steps - 1)


def make_policy(name: str, **params):
    """get_policy(name, **params); its plans take the cluster as an argument."""
    return get_policy(name, **params)


def simulate_trace(cfg: Config, trace, policies=None, cluster: str | None = None, workload: str | None = None,
                   policy_params: dict | None = None, keep_costs: bool = False, with_result: bool = False):
    """Simulate `policies` (default cfg.policies) on `trace` with the set-up card's cost knobs and
    ReLibra parameters (parameter `setup`, default paper); one summary row per policy.

    Returns a DataFrame with relibra.sim.SUMMARY_COLUMNS plus model, workload, ep, cluster
    (and the SimResult too when with_result).
    """
    policies = list(policies or cfg.policies)
    cluster = cluster or cfg.cluster
    card = load_card(cfg.extra.get("setup") or "token-budget-tp1")
    res = simulate(trace, cluster, policies, steps=min(history_steps(cfg), trace.num_steps),
                   policy_params={**card.policy_params(policies), **(policy_params or {})}, progress=False,
                   params=card.cost_params(trace.ep),
                   workload=workload or str(trace.provenance.get("workload", "")), keep_costs=keep_costs)
    summary = res.summary.copy()
    summary.insert(0, "cluster", res.config["cluster"])
    summary.insert(0, "ep", trace.ep)
    summary.insert(0, "workload", res.config["workload"])
    summary.insert(0, "model", trace.model.name)
    summary["layers"] = trace.num_layers
    summary["micro_batches"] = trace.num_microbatches
    return (summary, res) if with_result else summary


def throughput_grid(cfg: Config, models=None, workloads=None, policies=None, progress: bool = True) -> pd.DataFrame:
    """Simulated throughput of every policy for every (model, workload) of the config.

    Returns one row per (model, workload, policy): tokens_per_s, speedup_vs_megatron, frac_of_balanced,
    skewness and the rest of relibra.sim.SUMMARY_COLUMNS.
    """
    cases = [(m, w) for m in (models or cfg.models) for w in (workloads or cfg.workloads)]
    frames = []
    for model, workload in tqdm(cases, desc="model x workload", disable=not progress):
        trace = make_trace(cfg, model=model, workload=workload)
        frames.append(simulate_trace(cfg, trace, policies=policies, workload=workload))
    return pd.concat(frames, ignore_index=True)


def plan_metrics(plan, gpus_per_node: int) -> dict:
    """Plan-level figures the simulator's summary does not carry.

    node_skewness: mean over (micro_batch, layer) of max / mean tokens per node; gpu_skewness: the
    same per GPU; cross_node_share: share of dispatched token-expert pairs whose destination GPU is
    in another node than their source rank; replicas_per_gpu: mean occupied replica slots per GPU.
    """
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


def simulate_with_plans(cfg: Config, trace, policies, cluster: str | None = None,
                        policy_params: dict | None = None, workload: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """relibra.sim.simulate over cfg's steps, keeping plan-level figures per (policy, step) too.

    Returns (per_step, summary): per_step has one row per (policy, step) with the simulator's step
    figures (step_s, tokens, skewness, migration_s, plan_s, ...) plus `plan_metrics`, migration
    bytes, forward seconds and unhidden replica-transfer seconds; summary is the simulator's summary
    with those plan figures averaged per policy.
    """
    topo = resolve_topology(cluster or cfg.cluster)
    card = load_card(cfg.extra.get("setup") or "token-budget-tp1")
    _, gpn = topo.ep_layout(trace.ep)

    def extras(plan, cost) -> dict:
        row = plan_metrics(plan, gpn)
        row["migration_gb"] = (cost.migration_bytes["intra_node"] + cost.migration_bytes["inter_node"]) / 1e9
        row["migration_inter_node_gb"] = cost.migration_bytes["inter_node"] / 1e9
        row["forward_s"] = float(sum(v.sum() for v in cost.forward.values()) + cost.extra_forward.sum())
        row["transfer_s"] = cost.replica_transfer_s  # pushes and pulls had none been hidden (relibra.costs)
        return row

    result = simulate(trace, topo, list(policies), steps=min(history_steps(cfg), trace.num_steps),
                      policy_params={**card.policy_params(policies), **(policy_params or {})}, progress=False,
                      workload=workload, step_extras=extras, params=card.cost_params(trace.ep))
    per_step, summary = result.per_step, result.summary
    extra = per_step.groupby("policy")[["gpu_skewness", "node_skewness", "cross_node_share", "replicas_per_gpu",
                                        "migration_gb", "migration_inter_node_gb", "forward_s", "transfer_s",
                                        "exposed_transfer_s"]].mean()
    summary = summary.join(extra, on="policy")
    labels = {"model": trace.model.name, "workload": workload or str(trace.provenance.get("workload", "")),
              "ep": trace.ep, "cluster": topo.name}
    for frame in (per_step, summary):
        for i, (k, v) in enumerate(labels.items()):
            frame.insert(i, k, v)
    mega = summary.set_index("policy")["tokens_per_s"].get("megatron", np.nan)
    tokens_per_s = per_step["tokens"] / per_step["step_s"]
    megatron_by_step = tokens_per_s[per_step["policy"] == "megatron"].set_axis(
        per_step.loc[per_step["policy"] == "megatron", "step"])
    per_step["speedup_vs_megatron"] = tokens_per_s / per_step["step"].map(megatron_by_step)
    summary["speedup_vs_megatron"] = summary["tokens_per_s"] / mega
    return per_step, summary


def simulate_workloads(cfg: Config, progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """simulate_with_plans of cfg.policies on cfg.model for every cfg.workloads (notebooks 04 and 05).

    Returns (per_step, summary), each concatenated over workloads (one row per (workload, policy,
    step) and per (workload, policy)).
    """
    per_step, summary = [], []
    for workload in tqdm(cfg.workloads, desc="workloads", disable=not progress):
        trace = make_trace(cfg, workload=workload)
        steps, totals = simulate_with_plans(cfg, trace, cfg.policies, workload=workload)
        per_step.append(steps)
        summary.append(totals)
    return pd.concat(per_step, ignore_index=True), pd.concat(summary, ignore_index=True)
