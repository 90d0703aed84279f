"""Notebook 07, overheads: planner time (measured), migration, replica memory and transfer overlap."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from relibra.cluster import get_model
from relibra.costs import dense_params_per_gpu
from relibra.experiments.config import Config
from relibra.experiments.machine import this_machine
from relibra.experiments.simulation import make_policy, simulate_with_plans
from relibra.experiments.traces import make_trace
from relibra.sim import resolve_topology
from relibra.trace import static_placement


def planner_seconds(trace, policy: str, step: int, repeats: int = 1, cluster: str = "paper") -> float:
    """Best-of-`repeats` wall seconds of one step's plan on `cluster` (one thread, this machine)."""
    pol = make_policy(policy)
    prev = static_placement(trace.num_layers, trace.num_experts, trace.ep)
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        pol.plan(trace, step, cluster, prev)
        best = min(best, time.perf_counter() - t0)
    return best


def full_model_memory_share(model: str, ep: int, simulated_layers: int, buffer_bytes, per_layer_buffer) -> np.ndarray:
    """Replica buffer bytes per GPU as a share of the parameter bytes per GPU of the *whole* model
    (all its MoE layers), whatever layers the profile simulated: a layer-shared buffer does not grow
    with layers; a per-layer one (plans with transfers on the critical path, LLEP) grows with them."""
    full = get_model(model)
    param_bytes = ((full.num_experts // ep) * full.num_layers * full.expert_params
                   + dense_params_per_gpu(full)) * full.bytes_per_param
    scale = np.where(np.asarray(per_layer_buffer, dtype=bool), full.num_layers / simulated_layers, 1.0)
    return np.asarray(buffer_bytes, dtype=float) * scale / param_bytes


def overhead_table(cfg: Config) -> pd.DataFrame:
    """Per policy, for cfg.model / cfg.workload on cfg.cluster at cfg.ep:

    plan_s (measured: best-of-repeats wall seconds to plan one step, one thread), forward_s and step_s
    (simulated seconds of one step's forward pass and of the whole step), planner_vs_forward
    (plan_s / forward_s: < 1 means the planner hides behind one forward pass), planner_on_critical_path,
    migration_share, migration_gb, replica_memory_share, transfer_s (replica transfers if none were
    hidden), exposed_transfer_s and transfer_overlap (share hidden behind attention).
    """
    import torch  # heavy: only the replica-memory figure needs it


    trace = make_trace(cfg)
    topo = resolve_topology(cfg.cluster)
    _, gpn = topo.ep_layout(trace.ep)
    per_step, summary = simulate_with_plans(cfg, trace, cfg.policies)
    # the simulator adds the ideals (balanced, balanced-compute) as references: they plan nothing
    summary = summary[~summary["policy"].isin(("balanced", "balanced-compute"))].reset_index(drop=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        last = trace.num_steps - 1
        plan_s = {p: planner_seconds(trace, p, last, cfg.sizes.planner_repeats, cfg.cluster)
                  for p in summary["policy"]}
    finally:
        torch.set_num_threads(threads)
    out = summary[["model", "workload", "ep", "cluster", "policy", "step_s", "forward_s", "migration_share",
                   "migration_gb", "replica_memory_share", "exposed_transfer_share", "planner_on_critical_path",
                   "speedup_vs_megatron"]].copy()
    out["plan_s"] = out["policy"].map(plan_s)
    out["planner_vs_forward"] = out["plan_s"] / out["forward_s"]
    out["transfer_s"] = summary["transfer_s"].to_numpy()
    out["exposed_transfer_s"] = summary["exposed_transfer_s"].to_numpy()
    out["transfer_overlap"] = np.where(out["transfer_s"] > 0, 1.0 - out["exposed_transfer_s"] / out["transfer_s"].where(
        out["transfer_s"] > 0, 1.0), np.nan)
    out["layers"] = trace.num_layers
    out["micro_batches"] = trace.num_microbatches
    out["planner_hardware"] = this_machine()
    out["replica_memory_share_full_model"] = full_model_memory_share(
        cfg.model, trace.ep, trace.num_layers, summary["replica_buffer_bytes"].to_numpy(dtype=float),
        summary["planner_on_critical_path"].to_numpy(dtype=bool))
    return out
