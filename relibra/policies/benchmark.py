"""The planner benchmark behind `relibra bench planner`, and a cheap random skewed trace for
property tests of the policies.

Figures are wall seconds and process CPU seconds (what one core spent, whatever else the machine
runs); no timed unit test asserts them.
"""

from __future__ import annotations

import numpy as np

from relibra.cluster import ModelShape, get_model
from relibra.trace import RoutingTrace


def random_skewed_trace(model: str | ModelShape, ep: int, steps: int = 1, micro_batches: int = 4,
                        tokens_per_rank: int = 256, seed: int = 0, skew: float = 1.0,
                        shift: float = 0.6) -> RoutingTrace:
    """A RoutingTrace with skewed, shifting expert popularity (not a model of any real workload).

    Per (step, layer) a Zipf-like popularity over a random expert order (exponent `skew`); each
    micro-batch multiplies it by log-normal noise of scale `shift`, so hot experts move between
    micro-batches; each src rank draws tokens_per_rank * top_k expert slots from it.
    """
    shape = get_model(model) if isinstance(model, str) else model
    rng = np.random.default_rng(seed)
    e, l, k = shape.num_experts, shape.num_layers, shape.top_k
    ranks = rng.permuted(np.broadcast_to(np.arange(1, e + 1, dtype=np.float64), (steps, l, e)), axis=2)
    base = ranks ** (-skew)  # [S, L, E]
    noise = rng.lognormal(0.0, shift, size=(steps, micro_batches, l, e))
    pop = base[:, None] * noise
    # a per-src tilt so that sources differ (locality for the communication term)
    tilt = rng.lognormal(0.0, 0.3, size=(steps, micro_batches, l, ep, e))
    p = pop[:, :, :, None, :] * tilt
    p /= p.sum(axis=-1, keepdims=True)
    loads = rng.multinomial(tokens_per_rank * k, p).astype(np.int32)
    return RoutingTrace(loads=loads, model=shape, ep=ep, tokens_per_microbatch=tokens_per_rank * ep,
                        provenance={"generator": "relibra.policies.benchmark.random_skewed_trace", "seed": seed,
                                    "skew": skew, "shift": shift})


def benchmark_trace(model: str, ep: int, seed: int = 0, steps: int = 2) -> RoutingTrace:
    """The paper-scale synthetic trace (relibra.workloads, `mixed` workload) the benchmark plans."""
    from relibra.workloads import generate_trace

    return generate_trace(model, "mixed", ep, steps, seed=seed)


def benchmark_planner(model: str, ep: int, seed: int = 0, policies=("relibra", "eplb"), cluster: str = "paper",
                      trace: RoutingTrace | None = None) -> list[dict]:
    """Plan the last step of a trace with each policy on `cluster` (preset or spec); one row per policy.

    Rows: policy, model, ep, micro_batches, layers, experts, step_plan_s (whole step, wall seconds)
    and step_plan_cpu_s (process CPU seconds: what one core spent, whatever else the machine runs),
    replication_us_per_microbatch_layer and replication_cpu_us_per_microbatch_layer (relibra: the
    replication part; eplb and kin: the EPLB rebalance; else the whole plan; amortized over the
    step's micro_batches x layers cells), reorder_s / reorder_cpu_s, flow_s / flow_cpu_s (turning
    replica token counts into the per-source replica_flow, whose [M, L, ep, ep, R] array alone is
    about 1 GB at deepseek-v3 EP256; 0 for policies that do not record it), mean_skewness,
    mean_gap_to_bound (relibra.bounds, reference "policy"; computed after the planner's clock stops),
    trace (where the loads came from).
    """
    from relibra.bounds import gap_to_bound
    from relibra.cluster import resolve_topology
    from relibra.policies import get_policy

    if trace is None:
        trace = benchmark_trace(model, ep, seed)
    step = trace.num_steps - 1
    topology = resolve_topology(cluster)
    cells = trace.num_microbatches * trace.num_layers
    rows = []
    for name in policies:
        policy = get_policy(name)
        plan = policy.plan(trace, step, topology)
        info = plan.info
        wall, cpu = info["plan_seconds"], info["plan_cpu_seconds"]
        if "replication_seconds" in info:
            per_cell, per_cell_cpu = info["replication_seconds"], info["replication_cpu_seconds"]
        elif "rebalance_seconds" in info:
            per_cell, per_cell_cpu = info["rebalance_seconds"], info["rebalance_cpu_seconds"]
        else:
            per_cell, per_cell_cpu = wall, cpu
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
            "reorder_s": info.get("reorder_seconds", 0.0),
            "reorder_cpu_s": info.get("reorder_cpu_seconds", 0.0),
            "flow_s": info.get("flow_seconds", 0.0),
            "flow_cpu_s": info.get("flow_cpu_seconds", 0.0),
            "mean_skewness": float(plan.skewness().mean()),
            "mean_gap_to_bound": float(gap_to_bound(plan).mean()),
            "trace": trace.provenance.get("generator", "unknown"),
        })
    return rows
