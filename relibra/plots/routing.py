"""Figures of notebook 01: how routing moves between micro-batches and steps (synthetic traces)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from relibra.plots.style import titled

_MEAN_MARKER = {"marker": "D", "markerfacecolor": "white", "markeredgecolor": "black", "markersize": 4}  # box plots


def expert_load_heatmaps(table: pd.DataFrame, subtitle: str, max_experts: int = 128):
    """Heatmaps of expert load share (`table`: relibra.experiments.dynamics.expert_load_table's): micro-batches of
    one step (left) versus whole steps (right)."""
    mb, st = (table[table["scope"] == scope] for scope in ("micro-batch", "step"))
    step, layer = int(mb["step"].iloc[0]), int(mb["layer"].iloc[0])
    grid_mb, grid_st = (t.pivot(index=rows, columns="expert", values="share").iloc[:, :max_experts] * 100
                        for t, rows in ((mb, "micro_batch"), (st, "step")))
    vmax = float(max(grid_mb.values.max(), grid_st.values.max()))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1]})
    for ax, grid, ylabel, title in (
        (axes[0], grid_mb, f"micro-batch (within step {step})", f"each micro-batch of step {step}"),
        (axes[1], grid_st, "training step", "each whole step (sum of its micro-batches)"),
    ):
        sns.heatmap(grid, ax=ax, cmap="rocket_r", vmin=0, vmax=vmax, cbar_kws={"label": "share of token-slots (%)"},
                    xticklabels=max(1, grid.shape[1] // 16), yticklabels=max(1, grid.shape[0] // 16))
        ax.set_xlabel("expert id")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    return titled(fig, f"Expert load of MoE layer {layer}: per micro-batch (left) vs per whole step (right)", subtitle)


def trace_palette(traces) -> dict:
    """Colours of workloads (traces): cividis shades, which no policy uses."""
    traces = list(dict.fromkeys(traces))
    return dict(zip(traces, sns.color_palette("cividis", max(len(traces), 2))))


def shift_bars(table: pd.DataFrame, subtitle: str):
    """Bars of hot-expert overlap and load correlation per comparison, one colour per trace. Both
    panels show the same comparisons in the same order; one a metric does not cover says so."""
    order = ["consecutive micro-batches", "micro-batch vs its own step", "micro-batch vs history prediction",
             "consecutive steps", "step vs history prediction"]
    metrics = [("hot-expert overlap", "hot-expert overlap (share of top 10%)"),
               ("load correlation", "load correlation (Pearson)")]
    present = [o for o in order if o in set(table["comparison"])]
    ticks = [o.replace(" vs ", "\nvs ") for o in present]
    palette = trace_palette(table["trace"])
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.6))
    for ax, (metric, ylabel) in zip(axes, metrics):
        d = table[(table["metric"] == metric) & table["value"].notna()].copy()
        d["comparison"] = d["comparison"].str.replace(" vs ", "\nvs ", regex=False)
        sns.barplot(d, x="comparison", y="value", hue="trace", order=ticks, palette=palette, errorbar=None, ax=ax)
        for i, tick in enumerate(ticks):
            if tick not in set(d["comparison"]):
                ax.text(i, 0.02, "not\ndefined", ha="center", va="bottom", fontsize=7, color="0.4")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{metric} (1 = identical)")
        ax.tick_params(axis="x", labelsize=8)
        ax.get_legend().remove()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, title="trace", loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    return titled(fig, "How far hot experts shift: between micro-batches, between steps, and against a history "
                  "prediction (bars: mean over steps and layers)", subtitle)


def prediction_error_plot(table: pd.DataFrame, subtitle: str):
    """Box plots of prediction error (share of token-slots on the wrong experts) per predictor and target."""
    d = table.assign(case=table["predictor"] + " -> " + table["target"], error_pct=100 * table["error"])
    order = [o for o in ("history -> whole step", "history -> micro-batch", "this step (oracle) -> micro-batch")
             if o in set(d["case"])]
    fig, ax = plt.subplots(figsize=(10, 5.0))
    sns.boxplot(d, x="case", y="error_pct", hue="trace", order=order, ax=ax, showfliers=False, showmeans=True,
                palette=trace_palette(d["trace"]), meanprops=_MEAN_MARKER)
    ax.set_xlabel("predictor -> what it must predict")
    ax.set_ylabel("% of token-slots on wrong experts")
    ax.legend(title="workload", fontsize=7, title_fontsize=8)
    return titled(fig, "How wrong load predictions are: history (EPLB) and the exact step total (EPLB+) vs each "
                  "micro-batch (box: quartiles over steps, micro-batches and layers; diamond: mean)", subtitle)


def static_skewness_plot(table: pd.DataFrame, subtitle: str):
    """Distribution of rank skewness under static placement: per micro-batch versus per whole step."""
    fig, ax = plt.subplots(figsize=(10, 5))
    sns.boxplot(table, x="trace", y="skewness", hue="scope", ax=ax, showfliers=False, showmeans=True, palette="Greys",
                meanprops=_MEAN_MARKER)
    ax.axhline(1.0, color="0.3", lw=1, ls="--")
    ax.set_xlabel("workload")
    ax.set_ylabel("rank skewness (max / mean per GPU)")
    ax.legend(title="load summed over", fontsize=8)
    return titled(fig, "Static expert placement: rank skewness per micro-batch and per whole step (box: quartiles over "
                  "micro-batches and layers; diamond: mean)", subtitle)
