"""Figures of notebook 11: throughput ratios and planner time from EP16 to EP256 (relibra.studies.scale)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from relibra.cluster import resolve_topology
from relibra.errors import RelibraError
from relibra.plots.style import POLICY_LABELS, policy_order, policy_palette, titled


def cluster_label(spec: str) -> str:
    """'32 nodes x 8 GPUs (paper preset)' for a cluster preset or spec; the spec itself if unknown."""
    try:
        topo = resolve_topology(spec)
    except RelibraError:
        return spec
    nodes = f"{topo.num_nodes} node{'s' if topo.num_nodes > 1 else ''}"
    return f"{nodes} x {topo.gpus_per_node} GPUs ({spec.split(',')[0]} preset)"


# balanced-compute: the ceiling, dashed; relibra-h, often on ReLibra's line: drawn over it, dashed, hollow squares
_STYLES = {"balanced-compute": dict(ls="--", marker=""),
           "relibra-h": dict(ls=(0, (4, 2)), marker="s", ms=6, mfc="none", mew=1.2, zorder=3)}


def _ep_axis(ax, eps) -> None:
    """A log2 x axis ticked at the EP sizes `eps`."""
    eps = sorted(set(eps))
    ax.set_xscale("log", base=2)
    ax.set_xticks(eps, [str(e) for e in eps])
    ax.minorticks_off()


def ep_sweep_plot(table: pd.DataFrame, subtitle: str):
    """One panel per (model row, cluster column): simulated tokens/s over Megatron against EP (log2 axis),
    one line per policy, balanced-compute dashed grey as the ceiling. EP sizes a case cannot hold
    are absent from its panel and named under it.

    table: relibra.studies.scale.scale_sweep.
    """
    models = list(dict.fromkeys(table["model"]))
    clusters = list(dict.fromkeys(table["cluster"]))
    ok = table[(table["status"] == "ok") & (table["policy"] != "balanced")]
    policies = policy_order(set(ok["policy"]))
    palette = policy_palette(policies)
    fig, axes = plt.subplots(len(models), len(clusters), figsize=(5.0 * len(clusters), 3.2 * len(models)),
                             squeeze=False, sharey="row")
    for i, model in enumerate(models):
        for j, cluster in enumerate(clusters):
            ax = axes[i][j]
            d = ok[(ok["model"] == model) & (ok["cluster"] == cluster)]
            for policy in policies:
                g = d[d["policy"] == policy].sort_values("ep")
                if len(g):
                    ax.plot(g["ep"], g["speedup_vs_megatron"], label=POLICY_LABELS.get(policy, policy),
                            color=palette[policy], **_STYLES.get(policy, dict(marker="o", ms=4)))
            ax.axhline(1.0, color="0.7", lw=0.8)
            case = table[(table["model"] == model) & (table["cluster"] == cluster)]
            _ep_axis(ax, case["ep"])
            missing = case[case["status"] != "ok"]
            note = f"\n(EP {', '.join(str(e) for e in missing['ep'])}: not possible)" if len(missing) else ""
            ax.set_title(f"{model} on {cluster_label(cluster)}{note}", fontsize=9)
            ax.set_xlabel("EP size")
            if j == 0:
                ax.set_ylabel("tokens/s over Megatron")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, bbox_to_anchor=(0.5, 0.0))
    eps = sorted(set(table["ep"]))
    return titled(fig, f"Beyond the paper's scale: throughput over Megatron from EP{eps[0]} to EP{eps[-1]} (dashed: "
                  "balanced-compute, the ceiling)", subtitle, rect=(0, 0.45 / (3.2 * len(models)), 1, 1))


def scale_planner_plot(table: pd.DataFrame, subtitle: str, policies=("relibra", "relibra-h", "eplb+", "llep")):
    """Measured CPU seconds of one whole step's plan against EP, one line per (policy, model), for the
    first cluster of the table (8-GPU nodes), log-log; one panel per policy."""
    ok = table[(table["status"] == "ok") & table["policy"].isin(policies)]
    cluster = next(iter(dict.fromkeys(ok["cluster"])), None)
    d = ok[ok["cluster"] == cluster]
    shown = [p for p in policies if p in set(d["policy"])]
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(3.6 * max(1, len(shown)), 3.4), squeeze=False, sharey=True)
    markers = dict(zip(dict.fromkeys(d["model"]), "osD^v"))
    greys = dict(zip(dict.fromkeys(d["model"]), ("0.15", "0.45", "0.7") * 3))
    for ax, policy in zip(axes[0], shown):
        for model, g in d[d["policy"] == policy].groupby("model", sort=False):
            g = g.sort_values("ep")
            ax.plot(g["ep"], g["plan_cpu_s"], marker=markers[model], ms=4, color=greys[model], label=model)
        ax.set_yscale("log")
        _ep_axis(ax, d["ep"])
        ax.set_title(POLICY_LABELS.get(policy, policy), fontsize=9)
        ax.set_xlabel("EP size")
    axes[0][0].set_ylabel("planner CPU seconds per step")
    axes[0][0].legend(fontsize=7)
    return titled(fig, f"Planner time per training step on {cluster_label(cluster)} (measured, one core of this "
                  "machine)", subtitle)


def ratio_pivot(table: pd.DataFrame, value: str = "speedup_vs_megatron") -> pd.DataFrame:
    """`value` as a (model, cluster, ep) x policy table, for display; policies sorted by their mean,
    the best first (highest speed-up, lowest planner seconds)."""
    ok = table[table["status"] == "ok"]
    wide = ok.pivot_table(index=["model", "cluster", "ep"], columns="policy", values=value, sort=False)
    return wide[list(wide.mean().sort_values(ascending=value != "plan_cpu_s").index)].replace({np.nan: None})
