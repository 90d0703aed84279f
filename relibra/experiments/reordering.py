"""Notebook 04, inter-batch reordering: annealing search vs greedy LPT vs static homes."""

from __future__ import annotations

import pandas as pd

from relibra.experiments.config import Config
from relibra.experiments.simulation import simulate_workloads


def reorder_table(cfg: Config, progress: bool = True) -> pd.DataFrame:
    """Per (workload, policy, step): simulated speedup over Megatron, node and GPU skewness, share of
    tokens crossing nodes, migration GB, planner seconds; for cfg.model on every cfg.workloads."""
    per_step, _ = simulate_workloads(cfg, progress)
    return per_step
