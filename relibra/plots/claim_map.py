"""Figure of notebook 12: the verdict as a map, one row of panels per step size, one panel per paper claim
(verdict_map_plot)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from relibra.labels import PAPER_CLAIMS
from relibra.plots.style import titled

# (claim, value format, colour map) per panel: the speed-ups rise to the paper's claim (brighter is better), the
# gap falls to it.
PANELS = tuple((c, "{:.1%}" if c.is_gap else "{:.2f}x", "viridis_r" if c.is_gap else "viridis") for c in PAPER_CLAIMS)
CARD_MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*")
CARD_COLORS = ("#d62728", "#ff7f0e", "#e377c2", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f", "#1f77b4")


def _matrix(nodes: pd.DataFrame, column: str) -> np.ndarray:
    """A node column of one facet as [tokens, shift values] (both sorted; NaN stays NaN)."""
    return nodes.pivot(index="tokens", columns="shift_value", values=column).sort_index().sort_index(
        axis=1).to_numpy(float, copy=True)


def card_facets(cards: pd.DataFrame, steps) -> list:
    """The facet (step size of the grid's nodes) each card is drawn in: the one whose sequences per rank per step
    is nearest the card's in log scale. steps: [(step_sequences, sequences_per_rank)] of the facets."""
    if cards.empty:
        return []
    return [min(steps, key=lambda s: abs(np.log(s[1]) - np.log(c)))[0] for c in cards["sequences_per_rank"]]


def _labels_below(x: np.ndarray, y: np.ndarray, ylim, height_pt: float, gap_pt: float = 20.0) -> list[bool]:
    """Per node (x, y: [n]): whether its label goes below its marker, as a node above it in about the same column
    (a third of a doubling of x) is closer than `gap_pt` points (label offset, height and the marker above) on an
    axes `height_pt` points tall spanning `ylim`."""
    per_pt = (ylim[1] - ylim[0]) / max(height_pt, 1.0)
    lx = np.log2(np.asarray(x, dtype=float))
    below = [False] * len(x)
    for i in range(len(x)):
        above = [y[j] - y[i] for j in range(len(x)) if j != i and abs(lx[j] - lx[i]) < 1 / 3 and y[j] >= y[i]]
        below[i] = bool(above) and min(above) < gap_pt * per_pt
    return below


def _clear_clabel(ax, cs, text: str, points: np.ndarray, ylim) -> None:
    """Label contour set `cs` with `text` at the first of its vertices, farthest from `points` [n, 2] (the
    nodes, the cards and their labels; a log2 x axis) first, where the label meets no other text of `ax`."""
    verts = np.concatenate([seg for segs in cs.allsegs for seg in segs if len(seg)])
    scale = np.array([max(np.ptp(np.log2(points[:, 0])), 1.0), max(ylim[1] - ylim[0], 1e-9)])

    def norm(p):
        return np.c_[np.log2(p[:, 0]), p[:, 1]] / scale

    far = np.linalg.norm(norm(verts)[:, None, :] - norm(points)[None, :, :], axis=2).min(axis=1)
    renderer = ax.figure.canvas.get_renderer()
    others = [t.get_window_extent(renderer) for t in ax.texts if t.get_visible() and t.get_text().strip()]
    tries = [*np.argsort(-far)[:80], int(np.argmax(far))]  # the farthest again, and kept, when none is clear
    for n, i in enumerate(tries):
        before = set(map(id, ax.texts))
        # not inline (a label tried and removed would leave a gap in the line): on a white box instead
        cs.clabel(fmt={cs.levels[0]: text}, fontsize=8, manual=[tuple(verts[i])], inline=False)
        new = [t for t in ax.texts if id(t) not in before]
        for t in new:  # level, on a white box: it fits between the nodes' labels where a slanted one would not
            t.set_rotation(0)
            t.set_bbox({"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85})
        if n == len(tries) - 1 or not any(t.get_window_extent(renderer).overlaps(o) for t in new for o in others):
            return
        for t in new:
            t.remove()
        cs.labelTexts.clear(), cs.labelCValues.clear(), cs.labelXYs.clear()


def verdict_map_plot(nodes: pd.DataFrame, cards: pd.DataFrame, calibration: dict, subtitle: str,
                     grid_note: str = "", shift_range=(0.0, 0.3)):
    """One row of panels per step size, one panel per paper claim: the best-over-feasible-cases field of the
    facet's nodes (colour, values written) over the simulated tokens per EP rank (log x) and the generated trace's
    micro-batch vs step correlation (y); a node where no case fits a grey hatched cross, one at a shift beyond
    `shift_range` (the assumed range) a dashed edge; the claim's levels as black contours over the feasible nodes,
    else a note under the axis label; each card a labelled marker in the facet nearest its step size (hollow when
    it does not fit); the calibration a dotted line.

    nodes: claim_map.node_fields; cards: claim_map.card_points (or merge_coincident of it); calibration:
    {"label", "mb_vs_step_corr", "tokens_per_ep_rank"} or {}.
    """
    steps = [(s, float(nodes.loc[nodes["step_sequences"] == s, "sequences_per_rank"].mean()))
             for s in sorted(nodes["step_sequences"].unique())]
    height = 5.6 * len(steps) + 0.8
    fig, axes = plt.subplots(len(steps), len(PANELS), figsize=(6.2 * len(PANELS), height), squeeze=False)
    facet_of = card_facets(cards, steps)
    card_xy = cards[["tokens_per_ep_rank", "mb_vs_step_corr"]].to_numpy(float) if len(cards) else np.empty((0, 2))
    all_x = np.concatenate([nodes["tokens_per_ep_rank"].to_numpy(float), card_xy[:, 0]])
    all_y = np.concatenate([nodes["mb_vs_step_corr"].to_numpy(float), card_xy[:, 1]]
                           + ([[calibration["mb_vs_step_corr"]]] if calibration else []))
    xlim = (2 ** np.floor(np.log2(np.nanmin(all_x)) - 0.3), 2 ** np.ceil(np.log2(np.nanmax(all_x)) + 0.3))
    ylim = (max(-0.05, float(np.nanmin(all_y)) - 0.05), min(1.02, float(np.nanmax(all_y)) + 0.04))
    card_handles, contour_labels = [], []  # the contours' labels are placed once the layout is final
    for row, (step, per_rank) in enumerate(steps):
        facet = nodes[nodes["step_sequences"] == step]
        xs, ys = _matrix(facet, "tokens_per_ep_rank"), _matrix(facet, "mb_vs_step_corr")
        fit = _matrix(facet.assign(feasible=facet["feasible"].astype(float)), "feasible") > 0
        shifts = np.sort(facet["shift_value"].unique())
        beyond = np.broadcast_to(shifts[None, :] > shift_range[1], xs.shape)
        for ax, (claim, fmt, cmap) in zip(axes[row], PANELS):
            z = np.where(fit, _matrix(facet, f"{claim.id}_best"), np.nan)
            ok = ~np.isnan(z)
            lo, hi = (float(np.nanmin(z)), float(np.nanmax(z))) if ok.any() else (0.0, 1.0)
            surface = ok.all() and min(z.shape) >= 2  # contours need two nodes along each axis, all feasible
            levels = [lv for lv in (claim.level, claim.lower) if lv is not None]
            in_facet = [i for i, f in enumerate(facet_of) if f == step]
            card_values = [v for v in cards[f"{claim.id}_mean"].iloc[in_facet] if np.isfinite(v)] if len(cards) else []
            span_lo, span_hi = min([lo] + card_values), max([hi] + card_values)
            norm = plt.Normalize(span_lo, span_hi if span_hi > span_lo else span_lo + 1e-9)
            if surface:
                ax.contourf(xs, ys, z, levels=12, cmap=cmap, norm=norm, alpha=0.85)
            sc = ax.scatter(xs[ok & ~beyond], ys[ok & ~beyond], c=z[ok & ~beyond], cmap=cmap, norm=norm, s=36,
                            edgecolors="0.15", linewidths=0.6, zorder=3)
            ax.scatter(xs[ok & beyond], ys[ok & beyond], c=z[ok & beyond], cmap=cmap, norm=norm, s=36,
                       edgecolors="0.15", linewidths=1.0, linestyles="--", zorder=3)
            ax.scatter(xs[~ok], ys[~ok], marker="X", s=70, c="0.75", edgecolors="0.3", hatch="////", zorder=3)
            height_pt = fig.get_figheight() * 72 * ax.get_position().height
            below = _labels_below(xs.ravel(), ys.ravel(), ylim, height_pt)
            for x, y, v, down in zip(xs.ravel(), ys.ravel(), z.ravel(), below):
                # above the card markers (zorder 6), so that no card hides a node's label; below a node whose
                # label would meet the label of the node above it
                ax.annotate("does not fit" if np.isnan(v) else fmt.format(v), (x, y), xytext=(0, -6 if down else 6),
                            textcoords="offset points", ha="center", va="top" if down else "bottom", fontsize=7,
                            color="0.45" if np.isnan(v) else "0.05", zorder=6.5,
                            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.7})
            notes = []
            for level in levels:
                if surface and lo <= level <= hi:
                    cs = ax.contour(xs, ys, z, levels=[level], colors="black", linewidths=2.0, linestyles="--",
                                    zorder=5)
                    points = np.concatenate([np.c_[xs.ravel(), ys.ravel()], card_xy[in_facet]])
                    labels = points + [0.0, 12 * (ylim[1] - ylim[0]) / height_pt]  # about where the nodes' labels sit
                    contour_labels.append((ax, cs, "paper " + fmt.format(level), np.concatenate([points, labels])))
                elif not ok.any():
                    notes.append("no node of this step size fits in memory")
                elif lo <= level <= hi:
                    notes.append(f"paper's {fmt.format(level)}: crossed between feasible nodes (no contour drawn "
                                 "where nodes do not fit)")
                else:
                    notes.append(f"paper's {fmt.format(level)}: " + (
                        f"every feasible node is {'below' if hi < level else 'above'} it ({fmt.format(lo)}-"
                        f"{fmt.format(hi)})" if claim.is_gap else f"reached at no feasible node (best {fmt.format(hi)})"
                    ))
            if calibration:
                ax.axhline(calibration["mb_vs_step_corr"], color="0.25", lw=1.0, ls=":", zorder=2)
                ax.text(xlim[1] / 1.05, calibration["mb_vs_step_corr"] - 0.004,
                        f"tiny real RL trace: {calibration['mb_vs_step_corr']:.2f}", fontsize=7, color="0.25",
                        va="top", ha="right")
            for i, (_, c) in enumerate(cards.iterrows()):
                marker, color = CARD_MARKERS[i % len(CARD_MARKERS)], CARD_COLORS[i % len(CARD_COLORS)]
                fits = bool(c["feasible"])
                if ax is axes[0][0]:
                    card_handles.append(Line2D([], [], marker=marker, color="none", markersize=9,
                                               markerfacecolor=color if fits else "none",
                                               markeredgecolor="black" if fits else color,
                                               label=f"card {c['setup']}" + ("" if fits else " (does not fit)")))
                if facet_of[i] != step:
                    continue
                ax.scatter([c["tokens_per_ep_rank"]], [c["mb_vs_step_corr"]], marker=marker, s=110,
                           c=color if fits else "none", edgecolors="black" if fits else color, linewidths=1.0,
                           zorder=6)
                text = fmt.format(c[f"{claim.id}_mean"]) if fits else "does not fit"
                ax.annotate(text, (c["tokens_per_ep_rank"], c["mb_vs_step_corr"]), xytext=(7, -11),
                            textcoords="offset points", fontsize=8, fontweight="bold", color=color, zorder=7,
                            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": color, "alpha": 0.85})
            notes = list(dict.fromkeys(notes))
            ax.set_xscale("log", base=2)
            ticks = [2 ** k for k in range(int(np.log2(xlim[0])), int(np.log2(xlim[1])) + 1)]
            ax.set_xticks(ticks, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks])
            ax.set_xlim(*xlim)
            ax.set_ylim(*ylim)
            # the notes go under the axis label, where no node's label can be (tight_layout makes room)
            ax.set_xlabel("\n".join(["tokens per EP rank per micro-batch (simulated mean, log scale)", *notes]))
            ax.set_ylabel("micro-batch vs step load correlation\n(generated trace)")
            ax.set_title(f"{claim.verdict_label}\n{step} sequences per step ({per_rank:g} per rank): best over "
                         "feasible cases", fontsize=10)
            tick_fmt = fmt if span_hi - span_lo > 0.05 else fmt.replace(".2f", ".3f").replace(".1%", ".2%")
            fig.colorbar(sc, ax=ax, shrink=0.8, pad=0.02, format=(lambda v, _, f=tick_fmt: f.format(v)))
    node = {"marker": "o", "color": "none", "markerfacecolor": "0.7", "markeredgecolor": "0.15", "markersize": 6}
    handles = card_handles + [
        Line2D([], [], **node, label="grid node (best over feasible models x workloads x seeds)"),
        Line2D([], [], **node, linestyle="none", markeredgewidth=1.0,
               label=f"node at a shift beyond {shift_range[1]:g}: sensitivity of the assumed shift"),
        Line2D([], [], marker="X", color="none", markerfacecolor="0.75", markeredgecolor="0.3", markersize=8,
               label="node where no case fits in HBM (left out of every claim)"),
        Line2D([], [], color="black", lw=2.0, ls="--", label="the paper's claim (contour)")]
    if calibration:
        handles.append(Line2D([], [], color="0.25", lw=1.0, ls=":", label=f"{calibration['label']}"))
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=min(3, len(handles)), fontsize=8,
               title="card markers: the card's mean over its feasible cases, in the facet nearest its step size"
                     + (f"; {grid_note}" if grid_note else ""), title_fontsize=8)
    rows = (len(handles) + 2) // 3
    titled(fig, "The verdict as a map: where do the paper's claims (1.6x over Megatron, 1.2x over EPLB+, within "
           f"6-10% of Balanced) hold? Higher correlation = less micro-batch shift (an assumption, "
           f"{shift_range[0]:g}-{shift_range[1]:g} with sensitivity beyond)", subtitle,
           rect=(0, (0.35 + 0.25 * rows) / height, 1, 0.97))
    for ax, cs, text, points in contour_labels:
        _clear_clabel(ax, cs, text, points, ylim)
    return fig
