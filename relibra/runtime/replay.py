"""Which top-k ids a router's next routing call must follow: the replayed routing, read without consuming it.

A ReLibra router routes through whatever replay its training stack installed (relibra.runtime.router).
To make sure it did, the router reads, before the call, the ids the stack's replay will hand it, and
afterwards counts the tokens whose routing is exactly those ids (`followed_tokens`); a step in which any
token departs from them is refused (ReplayError). The replay objects read here, each by its contract:

  megatron-core's RouterReplay (megatron/core/transformer/moe/router_replay.py, 0.16) and verl's own
      (verl/utils/megatron/router_replay_patch.py, volcengine/verl @b178a3c), both on `router.router_replay`:
      `router_replay_action` REPLAY_FORWARD replays `target_topk_idx`, REPLAY_BACKWARD replays
      `replay_backward_list[0]`; RECORD and None route by the scores (nothing to follow).
  slime's RoutingReplay (slime/utils/routing_replay.py, THUDM/slime @624b824), on `router.routing_replay`
      when ENABLE_ROUTING_REPLAY=1: ROUTING_REPLAY_STAGE replay_forward replays
      `top_indices_list[forward_index]`, replay_backward `top_indices_list[backward_index]`; record and
      fallthrough route by the scores. slime's stage wins over router_replay (its compute_topk wraps
      megatron's, docker/patch/latest/megatron.patch).
"""

from __future__ import annotations

import os

import torch

from relibra.errors import ConfigError, PlanError


class ReplayError(PlanError):
    """A router's routing departed from the replayed routing it had to follow."""


def _action(replay) -> str | None:
    action = getattr(replay, "router_replay_action", None)
    if action is None:
        return None
    return str(getattr(action, "value", action))


def slime_expected_ids(router, layer) -> tuple[bool, torch.Tensor | None]:
    """(slime decides, ids) for a router with slime's RoutingReplay."""
    replay = getattr(router, "routing_replay", None)
    if replay is None or not hasattr(replay, "top_indices_list") or os.environ.get("ENABLE_ROUTING_REPLAY", "0") != "1":
        return False, None
    stage = os.environ.get("ROUTING_REPLAY_STAGE")
    if stage not in ("replay_forward", "replay_backward"):
        return False, None  # record, fallthrough: megatron's own compute_topk (and its router_replay) decide
    index = int(replay.forward_index if stage == "replay_forward" else replay.backward_index)
    if index >= len(replay.top_indices_list):
        raise ReplayError(f"MoE layer {layer}: slime's ROUTING_REPLAY_STAGE={stage} but its RoutingReplay holds "
                          f"{len(replay.top_indices_list)} micro-batches, none at index {index}")
    entry = replay.top_indices_list[index]
    if not torch.is_tensor(entry):
        raise ConfigError(f"MoE layer {layer}: slime's replay entry {index} is a {type(entry).__name__}, not a "
                          "tensor (lazy routing-replay resources are not read ahead)")
    return True, entry


def expected_ids(router, layer) -> torch.Tensor | None:
    """int [T, K] ids the stack's replay gives `router` in its next routing call, or None when the stack
    routes by the router's scores. Reads only; raises ReplayError when replay is on but holds no ids."""
    decided, ids = slime_expected_ids(router, layer)
    if decided:
        return ids
    replay = getattr(router, "router_replay", None)
    action = _action(replay)
    if action == "replay_forward":
        ids = getattr(replay, "target_topk_idx", None)
        if ids is None:
            raise ReplayError(f"MoE layer {layer}: the router's replay is set to REPLAY_FORWARD but holds no ids "
                              "(RouterReplay.set_replay_data / set_target_indices was not called for this forward)")
        return ids
    if action == "replay_backward":
        pending = getattr(replay, "replay_backward_list", None)
        if not pending:
            raise ReplayError(f"MoE layer {layer}: the router's replay is set to REPLAY_BACKWARD but its "
                              "replay_backward_list is empty")
        return pending[0]
    return None


def followed_tokens(routing_map: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """bool [T]: token t was routed to exactly the experts ids[t] names (routing_map bool [T, E], ids int [T, K])."""
    ids = ids.to(device=routing_map.device, dtype=torch.int64)
    if (ids.dim() != 2 or ids.shape[0] != routing_map.shape[0]
            or (ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= routing_map.shape[1]))):
        return torch.zeros(routing_map.shape[0], dtype=torch.bool, device=routing_map.device)
    wanted = torch.zeros_like(routing_map, dtype=torch.bool).scatter(1, ids, True)
    return (wanted == routing_map.bool()).all(dim=1)
