"""Calibration: fitting the GEMM curve to measured times, and the measured planner-time table.

- measure_expert_gemm / fit_gemm_efficiency: time a SwiGLU expert at several token counts and fit
  Topology.matmul_tflops and gemm_half_tokens (flops.gemm_seconds) by non-negative least squares.
- measure_planner_table / planner_seconds_per_cell: the seconds a run-time planner (LLEP; any policy
  whose plans set "planner_on_critical_path") takes per (micro-batch, layer) at each EP size,
  measured on one machine and stored in data/planner_seconds.json; the cost model interpolates it.
"""

from __future__ import annotations

import functools
import json
import platform
from pathlib import Path

import numpy as np

from relibra.errors import ConfigError

PLANNER_TABLE = Path(__file__).resolve().parents[2] / "data" / "planner_seconds.json"


def fit_gemm_efficiency(tokens, seconds, flops_per_token: float) -> dict:
    """Fit the rate and half-saturation point of flops.gemm_seconds to measured GEMM times.

    tokens: rows of each measured GEMM (one expert's tokens); seconds: its measured time;
    flops_per_token: FLOPs per row (2 * expert_params for a SwiGLU expert forward).
    gemm_seconds makes seconds = a * tokens + b with a = flops_per_token / rate and b = a * half_tokens,
    so a non-negative least-squares line gives both. Returns {"matmul_tflops", "gemm_half_tokens",
    "rmse_s", "max_rel_err"}; pass the first two to Topology.with_changes.
    """
    from scipy.optimize import nnls

    t = np.asarray(tokens, dtype=np.float64).ravel()
    s = np.asarray(seconds, dtype=np.float64).ravel()
    if t.shape != s.shape or t.size < 2:
        raise ConfigError(f"fit_gemm_efficiency: need at least two (tokens, seconds) pairs of equal length, "
                          f"got {t.size} tokens and {s.size} seconds")
    if len(np.unique(t)) < 2:
        raise ConfigError("fit_gemm_efficiency: need at least two distinct token counts")
    if (t <= 0).any() or (s <= 0).any() or not np.isfinite(s).all():
        raise ConfigError("fit_gemm_efficiency: token counts and seconds must be positive and finite")
    if flops_per_token <= 0:
        raise ConfigError(f"fit_gemm_efficiency: flops_per_token must be positive, got {flops_per_token}")
    # Relative errors matter (times span orders of magnitude): weight each row by 1 / seconds.
    w = 1.0 / s
    (a, b), _ = nnls(np.stack([t * w, w], axis=1), s * w)
    if a <= 0:
        raise ConfigError("fit_gemm_efficiency: time does not grow with tokens; the measurements do not fit the curve")
    pred = a * t + b
    return {"matmul_tflops": flops_per_token / a / 1e12, "gemm_half_tokens": max(b / a, 1e-9),
            "rmse_s": float(np.sqrt(np.mean((pred - s) ** 2))), "max_rel_err": float(np.max(np.abs(pred - s) / s))}


def measure_expert_gemm(hidden: int, ffn: int, token_counts, device: str = "cpu", dtype: str = "float32",
                        repeats: int = 5, threads: int | None = 1) -> dict:
    """Time one SwiGLU expert forward (x @ W_gate, x @ W_up, silu * , @ W_down) at several token counts.

    Returns {"tokens": [...], "seconds": [...] (median of `repeats`), "flops_per_token": 6 * hidden * ffn,
    "device", "dtype", "threads"}; feed it to fit_gemm_efficiency to calibrate a topology.
    """
    import time

    import torch

    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cpu").manual_seed(0)
    w_gate = torch.randn(hidden, ffn, generator=gen).to(device=device, dtype=dt)
    w_up = torch.randn(hidden, ffn, generator=gen).to(device=device, dtype=dt)
    w_down = torch.randn(ffn, hidden, generator=gen).to(device=device, dtype=dt)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    seconds = []
    for n in token_counts:
        x = torch.randn(int(n), hidden, generator=gen).to(device=device, dtype=dt)
        times = []
        for i in range(repeats + 1):
            sync()
            t0 = time.perf_counter()
            y = (torch.nn.functional.silu(x @ w_gate) * (x @ w_up)) @ w_down
            sync()
            if i:  # the first run warms caches and allocators
                times.append(time.perf_counter() - t0)
        del y
        seconds.append(float(np.median(times)))
    return {"tokens": [int(n) for n in token_counts], "seconds": seconds, "flops_per_token": 6 * hidden * ffn,
            "device": device, "dtype": dtype, "threads": threads}


def machine_description() -> str:
    """CPU model, logical CPUs and OS of this machine, for the record of a measurement."""
    import os

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


@functools.lru_cache(maxsize=4)
def load_planner_table(path: str | None = None) -> dict:
    """The measured planner table (measure_planner_table's output) as stored in JSON; {} if absent."""
    p = Path(path) if path else PLANNER_TABLE
    if not p.exists():
        return {}
    with open(p) as f:
        table = json.load(f)
    if not isinstance(table, dict) or not isinstance(table.get("policies", {}), dict):
        raise ConfigError(f"{p}: not a planner table (expected {{'policies': {{name: {{'ep': [...], ...}}}}}})")
    return table


def planner_seconds_per_cell(policy: str, ep: int, path: str | None = None) -> float | None:
    """A run-time planner's seconds per (micro-batch, layer) at EP `ep`, interpolated linearly in
    (log EP, log seconds) between the measured EP sizes and held at the end values beyond them.
    None when the table has no row for `policy`."""
    entry = load_planner_table(path).get("policies", {}).get(policy)
    if entry is None:
        return None
    eps = np.asarray(entry["ep"], dtype=np.float64)
    sec = np.asarray(entry["seconds_per_cell"], dtype=np.float64)
    if eps.ndim != 1 or eps.shape != sec.shape or len(eps) == 0 or (sec <= 0).any() or (np.diff(eps) <= 0).any():
        raise ConfigError(f"planner table: row {policy!r} needs increasing 'ep' and positive 'seconds_per_cell' "
                          f"of equal length")
    return float(np.exp(np.interp(np.log(ep), np.log(eps), np.log(sec))))


def runtime_cpu_seconds(info: dict) -> float:
    """CPU seconds of the part of a plan made at run time: plan.info "runtime_planner_cpu_seconds"
    when the policy records it (lplb+: the LP solves, not its once-per-step EPLB reordering), else the
    whole plan's "plan_cpu_seconds" (llep plans everything at run time)."""
    return float(info.get("runtime_planner_cpu_seconds", info["plan_cpu_seconds"]))


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
    Returns the JSON-ready table {"machine", "model", "workload", ..., "policies": {name: {"ep",
    "experts", "seconds_per_cell", "seconds_per_cell_single"}}}.
    """
    import dataclasses

    from relibra.progress import progress as tqdm

    from relibra.cluster import get_model, get_topology
    from relibra.policies import get_policy
    from relibra.trace import RoutingTrace
    from relibra.workloads import generate_trace

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
            batched = [runtime_cpu_seconds(policy.plan(trace, 0, topo).info) for _ in range(repeats)]
            single = []
            for mb, layer in picks:
                loads = np.ascontiguousarray(trace.loads[:, mb:mb + 1, layer:layer + 1])
                cell = RoutingTrace(loads=loads, model=one, ep=ep,
                                    tokens_per_microbatch=int(loads[0, 0, 0].sum()) // one.top_k)
                single.append(float(np.median([runtime_cpu_seconds(policy.plan(cell, 0, topo).info)
                                               for _ in range(repeats)])))
            row = out[name]
            row["ep"].append(int(ep))
            row["experts"].append(int(experts))
            row["seconds_per_cell"].append(float(np.median(batched)) / (micro_batches * layers))
            row["seconds_per_cell_single"].append(float(np.median(single)) if single else float("nan"))
            bar.update(1)
    bar.close()
    return {"machine": machine_description(), "python": platform.python_version(), "model": model,
            "workload": workload, "micro_batches": micro_batches, "layers": layers, "repeats": repeats,
            "seed": seed, "policies": out}

def main(argv=None) -> int:
    """`python -m relibra.costs.calibration --planner-table [--out data/planner_seconds.json]`."""
    import argparse

    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m relibra.costs.calibration",
                                description="Measure the run-time planner table the cost model charges.")
    p.add_argument("--planner-table", action="store_true", required=True)
    p.add_argument("--policies", default="llep,lplb+", help="comma-separated run-time planners to time")
    p.add_argument("--eps", default="8,16,32,64,128,256")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(PLANNER_TABLE))
    args = p.parse_args(argv)
    table = measure_planner_table(policies=tuple(args.policies.split(",")),
                                  eps=tuple(int(x) for x in args.eps.split(",")), repeats=args.repeats)
    table["note"] = ("process CPU seconds on this machine, which other processes may share; charged: "
                     "seconds_per_cell (the step's cells planned together)")
    with open(args.out, "w") as f:
        json.dump(table, f, indent=1)
    print(json.dumps(table["policies"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
