"""The runtime's training loop: StepPlans in, measurements out.

`worker(rank, world, options, runs)` is one rank's body (relibra.runtime.launch starts it on local gloo
ranks; under torchrun `relibra run --torchrun` calls it after init_distributed). Every policy gets its
own engine (megatron-core GPTModel with ReLibra's MoE spec, step hook, AdamW) from the same seed. The
policies then alternate step by step (megatron, relibra, megatron, relibra, ...), every policy's step s
on the same step of data, each step starting at a barrier, so that drift of a shared machine hits
every policy alike. Nothing here plans or simulates: the plans come from the caller
(relibra.runtime.measure), which also turns the records into reports.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from relibra.errors import ConfigError
from relibra.progress import progress as tqdm
from relibra.runtime.config import ModelConfig, NodeLayout, RunOptions, TrainConfig
from relibra.runtime.data import TraceData
from relibra.runtime.plans import static_plan
from relibra.runtime.results import Equivalence, RunResult, StepRecord
from relibra.trace import RoutingTrace

# torch and megatron-core (seconds to import) load inside the functions below, in the ranks: the
# launcher's process and relibra.runtime.measure import this module without them, and a spawned rank
# imports it (to unpickle `worker`) before relibra.runtime.launch sets up its watchdog, warning filters
# and one-line error report.


@dataclass
class PolicyPlans:
    """One policy's input: the token trace it trains on and one StepPlan per step (warm-up included)."""

    policy: str
    trace: RoutingTrace
    plans: list


def hardware(world: int, threads: int) -> str:
    import torch  # see the note at the top

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} x{world} (nccl)"
    return f"cpu-gloo ({os.cpu_count()} cores, gloo, {world} ranks, {threads} thread/rank)"


class _PolicyRun:
    """One policy's engine and data on this rank."""

    def __init__(self, run: PolicyPlans, options: RunOptions, groups, device: str):
        from relibra.runtime.engine import Engine  # megatron-core: see the note at the top

        trace = run.trace
        m = options.model
        self.label = run.policy
        self.plans = run.plans
        self.replica_slots = max(p.replica_slots for p in run.plans)
        cfg = ModelConfig.from_preset(m.name, replica_slots=self.replica_slots, seed=m.seed, dtype=m.dtype)
        if cfg.num_layers != trace.num_layers:
            raise ConfigError(f"the trace has {trace.num_layers} layers; model {m.name!r} has {cfg.num_layers}")
        self.data = TraceData(trace, cfg.shape.vocab_size, m.seed)
        self.layers = cfg.num_layers
        self.micro_batches = trace.num_microbatches
        max_tokens = int(self.data.max_tokens_per_src())
        self.engine = Engine(cfg, TrainConfig(lr=m.lr), groups.collection(), groups.layout.ranks_per_node,
                             run.plans[0].home, max_tokens, device=device,
                             split_waiting=options.measurement.split_waiting,
                             on_migration_failure=options.faults.on_migration_failure)
        self.losses: list[float] = []


def worker(rank: int, world: int, options: RunOptions, runs: list[PolicyPlans], failure=None) -> dict:
    """Body of one rank: every policy of `runs`, interleaved step by step. Rank 0 returns
    RunResult.to_dict(); others {}. failure: a migration.InjectedFailure for tests of the rollback path."""
    import torch  # torch: see the note at the top
    import torch.distributed as dist

    from relibra.runtime.collect import gather_arrays, gather_list
    from relibra.runtime.groups import build_groups

    options.validate()
    torch.set_num_threads(options.parallelism.threads_per_rank)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layout = NodeLayout(world, options.parallelism.nodes)
    groups = build_groups(layout)
    runs = list(runs)
    check = options.measurement.check_equivalence
    if check:  # the static placement on each policy's data, trained alongside (not timed)
        runs += [PolicyPlans(f"static:{r.policy}", r.trace, [static_plan(p.loads, layout.ranks_per_node)
                                                            for p in r.plans]) for r in runs]
    policies = [_PolicyRun(r, options, groups, device) for r in runs]
    if failure is not None:
        policies[0].engine.hook.failure = failure
    total = len(runs[0].plans)
    if any(len(r.plans) != total for r in runs):
        raise ConfigError("every policy needs the same number of plans")
    warmup = options.measurement.warmup_steps
    records = []
    steps = range(total)
    if rank == 0 and total > 2:
        steps = tqdm(steps, desc=f"{'/'.join(r.label for r in policies)} x{world}", unit="step", file=sys.stderr,
                     leave=False)
    for s in steps:
        for run in policies:
            dist.barrier()  # every policy's step starts together, as after a global-batch boundary
            out = run.engine.step(run.plans[s], *_inputs(run, s, rank), [rank])
            if out["migration_error"] and rank == 0:
                print(f"warning: step {s} ({run.label}): {out['migration_error']}; training goes on on the old "
                      "placement", file=sys.stderr)
            loss = torch.tensor([out["loss"]], dtype=torch.float64, device=run.engine.device)
            dist.all_reduce(loss)
            run.losses.append(float(loss.item()))
            if not np.isfinite(run.losses[-1]):  # the same all-reduced value on every rank: all stop here alike
                raise ConfigError(f"{run.label}: the loss of step {s} is {run.losses[-1]}; training diverged "
                                  f"(lower --lr)")
            if s >= warmup and not run.label.startswith("static:"):
                timer = run.engine.timer
                records.append(StepRecord(
                    policy=run.label, step=s - warmup, rank=rank, wall_s=out["wall_s"], cpu_s=out["cpu_s"],
                    expert_tokens=int(timer.tokens.get(("forward", "expert_compute"), 0)),
                    experts_moved=int(out["experts_moved"]),
                    seconds={f"{phase}/{comp}": float(v) for (phase, comp), v in timer.seconds.items()}))
    equivalence = {}
    if check:
        n = len(runs) // 2
        for run, static in zip(policies[:n], policies[n:]):
            experts = gather_arrays(run.engine.logical_expert_state("param"))
            s_experts = gather_arrays(static.engine.logical_expert_state("param"))
            dense_diff = gather_list(float(np.abs(run.engine.dense_state() - static.engine.dense_state()).max()))
            if rank == 0:
                expert_diff = max(float(np.abs(experts[k] - s_experts[k]).max()) for k in experts)
                loss_diff = max(abs(a - b) for a, b in zip(run.losses, static.losses))
                equivalence[run.label] = Equivalence(max(expert_diff, max(dense_diff), loss_diff), expert_diff,
                                                     max(dense_diff), loss_diff, options.model.dtype)
    all_records = gather_list([r.__dict__ for r in records])
    if rank != 0:
        return {}
    timed = [r for r in policies if not r.label.startswith("static:")]
    return RunResult(records=[StepRecord(**r) for part in all_records for r in part],
                     losses={r.label: r.losses for r in timed}, replica_slots={r.label: r.replica_slots for r in timed},
                     hardware=hardware(world, options.parallelism.threads_per_rank), world=world,
                     nodes=options.parallelism.nodes, threads_per_rank=options.parallelism.threads_per_rank,
                     equivalence=equivalence).to_dict()


def _inputs(run: _PolicyRun, s: int, rank: int):
    batches = [[run.data.batch(s, m, rank, run.layers)] for m in range(run.micro_batches)]
    return batches, [run.data.tokens(s, m) for m in range(run.micro_batches)]
