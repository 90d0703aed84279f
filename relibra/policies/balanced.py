"""`balanced`: the ideal bound, not a system. Routing is forced uniform over experts.

Each (micro_batch, layer, src) keeps its token count but spreads it evenly over all experts, so
with Megatron's static placement every GPU computes the mean load (to within one token per
source). The simulator's `balanced` throughput is what perfect balance would buy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relibra.cluster import Topology
from relibra.plan import StepPlan, empty_replicas
from relibra.policies.base import Policy, register
from relibra.trace import RoutingTrace, static_placement


def uniform_loads(loads: np.ndarray) -> np.ndarray:
    """Uniform routing with the same per-(micro_batch, layer, src) token totals.

    loads: int [M, L, ep, E]. Returns int32 [M, L, ep, E]: each src gives every expert
    total // E tokens; the total % E left over go one each to experts taken in a GPU-interleaved
    cyclic order (expert 0 of every GPU, then expert 1 of every GPU, ...), each src continuing
    where the previous one stopped, so that GPU totals under static placement differ by at most one.
    """
    m, l, ep, e = loads.shape
    per_gpu = e // ep
    totals = loads.sum(axis=3, dtype=np.int64)  # [M, L, ep]
    base, extra = totals // e, totals % e
    # cyclic position of each expert in the interleaved order: expert g*per_gpu + j sits at j*ep + g
    expert = np.arange(e)
    position = (expert % per_gpu) * ep + expert // per_gpu  # [E]
    start = (np.cumsum(extra, axis=2) - extra) % e  # [M, L, ep] where each src's window begins
    offset = (position[None, None, None, :] - start[..., None]) % e
    out = base[..., None] + (offset < extra[..., None])
    return out.astype(np.int32)


@register
@dataclass
class BalancedPolicy(Policy):
    """Uniform routing on static placement; no parameters."""

    name: ClassVar[str] = "balanced"

    def _plan(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
              prev_home: np.ndarray | None) -> StepPlan:
        loads = uniform_loads(trace.loads[step])
        m, l, ep, e = loads.shape
        rexp, rstart, rtok = empty_replicas(m, l, ep, 0)
        return StepPlan(policy=self.name, loads=loads, home=static_placement(l, e, ep), replica_expert=rexp,
                        replica_start=rstart, replica_tokens=rtok, gpus_per_node=gpus_per_node, slots_per_gpu=e // ep,
                        replica_scope="none", uniform_routing=True)
