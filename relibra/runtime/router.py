"""A megatron-core TopKRouter that routes over logical experts and emits a routing map over the
plan's PHYSICAL slots (homes and replicas), following the plan's token split for this rank.

The router scores the E logical experts (its weight is [E, hidden]); top-k ids come from its own
scores or, under routing replay, from megatron's RouterReplay (REPLAY_FORWARD: the given ids, with
probabilities recomputed from the router's scores so router gradients still flow). Each (token,
expert) pair then goes to exactly one physical slot: of this rank's tokens routed to expert e, the
first n_1 (in token order) go to the first replica that the plan gives this rank for e, the next n_2
to the second, ..., the rest to e's home slot. Probabilities follow the pair to its slot, so the
combined output is the same whatever the placement.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplayAction

from relibra.errors import PlanError


@dataclass
class LayerRoute:
    """What one layer's router needs for one micro-batch on this rank.

    slot_expert: int64 [P] logical expert of each physical slot (-1 empty replica slot).
    home_slot: int64 [E] physical slot of each expert's home.
    replica_routes: (expert, slot, tokens) from this rank to replicas, in (rank, slot) order.
    replay_ids: int64 [tokens, top_k] replayed expert ids, or None to route by the router's scores.
    """

    slot_expert: torch.Tensor
    home_slot: torch.Tensor
    replica_routes: list
    replay_ids: torch.Tensor | None = None


def physical_routing_map(routing_map: torch.Tensor, route: LayerRoute, num_slots: int) -> torch.Tensor:
    """bool [T, E] logical routing -> bool [T, P] physical routing, one slot per (token, expert) pair.

    Vectorized over the replica routes (n of them): route i takes e_i's tokens ranked [start_i, start_i + n_i)
    among e_i's tokens in token order, start_i being the tokens of e_i given to earlier routes."""
    tokens = routing_map.shape[0]
    device = routing_map.device
    to_home = torch.zeros(tokens, num_slots, dtype=torch.bool, device=device)
    if not route.replica_routes:
        to_home.index_copy_(1, route.home_slot, routing_map)
        return to_home
    experts_np, slots_np, counts_np = (np.asarray(c, dtype=np.int64) for c in zip(*route.replica_routes))
    ends_np = np.zeros_like(counts_np)  # per route: e_i's tokens given to routes up to and including i
    for_expert = np.argsort(experts_np, kind="stable")
    grouped = np.cumsum(counts_np[for_expert])
    first = np.r_[0, np.flatnonzero(np.diff(experts_np[for_expert])) + 1]
    grouped -= np.repeat(np.r_[0, grouped[first[1:] - 1]], np.diff(np.r_[first, len(for_expert)]))
    ends_np[for_expert] = grouped
    experts = torch.as_tensor(experts_np, device=device)
    ends = torch.as_tensor(ends_np, device=device)
    starts = ends - torch.as_tensor(counts_np, device=device)
    available = routing_map.sum(dim=0).index_select(0, experts)  # [n]
    short = ends > available
    if bool(short.any()):
        i = int(torch.nonzero(short)[0, 0])
        raise PlanError(f"the plan sends {int(ends[i])} tokens of expert {int(experts[i])} from this rank to replicas "
                        f"but only {int(available[i])} are routed to it; plan and routing disagree")
    order = torch.cumsum(routing_map.to(torch.int64), dim=0) - 1  # rank of each token among e's tokens
    col = order.index_select(1, experts)  # [T, n]
    pick = routing_map.index_select(1, experts) & (col >= starts) & (col < ends)  # [T, n]
    to_replica = torch.zeros(tokens, num_slots, dtype=torch.bool, device=device)
    to_replica[:, torch.as_tensor(slots_np, device=device)] = pick
    taken = torch.zeros(routing_map.shape, dtype=torch.int64, device=device)
    taken.index_add_(1, experts, pick.to(torch.int64))
    to_home.index_copy_(1, route.home_slot, routing_map & (taken == 0))
    return to_home | to_replica


class PlacementRouter(TopKRouter):
    """TopKRouter over E logical experts whose routing() answers over P physical slots.

    Built by megatron-core's MoELayer with the model's physical config (num_moe_experts = P, every
    rank's home and replica slots); `num_experts` (E) sizes the router itself, so its weight is the
    logical [E, hidden] one. Before each forward the step hook sets `route` (a LayerRoute).
    """

    def __init__(self, config, pg_collection=None, *, num_experts: int):
        super().__init__(config=dataclasses.replace(config, num_moe_experts=num_experts), pg_collection=pg_collection)
        self.num_slots = config.num_moe_experts
        self.route: LayerRoute | None = None

    def routing(self, logits: torch.Tensor, padding_mask: torch.Tensor | None = None):
        route = self.route
        if route is None:
            raise PlanError(f"MoE layer {self.layer_number}: no route set; call the step hook's before_microbatch "
                            "before the forward")
        if self.router_replay is not None:
            self.router_replay.clear_indices()
            if route.replay_ids is not None:
                self.router_replay.set_target_indices(route.replay_ids)
                self.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            else:
                self.router_replay.clear_router_replay_action()
        probs, routing_map = super().routing(logits, padding_mask=padding_mask)  # [T, E] each
        physical_map = physical_routing_map(routing_map, route, self.num_slots)
        # Every slot reads its logical expert's probability; the map keeps one slot per pair.
        expert_of_slot = route.slot_expert.clamp(min=0)
        physical_probs = probs.index_select(1, expert_of_slot) * physical_map
        return physical_probs, physical_map


def make_layer_route(slot_expert: np.ndarray, home_slot: np.ndarray, replica_routes: list,
                     replay_ids: np.ndarray | None, device: str | torch.device = "cpu") -> LayerRoute:
    def as_tensor(a):
        return torch.as_tensor(a, dtype=torch.int64, device=device)

    return LayerRoute(as_tensor(slot_expert), as_tensor(home_slot), replica_routes,
                      None if replay_ids is None else as_tensor(replay_ids))
