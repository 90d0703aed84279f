"""A megatron-core TopKRouter that routes over logical experts and emits a routing map over the
plan's PHYSICAL slots (homes and replicas), following the plan's token split for this rank.

The router scores the E logical experts (its weight is [E, hidden]). Its top-k ids come, in order:
  1. from the step hook (`route.replay_ids`, ReLibraHook.before_microbatch(m, replay)): the given ids,
     probabilities gathered from the router's scores so router gradients still flow; the router's
     `router_replay` object is not touched;
  2. else from whatever replay the training stack installed, exactly as megatron-core's TopKRouter
     would consult it: megatron-core's RouterReplay (NeMo-RL: RouterReplay.set_replay_data and
     REPLAY_FORWARD; RECORD records the logical ids), verl's patched routing and its RouterReplay, or
     slime's RoutingReplay, which its patched topk_routing_with_score_function pops;
  3. else from the router's own scores.
When ids are replayed (1, or 2 in a replay stage) the router counts the tokens whose routing is exactly
the replayed ids (`replay_tokens`, `replay_followed`) and refuses the call with one ReplayError when any
token departs from them (relibra.runtime.replay): a replay the stack's code skipped is never silent.
Each (token,
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

from relibra.errors import ConfigError, PlanError
from relibra.runtime import compat
from relibra.runtime.replay import ReplayError, expected_ids, followed_tokens, slime_expected_ids

# The token dispatchers whose routing map the router may answer over physical slots: both take any
# boolean [tokens, slots] map and send each marked pair to the rank owning the slot.
SUPPORTED_DISPATCHERS = ("alltoall", "allgather")


def check_config(config) -> None:
    """Refuse (ConfigError) the megatron-core options a ReLibra MoE layer cannot run, at build time.

    A capacity factor drops tokens after routing, so the plan's token split (made from the replayed
    routing) would name tokens that never reach their slot; the flex (DeepEP) dispatcher is not wired
    to the physical slots. Grouped GEMM is the spec's business (relibra.runtime.spec: TEGroupedMLP is
    wrapped, the legacy GroupedMLP refused)."""
    if getattr(config, "moe_expert_capacity_factor", None) is not None or getattr(
            config, "moe_pad_expert_input_to_capacity", False):
        raise ConfigError(
            f"ReLibra MoE layers need every routed token to reach its expert: the model config sets "
            f"moe_expert_capacity_factor={config.moe_expert_capacity_factor!r} (token dropping); "
            "leave it None and moe_pad_expert_input_to_capacity False")
    dispatcher = getattr(config, "moe_token_dispatcher_type", "alltoall")
    if dispatcher not in SUPPORTED_DISPATCHERS:
        raise ConfigError(f"ReLibra MoE layers run on megatron-core's {' or '.join(SUPPORTED_DISPATCHERS)} token "
                          f"dispatcher; the model config sets moe_token_dispatcher_type={dispatcher!r} (the flex "
                          "dispatcher runs DeepEP or HybridEP, which need GPUs, so the kit has not checked that they "
                          "carry the physical routing map to replica slots)")


def rebuild_config(config, **changes):
    """dataclasses.replace(config, **changes) that keeps the attributes a training stack set on the config
    object beyond its dataclass fields (verl's router_replay_patch sets `enable_routing_replay` so; a plain
    replace would rebuild it from the class default and the stack's replay would be dropped).

    An attribute is carried over when the original holds it and a rebuild with no changes does not hold the
    same value: so values __post_init__ derives from the fields are derived anew, never copied."""
    fields = {f.name for f in dataclasses.fields(config)}
    rebuilt = dataclasses.replace(config, **changes)
    extra = {k: v for k, v in vars(config).items() if k not in fields}
    if extra:
        fresh = vars(dataclasses.replace(config))
        for name, value in extra.items():
            if name not in fresh or not _same(fresh[name], value):
                object.__setattr__(rebuilt, name, value)
    return rebuilt


def _same(a, b) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - tensors, arrays: not one truth value
        return False


class _ReplayForward:
    """The replay action of _GivenTopk: equal to any stack's REPLAY_FORWARD enum member (value
    "replay_forward": megatron-core's RouterReplayAction, verl's own), unequal to every other action."""

    value = "replay_forward"

    def __eq__(self, other) -> bool:
        return getattr(other, "value", other) == self.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return "REPLAY_FORWARD (given ids)"


def check_given_ids(ids: torch.Tensor, scores: torch.Tensor, topk: int, layer) -> torch.Tensor:
    """ids as int64 on the scores' device, or PlanError when they do not fit [T, K] over the router's experts."""
    ids = ids.to(device=scores.device, dtype=torch.int64)
    if ids.dim() != 2 or ids.shape[0] != scores.shape[0] or ids.shape[1] != topk:
        raise PlanError(f"MoE layer {layer}: replayed ids have shape {tuple(ids.shape)}; the router "
                        f"routes {scores.shape[0]} tokens to top-{topk}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= scores.shape[1]):
        raise PlanError(f"MoE layer {layer}: replayed ids span [{int(ids.min())}, {int(ids.max())}]; "
                        f"the router has {scores.shape[1]} experts")
    return ids


class _GivenTopk:
    """Stands in for a router's replay object for one routing call: top-k = the given ids [T, K].

    Serves both contracts a router's replay object has: megatron-core 0.16's get_replay_topk (scores,
    topk, num_groups, group_topk, default_compute_topk) -> (probs [T, K] gathered from the scores, ids
    [T, K]), and the attributes verl's router_replay_patch reads (router_replay_action equal to its
    REPLAY_FORWARD, target_topk_idx)."""

    def __init__(self, ids: torch.Tensor, layer):
        self.ids = ids
        self.layer = layer
        self.router_replay_action = _ReplayForward()
        self.target_topk_idx = ids
        self.replay_backward_list = []
        self.layer_number = layer

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        ids = check_given_ids(self.ids, scores, topk, self.layer)
        return scores.gather(1, ids), ids


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

    def __init__(self, config, pg_collection=None, *, num_experts: int, **kwargs):
        compat.check_megatron_version()  # on every device: the subclass depends on TopKRouter's internals
        check_config(config)
        if config.num_moe_experts < num_experts:
            raise ConfigError(f"the model config counts {config.num_moe_experts} expert slots, fewer than the "
                              f"{num_experts} logical experts: build it with relibra.runtime.spec.physical_config")
        # kwargs: what a release passes beyond (config, pg_collection), e.g. 0.19's is_mtp_layer.
        super().__init__(config=rebuild_config(config, num_moe_experts=num_experts), pg_collection=pg_collection,
                         **kwargs)
        self.num_slots = config.num_moe_experts
        self.route: LayerRoute | None = None
        self.replay_tokens = 0  # tokens routed under replay since reset_replay_counts
        self.replay_followed = 0  # of them, tokens routed exactly as replayed
        asked = [name for name in ("moe_enable_routing_replay", "enable_routing_replay")
                 if getattr(self.config, name, False) is True]
        if asked and getattr(self, "router_replay", None) is None:
            raise ConfigError(f"the model config sets {asked[0]}=True but the router was built without a replay "
                              "object (router_replay is None): the stack's replay would be ignored")

    def reset_replay_counts(self) -> None:
        self.replay_tokens = self.replay_followed = 0

    def _topk_routing(self, logits: torch.Tensor, padding_mask: torch.Tensor | None):
        # megatron-core 0.16 added padding_mask to TopKRouter.routing (compat.routing_takes_padding_mask);
        # 0.15, and a stack that patches routing with the one-argument signature (verl's
        # router_replay_patch), get a plain call.
        if padding_mask is None:
            return super().routing(logits)
        if not compat.routing_takes_padding_mask():
            raise ConfigError(f"MoE layer {self.layer_number}: a padding mask was given, but this megatron-core's "
                              "TopKRouter.routing takes none")
        return super().routing(logits, padding_mask=padding_mask)

    def routing(self, logits: torch.Tensor, padding_mask: torch.Tensor | None = None):
        route = self.route
        if route is None:
            raise PlanError(f"MoE layer {self.layer_number}: no route set; call the step hook's before_microbatch "
                            "before the forward")
        if route.replay_ids is not None:
            given = _GivenTopk(route.replay_ids, self.layer_number)
            # router_replay is swapped for the given ids; only slime's stage overrides them (then its ids count)
            decided, expected = slime_expected_ids(self, self.layer_number)
            expected = expected if decided else route.replay_ids

            def check(scores, topk):
                return check_given_ids(route.replay_ids, scores, topk, self.layer_number)

            with compat.given_topk(self, given, route.replay_ids, check):
                probs, routing_map = self._topk_routing(logits, padding_mask)  # [T, E] each
        else:
            expected = expected_ids(self, self.layer_number)
            probs, routing_map = self._topk_routing(logits, padding_mask)
        if expected is not None:
            self._count_followed(routing_map, expected, given=route.replay_ids is not None)
        physical_map = physical_routing_map(routing_map, route, self.num_slots)
        # Every slot reads its logical expert's probability; the map keeps one slot per pair.
        expert_of_slot = route.slot_expert.clamp(min=0)
        physical_probs = probs.index_select(1, expert_of_slot) * physical_map
        return physical_probs, physical_map

    def _count_followed(self, routing_map: torch.Tensor, expected: torch.Tensor, given: bool) -> None:
        """Count the tokens routed exactly as replayed; ReplayError when any was not."""
        followed = followed_tokens(routing_map, expected)
        tokens, ok = int(followed.numel()), int(followed.sum())
        self.replay_tokens += tokens
        self.replay_followed += ok
        if ok != tokens:
            t = int(torch.nonzero(~followed)[0, 0])
            routed = torch.nonzero(routing_map[t]).flatten().tolist()
            source = "the ids given to the hook" if given else "the stack's replay object"
            raise ReplayError(f"MoE layer {self.layer_number}: {tokens - ok} of {tokens} tokens did not follow the "
                              f"replayed routing ({source}); token {t} went to experts {routed}, replay says "
                              f"{sorted(expected[t].tolist())}: the routing call did not use the replay")


def make_layer_route(slot_expert: np.ndarray, home_slot: np.ndarray, replica_routes: list,
                     replay_ids: np.ndarray | None, device: str | torch.device = "cpu") -> LayerRoute:
    def as_tensor(a):
        return torch.as_tensor(a, dtype=torch.int64, device=device)

    return LayerRoute(as_tensor(slot_expert), as_tensor(home_slot), replica_routes,
                      None if replay_ids is None else as_tensor(replay_ids))
