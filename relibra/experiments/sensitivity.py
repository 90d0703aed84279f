"""Sensitivity of the headline ratios: one knob at a time around the default set-up.

For each knob value the trace is generated (workload knobs) or kept (cost and cluster knobs), the
policies are simulated (relibra.sim.simulate) and three ratios of tokens per second are kept:
ReLibra / Megatron, ReLibra / EPLB+ and ReLibra / balanced-compute. `sensitivity` returns one tidy
row per (knob, value), the default set-up simulated once; the `relibra sensitivity` command prints it
as JSON or a table, and notebook 10 draws the tornado figure from `tornado_table` (per ratio and
knob: lowest and highest ratio over the knob's values around the default, sorted by swing).

Knobs and where they act:
  batch layout          WorkloadConfig.batch_layout (relibra.workloads.BATCH_LAYOUTS)
  tokens per slot       tokens per (micro-batch, rank) of the generated trace
  topic concentration   WorkloadConfig.topic_concentration (how peaked a prompt group's topics are)
  spare slots           ReLibra's spare_slots_per_gpu
  NVLink rate, RDMA rate, GEMM half-saturation   the topology's nvlink_GBps, rdma_GBps, gemm_half_tokens,
                        moved by fixed factors of the cluster preset's own values (_COST_FACTORS)
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
KNOBS = ("batch layout", "tokens per slot", "topic concentration", "spare slots", "NVLink rate", "RDMA rate",
         "GEMM half-saturation", "sequence length", "cluster preset")
DERIVED = "derived"  # the "tokens per slot" value that means: derived from the global batch (WorkloadConfig)

# Excursions of the cost knobs, as factors of the cluster preset's own value. On the `paper` preset they give
# NVLink 77.5 / 155 / 450 GB/s (half DeepEP's measured rate, DeepEP's, the H800 datasheet), RDMA 25 / 50 /
# 100 GB/s and GEMM half-saturation 256 / 512 / 1024 tokens; other presets move by the same factors.
_COST_FACTORS = {"NVLink rate": (0.5, 1.0, 450.0 / 155.0), "RDMA rate": (0.5, 1.0, 2.0),
                 "GEMM half-saturation": (0.5, 1.0, 2.0)}
_COST_FIELDS = {"NVLink rate": "nvlink_GBps", "RDMA rate": "rdma_GBps", "GEMM half-saturation": "gemm_half_tokens"}


def cost_factors() -> dict[str, tuple[float, ...]]:
    """{cost knob: the factors of the cluster preset's own value it is moved by}."""
    return dict(_COST_FACTORS)


def knob_values(quick: bool = False, cluster: str = "paper", tokens_per_rank: int | None = None) -> dict[str, list]:
    """{knob: values}, every knob's default (see `defaults`) among them, in KNOBS order.

    cluster, tokens_per_rank: the default set-up (cost knobs move by fixed factors of the cluster's
    rates; tokens per slot: "derived" or 4096 / 8192 / 16384 when the default derives it from the
    batch, else 0.5x / 1x / 2x the given size). quick: two values per knob, the default and the first
    other one (for tests and a first look).
    """
    from relibra.cluster import get_topology
    from relibra.workloads import BATCH_LAYOUTS

    topo = get_topology(cluster)
    base = defaults(cluster, tokens_per_rank)
    values = {
        "batch layout": list(BATCH_LAYOUTS),
        "tokens per slot": ([DERIVED, 4096, 8192, 16384] if tokens_per_rank is None else
                            [max(1, tokens_per_rank // 2), tokens_per_rank, 2 * tokens_per_rank]),
        "topic concentration": [0.1, 0.2, 0.4],
        "spare slots": [1, 2, 4],
        **{k: [round(f * getattr(topo, _COST_FIELDS[k]), 6) for f in fs] for k, fs in _COST_FACTORS.items()},
        "sequence length": [0.5, 1.0, 2.0],
        "cluster preset": list(dict.fromkeys([cluster, "paper", "paper-datasheet", "h100"])),
    }
    for knob, vals in values.items():
        if base[knob] not in vals:
            vals.insert(0, base[knob])
        if quick:
            values[knob] = [v for v in vals if v == base[knob] or v == next(x for x in vals if x != base[knob])]
    return values


def defaults(cluster: str = "paper", tokens_per_rank: int | None = None) -> dict:
    """The default value of every knob (the generator's, ReLibra's and the cluster preset's)."""
    from relibra.cluster import get_topology
    from relibra.policies import get_policy
    from relibra.workloads import WorkloadConfig

    cfg = WorkloadConfig()
    topo = get_topology(cluster)
    tokens = tokens_per_rank if tokens_per_rank is not None else cfg.tokens_per_rank
    return {"batch layout": cfg.batch_layout, "tokens per slot": DERIVED if tokens is None else tokens,
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
                knobs: list[str] | None = None, progress: bool = True,
                tokens_per_rank: int | None = None) -> pd.DataFrame:
    """Ratios per (knob, value), varying one knob at a time: a tidy DataFrame (SENSITIVITY_COLUMNS).

    model, ep, cluster, workload, tokens_per_rank (None: derived from the global batch): the default
    set-up; micro_batches, layers (None: all), steps: the trace's size (the last steps - 1 steps are
    simulated, the first is history); knobs: a subset of KNOBS (None: all); quick: two values per
    knob (knob_values). The default set-up is simulated once and its ratios fill every knob's default
    row. Same arguments, same frame.
    """
    from relibra.progress import progress as tqdm

    from relibra.cluster import get_topology
    from relibra.errors import ConfigError
    from relibra.experiments.config import scaled_model
    from relibra.sim import simulate
    from relibra.workloads import WorkloadConfig, generate_trace

    shape = scaled_model(model, layers)
    base = defaults(cluster, tokens_per_rank)
    values = knob_values(quick, cluster, tokens_per_rank)
    chosen = list(values) if knobs is None else list(dict.fromkeys(knobs))
    unknown = [k for k in chosen if k not in values]
    if unknown or not chosen:
        raise ConfigError(f"unknown sensitivity knob(s) {unknown or chosen}; known: {', '.join(values)}")
    default_cfg = WorkloadConfig(tokens_per_rank=tokens_per_rank)
    traces: dict = {}

    def trace_for(cfg: WorkloadConfig):
        key = dataclasses.astuple(cfg)
        if key not in traces:
            traces[key] = generate_trace(shape, workload, ep, steps=steps, seed=seed, micro_batches=micro_batches,
                                         config=cfg)
        return traces[key]

    cases = [(k, v) for k in chosen for v in values[k]]
    rows = []
    default_ratios = None
    for knob, value in tqdm(cases, desc="sensitivity", unit="case", disable=not progress):
        cfg = default_cfg
        topo = get_topology(cluster)
        is_default = value == base[knob]
        if is_default and default_ratios is not None:  # the default set-up: simulated once
            rows.append({"knob": knob, "value": value, "is_default": True, "policy": "relibra", **default_ratios,
                         "model": shape.name, "ep": ep, "cluster": topo.name})
            continue
        params = {}
        if knob == "batch layout":
            cfg = dataclasses.replace(cfg, batch_layout=value)
        elif knob == "tokens per slot":
            cfg = dataclasses.replace(cfg, tokens_per_rank=None if value == DERIVED else int(value))
        elif knob == "topic concentration":
            cfg = dataclasses.replace(cfg, topic_concentration=float(value))
        elif knob == "sequence length":
            cfg = dataclasses.replace(cfg, length_scale=float(value))
        elif knob == "spare slots":
            params = {"relibra": {"spare_slots_per_gpu": int(value)}}
        elif knob in _COST_FIELDS and not is_default:
            field = _COST_FIELDS[knob]
            topo = topo.with_changes(name=f"{cluster},{field}={value}", **{field: float(value)})
        elif knob == "cluster preset":
            topo = get_topology(value)
        trace = trace_for(cfg)
        result = simulate(trace, topo, list(POLICIES), steps=steps - 1 if steps > 1 else None,
                          policy_params=params, progress=False, references=False)
        ratios = _ratios(result.summary)
        if is_default:
            default_ratios = ratios
        rows.append({"knob": knob, "value": value, "is_default": is_default, "policy": "relibra", **ratios,
                     "model": shape.name, "ep": ep, "cluster": topo.name})
    frame = pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS)
    frame["value"] = frame["value"].astype(object)
    return frame


def tornado_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (ratio, knob): the default ratio, the lowest and highest ratio over the knob's values, the
    values that give them, and the swing (highest - lowest); rows sorted by swing within each ratio.

    frame: `sensitivity`'s rows (each knob holds its default row). Columns: ratio, knob, default,
    low, high, low_value, high_value, swing.
    """
    from relibra.errors import ConfigError

    missing = [k for k, d in frame.groupby("knob", sort=False) if not d["is_default"].any()]
    if missing:
        raise ConfigError(f"tornado_table: knob(s) {missing} have no default row")
    out = []
    for ratio in RATIOS:
        for knob, d in frame.groupby("knob", sort=False):
            r = d[ratio].astype(float)
            lo, hi = r.idxmin(), r.idxmax()
            out.append({"ratio": ratio, "knob": knob, "default": float(r[d["is_default"]].iloc[0]),
                        "low": float(r[lo]), "high": float(r[hi]), "low_value": d.loc[lo, "value"],
                        "high_value": d.loc[hi, "value"], "swing": float(r[hi] - r[lo])})
    table = pd.DataFrame(out)
    table["order"] = table["ratio"].map({r: i for i, r in enumerate(RATIOS)})
    table = table.sort_values(["order", "swing"], ascending=[True, False], kind="stable").drop(columns="order")
    return table.reset_index(drop=True)


def config_sensitivity(cfg, progress: bool = True) -> pd.DataFrame:
    """`sensitivity` at a notebook Config's scale (notebook 10): its model, EP, cluster, workload,
    micro-batches, layers, steps, tokens per slot and seed; knobs from the `knobs` parameter, else the
    profile's `sensitivity_knobs` (None: all), and the profile's `sensitivity_quick`."""
    knobs = cfg.extra.get("knobs") or cfg.sizes.sensitivity_knobs
    return sensitivity(cfg.model, cfg.ep, cluster=cfg.cluster, workload=cfg.workload, micro_batches=cfg.micro_batches,
                       layers=cfg.layers, steps=cfg.steps, seed=cfg.seed, quick=cfg.sizes.sensitivity_quick,
                       knobs=None if knobs is None else list(knobs), progress=progress,
                       tokens_per_rank=cfg.tokens_per_rank)
