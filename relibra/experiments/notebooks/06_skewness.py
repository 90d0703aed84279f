"""Notebook 06: rank skewness of each policy's plans across EP sizes and task domains (no cost model)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from relibra.experiments.base import Result, TryThis, integers, param, table
from relibra.experiments.profiles import SCALES, Scale
from relibra.experiments.simulation import history_steps
from relibra.experiments.text import cluster_text, row, span, unique
from relibra.experiments.traces import POLICIES, TracedParams, traced_sizes
from relibra.labels import short
from relibra.policies import get_policy
from relibra.progress import progress as tqdm
from relibra.setups import load_card

QUESTION = "How skewed is each policy's busiest GPU across EP sizes and task domains?"
SIZES = SCALES
sizes_of = traced_sizes(SIZES)


@dataclass(frozen=True)
class Params(TracedParams):
    policies: tuple[str, ...] = param(None, "policies compared (None: this notebook's)", POLICIES,
                                      none="megatron,eplb,eplb+,lplb+,eplb+lp,llep,relibra")
    ep_sizes: tuple[int, ...] = param(None, "EP sizes of the sweep, e.g. '8,16,32,64' (None: the profile's)",
                                      integers(1), sizes="ep_sizes")

    def ep_sizes_used(self, sizes: Scale) -> tuple[int, ...]:
        return (self.ep,) + self.ep_sizes


@dataclass(kw_only=True)
class Result(Result):
    skewness: pd.DataFrame = table("mean and p95 rank skewness per policy, EP size and workload")


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
    return Result(skewness=pd.DataFrame(rows))


def story(r: Result) -> str:
    t = r.skewness
    ep = t[t["sweep"] == "ep"].pivot_table(index="ep", columns="policy", values="skewness")
    out = []
    if len(ep) and "megatron" in ep:
        lo, hi = ep.index.min(), ep.index.max()
        out.append(f"Megatron's skewness grows from {ep.loc[lo, 'megatron']:.2f} at EP {lo} to "
                   f"{ep.loc[hi, 'megatron']:.2f} at EP {hi}: fewer experts per GPU let one hot expert weigh more.")
        if "relibra" in ep:
            out.append(f"ReLibra stays at {ep['relibra'].min():.2f}-{ep['relibra'].max():.2f} over the same range.")
    dom = t[t["sweep"] == "workload"].pivot_table(index="workload", columns="policy", values="skewness")
    if len(dom) and "megatron" in dom:
        w = dom["megatron"].idxmax()
        out.append(f"Across domains, {w} is the most skewed under Megatron ({dom.loc[w, 'megatron']:.2f}).")
    return " ".join(out)


def rows(r: Result, man: dict) -> list[dict]:
    t = r.skewness[r.skewness["sweep"] == "ep"] if (r.skewness["sweep"] == "ep").any() else r.skewness
    eps = sorted(int(e) for e in t["ep"].unique())
    where = f"EP {eps[0]}" if len(eps) == 1 else f"EP {eps[0]}-{eps[-1]}"
    return [row(f"rank skewness (max / mean tokens per GPU), mean over plans, {where}",
                "; ".join(f"{short(p)} {span(d['skewness'])}" for p, d in t.groupby("policy", sort=False)),
                f"**simulated**: policies' plans on synthetic RL traces of {unique(t, 'model')}, "
                f"{unique(t, 'workload')}, nodes of the {cluster_text(man['config'].get('cluster'))}, no cost model; "
                f"{man['scale_note']}")]


def _largest_ep(t: pd.DataFrame, policy: str) -> float:
    t = t[(t["sweep"] == "ep") & (t["policy"] == policy)]
    return float(t[t["ep"] == t["ep"].max()]["skewness"].mean())


TRIES = (
    TryThis(lambda p, s: {"ep_sizes": ",".join(map(str, p.ep_sizes + (2 * max(p.ep_sizes),)))},
            "Megatron's skewness at the largest EP size", lambda r: _largest_ep(r.skewness, "megatron"), +1,
            "the trend of the left panel continues: fewer experts per GPU"),
)
