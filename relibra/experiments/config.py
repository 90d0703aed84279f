"""Configuration of one notebook run: `resolve_config`, which fills a notebook's parameters from its
profile into a `Config` (registry.resolve supplies the notebook's own defaults)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from relibra.cluster import ModelShape, Topology, get_model, get_topology
from relibra.errors import ConfigError
from relibra.experiments.profiles import Profile, Scale, get_profile
from relibra.workloads import WORKLOADS


@dataclass(frozen=True)
class Config(Scale):
    """A notebook's parameters resolved against its profile (every field filled): the Scale fields
    (keyword-only) and the ones below."""

    notebook: str
    profile: str
    policies: tuple[str, ...]
    seed: int
    out_dir: Path
    measured_dir: Path | None
    sizes: Profile
    extra: dict = field(default_factory=dict)
    scale_kind: str = "profile"  # how scale_note describes the run: profile | toy | runtime | rl | grid
    single_model: bool = False   # the notebook studies cfg.model only (captions name it alone)

    def topology(self) -> Topology:
        return get_topology(self.cluster)

    def model_shape(self, name: str | None = None) -> ModelShape:
        """The preset `name` (default: self.model), cut to the profile's first `layers` MoE layers."""
        return scaled_model(name or self.model, self.layers)

    def scale_note(self) -> str:
        """One line on how far this run is from the paper's scale, for captions."""
        if self.scale_kind == "toy":
            x = self.extra
            return (f"toy layer: 16 experts, top-2, EP {self.ep} as 2 nodes x {self.ep // 2} GPUs, "
                    f"{x.get('tokens_per_gpu')} tokens per GPU, {self.micro_batches} micro-batches, seed {self.seed}")
        s, x = self.sizes, self.extra
        if self.scale_kind == "runtime":  # notebook 08: the gloo run's own sizes
            nproc, nodes = x.get("nproc") or s.runtime_nproc, x.get("nodes") or s.runtime_nodes
            return (f"{self.profile} profile: model {s.runtime_model}, {nproc} ranks as {nodes} node(s), "
                    f"{s.runtime_micro_batches} micro-batches x {s.runtime_tokens_per_rank} tokens per rank, "
                    f"{s.runtime_steps} timed steps x {s.runtime_repeats} launch(es), seed {self.seed}")
        if self.scale_kind == "rl":  # notebook 09: the RL run's own sizes
            return (f"{self.profile} profile: the tiny MoE policy of relibra.rl, {x.get('rl_steps') or s.rl_steps} GRPO "
                    f"steps after warm-up, seed {self.seed}")
        if self.scale_kind == "grid":  # its own grid (ScaleSweep)
            g = self.sizes.scale
            layers = "all MoE layers" if g.layers is None else f"first {g.layers} MoE layers"
            return (f"{self.profile} profile: {layers}, {g.micro_batches} micro-batches, the last of {g.steps} steps "
                    f"simulated, seed {self.seed}")
        layers = "all MoE layers" if self.layers is None else f"first {self.layers} MoE layers"
        mbs = "every micro-batch of the batch" if self.micro_batches is None else f"{self.micro_batches} micro-batches"
        return f"{self.profile} profile: {layers}, {mbs} x {self.steps} steps, seed {self.seed}"

    def simulated_label(self) -> str:
        """'simulated (<cluster preset>: nodes x GPUs)' for titles."""
        topo = self.topology()
        return f"simulated ({topo.name} cluster preset, {topo.num_nodes} x {topo.gpus_per_node} GPUs)"

    def trace_label(self, model: str | None = None, ep: int | None = None) -> str:
        """Provenance of routing statistics that need no cluster: the synthetic trace generator."""
        return (f"synthetic routing: the kit's RL trace generator, {model or self.model}, EP {ep or self.ep} "
                f"(no cluster involved) | {self.scale_note()}")

    def plan_label(self, ep: str | int | None = None) -> str:
        """Provenance of plan statistics (no cost model): policies' plans on synthetic traces."""
        topo = self.topology()
        return (f"simulated: policies' plans on synthetic RL traces of {self.model}, EP {ep or self.ep}, nodes of "
                f"{topo.gpus_per_node} GPUs ({topo.name} cluster preset; no cost model) | {self.scale_note()}")

    def cases_note(self) -> str:
        """'model qwen3-235b-a22b; workloads math, code' (the notebook's models and workloads)."""
        models = [self.model] if self.single_model else list(self.models)
        return (f"model{'s' if len(models) > 1 else ''} {', '.join(models)}; workload"
                f"{'s' if len(self.workloads) > 1 else ''} {', '.join(self.workloads)}")

    def sim_subtitle(self, ep: str | int | None = None) -> str:
        """'simulated (<cluster>), EP <ep>, <models and workloads> | <scale note>' for figures of the simulator."""
        return f"{self.simulated_label()}, EP {ep or self.ep}, {self.cases_note()} | {self.scale_note()}"

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sizes"}
        d["out_dir"] = str(self.out_dir)
        d["measured_dir"] = None if self.measured_dir is None else str(self.measured_dir)
        return jsonable(d)


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
    here = Path(__file__).resolve().parents[2]  # relibra/experiments/config.py
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


def resolve_config(notebook: str, default_policies: tuple[str, ...], scale_kind: str = "profile",
                   simulates_cluster: bool = True, single_model: bool = False, profile: str = "laptop", out_dir: str | os.PathLike | None = None, model=None, workload=None,
                   ep=None, cluster=None, policies=None, steps=None, seed: int = 0, micro_batches=None, layers=None,
                   ep_sizes=None, measured_dir=None, **extra) -> Config:
    """Fill a notebook's parameters from its profile; None means 'the profile's default' (policies:
    `default_policies`). simulates_cluster: check that the cluster holds every EP size (a notebook
    that only counts routing, 01, has no cluster).

    model / workload / policies / ep_sizes take one value, a list, or a comma-separated string
    (papermill -p passes strings). A list of models or workloads sets the grid of notebooks 02-05;
    its first element is the single case of the others.
    """
    sizes = get_profile(profile or "tiny")  # profile None: the tutorial's toy layer, which reads no profile
    models = _as_tuple(model) or sizes.models
    workloads = _as_tuple(workload) or sizes.workloads
    for m in models:
        get_model(m)
    cfg = Config(
        notebook=notebook,
        profile=profile or "none",
        models=models,
        workloads=workloads,
        model=models[0] if model not in (None, "") else sizes.model,
        workload=workloads[0] if workload not in (None, "") else sizes.workload,
        ep=int(ep) if ep not in (None, "") else sizes.ep,
        ep_sizes=_as_tuple(ep_sizes, int) or sizes.ep_sizes,
        cluster=cluster or sizes.cluster,
        policies=_as_tuple(policies) or tuple(default_policies),
        steps=int(steps) if steps not in (None, "") else sizes.steps,
        micro_batches=int(micro_batches) if micro_batches not in (None, "") else sizes.micro_batches,
        layers=(None if layers in ("all", 0) else int(layers)) if layers not in (None, "") else sizes.layers,
        tokens_per_rank=sizes.tokens_per_rank,
        seed=int(seed),
        out_dir=_resolve_dir(out_dir if out_dir not in (None, "") else Path("results") / notebook),
        measured_dir=_resolve_dir(measured_dir or sizes.measured_dir) if (measured_dir or sizes.measured_dir) else None,
        sizes=sizes,
        extra={k: v for k, v in extra.items() if v is not None},
        scale_kind=scale_kind,
        single_model=single_model,
    )

    for w in cfg.workloads + (cfg.workload,):
        if w not in WORKLOADS:
            raise ConfigError(f"unknown workload {w!r}; known: {', '.join(WORKLOADS)}")
    topo = get_topology(cfg.cluster)
    if cfg.steps < 1 or (cfg.micro_batches is not None and cfg.micro_batches < 1):
        raise ConfigError(f"steps and micro_batches must be >= 1, got {cfg.steps} and {cfg.micro_batches}")
    if profile is not None:  # EP sizes the cluster and every model can hold
        for ep_size in dict.fromkeys((cfg.ep,) + tuple(cfg.ep_sizes)):
            try:
                if simulates_cluster:
                    topo.ep_layout(ep_size)
            except ConfigError as exc:
                raise ConfigError(f"{notebook}: ep={ep_size} on cluster {cfg.cluster!r}: {exc}") from None
            for m in cfg.models + (cfg.model,):
                experts = get_model(m).num_experts
                if experts % ep_size:
                    raise ConfigError(f"{notebook}: ep={ep_size} does not divide the {experts} experts of {m!r}")
    return cfg



def jsonable(obj):
    """`obj` with dict keys as strings, tuples as lists, paths as strings and numpy scalars and arrays
    as Python numbers and lists, for json.dumps."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj
