"""Notebook 07, overheads: planner time (measured), migration, replica memory and transfer overlap."""

from __future__ import annotations

import timeit
from dataclasses import dataclass

import pandas as pd

from relibra.experiments.base import Fact, Result, TryThis, mean_of, table
from relibra.machine import this_machine
from relibra.experiments.profiles import SCALES, Scale
from relibra.studies.overheads import overheads_table
from relibra.studies.simulation import full_model_memory_share, simulate_with_plans
from relibra.experiments.text import cluster_text, pct, unique
from relibra.experiments.traces import SimParams, make_trace, own_policies
from relibra.labels import IDEALS, short
from relibra.policies import get_policy
from relibra.setups import load_card
from relibra.trace import static_placement

QUESTION = "What does balancing cost: planner time, migration, replica memory?"
SIZES = SCALES


@dataclass(frozen=True)
class Params(SimParams):
    policies: tuple[str, ...] = own_policies("eplb,eplb+,lplb+,eplb+lp,llep,relibra")


@dataclass(kw_only=True)
class Result(Result):
    overheads: pd.DataFrame = table("per policy: planner seconds per step (measured), simulated step/forward "
                                    "seconds, migration share, replica memory share, transfer overlap")


def planner_seconds(trace, policy: str, step: int, repeats: int, cluster) -> float:
    """Best-of-`repeats` wall seconds of one step's plan on `cluster` (one thread, this machine)."""
    pol, prev = get_policy(policy), static_placement(trace.num_layers, trace.num_experts, trace.ep)
    return min(timeit.repeat(lambda: pol.plan(trace, step, cluster, prev), number=1, repeat=max(1, repeats)))


def compute(p: Params, sizes: Scale) -> Result:
    """Per policy, for the model and workload on p.cluster at p.ep: relibra.studies.overheads.overheads_table's
    "policies" view (plan_s measured: best-of-repeats wall seconds to plan one step, one thread; the rest
    simulated), with the trace's layers and micro-batches, the planner's machine and the replica memory share
    of the whole model."""
    import torch  # heavy: only the replica-memory figure needs it

    card = load_card()
    trace = make_trace(p.model, p.the_workload(sizes), p.ep, p.steps, p.seed, sizes, card)
    _, summary = simulate_with_plans(trace, p.cluster, p.policies, card, p.steps)
    summary = summary[~summary["policy"].isin(IDEALS)].reset_index(drop=True)  # the ideals plan nothing
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plan_s = [planner_seconds(trace, x, trace.num_steps - 1, sizes.planner_repeats, p.cluster)
                  for x in summary["policy"]]
    finally:
        torch.set_num_threads(threads)
    out = overheads_table(summary.assign(plan_s=plan_s), "policies").assign(
        layers=trace.num_layers, micro_batches=trace.num_microbatches, planner_hardware=this_machine())
    out["replica_memory_share_full_model"] = full_model_memory_share(
        p.model, trace.ep, trace.num_layers, summary["replica_buffer_bytes"].to_numpy(dtype=float),
        summary["planner_on_critical_path"].to_numpy(dtype=bool))
    return Result(overheads=out)


@dataclass(frozen=True)
class Summary:
    case: str  # "model, EP n"
    cluster: str  # the cluster preset, as text
    planner_hardware: str
    policies: tuple  # the overheads table's rows (named tuples of its columns)


def summarize(r: Result) -> Summary:
    t = r.overheads
    return Summary(f"{unique(t, 'model')}, EP {unique(t, 'ep')}", cluster_text(t["cluster"].iloc[0]),
                   unique(t, "planner_hardware"), tuple(t.itertuples(index=False, name="PolicyCost")))


def story(s: Summary) -> str:
    out = []
    for x in s.policies:
        hidden = "on the critical path" if x.planner_on_critical_path else (
            "hidden behind one forward pass" if x.plan_s <= x.forward_s else "longer than one forward pass")
        out.append(f"- {short(x.policy)}: plans a step in {1e3 * x.plan_s:.1f} ms ({hidden}, forward "
                   f"{1e3 * x.forward_s:.1f} ms); migration {pct(x.migration_share)} of the step; replica "
                   f"memory {pct(x.replica_memory_share_full_model)}"
                   + ("" if pd.isna(x.transfer_overlap) else f"; {pct(x.transfer_overlap)} of replica "
                      "transfers hidden") + ".")
        if getattr(x, "transfers_on_critical_path", False):
            out[-1] += (" It fetches its replicas' weights on the critical path, so it hides none of them, and "
                        "autograd keeps every layer's fetched copies until backward: its replica memory grows with "
                        "the layers, where the other policies reuse one layer-shared buffer "
                        "(relibra.costs.phases.replica_memory).")
    return "\n".join(out)


def facts(r: Result, scale: str) -> list[Fact]:
    """Per policy, its measured planner seconds and their share of one simulated forward pass, its migration
    share of the step, replica memory share and hidden share of replica transfers."""
    s = summarize(r)
    measured = f"{s.planner_hardware}; forward pass simulated on the {s.cluster}; {scale}"
    title, simulated = f"planner wall time per step, {s.case}", f"the {s.cluster}; {scale}"
    out = []
    for x in s.policies:
        show = dict(of=short(x.policy), readme=title)
        out += [Fact("planner_s", x.plan_s, "s", scope="measured", on=measured, **show),
                Fact("planner_vs_forward", x.planner_vs_forward, "x", scope="measured", on=measured, **show)]
    for x in s.policies:
        show = dict(of=short(x.policy), on=simulated,
                    readme=f"ReLibra migration and replica memory, {s.case}" if x.policy == "relibra" else "")
        out += [Fact("migration_share", x.migration_share, "%", **show),
                Fact("replica_memory_share", x.replica_memory_share_full_model, "%", **show),
                Fact("transfer_overlap", x.transfer_overlap, "%", **show)]
    return out


TRIES = (
    TryThis(lambda p, s: {"ep": 2 * p.ep}, "ReLibra's replica buffer as a share of parameter memory per GPU",
            lambda r: mean_of(r.overheads, "replica_memory_share_full_model", policy="relibra"), +1,
            "the buffer keeps its spare slots while each GPU's own experts halve"),
)
