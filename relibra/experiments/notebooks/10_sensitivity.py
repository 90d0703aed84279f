"""Notebook 10: how far each headline ratio moves with one input of the set-up card at a time, around
the card's default (relibra.experiments.sensitivity)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from relibra.cluster import resolve_topology
from relibra.experiments.base import Result, TryThis, mean_of, names, objects, param, table, value
from relibra.experiments.profiles import SCALES, Scale, per_profile
from relibra.experiments.sensitivity import KNOB_NAMES, RATIOS, sensitivity, tornado_table
from relibra.experiments.text import cluster_text, pct, row
from relibra.experiments.traces import TraceParams
from relibra.labels import RATIO_LABELS, knob_value
from relibra.setups import DEFAULT_CARD, SetupCard, load_card

QUESTION = "How far does each headline ratio move with the set-up?"


@dataclass(frozen=True, kw_only=True)
class Sizes(Scale):
    """The trace sizes, and the knobs moved (None: all of relibra.experiments.sensitivity.KNOBS); quick:
    two values per knob (the default and one other) instead of all."""

    knobs: tuple[str, ...] | None = None
    quick: bool = False


SIZES = {**per_profile(lambda name: Sizes(**vars(SCALES[name]))),
         "tiny": Sizes(**vars(SCALES["tiny"]), knobs=("batch layout", "RDMA rate"), quick=True)}


@dataclass(frozen=True)
class Params(TraceParams):
    setup: SetupCard = param(DEFAULT_CARD, "set-up card of the default: a name (relibra setup list) or a .toml path",
                             objects(load_card, "set-up card", single=True))
    knobs: tuple[str, ...] | None = param(None, "knobs moved, e.g. 'batch layout,NVLink rate' (None: the profile's)",
                                          names(KNOB_NAMES, "sensitivity knob"), sizes="knobs")

    def simulated_on(self) -> str:
        return self.setup.topology().name

    def subtitle(self, sizes: Sizes) -> str:
        c = resolve_topology(sizes.cluster)  # the profile's cluster names the figure (the card's is simulated)
        return (f"simulated ({c.name} cluster preset, {c.num_nodes} x {c.gpus_per_node} GPUs), EP {self.ep}, model "
                f"{self.model.name}; workload {self.the_workload(sizes)} | {self.scale_note(sizes)}")


@dataclass(kw_only=True)
class Result(Result):
    sensitivity: pd.DataFrame = table("simulated ratios ReLibra/Megatron, ReLibra/EPLB+ and ReLibra/balanced-"
                                      "compute per knob and value, one knob moved at a time")
    tornado: pd.DataFrame = table("per ratio and knob: default, lowest and highest ratio, the values giving them, "
                                  "swing (sorted by swing)")
    case: dict = value(None)  # model, workload, ep and cluster of the default set-up


def compute(p: Params, sizes: Sizes, progress: bool = True) -> Result:
    frame = sensitivity(p.model, p.ep, setup=p.setup, workload=p.the_workload(sizes),
                        micro_batches=sizes.micro_batches, layers=sizes.layers, steps=p.steps, seed=p.seed,
                        quick=sizes.quick, knobs=None if p.knobs is None else list(p.knobs), progress=progress)
    case = {"model": p.model.name, "workload": p.the_workload(sizes), "ep": p.ep, "cluster": sizes.cluster}
    return Result(sensitivity=frame, tornado=tornado_table(frame), case=case)


def _slower_links(frame: pd.DataFrame) -> list[str]:
    """Why a slower link raises ReLibra / Megatron, said only where the rows show it."""
    out = []
    for knob in ("NVLink rate", "RDMA rate"):
        d = frame[frame["knob"] == knob]
        if d.empty or "relibra_over_megatron" not in d or d["value"].nunique() < 2:
            continue
        d = d.assign(rate=pd.to_numeric(d["value"], errors="coerce")).dropna(subset=["rate"]).sort_values("rate")
        slow, dflt = d.iloc[0], d[d["is_default"].astype(bool)]
        if len(dflt) and slow["relibra_over_megatron"] > float(dflt["relibra_over_megatron"].iloc[0]) + 1e-9:
            out.append(f"A slower {knob} ({knob_value(slow['value'])} GB/s) raises ReLibra / Megatron from "
                       f"{float(dflt['relibra_over_megatron'].iloc[0]):.3f} to {slow['relibra_over_megatron']:.3f}: the "
                       "all-to-all then takes a larger share of the step, and each all-to-all lasts as long as its "
                       "busiest receiver's transfer, which balancing makes shorter; so the slower the link, the more "
                       "Megatron's busiest GPU costs.")
    return out


def story(r: Result, flat: float = 0.005) -> str:
    """Which knob moves each ratio most (from what to what, at which values), the knobs that move none
    of them by more than `flat` (relative), and the knob values where ReLibra falls behind Megatron or
    EPLB+."""
    tornado, frame = r.tornado, r.sensitivity
    t = tornado.set_index(["ratio", "knob"])
    default = {r: float(tornado.loc[tornado["ratio"] == r, "default"].iloc[0]) for r in tornado["ratio"].unique()}
    out = []
    if {"relibra_over_megatron", "relibra_over_eplb_plus", "relibra_over_balanced_compute"} <= set(default):
        out.append(f"At the default set-up ReLibra runs {default['relibra_over_megatron']:.3f}x Megatron's "
                   f"throughput and {default['relibra_over_eplb_plus']:.3f}x EPLB+'s, and reaches "
                   f"{pct(default['relibra_over_balanced_compute'])} of balanced-compute.")
    for ratio, name in RATIO_LABELS.items():
        d = tornado[tornado["ratio"] == ratio]
        if d.empty:
            continue
        top = d.iloc[0]  # tornado_table sorts by swing
        if top["swing"] <= flat * default[ratio]:
            out.append(f"- {name} barely moves with any knob here (largest swing {top['swing']:.4f}, {top['knob']}).")
            continue
        lead = f"The headline, {name}," if ratio == "relibra_over_megatron" else name
        line = (f"- {lead} moves most with **{top['knob']}**: from {top['low']:.3f} ({top['knob']} = "
                f"{knob_value(top['low_value'], top['knob'])}) to {top['high']:.3f} "
                f"({knob_value(top['high_value'], top['knob'])}), a swing of "
                f"{pct(top['swing'] / default[ratio])} of its default")
        rest = d.iloc[1:3]
        rest = rest[rest["swing"] > flat * default[ratio]]
        if len(rest):
            line += "; then " + ", ".join(f"{r['knob']} ({r['low']:.3f}-{r['high']:.3f})" for _, r in rest.iterrows())
        out.append(line + ".")
    knobs = list(dict.fromkeys(tornado["knob"]))
    still = [k for k in knobs if all(t.loc[(r, k), "swing"] <= flat * default[r] for r in default if (r, k) in t.index)]
    if still:
        out.append(f"Knobs that move none of the three ratios by more than {pct(flat)}: {', '.join(still)}.")
    out += _slower_links(frame)
    for ratio, rival in (("relibra_over_megatron", "Megatron"), ("relibra_over_eplb_plus", "EPLB+")):
        if ratio not in frame:
            continue
        moved = frame[~frame["is_default"].astype(bool)]
        if default[ratio] < 1.0:
            ahead = moved[moved[ratio] >= 1.0]
            cases = ", ".join(f"{r['knob']} = {knob_value(r['value'], r['knob'])} ({r[ratio]:.3f})" for _, r in ahead.iterrows())
            out.append(f"ReLibra is slower than {rival} at the default set-up ({default[ratio]:.3f}x); "
                       + (f"it gets ahead only at: {cases}." if cases else "no knob value tried puts it ahead."))
        else:
            behind = moved[moved[ratio] < 1.0]
            if len(behind):
                cases = ", ".join(f"{r['knob']} = {knob_value(r['value'], r['knob'])} ({r[ratio]:.3f})" for _, r in behind.iterrows())
                out.append(f"ReLibra falls behind {rival} at: {cases}.")
    return "\n\n".join(out)


def rows(r: Result, man: dict) -> list[dict]:
    t = r.tornado[r.tornado["ratio"] == "relibra_over_megatron"].sort_values("swing", ascending=False, kind="stable")
    if t.empty:
        return []
    knobs = "; then ".join(f"{k.knob}: {k.low:.2f}x ({knob_value(k.low_value, k.knob)}) to {k.high:.2f}x "
                           f"({knob_value(k.high_value, k.knob)})" for k in t.head(2).itertuples(index=False))
    c = r.case
    return [row("what moves ReLibra / Megatron most (one knob at a time)",
                f"default {float(t['default'].iloc[0]):.2f}x; most with {knobs}",
                f"**simulated**, {c['model']}, {c['workload']}, EP {c['ep']} on the {cluster_text(c['cluster'])}; "
                f"{man['scale_note']}")]


def section(r: Result, man: dict, table_md) -> str:
    """REPORT.md: how far each headline ratio moves with one knob at a time (the tornado), per knob."""
    t, c = r.tornado, r.case
    ratios = [q for q in RATIOS if q in set(t["ratio"])]
    by = {q: t[t["ratio"] == q].set_index("knob") for q in ratios}
    cells = [{"knob": k, **{f"{RATIO_LABELS[q]}: low - high": f"{by[q].loc[k, 'low']:.3f} - {by[q].loc[k, 'high']:.3f}"
                            for q in ratios}} for k in by[ratios[0]].index]  # sorted by the headline's swing
    defaults = "; ".join(f"{RATIO_LABELS[q]} {float(by[q]['default'].iloc[0]):.3f}" for q in ratios)
    figure = next((f for f in man.get("figures", []) if f["name"] == "tornado"), None)
    return (f"## How far the headline moves: sensitivity\n\nFrom notebook 10 (simulated, `{c['model']}`, "
            f"{c['workload']}, EP {c['ep']} on the `{c['cluster']}` cluster preset, {man['scale_note']}): one knob "
            f"moved at a time around the default set-up, whose ratios are {defaults}. Per knob, the lowest and highest "
            "ratio over its values, sorted by the swing of ReLibra / Megatron "
            f"([tornado.csv](10_sensitivity/tornado.csv)):\n\n{table_md(pd.DataFrame(cells))}\n"
            + (f"\n![tornado](10_sensitivity/{figure['png']})\n" if figure else ""))


TRIES = (
    TryThis(lambda p, s: {"ep": 2 * p.ep}, "ReLibra / balanced-compute at the default set-up",
            lambda r: mean_of(r.sensitivity, "relibra_over_balanced_compute", is_default=True), -1,
            "a node is then a smaller share of the EP group, so in-node replication has less room (notebook 11 "
            "follows this to EP 256)"),
)
