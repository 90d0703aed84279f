"""StepPlan: what a balancing policy decides for one training step, consumed by the simulator and
the real runtime alike.

Vocabulary: an *expert* is logical; a *slot* is a place for one expert's weights on one GPU; an
expert's *home* is the slot that owns its weights and optimizer state; a *replica* is a temporary
copy in a spare slot, used for one (micro_batch, layer) and holding no optimizer state.

Token flow, held sparse. For every (micro_batch, layer) the plan names each GPU's replicas
(`replica_expert[m, l, gpu, r]`, -1 when slot r is empty) and which of their expert's tokens each
one computes: a run `[replica_start, replica_start + replica_tokens)` of the expert's tokens of
that (micro_batch, layer) counted in source-rank order (source 0's tokens first, then source 1's,
...). The home computes every token no replica takes. So a replica receives from source s the
overlap of its run with source s's tokens (`replica_rows`), and token conservation reduces to: the
runs of one expert lie inside its tokens and do not overlap.

Why runs and not a per-(source, replica) list: every policy lets a copy take a run of its expert's
tokens in source order (relibra.policies.split, for locality: nodes are runs of ranks), and the
per-source list of such runs has about 17 million entries at deepseek-v3 EP256 with 32
micro-batches, against two numbers per replica slot here. The per-source view is built one layer at
a time where it is needed (simulator, runtime, validator, tests), by the kernels in relibra.flow.

This module holds StepPlan, its records (PlanInfo, RuntimePlanner) and its validator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from relibra.errors import PlanError
# the flow kernels (relibra.flow) the plan is read through; callers may import them from here too
from relibra.flow import (HomeGroups, LayerFlow, count_type, gpu_tokens_from, home_tokens_of, homes_per_gpu,
                          rank_within, run_rows, scatter_rows)
from relibra.trace import skewness

__all__ = ["REPLICA_SCOPES", "PlanInfo", "RuntimePlanner", "StepPlan", "validate_plan", "empty_replicas",
           "HomeGroups", "LayerFlow", "count_type", "gpu_tokens_from", "home_tokens_of", "homes_per_gpu",
           "rank_within", "run_rows", "scatter_rows"]

REPLICA_SCOPES = ("none", "node", "any")


@dataclass(frozen=True)
class PlanInfo:
    """What a planner reports about one plan: its clocks and its own counters.

    plan_seconds, plan_cpu_seconds: wall seconds and process-CPU seconds of the whole plan (Policy.plan
    times the policy's planner, not the interface's checks; 0 for a plan built by hand). A policy
    that times its stages or counts what its search did subclasses this record beside its planner
    (relibra.policies.relibra.ReLibraInfo, eplb.EplbInfo, ...).
    """

    plan_seconds: float = 0.0
    plan_cpu_seconds: float = 0.0

    @property
    def balancing_seconds(self) -> tuple[float, float]:
        """(wall, CPU) seconds of the stage that balances the loads: the whole plan here; a policy that
        times that stage apart (ReLibra's replication, EPLB's rebalance) returns its clocks."""
        return self.plan_seconds, self.plan_cpu_seconds


@dataclass(frozen=True)
class RuntimePlanner:
    """The part of a plan that a real run makes between routing and dispatch (lplb+'s LP, LLEP's spill
    assignment), timed apart by the policy; the cost model charges it per (micro-batch, layer).

    seconds, cpu_seconds: its wall and process-CPU seconds over the whole step; cells: the (micro-batch,
    layer) cells it planned; collective: how every rank's int32 expert counts reach the planner first;
    collective_bytes: what one rank contributes (4 x experts).
    """

    seconds: float
    cpu_seconds: float
    cells: int
    collective: Literal["all_gather", "all_reduce"]
    collective_bytes: int


@dataclass
class StepPlan:
    """One training step's placement, replicas and token flow.

    policy: name of the policy that made it.
    loads: int32 [micro_batches, layers, ep, experts] tokens routed (src rank, expert); the step's
        trace loads, except for the `balanced` ideal whose routing is forced uniform.
    home: int64 [layers, experts] home GPU (EP rank) of each expert for this step.
    replica_expert: int32 [micro_batches, layers, ep, replica_slots] expert held by each spare slot, -1 empty.
    replica_start: int [micro_batches, layers, ep, replica_slots] first token of the replica's run among its
        expert's tokens of that (micro_batch, layer) in source-rank order (0 for an empty slot).
    replica_tokens: int [micro_batches, layers, ep, replica_slots] tokens in that run, the tokens the replica
        computes (0 for an empty slot).
    gpus_per_node: EP ranks per node (node of rank g is g // gpus_per_node).
    slots_per_gpu: the most expert weights (homes + replicas) one GPU holds in one layer.
    replica_scope: "none" (no replicas), "node" (replicas only in the home's node), "any".
    equal_homes: every GPU homes exactly experts / ep experts.
    transfers_on_critical_path: replica weights move on the critical path (LLEP) instead of being
        overlapped with attention compute (ReLibra, and the replication baselines given its buffer).
    uniform_routing: routing was forced uniform (the `balanced` ideal); loads differ from the trace.
    planner_on_critical_path: part of the plan is made at run time, between routing and dispatch
        (lplb+, LLEP), so a real run waits for it.
    runtime_planner: that part's clocks and collective (RuntimePlanner) when the policy times it
        apart; None charges the whole plan's time (relibra.costs.phases.planner_seconds).
    prev_home: int [layers, experts] the placement the plan was made from (Policy.plan's prev_home):
        migration moves experts from it to `home`; None when none was given.
    info: the planner's clocks and counters (PlanInfo or a policy's subclass of it).
    """

    policy: str
    loads: np.ndarray
    home: np.ndarray
    replica_expert: np.ndarray
    replica_start: np.ndarray
    replica_tokens: np.ndarray
    gpus_per_node: int
    slots_per_gpu: int
    replica_scope: str = "none"
    equal_homes: bool = True
    transfers_on_critical_path: bool = False
    uniform_routing: bool = False
    planner_on_critical_path: bool = False
    runtime_planner: RuntimePlanner | None = None
    prev_home: np.ndarray | None = None
    info: PlanInfo = field(default_factory=PlanInfo)

    # ---- shape -------------------------------------------------------------------------------
    @property
    def num_microbatches(self) -> int:
        return self.loads.shape[0]

    @property
    def num_layers(self) -> int:
        return self.loads.shape[1]

    @property
    def ep(self) -> int:
        return self.loads.shape[2]

    @property
    def num_experts(self) -> int:
        return self.loads.shape[3]

    @property
    def replica_slots(self) -> int:
        return self.replica_expert.shape[3]

    @property
    def num_nodes(self) -> int:
        return self.ep // self.gpus_per_node

    # ---- derived: the one token flow (every per-GPU, per-copy and per-pair count comes from here) ----
    def occupied_replica_tokens(self) -> np.ndarray:
        """Tokens each replica computes: int64 [M, L, ep, replica_slots] (0 for an empty slot)."""
        return np.asarray(self.replica_tokens, dtype=np.int64) * (self.replica_expert >= 0)

    def home_tokens(self) -> np.ndarray:
        """Tokens each expert's home computes: int64 [M, L, E] (its load minus what its replicas take)."""
        return home_tokens_of(self.loads.sum(axis=2, dtype=np.int64), self.replica_expert,
                              self.occupied_replica_tokens())

    def replica_rows(self, layer: int, micro_batch: np.ndarray, gpu: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Tokens each of the given occupied replica slots of `layer` receives from each source:
        signed int [n, ep_src] (the loads' type, at least 32 bits); micro_batch, gpu, slot: int [n]."""
        expert = self.replica_expert[micro_batch, layer, gpu, slot].astype(np.int64)
        per_source = self.loads[micro_batch, layer, :, expert]  # [n, ep_src]
        count = count_type(self.loads.dtype)
        start = self.replica_start[micro_batch, layer, gpu, slot].astype(count)
        return run_rows(per_source, start, start + self.replica_tokens[micro_batch, layer, gpu, slot].astype(count))

    def replica_flow_entries(self) -> dict:
        """The token flow into replicas as a list, one entry per (micro_batch, layer, src, gpu, slot)
        that carries tokens: {"micro_batch", "layer", "src", "gpu", "slot", "tokens": int64 [n]}, in
        (layer, micro_batch, gpu, slot, src) order. Built layer by layer; at paper scale it holds tens
        of millions of entries, so the simulator never asks for it."""
        parts = []
        occupied = self.replica_expert >= 0
        for layer in range(self.num_layers):
            mi, gi, ri = np.nonzero(occupied[:, layer])
            rows = self.replica_rows(layer, mi, gi, ri)
            k, src = np.nonzero(rows > 0)
            parts.append(np.stack([mi[k], np.full(len(k), layer), src, gi[k], ri[k], rows[k, src]]))
        flat = np.concatenate(parts, axis=1) if parts else np.zeros((6, 0), dtype=np.int64)
        return dict(zip(("micro_batch", "layer", "src", "gpu", "slot", "tokens"), flat.astype(np.int64)))

    def dense_replica_flow(self) -> np.ndarray:
        """Tokens each source sends each replica: int64 [M, L, ep_src, ep, replica_slots]. For small plans
        (tests, the tutorial): at deepseek-v3 EP256 this array would be about 2 GB."""
        m, l, ep, _ = self.loads.shape
        out = np.zeros((m, l, ep, ep, self.replica_slots), dtype=np.int64)
        flow = self.replica_flow_entries()
        out[flow["micro_batch"], flow["layer"], flow["src"], flow["gpu"], flow["slot"]] = flow["tokens"]
        return out

    def layer_flows(self, groups: HomeGroups | None = None):
        """The token flow one layer at a time, sources last, so that the simulator's hot path never
        builds an [M, L, ep, E] or [M, L, ep, ep] array and moves whole rows of sources.

        Yields a LayerFlow(layer, home_flow, slots, rows) per layer, in order:
          home_flow: signed int [M, E, ep_src] (the loads' type, at least 32 bits) tokens of each
            (expert, src) left for the expert's home; with `groups` (HomeGroups of this plan's home)
            its expert axis is in groups.order[layer] (experts grouped by home GPU), else in expert order;
          slots: (micro_batch, gpu, slot) int64 [n] index arrays of the layer's occupied replica slots
            (in no particular order);
          rows: signed int [n, ep_src] tokens each of those replicas receives from each source.
        Only occupied slots carry tokens (runs of empty slots are ignored; the validator rejects them).
        """
        m, l, ep, e = self.loads.shape
        occupied = self.replica_expert >= 0
        any_replica = bool(self.replica_slots) and bool(occupied.any())
        none = np.zeros(0, dtype=np.int64)
        load_type = count_type(self.loads.dtype)
        for layer in range(l):
            loads = self.loads[:, layer].transpose(0, 2, 1)  # [M, E, src] view
            column = np.arange(e)
            if groups is not None and not groups.in_order[layer]:
                home_flow = np.take(loads, groups.order[layer], axis=1).astype(load_type, copy=False)  # a copy
                column = groups.position[layer]
            else:
                home_flow = np.array(loads, dtype=load_type, order="C")
            mi, gi, ri = np.nonzero(occupied[:, layer]) if any_replica else (none, none, none)
            if len(mi):
                key = mi * e + column[self.replica_expert[mi, layer, gi, ri]]
                rank = rank_within(key)
                if rank.any():  # the replicas of one expert one after another, so that rounds are blocks
                    order = np.argsort(rank, kind="stable")
                    mi, gi, ri, key = mi[order], gi[order], ri[order], key[order]
                rows = self.replica_rows(layer, mi, gi, ri)  # [n, src]
                scatter_rows(np.subtract, home_flow, key // e, key % e, rows)  # what replicas take leaves home
            else:
                rows = np.zeros((0, ep), dtype=load_type)
            yield LayerFlow(layer, home_flow, (mi, gi, ri), rows)

    def home_flow(self) -> np.ndarray:
        """Tokens of each (src, expert) left for the expert's home: int64 [M, L, ep_src, E].

        The loads minus what the occupied replica slots take (flows into empty slots are not
        subtracted; the validator rejects them).
        """
        out = np.empty(self.loads.shape, dtype=np.int64)
        for flow in self.layer_flows():
            out[:, flow.layer] = flow.home_flow.transpose(0, 2, 1)
        return out

    def gpu_tokens(self) -> np.ndarray:
        """Tokens each GPU computes (expert GEMM rows): int64 [micro_batches, layers, ep]."""
        return gpu_tokens_from(self.loads.sum(axis=2, dtype=np.int64), self.home, self.replica_expert,
                               self.occupied_replica_tokens())

    def skewness(self) -> np.ndarray:
        """max / mean tokens per GPU: float64 [micro_batches, layers]."""
        return skewness(self.gpu_tokens())

    def homes_per_gpu(self) -> np.ndarray:
        """Experts homed on each GPU: int64 [layers, ep]."""
        return homes_per_gpu(self.home, self.ep)

    def token_matrix(self) -> np.ndarray:
        """Tokens dispatched from each src to each GPU (combine sends them back): float64 [M, L, ep_src, ep_dst]."""
        return self.flows()[0]

    def layer_token_matrices(self):
        """Tokens dispatched from each src to each GPU, one layer at a time: yields (layer, float64
        [M, ep_src, ep_dst]), a view of a buffer reused from one layer to the next (copy it to keep it).
        Each home's column sums its experts' home flows, each replica's GPU column adds the replica's
        rows (integer sums, exact in float64)."""
        m, l, ep, e = self.loads.shape
        groups = HomeGroups(self.home, ep)
        out = np.empty((m, ep, ep))  # [M, dst, src]
        for flow in self.layer_flows(groups):
            groups.reduce(np.add, flow.home_flow, flow.layer, out)
            mi, gi, _ = flow.slots
            scatter_rows(np.add, out, mi, gi, flow.rows)  # what replicas take arrives at their GPU
            yield flow.layer, out.transpose(0, 2, 1)

    def flows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The token flow in one pass.

        Returns (token_matrix float64 [M, L, ep_src, ep_dst], home_tokens int64 [M, L, E] tokens each
        expert's home computes, replica_tokens int64 [M, L, ep, replica_slots] tokens each replica
        computes). The simulator itself takes the per-GPU counts from gpu_tokens and the matrix layer
        by layer (layer_token_matrices) only where it needs it.
        """
        m, l, ep, e = self.loads.shape
        matrix = np.empty((m, l, ep, ep))
        for layer, layer_matrix in self.layer_token_matrices():
            matrix[:, layer] = layer_matrix
        replica_tokens = self.occupied_replica_tokens()
        home_tokens = home_tokens_of(self.loads.sum(axis=2, dtype=np.int64), self.replica_expert, replica_tokens)
        return matrix, home_tokens, replica_tokens

    def num_replicas(self) -> np.ndarray:
        """Occupied replica slots per GPU: int64 [micro_batches, layers, ep]."""
        return (self.replica_expert >= 0).sum(axis=3)

    def validate(self, trace_loads: np.ndarray | None = None) -> None:
        """Check every invariant; raise PlanError naming the first violation.

        trace_loads: optional int [micro_batches, layers, ep, experts], the trace's loads for the
        step; the plan's loads must equal them (or, under uniform routing, match their per-src totals).
        """
        validate_plan(self, trace_loads)


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def validate_plan(plan: StepPlan, trace_loads: np.ndarray | None = None) -> None:
    """See StepPlan.validate."""
    name = f"plan of policy {plan.policy!r}"
    # Types first, so that a float home or NaN loads give a PlanError, not a TypeError further down.
    axes = {"loads": "micro_batch, layer, src, expert", "home": "layer, expert",
            "replica_expert": "micro_batch, layer, gpu, slot", "replica_start": "micro_batch, layer, gpu, slot",
            "replica_tokens": "micro_batch, layer, gpu, slot"}
    for key, axis_names in axes.items():
        arr = getattr(plan, key)
        if not isinstance(arr, np.ndarray):
            raise PlanError(f"{name}: {key} must be a numpy array, got {type(arr).__name__}")
        if arr.dtype.kind not in "iu":
            if arr.dtype.kind == "f" and arr.size:
                bad = ~np.isfinite(arr) | (arr != np.round(arr))
                if bad.any():
                    where = f"[{axis_names}]" if arr.ndim == axis_names.count(",") + 1 else "index"
                    raise PlanError(f"{name}: {key} at {where}={_first(bad)} holds {arr[_first(bad)].item()!r}; "
                                    f"token counts and ids must be integers")
            raise PlanError(f"{name}: {key} has dtype {arr.dtype}; it must hold integers (token counts and ids "
                            f"are whole numbers)")
    for key in ("gpus_per_node", "slots_per_gpu"):
        value = getattr(plan, key)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise PlanError(f"{name}: {key} is {value!r}, not an integer")
    loads = plan.loads
    if loads.ndim != 4:
        raise PlanError(f"{name}: loads must be [micro_batches, layers, ep, experts], got shape {loads.shape}")
    m, l, ep, e = loads.shape
    if (loads < 0).any():
        raise PlanError(f"{name}: negative load at [micro_batch, layer, src, expert]={_first(loads < 0)}")
    if plan.replica_scope not in REPLICA_SCOPES:
        raise PlanError(f"{name}: replica_scope must be one of {REPLICA_SCOPES}, got {plan.replica_scope!r}")
    if plan.gpus_per_node <= 0 or ep % plan.gpus_per_node:
        raise PlanError(f"{name}: gpus_per_node={plan.gpus_per_node} does not divide ep={ep}")
    if plan.home.shape != (l, e):
        raise PlanError(f"{name}: home must have shape [layers, experts]=({l}, {e}), got {plan.home.shape}")
    if ((plan.home < 0) | (plan.home >= ep)).any():
        bad = _first((plan.home < 0) | (plan.home >= ep))
        raise PlanError(f"{name}: home of [layer, expert]={bad} is GPU {int(plan.home[bad])}, outside [0, {ep})")
    if plan.prev_home is not None:
        prev = np.asarray(plan.prev_home)
        if prev.shape != (l, e) or prev.dtype.kind not in "iu" or ((prev < 0) | (prev >= ep)).any():
            raise PlanError(f"{name}: prev_home must be integer GPUs in [0, {ep}) of shape [layers, experts]="
                            f"({l}, {e}), got shape {prev.shape} of {prev.dtype}")
    if not isinstance(plan.info, PlanInfo):
        raise PlanError(f"{name}: info must be a relibra.plan.PlanInfo, got {type(plan.info).__name__}")
    if plan.runtime_planner is not None:
        if not plan.planner_on_critical_path:
            raise PlanError(f"{name}: it times a run-time planner (runtime_planner) but planner_on_critical_path "
                            f"is False")
        if plan.runtime_planner.cells <= 0:
            raise PlanError(f"{name}: runtime_planner.cells is {plan.runtime_planner.cells}; it must be positive")
    homes = homes_per_gpu(plan.home, ep)  # [L, ep]
    if plan.equal_homes and (homes != e // ep).any():
        li, g = _first(homes != e // ep)
        raise PlanError(f"{name}: layer {li} GPU {g} homes {int(homes[li, g])} experts; "
                        f"each GPU must home {e // ep}")
    rexp = plan.replica_expert
    r = rexp.shape[3] if rexp.ndim == 4 else -1
    if rexp.shape != (m, l, ep, r):
        raise PlanError(f"{name}: replica_expert must have shape [{m}, {l}, {ep}, slots], got {rexp.shape}")
    for key in ("replica_start", "replica_tokens"):
        if getattr(plan, key).shape != rexp.shape:
            raise PlanError(f"{name}: {key} must have replica_expert's shape {rexp.shape}, got {getattr(plan, key).shape}")
    if ((rexp < -1) | (rexp >= e)).any():
        bad = _first((rexp < -1) | (rexp >= e))
        raise PlanError(f"{name}: replica slot [micro_batch, layer, gpu, slot]={bad} holds expert "
                        f"{int(rexp[bad])}, outside [-1, {e})")
    occupied = rexp >= 0
    if plan.replica_scope == "none" and occupied.any():
        raise PlanError(f"{name}: replicas are not allowed, but slot {_first(occupied)} holds one")
    used = homes[None] + occupied.sum(axis=3)  # [M, L, ep]
    if (used > plan.slots_per_gpu).any():
        bad = _first(used > plan.slots_per_gpu)
        raise PlanError(f"{name}: [micro_batch, layer, gpu]={bad} holds {int(used[bad])} experts, over the "
                        f"limit of {plan.slots_per_gpu} slots per GPU")
    if occupied.any():
        mi, li, gi, ri = np.nonzero(occupied)
        ex = rexp[mi, li, gi, ri]
        home_gpu = plan.home[li, ex]
        on_home = home_gpu == gi
        if on_home.any():
            i = int(np.argmax(on_home))
            raise PlanError(f"{name}: [micro_batch, layer, gpu, slot]=({mi[i]}, {li[i]}, {gi[i]}, {ri[i]}) "
                            f"replicates expert {ex[i]} on its own home GPU")
        if plan.replica_scope == "node":
            off = home_gpu // plan.gpus_per_node != gi // plan.gpus_per_node
            if off.any():
                i = int(np.argmax(off))
                raise PlanError(f"{name}: replica of expert {ex[i]} at [micro_batch, layer, gpu]=({mi[i]}, {li[i]}, "
                                f"{gi[i]}) is outside its home's node {home_gpu[i] // plan.gpus_per_node}; "
                                f"this policy replicates only inside a node")
        key = (((mi * l + li) * ep + gi) * e + ex)
        uniq, counts = np.unique(key, return_counts=True)
        if (counts > 1).any():
            k = int(uniq[np.argmax(counts > 1)])
            raise PlanError(f"{name}: expert {k % e} has two replicas on GPU {(k // e) % ep} at "
                            f"[micro_batch, layer]=({k // e // ep // l}, {(k // e // ep) % l})")
    start, size = plan.replica_start, plan.replica_tokens
    for key, values in (("replica_start", start), ("replica_tokens", size)):
        if (values < 0).any():
            raise PlanError(f"{name}: negative {key} at [micro_batch, layer, gpu, slot]={_first(values < 0)}")
    to_empty = (size > 0) & ~occupied
    if to_empty.any():
        raise PlanError(f"{name}: tokens sent to an empty replica slot at [micro_batch, layer, gpu, slot]="
                        f"{_first(to_empty)}")
    if occupied.any():
        _check_runs(name, plan, mi, li, gi, ri, ex)
    if trace_loads is not None:
        trace_loads = np.asarray(trace_loads)
        if trace_loads.shape != loads.shape:
            raise PlanError(f"{name}: plan loads have shape {loads.shape}, the trace step {trace_loads.shape}")
        if plan.uniform_routing:
            a, b = loads.sum(axis=3, dtype=np.int64), trace_loads.sum(axis=3, dtype=np.int64)
            if (a != b).any():
                raise PlanError(f"{name}: uniform routing changed the token count at [micro_batch, layer, src]={_first(a != b)}")
        elif not _same_memory(loads, trace_loads) and (loads != trace_loads).any():
            raise PlanError(f"{name}: plan loads differ from the trace at [micro_batch, layer, src, expert]="
                            f"{_first(loads != trace_loads)}")


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """a and b are views of the same bytes (same address, strides and type), so equal without a look."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.strides == b.strides
            and a.shape == b.shape and a.dtype == b.dtype)


def _check_runs(name: str, plan: StepPlan, mi, li, gi, ri, ex) -> None:
    """Token conservation on the occupied slots (micro_batch, layer, gpu, slot, expert: int [n]): each
    replica's run lies inside its expert's tokens, and the runs of one expert do not overlap."""
    m, l, ep, e = plan.loads.shape
    start = plan.replica_start[mi, li, gi, ri].astype(np.int64)
    end = start + plan.replica_tokens[mi, li, gi, ri]
    routed = plan.loads.sum(axis=2, dtype=np.int64)[mi, li, ex]  # [n] the expert's tokens
    over = end > routed
    if over.any():
        i = int(np.argmax(over))
        raise PlanError(f"{name}: the replica at [micro_batch, layer, gpu, slot]=({mi[i]}, {li[i]}, {gi[i]}, "
                        f"{ri[i]}) takes tokens [{start[i]}, {end[i]}) of expert {ex[i]}, which was routed only "
                        f"{routed[i]}; tokens are not conserved")
    taking = end > start  # empty runs overlap nothing; among the others, sorted by start, an overlap
    key = ((mi * l + li) * e + ex)[taking]  # shows between neighbours
    start, end = start[taking], end[taking]
    order = np.lexsort((start, key))
    key, start, end = key[order], start[order], end[order]
    overlap = (key[1:] == key[:-1]) & (start[1:] < end[:-1])
    if overlap.any():
        i = int(np.argmax(overlap)) + 1
        k = int(key[i])
        raise PlanError(f"{name}: two replicas of expert {k % e} at [micro_batch, layer]=({k // e // l}, {(k // e) % l}) "
                        f"take the same tokens ([{start[i - 1]}, {end[i - 1]}) and [{start[i]}, {end[i]})); "
                        f"tokens are not conserved")


def empty_replicas(num_microbatches: int, num_layers: int, ep: int, slots: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(replica_expert filled with -1, replica_start and replica_tokens of zeros) for a plan with
    `slots` spare slots per GPU."""
    shape = (num_microbatches, num_layers, ep, slots)
    return np.full(shape, -1, dtype=np.int32), np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
