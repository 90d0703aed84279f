"""Sensitivity of the headline ratios: one knob at a time around the default set-up (issue 11 item 7).

For each knob value the trace is generated (workload knobs) or kept (cost and cluster knobs), the
policies are simulated (relibra.sim.simulate) and three ratios of tokens per second are kept:
ReLibra / Megatron, ReLibra / EPLB+ and ReLibra / balanced-compute. `sensitivity` returns one tidy
row per (knob, value); the `relibra sensitivity` command prints it as JSON or a table, and a notebook
draws the tornado figure from it.

Knobs and where they act:
  batch layout          WorkloadConfig.batch_layout (relibra.workloads.BATCH_LAYOUTS)
  tokens per slot       tokens per (micro-batch, rank) of the generated trace
  topic concentration   WorkloadConfig.topic_concentration (how peaked a prompt group's topics are)
  spare slots           ReLibra's spare_slots_per_gpu
  NVLink rate, RDMA rate, GEMM half-saturation   the topology's nvlink_GBps, rdma_GBps, gemm_half_tokens
  sequence length       WorkloadConfig.length_scale (generated sequence lengths; attention follows
                        the trace's seq_lens)
  cluster preset        relibra.cluster presets
"""

from __future__ import annotations

import dataclasses

import pandas as pd

RATIOS = ("relibra_over_megatron", "relibra_over_eplb_plus", "relibra_over_balanced_compute")
POLICIES = ("relibra", "eplb+", "megatron", "balanced-compute")
SENSITIVITY_COLUMNS = ["knob", "value", "is_default", "policy", *RATIOS, "relibra_skewness", "model", "ep",
                       "cluster"]


def knob_values(quick: bool = False) -> dict[str, list]:
    """{knob: values}; the default value of each knob is among them (see `defaults`)."""
    from relibra.workloads import BATCH_LAYOUTS

    values = {
        "batch layout": list(BATCH_LAYOUTS),
        "tokens per slot": [4096, 8192, 16384],
        "topic concentration": [0.1, 0.2, 0.4],
        "spare slots": [1, 2, 4],
        "NVLink rate": [77.5, 155.0, 450.0],
        "RDMA rate": [25.0, 50.0, 100.0],
        "GEMM half-saturation": [256.0, 512.0, 1024.0],
        "sequence length": [0.5, 1.0, 2.0],
        "cluster preset": ["paper", "paper-datasheet", "h100"],
    }
    if quick:
        values = {k: v[:2] for k, v in values.items()}
    return values


def defaults(cluster: str = "paper") -> dict:
    """The default value of every knob (the generator's, ReLibra's and the cluster preset's)."""
    from relibra.cluster import get_topology
    from relibra.policies import get_policy
    from relibra.workloads import WorkloadConfig

    cfg = WorkloadConfig()
    topo = get_topology(cluster)
    return {"batch layout": cfg.batch_layout, "tokens per slot": cfg.tokens_per_rank,
            "topic concentration": cfg.topic_concentration,
            "spare slots": get_policy("relibra").spare_slots_per_gpu, "NVLink rate": topo.nvlink_GBps,
            "RDMA rate": topo.rdma_GBps, "GEMM half-saturation": topo.gemm_half_tokens,
            "sequence length": cfg.length_scale, "cluster preset": cluster}


def _ratios(summary: pd.DataFrame) -> dict:
    tps = summary.set_index("policy")["tokens_per_s"]
    return {"relibra_over_megatron": tps["relibra"] / tps["megatron"],
            "relibra_over_eplb_plus": tps["relibra"] / tps["eplb+"],
            "relibra_over_balanced_compute": tps["relibra"] / tps["balanced-compute"],
            "relibra_skewness": float(summary.set_index("policy").loc["relibra", "skewness"])}


def sensitivity(model: str, ep: int, cluster: str = "paper", workload: str = "mixed", micro_batches: int = 8,
                layers: int | None = None, steps: int = 2, seed: int = 0, quick: bool = False,
                knobs: list[str] | None = None, progress: bool = True) -> pd.DataFrame:
    """Ratios per (knob, value), varying one knob at a time: a tidy DataFrame (SENSITIVITY_COLUMNS).

    model, ep, cluster, workload: the default set-up; micro_batches, layers (None: all), steps: the
    trace's size (the last steps - 1 steps are simulated, the first is history); quick: two values
    per knob (the default among them where it is first or second). Same arguments, same frame.
    """
    from tqdm.auto import tqdm

    from relibra.cluster import get_topology
    from relibra.errors import ConfigError
    from relibra.experiments.config import scaled_model
    from relibra.sim import simulate
    from relibra.workloads import WorkloadConfig, generate_trace

    shape = scaled_model(model, layers)
    base = defaults(cluster)
    values = knob_values(quick)
    chosen = list(values) if knobs is None else knobs
    unknown = [k for k in chosen if k not in values]
    if unknown:
        raise ConfigError(f"unknown sensitivity knob(s) {unknown}; known: {', '.join(values)}")
    traces: dict = {}

    def trace_for(cfg: WorkloadConfig):
        key = dataclasses.astuple(cfg)
        if key not in traces:
            traces[key] = generate_trace(shape, workload, ep, steps=steps, seed=seed, micro_batches=micro_batches,
                                         config=cfg)
        return traces[key]

    cases = [(k, v) for k in chosen for v in values[k]]
    rows = []
    for knob, value in tqdm(cases, desc="sensitivity", unit="case", disable=not progress):
        cfg = WorkloadConfig()
        topo = get_topology(cluster)
        params = {}
        if knob == "batch layout":
            cfg = dataclasses.replace(cfg, batch_layout=value)
        elif knob == "tokens per slot":
            cfg = dataclasses.replace(cfg, tokens_per_rank=int(value))
        elif knob == "topic concentration":
            cfg = dataclasses.replace(cfg, topic_concentration=float(value))
        elif knob == "sequence length":
            cfg = dataclasses.replace(cfg, length_scale=float(value))
        elif knob == "spare slots":
            params = {"relibra": {"spare_slots_per_gpu": int(value)}}
        elif knob == "NVLink rate":
            topo = topo.with_changes(name=f"{cluster},nvlink_GBps={value}", nvlink_GBps=float(value))
        elif knob == "RDMA rate":
            topo = topo.with_changes(name=f"{cluster},rdma_GBps={value}", rdma_GBps=float(value))
        elif knob == "GEMM half-saturation":
            topo = topo.with_changes(name=f"{cluster},gemm_half_tokens={value}", gemm_half_tokens=float(value))
        elif knob == "cluster preset":
            topo = get_topology(value)
        trace = trace_for(cfg)
        result = simulate(trace, topo, list(POLICIES), steps=steps - 1 if steps > 1 else None,
                          policy_params=params, progress=False, references=False)
        rows.append({"knob": knob, "value": value, "is_default": value == base[knob], "policy": "relibra",
                     **_ratios(result.summary), "model": shape.name, "ep": ep, "cluster": topo.name})
    frame = pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS)
    frame["value"] = frame["value"].astype(object)
    return frame
