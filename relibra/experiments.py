"""What the notebooks call: every experiment of the kit as a function that returns a tidy DataFrame.

A notebook holds parameters, narrative and calls; the computation lives here (tested) and every
figure in relibra.plots. Each notebook starts with

    run = start("02_throughput", profile=profile, out_dir=out_dir, model=model, ...)

which resolves the notebook's parameters against a *profile* (sizes that fit a machine), makes
`results/<notebook>/`, and returns a `Run` that saves figures (PNG + SVG) and CSVs there and, at
`run.finish()`, a `manifest.json` that relibra.report turns into results/REPORT.md.

Profiles (PROFILES):
- tiny:   seconds per notebook; the tests run every notebook with it.
- laptop: the default; all ten notebooks within 20 minutes on 2 CPU cores. Paper-shaped models
          (128 experts, top-8, paper EP sizes and cluster) cut to their first few MoE layers and a
          few micro-batches per step, so the per-layer balance problem is the paper's.
- paper:  the paper's scale: every layer, 32 micro-batches per step, EP 32.
- gpu:    the paper's scale for simulations; measured results (runtime metrics written by
          `relibra run` under torchrun/NCCL on GPU nodes) are read from `measured_dir`.

Same seed, same numbers: every trace comes from the seed; wall-clock figures (planner seconds, the
runtime's measured times) are measurements and vary run to run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from relibra.cluster import ModelShape, Topology, get_model, get_topology
from relibra.errors import ConfigError

NOTEBOOKS = (
    "00_tutorial",
    "01_routing_dynamics",
    "02_throughput",
    "03_ablation",
    "04_reordering",
    "05_replication",
    "06_skewness",
    "07_overheads",
    "08_runtime",
    "09_rl_workload",
)

MAIN_POLICIES = ("megatron", "eplb", "eplb+", "lplb+", "llep", "relibra", "balanced")
ABLATION_POLICIES = ("megatron", "relibra-reorder", "relibra-replicate", "relibra", "balanced")
REORDER_POLICIES = ("relibra-replicate", "relibra-lpt", "relibra")
REPLICATION_POLICIES = ("relibra-reorder", "relibra-split", "relibra")
SKEW_POLICIES = ("megatron", "eplb", "eplb+", "lplb+", "llep", "relibra")
OVERHEAD_POLICIES = ("eplb", "eplb+", "lplb+", "llep", "relibra")

# Policies each notebook compares by default (its `policies` parameter overrides).
NOTEBOOK_POLICIES: dict[str, tuple[str, ...]] = {
    "00_tutorial": ("megatron", "relibra-reorder", "relibra-replicate", "relibra"),
    "01_routing_dynamics": ("megatron",),
    "02_throughput": MAIN_POLICIES,
    "03_ablation": ABLATION_POLICIES,
    "04_reordering": REORDER_POLICIES + ("megatron",),
    "05_replication": REPLICATION_POLICIES + ("megatron",),
    "06_skewness": SKEW_POLICIES,
    "07_overheads": OVERHEAD_POLICIES,
    "08_runtime": ("megatron", "relibra"),
    "09_rl_workload": ("megatron", "eplb", "eplb+", "relibra", "balanced"),
}

# The paper's headline claims (abstract), next to which REPORT.md puts the kit's figures.
PAPER_CLAIMS = {
    "relibra_vs_megatron": "up to 1.6x",
    "relibra_vs_eplb+": "up to 1.2x",
    "relibra_gap_to_balanced": "within 6-10%",
}


@dataclass(frozen=True)
class Profile:
    """Sizes of every experiment for one kind of machine.

    models / workloads: the grid of notebooks 02, 03 and 05; model / workload: the single case of
    notebooks 01, 04 and 07. layers: keep only the first `layers` MoE layers of each model (None:
    all). micro_batches and steps: per trace. ep_sizes: the EP sweep of notebook 06.
    runtime_*: the gloo run of notebook 08 (world size, simulated nodes, steps, model, tokens).
    rl_steps: GRPO steps of notebook 09. measured_dir: folder of measured results (gpu profile).
    """

    name: str
    description: str
    models: tuple[str, ...]
    workloads: tuple[str, ...]
    model: str
    workload: str
    ep: int
    ep_sizes: tuple[int, ...]
    cluster: str
    steps: int
    micro_batches: int
    layers: int | None
    tokens_per_rank: int | None = None
    planner_repeats: int = 1
    runtime_nproc: int = 4
    runtime_nodes: int = 2
    runtime_steps: int = 3
    runtime_model: str = "small"
    runtime_workload: str = "math"
    runtime_tokens_per_rank: int = 256
    runtime_micro_batches: int = 2
    runtime_repeats: int = 2
    rl_steps: int = 20
    measured_dir: str | None = None


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in [
        Profile("tiny", "seconds per notebook, for the tests: the `tiny` model (4 layers, 16 experts, top-2) "
                "on the cpu-gloo cluster preset", models=("tiny",), workloads=("math",), model="tiny",
                workload="mixed", ep=4, ep_sizes=(2, 4), cluster="cpu-gloo", steps=3, micro_batches=4,
                layers=None, tokens_per_rank=64, runtime_nproc=2, runtime_nodes=1, runtime_steps=1,
                runtime_model="tiny", runtime_tokens_per_rank=32, runtime_micro_batches=1,
                runtime_repeats=1, rl_steps=2),
        Profile("laptop", "minutes on 2 CPU cores: the paper's models, EP and cluster, cut to 4 MoE layers, "
                "8 micro-batches per step and 4 steps", models=("qwen3-30b-a3b", "glm-4.5-air", "qwen3-235b-a22b"),
                workloads=("math", "science", "instruct", "code", "mixed"), model="qwen3-235b-a22b",
                workload="mixed", ep=32, ep_sizes=(8, 16, 32, 64), cluster="paper", steps=4, micro_batches=8,
                layers=4, runtime_steps=3, rl_steps=20),
        Profile("paper", "the paper's scale: every MoE layer, 32 micro-batches per step, EP 32 on the paper's "
                "cluster (20 nodes x 8 Hopper GPUs); hours on a CPU", models=("qwen3-30b-a3b", "glm-4.5-air",
                "qwen3-235b-a22b"), workloads=("math", "science", "instruct", "code", "mixed"),
                model="qwen3-235b-a22b", workload="mixed", ep=32, ep_sizes=(8, 16, 32, 64), cluster="paper",
                steps=6, micro_batches=32, layers=None, planner_repeats=3, runtime_steps=5, runtime_repeats=3,
                rl_steps=60),
        Profile("gpu", "the paper's scale for the simulations; measured results of real runs on GPU nodes are "
                "read from `measured_dir` (default results/gpu_runs)", models=("qwen3-30b-a3b", "glm-4.5-air",
                "qwen3-235b-a22b"), workloads=("math", "science", "instruct", "code", "mixed"),
                model="qwen3-235b-a22b", workload="mixed", ep=32, ep_sizes=(8, 16, 32, 64), cluster="paper",
                steps=6, micro_batches=32, layers=None, planner_repeats=3, rl_steps=60,
                measured_dir="results/gpu_runs"),
    ]
}


def get_profile(name: str) -> Profile:
    """The profile called `name`; a ConfigError lists the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None


# ---- configuration of one notebook run -----------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """A notebook's parameters resolved against its profile (every field filled)."""

    notebook: str
    profile: str
    models: tuple[str, ...]
    workloads: tuple[str, ...]
    model: str
    workload: str
    ep: int
    ep_sizes: tuple[int, ...]
    cluster: str
    policies: tuple[str, ...]
    steps: int
    micro_batches: int
    layers: int | None
    tokens_per_rank: int | None
    seed: int
    out_dir: Path
    measured_dir: Path | None
    sizes: Profile
    extra: dict = field(default_factory=dict)

    def topology(self) -> Topology:
        return get_topology(self.cluster)

    def model_shape(self, name: str | None = None) -> ModelShape:
        """The preset `name` (default: self.model), cut to the profile's first `layers` MoE layers."""
        return scaled_model(name or self.model, self.layers)

    def scale_note(self) -> str:
        """One line on how far this run is from the paper's scale, for captions."""
        layers = "all MoE layers" if self.layers is None else f"first {self.layers} MoE layers"
        return f"{self.profile} profile: {layers}, {self.micro_batches} micro-batches x {self.steps} steps, seed {self.seed}"

    def simulated_label(self) -> str:
        """'simulated (<cluster preset>: nodes x GPUs)' for titles."""
        topo = self.topology()
        return f"simulated ({topo.name} cluster preset, {topo.num_nodes} x {topo.gpus_per_node} GPUs)"

    def trace_label(self, model: str | None = None, ep: int | None = None) -> str:
        """Provenance of routing statistics that need no cluster: the synthetic trace generator."""
        return (f"simulated routing: synthetic RL traces of {model or self.model}, EP {ep or self.ep} "
                f"(no cluster involved) | {self.scale_note()}")

    def plan_label(self, ep: str | int | None = None) -> str:
        """Provenance of plan statistics (no cost model): policies' plans on synthetic traces."""
        topo = self.topology()
        return (f"simulated: policies' plans on synthetic RL traces of {self.model}, EP {ep or self.ep}, nodes of "
                f"{topo.gpus_per_node} GPUs ({topo.name} cluster preset; no cost model) | {self.scale_note()}")

    def sim_subtitle(self) -> str:
        return f"{self.simulated_label()} | {self.scale_note()}"

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sizes"}
        d["out_dir"] = str(self.out_dir)
        d["measured_dir"] = None if self.measured_dir is None else str(self.measured_dir)
        return _jsonable(d)


def scaled_model(name: str, layers: int | None) -> ModelShape:
    """Model preset `name`, keeping only its first `layers` MoE layers (all when None or larger).

    The per-layer balance problem (experts, top-k, hidden sizes) is the preset's; only the number of
    layers summed per step shrinks, which leaves throughput *ratios* between policies comparable.
    """
    shape = get_model(name)
    if layers is None or layers >= shape.num_layers:
        return shape
    if layers <= 0:
        raise ConfigError(f"layers must be positive, got {layers}")
    return dataclasses.replace(shape, num_layers=int(layers))


def project_root() -> Path:
    """The repository root (holding pyproject.toml) when running from a checkout, else the cwd."""
    here = Path(__file__).resolve().parents[1]
    return here if (here / "pyproject.toml").exists() else Path.cwd()


def _resolve_dir(path: str | os.PathLike) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else project_root() / p


def _as_tuple(value, cast=str) -> tuple | None:
    """None -> None; 'a,b' or ['a', 'b'] -> ('a', 'b'); a scalar -> (scalar,)."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    try:
        return tuple(cast(v) for v in items)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"cannot read {value!r}: {exc}") from None


def resolve(notebook: str, profile: str = "laptop", out_dir: str | os.PathLike | None = None,
            model=None, workload=None, ep=None, cluster=None, policies=None, steps=None, seed: int = 0,
            micro_batches=None, layers=None, ep_sizes=None, measured_dir=None, **extra) -> Config:
    """Fill a notebook's parameters from its profile; None means 'the profile's default'.

    model / workload / policies / ep_sizes take one value, a list, or a comma-separated string
    (papermill -p passes strings). A list of models or workloads sets the grid of notebooks 02-05;
    its first element is the single case of the others.
    """
    if notebook not in NOTEBOOKS:
        raise ConfigError(f"unknown notebook {notebook!r}; known: {', '.join(NOTEBOOKS)}")
    sizes = get_profile(profile)
    models = _as_tuple(model) or sizes.models
    workloads = _as_tuple(workload) or sizes.workloads
    for m in models:
        get_model(m)
    cfg = Config(
        notebook=notebook,
        profile=profile,
        models=models,
        workloads=workloads,
        model=models[0] if model not in (None, "") else sizes.model,
        workload=workloads[0] if workload not in (None, "") else sizes.workload,
        ep=int(ep) if ep not in (None, "") else sizes.ep,
        ep_sizes=_as_tuple(ep_sizes, int) or sizes.ep_sizes,
        cluster=cluster or sizes.cluster,
        policies=_as_tuple(policies) or NOTEBOOK_POLICIES[notebook],
        steps=int(steps) if steps not in (None, "") else sizes.steps,
        micro_batches=int(micro_batches) if micro_batches not in (None, "") else sizes.micro_batches,
        layers=(None if layers in ("all", 0) else int(layers)) if layers not in (None, "") else sizes.layers,
        tokens_per_rank=sizes.tokens_per_rank,
        seed=int(seed),
        out_dir=_resolve_dir(out_dir if out_dir not in (None, "") else Path("results") / notebook),
        measured_dir=_resolve_dir(measured_dir or sizes.measured_dir) if (measured_dir or sizes.measured_dir) else None,
        sizes=sizes,
        extra={k: v for k, v in extra.items() if v is not None},
    )
    from relibra.workloads import WORKLOADS

    for w in cfg.workloads + (cfg.workload,):
        if w not in WORKLOADS:
            raise ConfigError(f"unknown workload {w!r}; known: {', '.join(WORKLOADS)}")
    get_topology(cfg.cluster)
    if cfg.steps < 1 or cfg.micro_batches < 1:
        raise ConfigError(f"steps and micro_batches must be >= 1, got {cfg.steps} and {cfg.micro_batches}")
    return cfg


# ---- one notebook run: where figures and tables go ----------------------------------------------
class Run:
    """Saves a notebook's figures and tables under `config.out_dir` and records them in a manifest.

    Each saved figure carries its caption and whether it shows simulated or measured numbers (and on
    what hardware); relibra.report reads `manifest.json` to write results/REPORT.md.
    """

    def __init__(self, config: Config):
        self.config = config
        self.started = time.perf_counter()
        self.figures: list[dict] = []
        self.tables: list[dict] = []
        self.sources: dict[str, dict] = {}
        self.facts: dict = {}
        config.out_dir.mkdir(parents=True, exist_ok=True)

    @property
    def out_dir(self) -> Path:
        return self.config.out_dir

    def save_csv(self, table: pd.DataFrame, name: str, description: str = "") -> Path:
        """Write `table` as results/<notebook>/<name>.csv (tidy: one row per observation)."""
        path = self.out_dir / f"{name}.csv"
        table.to_csv(path, index=False, float_format="%.6g")
        self.tables.append({"file": path.name, "rows": int(len(table)), "description": description})
        return path

    def save_figure(self, fig, name: str, caption: str, source: str = "simulated", hardware: str | None = None) -> list[Path]:
        """Write `fig` as <name>.png and <name>.svg; source is 'simulated' or 'measured'."""
        from relibra.plots import save_figure

        if source not in ("simulated", "measured", "synthetic", "real"):
            raise ConfigError(f"figure source must be simulated, measured, synthetic or real, got {source!r}")
        hardware = hardware or (self.config.cluster if source == "simulated" else "this machine")
        paths = save_figure(fig, self.out_dir / name)
        self.figures.append({"name": name, "png": paths[0].name, "svg": paths[1].name, "caption": caption,
                             "source": source, "hardware": hardware})
        self.sources.setdefault(f"{source}|{hardware}", {"source": source, "hardware": hardware})
        return paths

    def note(self, **facts) -> None:
        """Record headline numbers (JSON-serializable) for REPORT.md."""
        self.facts.update(_jsonable(facts))

    def finish(self) -> Path:
        """Write manifest.json (parameters, figures, tables, sources, facts, wall seconds)."""
        manifest = {
            "notebook": self.config.notebook,
            "config": self.config.to_dict(),
            "scale_note": self.config.scale_note(),
            "figures": self.figures,
            "tables": self.tables,
            "sources": list(self.sources.values()),
            "facts": self.facts,
            "wall_seconds": round(time.perf_counter() - self.started, 2),
        }
        path = self.out_dir / "manifest.json"
        path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        return path


def start(notebook: str, **params) -> Run:
    """Resolve a notebook's parameters (see `resolve`), set plot style, and open its Run."""
    from relibra.plots import set_style

    set_style()
    return Run(resolve(notebook, **params))


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj


# ---- environment ------------------------------------------------------------------------------
def environment() -> dict:
    """The software and hardware a run used: versions, CPU count, GPU if any."""
    from importlib import metadata

    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    try:
        usable_cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        usable_cpus = os.cpu_count()
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus,
        "relibra": version("relibra"),
        "torch": version("torch"),
        "megatron-core": version("megatron-core"),
        "numpy": version("numpy"),
        "pandas": version("pandas"),
        "scipy": version("scipy"),
        "seaborn": version("seaborn"),
        "papermill": version("papermill"),
        "executable": sys.executable,
        "load_average_1min": round(os.getloadavg()[0], 2),  # other work inflates every measured time
    }
    try:  # the kit's revision, when run from a git checkout (read-only)
        import subprocess

        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=project_root(), capture_output=True,
                             text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=project_root(), capture_output=True, text=True,
                               timeout=5)
        if rev.returncode == 0:
            env["git_commit"] = rev.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch

        env["cuda_available"] = bool(torch.cuda.is_available())
        env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
        env["torch_threads"] = torch.get_num_threads()
    except Exception:  # torch missing or broken: report, do not fail the report
        env["cuda_available"] = False
        env["gpu"] = "unknown"
    return env


# ---- headline ratios -------------------------------------------------------------------------
def headline_ratios(throughput: pd.DataFrame) -> pd.DataFrame:
    """The paper's three headline ratios from a throughput table.

    throughput: one row per (model, workload, policy) with `tokens_per_s` (other grouping columns
    such as ep or cluster are kept as part of the case). Returns one row per claim: the best case
    ("up to"), the range over cases, the number of cases, and the paper's figure.
    """
    keys = [c for c in ("model", "workload", "ep", "cluster") if c in throughput]
    wide = throughput.pivot_table(index=keys, columns="policy", values="tokens_per_s", aggfunc="mean")
    rows = []

    def case(idx) -> str:
        return ", ".join(str(v) for v in (idx if isinstance(idx, tuple) else (idx,)))

    for other, claim, label in (("megatron", "relibra_vs_megatron", "ReLibra / Megatron"),
                                ("eplb+", "relibra_vs_eplb+", "ReLibra / EPLB+ (oracle)")):
        if "relibra" in wide and other in wide:
            ratio = (wide["relibra"] / wide[other]).dropna()
            if len(ratio):
                rows.append({"claim": label, "paper": PAPER_CLAIMS[claim], "kit": f"up to {ratio.max():.2f}x",
                             "range": f"{ratio.min():.2f}x - {ratio.max():.2f}x", "mean": float(ratio.mean()),
                             "where_best": case(ratio.idxmax()), "cases": int(len(ratio))})
    if "relibra" in wide and "balanced" in wide:
        gap = (1.0 - wide["relibra"] / wide["balanced"]).dropna()
        if len(gap):
            rows.append({"claim": "gap to Balanced (1 - ReLibra / Balanced)",
                         "paper": PAPER_CLAIMS["relibra_gap_to_balanced"],
                         "kit": f"within {100 * gap.min():.1f}-{100 * gap.max():.1f}%",
                         "range": f"{100 * gap.min():.1f}% - {100 * gap.max():.1f}%", "mean": float(gap.mean()),
                         "where_best": case(gap.idxmin()), "cases": int(len(gap))})
    return pd.DataFrame(rows, columns=["claim", "paper", "kit", "range", "mean", "where_best", "cases"])


# ---- traces and plans ------------------------------------------------------------------------
_TRACE_CACHE: dict[tuple, object] = {}


def make_trace(cfg: Config, model: str | None = None, workload: str | None = None, ep: int | None = None,
               steps: int | None = None, seed: int | None = None):
    """The synthetic RL routing trace of (model, workload, ep) at the config's scale (cached per kernel).

    Returns a RoutingTrace with loads int32 [steps, micro_batches, layers, ep, experts].
    """
    from relibra.workloads import generate_trace

    shape = cfg.model_shape(model)
    key = (shape, workload or cfg.workload, int(ep or cfg.ep), int(steps or cfg.steps), cfg.micro_batches,
           cfg.tokens_per_rank, int(cfg.seed if seed is None else seed))
    if key not in _TRACE_CACHE:
        _TRACE_CACHE[key] = generate_trace(shape, key[1], key[2], key[3], seed=key[6], micro_batches=key[4],
                                           tokens_per_rank=key[5])
    return _TRACE_CACHE[key]


def workload_traces(cfg: Config, model: str | None = None, ep: int | None = None) -> dict:
    """{workload: trace} of cfg.model (or `model`) at cfg.ep (or `ep`) for every workload of the config
    (cfg.workload included)."""
    names = list(dict.fromkeys(list(cfg.workloads) + [cfg.workload]))
    return {w: make_trace(cfg, model=model, workload=w, ep=ep) for w in names}


def _gpus_per_node(topology: Topology, ep: int) -> int:
    return topology.ep_layout(ep)[1]


def plan_steps(trace, policy: str, gpus_per_node: int, steps: list[int] | None = None, **params) -> list:
    """StepPlans of `policy` for the given steps (default all), each placement feeding the next.

    Returns a list of (step, plan, plan_seconds) with plan_seconds the measured wall time of planning.
    """
    from relibra.policies import get_policy

    pol = get_policy(policy, **params)
    out = []
    prev_home = None
    for step in (range(trace.num_steps) if steps is None else steps):
        t0 = time.perf_counter()
        plan = pol.plan(trace, step, gpus_per_node, prev_home=prev_home)
        seconds = time.perf_counter() - t0
        out.append((step, plan, seconds))
        prev_home = plan.home
    return out


# ---- 01 routing dynamics -------------------------------------------------------------------------
def expert_load_table(trace, step: int = 0, layer: int = 0) -> pd.DataFrame:
    """Tokens per expert in every micro-batch of one (step, layer), and in every whole step of that layer.

    Columns: scope ('micro-batch' or 'step'), step, micro_batch (-1 for whole steps), layer, expert,
    tokens, share (of that micro-batch's or step's token-slots).
    """
    el = trace.expert_load()  # [S, M, L, E]
    mb = el[step, :, layer]  # [M, E]
    st = el[:, :, layer].sum(axis=1)  # [S, E]
    m, e = mb.shape
    rows_mb = pd.DataFrame({
        "scope": "micro-batch", "step": step, "micro_batch": np.repeat(np.arange(m), e), "layer": layer,
        "expert": np.tile(np.arange(e), m), "tokens": mb.ravel(),
        "share": (mb / np.maximum(mb.sum(-1, keepdims=True), 1)).ravel()})
    s = st.shape[0]
    rows_st = pd.DataFrame({
        "scope": "step", "step": np.repeat(np.arange(s), e), "micro_batch": -1, "layer": layer,
        "expert": np.tile(np.arange(e), s), "tokens": st.ravel(),
        "share": (st / np.maximum(st.sum(-1, keepdims=True), 1)).ravel()})
    return pd.concat([rows_mb, rows_st], ignore_index=True)


SHIFT_COMPARISONS = {
    # key in trace.shift_stats -> (comparison, metric)
    "mb_hot_overlap": ("consecutive micro-batches", "hot-expert overlap"),
    "mb_corr": ("consecutive micro-batches", "load correlation"),
    "mb_vs_step_hot_overlap": ("micro-batch vs its own step", "hot-expert overlap"),
    "mb_vs_step_corr": ("micro-batch vs its own step", "load correlation"),
    "step_hot_overlap": ("consecutive steps", "hot-expert overlap"),
    "step_corr": ("consecutive steps", "load correlation"),
    "history_hot_overlap": ("step vs history prediction", "hot-expert overlap"),
    "history_corr": ("step vs history prediction", "load correlation"),
    "history_mb_hot_overlap": ("micro-batch vs history prediction", "hot-expert overlap"),
}


def shift_table(traces: dict[str, object], hot_frac: float = 0.1, history_window: int = 4) -> pd.DataFrame:
    """How far hot experts move, per trace (e.g. per workload), as a tidy table.

    traces: {label: RoutingTrace}. Columns: trace, comparison, metric, value (hot-expert overlap is
    the share of the hottest `hot_frac` experts found again among the other's hottest; 1 = same).
    """
    from relibra.trace import shift_stats

    rows = []
    for label, trace in traces.items():
        stats = shift_stats(trace.expert_load(), hot_frac=hot_frac, history_window=history_window)
        for key, (comparison, metric) in SHIFT_COMPARISONS.items():
            rows.append({"trace": label, "comparison": comparison, "metric": metric, "value": stats[key]})
    return pd.DataFrame(rows)


def distribution_distance(actual: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Total-variation distance between load vectors normalized to shares, along the last axis.

    = the share of token-slots that the prediction puts on the wrong experts (0 = exact, 1 = disjoint).
    """
    a = actual / np.maximum(actual.sum(-1, keepdims=True), 1e-12)
    p = predicted / np.maximum(predicted.sum(-1, keepdims=True), 1e-12)
    return 0.5 * np.abs(a - p).sum(-1)


def prediction_error_table(traces: dict[str, object], history_window: int = 4) -> pd.DataFrame:
    """How wrong predicted expert loads are, per (trace, predictor, target, step, micro_batch, layer).

    Predictors: 'history' (moving average of up to `history_window` previous whole steps, what
    EPLB is fed), 'this step (oracle)' (the exact whole-step load, what EPLB+ is given). Targets:
    'whole step' and 'micro-batch'. error = total-variation distance of the load shares (share of
    token-slots predicted on the wrong experts). Steps from 1 on (step 0 has no history).
    """
    from relibra.trace import history_prediction

    frames = []
    for label, trace in traces.items():
        el = trace.expert_load().astype(np.float64)  # [S, M, L, E]
        s, m, l, _ = el.shape
        if s < 2:
            continue
        step = el.sum(axis=1)  # [S, L, E]
        hist = history_prediction(step, history_window)  # [S-1, L, E]
        cases = {
            ("history", "whole step"): distribution_distance(step[1:], hist)[:, None, :],  # [S-1, 1, L]
            ("history", "micro-batch"): distribution_distance(el[1:], hist[:, None]),  # [S-1, M, L]
            ("this step (oracle)", "micro-batch"): distribution_distance(el[1:], step[1:, None]),
        }
        for (predictor, target), err in cases.items():
            ss, mm, ll = np.meshgrid(np.arange(1, s), np.arange(err.shape[1]), np.arange(l), indexing="ij")
            frames.append(pd.DataFrame({
                "trace": label, "predictor": predictor, "target": target, "step": ss.ravel(),
                "micro_batch": mm.ravel() if target == "micro-batch" else -1, "layer": ll.ravel(),
                "error": err.ravel()}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["trace", "predictor", "target", "step", "micro_batch", "layer", "error"])


def static_skewness_table(traces: dict[str, object]) -> pd.DataFrame:
    """Rank skewness (max / mean tokens per EP rank) under static contiguous placement, per
    (trace, step, micro_batch, layer), and of the whole step ('micro_batch' = -1)."""
    from relibra.trace import skewness

    frames = []
    for label, trace in traces.items():
        rl = trace.rank_load()  # [S, M, L, ep]
        sk = skewness(rl)
        s, m, l = sk.shape
        ss, mm, ll = np.meshgrid(np.arange(s), np.arange(m), np.arange(l), indexing="ij")
        frames.append(pd.DataFrame({"trace": label, "scope": "micro-batch", "step": ss.ravel(),
                                    "micro_batch": mm.ravel(), "layer": ll.ravel(), "skewness": sk.ravel()}))
        whole = skewness(rl.sum(axis=1))  # [S, L]
        s2, l2 = np.meshgrid(np.arange(s), np.arange(l), indexing="ij")
        frames.append(pd.DataFrame({"trace": label, "scope": "whole step", "step": s2.ravel(), "micro_batch": -1,
                                    "layer": l2.ravel(), "skewness": whole.ravel()}))
    return pd.concat(frames, ignore_index=True)


# ---- 00 tutorial -------------------------------------------------------------------------------
TUTORIAL_MODEL = ModelShape("tutorial", num_layers=1, num_experts=16, top_k=2, hidden=2048, moe_ffn=768,
                            num_attention_heads=32, num_kv_heads=4, head_dim=128)
TUTORIAL_PLACEMENTS = ("static", "search", "lpt")


def tutorial_topology() -> Topology:
    """The paper's GPUs and links, cut to 2 nodes x 2 GPUs so the toy layer spans two nodes."""
    return get_topology("paper").with_changes(name="paper-2x2", num_nodes=2, gpus_per_node=2)


def tutorial_trace(skew: float = 1.2, shift: float = 0.5, seed: int = 0, micro_batches: int = 4,
                   tokens_per_rank: int = 4096, ep: int = 4):
    """A one-layer, one-step routing trace of TUTORIAL_MODEL (16 experts, top-2) over `ep` ranks.

    Expert popularity is Zipf: share of the expert ranked r is proportional to (r + 1) ** -skew. The
    ranking starts as a random permutation; before each further micro-batch a share `shift` of the
    ranking positions is reshuffled among themselves (0: hot experts never move; 1: new ranking).
    Every src rank's tokens pick top-k distinct experts from that micro-batch's shares.
    Returns a RoutingTrace with loads int32 [1, micro_batches, 1, ep, 16].
    """
    from relibra.trace import RoutingTrace
    from relibra.workloads import sample_topk_counts

    if skew < 0 or not 0 <= shift <= 1:
        raise ConfigError(f"tutorial: skew must be >= 0 and shift in [0, 1], got skew={skew}, shift={shift}")
    e, k = TUTORIAL_MODEL.num_experts, TUTORIAL_MODEL.top_k
    rng = np.random.default_rng(seed)
    zipf = (np.arange(e) + 1.0) ** -float(skew)
    zipf /= zipf.sum()
    ranking = rng.permutation(e)  # ranking[r] = expert at popularity rank r
    loads = np.zeros((1, micro_batches, 1, ep, e), dtype=np.int32)
    for m in range(micro_batches):
        if m > 0:
            moved = np.nonzero(rng.random(e) < shift)[0]
            ranking[moved] = ranking[rng.permutation(moved)]
        p = np.empty(e)
        p[ranking] = zipf
        loads[0, m, 0] = sample_topk_counts(rng, np.broadcast_to(p, (ep, e)).copy(), tokens_per_rank, k)
    return RoutingTrace(loads, TUTORIAL_MODEL, ep, tokens_per_rank * ep,
                        {"generator": "experiments.tutorial_trace", "skew": skew, "shift": shift, "seed": seed})


def tutorial_policy(placement: str, spare_slots: int) -> tuple[str, dict]:
    """(policy name, params) of the kit that implement a placement x spare-slots choice."""
    if placement not in TUTORIAL_PLACEMENTS:
        raise ConfigError(f"tutorial: placement must be one of {TUTORIAL_PLACEMENTS}, got {placement!r}")
    spare_slots = int(spare_slots)
    if spare_slots < 0:
        raise ConfigError(f"tutorial: spare_slots must be >= 0, got {spare_slots}")
    if spare_slots == 0:
        if placement == "lpt":  # LPT homes without replicas: relibra with both knobs set
            return "relibra", {"reorder": "lpt", "replicate": "none"}
        return {"static": "megatron", "search": "relibra-reorder"}[placement], {}
    name = {"static": "relibra-replicate", "search": "relibra", "lpt": "relibra-lpt"}[placement]
    return name, {"spare_slots_per_gpu": spare_slots}


def tutorial_case(placement: str = "static", spare_slots: int = 0, skew: float = 1.2, shift: float = 0.5,
                  micro_batch: int = 0, seed: int = 0, **_ignored) -> dict:
    """Plan and price the toy layer for one placement x spare-slots choice.

    Returns {"expert_tokens": tokens per (micro_batch, expert), "gpu_table": per (micro_batch, gpu):
    node, home_tokens, replica_tokens, tokens, expert_seconds (simulated forward GEMM seconds),
    "summary": one row per micro-batch (skewness, slowest and balanced seconds), "policy", "hardware"}.
    """
    from relibra.costs import cost_plan
    from relibra.trace import skewness

    trace = tutorial_trace(skew, shift, seed)
    topo = tutorial_topology()
    name, params = tutorial_policy(placement, spare_slots)
    gpn = _gpus_per_node(topo, trace.ep)
    (_, plan, plan_s), = plan_steps(trace, name, gpn, **params)
    cost = cost_plan(plan, TUTORIAL_MODEL, topo, planner_s=plan_s)
    m, e = trace.num_microbatches, trace.num_experts
    el = trace.expert_load()[0, :, 0]  # [M, E]
    expert_tokens = pd.DataFrame({"micro_batch": np.repeat(np.arange(m), e), "expert": np.tile(np.arange(e), m),
                                  "tokens": el.ravel(),
                                  "home_gpu": np.tile(plan.home[0], m)})
    total = plan.gpu_tokens()[:, 0]  # [M, ep]
    replica = plan.replica_flow[:, 0].sum(axis=(1, 3), dtype=np.int64)  # [M, ep]
    seconds = cost.expert_seconds_per_gpu[:, 0]  # [M, ep]
    ep = trace.ep
    gpu_table = pd.DataFrame({
        "policy": name, "placement": placement, "spare_slots": int(spare_slots),
        "micro_batch": np.repeat(np.arange(m), ep), "gpu": np.tile(np.arange(ep), m),
        "node": np.tile(np.arange(ep) // gpn, m), "tokens": total.ravel(), "replica_tokens": replica.ravel(),
        "home_tokens": (total - replica).ravel(), "replicas_held": plan.num_replicas()[:, 0].ravel(),
        "expert_seconds": seconds.ravel()})
    from relibra.costs import gemm_seconds, expert_flops_per_token

    # Balanced: every GPU computes the mean tokens, spread over its own experts (one GEMM each).
    mean_tokens = total.mean(axis=1)
    experts_per_gpu = e // ep
    balanced_s = experts_per_gpu * gemm_seconds(mean_tokens / experts_per_gpu, expert_flops_per_token(TUTORIAL_MODEL), topo)
    summary = pd.DataFrame({"micro_batch": np.arange(m), "policy": name, "skewness": skewness(total),
                            "slowest_gpu_ms": 1e3 * seconds.max(axis=1), "balanced_ms": 1e3 * balanced_s,
                            "experts_moved_from_static": int((plan.home[0] != np.arange(e) // (e // ep)).sum())})
    return {"expert_tokens": expert_tokens, "gpu_table": gpu_table, "summary": summary, "policy": name,
            "micro_batch": int(micro_batch), "hardware": f"{topo.name}: the paper's GPUs and links, 2 nodes x 2 GPUs",
            "plan": plan}


def tutorial_grid(skew: float = 1.2, shift: float = 0.5, seed: int = 0, spare_slots=(0, 1, 2)) -> pd.DataFrame:
    """Every placement x spare-slots choice on the same toy trace: mean skewness and slowest-GPU ms."""
    rows = []
    for placement in TUTORIAL_PLACEMENTS:
        for slots in spare_slots:
            case = tutorial_case(placement, slots, skew, shift, seed=seed)
            s = case["summary"]
            rows.append({"placement": placement, "spare_slots": int(slots), "policy": case["policy"],
                         "skewness": float(s["skewness"].mean()), "slowest_gpu_ms": float(s["slowest_gpu_ms"].mean()),
                         "balanced_ms": float(s["balanced_ms"].mean()), "hardware": case["hardware"]})
    return pd.DataFrame(rows)


# ---- simulation over a grid ---------------------------------------------------------------------
def history_steps(cfg: Config) -> int:
    """Steps simulated per trace: all but the first, which only serves as history for `eplb`."""
    return max(1, cfg.steps - 1)


def make_policy(name: str, cluster: str, **params):
    """get_policy(name, **params) configured for a run on `cluster` (relibra.policies.get_policy_for_cluster)."""
    from relibra.policies import get_policy_for_cluster

    return get_policy_for_cluster(name, cluster, **params)


def simulate_trace(cfg: Config, trace, policies=None, cluster: str | None = None, workload: str | None = None,
                   policy_params: dict | None = None, keep_costs: bool = False, with_result: bool = False):
    """Simulate `policies` (default cfg.policies) on `trace`; one summary row per policy.

    Returns a DataFrame with relibra.sim.SUMMARY_COLUMNS plus model, workload, ep, cluster
    (and the SimResult too when with_result).
    """
    from relibra.sim import simulate

    policies = list(policies or cfg.policies)
    cluster = cluster or cfg.cluster
    res = simulate(trace, cluster, policies, steps=min(history_steps(cfg), trace.num_steps),
                   policy_params=policy_params, progress=False,
                   workload=workload or str(trace.provenance.get("workload", "")), keep_costs=keep_costs)
    summary = res.summary.copy()
    summary.insert(0, "cluster", res.config["cluster"])
    summary.insert(0, "ep", trace.ep)
    summary.insert(0, "workload", res.config["workload"])
    summary.insert(0, "model", trace.model.name)
    summary["layers"] = trace.num_layers
    summary["micro_batches"] = trace.num_microbatches
    return (summary, res) if with_result else summary


def throughput_grid(cfg: Config, models=None, workloads=None, policies=None, progress: bool = True) -> pd.DataFrame:
    """Simulated throughput of every policy for every (model, workload) of the config.

    Returns one row per (model, workload, policy): tokens_per_s, speedup_vs_megatron, frac_of_balanced,
    skewness and the rest of relibra.sim.SUMMARY_COLUMNS.
    """
    from tqdm.auto import tqdm

    cases = [(m, w) for m in (models or cfg.models) for w in (workloads or cfg.workloads)]
    frames = []
    for model, workload in tqdm(cases, desc="model x workload", disable=not progress):
        trace = make_trace(cfg, model=model, workload=workload)
        frames.append(simulate_trace(cfg, trace, policies=policies, workload=workload))
    return pd.concat(frames, ignore_index=True)


def plan_metrics(plan, gpus_per_node: int) -> dict:
    """Plan-level figures the simulator's summary does not carry.

    node_skewness: mean over (micro_batch, layer) of max / mean tokens per node; gpu_skewness: the
    same per GPU; cross_node_share: share of dispatched token-expert pairs whose destination GPU is
    in another node than their source rank; replicas_per_gpu: mean occupied replica slots per GPU.
    """
    from relibra.trace import skewness

    gpu = plan.gpu_tokens()  # [M, L, ep]
    m, l, ep = gpu.shape
    nodes = ep // gpus_per_node
    node_tokens = gpu.reshape(m, l, nodes, gpus_per_node).sum(axis=3)
    matrix = plan.token_matrix()  # [M, L, src, dst]
    node = np.arange(ep) // gpus_per_node
    cross = (node[:, None] != node[None, :])
    total = matrix.sum()
    return {
        "gpu_skewness": float(skewness(gpu).mean()),
        "node_skewness": float(skewness(node_tokens).mean()) if nodes > 1 else 1.0,
        "cross_node_share": float((matrix * cross).sum() / total) if total > 0 else 0.0,
        "replicas_per_gpu": float(plan.num_replicas().mean()),
    }


def simulate_with_plans(cfg: Config, trace, policies, cluster: str | None = None,
                        policy_params: dict | None = None, workload: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """relibra.sim.simulate over cfg's steps, keeping plan-level figures per (policy, step) too.

    Returns (per_step, summary): per_step has one row per (policy, step) with the simulator's step
    figures (step_s, tokens, skewness, migration_s, plan_s, ...) plus `plan_metrics`, migration
    bytes, forward seconds and unhidden replica-transfer seconds; summary is the simulator's summary
    with those plan figures averaged per policy.
    """
    from relibra.cluster import resolve_topology
    from relibra.sim import simulate

    topo = resolve_topology(cluster or cfg.cluster)
    _, gpn = topo.ep_layout(trace.ep)

    def extras(plan, cost) -> dict:
        row = plan_metrics(plan, gpn)
        row["migration_gb"] = (cost.migration_bytes["intra_node"] + cost.migration_bytes["inter_node"]) / 1e9
        row["migration_inter_node_gb"] = cost.migration_bytes["inter_node"] / 1e9
        row["forward_s"] = float(sum(v.sum() for v in cost.forward.values()) + cost.extra_forward.sum())
        row["transfer_s"] = replica_transfer_seconds(plan, trace.model, topo)
        return row

    result = simulate(trace, topo, list(policies), steps=min(history_steps(cfg), trace.num_steps),
                      policy_params=policy_params, progress=False, workload=workload, step_extras=extras)
    per_step, summary = result.per_step, result.summary
    extra = per_step.groupby("policy")[["gpu_skewness", "node_skewness", "cross_node_share", "replicas_per_gpu",
                                        "migration_gb", "migration_inter_node_gb", "forward_s", "transfer_s",
                                        "exposed_transfer_s"]].mean()
    summary = summary.join(extra, on="policy")
    labels = {"model": trace.model.name, "workload": workload or str(trace.provenance.get("workload", "")),
              "ep": trace.ep, "cluster": topo.name}
    for frame in (per_step, summary):
        for i, (k, v) in enumerate(labels.items()):
            frame.insert(i, k, v)
    mega = summary.set_index("policy")["tokens_per_s"].get("megatron", np.nan)
    tokens_per_s = per_step["tokens"] / per_step["step_s"]
    megatron_by_step = tokens_per_s[per_step["policy"] == "megatron"].set_axis(
        per_step.loc[per_step["policy"] == "megatron", "step"])
    per_step["speedup_vs_megatron"] = tokens_per_s / per_step["step"].map(megatron_by_step)
    summary["speedup_vs_megatron"] = summary["tokens_per_s"] / mega
    return per_step, summary


# ---- 04 reordering / 05 replication ------------------------------------------------------------
def reorder_table(cfg: Config, progress: bool = True) -> pd.DataFrame:
    """Per (workload, policy, step): simulated speedup over Megatron, node and GPU skewness, share of
    tokens crossing nodes, migration GB, planner seconds; for cfg.model on every cfg.workloads."""
    from tqdm.auto import tqdm

    frames = []
    for workload in tqdm(cfg.workloads, desc="workloads", disable=not progress):
        trace = make_trace(cfg, workload=workload)
        per_step, _ = simulate_with_plans(cfg, trace, cfg.policies, workload=workload)
        frames.append(per_step)
    return pd.concat(frames, ignore_index=True)


def replication_table(cfg: Config, progress: bool = True) -> pd.DataFrame:
    """Per (workload, policy): simulated speedup, tokens/s, GPU skewness and replicas used per GPU."""
    from tqdm.auto import tqdm

    frames = []
    for workload in tqdm(cfg.workloads, desc="workloads", disable=not progress):
        trace = make_trace(cfg, workload=workload)
        _, summary = simulate_with_plans(cfg, trace, cfg.policies, workload=workload)
        frames.append(summary)
    return pd.concat(frames, ignore_index=True)


def default_spare_slots(policy: str = "relibra") -> int:
    """The policy's default number of spare replica slots per GPU."""
    from relibra.policies import get_policy

    return int(get_policy(policy).params().get("spare_slots_per_gpu", 0))


def spare_slot_sweep(cfg: Config, slots=(1, 2, 3, 4), policy: str = "relibra") -> pd.DataFrame:
    """ReLibra with each number of spare slots per GPU, on cfg.model / cfg.workload.

    One row per spare-slot count: speedup over Megatron, tokens/s, GPU skewness, replica memory
    share, whether it is the policy's default.
    """
    trace = make_trace(cfg)
    rows = []
    default = default_spare_slots(policy)
    for n in slots:
        summary = simulate_trace(cfg, trace, policies=[policy], policy_params={policy: {"spare_slots_per_gpu": int(n)}})
        r = summary.set_index("policy").loc[policy]
        rows.append({"model": trace.model.name, "workload": cfg.workload, "ep": trace.ep, "cluster": cfg.cluster,
                     "policy": policy, "spare_slots_per_gpu": int(n), "default": int(n) == default,
                     "speedup_vs_megatron": float(r["speedup_vs_megatron"]), "frac_of_balanced": float(r["frac_of_balanced"]),
                     "tokens_per_s": float(r["tokens_per_s"]), "skewness": float(r["skewness"]),
                     "replica_memory_share": float(r["replica_memory_share"]),
                     "replica_memory_share_full_model": float(full_model_memory_share(
                         cfg.model, trace.ep, trace.num_layers, [r["replica_buffer_bytes"]], [False])[0])})
    return pd.DataFrame(rows)


# ---- 06 skewness -------------------------------------------------------------------------------
def plan_skewness(trace, policy: str, gpus_per_node: int, steps: list[int], cluster: str = "paper") -> np.ndarray:
    """Rank skewness of every (step, micro_batch, layer) of `policy`'s plans: float64 [steps, M, L].

    Placements chain from the static one through the steps before steps[0] (as the simulator's warm-up).
    """
    from relibra.trace import static_placement

    pol = make_policy(policy, cluster)
    prev = static_placement(trace.num_layers, trace.num_experts, trace.ep)
    if steps[0] > 0:
        prev = np.asarray(pol.plan(trace, steps[0] - 1, gpus_per_node, prev).home)
    out = []
    for step in steps:
        plan = pol.plan(trace, step, gpus_per_node, prev)
        out.append(plan.skewness())
        prev = plan.home
    return np.stack(out)


def skewness_sweep(cfg: Config, progress: bool = True) -> pd.DataFrame:
    """Mean and p95 rank skewness per policy (from plans; no cost model) across cfg.ep_sizes (on
    cfg.workload) and across cfg.workloads (at cfg.ep), for cfg.model on cfg.cluster's node size.

    Columns: sweep ('ep' or 'workload'), model, workload, ep, policy, skewness, skewness_p95.
    """
    from tqdm.auto import tqdm

    topo = cfg.topology()
    cases = [("ep", cfg.workload, ep) for ep in cfg.ep_sizes] + [("workload", w, cfg.ep) for w in cfg.workloads]
    rows = []
    for sweep, workload, ep in tqdm(cases, desc="EP sizes and domains", disable=not progress):
        trace = make_trace(cfg, workload=workload, ep=ep)
        gpn = _gpus_per_node(topo, ep)
        steps = list(range(trace.num_steps - min(history_steps(cfg), trace.num_steps), trace.num_steps))
        for policy in cfg.policies:
            sk = plan_skewness(trace, policy, gpn, steps, cfg.cluster)
            rows.append({"sweep": sweep, "model": trace.model.name, "workload": workload, "ep": ep, "policy": policy,
                         "skewness": float(sk.mean()), "skewness_p95": float(np.percentile(sk, 95))})
    return pd.DataFrame(rows)


# ---- 07 overheads ------------------------------------------------------------------------------
def this_machine() -> str:
    """A short description of the CPU this code runs on, for 'measured (...)' labels."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count()
    proc = platform.processor() or platform.machine()
    # Wall-clock figures on a shared machine depend on what else runs: give the load with them.
    return f"this machine: {cpus} CPU cores ({proc}), 1 planner thread, load average {os.getloadavg()[0]:.1f}"


def replica_transfer_seconds(plan, model: ModelShape, topology: Topology) -> float:
    """Seconds of replica weight pushes and gradient pulls of one step if none were hidden: the
    slowest GPU's transfer time per (micro_batch, layer) from relibra.costs, summed, counting the
    backward re-push of a layer-shared buffer as the cost model does."""
    from relibra.costs import CostParams
    from relibra.costs import replica_transfer_seconds as per_gpu

    if not (plan.replica_expert >= 0).any():
        return 0.0
    params = CostParams()
    push, pull = per_gpu(plan, model, topology, params)  # [M, L, ep] each
    repush = (not plan.transfers_on_critical_path) and params.replica_buffer == "layer-shared"
    return float((2 if repush else 1) * push.max(axis=2).sum() + pull.max(axis=2).sum())


def planner_seconds(trace, policy: str, gpus_per_node: int, step: int, repeats: int = 1,
                    cluster: str = "paper") -> float:
    """Best-of-`repeats` wall seconds of one step's plan (one thread, this machine)."""
    from relibra.trace import static_placement

    pol = make_policy(policy, cluster)
    prev = static_placement(trace.num_layers, trace.num_experts, trace.ep)
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        pol.plan(trace, step, gpus_per_node, prev)
        best = min(best, time.perf_counter() - t0)
    return best


def full_model_memory_share(model: str, ep: int, simulated_layers: int, buffer_bytes, per_layer_buffer) -> np.ndarray:
    """Replica buffer bytes per GPU as a share of the parameter bytes per GPU of the *whole* model
    (all its MoE layers), whatever layers the profile simulated: a layer-shared buffer does not grow
    with layers; a per-layer one (plans with transfers on the critical path, LLEP) grows with them."""
    from relibra.costs import dense_params_per_gpu

    full = get_model(model)
    param_bytes = ((full.num_experts // ep) * full.num_layers * full.expert_params
                   + dense_params_per_gpu(full)) * full.bytes_per_param
    scale = np.where(np.asarray(per_layer_buffer, dtype=bool), full.num_layers / simulated_layers, 1.0)
    return np.asarray(buffer_bytes, dtype=float) * scale / param_bytes


def overhead_table(cfg: Config) -> pd.DataFrame:
    """Per policy, for cfg.model / cfg.workload on cfg.cluster at cfg.ep:

    plan_s (measured: best-of-repeats wall seconds to plan one step, one thread), forward_s and step_s
    (simulated seconds of one step's forward pass and of the whole step), planner_vs_forward
    (plan_s / forward_s: < 1 means the planner hides behind one forward pass), planner_on_critical_path,
    migration_share, migration_gb, replica_memory_share, transfer_s (replica transfers if none were
    hidden), exposed_transfer_s and transfer_overlap (share hidden behind attention).
    """
    import torch

    from relibra.costs import cost_plan  # noqa: F401  (the cost model every figure here uses)
    from relibra.sim import resolve_topology

    trace = make_trace(cfg)
    topo = resolve_topology(cfg.cluster)
    _, gpn = topo.ep_layout(trace.ep)
    per_step, summary = simulate_with_plans(cfg, trace, cfg.policies)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        last = trace.num_steps - 1
        plan_s = {p: planner_seconds(trace, p, gpn, last, cfg.sizes.planner_repeats, cfg.cluster)
                  for p in summary["policy"]}
    finally:
        torch.set_num_threads(threads)
    out = summary[["model", "workload", "ep", "cluster", "policy", "step_s", "forward_s", "migration_share",
                   "migration_gb", "replica_memory_share", "exposed_transfer_share", "planner_on_critical_path",
                   "speedup_vs_megatron"]].copy()
    out["plan_s"] = out["policy"].map(plan_s)
    out["planner_vs_forward"] = out["plan_s"] / out["forward_s"]
    out["transfer_s"] = summary["transfer_s"].to_numpy()
    out["exposed_transfer_s"] = summary["exposed_transfer_s"].to_numpy()
    out["transfer_overlap"] = np.where(out["transfer_s"] > 0, 1.0 - out["exposed_transfer_s"] / out["transfer_s"].where(
        out["transfer_s"] > 0, 1.0), np.nan)
    out["layers"] = trace.num_layers
    out["micro_batches"] = trace.num_microbatches
    out["planner_hardware"] = this_machine()
    out["replica_memory_share_full_model"] = full_model_memory_share(
        cfg.model, trace.ep, trace.num_layers, summary["replica_buffer_bytes"].to_numpy(dtype=float),
        summary["planner_on_critical_path"].to_numpy(dtype=bool))
    return out


# ---- 09 RL workload ----------------------------------------------------------------------------
# RLConfig overrides per profile (relibra.rl.grpo.RLConfig); the step count is Profile.rl_steps.
RL_OVERRIDES: dict[str, dict] = {
    "tiny": {"warmup_steps": 20, "prompts_per_step": 4, "group_size": 2, "micro_batches": 2, "eval_prompts": 0},
    "laptop": {"warmup_steps": 150, "eval_prompts": 64},
    "paper": {},
    "gpu": {},
}
RL_TORCH_THREADS = 1  # the RL run is deterministic for a fixed thread count; 1 gives the same numbers everywhere


def rl_workload(cfg: Config) -> dict:
    """Run the kit's real RL workload (relibra.rl: GRPO on a tiny MoE policy, routing replay) on this CPU.

    Returns {"rewards": one row per GRPO step (step, reward, solved, seconds, ...), "trace": the real
    RoutingTrace it recorded, "traces": {label: trace} with a synthetic trace of the same shape,
    "config": the RLConfig as a dict, "label"/"sim_label": figure subtitles, "hardware"}.
    """
    import torch

    from relibra.rl.grpo import RLConfig, run_rl
    from relibra.workloads import generate_trace

    steps = int(cfg.extra.get("rl_steps") or cfg.sizes.rl_steps)
    rl_cfg = RLConfig(steps=steps, seed=cfg.seed, **RL_OVERRIDES.get(cfg.profile, {}))
    threads = torch.get_num_threads()
    torch.set_num_threads(RL_TORCH_THREADS)
    try:
        result = run_rl(rl_cfg, progress=False)
    finally:
        torch.set_num_threads(threads)
    rewards = pd.DataFrame(result.history)
    trace = result.trace
    # A synthetic trace of the same model shape, EP, steps and micro-batches, for comparison. It keeps
    # the generator's default tokens per (micro-batch, rank): its sequences are hundreds to thousands of
    # tokens long, so at the RL run's ~70 tokens per slot one sequence would fill whole steps and the
    # comparison would measure packing, not routing.
    s, m, _, ep, _ = trace.loads.shape
    synthetic = generate_trace(trace.model, "mixed", ep, s, seed=cfg.seed, micro_batches=m)
    hardware = this_machine().replace("1 planner thread", f"{RL_TORCH_THREADS} torch thread")
    label = (f"measured: real GRPO run of a tiny MoE ({trace.model.num_layers} layers, {trace.model.num_experts} "
             f"experts, top-{trace.model.top_k}) on {hardware} | {steps} steps, seed {cfg.seed}")
    topo = get_topology("cpu-gloo")
    # The RL trace is tiny (tens of tokens per expert): ReLibra's default minimum of 128 tokens per
    # replica, meant for paper-scale traces, would forbid every replica. Use the cpu-gloo preset's GEMM
    # half-saturation point instead: a replica must take at least the GEMM's fixed cost in tokens.
    sim_params = {p: {"min_replica_tokens": int(topo.gemm_half_tokens)}
                  for p in cfg.policies if p.startswith("relibra") and p != "relibra-reorder"}
    return {
        "sim_policy_params": sim_params,
        "rewards": rewards, "trace": trace, "config": rl_cfg.to_dict(), "seconds": result.seconds,
        "traces": {"real RL (relibra.rl)": trace, "synthetic (mixed, same model shape)": synthetic},
        "eval_before": result.eval_before, "eval_after": result.eval_after,
        "label": label, "hardware": hardware,
        "sim_label": (f"simulated (cpu-gloo cluster preset, {topo.num_nodes} x {topo.gpus_per_node} ranks) on the real "
                      f"RL trace, EP {ep} | {steps} GRPO steps, seed {cfg.seed}"),
    }


# ---- 08 runtime ----------------------------------------------------------------------------------
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
