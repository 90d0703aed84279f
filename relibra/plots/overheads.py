"""Figures of notebook 07: planner time, memory and the other overheads."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.patches import Patch

from relibra.plots.style import POLICY_LABELS, policy_rows, titled


# ---- 07 overheads ------------------------------------------------------------------------------
def planner_time_plot(table: pd.DataFrame, subtitle: str):
    """Planner wall seconds per step (measured) next to the simulated forward window, log scale."""
    d, palette = policy_rows(table, drop=("megatron", "balanced", "balanced-compute"))
    fig, ax = plt.subplots(figsize=(9, 4.4))
    x = np.arange(len(d))
    w = 0.38
    ax.bar(x - w / 2, d["plan_s"], w, color=[palette[p] for p in d["policy"]], edgecolor="0.2", lw=0.6)
    ax.bar(x + w / 2, d["forward_s"], w, color="0.88", edgecolor="0.4", hatch="//", lw=0.6)
    for xi, (p, crit) in enumerate(zip(d["plan_s"], d["planner_on_critical_path"])):
        if crit:
            ax.text(xi - w / 2, p, "on critical\npath", ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(x, [POLICY_LABELS.get(p, p) for p in d["policy"]], rotation=20, ha="right")
    ax.set_ylabel("seconds per training step (log)")
    ax.set_ylim(top=ax.get_ylim()[1] * 8)  # room for the legend above the bars
    ax.legend([Patch(facecolor="white", edgecolor="0.2"), Patch(facecolor="0.88", edgecolor="0.4", hatch="//")],
              ["left bar (the policy's colour): planner, measured wall seconds per step",
               "right bar: one forward pass, simulated: the window it hides behind"],
              fontsize=8, loc="upper left", ncol=1)
    return titled(fig, "Planner time per step vs the forward pass it hides behind",
                  f"planner: measured ({d['planner_hardware'].iloc[0]}) | window: {subtitle}")


def overhead_bars(table: pd.DataFrame, subtitle: str):
    """Migration share of step time, replica memory share, transfer overlap per policy (percent)."""
    d, palette = policy_rows(table, drop=("megatron", "balanced", "balanced-compute"))
    panels = [("migration_share", "% of step time", "migration share (paper: 1.4-2.1%)"),
              ("replica_memory_share_full_model", "% of parameter memory per GPU",
               "replica memory, whole model (paper: 0.13-1.62%)"),
              ("transfer_overlap", "% of replica transfers hidden", "transfer overlap")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    crit = (d["transfers_on_critical_path"] if "transfers_on_critical_path" in d else
            d["planner_on_critical_path"]).astype(bool)
    for ax, (col, ylabel, title) in zip(axes, panels):
        vals = 100 * d[col].astype(float).fillna(0.0)
        ax.bar(np.arange(len(d)), vals, color=[palette[p] for p in d["policy"]])
        for xi, (v, raw, c) in enumerate(zip(vals, d[col], crit)):
            text = ("n/a" if pd.isna(raw) else "0: moved on the\ncritical path" if col == "transfer_overlap" and c
                    and v == 0 else f"{v:.2f}\nheld for every layer\nuntil backward" if c and col.startswith(
                        "replica_memory") and v > 0 else f"{v:.2f}")
            ax.text(xi, v, text, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(np.arange(len(d)), [POLICY_LABELS.get(p, p) for p in d["policy"]], rotation=25, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.25)  # room for the bars' labels
    notes = []
    if d["transfer_overlap"].isna().any():
        notes.append("n/a: the policy moves no replica weights")
    if crit.any():
        notes.append("a policy that fetches replica weights on the critical path (" + ", ".join(
            POLICY_LABELS.get(p, p) for p in d.loc[crit, "policy"]) + ") hides none of them, and autograd keeps "
            "every layer's fetched copies until backward, hence its replica memory")
    return titled(fig, "Overheads per policy" + (f" ({'; '.join(notes)})" if notes else ""), subtitle)


def policy_summary_plot(summary: pd.DataFrame, subtitle: str, title: str, components: pd.DataFrame):
    """Speedup over Megatron and rank skewness per policy for one trace, and a third panel stacking each
    policy's simulated step time by part (`components`: seconds per step by part and policy,
    relibra.experiments.text.step_components), which shows why lower skewness can still run slower."""
    d, palette = policy_rows(summary)
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.6))
    comp = components.drop(columns=["step"]).reindex(d["policy"])
    bottom = np.zeros(len(comp))
    for color, col in zip(sns.color_palette("Set2", len(comp.columns)), comp.columns):
        vals = 1e3 * comp[col].to_numpy(dtype=float)
        axes[2].bar(np.arange(len(comp)), vals, bottom=bottom, color=color, label=col)
        bottom += vals
    axes[2].set_xticks(np.arange(len(comp)), [POLICY_LABELS.get(p, p) for p in comp.index], rotation=25, ha="right")
    axes[2].set_ylabel("simulated ms per training step")
    axes[2].set_title("step time by part")
    axes[2].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for ax, col, ylabel, name in ((axes[0], "speedup_vs_megatron", "throughput / Megatron's (tokens/s)", "throughput"),
                                  (axes[1], "skewness", "rank skewness (max / mean tokens)", "rank skewness")):
        ax.set_title(name)
        ax.bar(np.arange(len(d)), d[col], color=[palette[p] for p in d["policy"]])
        ax.axhline(1.0, color="0.2", ls="--", lw=1)
        ax.set_xticks(np.arange(len(d)), [POLICY_LABELS.get(p, p) for p in d["policy"]], rotation=25, ha="right")
        ax.set_ylabel(ylabel)
    return titled(fig, f"{title}: throughput and rank skewness per policy", subtitle)
