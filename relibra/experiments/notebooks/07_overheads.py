"""Notebook 07, overheads: planner time (measured), migration, replica memory and transfer overlap."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from relibra.experiments.base import Fact, Result, TryThis, mean_of, param, table
from relibra.machine import this_machine
from relibra.experiments.profiles import SCALES, Scale
from relibra.studies.simulation import full_model_memory_share, simulate_with_plans
from relibra.experiments.text import cluster_text, pct, unique
from relibra.errors import RelibraError
from relibra.experiments.traces import POLICIES, SimParams, make_trace
from relibra.labels import IDEALS, short
from relibra.policies import get_policy
from relibra.setups import load_card
from relibra.trace import static_placement

QUESTION = "What does balancing cost: planner time, migration, replica memory?"
SIZES = SCALES


@dataclass(frozen=True)
class Params(SimParams):
    policies: tuple[str, ...] = param(None, "policies compared (None: this notebook's)", POLICIES,
                                      none="eplb,eplb+,lplb+,eplb+lp,llep,relibra")


@dataclass(kw_only=True)
class Result(Result):
    overheads: pd.DataFrame = table("per policy: planner seconds per step (measured), simulated step/forward "
                                    "seconds, migration share, replica memory share, transfer overlap")


def planner_seconds(trace, policy: str, step: int, repeats: int, cluster) -> float:
    """Best-of-`repeats` wall seconds of one step's plan on `cluster` (one thread, this machine)."""
    pol = get_policy(policy)
    prev = static_placement(trace.num_layers, trace.num_experts, trace.ep)
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        pol.plan(trace, step, cluster, prev)
        best = min(best, time.perf_counter() - t0)
    return best


def compute(p: Params, sizes: Scale) -> Result:
    """Per policy, for the model and workload on p.cluster at p.ep: plan_s (measured: best-of-repeats
    wall seconds to plan one step, one thread), forward_s and step_s (simulated), planner_vs_forward
    (< 1: the planner hides behind one forward pass), planner_on_critical_path, migration_share,
    migration_gb, replica_memory_share, transfer_s, exposed_transfer_s and transfer_overlap."""
    import torch  # heavy: only the replica-memory figure needs it

    card = load_card()
    trace = make_trace(p.model, p.the_workload(sizes), p.ep, p.steps, p.seed, sizes, card)
    _, summary = simulate_with_plans(trace, p.cluster, p.policies, card, p.steps)
    summary = summary[~summary["policy"].isin(IDEALS)].reset_index(drop=True)  # the ideals plan nothing
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plan_s = {x: planner_seconds(trace, x, trace.num_steps - 1, sizes.planner_repeats, p.cluster)
                  for x in summary["policy"]}
    finally:
        torch.set_num_threads(threads)
    out = summary[["model", "workload", "ep", "cluster", "policy", "step_s", "forward_s", "migration_share",
                   "migration_gb", "replica_memory_share", "exposed_transfer_share", "planner_on_critical_path",
                   "speedup_vs_megatron"]].copy()
    out["plan_s"] = out["policy"].map(plan_s)
    out["planner_vs_forward"] = out["plan_s"] / out["forward_s"]
    out["transfer_s"] = summary["transfer_s"]
    # The simulator's exposed replica seconds include the replica gradients' adds into their homes'
    # gradients (compute charged beside the pulls); the transfers' exposed part is the rest. Each transfer's
    # exposed part is at most the transfer (relibra.costs.overheads.overlapped_seconds), so the overlap lies
    # in [0, 1] by construction: 0 for a policy that moves its replicas on the critical path (LLEP).
    out["replica_grad_add_s"] = summary["replica_grad_add_s"]
    out["transfers_on_critical_path"] = summary["transfers_on_critical_path"] > 0.5
    out["exposed_transfer_s"] = summary["exposed_transfer_s"] - summary["replica_grad_add_s"]
    # NaN: the policy moves no replica weights
    out["transfer_overlap"] = 1.0 - out["exposed_transfer_s"] / out["transfer_s"].where(out["transfer_s"] > 0)
    bad = out[(out["transfer_overlap"] < -1e-9) | (out["transfer_overlap"] > 1 + 1e-9)]
    if len(bad):
        raise RelibraError(f"07_overheads: transfer overlap outside [0, 1] for {', '.join(bad['policy'])} "
                           f"({', '.join(f'{v:.4g}' for v in bad['transfer_overlap'])}): the cost model's exposed "
                           "and total replica seconds disagree")
    out["transfer_overlap"] = out["transfer_overlap"].clip(0.0, 1.0)  # rounding only (checked above)
    out["layers"] = trace.num_layers
    out["micro_batches"] = trace.num_microbatches
    out["planner_hardware"] = this_machine()
    out["replica_memory_share_full_model"] = full_model_memory_share(
        p.model, trace.ep, trace.num_layers, summary["replica_buffer_bytes"].to_numpy(dtype=float),
        summary["planner_on_critical_path"].to_numpy(dtype=bool))
    return Result(overheads=out)


@dataclass(frozen=True)
class PolicyCost:
    policy: str
    plan_s: float  # measured
    forward_s: float  # simulated
    planner_vs_forward: float
    on_critical_path: bool
    migration_share: float
    replica_memory_share: float  # of the whole model's parameter memory per GPU
    transfer_overlap: float  # share of replica transfers hidden; NaN: no replica transfers
    fetched_in_line: bool = False  # replica weights fetched on the critical path (LLEP)


@dataclass(frozen=True)
class Summary:
    case: str  # "model, EP n"
    cluster: str  # the cluster preset, as text
    planner_hardware: str
    policies: tuple[PolicyCost, ...]


def summarize(r: Result) -> Summary:
    t = r.overheads
    return Summary(f"{unique(t, 'model')}, EP {unique(t, 'ep')}", cluster_text(t["cluster"].iloc[0]),
                   unique(t, "planner_hardware"),
                   tuple(PolicyCost(x.policy, x.plan_s, x.forward_s, x.planner_vs_forward,
                                    bool(x.planner_on_critical_path), x.migration_share,
                                    x.replica_memory_share_full_model, x.transfer_overlap,
                                    bool(getattr(x, "transfers_on_critical_path", False)))
                         for x in t.itertuples(index=False)))


def story(s: Summary) -> str:
    out = []
    for x in s.policies:
        hidden = "on the critical path" if x.on_critical_path else (
            "hidden behind one forward pass" if x.plan_s <= x.forward_s else "longer than one forward pass")
        out.append(f"- {short(x.policy)}: plans a step in {1e3 * x.plan_s:.1f} ms ({hidden}, forward "
                   f"{1e3 * x.forward_s:.1f} ms); migration {pct(x.migration_share)} of the step; replica "
                   f"memory {pct(x.replica_memory_share)}"
                   + ("" if pd.isna(x.transfer_overlap) else f"; {pct(x.transfer_overlap)} of replica "
                      "transfers hidden") + ".")
        if x.fetched_in_line:
            out[-1] += (" It fetches its replicas' weights on the critical path, so it hides none of them, and "
                        "autograd "
                        "keeps every layer's fetched copies until backward: its replica memory grows with the layers, "
                        "where the other policies reuse one layer-shared buffer (relibra.costs.phases.replica_memory).")
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
                Fact("replica_memory_share", x.replica_memory_share, "%", **show),
                Fact("transfer_overlap", x.transfer_overlap, "%", **show)]
    return out


TRIES = (
    TryThis(lambda p, s: {"ep": 2 * p.ep}, "ReLibra's replica buffer as a share of parameter memory per GPU",
            lambda r: mean_of(r.overheads, "replica_memory_share_full_model", policy="relibra"), +1,
            "the buffer keeps its spare slots while each GPU's own experts halve"),
)
