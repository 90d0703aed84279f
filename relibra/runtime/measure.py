"""The runtime as an experiment: plan, run (relibra.runtime), predict (the simulator), summarise.

relibra.runtime only consumes StepPlans. Here a request (policies, data, run options) becomes every
policy's trace and plans (`prepare`, the same on every rank), the runtime's records become per-policy
summaries with the measured speed-up over megatron and its bootstrap confidence interval
(`summarise`), next to the simulator's prediction for the same plans; `report` prints them and
writes metrics.csv / summary.json. Notebook 08 reads the same functions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from relibra.cluster import FITTED_CPU_PRESET, get_model, get_topology, read_preset_file
from relibra.costs import CostParams, cost_plan
from relibra.display import json_text
from relibra.errors import ConfigError
from relibra.paths import project_root
from relibra.machine import usable_cpus
from relibra.labels import short as label
from relibra.metrics import frame
from relibra.paths import atomic_path, write_text
from relibra.policies import get_policy, parameter_names
from relibra.runtime.config import NodeLayout, RunOptions
from relibra.runtime.plans import static_plan
from relibra.runtime.results import RunResult
from relibra.runtime.train import PolicyPlans
from relibra.trace import RoutingTrace
from relibra.workloads import generate_trace


# ---- what to run --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataOptions:
    """The tokens every policy trains on: a RoutingTrace file (its EP must equal the ranks), or a
    synthetic token-level trace of `workload`. expert_order: "hot-first" relabels a synthetic trace's
    experts per layer by popularity, so the static contiguous placement puts the hot experts together
    (the worst case a placement that ignores routing can meet); "trace" keeps the generator's ids.
    Trace files are never relabelled."""

    trace: str | None = None
    workload: str = "math"
    micro_batches: int = 4
    tokens_per_rank: int = 256
    expert_order: str = "hot-first"

    def validate(self) -> None:
        for name in ("micro_batches", "tokens_per_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.expert_order not in ("hot-first", "trace"):
            raise ConfigError(f"--expert-order must be hot-first or trace, got {self.expert_order!r}")


@dataclass(frozen=True)
class RuntimeRequest:
    """One launch as the CLI and notebook 08 ask for it: policies (alternating step by step on the
    same data), their parameters, the data, and the runtime's own options."""

    policies: tuple = ("megatron", "relibra")
    policy_params: dict = field(default_factory=dict)
    data: DataOptions = field(default_factory=DataOptions)
    run: RunOptions = field(default_factory=RunOptions)

    def validate(self) -> "RuntimeRequest":
        self.data.validate()
        self.run.validate()
        if not self.policies or any(not p for p in self.policies):
            raise ConfigError(f"--policies needs at least one policy name, got {','.join(self.policies)!r}")
        if len(set(self.policies)) != len(self.policies):
            raise ConfigError(f"--policies names a policy twice: {','.join(self.policies)}")
        return self


# ---- plans ----------------------------------------------------------------------------------------------
def hot_first(trace: RoutingTrace) -> RoutingTrace:
    """The trace with each layer's experts relabelled by total load, hottest first.

    loads [S, M, L, ep, E] and token ids are relabelled alike."""
    pop = trace.loads.sum(axis=(0, 1, 3), dtype=np.int64)  # [L, E]
    order = np.argsort(-pop, axis=1, kind="stable")  # new id -> old id
    new_of_old = np.argsort(order, axis=1)  # old id -> new id
    loads = np.take_along_axis(trace.loads, order[None, None, :, None, :], axis=-1)
    te = trace.token_experts
    if te is not None:
        layer = np.arange(trace.num_layers)[None, None, None, :, None]
        te = np.where(te >= 0, new_of_old[layer, np.maximum(te, 0)], te).astype(te.dtype)
    return dataclasses.replace(trace, loads=np.ascontiguousarray(loads), token_experts=te,
                               provenance={**trace.provenance, "expert_order": "hot-first"})


def load_or_make_trace(request: RuntimeRequest, ep: int) -> RoutingTrace:
    """The launch's trace: the data's trace file (its EP must be `ep`), else a synthetic token-level one."""
    data, run = request.data, request.run
    if data.trace:
        trace = RoutingTrace.load(data.trace)
        if trace.ep != ep:
            raise ConfigError(f"trace {data.trace} was recorded at EP {trace.ep}; launch it with --nproc {trace.ep}")
        check_trace_fits_model(trace, data.trace, run.model.name)
        return trace

    steps = run.measurement.steps + run.measurement.warmup_steps
    trace = generate_trace(run.model.name, data.workload, ep=ep, steps=steps, seed=run.model.seed,
                           micro_batches=data.micro_batches, tokens_per_rank=data.tokens_per_rank, token_level=True)
    return hot_first(trace) if data.expert_order == "hot-first" else trace


def check_trace_fits_model(trace: RoutingTrace, where: str, model: str) -> None:
    """Raise ConfigError unless the runtime's model (--model) has the trace's shape: the fields the runtime
    builds from (layers, experts, top-k, vocabulary) must agree."""
    preset = get_model(model)
    theirs_of = {"num_layers": trace.num_layers, "num_experts": trace.num_experts, "top_k": trace.model.top_k,
                 "vocab_size": trace.model.vocab_size}
    for name, theirs in theirs_of.items():
        ours = getattr(preset, name)
        if ours != theirs:
            raise ConfigError(f"trace {where}: {name} is {theirs}, but the runtime's model {preset.name!r} has {ours}")


def runtime_topology(ep: int, gpus_per_node: int):
    """The rates the runtime's machine runs at, cut to the launch's nodes x ranks: on GPUs the paper's
    Hopper cluster; on CPU the preset fitted here from micro-benchmarks (`cpu-gloo-fit`, data/) when
    present (or the file RELIBRA_CPU_FIT names: a fit taken on another machine), else `cpu-gloo`."""
    import torch  # heavy: only to ask whether a GPU is present

    if torch.cuda.is_available():
        base = get_topology("paper")
    elif os.environ.get("RELIBRA_CPU_FIT"):
        base = read_preset_file(os.environ["RELIBRA_CPU_FIT"], where="RELIBRA_CPU_FIT")
    else:
        base = read_preset_file(FITTED_CPU_PRESET) if FITTED_CPU_PRESET.exists() else get_topology("cpu-gloo")
    return base.with_changes(num_nodes=ep // gpus_per_node, gpus_per_node=gpus_per_node)


def policy_params(policy: str, params: dict) -> dict:
    """The subset of `params` that `policy` takes (one --policy-param list serves several policies)."""
    known = set(parameter_names(policy))
    return {k: v for k, v in params.items() if k in known}


def data_trace(trace: RoutingTrace, plans: list) -> RoutingTrace:
    """The trace whose tokens a policy trains on: the trace itself, or for plans with forced uniform
    routing (`balanced`) a loads-only trace of the plans' loads (ids dealt from them)."""
    if not any(p.uniform_routing for p in plans):
        return trace
    loads = np.stack([p.loads for p in plans]).astype(trace.loads.dtype)
    return dataclasses.replace(trace, loads=loads, token_experts=None, token_src_rank=None)


@dataclass
class Prepared:
    """Every policy's runtime input and the planner's seconds per policy."""

    runs: list[PolicyPlans]
    plan_seconds: dict[str, float]


def prepare(request: RuntimeRequest, world: int) -> Prepared:
    """Trace and plans of every policy: the same on every rank, so a launcher computes them once."""
    request.validate()
    layout = NodeLayout(world, request.run.parallelism.nodes)
    if request.data.trace is None:
        shape = get_model(request.run.model.name)
        if shape.num_experts % world:
            raise ConfigError(f"{world} ranks do not divide the {shape.num_experts} experts of "
                              f"{request.run.model.name!r}")
    params = {p: policy_params(p, request.policy_params) for p in request.policies}  # checked first
    unused = set(request.policy_params) - {k for p in params.values() for k in p}
    if unused:
        raise ConfigError(f"--policy-param {', '.join(sorted(unused))}: no policy of {','.join(request.policies)} "
                          "takes it")
    trace = load_or_make_trace(request, world)
    m = request.run.measurement
    total = m.steps + m.warmup_steps
    if trace.num_steps < total:
        raise ConfigError(f"the trace holds {trace.num_steps} steps; asked for {m.steps} + {m.warmup_steps} warm-up")
    topology = runtime_topology(world, layout.ranks_per_node)
    runs, seconds = [], {}
    for policy in request.policies:  # one StepPlan per step, each from the previous step's placement
        t0 = time.perf_counter()
        plans = get_policy(policy, **params[policy]).plan_steps(trace, range(total), topology, warmup=0,
                                                                initial_home=None)
        seconds[policy] = time.perf_counter() - t0
        runs.append(PolicyPlans(policy, data_trace(trace, plans), plans))
    return Prepared(runs, seconds)


# ---- the simulator's prediction -------------------------------------------------------------------
def simulated_costs(run: PolicyPlans, warmup: int, ranks_per_node: int) -> list:
    """relibra.costs.cost_plan of every timed plan of `run` on the fitted CPU preset (runtime_topology),
    each step after the previous step's placement, priced as the runtime runs it: each rank's tokens of
    a micro-batch as one sequence, fp32 gradients, the layer-shared replica buffer filled in line
    (blocking point-to-point before each layer, nothing hidden behind attention)."""
    trace = run.trace
    topology = runtime_topology(trace.ep, ranks_per_node)
    seq = int(trace.loads[0, 0, 0].sum(axis=1).max() // trace.model.top_k)
    params = CostParams(seq_len=max(seq, 1), include_lm_head=True, grad_bytes_per_param=trace.model.bytes_per_param,
                        replica_buffer="layer-shared", overlap_transfers=False)
    return [cost_plan(plan, trace.model, topology, params, prev_home=run.plans[s - 1].home if s > 0 else None)
            for s, plan in enumerate(run.plans) if s >= warmup]


# ---- summaries ------------------------------------------------------------------------------------------
# Segments of a whole step: measured components (own work) and the simulator's components for the same part.
SEGMENTS = {
    "expert compute": (("expert_compute",), ("expert_compute",)),
    "all-to-all": (("dispatch", "combine"), ("dispatch", "combine")),
    "dense compute": (("attention", "router", "permute", "dense_grad_allreduce"), ("dense_compute",)),
    "replica transfers": (("replica_push", "replica_grad"), ("replica_push", "replica_grad")),
    "migration": (("migration",), ("migration",)),
    "optimizer": (("optimizer",), ("optimizer",)),
}
WAITING = "waiting for the other ranks"
OTHER = "other (data, loss, bookkeeping)"


def paired_ratio_ci(reference_s, policy_s, resamples: int = 2000, level: float = 0.95,
                    seed: int = 0) -> tuple[float, float, float]:
    """median(reference_s) / median(policy_s) with a paired bootstrap confidence interval.

    reference_s, policy_s: float [n] per-step seconds of two policies, step i of both taken back to back
    (interleaved), so step indices are resampled jointly. Returns (ratio, low, high)."""
    ref, pol = np.asarray(reference_s, dtype=float), np.asarray(policy_s, dtype=float)
    if ref.shape != pol.shape or ref.size == 0:
        raise ConfigError(f"paired steps needed: {ref.size} reference and {pol.size} policy steps")
    idx = np.random.default_rng(seed).integers(0, ref.size, size=(resamples, ref.size))
    boots = np.median(ref[idx], axis=1) / np.median(pol[idx], axis=1)
    low, high = np.quantile(boots, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(np.median(ref) / np.median(pol)), float(low), float(high)


@dataclass
class PolicySummary:
    """One policy of one launch, measured and simulated. Seconds per training step.

    step_s: per timed step, the slowest rank's wall seconds; cpu_step_s: per timed step, the largest
    rank's process CPU seconds (what a step would take with free waiting and a core per rank: on a
    shared machine the steadier figure); cpu_s_per_rank / wall_s_per_rank: median over steps of each
    rank's process CPU and wall seconds; wait_s_per_rank: median seconds each rank
    waited at the barriers before collectives and transfers; segments_s / sim_segments_s: SEGMENTS,
    measured (mean over ranks, median over steps) and simulated (median over steps), plus waiting and
    the rest of the step (measured only); speed-ups are megatron's median over this policy's, with the
    paired bootstrap 95% interval; cpu_speedup_* the same on cpu_step_s."""

    policy: str
    step_s: list[float]
    cpu_step_s: list[float]
    step_s_median: float
    step_s_min: float
    step_s_max: float
    sim_step_s: float
    cpu_s_per_rank: list[float]
    wall_s_per_rank: list[float]
    wait_s_per_rank: list[float]
    segments_s: dict[str, float]
    sim_segments_s: dict[str, float]
    token_skew: float
    plan_skewness: float
    static_skewness: float
    replica_slots: int
    plan_seconds: float
    losses: list[float]
    model: str
    ranks: int
    nodes: int
    ranks_per_node: int
    threads_per_rank: int
    oversubscribed: bool
    warmup_steps: int
    steps: int
    hardware: str
    speedup_vs_megatron: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    sim_speedup_vs_megatron: float | None = None
    cpu_speedup_vs_megatron: float | None = None
    cpu_speedup_ci_low: float | None = None
    cpu_speedup_ci_high: float | None = None


def oversubscribed(world: int, threads_per_rank: int = 1) -> bool:
    """More busy threads than usable cores: wall-clock times then measure the scheduler, not the kit."""
    return world * threads_per_rank > usable_cpus()


def _component_sum(seconds: dict[str, float], names) -> float:
    return sum(v for k, v in seconds.items() if k.split("/", 1)[1] in names)


def summarise(result: RunResult, prepared: Prepared, request: RuntimeRequest) -> list[PolicySummary]:
    """One PolicySummary per policy of the launch (speed-ups when megatron is among them)."""
    m = request.run.measurement
    ranks_per_node = result.world // result.nodes
    out = []
    for run in prepared.runs:
        recs = [r for r in result.records if r.policy == run.policy]
        steps = sorted({r.step for r in recs})
        by_step = {s: [r for r in recs if r.step == s] for s in steps}
        step_s = [max(r.wall_s for r in by_step[s]) for s in steps]
        ranks = sorted({r.rank for r in recs})

        def per_rank(field):  # median over steps of each rank's figure
            return [float(np.median([getattr(r, field) for r in recs if r.rank == g])) for g in ranks]

        def step_median(of):  # median over steps of the mean over ranks
            return float(np.median([np.mean([of(r) for r in by_step[s]]) for s in steps]))

        tokens = np.array([[r.expert_tokens for r in sorted(by_step[s], key=lambda r: r.rank)] for s in steps])
        segments = {name: step_median(lambda r: _component_sum(r.seconds, measured))
                    for name, (measured, _) in SEGMENTS.items()}
        segments[WAITING] = step_median(lambda r: r.wait_s)
        segments[OTHER] = step_median(lambda r: r.wall_s) - sum(segments.values())
        costs = simulated_costs(run, m.warmup_steps, ranks_per_node)
        totals = [c.totals() for c in costs]
        sim_segments = {name: float(np.median([sum(t.get(c, 0.0) for c in sim) for t in totals]))
                        for name, (_, sim) in SEGMENTS.items()}
        timed = run.plans[m.warmup_steps:]
        out.append(PolicySummary(
            policy=run.policy, step_s=step_s, cpu_step_s=[max(r.cpu_s for r in by_step[s]) for s in steps],
            step_s_median=float(np.median(step_s)), step_s_min=float(min(step_s)),
            step_s_max=float(max(step_s)), sim_step_s=float(np.median([c.step_seconds for c in costs])),
            cpu_s_per_rank=per_rank("cpu_s"), wall_s_per_rank=per_rank("wall_s"), wait_s_per_rank=per_rank("wait_s"),
            segments_s=segments, sim_segments_s=sim_segments,
            token_skew=float(np.mean(tokens.max(axis=1) / np.maximum(tokens.mean(axis=1), 1e-12))),
            plan_skewness=float(np.mean([p.skewness().mean() for p in timed])),
            static_skewness=float(np.mean([static_plan(p.loads, ranks_per_node).skewness().mean() for p in timed])),
            replica_slots=int(result.replica_slots[run.policy]), plan_seconds=float(prepared.plan_seconds[run.policy]),
            losses=result.losses[run.policy], model=run.trace.model.name, ranks=result.world, nodes=result.nodes,
            ranks_per_node=ranks_per_node, threads_per_rank=result.threads_per_rank,
            oversubscribed=oversubscribed(result.world, result.threads_per_rank), warmup_steps=m.warmup_steps,
            steps=len(steps), hardware=result.hardware))
    ref = next((s for s in out if s.policy == "megatron"), None)
    if ref is not None:
        for s in out:
            s.speedup_vs_megatron, s.speedup_ci_low, s.speedup_ci_high = paired_ratio_ci(ref.step_s, s.step_s)
            s.sim_speedup_vs_megatron = ref.sim_step_s / s.sim_step_s
            s.cpu_speedup_vs_megatron, s.cpu_speedup_ci_low, s.cpu_speedup_ci_high = paired_ratio_ci(ref.cpu_step_s,
                                                                                                      s.cpu_step_s)
    return out


def summary_frame(summaries: list[PolicySummary]) -> pd.DataFrame:
    """One row per policy with the scalar fields (lists and dicts left out)."""
    return pd.DataFrame([{k: v for k, v in dataclasses.asdict(s).items() if not isinstance(v, (list, dict))}
                         for s in summaries])


def segment_frame(summaries: list[PolicySummary]) -> pd.DataFrame:
    """Long table (policy, segment, source, seconds) of every policy's whole step, measured and simulated."""
    return pd.DataFrame([{"policy": s.policy, "segment": name, "source": source, "seconds": sec}
                         for s in summaries
                         for source, seconds in (("measured", s.segments_s), ("simulated", s.sim_segments_s))
                         for name, sec in seconds.items()])


# ---- reports ----------------------------------------------------------------------------------------------
def report(result: RunResult, prepared: Prepared, request: RuntimeRequest, as_json: bool = False,
           out: str | None = None, machine_load: dict | None = None) -> int:
    """Print the summaries (a table, or one JSON object) and the equivalence lines, then write metrics.csv
    (relibra.metrics rows of every rank and step) and summary.json to `out` (printed first: an --out that
    fails loses nothing). machine_load: the load check made before measuring (relibra.machine
    .QuietCheck as a dict), kept in the JSON and summary.json as "machine_load", its warning repeated.
    Returns the exit code (1 when the equivalence check fails)."""
    summaries = summarise(result, prepared, request)
    check = request.run.measurement.check_equivalence
    record = {"results": [dataclasses.asdict(s) for s in summaries],
              "equivalence": {k: dataclasses.asdict(v) for k, v in result.equivalence.items()},
              **({"machine_load": machine_load} if machine_load is not None else {})}
    stream = sys.stderr if as_json else sys.stdout
    if as_json:
        print(json_text(record if check else {k: v for k, v in record.items() if k != "equivalence"}))
    else:
        _print_tables(result, summaries)
    for policy, eq in result.equivalence.items() if check else ():
        print(f"equivalence ok ({policy}): max abs diff {eq.max_abs_diff:.3e} ({eq.dtype}, tolerance {eq.tolerance:g})"
              if eq.ok() else f"equivalence FAILED ({policy}): max abs diff {eq.max_abs_diff:.3e} > {eq.tolerance:g} "
              f"({eq.dtype}; experts {eq.expert_params:.3e}, dense {eq.dense_params:.3e}, loss {eq.loss:.3e})",
              file=stream)
    if out:
        os.makedirs(out, exist_ok=True)
        with atomic_path(os.path.join(out, "metrics.csv")) as tmp:
            frame(result.metric_rows(request.run.model.name, request.data.workload)).to_csv(tmp, index=False)
        write_text(os.path.join(out, "summary.json"), json_text(record, indent=2))
        print(f"wrote {out}/metrics.csv and summary.json", file=stream)
    if machine_load and machine_load.get("warning"):
        print(f"warning: {machine_load['warning']}", file=sys.stderr)
    return int(check and not all(eq.ok() for eq in result.equivalence.values()))


def _print_tables(result: RunResult, summaries: list) -> None:
    table = summary_frame(summaries)
    cols = ["policy", "step_s_median", "step_s_min", "step_s_max", "sim_step_s", "token_skew", "plan_skewness",
            "replica_slots"]
    cols += [c for c in ("speedup_vs_megatron", "speedup_ci_low", "speedup_ci_high", "sim_speedup_vs_megatron",
                         "cpu_speedup_vs_megatron", "cpu_speedup_ci_low", "cpu_speedup_ci_high")
             if table[c].notna().any()]
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table[cols].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        seg = pd.DataFrame({s.policy: {**{f"{k} (measured)": v for k, v in s.segments_s.items()},
                                       **{f"{k} (simulated)": v for k, v in s.sim_segments_s.items()}}
                            for s in summaries})
        print(seg.to_string(float_format=lambda x: f"{x:.4f}"))
    for s in summaries:
        print(f"{s.policy}: per rank, median CPU s {' '.join(f'{c:.3f}' for c in s.cpu_s_per_rank)} | wall s "
              f"{' '.join(f'{w:.3f}' for w in s.wall_s_per_rank)} | losses {' '.join(f'{x:.5f}' for x in s.losses)}")
    if summaries and summaries[0].oversubscribed:
        print(f"note: OVERSUBSCRIBED ({result.world} ranks x {result.threads_per_rank} threads > cores): times "
              "say nothing about speed")


# ---- what notebook 08 reads ---------------------------------------------------------------------------
def recorded_runtime() -> tuple[pd.DataFrame, dict]:
    """The reference measurement `scripts/measure_runtime.py` wrote (data/runtime_measured.json):
    one row per (command, launch, policy) with the launch's scalar fields (step_s_median/min/max,
    sim_step_s, speedup_vs_megatron with its CI, ...) plus `command`, `launch`, `nodes_x_ranks` and the
    machine's 1-min load average before and after the command; and the file's {"machine", "date"}."""
    with open(project_root() / "data" / "runtime_measured.json") as f:
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


def runtime_segments_story(segments: pd.DataFrame, waiting: str) -> str:
    """Per policy: the step's largest measured segments, the share spent waiting for the other ranks, and
    simulated / measured for each segment the simulator prices. segments: runtime.measure.segment_frame
    rows (median over launches when several)."""
    g = segments.groupby(["policy", "segment", "source"], sort=False)["seconds"].median().unstack("source")
    out = []
    for policy in g.index.get_level_values("policy").unique():
        d = g.loc[policy]
        measured = d["measured"].dropna()
        step = measured.sum()
        wait = measured.get(waiting, 0.0)
        top = measured.drop(waiting, errors="ignore").sort_values(ascending=False).head(2)
        line = (f"- {label(policy)}: step {1e3 * step:.0f} ms (mean over ranks); largest own work: "
                + ", ".join(f"{name} {1e3 * v:.0f} ms" for name, v in top.items())
                + f"; waiting for the other ranks {1e3 * wait:.0f} ms ({100 * wait / step:.0f}% of the step).")
        if "simulated" in d:
            both = d[(d["measured"] > 0) & (d["simulated"] > 0)]  # NaN compares False: both sources present
            if len(both):
                line += " Simulated / measured: " + ", ".join(
                    f"{name} {r['simulated'] / r['measured']:.2f}" for name, r in both.iterrows()) + "."
        out.append(line)
    return "\n".join(out)


def agreement_facts(results: pd.DataFrame, step_tolerance: float = 0.15) -> dict:
    """Measured vs simulated, as facts: "steps", per policy the measured median step seconds (min, max), the
    simulated one, their ratio and whether it is within `step_tolerance`; "launches", per launch and policy
    other than Megatron the measured speed-up with its 95% interval (and on process CPU time), the simulated one
    and whether it lies inside; "oversubscribed"; "agrees": every policy within the tolerance. results:
    runtime.measure.summary_frame rows (one per policy and launch, `repeat` or `launch` numbering them)."""
    g = results.groupby("policy").agg(measured=("step_s_median", "median"), sim=("sim_step_s", "median"),
                                      lo=("step_s_min", "min"), hi=("step_s_max", "max"))
    g["ratio"] = g["sim"] / g["measured"]
    g["ok"] = (g["ratio"] - 1).abs() <= step_tolerance
    launch = next((c for c in ("repeat", "launch") if c in results), None)
    launches = []
    if "speedup_ci_low" in results:
        for _, r in results[(results["policy"] != "megatron") & results["speedup_ci_low"].notna()].iterrows():
            cpu = "cpu_speedup_ci_low" in results and not pd.isna(r["cpu_speedup_ci_low"])
            launches.append({"launch": int(r[launch]) + 1 if launch else None, "policy": r["policy"],
                             "measured": r["speedup_vs_megatron"], "low": r["speedup_ci_low"],
                             "high": r["speedup_ci_high"], "simulated": r["sim_speedup_vs_megatron"],
                             "inside": bool(r["speedup_ci_low"] <= r["sim_speedup_vs_megatron"]
                                            <= r["speedup_ci_high"]),
                             "cpu": (r["cpu_speedup_vs_megatron"], r["cpu_speedup_ci_low"],
                                     r["cpu_speedup_ci_high"]) if cpu else None})
    return {"steps": g.reset_index().to_dict("records"), "launches": launches, "tolerance": step_tolerance,
            "oversubscribed": bool("oversubscribed" in results and results["oversubscribed"].any()),
            "agrees": bool(g["ok"].all())}


def runtime_agreement(results: pd.DataFrame, step_tolerance: float = 0.15) -> str:
    """agreement_facts in words: measured vs simulated step time per policy, then each launch's speed-up over
    Megatron with its 95% interval and whether the simulated ratio lies inside it. Refuses to judge
    oversubscribed runs."""
    f = agreement_facts(results, step_tolerance)
    tol = f"{100 * step_tolerance:.0f}%"
    text = "\n".join(f"- {label(r['policy'])}: measured median {r['measured']:.3f} s (min {r['lo']:.3f}, max "
                     f"{r['hi']:.3f}), simulated {r['sim']:.3f} s: simulated / measured {r['ratio']:.2f} "
                     f"({'within' if r['ok'] else 'outside'} {tol})" for r in f["steps"])
    if f["oversubscribed"]:
        return ("OVERSUBSCRIBED: more ranks than cores, so these wall-clock times measure the scheduler and say "
                "nothing about speed or about the simulator.\n\n" + text)
    for x in f["launches"]:
        which = f"launch {x['launch']}, " if x["launch"] else ""
        text += (f"\n\n{which}{label(x['policy'])} vs Megatron: measured {x['measured']:.2f}x (95% interval "
                 f"{x['low']:.2f}-{x['high']:.2f}, width {x['high'] - x['low']:.2f}), simulated {x['simulated']:.2f}x, "
                 f"{'inside' if x['inside'] else 'outside'} the interval.")
        if x["cpu"] is not None:
            text += " On process CPU time (the busiest rank per step) {:.2f}x ({:.2f}-{:.2f}).".format(*x["cpu"])
    return text + (f"\n\nOn these numbers the simulator {'agrees with' if f['agrees'] else 'does not agree with'} "
                   f"the measured step times to {tol}.")
