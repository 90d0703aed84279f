"""Notebook 01, routing dynamics: expert load per micro-batch vs per step, how far hot experts shift,
how wrong load predictions are, and rank skewness under static placement."""

from __future__ import annotations

import numpy as np
import pandas as pd

from relibra.analysis import history_prediction, shift_stats
from relibra.trace import skewness


def expert_load_table(trace, step: int = 0, layer: int = 0) -> pd.DataFrame:
    """Tokens per expert in every micro-batch of one (step, layer), and in every whole step of that layer.

    Columns: scope ('micro-batch' or 'step'), step, micro_batch (-1 for whole steps), layer, expert,
    tokens, share (of that micro-batch's or step's token-slots).
    """
    el = trace.expert_load()  # [S, M, L, E]
    mb = el[step, :, layer]  # [M, E]
    st = el[:, :, layer].sum(axis=1)  # [S, E]
    m, e = mb.shape
    rows_mb = pd.DataFrame({
        "scope": "micro-batch", "step": step, "micro_batch": np.repeat(np.arange(m), e), "layer": layer,
        "expert": np.tile(np.arange(e), m), "tokens": mb.ravel(),
        "share": (mb / np.maximum(mb.sum(-1, keepdims=True), 1)).ravel()})
    s = st.shape[0]
    rows_st = pd.DataFrame({
        "scope": "step", "step": np.repeat(np.arange(s), e), "micro_batch": -1, "layer": layer,
        "expert": np.tile(np.arange(e), s), "tokens": st.ravel(),
        "share": (st / np.maximum(st.sum(-1, keepdims=True), 1)).ravel()})
    return pd.concat([rows_mb, rows_st], ignore_index=True)


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
    """How far hot experts move, per trace (e.g. per workload), as a tidy table.

    traces: {label: RoutingTrace}. Columns: trace, comparison, metric, value (hot-expert overlap is
    the share of the hottest `hot_frac` experts found again among the other's hottest; 1 = same).
    """
    rows = []
    for label, trace in traces.items():
        stats = shift_stats(trace.expert_load(), hot_frac=hot_frac, history_window=history_window)
        for key, (comparison, metric) in SHIFT_COMPARISONS.items():
            rows.append({"trace": label, "comparison": comparison, "metric": metric, "value": stats[key]})
    return pd.DataFrame(rows)


def distribution_distance(actual: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Total-variation distance between load vectors normalized to shares, along the last axis.

    = the share of token-slots that the prediction puts on the wrong experts (0 = exact, 1 = disjoint).
    """
    a = actual / np.maximum(actual.sum(-1, keepdims=True), 1e-12)
    p = predicted / np.maximum(predicted.sum(-1, keepdims=True), 1e-12)
    return 0.5 * np.abs(a - p).sum(-1)


def prediction_error_table(traces: dict[str, object], history_window: int = 4) -> pd.DataFrame:
    """How wrong predicted expert loads are, per (trace, predictor, target, step, micro_batch, layer).

    Predictors: 'history' (moving average of up to `history_window` previous whole steps, what
    EPLB is fed), 'this step (oracle)' (the exact whole-step load, what EPLB+ is given). Targets:
    'whole step' and 'micro-batch'. error = total-variation distance of the load shares (share of
    token-slots predicted on the wrong experts). Steps from 1 on (step 0 has no history).
    """
    frames = []
    for label, trace in traces.items():
        el = trace.expert_load().astype(np.float64)  # [S, M, L, E]
        s, m, l, _ = el.shape
        if s < 2:
            continue
        step = el.sum(axis=1)  # [S, L, E]
        hist = history_prediction(step, history_window)  # [S-1, L, E]
        cases = {
            ("history", "whole step"): distribution_distance(step[1:], hist)[:, None, :],  # [S-1, 1, L]
            ("history", "micro-batch"): distribution_distance(el[1:], hist[:, None]),  # [S-1, M, L]
            ("this step (oracle)", "micro-batch"): distribution_distance(el[1:], step[1:, None]),
        }
        for (predictor, target), err in cases.items():
            ss, mm, ll = np.meshgrid(np.arange(1, s), np.arange(err.shape[1]), np.arange(l), indexing="ij")
            frames.append(pd.DataFrame({
                "trace": label, "predictor": predictor, "target": target, "step": ss.ravel(),
                "micro_batch": mm.ravel() if target == "micro-batch" else -1, "layer": ll.ravel(),
                "error": err.ravel()}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["trace", "predictor", "target", "step", "micro_batch", "layer", "error"])


def static_skewness_table(traces: dict[str, object]) -> pd.DataFrame:
    """Rank skewness (max / mean tokens per EP rank) under static contiguous placement, per
    (trace, step, micro_batch, layer), and of the whole step ('micro_batch' = -1)."""
    frames = []
    for label, trace in traces.items():
        rl = trace.rank_load()  # [S, M, L, ep]
        sk = skewness(rl)
        s, m, l = sk.shape
        ss, mm, ll = np.meshgrid(np.arange(s), np.arange(m), np.arange(l), indexing="ij")
        frames.append(pd.DataFrame({"trace": label, "scope": "micro-batch", "step": ss.ravel(),
                                    "micro_batch": mm.ravel(), "layer": ll.ravel(), "skewness": sk.ravel()}))
        whole = skewness(rl.sum(axis=1))  # [S, L]
        s2, l2 = np.meshgrid(np.arange(s), np.arange(l), indexing="ij")
        frames.append(pd.DataFrame({"trace": label, "scope": "whole step", "step": s2.ravel(), "micro_batch": -1,
                                    "layer": l2.ravel(), "skewness": whole.ravel()}))
    return pd.concat(frames, ignore_index=True)
