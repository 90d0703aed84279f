"""Notebook 11, beyond the paper's scale: throughput ratios and planner time from EP16 to EP256.

One grid, ScaleSweep: model presets of three sizes x cluster kinds (8-GPU nodes joined by RDMA, NVL72
racks) x EP sizes. A case the cluster or the model cannot hold (EP256 of a 128-expert model; 384
experts over 256 ranks) is kept as a row saying why, never dropped silently. Every throughput figure
is simulated (relibra.sim); planner seconds are measured here, on one core of this machine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from relibra.cluster import ModelShape, Topology
from relibra.errors import ConfigError
from relibra.studies.case import run_cases, scaled_model
from relibra.policies.relibra import ReLibraInfo
from relibra.sim import simulate
from relibra.workloads import generate_trace

SCALE_POLICIES = ("megatron", "eplb+", "llep", "relibra", "relibra-h")


@dataclass(frozen=True)
class ScaleSweep:
    """The grid of notebook 11: models (model presets or shapes) x clusters x EP sizes. layers: keep
    each model's first `layers` MoE layers (None: all); micro_batches per step; steps: trace steps, the
    last one simulated (the ones before give history-based policies their history)."""

    models: tuple
    clusters: tuple
    ep_sizes: tuple[int, ...]
    layers: int | None = 2
    micro_batches: int = 8
    steps: int = 2


def why_impossible(model: ModelShape, cluster: Topology, ep: int) -> str | None:
    """None when `cluster` can hold EP `ep` of `model`; else the reason, as the kit's errors say it."""
    if model.num_experts % ep:
        return f"EP {ep} does not divide the {model.num_experts} experts"
    try:
        cluster.ep_layout(ep)
    except ConfigError as exc:
        return str(exc)
    return None


def scale_cases(models, clusters, ep_sizes) -> list[tuple[ModelShape, Topology, int, str | None]]:
    """(model, cluster, ep, reason it cannot run or None) for every point of the grid, in order."""
    return [(m, c, ep, why_impossible(m, c, ep)) for m in models for c in clusters for ep in ep_sizes]


def _plan_extras(plan, cost) -> dict:
    """Per (policy, step): the planner's CPU seconds and, for ReLibra's family, its replication CPU
    microseconds per (micro-batch, layer)."""
    replication_s = plan.info.replication_cpu_seconds if isinstance(plan.info, ReLibraInfo) else np.nan
    return {"plan_cpu_s": float(plan.info.plan_cpu_seconds),
            "replication_cpu_us_per_cell": 1e6 * replication_s / (plan.loads.shape[0] * plan.loads.shape[1])}


def scale_sweep(models, clusters, ep_sizes, sweep: ScaleSweep, policies=SCALE_POLICIES, workload: str = "mixed",
                seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """The last step of one synthetic trace per (model, cluster, EP) of the grid (ModelShapes, Topologies;
    `sweep`: layers, micro-batches, steps) simulated for every policy and the references. One row per (model,
    cluster, ep, policy), status "ok": the EP layout's nodes and gpus_per_node, tokens_per_s,
    speedup_vs_megatron, frac_of_balanced_compute, skewness (max / mean tokens per GPU), plan_s and plan_cpu_s
    (measured wall and CPU seconds of the whole step's plan), replication_cpu_us_per_cell. An impossible case
    is one row, policy "-", status "impossible: <why>"."""
    simulate_one = functools.partial(_scale_rows, sweep=sweep, policies=tuple(policies), workload=workload, seed=seed)
    return run_cases(simulate_one, scale_cases(models, clusters, ep_sizes), workers=1, progress=progress,
                     desc="models x clusters x EP")


def _scale_rows(point, sweep: ScaleSweep, policies: tuple[str, ...], workload: str, seed: int) -> pd.DataFrame:
    """scale_sweep's rows of one (model, cluster, ep, reason) point."""
    shape, topo, ep, reason = point
    model, cluster = shape.name, topo.name
    if reason is not None:
        return pd.DataFrame([{"model": model, "cluster": cluster, "ep": ep, "policy": "-",
                              "status": f"impossible: {reason}"}])
    nodes, gpn = topo.ep_layout(ep)
    shape = scaled_model(shape, sweep.layers)
    trace = generate_trace(shape, workload, ep, steps=sweep.steps, seed=seed, micro_batches=sweep.micro_batches)
    result = simulate(trace, topo, list(policies), steps=1, progress=False, step_extras=_plan_extras)
    extras = result.per_step.groupby("policy")[["plan_cpu_s", "replication_cpu_us_per_cell"]].mean()
    rows = []
    for policy, s in result.summary.set_index("policy").iterrows():
        planned = policy not in ("balanced", "balanced-compute")  # references: they plan nothing of their own
        rows.append({"model": model, "cluster": cluster, "ep": ep, "policy": policy, "status": "ok",
                     "nodes": nodes, "gpus_per_node": gpn, "experts": shape.num_experts,
                     **{c: float(s[c]) for c in ("tokens_per_s", "speedup_vs_megatron", "frac_of_balanced_compute",
                                                 "skewness")},
                     "plan_s": float(s["plan_s"]) if planned else np.nan,
                     **{c: float(extras.loc[policy, c]) if planned else np.nan for c in extras.columns}})
    return pd.DataFrame(rows)


def best_other(table: pd.DataFrame, against: str = "relibra-h") -> pd.DataFrame:
    """Per (model, cluster, ep): `against`'s speed-up over Megatron and fraction of balanced-compute
    beside the best other simulated policy's (ideals and Megatron excluded), and their ratio."""
    ok = table[table["status"] == "ok"]
    keys = ["model", "cluster", "ep"]
    out = []
    for key, g in ok.groupby(keys, sort=False):
        g = g.set_index("policy")
        others = g.drop(index=[against, "megatron", "balanced", "balanced-compute"], errors="ignore")
        if against not in g.index or others.empty:
            continue
        best = others["tokens_per_s"].idxmax()
        out.append(dict(zip(keys, key), policy=against, speedup=g.loc[against, "speedup_vs_megatron"],
                        frac_of_balanced_compute=g.loc[against, "frac_of_balanced_compute"], best_other=best,
                        best_other_speedup=others.loc[best, "speedup_vs_megatron"],
                        over_best_other=g.loc[against, "tokens_per_s"] / others.loc[best, "tokens_per_s"]))
    return pd.DataFrame(out)
