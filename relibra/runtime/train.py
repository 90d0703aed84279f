"""The training entry point: a policy's plans drive real expert-parallel steps; metrics per step and rank.

Under torchrun (one process per rank, gloo on CPU, NCCL on GPUs):

    torchrun --standalone --nproc-per-node 2 -m relibra.runtime.train --model moe-cpu \
        --policies megatron,relibra --json

or locally through `relibra run` (relibra.runtime.launch). Every rank builds the same trace and the
same plans (planning is deterministic, and replay-driven planning happens after rollout, off the
training step's critical path), then trains each policy in turn from the same seed on the same data:
AdamW over dense parameters and home experts.

Routing: a trace with token-level ids is replayed through megatron's RouterReplay; a trace with loads
only (or a plan with forced uniform routing, `balanced`) gets per-token ids dealt deterministically
from its loads (relibra.runtime.data); with no trace a synthetic skewed trace comes from
relibra.workloads.generate_trace(token_level=True), its experts relabelled hottest first
(RunOptions.expert_order).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import TYPE_CHECKING

import numpy as np

from relibra.errors import ConfigError
from relibra.runtime.options import RunOptions
from relibra.trace import RoutingTrace, static_placement

if TYPE_CHECKING:
    import pandas as pd


# ---- inputs: trace, plans, data (the same on every rank) ------------------------------------------------
def hot_first(trace: RoutingTrace) -> RoutingTrace:
    """The trace with each layer's experts relabelled by total load, hottest first.

    Expert ids of a synthetic trace are arbitrary; under the static contiguous placement this puts the
    hottest experts on the first ranks. loads [S, M, L, ep, E] and token ids are relabelled alike.
    """
    pop = trace.loads.sum(axis=(0, 1, 3), dtype=np.int64)  # [L, E]
    order = np.argsort(-pop, axis=1, kind="stable")  # new id -> old id
    new_of_old = np.argsort(order, axis=1)  # old id -> new id
    loads = np.take_along_axis(trace.loads, order[None, None, :, None, :], axis=-1)
    te = trace.token_experts
    if te is not None:
        layer = np.arange(trace.num_layers)[None, None, None, :, None]
        te = np.where(te >= 0, new_of_old[layer, np.maximum(te, 0)], te).astype(te.dtype)
    return dataclasses.replace(trace, loads=np.ascontiguousarray(loads), token_experts=te,
                               provenance={**trace.provenance, "expert_order": "hot-first"})


def load_or_make_trace(opts: RunOptions, ep: int) -> RoutingTrace:
    """The run's trace: opts.trace (its EP must be `ep`), else a synthetic token-level one."""
    if opts.trace:
        trace = RoutingTrace.load(opts.trace)
        if trace.ep != ep:
            raise ConfigError(f"trace {opts.trace} was recorded at EP {trace.ep}; launch it with --nproc {trace.ep}")
        return trace
    from relibra.workloads import generate_trace

    trace = generate_trace(opts.model, opts.workload, ep=ep, steps=opts.steps + opts.warmup_steps, seed=opts.seed,
                           micro_batches=opts.micro_batches, tokens_per_rank=opts.tokens_per_rank, token_level=True)
    return hot_first(trace) if opts.expert_order == "hot-first" else trace


def runtime_topology(ep: int, gpus_per_node: int):
    """The rates this machine runs at, cut to the run's nodes x ranks: on GPUs the paper's Hopper
    cluster; on CPU the preset fitted here from micro-benchmarks (`cpu-gloo-fit`, data/) when present,
    else the older `cpu-gloo`."""
    import torch

    from relibra.cluster import TOPOLOGY_PRESETS, Topology, get_topology

    if torch.cuda.is_available():
        base = get_topology("paper")
    elif os.environ.get("RELIBRA_CPU_FIT"):  # a fit taken on another machine (scripts/device_check.sh)
        with open(os.environ["RELIBRA_CPU_FIT"]) as f:
            base = Topology(**json.load(f)["preset"])
    else:
        base = get_topology("cpu-gloo-fit" if "cpu-gloo-fit" in TOPOLOGY_PRESETS else "cpu-gloo")
    return base.with_changes(num_nodes=ep // gpus_per_node, gpus_per_node=gpus_per_node)


def policy_params(policy: str, params: dict) -> dict:
    """The subset of `params` that `policy` takes (one --policy-param list serves several policies)."""
    from relibra.policies.base import _REGISTRY, _factory_fields

    if policy not in _REGISTRY:
        from relibra.policies import get_policy

        get_policy(policy)  # raises the ConfigError listing the known names
    known = set(_factory_fields(_REGISTRY[policy]))
    return {k: v for k, v in params.items() if k in known}


def make_plans(trace: RoutingTrace, policy: str, params: dict, gpus_per_node: int, steps: int) -> list:
    """One StepPlan per step, each seeing the previous step's placement (rates: runtime_topology)."""
    from relibra.policies import get_policy

    topology = runtime_topology(trace.ep, gpus_per_node)
    pol = get_policy(policy, **params)
    plans, prev = [], None
    for s in range(steps):
        plan = pol.plan(trace, s, topology, prev)
        plans.append(plan)
        prev = plan.home
    return plans


def data_trace(trace: RoutingTrace, plans: list) -> RoutingTrace:
    """The trace whose tokens a policy trains on: the trace itself, or for plans with forced uniform
    routing (`balanced`) a loads-only trace of the plans' loads (ids dealt from them)."""
    if not any(p.uniform_routing for p in plans):
        return trace
    loads = np.stack([p.loads for p in plans]).astype(trace.loads.dtype)
    return dataclasses.replace(trace, loads=loads, token_experts=None, token_src_rank=None)


@dataclasses.dataclass
class Prepared:
    """One policy's inputs: the trace it trains on, its plans and the planner's seconds."""

    policy: str
    trace: RoutingTrace
    plans: list
    plan_seconds: float


def prepare(opts: RunOptions, world: int) -> list[Prepared]:
    """Trace and plans of every policy: the same on every rank, so a launcher may compute them once."""
    from relibra.cluster import get_model
    from relibra.runtime.config import NodeLayout

    opts.validate()
    layout = NodeLayout(world, opts.nodes)
    if opts.trace is None:
        shape = get_model(opts.model)
        if shape.num_experts % world:
            raise ConfigError(f"{world} ranks do not divide the {shape.num_experts} experts of {opts.model!r}")
    params = {policy: policy_params(policy, opts.policy_params) for policy in opts.policies}  # checked first
    unused = set(opts.policy_params) - {k for p in params.values() for k in p}
    if unused:
        raise ConfigError(f"--policy-param {', '.join(sorted(unused))}: no policy of {','.join(opts.policies)} "
                          "takes it")
    trace = load_or_make_trace(opts, world)
    total_steps = opts.steps + opts.warmup_steps
    if trace.num_steps < total_steps:
        raise ConfigError(f"the trace holds {trace.num_steps} steps; asked for {opts.steps} + {opts.warmup_steps} warm-up")
    out = []
    for policy in opts.policies:
        t0 = time.perf_counter()
        plans = make_plans(trace, policy, params[policy], layout.ranks_per_node, total_steps)
        out.append(Prepared(policy, data_trace(trace, plans), plans, time.perf_counter() - t0))
    return out


# ---- training ---------------------------------------------------------------------------------------------
def _hardware(world: int, threads: int) -> str:
    import torch

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
              replica_slots: int, dtype: str, device: str = "cpu") -> tuple[list[dict], list[float], dict, np.ndarray]:
    """Train `plans` from the seed; return (metric rows, per-step losses, expert params, dense params).

    The first opts.warmup_steps plans are trained but not recorded. A rolled-back migration leaves the
    old placement: the step then runs on it without replicas (one warning line on rank 0), or the run
    stops with the MigrationError when opts.on_migration_failure == "stop".
    """
    import torch
    import torch.distributed as dist

    from relibra.runtime.config import ModelConfig, TrainConfig
    from relibra.runtime.data import TraceData
    from relibra.runtime.engine import Engine
    from relibra.runtime.migration import InjectedFailure

    cfg = ModelConfig.from_preset(trace.model.name, replica_slots=replica_slots, seed=opts.seed, dtype=dtype)
    if cfg.num_layers != trace.num_layers:
        raise ConfigError(f"the trace has {trace.num_layers} layers; model {cfg.shape.name!r} has {cfg.num_layers}")
    data = TraceData(trace, cfg.shape.vocab_size, opts.seed)
    train = TrainConfig(lr=opts.lr)
    home0 = plans[0].home if plans else static_placement(cfg.num_layers, cfg.num_experts, world)
    engine = Engine(cfg, train, groups.collection(), groups.layout.ranks_per_node, home0, device=device)
    failure = InjectedFailure(*opts.inject_migration_failure) if opts.inject_migration_failure else None
    rows, losses = [], []
    steps = range(len(plans))
    if rank == 0 and len(plans) > 2:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=f"{label} x{world}", unit="step", file=sys.stderr, leave=False)
    for s in steps:
        batches = [[data.batch(s, m, rank, cfg.num_layers)] for m in range(trace.num_microbatches)]
        ntok = [data.tokens(s, m) for m in range(trace.num_microbatches)]
        dist.barrier()  # steps start together, as after a global-batch boundary
        out = engine.step(plans[s], batches, ntok, [rank], failure=failure,
                          on_migration_failure=opts.on_migration_failure)
        if out.get("migration_error") and rank == 0:
            print(f"warning: step {s} ({label}): {out['migration_error']}; training goes on on the old placement",
                  file=sys.stderr)
        loss = torch.tensor([out["loss"]], dtype=torch.float64, device=engine.device)
        dist.all_reduce(loss)
        losses.append(float(loss.item()))
        if s >= opts.warmup_steps:
            rows += _rows(engine, opts, label, s - opts.warmup_steps, rank, world, trace)
    return rows, losses, engine.logical_expert_state("param"), engine.dense_state("param")


def worker(rank: int, world: int, opts: RunOptions, prepared: list | None = None, device: str = "cpu") -> dict:
    """Body of one rank: every policy of opts in turn. Rank 0 returns a JSON-able dict
    {"rows", "losses": {policy: [...]}, "plan_seconds", "replica_slots", "equivalence"?}; others {}.

    prepared: prepare()'s list, or None to compute it here.
    """
    import torch

    from relibra.runtime.config import NodeLayout
    from relibra.runtime.groups import build_groups
    from relibra.runtime.plans import static_plan
    from relibra.runtime.verify import gather_arrays, gather_list

    torch.set_num_threads(opts.threads_per_rank)
    layout = NodeLayout(world, opts.nodes)
    groups = build_groups(layout)
    prepared = prepared or prepare(opts, world)
    rows, losses, slots, result = [], {}, {}, {}
    for prep in prepared:
        slots[prep.policy] = max(p.replica_slots for p in prep.plans)
        r, losses[prep.policy], experts, dense = run_plans(rank, world, groups, opts, prep.trace, prep.plans,
                                                           prep.policy, slots[prep.policy], opts.dtype, device)
        rows += r
        if opts.check_equivalence:
            experts_all = gather_arrays(experts)
            steps = len(prep.plans)
            static = [static_plan(prep.trace.loads[s], layout.ranks_per_node) for s in range(steps)]
            _, s_losses, s_experts, s_dense = run_plans(rank, world, groups, dataclasses.replace(
                opts, inject_migration_failure=None), prep.trace, static, "static", 0, opts.dtype, device)
            s_experts_all = gather_arrays(s_experts)
            dense_diffs = gather_list(float(np.abs(dense - s_dense).max()))
            if rank == 0:
                expert_diff = max(float(np.abs(experts_all[k] - s_experts_all[k]).max()) for k in experts_all)
                loss_diff = max(abs(a - b) for a, b in zip(losses[prep.policy], s_losses))
                result.setdefault("equivalence", {})[prep.policy] = {
                    "max_abs_diff": max(expert_diff, max(dense_diffs), loss_diff), "expert_params": expert_diff,
                    "dense_params": max(dense_diffs), "loss": loss_diff, "dtype": opts.dtype}
    all_rows = gather_list(rows)
    if rank == 0:
        result.update(rows=[r for part in all_rows for r in part], losses=losses, replica_slots=slots,
                      plan_seconds={p.policy: p.plan_seconds for p in prepared})
    return result


# ---- results ------------------------------------------------------------------------------------------------
def oversubscribed(world: int, threads_per_rank: int = 1) -> bool:
    """More busy threads than usable cores: wall-clock times then measure the scheduler, not the kit."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return world * threads_per_rank > cores


def per_step_table(rows: list[dict]) -> "pd.DataFrame":
    """Per (policy, step): step_s (slowest rank's step), expert_s (slowest rank's routed-expert region),
    token_skew (max / mean token-expert rows computed per rank) and every component's slowest-rank seconds."""
    import pandas as pd

    df = pd.DataFrame(rows)
    per_rank = df.groupby(["policy", "step", "rank", "component"], as_index=False)[["seconds", "tokens"]].sum()
    wide = per_rank.pivot_table(index=["policy", "step", "rank"], columns="component", values="seconds",
                                aggfunc="sum", fill_value=0.0)
    tok = per_rank[per_rank.component == "expert_compute"].set_index(["policy", "step", "rank"])["tokens"]
    per_step = wide.groupby(["policy", "step"]).max()
    per_step["token_skew"] = (tok.groupby(["policy", "step"]).max() / tok.groupby(["policy", "step"]).mean())
    per_step = per_step.rename(columns={"step_total": "step_s", "expert_compute": "expert_s"})
    return per_step.reset_index()


def simulate_step_seconds(prep: Prepared, warmup: int, ranks_per_node: int, topology=None) -> list[float]:
    """The simulator's step seconds (relibra.costs.cost_plan) for every timed plan of `prep`, on the
    fitted CPU preset (runtime_topology), each step after the previous step's placement. The runtime
    runs each rank's tokens of a micro-batch as one sequence, keeps fp32 gradients and moves replicas in
    line (relibra.runtime.replicas: blocking point-to-point before each layer, nothing hides behind attention)."""
    from relibra.costs import CostParams, cost_plan

    trace = prep.trace
    topology = topology or runtime_topology(trace.ep, ranks_per_node)
    seq = int(trace.loads[0, 0, 0].sum(axis=1).max() // trace.model.top_k)
    params = CostParams(seq_len=max(seq, 1), include_lm_head=True, grad_bytes_per_param=trace.model.bytes_per_param,
                        replica_buffer="layer-shared", overlap_transfers=False)
    out = []
    for s in range(warmup, len(prep.plans)):
        prev = prep.plans[s - 1].home if s > 0 else None
        out.append(cost_plan(prep.plans[s], trace.model, topology, params, prev_home=prev).step_seconds)
    return out


def results(result: dict, opts: RunOptions, prepared: list[Prepared], world: int) -> list[dict]:
    """One JSON-able dict per policy: measured median / min / max step seconds, simulated step seconds,
    expert share of the step, token skew, oversubscription and the plan's skewness."""
    from relibra.runtime.plans import static_plan

    table = per_step_table(result["rows"])
    ranks_per_node = world // opts.nodes
    over = oversubscribed(world, opts.threads_per_rank)
    out = []
    for prep in prepared:
        d = table[table.policy == prep.policy]
        timed = prep.plans[opts.warmup_steps:]
        sim = simulate_step_seconds(prep, opts.warmup_steps, ranks_per_node)
        static = [static_plan(p.loads, ranks_per_node).skewness().mean() for p in timed]
        out.append({
            "policy": prep.policy, "step_s_median": float(d.step_s.median()), "step_s_min": float(d.step_s.min()),
            "step_s_max": float(d.step_s.max()), "sim_step_s": float(np.median(sim)),
            "expert_share": float((d.expert_s / d.step_s).mean()), "token_skew": float(d.token_skew.mean()),
            "plan_skewness": float(np.mean([p.skewness().mean() for p in timed])),
            "static_skewness": float(np.mean(static)),
            "step_s": [float(x) for x in d.step_s], "sim_step_s_per_step": sim,
            "components_s": {c: float(d[c].mean()) for c in d.columns
                             if c not in ("policy", "step", "token_skew", "step_s")},
            "losses": result["losses"][prep.policy], "replica_slots": int(result["replica_slots"][prep.policy]),
            "plan_seconds": float(result["plan_seconds"][prep.policy]),
            "ranks": world, "nodes": opts.nodes, "ranks_per_node": ranks_per_node,
            "threads_per_rank": opts.threads_per_rank, "oversubscribed": over,
            "model": prep.trace.model.name, "warmup_steps": opts.warmup_steps, "steps": opts.steps,
            "hardware": _hardware(world, opts.threads_per_rank),
        })
    if "megatron" in [r["policy"] for r in out]:
        ref = next(r for r in out if r["policy"] == "megatron")
        for r in out:
            r["speedup_vs_megatron"] = ref["step_s_median"] / r["step_s_median"]
            r["sim_speedup_vs_megatron"] = ref["sim_step_s"] / r["sim_step_s"]
    return out


def write_outputs(result: dict, res: list[dict], out: str) -> None:
    from relibra.metrics import frame

    os.makedirs(out, exist_ok=True)
    frame(result["rows"]).to_csv(os.path.join(out, "metrics.csv"), index=False)
    meta = {k: v for k, v in result.items() if k != "rows"}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"results": res, **meta}, f, indent=2, default=float)


def report(result: dict, opts: RunOptions, prepared: list[Prepared], world: int, as_json: bool = False) -> int:
    """Print the results (a table, or one JSON object) and the equivalence lines; write outputs.
    Returns the exit code."""
    res = results(result, opts, prepared, world)
    if opts.out:
        write_outputs(result, res, opts.out)
    if as_json:
        print(json.dumps({"results": res, **({"equivalence": result["equivalence"]} if "equivalence" in result
                                             else {})}, default=float))
    else:
        import pandas as pd

        cols = ["policy", "step_s_median", "step_s_min", "step_s_max", "sim_step_s", "expert_share", "token_skew",
                "plan_skewness", "static_skewness", "replica_slots"]
        table = pd.DataFrame(res)[cols + (["speedup_vs_megatron"] if "speedup_vs_megatron" in res[0] else [])]
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        comps = pd.DataFrame({r["policy"]: r["components_s"] for r in res}).T
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            print(comps.to_string(float_format=lambda x: f"{x:.4f}"))
        for r in res:
            print(f"losses {r['policy']}: {' '.join(f'{x:.5f}' for x in r['losses'])}")
        if res[0]["oversubscribed"]:
            print(f"note: OVERSUBSCRIBED ({world} ranks x {opts.threads_per_rank} threads > cores): times say "
                  "nothing about speed")
        if opts.out:
            print(f"wrote {opts.out}/metrics.csv and summary.json")
    if opts.check_equivalence:
        tol = 1e-9 if opts.dtype == "float64" else 1e-5
        code = 0
        for policy, eq in result["equivalence"].items():
            if eq["max_abs_diff"] <= tol:
                print(f"equivalence ok ({policy}): max abs diff {eq['max_abs_diff']:.3e} ({opts.dtype}, "
                      f"tolerance {tol:g})", file=sys.stderr if as_json else sys.stdout)
            else:
                print(f"equivalence FAILED ({policy}): max abs diff {eq['max_abs_diff']:.3e} > {tol:g} ({opts.dtype}; "
                      f"experts {eq['expert_params']:.3e}, dense {eq['dense_params']:.3e}, loss {eq['loss']:.3e})",
                      file=sys.stderr if as_json else sys.stdout)
                code = 1
        return code
    return 0


def main(argv: list[str] | None = None) -> int:
    """torchrun entry: every rank runs worker(); rank 0 prints the results and writes outputs."""
    import argparse

    import torch.distributed as dist

    from relibra.errors import RelibraError
    from relibra.runtime.groups import init_distributed
    from relibra.runtime.options import add_run_arguments, options_from_args
    from relibra.runtime.quiet import quiet_known_warnings

    quiet_known_warnings()
    p = argparse.ArgumentParser(allow_abbrev=False, prog="relibra.runtime.train")
    add_run_arguments(p)
    args = p.parse_args(argv)
    try:
        opts = options_from_args(args)
    except RelibraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    device = "cpu"
    if torch.cuda.is_available():
        device = "cuda"
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    rank, world = init_distributed(timeout_s=opts.collective_timeout_s)
    try:
        prepared = prepare(opts, world)
        result = worker(rank, world, opts, prepared, device=device)
        code = report(result, opts, prepared, world, as_json=args.json) if rank == 0 else 0
    except RelibraError as exc:
        print(f"error: rank {rank}: {exc}", file=sys.stderr)
        code = 2
    finally:
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
