"""Notebook 11, beyond the paper's scale: throughput ratios and planner time from EP16 to EP256 over
model sizes and cluster kinds (relibra.experiments.scale)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from relibra.cluster import ModelShape, Topology, get_model, resolve_topology
from relibra.experiments.base import PATH, Params, Result, TryThis, integer, integers, objects, param, table
from relibra.experiments.profiles import SCALES
from relibra.experiments.scale import SCALE_POLICIES, ScaleSweep, best_other, scale_sweep
from relibra.experiments.text import pct, row
from relibra.experiments.traces import POLICIES, PROFILE, WORKLOAD
from relibra.labels import short as label

QUESTION = "Where does in-node replication run out of room between EP16 and EP256?"
# Three model sizes, 8-GPU nodes against NVL72 racks, EP 16 to 256.
MODELS, CLUSTERS, EP_SIZES = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"), ("paper,nodes=32", "gb200-nvl72x4"), \
    (16, 32, 64, 128, 256)
SIZES = {"tiny": ScaleSweep(("tiny",), ("cpu-gloo,nodes=4", "nvl72"), (4, 8, 32), layers=2, micro_batches=2),
         "laptop": ScaleSweep(MODELS, CLUSTERS, EP_SIZES), "paper": ScaleSweep(MODELS, CLUSTERS, EP_SIZES, layers=None,
                                                                               micro_batches=32),
         "gpu": ScaleSweep(MODELS, CLUSTERS, EP_SIZES)}


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
    policies: tuple[str, ...] = param(None, "policies compared (None: this notebook's)", POLICIES,
                                      none=",".join(SCALE_POLICIES))
    seed: int = param(0, "same seed, same numbers", integer(0))
    out_dir: str | None = param(None, "where results go (None: results/11_scale)", PATH, affects=False)

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


def story(r: Result, planner_target_s: float = 2.0) -> str:
    """What notebook 11's sweep says: where ReLibra's in-node replication runs out of room (its
    fraction of balanced-compute at the largest EP per cluster), whether relibra-h wins there against
    the best other policy, the cases that could not run and the slowest planner step against
    `planner_target_s`."""
    table, comparison = r.scale, r.relibra_h_vs_best
    ok = table[table["status"] == "ok"]
    out = []
    for (model, cluster), g in ok.groupby(["model", "cluster"], sort=False):
        top = g[g["ep"] == g["ep"].max()].set_index("policy")
        if "relibra" not in top.index:
            continue
        ep = int(g["ep"].max())
        line = (f"- **{model} on {cluster}**, largest EP {ep}: ReLibra {top.loc['relibra', 'speedup_vs_megatron']:.3f}x "
                f"Megatron ({pct(top.loc['relibra', 'frac_of_balanced_compute'])} of balanced-compute, skewness "
                f"{top.loc['relibra', 'skewness']:.2f})")
        if "relibra-h" in top.index:
            line += (f"; relibra-h {top.loc['relibra-h', 'speedup_vs_megatron']:.3f}x "
                     f"({pct(top.loc['relibra-h', 'frac_of_balanced_compute'])}, skewness "
                     f"{top.loc['relibra-h', 'skewness']:.2f})")
        out.append(line + ".")
    if len(comparison):
        behind = comparison[comparison["over_best_other"] < 1.0 - 1e-9]
        if behind.empty:
            out.append(f"relibra-h is at least the best other policy in all {len(comparison)} cases.")
        else:
            worst = behind.loc[behind["over_best_other"].idxmin()]
            out.append(f"relibra-h trails the best other policy in {len(behind)} of {len(comparison)} cases; the "
                       f"largest gap is {worst['model']} on {worst['cluster']} at EP {int(worst['ep'])}, where "
                       f"{label(worst['best_other'])} is {pct(1 / worst['over_best_other'] - 1)} faster.")
    skipped = table[table["status"] != "ok"]
    if len(skipped):
        out.append("Not possible and kept as rows: " + "; ".join(
            f"{r.model} on {r.cluster} at EP {r.ep} ({r.status.removeprefix('impossible: ')})"
            for r in skipped.itertuples()) + ".")
    planners = ok[ok["policy"].isin(("relibra", "relibra-h"))]
    if len(planners):
        slow = planners.loc[planners["plan_cpu_s"].idxmax()]
        verdict = "within" if slow["plan_cpu_s"] <= planner_target_s else "over"
        out.append(f"The slowest plan is {label(slow['policy'])} for {slow['model']} at EP {int(slow['ep'])}: "
                   f"{slow['plan_cpu_s']:.2f} CPU s for the simulated layers, {verdict} the {planner_target_s:g} s "
                   "a step's plan must stay under to hide behind the previous step (measured on this machine).")
    return "\n".join(out)


def rows(r: Result, man: dict) -> list[dict]:
    t = r.relibra_h_vs_best
    if t.empty:
        return []
    top = t.loc[t.groupby(["model", "cluster"], sort=False)["ep"].idxmax()]
    fig = "; ".join(f"{x.model} EP{x.ep} on {x.cluster}: {x.speedup:.2f}x Megatron, {x.frac_of_balanced_compute:.3f} "
                    f"of balanced-compute, {x.over_best_other:.3f}x {label(x.best_other)}" for x in top.itertuples())
    behind = int((t["over_best_other"] < 1 - 1e-9).sum())
    return [row("relibra-h (cross-node replicas) at the largest EP, against the best other policy",
                f"{fig}; behind the best other policy in {behind} of {len(t)} cases",
                f"**simulated** on each named cluster; {man['scale_note']}")]


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
