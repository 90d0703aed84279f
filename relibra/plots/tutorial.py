"""Figures of notebook 00, the tutorial: one layer, one micro-batch, one plan, drawn."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.patches import FancyBboxPatch, Patch, PathPatch, Rectangle
from matplotlib.path import Path as MPath

from relibra.plots.style import _TAB, POLICY_LABELS, legend_below, titled

# ---- 00 tutorial -------------------------------------------------------------------------------
# One meaning per colour in the tutorial: blue = tokens at an expert's home, orange = tokens a replica
# takes; the slowest GPU is marked by a black outline and a label, never by a colour.
HOME_COLOR = _TAB[0]
REPLICA_COLOR = _TAB[1]
PHASE_COLORS = {"dense_compute": (0.65, 0.65, 0.65), "dispatch": _TAB[2], "expert_compute": _TAB[4],
                "combine": _TAB[9], "replica_push": _TAB[5], "replica_grad": _TAB[7]}
PHASE_LABELS = {"dense_compute": "attention (dense)", "dispatch": "dispatch all-to-all",
                "expert_compute": "expert compute (slowest GPU)", "combine": "combine all-to-all",
                "replica_push": "replica weight push (exposed)", "replica_grad": "replica gradient pull (exposed)"}


def _case_titled(fig, head: str, case: dict):
    """`fig` titled `head` (ending in its separator) then the case's policy and choices, over the simulated
    hardware; laid out."""
    policy = case["policy"]
    return titled(fig, f"{head}policy `{policy}` ({POLICY_LABELS.get(policy, policy)}): placement "
                  f"{case['placement']}, {case['spare_slots']} spare slot(s) per GPU",
                  f"simulated ({case['hardware']}); synthetic Zipf routing, {case['tokens_per_gpu']} tokens per GPU, "
                  "top-2 of 16 experts")


def _at(case: dict, table: str, micro_batch: int) -> pd.DataFrame:
    """The rows of one of the case's tables for one micro-batch."""
    t = case[table]
    return t[t["micro_batch"] == micro_batch]


def _legend_below(fig, ax, head: str, hardware: str, scale_note: str, bottom: float, **legend):
    """style.legend_below with the provenance of a toy-layer figure."""
    return legend_below(fig, ax, head, f"simulated ({hardware}); synthetic Zipf routing"
                        + (f" | {scale_note}" if scale_note else ""), bottom, **legend)


def _gpu_panel(ax, g: pd.DataFrame, ylabel: str, top: float, title: str) -> None:
    """Ticks (GPU and node), y label and limit, title and legend of a panel of one bar per GPU. Up to 4
    GPUs each tick names its node; beyond, ticks are GPU numbers, a dotted line parts the nodes and the
    x label says which GPUs each node holds."""
    gpus, nodes = g["gpu"].to_numpy(), g["node"].to_numpy()
    if len(gpus) <= 4:
        ax.set_xticks(gpus, [f"GPU {gpu}\n(node {node})" for gpu, node in zip(gpus, nodes)])
    else:
        ax.set_xticks(gpus, [str(gpu) for gpu in gpus])
        parts = [f"node {n}: GPUs {gpus[nodes == n].min()}-{gpus[nodes == n].max()}" for n in np.unique(nodes)]
        ax.set_xlabel(f"GPU ({'; '.join(parts)})")
        for n in np.unique(nodes)[1:]:
            ax.axvline(gpus[nodes == n].min() - 0.5, color="0.3", ls=":", lw=1)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper right")


def _mark_slowest(ax, x, heights, label: str = "slowest") -> None:
    """Black outline and a label on the tallest bar (the GPU everyone waits for)."""
    i = int(np.argmax(heights))
    ax.bar([x[i]], [heights[i]], fill=False, edgecolor="black", lw=2.2, zorder=3)
    ax.text(x[i], heights[i], label, ha="center", va="bottom", fontsize=8, fontweight="bold")


def tutorial_figure(case: dict, micro_batch: int = 0):
    """Left: tokens per GPU (home blue, replica orange) for one micro-batch; right: simulated forward
    expert ms per GPU. The slowest GPU carries a black outline in both panels."""
    g = _at(case, "gpu_table", micro_batch)
    s = case["summary"].set_index("micro_batch").loc[micro_batch]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = g["gpu"].to_numpy()
    ax = axes[0]
    ax.bar(x, g["home_tokens"], color=HOME_COLOR, label="tokens of its home experts")
    ax.bar(x, g["replica_tokens"], bottom=g["home_tokens"], color=REPLICA_COLOR, label="tokens it takes as a replica")
    ax.axhline(g["tokens"].mean(), color="0.2", ls="--", lw=1, label="balanced (mean)")
    _mark_slowest(ax, x, g["tokens"].to_numpy(dtype=float), "busiest")
    _gpu_panel(ax, g, "token-expert pairs computed", 1.4 * float(g["tokens"].max()),  # room for the legend
               f"tokens per GPU, micro-batch {micro_batch} (skewness {s['skewness']:.2f})")
    ax = axes[1]
    ms = 1e3 * g["expert_seconds"].to_numpy()
    ax.bar(x, ms, color="0.6")
    _mark_slowest(ax, x, ms)
    ax.axhline(s["balanced_ms"], color="0.2", ls="--", lw=1, label="balanced")
    _gpu_panel(ax, g, "expert compute, forward (ms)", 1.25 * float(ms.max()),
               f"simulated expert time per GPU: slowest {s['slowest_gpu_ms']:.3f} ms (outlined)")
    return _case_titled(fig, f"Toy MoE layer, 16 experts on {case['ep']} GPUs, ", case)


def plan_figure(case: dict, micro_batch: int = 0):
    """The StepPlan of one micro-batch drawn two ways.

    Left, the expert-home map: one box per GPU (grouped by node) holding its home experts (blue, with
    the tokens they compute there) and its spare replica slots (orange when filled: which expert it
    copies and how many tokens the copy takes; dashed when empty). Right, the token split as a flow
    diagram: every expert (left column, height ~ its tokens) sends its tokens to its home GPU (blue
    band) and, if replicated, part of them to the replica's GPU (orange band, labelled).
    """
    plan, ep, gpn = case["plan"], case["ep"], case["gpus_per_node"]
    et = _at(case, "expert_tokens", micro_batch).set_index("expert")["tokens"]
    reps = _at(case, "replicas", micro_batch)
    home = plan.home[0]
    home_tokens = plan.home_flow().sum(axis=2)[micro_batch, 0]  # [E] tokens computed at home
    e = len(home)
    slots = plan.replica_slots
    fig, (ax, fx) = plt.subplots(1, 2, figsize=(14, 5.6 if ep <= 8 else 7.5), gridspec_kw={"width_ratios": [1.1, 1]})

    # -- left: expert-home map -------------------------------------------------------------------
    per_gpu = e // ep
    cols = per_gpu + max(slots, 0)
    cell, pad = 1.0, 0.15
    box_w, box_h = cols * cell + 2 * pad, cell + 0.9
    per_row = min(gpn, 4)  # GPUs per row of the map: a node of 8 takes two rows
    rows_per_node = -(-gpn // per_row)
    node_h = rows_per_node * (box_h + 0.4) - 0.4  # one node's rows
    num_nodes = ep // gpn
    vmax = float(et.max()) or 1.0
    cmap = sns.light_palette(HOME_COLOR, as_cmap=True)

    def square(cx, y0, text, fontsize=6, color=None, **patch):
        """One cell of a GPU's box: a square and its centred text."""
        ax.add_patch(Rectangle((cx, y0 + 0.1), cell * 0.92, cell * 0.92, **patch))
        ax.text(cx + 0.46, y0 + 0.56, text, ha="center", va="center", fontsize=fontsize, color=color)

    for g in range(ep):
        node, local = divmod(g, gpn)
        row, col = divmod(local, per_row)
        x0 = col * (box_w + 0.4)
        y0 = (num_nodes - 1 - node) * (node_h + 1.2) + (rows_per_node - 1 - row) * (box_h + 0.4)
        ax.add_patch(FancyBboxPatch((x0, y0), box_w, box_h, boxstyle="round,pad=0.05", fc="white", ec="0.3"))
        ax.text(x0 + box_w / 2, y0 + box_h - 0.3, f"GPU {g}", ha="center", va="center", fontsize=9, fontweight="bold")
        for j, ex in enumerate(np.nonzero(home == g)[0]):
            square(x0 + pad + j * cell, y0, f"e{ex}\n{home_tokens[ex]}", 6.5, fc=cmap(home_tokens[ex] / vmax), ec="0.3")
        held = reps[reps["gpu"] == g].set_index("slot")
        for r in range(slots):
            cx = x0 + pad + (per_gpu + r) * cell
            if r in held.index:
                square(cx, y0, f"copy\ne{int(held.loc[r, 'expert'])}\n{int(held.loc[r, 'replica_tokens'])}",
                       fc=REPLICA_COLOR, ec="0.3", alpha=0.85)
            else:
                square(cx, y0, "empty\nslot", color="0.4", fill=False, ec="0.5", ls="--")
    for node in range(num_nodes):
        y0 = (num_nodes - 1 - node) * (node_h + 1.2)
        ax.text(-0.3, y0 + node_h / 2, f"node {node}", rotation=90, ha="right", va="center", fontsize=9)
    ax.set_xlim(-0.8, per_row * (box_w + 0.4))
    ax.set_ylim(-0.3, num_nodes * node_h + (num_nodes - 1) * 1.2 + 0.2)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("expert-home map: home experts (blue: tokens computed there) and replica slots (orange)")

    # -- right: flow diagram experts -> GPUs -------------------------------------------------------
    tokens, total = et.to_numpy(), float(et.sum())  # [E] in expert order
    ey = np.cumsum([0.0, *(tokens + 0.004 * total)])  # left column: experts stacked, height = tokens; [E + 1]
    gpu_tok = _at(case, "gpu_table", micro_batch).set_index("gpu")["tokens"]
    gy = np.cumsum([0.0, *(gpu_tok + (ey[-1] - float(gpu_tok.sum())) / max(ep - 1, 1))])  # right column; [ep + 1]
    efill, gfill = np.zeros(e), np.zeros(ep)

    def band(ex, g, tokens, color, label=None):
        y0a = ey[ex] + efill[ex]
        y0b = gy[g] + gfill[g]
        efill[ex] += tokens
        gfill[g] += tokens
        xa, xb = 0.12, 0.88
        verts = [(xa, y0a), (0.5, y0a), (0.5, y0b), (xb, y0b), (xb, y0b + tokens), (0.5, y0b + tokens),
                 (0.5, y0a + tokens), (xa, y0a + tokens), (xa, y0a)]
        codes = [MPath.MOVETO, *[MPath.CURVE4] * 3, MPath.LINETO, *[MPath.CURVE4] * 3, MPath.CLOSEPOLY]
        fx.add_patch(PathPatch(MPath(verts, codes), fc=color, ec="none", alpha=0.55))
        if label:
            band_labels.append((y0b + tokens / 2, label))

    band_labels: list[tuple[float, str]] = []

    for ex in range(e):
        band(ex, int(home[ex]), float(home_tokens[ex]), HOME_COLOR)
    for _, row in reps.iterrows():
        band(int(row["expert"]), int(row["gpu"]), float(row["replica_tokens"]), REPLICA_COLOR,
             f"e{int(row['expert'])}: {int(row['replica_tokens'])} of {int(row['expert_tokens'])} to its copy")
    top = max(ey[-1], gy[-1])
    # one label's height in data units: 7-point text with a little leading, over the panel's height in points
    step = top * 7 * 1.35 / (fx.get_position().height * fig.get_figheight() * 72)
    for y, label in zip(spread(sorted(y for y, _ in band_labels), step, 0.0, top),
                        (lbl for _, lbl in sorted(band_labels))):
        fx.text(0.8, y, label, ha="right", va="center", fontsize=7, color="0.1")
    for ex in range(e):
        fx.add_patch(Rectangle((0.08, ey[ex]), 0.04, tokens[ex], fc="0.35"))
        if tokens[ex] > 0.025 * total:
            fx.text(0.07, ey[ex] + tokens[ex] / 2, f"e{ex} ({int(tokens[ex])})", ha="right", va="center", fontsize=6.5)
    busiest = int(gpu_tok.idxmax())
    for g in range(ep):
        fx.add_patch(Rectangle((0.88, gy[g]), 0.04, gpu_tok[g], fc="0.35",
                               ec="black" if g == busiest else "none", lw=2))
        fx.text(0.93, gy[g] + gpu_tok[g] / 2, f"GPU {g}: {int(gpu_tok[g])}" + (" (busiest)" if g == busiest else ""),
                ha="left", va="center", fontsize=8, fontweight="bold" if g == busiest else "normal")
    fx.set_xlim(-0.12, 1.2)
    fx.set_ylim(top, 0)
    fx.axis("off")
    fx.set_title("token split: expert (left, height = tokens) -> GPU that computes them (right)")
    fx.legend([Patch(color=HOME_COLOR, alpha=0.55), Patch(color=REPLICA_COLOR, alpha=0.55)],
              ["computed at the expert's home", "sent to a replica (copy) in the same node"], fontsize=7,
              loc="lower center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    return _case_titled(fig, f"The StepPlan of micro-batch {micro_batch}: ", case)


def spread(ys: list[float], step: float, low: float, high: float) -> list[float]:
    """Label positions near sorted `ys`, at least `step` apart and inside [low, high] where they fit:
    pushed down past their upper neighbours, then back up from `high`."""
    out = []
    for y in ys:
        out.append(max(y, low + step / 2, out[-1] + step if out else y))
    for i in range(len(out) - 1, -1, -1):
        ceiling = high - step / 2 if i == len(out) - 1 else out[i + 1] - step
        out[i] = min(out[i], ceiling)
    return out


def phase_figure(case: dict, micro_batch: int = 0):
    """The simulator's time per phase of the layer for one micro-batch, forward and backward, as
    stacked horizontal bars (each phase: the slowest GPU's seconds; transfers only where exposed)."""
    d = _at(case, "phases", micro_batch)
    fig, ax = plt.subplots(figsize=(11, 2.9))
    for yi, direction in enumerate(("forward", "backward")):
        left = 0.0
        for phase in PHASE_COLORS:
            ms = 1e3 * float(d[(d["direction"] == direction) & (d["phase"] == phase)]["seconds"].sum())
            if ms <= 0:
                continue
            ax.barh(yi, ms, left=left, color=PHASE_COLORS[phase], edgecolor="white", label=PHASE_LABELS[phase])
            if ms > 0.04 * float(1e3 * d.groupby("direction")["seconds"].sum().max()):
                ax.text(left + ms / 2, yi, f"{ms:.3f}", ha="center", va="center", fontsize=7)
            left += ms
        ax.text(left, yi, f"  {left:.3f} ms", ha="left", va="center", fontsize=8)
    ax.set_yticks([0, 1], ["forward", "backward"])
    ax.invert_yaxis()
    ax.set_xlabel("simulated ms of this layer and micro-batch (phases run one after another)")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xlim(0, ax.get_xlim()[1] * 1.12)
    return _case_titled(fig, f"Where the time goes, micro-batch {micro_batch}: ", case)


def tutorial_grid_figure(grid: pd.DataFrame, scale_note: str = ""):
    """Rank skewness and slowest-GPU ms for each placement (x) and number of spare slots (hue); each
    bar is labelled with the replica slots the planner filled per GPU at most. One legend under the
    panels, clear of the bars."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    d = grid.copy()
    d["spare slots per GPU"] = d["spare_slots"].astype(str)
    for ax, col, ylabel, title in (
            (axes[0], "skewness", "rank skewness (max / mean tokens)", "rank skewness, mean over micro-batches"),
            (axes[1], "slowest_gpu_ms", "slowest GPU, expert compute (ms)",
             "slowest GPU's forward expert time, mean over micro-batches")):
        sns.barplot(d, x="placement", y=col, hue="spare slots per GPU", ax=ax, palette="crest")
        for container, (_, sub) in zip(ax.containers, d.groupby("spare_slots", sort=True)):
            ax.bar_label(container, labels=[f"used {u}" for u in sub["max_replicas_per_gpu"]], fontsize=6.5,
                         padding=1)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_xlabel("expert placement: static (Megatron), search (ReLibra), lpt (greedy)")
        ax.set_ylim(0, 1.2 * float(d[col].max()))
        ax.get_legend().remove()
    axes[0].axhline(1.0, color="0.2", ls="--", lw=1)
    axes[1].axhline(float(d["balanced_ms"].mean()), color="0.2", ls="--", lw=1)
    return _legend_below(fig, axes[0], "Toy layer: every placement x number of spare replica slots (bar label: most "
                         "slots any GPU actually filled; dashed: balanced)", d["hardware"].iloc[0], scale_note, 0.07,
                         title="spare slots per GPU", title_fontsize=8)


def skew_sweep_figure(sweep: pd.DataFrame, scale_note: str = ""):
    """The skew slider, drawn: rank skewness and slowest-GPU ms against the Zipf exponent, for static
    placement without replicas and for the chosen plan (relibra.experiments.tutorial_skew_sweep)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharex=True)
    for (placement, slots), d in sweep.groupby(["placement", "spare_slots"], sort=False):
        style = dict(label=f"{placement} placement, {slots} spare slot(s)", marker="o",
                     color="0.45" if placement == "static" else HOME_COLOR)
        axes[0].plot(d["skew"], d["skewness"], **style)
        axes[1].plot(d["skew"], d["slowest_gpu_ms"], **style)
    axes[0].axhline(1.0, color="0.2", ls="--", lw=1)
    axes[1].plot(sweep["skew"].unique(), sweep.groupby("skew", sort=False)["balanced_ms"].mean(), color="0.2", ls="--",
                 lw=1, label="balanced")
    axes[0].set_ylabel("rank skewness\n(max / mean tokens)")
    axes[1].set_ylabel("slowest GPU,\nexpert compute (ms)")
    for ax in axes:
        ax.set_xlabel("skew (Zipf exponent of expert popularity)")
        ax.set_ylim(bottom=0)
    return _legend_below(fig, axes[1], "What the skew slider shows: imbalance as expert popularity gets more peaked "
                         "(dashed: balanced)", "the paper's GPUs and links", scale_note, 0.08)


def replay_figure(replay: pd.DataFrame, scale_note: str = ""):
    """Routing replay, drawn (relibra.experiments.tutorial_replay): the slowest GPU's expert ms and the rank
    skewness of the plan made from the previous step's loads (history) and of the plan made from the
    replayed exact loads, against the micro-batch shift; balanced dashed."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.9), sharex=True)
    styles = {"history": dict(color="0.45", marker="s", ls="--",
                              label="planned from the previous step's loads (history)"),
              "replay": dict(color=HOME_COLOR, marker="o", label="planned from this step's replayed loads (replay)")}
    for plan, d in replay.groupby("plan", sort=False):
        axes[0].plot(d["shift"], d["slowest_gpu_ms"], **styles[plan])
        axes[1].plot(d["shift"], d["skewness"], **styles[plan])
    b = replay.groupby("shift", sort=True)["balanced_ms"].mean()
    axes[0].plot(b.index, b.to_numpy(), color="0.2", ls=":", lw=1.2, label="balanced")
    axes[1].axhline(1.0, color="0.2", ls=":", lw=1.2)
    axes[0].set_ylabel("slowest GPU,\nexpert compute (ms)")
    axes[1].set_ylabel("rank skewness\n(max / mean tokens)")
    for ax in axes:
        ax.set_xlabel("micro-batch shift (share of the popularity ranking reshuffled)")
        ax.set_ylim(bottom=0)
    policy = replay["policy"].iloc[0]
    return _legend_below(fig, axes[0], f"Routing replay: `{policy}` ({POLICY_LABELS.get(policy, policy)}) planned "
                         "from history vs from the exact loads as the micro-batch shift grows (means over the step's "
                         "micro-batches)", "the paper's GPUs and links", scale_note, 0.08)
