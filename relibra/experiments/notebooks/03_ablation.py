"""Notebook 03, ablation: reordering only, replication only and both, against Megatron."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from relibra.cluster import ModelShape
from relibra.experiments.base import Result, TryThis, mean_of, param, table
from relibra.experiments.profiles import SCALES, Scale
from relibra.studies.simulation import simulate_trace
from relibra.experiments.text import pct
from relibra.experiments.traces import MODELS, SimParams, make_trace, own_policies
from relibra.labels import short as label
from relibra.progress import progress as tqdm
from relibra.setups import load_card

QUESTION = "What do reordering and replication each contribute?"
SIZES = SCALES
STAGES = ("relibra-reorder", "relibra-replicate", "relibra")


@dataclass(frozen=True)
class Params(SimParams):
    model: tuple[ModelShape, ...] = param(None, "model presets, e.g. 'qwen3-30b-a3b,qwen3-235b-a22b' (None: the "
                                          "profile's)", MODELS, sizes="models")
    policies: tuple[str, ...] = own_policies("megatron,relibra-reorder,relibra-replicate,relibra,balanced")


@dataclass(kw_only=True)
class Result(Result):
    ablation: pd.DataFrame = table("simulated tokens/s and skewness per model, workload and ablation stage")


def compute(p: Params, sizes: Scale, progress: bool = True) -> Result:
    """Every policy simulated on every (model, workload) of the grid: one row per (model, workload,
    policy) with tokens_per_s, speedup_vs_megatron, frac_of_balanced, skewness and the rest of
    relibra.sim.SUMMARY_COLUMNS."""
    card = load_card()
    cases = [(m, w) for m in p.models() for w in p.workloads(sizes)]
    frames = [simulate_trace(make_trace(m, w, p.ep, p.steps, p.seed, sizes, card), p.cluster, p.policies, card,
                             p.steps, workload=w)
              for m, w in tqdm(cases, desc="model x workload", disable=not progress)]
    return Result(ablation=pd.concat(frames, ignore_index=True))


@dataclass(frozen=True)
class Stage:
    policy: str
    speedup: float  # mean tokens/s over Megatron's, over models and workloads
    skewness: float


@dataclass(frozen=True)
class Summary:
    """The ablation stages present (in STAGES order) and, when all three are, each one's gain over Megatron."""

    stages: tuple[Stage, ...]
    gains: tuple[float, float, float] | None  # reordering only, replication only, both: speedup - 1


def summarize(r: Result) -> Summary:
    s = r.ablation.groupby("policy")[["speedup_vs_megatron", "skewness"]].mean()
    stages = tuple(Stage(p, float(s.loc[p, "speedup_vs_megatron"]), float(s.loc[p, "skewness"]))
                   for p in STAGES if p in s.index)
    return Summary(stages, tuple(x.speedup - 1 for x in stages) if len(stages) == 3 else None)


def story(s: Summary) -> str:
    """Each stage's speed-up and skewness, how much of ReLibra's gain each mechanism gives alone, and
    whether the two add up."""
    text = "Averaged over models and workloads, relative to Megatron: " + "; ".join(
        f"{label(x.policy)} {x.speedup:.2f}x (skewness {x.skewness:.2f})" for x in s.stages) + "."
    if s.gains is None:
        return text
    ro, rp, both = s.gains
    if both > 0:
        text += (f" Of ReLibra's gain ({pct(both)}), replication alone gives {pct(rp / both)} and reordering alone "
                 f"{pct(ro / both)}.")
    kind = "more than" if both > ro + rp + 1e-9 else "less than" if both < ro + rp - 1e-9 else "exactly"
    why = ("reordering balances the nodes, which lets in-node replication finish the job" if kind == "more than" else
           "they partly fix the same imbalance")
    return text + f" Together they gain {kind} the sum of their separate gains ({pct(ro)} + {pct(rp)}): {why}."


TRIES = (
    TryThis(lambda p, s: {"ep": 2 * p.ep}, "reordering-only's mean rank skewness",
            lambda r: mean_of(r.ablation, "skewness", policy="relibra-reorder"), +1,
            "reordering places homes once per step and cannot follow a micro-batch's hot experts, which weigh "
            "more on fewer experts per GPU"),
)
