"""Test doubles of the two RL stacks' routing-replay code, written for these tests from the stacks' sources
(their shapes and calls; no code copied), so the kit is driven as each stack drives megatron-core.

verl (volcengine/verl @b178a3c, verl/utils/megatron/router_replay_patch.py; its callers
    verl/utils/megatron/router_replay_utils.py set_router_replay_data and verl/workers/megatron_workers.py):
    `apply_router_replay_patch()` gives TransformerConfig a class attribute `enable_routing_replay = False`
    and an __init__ that pops the keyword and sets it on the instance (not a dataclass field); wraps
    TopKRouter.__init__ so that every router gets `router_replay = RouterReplay()` when
    `self.config.enable_routing_replay`; and replaces TopKRouter.routing by a one-argument routing whose
    top-k reads `router_replay.router_replay_action` (its own RouterReplayAction enum): RECORD records,
    REPLAY_FORWARD uses `target_topk_idx` (or, when that is None, silently computes its own top-k),
    REPLAY_BACKWARD pops `replay_backward_list[0]`. verl sets the ids of every layer before each
    micro-batch with RouterReplay.set_replay_data (set_target_indices per instance, in instance order).

slime (THUDM/slime @624b824, slime/utils/routing_replay.py and docker/patch/latest/megatron.patch):
    a module `slime.utils.routing_replay` with `RoutingReplay` (class list `all_routing_replays`;
    `top_indices_list`, `forward_index`, `backward_index`; record, pop_forward, pop_backward, clear_forward,
    clear_all_forward, clear_all), `register_routing_replay(module)` (when ENABLE_ROUTING_REPLAY=1: the
    router gets `routing_replay` and a forward pre-hook that makes it the module-level current replay),
    and `get_routing_replay_compute_topk(old)`, whose compute_topk reads ROUTING_REPLAY_STAGE: fallthrough
    and record compute (record also records), replay_forward / replay_backward pop. slime's megatron patch
    adds two lines to megatron-core: `register_routing_replay(self)` at the end of TopKRouter.__init__, and
    `compute_topk = get_routing_replay_compute_topk(compute_topk)` in topk_routing_with_score_function,
    before its score function. There is no bridge object on `router_replay`.
"""

from __future__ import annotations

import enum
import inspect
import os
import sys
import textwrap
import types

import torch


# ---- verl --------------------------------------------------------------------------------------------
class VerlRouterReplayAction(enum.Enum):
    RECORD = "record"
    REPLAY_FORWARD = "replay_forward"
    REPLAY_BACKWARD = "replay_backward"


class VerlRouterReplay:
    """verl's per-layer replay object (router_replay_patch.py: RouterReplay)."""

    router_instances: list = []

    def __init__(self):
        self.target_topk_idx = None
        self.recorded_topk_idx = None
        self.router_replay_action = None
        self.replay_backward_list = []
        self.layer_number = None
        VerlRouterReplay.router_instances.append(self)

    @staticmethod
    def set_replay_data(all_layers_topk_indices):
        if len(all_layers_topk_indices) != len(VerlRouterReplay.router_instances):
            raise ValueError(f"{len(all_layers_topk_indices)} replay tensors for "
                             f"{len(VerlRouterReplay.router_instances)} router instances")
        for replay, ids in zip(VerlRouterReplay.router_instances, all_layers_topk_indices):
            replay.set_target_indices(ids)

    @staticmethod
    def set_global_router_replay_action(action):
        for replay in VerlRouterReplay.router_instances:
            replay.router_replay_action = action

    @staticmethod
    def clear_global_router_replay_action():
        for replay in VerlRouterReplay.router_instances:
            replay.router_replay_action = None

    @staticmethod
    def clear_global_indices():
        for replay in VerlRouterReplay.router_instances:
            replay.clear_indices()

    def set_target_indices(self, ids):
        self.target_topk_idx = ids
        self.replay_backward_list.append(ids)

    def record_indices(self, ids):
        self.recorded_topk_idx = ids

    def get_recorded_indices(self):
        return self.recorded_topk_idx

    def clear_indices(self):
        self.recorded_topk_idx = None
        self.target_topk_idx = None
        self.replay_backward_list = []


def _verl_topk(router_replay, scores, topk):
    """verl's compute_topk: the replay action of the layer's replay object decides."""
    action = router_replay.router_replay_action if router_replay is not None else None
    if action == VerlRouterReplayAction.RECORD:
        probs, ids = torch.topk(scores, k=topk, dim=1)
        router_replay.record_indices(ids)
        return probs, ids
    if action == VerlRouterReplayAction.REPLAY_FORWARD and router_replay.target_topk_idx is not None:
        ids = router_replay.target_topk_idx.to(scores.device)
        return scores.gather(1, ids), ids
    if action == VerlRouterReplayAction.REPLAY_BACKWARD and router_replay.replay_backward_list:
        ids = router_replay.replay_backward_list.pop(0).to(scores.device)
        return scores.gather(1, ids), ids
    return torch.topk(scores, k=topk, dim=1)  # no action, or replay without data: verl computes its own


def _verl_routing(self, logits):
    """verl's one-argument TopKRouter.routing (softmax or sigmoid scores, no token dropping, no aux loss)."""
    logits = logits.view(-1, self.config.num_moe_experts)
    logits = self.apply_z_loss(logits)
    if self.score_function == "softmax":
        if self.config.moe_router_pre_softmax:
            scores = torch.softmax(logits, dim=-1, dtype=torch.float32).type_as(logits)
            probs, ids = _verl_topk(self.router_replay, scores, self.topk)
        else:
            top, ids = _verl_topk(self.router_replay, logits, self.topk)
            probs = torch.softmax(top, dim=-1, dtype=torch.float32).type_as(logits)
    else:
        scores = torch.sigmoid(logits.float()).type_as(logits)
        top, ids = _verl_topk(self.router_replay, scores, self.topk)
        probs = top / (top.sum(dim=-1, keepdim=True) + 1e-20) if self.topk > 1 else top
    if self.config.moe_router_topk_scaling_factor:
        probs = probs * self.config.moe_router_topk_scaling_factor
    routing_probs = torch.zeros_like(logits).scatter(1, ids, probs)
    routing_map = torch.zeros_like(logits).int().scatter(1, ids, 1).bool()
    return routing_probs, routing_map


def apply_verl_router_replay_patch():
    """What verl's apply_router_replay_patch does to megatron-core (idempotent)."""
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.transformer_config import TransformerConfig

    VerlRouterReplay.router_instances.clear()
    if not hasattr(TransformerConfig, "enable_routing_replay"):
        TransformerConfig.enable_routing_replay = False
        original_config_init = TransformerConfig.__init__

        def config_init(self, *args, **kwargs):
            flag = kwargs.pop("enable_routing_replay", TransformerConfig.enable_routing_replay)
            original_config_init(self, *args, **kwargs)
            self.enable_routing_replay = flag

        TransformerConfig.__init__ = config_init
    if getattr(TopKRouter, "_verl_double_patched", False):
        return
    original_router_init = TopKRouter.__init__

    def router_init(self, *args, **kwargs):
        original_router_init(self, *args, **kwargs)
        self.router_replay = None
        if self.config.enable_routing_replay:
            self.router_replay = VerlRouterReplay()

    TopKRouter.__init__ = router_init
    TopKRouter.routing = _verl_routing
    TopKRouter._verl_double_patched = True


# ---- slime -------------------------------------------------------------------------------------------
class SlimeRoutingReplay:
    """slime's RoutingReplay (slime/utils/routing_replay.py), host tensors only."""

    all_routing_replays: list = []

    def __init__(self):
        self.forward_index = 0
        self.backward_index = 0
        self.top_indices_list = []
        SlimeRoutingReplay.all_routing_replays.append(self)

    def record(self, top_indices):
        self.top_indices_list.append(top_indices.detach().to("cpu").clone())

    def pop_forward(self):
        ids = self.top_indices_list[self.forward_index]
        self.forward_index += 1
        return ids.to(dtype=torch.int32)

    def pop_backward(self):
        ids = self.top_indices_list[self.backward_index]
        self.backward_index += 1
        return ids.to(dtype=torch.int32)

    def clear(self):
        self.forward_index = self.backward_index = 0
        self.top_indices_list = []

    def clear_forward(self):
        self.forward_index = 0

    @staticmethod
    def clear_all():
        for replay in SlimeRoutingReplay.all_routing_replays:
            replay.clear()

    @staticmethod
    def clear_all_forward():
        for replay in SlimeRoutingReplay.all_routing_replays:
            replay.clear_forward()


def _slime_module() -> types.ModuleType:
    module = types.ModuleType("slime.utils.routing_replay")
    module.ROUTING_REPLAY = None
    module.RoutingReplay = SlimeRoutingReplay

    def set_routing_replay(replay):
        module.ROUTING_REPLAY = replay

    def get_routing_replay_compute_topk(old_compute_topk):
        def compute_topk(scores, topk, num_groups=None, group_topk=None):
            if os.environ.get("ENABLE_ROUTING_REPLAY", "0") != "1":
                return old_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
            stage = os.environ["ROUTING_REPLAY_STAGE"]
            if stage in ("fallthrough", "record"):
                probs, ids = old_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
                if stage == "record":
                    module.ROUTING_REPLAY.record(ids)
                return probs, ids
            ids = module.ROUTING_REPLAY.pop_forward() if stage == "replay_forward" else module.ROUTING_REPLAY.pop_backward()
            assert ids.shape[0] == scores.shape[0] and ids.shape[1] == topk
            ids = ids.to(scores.device).long()  # torch's gather wants int64 (slime's CUDA path takes int32)
            return scores.gather(1, ids), ids

        return compute_topk

    def register_routing_replay(router):
        if os.environ.get("ENABLE_ROUTING_REPLAY", "0") == "1":
            router.routing_replay = SlimeRoutingReplay()
            router.register_forward_pre_hook(lambda *args, **kwargs: set_routing_replay(router.routing_replay))

    module.set_routing_replay = set_routing_replay
    module.get_routing_replay_compute_topk = get_routing_replay_compute_topk
    module.register_routing_replay = register_routing_replay
    return module


def apply_slime_megatron_patch():
    """Install the slime.utils.routing_replay double and apply slime's two megatron-core lines: the
    register_routing_replay call at the end of TopKRouter.__init__ and the compute_topk wrap inside
    topk_routing_with_score_function (inserted into megatron-core's own source of that function, before
    its score-function branch, as the patch hunk does). Idempotent; set ENABLE_ROUTING_REPLAY before
    building the model."""
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe import router as router_module

    if "slime.utils.routing_replay" not in sys.modules:
        for name in ("slime", "slime.utils"):
            sys.modules.setdefault(name, types.ModuleType(name))
        sys.modules["slime.utils.routing_replay"] = _slime_module()
    if getattr(router_module.TopKRouter, "_slime_double_patched", False):
        return
    source = textwrap.dedent(inspect.getsource(moe_utils.topk_routing_with_score_function))
    anchor = '    if score_function == "softmax":\n'
    assert source.count(anchor) == 1, "megatron-core's topk_routing_with_score_function changed shape"
    source = source.replace(anchor, "    from slime.utils.routing_replay import get_routing_replay_compute_topk\n"
                                    "    compute_topk = get_routing_replay_compute_topk(compute_topk)\n" + anchor)
    original = moe_utils.topk_routing_with_score_function
    exec(compile(source, moe_utils.__file__, "exec"), vars(moe_utils))  # rebinds it in megatron's module
    router_module.topk_routing_with_score_function = moe_utils.topk_routing_with_score_function
    router_module._megatron_topk_routing = original  # megatron's own, for tests of a missing patch
    original_router_init = router_module.TopKRouter.__init__

    def router_init(self, *args, **kwargs):
        original_router_init(self, *args, **kwargs)
        sys.modules["slime.utils.routing_replay"].register_routing_replay(self)

    router_module.TopKRouter.__init__ = router_init
    router_module.TopKRouter._slime_double_patched = True
