"""Hand-built StepPlans for the runtime's checks and tests: static placement, in-node replicas that
take half of a hot expert's tokens, and a cross-node reordering. (Policies proper live in
relibra.policies; these only need to be valid and to exercise every runtime path.)"""

from __future__ import annotations

import numpy as np

from relibra.plan import StepPlan, empty_replicas
from relibra.trace import static_placement


def static_plan(loads: np.ndarray, gpus_per_node: int, replica_slots: int = 0, home: np.ndarray | None = None,
                policy: str = "megatron") -> StepPlan:
    """No replicas; `home` (default: megatron's contiguous placement). loads: int [M, L, ep, E]."""
    m, l, ep, e = loads.shape
    home = static_placement(l, e, ep) if home is None else np.asarray(home, dtype=np.int64)
    rexp, rstart, rtok = empty_replicas(m, l, ep, replica_slots)
    return StepPlan(policy, loads, home, rexp, rstart, rtok, gpus_per_node, e // ep + replica_slots,
                    replica_scope="none" if replica_slots == 0 else "node")


def reordered_home(num_layers: int, num_experts: int, ep: int, shift: int = 1) -> np.ndarray:
    """A placement that moves every expert: the static one with expert ids rotated by `shift`."""
    home = static_placement(num_layers, num_experts, ep)
    return np.roll(home, shift, axis=1)


def in_node_replica_plan(loads: np.ndarray, gpus_per_node: int, replica_slots: int,
                         home: np.ndarray | None = None, policy: str = "hand-replicas") -> StepPlan:
    """Each rank's replica slots copy the hottest experts homed elsewhere in its node, each replica taking
    half (rounded down) of its expert's tokens, or what its earlier replicas (in rank, slot order) left;
    consecutive runs in source order. loads: int [M, L, ep, E]."""
    plan = static_plan(loads, gpus_per_node, replica_slots, home, policy)
    m, l, ep, e = loads.shape
    expert_load = loads.sum(axis=2, dtype=np.int64)  # [M, L, E]
    for mi in range(m):
        for li in range(l):
            hot = np.argsort(-expert_load[mi, li], kind="stable")
            taken = np.zeros(e, dtype=np.int64)  # tokens of each expert already given to a replica
            for g in range(ep):
                node = g // gpus_per_node
                candidates = [int(x) for x in hot if plan.home[li, x] != g
                              and plan.home[li, x] // gpus_per_node == node
                              and x not in plan.replica_expert[mi, li]]
                for r, expert in enumerate(candidates[:replica_slots]):
                    total = expert_load[mi, li, expert]
                    take = min(total // 2, total - taken[expert])
                    plan.replica_expert[mi, li, g, r] = expert
                    plan.replica_start[mi, li, g, r] = taken[expert]
                    plan.replica_tokens[mi, li, g, r] = take
                    taken[expert] += take
    return plan


def cross_node_replica_plan(loads: np.ndarray, gpus_per_node: int, replica_slots: int) -> StepPlan:
    """A plan that breaks the node rule: rank 0's expert 0 replicated on the first rank of the next node."""
    plan = static_plan(loads, gpus_per_node, replica_slots, policy="bad-cross-node")
    plan.replica_scope = "any"
    dst = gpus_per_node  # first rank of node 1
    plan.replica_expert[0, 0, dst, 0] = 0
    plan.replica_tokens[0, 0, dst, 0] = loads[0, 0, :, 0].sum() // 2
    return plan
