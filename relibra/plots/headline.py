"""Figures of notebook 02's headline: the kit's ratios per case with their spread over seeds, and the
ratios against the tokens per micro-batch for the token-budget and one-sequence families."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from relibra.labels import CLAIMS
from relibra.plots.style import model_label, titled

# The two families of the budget sweep and the ratio panels, in drawing order.
FAMILY_STYLE = {"token-budget": ("#1f77b4", "o", "-"), "one sequence per micro-batch": ("#d62728", "s", "--")}
RATIO_PANELS = tuple((c.id, c.verdict_label, c.paper, c.level) for c in (CLAIMS["relibra_over_megatron"],
                                                                          CLAIMS["relibra_over_eplb_plus"]))


def headline_cases_plot(ratios: pd.DataFrame, subtitle: str):
    """One panel per ratio: per model (colour) and workload (x), the mean over seeds as a dot and the
    range over seeds as a bar; the paper's "up to" as a dashed line.

    ratios: one row per (model, workload, seed) with relibra_over_megatron and relibra_over_eplb_plus.
    """
    models = list(dict.fromkeys(ratios["model"]))
    workloads = list(dict.fromkeys(ratios["workload"]))
    colors = plt.get_cmap("viridis")(np.linspace(0.1, 0.8, len(models)))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), squeeze=False)
    width = 0.8 / max(1, len(models))
    for ax, (col, label, paper, paper_x) in zip(axes[0], RATIO_PANELS):
        for i, (model, color) in enumerate(zip(models, colors)):
            d = ratios[ratios["model"] == model].groupby("workload")[col].agg(["mean", "min", "max"]).reindex(workloads)
            x = np.arange(len(workloads)) + (i - (len(models) - 1) / 2) * width
            ax.errorbar(x, d["mean"], yerr=[d["mean"] - d["min"], d["max"] - d["mean"]], fmt="o", color=color,
                        capsize=3, label=model_label(model))
        ax.axhline(paper_x, color="0.3", ls="--", lw=1)
        ax.text(0.99, paper_x, f"paper: {paper}", ha="right", va="bottom", fontsize=8,
                transform=ax.get_yaxis_transform())
        ax.axhline(1.0, color="0.2", lw=0.8)
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, max(hi, paper_x + 0.1 * (max(hi, paper_x) - lo)))  # room above the line for its label
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_xlabel("workload")
        ax.set_ylabel("tokens/s ratio")
        ax.set_title(label, fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(3, len(labels)), frameon=False,
               title="model (dot: mean over seeds, bar: range over seeds)", title_fontsize=8,
               bbox_to_anchor=(0.5, -0.02))
    return titled(fig, "The headline: ReLibra's throughput over Megatron and over EPLB+ with oracle loads", subtitle,
                  rect=(0, 0.12, 1, 1))


def budget_plot(sweep: pd.DataFrame, subtitle: str):
    """ReLibra / Megatron and ReLibra / EPLB+ against the tokens per micro-batch and EP rank, one line per
    family (token-budget packing, one sequence per micro-batch).

    sweep: relibra.studies.throughput.budget_ratios rows with a `family` column; with none (a recorded
    trace fixes its own batch) the panels say so and the subtitle says why.
    """
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), squeeze=False)
    for ax, (col, label, paper, _) in zip(axes[0], RATIO_PANELS):
        if sweep.empty:
            ax.text(0.5, 0.5, "no budget sweep (the subtitle says why)", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_axis_off()
            ax.set_title(f"{label}; paper: {paper}", fontsize=10)
            continue
        for family, (color, marker, ls) in FAMILY_STYLE.items():
            d = sweep[sweep["family"] == family].sort_values("tokens_per_microbatch")
            if d.empty:
                continue
            ax.plot(d["tokens_per_microbatch"], d[col], marker=marker, ls=ls, color=color, label=family)
        ax.axhline(1.0, color="0.2", lw=0.8)
        ax.set_xscale("log", base=2)
        ticks = sorted(sweep["tokens_per_microbatch"].unique())
        ax.set_xticks(ticks, [f"{t // 1024}k" for t in ticks])
        ax.set_xlabel("tokens per micro-batch and rank")
        ax.set_ylabel("tokens/s ratio")
        ax.set_title(f"{label}; paper: {paper}", fontsize=10)
    if not sweep.empty:
        axes[0][0].legend(fontsize=8, loc="best")
    return titled(fig, "How the batch layout and its micro-batch size move the headline ratios (token-budget: the "
                  "budget; one sequence per micro-batch: sequences scaled to that mean)", subtitle, w_pad=3.0)
