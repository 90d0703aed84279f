"""The notebooks, one spec each: name, question, parameters dataclass, default policies, a compute
function returning a typed result (results.Result), the narrative of that result and the rows it
puts in the README's results table. `relibra reproduce`, REPORT.md and the README table iterate
over SPECS and read the typed results back; nothing else names a notebook's files.

A notebook's parameters cell declares exactly the fields of its parameters dataclass, with the same
defaults (tests/test_notebooks.py checks both).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

import pandas as pd

from relibra.cluster import resolve_topology
from relibra.errors import ConfigError, RelibraError
from relibra.experiments import narrative as nr
from relibra.experiments.config import Config, resolve_config
from relibra.experiments.dynamics import expert_load_table, prediction_error_table, shift_table, static_skewness_table
from relibra.experiments.headline import config_headline, verdict_cells, verdict_story
from relibra.experiments.overheads import overhead_table
from relibra.experiments.reordering import reorder_table
from relibra.experiments.replication import replication_table, spare_slot_sweep
from relibra.experiments.results import Result, live, table, value
from relibra.experiments.rl import rl_workload
from relibra.experiments.runtime import WAITING, recorded_runtime, runtime_comparison
from relibra.experiments.scale import best_other, scale_table, sweep_of
from relibra.experiments.sensitivity import config_sensitivity, tornado_table
from relibra.experiments.simulation import simulate_trace, throughput_grid
from relibra.experiments.skewness import skewness_sweep
from relibra.experiments.traces import workload_traces
from relibra.experiments.tutorial import tutorial_args, tutorial_case, tutorial_grid, tutorial_skew_sweep
from relibra.labels import knob_value, short


# ---- parameters: one dataclass per parameters cell -------------------------------------------------
@dataclass(frozen=True)
class TraceParams:
    profile: str = "laptop"
    model: str | None = None
    workload: str | None = None
    ep: int | None = None
    steps: int | None = None
    seed: int = 0
    out_dir: str | None = None


@dataclass(frozen=True)
class SimParams(TraceParams):
    cluster: str | None = None
    policies: str | None = None


@dataclass(frozen=True)
class ReplicationParams(SimParams):
    spare_slot_counts: str = "1,2,3,4"


@dataclass(frozen=True)
class SkewnessParams(SimParams):
    ep_sizes: str | None = None


@dataclass(frozen=True)
class SensitivityParams(TraceParams):
    setup: str = "token-budget-tp1"
    knobs: str | None = None


@dataclass(frozen=True)
class HeadlineParams:
    profile: str = "laptop"
    setup: str = "token-budget-tp1"
    tokens_per_microbatch: int | None = None
    out_dir: str | None = None


@dataclass(frozen=True)
class RuntimeParams:
    profile: str = "laptop"
    policies: str | None = None
    seed: int = 0
    out_dir: str | None = None
    measured_dir: str | None = None
    nproc: int | None = None
    nodes: int | None = None


@dataclass(frozen=True)
class RLParams:
    profile: str = "laptop"
    policies: str | None = None
    rl_steps: int | None = None
    seed: int = 0
    out_dir: str | None = None


@dataclass(frozen=True)
class ScaleParams:
    profile: str = "laptop"
    models: str | None = None
    clusters: str | None = None
    eps: str | None = None
    workload: str | None = None
    policies: str | None = None
    seed: int = 0
    out_dir: str | None = None


@dataclass(frozen=True)
class TutorialParams:
    ep: int = 4
    placement: str = "search"
    spare_slots: int = 2
    skew: float = 1.2
    shift: float = 0.5
    tokens_per_gpu: int = 4096
    micro_batches: int = 4
    micro_batch: int = 0
    seed: int = 0
    out_dir: str | None = None
    interactive: bool = True


# ---- typed results ----------------------------------------------------------------------------------
@dataclass(kw_only=True)
class TutorialResult(Result):
    expert_tokens: pd.DataFrame = table("tokens per expert and micro-batch, with its home GPU")
    gpu_load: pd.DataFrame = table("tokens and simulated expert seconds per GPU")
    replicas: pd.DataFrame = table("occupied replica slots: expert, home GPU, tokens taken per micro-batch")
    phases: pd.DataFrame = table("simulated seconds per micro-batch, direction and phase (slowest GPU)")
    placement_replica_grid: pd.DataFrame = table("rank skewness and slowest-GPU time per placement x spare slots")
    skew_sweep: pd.DataFrame = table("slowest-GPU time per placement as the skew slider moves (section 5)")
    case: dict = live()


@dataclass(kw_only=True)
class DynamicsResult(Result):
    expert_load: pd.DataFrame = table("tokens per expert: micro-batches of step 0 and whole steps, layer 0")
    shift_stats: pd.DataFrame = table("hot-expert overlap and load correlation per comparison and workload")
    prediction_error: pd.DataFrame = table("prediction error per predictor, target, step, micro-batch and layer")
    static_skewness: pd.DataFrame = table("rank skewness under static placement per micro-batch / whole step")
    traces: dict = live()


@dataclass(kw_only=True)
class ThroughputResult(Result):
    throughput: pd.DataFrame = table("simulated tokens/s and shares per model, workload, seed and policy")
    case_ratios: pd.DataFrame = table("ReLibra / Megatron, ReLibra / EPLB+ and the gaps per model, workload and seed")
    verdict: pd.DataFrame = table("per paper claim: the kit's mean and range over cases and seeds, the best case and "
                                  "seed, the range over the alternatives (layouts, link rates), why they differ")
    ratio_vs_budget: pd.DataFrame = table("ReLibra / Megatron and / EPLB+ per family and tokens per micro-batch")
    alternatives: pd.DataFrame = table("the headline ratios under each other batch layout and link-rate pair")
    overheads: pd.DataFrame = table("ReLibra's overheads: the paper's figure and the kit's, with how the kit "
                                    "obtains it")
    setup: str = value("token-budget-tp1")
    caption: str = value("")
    sweep_caption: str = value("")


@dataclass(kw_only=True)
class AblationResult(Result):
    ablation: pd.DataFrame = table("simulated tokens/s and skewness per model, workload and ablation stage")


@dataclass(kw_only=True)
class ReorderResult(Result):
    reordering: pd.DataFrame = table("per workload, policy and step: throughput, node/GPU skewness, cross-node "
                                     "share, migration")


@dataclass(kw_only=True)
class ReplicationResult(Result):
    replication: pd.DataFrame = table("per workload and policy: throughput, GPU skewness, replicas used")
    spare_slots: pd.DataFrame = table("ReLibra throughput and skewness vs spare replica slots per GPU")


@dataclass(kw_only=True)
class SkewnessResult(Result):
    skewness: pd.DataFrame = table("mean and p95 rank skewness per policy, EP size and workload")


@dataclass(kw_only=True)
class OverheadResult(Result):
    overheads: pd.DataFrame = table("per policy: planner seconds per step (measured), simulated step/forward "
                                    "seconds, migration share, replica memory share, transfer overlap")


@dataclass(kw_only=True)
class RuntimeResult(Result):
    measured: pd.DataFrame = table("measured per-rank metrics of the runtime (metrics schema; <component>_wait: "
                                   "waiting at the barrier before it; step_cpu: process CPU seconds)")
    step_results: pd.DataFrame = table("per launch and policy: measured step seconds (median, min, max), the "
                                       "simulator's sim_step_s, the speed-up over megatron with its paired bootstrap "
                                       "95% interval")
    step_segments: pd.DataFrame = table("per launch and policy: the whole step in segments, measured (mean over "
                                        "ranks, median over timed steps) and simulated")
    rank_times: pd.DataFrame = table("per launch, policy and rank: median process CPU, wall and waiting seconds "
                                     "per step")
    recorded_step_results: pd.DataFrame = table("the reference measurement (data/runtime_measured.json): per "
                                                "command, launch and policy")
    label: str = value("")
    hardware: str = value("")


@dataclass(kw_only=True)
class RLResult(Result):
    rewards: pd.DataFrame = table("reward per RL step")
    expert_load: pd.DataFrame = table("tokens per expert of the real RL trace, layer 0")
    shift_stats: pd.DataFrame = table("hot-expert overlap and load correlation: real RL trace vs synthetic")
    balancing: pd.DataFrame = table("simulated throughput and skewness of each policy on the real RL trace")
    label: str = value("")
    sim_label: str = value("")
    hardware: str = value("")
    rl: dict = live()


@dataclass(kw_only=True)
class SensitivityResult(Result):
    sensitivity: pd.DataFrame = table("simulated ratios ReLibra/Megatron, ReLibra/EPLB+ and ReLibra/balanced-"
                                      "compute per knob and value, one knob moved at a time")
    tornado: pd.DataFrame = table("per ratio and knob: default, lowest and highest ratio, the values giving them, "
                                  "swing (sorted by swing)")


@dataclass(kw_only=True)
class ScaleResult(Result):
    scale: pd.DataFrame = table("per model, cluster, EP and policy: simulated tokens/s, speed-up over Megatron, "
                                "fraction of balanced-compute, skewness; measured planner wall and CPU seconds")
    relibra_h_vs_best: pd.DataFrame = table("per case: relibra-h's speed-up and fraction of balanced-compute beside "
                                            "the best other policy's")


# ---- compute: one function per notebook ---------------------------------------------------------------
def _tutorial(cfg: Config) -> TutorialResult:
    args = tutorial_args(cfg)
    case = tutorial_case(**args)
    grid_args = {k: args[k] for k in ("skew", "shift", "seed", "ep", "tokens_per_gpu", "micro_batches")}
    return TutorialResult(expert_tokens=case["expert_tokens"], gpu_load=case["gpu_table"], replicas=case["replicas"],
                          phases=case["phases"], placement_replica_grid=tutorial_grid(**grid_args),
                          skew_sweep=tutorial_skew_sweep(**{k: v for k, v in args.items() if k != "skew"}), case=case)


def _dynamics(cfg: Config) -> DynamicsResult:
    traces = workload_traces(cfg)
    return DynamicsResult(expert_load=expert_load_table(traces[cfg.workload], step=0, layer=0),
                          shift_stats=shift_table(traces), prediction_error=prediction_error_table(traces),
                          static_skewness=static_skewness_table(traces), traces=traces)


def _throughput(cfg: Config) -> ThroughputResult:
    h = config_headline(cfg)
    return ThroughputResult(throughput=h.grid, case_ratios=h.ratios, verdict=h.verdict_with_alternatives(),
                            ratio_vs_budget=h.sweep, alternatives=h.alternatives, overheads=h.overheads,
                            setup=h.setup, caption=h.caption, sweep_caption=h.sweep_caption)


def _ablation(cfg: Config) -> AblationResult:
    return AblationResult(ablation=throughput_grid(cfg))


def _reordering(cfg: Config) -> ReorderResult:
    return ReorderResult(reordering=reorder_table(cfg))


def _replication(cfg: Config) -> ReplicationResult:
    return ReplicationResult(replication=replication_table(cfg),
                             spare_slots=spare_slot_sweep(cfg, slots=cfg.extra["spare_slot_counts"]))


def _skewness(cfg: Config) -> SkewnessResult:
    return SkewnessResult(skewness=skewness_sweep(cfg))


def _overheads(cfg: Config) -> OverheadResult:
    return OverheadResult(overheads=overhead_table(cfg))


def _runtime(cfg: Config) -> RuntimeResult:
    r = runtime_comparison(cfg)
    recorded, where = recorded_runtime()
    return RuntimeResult(measured=r["metrics"], step_results=r["results"], step_segments=r["segments"],
                         rank_times=r["rank_times"],
                         recorded_step_results=recorded.assign(date=where["date"], cpus=where["machine"]["cpus"]),
                         label=r["label"], hardware=r["hardware"])


def _rl(cfg: Config) -> RLResult:
    rl = rl_workload(cfg)
    sim = simulate_trace(cfg, rl["trace"], cluster="cpu-gloo", workload="rl", policy_params=rl["sim_policy_params"])
    return RLResult(rewards=rl["rewards"], expert_load=expert_load_table(rl["trace"], step=0, layer=0),
                    shift_stats=shift_table(rl["traces"]), balancing=sim, label=rl["label"], sim_label=rl["sim_label"],
                    hardware=rl["hardware"], rl=rl)


def _sensitivity(cfg: Config) -> SensitivityResult:
    frame = config_sensitivity(cfg)
    return SensitivityResult(sensitivity=frame, tornado=tornado_table(frame))


def _scale(cfg: Config) -> ScaleResult:
    t = scale_table(cfg)
    return ScaleResult(scale=t, relibra_h_vs_best=best_other(t))


# ---- the README table's rows, from a typed result and its run's manifest --------------------------------
def _cluster(name) -> str:
    """'`paper` cluster preset (20 x 8 GPUs)', or the bare name for a spec the kit cannot parse."""
    try:
        topo = resolve_topology(str(name))
    except RelibraError:
        return f"`{name}` cluster"
    return f"`{name}` cluster preset ({topo.num_nodes} x {topo.gpus_per_node} GPUs)"


def _span(values: pd.Series) -> str:
    lo, hi = f"{float(values.min()):.2f}", f"{float(values.max()):.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _unique(t: pd.DataFrame, column: str) -> str:
    return ", ".join(str(v) for v in dict.fromkeys(t[column]))


def _row(what: str, figure: str, how: str) -> dict:
    return {"what": what, "figure": figure, "how it was obtained": how}


def _throughput_rows(r: ThroughputResult, man: dict) -> list[dict]:
    """The verdict per paper claim: the kit's mean and range over cases and seeds, best case, alternatives."""
    how = f"**{r.caption}** (relibra setup show {r.setup})"
    rows = []
    for _, v in r.verdict.iterrows():
        c = verdict_cells(v)
        rows.append(_row(v["claim"], f"{c['kit (mean; range over cases x seeds)']}; best {c['best case']}; other "
                         f"layouts and link rates {c['other layouts and link rates']}; paper: {v['paper']}", how))
    return rows


def _skewness_rows(r: SkewnessResult, man: dict) -> list[dict]:
    t = r.skewness[r.skewness["sweep"] == "ep"] if (r.skewness["sweep"] == "ep").any() else r.skewness
    eps = sorted(int(e) for e in t["ep"].unique())
    where = f"EP {eps[0]}" if len(eps) == 1 else f"EP {eps[0]}-{eps[-1]}"
    return [_row(f"rank skewness (max / mean tokens per GPU), mean over plans, {where}",
                 "; ".join(f"{short(p)} {_span(d['skewness'])}" for p, d in t.groupby("policy", sort=False)),
                 f"**simulated**: policies' plans on synthetic RL traces of {_unique(t, 'model')}, "
                 f"{_unique(t, 'workload')}, nodes of the {_cluster(man['config'].get('cluster'))}, no cost model; "
                 f"{man['scale_note']}")]


def _overhead_rows(r: OverheadResult, man: dict) -> list[dict]:
    t = r.overheads
    case, where = f"{_unique(t, 'model')}, EP {_unique(t, 'ep')}", _cluster(t["cluster"].iloc[0])
    rows = [_row(f"planner wall time per step, {case}",
                 "; ".join(f"{short(x.policy)} {x.plan_s:.3g} s ({x.planner_vs_forward:.2g}x the forward pass)"
                           for x in t.itertuples(index=False)),
                 f"**measured** on {_unique(t, 'planner_hardware')}; forward pass simulated on the {where}; "
                 f"{man['scale_note']}")]
    for x in t[t["policy"] == "relibra"].head(1).itertuples(index=False):
        overlap = ("no replica transfers" if pd.isna(x.transfer_overlap)
                   else f"{100 * x.transfer_overlap:.0f}% of replica transfers hidden behind attention")
        rows.append(_row(f"ReLibra migration and replica memory, {case}",
                         f"migration {100 * x.migration_share:.2f}% of step time; replica buffer "
                         f"{100 * x.replica_memory_share_full_model:.2f}% of parameter memory per GPU (whole model); "
                         f"{overlap}", f"**simulated** on the {where}; {man['scale_note']}"))
    return rows


def _speedups(d: pd.DataFrame, g: pd.DataFrame) -> str:
    """"; <policy> / Megatron ..." per policy: each launch's ratio of median steps with its paired bootstrap
    95% interval where the table has one (policies interleaved in one launch), else the ratio of the
    medians over launches; and the simulated ratio."""
    ref, out = g.loc["megatron"], ""
    for p, x in g.iterrows():
        if p == "megatron":
            continue
        rows = d[d["policy"] == p]
        if "speedup_ci_low" in d and rows["speedup_ci_low"].notna().all():
            measured = ", ".join(f"{y.speedup_vs_megatron:.2f}x [{y.speedup_ci_low:.2f}, {y.speedup_ci_high:.2f}]"
                                 for y in rows.itertuples())
            measured += " measured (95% interval" + (" per launch)" if len(rows) > 1 else ")")
            if "cpu_speedup_ci_low" in d and rows["cpu_speedup_ci_low"].notna().all():
                measured += ", on process CPU time " + ", ".join(
                    f"{y.cpu_speedup_vs_megatron:.2f}x [{y.cpu_speedup_ci_low:.2f}, {y.cpu_speedup_ci_high:.2f}]"
                    for y in rows.itertuples())
        else:
            measured = f"{ref.measured / x.measured:.2f}x measured"
        out += f"; {short(p)} / Megatron {measured}, {ref.sim / x.sim:.2f}x simulated"
    return out


def _runtime_rows(r: RuntimeResult, man: dict) -> list[dict]:
    """This run's measured step times and the shipped reference, each next to the simulator's, with the
    measured speed-up's interval."""
    rows = []
    rec = r.recorded_step_results
    recorded_how = ("" if rec.empty else f"**measured** on a {_unique(rec, 'cpus')}-core machine, "
                    f"{_unique(rec, 'date')}, 1-min load {rec['load_before'].min():.1f}-{rec['load_after'].max():.1f}, "
                    f"{rec['launch'].nunique()} launch(es) x {_unique(rec, 'steps')} timed steps per policy, policies "
                    "alternating step by step; simulated on the CPU preset fitted just before "
                    "(data/runtime_measured.json, `scripts/measure_runtime.py --calibrate`)")
    for what, t, how in (
            ("runtime step time on the CPU, this run (median over launches)", r.step_results,
             f"**measured** on {r.hardware}; simulated on the fitted CPU preset; {man['scale_note']}"),
            ("runtime step time on the CPU, the shipped reference (median over launches)", rec, recorded_how)):
        if t.empty or "step_s_median" not in t:
            continue
        for layout, d in (t.groupby("nodes_x_ranks", sort=False) if "nodes_x_ranks" in t else [("", t)]):
            g = d.groupby("policy", sort=False).agg(measured=("step_s_median", "median"), sim=("sim_step_s", "median"))
            fig = "; ".join(f"{short(p)} {x.measured:.3g} s measured, {x.sim:.3g} s simulated" for p, x in g.iterrows())
            if "megatron" in g.index:
                fig += _speedups(d, g)
            over = " (OVERSUBSCRIBED: ranks > cores)" if "oversubscribed" in d and d["oversubscribed"].any() else ""
            rows.append(_row(what + (f", {layout} (nodes x ranks)" if layout else ""), fig + over, how))
    return rows


def _sensitivity_rows(r: SensitivityResult, man: dict) -> list[dict]:
    t = r.tornado[r.tornado["ratio"] == "relibra_over_megatron"].sort_values("swing", ascending=False, kind="stable")
    if t.empty:
        return []
    knobs = "; then ".join(f"{k.knob}: {k.low:.2f}x ({knob_value(k.low_value, k.knob)}) to {k.high:.2f}x "
                           f"({knob_value(k.high_value, k.knob)})"
                           for k in t.head(2).itertuples(index=False))
    cfg = man["config"]
    return [_row("what moves ReLibra / Megatron most (one knob at a time)",
                 f"default {float(t['default'].iloc[0]):.2f}x; most with {knobs}",
                 f"**simulated**, {cfg.get('model')}, {cfg.get('workload')}, EP {cfg.get('ep')} on the "
                 f"{_cluster(cfg.get('cluster'))}; {man['scale_note']}")]


def _scale_rows(r: ScaleResult, man: dict) -> list[dict]:
    t = r.relibra_h_vs_best
    if t.empty:
        return []
    top = t.loc[t.groupby(["model", "cluster"], sort=False)["ep"].idxmax()]
    fig = "; ".join(f"{x.model} EP{x.ep} on {x.cluster}: {x.speedup:.2f}x Megatron, {x.frac_of_balanced_compute:.3f} "
                    f"of balanced-compute, {x.over_best_other:.3f}x {short(x.best_other)}" for x in top.itertuples())
    behind = int((t["over_best_other"] < 1 - 1e-9).sum())
    return [_row("relibra-h (cross-node replicas) at the largest EP, against the best other policy",
                 f"{fig}; behind the best other policy in {behind} of {len(t)} cases",
                 f"**simulated** on each named cluster; {man['scale_note']}")]


# ---- "Try this": a suggested change and the direction it moves a quantity, tested ------------------------
@dataclass(frozen=True)
class TryThis:
    """A change a notebook suggests and what it claims the change does: `measure` (read from the
    notebook's result by `value`) rises (direction +1) or falls (-1). The notebook prints `text`, and
    tests/test_lessons.py runs the change at the tiny profile and checks the direction, so a claim
    that does not hold fails CI."""

    change: Callable[[Config], dict]  # the parameters to set, from the reader's resolved run
    measure: str
    value: Callable[[Result], float]
    direction: int
    why: str

    def text(self, cfg: Config) -> str:
        now = {**cfg.extra, **{k: getattr(cfg, k) for k in ("ep", "ep_sizes", "cluster", "seed") if hasattr(cfg, k)}}
        parts = [f"`{k} = {v!r}`" + (f" (now {_show(now[k])})" if k in now else "")
                 for k, v in self.change(cfg).items()]
        return f"Set {' and '.join(parts)}: {self.measure} {'rises' if self.direction > 0 else 'falls'}; {self.why}."


def _show(v) -> str:
    return ",".join(map(str, v)) if isinstance(v, (tuple, list)) else repr(v)


def _mean(t: pd.DataFrame, column: str, **where) -> float:
    for k, v in where.items():
        t = t[t[k] == v]
    return float(t[column].mean())


def _more_nodes(cluster: str) -> str:
    """`cluster` with twice its nodes, so that twice the EP size fits."""
    return f"{cluster.split(',')[0]},nodes={2 * resolve_topology(cluster).num_nodes}"


def _double_ep(cfg: Config) -> dict:
    return {"ep": 2 * cfg.ep}


# ---- the specs ------------------------------------------------------------------------------------------
MAIN_POLICIES = ("megatron", "eplb", "eplb+", "lplb+", "eplb+lp", "llep", "relibra", "balanced")


@dataclass(frozen=True)
class NotebookSpec:
    name: str                                   # notebooks/<name>.py, results/<name>/
    question: str                               # what the notebook answers, one line
    params: type                                # the parameters cell as a dataclass
    policies: tuple[str, ...]                   # compared by default (its `policies` parameter overrides)
    compute: Callable[[Config], Result]
    result: type                                # the Result subclass compute returns
    narrative: Callable[[Result], str]          # markdown interpreting the result
    glance: Callable[[Result, dict], list[dict]] | None = None  # rows of the README table (result, manifest)
    single_model: bool = False                  # studies one model (a list is an error)
    scale: str = "profile"                      # how captions describe the scale: profile|toy|runtime|rl|grid
    tries: tuple[TryThis, ...] = ()             # its "Try this" suggestions, each tested

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.params))

    @property
    def defaults(self) -> dict:
        return {f.name: f.default for f in fields(self.params)}


def _static_skewness(r: TutorialResult) -> float:
    g = r.placement_replica_grid
    return float(g[(g["placement"] == "static") & (g["spare_slots"] == 0)]["skewness"].iloc[0])


def _largest_ep(t: pd.DataFrame, policy: str) -> float:
    t = t[(t["sweep"] == "ep") & (t["policy"] == policy)]
    return float(t[t["ep"] == t["ep"].max()]["skewness"].mean())


def _nvl72_only(cfg: Config) -> dict:
    racks = [c for c in sweep_of(cfg).clusters if "nvl72" in c]
    return {"clusters": racks[0] if racks else "nvl72"}


def _relibra_at_largest_ep(r: ScaleResult) -> float:
    t = r.scale[(r.scale["status"] == "ok") & (r.scale["policy"] == "relibra")]
    return float(t[t["ep"] == t.groupby("cluster")["ep"].transform("max")]["skewness"].mean())


TRIES = {
    "00_tutorial": (
        TryThis(lambda c: {"skew": 0.0}, "static placement's rank skewness (section 4, no spare slots)",
                _static_skewness, -1, "with uniform routing no expert is hot enough to pile tokens on one GPU"),
        TryThis(lambda c: {"spare_slots": 0}, "the slowest GPU's expert time in this plan",
                lambda r: _mean(r.case["summary"], "slowest_gpu_ms"), +1,
                "without copies nothing takes tokens off the GPU that holds a hot expert"),
        TryThis(lambda c: {"ep": 16}, "static placement's rank skewness (section 4)", _static_skewness, +1,
                "at EP 16 each GPU holds one expert, so a hot expert is a hot GPU"),
    ),
    "01_routing_dynamics": (
        TryThis(_double_ep, "the mean rank skewness of a micro-batch under static placement",
                lambda r: _mean(r.static_skewness, "skewness", scope="micro-batch"), +1,
                "with fewer experts per GPU one hot expert weighs more"),),
    "02_throughput": (
        TryThis(lambda c: {"tokens_per_microbatch": 4096}, "ReLibra / Megatron (mean over cases and seeds)",
                lambda r: _mean(r.case_ratios, "relibra_over_megatron"), -1,
                "smaller packed micro-batches hold fewer sequences, so a long one weighs more on its rank's attention "
                "and all-to-all, which no expert placement changes"),),
    "03_ablation": (
        TryThis(_double_ep, "reordering-only's mean rank skewness",
                lambda r: _mean(r.ablation, "skewness", policy="relibra-reorder"), +1,
                "reordering places homes once per step and cannot follow a micro-batch's hot experts, which weigh "
                "more on fewer experts per GPU"),),
    "04_reordering": (
        TryThis(lambda c: {"cluster": "nvl72"}, "the GPU skewness of replication without reordering "
                "(`relibra-replicate`)", lambda r: _mean(r.reordering, "gpu_skewness", policy="relibra-replicate"), -1,
                "in one 72-GPU NVLink domain every GPU shares the home's node, so in-node replication alone can level "
                "them and reordering has little left to do"),),
    "05_replication": (
        TryThis(lambda c: {"cluster": "nvl72"}, "ReLibra's GPU skewness",
                lambda r: _mean(r.replication, "gpu_skewness", policy="relibra"), -1,
                "a copy may then go to any of the 72 GPUs of one NVLink domain, not only to the GPUs of its home's node"),),
    "06_skewness": (
        TryThis(lambda c: {"ep_sizes": ",".join(map(str, c.ep_sizes + (2 * max(c.ep_sizes),)))},
                "Megatron's skewness at the largest EP size", lambda r: _largest_ep(r.skewness, "megatron"), +1,
                "the trend of the left panel continues: fewer experts per GPU"),),
    "07_overheads": (
        TryThis(_double_ep, "ReLibra's replica buffer as a share of parameter memory per GPU",
                lambda r: _mean(r.overheads, "replica_memory_share_full_model", policy="relibra"), +1,
                "the buffer keeps its spare slots while each GPU's own experts halve"),),
    "10_sensitivity": (
        TryThis(_double_ep, "ReLibra / balanced-compute at the default set-up",
                lambda r: _mean(r.sensitivity, "relibra_over_balanced_compute", is_default=True), -1,
                "a node is then a smaller share of the EP group, so in-node replication has less room (notebook 11 "
                "follows this to EP 256)"),),
    "11_scale": (
        TryThis(_nvl72_only, "ReLibra's rank skewness at the largest EP (mean over clusters)", _relibra_at_largest_ep,
                -1, "a 72-GPU NVLink domain gives in-node replication room that 8-GPU nodes do not"),),
}

SPECS = (
    NotebookSpec("00_tutorial", "What is expert-parallel load imbalance, and how do a placement and replicas fix it?",
                 TutorialParams, ("megatron", "relibra-reorder", "relibra-replicate", "relibra"), _tutorial,
                 TutorialResult, lambda r: nr.tutorial_grid_story(r.placement_replica_grid), scale="toy"),
    NotebookSpec("01_routing_dynamics", "How far do hot experts move between micro-batches, and what does a "
                 "history-based prediction miss?", TraceParams, ("megatron",), _dynamics, DynamicsResult,
                 lambda r: nr.dynamics_story(r.shift_stats, r.prediction_error, r.static_skewness), single_model=True),
    NotebookSpec("02_throughput", "Does ReLibra deliver what the paper claims, at full scale and over seeds?",
                 HeadlineParams, MAIN_POLICIES, _throughput, ThroughputResult, lambda r: verdict_story(r.verdict),
                 glance=_throughput_rows),
    NotebookSpec("03_ablation", "What do reordering and replication each contribute?", SimParams,
                 ("megatron", "relibra-reorder", "relibra-replicate", "relibra", "balanced"), _ablation,
                 AblationResult, lambda r: nr.ablation_story(r.ablation)),
    NotebookSpec("04_reordering", "Does annealing search place homes better than greedy LPT or no reordering?",
                 SimParams, ("relibra-replicate", "relibra-lpt", "relibra", "megatron"), _reordering, ReorderResult,
                 lambda r: nr.reorder_story(r.reordering), single_model=True),
    NotebookSpec("05_replication", "Does joint replica placement and token split beat either alone, and how many "
                 "spare slots are worth it?", ReplicationParams,
                 ("relibra-reorder", "relibra-split", "relibra", "megatron"), _replication, ReplicationResult,
                 lambda r: nr.replication_story(r.replication, r.spare_slots), single_model=True),
    NotebookSpec("06_skewness", "How skewed is each policy's busiest GPU across EP sizes and task domains?",
                 SkewnessParams, ("megatron", "eplb", "eplb+", "lplb+", "eplb+lp", "llep", "relibra"), _skewness,
                 SkewnessResult, lambda r: nr.skewness_story(r.skewness), glance=_skewness_rows, single_model=True),
    NotebookSpec("07_overheads", "What does balancing cost: planner time, migration, replica memory?", SimParams,
                 ("eplb", "eplb+", "lplb+", "eplb+lp", "llep", "relibra"), _overheads, OverheadResult,
                 lambda r: nr.overheads_story(r.overheads), glance=_overhead_rows, single_model=True),
    NotebookSpec("08_runtime", "Does the real runtime agree with the simulator?", RuntimeParams,
                 ("megatron", "relibra"), _runtime, RuntimeResult,
                 lambda r: nr.runtime_segments_story(r.step_segments, WAITING) + "\n\n"
                 + nr.runtime_agreement(r.step_results), glance=_runtime_rows, scale="runtime"),
    NotebookSpec("09_rl_workload", "Does a real RL run route like the synthetic traces, and how do the policies "
                 "balance it?", RLParams, ("megatron", "eplb", "eplb+", "relibra", "balanced"), _rl, RLResult,
                 lambda r: nr.rl_story(r.rewards, r.balancing), scale="rl"),
    NotebookSpec("10_sensitivity", "How far does each headline ratio move with the set-up?", SensitivityParams,
                 ("megatron", "eplb+", "relibra", "balanced-compute"), _sensitivity, SensitivityResult,
                 lambda r: nr.sensitivity_story(r.tornado, r.sensitivity), glance=_sensitivity_rows,
                 single_model=True),
    NotebookSpec("11_scale", "Where does in-node replication run out of room between EP16 and EP256?", ScaleParams,
                 ("megatron", "eplb+", "llep", "relibra", "relibra-h"), _scale, ScaleResult,
                 lambda r: nr.scale_story(r.scale, r.relibra_h_vs_best), glance=_scale_rows, scale="grid"),
)
SPECS = tuple(dataclasses.replace(s, tries=TRIES.get(s.name, ())) for s in SPECS)
BY_NAME = {s.name: s for s in SPECS}
NOTEBOOKS = tuple(BY_NAME)
NOTEBOOK_PARAMETERS = {s.name: s.parameter_names for s in SPECS}
NOTEBOOK_POLICIES = {s.name: s.policies for s in SPECS}


def get_spec(notebook: str) -> NotebookSpec:
    if notebook not in BY_NAME:
        raise ConfigError(f"unknown notebook {notebook!r}; known: {', '.join(NOTEBOOKS)}")
    return BY_NAME[notebook]


def resolve(notebook: str, **params) -> Config:
    """The notebook's parameters resolved against its profile (config.resolve_config) with the spec's
    default policies; the tutorial reads no profile (its toy layer sets every size)."""
    spec = get_spec(notebook)
    if spec.scale == "toy":
        params = {**params, "profile": None}
    return resolve_config(notebook, spec.policies, spec.scale, "cluster" in spec.parameter_names, spec.single_model,
                          **params)


@dataclass(frozen=True)
class Loaded:
    """One notebook's run read back: its spec, typed result and manifest."""

    spec: NotebookSpec
    result: Result
    manifest: dict


def load_results(out_dir: str | Path) -> dict[str, Loaded]:
    """{notebook: Loaded} for every notebook whose typed result is under out_dir, in registry order."""
    found = {}
    for spec in SPECS:
        folder = Path(out_dir) / spec.name
        result = spec.result.load(folder)
        if result is not None:
            path = folder / "manifest.json"
            man = json.loads(path.read_text()) if path.exists() else {}
            man.setdefault("config", {})
            man.setdefault("scale_note", "profile unknown (no manifest.json)")
            found[spec.name] = Loaded(spec, result, man)
    return found
