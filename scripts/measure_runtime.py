"""The measured runtime comparison (docs/runtime.md), in one command, for an idle machine:

    .venv/bin/python scripts/measure_runtime.py [--calibrate] [--repeats 2] [--out data/runtime_measured.json]

1. (--calibrate) `relibra calibrate --model moe-cpu --world 2 --out data/cpu_gloo_fit.json`: the fitted CPU
   preset from micro-benchmarks only (expert GEMM, attention block, gloo all-to-all and point-to-point, AdamW).
2. `relibra run --nproc 2 --nodes 1 --model moe-cpu --policies megatron,relibra,balanced,eplb+ --json`
   (one rank per core: the speed-up measurement) and
   `relibra run --nproc 2 --nodes 2 --model moe-cpu --policies megatron,relibra --json` (2 nodes x 1:
   relibra may only reorder), each `--repeats` times.
Every command runs in its own process, as a user would type it; its JSON, wall seconds and the machine's
1-minute load average before and after are written to --out with the machine and date, so the numbers can
be told apart from runs on a loaded machine. Nothing here tunes anything: it only runs and records.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

COMMANDS = [
    ["run", "--nproc", "2", "--nodes", "1", "--model", "moe-cpu", "--policies", "megatron,relibra", "--steps", "20",
     "--json"],
    ["run", "--nproc", "2", "--nodes", "2", "--model", "moe-cpu", "--policies", "megatron,relibra", "--steps", "20",
     "--json"],
]
CALIBRATE = ["calibrate", "--model", "moe-cpu", "--world", "2", "--out", "data/cpu_gloo_fit.json"]


def relibra(args: list[str]) -> tuple[dict | None, float, str]:
    """Run `relibra ARGS` in a fresh process: (the JSON object it printed or None, wall seconds, stderr tail)."""
    cmd = [sys.executable, "-c", "import sys; from relibra.cli import main; sys.exit(main(sys.argv[1:]))", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"error: relibra {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
    text = proc.stdout.strip()
    start = text.find("{")
    return (json.loads(text[start:]) if start >= 0 else None), seconds, proc.stderr.strip()[-300:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="scripts/measure_runtime.py")
    p.add_argument("--calibrate", action="store_true", help="refit data/cpu_gloo_fit.json first")
    p.add_argument("--repeats", type=int, default=3, help="launches of each run command (default 3)")
    p.add_argument("--out", default="data/runtime_measured.json")
    args = p.parse_args(argv)
    if args.repeats <= 0:
        print(f"error: --repeats must be positive, got {args.repeats}", file=sys.stderr)
        return 2
    from tqdm.auto import tqdm

    import torch

    record = {"machine": {"cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                          "processor": platform.processor() or platform.machine(), "platform": platform.platform(),
                          "node": platform.node(), "torch": torch.__version__, "python": platform.python_version()},
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "runs": []}
    # the layouts alternate launch by launch, so a change in the machine's load reaches both
    todo = ([CALIBRATE] if args.calibrate else []) + [c for _ in range(args.repeats) for c in COMMANDS]
    for cmd in tqdm(todo, desc="measured runtime", unit="command"):
        load_before = os.getloadavg()[0]
        out, seconds, _ = relibra(cmd)
        entry = {"command": "relibra " + " ".join(cmd), "wall_s": seconds,
                 "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
        if cmd is not CALIBRATE:
            entry["results"] = out["results"]
        record["runs"].append(entry)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, default=float)
    os.replace(tmp, args.out)
    for run in record["runs"]:
        for r in run.get("results", []):
            cpu = "/".join(f"{c:.3f}" for c in r["cpu_s_per_rank"])
            line = (f"{r['nodes']}x{r['ranks_per_node']} {r['policy']:9s} median {r['step_s_median']:.3f} s "
                    f"[{r['step_s_min']:.3f}, {r['step_s_max']:.3f}] sim {r['sim_step_s']:.3f} s cpu/rank {cpu} s "
                    f"load {run['load_average_1min'][0]:.1f}-{run['load_average_1min'][1]:.1f}")
            if r["policy"] != "megatron" and r.get("speedup_ci_low") is not None:
                line += (f" | x{r['speedup_vs_megatron']:.3f} [{r['speedup_ci_low']:.3f}, {r['speedup_ci_high']:.3f}] "
                         f"sim x{r['sim_speedup_vs_megatron']:.3f} cpu x{r['cpu_speedup_vs_megatron']:.3f} "
                         f"[{r['cpu_speedup_ci_low']:.3f}, {r['cpu_speedup_ci_high']:.3f}]")
            print(line + ("  OVERSUBSCRIBED" if r["oversubscribed"] else ""))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
