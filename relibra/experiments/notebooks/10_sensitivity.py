"""Notebook 10: how far each headline ratio moves with one input of the set-up card at a time, around
the card's default (relibra.studies.sensitivity)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from relibra.errors import ConfigError
from relibra.experiments.base import Fact, Result, TryThis, mean_of, objects, param, table, value
from relibra.experiments.profiles import SCALES, Scale, per_profile
from relibra.studies.sensitivity import RATIOS, KnobParams, knob_values, sensitivity, tornado_table
from relibra.experiments.text import facts_table, figure_link, pct
from relibra.experiments.traces import TraceParams
from relibra.labels import RATIO_LABELS, knob_value
from relibra.setups import DEFAULT_CARD, SetupCard, load_card

QUESTION = "How far does each headline ratio move with the set-up?"


@dataclass(frozen=True, kw_only=True)
class Sizes(Scale):
    """The trace sizes, and the knobs moved (None: all of relibra.studies.sensitivity.KNOBS); quick:
    two values per knob (the default and one other) instead of all."""

    knobs: tuple[str, ...] | None = None
    quick: bool = False


SIZES = {**per_profile(lambda name: Sizes(**vars(SCALES[name]))),
         "tiny": Sizes(**vars(SCALES["tiny"]), knobs=("batch layout", "RDMA rate"), quick=True)}


@dataclass(frozen=True)
class Params(TraceParams, KnobParams):
    setup: SetupCard = param(DEFAULT_CARD, "set-up card of the default: a name (relibra setup list) or a .toml path",
                             objects(load_card, "set-up card", single=True))

    def check(self, notebook: str, sizes: Sizes) -> None:
        """The card gives every knob's sweep (knob_values), before any simulation."""
        super().check(notebook, sizes)
        try:
            knob_values(sizes.quick, self.setup)
        except ConfigError as exc:
            raise ConfigError(f"{notebook}: setup: {exc}") from None

    def simulated_on(self) -> str:
        return self.setup.topology().name

    def subtitle(self, sizes: Sizes) -> str:
        c = self.setup.topology()  # the card's cluster: the one simulated
        return (f"simulated on the `{self.setup.name}` set-up card ({c.num_nodes} x {c.gpus_per_node} GPUs), EP "
                f"{self.ep}, model {self.model.name}; workload {self.the_workload(sizes)} | {self.scale_note(sizes)}")


@dataclass(kw_only=True)
class Result(Result):
    sensitivity: pd.DataFrame = table("simulated ratios ReLibra/Megatron, ReLibra/EPLB+ and ReLibra/balanced-"
                                      "compute per knob and value, one knob moved at a time")
    tornado: pd.DataFrame = table("per ratio and knob: default, lowest and highest ratio, the values giving them, "
                                  "swing (sorted by swing)")
    case: dict = value(None)  # model, workload, ep and set-up card (whose cluster is simulated) of the default


def compute(p: Params, sizes: Sizes, progress: bool = True) -> Result:
    frame = sensitivity(p.model, p.ep, setup=p.setup, workload=p.the_workload(sizes),
                        micro_batches=sizes.micro_batches, layers=sizes.layers, steps=p.steps, seed=p.seed,
                        quick=sizes.quick, knobs=None if p.knobs is None else list(p.knobs), progress=progress)
    c = p.setup.topology()
    case = {"model": p.model.name, "workload": p.the_workload(sizes), "ep": p.ep, "setup": p.setup.name,
            "nodes_x_gpus": f"{c.num_nodes} x {c.gpus_per_node}"}
    return Result(sensitivity=frame, tornado=tornado_table(frame), case=case)


FLAT = 0.005  # a knob whose swing is at most this share of a ratio's default leaves the ratio flat


@dataclass(frozen=True)
class Swing:
    """One knob's reach on one ratio: lowest and highest ratio over its values, the values (as text)."""

    knob: str
    low: float
    high: float
    low_value: str
    high_value: str
    swing: float


@dataclass(frozen=True)
class Summary:
    default: dict[str, float]  # ratio id -> its value at the default set-up
    swings: dict[str, tuple[Swing, ...]]  # ratio id -> its knobs, largest swing first
    flat_knobs: tuple[str, ...]  # knobs that move no ratio by more than FLAT
    slower_links: tuple[tuple[str, str, float, float], ...]  # (link, its slowest rate, default, ratio there)
    turns: dict[str, tuple[tuple[str, str, float], ...]]  # ratio id -> (knob, value, ratio) where ReLibra
    # gets ahead (default < 1) or falls behind (default >= 1) of the rival


def _slower_links(frame: pd.DataFrame) -> tuple:
    """Where a link's slowest rate raises ReLibra / Megatron above its default."""
    out = []
    for knob in ("NVLink rate", "RDMA rate") if "knob" in frame else ():
        d = frame[frame["knob"] == knob]
        if d["value"].nunique() < 2:
            continue
        d = d.assign(rate=pd.to_numeric(d["value"], errors="coerce")).dropna(subset=["rate"]).sort_values("rate")
        slow, dflt = d.iloc[0], d.loc[d["is_default"].astype(bool), "relibra_over_megatron"]
        if len(dflt) and slow["relibra_over_megatron"] > float(dflt.iloc[0]) + 1e-9:
            out.append((knob, knob_value(slow["value"]), float(dflt.iloc[0]), slow["relibra_over_megatron"]))
    return tuple(out)


def summarize(r: Result) -> Summary:
    """The tornado's bars per ratio (tornado_table's order: largest swing first) and the sensitivity rows'
    turns: the knob values where ReLibra gets ahead of or falls behind Megatron and EPLB+."""
    t, frame = r.tornado, r.sensitivity
    default = t.groupby("ratio", sort=False)["default"].first().astype(float).to_dict()
    swings = {q: tuple(Swing(x.knob, x.low, x.high, knob_value(x.low_value, x.knob), knob_value(x.high_value, x.knob),
                             x.swing) for x in d.itertuples(index=False)) for q, d in t.groupby("ratio", sort=False)}
    flat = (t["swing"] <= FLAT * t["ratio"].map(default)).groupby(t["knob"], sort=False).all()
    turns = {}
    for q in [q for q in ("relibra_over_megatron", "relibra_over_eplb_plus") if q in frame]:
        moved = frame[~frame["is_default"].astype(bool)]
        d = moved[moved[q] >= 1.0] if default[q] < 1.0 else moved[moved[q] < 1.0]
        turns[q] = tuple((x["knob"], knob_value(x["value"], x["knob"]), x[q]) for _, x in d.iterrows())
    return Summary(default, swings, tuple(flat.index[flat]), _slower_links(frame), turns)


def story(s: Summary) -> str:
    """Which knob moves each ratio most (from what to what, at which values), the knobs that move none
    of them by more than FLAT (relative), and the knob values where ReLibra falls behind Megatron or
    EPLB+."""
    d, out = s.default, []
    if {"relibra_over_megatron", "relibra_over_eplb_plus", "relibra_over_balanced_compute"} <= set(d):
        out.append(f"At the default set-up ReLibra runs {d['relibra_over_megatron']:.3f}x Megatron's "
                   f"throughput and {d['relibra_over_eplb_plus']:.3f}x EPLB+'s, and reaches "
                   f"{pct(d['relibra_over_balanced_compute'])} of balanced-compute.")
    for ratio, name in RATIO_LABELS.items():
        if not s.swings.get(ratio):
            continue
        top, *rest = s.swings[ratio]
        if top.swing <= FLAT * d[ratio]:
            out.append(f"- {name} barely moves with any knob here (largest swing {top.swing:.4f}, {top.knob}).")
            continue
        lead = f"The headline, {name}," if ratio == "relibra_over_megatron" else name
        line = (f"- {lead} moves most with **{top.knob}**: from {top.low:.3f} ({top.knob} = {top.low_value}) to "
                f"{top.high:.3f} ({top.high_value}), a swing of {pct(top.swing / d[ratio])} of its default")
        rest = [x for x in rest[:2] if x.swing > FLAT * d[ratio]]
        if rest:
            line += "; then " + ", ".join(f"{x.knob} ({x.low:.3f}-{x.high:.3f})" for x in rest)
        out.append(line + ".")
    if s.flat_knobs:
        out.append(f"Knobs that move none of the three ratios by more than {pct(FLAT)}: {', '.join(s.flat_knobs)}.")
    out += [f"A slower {knob} ({rate} GB/s) raises ReLibra / Megatron from {dflt:.3f} to {slow:.3f}: the all-to-all "
            "then takes a larger share of the step, and each all-to-all lasts as long as its busiest receiver's "
            "transfer, which balancing makes shorter; so the slower the link, the more Megatron's busiest GPU costs."
            for knob, rate, dflt, slow in s.slower_links]
    for ratio, rival in (("relibra_over_megatron", "Megatron"), ("relibra_over_eplb_plus", "EPLB+")):
        if ratio not in s.turns:
            continue
        cases = ", ".join(f"{k} = {v} ({x:.3f})" for k, v, x in s.turns[ratio])
        if d[ratio] < 1.0:
            out.append(f"ReLibra is slower than {rival} at the default set-up ({d[ratio]:.3f}x); "
                       + (f"it gets ahead only at: {cases}." if cases else "no knob value tried puts it ahead."))
        elif cases:
            out.append(f"ReLibra falls behind {rival} at: {cases}.")
    return "\n\n".join(out)


def facts(r: Result, scale: str) -> list[Fact]:
    """Per headline ratio, its value at the default set-up and, per knob (largest swing of ReLibra / Megatron
    first), its lowest and highest over the knob's values; the README shows ReLibra / Megatron's two largest."""
    s, c, out = summarize(r), r.case, []
    on = (f"{c['model']}, {c['workload']}, EP {c['ep']} on the `{c['setup']}` set-up card ({c['nodes_x_gpus']} "
          f"GPUs); {scale}")
    for q in (q for q in RATIOS if q in s.swings):
        title = "what moves ReLibra / Megatron most (one knob at a time)" if q == "relibra_over_megatron" else ""
        out.append(Fact(q, s.default[q], "ratio", "default", on=on, readme=title))
        out += [Fact(q, v, "ratio", stat, f"{k.knob} = {value}", on=on, readme=title if i < 2 else "")
                for i, k in enumerate(s.swings[q]) for stat, v, value in (("low", k.low, k.low_value),
                                                                           ("high", k.high, k.high_value))]
    return out


def section(x, table_md) -> str:
    """REPORT.md: how far each headline ratio moves with one knob at a time (the tornado), per knob."""
    f, man, c = x.facts, x.manifest, x.result.case
    f = f[f["stat"] != "default"].assign(of=f["of"].str.split(" = ").str[0])
    defaults = "; ".join(f"{RATIO_LABELS[q]} {v:.3f}" for q, v in x.summary.default.items() if q in RATIOS)
    return (f"## How far the headline moves: sensitivity\n\nFrom notebook 10 (simulated, `{c['model']}`, "
            f"{c['workload']}, EP {c['ep']} on the `{c['setup']}` set-up card ({c['nodes_x_gpus']} GPUs), "
            f"{man['scale_note']}): one knob moved at a time around the default set-up, whose ratios are {defaults}. "
            "Per knob, the lowest and highest ratio over its values, sorted by the swing of ReLibra / Megatron "
            f"([tornado.csv](10_sensitivity/tornado.csv)):\n\n{table_md(facts_table(f, 'of', 'name', 'knob'))}\n"
            + figure_link(x, "tornado", "tornado"))


TRIES = (
    TryThis(lambda p, s: {"ep": 4 * p.ep}, "ReLibra / balanced-compute at the default set-up",
            lambda r: mean_of(r.sensitivity, "relibra_over_balanced_compute", is_default=True), -1,
            "the EP group then spans four times as many GPUs, so a node is a smaller share of it and in-node "
            "replication has less room (notebook 11 follows this to EP 256; an EP size that stays inside one "
            "node gives replication the same room)"),
)
