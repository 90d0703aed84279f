"""Figure of notebook 10: the tornado of the headline ratios, one knob at a time around the default."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from relibra.labels import RATIO_LABELS, knob_value
from relibra.plots.style import titled

KNOB_UNITS = {"tokens per micro-batch": "tokens", "data-parallel size": "ranks", "topic concentration": "Dirichlet",
              "spare slots": "per GPU", "NVLink rate": "GB/s", "RDMA rate": "GB/s", "GEMM rate": "TFLOP/s",
              "GEMM half-saturation": "tokens", "attention efficiency": "of the GEMM rate",
              "collective latency": "s", "sequence length": "x the card's"}
LOW_COLOR, HIGH_COLOR = (0.27, 0.51, 0.71), (0.84, 0.37, 0.30)


def tornado_plot(table: pd.DataFrame, subtitle: str):
    """One panel per ratio: per knob, a bar from the lowest to the highest ratio over the knob's values,
    as % change from the default set-up's ratio (vertical line at 0); blue: below the default, red:
    above; each end names the knob value that gives it. Every panel has the same x scale, so equal
    lengths mean equal relative changes. Knobs sorted by swing, the largest on top.

    table: relibra.studies.sensitivity.tornado_table (ratio, knob, default, low, high, low_value,
    high_value, swing).
    """
    ratios = [r for r in RATIO_LABELS if r in set(table["ratio"])]
    height = max(3.6, 2.0 + 0.55 * table["knob"].nunique())
    rel = table.assign(lo=100 * (table["low"] / table["default"] - 1), hi=100 * (table["high"] / table["default"] - 1))
    span = max(float(rel["hi"].max()), -float(rel["lo"].min()), 0.5)
    fig, axes = plt.subplots(1, len(ratios), figsize=(5.6 * len(ratios), height), squeeze=False)
    for ax, ratio in zip(axes[0], ratios):
        d = rel[rel["ratio"] == ratio].sort_values("swing", ascending=True, kind="stable")
        y = np.arange(len(d))
        default = float(d["default"].iloc[0])
        ax.barh(y, d["lo"], color=LOW_COLOR, height=0.6, label="below the default")
        ax.barh(y, d["hi"], color=HIGH_COLOR, height=0.6, label="above the default")
        ax.axvline(0.0, color="0.15", lw=1.0)
        ax.set_xlim(-1.9 * span, 1.9 * span)  # room for the value names at the bars' ends
        if -1.9 * span < 100 * (1 / default - 1) < 1.9 * span:
            ax.axvline(100 * (1 / default - 1), color="0.55", lw=0.8, ls="--")
        for yi, row in zip(y, d.itertuples()):
            if row.swing == 0:
                ax.plot([0], [yi], "o", color="0.3", ms=3)
                ax.text(0, yi + 0.32, "no change", ha="center", va="bottom", fontsize=7, color="0.3")
                continue
            if row.lo < 0:
                ax.text(row.lo, yi, knob_value(row.low_value, row.knob) + " ", ha="right", va="center", fontsize=7)
            if row.hi > 0:
                ax.text(row.hi, yi, " " + knob_value(row.high_value, row.knob), ha="left", va="center", fontsize=7)
        ax.set_yticks(y, [f"{k} ({KNOB_UNITS[k]})" if k in KNOB_UNITS else k for k in d["knob"]])
        ax.set_xlabel(f"{RATIO_LABELS[ratio]}: % change from the default")
        ax.set_title(f"{RATIO_LABELS[ratio]}: default {default:.3f}")
    for ax in axes[0][1:]:
        ax.tick_params(axis="y", labelsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += [Line2D([], [], color="0.15", lw=1.0), Line2D([], [], color="0.55", lw=0.8, ls="--")]
    labels += ["default set-up", "ratio 1.0 (parity)"]
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize=8,
               title="ratio at the knob value named at each bar's end", title_fontsize=8)
    return titled(fig, "Sensitivity of the headline ratios: one knob at a time around the default (same % scale in "
                  "every panel)", subtitle, rect=(0, 0.85 / height, 1, 1))
