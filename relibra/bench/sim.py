"""The simulator benchmark behind `relibra bench sim`: seconds to cost one planned step."""

from __future__ import annotations

import time

import numpy as np

from relibra.cluster import resolve_topology
from relibra.costs import cost_plan
from relibra.policies import get_policy
from relibra.trace import static_placement
from relibra.workloads import generate_trace


def benchmark_sim(model: str = "qwen3-235b-a22b", ep: int = 32, policy: str = "relibra", cluster: str = "paper",
                  seed: int = 0, workload: str = "mixed", micro_batches: int = 32, repeats: int = 3) -> dict:
    """Seconds to simulate (cost, with the tidy rows) one step of `model` at EP `ep` for one policy.

    Generates a one-step synthetic trace, plans it once (timed apart: planning is excluded from the
    target), then times cost_plan + rows `repeats` times: sim_s is the median wall time, sim_cpu_s
    the median CPU time of this process (what an unloaded machine shows). Target: one step of
    deepseek-v3 at EP256, one policy, within 5 s on one core.
    """
    topo = resolve_topology(cluster)
    topo.ep_layout(ep)
    t0 = time.perf_counter()
    trace = generate_trace(model, workload, ep, steps=1, seed=seed, micro_batches=micro_batches)
    trace_s = time.perf_counter() - t0
    static = static_placement(trace.model.num_layers, trace.model.num_experts, ep)
    plan = get_policy(policy).plan(trace, 0, topo, static)
    plan_s = plan.info.plan_seconds
    t0 = time.perf_counter()
    plan.validate(trace.loads[0])
    validate_s = time.perf_counter() - t0
    times, cpu_times = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        cost = cost_plan(plan, trace.model, topo, prev_home=static, planner_s=plan_s,
                         critical_planner_s=plan.info.plan_cpu_seconds,
                         seq_lens=None if getattr(trace, "seq_lens", None) is None else trace.seq_lens[0])
        rows = cost.rows(source="simulated", hardware=topo.name, policy=policy, model=trace.model.name,
                  workload=workload, ep=ep, step=0)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    return {"model": trace.model.name, "ep": ep, "policy": policy, "cluster": topo.name,
            "micro_batches": trace.num_microbatches, "layers": trace.num_layers,
            "sim_s": float(np.median(times)), "sim_s_min": float(np.min(times)),
            "sim_cpu_s": float(np.median(cpu_times)), "target_s": 5.0,
            "validate_s": validate_s, "plan_s": plan_s, "trace_s": trace_s,
            "simulated_step_s": cost.step_seconds, "tokens_per_s": cost.tokens / cost.step_seconds,
            "frame_rows": int(len(rows["seconds"]))}
