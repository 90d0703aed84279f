"""Notebook 11, beyond the paper's scale: throughput ratios and planner time from EP16 to EP256 over
model sizes and cluster kinds (relibra.studies.scale)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from relibra.cluster import ModelShape, Topology, get_model, resolve_topology
from relibra.experiments.base import PATH, Fact, Params, Result, TryThis, integer, integers, objects, param, table
from relibra.experiments.profiles import SCALES
from relibra.studies.scale import SCALE_POLICIES, ScaleSweep, best_other, scale_sweep
from relibra.experiments.text import pct
from relibra.experiments.traces import PROFILE, WORKLOAD, own_policies
from relibra.labels import short as label

QUESTION = "Where does in-node replication run out of room between EP16 and EP256?"
# Three model sizes, 8-GPU nodes against NVL72 racks, EP 16 to 256.
MODELS = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3")
CLUSTERS, EP_SIZES = ("paper,nodes=32", "gb200-nvl72x4"), (16, 32, 64, 128, 256)
SIZES = {"tiny": ScaleSweep(("tiny",), ("cpu-gloo,nodes=4", "nvl72"), (4, 8, 32), layers=2, micro_batches=2),
         "laptop": ScaleSweep(MODELS, CLUSTERS, EP_SIZES), "gpu": ScaleSweep(MODELS, CLUSTERS, EP_SIZES),
         "paper": ScaleSweep(MODELS, CLUSTERS, EP_SIZES, layers=None, micro_batches=32)}


@dataclass(frozen=True)
class Params(Params):
    profile: str = param("laptop", "sets the grid's layers and micro-batches", PROFILE, affects=False)
    models: tuple[ModelShape, ...] = param(None, "comma-separated model presets (None: the profile's)",
                                           objects(get_model, "model presets"), sizes="models")
    clusters: tuple[Topology, ...] = param(None, "cluster presets or specs separated by semicolons (None: the "
                                           "profile's)", objects(resolve_topology, "clusters", sep=";"),
                                           sizes="clusters")
    eps: tuple[int, ...] = param(None, "comma-separated EP sizes (None: the profile's)", integers(1, 4096),
                                 sizes="ep_sizes")
    workload: tuple[str, ...] | None = param(None, "the workload (None: the profile's)", WORKLOAD)
    policies: tuple[str, ...] = own_policies(",".join(SCALE_POLICIES))
    seed: int = param(0, "same seed, same numbers", integer(0))
    out_dir: str | None = param(None, "where results go (None: results/interactive/11_scale)", PATH,
                                affects=False)

    def the_workload(self) -> str:
        return self.workload[0] if self.workload else SCALES[self.profile].workload

    def scale_note(self, g: ScaleSweep) -> str:
        layers = "all MoE layers" if g.layers is None else f"first {g.layers} MoE layers"
        return (f"{self.profile} profile: {layers}, {g.micro_batches} micro-batches, the last of {g.steps} steps "
                f"simulated, seed {self.seed}")

    def simulated_on(self) -> str:
        return ", ".join(c.name for c in self.clusters)


@dataclass(kw_only=True)
class Result(Result):
    scale: pd.DataFrame = table("per model, cluster, EP and policy: simulated tokens/s, speed-up over Megatron, "
                                "fraction of balanced-compute, skewness; measured planner wall and CPU seconds")
    relibra_h_vs_best: pd.DataFrame = table("per case: relibra-h's speed-up and fraction of balanced-compute beside "
                                            "the best other policy's")


def compute(p: Params, g: ScaleSweep, progress: bool = True) -> Result:
    t = scale_sweep(p.models, p.clusters, p.eps, g, policies=p.policies, workload=p.the_workload(), seed=p.seed,
                    progress=progress)
    return Result(scale=t, relibra_h_vs_best=best_other(t))


PLANNER_TARGET_S = 2.0  # a step's plan must stay under this to hide behind the previous step


@dataclass(frozen=True)
class Point:
    speedup: float  # over Megatron
    frac_of_balanced_compute: float
    skewness: float


@dataclass(frozen=True)
class Largest:
    """One (model, cluster) at its largest EP: ReLibra's and relibra-h's (None: not simulated) figures."""

    model: str
    cluster: str
    ep: int
    relibra: Point
    relibra_h: Point | None


@dataclass(frozen=True)
class Against:
    """relibra-h against the best other policy in one case: a row of relibra.studies.scale.best_other."""

    model: str
    cluster: str
    ep: int
    speedup: float
    frac_of_balanced_compute: float
    best_other: str
    over_best_other: float


@dataclass(frozen=True)
class Summary:
    largest: tuple[Largest, ...]
    cases: int  # cases with relibra-h and another policy
    behind: int  # of them, where relibra-h trails the best other policy
    worst: Against | None  # the largest of those gaps
    top: tuple[Against, ...]  # per (model, cluster), the largest EP
    skipped: tuple[tuple[str, str, int, str], ...]  # (model, cluster, ep, why) of the cases that could not run
    slowest_plan: tuple[str, str, int, float] | None  # (policy, model, ep, CPU seconds of the simulated layers)


def _point(x) -> Point:
    return Point(x["speedup_vs_megatron"], x["frac_of_balanced_compute"], x["skewness"])


def _against(x) -> Against:
    return Against(x.model, x.cluster, int(x.ep), x.speedup, x.frac_of_balanced_compute, x.best_other,
                   x.over_best_other)


def summarize(r: Result) -> Summary:
    table, t = r.scale, r.relibra_h_vs_best
    if not len(table):  # nothing simulated
        table = pd.DataFrame(columns=["model", "cluster", "ep", "policy", "status", "plan_cpu_s"])
    ok = table[table["status"] == "ok"]
    largest = []
    for (model, cluster), g in ok.groupby(["model", "cluster"], sort=False):
        top = g[g["ep"] == g["ep"].max()].set_index("policy")
        if "relibra" in top.index:
            largest.append(Largest(model, cluster, int(g["ep"].max()), _point(top.loc["relibra"]),
                                   _point(top.loc["relibra-h"]) if "relibra-h" in top.index else None))
    behind = t[t["over_best_other"] < 1.0 - 1e-9] if len(t) else t
    tops = t.loc[t.groupby(["model", "cluster"], sort=False)["ep"].idxmax()] if len(t) else t
    planners = ok[ok["policy"].isin(("relibra", "relibra-h"))]
    slow = planners.loc[planners["plan_cpu_s"].idxmax()] if len(planners) else None
    return Summary(tuple(largest), len(t), len(behind),
                   _against(behind.loc[behind["over_best_other"].idxmin()]) if len(behind) else None,
                   tuple(_against(x) for x in tops.itertuples()),
                   tuple((x.model, x.cluster, int(x.ep), x.status.removeprefix("impossible: "))
                         for x in table[table["status"] != "ok"].itertuples()),
                   None if slow is None else (slow["policy"], slow["model"], int(slow["ep"]), slow["plan_cpu_s"]))


def story(s: Summary) -> str:
    """What notebook 11's sweep says: where ReLibra's in-node replication runs out of room (its
    fraction of balanced-compute at the largest EP per cluster), whether relibra-h wins there against
    the best other policy, the cases that could not run and the slowest planner step against
    PLANNER_TARGET_S."""
    out = []
    for x in s.largest:
        a, h = x.relibra, x.relibra_h
        out.append(f"- **{x.model} on {x.cluster}**, largest EP {x.ep}: ReLibra {a.speedup:.3f}x Megatron "
                   f"({pct(a.frac_of_balanced_compute)} of balanced-compute, skewness {a.skewness:.2f})"
                   + ("" if h is None else f"; relibra-h {h.speedup:.3f}x ({pct(h.frac_of_balanced_compute)}, "
                      f"skewness {h.skewness:.2f})") + ".")
    if s.cases and s.worst is None:
        out.append(f"relibra-h is at least the best other policy in all {s.cases} cases.")
    elif s.worst is not None:
        w = s.worst
        out.append(f"relibra-h trails the best other policy in {s.behind} of {s.cases} cases; the largest gap is "
                   f"{w.model} on {w.cluster} at EP {w.ep}, where {label(w.best_other)} is "
                   f"{pct(1 / w.over_best_other - 1)} faster.")
    if s.skipped:
        out.append("Not possible and kept as rows: " + "; ".join(
            f"{model} on {cluster} at EP {ep} ({why})" for model, cluster, ep, why in s.skipped) + ".")
    if s.slowest_plan is not None:
        policy, model, ep, cpu_s = s.slowest_plan
        verdict = "within" if cpu_s <= PLANNER_TARGET_S else "over"
        out.append(f"The slowest plan is {label(policy)} for {model} at EP {ep}: {cpu_s:.2f} CPU s for the simulated "
                   f"layers, {verdict} the {PLANNER_TARGET_S:g} s a step's plan must stay under to hide behind the "
                   "previous step (measured on this machine).")
    return "\n".join(out)


def facts(r: Result, scale: str) -> list[Fact]:
    """Per (model, cluster) at its largest EP, relibra-h's speed-up over Megatron, share of balanced-compute and
    ratio to the best other policy; in how many cases it trails that policy."""
    s = summarize(r)
    title, on = "relibra-h (cross-node replicas) at the largest EP, against the best other policy", (
        f"each named cluster; {scale}")
    out = []
    for x in s.top:
        show = dict(of=f"{x.model} EP{x.ep} on {x.cluster}", on=on, readme=title)
        out += [Fact("speedup_vs_megatron", x.speedup, "x", **show),
                Fact("frac_of_balanced_compute", x.frac_of_balanced_compute, "ratio", **show),
                Fact("over_best_other", x.over_best_other, "ratio", f"vs {label(x.best_other)}", **show)]
    return out + ([Fact("behind_best_other", s.behind, "count", of=f"of {s.cases} cases", on=on, readme=title)]
                  if s.cases else [])


def _relibra_at_largest_ep(r: Result) -> float:
    t = r.scale[(r.scale["status"] == "ok") & (r.scale["policy"] == "relibra")]
    return float(t[t["ep"] == t.groupby("cluster")["ep"].transform("max")]["skewness"].mean())


def _nvl72_only(p: Params, g) -> dict:
    racks = [c.name for c in p.clusters if "nvl72" in c.name]
    return {"clusters": racks[0] if racks else "nvl72"}


TRIES = (
    TryThis(_nvl72_only, "ReLibra's rank skewness at the largest EP (mean over clusters)", _relibra_at_largest_ep,
            -1, "a 72-GPU NVLink domain gives in-node replication room that 8-GPU nodes do not"),
)
