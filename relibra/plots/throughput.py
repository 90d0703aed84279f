"""Figures of notebooks 02-06: throughput, ablation, reordering, replication and skewness."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from relibra.labels import colour
from relibra.plots.style import (POLICY_COLORS, POLICY_LABELS, figure_policy_legend, legend_below, model_label,
                                 policy_hue, titled)

# ---- 02 throughput / 03 ablation ----------------------------------------------------------------
MODEL_MARKERS = ("o", "s", "^", "D", "v", "P")
MODEL_GREYS = ("0.25", "0.5", "0.72", "0.15", "0.6", "0.85")  # models, in greys: no policy's colour


def _ranked(d: pd.DataFrame, column: str) -> list[str]:
    """Policies by their mean `column`, highest first."""
    return list(d.groupby("policy")[column].mean().sort_values(ascending=False).index)


def _dots_and_means(ax, d: pd.DataFrame, column: str, order: list[str], marker_of=None) -> None:
    """One row per policy of `order` (top: first): a small dot per case (marker: model) and the
    policy's mean as a large marker in its colour with its value written beside it."""
    for y, policy in enumerate(order):
        rows = d[d["policy"] == policy]
        for model, g in rows.groupby("model", sort=False):
            ax.scatter(g[column], [y] * len(g), s=14, color="0.35", alpha=0.8,
                       marker=(marker_of or {}).get(model, "o"), zorder=2)
        mean = float(rows[column].mean())
        ax.scatter([mean], [y], s=110, color=colour(policy), edgecolor="black", lw=0.6, zorder=3)
        ax.annotate(f"{mean:.3f}", (mean, y), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
    ax.set_yticks(range(len(order)), [POLICY_LABELS.get(p, p) for p in order])
    ax.set_ylim(len(order) - 0.5, -0.7)


def throughput_bars(table: pd.DataFrame, subtitle: str):
    """Tokens/s over Megatron's: one panel per model, one row per policy sorted by its mean speed-up
    (large marker, in the policy's colour, with its value), a small dot per workload. The x axis spans
    the data, so differences of a percent stay visible; the line at 1.0 is Megatron."""
    models = list(dict.fromkeys(table["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(4.4 * len(models) + 2.2, 0.42 * table["policy"].nunique() + 1.8),
                             sharey=True, squeeze=False)
    order = _ranked(table, "speedup_vs_megatron")
    for ax, model in zip(axes[0], models):
        _dots_and_means(ax, table[table["model"] == model], "speedup_vs_megatron", order)
        ax.axvline(1.0, color="0.2", lw=1)
        ax.set_title(model_label(model).replace(" (", "\n(", 1), fontsize=9)
        ax.set_xlabel("throughput / Megatron's (tokens/s ratio)")
    return titled(fig, "Training throughput over Megatron's, per policy (large marker: mean over workloads; dots: one "
                  "workload each; policies sorted by mean)", subtitle)


def fraction_of_balanced(table: pd.DataFrame, subtitle: str):
    """Tokens/s as a fraction of the balanced ideal, one row per policy sorted by its mean (large
    marker), a small dot per (model, workload) case with the model as the dot's shape."""
    d = table[~table["policy"].isin(("balanced", "balanced-compute"))]
    models = list(dict.fromkeys(d["model"]))
    markers = dict(zip(models, MODEL_MARKERS))
    order = _ranked(d, "frac_of_balanced")
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(order) + 1.9))
    _dots_and_means(ax, d, "frac_of_balanced", order, markers)
    ax.axvline(1.0, color="0.2", ls="--", lw=1)
    ax.text(1.0, len(order) - 0.6, " balanced ideal", ha="left", va="bottom", fontsize=8)
    ax.set_xlabel("throughput / the balanced ideal's (tokens/s ratio)")
    handles = [plt.Line2D([], [], ls="", marker=markers[m], color="0.35", label=model_label(m)) for m in models]
    fig.legend(handles=handles, title="dots: one workload of model", fontsize=7, title_fontsize=8, loc="upper center",
               bbox_to_anchor=(0.5, 0.0), ncol=min(3, len(models)), frameon=False)
    return titled(fig, "How close each policy gets to the balanced ideal (large marker: mean over models and "
                  "workloads; policies sorted by mean)", subtitle)


ABLATION_STAGES = {"megatron": "Megatron\n(static)", "relibra-reorder": "+ reordering",
                   "relibra-replicate": "+ replication\n(static homes)", "relibra": "+ reordering\n+ replication",
                   "balanced": "Balanced\n(ideal)"}


def ablation_plot(table: pd.DataFrame, subtitle: str):
    """Left: speedup over Megatron per ablation stage (x) and model (hue); right: rank skewness."""
    stages = [p for p in ABLATION_STAGES if p in set(table["policy"])]
    d = table[table["policy"].isin(stages)].copy()
    d["stage"] = d["policy"].map(ABLATION_STAGES)
    order = [ABLATION_STAGES[p] for p in stages]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    greys = dict(zip(dict.fromkeys(d["model"]), MODEL_GREYS))
    for ax, col, line, ylabel, title in (
            (axes[0], "speedup_vs_megatron", {}, "throughput / Megatron's (tokens/s ratio)", "throughput"),
            (axes[1], "skewness", {"ls": "--"}, "rank skewness (max / mean tokens per GPU)", "rank skewness")):
        sns.barplot(d, x="stage", y=col, hue="model", order=order, ax=ax, palette=greys, errorbar=("pi", 100))
        ax.axhline(1.0, color="0.2", lw=1, **line)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    for ax in axes:
        ax.set_xlabel("")
        ax.get_legend().remove()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, [model_label(m) for m in labels], title="model", fontsize=8, title_fontsize=8,
               loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=min(3, len(labels)))
    return titled(fig, "Ablation: what reordering and replication each add (bars: mean over workloads; whiskers: "
                  "range)", subtitle)


# ---- 04 reordering / 05 replication ---------------------------------------------------------------
def _workload_panels(table: pd.DataFrame, panels, grid: tuple[int, int], figsize, heading: str, subtitle: str):
    """Bars per workload (x) and policy (hue; the ideals left out), one panel per (column, y label,
    title) of `panels` on a `grid` (rows, columns) of axes: the mean over steps and layers, whiskers their
    range (deterministic, unlike a bootstrap interval); a line at 1.0 on the first panel (Megatron's
    throughput) and a dashed one on the second (perfect balance); one policy legend for the figure."""
    fig, axes = plt.subplots(*grid, figsize=figsize)
    axes = axes.ravel()
    order, palette = policy_hue(table["policy"].unique())
    order = [p for p in order if p not in ("balanced", "balanced-compute")]
    d = table[table["policy"].isin(order)]
    for ax, (col, ylabel, title) in zip(axes, panels):
        sns.barplot(d, x="workload", y=col, hue="policy", hue_order=order, palette=palette, ax=ax,
                    errorbar=("pi", 100), err_kws={"linewidth": 1})
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_xlabel("workload")
        ax.tick_params(axis="x", rotation=30)
        ax.get_legend().remove()
    axes[0].axhline(1.0, color="0.2", lw=1)
    axes[1].axhline(1.0, color="0.2", ls="--", lw=1)
    figure_policy_legend(fig, axes[0])
    return titled(fig, heading, subtitle)


def reorder_plot(table: pd.DataFrame, subtitle: str):
    """Four panels per policy: speedup over Megatron, node skewness, cross-node token share, migration GB."""
    panels = [("speedup_vs_megatron", "throughput / Megatron's", "throughput (tokens/s ratio)"),
              ("node_skewness", "node skewness (max / mean)", "balance across nodes: max / mean tokens per node"),
              ("cross_node_share", "share crossing nodes", "inter-node traffic: share of token-expert pairs"),
              ("migration_gb", "migration per step (GB)", "migration: expert weights + optimizer state moved")]
    return _workload_panels(table, panels, (2, 2), (13, 7.5), "Reordering: annealing search vs greedy LPT vs static "
                            "homes (the three ReLibra variants all replicate inside nodes; Megatron: static homes, no "
                            "replicas; bars: mean over steps, whiskers: their range)", subtitle)


def replication_plot(table: pd.DataFrame, subtitle: str):
    """Speedup over Megatron, GPU skewness and replicas used per GPU, per workload and policy."""
    panels = [("speedup_vs_megatron", "throughput / Megatron's", "throughput (tokens/s ratio)"),
              ("gpu_skewness", "rank skewness (max / mean)", "balance: max / mean tokens per GPU"),
              ("replicas_per_gpu", "replicas per GPU", "replicas held per GPU, per micro-batch x layer")]
    return _workload_panels(table, panels, (1, 3), (15, 4.2), "Replication: joint replica placement + token split "
                            "vs reordering only (no replicas) vs splitting only (one bar per workload: its mean over "
                            "steps and layers)", subtitle)


def spare_slot_plot(sweep: pd.DataFrame, subtitle: str):
    """ReLibra's speedup, skewness and replica memory share against spare slots per GPU."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.0))
    x, dflt = sweep["spare_slots_per_gpu"], sweep[sweep["default"]]
    for ax, col, ylabel, pct in ((axes[0], "speedup_vs_megatron", "throughput / Megatron's", False),
                                 (axes[1], "skewness", "rank skewness (max / mean)", False),
                                 (axes[2], "replica_memory_share_full_model", "replica buffer / parameters (%)", True)):
        y = sweep[col] * (100 if pct else 1)
        ax.plot(x, y, marker="o", color=POLICY_COLORS["relibra"], label="ReLibra")
        if len(dflt):
            ax.scatter(dflt["spare_slots_per_gpu"], y[sweep["default"]], s=120,
                       facecolors="none", edgecolors="0.1", zorder=3, label="kit default")
        for xi, yi in zip(x, y):
            ax.annotate(f"{yi:.3f}", (xi, yi), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7)
        # Ratios start at 1.0 (Megatron / perfect balance) and memory at 0, so that a spread of a
        # few thousandths looks like what it is instead of filling the axis.
        floor = 0.0 if pct else 1.0
        lo, hi = min(floor, float(y.min())), max(floor, float(y.max()))
        pad = 0.15 * max(hi - lo, 0.05 * max(abs(hi), 1e-9))
        ax.set_ylim(lo if pct else lo - pad, hi + pad)
        ax.set_xlabel("spare replica slots per GPU")
        ax.set_ylabel(ylabel)
        ax.set_xticks(list(x))
    # one legend under the panels, off the lines
    return legend_below(fig, axes[0], "ReLibra vs the number of spare replica slots per GPU (mean over the workload's "
                        "steps; replica buffer counted against the whole model's parameters)", subtitle,
                        0.35 / fig.get_figheight(), fontsize=7)


# ---- 06 skewness --------------------------------------------------------------------------------
def skewness_plot(table: pd.DataFrame, subtitle: str):
    """Left: mean rank skewness vs EP size per policy; right: per task domain at one EP size."""
    order, palette = policy_hue(table["policy"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.3), sharey=True)  # one scale: both panels from 0
    ep = table[table["sweep"] == "ep"]
    sns.lineplot(ep, x="ep", y="skewness", hue="policy", hue_order=order, palette=palette, marker="o", ax=axes[0])
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(sorted(ep["ep"].unique()), [str(v) for v in sorted(ep["ep"].unique())])
    axes[0].set_xlabel("EP size (GPUs per expert-parallel group)")
    axes[0].set_title(f"across EP sizes ({ep['workload'].iloc[0] if len(ep) else ''} workload)")
    dom = table[table["sweep"] == "workload"]
    sns.barplot(dom, x="workload", y="skewness", hue="policy", hue_order=order, palette=palette, ax=axes[1],
                errorbar=None)
    axes[1].set_xlabel("workload (task domain)")
    axes[1].set_title(f"across domains (EP {dom['ep'].iloc[0] if len(dom) else ''})")
    for ax in axes:
        ax.axhline(1.0, color="0.2", ls="--", lw=1)
        ax.set_ylabel("rank skewness (max / mean tokens per GPU)")
        ax.get_legend().remove()
    axes[0].set_ylim(bottom=0)
    figure_policy_legend(fig, axes[0])
    return titled(fig, "Rank skewness per policy (mean over micro-batches and layers; 1.0 = perfectly balanced)",
                  subtitle)
