"""Notebook 06: rank skewness of each policy's plans across EP sizes and task domains (no cost model)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from relibra.experiments.config import Config
from relibra.experiments.simulation import history_steps, make_policy
from relibra.experiments.traces import make_trace
from relibra.progress import progress as tqdm
from relibra.trace import static_placement


def plan_skewness(trace, policy: str, steps: list[int], cluster: str = "paper") -> np.ndarray:
    """Rank skewness of every (step, micro_batch, layer) of `policy`'s plans: float64 [steps, M, L].

    Placements chain from the static one through the steps before steps[0] (as the simulator's warm-up).
    """
    pol = make_policy(policy)
    prev = static_placement(trace.num_layers, trace.num_experts, trace.ep)
    if steps[0] > 0:
        prev = np.asarray(pol.plan(trace, steps[0] - 1, cluster, prev).home)
    out = []
    for step in steps:
        plan = pol.plan(trace, step, cluster, prev)
        out.append(plan.skewness())
        prev = plan.home
    return np.stack(out)


def skewness_sweep(cfg: Config, progress: bool = True) -> pd.DataFrame:
    """Mean and p95 rank skewness per policy (from plans; no cost model) across cfg.ep_sizes (on
    cfg.workload) and across cfg.workloads (at cfg.ep), for cfg.model on cfg.cluster's node size.

    Columns: sweep ('ep' or 'workload'), model, workload, ep, policy, skewness, skewness_p95.
    """
    topo = cfg.topology()
    cases = [("ep", cfg.workload, ep) for ep in cfg.ep_sizes] + [("workload", w, cfg.ep) for w in cfg.workloads]
    rows = []
    for sweep, workload, ep in tqdm(cases, desc="EP sizes and domains", disable=not progress):
        trace = make_trace(cfg, workload=workload, ep=ep)
        _, gpn = topo.ep_layout(ep)
        steps = list(range(trace.num_steps - min(history_steps(cfg), trace.num_steps), trace.num_steps))
        for policy in cfg.policies:
            sk = plan_skewness(trace, policy, steps, cfg.cluster)
            rows.append({"sweep": sweep, "model": trace.model.name, "workload": workload, "ep": ep, "policy": policy,
                         "skewness": float(sk.mean()), "skewness_p95": float(np.percentile(sk, 95))})
    return pd.DataFrame(rows)
