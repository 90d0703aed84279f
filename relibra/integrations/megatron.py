"""megatron-core's RouterReplay as the planner's input.

Under routing replay the ids each MoE layer will use in the next training step are known before the
step: megatron-core's RouterReplay holds them per layer (recorded_topk_idx after a RECORD forward,
target_topk_idx once set_replay_data has been called for REPLAY_FORWARD). This module turns them,
per micro-batch, into the int [M, L, ep, E] loads a StepPlan is made from, gathering every EP rank's
counts (collective over the EP group). Nothing here routes: the ReLibra router reads the same
RouterReplay objects when it routes (relibra.runtime.router).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from relibra.cluster import ModelShape
from relibra.errors import ConfigError, PlanError
from relibra.runtime.slots import moe_layers
from relibra.trace import RoutingTrace


def placement_routers(model) -> list:
    """The ReLibra routers of `model` (a megatron-core model, or a DDP / Float16Module wrapping one),
    in module order: the plan's layer order."""
    return [moe.router for moe in moe_layers(model)]


def recorded_ids(model) -> list[torch.Tensor]:
    """Per MoE layer, the ids [T, K] megatron-core's RouterReplay recorded in the last RECORD forward."""
    out = []
    for layer, router in enumerate(placement_routers(model)):
        replay = router.router_replay
        if replay is None or not hasattr(replay, "get_recorded_indices"):
            raise ConfigError(f"MoE layer {layer}: no megatron-core RouterReplay (build the model config with "
                              "moe_enable_routing_replay=True)")
        ids = replay.get_recorded_indices()
        if ids is None:
            raise ConfigError(f"MoE layer {layer}: RouterReplay recorded nothing; run the forward with "
                              "RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)")
        out.append(ids.detach())
    return out


def target_ids(model) -> list[torch.Tensor]:
    """Per MoE layer, the ids [T, K] set for REPLAY_FORWARD (RouterReplay.set_replay_data)."""
    out = []
    for layer, router in enumerate(placement_routers(model)):
        replay = router.router_replay
        ids = None if replay is None else getattr(replay, "target_topk_idx", None)
        if ids is None:
            raise ConfigError(f"MoE layer {layer}: no replay ids set; call RouterReplay.set_replay_data first")
        out.append(ids.detach())
    return out


def replay_loads(ids_per_microbatch: list[list[torch.Tensor]], num_experts: int, ep_group) -> np.ndarray:
    """int64 [M, L, ep, E]: tokens each EP rank routes to each expert, per micro-batch and MoE layer.

    ids_per_microbatch: this rank's replayed ids, [micro-batch][layer] -> int [T, K] (T may differ
    between micro-batches, never between layers of one micro-batch). Collective over ep_group (every
    rank passes the same M and L); ep_group None means a single rank."""
    if not ids_per_microbatch:
        raise PlanError("no micro-batches of replay ids")
    layers = len(ids_per_microbatch[0])
    counts = []
    for m, per_layer in enumerate(ids_per_microbatch):
        if len(per_layer) != layers:
            raise PlanError(f"micro-batch {m} has replay ids for {len(per_layer)} MoE layers, "
                            f"micro-batch 0 for {layers}")
        rows = []
        for l, ids in enumerate(per_layer):
            ids = torch.as_tensor(ids).to(torch.int64).cpu()
            if ids.dim() != 2:
                raise PlanError(f"micro-batch {m} layer {l}: replay ids must be [tokens, top_k], "
                                f"got {tuple(ids.shape)}")
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_experts):
                raise PlanError(f"micro-batch {m} layer {l}: replay ids span [{int(ids.min())}, {int(ids.max())}], "
                                f"outside the {num_experts} experts")
            rows.append(torch.bincount(ids.reshape(-1), minlength=num_experts))
        counts.append(torch.stack(rows))
    mine = torch.stack(counts)  # [M, L, E]
    if ep_group is None or dist.get_world_size(ep_group) == 1:
        return mine.numpy()[:, :, None, :].astype(np.int64)
    shape = torch.tensor(list(mine.shape), dtype=torch.int64)
    shapes = [torch.empty_like(shape) for _ in range(dist.get_world_size(ep_group))]
    dist.all_gather(shapes, shape, group=ep_group)
    if any(not torch.equal(s, shape) for s in shapes):
        raise PlanError(f"EP ranks hold replay ids of different shapes [M, L, E]: {[s.tolist() for s in shapes]}")
    gathered = [torch.empty_like(mine) for _ in shapes]
    dist.all_gather(gathered, mine, group=ep_group)
    return torch.stack(gathered, dim=2).numpy().astype(np.int64)  # [M, L, ep, E]


def model_shape(model, name: str = "megatron-model") -> ModelShape:
    """The planner's ModelShape of a model built with relibra.runtime.spec: its MoE layers, logical
    experts, top-k, hidden size and expert FFN width, read from the model itself."""
    routers = placement_routers(model)
    config = routers[0].config
    return ModelShape(name, num_layers=len(routers), num_experts=int(routers[0].weight.shape[0]),
                      top_k=int(config.moe_router_topk), hidden=int(config.hidden_size),
                      moe_ffn=int(config.moe_ffn_hidden_size),
                      num_shared_experts=1 if config.moe_shared_expert_intermediate_size else 0)


def replay_trace(model, ids_per_microbatch: list[list[torch.Tensor]], ep_group, source: str = "megatron-replay"
                 ) -> RoutingTrace:
    """A one-step RoutingTrace of the replayed ids of every EP rank (collective over ep_group), for
    planner.plan(trace, 0, topology, prev_home)."""
    shape = model_shape(model)
    loads = replay_loads(ids_per_microbatch, shape.num_experts, ep_group)
    tokens = int(loads[:, 0].sum(axis=(1, 2)).max()) // shape.top_k
    return RoutingTrace(loads[None].astype(np.int32), shape, loads.shape[2], max(tokens, 1),
                        {"importer": source, "source": "in-process"})


def current_placement_plan(hook, micro_batches: int):
    """A StepPlan that keeps the hook's current placement and makes no replicas, for a forward whose
    routing is not known before it runs (the recording log-prob forward): hook.begin_step(it) moves
    nothing and every token goes to its expert's home."""
    from relibra.runtime.plans import static_plan

    if not isinstance(micro_batches, int) or isinstance(micro_batches, bool) or micro_batches <= 0:
        raise PlanError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    layers, experts = hook.home.shape
    loads = np.zeros((micro_batches, layers, hook.ep, experts), dtype=np.int64)
    return static_plan(loads, hook.ranks_per_node, hook.replica_slots, home=hook.home, policy="current-placement")
