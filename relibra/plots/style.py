"""The kit's look shared by every figure: policy colours and labels, titles that say where the numbers come from,
saving as PNG + SVG."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import matplotlib

if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline", "svg", "pdf") and (
        not os.environ.get("DISPLAY")):  # headless runs (papermill, tests) must never try to open a window
    matplotlib.use("Agg")

import matplotlib.pyplot as plt
import matplotlib.ticker  # noqa: F401  (integer step axes)
import pandas as pd
import seaborn as sns

from relibra import labels as _labels
from relibra.cluster import get_model
from relibra.paths import atomic_path

# Policy colours and labels: the kit's one table (relibra.labels).
POLICY_COLORS = {p.name: p.colour for p in _labels.POLICY_TABLE}
POLICY_LABELS = {p.name: p.label for p in _labels.POLICY_TABLE}
_TAB = sns.color_palette("tab10", 10)


def model_label(name: str) -> str:
    """'<preset> (E experts, top-k, L MoE layers, hidden H)', for per-model figures."""
    try:
        m = get_model(name)
    except Exception:  # a label only: an unknown name stays as it is
        return name
    return f"{name} ({m.num_experts} experts, top-{m.top_k}, {m.num_layers} MoE layers, hidden {m.hidden})"


def set_style() -> None:
    """The kit's look: seaborn whitegrid, readable fonts, deterministic SVG output."""
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 130, "savefig.bbox": "tight", "axes.titlesize": 11,
                         "figure.titlesize": 12, "legend.fontsize": 8,
                         "svg.hashsalt": "relibra"})  # stable element ids: same data, same SVG bytes


policy_order = _labels.policy_order


def policy_palette(policies) -> dict:
    return {p: _labels.colour(p) for p in policies}


def titled(fig, title: str, subtitle: str, **layout):
    """`fig`, its title on the first line and its provenance (simulated / measured, scale) below, wrapped to the
    width, laid out by fig.tight_layout(**layout)."""
    width = max(40, int(fig.get_figwidth() * 12))
    lines = textwrap.wrap(title, width) + textwrap.wrap(subtitle, int(width * 1.1))
    # at the figure's top edge, so that tight_layout makes room under it (and nothing above it)
    fig.suptitle("\n".join(lines), fontsize=11, y=0.995, va="top")
    fig.tight_layout(**layout)
    return fig


def legend_below(fig, ax, title: str, subtitle: str, bottom: float, /, **legend):
    """`fig` titled and laid out above `bottom` (a share of its height), `ax`'s legend in one row under the panels,
    clear of the title and the data; `legend`: more fig.legend options (its own title too; fontsize 8 unless
    given)."""
    handles, labels = ax.get_legend_handles_labels()
    titled(fig, title, subtitle, rect=(0, bottom, 1, 1))
    fig.legend(handles, labels, ncol=len(labels), loc="lower center", bbox_to_anchor=(0.5, 0.0), frameon=False,
               **{"fontsize": 8, **legend})
    return fig


def save_figure(fig, stem: str | Path) -> tuple[Path, Path]:
    """Write <stem>.png and <stem>.svg (no timestamps: same data, same bytes). In a notebook kernel, also display
    the PNG as the cell's figure and close `fig` (not drawn twice), whatever the backend (even Agg)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    with atomic_path(png) as tmp:  # the temporary name keeps the suffix that picks the format
        fig.savefig(tmp, metadata={"Software": None})
    with atomic_path(svg) as tmp:
        fig.savefig(tmp, metadata={"Date": None, "Creator": None})
    try:
        from IPython import get_ipython  # notebook-only dependency
        from IPython.display import Image, display
    except ImportError:
        return png, svg
    shell = get_ipython()
    if shell is not None and hasattr(shell, "kernel"):
        display(Image(filename=str(png)))
        plt.close(fig)
    return png, svg


def policy_hue(policies):
    order = policy_order(policies)
    return order, policy_palette(order)


def policy_rows(table: pd.DataFrame, drop=()) -> tuple[pd.DataFrame, dict]:
    """`table`'s rows (one per policy) in POLICY_ORDER, those of `drop` left out, and the policy palette."""
    order, palette = policy_hue(table["policy"].unique())
    order = [p for p in order if p not in drop]
    return table.set_index("policy").loc[order].reset_index(), palette


def figure_policy_legend(fig, ax) -> None:
    """One legend for the whole figure, right of the panels, from `ax`'s policy handles."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, [POLICY_LABELS.get(l, l) for l in labels], title="policy", loc="center left",
               bbox_to_anchor=(1.0, 0.5), fontsize=8)
