"""Helpers shared by the test files (tests/ is on sys.path under pytest: `from conftest import ...`)."""

from __future__ import annotations

import numpy as np

from relibra.cluster import ModelShape, get_topology
from relibra.plan import StepPlan
from relibra.policies import get_policy
from relibra.trace import RoutingTrace

# Small planner settings so that a test file stays within a few seconds per policy.
FAST = {"relibra": {"iterations": 60, "min_replica_tokens": 1}, "llep": {"min_tokens_per_gemm": 4}}
for _name in ("relibra-reorder", "relibra-replicate", "relibra-lpt", "relibra-split", "relibra-h"):
    FAST[_name] = {"iterations": 60, "min_replica_tokens": 1}


def nodes_of(gpus_per_node: int):
    """The paper cluster's rates on nodes of `gpus_per_node` GPUs (the EP ranks pack into them)."""
    return get_topology("paper").with_changes(gpus_per_node=gpus_per_node)


def make_trace(seed: int, ep: int, experts: int, layers: int = 2, micro_batches: int = 3, steps: int = 2,
               top_k: int = 2, tokens: int = 40, skew: float = 1.2) -> RoutingTrace:
    """Random skewed loads: a Zipf popularity over a shuffled expert order, per micro-batch noise."""
    rng = np.random.default_rng(seed)
    model = ModelShape("test", num_layers=layers, num_experts=experts, top_k=top_k, hidden=8, moe_ffn=8)
    pop = rng.permuted(np.broadcast_to(np.arange(1.0, experts + 1), (steps, micro_batches, layers, ep, experts)),
                       axis=4) ** -skew
    pop *= rng.lognormal(0, 0.5, size=pop.shape)
    pop /= pop.sum(axis=4, keepdims=True)
    loads = rng.multinomial(tokens * top_k, pop).astype(np.int32)
    return RoutingTrace(loads, model, ep, tokens * ep, {"generator": "test", "seed": seed})


def plan_of(name: str, trace: RoutingTrace, step: int, gpus_per_node: int, prev_home=None) -> StepPlan:
    """Policy `name` at FAST settings plans `step` of `trace` on nodes of `gpus_per_node` GPUs."""
    return get_policy(name, **FAST.get(name, {})).plan(trace, step, nodes_of(gpus_per_node), prev_home)
