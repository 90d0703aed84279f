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
    rexp, rflow = empty_replicas(m, l, ep, replica_slots)
    return StepPlan(policy, loads, home, rexp, rflow, gpus_per_node, e // ep + replica_slots,
                    replica_scope="none" if replica_slots == 0 else "node")


def reordered_home(num_layers: int, num_experts: int, ep: int, shift: int = 1) -> np.ndarray:
    """A placement that moves every expert: the static one with expert ids rotated by `shift`."""
    home = static_placement(num_layers, num_experts, ep)
    return np.roll(home, shift, axis=1)


def in_node_replica_plan(loads: np.ndarray, gpus_per_node: int, replica_slots: int,
                         home: np.ndarray | None = None, policy: str = "hand-replicas") -> StepPlan:
    """Each rank's replica slots copy the hottest experts homed elsewhere in its node, taking half
    (rounded down) of every src's tokens of that expert. loads: int [M, L, ep, E]."""
    plan = static_plan(loads, gpus_per_node, replica_slots, home, policy)
    m, l, ep, e = loads.shape
    expert_load = loads.sum(axis=2)  # [M, L, E]
    for mi in range(m):
        for li in range(l):
            hot = np.argsort(-expert_load[mi, li], kind="stable")
            for g in range(ep):
                node = g // gpus_per_node
                candidates = [int(x) for x in hot if plan.home[li, x] != g
                              and plan.home[li, x] // gpus_per_node == node
                              and x not in plan.replica_expert[mi, li]]
                for r, expert in enumerate(candidates[:replica_slots]):
                    plan.replica_expert[mi, li, g, r] = expert
                    plan.replica_flow[mi, li, :, g, r] = loads[mi, li, :, expert] // 2
    _cap_flows(plan)
    return plan


def _cap_flows(plan: StepPlan) -> None:
    """Several replicas of one expert must not take more than its tokens: cap in (rank, slot) order."""
    m, l, ep, e = plan.loads.shape
    for mi in range(m):
        for li in range(l):
            left = plan.loads[mi, li].astype(np.int64).copy()  # [src, E]
            for g in range(ep):
                for r in range(plan.replica_slots):
                    x = plan.replica_expert[mi, li, g, r]
                    if x < 0:
                        continue
                    take = np.minimum(plan.replica_flow[mi, li, :, g, r], left[:, x])
                    plan.replica_flow[mi, li, :, g, r] = take
                    left[:, x] -= take


def cross_node_replica_plan(loads: np.ndarray, gpus_per_node: int, replica_slots: int) -> StepPlan:
    """A plan that breaks the node rule: rank 0's expert 0 replicated on the first rank of the next node."""
    plan = static_plan(loads, gpus_per_node, replica_slots, policy="bad-cross-node")
    plan.replica_scope = "any"
    dst = gpus_per_node  # first rank of node 1
    plan.replica_expert[0, 0, dst, 0] = 0
    plan.replica_flow[0, 0, :, dst, 0] = loads[0, 0, :, 0] // 2
    return plan
