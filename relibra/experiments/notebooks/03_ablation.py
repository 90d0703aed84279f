"""Notebook 03, ablation: reordering only, replication only and both, against Megatron."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from relibra.cluster import ModelShape
from relibra.experiments.base import Result, TryThis, mean_of, param, table
from relibra.experiments.profiles import SCALES, Scale
from relibra.experiments.simulation import simulate_trace
from relibra.experiments.text import pct
from relibra.experiments.traces import MODELS, POLICIES, SimParams, make_trace
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
    policies: tuple[str, ...] = param(None, "policies compared (None: this notebook's)", POLICIES,
                                      none="megatron,relibra-reorder,relibra-replicate,relibra,balanced")


@dataclass(kw_only=True)
class Result(Result):
    ablation: pd.DataFrame = table("simulated tokens/s and skewness per model, workload and ablation stage")


def compute(p: Params, sizes: Scale, progress: bool = True) -> Result:
    """Every policy simulated on every (model, workload) of the grid: one row per (model, workload,
    policy) with tokens_per_s, speedup_vs_megatron, frac_of_balanced, skewness and the rest of
    relibra.sim.SUMMARY_COLUMNS."""
    card = load_card()
    cases = [(m, w) for m in p.models() for w in p.workloads(sizes)]
    frames = []
    for model, workload in tqdm(cases, desc="model x workload", disable=not progress):
        trace = make_trace(model, workload, p.ep, p.steps, p.seed, sizes, card)
        frames.append(simulate_trace(trace, p.cluster, p.policies, card, p.steps, workload=workload))
    return Result(ablation=pd.concat(frames, ignore_index=True))


def story(r: Result) -> str:
    """Each stage's speed-up and skewness, how much of ReLibra's gain each mechanism gives alone, and
    whether the two add up."""
    s = r.ablation.groupby("policy")[["speedup_vs_megatron", "skewness"]].mean()
    stages = [p for p in STAGES if p in s.index]
    text = "Averaged over models and workloads, relative to Megatron: " + "; ".join(
        f"{label(p)} {s.loc[p, 'speedup_vs_megatron']:.2f}x (skewness {s.loc[p, 'skewness']:.2f})" for p in stages) + "."
    if len(stages) < 3:
        return text
    ro, rp, both = (s.loc[p, "speedup_vs_megatron"] - 1 for p in stages)
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
