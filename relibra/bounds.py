"""Lower bounds on the maximum tokens any GPU computes, per (micro_batch, layer), and every plan's
gap to its bound.

Three references:
- "policy": the plan's own constraints: its homes (fixed for the step), its replica scope and its
  spare slots per GPU, with replicas and token splits free per (micro_batch, layer). What a
  perfect per-micro-batch replication could reach on that placement; for ReLibra this isolates
  the replication step, for EPLB it includes the cost of copies fixed for the whole step.
- "free": any placement with equal homes, the plan's replica scope and spare slots (a bound for
  the placement search too).
- "ideal": ceil(mean tokens per GPU), what the `balanced` ideal reaches.

Bounds under fixed homes (x_e: tokens of expert e; H_g: tokens homed on GPU g; s_g: spare slots):
- scope "none": the loads are forced: bound = max_g H_g.
- scope "node": a node's tokens stay in the node: max_n ceil(N_n / gpus_per_node); and GPU g can
  shed tokens only through replicas in the other GPUs' spare slots of its node, at most one expert
  per slot: H_g - (sum of g's k heaviest experts), k = sum of s over the node's other GPUs.
- scope "any": ceil(total / ep), and the same shedding bound with the slots of all other GPUs.
Free placement: ceil(mean), and one expert's tokens spread over at most c copies
(c = 1 + min(other GPUs that can hold it, spare slots elsewhere)), and for "none" the
largest expert.
"""

from __future__ import annotations

import numpy as np

from relibra.errors import PlanError
from relibra.plan import StepPlan
from relibra.trace import rank_load

REFERENCES = ("policy", "free", "ideal")


def _ceil_div(a, b):
    return -(-np.asarray(a, dtype=np.int64) // b)


def ideal_bound(expert_tokens: np.ndarray, ep: int) -> np.ndarray:
    """ceil(mean tokens per GPU): [M, L, E] -> int64 [M, L]."""
    return _ceil_div(expert_tokens.sum(axis=-1, dtype=np.int64), ep)


def shedding_bound(expert_tokens: np.ndarray, home: np.ndarray, ep: int, slots_elsewhere: np.ndarray) -> np.ndarray:
    """max_g (H_g - tokens of g's slots_elsewhere[g] heaviest homed experts), int64 [M, L].

    expert_tokens: [M, L, E]; home: [L, E]; slots_elsewhere: int [L, ep] spare slots on the GPUs
    g's tokens may move to.
    """
    m, layers, experts = expert_tokens.shape
    x = expert_tokens.astype(np.int64)
    # sort each GPU's homed experts by tokens, heaviest first, then drop the k heaviest
    order = np.argsort(home, axis=1, kind="stable")  # experts grouped by GPU
    gpu_sorted = np.take_along_axis(home, order, axis=1)  # [L, E]
    xs = np.take_along_axis(x, np.broadcast_to(order, x.shape), axis=2)  # [M, L, E] grouped by GPU
    key = gpu_sorted[None].astype(np.float64) * (x.max(initial=0) + 1.0) * 2 - xs  # GPU asc, tokens desc
    within = np.argsort(key, axis=2, kind="stable")
    xs = np.take_along_axis(xs, within, axis=2)
    gs = np.broadcast_to(gpu_sorted[None], xs.shape)
    first = np.concatenate([np.ones((m, layers, 1), bool), gs[..., 1:] != gs[..., :-1]], axis=2)
    pos = np.arange(experts)[None, None, :]
    start = np.maximum.accumulate(np.where(first, pos, 0), axis=2)
    rank = pos - start  # rank of the expert among its GPU's, heaviest = 0
    k = np.take_along_axis(np.broadcast_to(slots_elsewhere[None], (m, layers, ep)), gs, axis=2)
    kept = np.where(rank >= k, xs, 0)
    residual = np.zeros((m, layers, ep), dtype=np.int64)
    mi, li = np.meshgrid(np.arange(m), np.arange(layers), indexing="ij")
    np.add.at(residual, (mi[..., None], li[..., None], gs), kept)
    return residual.max(axis=2)


def fixed_home_bound(expert_tokens: np.ndarray, home: np.ndarray, ep: int, gpus_per_node: int, replica_scope: str,
                     spare_slots: np.ndarray | int) -> np.ndarray:
    """Lower bound on max GPU tokens with these homes: int64 [M, L].

    expert_tokens: int [M, L, E]; home: int [L, E]; spare_slots: int or int [L, ep] replica slots
    free on each GPU after its homes.
    """
    m, layers, experts = expert_tokens.shape
    homed = rank_load(expert_tokens, home, ep)  # [M, L, ep]
    spare = np.broadcast_to(np.asarray(spare_slots, dtype=np.int64), (layers, ep))
    if replica_scope == "none" or not spare.any():
        return homed.max(axis=2)
    if replica_scope == "node":
        nodes = ep // gpus_per_node
        node_tokens = homed.reshape(m, layers, nodes, gpus_per_node).sum(axis=3)
        bound = _ceil_div(node_tokens, gpus_per_node).max(axis=2)
        node_spare = spare.reshape(layers, nodes, gpus_per_node).sum(axis=2)
        elsewhere = np.repeat(node_spare, gpus_per_node, axis=1) - spare
    elif replica_scope == "any":
        bound = ideal_bound(expert_tokens, ep)
        elsewhere = spare.sum(axis=1, keepdims=True) - spare
    else:
        raise PlanError(f"unknown replica scope {replica_scope!r}")
    return np.maximum(bound, shedding_bound(expert_tokens, home, ep, elsewhere))


def free_placement_bound(expert_tokens: np.ndarray, ep: int, gpus_per_node: int, replica_scope: str,
                         spare_slots_per_gpu: int) -> np.ndarray:
    """Lower bound on max GPU tokens over every equal-homes placement: int64 [M, L]."""
    mean = ideal_bound(expert_tokens, ep)
    hottest = expert_tokens.max(axis=-1).astype(np.int64)
    if replica_scope == "none" or spare_slots_per_gpu == 0:
        return np.maximum(mean, hottest)
    reach = gpus_per_node - 1 if replica_scope == "node" else ep - 1
    copies = 1 + min(reach, reach * spare_slots_per_gpu)
    return np.maximum(mean, _ceil_div(hottest, copies))


def plan_spare_slots(plan: StepPlan) -> np.ndarray:
    """Spare slots per GPU after its homes: int64 [L, ep]."""
    return np.maximum(plan.slots_per_gpu - plan.homes_per_gpu(), 0)


def plan_lower_bound(plan: StepPlan, reference: str = "policy") -> np.ndarray:
    """The bound a plan is measured against: int64 [M, L] (see the module docstring)."""
    expert_tokens = plan.loads.sum(axis=2, dtype=np.int64)
    if reference == "policy":
        return fixed_home_bound(expert_tokens, plan.home, plan.ep, plan.gpus_per_node, plan.replica_scope,
                                plan_spare_slots(plan))
    if reference == "free":
        spare = int(plan_spare_slots(plan).max()) if plan.replica_scope != "none" else 0
        return free_placement_bound(expert_tokens, plan.ep, plan.gpus_per_node, plan.replica_scope, spare)
    if reference == "ideal":
        return ideal_bound(expert_tokens, plan.ep)
    raise PlanError(f"unknown bound reference {reference!r}; known: {', '.join(REFERENCES)}")


def gap_to_bound(plan: StepPlan, reference: str = "policy") -> np.ndarray:
    """max GPU tokens / lower bound - 1: float64 [M, L] (0 where the bound is 0)."""
    bound = plan_lower_bound(plan, reference).astype(np.float64)
    actual = plan.gpu_tokens().max(axis=2).astype(np.float64)
    return np.where(bound > 0, actual / np.maximum(bound, 1) - 1.0, 0.0)
