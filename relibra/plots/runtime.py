"""Figures of notebooks 08 and 09: measured runs (the CPU runtime, the RL workload) beside the simulator."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from relibra.plots.style import POLICY_COLORS, POLICY_LABELS, policy_hue, policy_order, titled

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
    ax.set_xlabel("GRPO step")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("reward (0-1, verifier score)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("reward")
    ax = axes[1]
    ax.bar(rewards["step"], rewards["seconds"], color="0.6")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("wall s per step (rollout + train)")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title("time per step")
    titled(fig, "The real RL run: reward over GRPO steps", subtitle)
    fig.tight_layout()
    return fig


# ---- 08 runtime --------------------------------------------------------------------------------
def runtime_vs_sim_plot(comparison: pd.DataFrame, subtitle: str):
    """Per component (panel): seconds per step per policy, measured (bars with min-max) vs simulated."""
    comps = list(dict.fromkeys(comparison["component"]))
    policies = policy_order(comparison["policy"].unique())
    fig, axes = plt.subplots(1, len(comps), figsize=(4.4 * len(comps), 4), squeeze=False)
    w = 0.38
    for ax, comp in zip(axes[0], comps):
        d = comparison[comparison["component"] == comp].set_index(["policy", "source"])
        x = np.arange(len(policies))
        for off, source, hatch in ((-w / 2, "measured", None), (w / 2, "simulated", "//")):
            vals = [d["seconds"].get((p, source), np.nan) for p in policies]
            lo = [d["seconds_min"].get((p, source), np.nan) for p in policies]
            hi = [d["seconds_max"].get((p, source), np.nan) for p in policies]
            err = np.array([np.subtract(vals, lo), np.subtract(hi, vals)])
            ax.bar(x + off, 1e3 * np.array(vals), w, yerr=1e3 * err, capsize=3,
                   color=[POLICY_COLORS.get(p, (0.5, 0.5, 0.5)) for p in policies], hatch=hatch,
                   alpha=1.0 if source == "measured" else 0.55, edgecolor="0.2", label=source)
        ax.set_xticks(x, [POLICY_LABELS.get(p, p) for p in policies], rotation=15)
        ax.set_ylabel("ms per training step (slowest rank)")
        ax.set_title(comp)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.05)
    from matplotlib.patches import Patch

    fig.legend([Patch(facecolor="0.4", edgecolor="0.2"), Patch(facecolor="0.75", edgecolor="0.2", hatch="//")],
               ["measured (left bar of each policy)", "simulated (right bar, hatched)"], loc="lower center",
               bbox_to_anchor=(0.5, -0.06), ncol=2, fontsize=8)
    titled(fig, "Real runtime vs simulator, per component (whiskers: min-max over repeats and steps)", subtitle)
    fig.tight_layout()
    return fig


def runtime_rank_plot(measured: pd.DataFrame, subtitle: str, simulated: pd.DataFrame | None = None):
    """Expert-compute seconds per rank and policy (forward + backward, mean over steps): measured bars,
    and the simulator's figures from `simulated` (relibra metric rows): hatched bars where it holds
    per-rank rows (rank >= 0), else one dashed line per policy at the simulated slowest GPU (rank -1,
    summed over micro-batches and layers)."""
    d = measured[measured["component"] == "expert_compute"]
    d = d.groupby(["policy", "repeat", "step", "rank"], as_index=False)["seconds"].sum()
    d["ms"] = 1e3 * d["seconds"]
    d["source"] = "measured"
    order, palette = policy_hue(d["policy"].unique())
    sim_lines = {}
    if simulated is not None and len(simulated):
        s = simulated[(simulated["component"] == "expert_compute") & simulated["policy"].isin(order)]
        per_rank = s[s["rank"] >= 0]
        if len(per_rank):
            g = per_rank.groupby(["policy", "step", "rank"], as_index=False)["seconds"].sum()
            g["ms"], g["source"], g["repeat"] = 1e3 * g["seconds"], "simulated", -1
            d = pd.concat([d, g], ignore_index=True)
        else:
            slow = s[s["rank"] == -1].groupby(["policy", "step"])["seconds"].sum().groupby("policy").mean()
            sim_lines = {p: 1e3 * v for p, v in slow.items()}
    fig, ax = plt.subplots(figsize=(9, 4.8))
    if (d["source"] == "simulated").any():
        d["policy, source"] = d["policy"].map(lambda p: POLICY_LABELS.get(p, p)) + ", " + d["source"]
        hue_order = [f"{POLICY_LABELS.get(p, p)}, {src}" for p in order for src in ("measured", "simulated")]
        pal = {f"{POLICY_LABELS.get(p, p)}, {src}": palette[p] for p in order for src in ("measured", "simulated")}
        sns.barplot(d, x="rank", y="ms", hue="policy, source", hue_order=hue_order, palette=pal, ax=ax,
                    errorbar=("pi", 100))
        for container, name in zip(ax.containers, hue_order):
            if name.endswith("simulated"):
                for bar in container:
                    bar.set_hatch("//")
                    bar.set_alpha(0.6)
        ax.legend(fontsize=7, title="policy, source")
    else:
        sns.barplot(d, x="rank", y="ms", hue="policy", hue_order=order, palette=palette, ax=ax, errorbar=("pi", 100))
        handles, labels = ax.get_legend_handles_labels()
        labels = [f"{POLICY_LABELS.get(p, p)}, measured" for p in labels]
        for p, ms in sim_lines.items():
            handles.append(ax.axhline(ms, color=palette[p], ls="--", lw=1.5))
            labels.append(f"{POLICY_LABELS.get(p, p)}, simulated slowest GPU")
        ax.legend(handles, labels, fontsize=7, loc="lower right")
    ax.set_xlabel("EP rank")
    ax.set_ylabel("expert compute (ms per step)")
    what = "measured vs simulated" if sim_lines or (d["source"] == "simulated").any() else "measured"
    titled(fig, f"Expert-compute time per rank, {what} (whiskers: min-max over repeats and steps)", subtitle)
    fig.tight_layout()
    return fig


# ---- 08: measured step time next to the simulator's ---------------------------------------------
def runtime_step_plot(results: pd.DataFrame, subtitle: str):
    """Per policy: measured median step seconds (bar, min-max whisker over timed steps and repeats) next to
    the simulator's sim_step_s (hatched bar). results: train.results rows (one per policy and repeat).
    Oversubscribed runs (more ranks than cores) are labelled in the title: never judge speed from them."""
    g = results.groupby("policy").agg(median=("step_s_median", "median"), lo=("step_s_min", "min"),
                                      hi=("step_s_max", "max"), sim=("sim_step_s", "median"))
    order = policy_order(g.index)
    g = g.loc[order]
    x = np.arange(len(order))
    fig, ax = plt.subplots(figsize=(1.6 * len(order) + 3, 3.8))
    colors = [POLICY_COLORS.get(p, "0.5") for p in order]
    ax.bar(x - 0.2, g["median"], 0.38, color=colors, label="measured (median; whisker: min-max)")
    ax.errorbar(x - 0.2, g["median"], yerr=[g["median"] - g["lo"], g["hi"] - g["median"]], fmt="none",
                ecolor="0.15", capsize=4, lw=1)
    ax.bar(x + 0.2, g["sim"], 0.38, color=colors, alpha=0.45, hatch="//", edgecolor="0.3",
           label="simulated (sim_step_s)")
    for xi, (m, s) in enumerate(zip(g["median"], g["sim"])):
        ax.annotate(f"{s / m:.2f}", (xi + 0.2, s), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [POLICY_LABELS.get(p, p) for p in order])
    ax.set_ylabel("seconds per training step (slowest rank)")
    ax.legend(fontsize=8, loc="lower right")
    over = bool(results.get("oversubscribed", pd.Series([False])).any())
    title = "Measured step time vs the simulator's prediction (label: simulated / measured)"
    if over:
        title = "OVERSUBSCRIBED (ranks > cores): not a speed measurement. " + title
    titled(fig, title, subtitle)
    fig.tight_layout()
    return fig
