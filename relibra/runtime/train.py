"""The training entry point: a policy's plans drive real expert-parallel steps; metrics per step and rank.

Under torchrun (one process per rank, gloo on CPU, NCCL on GPUs):

    torchrun --nproc-per-node 4 -m relibra.runtime.train --nodes 2 --policy relibra --steps 3 --out runs/x

or locally through `relibra run` (relibra.runtime.launch). Every rank builds the same trace and the
same plans (planning is deterministic, and replay-driven planning happens after rollout, off the
training step's critical path), then trains: AdamW over dense parameters and home experts.

Routing: a trace with token-level ids is replayed through megatron's RouterReplay; a trace with loads
only gets per-token ids dealt deterministically from its loads (relibra.runtime.data); with no trace a
synthetic skewed trace comes from relibra.workloads.generate_trace(token_level=True).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from relibra.errors import ConfigError
from relibra.metrics import frame
from relibra.runtime.options import RunOptions, parse_args
from relibra.trace import RoutingTrace, static_placement


def load_or_make_trace(opts: RunOptions, ep: int) -> RoutingTrace:
    """The run's trace: opts.trace (its EP must be `ep`), else a synthetic token-level one."""
    if opts.trace:
        trace = RoutingTrace.load(opts.trace)
        if trace.ep != ep:
            raise ConfigError(f"trace {opts.trace} was recorded at EP {trace.ep}; launch it with --nproc {trace.ep}")
        return trace
    from relibra.workloads import generate_trace

    return generate_trace(opts.model, opts.workload, ep=ep, steps=opts.steps + opts.warmup_steps, seed=opts.seed,
                          micro_batches=opts.micro_batches, tokens_per_rank=opts.tokens_per_rank, token_level=True)


def make_plans(trace: RoutingTrace, policy: str, params: dict, gpus_per_node: int, steps: int) -> list:
    """One StepPlan per step, each seeing the previous step's placement.

    Placement scores that weigh bytes against compute use this machine's rates: the measured
    cpu-gloo preset on CPU, the paper's Hopper cluster on GPUs, cut to the run's nodes x ranks.
    """
    from relibra.cluster import get_topology
    from relibra.policies import get_policy

    preset = get_topology("paper" if torch.cuda.is_available() else "cpu-gloo")
    topology = preset.with_changes(num_nodes=trace.ep // gpus_per_node, gpus_per_node=gpus_per_node)
    pol = get_policy(policy, **params)
    plans, prev = [], None
    for s in range(steps):
        plan = pol.plan(trace, s, topology, prev)
        plans.append(plan)
        prev = plan.home
    return plans


def _hardware(world: int, threads: int) -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} x{world} (nccl)"
    return f"cpu-gloo ({os.cpu_count()} cores, gloo, {world} ranks, {threads} thread/rank)"


def _rows(engine, opts: RunOptions, policy: str, step: int, rank: int, world: int, trace: RoutingTrace) -> list[dict]:
    timer = engine.model.timer
    base = {"source": "measured", "hardware": _hardware(world, opts.threads_per_rank), "policy": policy,
            "model": trace.model.name, "workload": trace.provenance.get("workload", opts.workload),
            "ep": world, "step": step, "micro_batch": -1, "layer": -1, "rank": rank}
    expert_tokens = timer.tokens.get(("forward", "expert_compute"), 0)
    rows = []
    for (phase, component), seconds in sorted(timer.seconds.items()):
        tokens = expert_tokens if component in ("expert_compute", "step_total") else 0
        rows.append({**base, "phase": phase, "component": component, "seconds": seconds, "tokens": tokens})
    return rows


def run_plans(rank: int, world: int, groups, opts: RunOptions, trace: RoutingTrace, plans: list, label: str,
              replica_slots: int, dtype: str) -> tuple[list[dict], list[float], dict, np.ndarray]:
    """Train `plans` from the seed; return (metric rows, per-step losses, expert params, dense params)."""
    from relibra.runtime.config import ModelConfig, TrainConfig
    from relibra.runtime.data import TraceData
    from relibra.runtime.engine import Engine

    cfg = ModelConfig.from_preset(trace.model.name, replica_slots=replica_slots, seed=opts.seed, dtype=dtype)
    if cfg.num_layers != trace.num_layers:
        raise ConfigError(f"the trace has {trace.num_layers} layers; model {cfg.shape.name!r} has {cfg.num_layers}")
    data = TraceData(trace, cfg.shape.vocab_size, opts.seed)
    train = TrainConfig(steps=opts.steps, lr=opts.lr, threads_per_rank=opts.threads_per_rank)
    home0 = plans[0].home if plans else static_placement(cfg.num_layers, cfg.num_experts, world)
    engine = Engine(cfg, train, groups.collection(), groups.layout.ranks_per_node, home0)
    rows, losses = [], []
    steps = range(len(plans))
    if rank == 0 and len(plans) > 2:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=f"{label} x{world}", unit="step", file=sys.stderr)
    for s in steps:
        batches = [[data.batch(s, m, rank, cfg.num_layers)] for m in range(trace.num_microbatches)]
        ntok = [data.tokens(s, m) for m in range(trace.num_microbatches)]
        dist.barrier()  # steps start together, as after a global-batch boundary
        out = engine.step(plans[s], batches, ntok, [rank])
        loss = torch.tensor([out["loss"]], dtype=torch.float64)
        dist.all_reduce(loss)
        losses.append(float(loss.item()))
        if s >= opts.warmup_steps:
            rows += _rows(engine, opts, label, s - opts.warmup_steps, rank, world, trace)
    return rows, losses, engine.logical_expert_state("param"), engine.dense_state("param")


def prepare(opts: RunOptions, world: int) -> tuple[RoutingTrace, list, float]:
    """(trace, plans, planner seconds): the same on every rank, so a launcher may compute it once."""
    from relibra.runtime.config import NodeLayout

    layout = NodeLayout(world, opts.nodes)
    trace = load_or_make_trace(opts, world)
    total_steps = opts.steps + opts.warmup_steps
    if trace.num_steps < total_steps:
        raise ConfigError(f"the trace holds {trace.num_steps} steps; asked for {opts.steps} + {opts.warmup_steps} warm-up")
    t0 = time.perf_counter()
    plans = make_plans(trace, opts.policy, opts.policy_params, layout.ranks_per_node, total_steps)
    return trace, plans, time.perf_counter() - t0


def worker(rank: int, world: int, opts: RunOptions, prepared: tuple | None = None) -> dict:
    """Body of one rank. Rank 0 returns {"rows", "losses", "equivalence"}; others return {}.

    prepared: (trace, plans, planner seconds) from prepare(), or None to compute them here.
    """
    torch.set_num_threads(opts.threads_per_rank)
    from relibra.runtime.config import NodeLayout
    from relibra.runtime.groups import build_groups
    from relibra.runtime.plans import static_plan
    from relibra.runtime.verify import gather_experts, gather_list

    layout = NodeLayout(world, opts.nodes)
    groups = build_groups(layout)
    trace, plans, plan_seconds = prepared or prepare(opts, world)
    total_steps = opts.steps + opts.warmup_steps
    replica_slots = max(p.replica_slots for p in plans)
    rows, losses, experts, dense = run_plans(rank, world, groups, opts, trace, plans, opts.policy, replica_slots,
                                             opts.dtype)
    all_rows = gather_list(rows)
    experts_all = gather_experts(experts)
    result = {}
    if opts.check_equivalence:
        static = [static_plan(trace.loads[s], layout.ranks_per_node) for s in range(total_steps)]
        _, s_losses, s_experts, s_dense = run_plans(rank, world, groups, opts, trace, static, "static", 0, opts.dtype)
        s_experts_all = gather_experts(s_experts)
        dense_diff = float(np.abs(dense - s_dense).max())
        dense_diffs = gather_list(dense_diff)
        if rank == 0:
            expert_diff = max(float(np.abs(experts_all[k] - s_experts_all[k]).max()) for k in experts_all)
            loss_diff = max(abs(a - b) for a, b in zip(losses, s_losses))
            result["equivalence"] = {"max_abs_diff": max(expert_diff, max(dense_diffs), loss_diff),
                                     "expert_params": expert_diff, "dense_params": max(dense_diffs),
                                     "loss": loss_diff, "dtype": opts.dtype}
    if rank == 0:
        result.update(rows=[r for part in all_rows for r in part], losses=losses, plan_seconds=plan_seconds,
                      replica_slots=replica_slots,
                      skewness={"plan_mean": float(np.mean([p.skewness().mean() for p in plans])),
                                "static_mean": float(np.mean([static_plan(trace.loads[s], layout.ranks_per_node)
                                                              .skewness().mean() for s in range(total_steps)]))})
    return result


def summarize(rows: list[dict]) -> "pd.DataFrame":
    """Per policy: mean over steps of the slowest rank's seconds per component, plus token skew."""
    import pandas as pd

    df = frame(rows)
    per_rank = df.groupby(["policy", "step", "rank", "component"], as_index=False)[["seconds", "tokens"]].sum()
    slowest = per_rank.groupby(["policy", "step", "component"], as_index=False).agg(
        seconds=("seconds", "max"), mean_seconds=("seconds", "mean"))
    table = slowest.groupby(["policy", "component"], as_index=False)[["seconds", "mean_seconds"]].mean()
    wide = table.pivot(index="policy", columns="component", values="seconds")
    tok = per_rank[per_rank.component == "expert_compute"].groupby(["policy", "step"])["tokens"]
    skew = (tok.max() / tok.mean()).groupby("policy").mean()
    wide["token_skew"] = skew
    return wide


def write_outputs(result: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    frame(result["rows"]).to_csv(os.path.join(out, "metrics.csv"), index=False)
    meta = {k: v for k, v in result.items() if k != "rows"}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(meta, f, indent=2, default=float)


def main(argv: list[str] | None = None) -> int:
    """torchrun entry: every rank runs worker(); rank 0 prints the summary and writes outputs."""
    from relibra.runtime.groups import init_distributed

    opts = parse_args(argv)
    rank, world = init_distributed()
    try:
        result = worker(rank, world, opts)
    finally:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        return report(result, opts)
    return 0


def report(result: dict, opts: RunOptions) -> int:
    """Print the summary table (and the equivalence line); write outputs. Returns the exit code."""
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summarize(result["rows"]).to_string(float_format=lambda x: f"{x:.4f}"))
    print(f"losses: {' '.join(f'{x:.5f}' for x in result['losses'])}")
    print(f"skewness (max/mean tokens per rank, plan): {result['skewness']['plan_mean']:.3f}; "
          f"static: {result['skewness']['static_mean']:.3f}; replica slots: {result['replica_slots']}")
    if opts.out:
        write_outputs(result, opts.out)
        print(f"wrote {opts.out}/metrics.csv and summary.json")
    if opts.check_equivalence:
        eq = result["equivalence"]
        tol = 1e-9 if opts.dtype == "float64" else 1e-5
        if eq["max_abs_diff"] <= tol:
            print(f"equivalence ok: max abs diff {eq['max_abs_diff']:.3e} ({opts.dtype}, tolerance {tol:g})")
        else:
            print(f"equivalence FAILED: max abs diff {eq['max_abs_diff']:.3e} > {tol:g} ({opts.dtype}; "
                  f"experts {eq['expert_params']:.3e}, dense {eq['dense_params']:.3e}, loss {eq['loss']:.3e})")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
