"""The measured planner-time table, as the cost model reads it: the seconds a run-time planner (LLEP;
any policy whose plans set "planner_on_critical_path") takes per (micro-batch, layer) at each EP size,
measured on one machine by relibra.bench.planner_table and stored in data/planner_seconds.json; the
cost model interpolates it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from relibra.errors import ConfigError

PLANNER_TABLE = Path(__file__).resolve().parents[2] / "data" / "planner_seconds.json"


@functools.lru_cache(maxsize=4)
def load_planner_table(path: str | None = None) -> dict:
    """The measured planner table (measure_planner_table's output) as stored in JSON; {} if absent."""
    p = Path(path) if path else PLANNER_TABLE
    if not p.exists():
        return {}
    with open(p) as f:
        table = json.load(f)
    if not isinstance(table, dict) or not isinstance(table.get("policies", {}), dict):
        raise ConfigError(f"{p}: not a planner table (expected {{'policies': {{name: {{'ep': [...], ...}}}}}})")
    return table


def planner_seconds_per_cell(policy: str, ep: int, path: str | None = None) -> float | None:
    """A run-time planner's seconds per (micro-batch, layer) at EP `ep`, interpolated linearly in
    (log EP, log seconds) between the measured EP sizes and held at the end values beyond them.
    None when the table has no row for `policy`."""
    entry = load_planner_table(path).get("policies", {}).get(policy)
    if entry is None:
        return None
    eps = np.asarray(entry["ep"], dtype=np.float64)
    sec = np.asarray(entry["seconds_per_cell"], dtype=np.float64)
    if eps.ndim != 1 or eps.shape != sec.shape or len(eps) == 0 or (sec <= 0).any() or (np.diff(eps) <= 0).any():
        raise ConfigError(f"planner table: row {policy!r} needs increasing 'ep' and positive 'seconds_per_cell' "
                          f"of equal length")
    return float(np.exp(np.interp(np.log(ep), np.log(eps), np.log(sec))))


def runtime_cpu_seconds(plan) -> float:
    """CPU seconds of the part of a StepPlan made at run time: plan.runtime_planner.cpu_seconds when
    the policy times it apart (lplb+: the LP solves, not its once-per-step EPLB reordering), else the
    whole plan's plan.info.plan_cpu_seconds."""
    part = plan.runtime_planner
    return float(plan.info.plan_cpu_seconds if part is None else part.cpu_seconds)
