"""`llep`: Least-Loaded Expert Parallelism (arXiv 2601.17111), per micro-batch and layer.

Homes stay static (Megatron's placement). For each (micro_batch, layer) whose static imbalance
(max GPU tokens / mean) reaches `trigger_imbalance`, experts are taken in decreasing load (LPT
order) and each is kept on its native GPU up to a capacity of `capacity_factor` x mean tokens; the
rest spills to the least-loaded other GPUs (any node), each helper filled up to the capacity. A
GPU's load counts both what it was assigned and the native experts still to come. A spill chunk
smaller than `min_tokens_per_gemm` is not split further: the whole remainder goes to the current
least-loaded helper (a small GEMM wastes the transfer). Helper weights move peer to peer on the
critical path (transfers_on_critical_path=True), and LLEP allocates its buffers on demand, so the
plan's replica slots are as many as the busiest GPU needs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relibra.cluster import Topology
from relibra.plan import PlanInfo, RuntimePlanner, StepPlan
from relibra.policies.base import Policy, check_nonnegative_int, check_positive, register
from relibra.policies.split import pack_replicas, replica_runs
from relibra.trace import RoutingTrace, static_placement


def llep_assign(expert_tokens: np.ndarray, ep: int, capacity_factor: float, min_tokens_per_gemm: int,
                trigger_imbalance: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """LPT spill assignment for a batch of (micro_batch, layer) cells under static placement.

    expert_tokens: int [B, E]. Returns flat replica lists (cell int64, gpu, expert, tokens).
    """
    b, e = expert_tokens.shape
    per_gpu = e // ep
    x_all = expert_tokens.astype(np.int64)
    native_of = np.arange(e) // per_gpu
    native = x_all.reshape(b, ep, per_gpu).sum(axis=2)  # [B, ep]
    mean = native.sum(axis=1) / ep
    active = native.max(axis=1) >= trigger_imbalance * np.maximum(mean, 1e-9)
    cap = np.maximum(np.floor(capacity_factor * mean), 1).astype(np.int64)
    pending = native.copy()
    assigned = np.zeros_like(native)
    order = np.argsort(-x_all, axis=1, kind="stable")
    cells, gpus, experts, tokens = [], [], [], []
    rows = np.arange(b)
    big = np.iinfo(np.int64).max
    for i in range(e):
        ex = order[:, i]
        x = x_all[rows, ex]
        g = native_of[ex]
        pending[rows, g] -= x
        room = cap - (assigned[rows, g] + pending[rows, g])
        keep = np.where(active, np.clip(room, 0, x), x)
        assigned[rows, g] += keep
        remaining = x - keep
        spill = np.nonzero(remaining > 0)[0]
        if len(spill) == 0:
            continue
        rem = remaining[spill]
        used = np.zeros((len(spill), ep), dtype=bool)
        used[np.arange(len(spill)), g[spill]] = True
        while len(spill):
            if ep == 1:  # no helper: everything stays native
                assigned[spill, 0] += rem
                break
            load = np.where(used, big, assigned[spill] + pending[spill])
            helper = np.argmin(load, axis=1)
            room = cap[spill] - load[np.arange(len(spill)), helper]
            chunk = np.where(room > 0, np.minimum(rem, room), rem)
            last_helper = used.sum(axis=1) == ep - 1  # this helper is the only one left
            chunk = np.where((chunk < min_tokens_per_gemm) | last_helper, rem, chunk)
            assigned[spill, helper] += chunk
            cells.append(spill)
            gpus.append(helper)
            experts.append(ex[spill])
            tokens.append(chunk)
            used[np.arange(len(spill)), helper] = True
            rem = rem - chunk
            left = rem > 0
            # the last helper takes the whole remainder, so every cell finishes within ep - 1 rounds
            spill, rem, used = spill[left], rem[left], used[left]
    if cells:
        return (np.concatenate(cells), np.concatenate(gpus), np.concatenate(experts), np.concatenate(tokens))
    empty = np.zeros(0, dtype=np.int64)
    return empty, empty, empty, empty


@dataclass(frozen=True)
class LlepInfo(PlanInfo):
    """LLEP's count: spilled_cells, the (micro-batch, layer) cells where it planned a spill."""

    spilled_cells: int = 0


@register
@dataclass
class LlepPolicy(Policy):
    """LLEP's per-(micro_batch, layer) spill planner. Defaults are the paper's.

    capacity_factor: a GPU takes at most this times the mean tokens before spilling (1.1).
    min_tokens_per_gemm: the smallest spilled chunk worth its own GEMM (1024 tokens; scale it down
        for the tiny test models).
    trigger_imbalance: plan only when max/mean GPU tokens under static placement reaches this (1.3).
    """

    name: ClassVar[str] = "llep"
    capacity_factor: float = 1.1
    min_tokens_per_gemm: int = 1024
    trigger_imbalance: float = 1.3

    def __post_init__(self):
        check_positive(self.name, capacity_factor=self.capacity_factor, trigger_imbalance=self.trigger_imbalance)
        check_nonnegative_int(self.name, min_tokens_per_gemm=self.min_tokens_per_gemm)

    def _plan(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
              prev_home: np.ndarray | None) -> StepPlan:
        loads = trace.loads[step]
        m, l, ep, e = loads.shape
        home = static_placement(l, e, ep)
        expert_tokens = loads.sum(axis=2, dtype=np.int64).reshape(m * l, e)
        start, start_cpu = time.perf_counter(), time.process_time()
        cell, gpu, expert, tokens = llep_assign(expert_tokens, ep, self.capacity_factor, self.min_tokens_per_gemm,
                                                self.trigger_imbalance)
        assign_s, assign_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
        rexp, rtok = pack_replicas((m, l, ep), cell // l, cell % l, gpu, expert, tokens)
        rstart = replica_runs(home, rexp, rtok, expert_tokens.reshape(m, l, e))
        plan = StepPlan(policy=self.name, loads=loads, home=home, replica_expert=rexp, replica_start=rstart,
                        replica_tokens=rtok, gpus_per_node=gpus_per_node, slots_per_gpu=e // ep + rexp.shape[3], replica_scope="any",
                        transfers_on_critical_path=True, planner_on_critical_path=True,
                        # the run-time part: the spill assignment, after an all-gather of every rank's
                        # per-expert counts, per (micro-batch, layer)
                        runtime_planner=RuntimePlanner(seconds=assign_s, cpu_seconds=assign_cpu_s, cells=m * l,
                                                       collective="all_gather", collective_bytes=4 * e),
                        info=LlepInfo(spilled_cells=int(len(np.unique(cell)))))
        return plan
