"""Notebook 08: the real runtime (relibra.runtime, gloo on this CPU or measured runs read from GPU
nodes) next to the simulator, per policy and component."""

from __future__ import annotations

import os

import pandas as pd

from relibra.cluster import get_topology
from relibra.errors import ConfigError
from relibra.experiments.config import Config


RUNTIME_COMPONENTS = {  # comparison label -> metric components summed (forward + backward)
    "expert compute": ("expert_compute",),
    "all-to-all (dispatch + combine)": ("dispatch", "combine"),
    "whole step": ("step_total",),
}


def runtime_options(cfg: Config, policy: str):
    """relibra.runtime RunOptions of notebook 08 for `policy` at the profile's runtime sizes."""
    from relibra.runtime.options import RunOptions

    s = cfg.sizes
    nodes = int(cfg.extra.get("nodes") or s.runtime_nodes)
    return RunOptions(nodes=nodes, policy=policy, steps=int(cfg.extra.get("runtime_steps") or s.runtime_steps),
                      model=s.runtime_model, workload=s.runtime_workload, micro_batches=s.runtime_micro_batches,
                      tokens_per_rank=s.runtime_tokens_per_rank, seed=cfg.seed, threads_per_rank=1,
                      policy_params={}, warmup_steps=1 if s.runtime_steps > 1 else 0)


def _per_step_components(metrics: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Seconds per (keys..., step, rank, label) from metric rows, labels of RUNTIME_COMPONENTS."""
    frames = []
    for label, comps in RUNTIME_COMPONENTS.items():
        d = metrics[metrics["component"].isin(comps)]
        g = d.groupby(keys + ["step", "rank"], as_index=False)["seconds"].sum()
        g["component"] = label
        frames.append(g)
    return pd.concat(frames, ignore_index=True)


def runtime_worker(rank: int, world: int, options: list) -> list[dict]:
    """One rank of notebook 08's launch: train every policy of `options` (a list of RunOptions, one per
    policy, same data) in turn, in one process group, so megatron-core starts once per launch.

    Follows relibra.runtime.train.worker (same trace, plans and engine); returns, on rank 0, every
    rank's metric rows (relibra.metrics schema, source "measured")."""
    import torch

    from relibra.runtime.config import NodeLayout
    from relibra.runtime.groups import build_groups
    from relibra.runtime.train import load_or_make_trace, make_plans, run_plans
    from relibra.runtime.verify import gather_list

    torch.set_num_threads(options[0].threads_per_rank)
    layout = NodeLayout(world, options[0].nodes)
    groups = build_groups(layout)
    rows = []
    for opts in options:
        trace = load_or_make_trace(opts, world)
        plans = make_plans(trace, opts.policy, opts.policy_params, layout.ranks_per_node, opts.steps + opts.warmup_steps)
        slots = max(p.replica_slots for p in plans)
        policy_rows, *_ = run_plans(rank, world, groups, opts, trace, plans, opts.policy, slots, opts.dtype)
        rows += policy_rows
    everyone = gather_list(rows)
    return [r for part in everyone for r in part] if rank == 0 else []


def measured_runtime(cfg: Config) -> tuple[pd.DataFrame, str]:
    """Run (cpu profiles) or read (gpu profile) the runtime for every policy of the config.

    Returns (metrics rows in relibra.metrics.METRIC_COLUMNS plus `repeat`, hardware label). Runs go
    through relibra.runtime.launch (gloo, loopback, 1 torch thread per rank), `runtime_repeats` times
    per policy; the gpu profile reads every metrics.csv under cfg.measured_dir instead (written by
    `torchrun ... -m relibra.runtime.train --out DIR` on GPU nodes, see docs/notebooks.md).
    """
    from relibra.metrics import frame

    if cfg.profile == "gpu":
        if cfg.measured_dir is None or not cfg.measured_dir.exists():
            raise ConfigError(f"gpu profile: no measured runs in {cfg.measured_dir}; run the GPU script of "
                              "docs/notebooks.md first, or pass measured_dir")
        files = sorted(cfg.measured_dir.rglob("metrics.csv"))
        if not files:
            raise ConfigError(f"gpu profile: {cfg.measured_dir} holds no metrics.csv")
        parts = []
        for i, f in enumerate(files):
            d = pd.read_csv(f)
            d["repeat"] = i
            parts.append(d)
        metrics = pd.concat(parts, ignore_index=True)
        return metrics, str(metrics["hardware"].iloc[0])
    from tqdm.auto import tqdm

    from relibra.runtime.launch import launch

    nproc = int(cfg.extra.get("nproc") or cfg.sizes.runtime_nproc)
    parts = []
    options = [runtime_options(cfg, p) for p in cfg.policies]
    load_before = os.getloadavg()[0]  # other work on the machine inflates wall-clock times: say so
    for repeat in tqdm(range(cfg.sizes.runtime_repeats), desc="runtime launches", unit="launch"):
        rows = launch(runtime_worker, nproc, options, threads_per_rank=1)
        d = frame(rows)
        d["repeat"] = repeat
        parts.append(d)
    metrics = pd.concat(parts, ignore_index=True)
    load = max(load_before, os.getloadavg()[0])
    return metrics, f"{metrics['hardware'].iloc[0]}; 1-min load average up to {load:.1f}"


def runtime_comparison(cfg: Config) -> dict:
    """Measured runtime next to the simulator, per policy and component (seconds per training step).

    measured: the runtime's rows; comparison: one row per (policy, component, source) with the mean,
    min and max over repeats and steps of the slowest rank's seconds (measured) or the simulator's
    seconds (simulated on the cpu-gloo preset, the same trace and plans, one value per step) and
    measured_mean_rank (the mean rank, measured). The simulator's expert compute sums each (micro-batch,
    layer)'s slowest GPU, the runtime's the slowest rank's total: the first is >= the second.
    """
    from relibra.runtime.train import load_or_make_trace
    from relibra.sim import simulate

    measured, hardware = measured_runtime(cfg)
    nproc = int(measured["ep"].iloc[0])
    opts = runtime_options(cfg, cfg.policies[0])
    trace = load_or_make_trace(opts, nproc)
    steps = list(range(opts.warmup_steps, trace.num_steps))
    res = simulate(trace, "cpu-gloo", list(cfg.policies), steps=steps, progress=False, references=False,
                   warmup=False)
    sim = res.frame.copy()
    sim["step"] = sim["step"] - opts.warmup_steps

    per_rank = _per_step_components(measured, ["policy", "repeat"])
    slowest = per_rank.groupby(["policy", "repeat", "step", "component"], as_index=False)["seconds"].agg(
        seconds="max", mean_rank="mean")
    meas = slowest.groupby(["policy", "component"], as_index=False).agg(
        seconds=("seconds", "mean"), seconds_min=("seconds", "min"), seconds_max=("seconds", "max"),
        measured_mean_rank=("mean_rank", "mean"), samples=("seconds", "count"))
    meas["source"] = "measured"
    sim_steps = _per_step_components(sim.assign(repeat=0), ["policy", "repeat"])
    sim_steps = sim_steps[sim_steps["rank"] == -1]
    simd = sim_steps.groupby(["policy", "component"], as_index=False).agg(
        seconds=("seconds", "mean"), seconds_min=("seconds", "min"), seconds_max=("seconds", "max"),
        samples=("seconds", "count"))
    simd["source"] = "simulated"
    comparison = pd.concat([meas, simd], ignore_index=True)
    topo = get_topology("cpu-gloo")
    label = (f"measured ({hardware}) vs simulated (cpu-gloo cluster preset, {topo.num_nodes} x {topo.gpus_per_node}) | "
             f"model {trace.model.name}, EP {nproc}, {trace.num_microbatches} micro-batches x {len(steps)} steps, "
             f"{cfg.sizes.runtime_repeats if cfg.profile != 'gpu' else 'all'} repeat(s), seed {cfg.seed}")
    return {"measured": measured, "simulated": sim, "comparison": comparison, "hardware": hardware, "label": label}
