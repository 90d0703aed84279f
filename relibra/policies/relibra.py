"""`relibra` and its ablations: routing-replay-guided balancing from the step's exact loads.

Two mechanisms, matched to the bandwidth hierarchy:

1. Inter-batch reordering (once per step, across nodes): choose every expert's home GPU. Replication
   later moves load only inside a node, so what reordering must get right is the *node* balance of
   every micro-batch (not of the step total). The score of a layer's placement, in per-GPU compute
   tokens summed over the step's micro-batches m:

       J = sum_m mu[m] * (mean_n (W[m,n] / mu[m])^p)^(1/p) / gpn     node balance per micro-batch
         + w_gpu * sum_m sum_g G[m,g]^2 / T[m]                       GPU balance per micro-batch
         + w_mig * sum over moved experts of r_mig                   migration from prev_home

   W[m,n] = sum over experts homed in node n of (1 + r) x[m,e] - r s[m,e,n]: the node's compute
   plus r times the tokens it receives from other nodes (x: the expert's tokens, s: those coming
   from node n's ranks), r = comm_weight * r_comm, where r_comm converts one cross-node token
   (dispatch and combine, forward and backward, over RDMA) into compute tokens of that model.
   The first term is a p-norm smooth max over nodes (p = node_power, 8): smooth, between the mean
   and the max ("objective smoothing"), and it decomposes over nodes, so a swap of two experts
   changes it through two nodes' power sums: O(M) per candidate (incremental update). G, T: tokens
   per GPU and per layer; sum_g G^2 / T is the load-weighted mean GPU load, a light term since
   replication evens GPUs out inside a node. r_mig converts an expert's weights + optimizer state
   moved over RDMA (NVLink inside a node), spread over the ep GPUs, into compute tokens.
   Search: simulated annealing over swaps of two experts on different GPUs of the same layer. Each
   layer starts from the better-scoring of an LPT placement and prev_home (when given, with equal
   homes); every layer is independent, so all layers anneal together, each iteration scoring
   `candidates` random swaps per layer and taking the best by the Metropolis rule under a
   geometric cooling schedule. Layers whose result is worse than Megatron's (summed max GPU load
   after replication) fall back to static homes, so ReLibra is never worse per layer.

2. Intra-batch replication (per micro-batch and layer, inside each node): a greedy water-filling
   towards the node mean, with top-ups and one-hop chains through existing replicas (see
   replicate_in_node), and a minimum per move of min(`min_replica_tokens`, `min_replica_fraction` x
   the node's mean GPU tokens). Every (micro_batch, layer,
   node) runs in lock step, vectorized.

Ablations are parameterizations of the same class: `relibra-reorder` (no replication),
`relibra-replicate` (static homes), `relibra-lpt` (LPT placement, no annealing) and
`relibra-split` (replicas fixed for the whole step: per layer and GPU the ones that carry the most
tokens over the step's micro-batches; only the token split changes per micro-batch, by the LP of
lplb+).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relibra.cluster import Topology
from relibra.errors import ConfigError, PlanError
from relibra.plan import StepPlan
from relibra.policies.base import Policy, check_nonnegative_int, check_positive
from relibra.policies.lplb import lp_copy_tokens
from relibra.policies.reorder import AnnealConfig, anneal_homes, cost_ratios, equal_homes, lpt_homes
from relibra.policies.replicate import gpu_tokens_of, held_from_replicas, replicate_in_node
from relibra.policies.split import replica_flow_from_tokens
from relibra.trace import RoutingTrace, rank_load, static_placement

REORDERS = ("anneal", "lpt", "static")
REPLICATIONS = ("micro_batch", "step", "none")


@dataclass
class ReLibraPolicy(Policy):
    """ReLibra: reorder homes across nodes once per step, replicate inside nodes per micro-batch.

    reorder: "anneal" (simulated annealing), "lpt" (greedy LPT only) or "static" (Megatron's homes).
    replicate: "micro_batch" (greedy per micro-batch and layer), "step" (replicas fixed for the step:
        per layer and GPU the ones carrying the most tokens over the step under the per-micro-batch
        greedy; tokens split per micro-batch by an LP) or "none".
    spare_slots_per_gpu: replica slots per GPU per layer (the layer-shared buffer), default 2.
    min_replica_tokens, min_replica_fraction: a move onto a replica must carry at least
        min(min_replica_tokens, min_replica_fraction x the node's mean GPU tokens) tokens
        (defaults 128 and 0.01: 128 at the paper scale, a few tokens for the tiny test models).
    seed: annealing seed (the step index is mixed in, so every step draws differently).
    iterations, polish_iterations, candidates, initial_temperature, final_temperature, node_power, gpu_weight,
    comm_weight, migration_weight: see AnnealConfig.
    """

    name: ClassVar[str] = "relibra"
    reorder: str = "anneal"
    replicate: str = "micro_batch"
    spare_slots_per_gpu: int = 2
    min_replica_tokens: int = 128
    min_replica_fraction: float = 0.01
    seed: int = 0
    iterations: int = 1000
    polish_iterations: int = 300
    candidates: int = 8
    initial_temperature: float = 1e-4
    final_temperature: float = 1e-7
    node_power: int = 8
    gpu_weight: float = 0.1
    comm_weight: float = 0.1
    migration_weight: float = 1.0

    def __post_init__(self):
        if self.reorder not in REORDERS:
            raise ConfigError(f"policy {self.name!r}: reorder must be one of {REORDERS}, got {self.reorder!r}")
        if self.replicate not in REPLICATIONS:
            raise ConfigError(f"policy {self.name!r}: replicate must be one of {REPLICATIONS}, "
                              f"got {self.replicate!r}")
        check_nonnegative_int(self.name, spare_slots_per_gpu=self.spare_slots_per_gpu,
                              min_replica_tokens=self.min_replica_tokens, seed=self.seed,
                              iterations=self.iterations, polish_iterations=self.polish_iterations,
                              node_power=self.node_power)
        if self.node_power < 1:
            raise ConfigError(f"policy {self.name!r}: node_power must be a positive integer, got {self.node_power}")
        check_positive(self.name, candidates=self.candidates, min_replica_fraction=self.min_replica_fraction,
                       initial_temperature=self.initial_temperature, final_temperature=self.final_temperature)
        for key in ("gpu_weight", "comm_weight", "migration_weight"):
            if getattr(self, key) < 0:
                raise ConfigError(f"policy {self.name!r}: {key} must be >= 0, got {getattr(self, key)}")
        if self.replicate != "none" and self.spare_slots_per_gpu == 0:
            raise ConfigError(f"policy {self.name!r}: replication needs spare slots, but spare_slots_per_gpu=0; "
                              f"use replicate='none' (relibra-reorder) for no replicas")

    def anneal_config(self) -> AnnealConfig:
        return AnnealConfig(iterations=self.iterations, polish_iterations=self.polish_iterations,
                            candidates=self.candidates,
                            initial_temperature=self.initial_temperature, final_temperature=self.final_temperature,
                            node_power=self.node_power, gpu_weight=self.gpu_weight, comm_weight=self.comm_weight,
                            migration_weight=self.migration_weight)

    def place(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
              prev_home: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
        """The step's homes int64 [L, E] and planner figures; `topology`'s link and matmul rates
        convert communication and migration into compute tokens for the score."""
        loads = trace.loads[step]
        m, l, ep, e = loads.shape
        if self.reorder == "static":
            return static_placement(l, e, ep), {}
        expert_tokens = loads.sum(axis=2, dtype=np.int64)  # [M, L, E]
        home = lpt_homes(expert_tokens.sum(axis=0).astype(np.float64), ep)
        if self.reorder == "lpt":
            return home, {}
        nodes = ep // gpus_per_node
        src_node = loads.reshape(m, l, nodes, gpus_per_node, e).sum(axis=3, dtype=np.int64).transpose(0, 1, 3, 2)
        comm, mig = cost_ratios(trace.model, topology, ep)
        if prev_home is not None:
            prev_home = np.asarray(prev_home, dtype=np.int64)
            if ((prev_home < 0) | (prev_home >= ep)).any():
                raise PlanError(f"{self.name}: prev_home names GPUs outside [0, {ep})")
        rng = np.random.default_rng([self.seed, step])
        config = self.anneal_config()
        starts = home if prev_home is None or not equal_homes(prev_home, ep) else np.stack([home, prev_home])
        return anneal_homes(expert_tokens, src_node, starts, ep, gpus_per_node, config, rng,
                            comm_ratio=comm * config.comm_weight, migration_cost=mig, prev_home=prev_home)

    def _replicas(self, loads: np.ndarray, expert_tokens: np.ndarray, home: np.ndarray, gpus_per_node: int
                  ) -> tuple[np.ndarray, np.ndarray]:
        """(replica_expert, replica_tokens) [M, L, ep, R] for these homes, by the policy's replication mode."""
        m, l, ep, e = loads.shape
        r = self.spare_slots_per_gpu if self.replicate != "none" else 0
        if self.replicate == "micro_batch":
            return replicate_in_node(expert_tokens, home, ep, gpus_per_node, r, self.min_replica_tokens,
                                     self.min_replica_fraction)
        if self.replicate == "step":
            # replicas fixed for the step: per (layer, GPU) the R replicas that carry the most tokens
            # over the step when the greedy runs per micro-batch; then only the split changes per micro-batch
            mb_rexp, mb_rtok = replicate_in_node(expert_tokens, home, ep, gpus_per_node, r,
                                                 self.min_replica_tokens, self.min_replica_fraction)
            carried = np.zeros((l, ep, e), dtype=np.int64)
            mi, li, gi, ri = np.nonzero(mb_rexp >= 0)
            np.add.at(carried, (li, gi, mb_rexp[mi, li, gi, ri]), mb_rtok[mi, li, gi, ri])
            top = np.argsort(-carried, axis=2, kind="stable")[:, :, :r]  # [L, ep, R]
            step_rexp = np.where(np.take_along_axis(carried, top, axis=2) > 0, top, -1).astype(np.int32)
            held = held_from_replicas(step_rexp, home, ep)
            li, gi, ri = np.nonzero(step_rexp >= 0)
            ei = step_rexp[li, gi, ri].astype(np.int64)
            rexp = np.broadcast_to(step_rexp[None], (m, l, ep, r)).copy()
            rtok = np.zeros((m, l, ep, r), dtype=np.int64)
            rtok[:, li, gi, ri] = lp_copy_tokens(expert_tokens, held, home, li, ei, gi)  # [M, n]
            return rexp, rtok
        return np.full((m, l, ep, 0), -1, dtype=np.int32), np.zeros((m, l, ep, 0), dtype=np.int64)

    def _plan(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
              prev_home: np.ndarray | None) -> StepPlan:
        loads = trace.loads[step]
        m, l, ep, e = loads.shape
        clock = _Clock()
        home, info = self.place(trace, step, topology, gpus_per_node, prev_home)
        reorder = clock.lap()
        expert_tokens = loads.sum(axis=2, dtype=np.int64)
        rexp, rtok = self._replicas(loads, expert_tokens, home, gpus_per_node)
        replicate = clock.lap()
        # Guarantee: per layer, the summed max GPU load never exceeds Megatron's. Replication never raises a
        # node's max, so a layer whose new homes lose (possible: homes are fixed for the whole step while
        # the search only sees a smoothed score) falls back to static homes.
        static = static_placement(l, e, ep)
        worse = np.zeros(l, dtype=bool)
        if self.reorder != "static":
            mine = gpu_tokens_of(expert_tokens, home, rexp, rtok).max(axis=2).sum(axis=0)
            megatron = rank_load(expert_tokens, static, ep).max(axis=2).sum(axis=0)
            worse = mine > megatron
            if worse.any():
                home = np.where(worse[:, None], static, home)
                fb_rexp, fb_rtok = self._replicas(loads[:, worse], expert_tokens[:, worse], home[worse], gpus_per_node)
                rexp[:, worse], rtok[:, worse] = fb_rexp, fb_rtok
        fallback = clock.lap()
        rflow = replica_flow_from_tokens(loads, home, rexp, rtok)
        flow = clock.lap()
        r = rexp.shape[3]
        plan = StepPlan(policy=self.name, loads=loads, home=home, replica_expert=rexp.astype(np.int32),
                        replica_flow=rflow, gpus_per_node=gpus_per_node, slots_per_gpu=e // ep + r,
                        replica_scope="node" if r else "none")
        info.update({"reorder_seconds": reorder[0], "reorder_cpu_seconds": reorder[1],
                     "replication_seconds": replicate[0], "replication_cpu_seconds": replicate[1],
                     "replication_us_per_microbatch_layer": replicate[0] / (m * l) * 1e6,
                     "replication_cpu_us_per_microbatch_layer": replicate[1] / (m * l) * 1e6,
                     "fallback_seconds": fallback[0], "flow_seconds": flow[0], "flow_cpu_seconds": flow[1],
                     "fallback_layers": int(worse.sum())})
        plan.info.update(info)
        return plan


class _Clock:
    """Wall and process-CPU seconds between laps (CPU time is what one core spends, whatever the load)."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        out = (wall - self.wall, cpu - self.cpu)
        self.wall, self.cpu = wall, cpu
        return out


def _variant(name: str, **fixed):
    """A registry factory for an ablation: a ReLibraPolicy subclass named `name` with some
    parameters fixed."""
    cls = type(f"ReLibraPolicy[{name}]", (ReLibraPolicy,), {"name": name, "__doc__": ReLibraPolicy.__doc__})

    def factory(**params):
        clash = set(params) & set(fixed)
        if clash:
            raise ConfigError(f"policy {name!r} fixes {sorted(clash)}; use 'relibra' to change them")
        return cls(**fixed, **params)

    factory.policy_class = ReLibraPolicy
    return factory


VARIANTS = {
    "relibra": {},
    "relibra-reorder": {"replicate": "none"},
    "relibra-replicate": {"reorder": "static"},
    "relibra-lpt": {"reorder": "lpt"},
    "relibra-split": {"replicate": "step"},
}
