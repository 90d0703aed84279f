"""One rank's training engine: the model, its replica buffer, AdamW, and one training step driven
by a StepPlan (migration if the placement changed, then micro-batches with replicas, then the
dense-gradient all-reduce and the optimizer step)."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from relibra.plan import StepPlan
from relibra.runtime.config import ModelConfig, TrainConfig
from relibra.runtime.data import SourceBatch
from relibra.runtime.migration import InjectedFailure, MigrationError, migrate_homes
from relibra.runtime.model import MoETransformer
from relibra.runtime.plans import static_plan
from relibra.runtime.placement import (check_plan_for_runtime, home_slot_index, padded_replicas, replica_routes,
                                       slot_experts)
from relibra.runtime.replicas import ReplicaBuffer
from relibra.runtime.router import make_layer_route


class Engine:
    """Model + optimizer of one rank.

    pg_collection: megatron groups (pg_collection.ep is the EP group this model spans);
    ranks_per_node: simulated node size; home: int [L, E] initial placement; device: "cpu" or "cuda"
    (on CUDA, build it after torch.cuda.set_device).
    """

    def __init__(self, cfg: ModelConfig, train: TrainConfig, pg_collection, ranks_per_node: int, home: np.ndarray,
                 device: str = "cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.train = train
        self.ep_group = pg_collection.ep
        self.ep = self.ep_group.size()
        self.ranks_per_node = ranks_per_node
        self.model = MoETransformer(cfg, pg_collection, home).to(self.device)
        self.rank = self.model.rank
        if cfg.replica_slots > 0:
            self.model.replicas = ReplicaBuffer(self.model, lambda a, b: a // ranks_per_node == b // ranks_per_node)
        self.optimizer = torch.optim.AdamW(self.model.optimizer_parameters(), lr=train.lr, betas=train.betas,
                                           eps=train.eps, weight_decay=train.weight_decay)
        # Gradients live from the start and are zeroed in place each step (as megatron's grad buffers): a home
        # slot that gets no tokens is skipped in the forward (model._occupied_experts_forward) yet still has a
        # zero gradient, so AdamW updates it (weight decay, moments, step count) exactly as if it had run on
        # an empty batch, whatever the placement.
        for p in self.model.optimizer_parameters():
            p.grad = torch.zeros_like(p)

    # ---- plan -> routes ----------------------------------------------------------------------
    def set_routes(self, plan: StepPlan, micro_batch: int, src: int, replay: np.ndarray | None) -> None:
        """Routes of every layer for `src`'s tokens of `micro_batch` under the current placement."""
        r = self.cfg.replica_slots
        rexp = padded_replicas(plan, r)[micro_batch]  # [L, ep, R]
        home = self.model.home
        slots = slot_experts(home, rexp)
        hs = home_slot_index(home, self.ep, r)
        for layer in range(self.cfg.num_layers):
            routes = replica_routes(plan, micro_batch, layer, src, r) if plan.replica_slots else []
            self.model.routing.layers[layer] = make_layer_route(
                slots[layer], hs[layer], routes, None if replay is None else replay[layer], self.device)
        if self.model.replicas is not None:
            flow = plan.replica_flow[micro_batch].sum(axis=1)  # [L, ep, r] tokens per replica slot (all sources)
            used = np.zeros(rexp.shape, dtype=bool)
            used[..., : flow.shape[-1]] = flow > 0
            self.model.replicas.set_microbatch(np.where(used, rexp, -1), home)  # only slots in use move

    def check(self, plan: StepPlan) -> None:
        check_plan_for_runtime(plan, self.ep, self.ranks_per_node, self.cfg.replica_slots,
                               self.cfg.num_layers, self.cfg.num_experts)

    # ---- one step ------------------------------------------------------------------------------
    def step(self, plan: StepPlan, batches: list[list[SourceBatch]], tokens_per_microbatch: list[int],
             sources: list[int], failure: InjectedFailure | None = None, optimizer_step: bool = True,
             on_migration_failure: str = "continue") -> dict:
        """Run one training step. batches[m][i]: the batch of sources[i] in micro-batch m.

        A single-rank EP group may process several sources one after another (the reference);
        with EP > 1 each rank processes its own rank's tokens (sources == [rank]).
        Returns {"loss": this rank's share of the step loss, "seconds": wall time, "experts_moved",
        "migration_error": None or the rolled-back migration's message}.

        A migration that rolls back (every rank voted, see relibra.runtime.migration) leaves the old
        placement; with on_migration_failure="continue" the step then runs on it without replicas
        (the plan's replicas were made for the new placement), with "stop" the MigrationError goes up.
        """
        self.check(plan)
        self.model.timer.reset()
        t0 = time.perf_counter()
        moved, migration_error = 0, None
        if (plan.home != self.model.home).any():
            try:
                moved = migrate_homes(self.model, self.optimizer, plan.home, failure)["experts_moved"]
            except MigrationError as exc:
                if on_migration_failure == "stop":
                    raise
                migration_error = str(exc)
                plan = static_plan(plan.loads, self.ranks_per_node, home=self.model.home, policy=plan.policy)
        self.optimizer.zero_grad(set_to_none=False)
        loss_total = 0.0
        m_count = len(batches)
        for m in range(m_count):
            for src, batch in zip(sources, batches[m]):
                self.set_routes(plan, m, src, batch.replay)
                logits = self.model(torch.as_tensor(batch.ids, device=self.device))
                loss = F.cross_entropy(logits, torch.as_tensor(batch.labels, device=self.device), reduction="sum")
                loss = loss / (tokens_per_microbatch[m] * m_count)
                loss.backward()
                if self.model.replicas is not None:
                    self.model.replicas.pull_gradients()
                loss_total += float(loss.detach())
        t_reduce = time.perf_counter()
        self.allreduce_dense_grads()
        self.model.timer.add("backward", "dense_grad_allreduce", time.perf_counter() - t_reduce)
        if optimizer_step:
            t_opt = time.perf_counter()
            self.optimizer.step()
            self.model.timer.add("step", "optimizer", time.perf_counter() - t_opt)
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # component timers are not synchronized on CUDA; the step total is
        seconds = time.perf_counter() - t0
        self.model.timer.add("step", "step_total", seconds)
        return {"loss": loss_total, "seconds": seconds, "experts_moved": moved, "migration_error": migration_error}

    def allreduce_dense_grads(self) -> None:
        if self.ep == 1:
            return
        params = self.model.dense_parameters()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=self.ep_group)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset: offset + n].view_as(p))
            offset += n

    # ---- inspection ----------------------------------------------------------------------------
    def logical_expert_state(self, what: str = "param") -> dict[tuple[int, int], np.ndarray]:
        """{(layer, expert): flat float64} of experts homed here: what = param | grad | exp_avg | exp_avg_sq."""
        out = {}
        for layer in range(self.cfg.num_layers):
            for mlp, e in zip(self.model.home_mlps(layer), self.model.local_experts(layer)):
                parts = []
                for p in self.model.mlp_params(mlp):
                    if what == "param":
                        t = p.detach()
                    elif what == "grad":
                        t = p.grad if p.grad is not None else torch.zeros_like(p)
                    else:
                        t = self.optimizer.state[p][what]
                    parts.append(t.reshape(-1).double().cpu().numpy())
                out[(layer, int(e))] = np.concatenate(parts)
        return out

    def dense_state(self, what: str = "param") -> np.ndarray:
        parts = []
        for p in self.model.dense_parameters():
            t = p.detach() if what == "param" else (p.grad if p.grad is not None else torch.zeros_like(p))
            parts.append(t.reshape(-1).double().cpu().numpy())
        return np.concatenate(parts)
