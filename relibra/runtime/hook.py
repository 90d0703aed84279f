"""ReLibra's step hook: three calls a megatron-core training loop makes around a step it already runs.

    hook = ReLibraHook(model, ep_group, ranks_per_node)
    optimizer = AdamW(dense_params + hook.slots.home_expert_parameters())   # no replica parameters
    hook.optimizer = optimizer
    for step in ...:
        plan = ...                             # a StepPlan, planned after rollout from replay data
        hook.begin_step(plan)                  # migration: expert homes (weights, AdamW moments) move
        for m, batch in enumerate(micro_batches):
            hook.before_microbatch(m, replay)  # routes of every MoE layer; replica weights follow
            loss = ...; loss.backward()
            hook.after_backward(m)             # replica gradients go home
        optimizer.step()

The model is any megatron-core model whose MoE layers come from relibra.runtime.spec.moe_layer_spec
(module order = the plan's layer order), built with physical_config(config, ep, replica_slots), bare
or wrapped in megatron's DistributedDataParallel. The optimizer must hold the home experts'
parameters (replicas keep no optimizer state): a torch optimizer, or what megatron's
get_megatron_optimizer returns (fp32, bf16, distributed). The hook moves each migrated expert's
weights, master copy and Adam state (relibra.runtime.optstate) and adds replica gradients where the
optimizer reads them (`main_grad` under megatron DDP, `.grad` otherwise). Under megatron DDP:

    ddp.zero_grad_buffer(); optimizer.zero_grad()
    hook.begin_step(plan)
    for m, batch in ...: hook.before_microbatch(m, replay); loss.backward(); hook.after_backward(m)
    ddp.finish_grad_sync()                     # after the last after_backward: replica share included
    optimizer.step()

Process groups: every transfer and collective runs on the EP group the MoE layers were built with,
and the migration vote also spans their expert data-parallel group (pg_collection.expt_dp), so any
EP x DP grid works; tensor parallelism with sequence parallelism, and pipeline parallelism, too.
Expert-tensor and context parallelism, and TP without SP, are refused at construction with one error
naming the setting (check_parallelism).

Pipeline parallelism: each stage's hook executes the plan's rows of its own MoE layers (layers
first_layer .. first_layer + n - 1 of the plan; the plan and the replayed ids cover every layer).
Under megatron's pipeline schedules the forward step function calls before_microbatch(m) (the
schedule runs micro-batches' forwards in order, so the k-th call is micro-batch k) and the
schedule runs the backwards; 1F1B keeps several micro-batches in flight, each with its own
replica leaves and layout (relibra.runtime.replicas), and the routers hold the latest forward's
routes: a gradient hook on the model's output switches routers and replica slots back to the
micro-batch when its backward starts, so activation recompute inside it routes as its forward
did. A micro-batch's replica gradients are pulled
at the first before_microbatch after its backward, and the rest by end_backward() after the
schedule returns (before finalize_model_grads):

    hook.begin_step(plan)
    forward_backward_func(forward_step_func=step_fn, ...)  # step_fn: hook.before_microbatch(m, replay); model(...)
    hook.end_backward()
    finalize_model_grads([ddp]); optimizer.step()
"""

from __future__ import annotations

import time

import numpy as np
import torch

from relibra.errors import ConfigError, PlanError
from relibra.plan import StepPlan
from relibra.runtime.migration import InjectedFailure, MigrationError, migrate_homes
from relibra.runtime.placement import (check_plan_for_runtime, home_slot_index, replica_routes, replicas_in_use,
                                       slot_experts, stage_plan)
from relibra.runtime.optstate import OptimizerState
from relibra.runtime.replicas import ReplicaBuffer
from relibra.runtime.router import make_layer_route
from relibra.runtime.plans import static_plan
from relibra.runtime.slots import ExpertSlots, moe_layers
from relibra.runtime.timing import Timer
from relibra.trace import static_placement


def check_parallelism(moe) -> None:
    """Refuse (ConfigError) a MoE layer built with parallelism the hook does not execute.

    Supported: expert parallelism times data parallelism, tensor parallelism with sequence
    parallelism and whole experts (expert TP 1): each rank's router then routes its own slice of the
    sequence, and that slice is the rank's source in the plan; and pipeline parallelism (each stage's
    hook runs its own MoE layers, several micro-batches in flight). Refused, each named with its reason
    (_UNSUPPORTED_PARALLELISM): TP without SP, expert tensor parallelism, context parallelism."""
    cfg = moe.config

    def size(group) -> int:
        return group.size() if group is not None else 1

    sizes = {"tensor_model_parallel_size": max(cfg.tensor_model_parallel_size, size(getattr(moe, "tp_group", None))),
             "expert_tensor_parallel_size": max(cfg.expert_tensor_parallel_size or 1,
                                                size(getattr(moe.experts, "tp_group", None))),
             "context_parallel_size": cfg.context_parallel_size}
    if sizes["tensor_model_parallel_size"] > 1 and cfg.sequence_parallel and sizes["expert_tensor_parallel_size"] == 1:
        # TP with sequence parallelism and whole experts: each rank's router sees its own slice of the
        # sequence, the rank is that slice's source in the plan
        del sizes["tensor_model_parallel_size"]
        sequence_parallel = False
    else:
        sequence_parallel = cfg.sequence_parallel
    bad = [(f"{k}={v}", k) for k, v in sizes.items() if v > 1]
    bad += [("sequence_parallel=True", "sequence_parallel")] if sequence_parallel else []
    if bad:
        why = "; ".join(f"{setting} ({_UNSUPPORTED_PARALLELISM[key]})" for setting, key in bad)
        raise ConfigError("ReLibraHook runs on EP x DP grids, with TP only under sequence parallelism, and PP "
                          f"(expert-tensor and context parallel sizes 1); this model has {why}")


# Why each parallelism the hook refuses is refused (check_parallelism names the setting and this).
_UNSUPPORTED_PARALLELISM = {
    "tensor_model_parallel_size": "each rank's router sees its share of the TP group's tokens, and the plan's "
                                  "per-source token split is not made per TP rank",
    "sequence_parallel": "a rank's router sees a slice of the sequence, which the plan's per-source token split "
                         "does not describe",
    "expert_tensor_parallel_size": "an expert's weights are split over ranks, while migration and replicas move "
                                   "whole experts (and gloo's all_gather takes no uneven shards)",
    "context_parallel_size": "a rank's router sees a context shard of each sequence; context parallelism also "
                             "needs Transformer Engine's attention on GPUs",
}


def stage_first_layer(model) -> int:
    """The plan's layer index of `model`'s first MoE layer: 0 without pipeline parallelism; under it the
    layer's global layer number - 1 (megatron numbers a stage's layers from its offset), which is the
    MoE layer index when every transformer layer is a MoE layer (checked: the stage's MoE layers must
    number consecutively)."""
    moes = moe_layers(model)
    if moes[0].config.pipeline_model_parallel_size == 1:
        return 0
    numbers = [int(m.router.layer_number) for m in moes]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise ConfigError(f"under pipeline parallelism the hook maps a stage's MoE layers to the plan's layers by "
                          f"their layer numbers, which must be consecutive (every transformer layer a MoE layer); "
                          f"this stage's are {numbers}: pass first_layer to ReLibraHook")
    return numbers[0] - 1


class ReLibraHook:
    """Executes StepPlans on a model built from relibra.runtime.spec.

    ep_group: the EP process group the MoE layers span; ranks_per_node: the node size in EP-local
    ranks (replicas stay in a node); optimizer: a torch optimizer or a megatron optimizer over the
    dense and home-expert parameters (may be set later, before the first migration); home: int
    [L, E] placement the weights are in now (default megatron's static contiguous one); timer: a
    Timer (one is made when None); on_migration_failure: "continue" (a rolled-back migration leaves
    the old placement and the step runs on it without replicas) or "stop" (raise); dp_group: the
    experts' data-parallel group (default: the one the MoE layers were built with, expt_dp);
    first_layer: the plan's layer index of this model's first MoE layer (default: 0 without pipeline
    parallelism; under it the first MoE layer's global layer number - 1, every transformer layer
    being a MoE layer).
    """

    def __init__(self, model, ep_group, ranks_per_node: int, optimizer=None, home: np.ndarray | None = None,
                 timer: Timer | None = None, on_migration_failure: str = "continue", dp_group=None,
                 first_layer: int | None = None):
        first = moe_layers(model)[0]
        check_parallelism(first)
        self.first_layer = stage_first_layer(model) if first_layer is None else first_layer
        built_ep = getattr(first.experts, "ep_group", None)
        if built_ep is not None and built_ep.size() != ep_group.size():
            raise ConfigError(f"the MoE layers were built on an EP group of {built_ep.size()} ranks; the hook was "
                              f"given one of {ep_group.size()}")
        ep = ep_group.size()
        self.ep_group = ep_group
        self.dp_group = dp_group if dp_group is not None else getattr(first.experts, "dp_group", None)
        num_experts = first.router.weight.shape[0]
        self.replica_slots = first.experts.num_local_experts - num_experts // ep
        home = static_placement(len(moe_layers(model)), num_experts, ep) if home is None else home
        self.slots = ExpertSlots(model, ep_group, home, self.replica_slots)
        self.optimizer = optimizer
        self.ep = ep
        self.ranks_per_node = ranks_per_node
        self.timer = timer or Timer()
        self.on_migration_failure = on_migration_failure
        self.replicas = (ReplicaBuffer(self.slots, ep_group, lambda a, b: a // ranks_per_node == b // ranks_per_node,
                                       self.timer) if self.replica_slots else None)
        self.plan: StepPlan | None = None  # this stage's rows of the step's plan
        self.plan_layers = 0  # layers of the step's whole plan
        self.failure: InjectedFailure | None = None  # tests of the rollback path set it
        self.routes: dict = {}  # micro-batch (None: outside a plan) -> every layer's LayerRoute
        self.current = None  # the micro-batch whose routes the routers hold
        self.set_home_routes()
        model.register_forward_hook(self._mark_backward_start)

    @property
    def home(self) -> np.ndarray:
        return self.slots.home

    def set_home_routes(self) -> None:
        """Route every token to its expert's home under the current placement, with no replicas: what a
        forward outside a planned step runs on (slime's log-prob recompute, an evaluation forward). Set
        at construction, after a migration and when the plan's last micro-batch is done (end_step)."""
        rexp = np.full((self.slots.num_layers, self.ep, self.replica_slots), -1, dtype=np.int64)
        slots = slot_experts(self.slots.home, rexp)
        hs = home_slot_index(self.slots.home, self.ep, self.replica_slots)
        self.routes = {None: [make_layer_route(slots[layer], hs[layer], [], None, router.weight.device)
                              for layer, router in enumerate(self.slots.routers)]}
        self._set_routes(None)
        if self.replicas is not None:
            self.replicas.reset(self.slots.home)
            self.replicas.set_microbatch(rexp, self.slots.home)

    def end_step(self) -> None:
        """Leave the step: later forwards route home (set_home_routes) until the next begin_step. Called by
        after_backward of the plan's last micro-batch; call it yourself after a forward-only step. The plan
        stays (`plan`); before_microbatch may enter it again."""
        self.set_home_routes()

    def replay_counts(self) -> dict:
        """{"tokens", "followed"}: tokens routed under replay (given ids or the stack's replay object) since
        begin_step, summed over MoE layers, and how many of them followed the replayed routing exactly.
        A routing call in which any token departs raises ReplayError, so followed < tokens never reaches
        an optimizer step."""
        routers = self.slots.routers
        return {"tokens": sum(r.replay_tokens for r in routers), "followed": sum(r.replay_followed for r in routers)}

    def _check_ddp_marking(self) -> None:
        """Under megatron DDP (parameters carry main_grad) expert weights must be marked expert-parallel
        (allreduce=False), or DDP sums different experts' gradients across the EP group."""
        p = self.slots.home_expert_parameters()[0]
        if self.ep > 1 and getattr(p, "main_grad", None) is not None and getattr(p, "allreduce", True):
            raise ConfigError(f"under megatron's DDP the expert weights are marked for data-parallel all-reduce "
                              f"(allreduce=True) on an EP group of {self.ep} ranks, so DDP would sum different "
                              f"experts' gradients; build the model with config.expert_model_parallel_size={self.ep}")

    def begin_step(self, plan: StepPlan) -> dict:
        """Check the plan, then move expert homes where its placement differs from the current one.

        Returns {"experts_moved", "migration_error": None or the rolled-back migration's message}."""
        t0 = time.perf_counter()
        self._check_ddp_marking()
        self.plan_layers = plan.num_layers
        plan = stage_plan(plan, self.first_layer, self.slots.num_layers)
        check_plan_for_runtime(plan, self.ep, self.ranks_per_node, self.replica_slots, self.slots.num_layers,
                               self.slots.num_experts)
        self.timer.add("step", "plan_check", time.perf_counter() - t0)
        moved, error = 0, None
        if (plan.home != self.slots.home).any():
            t0 = time.perf_counter()
            try:
                moved = migrate_homes(self.slots, self.ep_group, self.optimizer, plan.home, self.failure,
                                      self.dp_group)["experts_moved"]
            except MigrationError as exc:
                if self.on_migration_failure == "stop":
                    raise
                error = str(exc)
                plan = static_plan(plan.loads, self.ranks_per_node, home=self.slots.home, policy=plan.policy)
            self.timer.add("step", "migration", time.perf_counter() - t0)
        self.plan = plan
        for router in self.slots.routers:
            router.reset_replay_counts()
        self.set_home_routes()  # a forward before before_microbatch routes home under the new placement
        return {"experts_moved": moved, "migration_error": error}

    def before_microbatch(self, micro_batch: int, replay: np.ndarray | None = None, src: int | None = None) -> None:
        """Routes of every MoE layer for micro-batch `micro_batch` under the current placement.

        replay: int [L, T, K] replayed expert ids of this rank's tokens (routing replay), or None to
        route by the routers' own scores; src: the rank whose tokens follow (default this rank; a
        single-rank reference runs every rank's tokens in turn). replay covers the plan's layers (L of
        the whole plan; a pipeline stage takes its own rows) or this model's.

        Replica gradients of micro-batches whose backward has run since (a pipeline schedule's, which
        calls no after_backward) are pulled first."""
        t0 = time.perf_counter()
        self._pull_finished_backwards()
        plan = self.plan
        if plan is None:
            raise PlanError(f"before_microbatch({micro_batch}) before any plan: call begin_step(plan) first (a forward "
                            "without a plan, such as a log-prob recompute, needs no hook call: it routes home)")
        if not 0 <= micro_batch < plan.loads.shape[0]:
            raise PlanError(f"micro-batch {micro_batch} is outside the step's plan of {plan.loads.shape[0]} micro-batches")
        src = self.slots.rank if src is None else src
        if replay is not None and len(replay) == self.plan_layers != self.slots.num_layers:
            replay = replay[self.first_layer: self.first_layer + self.slots.num_layers]
        rexp = replicas_in_use(plan, micro_batch, self.replica_slots)  # [L, ep, R]
        slots = slot_experts(self.slots.home, rexp)
        hs = home_slot_index(self.slots.home, self.ep, self.replica_slots)
        self.routes[micro_batch] = [
            make_layer_route(slots[layer], hs[layer],
                             replica_routes(plan, micro_batch, layer, src, self.replica_slots) if plan.replica_slots
                             else [], None if replay is None else replay[layer], router.weight.device)
            for layer, router in enumerate(self.slots.routers)]
        self._set_routes(micro_batch)
        if self.replicas is not None:
            self.replicas.set_microbatch(rexp, self.slots.home, micro_batch)
        self.timer.add("forward", "routes", time.perf_counter() - t0)

    def _set_routes(self, micro_batch) -> None:
        """Every router routes by micro-batch `micro_batch`'s routes (None: home routes) from now on."""
        self.current = micro_batch
        for router, route in zip(self.slots.routers, self.routes[micro_batch]):
            router.route = route

    def _mark_backward_start(self, module, args, output) -> None:
        """Forward hook on the model: its output's gradient hook runs first in that micro-batch's
        backward and switches routers and replica slots back to the micro-batch, so a recompute inside
        the backward routes as its forward did, whatever forwards ran in between (1F1B)."""
        out = output[0] if isinstance(output, (tuple, list)) else output
        if torch.is_tensor(out) and out.requires_grad:
            micro_batch = self.current
            out.register_hook(lambda grad: self._enter_backward(micro_batch))

    def _enter_backward(self, micro_batch) -> None:
        if micro_batch in self.routes:
            self._set_routes(micro_batch)
            if self.replicas is not None:
                self.replicas.current = micro_batch

    def after_backward(self, micro_batch: int) -> None:
        """Add the replica gradients of the micro-batch into their home experts' gradients (main_grad
        under megatron DDP, else .grad)."""
        if self.replicas is not None:
            self.replicas.pull_gradients(micro_batch)
        if self.plan is not None and micro_batch == self.plan.loads.shape[0] - 1:
            self.end_step()

    def _pull_finished_backwards(self) -> None:
        if self.replicas is not None:
            for m in [m for m in self.replicas.in_flight() if m in self.replicas.backward_started]:
                self.replicas.pull_gradients(m)

    def end_backward(self) -> None:
        """After a pipeline schedule's forwards and backwards (every micro-batch's backward has run):
        pull the replica gradients not pulled yet, then end_step. Call it before megatron's
        finalize_model_grads (or finish_grad_sync), so that the data-parallel reduction carries them."""
        if self.replicas is not None:
            for m in self.replicas.in_flight():
                self.replicas.pull_gradients(m)
        self.end_step()

    # ---- inspection --------------------------------------------------------------------------
    def logical_expert_state(self, what: str = "param") -> dict[tuple[int, int], np.ndarray]:
        """{(layer, expert): flat float64} of experts homed here: what = param | grad | master | exp_avg |
        exp_avg_sq (grad: main_grad under megatron DDP; master and moments whole, wherever the optimizer
        keeps them; collective over the expert data-parallel group for a sharded optimizer)."""
        state = OptimizerState(self.optimizer, self.dp_group) if what in ("master", "exp_avg", "exp_avg_sq") else None
        out = {}
        for layer in range(self.slots.num_layers):
            for mlp, e in zip(self.slots.home_mlps(layer), self.slots.local_experts(layer)):
                params = self.slots.mlp_params(mlp)
                if what == "param":
                    parts = [p.detach() for p in params]
                elif what == "grad":
                    parts = [getattr(p, "main_grad", None) if getattr(p, "main_grad", None) is not None
                             else (p.grad if p.grad is not None else torch.zeros_like(p)) for p in params]
                else:
                    index = {"master": 0, "exp_avg": 1, "exp_avg_sq": 2}[what]
                    parts = [whole[index] for whole in state.gather(params, torch.float64)]
                out[(self.first_layer + layer, int(e))] = np.concatenate([t.reshape(-1).double().cpu().numpy() for t in parts])
        return out
