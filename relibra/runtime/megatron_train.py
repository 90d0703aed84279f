"""One rank's model under megatron-core's training stack: GPTModel with ReLibra's MoE spec, the step
hook, megatron's DistributedDataParallel and get_megatron_optimizer, on any EP x DP grid.

    pgc = megatron_grid(ep)                              # parallel_state.initialize_model_parallel
    trainer = MegatronTrainer(cfg, setup, pgc, max_tokens)
    out = trainer.step(plan, batches, tokens_per_microbatch)

A step is megatron's own sequence with the hook's three calls in it:
    ddp.zero_grad_buffer(); optimizer.zero_grad()
    hook.begin_step(plan)                                  # migration: weights, masters, Adam state
    for each micro-batch: hook.before_microbatch; forward; backward; hook.after_backward
    ddp.finish_grad_sync()                                 # dense over DP, experts over expert-DP
    optimizer.step()                                       # masters -> model weights (all-gather)

Set-ups (MegatronSetup): parameter dtype float64 / float32 (megatron's FP32Optimizer, or with
distributed_optimizer its DistributedOptimizer, which takes float32 only) or bfloat16
(Float16OptimizerWithFloat16Params, or the DistributedOptimizer; fp32 masters, gradients reduced in
fp32). Adam, megatron's own gradient clipping by global norm.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from relibra.errors import ConfigError
from relibra.runtime import compat
from relibra.plan import StepPlan
from relibra.runtime.config import ModelConfig
from relibra.runtime.data import SourceBatch
from relibra.runtime.hook import ReLibraHook
from relibra.runtime.optstate import OptimizerState
from relibra.runtime.model import build_model, init_dense_weights, logical_expert_weights
from relibra.runtime.timing import Timer

DTYPES = ("float64", "float32", "bfloat16")


@dataclass(frozen=True)
class MegatronSetup:
    """dtype: model parameters (float64, float32, bfloat16); distributed_optimizer: shard master copies
    and Adam state over data parallelism (megatron's DistributedOptimizer); clip_grad: megatron's
    global-norm clip (0 = off; it needs float32 gradients, so float32 or bfloat16); grouped_gemm:
    TEGroupedMLP experts (relibra.runtime.model.grouped_moe_spec); gradient_accumulation_fusion:
    megatron's fused weight-gradient accumulation into main_grad (float32 or bfloat16); recompute:
    megatron's activation recompute, "" (off), "full" (every transformer layer, uniform, one layer per
    checkpoint) or "selective" (the MoE layer: recompute_modules ["moe"], plus "moe_act" with grouped
    experts); optimizer_cpu_offload: megatron's HybridDeviceOptimizer under the DistributedOptimizer
    (optimizer_cpu_offload, offload fraction 1: fp32 masters and Adam state in host memory)."""

    dtype: str = "float64"
    distributed_optimizer: bool = False
    lr: float = 1e-2
    weight_decay: float = 0.01
    clip_grad: float = 0.0
    grouped_gemm: bool = False
    gradient_accumulation_fusion: bool = False
    recompute: str = ""
    optimizer_cpu_offload: bool = False

    def validate(self) -> "MegatronSetup":
        if self.dtype not in DTYPES:
            raise ConfigError(f"megatron set-up: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.distributed_optimizer and self.dtype == "float64":
            raise ConfigError("megatron's DistributedOptimizer takes float32 or bfloat16 parameters, not float64")
        if self.clip_grad > 0 and self.dtype == "float64":
            raise ConfigError("megatron's gradient clipping takes float32 gradients; use clip_grad=0 with float64")
        if self.recompute not in ("", "full", "selective"):
            raise ConfigError(f"megatron set-up: recompute must be '', 'full' or 'selective', got {self.recompute!r}")
        if self.optimizer_cpu_offload and not self.distributed_optimizer:
            raise ConfigError("megatron's optimizer CPU offload runs under the DistributedOptimizer; set "
                              "distributed_optimizer=True with optimizer_cpu_offload")
        if self.gradient_accumulation_fusion and self.dtype == "float64":
            raise ConfigError("megatron's gradient-accumulation fusion accumulates into float32, bfloat16 or float16 "
                              "main_grad; use float32 or bfloat16 with gradient_accumulation_fusion")
        return self

    @property
    def name(self) -> str:
        return (f"{self.dtype}{'+distributed-optimizer' if self.distributed_optimizer else ''}"
                f"{'+grouped-gemm' if self.grouped_gemm else ''}"
                f"{'+grad-accum-fusion' if self.gradient_accumulation_fusion else ''}"
                f"{'+recompute-' + self.recompute if self.recompute else ''}"
                f"{'+cpu-offload' if self.optimizer_cpu_offload else ''}")


def megatron_grid(ep: int, tp: int = 1, pp: int = 1):
    """megatron's process groups for pipeline size `pp`, tensor parallelism `tp` (with sequence
    parallelism in the model; expert TP 1) and EP `ep` within each stage (DP = world / (tp * pp); expert
    DP = world / (ep * pp)), via parallel_state.initialize_model_parallel (once per process); returns
    the ProcessGroupCollection."""
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    from relibra.runtime import compat

    compat.apply()
    world = dist.get_world_size()
    if ep <= 0 or tp <= 0 or pp <= 0 or world % (ep * pp) or world % (tp * pp):
        raise ConfigError(f"EP {ep} x PP {pp} and TP {tp} x PP {pp} must divide the {world} ranks")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                                                 pipeline_model_parallel_size=pp,
                                                 expert_tensor_parallel_size=1, create_gloo_process_groups=False)
    elif parallel_state.get_expert_model_parallel_world_size() != ep:
        raise ConfigError(f"megatron's process groups are initialized with EP "
                          f"{parallel_state.get_expert_model_parallel_world_size()}, not {ep}")
    return ProcessGroupCollection.use_mpu_process_groups()


def packed_forward(model, ids: np.ndarray, lengths: list[int] | None = None, device="cpu") -> torch.Tensor:
    """Logits [T, vocab] of token ids int [T]: one sequence, or with `lengths` several sequences
    packed back to back, each attending causally to itself only (a block-diagonal causal mask). RoPE
    depends on position differences only, so a packed sequence computes what it would alone."""
    t = len(ids)
    ids_t = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=device).view(1, t)
    positions = torch.arange(t, device=device).view(1, t)
    masked = torch.triu(torch.ones(t, t, dtype=torch.bool, device=device), 1)
    if lengths is not None:
        segment = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                          torch.as_tensor(lengths, device=device))
        masked |= segment[:, None] != segment[None, :]
    return model(ids_t, positions, masked.view(1, 1, t, t)).view(t, -1)


def tp_token_loss(model, batch: SourceBatch, scale: float, device) -> torch.Tensor:
    """Under tensor parallelism (logits split over the vocabulary): the summed next-token cross-entropy
    of one sequence times `scale`, computed by GPTModel itself (megatron's vocab-parallel
    cross-entropy, given the labels)."""
    t = len(batch.ids)
    ids = torch.as_tensor(np.asarray(batch.ids, dtype=np.int64), device=device).view(1, t)
    labels = torch.as_tensor(np.asarray(batch.labels, dtype=np.int64), device=device).view(1, t)
    positions = torch.arange(t, device=device).view(1, t)
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=device), 1).view(1, 1, t, t)
    return model(ids, positions, causal, labels=labels).sum() * scale


def pipeline_stage_loss(model, batch: SourceBatch, scale: float, device) -> torch.Tensor:
    """One pipeline stage's forward of one sequence: the first stage embeds the ids, a later stage takes
    the activations megatron's schedule gave it (set_input_tensor); the last stage returns the summed
    next-token cross-entropy times `scale` (GPTModel's, given the labels), the others their hidden
    states [T, 1, hidden]."""
    t = len(batch.ids)
    ids = torch.as_tensor(np.asarray(batch.ids, dtype=np.int64), device=device).view(1, t)
    labels = torch.as_tensor(np.asarray(batch.labels, dtype=np.int64), device=device).view(1, t)
    positions = torch.arange(t, device=device).view(1, t)
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=device), 1).view(1, 1, t, t)
    out = model(ids, positions, causal, labels=labels)
    return out.sum() * scale if out.dim() == 2 else out


def token_loss(model, batch: SourceBatch, scale: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token cross-entropy (in float32 or wider) of one sequence times `scale`; and its logits."""
    logits = packed_forward(model, batch.ids, device=device)
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    loss = F.cross_entropy(wide, torch.as_tensor(batch.labels, device=device), reduction="sum")
    return loss * scale, logits


class MegatronTrainer:
    """Model, hook, megatron DDP and megatron optimizer of one rank.

    cfg: the model (cfg.replica_slots replica slots per rank; cfg.dtype is ignored, setup.dtype rules);
    pgc: megatron's ProcessGroupCollection (megatron_grid); max_tokens: longest sequence a rank runs;
    home: int [L, E] initial placement (default megatron's static one); ranks_per_node: node size in
    EP-local ranks (default: the whole EP group).
    """

    def __init__(self, cfg: ModelConfig, setup: MegatronSetup, pgc, max_tokens: int,
                 home: np.ndarray | None = None, ranks_per_node: int | None = None, device: str = "cpu"):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        setup.validate()
        self.setup = setup
        self.device = torch.device(device)
        self.ep_group = pgc.ep
        self.pgc = pgc
        self.tp = pgc.tp.size() if getattr(pgc, "tp", None) is not None else 1
        self.pp = pgc.pp.size() if getattr(pgc, "pp", None) is not None else 1
        self.timer = Timer()
        build_cfg = ModelConfig(cfg.shape, cfg.num_layers, cfg.replica_slots, cfg.seed,
                                "float64" if setup.dtype == "float64" else "float32")
        model = build_model(build_cfg, pgc, max_tokens, grouped_gemm=setup.grouped_gemm,
                            gradient_accumulation_fusion=setup.gradient_accumulation_fusion,
                            recompute=setup.recompute)
        if setup.dtype == "bfloat16":
            model = model.to(torch.bfloat16)
        self.model = model.to(self.device)
        # The hook first (it shares the replica slot modules across layers), then DDP over the result.
        self.hook = ReLibraHook(model, pgc.ep, ranks_per_node or pgc.ep.size(), home=home, timer=self.timer)
        slots = self.hook.slots
        expert_ids = {id(p) for p in slots.home_expert_parameters() + slots.replica_parameters()}
        init_dense_weights(model, cfg.seed, expert_ids)
        slots.load_logical_weights(lambda layer, expert: logical_expert_weights(cfg, layer, expert))
        self.dense = [p for p in model.parameters() if id(p) not in expert_ids]
        bf16 = setup.dtype == "bfloat16"
        ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=setup.distributed_optimizer,
                                                   grad_reduce_in_fp32=bf16, overlap_grad_reduce=False)
        self.ddp = DistributedDataParallel(model.config, ddp_config, model, pg_collection=pgc)
        opt_config = OptimizerConfig(optimizer="adam", lr=setup.lr, weight_decay=setup.weight_decay,
                                     adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, bf16=bf16,
                                     use_distributed_optimizer=setup.distributed_optimizer,
                                     clip_grad=setup.clip_grad, optimizer_cpu_offload=setup.optimizer_cpu_offload,
                                     optimizer_offload_fraction=1.0 if setup.optimizer_cpu_offload else 0.0,
                                     pin_cpu_grads=not compat.cuda_absent(), pin_cpu_params=not compat.cuda_absent())
        if setup.optimizer_cpu_offload and compat.cuda_absent():
            from relibra.runtime import standins

            standins.install_cpu_optimizer_offload()
        self.optimizer = get_megatron_optimizer(opt_config, [self.ddp], pg_collection=pgc,
                                                use_gloo_process_groups=False)
        self.hook.optimizer = self.optimizer
        OptimizerState(self.optimizer, pgc.expt_dp)  # refuses, before training, state a migration cannot move

    def step(self, plan: StepPlan, batches: list[SourceBatch], tokens_per_microbatch: list[int]) -> dict:
        """One training step on this rank's batches (one sequence per micro-batch), summed next-token
        cross-entropy over the micro-batch's tokens. Returns run()'s dict."""
        def loss(m: int, batch: SourceBatch) -> torch.Tensor:
            scale = 1.0 / (tokens_per_microbatch[m] * len(batches))
            if self.pp > 1:
                return pipeline_stage_loss(self.ddp, batch, scale, self.device)
            if self.tp > 1:
                return tp_token_loss(self.ddp, batch, scale, self.device)
            return token_loss(self.ddp, batch, scale, self.device)[0]

        return self.run(plan, batches, loss)

    def run(self, plan: StepPlan, micro_batches: list, loss_fn) -> dict:
        """One step: micro_batches[m] has `.replay` (int [L, T, K] replayed ids or None); loss_fn(m,
        micro_batch) runs the forward (through self.ddp) and returns the micro-batch's loss. Returns
        {"loss": this rank's summed losses, "grad_norm", "experts_moved", "migration_error", "wall_s"}."""
        t0 = time.perf_counter()
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        start = self.hook.begin_step(plan)
        if self.pp > 1:
            return self._run_pipeline(micro_batches, loss_fn, t0, start)
        loss_total = 0.0
        for m, batch in enumerate(micro_batches):
            self.hook.before_microbatch(m, batch.replay)
            loss = loss_fn(m, batch)
            loss.backward()
            self.hook.after_backward(m)
            loss_total += float(loss.detach())
        if self.tp > 1:  # megatron's own: DP reduction, plus sequence-parallel weights (norms, router) over TP
            from megatron.core.distributed.finalize_model_grads import finalize_model_grads

            finalize_model_grads([self.ddp], pg_collection=self.pgc)
        else:
            self.ddp.finish_grad_sync()
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:
            raise ConfigError("megatron's optimizer skipped the step (inf or nan gradients)")
        return {"loss": loss_total, "grad_norm": float(grad_norm), "wall_s": time.perf_counter() - t0, **start}

    def _run_pipeline(self, micro_batches: list, loss_fn, t0: float, start: dict) -> dict:
        """The step's forwards and backwards through megatron's non-interleaved 1F1B schedule
        (get_forward_backward_func): the forward step function is the k-th call for micro-batch k, so
        it gives the hook micro-batch k's routes; loss_fn returns the stage's output (the last stage:
        its loss, which the schedule divides by the number of micro-batches, so it is handed over
        multiplied by that number). Sequence lengths vary between micro-batches (variable_seq_lengths:
        the stages exchange shapes first). "loss": the last stage's summed losses (0 on other stages)."""
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads

        count = len(micro_batches)
        calls = iter(range(count))
        losses = []

        def forward_step(data_iterator, model):
            m = next(calls)
            batch = next(data_iterator)
            self.hook.before_microbatch(m, batch.replay)
            out = loss_fn(m, batch)

            def reduce(output):
                losses.append(float(output.detach()))
                return output * count, {}

            return out, reduce

        config = self.ddp.config
        config.variable_seq_lengths = True
        config.pipeline_dtype = self.dense[0].dtype  # what the stages send: the parameters' dtype (bf16 after .to)
        length = max(len(b.ids) for b in micro_batches)
        compat.forward_backward_func(self.pp)(
            forward_step_func=forward_step, data_iterator=iter(micro_batches), model=[self.ddp],
            num_microbatches=count, seq_length=length, micro_batch_size=1, forward_only=False)  # parallel_state's groups
        self.hook.end_backward()
        finalize_model_grads([self.ddp], pg_collection=self.pgc)
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:
            raise ConfigError("megatron's optimizer skipped the step (inf or nan gradients)")
        return {"loss": sum(losses), "grad_norm": float(grad_norm), "wall_s": time.perf_counter() - t0, **start}

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ---- inspection ----------------------------------------------------------------------------
    def logical_expert_state(self, what: str = "param") -> dict[tuple[int, int], np.ndarray]:
        return self.hook.logical_expert_state(what)

    def dense_state(self) -> np.ndarray:
        return np.concatenate([p.detach().reshape(-1).double().cpu().numpy() for p in self.dense])

    @property
    def home(self) -> np.ndarray:
        return self.hook.home
