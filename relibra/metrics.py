"""One tidy metrics schema shared by the simulator (simulated seconds) and the runtime (measured).

Each row is one time (or count) component of one (policy, step, micro_batch, layer, rank, phase).
Aggregates use -1 for an axis they sum or reduce over (e.g. rank=-1: the slowest rank, which sets
the pace of an all-to-all; layer=-1: a whole-step cost such as migration or the optimizer).
"""

from __future__ import annotations

import pandas as pd

METRIC_COLUMNS = [
    "source",  # "simulated" or "measured"
    "hardware",  # topology preset or a description of the machine, e.g. "cpu-gloo (2 cores, gloo)"
    "policy",
    "model",
    "workload",
    "ep",
    "step",
    "micro_batch",  # -1: whole step
    "layer",  # -1: not one layer
    "rank",  # -1: the slowest rank (critical path)
    "phase",  # "forward", "backward", "step"
    "component",  # see COMPONENTS
    "seconds",
    "tokens",  # tokens computed by the rank (or the slowest rank), where meaningful; else 0
]

COMPONENTS = (
    "dispatch",  # all-to-all before the experts
    "combine",  # all-to-all after the experts
    "expert_compute",  # routed-expert GEMMs
    "dense_compute",  # attention, shared experts, dense layers
    "replica_push",  # replica weights copied to spare slots (exposed part only)
    "replica_grad",  # replica gradients reduced into the home (exposed part only)
    "migration",  # reordering: moving homes with their optimizer state
    "optimizer",  # the optimizer step
    "pipeline_send",  # stage-to-stage activation and gradient sends that hold the busiest stage (simulated, PP > 1)
    "pipeline_bubble",  # the 1F1B schedule's time beyond the busiest pipeline stage's own work (simulated, PP > 1)
    "planner",  # planning time (off the critical path for replay-driven policies)
    "step_total",  # whole step as measured / simulated end to end
    "step_cpu",  # process CPU seconds of a rank's whole step (measured only)
)
# A measured component "<name>_wait" holds the seconds a rank waited for the others at a timed barrier
# just before the collective or transfer <name> (relibra.runtime.timing): its own work is <name>.


def frame(rows: list[dict]) -> pd.DataFrame:
    """A DataFrame with exactly METRIC_COLUMNS (missing optional values filled)."""
    df = pd.DataFrame(rows)
    for col in METRIC_COLUMNS:
        if col not in df:
            df[col] = 0 if col == "tokens" else ("" if col in ("source", "hardware", "workload") else -1)
    return df[METRIC_COLUMNS]
