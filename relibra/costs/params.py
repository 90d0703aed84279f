"""CostParams: the cost model's knobs that belong to the training run rather than to the hardware."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from relibra.costs.overheads import Overheads
from relibra.errors import ConfigError

REPLICA_BUFFERS = ("layer-shared", "per-layer")
ROUTES = ("rail", "direct")
# Token dispatchers a set-up card names, each with its traffic rule (relibra.costs.phases.dispatch_seconds):
# deepep: rail route, a token sent once per destination GPU and node; alltoall (Megatron's
# MoEAlltoAllTokenDispatcher): direct route, one row per token-expert pair; allgather (Megatron's
# MoEAllGatherTokenDispatcher): every token of every EP rank to every other EP rank, rail route, once per node.
DISPATCHERS = ("deepep", "alltoall", "allgather")
DISPATCHER_ROUTE = {"deepep": ("rail", True), "alltoall": ("direct", False), "allgather": ("rail", True)}
PLANNER_CHARGES = ("table", "measured")
GB = 1e9
TFLOP = 1e12


@dataclass(frozen=True)
class CostParams:
    """Knobs of the cost model that belong to the training run rather than to the hardware.

    seq_len: tokens per sequence, the attention assumption used when a step's actual sequence
        lengths are not given (a trace without `seq_lens`): every token sits in a sequence of
        seq_len tokens, causal, so its core attends to (seq_len + 1) / 2 positions on average.
    replica_buffer: "layer-shared" (one set of replica slots reused by every layer, so weights are
        pushed again for backward) or "per-layer" (slots per layer, kept from forward to backward;
        a replica is pushed only when its slot's content changes from the previous micro-batch and
        its gradient pulled when it leaves). Applies to every policy that overlaps its transfers;
        plans with `transfers_on_critical_path` (LLEP) keep fetched weights until backward (autograd
        holds them), so they push once per (micro-batch, layer) and never again for backward.
    grad_bytes_per_param: bytes of one replica gradient element pulled back to the home (bf16).
    include_lm_head: charge the embedding / LM-head GEMM (once per micro-batch, outside the layers).
    runtime_plan_s: what a plan whose planner runs on the critical path (`planner_on_critical_path`
        or `transfers_on_critical_path`) is charged per (micro-batch,
        layer), on top of an all-gather of the expert counts:
          "table" (default): the planner's seconds per (micro-batch, layer) measured on this kit's
            machine per EP size (data/planner_seconds.json, relibra.bench.planner_table), interpolated
            in log(EP); a planner the table lacks is charged as "measured";
          "measured": this step's measured planner CPU seconds / (micro-batches x layers) (noisy on
            a shared machine, so not the default);
          a number: that many seconds.
    dp_size: data-parallel ranks of each EP rank, over which a distributed optimizer shards the
        optimizer state (migration moves the weights plus 1 / dp_size of the state; the optimizer
        step updates 1 / dp_size of the parameters). None (default): the topology's
        `dp_size(ep)` = num_gpus // ep, the whole cluster training one model; 1 = unsharded.
    route: how bytes cross nodes in every exchange (see links.link_seconds): "rail" (DeepEP, the
        paper's dispatcher) or "direct"; None (default) = the topology's own `route`.
    dedup: send a token once per destination node (RDMA) and GPU (NVLink) as DeepEP does, with the
        distinct tokens estimated from counts (links.distinct_tokens), or (False) one row per
        token-expert pair as Megatron's alltoall dispatcher; None (default) = the topology's.
    attention_backward_factor: backward FLOPs of the attention core as a multiple of its forward
        FLOPs (2.5: FlashAttention's backward recomputes Q K^T; Dao-AILab/flash-attention
        benchmarks/benchmark_flash_attention.py counts it so); every GEMM's backward is twice its forward.
    overlap_transfers: True (default): replica pushes and gradient pulls of plans made ahead of the
        step run on a side stream behind the layer's attention (GPUs: copy engines, NCCL kernels on
        spare SMs); False: they run in line, on the critical path, as the kit's runtime does them
        (relibra.runtime.replicas: blocking point-to-point before each layer).
    dispatcher: the recipe's token dispatcher (DISPATCHERS), which sets the route and dedup where those are
        None: "deepep" (rail, dedup), "alltoall" (direct, one row per token-expert pair), "allgather" (every
        source's tokens to every other EP rank, token rows not pairs, rail, once per node); None: the
        route and dedup alone say (the topology's where None).
    pipeline_stages: pipeline-parallel stages the decoder layers split over (relibra.costs.pipeline);
        the step is the 1F1B schedule of per-stage, per-micro-batch times plus the per-step costs.
    last_stage_layers: decoder layers of the last stage (Megatron's --decoder-last-pipeline-num-layers),
        the others split the rest evenly; None: an even split.
    virtual_stages: model chunks per pipeline device (interleaved 1F1B); 1: plain 1F1B.
    stage_gpus: GPUs of one pipeline stage (DP x CP x TP), which with the cluster's GPUs per node says whether
        a stage-to-stage send crosses nodes (pipeline.boundary_crosses_nodes); None: the EP size.
    sequence_split: ranks every sequence is split over (context x sequence parallel, CP x TP): a trace's
        seq_lens then hold each rank's piece, and one rank's attention core is that of the whole
        sequence (piece x split) over split (Megatron's CP load-balances the causal work).
    optimizer_offload_fraction: share of the optimizer state kept in host memory (Megatron's
        --optimizer-cpu-offload with --optimizer-offload-fraction): migration moves that share of each
        moved expert's state shard over PCIe, out of the old home's host and into the new one's
        (relibra.costs.memory.offload_migration_seconds), and the optimizer step updates that share on the host
        (phases.optimizer_seconds); 0 (default) = all in HBM.
    host_adam_params_per_s: parameters per second the host's CPU Adam updates for one GPU (the host's rate
        shared by the GPUs it serves); charges the offloaded share of the optimizer step.
    overheads: the costs of balancing beyond its transfers' bytes (relibra.costs.overheads.Overheads:
        overlap efficiency, activation recomputation, replica gradient adds, the post-rollout planner);
        the default charges none of them, the set-up card's [overheads] section says what to charge.
    """

    seq_len: int = 4096
    replica_buffer: str = "layer-shared"
    grad_bytes_per_param: int = 2
    include_lm_head: bool = True
    runtime_plan_s: float | str = "table"
    dp_size: int | None = None
    route: str | None = None
    dedup: bool | None = None
    overlap_transfers: bool = True
    attention_backward_factor: float = 2.5
    dispatcher: str | None = None
    pipeline_stages: int = 1
    last_stage_layers: int | None = None
    virtual_stages: int = 1
    stage_gpus: int | None = None
    sequence_split: int = 1
    overheads: Overheads = field(default_factory=Overheads)
    optimizer_offload_fraction: float = 0.0
    host_adam_params_per_s: float = 4.0e8

    def __post_init__(self):
        if not isinstance(self.overheads, Overheads):
            raise ConfigError(f"cost model: overheads must be a relibra.costs.overheads.Overheads, got {self.overheads!r}")
        if self.seq_len <= 0:
            raise ConfigError(f"cost model: seq_len must be positive, got {self.seq_len}")
        if self.replica_buffer not in REPLICA_BUFFERS:
            raise ConfigError(f"cost model: replica_buffer must be one of {REPLICA_BUFFERS}, got {self.replica_buffer!r}")
        if self.grad_bytes_per_param <= 0:
            raise ConfigError(f"cost model: grad_bytes_per_param must be positive, got {self.grad_bytes_per_param}")
        if self.route is not None and self.route not in ROUTES:
            raise ConfigError(f"cost model: route must be one of {ROUTES}, got {self.route!r}")
        if isinstance(self.runtime_plan_s, str):
            if self.runtime_plan_s not in PLANNER_CHARGES:
                raise ConfigError(f"cost model: runtime_plan_s must be a number of seconds or one of "
                                  f"{PLANNER_CHARGES}, got {self.runtime_plan_s!r}")
        elif not self.runtime_plan_s >= 0:
            raise ConfigError(f"cost model: runtime_plan_s must be >= 0, got {self.runtime_plan_s}")
        if not (math.isfinite(self.attention_backward_factor) and self.attention_backward_factor > 0):
            raise ConfigError(f"cost model: attention_backward_factor must be positive and finite, "
                              f"got {self.attention_backward_factor}")
        f = self.optimizer_offload_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
            raise ConfigError(f"cost model: optimizer_offload_fraction must lie in [0, 1], got {f!r}")
        v = self.host_adam_params_per_s
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"cost model: host_adam_params_per_s must be a positive number, got {v!r}")
        if self.dp_size is not None and (not isinstance(self.dp_size, int) or self.dp_size <= 0):
            raise ConfigError(f"cost model: dp_size must be a positive integer or None, got {self.dp_size!r}")
        if self.dispatcher is not None and self.dispatcher not in DISPATCHERS:
            raise ConfigError(f"cost model: dispatcher must be one of {DISPATCHERS} or None, got {self.dispatcher!r}")
        for name in ("pipeline_stages", "virtual_stages", "sequence_split"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"cost model: {name} must be a positive integer, got {v!r}")
        v = self.stage_gpus
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"cost model: stage_gpus must be a positive integer or None, got {v!r}")
        v = self.last_stage_layers
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"cost model: last_stage_layers must be a positive integer or None, got {v!r}")
