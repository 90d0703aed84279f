"""`lplb+`: DeepSeek's LPLB (Linear-Programming-Based Load Balancer), fed the step's exact loads.

Written from LPLB's README and the contract of its lplb/planner.py (see docs/policies.md for what
was read and where the kit differs). Top to bottom:

1. Reorder (at every re-plan, each `replan_interval` steps): EPLB without replication (num_replicas =
   experts, num_groups = the topology's groups, num_nodes = ep / gpus_per_node, num_gpus = ep) on
   the re-plan step's loads summed over micro-batches (an oracle, as in eplb+), its GPU labels
   matched to the previous homes (relabel_reorder); then each GPU's experts in decreasing load.
2. Redundant experts along a fixed topology `r2o` int [ep, columns] (LPLB's redundant_to_original):
   GPU g's redundant slot (c, j) holds a copy of the (c * columns + j)-th most loaded expert of GPU
   r2o[g, j]. Every column is a permutation of its group's GPUs, so every expert has at most 2
   copies and each copy is one edge (home GPU -> copy GPU). Topologies: cube for 8 GPUs,
   hypercube for 16, a 2-D torus (nodes x gpus per node) beyond.
3. Per micro-batch and layer, per topology group G, the LP
       minimize t_G
       base(g) - sum_{edges out of g} f_e + sum_{edges into g} f_e <= t_G     for each GPU g in G
       0 <= f_e <= cap_e = tokens of edge e's expert in this micro-batch
   base(g): the tokens of the experts homed on g; f_e: tokens edge e's copy computes. Replicas
   take floor(f_e) tokens, the home the rest. If the solver fails, the tokens of every replicated
   expert split evenly between its two copies (counted in plan.info.lp_fallback_micro_batches).

LPLB solves step 3 at run time, per (micro-batch, layer), after an all-reduce of the per-expert
token counts over the EP group; so the plan sets planner_on_critical_path = True and records that
run-time part for the cost model in plan.runtime_planner (relibra.plan.RuntimePlanner):
  seconds / cpu_seconds: wall / process-CPU seconds of all the step's step-3 solves (divide by
      cells for one (micro-batch, layer)); cells: micro_batches x layers;
  collective: "all_reduce"; collective_bytes: bytes each rank contributes per (micro-batch,
      layer): one int32 count per logical expert.
Steps 1-2 happen once per step, before it, and the copies' weights move off the critical path
(like eplb+), so `transfers_on_critical_path` stays False.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from relibra.cluster import Topology
from relibra.errors import ConfigError
from relibra.plan import PlanInfo, RuntimePlanner, StepPlan
from relibra.policies.base import Policy, check_nonnegative_int, register
from relibra.policies.eplb import check_replan, plan_from_copies, rebalance_experts, replan_step
from relibra.policies.relabel import match_gpus, relabel_home
from relibra.trace import RoutingTrace

# LPLB's topologies (tests/utils.py of deepseek-ai/LPLB): r2o columns, one entry per GPU of a group.
CUBE_8 = ((3, 0, 1, 2, 7, 4, 5, 6), (6, 7, 4, 5, 0, 1, 2, 3))
HYPERCUBE_16 = ((3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10, 15, 12, 13, 14),
                (12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11))
TOPOLOGIES = ("auto", "cube", "hypercube", "torus")


def torus_r2o(rows: int, cols: int) -> np.ndarray:
    """LPLB's 2-D torus: GPU (i, j) = i * cols + j copies from ((i + 1) % rows, j) and (i, (j + 1) % cols).
    Returns int64 [rows * cols, 2]."""
    i, j = np.divmod(np.arange(rows * cols), cols)
    return np.stack([(i + 1) % rows * cols + j, i * cols + (j + 1) % cols], axis=1)


def lplb_r2o(ep: int, gpus_per_node: int, topology: str = "auto") -> tuple[np.ndarray, int]:
    """(r2o int64 [ep, columns] in global GPU ids, group_size). auto: cube when ep == 8, hypercube
    when ep == 16, else the torus over (nodes, gpus_per_node) as one group. Columns that map a GPU
    onto itself (a torus side of length 1) are dropped, so small clusters get a ring or nothing."""
    if topology == "auto":
        topology = {8: "cube", 16: "hypercube"}.get(ep, "torus")
    if topology in ("cube", "hypercube"):
        base = np.array(CUBE_8 if topology == "cube" else HYPERCUBE_16, dtype=np.int64).T  # [group, 2]
        size = len(base)
        if ep % size:
            raise ConfigError(f"lplb+: the {topology} topology needs a multiple of {size} GPUs, got ep={ep}")
        r2o = (base[None] + (np.arange(ep // size) * size)[:, None, None]).reshape(ep, -1)
    elif topology == "torus":
        r2o, size = torus_r2o(ep // gpus_per_node, gpus_per_node), ep
    else:
        raise ConfigError(f"lplb+: topology must be one of {TOPOLOGIES}, got {topology!r}")
    keep = (r2o != np.arange(ep)[:, None]).all(axis=0)
    r2o = r2o[:, keep]
    if not (np.sort(r2o, axis=0) == np.arange(ep)[:, None]).all():
        raise ConfigError(f"lplb+: every column of the {topology} topology must be a permutation of the GPUs")
    return r2o, size


def lplb_reorder(weight: np.ndarray, ep: int, num_nodes: int, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """EPLB without replication, then each GPU's experts by decreasing load.

    weight: float [L, E]. Returns (home int64 [L, E], by_load int64 [L, ep, E / ep]: GPU g's experts,
    most loaded first).
    """
    import torch  # heavy: EPLB's tensors; other policies and `relibra --help` load without it

    layers, experts = weight.shape
    w = torch.as_tensor(np.asarray(weight, dtype=np.float64))
    phy2log = rebalance_experts(w, experts, num_groups, num_nodes, ep)[0].numpy()  # [L, E], GPU-major
    per_gpu = phy2log.reshape(layers, ep, experts // ep)
    order = torch.as_tensor(np.take_along_axis(weight, phy2log, axis=1).reshape(per_gpu.shape))
    by_load = np.take_along_axis(per_gpu, order.argsort(dim=-1, descending=True).numpy(), axis=2)
    home = np.empty((layers, experts), dtype=np.int64)
    np.put_along_axis(home, phy2log, np.arange(experts)[None] // (experts // ep), axis=1)
    return home, by_load


def lplb_edges(by_load: np.ndarray, r2o: np.ndarray, redundant_slots: int) -> tuple[np.ndarray, ...]:
    """The redundant copies: GPU g's slot (c, j) copies the (c * columns + j)-th expert of GPU r2o[g, j].

    by_load: int [L, ep, k]; r2o: int [ep, columns]. Uses columns' = min(columns, k, slots) columns and
    min(slots, k) // columns' copies per column. Returns flat int64 arrays (layer, expert, home GPU,
    copy GPU), one entry per edge.
    """
    layers, ep, k = by_load.shape
    cols = min(r2o.shape[1], k, redundant_slots)
    if cols == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    combined = min(redundant_slots, k) // cols
    c, j = np.divmod(np.arange(combined * cols), cols)  # slot (c, j) of every GPU
    src = r2o[:, j]  # [ep, slots] home GPU of each copy
    expert = by_load[:, src, c * cols + j]  # [L, ep, slots]
    li = np.broadcast_to(np.arange(layers)[:, None, None], expert.shape)
    gi = np.broadcast_to(np.arange(ep)[None, :, None], expert.shape)
    return li.ravel(), expert.ravel(), np.broadcast_to(src[None], expert.shape).ravel(), gi.ravel()


def lplb_solve(expert_tokens: np.ndarray, home: np.ndarray, edges: tuple[np.ndarray, ...], ep: int,
               group_size: int) -> tuple[np.ndarray, int]:
    """Step 3 for every (micro-batch, layer, group): tokens each copy computes.

    expert_tokens: int [M, L, E]; home: int [L, E]; edges: (layer, expert, home GPU, copy GPU) flat
    arrays of n edges. All layers and groups of one micro-batch go to HiGHS as one block-diagonal LP
    (objective: the sum of the blocks' t, which is separable). Returns (int64 [M, n], the number of
    micro-batches whose LP failed and were split evenly).
    """
    m, layers, experts = expert_tokens.shape
    el, ex, eo, eg = edges
    n = len(el)
    out = np.zeros((m, n), dtype=np.int64)
    if n == 0:
        return out, 0
    groups = ep // group_size
    # rows: (layer, GPU) loads; columns: the n edge flows, then t per (layer, group)
    t_col = n + (np.arange(layers)[:, None] * groups + np.arange(ep) // group_size).ravel()  # [L * ep]
    rows = np.concatenate([el * ep + eo, el * ep + eg, np.arange(layers * ep)])
    cols = np.concatenate([np.arange(n), np.arange(n), t_col])
    vals = np.concatenate([-np.ones(n), np.ones(n), -np.ones(layers * ep)])  # out of home, into copy, -t
    a_ub = sp.csr_matrix((vals, (rows, cols)), shape=(layers * ep, n + layers * groups))
    cost = np.concatenate([np.zeros(n), np.ones(layers * groups)])
    lay = np.broadcast_to(np.arange(layers)[:, None], home.shape)
    fallbacks = 0
    for mb in range(m):
        x = expert_tokens[mb]
        base = np.zeros((layers, ep))
        np.add.at(base, (lay, home), x)
        cap = x[el, ex].astype(np.float64)
        bounds = np.concatenate([np.stack([np.zeros(n), cap], axis=1),
                                 np.tile([[-np.inf, np.inf]], (layers * groups, 1))])
        res = linprog(cost, A_ub=a_ub, b_ub=-base.ravel(), bounds=bounds, method="highs")
        if res.status == 0:
            out[mb] = np.minimum(np.floor(res.x[:n] + 1e-6).astype(np.int64), x[el, ex])
        else:  # even split between the home and its one copy
            out[mb] = x[el, ex] // 2
            fallbacks += 1
    return out, fallbacks


def relabel_reorder(home: np.ndarray, by_load: np.ndarray, prev_home: np.ndarray,
                    group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """lplb_reorder's placement with its GPU labels matched to prev_home (relibra.policies.relabel).

    home: int [L, E]; by_load: int [L, ep, E / ep]; prev_home: int [L, E]; group_size: GPUs that
    move as one block. Returns (home, by_load) relabelled: the same experts share a GPU.
    """
    layers, experts = home.shape
    ep = by_load.shape[1]
    held = np.zeros((layers, experts, ep), dtype=bool)
    np.put_along_axis(held, home[:, :, None], True, axis=2)
    perm = match_gpus(held, prev_home, group_size)  # [L, ep]
    moved = np.empty_like(by_load)
    np.put_along_axis(moved, np.broadcast_to(perm[:, :, None], by_load.shape), by_load, axis=1)
    return relabel_home(home, perm), moved


@dataclass(frozen=True)
class LplbInfo(PlanInfo):
    """lplb+'s clocks and counts: rebalance_seconds / rebalance_cpu_seconds (steps 1-2, once per step;
    the run-time step 3 is plan.runtime_planner), lp_fallback_micro_batches (micro-batches whose LP
    failed and were split evenly), lplb_topology_columns (columns of the r2o matrix), lplb_group_size
    (GPUs per LP group)."""

    rebalance_seconds: float = 0.0
    rebalance_cpu_seconds: float = 0.0
    lp_fallback_micro_batches: int = 0
    lplb_topology_columns: int = 0
    lplb_group_size: int = 0

    @property
    def balancing_seconds(self) -> tuple[float, float]:
        return self.rebalance_seconds, self.rebalance_cpu_seconds


@register
@dataclass
class LplbOraclePolicy(Policy):
    """LPLB on the step's exact loads (oracle reorder), per-micro-batch LP at run time.

    redundant_slots_per_gpu: redundant slots per GPU (LPLB's n_redundants_per_rank), default 2, the
        same replica buffer ReLibra gets.
    topology: "auto" (cube for 8 GPUs, hypercube for 16, torus beyond), "cube" (groups of 8),
        "hypercube" (groups of 16) or "torus" (one group).
    relabel: map step 1's placement onto the previous step's homes so that the fewest experts move
        (relibra.policies.relabel, whole nodes first when EPLB's policy is hierarchical), before the
        redundant copies are laid along the topology. False: EPLB's own GPU labels.
    replan_interval: k, steps 1-2 run at steps that are multiples of k, on that step's loads; the
        homes and copies stay until the next re-plan, and step 3 splits each step's own tokens.
    replan_phase: the re-plans fall on steps equal to replan_phase modulo k, as eplb's.
    """

    name: ClassVar[str] = "lplb+"
    redundant_slots_per_gpu: int = 2
    topology: str = "auto"
    relabel: bool = True
    replan_interval: int = 1
    replan_phase: int = 0

    def __post_init__(self):
        check_nonnegative_int(self.name, redundant_slots_per_gpu=self.redundant_slots_per_gpu)
        check_replan(self.name, self.relabel, self.replan_interval, self.replan_phase)
        if self.topology not in TOPOLOGIES:
            raise ConfigError(f"policy {self.name!r}: topology must be one of {TOPOLOGIES}, got {self.topology!r}")

    def _plan(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
              prev_home: np.ndarray | None) -> StepPlan:
        loads = trace.loads[step]
        m, l, ep, e = loads.shape
        start, start_cpu = time.perf_counter(), time.process_time()
        r2o, group_size = lplb_r2o(ep, gpus_per_node, self.topology)
        placed = replan_step(step, self.replan_interval, self.replan_phase)
        weight = trace.loads[placed].sum(axis=(0, 2), dtype=np.int64)
        home, by_load = lplb_reorder(weight.astype(np.float64), ep, ep // gpus_per_node, ep // group_size)
        if prev_home is not None and self.relabel:
            hierarchical = (ep // group_size) % (ep // gpus_per_node) == 0  # EPLB's policy split
            home, by_load = relabel_reorder(home, by_load, prev_home, gpus_per_node if hierarchical else ep)
        edges = lplb_edges(by_load, r2o, self.redundant_slots_per_gpu)
        rebalance_s, rebalance_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
        el, ex, eo, eg = edges
        held = np.zeros((l, e, ep), dtype=bool)
        held[np.arange(l)[:, None], np.arange(e)[None], home] = True
        held[el, ex, eg] = True
        expert_tokens = loads.sum(axis=2, dtype=np.int64)
        start, start_cpu = time.perf_counter(), time.process_time()
        tokens, lp_fallbacks = lplb_solve(expert_tokens, home, edges, ep, group_size)
        solve_s, solve_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
        edge_of = np.full((l, e, ep), -1, dtype=np.int64)
        edge_of[el, ex, eg] = np.arange(len(el))

        def edge_tokens(li, ei, gi):
            return tokens[:, edge_of[li, ei, gi]]

        scope = "node" if (eo // gpus_per_node == eg // gpus_per_node).all() else "any"
        slots = e // ep + int(np.bincount(eg[el == 0], minlength=ep).max() if len(el) else 0)
        plan = plan_from_copies(self.name, loads, held, home, gpus_per_node, slots,
                                scope if len(el) else "none", edge_tokens, equal_homes=True)
        plan.planner_on_critical_path = True  # the solves run between routing and dispatch
        plan.runtime_planner = RuntimePlanner(seconds=solve_s, cpu_seconds=solve_cpu_s, cells=m * l,
                                              collective="all_reduce", collective_bytes=4 * e)
        plan.info = LplbInfo(rebalance_seconds=rebalance_s, rebalance_cpu_seconds=rebalance_cpu_s,
                             lp_fallback_micro_batches=lp_fallbacks, lplb_topology_columns=int(r2o.shape[1]),
                             lplb_group_size=group_size)
        return plan
