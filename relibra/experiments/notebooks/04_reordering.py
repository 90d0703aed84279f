"""Notebook 04, inter-batch reordering: annealing search vs greedy LPT vs static homes."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from relibra.experiments.base import Result, TryThis, mean_of, table
from relibra.experiments.profiles import SCALES, Scale
from relibra.studies.simulation import simulate_workloads
from relibra.experiments.text import fastest_first, pct, speedup_list
from relibra.experiments.traces import TracedParams, own_policies, traced_sizes
from relibra.setups import load_card

QUESTION = "Does annealing search place homes better than greedy LPT or no reordering?"
SIZES = SCALES
sizes_of = traced_sizes(SIZES)


@dataclass(frozen=True)
class Params(TracedParams):
    policies: tuple[str, ...] = own_policies("relibra-replicate,relibra-lpt,relibra,megatron")


@dataclass(kw_only=True)
class Result(Result):
    reordering: pd.DataFrame = table("per workload, policy and step: throughput, node/GPU skewness, cross-node "
                                     "share, migration")


def compute(p: Params, sizes: Scale, progress: bool = True) -> Result:
    """Per (workload, policy, step): simulated speedup over Megatron, node and GPU skewness, share of
    tokens crossing nodes, migration GB, planner seconds; for the model on every workload."""
    per_step, _ = simulate_workloads(p, sizes, load_card(), progress)
    return Result(reordering=per_step)


@dataclass(frozen=True)
class Reordered:
    """One policy's means over workloads and steps."""

    policy: str
    speedup: float  # over Megatron
    node_skewness: float
    cross_node_share: float  # of token-expert pairs
    migration_gb: float  # per step


@dataclass(frozen=True)
class Summary:
    policies: tuple[Reordered, ...]  # the systems (no ideals), fastest first

    def get(self, policy: str) -> Reordered | None:
        return next((x for x in self.policies if x.policy == policy), None)


def summarize(r: Result) -> Summary:
    means = fastest_first(r.reordering, ["node_skewness", "cross_node_share", "migration_gb"])
    return Summary(tuple(Reordered(p, *x) for p, x in means.iterrows()))


def story(s: Summary) -> str:
    text = speedup_list("Mean over workloads and steps", s.policies, lambda x: (
        f"node skewness {x.node_skewness:.2f}, {pct(x.cross_node_share)} of token-expert pairs cross nodes, "
        f"{x.migration_gb:.2f} GB migrated per step"))
    a, b, none = s.get("relibra"), s.get("relibra-lpt"), s.get("relibra-replicate")
    if a and b:
        text += (f"\n\nThe annealing search is {'faster' if a.speedup >= b.speedup else 'slower'} than greedy LPT here "
                 f"({a.speedup:.2f}x vs {b.speedup:.2f}x): its node skewness is {a.node_skewness:.2f} vs "
                 f"{b.node_skewness:.2f} and it sends {pct(a.cross_node_share)} vs {pct(b.cross_node_share)} of pairs "
                 "across nodes.")
    if b and none and abs(b.speedup / none.speedup - 1) < 0.005:
        text += (f" Greedy LPT placement runs as fast as no reordering at all ({b.speedup:.3f}x vs "
                 f"{none.speedup:.3f}x) although it moves homes (node skewness {b.node_skewness:.2f} vs "
                 f"{none.node_skewness:.2f}): what it changes, in-node replication already fixed.")
    return text


TRIES = (
    TryThis(lambda p, s: {"cluster": "nvl72"}, "the GPU skewness of replication without reordering "
            "(`relibra-replicate`)", lambda r: mean_of(r.reordering, "gpu_skewness", policy="relibra-replicate"), -1,
            "in one 72-GPU NVLink domain every GPU shares the home's node, so in-node replication alone can level "
            "them and reordering has little left to do"),
)
