"""Figure of notebook 10: the tornado of the headline ratios, one knob at a time around the default."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from relibra.labels import RATIO_LABELS
from relibra.plots.style import titled

KNOB_UNITS = {"tokens per slot": "tokens", "topic concentration": "Dirichlet", "spare slots": "per GPU",
              "NVLink rate": "GB/s", "RDMA rate": "GB/s", "GEMM half-saturation": "tokens",
              "sequence length": "x generator's"}
LOW_COLOR, HIGH_COLOR = (0.27, 0.51, 0.71), (0.84, 0.37, 0.30)


def value_label(value) -> str:
    """A knob value as shown at a bar's end: numbers in %g, names as they are."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return f"{float(value):g}"
    return str(value)


def knob_label(knob: str) -> str:
    unit = KNOB_UNITS.get(knob)
    return f"{knob} ({unit})" if unit else knob


def tornado_plot(table: pd.DataFrame, subtitle: str):
    """One panel per ratio: per knob, a bar from the lowest to the highest ratio over the knob's values,
    split at the default set-up's ratio (vertical line); blue: the part below the default, red: above;
    each end names the knob value that gives it. Knobs sorted by swing, the largest on top.

    table: relibra.experiments.sensitivity.tornado_table (ratio, knob, default, low, high, low_value,
    high_value, swing).
    """
    ratios = [r for r in RATIO_LABELS if r in set(table["ratio"])]
    n_knobs = table["knob"].nunique()
    height = max(3.4, 1.8 + 0.5 * n_knobs)
    fig, axes = plt.subplots(1, len(ratios), figsize=(5.2 * len(ratios), height), squeeze=False)
    for ax, ratio in zip(axes[0], ratios):
        d = table[table["ratio"] == ratio].sort_values("swing", ascending=True, kind="stable")
        y = np.arange(len(d))
        default = float(d["default"].iloc[0])
        ax.barh(y, d["low"] - default, left=default, color=LOW_COLOR, height=0.6, label="below the default")
        ax.barh(y, d["high"] - default, left=default, color=HIGH_COLOR, height=0.6, label="above the default")
        ax.axvline(default, color="0.15", lw=1.0)
        lo, hi = float(d["low"].min()), float(d["high"].max())
        pad = max(hi - lo, 1e-3 * max(abs(default), 1.0)) * 0.35
        ax.set_xlim(lo - pad, hi + pad)
        if lo - pad < 1.0 < hi + pad:
            ax.axvline(1.0, color="0.55", lw=0.8, ls="--")
        for yi, row in zip(y, d.itertuples()):
            if row.swing == 0:
                ax.plot([default], [yi], "o", color="0.3", ms=3)
                ax.text(default, yi + 0.32, "no change", ha="center", va="bottom", fontsize=7, color="0.3")
                continue
            if row.low < default:
                ax.text(row.low, yi, value_label(row.low_value) + " ", ha="right", va="center", fontsize=7)
            if row.high > default:
                ax.text(row.high, yi, " " + value_label(row.high_value), ha="left", va="center", fontsize=7)
        ax.set_yticks(y, [knob_label(k) for k in d["knob"]])
        ax.set_xlabel(f"{RATIO_LABELS[ratio]} (tokens/s ratio)")
        ax.set_title(f"{RATIO_LABELS[ratio]}: default {default:.3f}")
    from matplotlib.lines import Line2D

    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += [Line2D([], [], color="0.15", lw=1.0), Line2D([], [], color="0.55", lw=0.8, ls="--")]
    labels += ["default set-up", "1.0 (parity)"]
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize=8,
               title="ratio at the knob value named at each bar's end", title_fontsize=8)
    titled(fig, "Sensitivity of the headline ratios: one knob at a time around the default", subtitle)
    fig.tight_layout(rect=(0, 0.75 / height, 1, 1))
    return fig
