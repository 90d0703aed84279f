"""Figures of notebooks 08 and 09: measured runs (the CPU runtime, the RL workload) beside the simulator."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.patches import Patch

from relibra.plots.style import POLICY_COLORS, POLICY_LABELS, legend_below, policy_hue, policy_order, titled


# ---- 09 RL workload ------------------------------------------------------------------------------
def reward_plot(rewards: pd.DataFrame, subtitle: str):
    """Mean reward and share of solved responses per GRPO step (left), seconds per step (right)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    ax = axes[0]
    ax.plot(rewards["step"], rewards["reward"], marker="o", ms=3, color=POLICY_COLORS["relibra"], label="mean reward")
    if "solved" in rewards:
        ax.plot(rewards["step"], rewards["solved"], marker="s", ms=3, color=POLICY_COLORS["eplb"],
                label="share of responses fully solved")
    if len(rewards) >= 5:
        smooth = rewards["reward"].rolling(5, min_periods=1, center=True).mean()
        ax.plot(rewards["step"], smooth, color="0.2", lw=1, ls="--", label="mean reward, 5-step average")
    ax.set_ylabel("reward (0-1, verifier score)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("reward")
    ax = axes[1]
    ax.bar(rewards["step"], rewards["seconds"], color="0.6")
    ax.set_ylabel("wall s per step (rollout + train)")
    ax.set_title("time per step")
    for ax in axes:
        ax.set_xlabel("GRPO step")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    return titled(fig, "The real RL run: reward over GRPO steps", subtitle)


# ---- 08 runtime --------------------------------------------------------------------------------
WAIT_COLOR = "0.25"


def runtime_step_segments_plot(segments: pd.DataFrame, subtitle: str, waiting: str):
    """One panel per policy: its whole training step split into segments, the measured seconds (bar in
    the policy's colour; waiting for the other ranks dark, as its own segment) beside the simulator's
    for the same segment (hatched). segments: runtime.measure.segment_frame rows (policy, segment,
    source, seconds[, repeat]); several launches: the median over launches, whiskers min-max."""
    g = segments.groupby(["policy", "segment", "source"], sort=False)["seconds"].agg(["median", "min", "max"])
    policies = policy_order(segments["policy"].unique())
    names = list(dict.fromkeys(segments["segment"]))
    fig, axes = plt.subplots(1, len(policies), figsize=(6.2 * len(policies), 0.5 * len(names) + 2.4), squeeze=False,
                             sharex=True)
    y = np.arange(len(names) + 1)[::-1]  # the whole step on top
    h = 0.38
    for ax, p in zip(axes[0], policies):
        color = POLICY_COLORS.get(p, "0.5")
        colors = [color] + [WAIT_COLOR if name == waiting else color for name in names]
        mine = segments[segments["policy"] == p]
        totals = {src: mine[mine["source"] == src].groupby("segment")["seconds"].median().sum()
                  for src in ("measured", "simulated")}
        for src, off, hatch in (("measured", h / 2, None), ("simulated", -h / 2, "//")):
            # the whole step, then each segment: median, min, max over launches (NaN where a source has none)
            v = {c: np.array([totals[src], *g[c].reindex([(p, name, src) for name in names])]) for c in g}
            ms = 1e3 * v["median"]
            err = 1e3 * np.array([v["median"] - v["min"], v["max"] - v["median"]])
            ax.barh(y + off, ms, h, xerr=np.nan_to_num(err), color=colors, hatch=hatch, edgecolor="0.2",
                    alpha=1.0 if src == "measured" else 0.5, capsize=2, error_kw={"lw": 0.8})
            for yi, v in zip(y + off, ms):
                ax.annotate("n/a" if np.isnan(v) else f"{v:.0f}", (0 if np.isnan(v) else v, yi), xytext=(3, 0),
                            textcoords="offset points", va="center", fontsize=7)
        ax.set_yticks(y, ["whole step"] + names)
        ax.set_xlabel("ms per training step (mean over ranks, median over timed steps)")
        ax.set_title(POLICY_LABELS.get(p, p))
    fig.legend([Patch(facecolor="0.6", edgecolor="0.2"), Patch(facecolor="0.8", edgecolor="0.2", hatch="//"),
                Patch(facecolor=WAIT_COLOR, edgecolor="0.2")],
               ["measured (upper bar)", "simulated (lower bar, hatched)",
                f"{waiting}: measured at a barrier before each all-to-all and transfer; the simulator has no such "
                "segment (it charges the slowest GPU's work instead)"],
               loc="lower center", bbox_to_anchor=(0.5, -0.02), ncol=1, fontsize=8)
    return titled(fig, "Where a training step goes, measured beside simulated, per policy", subtitle,
                  rect=(0, 0.09, 1, 1))


def runtime_speedup_plot(results: pd.DataFrame, subtitle: str, recorded: pd.DataFrame | None = None):
    """Speed-up over Megatron per launch (median step ratio, bar: paired bootstrap 95% interval) with the
    simulator's ratio for the same plans (diamond). results: runtime.measure.summary_frame rows with
    `repeat` (this run's launches); recorded: the same columns with `nodes_x_ranks` and `launch` (the
    shipped reference measurement), drawn after them."""
    rows = [(f"this run, launch {int(r['repeat']) + 1}", r)
            for _, r in results[results["policy"] != "megatron"].iterrows()]
    if recorded is not None and "speedup_ci_low" in recorded:
        rows += [(f"reference {r['nodes_x_ranks']}, launch {int(r['launch']) + 1}", r)
                 for _, r in recorded[recorded["policy"] != "megatron"].iterrows()]
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(rows) + 2.0))
    for i, (name, r) in enumerate(rows):
        color = POLICY_COLORS.get(r["policy"], "0.5")
        ax.errorbar(r["speedup_vs_megatron"], i, xerr=[[r["speedup_vs_megatron"] - r["speedup_ci_low"]],
                                                       [r["speedup_ci_high"] - r["speedup_vs_megatron"]]],
                    fmt="o", color=color, capsize=4, label="measured (95% CI)" if i == 0 else None)
        ax.plot(r["sim_speedup_vs_megatron"], i, "D", color="0.2", mfc="none",
                label="simulated" if i == 0 else None)
    ax.axvline(1.0, color="0.5", lw=1, ls="--")
    ax.set_yticks(range(len(rows)), [f"{n}\n{POLICY_LABELS.get(r['policy'], r['policy'])}" for n, r in rows],
                  fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("Megatron's median step / the policy's (x)")
    # the legend under the panel, where it can cover no row's interval
    return legend_below(fig, ax, "Speed-up over Megatron: measured with its 95% interval, and simulated", subtitle,
                        0.6 / fig.get_figheight())


def runtime_rank_plot(measured: pd.DataFrame, subtitle: str):
    """Measured expert-compute seconds per rank and policy (forward + backward, mean over steps).
    measured: relibra metric rows with `repeat`."""
    d = measured[measured["component"] == "expert_compute"]
    d = d.groupby(["policy", "repeat", "step", "rank"], as_index=False)["seconds"].sum()
    d["ms"] = 1e3 * d["seconds"]
    order, palette = policy_hue(d["policy"].unique())
    fig, ax = plt.subplots(figsize=(9, 4.8))
    sns.barplot(d, x="rank", y="ms", hue="policy", hue_order=order, palette=palette, ax=ax, errorbar=("pi", 100))
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, [f"{POLICY_LABELS.get(p, p)}, measured" for p in labels], fontsize=7, loc="lower right")
    ax.set_xlabel("EP rank")
    ax.set_ylabel("expert compute (ms per step)")
    return titled(fig, "Expert-compute time per rank, measured (whiskers: min-max over repeats and steps)", subtitle)
