"""Notebook 06: rank skewness of each policy's plans across EP sizes and task domains (no cost model)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from relibra.experiments.base import Fact, Result, TryThis, integers, param, table, value
from relibra.experiments.profiles import SCALES, Scale
from relibra.studies.simulation import history_steps
from relibra.experiments.text import cluster_text, unique
from relibra.experiments.traces import TracedParams, own_policies, traced_sizes
from relibra.labels import short
from relibra.policies import get_policy
from relibra.progress import progress as tqdm
from relibra.setups import load_card

QUESTION = "How skewed is each policy's busiest GPU across EP sizes and task domains?"
SIZES = SCALES
sizes_of = traced_sizes(SIZES)


@dataclass(frozen=True)
class Params(TracedParams):
    policies: tuple[str, ...] = own_policies("megatron,eplb,eplb+,lplb+,eplb+lp,llep,relibra")
    ep_sizes: tuple[int, ...] = param(None, "EP sizes of the sweep, e.g. '8,16,32,64' (None: the profile's)",
                                      integers(1, 1024), sizes="ep_sizes")

    def ep_sizes_used(self, sizes: Scale) -> tuple[int, ...]:
        return (self.ep,) + self.ep_sizes


@dataclass(kw_only=True)
class Result(Result):
    skewness: pd.DataFrame = table("mean and p95 rank skewness per policy, EP size and workload")
    cluster: str = value("")  # whose node size the plans use


def plan_skewness(trace, policy: str, steps: list[int], cluster) -> np.ndarray:
    """Rank skewness of every (step, micro_batch, layer) of `policy`'s plans: float64 [steps, M, L]; the
    plans chain from the static placement through one warm-up step (as the simulator's)."""
    return np.stack([plan.skewness() for plan in get_policy(policy).plan_steps(trace, steps, cluster)])


def compute(p: Params, sizes: Scale, progress: bool = True) -> Result:
    """Mean and p95 rank skewness per policy (from plans; no cost model) across p.ep_sizes (on the
    single workload) and across the workloads (at p.ep), on p.cluster's node size.

    Columns: sweep ('ep' or 'workload'), model, workload, ep, policy, skewness, skewness_p95.
    """
    card = load_card()
    cases = ([("ep", p.the_workload(sizes), ep) for ep in p.ep_sizes]
             + [("workload", w, p.ep) for w in p.workloads(sizes)])
    rows = []
    for sweep, workload, ep in tqdm(cases, desc="EP sizes and domains", disable=not progress):
        trace = p.routing(workload, ep, sizes, card)
        steps = list(range(trace.num_steps - min(history_steps(p.steps), trace.num_steps), trace.num_steps))
        for policy in p.policies:
            sk = plan_skewness(trace, policy, steps, p.cluster)
            rows.append({"sweep": sweep, "model": trace.model.name, "workload": workload, "ep": ep, "policy": policy,
                         "skewness": float(sk.mean()), "skewness_p95": float(np.percentile(sk, 95))})
    return Result(skewness=pd.DataFrame(rows), cluster=p.cluster.name)


@dataclass(frozen=True)
class Summary:
    megatron_over_ep: tuple[tuple[int, float], tuple[int, float]] | None  # Megatron's skewness at the smallest
    # and largest EP of the sweep
    relibra_over_ep: tuple[float, float] | None  # ReLibra's lowest and highest skewness over the sweep
    most_skewed_domain: tuple[str, float] | None  # the workload most skewed under Megatron
    eps: tuple[int, ...]  # of the README row's table (the EP sweep, else every row)
    spans: tuple[tuple[str, float, float], ...]  # per policy: lowest and highest skewness over that table
    models: str
    workloads: str


def summarize(r: Result) -> Summary:
    t = r.skewness
    ep = t[t["sweep"] == "ep"].pivot_table(index="ep", columns="policy", values="skewness")
    dom = t[t["sweep"] == "workload"].pivot_table(index="workload", columns="policy", values="skewness")
    has_ep = len(ep) and "megatron" in ep
    lo, hi = (ep.index.min(), ep.index.max()) if has_ep else (None, None)
    w = dom["megatron"].idxmax() if len(dom) and "megatron" in dom else None
    shown = t[t["sweep"] == "ep"] if (t["sweep"] == "ep").any() else t
    return Summary(((int(lo), ep.loc[lo, "megatron"]), (int(hi), ep.loc[hi, "megatron"])) if has_ep else None,
                   (ep["relibra"].min(), ep["relibra"].max()) if has_ep and "relibra" in ep else None,
                   None if w is None else (w, dom.loc[w, "megatron"]),
                   tuple(sorted(int(e) for e in shown["ep"].unique())),
                   tuple((p, float(d["skewness"].min()), float(d["skewness"].max()))
                         for p, d in shown.groupby("policy", sort=False)),
                   unique(shown, "model"), unique(shown, "workload"))


def story(s: Summary) -> str:
    out = []
    if s.megatron_over_ep:
        (lo, at_lo), (hi, at_hi) = s.megatron_over_ep
        out.append(f"Megatron's skewness grows from {at_lo:.2f} at EP {lo} to {at_hi:.2f} at EP {hi}: fewer experts "
                   "per GPU let one hot expert weigh more.")
        if s.relibra_over_ep:
            out.append("ReLibra stays at {:.2f}-{:.2f} over the same range.".format(*s.relibra_over_ep))
    if s.most_skewed_domain:
        out.append("Across domains, {} is the most skewed under Megatron ({:.2f}).".format(*s.most_skewed_domain))
    return " ".join(out)


def facts(r: Result, scale: str) -> list[Fact]:
    """Per policy, its mean rank skewness's lowest and highest over the EP sweep (else over every row); per
    workload, Megatron's."""
    s = summarize(r)
    where = f"EP {s.eps[0]}" if len(s.eps) == 1 else f"EP {s.eps[0]}-{s.eps[-1]}"
    title = f"rank skewness (max / mean tokens per GPU), mean over plans, {where}"
    on = (f"policies' plans on synthetic RL traces of {s.models}, {s.workloads}, nodes of the "
          f"{cluster_text(r.cluster)}, no cost model; {scale}")
    out = [Fact("skewness", v, "skewness", stat, short(p), on=on, readme=title)
           for p, lo, hi in s.spans for stat, v in (("low", lo), ("high", hi))]
    dom = r.skewness[(r.skewness["sweep"] == "workload") & (r.skewness["policy"] == "megatron")]
    return out + [Fact("skewness", x.skewness, "skewness", of=f"Megatron, {x.workload}", on=on)
                  for x in dom.itertuples()]


def _largest_ep(t: pd.DataFrame, policy: str) -> float:
    t = t[(t["sweep"] == "ep") & (t["policy"] == policy)]
    return float(t[t["ep"] == t["ep"].max()]["skewness"].mean())


TRIES = (
    TryThis(lambda p, s: {"ep_sizes": ",".join(map(str, p.ep_sizes + (2 * max(p.ep_sizes),)))},
            "Megatron's skewness at the largest EP size", lambda r: _largest_ep(r.skewness, "megatron"), +1,
            "the trend of the left panel continues: fewer experts per GPU"),
)
