"""Synthetic routing traces at a config's scale (cached per kernel) and a policy's plans over steps."""

from __future__ import annotations

import time

from relibra.experiments.config import Config
from relibra.policies import get_policy
from relibra.setups import load_card
from relibra.workloads import generate_trace

_TRACE_CACHE: dict[tuple, object] = {}


def make_trace(cfg: Config, model: str | None = None, workload: str | None = None, ep: int | None = None,
               steps: int | None = None, seed: int | None = None):
    """The synthetic RL routing trace of (model, workload, ep) at the config's scale (cached per kernel),
    its batch laid out as the set-up card (parameter `setup`, default paper) says.

    Returns a RoutingTrace with loads int32 [steps, micro_batches, layers, ep, experts].
    """
    shape = cfg.model_shape(model)
    setup = cfg.extra.get("setup") or "token-budget-tp1"
    key = (shape, workload or cfg.workload, int(ep or cfg.ep), int(steps or cfg.steps), cfg.micro_batches,
           cfg.tokens_per_rank, int(cfg.seed if seed is None else seed), setup)
    if key not in _TRACE_CACHE:
        _TRACE_CACHE[key] = generate_trace(shape, key[1], key[2], key[3], seed=key[6], micro_batches=key[4],
                                           tokens_per_rank=key[5], config=load_card(setup).workload_config())
    return _TRACE_CACHE[key]


def workload_traces(cfg: Config, model: str | None = None, ep: int | None = None) -> dict:
    """{workload: trace} of cfg.model (or `model`) at cfg.ep (or `ep`) for every workload of the config
    (cfg.workload included)."""
    names = list(dict.fromkeys(list(cfg.workloads) + [cfg.workload]))
    return {w: make_trace(cfg, model=model, workload=w, ep=ep) for w in names}



def plan_steps(trace, policy: str, cluster, steps: list[int] | None = None, **params) -> list:
    """StepPlans of `policy` on `cluster` (Topology or preset/spec) for the given steps (default all),
    each placement feeding the next.

    Returns a list of (step, plan, plan_seconds) with plan_seconds the measured wall time of planning.
    """
    pol = get_policy(policy, **params)
    out = []
    prev_home = None
    for step in (range(trace.num_steps) if steps is None else steps):
        t0 = time.perf_counter()
        plan = pol.plan(trace, step, cluster, prev_home=prev_home)
        seconds = time.perf_counter() - t0
        out.append((step, plan, seconds))
        prev_home = plan.home
    return out
