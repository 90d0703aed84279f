"""The measured planner-time table the cost model charges run-time planners (LLEP; any policy whose
plans set "planner_on_critical_path"): seconds per (micro-batch, layer) at each EP size, measured on
one machine and stored in data/planner_seconds.json (relibra.costs.calibration reads it).

    python -m relibra.bench.planner_table [--policies llep,lplb+] [--eps 8,16,...] [--out data/planner_seconds.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform

import numpy as np

from relibra.bench.gemm import machine_description
from relibra.bench.records import load_average, utc_now
from relibra.cluster import get_model, get_topology
from relibra.costs.calibration import PLANNER_TABLE, runtime_cpu_seconds
from relibra.paths import write_text
from relibra.policies import get_policy
from relibra.progress import progress as tqdm
from relibra.trace import RoutingTrace
from relibra.workloads import generate_trace


def measure_planner_table(policies=("llep", "lplb+"), eps=(8, 16, 32, 64, 128, 256), model: str = "qwen3-235b-a22b",
                          workload: str = "mixed", micro_batches: int = 4, layers: int = 8, single_cells: int = 4,
                          repeats: int = 3, seed: int = 0, progress: bool = True) -> dict:
    """Time each policy's planner per (micro-batch, layer) at each EP size.

    For each EP size: a generated trace of `model` cut to `layers` layers (experts raised to EP where
    EP exceeds them, as a model with that many experts would need) with `micro_batches`
    micro-batches. Charged figure, "seconds_per_cell": the policy plans the whole step, its cells
    batched as the planner's vectorised code runs them, `repeats` times; the median process CPU
    seconds of the run-time part (runtime_cpu_seconds) over micro_batches x layers. Recorded beside it,
    "seconds_per_cell_single": the median over `single_cells` cells planned one at a time (a
    one-cell trace), which adds this implementation's per-call overhead (for LLEP a Python loop over
    the experts, ~4 ms per call here) that a run-time implementation on the GPU would not pay.
    Returns the JSON-ready table {"machine", "python", "date_utc", "load_average" (at the end), "model", "workload", ..., "policies": {name: {"ep",
    "experts", "seconds_per_cell", "seconds_per_cell_single"}}}.
    """
    base = get_model(model)
    layers = max(1, min(base.num_layers, layers))
    keys = ("ep", "experts", "seconds_per_cell", "seconds_per_cell_single")
    out = {name: {k: [] for k in keys} for name in policies}
    bar = tqdm(total=len(eps) * len(policies), desc="planner table", disable=not progress)
    for ep in eps:
        experts = max(base.num_experts, ep)
        shape = dataclasses.replace(base, name=f"{base.name}-e{experts}-l{layers}", num_layers=layers,
                                    num_experts=experts)
        trace = generate_trace(shape, workload, ep, steps=1, seed=seed, micro_batches=micro_batches)
        one = dataclasses.replace(shape, num_layers=1)
        topo = get_topology("paper")
        topo = topo.with_changes(num_nodes=max(topo.num_nodes, -(-ep // topo.gpus_per_node)))
        picks = [(mb, layer) for mb in range(micro_batches) for layer in range(layers)][:single_cells]
        for name in policies:
            policy = get_policy(name)
            batched = [runtime_cpu_seconds(policy.plan(trace, 0, topo)) for _ in range(repeats)]
            single = []
            for mb, layer in picks:
                loads = np.ascontiguousarray(trace.loads[:, mb:mb + 1, layer:layer + 1])
                cell = RoutingTrace(loads=loads, model=one, ep=ep,
                                    tokens_per_microbatch=int(loads[0, 0, 0].sum()) // one.top_k)
                single.append(float(np.median([runtime_cpu_seconds(policy.plan(cell, 0, topo))
                                               for _ in range(repeats)])))
            row = out[name]
            row["ep"].append(int(ep))
            row["experts"].append(int(experts))
            row["seconds_per_cell"].append(float(np.median(batched)) / (micro_batches * layers))
            row["seconds_per_cell_single"].append(float(np.median(single)) if single else float("nan"))
            bar.update(1)
    bar.close()
    return {"machine": machine_description(), "python": platform.python_version(), "date_utc": utc_now(),
            "load_average": load_average(), "model": model,
            "workload": workload, "micro_batches": micro_batches, "layers": layers, "repeats": repeats,
            "seed": seed, "policies": out}

def main(argv=None) -> int:
    """`python -m relibra.bench.planner_table [--out data/planner_seconds.json]`."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m relibra.bench.planner_table",
                                description="Measure the run-time planner table the cost model charges.")
    p.add_argument("--policies", default="llep,lplb+", help="comma-separated run-time planners to time")
    p.add_argument("--eps", default="8,16,32,64,128,256")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(PLANNER_TABLE))
    args = p.parse_args(argv)
    table = measure_planner_table(policies=tuple(args.policies.split(",")),
                                  eps=tuple(int(x) for x in args.eps.split(",")), repeats=args.repeats)
    table["note"] = ("process CPU seconds on this machine, which other processes may share; charged: "
                     "seconds_per_cell (the step's cells planned together)")
    print(json.dumps(table["policies"]))  # printed first: a failing --out loses nothing
    write_text(args.out, json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
