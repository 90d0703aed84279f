"""What the notebooks' text is built from: `show`, tables sorted by what they teach, and the facts as text
(REPORT's tables, the README's rows)."""

from __future__ import annotations

import pandas as pd

from relibra.cluster import get_model, resolve_topology
from relibra.errors import RelibraError
from relibra.labels import CLAIMS, IDEALS, fact_label, fact_text, short, verdict_line


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
    """A pivot of `values` (mean) whose columns are sorted by their mean, best (highest by default) first."""
    wide = table.pivot_table(index=index, columns=columns, values=values)
    return wide[wide.mean().sort_values(ascending=ascending).index]


def fastest_first(table: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Per policy (the index; the ideal ones left out) the mean of speedup_vs_megatron and of `columns` over
    `table`'s rows, fastest first."""
    means = table.groupby("policy")[["speedup_vs_megatron", *columns]].mean()
    means = means.sort_values("speedup_vs_megatron", ascending=False)
    return means[~means.index.isin(IDEALS)]


def speedup_list(head: str, policies, detail) -> str:
    """'head:' over a bullet per policy (rows with `policy` and `speedup`): its speed-up over Megatron, then
    detail(row)."""
    return f"{head}:\n\n" + "\n".join(f"- {short(x.policy)}: {x.speedup:.2f}x Megatron, {detail(x)}" for x in policies)


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def model_differences(models) -> str:
    """How model presets differ: experts, top-k, MoE layers, hidden and expert sizes, "; "-joined."""
    parts = []
    for m in dict.fromkeys(models):
        s = get_model(m) if isinstance(m, str) else m
        parts.append(f"{s.name}: {s.num_experts} experts, top-{s.top_k}, {s.num_layers} MoE layers, hidden "
                     f"{s.hidden}, expert FFN {s.moe_ffn}")
    return "; ".join(parts)


def step_components(summary: pd.DataFrame) -> pd.DataFrame:
    """Seconds per step of each policy (rows) split into all-to-all, expert compute, exposed replica transfers,
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
    """Why `slower` takes longer per step than `faster`: ((part, seconds more), ...) for the two step_components
    that cost it most and ((part, seconds less),) for the one it gains most, among those differing by at least
    0.005 ms; ((), ()) when either policy is missing."""
    c = step_components(summary)
    if slower not in c.index or faster not in c.index:
        return (), ()
    diff = (c.loc[slower] - c.loc[faster]).drop("step")
    worse = diff[diff > 5e-6].sort_values(ascending=False)
    better = diff[diff < -5e-6].sort_values()
    return tuple(worse.head(2).items()), tuple(better.head(1).items())


def _names(facts: pd.DataFrame) -> pd.Series:
    """Each fact's name in text: its label, with its stat unless that is the plain "value"."""
    label = facts["fact"].map(fact_label)
    return label.where(facts["stat"] == "value", label + " " + facts["stat"])


def facts_table(facts: pd.DataFrame, index: str, columns: str, header: str = "") -> pd.DataFrame:
    """Facts (a facts.csv frame) as a table of text in first-seen order: a row per `index` and a column per
    `columns`, each "fact" (its label), "stat", "of" or "name" (label and stat); `header` heads the index column.
    A cell is the value as text, its `of` in brackets where neither axis is `of`. Rows of facts get the paper's
    figure ("-": none) as a last column."""
    t = facts.assign(name=_names(facts), label=facts["fact"].map(fact_label), cell=[
        fact_text(f, u, v) + (f" ({o})" if o and "of" not in (index, columns) else "")
        for f, u, v, o in zip(facts["fact"], facts["unit"], facts["value"], facts["of"])])
    axis = {"fact": "label", "name": "name", "stat": "stat", "of": "of"}
    rows, cols = axis[index], axis[columns]
    wide = t.pivot_table(index=rows, columns=cols, values="cell", aggfunc="first", sort=False)
    wide = wide.reindex(index=list(dict.fromkeys(t[rows])), columns=list(dict.fromkeys(t[cols]))).fillna("-")
    if index in ("fact", "name"):
        paper = {x: CLAIMS[f].paper if f in CLAIMS else None for x, f in zip(t[rows], t["fact"])}
        wide["paper"] = [paper[x] or "-" for x in wide.index]
    return wide.rename_axis(index=None, columns=None).reset_index(names=header)


def _figure(group: pd.DataFrame) -> str:
    """One README row's figure: per `of` (named where the row has several), per fact (named likewise) its
    stats' values; a claim's region of the verdict map reads as its verdict line (relibra.labels)."""
    fact = group["fact"].iloc[0]
    if "of_nodes" in set(group["stat"]):
        grid = group[group["of"] == "the grid"]
        cards = group[group["stat"] == "reached by the card"]
        line = verdict_line({"id": fact, **dict(zip(grid["stat"], grid["value"]))}, list(zip(cards["of"],
                                                                                           cards["value"])))
        return line.split(": ", 1)[1]
    several, named = group["fact"].nunique() > 1, group["of"].nunique() > 1
    parts = []
    for of, g in group.groupby("of", sort=False):
        items = []
        for f, h in g.groupby("fact", sort=False):
            values = ", ".join(f"{'' if st == 'value' else st + ' '}{fact_text(f, u, v)}"
                               for st, u, v in zip(h["stat"], h["unit"], h["value"]))
            items.append(f"{fact_label(f)} {values}" if several else values)
        parts.append((f"{of}: " if of and named else "") + "; ".join(items))
    claim = CLAIMS.get(fact)
    return "; ".join(parts) + (f"; paper: {claim.paper}" if not several and claim is not None and claim.paper
                               else "")


def fact_rows(facts: pd.DataFrame) -> list[dict]:
    """The README rows of a notebook's facts: one per `readme` title (and `on`), in order: what, figure, and
    how it was obtained (the scopes, on what)."""
    shown = facts[facts["readme"] != ""]
    out = []
    for (what, on), g in shown.groupby(["readme", "on"], sort=False):
        scopes = " and ".join(f"**{x}**" for x in dict.fromkeys(g["scope"]))
        out.append({"what": what, "figure": _figure(g), "how it was obtained": f"{scopes} on {on}"})
    return out


def figure_link(loaded, name: str, alt: str) -> str:
    """REPORT.md's image of figure `name` of a notebook's run (registry.Loaded): "\n![alt](<notebook>/<png>)\n",
    or "" where its manifest lists no such figure."""
    figure = next((f for f in loaded.manifest.get("figures", []) if f["name"] == name), None)
    return f"\n![{alt}]({loaded.notebook.name}/{figure['png']})\n" if figure else ""


def cluster_text(name) -> str:
    """'`paper` cluster preset (20 x 8 GPUs)', or '`name` cluster' for a spec the kit cannot parse."""
    try:
        topo = resolve_topology(str(name))
    except RelibraError:
        return f"`{name}` cluster"
    return f"`{name}` cluster preset ({topo.num_nodes} x {topo.gpus_per_node} GPUs)"


def unique(t: pd.DataFrame, column: str) -> str:
    return ", ".join(str(v) for v in dict.fromkeys(t[column]))
