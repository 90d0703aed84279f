"""The re-plan interval of the policies that re-home experts, chosen per card by their own throughput.

A re-homing policy (eplb, eplb+, eplb+lp, lplb+) takes `replan_interval` k: it re-plans at steps that
are multiples of k and keeps its placement in between (relibra.policies.eplb.replan_step). k = 1 pays
migration every step for a placement made for that step; a larger k pays it once per k steps for a
placement that ages. Which is faster depends on the card (its migration rates and state bytes, its
step time, how fast routing drifts), so the choice is the policy's own best throughput on the card,
made here, above the policies (a policy never consults the simulator):

    best, table = choose_replan_interval(trace, topology, "eplb+", card)

Every candidate is simulated on the same steps, a whole number of re-plan cycles of the longest
candidate (replan_window), each started from the placement the policy would have had (warm-up).
"""

from __future__ import annotations

import math

import pandas as pd

from relibra.cluster import Topology
from relibra.errors import ConfigError
from relibra.setups import SetupCard
from relibra.sim import simulate
from relibra.trace import RoutingTrace

REPLAN_INTERVALS = (1, 2, 4, 8)
# The policies whose placement is rebuilt from the loads (they take replan_interval); relibra weighs
# migration in its own placement search, megatron and llep keep the static homes.
REHOMING_POLICIES = ("eplb", "eplb+", "eplb+lp", "lplb+")


def replan_window(candidates=REPLAN_INTERVALS) -> int:
    """Steps every candidate is measured on: the least common multiple of the candidates, so that each
    sees whole re-plan cycles."""
    bad = [k for k in candidates if isinstance(k, bool) or not isinstance(k, int) or k < 1]
    if not candidates or bad:
        raise ConfigError(f"replan intervals must be positive integers, got {list(candidates)!r}")
    return math.lcm(*candidates)


def replan_steps(trace: RoutingTrace, candidates=REPLAN_INTERVALS) -> list[int]:
    """The last replan_window(candidates) steps of the trace that start at a multiple of the window:
    int step indices, each candidate's re-plans falling on its cycle starts. ConfigError when the
    trace is shorter than one window after the first."""
    window = replan_window(candidates)
    first = (trace.num_steps - window) // window * window
    if first < window:
        raise ConfigError(f"choosing the re-plan interval over {list(candidates)} needs {2 * window} steps "
                          f"(one window of warm-up, one measured), the trace holds {trace.num_steps}")
    return list(range(first, first + window))


def choose_replan_interval(trace: RoutingTrace, topology: Topology, policy: str, card: SetupCard,
                           candidates=REPLAN_INTERVALS, policy_params: dict | None = None
                           ) -> tuple[int, pd.DataFrame]:
    """The re-plan interval of `policy` with the highest throughput on `trace`, `topology` and the card's
    cost knobs, and the table behind it.

    Every candidate k is simulated on replan_steps(trace, candidates), after one window of warm-up
    planned from Megatron's placement. Ties go to the smaller k. Returns (best k, DataFrame with one
    row per k: replan_interval, tokens_per_s, step_s, migration_s, experts_moved per step).
    """
    if policy not in REHOMING_POLICIES:
        raise ConfigError(f"{policy!r} does not re-home experts; the re-plan interval is a parameter of "
                          f"{', '.join(REHOMING_POLICIES)}")
    steps = replan_steps(trace, candidates)
    rows = []
    for k in candidates:
        params = {**card.policy_params([policy]).get(policy, {}), **(policy_params or {}), "replan_interval": k}
        res = simulate(trace, topology, [policy], steps=steps, params=card.cost_params(trace.ep),
                       policy_params={policy: params}, progress=False, references=False,
                       warmup=replan_window(candidates))
        per_step = res.per_step[res.per_step["policy"] == policy]
        rows.append({"replan_interval": k, "tokens_per_s": per_step["tokens"].sum() / per_step["step_s"].sum(),
                     "step_s": per_step["step_s"].mean(), "migration_s": per_step["migration_s"].mean(),
                     "experts_moved": per_step["experts_moved"].mean()})
    table = pd.DataFrame(rows)
    best = int(table.loc[table["tokens_per_s"].idxmax(), "replan_interval"])  # first maximum: smaller k
    return best, table


def rehoming_at_best_interval(trace: RoutingTrace, topology: Topology, card: SetupCard,
                              policies=REHOMING_POLICIES, references=("megatron", "relibra"),
                              candidates=REPLAN_INTERVALS) -> pd.DataFrame:
    """Each re-homing policy at every candidate interval and the reference policies, on the same steps
    (replan_steps) after the same warm-up: one row per (policy, replan_interval) with tokens_per_s,
    step_s, migration_s, experts_moved (per step), speedup_vs_megatron (tokens_per_s over Megatron's on
    those steps; needs "megatron" in references), best (the row is the policy's chosen interval; True
    for the references, which have none: replan_interval 0)."""
    steps = replan_steps(trace, candidates)
    res = simulate(trace, topology, list(references), steps=steps, params=card.cost_params(trace.ep),
                   policy_params=card.policy_params(references), progress=False, references=False,
                   warmup=replan_window(candidates))
    g = res.per_step.groupby("policy", sort=False)
    ref = pd.DataFrame({"replan_interval": 0, "tokens_per_s": g["tokens"].sum() / g["step_s"].sum(),
                        "step_s": g["step_s"].mean(), "migration_s": g["migration_s"].mean(),
                        "experts_moved": g["experts_moved"].mean(), "best": True}).reset_index()
    tables = [ref]
    for policy in policies:
        best, table = choose_replan_interval(trace, topology, policy, card, candidates)
        tables.append(table.assign(policy=policy, best=table["replan_interval"] == best))
    out = pd.concat(tables, ignore_index=True)
    megatron = ref.set_index("policy")["tokens_per_s"].get("megatron", float("nan"))
    out["speedup_vs_megatron"] = out["tokens_per_s"] / megatron
    return out[["policy", "replan_interval", "best", "tokens_per_s", "speedup_vs_megatron", "step_s",
                "migration_s", "experts_moved"]]
