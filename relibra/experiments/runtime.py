"""Notebook 08: the real runtime (relibra.runtime, gloo on this CPU or measured runs read from GPU
nodes) next to the simulator, per policy and component."""

from __future__ import annotations

import os

import pandas as pd

from relibra.errors import ConfigError
from relibra.experiments.config import Config


RUNTIME_COMPONENTS = {  # comparison label -> metric components summed (forward + backward)
    "expert compute": ("expert_compute",),
    "all-to-all (dispatch + combine)": ("dispatch", "combine"),
    "whole step": ("step_total",),
}


def runtime_options(cfg: Config, policy: str | None = None):
    """relibra.runtime RunOptions of notebook 08 at the profile's runtime sizes: every policy of the
    config (or just `policy`), trained one after another on the same data in one launch."""
    from relibra.runtime.options import RunOptions

    s = cfg.sizes
    nodes = int(cfg.extra.get("nodes") or s.runtime_nodes)
    policies = (policy,) if policy else tuple(cfg.policies)
    steps = int(cfg.extra.get("runtime_steps") or s.runtime_steps)
    return RunOptions(nodes=nodes, policies=policies, steps=steps, model=s.runtime_model, workload=s.runtime_workload,
                      micro_batches=s.runtime_micro_batches, tokens_per_rank=s.runtime_tokens_per_rank,
                      seed=cfg.seed, threads_per_rank=1, policy_params={},
                      warmup_steps=2 if steps >= 5 else (1 if steps > 1 else 0))


def _per_step_components(metrics: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Seconds per (keys..., step, rank, label) from metric rows, labels of RUNTIME_COMPONENTS."""
    frames = []
    for label, comps in RUNTIME_COMPONENTS.items():
        d = metrics[metrics["component"].isin(comps)]
        g = d.groupby(keys + ["step", "rank"], as_index=False)["seconds"].sum()
        g["component"] = label
        frames.append(g)
    return pd.concat(frames, ignore_index=True)


def runtime_worker(rank: int, world: int, options) -> dict:
    """One rank of notebook 08's launch: relibra.runtime.train.worker itself (every policy of `options`,
    a RunOptions or a list of single-policy RunOptions, trained in turn on the same data in one process
    group, so megatron-core starts once per launch). Rank 0 returns the worker's JSON-able result."""
    from relibra.runtime.train import worker

    return worker(rank, world, _merge(options))


def _merge(options):
    if isinstance(options, (list, tuple)):
        import dataclasses

        return dataclasses.replace(options[0], policies=tuple(p for o in options for p in o.policies))
    return options


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
    from relibra.progress import progress as tqdm

    from relibra.runtime.launch import launch

    from relibra.runtime.train import oversubscribed, prepare, results, worker

    nproc = int(cfg.extra.get("nproc") or cfg.sizes.runtime_nproc)
    parts, per_policy = [], []
    opts = runtime_options(cfg)
    prepared = prepare(opts, nproc)
    load_before = os.getloadavg()[0]  # other work on the machine inflates wall-clock times: say so
    for repeat in tqdm(range(cfg.sizes.runtime_repeats), desc="runtime launches", unit="launch"):
        result = launch(worker, nproc, opts, prepared, threads_per_rank=1, timeout_s=opts.collective_timeout_s)
        d = frame(result["rows"])
        d["repeat"] = repeat
        parts.append(d)
        per_policy += [{**r, "repeat": repeat} for r in results(result, opts, prepared, nproc)]
    metrics = pd.concat(parts, ignore_index=True)
    metrics.attrs["results"] = per_policy
    load = max(load_before, os.getloadavg()[0])
    over = " OVERSUBSCRIBED (ranks > cores: times say nothing about speed)" if oversubscribed(nproc) else ""
    return metrics, f"{metrics['hardware'].iloc[0]}; 1-min load average up to {load:.1f}{over}"


def recorded_runtime(path=None) -> tuple[pd.DataFrame, dict]:
    """The reference measurement `scripts/measure_runtime.py` wrote (data/runtime_measured.json by default):
    one row per (command, launch, policy) with the run's fields (step_s_median/min/max, sim_step_s,
    expert_share, token_skew, ...) plus `command`, `launch`, `nodes_x_ranks` and the machine's 1-min load
    average before and after the command; and the file's {"machine", "date"}."""
    import json

    from relibra.experiments.config import project_root

    path = project_root() / "data" / "runtime_measured.json" if path is None else path
    with open(path) as f:
        record = json.load(f)
    rows, seen = [], {}
    for run in (r for r in record["runs"] if "results" in r):  # the calibration command has none
        launch = seen[run["command"]] = seen.get(run["command"], -1) + 1
        load_before, load_after = run.get("load_average_1min", [float("nan")] * 2)
        for r in run["results"]:
            rows.append({"command": run["command"], "launch": launch, "load_before": load_before,
                         "load_after": load_after, "nodes_x_ranks": f"{r['nodes']} x {r['ranks_per_node']}",
                         **{k: v for k, v in r.items() if not isinstance(v, (list, dict))}})
    return pd.DataFrame(rows), {"machine": record["machine"], "date": record["date"]}


def runtime_comparison(cfg: Config) -> dict:
    """Measured runtime next to the simulator, per policy and component (seconds per training step).

    measured: the runtime's rows; comparison: one row per (policy, component, source) with the mean,
    min and max over repeats and steps of the slowest rank's seconds (measured) or the simulator's
    seconds (simulated on the cpu-gloo preset, the same trace and plans, one value per step) and
    measured_mean_rank (the mean rank, measured). The simulator's expert compute sums each (micro-batch,
    layer)'s slowest GPU, the runtime's the slowest rank's total: the first is >= the second.
    """
    from relibra.runtime.train import load_or_make_trace, runtime_topology
    from relibra.sim import simulate

    measured, hardware = measured_runtime(cfg)
    nproc = int(measured["ep"].iloc[0])
    opts = runtime_options(cfg)
    trace = load_or_make_trace(opts, nproc)
    steps = list(range(opts.warmup_steps, trace.num_steps))
    topo = runtime_topology(nproc, nproc // opts.nodes)
    res = simulate(trace, topo, list(cfg.policies), steps=steps, progress=False, references=False,
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
    label = (f"measured ({hardware}) vs simulated ({topo.name} cluster preset, {topo.num_nodes} x {topo.gpus_per_node}) | "
             f"model {trace.model.name}, EP {nproc}, {trace.num_microbatches} micro-batches x {len(steps)} steps, "
             f"{cfg.sizes.runtime_repeats if cfg.profile != 'gpu' else 'all'} repeat(s), seed {cfg.seed}")
    results = pd.DataFrame(measured.attrs.get("results", []))
    return {"measured": measured, "simulated": sim, "comparison": comparison, "hardware": hardware, "label": label,
            "results": results}
