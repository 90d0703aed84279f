"""One rank's training engine: megatron-core's GPTModel with ReLibra's MoE spec, the step hook, AdamW,
and one training step driven by a StepPlan (the hook's three calls around micro-batches, then the
dense-gradient all-reduce and the optimizer step). Timers wrap the MoE layers' stages and attention."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from relibra.plan import StepPlan
from relibra.runtime.config import ModelConfig, TrainConfig
from relibra.runtime import compat
from relibra.runtime.data import SourceBatch
from relibra.runtime.hook import ReLibraHook
from relibra.runtime.model import build_model, forward_loss, init_dense_weights, logical_expert_weights
from relibra.runtime.timing import Timer, timed_region


def instrument(model, slots, timer: Timer) -> None:
    """Time every MoE layer's route, permute, dispatch, expert compute (and its GEMMs alone), combine,
    and every layer's self-attention; the collectives (the permute's count all-gather, dispatch and
    combine) also time their waiting (Timer.wait)."""
    for moe in slots.moes:
        for method, region, kwargs in compat.moe_layer_regions():  # what megatron-core's release has
            setattr(moe, method, timed_region(getattr(moe, method), timer, region, **kwargs))
        moe.experts.forward = timed_region(moe.experts.forward, timer, "expert_gemm")
    for layer in model.decoder.layers:
        layer.self_attention.forward = timed_region(layer.self_attention.forward, timer, "attention")


class Engine:
    """Model, hook and optimizer of one rank.

    pg_collection: megatron groups (pg_collection.ep is the EP group the model spans); ranks_per_node:
    simulated node size; home: int [L, E] initial placement; max_tokens: longest sequence a rank runs;
    device: "cpu" or "cuda" (build it after torch.cuda.set_device); split_waiting: time a barrier before
    every all-to-all and replica transfer (the waiting of each phase apart from its own work).
    """

    def __init__(self, cfg: ModelConfig, train: TrainConfig, pg_collection, ranks_per_node: int, home: np.ndarray,
                 max_tokens: int, device: str = "cpu", split_waiting: bool = False,
                 on_migration_failure: str = "continue"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.ep_group = pg_collection.ep
        self.ep = self.ep_group.size()
        sync = torch.cuda.synchronize if self.device.type == "cuda" else None
        self.timer = Timer(wait_group=self.ep_group if split_waiting and self.ep > 1 else None, synchronize=sync)
        self.model = build_model(cfg, pg_collection, max_tokens).to(self.device)
        self.hook = ReLibraHook(self.model, self.ep_group, ranks_per_node, home=home, timer=self.timer,
                                on_migration_failure=on_migration_failure)
        slots = self.hook.slots
        expert_ids = {id(p) for p in slots.home_expert_parameters() + slots.replica_parameters()}
        init_dense_weights(self.model, cfg.seed, expert_ids)
        slots.load_logical_weights(lambda layer, expert: logical_expert_weights(cfg, layer, expert))
        self.dense = [p for p in self.model.parameters() if id(p) not in expert_ids]
        instrument(self.model, slots, self.timer)
        self.optimizer = torch.optim.AdamW(self.dense + slots.home_expert_parameters(), lr=train.lr,
                                           betas=train.betas, eps=train.eps, weight_decay=train.weight_decay)
        self.hook.optimizer = self.optimizer
        # Gradients live from the start and are zeroed in place each step (as megatron's grad buffers): a home
        # slot that gets no tokens is skipped in the forward (spec.OccupiedSequentialMLP) yet still has a
        # zero gradient, so AdamW updates it (weight decay, moments, step count) exactly as if it had run on
        # an empty batch, whatever the placement.
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                p.grad = torch.zeros_like(p)
        self.capture: list | None = None  # a list: each micro-batch appends {"logits"} (tests)

    def step(self, plan: StepPlan, batches: list[list[SourceBatch]], tokens_per_microbatch: list[int],
             sources: list[int], optimizer_step: bool = True) -> dict:
        """Run one training step. batches[m][i]: the batch of sources[i] in micro-batch m.

        A single-rank EP group may process several sources one after another (the reference);
        with EP > 1 each rank processes its own rank's tokens (sources == [rank]).
        Returns {"loss": this rank's share of the step loss, "wall_s", "cpu_s", "experts_moved",
        "migration_error": None or the rolled-back migration's message}.
        """
        self.timer.reset()
        t0, c0 = time.perf_counter(), time.process_time()
        start = self.hook.begin_step(plan)
        self.optimizer.zero_grad(set_to_none=False)
        loss_total = 0.0
        m_count = len(batches)
        for m in range(m_count):
            for src, batch in zip(sources, batches[m]):
                self.hook.before_microbatch(m, batch.replay, src)
                loss, logits = forward_loss(self.model, batch.ids, batch.labels,
                                            1.0 / (tokens_per_microbatch[m] * m_count), self.device)
                if self.capture is not None:
                    self.capture.append({"logits": logits.detach().double().cpu().numpy().reshape(len(batch.ids), -1)})
                loss.backward()
                self.hook.after_backward(m)
                loss_total += float(loss.detach())
        self.allreduce_dense_grads()
        if optimizer_step:
            t_opt = time.perf_counter()
            self.optimizer.step()
            self.timer.add("step", "optimizer", time.perf_counter() - t_opt)
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # component timers are not synchronized on CUDA; the step total is
        wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        self.timer.add("step", "step_total", wall_s)
        return {"loss": loss_total, "wall_s": wall_s, "cpu_s": cpu_s, **start}

    def allreduce_dense_grads(self) -> None:
        if self.ep == 1:
            return
        self.timer.wait("backward", "dense_grad_allreduce")
        t0 = time.perf_counter()
        flat = torch.cat([p.grad.reshape(-1) for p in self.dense])
        dist.all_reduce(flat, group=self.ep_group)
        offset = 0
        for p in self.dense:
            n = p.numel()
            p.grad.copy_(flat[offset: offset + n].view_as(p))
            offset += n
        self.timer.add("backward", "dense_grad_allreduce", time.perf_counter() - t0)

    # ---- inspection ----------------------------------------------------------------------------
    def logical_expert_state(self, what: str = "param") -> dict[tuple[int, int], np.ndarray]:
        return self.hook.logical_expert_state(what)

    def dense_state(self, what: str = "param") -> np.ndarray:
        parts = []
        for p in self.dense:
            t = p.detach() if what == "param" else (p.grad if p.grad is not None else torch.zeros_like(p))
            parts.append(t.reshape(-1).double().cpu().numpy())
        return np.concatenate(parts)

    @property
    def home(self) -> np.ndarray:
        return self.hook.home
