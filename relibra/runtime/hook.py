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
(module order = the plan's layer order), built with physical_config(config, ep, replica_slots).
The optimizer must hold the home experts' parameters and no replica's (replicas keep no optimizer
state); the hook moves AdamW's exp_avg / exp_avg_sq / step with each migrated expert.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from relibra.plan import StepPlan
from relibra.runtime.migration import InjectedFailure, MigrationError, migrate_homes
from relibra.runtime.placement import (check_plan_for_runtime, home_slot_index, replica_routes, replicas_in_use,
                                       slot_experts)
from relibra.runtime.replicas import ReplicaBuffer
from relibra.runtime.router import make_layer_route
from relibra.runtime.plans import static_plan
from relibra.runtime.slots import ExpertSlots, moe_layers
from relibra.runtime.timing import Timer
from relibra.trace import static_placement


class ReLibraHook:
    """Executes StepPlans on a model built from relibra.runtime.spec.

    ep_group: the EP process group the MoE layers span; ranks_per_node: the node size (replicas stay in
    a node); optimizer: the torch optimizer over the dense and home-expert parameters (may be set
    later, before the first migration); home: int [L, E] placement the weights are in now (default megatron's static contiguous
    one); timer: a Timer (one is made when None); on_migration_failure: "continue" (a rolled-back
    migration leaves the old placement and the step runs on it without replicas) or "stop" (raise).
    """

    def __init__(self, model, ep_group, ranks_per_node: int, optimizer=None, home: np.ndarray | None = None,
                 timer: Timer | None = None, on_migration_failure: str = "continue"):
        first = moe_layers(model)[0]
        ep = ep_group.size()
        num_experts = first.router.weight.shape[0]
        self.replica_slots = first.experts.num_local_experts - num_experts // ep
        home = static_placement(len(moe_layers(model)), num_experts, ep) if home is None else home
        self.slots = ExpertSlots(model, ep_group, home, self.replica_slots)
        self.optimizer = optimizer
        self.ep = ep
        self.ranks_per_node = ranks_per_node
        self.timer = timer or Timer()
        self.on_migration_failure = on_migration_failure
        self.replicas = (ReplicaBuffer(self.slots, lambda a, b: a // ranks_per_node == b // ranks_per_node,
                                       self.timer) if self.replica_slots else None)
        self.plan: StepPlan | None = None
        self.failure: InjectedFailure | None = None  # tests of the rollback path set it

    @property
    def home(self) -> np.ndarray:
        return self.slots.home

    def begin_step(self, plan: StepPlan) -> dict:
        """Check the plan, then move expert homes where its placement differs from the current one.

        Returns {"experts_moved", "migration_error": None or the rolled-back migration's message}."""
        t0 = time.perf_counter()
        check_plan_for_runtime(plan, self.ep, self.ranks_per_node, self.replica_slots, self.slots.num_layers,
                               self.slots.num_experts)
        self.timer.add("step", "plan_check", time.perf_counter() - t0)
        moved, error = 0, None
        if (plan.home != self.slots.home).any():
            t0 = time.perf_counter()
            try:
                moved = migrate_homes(self.slots, self.optimizer, plan.home, self.failure)["experts_moved"]
            except MigrationError as exc:
                if self.on_migration_failure == "stop":
                    raise
                error = str(exc)
                plan = static_plan(plan.loads, self.ranks_per_node, home=self.slots.home, policy=plan.policy)
            self.timer.add("step", "migration", time.perf_counter() - t0)
        self.plan = plan
        return {"experts_moved": moved, "migration_error": error}

    def before_microbatch(self, micro_batch: int, replay: np.ndarray | None = None, src: int | None = None) -> None:
        """Routes of every MoE layer for micro-batch `micro_batch` under the current placement.

        replay: int [L, T, K] replayed expert ids of this rank's tokens (routing replay), or None to
        route by the routers' own scores; src: the rank whose tokens follow (default this rank; a
        single-rank reference runs every rank's tokens in turn)."""
        t0 = time.perf_counter()
        plan = self.plan
        src = self.slots.rank if src is None else src
        rexp = replicas_in_use(plan, micro_batch, self.replica_slots)  # [L, ep, R]
        slots = slot_experts(self.slots.home, rexp)
        hs = home_slot_index(self.slots.home, self.ep, self.replica_slots)
        for layer, router in enumerate(self.slots.routers):
            routes = replica_routes(plan, micro_batch, layer, src, self.replica_slots) if plan.replica_slots else []
            router.route = make_layer_route(slots[layer], hs[layer], routes, None if replay is None else replay[layer],
                                            router.weight.device)
        if self.replicas is not None:
            self.replicas.set_microbatch(rexp, self.slots.home)
        self.timer.add("forward", "routes", time.perf_counter() - t0)

    def after_backward(self, micro_batch: int) -> None:
        """Add the replica gradients of the micro-batch into their home experts' gradients."""
        if self.replicas is not None:
            self.replicas.pull_gradients()

    # ---- inspection --------------------------------------------------------------------------
    def logical_expert_state(self, what: str = "param") -> dict[tuple[int, int], np.ndarray]:
        """{(layer, expert): flat float64} of experts homed here: what = param | grad | exp_avg | exp_avg_sq."""
        out = {}
        for layer in range(self.slots.num_layers):
            for mlp, e in zip(self.slots.home_mlps(layer), self.slots.local_experts(layer)):
                parts = []
                for p in self.slots.mlp_params(mlp):
                    if what == "param":
                        t = p.detach()
                    elif what == "grad":
                        t = p.grad if p.grad is not None else torch.zeros_like(p)
                    else:
                        t = self.optimizer.state[p][what]
                    parts.append(t.reshape(-1).double().cpu().numpy())
                out[(layer, int(e))] = np.concatenate(parts)
        return out
