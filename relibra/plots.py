"""Every figure the notebooks show, as functions of the tidy tables in relibra.experiments.

Each function returns a matplotlib Figure whose title names what is plotted and whose subtitle says
where the numbers come from: "simulated (<cluster preset> ...)" or "measured (<hardware>)", plus the
profile's scale. Axes carry units; legends name policies. Saving (PNG + SVG) is `save_figure`.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline", "svg", "pdf"):
    # Headless runs (papermill, tests) must never try to open a window.
    import os

    if not os.environ.get("DISPLAY"):
        matplotlib.use("Agg")

import matplotlib.pyplot as plt
import matplotlib.ticker  # noqa: F401  (integer step axes)
import numpy as np
import pandas as pd
import seaborn as sns

# One color per policy, the same in every figure.
POLICY_ORDER = ("megatron", "eplb", "eplb+", "lplb+", "llep", "relibra-reorder", "relibra-replicate",
                "relibra-lpt", "relibra-split", "relibra", "balanced", "balanced-compute")
_TAB = sns.color_palette("tab10", 10)
POLICY_COLORS = {
    "megatron": _TAB[0], "eplb": _TAB[1], "eplb+": _TAB[2], "lplb+": _TAB[4], "llep": _TAB[5],
    "relibra-reorder": _TAB[6], "relibra-replicate": _TAB[8], "relibra-lpt": _TAB[9], "relibra-split": (0.6, 0.45, 0.8),
    "relibra": _TAB[3], "balanced": (0.35, 0.35, 0.35), "balanced-compute": (0.35, 0.35, 0.35),
}
POLICY_LABELS = {
    "megatron": "Megatron (static)",
    "eplb": "EPLB (history)",
    "eplb+": "EPLB+ (oracle)",
    "lplb+": "LPLB+ (oracle + LP)",
    "llep": "LLEP",
    "relibra": "ReLibra",
    "relibra-reorder": "ReLibra reorder only",
    "relibra-replicate": "ReLibra replicate only",
    "relibra-lpt": "ReLibra, LPT placement",
    "relibra-split": "ReLibra split only",
    "balanced": "Balanced (ideal)",
    "balanced-compute": "Balanced compute (ideal)",
}


def model_label(name: str) -> str:
    """'<preset> (E experts, top-k, L MoE layers, hidden H)': how model presets differ, for per-model figures."""
    try:
        from relibra.cluster import get_model

        m = get_model(name)
    except Exception:  # a label only: an unknown name stays as it is
        return name
    return f"{name} ({m.num_experts} experts, top-{m.top_k}, {m.num_layers} MoE layers, hidden {m.hidden})"


def set_style() -> None:
    """The kit's look: seaborn whitegrid, readable fonts, deterministic SVG output."""
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)
    plt.rcParams.update({
        "figure.dpi": 100,
        "savefig.dpi": 130,
        "savefig.bbox": "tight",
        "svg.hashsalt": "relibra",  # stable element ids: same data, same SVG bytes
        "axes.titlesize": 11,
        "figure.titlesize": 12,
        "legend.fontsize": 8,
    })


def policy_order(policies) -> list[str]:
    """Policies sorted as in POLICY_ORDER (unknown names last, alphabetically)."""
    known = [p for p in POLICY_ORDER if p in set(policies)]
    return known + sorted(set(policies) - set(known))


def policy_palette(policies) -> dict:
    return {p: POLICY_COLORS.get(p, (0.5, 0.5, 0.5)) for p in policies}


def titled(fig, title: str, subtitle: str) -> None:
    """Title on the first line, provenance (simulated / measured, scale) below, wrapped to the width."""
    import textwrap

    width = max(40, int(fig.get_figwidth() * 12))
    lines = textwrap.wrap(title, width) + textwrap.wrap(subtitle, int(width * 1.1))
    fig.suptitle("\n".join(lines), fontsize=11, y=1.0 + 0.02 * len(lines))


def save_figure(fig, stem: str | Path) -> tuple[Path, Path]:
    """Write <stem>.png and <stem>.svg (no timestamps, so identical data gives identical files)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    fig.savefig(png, metadata={"Software": None})
    fig.savefig(svg, metadata={"Date": None, "Creator": None})
    show_inline(fig, png)
    return png, svg


def show_inline(fig, png: Path) -> None:
    """In a notebook kernel, display the saved PNG once as the cell's figure and close `fig` (so the
    inline backend does not draw it a second time); elsewhere do nothing. Works whatever the
    matplotlib backend, so executed notebooks hold every figure even under MPLBACKEND=Agg."""
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    display(Image(filename=str(png)))
    plt.close(fig)


# ---- 01 routing dynamics -------------------------------------------------------------------------
def expert_load_heatmaps(table: pd.DataFrame, subtitle: str, max_experts: int = 128):
    """Heatmaps of expert load share: micro-batches of one step (left) versus whole steps (right).

    table: relibra.experiments.expert_load_table output.
    """
    mb = table[table["scope"] == "micro-batch"]
    st = table[table["scope"] == "step"]
    step, layer = int(mb["step"].iloc[0]), int(mb["layer"].iloc[0])
    grid_mb = mb.pivot(index="micro_batch", columns="expert", values="share") * 100
    grid_st = st.pivot(index="step", columns="expert", values="share") * 100
    grid_mb, grid_st = grid_mb.iloc[:, :max_experts], grid_st.iloc[:, :max_experts]
    vmax = float(max(grid_mb.values.max(), grid_st.values.max()))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1]})
    for ax, grid, ylabel, title in (
        (axes[0], grid_mb, "micro-batch (within step %d)" % step, f"each micro-batch of step {step}"),
        (axes[1], grid_st, "training step", "each whole step (sum of its micro-batches)"),
    ):
        sns.heatmap(grid, ax=ax, cmap="rocket_r", vmin=0, vmax=vmax, cbar_kws={"label": "share of token-slots (%)"},
                    xticklabels=max(1, grid.shape[1] // 16), yticklabels=max(1, grid.shape[0] // 16))
        ax.set_xlabel("expert id")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    titled(fig, f"Expert load of MoE layer {layer}: per micro-batch (left) vs per whole step (right)", subtitle)
    fig.tight_layout()
    return fig


def shift_bars(table: pd.DataFrame, subtitle: str):
    """Bars of hot-expert overlap and load correlation per comparison, one colour per trace."""
    order = ["consecutive micro-batches", "micro-batch vs its own step", "micro-batch vs history prediction",
             "consecutive steps", "step vs history prediction"]
    metrics = [("hot-expert overlap", "hot-expert overlap (share of top 10%)"),
               ("load correlation", "load correlation (Pearson)")]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
    for ax, (metric, ylabel) in zip(axes, metrics):
        d = table[(table["metric"] == metric) & table["value"].notna()].copy()
        present = [o for o in order if o in set(d["comparison"])]
        d["comparison"] = d["comparison"].str.replace(" vs ", "\nvs ", regex=False)
        sns.barplot(d, x="comparison", y="value", hue="trace", order=[o.replace(" vs ", "\nvs ") for o in present],
                    ax=ax)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{metric} (1 = identical)")
        ax.tick_params(axis="x", labelsize=8)
        ax.get_legend().remove()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, title="trace", loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    titled(fig, "How far hot experts shift: between micro-batches, between steps, and against a history prediction",
           subtitle)
    fig.tight_layout()
    return fig


def prediction_error_plot(table: pd.DataFrame, subtitle: str):
    """Box plots of prediction error (share of token-slots on the wrong experts) per predictor and target."""
    d = table.copy()
    d["case"] = d["predictor"] + " -> " + d["target"]
    order = ["history -> whole step", "history -> micro-batch", "this step (oracle) -> micro-batch"]
    order = [o for o in order if o in set(d["case"])]
    d["error_pct"] = 100 * d["error"]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    sns.boxplot(d, x="case", y="error_pct", hue="trace", order=order, ax=ax, showfliers=False)
    ax.set_xlabel("predictor -> what it must predict")
    ax.set_ylabel("prediction error (% of token-slots on wrong experts)")
    ax.legend(title="workload", fontsize=7, title_fontsize=8)
    titled(fig, "How wrong load predictions are: history (EPLB) and the exact step total (EPLB+) vs each micro-batch", subtitle)
    fig.tight_layout()
    return fig


def static_skewness_plot(table: pd.DataFrame, subtitle: str):
    """Distribution of rank skewness under static placement: per micro-batch versus per whole step."""
    fig, ax = plt.subplots(figsize=(8, 4))
    sns.boxplot(table, x="trace", y="skewness", hue="scope", ax=ax, showfliers=False)
    ax.axhline(1.0, color="0.3", lw=1, ls="--")
    ax.set_xlabel("workload")
    ax.set_ylabel("rank skewness (max / mean tokens per GPU)")
    ax.legend(title="load summed over", fontsize=8)
    titled(fig, "Static expert placement: rank skewness per micro-batch and per whole step", subtitle)
    fig.tight_layout()
    return fig


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


def _tutorial_title(case: dict) -> str:
    policy = case["policy"]
    return (f"policy `{policy}` ({POLICY_LABELS.get(policy, policy)}): placement {case['placement']}, "
            f"{case['spare_slots']} spare slot(s) per GPU")


def _tutorial_subtitle(case: dict) -> str:
    return (f"simulated ({case['hardware']}); synthetic Zipf routing, {case['tokens_per_gpu']} tokens per GPU, "
            f"top-2 of 16 experts")


def _gpu_labels(g: pd.DataFrame) -> list[str]:
    return [f"GPU {gpu}\n(node {node})" for gpu, node in zip(g["gpu"], g["node"])]


def _mark_slowest(ax, x, heights, label: str = "slowest") -> None:
    """Black outline and a label on the tallest bar (the GPU everyone waits for)."""
    i = int(np.argmax(heights))
    ax.bar([x[i]], [heights[i]], fill=False, edgecolor="black", lw=2.2, zorder=3)
    ax.text(x[i], heights[i], label, ha="center", va="bottom", fontsize=8, fontweight="bold")


def tutorial_figure(case: dict, micro_batch: int = 0):
    """Left: tokens per GPU (home blue, replica orange) for one micro-batch; right: simulated forward
    expert ms per GPU. The slowest GPU carries a black outline in both panels."""
    g = case["gpu_table"]
    g = g[g["micro_batch"] == micro_batch]
    s = case["summary"].set_index("micro_batch").loc[micro_batch]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = g["gpu"].to_numpy()
    ax = axes[0]
    ax.bar(x, g["home_tokens"], color=HOME_COLOR, label="tokens of its home experts")
    ax.bar(x, g["replica_tokens"], bottom=g["home_tokens"], color=REPLICA_COLOR, label="tokens it takes as a replica")
    ax.axhline(g["tokens"].mean(), color="0.2", ls="--", lw=1, label="balanced (mean)")
    _mark_slowest(ax, x, g["tokens"].to_numpy(dtype=float), "busiest")
    ax.set_xticks(x, _gpu_labels(g))
    ax.set_ylabel("token-expert pairs computed")
    ax.set_ylim(0, 1.4 * float(g["tokens"].max()))  # room for the legend
    ax.set_title(f"tokens per GPU, micro-batch {micro_batch} (skewness {s['skewness']:.2f})")
    ax.legend(fontsize=7, loc="upper right")
    ax = axes[1]
    ms = 1e3 * g["expert_seconds"].to_numpy()
    ax.bar(x, ms, color="0.6")
    _mark_slowest(ax, x, ms)
    ax.axhline(s["balanced_ms"], color="0.2", ls="--", lw=1, label="balanced")
    ax.set_xticks(x, _gpu_labels(g))
    ax.set_ylabel("expert compute, forward (ms)")
    ax.set_ylim(0, 1.25 * float(ms.max()))
    ax.set_title(f"simulated expert time per GPU: slowest {s['slowest_gpu_ms']:.3f} ms (outlined)")
    ax.legend(fontsize=7, loc="upper right")
    titled(fig, f"Toy MoE layer, 16 experts on {case['ep']} GPUs, {_tutorial_title(case)}", _tutorial_subtitle(case))
    fig.tight_layout()
    return fig


def plan_figure(case: dict, micro_batch: int = 0):
    """The StepPlan of one micro-batch drawn two ways.

    Left, the expert-home map: one box per GPU (grouped by node) holding its home experts (blue, with
    the tokens they compute there) and its spare replica slots (orange when filled: which expert it
    copies and how many tokens the copy takes; dashed when empty). Right, the token split as a flow
    diagram: every expert (left column, height ~ its tokens) sends its tokens to its home GPU (blue
    band) and, if replicated, part of them to the replica's GPU (orange band, labelled).
    """
    from matplotlib.patches import FancyBboxPatch, PathPatch, Rectangle
    from matplotlib.path import Path as MPath

    plan, ep, gpn = case["plan"], case["ep"], case["gpus_per_node"]
    et = case["expert_tokens"]
    et = et[et["micro_batch"] == micro_batch].set_index("expert")["tokens"]
    reps = case["replicas"]
    reps = reps[reps["micro_batch"] == micro_batch]
    home = plan.home[0]
    home_tokens = plan.home_flow().sum(axis=2)[micro_batch, 0]  # [E] tokens computed at home
    e = len(home)
    slots = plan.replica_slots
    fig, (ax, fx) = plt.subplots(1, 2, figsize=(14, 5.6), gridspec_kw={"width_ratios": [1.1, 1]})

    # -- left: expert-home map -------------------------------------------------------------------
    per_gpu = e // ep
    cols = per_gpu + max(slots, 0)
    cell, pad = 1.0, 0.15
    box_w, box_h = cols * cell + 2 * pad, cell + 0.9
    vmax = float(et.max()) or 1.0
    cmap = sns.light_palette(HOME_COLOR, as_cmap=True)
    for g in range(ep):
        node, local = divmod(g, gpn)
        x0 = local * (box_w + 0.4) + node * 0.0
        y0 = (1 - node) * (box_h + 1.2)
        ax.add_patch(FancyBboxPatch((x0, y0), box_w, box_h, boxstyle="round,pad=0.05", fc="white", ec="0.3"))
        ax.text(x0 + box_w / 2, y0 + box_h - 0.3, f"GPU {g}", ha="center", va="center", fontsize=9, fontweight="bold")
        for j, ex in enumerate(np.nonzero(home == g)[0]):
            cx = x0 + pad + j * cell
            ax.add_patch(Rectangle((cx, y0 + 0.1), cell * 0.92, cell * 0.92, fc=cmap(home_tokens[ex] / vmax), ec="0.3"))
            ax.text(cx + 0.46, y0 + 0.56, f"e{ex}\n{home_tokens[ex]}", ha="center", va="center", fontsize=6.5)
        held = reps[reps["gpu"] == g].set_index("slot")
        for r in range(slots):
            cx = x0 + pad + (per_gpu + r) * cell
            if r in held.index:
                row = held.loc[r]
                ax.add_patch(Rectangle((cx, y0 + 0.1), cell * 0.92, cell * 0.92, fc=REPLICA_COLOR, ec="0.3", alpha=0.85))
                ax.text(cx + 0.46, y0 + 0.56, f"copy\ne{int(row['expert'])}\n{int(row['replica_tokens'])}",
                        ha="center", va="center", fontsize=6)
            else:
                ax.add_patch(Rectangle((cx, y0 + 0.1), cell * 0.92, cell * 0.92, fill=False, ec="0.5", ls="--"))
                ax.text(cx + 0.46, y0 + 0.56, "empty\nslot", ha="center", va="center", fontsize=6, color="0.4")
    width = gpn * (box_w + 0.4)
    for node in range(ep // gpn):
        y0 = (1 - node) * (box_h + 1.2)
        ax.text(-0.3, y0 + box_h / 2, f"node {node}", rotation=90, ha="right", va="center", fontsize=9)
    ax.set_xlim(-0.8, width)
    ax.set_ylim(-0.3, 2 * box_h + 1.4)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("expert-home map: home experts (blue: tokens computed there) and replica slots (orange)")

    # -- right: flow diagram experts -> GPUs -------------------------------------------------------
    total = float(et.sum())
    gap = 0.004 * total
    ey, y = {}, 0.0
    for ex in range(e):  # left column: experts stacked, height = tokens
        ey[ex] = y
        y += et.get(ex, 0) + gap
    gpu_tok = case["gpu_table"]
    gpu_tok = gpu_tok[gpu_tok["micro_batch"] == micro_batch].set_index("gpu")["tokens"]
    gy, yy = {}, 0.0
    ggap = (y - float(gpu_tok.sum())) / max(ep - 1, 1)
    for g in range(ep):
        gy[g] = yy
        yy += gpu_tok[g] + ggap
    gfill = dict.fromkeys(range(ep), 0.0)
    efill = dict.fromkeys(range(e), 0.0)

    def band(ex, g, tokens, color, label=None):
        y0a = ey[ex] + efill[ex]
        y0b = gy[g] + gfill[g]
        efill[ex] += tokens
        gfill[g] += tokens
        xa, xb = 0.12, 0.88
        verts = [(xa, y0a), (0.5, y0a), (0.5, y0b), (xb, y0b), (xb, y0b + tokens), (0.5, y0b + tokens),
                 (0.5, y0a + tokens), (xa, y0a + tokens), (xa, y0a)]
        codes = [MPath.MOVETO, MPath.CURVE4, MPath.CURVE4, MPath.CURVE4, MPath.LINETO, MPath.CURVE4, MPath.CURVE4,
                 MPath.CURVE4, MPath.CLOSEPOLY]
        fx.add_patch(PathPatch(MPath(verts, codes), fc=color, ec="none", alpha=0.55))
        if label:
            fx.text(0.8, y0b + tokens / 2, label, ha="right", va="center", fontsize=7, color="0.1")

    for ex in range(e):
        band(ex, int(home[ex]), float(home_tokens[ex]), HOME_COLOR)
    for _, row in reps.iterrows():
        band(int(row["expert"]), int(row["gpu"]), float(row["replica_tokens"]), REPLICA_COLOR,
             f"e{int(row['expert'])}: {int(row['replica_tokens'])} of {int(row['expert_tokens'])} to its copy")
    for ex in range(e):
        fx.add_patch(Rectangle((0.08, ey[ex]), 0.04, et.get(ex, 0), fc="0.35"))
        if et.get(ex, 0) > 0.025 * total:
            fx.text(0.07, ey[ex] + et.get(ex, 0) / 2, f"e{ex} ({int(et.get(ex, 0))})", ha="right", va="center",
                    fontsize=6.5)
    busiest = int(gpu_tok.idxmax())
    for g in range(ep):
        fx.add_patch(Rectangle((0.88, gy[g]), 0.04, gpu_tok[g], fc="0.35",
                               ec="black" if g == busiest else "none", lw=2))
        fx.text(0.93, gy[g] + gpu_tok[g] / 2, f"GPU {g}: {int(gpu_tok[g])}" + (" (busiest)" if g == busiest else ""),
                ha="left", va="center", fontsize=8, fontweight="bold" if g == busiest else "normal")
    fx.set_xlim(-0.12, 1.2)
    fx.set_ylim(max(y, yy), 0)
    fx.axis("off")
    fx.set_title("token split: expert (left, height = tokens) -> GPU that computes them (right)")
    from matplotlib.patches import Patch

    fx.legend([Patch(color=HOME_COLOR, alpha=0.55), Patch(color=REPLICA_COLOR, alpha=0.55)],
              ["computed at the expert's home", "sent to a replica (copy) in the same node"], fontsize=7,
              loc="lower center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    titled(fig, f"The StepPlan of micro-batch {micro_batch}: {_tutorial_title(case)}", _tutorial_subtitle(case))
    fig.tight_layout()
    return fig


def phase_figure(case: dict, micro_batch: int = 0):
    """The simulator's time per phase of the layer for one micro-batch, forward and backward, as
    stacked horizontal bars (each phase: the slowest GPU's seconds; transfers only where exposed)."""
    d = case["phases"]
    d = d[d["micro_batch"] == micro_batch]
    fig, ax = plt.subplots(figsize=(11, 2.9))
    for yi, direction in enumerate(("forward", "backward")):
        left = 0.0
        for phase in PHASE_COLORS:
            sel = d[(d["direction"] == direction) & (d["phase"] == phase)]
            ms = 1e3 * float(sel["seconds"].sum()) if len(sel) else 0.0
            if ms <= 0:
                continue
            ax.barh(yi, ms, left=left, color=PHASE_COLORS[phase], edgecolor="white",
                    label=PHASE_LABELS[phase] if yi == 0 or direction == "backward" else None)
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
    titled(fig, f"Where the time goes, micro-batch {micro_batch}: {_tutorial_title(case)}", _tutorial_subtitle(case))
    fig.tight_layout()
    return fig


def tutorial_grid_figure(grid: pd.DataFrame):
    """Rank skewness and slowest-GPU ms for each placement (x) and number of spare slots (hue); each
    bar is labelled with the replica slots the planner filled per GPU at most."""
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
        ax.legend(title="spare slots per GPU", fontsize=7, title_fontsize=8, loc="lower right")
    axes[0].axhline(1.0, color="0.2", ls="--", lw=1)
    axes[1].axhline(float(d["balanced_ms"].mean()), color="0.2", ls="--", lw=1)
    titled(fig, "Toy layer: every placement x number of spare replica slots (bar label: most slots any GPU "
           "actually filled; dashed: balanced)", f"simulated ({d['hardware'].iloc[0]}); synthetic Zipf routing")
    fig.tight_layout()
    return fig


def tutorial_interactive(compute, enabled: bool = True, **params):
    """ipywidgets controls for EP, spare slots, skew (and placement, shift, micro-batch) that recompute
    the plan with `compute` (tutorial_case) and redraw the tokens-per-GPU and plan figures.

    Displays the controls once and returns None (so a notebook cell shows them once). Does nothing
    when disabled, when ipywidgets is missing, or when no IPython kernel runs this code.
    """
    if not enabled:
        return None
    try:
        import ipywidgets as widgets
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return None
    from relibra.experiments.parameters import TUTORIAL_EP_SIZES, TUTORIAL_MAX_SPARE_SLOTS

    controls = {
        "ep": widgets.Dropdown(options=list(TUTORIAL_EP_SIZES), value=int(params.get("ep", 4)), description="EP"),
        "spare_slots": widgets.IntSlider(value=int(params.get("spare_slots", 0)), min=0,
                                         max=TUTORIAL_MAX_SPARE_SLOTS, description="spare slots"),
        "skew": widgets.FloatSlider(value=float(params.get("skew", 1.2)), min=0.0, max=3.0, step=0.1,
                                    description="skew"),
        "placement": widgets.Dropdown(options=["static", "search", "lpt"], value=params.get("placement", "static"),
                                      description="placement"),
        "shift": widgets.FloatSlider(value=float(params.get("shift", 0.5)), min=0.0, max=1.0, step=0.1,
                                     description="shift"),
        "micro_batch": widgets.IntSlider(value=int(params.get("micro_batch", 0)), min=0,
                                         max=int(params.get("micro_batches", 4)) - 1, description="micro-batch"),
    }
    fixed = {k: params[k] for k in ("seed", "tokens_per_gpu", "micro_batches") if k in params}

    def redraw(**values):
        case = compute(**values, **fixed)
        tutorial_figure(case, values["micro_batch"])
        plan_figure(case, values["micro_batch"])
        plt.show()

    out = widgets.interactive_output(redraw, controls)
    display(widgets.VBox([widgets.HBox(list(controls.values())[:3]), widgets.HBox(list(controls.values())[3:]), out]))
    return None


# ---- 02 throughput / 03 ablation ------------------------------------------------------------------
def _policy_hue(policies):
    order = policy_order(policies)
    return order, policy_palette(order)


def _policy_rows(table: pd.DataFrame, drop=()) -> tuple[pd.DataFrame, dict]:
    """`table`'s rows (one per policy) in POLICY_ORDER, those of `drop` left out, and the policy palette."""
    order, palette = _policy_hue(table["policy"].unique())
    order = [p for p in order if p not in drop]
    return table.set_index("policy").loc[order].reset_index(), palette


def _figure_policy_legend(fig, ax) -> None:
    """One legend for the whole figure, right of the panels, from `ax`'s policy handles."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, [POLICY_LABELS.get(l, l) for l in labels], title="policy", loc="center left",
               bbox_to_anchor=(1.0, 0.5), fontsize=8)


def _relabel_legend(ax, title: str = "policy", **kw) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, [POLICY_LABELS.get(l, l) for l in labels], title=title, **{"fontsize": 7, **kw})


def throughput_bars(table: pd.DataFrame, subtitle: str):
    """Tokens/s normalized to Megatron: one panel per model, bars per workload (x) and policy (hue)."""
    models = list(dict.fromkeys(table["model"]))
    order, palette = _policy_hue(table["policy"].unique())
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models) + 1.5, 4.2), sharey=True, squeeze=False)
    for ax, model in zip(axes[0], models):
        d = table[table["model"] == model]
        sns.barplot(d, x="workload", y="speedup_vs_megatron", hue="policy", hue_order=order, palette=palette, ax=ax)
        ax.axhline(1.0, color="0.2", lw=1)
        ax.set_title(model_label(model).replace(" (", "\n(", 1), fontsize=9)
        ax.set_xlabel("workload")
        ax.set_ylabel("throughput / Megatron's (tokens/s ratio)")
        ax.get_legend().remove()
    _figure_policy_legend(fig, axes[0][0])
    titled(fig, "Training throughput normalized to Megatron (higher is better)", subtitle)
    fig.tight_layout()
    return fig


def fraction_of_balanced(table: pd.DataFrame, subtitle: str):
    """Box per policy of tokens/s as a fraction of the balanced ideal, over models and workloads."""
    d = table[~table["policy"].isin(("balanced", "balanced-compute"))]
    order, palette = _policy_hue(d["policy"].unique())
    fig, ax = plt.subplots(figsize=(10, 4.4))
    sns.boxplot(d, x="policy", y="frac_of_balanced", order=order, hue="policy", hue_order=order, palette=palette,
                ax=ax, legend=False)
    dots = d.assign(model=d["model"].map(model_label)) if "model" in d else d
    sns.stripplot(dots, x="policy", y="frac_of_balanced", order=order, hue="model" if "model" in d else None,
                  palette="dark:0.2" if "model" not in d else "crest", size=3.5, ax=ax, dodge=False)
    if "model" in d:
        ax.legend(title="model (dots)", fontsize=7, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.axhline(1.0, color="0.2", ls="--", lw=1)
    ax.text(len(order) - 0.5, 1.0, "balanced ideal", ha="right", va="bottom", fontsize=8)
    ax.set_xticks(range(len(order)), [POLICY_LABELS.get(p, p) for p in order], rotation=20, ha="right")
    ax.set_xlabel("")
    ax.set_ylabel("throughput / balanced ideal's")
    titled(fig, "How close each policy gets to the balanced ideal (each dot: one model x workload)", subtitle)
    fig.tight_layout()
    return fig


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
    sns.barplot(d, x="stage", y="speedup_vs_megatron", hue="model", order=order, ax=axes[0], palette="crest",
                errorbar=("pi", 100))
    axes[0].axhline(1.0, color="0.2", lw=1)
    axes[0].set_ylabel("throughput / Megatron's (tokens/s ratio)")
    axes[0].set_title("throughput")
    sns.barplot(d, x="stage", y="skewness", hue="model", order=order, ax=axes[1], palette="crest", errorbar=("pi", 100))
    axes[1].axhline(1.0, color="0.2", ls="--", lw=1)
    axes[1].set_ylabel("rank skewness (max / mean tokens per GPU)")
    axes[1].set_title("rank skewness")
    for ax in axes:
        ax.set_xlabel("")
        ax.get_legend().remove()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, [model_label(m) for m in labels], title="model", fontsize=8, title_fontsize=8,
               loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=min(3, len(labels)))
    titled(fig, "Ablation: what reordering and replication each add (bars: mean over workloads; whiskers: range)",
           subtitle)
    fig.tight_layout()
    return fig


# ---- 04 reordering / 05 replication ---------------------------------------------------------------
def _workload_panels(fig, axes, table: pd.DataFrame, panels) -> None:
    """Bars per workload (x) and policy (hue; Balanced left out), one panel per (column, y label, title)
    of `panels`; a line at 1.0 on the first panel (Megatron's throughput) and a dashed one on the second
    (perfect balance); one policy legend for the figure."""
    order, palette = _policy_hue(table["policy"].unique())
    order = [p for p in order if p not in ("balanced", "balanced-compute")]
    d = table[table["policy"].isin(order)]
    for ax, (col, ylabel, title) in zip(axes, panels):
        sns.barplot(d, x="workload", y=col, hue="policy", hue_order=order, palette=palette, ax=ax)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_xlabel("workload")
        ax.tick_params(axis="x", rotation=30)
        ax.get_legend().remove()
    axes[0].axhline(1.0, color="0.2", lw=1)
    axes[1].axhline(1.0, color="0.2", ls="--", lw=1)
    _figure_policy_legend(fig, axes[0])


def reorder_plot(table: pd.DataFrame, subtitle: str):
    """Four panels per policy: speedup over Megatron, node skewness, cross-node token share, migration GB."""
    panels = [("speedup_vs_megatron", "throughput / Megatron's", "throughput (tokens/s ratio)"),
              ("node_skewness", "node skewness (max / mean)", "balance across nodes: max / mean tokens per node"),
              ("cross_node_share", "share crossing nodes", "inter-node traffic: share of token-expert pairs"),
              ("migration_gb", "migration per step (GB)", "migration: expert weights + optimizer state moved")]
    fig, grid = plt.subplots(2, 2, figsize=(13, 7.5))
    _workload_panels(fig, grid.ravel(), table, panels)
    titled(fig, "Reordering: annealing search vs greedy LPT vs static homes (all with intra-node replication; "
           "bars: mean over steps)", subtitle)
    fig.tight_layout()
    return fig


def replication_plot(table: pd.DataFrame, subtitle: str):
    """Speedup over Megatron, GPU skewness and replicas used per GPU, per workload and policy."""
    panels = [("speedup_vs_megatron", "throughput / Megatron's", "throughput (tokens/s ratio)"),
              ("gpu_skewness", "rank skewness (max / mean)", "balance: max / mean tokens per GPU"),
              ("replicas_per_gpu", "replicas per GPU", "replicas held per GPU, per micro-batch x layer")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    _workload_panels(fig, axes, table, panels)
    titled(fig, "Replication: joint placement + split vs placement only vs splitting only", subtitle)
    fig.tight_layout()
    return fig


def spare_slot_plot(sweep: pd.DataFrame, subtitle: str):
    """ReLibra's speedup, skewness and replica memory share against spare slots per GPU."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    x = sweep["spare_slots_per_gpu"]
    for ax, col, ylabel in ((axes[0], "speedup_vs_megatron", "throughput / Megatron's"),
                            (axes[1], "skewness", "rank skewness (max / mean)"),
                            (axes[2], "replica_memory_share_full_model", "replica buffer / parameters, whole model (%)")):
        pct = col.startswith("replica_memory_share")
        y = sweep[col] * (100 if pct else 1)
        ax.plot(x, y, marker="o", color=POLICY_COLORS["relibra"], label="ReLibra")
        dflt = sweep[sweep["default"]]
        if len(dflt):
            ax.scatter(dflt["spare_slots_per_gpu"], dflt[col] * (100 if pct else 1), s=120,
                       facecolors="none", edgecolors="0.1", zorder=3, label="kit default")
        for xi, yi in zip(x, y):
            ax.annotate(f"{yi:.3f}", (xi, yi), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7)
        # Ratios start at 1.0 (Megatron / perfect balance) and memory at 0, so that a spread of a
        # few thousandths looks like what it is instead of filling the axis.
        floor = 0.0 if pct else 1.0
        top = float(max(y.max(), floor))
        ax.set_ylim(min(floor, float(y.min())), top + 0.15 * max(top - floor, 0.05 * max(top, 1e-9)))
        ax.set_xlabel("spare replica slots per GPU")
        ax.set_ylabel(ylabel)
        ax.set_xticks(list(x))
        ax.legend(fontsize=7, loc="lower right")
    titled(fig, "ReLibra vs the number of spare replica slots per GPU", subtitle)
    fig.tight_layout()
    return fig


# ---- 06 skewness --------------------------------------------------------------------------------
def skewness_plot(table: pd.DataFrame, subtitle: str):
    """Left: mean rank skewness vs EP size per policy; right: per task domain at one EP size."""
    order, palette = _policy_hue(table["policy"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.3))
    ep = table[table["sweep"] == "ep"]
    sns.lineplot(ep, x="ep", y="skewness", hue="policy", hue_order=order, palette=palette, marker="o", ax=axes[0])
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(sorted(ep["ep"].unique()), [str(v) for v in sorted(ep["ep"].unique())])
    axes[0].set_xlabel("EP size (GPUs per expert-parallel group)")
    axes[0].set_title(f"across EP sizes ({ep['workload'].iloc[0] if len(ep) else ''} workload)")
    dom = table[table["sweep"] == "workload"]
    sns.barplot(dom, x="workload", y="skewness", hue="policy", hue_order=order, palette=palette, ax=axes[1])
    axes[1].set_xlabel("workload (task domain)")
    axes[1].set_title(f"across domains (EP {dom['ep'].iloc[0] if len(dom) else ''})")
    for ax in axes:
        ax.axhline(1.0, color="0.2", ls="--", lw=1)
        ax.set_ylabel("rank skewness (max / mean tokens per GPU)")
        ax.get_legend().remove()
    _figure_policy_legend(fig, axes[0])
    titled(fig, "Rank skewness per policy (mean over micro-batches and layers; 1.0 = perfectly balanced)", subtitle)
    fig.tight_layout()
    return fig


# ---- 07 overheads ------------------------------------------------------------------------------
def planner_time_plot(table: pd.DataFrame, subtitle: str):
    """Planner wall seconds per step (measured) next to the simulated forward window, log scale."""
    d, palette = _policy_rows(table, drop=("megatron", "balanced", "balanced-compute"))
    fig, ax = plt.subplots(figsize=(9, 4.4))
    x = np.arange(len(d))
    w = 0.38
    ax.bar(x - w / 2, d["plan_s"], w, color=[palette[p] for p in d["policy"]])
    ax.bar(x + w / 2, d["forward_s"], w, color="0.75")
    for xi, (p, crit) in enumerate(zip(d["plan_s"], d["planner_on_critical_path"])):
        if crit:
            ax.text(xi - w / 2, p, "on critical\npath", ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(x, [POLICY_LABELS.get(p, p) for p in d["policy"]], rotation=15, ha="right")
    ax.set_ylabel("seconds per training step (log)")
    from matplotlib.patches import Patch

    ax.legend([Patch(color="0.35"), Patch(color="0.75")],
              ["left bar: planner, measured (wall s per step, policy colour)",
               "right bar: one forward pass, simulated (s): the window"],
              fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2)
    hardware = str(d["planner_hardware"].iloc[0]) if "planner_hardware" in d else "this machine"
    titled(fig, "Planner time per step vs the forward pass it hides behind",
           f"planner: measured ({hardware}) | window: {subtitle}")
    fig.tight_layout()
    return fig


def overhead_bars(table: pd.DataFrame, subtitle: str):
    """Migration share of step time, replica memory share, transfer overlap per policy (percent)."""
    d, palette = _policy_rows(table, drop=("megatron", "balanced", "balanced-compute"))
    panels = [("migration_share", "migration / step time (%)", "migration share (paper: 1.4-2.1%)"),
              ("replica_memory_share_full_model", "replica buffer / parameter memory (%)",
               "replica memory, whole model (paper: 0.13-1.62%)"),
              ("transfer_overlap", "replica transfers hidden (%)", "transfer overlap")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (col, ylabel, title) in zip(axes, panels):
        vals = 100 * d[col].astype(float).fillna(0.0)
        ax.bar(np.arange(len(d)), vals, color=[palette[p] for p in d["policy"]])
        for xi, (v, raw) in enumerate(zip(vals, d[col])):
            ax.text(xi, v, "n/a" if pd.isna(raw) else f"{v:.2f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(np.arange(len(d)), [POLICY_LABELS.get(p, p) for p in d["policy"]], rotation=25, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    titled(fig, "Overheads per policy (n/a: the policy moves no replicas)", subtitle)
    fig.tight_layout()
    return fig


def policy_summary_plot(summary: pd.DataFrame, subtitle: str, title: str = "Balancing one trace",
                        components: pd.DataFrame | None = None):
    """Speedup over Megatron and rank skewness per policy for one trace; with `components` (seconds
    per step by part and policy, relibra.experiments.narrative.step_components) a third panel stacks
    each policy's simulated step time by part, which shows why lower skewness can still run slower."""
    d, palette = _policy_rows(summary)
    ncols = 3 if components is not None else 2
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4.2))
    if components is not None:
        ax = axes[2]
        comp = components.drop(columns=["step"]).reindex(d["policy"])
        bottom = np.zeros(len(comp))
        part_colors = sns.color_palette("Set2", len(comp.columns))
        for color, col in zip(part_colors, comp.columns):
            vals = 1e3 * comp[col].to_numpy(dtype=float)
            ax.bar(np.arange(len(comp)), vals, bottom=bottom, color=color, label=col)
            bottom += vals
        ax.set_xticks(np.arange(len(comp)), [POLICY_LABELS.get(p, p) for p in comp.index], rotation=25, ha="right")
        ax.set_ylabel("simulated ms per training step")
        ax.set_title("step time by part")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        axes = axes[:2]
    for ax, col, ylabel in ((axes[0], "speedup_vs_megatron", "throughput / Megatron's (tokens/s)"),
                            (axes[1], "skewness", "rank skewness (max / mean tokens)")):
        ax.bar(np.arange(len(d)), d[col], color=[palette[p] for p in d["policy"]])
        ax.axhline(1.0, color="0.2", ls="--", lw=1)
        ax.set_xticks(np.arange(len(d)), [POLICY_LABELS.get(p, p) for p in d["policy"]], rotation=25, ha="right")
        ax.set_ylabel(ylabel)
    titled(fig, f"{title}: throughput and rank skewness per policy", subtitle)
    fig.tight_layout()
    return fig


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
    order, palette = _policy_hue(d["policy"].unique())
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
