"""Sensitivity of the headline ratios: one input of the set-up card at a time, around the card's default.

Every knob moves one input of the default set-up card over the range the card gives (assumed inputs their
stated range; measured and published ones their alternatives: other Hopper link measurements, the other
batch layouts), the others at the card's values. Per knob value the trace is generated (batch and routing
knobs) or kept, the policies are simulated, and ReLibra's tokens/s over Megatron's, EPLB+'s and
balanced-compute's are kept: `sensitivity`'s tidy rows, `tornado_table`'s bars (notebook 10).
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from relibra.cluster import get_topology
from relibra.errors import ConfigError
from relibra.labels import CLAIMS, RATIO_LABELS
from relibra.progress import progress as tqdm
from relibra.setups import DEFAULT_CARD, load_card
from relibra.sim import simulate
from relibra.studies.case import scaled_model
from relibra.studies.params import Params, names, param
from relibra.workloads import BATCH_LAYOUTS, WorkloadConfig, generate_trace

RATIOS = tuple(RATIO_LABELS)  # claim ids of relibra.labels.CLAIMS
POLICIES = ("relibra", "eplb+", "megatron", "balanced-compute")
SENSITIVITY_COLUMNS = ["knob", "value", "is_default", "policy", *RATIOS, "relibra_skewness", "model", "ep",
                       "cluster", "setup"]


@dataclasses.dataclass(frozen=True)
class Knob:
    """One input the study moves: its card entry (None: none), where it acts ("workload", "topology", "cost",
    "overheads", "policy", "cluster preset") and the field it sets there; values: its sweep (None: the entry's
    range), extra: values beside it; default: None for the entry's value, "card" for the card's own name."""

    name: str
    entry: str | None
    acts_on: str
    field: str
    values: tuple | None = None
    extra: tuple = ()
    default: object = None


# The synthetic routing's calibration knob "topic concentration": how peaked one prompt group's topics are
# (no card entry; relibra.workloads.WorkloadConfig, calibrated against the paper's skewness, docs/traces.md).
KNOBS = {k.name: k for k in (
    Knob("batch layout", "batch.layout", "workload", "batch_layout", values=tuple(BATCH_LAYOUTS)),
    Knob("tokens per micro-batch", "batch.tokens_per_gpu_per_microbatch", "workload", "tokens_per_microbatch",
         extra=(8192,)),
    Knob("data-parallel size", "batch.data_parallel_size", "workload", "data_parallel_size"),
    Knob("samples per prompt", "batch.responses_per_prompt", "workload", "responses_per_prompt"),
    Knob("sequence length", "lengths.math", "workload", "length_scale", default=1.0),
    Knob("topic concentration", None, "workload", "topic_concentration", values=(0.1, 0.2, 0.4),
         default=WorkloadConfig().topic_concentration),
    Knob("spare slots", "training.spare_slots_per_gpu", "policy", "spare_slots_per_gpu"),
    Knob("optimizer sharding", "training.distributed_optimizer", "cost", "dp_size"),
    Knob("optimizer offload", "optimizer.cpu_offload_fraction", "cost", "optimizer_offload_fraction"),
    Knob("host Adam rate", "optimizer.host_adam_params_per_s", "cost", "host_adam_params_per_s"),
    Knob("NVLink rate", "cluster.nvlink_GBps", "topology", "nvlink_GBps"),
    Knob("RDMA rate", "cluster.rdma_GBps", "topology", "rdma_GBps"),
    Knob("GEMM rate", "compute.matmul_tflops", "topology", "matmul_tflops"),
    Knob("GEMM half-saturation", "compute.gemm_half_tokens", "topology", "gemm_half_tokens"),
    Knob("attention efficiency", "compute.attention_efficiency", "topology", "attention_efficiency"),
    Knob("collective latency", "compute.collective_latency_s", "topology", "collective_latency_s"),
    Knob("copy / all-to-all contention", "overheads.copy_a2a_contention", "overheads", "copy_a2a_contention"),
    Knob("GEMM per-call floor", "overheads.gemm_call_floor_s", "overheads", "gemm_call_floor_s"),
    Knob("cluster preset", None, "cluster preset", "", values=("h800", "paper-datasheet", "h100"), default="card"),
)}
KNOB_NAMES = tuple(KNOBS)


@dataclasses.dataclass(frozen=True)
class KnobParams(Params):
    """The knobs the study moves, declared once: notebook 10's parameter and `relibra sensitivity --knobs`."""

    knobs: tuple[str, ...] | None = param(None, "knobs moved, e.g. 'batch layout,NVLink rate' (None: the profile's)",
                                          names(KNOB_NAMES, "sensitivity knob"), sizes="knobs")


def knob_values(quick: bool = False, setup: str = DEFAULT_CARD) -> dict[str, list]:
    """{knob: values} in KNOBS order: the card entry's range (or the knob's own values) and its extras with the
    default, sorted, or for a categorical knob the default first; quick: the default and one other value."""
    card, base = load_card(setup), defaults(setup)
    values: dict[str, list] = {}
    for k in KNOBS.values():
        spread = k.values if k.values is not None else card.entries[k.entry].range
        if spread is None:
            raise ConfigError(f"set-up card {card.name!r}: entry {k.entry!r} has no range, which the sensitivity "
                              f"knob {k.name!r} sweeps; give it one (range = [low, high], docs/setup.md) or use a "
                              f"card whose assumed entries carry ranges, e.g. {DEFAULT_CARD!r}")
        dflt, vals = base[k.name], [*spread, *k.extra]
        vals = list(dict.fromkeys([dflt, *vals])) if isinstance(dflt, str) else sorted(set(vals) | {dflt})
        if quick:
            other = next(v for v in vals if v != dflt)
            vals = [v for v in vals if v in (dflt, other)]
        values[k.name] = vals
    return values


def defaults(setup: str = DEFAULT_CARD) -> dict:
    """Every knob's default: the card's value, else the knob's own (cluster preset: the card's name)."""
    card = load_card(setup)
    return {k.name: card.value(k.entry) if k.default is None else card.name if k.default == "card" else k.default
            for k in KNOBS.values()}


def case_inputs(card, knob: Knob, value, ep: int, micro_batches: int | None = None):
    """(WorkloadConfig, Topology, CostParams, policy params, micro-batches) of the card with one knob moved to
    `value` (micro-batches: the card's for a layout other than token-budget, where None means the budget's)."""
    cfg_changes, topo_changes, cost_changes = {}, {}, {}
    policy_params = card.policy_params(POLICIES)
    if knob.acts_on == "workload":
        cfg_changes[knob.field] = value
    elif knob.acts_on == "topology":
        topo_changes = {knob.field: float(value), "name": f"{card.name},{knob.field}={value}"}
    elif knob.acts_on == "policy":
        policy_params = {**policy_params, "relibra": {**policy_params.get("relibra", {}), knob.field: int(value)}}
    elif knob.acts_on == "overheads":
        cost_changes["overheads"] = dataclasses.replace(card.cost_params(ep).overheads, **{knob.field: float(value)})
    elif knob.name == "optimizer sharding":
        entries = {**card.entries, knob.entry: dataclasses.replace(card.entries[knob.entry], value=bool(value))}
        cost_changes["dp_size"] = dataclasses.replace(card, entries=entries).expert_dp_size(ep)
    elif knob.acts_on == "cost":
        cost_changes[knob.field] = float(value)
    cfg = card.workload_config(**cfg_changes)
    if cfg.batch_layout != "token-budget" and micro_batches is None:
        micro_batches = card.micro_batches
    topo = get_topology(value) if knob.acts_on == "cluster preset" and value != card.name \
        else card.topology(**topo_changes)
    return cfg, topo, card.cost_params(ep, **cost_changes), policy_params, micro_batches


def sensitivity(model: str, ep: int, setup: str = DEFAULT_CARD, workload: str = "mixed",
                micro_batches: int | None = None, layers: int | None = None, steps: int = 2, seed: int = 0,
                quick: bool = False, knobs: list[str] | None = None, progress: bool = True) -> pd.DataFrame:
    """Ratios per (knob, value), one card input moved at a time: a tidy DataFrame (SENSITIVITY_COLUMNS).

    setup: the set-up card of the default; micro_batches None: the card's (token-budget: from its budget);
    layers None: all; steps: the trace's (the first is history only); knobs: a subset of KNOB_NAMES (None:
    all); quick: two values per knob. The default set-up is simulated once, its ratios in every knob's
    default row."""
    card = load_card(setup)
    card.check_ep(ep)  # every knob but the cluster preset runs on the card's cluster
    shape, base, values = scaled_model(model, layers), defaults(setup), knob_values(quick, setup)
    chosen = list(values) if knobs is None else list(dict.fromkeys(knobs))
    unknown = [k for k in chosen if k not in values]
    if unknown or not chosen:
        raise ConfigError(f"unknown sensitivity knob(s) {unknown or chosen}; known: {', '.join(values)}")
    traces, rows, default_ratios = {}, [], None
    cases = [(k, v) for k in chosen for v in values[k]]
    for name, value in tqdm(cases, desc="sensitivity", unit="case", disable=not progress):
        is_default = value == base[name]
        if is_default and default_ratios is not None:  # the default set-up: simulated once
            ratios, cluster = default_ratios, card.name
        else:
            cfg, topo, params, policy_params, mbs = case_inputs(card, KNOBS[name], value, ep, micro_batches)
            key = (dataclasses.astuple(cfg), mbs)
            if key not in traces:
                traces[key] = generate_trace(shape, workload, ep, steps=steps, seed=seed, micro_batches=mbs, config=cfg)
            summary = simulate(traces[key], topo, list(POLICIES), steps=steps - 1 if steps > 1 else None,
                               params=params, policy_params=policy_params, progress=False,
                               references=False).summary.set_index("policy")
            ratios = {**{k: CLAIMS[k].of(summary["tokens_per_s"]) for k in RATIOS},
                      "relibra_skewness": float(summary.loc["relibra", "skewness"])}
            cluster = topo.name
            default_ratios = ratios if is_default else default_ratios
        rows.append({"knob": name, "value": value, "is_default": is_default, "policy": "relibra", **ratios,
                     "model": shape.name, "ep": ep, "cluster": cluster, "setup": card.name})
    frame = pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS)
    frame["value"] = frame["value"].astype(object)
    return frame


def tornado_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (ratio, knob) of `sensitivity`'s rows (each knob with its default row): the default ratio, the lowest
    and highest over the knob's values and the values giving them, and the swing (highest - lowest); columns
    ratio, knob, default, low, high, low_value, high_value, swing; sorted by swing within each ratio."""
    by_knob = list(frame.groupby("knob", sort=False))
    missing = [k for k, d in by_knob if not d["is_default"].any()]
    if missing:
        raise ConfigError(f"tornado_table: knob(s) {missing} have no default row")
    parts = []
    for ratio in RATIOS:
        bars = []
        for knob, d in by_knob:
            r = d[ratio].astype(float)
            lo, hi = r.idxmin(), r.idxmax()
            bars.append({"ratio": ratio, "knob": knob, "default": float(r[d["is_default"]].iloc[0]),
                         "low": float(r[lo]), "high": float(r[hi]), "low_value": d.loc[lo, "value"],
                         "high_value": d.loc[hi, "value"], "swing": float(r[hi] - r[lo])})
        parts.append(pd.DataFrame(bars).sort_values("swing", ascending=False, kind="stable"))
    return pd.concat(parts, ignore_index=True)
