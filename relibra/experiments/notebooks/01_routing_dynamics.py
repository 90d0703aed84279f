"""Notebook 01, routing dynamics: expert load per micro-batch vs per step, how far hot experts shift,
how wrong load predictions are, and rank skewness under static placement."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from relibra.experiments.base import Result, TryThis, live, mean_of, table
from relibra.experiments.dynamics import expert_load_table, prediction_error_table, shift_table, static_skewness_table
from relibra.experiments.profiles import SCALES, Scale
from relibra.experiments.text import pct
from relibra.experiments.traces import TraceParams, make_trace
from relibra.setups import load_card

QUESTION = "How far do hot experts move between micro-batches, and what does a history-based prediction miss?"
SIZES = SCALES
Params = TraceParams


@dataclass(kw_only=True)
class Result(Result):
    expert_load: pd.DataFrame = table("tokens per expert: micro-batches of step 0 and whole steps, layer 0")
    shift_stats: pd.DataFrame = table("hot-expert overlap and load correlation per comparison and workload")
    prediction_error: pd.DataFrame = table("prediction error per predictor, target, step, micro-batch and layer")
    static_skewness: pd.DataFrame = table("rank skewness under static placement per micro-batch / whole step")
    traces: dict = live()


def compute(p: TraceParams, sizes: Scale) -> Result:
    """The routing statistics of the model's traces at p.ep, for every workload of the grid and the single one."""
    card = load_card()
    names = list(dict.fromkeys(list(p.workloads(sizes)) + [p.the_workload(sizes)]))
    traces = {w: make_trace(p.model, w, p.ep, p.steps, p.seed, sizes, card) for w in names}
    return Result(expert_load=expert_load_table(traces[p.the_workload(sizes)], step=0, layer=0),
                  shift_stats=shift_table(traces), prediction_error=prediction_error_table(traces),
                  static_skewness=static_skewness_table(traces), traces=traces)


@dataclass(frozen=True)
class Summary:
    """Means over workloads, steps and layers (NaN where the result lacks them)."""

    mb_overlap: float  # hot-expert overlap of consecutive micro-batches
    step_overlap: float  # ... of consecutive whole steps
    history_error: float | None  # share of a micro-batch's token-slots a history prediction misplaces
    history_step_error: float  # ... of a whole step's
    oracle_error: float  # ... that the exact step total misplaces in a micro-batch
    mb_skewness: float  # static placement's rank skewness per micro-batch
    step_skewness: float  # ... for the summed step


def summarize(r: Result) -> Summary:
    v = r.shift_stats.groupby(["comparison", "metric"])["value"].mean()
    e = r.prediction_error.groupby(["predictor", "target"])["error"].mean()
    sk = r.static_skewness.groupby("scope")["skewness"].mean()
    return Summary(v.get(("consecutive micro-batches", "hot-expert overlap"), np.nan),
                   v.get(("consecutive steps", "hot-expert overlap"), np.nan),
                   e[("history", "micro-batch")] if ("history", "micro-batch") in e else None,
                   e.get(("history", "whole step"), np.nan), e.get(("this step (oracle)", "micro-batch"), np.nan),
                   sk.get("micro-batch", np.nan), sk.get("whole step", np.nan))


def story(s: Summary) -> str:
    out = [f"Consecutive micro-batches share {pct(s.mb_overlap)} of their hottest 10% of experts; consecutive whole "
           f"steps share {pct(s.step_overlap)}."]
    if s.history_error is not None:
        out.append(f"A history prediction (EPLB's input) puts {pct(s.history_error)} of a micro-batch's token-slots "
                   f"on the wrong experts ({pct(s.history_step_error)} of a whole step's); even the exact step total "
                   f"(EPLB+'s input) misplaces {pct(s.oracle_error)} of a micro-batch's.")
    if s.mb_skewness > s.step_skewness + 0.02:
        out.append(f"Under static placement, the mean skewness is {s.mb_skewness:.2f} per micro-batch but "
                   f"{s.step_skewness:.2f} for the summed step: balancing the step's total hides imbalance that every "
                   "micro-batch pays for.")
    else:
        out.append(f"Under static placement, the mean skewness is {s.mb_skewness:.2f} per micro-batch and "
                   f"{s.step_skewness:.2f} for the summed step: here the hot experts stay hot across the step's "
                   "micro-batches, so a step-level placement would see the same imbalance.")
    return " ".join(out)


TRIES = (
    TryThis(lambda p, s: {"ep": 2 * p.ep}, "the mean rank skewness of a micro-batch under static placement",
            lambda r: mean_of(r.static_skewness, "skewness", scope="micro-batch"), +1,
            "with fewer experts per GPU one hot expert weighs more"),
)
