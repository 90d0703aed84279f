"""Process groups for the runtime: one expert-parallel group over every rank, simulated nodes, and
the ProcessGroupCollection megatron-core's MoELayer takes instead of its global parallel_state.

EP spans the whole world and so does data parallelism of the dense parts (each rank runs its own
tokens; dense gradients are all-reduced over all ranks). There is no tensor, context or pipeline
parallelism and no data parallelism over experts: those groups are single-rank.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from relibra.runtime.config import NodeLayout


@dataclass
class RuntimeGroups:
    """Every group one rank needs; built identically (same call order) on every rank."""

    rank: int
    layout: NodeLayout
    ep: dist.ProcessGroup  # all ranks, in rank order
    node: dist.ProcessGroup  # the ranks of this rank's node
    solo: dist.ProcessGroup  # this rank alone (tp, cp, expt_tp, expt_dp)
    solo_groups: list  # every rank's solo group, indexed by rank

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def same_node(self, a: int, b: int) -> bool:
        return self.layout.node_of(a) == self.layout.node_of(b)

    def collection(self, ep_group: dist.ProcessGroup | None = None):
        """megatron-core ProcessGroupCollection with `ep_group` (default: all ranks) as EP."""
        # megatron-core (seconds to import) loads only in ranks that build a model: every launched rank
        # imports this module for init_distributed, the gloo benchmarks' ranks too.
        from megatron.core.process_groups_config import ProcessGroupCollection

        ep_group = ep_group or self.ep
        pgc = ProcessGroupCollection()
        for name in ("tp", "pp", "mp", "embd", "pos_embd", "cp", "tp_cp", "expt_tp", "expt_dp"):
            setattr(pgc, name, self.solo)
        for name in ("ep", "tp_ep", "tp_ep_pp", "tp_dp_cp", "dp", "dp_cp"):
            setattr(pgc, name, ep_group)
        return pgc


def init_distributed(backend: str | None = None, timeout_s: float = 300.0,
                     store_file: str | None = None) -> tuple[int, int]:
    """Join the job described by torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT), or with
    `store_file` the ranks meeting through a FileStore at that path (no rendezvous socket at all)."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        store = dist.FileStore(store_file, world) if store_file else None
        dist.init_process_group(backend, rank=rank, world_size=world, store=store,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return rank, world


def build_groups(layout: NodeLayout) -> RuntimeGroups:
    """Create the EP, node and single-rank groups. Collective: every rank must call it."""
    rank = dist.get_rank()
    ep = dist.new_group(list(range(layout.world_size)))
    node_group = None
    for n in range(layout.num_nodes):
        g = dist.new_group(layout.node_ranks(n))
        if layout.node_of(rank) == n:
            node_group = g
    solos = [dist.new_group([r]) for r in range(layout.world_size)]
    return RuntimeGroups(rank, layout, ep, node_group, solos[rank], solos)
