"""`megatron`: Megatron-LM's static expert placement, no replicas.

Expert e lives on EP rank e // (experts / ep) in every layer, for every step; every token goes to
that home. This is the baseline every speedup is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relibra.cluster import Topology
from relibra.plan import StepPlan, empty_replicas
from relibra.policies.base import Policy, register
from relibra.trace import RoutingTrace, static_placement


@register
@dataclass
class MegatronPolicy(Policy):
    """Static contiguous placement; no parameters."""

    name: ClassVar[str] = "megatron"

    def _plan(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
              prev_home: np.ndarray | None) -> StepPlan:
        loads = trace.loads[step]
        m, l, ep, e = loads.shape
        rexp, rstart, rtok = empty_replicas(m, l, ep, 0)
        return StepPlan(policy=self.name, loads=loads, home=static_placement(l, e, ep), replica_expert=rexp,
                        replica_start=rstart, replica_tokens=rtok, gpus_per_node=gpus_per_node, slots_per_gpu=e // ep,
                        replica_scope="none")
