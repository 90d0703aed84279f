"""The planner benchmark behind `relibra bench planner`: seconds, peak memory and plan size of each
policy's whole-step plan, and the validator's seconds.

Figures are wall seconds and process CPU seconds (what one core spent, whatever else the machine
runs) from an untraced run, and the peak traced memory (tracemalloc, numpy's arrays included) of a
second, traced run of the same plan; no timed unit test asserts them.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np

from relibra.bounds import gap_to_bound
from relibra.cluster import resolve_topology
from relibra.plan import StepPlan
from relibra.policies import get_policy
from relibra.policies.relibra import ReLibraInfo
from relibra.trace import RoutingTrace
from relibra.workloads import WorkloadConfig, generate_trace

MB = 1e6


def benchmark_trace(model: str, ep: int, seed: int = 0, steps: int = 2, layout: str | None = None,
                    micro_batches: int | None = None) -> RoutingTrace:
    """The paper-scale synthetic trace (relibra.workloads, `mixed` workload) the benchmark plans.

    layout: a batch layout (relibra.workloads.BATCH_LAYOUTS), None = the generator's default;
    micro_batches: per step, None = the layout's own count (generate_trace)."""
    config = None if layout is None else WorkloadConfig(batch_layout=layout)
    return generate_trace(model, "mixed", ep, steps, seed=seed, micro_batches=micro_batches, config=config)


def benchmark_planner(model: str, ep: int, seed: int = 0, policies=("relibra", "eplb"), cluster: str = "paper",
                      trace: RoutingTrace | None = None, layout: str | None = None,
                      micro_batches: int | None = None) -> list[dict]:
    """Plan the last step of a trace with each policy on `cluster` (preset or spec); one row per policy.

    Rows: policy, model, ep, micro_batches, layers, experts, step_plan_s (whole step, wall seconds)
    and step_plan_cpu_s (process CPU seconds: what one core spent, whatever else the machine runs),
    replication_us_per_microbatch_layer and replication_cpu_us_per_microbatch_layer (relibra: the
    replication part; eplb and kin: the EPLB rebalance; else the whole plan; amortized over the
    step's micro_batches x layers cells), reorder_s / reorder_cpu_s, flow_s / flow_cpu_s (turning
    replica token counts into each replica's run of tokens; 0 for policies that do not record it),
    peak_MB (peak traced memory while planning, a second run), plan_MB (the arrays the plan holds
    besides the trace's loads it shares), validate_s / validate_cpu_s (StepPlan.validate against
    the trace's loads), mean_skewness,
    mean_gap_to_bound (relibra.bounds, reference "policy"; computed after the planner's clock stops),
    trace (where the loads came from). Without `trace`, benchmark_trace(model, ep, seed, layout=layout,
    micro_batches=micro_batches) is planned.
    """
    topology = resolve_topology(cluster)
    topology.ep_layout(ep if trace is None else trace.ep)  # an EP the cluster cannot hold fails before any work
    if trace is None:
        trace = benchmark_trace(model, ep, seed, layout=layout, micro_batches=micro_batches)
    step = trace.num_steps - 1
    cells = trace.num_microbatches * trace.num_layers
    rows = []
    for name in policies:
        policy = get_policy(name)
        plan = policy.plan(trace, step, topology)
        peak = _peak_bytes(lambda: policy.plan(trace, step, topology))
        t0, c0 = time.perf_counter(), time.process_time()
        plan.validate(trace.loads[step])
        validate_s, validate_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        info = plan.info
        wall, cpu = info.plan_seconds, info.plan_cpu_seconds
        per_cell, per_cell_cpu = info.balancing_seconds
        stages = info if isinstance(info, ReLibraInfo) else ReLibraInfo()  # 0 for policies without those stages
        rows.append({
            "policy": name,
            "model": trace.model.name,
            "ep": trace.ep,
            "micro_batches": trace.num_microbatches,
            "layers": trace.num_layers,
            "experts": trace.num_experts,
            "step_plan_s": wall,
            "step_plan_cpu_s": cpu,
            "replication_us_per_microbatch_layer": per_cell / cells * 1e6,
            "replication_cpu_us_per_microbatch_layer": per_cell_cpu / cells * 1e6,
            "reorder_s": stages.reorder_seconds,
            "reorder_cpu_s": stages.reorder_cpu_seconds,
            "flow_s": stages.flow_seconds,
            "flow_cpu_s": stages.flow_cpu_seconds,
            "peak_MB": peak / MB,
            "plan_MB": plan_bytes(plan, trace.loads) / MB,
            "validate_s": validate_s,
            "validate_cpu_s": validate_cpu_s,
            "mean_skewness": float(plan.skewness().mean()),
            "mean_gap_to_bound": float(gap_to_bound(plan).mean()),
            "trace": trace.provenance.get("generator", "unknown"),
        })
    return rows


def _peak_bytes(work) -> int:
    """Peak bytes traced (Python objects and numpy arrays) while work() runs, above what was held before."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


def plan_bytes(plan: StepPlan, trace_loads: np.ndarray) -> int:
    """Bytes of the arrays a plan holds, not counting loads it shares with the trace."""
    arrays = [plan.home, plan.replica_expert, plan.replica_start, plan.replica_tokens]
    if not np.shares_memory(plan.loads, trace_loads):
        arrays.append(plan.loads)
    return int(sum(a.nbytes for a in arrays))
