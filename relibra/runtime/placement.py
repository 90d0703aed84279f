"""Logical experts -> physical slots, as pure numpy functions of a StepPlan. Every read of a plan's
replica fields by the runtime goes through this module.

Physical layout of one layer: rank g owns the contiguous slots [g * S, (g + 1) * S) with
S = E / ep + R: first its E / ep home slots (its homed experts in increasing expert id), then its R
replica slots. megatron-core's alltoall dispatcher only needs each rank's slots to be contiguous.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from relibra.errors import PlanError
from relibra.plan import StepPlan, homes_per_gpu


def slots_per_rank(num_experts: int, ep: int, replica_slots: int) -> int:
    return num_experts // ep + replica_slots


def home_slot_index(home: np.ndarray, ep: int, replica_slots: int) -> np.ndarray:
    """Physical slot of each expert's home: int64 [layers, experts].

    home: int [layers, experts], every rank homing exactly experts / ep of them.
    """
    home = np.asarray(home, dtype=np.int64)
    layers, experts = home.shape
    onehot = home[:, :, None] == np.arange(ep)[None, None, :]  # [L, E, ep]
    position = np.take_along_axis(np.cumsum(onehot, axis=1), home[:, :, None], axis=2)[:, :, 0] - 1
    return home * slots_per_rank(experts, ep, replica_slots) + position


def local_home_experts(home: np.ndarray, rank: int) -> np.ndarray:
    """Experts homed on `rank`, per layer, in slot order: int64 [layers, experts / ep]."""
    home = np.asarray(home)
    return np.stack([np.flatnonzero(home[l] == rank) for l in range(home.shape[0])])


def slot_experts(home: np.ndarray, replica_expert: np.ndarray) -> np.ndarray:
    """Logical expert held by every physical slot: int64 [layers, ep * S], -1 for an empty replica slot.

    home: [layers, experts]; replica_expert: [layers, ep, R] for one micro-batch.
    """
    layers, experts = home.shape
    _, ep, r = replica_expert.shape
    per = experts // ep
    s = per + r
    out = np.full((layers, ep * s), -1, dtype=np.int64)
    hs = home_slot_index(home, ep, r)
    np.put_along_axis(out, hs, np.broadcast_to(np.arange(experts), (layers, experts)), axis=1)
    rep_idx = (np.arange(ep)[:, None] * s + per + np.arange(r)[None, :]).ravel()
    out[:, rep_idx] = replica_expert.reshape(layers, ep * r)
    return out


def replica_routes(plan: StepPlan, micro_batch: int, layer: int, src: int,
                   replica_slots: int) -> list[tuple[int, int, int]]:
    """(expert, physical slot, tokens) for every replica src sends tokens to, in (rank, slot) order.

    Of src's tokens routed to `expert`, the first `tokens` not taken by an earlier entry (in token
    order) go to that slot; the rest go home.
    """
    per = plan.num_experts // plan.ep
    s = per + replica_slots
    rexp = plan.replica_expert[micro_batch, layer]  # [ep, R_plan]
    gi, ri = np.nonzero(rexp >= 0)  # in (rank, slot) order
    flow = plan.replica_rows(layer, np.full(len(gi), micro_batch), gi, ri)[:, src]  # [n] tokens from src
    return [(int(rexp[g, r]), int(g * s + per + r), int(t)) for g, r, t in zip(gi, ri, flow) if t > 0]


def replicas_in_use(plan: StepPlan, micro_batch: int, replica_slots: int) -> np.ndarray:
    """Expert of every replica slot that receives tokens in `micro_batch`, else -1: int64 [L, ep, replica_slots].

    A slot the plan fills but sends no tokens to is left empty: its weights need not move."""
    rexp = padded_replicas(plan, replica_slots)[micro_batch]  # [L, ep, R]
    tokens = plan.occupied_replica_tokens()[micro_batch]  # [L, ep, R_plan]: every src's tokens per slot
    used = np.zeros(rexp.shape, dtype=bool)
    used[..., : tokens.shape[-1]] = tokens > 0
    return np.where(used, rexp, -1)


def padded_replicas(plan: StepPlan, replica_slots: int) -> np.ndarray:
    """plan.replica_expert widened to `replica_slots` with -1: int64 [M, L, ep, replica_slots]."""
    m, l, ep, r = plan.replica_expert.shape
    if r > replica_slots:
        raise PlanError(f"plan of policy {plan.policy!r} uses {r} replica slots per GPU; the runtime was "
                        f"built with {replica_slots}")
    out = np.full((m, l, ep, replica_slots), -1, dtype=np.int64)
    out[..., :r] = plan.replica_expert
    return out


def check_plan_for_runtime(plan: StepPlan, ep: int, ranks_per_node: int, replica_slots: int,
                           num_layers: int, num_experts: int) -> None:
    """Refuse (PlanError) a plan this runtime cannot execute, before anything moves.

    Beyond StepPlan.validate: the plan's EP size, layers and experts match the model; every rank homes
    E / ep experts; replicas fit the slots; and every replica sits in its home's node (node rule),
    whatever replica_scope the plan declares, because replica weights only move inside a node.
    """
    name = f"plan of policy {plan.policy!r}"
    if plan.ep != ep or plan.num_layers != num_layers or plan.num_experts != num_experts:
        raise PlanError(f"{name}: shape (ep={plan.ep}, layers={plan.num_layers}, experts={plan.num_experts}) does "
                        f"not match the runtime (ep={ep}, layers={num_layers}, experts={num_experts})")
    if plan.gpus_per_node != ranks_per_node:
        raise PlanError(f"{name}: made for {plan.gpus_per_node} GPUs per node, the runtime has {ranks_per_node}")
    plan.validate()
    counts = homes_per_gpu(plan.home, ep)
    if (counts != num_experts // ep).any():
        l, g = (int(i) for i in np.argwhere(counts != num_experts // ep)[0])
        raise PlanError(f"{name}: layer {l} rank {g} homes {int(counts[l, g])} experts; the runtime needs "
                        f"exactly {num_experts // ep} per rank")
    rexp = padded_replicas(plan, replica_slots)
    occ = rexp >= 0
    if occ.any():
        mi, li, gi, ri = np.nonzero(occ)
        home_rank = plan.home[li, rexp[mi, li, gi, ri]]
        off = home_rank // ranks_per_node != gi // ranks_per_node
        if off.any():
            i = int(np.argmax(off))
            raise PlanError(f"{name}: replica of expert {int(rexp[mi[i], li[i], gi[i], ri[i]])} at [micro_batch, "
                            f"layer, rank, slot]=({mi[i]}, {li[i]}, {gi[i]}, {ri[i]}) is on node "
                            f"{gi[i] // ranks_per_node} but its home rank {home_rank[i]} is on node "
                            f"{home_rank[i] // ranks_per_node}; replicas may only be made inside a node")


def stage_plan(plan: StepPlan, first_layer: int, num_layers: int) -> StepPlan:
    """The plan's rows of layers [first_layer, first_layer + num_layers): what one pipeline stage's
    MoE layers execute (the plan itself when it is exactly those layers). PlanError when the plan has
    fewer layers than the stage needs."""
    if first_layer == 0 and plan.num_layers == num_layers:
        return plan
    if first_layer < 0 or first_layer + num_layers > plan.num_layers:
        raise PlanError(f"plan of policy {plan.policy!r}: it has {plan.num_layers} layers; this pipeline stage's MoE "
                        f"layers are the plan's layers {first_layer} .. {first_layer + num_layers - 1}")
    rows = slice(first_layer, first_layer + num_layers)
    return dataclasses.replace(plan, loads=plan.loads[:, rows], home=plan.home[rows],
                               replica_expert=plan.replica_expert[:, rows], replica_start=plan.replica_start[:, rows],
                               replica_tokens=plan.replica_tokens[:, rows],
                               prev_home=None if plan.prev_home is None else plan.prev_home[rows])
