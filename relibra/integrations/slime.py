"""slime's own routing replay (THUDM/slime, slime/utils/routing_replay.py) as the planner's input.

slime does not use megatron-core's RouterReplay state. Its megatron patch (docker/patch/latest/
megatron.patch, THUDM/slime @624b824) adds two lines to megatron-core: TopKRouter.__init__ calls
register_routing_replay(self), which (ENABLE_ROUTING_REPLAY=1) gives the router a `routing_replay` (a
RoutingReplay: `top_indices_list` of int [T, K] tensors, one per micro-batch, filled from the rollout
engine's routed experts by the actor's fill_routing_replay; `forward_index` / `backward_index` advance as
the forward and the recompute pop them) and a forward pre-hook making it the current one; and
topk_routing_with_score_function wraps its compute_topk with get_routing_replay_compute_topk, which pops
the current RoutingReplay in the stages replay_forward / replay_backward (ROUTING_REPLAY_STAGE). The
ReLibra router calls megatron-core's routing, so slime's replay drives it unchanged (and the router checks
that every token followed it, relibra.runtime.replay); this module reads the ids the next step will
replay, without consuming them, to make its plan:

    ids = step_replay_ids(model, micro_batches)              # [M][L] int [T, K], this rank's
    trace = relibra.integrations.megatron.replay_trace(model, ids, ep_group)
    plan = planner.plan(trace, 0, topology, hook.home)
    hook.begin_step(plan)

`before_train_step_hook` packs those lines into the function slime calls through
--custom-megatron-before-train-step-hook-path (signature (args, rollout_id, step_id, model, optimizer,
opt_param_scheduler), slime/backends/megatron_utils/model.py, train_one_step).
"""

from __future__ import annotations

import torch

from relibra.errors import ConfigError, PlanError
from relibra.integrations.megatron import placement_routers, replay_trace


def _routing_replay(router, layer: int):
    replay = getattr(router, "routing_replay", None)
    if replay is None or not hasattr(replay, "top_indices_list"):
        raise ConfigError(f"MoE layer {layer}: the router has no slime RoutingReplay (`routing_replay` with "
                          "`top_indices_list`); run slime with --use-rollout-routing-replay (ENABLE_ROUTING_REPLAY=1)")
    return replay


def step_replay_ids(model, micro_batches: int) -> list[list[torch.Tensor]]:
    """The ids the next `micro_batches` forwards will replay, per micro-batch and MoE layer: [M][L] int64 [T, K].

    Read from each ReLibra router's slime RoutingReplay at its forward_index, nothing consumed."""
    if not isinstance(micro_batches, int) or isinstance(micro_batches, bool) or micro_batches <= 0:
        raise PlanError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    per_layer = []
    for layer, router in enumerate(placement_routers(model)):
        replay = _routing_replay(router, layer)
        start = int(replay.forward_index)
        entries = replay.top_indices_list[start: start + micro_batches]
        if len(entries) != micro_batches:
            raise PlanError(f"MoE layer {layer}: slime's RoutingReplay holds {len(replay.top_indices_list) - start} "
                            f"unreplayed micro-batches from forward_index {start}; the step needs {micro_batches}")
        ids = []
        for m, entry in enumerate(entries):
            if not torch.is_tensor(entry):
                raise ConfigError(f"MoE layer {layer} micro-batch {start + m}: the replay entry is a "
                                  f"{type(entry).__name__}, not a tensor (slime's lazy routing-replay resources "
                                  "are not read ahead)")
            ids.append(entry.detach().to(torch.int64).cpu())
        per_layer.append(ids)
    return [[per_layer[l][m] for l in range(len(per_layer))] for m in range(micro_batches)]


def before_train_step_hook(relibra_hook, planner, topology, micro_batches_per_step, ep_group=None):
    """A function in the signature slime calls before every train step, which plans the step from
    slime's replay data and runs relibra_hook.begin_step(plan).

    micro_batches_per_step: an int, or a callable (step_id) -> int (slime's num_microbatches of that step);
    ep_group: the EP process group (default: megatron's parallel_state expert-parallel group).
    The plan it made last is kept in `.last_plan` of the returned function."""

    def hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
        group = ep_group
        if group is None:
            from megatron.core import parallel_state

            group = parallel_state.get_expert_model_parallel_group()
        count = micro_batches_per_step(step_id) if callable(micro_batches_per_step) else micro_batches_per_step
        chunk = model[0] if isinstance(model, (list, tuple)) else model
        trace = replay_trace(chunk, step_replay_ids(chunk, count), group, source="slime-routing-replay")
        plan = planner.plan(trace, 0, topology, relibra_hook.home)
        relibra_hook.begin_step(plan)
        hook.last_plan = plan

    hook.last_plan = None
    return hook
