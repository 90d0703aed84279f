"""The Policy interface, the registry by name, and checks every policy shares.

A policy turns one training step of a RoutingTrace into a StepPlan:

    plan = get_policy("relibra", spare_slots_per_gpu=2).plan(trace, step, get_topology("paper"))
    plan.validate(trace.loads[step])

The topology (relibra.cluster.Topology, or a preset/spec string) is an argument of every plan, so a
plan is always made for the cluster it is simulated or run on: it fixes how the trace's EP ranks
pack into nodes (Topology.ep_layout) and, for policies whose score weighs communication or
migration against compute (relibra), the link and matmul rates.

History-based policies (eplb) read only trace.loads[:step]; oracle policies (eplb+, lplb+, llep,
relibra and its ablations) read trace.loads[step], which routing replay makes known before the
step runs. Every plan records its planner wall time in plan.info.plan_seconds (process CPU time
in plan_cpu_seconds; relibra.plan.PlanInfo, or the policy's subclass of it with its own clocks and
counters). Metrics of the plan (skewness, gap to its lower bound) are computed by the caller
(relibra.bounds, relibra.sim), never inside the planner.

A run of steps, each planned from the previous step's homes after a warm-up, is Policy.plan_steps
(iter_plans: one plan at a time, as the simulator plans).
"""

from __future__ import annotations

import abc

import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from relibra.cluster import Topology, resolve_topology
from relibra.errors import ConfigError, PlanError
from relibra.plan import StepPlan
from relibra.trace import RoutingTrace, static_placement


@dataclass
class Policy(abc.ABC):
    """Base of every policy. Subclasses are dataclasses whose fields are the policy's parameters; a
    field may be a small frozen config dataclass given whole (ReLibraPolicy.anneal: AnnealConfig),
    whose fields get_policy also takes by name."""

    name: ClassVar[str] = "policy"

    def plan(self, trace: RoutingTrace, step: int, topology: Topology | str,
             prev_home: np.ndarray | None = None) -> StepPlan:
        """The StepPlan for `step` of `trace` on `topology` (the trace's EP ranks packed node by node).

        prev_home: int [layers, experts] the previous step's placement, for policies that weigh
        migration (relibra); others ignore it.
        """
        check_step(trace, step)
        topology = resolve_topology(topology)
        _, gpus_per_node = topology.ep_layout(trace.ep)
        check_topology(trace.ep, trace.num_experts, gpus_per_node)
        if prev_home is not None:
            prev_home = np.asarray(prev_home)
            if prev_home.shape != (trace.num_layers, trace.num_experts):
                raise PlanError(f"{self.name}: prev_home must have shape [layers, experts]="
                                f"({trace.num_layers}, {trace.num_experts}), got {prev_home.shape}")
        start, start_cpu = time.perf_counter(), time.process_time()
        plan = self._plan(trace, step, topology, gpus_per_node, prev_home)
        wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        plan.info = dataclasses.replace(plan.info, plan_seconds=wall, plan_cpu_seconds=cpu)
        plan.prev_home = prev_home
        return plan

    def iter_plans(self, trace: RoutingTrace, steps: Sequence[int], topology: Topology | str, warmup: int = 1,
                   initial_home: np.ndarray | None | Literal["static"] = "static") -> Iterator[StepPlan]:
        """The plans of `steps` (step indices, planned in that order), one at a time, each made from
        the previous one's homes (plan.prev_home); see plan_steps."""
        steps = [int(s) for s in steps]
        if not steps:
            raise ConfigError(f"{self.name}: no steps to plan")
        if isinstance(warmup, bool) or not isinstance(warmup, (int, np.integer)) or warmup < 0:
            raise ConfigError(f"{self.name}: warmup must be a non-negative number of steps, got {warmup!r}")
        for s in steps:
            check_step(trace, s)
        topology = resolve_topology(topology)
        if isinstance(initial_home, str):
            if initial_home != "static":
                raise ConfigError(f"{self.name}: initial_home must be 'static', None or a placement, "
                                  f"got {initial_home!r}")
            initial_home = static_placement(trace.num_layers, trace.num_experts, trace.ep)
        home = initial_home
        for step in range(max(0, steps[0] - warmup), steps[0]):  # warm-up plans, not returned
            home = self.plan(trace, step, topology, home).home
        for step in steps:
            plan = self.plan(trace, step, topology, home)
            home = plan.home
            yield plan

    def plan_steps(self, trace: RoutingTrace, steps: Sequence[int], topology: Topology | str, warmup: int = 1,
                   initial_home: np.ndarray | None | Literal["static"] = "static") -> list[StepPlan]:
        """Plan each of `steps` from the previous step's homes, with warm-up.

        steps: step indices of `trace`, planned in order (each from the plan before it, whatever the
        gap between their indices). warmup: the steps just before steps[0] (as many as there are,
        at most warmup) are planned first, in order, and not returned, so that the first returned
        plan starts from the placement the policy would have had rather than from the initial one.
        initial_home: where the first planned step starts: "static" (Megatron's placement: training
        starts from it), an int [layers, experts] placement, or None (no previous placement: the
        planner weighs no migration for that step, and plan.prev_home is None).
        Returns one StepPlan per step; plan.prev_home is the placement it was made from, the one its
        migration leaves (relibra.costs.cost_plan's prev_home).
        """
        return list(self.iter_plans(trace, steps, topology, warmup, initial_home))

    @abc.abstractmethod
    def _plan(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
              prev_home: np.ndarray | None) -> StepPlan:
        """Each policy's planner: the StepPlan for one step (arguments already checked;
        gpus_per_node = topology.ep_layout(trace.ep)[1])."""

    def params(self) -> dict:
        """The policy's parameters as a plain dict, by the names get_policy takes (a config field's
        fields in its place): get_policy(policy.name, **policy.params()) rebuilds the policy."""
        configs = config_fields(type(self))
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out.update(dataclasses.asdict(value) if f.name in configs else {f.name: value})
        return out

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{self.name}({args})"


# ---- registry ------------------------------------------------------------------------------------
_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: get_policy(cls.name, **params) builds cls(**params). Names are listed in the
    order classes register (the import order in relibra/policies/__init__.py)."""
    if cls.name in _REGISTRY:
        raise ConfigError(f"policy name {cls.name!r} is registered twice ({_REGISTRY[cls.name].__name__}, {cls.__name__})")
    names = _factory_fields(cls)
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"policy {cls.name!r}: parameter names {twice} appear in more than one of its configs")
    _REGISTRY[cls.name] = cls
    return cls


def registered_names() -> list[str]:
    return list(_REGISTRY)


def _registered(name: str) -> type[Policy]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; known: {', '.join(_REGISTRY)}") from None


def parameter_names(name: str) -> list[str]:
    """The parameter names get_policy(name, ...) takes: the policy's fields, each config field's fields in
    its place. ConfigError lists the known names when `name` is none."""
    return _factory_fields(_registered(name))


def get_policy(name: str, **params) -> Policy:
    """The policy called `name` built with `params`: its own fields, a config field given whole
    (anneal=AnnealConfig(...)), or a config's fields by name (iterations=60 goes into `anneal`).
    ConfigError lists the known names or the policy's known parameters when either is wrong."""
    cls = _registered(name)
    configs = config_fields(cls)
    owner = {f.name: config for config, kind in configs.items() for f in dataclasses.fields(kind)}
    given, inner = {}, {config: {} for config in configs}
    for key, value in params.items():
        (inner[owner[key]] if key in owner else given)[key] = value
    try:
        for config, values in inner.items():
            if values:
                given[config] = dataclasses.replace(given.get(config) or configs[config](), **values)
        return cls(**given)
    except TypeError as exc:
        raise ConfigError(f"policy {name!r}: bad parameters {sorted(params)} ({exc}); "
                          f"known parameters: {', '.join(_factory_fields(cls)) or 'none'}") from None
    except ConfigError as exc:
        if str(exc).startswith(f"policy {name!r}"):
            raise
        raise ConfigError(f"policy {name!r}: {exc}") from None


def config_fields(cls: type[Policy]) -> dict[str, type]:
    """A policy class's config fields, each a dataclass given whole: {field name: its class}."""
    return {f.name: f.default_factory for f in dataclasses.fields(cls)
            if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory)}


def _factory_fields(cls: type[Policy]) -> list[str]:
    """The parameter names get_policy takes for a registered policy class: its fields, with each
    config field's fields in its place."""
    configs = config_fields(cls)
    names = []
    for f in dataclasses.fields(cls):
        names += [g.name for g in dataclasses.fields(configs[f.name])] if f.name in configs else [f.name]
    return names


# ---- shared checks -------------------------------------------------------------------------------
def check_step(trace: RoutingTrace, step: int) -> None:
    if not 0 <= step < trace.num_steps:
        raise PlanError(f"step {step} is outside the trace's {trace.num_steps} steps")


def check_topology(ep: int, num_experts: int, gpus_per_node: int) -> None:
    """EP must divide the experts, and gpus_per_node must divide EP."""
    if num_experts % ep:
        raise ConfigError(f"ep={ep} does not divide num_experts={num_experts}")
    if gpus_per_node <= 0 or ep % gpus_per_node:
        raise ConfigError(f"gpus_per_node={gpus_per_node} does not divide ep={ep}")


def check_nonnegative_int(policy: str, **values) -> None:
    for key, value in values.items():
        if value is None:
            continue
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"policy {policy!r}: {key} must be a non-negative integer, got {value!r}")


def check_config(owner: str, value, key: str, *, integer: bool = False, minimum: float | None = None,
                 positive: bool = False) -> None:
    """One field of a config dataclass: ConfigError "<owner>.<key> must be ..." when it is not a
    number (not an integer with integer=True), is below `minimum`, or is not > 0 (positive=True)."""
    where = f"{owner}.{key}"
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, kinds):
        raise ConfigError(f"{where} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if positive and not value > 0:
        raise ConfigError(f"{where} must be positive, got {value!r}")
    if minimum is not None and not value >= minimum:
        raise ConfigError(f"{where} must be at least {minimum}, got {value!r}")


def check_positive(policy: str, **values) -> None:
    for key, value in values.items():
        if not isinstance(value, (int, float, np.integer, np.floating)) or not value > 0:
            raise ConfigError(f"policy {policy!r}: {key} must be positive, got {value!r}")


def experts_by_gpu(home: np.ndarray, ep: int) -> np.ndarray:
    """Experts homed on each GPU, in expert order: int64 [layers, ep, experts / ep].

    home: int [layers, experts] with every GPU homing experts / ep experts.
    """
    layers, experts = home.shape
    order = np.argsort(home, axis=1, kind="stable")  # experts sorted by GPU, then by id
    return order.reshape(layers, ep, experts // ep)
