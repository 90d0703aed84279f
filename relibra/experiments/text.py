"""What the notebooks' text is built from: `show` (markdown in a notebook, print elsewhere), tables
sorted by what they teach, percentages, and the cells of the README's results table."""

from __future__ import annotations

import pandas as pd

from relibra.cluster import get_model, resolve_topology
from relibra.errors import RelibraError


def show(text: str) -> None:
    """Display markdown in a notebook; print it elsewhere."""
    try:
        from IPython import get_ipython  # notebook-only dependency
        from IPython.display import Markdown, display

        if get_ipython() is not None:
            display(Markdown(text))
            return
    except ImportError:
        pass
    print(text)


def ranked(table: pd.DataFrame, index, values: str, columns: str = "policy", ascending: bool = False) -> pd.DataFrame:
    """A pivot of `values` (mean) whose columns are sorted by their mean, best first (descending by
    default): a table sorted by what it teaches, not alphabetically."""
    wide = table.pivot_table(index=index, columns=columns, values=values)
    return wide[wide.mean().sort_values(ascending=ascending).index]


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def model_differences(models) -> str:
    """One line per model preset: experts, top-k, MoE layers, hidden and expert sizes (how they differ)."""
    parts = []
    for m in dict.fromkeys(models):
        s = get_model(m) if isinstance(m, str) else m
        parts.append(f"{s.name}: {s.num_experts} experts, top-{s.top_k}, {s.num_layers} MoE layers, hidden "
                     f"{s.hidden}, expert FFN {s.moe_ffn}")
    return "; ".join(parts)


def step_components(summary: pd.DataFrame) -> pd.DataFrame:
    """Seconds per step of each policy split into all-to-all, expert compute, exposed replica transfers,
    migration and the rest (dense layers, optimizer, exposed planner), from a simulator summary."""
    s = summary.set_index("policy")
    out = pd.DataFrame({
        "all-to-all": s["a2a_share"] * s["step_s"],
        "expert compute": s["expert_share"] * s["step_s"],
        "exposed replica transfers": s["exposed_transfer_share"] * s["step_s"],
        "migration": s["migration_s"],
    })
    out["the rest"] = s["step_s"] - out.sum(axis=1)
    out["step"] = s["step_s"]
    return out


def step_differences(summary: pd.DataFrame, slower: str, faster: str) -> tuple[tuple, tuple]:
    """Why `slower` takes longer per step than `faster`: ((part, seconds more), ...) for the two parts
    that cost it most and ((part, seconds less),) for the one it gains most, among the step_components
    that differ by at least 0.01 ms; ((), ()) when either policy is missing."""
    c = step_components(summary)
    if slower not in c.index or faster not in c.index:
        return (), ()
    diff = (c.loc[slower] - c.loc[faster]).drop("step")
    worse = diff[diff > 5e-6].sort_values(ascending=False)
    better = diff[diff < -5e-6].sort_values()
    return tuple(worse.head(2).items()), tuple(better.head(1).items())


# ---- cells of the README's results table -----------------------------------------------------------------
def row(what: str, figure: str, how: str) -> dict:
    return {"what": what, "figure": figure, "how it was obtained": how}


def cluster_text(name) -> str:
    """'`paper` cluster preset (20 x 8 GPUs)', or the bare name for a spec the kit cannot parse."""
    try:
        topo = resolve_topology(str(name))
    except RelibraError:
        return f"`{name}` cluster"
    return f"`{name}` cluster preset ({topo.num_nodes} x {topo.gpus_per_node} GPUs)"


def unique(t: pd.DataFrame, column: str) -> str:
    return ", ".join(str(v) for v in dict.fromkeys(t[column]))
