"""Notebook 08: the real runtime (relibra.runtime, gloo on this CPU) next to the simulator, and the
shipped reference measurement (data/runtime_measured.json)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

import pandas as pd

from relibra.errors import ConfigError
from relibra.experiments.base import PATH, Fact, Params, Result, integer, param, table, value
from relibra.paths import resolve_path
from relibra.machine import quiet_machine
from relibra.runtime.measure import (WAITING, DataOptions, PolicySummary, RuntimeRequest, oversubscribed,
                                         prepare, recorded_runtime, runtime_agreement, runtime_segments_story,
                                         runtime_topology, segment_frame, summarise, summary_frame)
from relibra.experiments.text import unique
from relibra.experiments.traces import PROFILE, own_policies
from relibra.labels import short
from relibra.metrics import frame
from relibra.progress import progress as tqdm
from relibra.runtime.config import MeasurementOptions, ModelOptions, ParallelismOptions, RunOptions
from relibra.runtime.launch import launch
from relibra.runtime.results import RunResult
from relibra.runtime.train import worker

QUESTION = "Does the real runtime agree with the simulator?"


@dataclass(frozen=True)
class Sizes:
    """The gloo run: ranks (one per core of a 2-core machine: more would be oversubscribed), simulated
    nodes, timed steps, the model (an expert-dominated CPU preset, docs/runtime.md), its tokens, and
    launches. measured_dir: where the gpu profile reads runs measured on GPU nodes instead."""

    nproc: int = 2
    nodes: int = 1
    steps: int = 5
    model: str = "moe-cpu"
    workload: str = "math"
    tokens_per_rank: int = 1024
    micro_batches: int = 2
    repeats: int = 2
    measured_dir: str | None = None
    quiet_wait_s: float = 120.0  # the longest wait for a quiet machine before measuring (machine.quiet_machine)


SIZES = {"tiny": Sizes(steps=1, tokens_per_rank=64, micro_batches=1, repeats=1, quiet_wait_s=0.0),
         "laptop": Sizes(steps=20, repeats=1), "paper": Sizes(steps=30, repeats=3, quiet_wait_s=300.0),
         "gpu": Sizes(measured_dir="results/gpu_runs")}


@dataclass(frozen=True)
class Params(Params):
    profile: str = param("laptop", "the runtime's model, steps and launches", PROFILE, affects=False)
    policies: tuple[str, ...] = own_policies("megatron,relibra",
                                                "policies, alternating step by step (None: megatron,relibra)")
    seed: int = param(0, "same seed, same trace and plans (measured times still vary)", integer(0))
    out_dir: str | None = param(None, "where results go (None: results/interactive/08_runtime)", PATH,
                                affects=False)
    measured_dir: str | None = param(None, "gpu profile: folder of measured runs (None: the profile's)", PATH,
                                     sizes="measured_dir")
    nproc: int = param(None, "ranks of the gloo run (None: the profile's)", integer(1), sizes="nproc")
    nodes: int = param(None, "simulated nodes the ranks are grouped into (None: the profile's)", integer(1),
                       sizes="nodes")

    def check(self, notebook: str, sizes: Sizes) -> None:
        if self.nproc % self.nodes:
            raise ConfigError(f"{notebook}: nodes={self.nodes} must divide nproc={self.nproc}")

    def scale_note(self, s: Sizes) -> str:
        return (f"{self.profile} profile: model {s.model}, {self.nproc} ranks as {self.nodes} node(s), "
                f"{s.micro_batches} micro-batches x {s.tokens_per_rank} tokens per rank, "
                f"{s.steps} timed steps x {s.repeats} launch(es), seed {self.seed}")

    def request(self, s: Sizes) -> RuntimeRequest:
        """The launch at the profile's runtime sizes: every policy, alternating step by step."""
        run = RunOptions(model=ModelOptions(name=s.model, seed=self.seed),
                         parallelism=ParallelismOptions(nodes=self.nodes),
                         measurement=MeasurementOptions(steps=s.steps, warmup_steps=2 if s.steps >= 5 else
                                                        (1 if s.steps > 1 else 0)))
        data = DataOptions(workload=s.workload, micro_batches=s.micro_batches, tokens_per_rank=s.tokens_per_rank)
        return RuntimeRequest(policies=self.policies, data=data, run=run)


@dataclass(kw_only=True)
class Result(Result):
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
    machine_load: dict = value(None)  # the load check before measuring (machine.QuietCheck); None: read runs


def read_measured(folder) -> dict:
    """PolicySummary rows of the summary.json files `relibra run --torchrun --out DIR` wrote on GPU nodes."""
    folder = resolve_path(folder)
    files = sorted(folder.rglob("summary.json")) if folder.exists() else []
    if not files:
        raise ConfigError(f"gpu profile: no measured runs (summary.json) in {folder}; run the GPU script of "
                          "docs/notebooks.md first, or pass measured_dir")
    runs = [json.loads(f.read_text())["results"] for f in files]  # one launch per file
    summaries = [PolicySummary(**r) for results in runs for r in results]
    launches = [i for i, results in enumerate(runs) for _ in results]
    return {"summaries": summaries, "launches": launches, "metrics": pd.DataFrame(), "hardware": summaries[0].hardware}


def measure(p: Params, s: Sizes) -> dict:
    """`repeats` launches through relibra.runtime.launch (gloo, loopback, 1 torch thread per rank):
    {"summaries": PolicySummary per launch and policy, "launches", "metrics" (with `repeat`), "hardware"}."""
    request = p.request(s)
    prepared = prepare(request, p.nproc)
    summaries, launches, parts = [], [], []
    # other work on the machine inflates wall-clock times: wait a while for a quiet one, else say so
    quiet = quiet_machine(s.quiet_wait_s, say=print)
    load_before = os.getloadavg()[0]
    for repeat in tqdm(range(s.repeats), desc="runtime launches", unit="launch"):
        result = RunResult.from_dict(launch(worker, p.nproc, request.run, prepared.runs, threads_per_rank=1,
                                            timeout_s=request.run.faults.collective_timeout_s))
        parts.append(frame(result.metric_rows(request.run.model.name, request.data.workload)).assign(repeat=repeat))
        summaries += summarise(result, prepared, request)
        launches += [repeat] * (len(summaries) - len(launches))
    load = max(load_before, os.getloadavg()[0])
    over = " OVERSUBSCRIBED (ranks > cores: times say nothing about speed)" if oversubscribed(p.nproc) else ""
    busy = f"; BUSY: 1-min load {quiet.load_at_start:.1f} on {quiet.cores} cores at the start" if quiet.busy else ""
    return {"summaries": summaries, "launches": launches, "metrics": pd.concat(parts, ignore_index=True),
            "hardware": f"{summaries[0].hardware}; 1-min load average up to {load:.1f}{busy}{over}",
            "machine_load": dataclasses.asdict(quiet)}


def compute(p: Params, s: Sizes) -> Result:
    """Measured launches next to the simulator (the gpu profile: runs measured on GPU nodes)."""
    measured = read_measured(p.measured_dir) if s.measured_dir else measure(p, s)
    summaries, launches = measured["summaries"], measured["launches"]
    first = summaries[0]
    topo = runtime_topology(first.ranks, first.ranks_per_node)
    label = (f"measured ({measured['hardware']}) vs simulated ({topo.name} preset, {topo.num_nodes} x "
             f"{topo.gpus_per_node}) | model {first.model}, EP {first.ranks}, {s.micro_batches} "
             f"micro-batches x {first.steps} timed steps per policy, policies alternating step by step, "
             f"{len(set(launches))} launch(es), seed {p.seed}")
    rank_times = pd.DataFrame([{"repeat": i, "policy": x.policy, "rank": g, "cpu_s": c, "wall_s": w, "wait_s": t}
                               for x, i in zip(summaries, launches)
                               for g, (c, w, t) in enumerate(zip(x.cpu_s_per_rank, x.wall_s_per_rank,
                                                                 x.wait_s_per_rank))])
    recorded, where = recorded_runtime()
    return Result(measured=measured["metrics"], step_results=summary_frame(summaries).assign(repeat=launches),
                  step_segments=pd.concat([segment_frame([x]).assign(repeat=i) for x, i in zip(summaries, launches)],
                                          ignore_index=True),
                  rank_times=rank_times,
                  recorded_step_results=recorded.assign(date=where["date"], cpus=where["machine"]["cpus"]),
                  label=label, hardware=measured["hardware"], machine_load=measured.get("machine_load"))


@dataclass(frozen=True)
class Versus:
    """One policy against Megatron in one table and layout: each launch's measured speed-up with its 95%
    interval (and on process CPU time; () without one), the ratio of the medians, the simulated ratio."""

    policy: str
    launches: tuple[tuple[float, float, float], ...]
    cpu_launches: tuple[tuple[float, float, float], ...]
    measured: float
    simulated: float


@dataclass(frozen=True)
class Layout:
    table: str  # "this run" or "the shipped reference"
    layout: str  # nodes x ranks ("": one layout)
    steps: tuple[tuple[str, float, float], ...]  # (policy, measured, simulated step seconds: medians over launches)
    versus: tuple[Versus, ...]  # () without Megatron
    oversubscribed: bool


@dataclass(frozen=True)
class Summary:
    hardware: str
    recorded: str  # the shipped reference: how it was measured ("" when none ships)
    layouts: tuple[Layout, ...]
    segments: str  # per policy, the step's segments (runtime.measure.runtime_segments_story)
    agreement: str  # measured vs simulated (runtime.measure.runtime_agreement)
    busy: str = ""  # the warning of a run measured on a busy machine ("" when it was quiet)


def _launches(rows: pd.DataFrame, prefix: str) -> tuple:
    """(speed-up, interval low, high) per launch of `rows`, () where they have no interval."""
    cols = [f"{prefix}speedup_vs_megatron", f"{prefix}speedup_ci_low", f"{prefix}speedup_ci_high"]
    return tuple(map(tuple, rows[cols].to_numpy())) if cols[1] in rows and rows[cols[1]].notna().all() else ()


def _versus(d: pd.DataFrame, g: pd.DataFrame) -> tuple[Versus, ...]:
    """Each policy of table `d` against Megatron; g: the medians over launches per policy (measured, sim)."""
    ref = g.loc["megatron"]
    return tuple(Versus(p, _launches(d[d["policy"] == p], ""), _launches(d[d["policy"] == p], "cpu_"),
                        ref.measured / x.measured, ref.sim / x.sim) for p, x in g.drop(index="megatron").iterrows())


def summarize(r: Result) -> Summary:
    rec, layouts = r.recorded_step_results, []
    recorded = ("" if rec.empty else f"**measured** on a {unique(rec, 'cpus')}-core machine, {unique(rec, 'date')}, "
                f"1-min load {rec['load_before'].min():.1f}-{rec['load_after'].max():.1f}, {rec['launch'].nunique()} "
                f"launch(es) x {unique(rec, 'steps')} timed steps per policy, policies alternating step by step; "
                "simulated on the CPU preset fitted just before (data/runtime_measured.json, "
                "`scripts/measure_runtime.py --calibrate`)")
    for name, t in (("this run", r.step_results), ("the shipped reference", rec)):
        if t.empty or "step_s_median" not in t:
            continue
        for layout, d in (t.groupby("nodes_x_ranks", sort=False) if "nodes_x_ranks" in t else [("", t)]):
            g = d.groupby("policy", sort=False).agg(measured=("step_s_median", "median"), sim=("sim_step_s", "median"))
            layouts.append(Layout(name, layout, tuple((p, x.measured, x.sim) for p, x in g.iterrows()),
                                  _versus(d, g) if "megatron" in g.index else (),
                                  "oversubscribed" in d and bool(d["oversubscribed"].any())))
    segments = runtime_segments_story(r.step_segments, WAITING) if len(r.step_segments) else ""
    return Summary(r.hardware, recorded, tuple(layouts), segments,
                   runtime_agreement(r.step_results) if len(r.step_results) else "",
                   (r.machine_load or {}).get("warning", ""))


def story(s: Summary) -> str:
    return (f"**Warning: {s.busy}.**\n\n" if s.busy else "") + s.segments + "\n\n" + s.agreement


def facts(r: Result, scale: str) -> list[Fact]:
    """Per table (this run, the shipped reference) and layout: each policy's measured and simulated step
    seconds (medians over launches); each policy's speed-up over Megatron per launch with its 95% interval
    (and on process CPU time) where the table has one, else the ratio of the medians; the simulated ratio."""
    s, out = summarize(r), []
    on = {"this run": f"{s.hardware}; simulated on the fitted CPU preset; {scale}" + (f"; warning: {s.busy}"
                                                                                      if s.busy else ""),
          "the shipped reference": s.recorded.removeprefix("**measured** on ")}
    for x in s.layouts:
        title = (f"runtime step time on the CPU, {x.table} (median over launches)"
                 + (f", {x.layout} (nodes x ranks)" if x.layout else "")
                 + (" (OVERSUBSCRIBED: ranks > cores)" if x.oversubscribed else ""))
        show = dict(on=on[x.table], readme=title)
        for p, measured, simulated in x.steps:
            out += [Fact("step_s", measured, "s", "measured", short(p), "measured", **show),
                    Fact("step_s", simulated, "s", "simulated", short(p), **show)]
        for v in x.versus:
            for fact, launches in (("speedup_vs_megatron", v.launches), ("cpu_speedup_vs_megatron", v.cpu_launches)):
                for i, (ratio, lo, hi) in enumerate(launches):
                    of = f"{short(v.policy)}, launch {i + 1}"
                    out += [Fact(fact, y, "x", stat, of, "measured", **show)
                            for stat, y in (("measured", ratio), ("95% low", lo), ("95% high", hi))]
            if not v.launches:
                out.append(Fact("speedup_vs_megatron", v.measured, "x", "measured", short(v.policy), "measured",
                                **show))
            out.append(Fact("speedup_vs_megatron", v.simulated, "x", "simulated", short(v.policy), **show))
    return out
