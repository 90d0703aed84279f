"""Notebook 01, routing dynamics: expert load per micro-batch vs per step, how far hot experts shift,
how wrong load predictions are, and rank skewness under static placement."""

from __future__ import annotations

import numpy as np
import pandas as pd

from relibra.analysis import history_prediction, shift_stats
from relibra.trace import skewness


def expert_load_table(trace, step: int = 0, layer: int = 0) -> pd.DataFrame:
    """Tokens per expert in every micro-batch of one (step, layer), and in every whole step of that layer.
    Columns: scope ('micro-batch' or 'step'), step, micro_batch (-1 for whole steps), layer, expert, tokens,
    share (of that micro-batch's or step's token-slots)."""
    el = trace.expert_load()[:, :, layer]  # [S, M, E]
    s, m, e = el.shape
    parts = (("micro-batch", el[step], np.full(m, step), np.arange(m)),  # tokens [rows, E], step, micro_batch
             ("step", el.sum(axis=1), np.arange(s), np.full(s, -1)))
    return pd.concat([pd.DataFrame({
        "scope": scope, "step": steps.repeat(e), "micro_batch": mbs.repeat(e), "layer": layer,
        "expert": np.tile(np.arange(e), len(tokens)), "tokens": tokens.ravel(),
        "share": (tokens / np.maximum(tokens.sum(-1, keepdims=True), 1)).ravel()})
        for scope, tokens, steps, mbs in parts], ignore_index=True)


SHIFT_COMPARISONS = {
    # key in analysis.shift_stats -> (comparison, metric)
    "mb_hot_overlap": ("consecutive micro-batches", "hot-expert overlap"),
    "mb_corr": ("consecutive micro-batches", "load correlation"),
    "mb_vs_step_hot_overlap": ("micro-batch vs its own step", "hot-expert overlap"),
    "mb_vs_step_corr": ("micro-batch vs its own step", "load correlation"),
    "step_hot_overlap": ("consecutive steps", "hot-expert overlap"),
    "step_corr": ("consecutive steps", "load correlation"),
    "history_hot_overlap": ("step vs history prediction", "hot-expert overlap"),
    "history_corr": ("step vs history prediction", "load correlation"),
    "history_mb_hot_overlap": ("micro-batch vs history prediction", "hot-expert overlap"),
}


def shift_table(traces: dict[str, object], hot_frac: float = 0.1, history_window: int = 4) -> pd.DataFrame:
    """How far hot experts move in each trace of {label: RoutingTrace}: columns trace, comparison, metric, value
    (hot-expert overlap: the share of the hottest `hot_frac` experts found again among the other's; 1 = same)."""
    rows = []
    for label, trace in traces.items():
        stats = shift_stats(trace.expert_load(), hot_frac=hot_frac, history_window=history_window)
        rows += [{"trace": label, "comparison": comparison, "metric": metric, "value": stats[key]}
                 for key, (comparison, metric) in SHIFT_COMPARISONS.items()]
    return pd.DataFrame(rows)


def distribution_distance(actual: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Total-variation distance between load vectors normalized to shares, along the last axis: the share of
    token-slots the prediction puts on the wrong experts (0 = exact, 1 = disjoint)."""
    a = actual / np.maximum(actual.sum(-1, keepdims=True), 1e-12)
    p = predicted / np.maximum(predicted.sum(-1, keepdims=True), 1e-12)
    return 0.5 * np.abs(a - p).sum(-1)


def _per_cell(values: np.ndarray, column: str, whole_step: bool, first_step: int = 0, **labels) -> pd.DataFrame:
    """One row per (step, micro_batch, layer) of `values` [S, M, L] (M = 1 for whole steps): the `labels`
    columns, step (counted from first_step), micro_batch (-1 for whole steps), layer, and `column`."""
    s, m, l = np.indices(values.shape).reshape(3, -1)
    return pd.DataFrame({**labels, "step": s + first_step, "micro_batch": -1 if whole_step else m, "layer": l,
                         column: values.ravel()})


def prediction_error_table(traces: dict[str, object], history_window: int = 4) -> pd.DataFrame:
    """How wrong predicted expert loads are (error: distribution_distance), per (trace, predictor, target, step,
    micro_batch, layer), steps from 1 on (step 0 has no history). Predictors: 'history' (moving average of up to
    `history_window` previous whole steps, EPLB's input) and 'this step (oracle)' (the exact whole-step load,
    EPLB+'s input); targets: 'whole step' and 'micro-batch'."""
    frames = []
    for label, trace in traces.items():
        el = trace.expert_load().astype(np.float64)  # [S, M, L, E]
        if el.shape[0] < 2:
            continue
        step = el.sum(axis=1)  # [S, L, E]
        hist = history_prediction(step, history_window)  # [S-1, L, E]
        cases = {
            ("history", "whole step"): distribution_distance(step[1:], hist)[:, None, :],  # [S-1, 1, L]
            ("history", "micro-batch"): distribution_distance(el[1:], hist[:, None]),  # [S-1, M, L]
            ("this step (oracle)", "micro-batch"): distribution_distance(el[1:], step[1:, None]),
        }
        frames += [_per_cell(err, "error", target == "whole step", 1, trace=label, predictor=predictor, target=target)
                   for (predictor, target), err in cases.items()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["trace", "predictor", "target", "step", "micro_batch", "layer", "error"])


def static_skewness_table(traces: dict[str, object]) -> pd.DataFrame:
    """Rank skewness (max / mean tokens per EP rank) under static contiguous placement, per
    (trace, step, micro_batch, layer), and of the whole step ('micro_batch' = -1)."""
    frames = []
    for label, trace in traces.items():
        rl = trace.rank_load()  # [S, M, L, ep]
        frames += [_per_cell(skewness(rl), "skewness", False, trace=label, scope="micro-batch"),
                   _per_cell(skewness(rl.sum(axis=1))[:, None], "skewness", True, trace=label, scope="whole step")]
    return pd.concat(frames, ignore_index=True)
