"""Routing record and replay for the RL policy's routers.

This mirrors megatron-core's `megatron.core.transformer.moe.router_replay.RouterReplay` (0.16):
one `RouterReplay` per router, and the same actions.

- RECORD: the router picks its own top-k experts and keeps the ids of every call, int64 [tokens, top_k].
- REPLAY_FORWARD: the router takes the given ids instead of its own top-k and recomputes their
  probabilities from its own scores (`scores.gather(1, ids)`), so router gradients still flow.
- None: plain top-k routing.

Two differences from megatron-core, both deliberate. (1) Instances live on the model (one per
router, in layer order) instead of in a class-wide list, so two policies in one process never see
each other's records. (2) RECORD keeps every call (a rollout calls the model once for the prompt
and once per generated token), and REPLAY_FORWARD also keeps the ids the router actually used and
the share of tokens whose own top-k would have picked the same experts, for the checks below.
REPLAY_BACKWARD (megatron-core's replay during activation recomputation) is not needed: the
policy does not recompute activations.
"""

from __future__ import annotations

import enum

import numpy as np
import torch

from relibra.errors import RelibraError


class ReplayMismatchError(RelibraError):
    """Training routed a token to other experts than the rollout recorded for it."""


class RouterReplayAction(enum.Enum):
    RECORD = "record"
    REPLAY_FORWARD = "replay_forward"


class RouterReplay:
    """Record / replay state of one router (one MoE layer)."""

    def __init__(self, layer: int):
        self.layer = layer
        self.action: RouterReplayAction | None = None
        self.recorded: list[torch.Tensor] = []  # one int64 [tokens, top_k] per RECORD call
        self.target: torch.Tensor | None = None  # int64 [tokens, top_k] to replay next
        self.used: torch.Tensor | None = None  # ids the last REPLAY_FORWARD call dispatched with
        self.own_agreement: float = float("nan")  # share of tokens whose own top-k set equals the replayed set

    def select(self, scores: torch.Tensor, top_k: int) -> torch.Tensor:
        """Expert ids int64 [tokens, top_k] for router scores [tokens, experts], per the action."""
        if self.action is RouterReplayAction.REPLAY_FORWARD:
            if self.target is None:
                raise ReplayMismatchError(f"layer {self.layer}: REPLAY_FORWARD without replay ids")
            if tuple(self.target.shape) != (scores.shape[0], top_k):
                raise ReplayMismatchError(f"layer {self.layer}: replay ids have shape {tuple(self.target.shape)} "
                                          f"but this call routes {scores.shape[0]} tokens with top_k={top_k}")
            ids = self.target.to(device=scores.device, dtype=torch.long)
            with torch.no_grad():
                own = torch.topk(scores, top_k, dim=1).indices
                same = (torch.sort(own, dim=1).values == torch.sort(ids, dim=1).values).all(dim=1)
                self.own_agreement = float(same.float().mean()) if len(same) else 1.0
            self.used = ids
            self.target = None  # one target feeds one call
            return ids
        ids = torch.topk(scores, top_k, dim=1).indices
        if self.action is RouterReplayAction.RECORD:
            self.recorded.append(ids.detach().clone())
        return ids

    def clear(self) -> None:
        self.recorded, self.target, self.used = [], None, None
        self.own_agreement = float("nan")


# ---- model-wide helpers (instances in layer order) -----------------------------------------------
def set_action(replays: list[RouterReplay], action: RouterReplayAction | None) -> None:
    """Set one action on every router and drop what they held."""
    for r in replays:
        r.clear()
        r.action = action


def set_replay_data(replays: list[RouterReplay], ids: torch.Tensor) -> None:
    """Feed ids int [tokens, layers, top_k] (tokens in the order the next forward routes them)."""
    if ids.ndim != 3 or ids.shape[1] != len(replays):
        raise ReplayMismatchError(f"replay ids must have shape [tokens, {len(replays)}, top_k], got {tuple(ids.shape)}")
    for layer, r in enumerate(replays):
        r.target = ids[:, layer]


def pop_recorded(replays: list[RouterReplay]) -> list[torch.Tensor]:
    """The ids of the last RECORD call of every router, stacked: int64 [tokens, layers, top_k] per call.

    Returns one tensor per recorded call, oldest first, and empties the records.
    """
    calls = len(replays[0].recorded)
    if any(len(r.recorded) != calls for r in replays):
        raise ReplayMismatchError("routers recorded different numbers of calls")
    out = [torch.stack([r.recorded[c] for r in replays], dim=1) for c in range(calls)]
    for r in replays:
        r.recorded = []
    return out


def used_ids(replays: list[RouterReplay]) -> torch.Tensor:
    """Ids every router dispatched with in the last REPLAY_FORWARD call: int64 [tokens, layers, top_k]."""
    if any(r.used is None for r in replays):
        raise ReplayMismatchError("a router has not replayed anything yet")
    return torch.stack([r.used for r in replays], dim=1)


def own_agreement(replays: list[RouterReplay]) -> float:
    """Mean over layers of the share of tokens whose own top-k equals the replayed set."""
    return float(np.mean([r.own_agreement for r in replays]))


def check_replay(recorded: np.ndarray, replayed: np.ndarray, where: str) -> None:
    """Raise ReplayMismatchError unless replayed routing equals the recorded one, token by token.

    recorded, replayed: int [tokens, layers, top_k]; ids are compared in recorded order.
    """
    recorded = np.asarray(recorded)
    replayed = np.asarray(replayed)
    if recorded.shape != replayed.shape:
        raise ReplayMismatchError(f"{where}: replay routed {replayed.shape} token-slots but the rollout recorded "
                                  f"{recorded.shape}")
    diff = recorded != replayed
    if diff.any():
        t, l, k = (int(i) for i in np.argwhere(diff)[0])
        raise ReplayMismatchError(f"{where}: token {t} layer {l} slot {k} was replayed to expert {int(replayed[t, l, k])} "
                                  f"but the rollout recorded expert {int(recorded[t, l, k])} "
                                  f"({int(diff.any(axis=(1, 2)).sum())} tokens differ)")
