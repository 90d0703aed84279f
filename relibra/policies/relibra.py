"""`relibra` and its ablations: routing-replay-guided balancing from the step's exact loads.

Two mechanisms, matched to the bandwidth hierarchy:

1. Inter-batch reordering (once per step, across nodes): choose every expert's home GPU. Replication
   later moves load only inside a node, so what reordering must get right is the *node* balance of
   every micro-batch (not of the step total). The score of a layer's placement
   (relibra.policies.objective.layer_scores, where it is written out) sums, over the step's
   micro-batches, two smooth maxima over nodes (of the compute each node hosts, and of the tokens it
   receives from other nodes, weighted by comm_weight x r_comm compute tokens per cross-node token),
   a light GPU-balance term (gpu_weight) and the migration cost from prev_home (migration_weight x
   r_mig, cost_ratios). The smooth maximum decomposes over nodes, so a swap of two experts changes
   it through two nodes' power sums: O(M) per candidate (incremental update, anneal_homes).
   Search: simulated annealing over swaps of two experts on different GPUs of the same layer. Each
   layer starts from the better-scoring of an LPT placement and prev_home (when given, with equal
   homes); every layer is independent, so all layers anneal together, each iteration scoring
   `candidates` random swaps per layer and taking the best by the Metropolis rule under a
   geometric cooling schedule. A layer whose summed max GPU load over the step is above what the
   same replication reaches on static homes (relibra-replicate) falls back to static homes, so per
   layer ReLibra is never worse than relibra-replicate, hence never worse than Megatron; how many
   layers fell back is plan.info.fallback_layers (0 on the paper presets, tested).

2. Intra-batch replication (per micro-batch and layer, inside each node): a greedy water-filling
   towards the node mean, with top-ups and one-hop chains through existing replicas (see
   replicate_in_node), and a minimum per move of min(`min_replica_tokens`, `min_replica_fraction` x
   the node's mean GPU tokens). Every (micro_batch, layer,
   node) runs in lock step, vectorized.

Ablations are subclasses that each pin one parameter: `relibra-reorder` (no replication),
`relibra-replicate` (static homes), `relibra-lpt` (LPT placement, no annealing) and
`relibra-split` (replicas fixed for the whole step: per layer and GPU the ones that carry the most
tokens over the step's micro-batches; only the token split changes per micro-batch, by the LP of
eplb+lp).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import ClassVar, Literal, get_args

import numpy as np

from relibra.cluster import Topology
from relibra.errors import ConfigError, PlanError
from relibra.flow import gpu_tokens_from
from relibra.plan import PlanInfo, StepPlan
from relibra.policies.base import Policy, check_nonnegative_int, register
from relibra.policies.eplb_lp import lp_copy_tokens
from relibra.policies.reorder import AnnealConfig, AnnealStats, anneal_homes, cost_ratios, equal_homes, lpt_homes
from relibra.policies.replicate import ReplicationConfig, held_from_replicas, replicate_in_node
from relibra.policies.split import replica_runs
from relibra.trace import RoutingTrace, rank_load, static_placement

Reorder = Literal["anneal", "lpt", "static"]
Replicate = Literal["micro_batch", "step", "none"]
REORDERS: tuple[str, ...] = get_args(Reorder)
REPLICATIONS: tuple[str, ...] = get_args(Replicate)


@dataclass(frozen=True)
class ReLibraInfo(PlanInfo):
    """ReLibra's clocks per stage (wall seconds and process-CPU seconds, over the whole step) and what
    its stages did (ReLibraPolicy._plan).

    reorder_*: placing the homes (relibra_homes); replication_*: replication inside the nodes plus any
    stage beyond them; fallback_*: the per-layer check against static homes (no_worse_than_static);
    flow_*: the replicas' runs of tokens (replica_runs). fallback_layers: layers that took static
    homes. anneal: the search's AnnealStats (None unless reorder="anneal"). cross_node_seconds,
    cross_node_replicas: relibra-h's cross-node stage (0 for the others).
    """

    reorder_seconds: float = 0.0
    reorder_cpu_seconds: float = 0.0
    replication_seconds: float = 0.0
    replication_cpu_seconds: float = 0.0
    fallback_seconds: float = 0.0
    fallback_cpu_seconds: float = 0.0
    flow_seconds: float = 0.0
    flow_cpu_seconds: float = 0.0
    fallback_layers: int = 0
    anneal: AnnealStats | None = None
    cross_node_seconds: float = 0.0
    cross_node_replicas: int = 0

    @property
    def balancing_seconds(self) -> tuple[float, float]:
        return self.replication_seconds, self.replication_cpu_seconds


# ---- the algorithm, top to bottom ------------------------------------------------------------------
def relibra_homes(loads: np.ndarray, shape, topology: Topology, gpus_per_node: int, reorder: Reorder,
                  config: AnnealConfig, rng: np.random.Generator, prev_home: np.ndarray | None = None,
                  expert_tokens: np.ndarray | None = None) -> tuple[np.ndarray, AnnealStats | None]:
    """(1) Inter-batch reordering: every expert's home for the step.

    loads: int [M, L, ep, E] the step's routed tokens (src rank, expert); shape: the ModelShape and
    topology whose rates convert communication and migration into compute tokens (cost_ratios);
    reorder: "static" (Megatron's homes), "lpt" (LPT on step totals) or "anneal" (LPT or prev_home
    as the start, then anneal_homes). prev_home: int [L, E] or None; expert_tokens: int [M, L, E]
    loads summed over sources, when the caller has it. Returns (home int64 [L, E], the search's
    AnnealStats, None for "static" and "lpt").
    """
    m, l, ep, e = loads.shape
    if reorder == "static":
        return static_placement(l, e, ep), None
    if expert_tokens is None:
        expert_tokens = loads.sum(axis=2, dtype=np.int64)  # [M, L, E]
    home = lpt_homes(expert_tokens.sum(axis=0).astype(np.float64), ep)
    if reorder == "lpt":
        return home, None
    nodes = ep // gpus_per_node
    # tokens per (micro-batch, layer) fit int32 with room to spare
    src_node = loads.reshape(m, l, nodes, gpus_per_node, e).sum(axis=3, dtype=np.int32).transpose(0, 1, 3, 2)
    comm, mig = cost_ratios(shape, topology, ep)
    starts = home if prev_home is None or not equal_homes(prev_home, ep) else np.stack([home, prev_home])
    return anneal_homes(expert_tokens, src_node, starts, ep, gpus_per_node, config, rng,
                        comm_ratio=comm * config.comm_weight, migration_cost=mig, prev_home=prev_home)


def relibra_replicas(expert_tokens: np.ndarray, home: np.ndarray, ep: int, gpus_per_node: int, mode: Replicate,
                     config: ReplicationConfig) -> tuple[np.ndarray, np.ndarray]:
    """(2) Intra-batch replication inside each node.

    expert_tokens: int [M, L, E]; home: int [L, E]; mode: "micro_batch" (replicate_in_node per
    micro-batch and layer), "step" (per (layer, GPU) the spare_slots replicas that carry the most
    tokens over the step under the per-micro-batch greedy, fixed for the step; tokens split per
    micro-batch by eplb+lp's LP) or "none"; config: the spare slots and the smallest move. Returns
    (replica_expert int32, replica_tokens int64), both [M, L, ep, R] with R = config.spare_slots_per_gpu
    (0 for "none").
    """
    m, l, e = expert_tokens.shape
    r = config.spare_slots_per_gpu if mode != "none" else 0
    if mode == "none":
        return np.full((m, l, ep, 0), -1, dtype=np.int32), np.zeros((m, l, ep, 0), dtype=np.int64)
    rexp, rtok = replicate_in_node(expert_tokens, home, ep, gpus_per_node, r, config.min_replica_tokens,
                                   config.min_replica_fraction)
    if mode == "micro_batch":
        return rexp, rtok
    carried = np.zeros((l, ep, e), dtype=np.int64)
    mi, li, gi, ri = np.nonzero(rexp >= 0)
    np.add.at(carried, (li, gi, rexp[mi, li, gi, ri]), rtok[mi, li, gi, ri])
    top = np.argsort(-carried, axis=2, kind="stable")[:, :, :r]  # [L, ep, R]
    step_rexp = np.where(np.take_along_axis(carried, top, axis=2) > 0, top, -1).astype(np.int32)
    held = held_from_replicas(step_rexp, home, ep)
    li, gi, ri = np.nonzero(step_rexp >= 0)
    ei = step_rexp[li, gi, ri].astype(np.int64)
    rexp = np.broadcast_to(step_rexp[None], (m, l, ep, r)).copy()
    rtok = np.zeros((m, l, ep, r), dtype=np.int64)
    rtok[:, li, gi, ri] = lp_copy_tokens(expert_tokens, held, home, li, ei, gi)  # [M, n]
    return rexp, rtok


def no_worse_than_static(expert_tokens: np.ndarray, home: np.ndarray, rexp: np.ndarray, rtok: np.ndarray,
                         gpus_per_node: int, no_replicas: bool, replicas_for) -> tuple[np.ndarray, ...]:
    """(3) Per layer, keep the step's summed max GPU load at or below what the same replication gives on
    static homes (relibra-replicate; without replicas: Megatron).

    Homes are fixed for the step while the search sees a smoothed score, so a layer can lose; it then
    takes static homes and their replicas. Replication inside a node never brings a node's busiest
    GPU below its node mean, so only layers above that bound for static homes need the static
    replication computed. expert_tokens: int [M, L, E]; home: int [L, E]; rexp, rtok: [M, L, ep, R];
    replicas_for(expert_tokens [M, L', E], home [L', E]) -> (rexp, rtok) for a subset of layers.
    Returns (home, rexp, rtok, fell_back bool [L]).
    """
    m, l, e = expert_tokens.shape
    ep = rexp.shape[2]
    worse = np.zeros(l, dtype=bool)
    static = static_placement(l, e, ep)
    mine = gpu_tokens_from(expert_tokens, home, rexp, rtok).max(axis=2).sum(axis=0)  # [L]
    static_gpu = rank_load(expert_tokens, static, ep)  # [M, L, ep] before replication
    if no_replicas:
        bound = static_gpu.max(axis=2).sum(axis=0)
    else:
        node = static_gpu.reshape(m, l, ep // gpus_per_node, gpus_per_node).sum(axis=3)
        bound = (-(-node // gpus_per_node)).max(axis=2).sum(axis=0)
    doubt = np.nonzero(mine > bound)[0]
    if len(doubt):
        s_rexp, s_rtok = replicas_for(expert_tokens[:, doubt], static[doubt])
        theirs = gpu_tokens_from(expert_tokens[:, doubt], static[doubt], s_rexp, s_rtok).max(axis=2).sum(axis=0)
        lose = mine[doubt] > theirs
        if lose.any():
            worse[doubt[lose]] = True
            home = np.where(worse[:, None], static, home)
            rexp[:, doubt[lose]], rtok[:, doubt[lose]] = s_rexp[:, lose], s_rtok[:, lose]
    return home, rexp, rtok, worse


@register
@dataclass
class ReLibraPolicy(Policy):
    """ReLibra: reorder homes across nodes once per step, replicate inside nodes per micro-batch.

    reorder: "anneal" (simulated annealing), "lpt" (greedy LPT only) or "static" (Megatron's homes).
    replicate: "micro_batch" (greedy per micro-batch and layer), "step" (replicas fixed for the step:
        per layer and GPU the ones carrying the most tokens over the step under the per-micro-batch
        greedy; tokens split per micro-batch by an LP) or "none".
    seed: annealing seed (the step index is mixed in, so every step draws differently).
    anneal: the search's knobs (AnnealConfig); replication: the spare slots and the smallest move
        (ReplicationConfig). get_policy also takes their fields by name
        (get_policy("relibra", iterations=60, spare_slots_per_gpu=1)).
    """

    name: ClassVar[str] = "relibra"
    reorder: Reorder = "anneal"
    replicate: Replicate = "micro_batch"
    seed: int = 0
    anneal: AnnealConfig = field(default_factory=AnnealConfig)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)

    def __post_init__(self):
        for f in fields(self):
            if f.metadata.get("pinned") and getattr(self, f.name) != f.default:
                raise ConfigError(f"policy {self.name!r} fixes {f.name}={f.default!r}; use 'relibra' to change it")
        if self.reorder not in REORDERS:
            raise ConfigError(f"policy {self.name!r}: reorder must be one of {REORDERS}, got {self.reorder!r}")
        if self.replicate not in REPLICATIONS:
            raise ConfigError(f"policy {self.name!r}: replicate must be one of {REPLICATIONS}, "
                              f"got {self.replicate!r}")
        check_nonnegative_int(self.name, seed=self.seed)
        for key, kind in (("anneal", AnnealConfig), ("replication", ReplicationConfig)):
            if not isinstance(getattr(self, key), kind):
                raise ConfigError(f"policy {self.name!r}: {key} must be an instance of {kind.__name__}, "
                                  f"got {type(getattr(self, key)).__name__}")
        if self.replicate != "none" and self.replication.spare_slots_per_gpu == 0:
            raise ConfigError(f"policy {self.name!r}: replication needs spare slots, but spare_slots_per_gpu=0; "
                              f"use replicate='none' (relibra-reorder) for no replicas")

    def place(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
              prev_home: np.ndarray | None = None, expert_tokens: np.ndarray | None = None
              ) -> tuple[np.ndarray, AnnealStats | None]:
        """The step's homes int64 [L, E] and the search's figures (see relibra_homes; expert_tokens: the
        step's loads summed over sources, int [M, L, E], when the caller has them)."""
        if prev_home is not None:
            prev_home = np.asarray(prev_home, dtype=np.int64)
            if ((prev_home < 0) | (prev_home >= trace.ep)).any():
                raise PlanError(f"{self.name}: prev_home names GPUs outside [0, {trace.ep})")
        return relibra_homes(trace.loads[step], trace.model, topology, gpus_per_node, self.reorder,
                             self.anneal, np.random.default_rng([self.seed, step]), prev_home,
                             expert_tokens)

    def _replicas(self, loads: np.ndarray, expert_tokens: np.ndarray, home: np.ndarray, gpus_per_node: int
                  ) -> tuple[np.ndarray, np.ndarray]:
        """(replica_expert, replica_tokens) [M, L, ep, R] for these homes (see relibra_replicas)."""
        return relibra_replicas(expert_tokens, home, loads.shape[2], gpus_per_node, self.replicate, self.replication)

    def _no_worse_than_static(self, loads: np.ndarray, expert_tokens: np.ndarray, home: np.ndarray,
                              rexp: np.ndarray, rtok: np.ndarray, gpus_per_node: int) -> tuple[np.ndarray, ...]:
        """(home, replica_expert, replica_tokens, fell_back bool [L]); see no_worse_than_static."""
        if self.reorder == "static":
            return home, rexp, rtok, np.zeros(home.shape[0], dtype=bool)
        return no_worse_than_static(expert_tokens, home, rexp, rtok, gpus_per_node, self.replicate == "none",
                                    lambda x, h: self._replicas(loads, x, h, gpus_per_node))

    def _plan(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
              prev_home: np.ndarray | None) -> StepPlan:
        """The stages in order: reorder (place), replicate inside nodes, fall back per layer to static
        homes where those do better, then any replicas beyond the node (none here; relibra-h adds
        cross-node ones), then the replicas' runs of tokens."""
        loads = trace.loads[step]
        m, l, ep, e = loads.shape
        clock = _Clock()
        expert_tokens = loads.sum(axis=2, dtype=np.int64)  # [M, L, E], once for every stage
        home, anneal = self.place(trace, step, topology, gpus_per_node, prev_home, expert_tokens)
        reorder = clock.lap()
        rexp, rtok = self._replicas(loads, expert_tokens, home, gpus_per_node)
        replicate = clock.lap()
        home, rexp, rtok, worse = self._no_worse_than_static(loads, expert_tokens, home, rexp, rtok, gpus_per_node)
        fallback = clock.lap()
        rexp, rtok, cross_replicas, cross_s = self._beyond_node(trace, step, topology, gpus_per_node, expert_tokens,
                                                                home, rexp, rtok)
        beyond = clock.lap()
        rstart = replica_runs(home, rexp, rtok, expert_tokens)
        flow = clock.lap()
        r = rexp.shape[3]
        scope = "any" if cross_replicas else ("node" if r else "none")
        info = ReLibraInfo(reorder_seconds=reorder[0], reorder_cpu_seconds=reorder[1],
                           replication_seconds=replicate[0] + beyond[0],
                           replication_cpu_seconds=replicate[1] + beyond[1],
                           fallback_seconds=fallback[0], fallback_cpu_seconds=fallback[1],
                           flow_seconds=flow[0], flow_cpu_seconds=flow[1], fallback_layers=int(worse.sum()),
                           anneal=anneal, cross_node_seconds=cross_s, cross_node_replicas=cross_replicas)
        return StepPlan(policy=self.name, loads=loads, home=home, replica_expert=rexp.astype(np.int32),
                        replica_start=rstart, replica_tokens=rtok, gpus_per_node=gpus_per_node,
                        slots_per_gpu=e // ep + r, replica_scope=scope, info=info)

    def _beyond_node(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
                     expert_tokens: np.ndarray, home: np.ndarray, rexp: np.ndarray, rtok: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, int, float]:
        """Replicas outside the expert's node, after the in-node ones: none for ReLibra (a subclass's
        stage). Returns (replica_expert, replica_tokens [M, L, ep, R'], cross-node replicas added,
        the stage's wall seconds)."""
        return rexp, rtok, 0, 0.0


class _Clock:
    """Wall and process-CPU seconds between laps (CPU time is what one core spends, whatever the load)."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        out = (wall - self.wall, cpu - self.cpu)
        self.wall, self.cpu = wall, cpu
        return out


# ---- the ablations: ReLibra with one stage pinned ------------------------------------------------------
def _pinned(value: str):
    """A parameter an ablation pins to `value`: its default, and the only value its __post_init__ accepts."""
    return field(default=value, metadata={"pinned": True})


@register
@dataclass
class ReLibraReorderPolicy(ReLibraPolicy):
    """relibra-reorder: the reordering alone, no replicas."""

    name: ClassVar[str] = "relibra-reorder"
    replicate: str = _pinned("none")


@register
@dataclass
class ReLibraReplicatePolicy(ReLibraPolicy):
    """relibra-replicate: in-node replication on Megatron's static homes."""

    name: ClassVar[str] = "relibra-replicate"
    reorder: str = _pinned("static")


@register
@dataclass
class ReLibraLptPolicy(ReLibraPolicy):
    """relibra-lpt: LPT homes on the step totals (no annealing), then in-node replication."""

    name: ClassVar[str] = "relibra-lpt"
    reorder: str = _pinned("lpt")


@register
@dataclass
class ReLibraSplitPolicy(ReLibraPolicy):
    """relibra-split: replicas fixed for the whole step; only their token split changes per micro-batch."""

    name: ClassVar[str] = "relibra-split"
    replicate: str = _pinned("step")
