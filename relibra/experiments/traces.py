"""The parameters every trace notebook shares (TraceParams, SimParams, TracedParams), their captions, and
the synthetic routing traces at a profile's scale (cached per kernel)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from relibra.cluster import ModelShape, Topology, get_model, resolve_topology
from relibra.errors import ConfigError
from relibra.experiments.profiles import PROFILES, Scale
from relibra.paths import resolve_path
from relibra.studies.case import scaled_model
from relibra.studies.params import PATH, Kind, Params, choice, integer, names, objects, param
from relibra.policies import POLICY_NAMES
from relibra.setups import SetupCard
from relibra.trace import RoutingTrace
from relibra.workloads import WORKLOADS, generate_trace

PROFILE = choice(tuple(PROFILES))
MODEL = objects(get_model, "model preset", single=True)
MODELS = objects(get_model, "model presets")
WORKLOAD = names(tuple(WORKLOADS), "workload")
POLICIES = names(POLICY_NAMES, "policy")
CLUSTER = objects(resolve_topology, "cluster (a preset, a fitted .json or key=value items)", sep=";", single=True)


def own_policies(default: str | None, doc: str = "policies compared (None: this notebook's)"):
    """A notebook's `policies` field, whose None stands for `default` (comma-separated policy names)."""
    return param(None, doc, POLICIES, none=default)


def _load_trace(raw) -> RoutingTrace:
    trace = RoutingTrace.load(resolve_path(raw))  # relative to the repository root, as papermill's cwd
    return dataclasses.replace(trace, provenance={**trace.provenance, "file": str(raw)})


TRACE = Kind("a routing trace file the kit wrote (.npz: relibra trace import, the generator, relibra rl)",
             _load_trace)


@dataclass(frozen=True)
class TraceParams(Params):
    """A notebook on synthetic traces of one model (None: the profile's); `workload` one or several."""

    profile: str = param("laptop", "sizes of every experiment", PROFILE, affects=False)
    model: ModelShape = param(None, "one model preset (None: the profile's)", MODEL, sizes="model")
    workload: tuple[str, ...] | None = param(None, "workloads, e.g. 'math,code' (None: the profile's)", WORKLOAD)
    ep: int = param(None, "expert-parallel size (None: the profile's)", integer(1, 1024), sizes="ep")
    steps: int = param(None, "training steps per trace (None: the profile's)", integer(1, 10000),
                       sizes="steps")
    seed: int = param(0, "same seed, same numbers", integer(0))
    out_dir: str | None = param(None, "where results go (None: results/interactive/<notebook>)", PATH,
                                affects=False)

    def workloads(self, sizes: Scale) -> tuple[str, ...]:
        return self.workload or sizes.workloads

    def the_workload(self, sizes: Scale) -> str:
        return self.workload[0] if self.workload else sizes.workload

    def models(self) -> tuple[ModelShape, ...]:
        return self.model if isinstance(self.model, tuple) else (self.model,)

    def ep_sizes_used(self, sizes: Scale) -> tuple[int, ...]:
        return (self.ep,)

    def check(self, notebook: str, sizes: Scale) -> None:
        for ep in dict.fromkeys(self.ep_sizes_used(sizes)):
            for m in self.models():
                if m.num_experts % ep:
                    raise ConfigError(f"{notebook}: ep={ep} does not divide the {m.num_experts} experts of "
                                      f"{m.name!r}")

    def scale_note(self, sizes: Scale) -> str:
        """One line on how far this run is from the paper's scale."""
        layers = "all MoE layers" if sizes.layers is None else f"first {sizes.layers} MoE layers"
        mbs = ("every micro-batch of the batch" if sizes.micro_batches is None
               else f"{sizes.micro_batches} micro-batches")
        return f"{self.profile} profile: {layers}, {mbs} x {self.steps} steps, seed {self.seed}"

    def trace_label(self, sizes: Scale) -> str:
        """Provenance of routing statistics that need no cluster: the synthetic trace generator."""
        return (f"synthetic routing: the kit's RL trace generator, {self.models()[0].name}, EP {self.ep} "
                f"(no cluster involved) | {self.scale_note(sizes)}")


@dataclass(frozen=True)
class SimParams(TraceParams):
    """A trace notebook that simulates (or plans) on a cluster, comparing `policies`."""

    cluster: Topology = param(None, "cluster preset or spec (None: the profile's)", CLUSTER, sizes="cluster")
    policies: tuple[str, ...] = own_policies(None)

    def check(self, notebook: str, sizes: Scale) -> None:
        for ep in dict.fromkeys(self.ep_sizes_used(sizes)):
            try:
                self.cluster.ep_layout(ep)
            except ConfigError as exc:
                raise ConfigError(f"{notebook}: ep={ep} on cluster {self.cluster.name!r}: {exc}") from None
        super().check(notebook, sizes)

    def simulated_on(self) -> str:
        return self.cluster.name

    def routing(self, workload: str, ep: int, sizes: Scale, card: SetupCard):
        """The routing trace of one case (the synthetic one at the profile's scale)."""
        return make_trace(self.model, workload, ep, self.steps, self.seed, sizes, card)

    def routing_text(self) -> str:
        return "synthetic RL traces"

    def plan_label(self, sizes: Scale, ep: str | int | None = None) -> str:
        """Provenance of plan statistics (no cost model): policies' plans on synthetic traces."""
        c = self.cluster
        return (f"simulated: policies' plans on {self.routing_text()} of {self.models()[0].name}, EP {ep or self.ep}, "
                f"nodes of {c.gpus_per_node} GPUs ({c.name} cluster preset; no cost model) | {self.scale_note(sizes)}")

    def cases_note(self, sizes: Scale) -> str:
        """'model qwen3-235b-a22b; workloads math, code' (the notebook's models and workloads)."""
        models, workloads = [m.name for m in self.models()], self.workloads(sizes)
        return (f"model{'s' if len(models) > 1 else ''} {', '.join(models)}; workload"
                f"{'s' if len(workloads) > 1 else ''} {', '.join(workloads)}")

    def sim_subtitle(self, sizes: Scale, cases: str | None = None) -> str:
        """'simulated (<cluster preset>, nodes x GPUs), EP <ep>, <cases: the models and workloads> | <scale
        note>' for figures of the simulator."""
        c = self.cluster
        return (f"simulated ({c.name} cluster preset, {c.num_nodes} x {c.gpus_per_node} GPUs), EP {self.ep}, "
                f"{cases or self.cases_note(sizes)} | {self.scale_note(sizes)}")

    def one_case_subtitle(self, sizes: Scale) -> str:
        return self.sim_subtitle(sizes, f"model {self.models()[0].name}; workload {self.the_workload(sizes)}")


@dataclass(frozen=True)
class TracedParams(SimParams):
    """A SimParams notebook that also studies a routing trace file (`trace`) instead of synthetic traces:
    the trace then gives the model, the EP size, the steps and micro-batches (traced_sizes)."""

    trace: RoutingTrace | None = param(None, "a routing trace file (.npz) to study (None: synthetic traces)", TRACE)

    def check(self, notebook: str, sizes: Scale) -> None:
        t = self.trace
        eps = set(self.ep_sizes_used(sizes))
        if t is not None and (self.model.name != t.model.name or eps != {t.ep}):
            raise ConfigError(f"{notebook}: trace {t.provenance['file']} holds {t.model.name} at EP {t.ep}; leave "
                              f"model and the EP sizes unset (None), got model={self.model.name!r}, EP {sorted(eps)}")
        super().check(notebook, sizes)

    def routing(self, workload: str, ep: int, sizes: Scale, card: SetupCard):
        return self.trace if self.trace is not None else super().routing(workload, ep, sizes, card)

    def routing_text(self) -> str:
        return super().routing_text() if self.trace is None else trace_text(self.trace)

    def cases_note(self, sizes: Scale) -> str:
        return super().cases_note(sizes) if self.trace is None else (
            f"model {self.model.name}; {self.routing_text()}")

    def one_case_subtitle(self, sizes: Scale) -> str:
        return super().one_case_subtitle(sizes) if self.trace is None else self.sim_subtitle(sizes)


def trace_text(trace: RoutingTrace) -> str:
    """A trace file's provenance for captions: 'the trace FILE (imported (importer) from SOURCE)', or '(from
    GENERATOR, seed S)'."""
    p = trace.provenance
    made = (f"imported ({p['importer']}) from {p['source']}" if "importer" in p else
            f"from {p.get('generator', 'an unnamed source')}" + (f", seed {p['seed']}" if "seed" in p else ""))
    return f"the trace {p.get('file', 'given in memory')} ({made})"


def trace_workload(trace: RoutingTrace) -> str:
    """The workload its provenance names, else "trace"."""
    return str(trace.provenance.get("workload") or "trace")


def traced_sizes(table: dict[str, Scale]):
    """A notebook's sizes_of: the profile's sizes, or with a `trace` the trace's own model, EP, steps
    and micro-batches (one workload, named as the trace names it)."""
    def sizes_of(values) -> Scale:
        sizes, t = table[values.profile], values.trace
        if t is None:
            return sizes
        label = trace_workload(t)
        return dataclasses.replace(sizes, models=(t.model.name,), model=t.model, workloads=(label,), workload=label,
                                   ep=t.ep, ep_sizes=(t.ep,), steps=t.num_steps, micro_batches=t.num_microbatches,
                                   layers=None)
    return sizes_of


def make_trace(model: ModelShape, workload: str, ep: int, steps: int, seed: int, sizes: Scale, card: SetupCard):
    """The synthetic RL routing trace of (model cut to sizes.layers, workload, ep) with the profile's
    micro-batches and tokens per rank, its batch laid out as `card` says: loads int32 [steps, micro_batches,
    layers, ep, experts], cached per kernel."""
    return cached_trace(scaled_model(model, sizes.layers), workload, int(ep), int(steps), sizes.micro_batches,
                        sizes.tokens_per_rank, int(seed), card.workload_config())


@functools.cache
def cached_trace(shape: ModelShape, workload: str, ep: int, steps: int, micro_batches: int | None,
                 tokens_per_rank: int | None, seed: int, config):
    """generate_trace, once per kernel for each set of inputs."""
    return generate_trace(shape, workload, ep, steps, seed=seed, micro_batches=micro_batches,
                          tokens_per_rank=tokens_per_rank, config=config)
