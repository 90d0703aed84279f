"""Routing-dynamics statistics of traces: how far hot experts move between micro-batches and steps,
and how well a history of steps predicts the next (notebook 01, `relibra trace stats`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from relibra.trace.core import skewness


def hot_overlap(a: np.ndarray, b: np.ndarray, frac: float = 0.1) -> np.ndarray:
    """Share of a's hottest `frac` experts that are also among b's hottest. [..., E] -> [...].

    Memory: a few arrays of a's size (b's hottest marked in a boolean mask, looked up at a's hottest).
    """
    a, b = np.broadcast_arrays(a, b)
    e = a.shape[-1]
    k = max(1, int(round(frac * e)))
    ta = np.argsort(-a, axis=-1, kind="stable")[..., :k]
    tb = np.argsort(-b, axis=-1, kind="stable")[..., :k]
    hot_b = np.zeros(a.shape, dtype=bool)
    np.put_along_axis(hot_b, tb, True, axis=-1)
    return np.take_along_axis(hot_b, ta, axis=-1).sum(-1) / k


def load_correlation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of load vectors along the last axis ([..., E] -> [...]); 0 where constant."""
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    return np.where(den > 0, (a * b).sum(-1) / np.where(den > 0, den, 1.0), 0.0)


def history_prediction(step_load: np.ndarray, window: int) -> np.ndarray:
    """Moving-average prediction of each step's load from the `window` steps before it.

    step_load: [steps, ...]. Returns [steps - 1, ...] predictions for steps 1.. (step 0 has no history).
    """
    cums = np.cumsum(step_load.astype(np.float64), axis=0)
    preds = []
    for s in range(1, step_load.shape[0]):
        lo = max(0, s - window)
        total = cums[s - 1] - (cums[lo - 1] if lo > 0 else 0)
        preds.append(total / (s - lo))
    return np.stack(preds)


# Working memory of one block of trace statistics (float64 loads of some steps x layers; the
# temporaries of one block take a few times this).
STATS_BLOCK_BYTES = 32 * 2**20


def _block_rows(bytes_per_row: int, rows: int) -> int:
    """How many rows of `bytes_per_row` fit STATS_BLOCK_BYTES (at least 1, at most `rows`)."""
    return int(max(1, min(rows, STATS_BLOCK_BYTES // max(bytes_per_row, 1))))


def shift_stats(expert_load: np.ndarray, hot_frac: float = 0.1, history_window: int = 4) -> dict:
    """How far hot experts move, from expert loads [steps, micro_batches, layers, experts].

    - mb_hot_overlap / mb_corr: consecutive micro-batches of one step.
    - mb_vs_step_hot_overlap / mb_vs_step_corr: a micro-batch against its own step's total.
    - step_hot_overlap / step_corr: consecutive whole steps.
    - history_hot_overlap / history_corr: a step against the moving average of up to
      `history_window` previous steps (what a history-based balancer such as EPLB predicts from).
    - history_mb_hot_overlap: each micro-batch against that history prediction.
    Values are means; NaN where the trace is too short (one step, one micro-batch). Computed in blocks
    of steps and layers (STATS_BLOCK_BYTES).
    """
    return _shift_stats(lambda s0, s1, l0, l1: expert_load[s0:s1, :, l0:l1], expert_load.shape, hot_frac,
                        history_window)


def _shift_stats(block, shape: tuple, hot_frac: float = 0.1, history_window: int = 4) -> dict:
    """shift_stats over `block(s0, s1, l0, l1)` -> expert loads [s1 - s0, M, l1 - l0, E], taken a block of
    layers at a time and, within it, a block of steps at a time; the last `history_window` step totals of a
    layer block are carried from one step block to the next."""
    steps, mbs, layers, experts = shape
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}

    def add(key: str, values: np.ndarray) -> None:
        sums[key] = sums.get(key, 0.0) + float(values.sum())
        counts[key] = counts.get(key, 0) + values.size

    per_step_layer = mbs * experts * 8 * 4  # float64 loads and the block's temporaries
    cl = _block_rows(per_step_layer, layers)
    cs = _block_rows(per_step_layer * cl, steps)
    for l0 in range(0, layers, cl):
        l1 = min(layers, l0 + cl)
        history = np.zeros((0, l1 - l0, experts))  # the step totals before this block, at most history_window
        for s0 in range(0, steps, cs):
            s1 = min(steps, s0 + cs)
            el = block(s0, s1, l0, l1).astype(np.float64)  # [cs, M, cl, E]
            step = el.sum(axis=1)  # [cs, cl, E]
            if mbs > 1:
                add("mb_hot_overlap", hot_overlap(el[:, 1:], el[:, :-1], hot_frac))
                add("mb_corr", load_correlation(el[:, 1:], el[:, :-1]))
            add("mb_vs_step_hot_overlap", hot_overlap(el, step[:, None], hot_frac))
            add("mb_vs_step_corr", load_correlation(el, step[:, None]))
            series = np.concatenate([history, step])  # the carried totals, then this block's
            first = len(history) if s0 else 1  # step 0 has no predecessor
            if len(series) > first:
                now, before = series[first:], series[first - 1:-1]
                pred = history_prediction(series, history_window)[first - 1:]  # [n, cl, E]
                add("step_hot_overlap", hot_overlap(now, before, hot_frac))
                add("step_corr", load_correlation(now, before))
                add("history_hot_overlap", hot_overlap(now, pred, hot_frac))
                add("history_corr", load_correlation(now, pred))
                add("history_mb_hot_overlap", hot_overlap(el[first - len(history):], pred[:, None], hot_frac))
            history = series[-history_window:]
    out: dict[str, float] = {"hot_frac": hot_frac, "history_window": history_window}
    for key in ("mb_hot_overlap", "mb_corr", "mb_vs_step_hot_overlap", "mb_vs_step_corr", "step_hot_overlap",
                "step_corr", "history_hot_overlap", "history_corr", "history_mb_hot_overlap"):
        out[key] = sums[key] / counts[key] if counts.get(key) else float("nan")
    return out


def trace_stats(trace) -> dict:
    """A trace's summary statistics as plain JSON-serializable numbers: its size, static skewness and
    shift_stats.

    Computed in blocks of steps and layers (STATS_BLOCK_BYTES), never as whole-trace float copies,
    so memory stays near the size of the loads themselves.
    """
    s, m, l, ep, e = trace.loads.shape
    skew = np.empty((s, m, l))
    rows = _block_rows(m * l * e * 8, s)
    for s0 in range(0, s, rows):  # static contiguous placement: rank r homes experts [r E/ep, (r+1) E/ep)
        per_rank = trace.loads[s0:s0 + rows].reshape(-1, m, l, ep, ep, e // ep).sum(axis=(3, 5), dtype=np.int64)
        skew[s0:s0 + rows] = skewness(per_rank)
    out = {
        "model": trace.model.name,
        "ep": trace.ep,
        "steps": trace.num_steps,
        "micro_batches": trace.num_microbatches,
        "layers": trace.num_layers,
        "experts": trace.num_experts,
        "top_k": trace.model.top_k,
        "tokens_per_microbatch": trace.tokens_per_microbatch,
        "total_tokens": int(trace.loads[:, :, 0].sum(dtype=np.int64) // trace.model.top_k),
        "static_skewness": float(skew.mean()),
        "static_skewness_p95": float(np.percentile(skew, 95)),
        "provenance": trace.provenance,
    }
    out.update(_shift_stats(lambda s0, s1, l0, l1: trace.loads[s0:s1, :, l0:l1].sum(axis=3, dtype=np.int64),
                            (s, m, l, e)))
    return out



# ---- expert balance, and the kit's routing against public routing data ------------------------------------------

def microbatch_calibration(trace) -> dict:
    """A trace's micro-batch vs step and consecutive micro-batch load correlations (shift_stats), and its
    mean tokens per (micro-batch, EP rank): the first layer's selections over top-k."""
    stats = shift_stats(trace.loads.sum(axis=3, dtype=np.int64))
    return {"mb_vs_step_corr": float(stats["mb_vs_step_corr"]), "mb_corr": float(stats["mb_corr"]),
            "tokens_per_ep_rank": float((trace.loads[:, :, 0].sum(axis=-1) / trace.model.top_k).mean())}


def gini(x: np.ndarray) -> np.ndarray:
    """Gini coefficient of non-negative values along the last axis ([..., E] -> [...]): 0 when every entry is
    equal, (E - 1) / E when one entry holds everything; 0 where a row sums to 0."""
    x = np.sort(np.asarray(x, dtype=np.float64), axis=-1)
    e = x.shape[-1]
    total = x.sum(-1)
    ranks = np.arange(1, e + 1, dtype=np.float64)
    g = 2.0 * (x * ranks).sum(-1) / (e * np.where(total > 0, total, 1.0)) - (e + 1.0) / e
    return np.where(total > 0, g, 0.0)


def placement_skewness(load: np.ndarray, ep: int) -> np.ndarray:
    """Max over mean tokens per rank under static contiguous placement (rank r homes experts
    [r E/ep, (r + 1) E/ep), Megatron's): load [..., E] with ep dividing E -> [...]."""
    load = np.asarray(load, dtype=np.float64)
    e = load.shape[-1]
    if ep < 1 or e % ep:
        raise ValueError(f"placement_skewness: ep={ep} does not divide {e} experts")
    per_rank = load.reshape(*load.shape[:-1], ep, e // ep).sum(-1)
    mean = per_rank.mean(-1)
    return np.where(mean > 0, per_rank.max(-1) / np.where(mean > 0, mean, 1.0), 1.0)


def expert_balance(load: np.ndarray, eps=(16, 32)) -> dict:
    """How unevenly tokens fall on experts, from per-expert loads [..., E] (token counts or frequencies; each
    row is one layer of one unit: a data set, a step or a micro-batch). Means over the rows of:
    max_over_mean (hottest expert / mean expert), gini, hottest_share (hottest expert's share of the row's
    token-expert assignments) and skewness_ep{N} (placement_skewness) for each N in eps that divides E."""
    load = np.asarray(load, dtype=np.float64)
    e = load.shape[-1]
    rows = load.reshape(-1, e)
    rows = rows[rows.sum(-1) > 0]
    if not len(rows):
        raise ValueError("expert_balance: every row of the loads is empty")
    share = rows / rows.sum(-1, keepdims=True)
    out = {"max_over_mean": float((share.max(-1) * e).mean()), "gini": float(gini(rows).mean()),
           "hottest_share": float(share.max(-1).mean())}
    for ep in eps:
        out[f"skewness_ep{ep}"] = float(placement_skewness(rows, ep).mean()) if e % ep == 0 else float("nan")
    return out


PUBLIC_ROUTING_CSV = "data/public/qwen3-30b-a3b-instruct-2507_top8_frequency_en.csv"


def read_public_frequencies(path=None) -> dict[str, np.ndarray]:
    """The public per-layer top-8 selection frequencies (data/public/README.md): {data set: float64 [layers,
    experts]}, each row the mean number of times a prompt token picked each expert (rows sum to top-k)."""
    import pandas as pd

    from relibra.errors import ConfigError

    path = Path(__file__).resolve().parents[1] / PUBLIC_ROUTING_CSV if path is None else path
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot be read as the public routing CSV ({exc})") from None
    experts = [c for c in df.columns if c.startswith("expert_")]
    if list(df.columns[:2]) != ["dataset", "layer"] or not experts or experts != [f"expert_{i}" for i in
                                                                                   range(len(experts))]:
        raise ConfigError(f"{path}: columns must be dataset, layer, expert_0 .. expert_N")
    out = {}
    for name, d in df.groupby("dataset", sort=False):
        x = d.sort_values("layer")[experts].to_numpy(dtype=np.float64)
        if not np.isfinite(x).all() or (x < 0).any():
            raise ConfigError(f"{path}: data set {name!r} holds negative or non-finite frequencies")
        out[str(name)] = x
    return out


def routing_profile(expert_load: np.ndarray, eps=(16, 32)) -> dict:
    """A trace's expert balance at two levels and its micro-batch shift, from expert loads [S, M, L, E]:
    {"step": expert_balance of each step's total, "micro_batch": of each micro-batch, "mb_vs_step_corr",
    "mb_corr", "step_corr": from shift_stats}."""
    el = np.asarray(expert_load)
    shift = shift_stats(el)
    return {"step": expert_balance(el.sum(axis=1), eps), "micro_batch": expert_balance(el, eps),
            "mb_vs_step_corr": shift["mb_vs_step_corr"], "mb_corr": shift["mb_corr"], "step_corr": shift["step_corr"]}


def comparison_rows(traces: dict | None = None, public: dict | None = None, eps=(16, 32)) -> list[dict]:
    """The side-by-side rows of `relibra routing compare`: one per (source, level).

    traces: {label: RoutingTrace} (generated or real); public: read_public_frequencies() output (None: the
    shipped CSV; {}: none). A trace gives a step row and a micro-batch row (with its micro-batch shift);
    a public data set one data-set row (prompt tokens of ~500 prompts; no micro-batch view). "tokens": the
    mean tokens of one unit of the row (NaN where the source does not say)."""
    rows = []
    public = read_public_frequencies() if public is None else public
    for name, freq in public.items():
        rows.append({"source": f"public: Qwen3-30B-A3B-Instruct-2507, {name} (English prompts)", "level": "data set",
                     "experts": freq.shape[-1], "tokens": float("nan"), **expert_balance(freq, eps),
                     "mb_vs_step_corr": float("nan"), "mb_corr": float("nan"), "step_corr": float("nan")})
    for label, trace in (traces or {}).items():
        el = trace.expert_load()
        prof = routing_profile(el, eps)
        mb_tokens = el[:, :, 0].sum(-1) / trace.model.top_k  # [S, M] tokens of each micro-batch
        for level in ("step", "micro_batch"):
            nan = float("nan")
            shift = {"mb_vs_step_corr": prof["mb_vs_step_corr"], "mb_corr": prof["mb_corr"], "step_corr": nan} \
                if level == "micro_batch" else {"mb_vs_step_corr": nan, "mb_corr": nan, "step_corr": prof["step_corr"]}
            tokens = float(mb_tokens.mean() if level == "micro_batch" else mb_tokens.sum(1).mean())
            rows.append({"source": label, "level": level.replace("_", "-"), "experts": trace.num_experts,
                         "tokens": tokens, **prof[level], **shift})
    return rows
