"""`relibra-h`: hierarchical ReLibra, beyond the paper. ReLibra's plan, then cross-node replicas where
in-node spare slots cannot absorb a micro-batch's imbalance.

At EP 128-256 on 8-GPU nodes a node holds 8 of 128-256 GPUs: reordering fixes homes for the whole
step, so a micro-batch whose hot experts crowd into one node leaves that node above the global mean
however its 8 GPUs share the load (ReLibra's replication stays inside the node). relibra-h keeps the
paper's `relibra` unchanged (same reordering, same in-node replication, same fall-back to static homes
per layer) and adds a second, cross-node pass per (micro-batch, layer):

  while the most loaded GPU d is above the global mean T (ceil of mean tokens per GPU):
      e  = d's copy (a home expert or an in-node replica) computing the most tokens
      g  = the least loaded GPU outside d's and e's home's nodes that has a free replica slot and
           holds no copy of e
      x  = min(G[d] - T, T - G[g], tokens of that copy); the new replica on g takes x of them
      take the move if x >= the minimum move size and the weight push pays:
        - hidden: e's weights cross RDMA (sender egress of d, receiver ingress of g) within that
          GPU's overlap window this micro-batch (sender: e's home), the slowest rank's dense time (attention + router
          + shared experts) minus the GPU's own non-attention dense time; or
        - pays for itself: the push's exposed seconds (the forward push beyond the window, the
          backward push and the gradient pull beyond the backward window, twice as long: backward
          dense compute costs twice the forward's) are below the expert seconds the move takes off
          the critical GPU (x tokens x 18 hidden moe_ffn FLOPs / matmul rate).

Rates and FLOPs come from ModelShape (expert_bytes, expert_train_flops_per_token, attention and
dense FLOPs per token, attention_core_flops over the trace's seq_lens) and Topology (rdma_GBps,
matmul_tflops, attention_efficiency); the policy does not call the cost model. Without seq_lens in
the trace each slot counts as one sequence. Cross-node replicas use the in-node pass's empty slots
plus `cross_slots_per_gpu` more per GPU (the replica buffer grows by that many experts); the plan's
replica_scope is "any". Tokens reach a cross-node replica from the sources split.py assigns (a run of
the expert's tokens by source rank); the dispatch bytes hardly change at these node counts, since a
token of a remote expert crosses RDMA wherever that expert's copy sits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relibra.cluster import Topology
from relibra.errors import ConfigError
from relibra.flow import gpu_tokens_from
from relibra.policies.base import check_nonnegative_int, experts_by_gpu, register
from relibra.policies.relibra import ReLibraPolicy, _Clock
from relibra.trace import RoutingTrace

TFLOP = 1e12
GB = 1e9


def overlap_window_s(trace: RoutingTrace, step: int, topology: Topology) -> np.ndarray:
    """Seconds each GPU may spend moving replica weights in one (micro-batch, layer) without delaying
    it: the slowest rank's forward dense time minus this GPU's non-attention dense time.

    Forward dense time of rank g: attention projections and core (over the slot's sequences,
    seq_lens, at matmul_tflops x attention_efficiency) plus router and shared experts, at
    matmul_tflops. Returns float64 [micro_batches, ep].
    """
    model = trace.model
    loads = trace.loads[step]
    src_tokens = loads[:, 0].sum(axis=2, dtype=np.int64) / model.top_k  # [M, ep]
    rate = topology.matmul_tflops * TFLOP
    if trace.seq_lens is not None:
        core = model.attention_core_flops(trace.seq_lens[step])  # [M, ep]
    else:
        core = model.attention_core_flops(src_tokens[..., None])
    attn = src_tokens * model.attention_projection_flops_per_token / rate + core / (rate * topology.attention_efficiency)
    other = src_tokens * model.moe_layer_dense_flops_per_token / rate
    dense = (attn + other).max(axis=1, keepdims=True)  # [M, 1]
    return dense - other


def cross_node_replicate(expert_tokens: np.ndarray, home: np.ndarray, rexp: np.ndarray, rtok: np.ndarray,
                         gpus_per_node: int, window_s: np.ndarray, push_s: float, token_s: float,
                         min_tokens: np.ndarray, max_rounds: int, shortlist: int = 32
                         ) -> tuple[np.ndarray, np.ndarray, int]:
    """The cross-node greedy of relibra-h, every (micro_batch, layer) in lock step (module docstring).

    expert_tokens: int [M, L, E]; home: int [L, E]; rexp, rtok: int [M, L, ep, R] the in-node replicas
    with free slots (-1) where cross-node replicas may go (filled in place); window_s: float [M, ep]
    overlap window per GPU; push_s: seconds of one expert's weights over RDMA; token_s: expert
    seconds (forward + backward) of one token; min_tokens: int [M, L] smallest move per cell;
    shortlist: receivers are sought among that many least loaded GPUs with a free slot.
    Returns (rexp, rtok, cross-node replicas added).
    """
    m, l, e = expert_tokens.shape
    ep, r = rexp.shape[2], rexp.shape[3]
    gpu = gpu_tokens_from(expert_tokens, home, rexp, rtok).reshape(m * l, ep).astype(np.int64)
    total = gpu.sum(axis=1)
    target = -(-total // ep)
    active = np.nonzero(gpu.max(axis=1) > target)[0]
    if len(active) == 0 or r == 0:
        return rexp, rtok, 0
    hosted = experts_by_gpu(home, ep)  # [L, ep, k]
    k = hosted.shape[2]
    mi_all, li_all = np.divmod(np.arange(m * l), l)
    # tokens each home copy still computes
    left = expert_tokens.reshape(m * l, e).astype(np.int64).copy()
    occ = rexp >= 0
    if occ.any():
        a, b, _, _ = np.nonzero(occ)
        np.subtract.at(left, (a * l + b, rexp[occ].astype(np.int64)), rtok[occ])
    rexp2 = rexp.reshape(m * l, ep, r)
    rtok2 = rtok.reshape(m * l, ep, r)
    nrep_free = (rexp2 < 0)
    free_all = nrep_free.any(axis=2)  # [cells, ep] GPUs with a free slot (kept up to date)
    used_s = np.zeros(m * l * ep)  # RDMA seconds each GPU has sent or received this cell (flat [cells, ep])
    window_f = np.ascontiguousarray(window_s, dtype=np.float64).reshape(-1)  # flat [M, ep]
    min_tok = min_tokens.reshape(-1)
    node = np.arange(ep) // gpus_per_node
    big = np.iinfo(np.int64).max
    added = 0
    for _ in range(max_rounds):
        if len(active) == 0:
            break
        n = len(active)
        rows = np.arange(n)
        g_load = gpu[active]
        d = np.argmax(g_load, axis=1)
        excess = g_load[rows, d] - target[active]
        lay = li_all[active]
        # the donor's copies: its home experts (tokens left at home) and its replicas (their tokens)
        mine = np.concatenate([hosted[lay, d], rexp2[active, d].astype(np.int64)], axis=1)  # [n, C]
        mine_tok = np.concatenate([left[active[:, None], hosted[lay, d]], rtok2[active, d]], axis=1)
        mine_tok *= mine >= 0
        src = home[lay[:, None], np.maximum(mine, 0)]  # [n, C] the GPU that pushes the weights: the home
        # receivers: the `shortlist` least loaded GPUs with a free slot (the least loaded feasible one
        # is almost always among them; looking at all ep GPUs costs ep / shortlist times more).
        # Masks enter as 0/1 factors (a masked np.where is several times slower here).
        free = free_all[active]  # [n, ep]
        q = min(ep, shortlist)
        keyed = g_load + ~free * (big - g_load)  # the load, or the largest int64 without a free slot
        low = np.argpartition(keyed, q - 1, axis=1)[:, :q] if q < ep else np.broadcast_to(np.arange(ep), (n, ep))
        low_free = np.take_along_axis(free, low, axis=1)  # [n, q]
        held = rexp2.reshape(m * l * ep, r).take(active[:, None] * ep + low, axis=0)  # [n, q, R] receivers' replicas
        holds = held[:, None, :, 0] == mine[:, :, None]  # [n, C, q]: the receiver holds that copy's expert
        for slot in range(1, r):
            holds |= held[:, None, :, slot] == mine[:, :, None]
        node_low = node[low]
        cand = (low_free[:, None] & ~holds & (node_low[:, None, :] != node[d][:, None, None])
                & (node_low[:, None, :] != node[src][:, :, None]))
        low_load = np.take_along_axis(g_load, low, axis=1)[:, None, :]
        pick = np.argmin(low_load + ~cand * (big - low_load), axis=2)  # [n, C] the least loaded candidate
        g_all = np.take_along_axis(low, pick, axis=1)
        has = np.take_along_axis(cand, pick[:, :, None], axis=2)[:, :, 0]
        room = target[active][:, None] - np.take_along_axis(g_load, g_all, axis=1)
        amount = np.minimum(np.minimum(excess[:, None], room), mine_tok)  # [n, C]
        at_src, at_g = active[:, None] * ep + src, active[:, None] * ep + g_all  # flat [cells, ep]
        mb_row = mi_all[active][:, None] * ep

        def over(u, w):  # seconds beyond the window one more push adds
            return np.maximum(u + push_s - w, 0.0) - np.maximum(u - w, 0.0)

        def exposed_s(u, w):  # forward push beyond the window; backward push and gradient pull beyond twice it
            return over(u, w) + 2.0 * over(u, 2.0 * w)

        exposed = np.maximum(exposed_s(used_s[at_src], window_f[mb_row + src]),
                             exposed_s(used_s[at_g], window_f[mb_row + g_all]))
        feasible = (has & (mine >= 0) & (amount >= min_tok[active][:, None]) & (amount > 0)
                    & ((exposed == 0) | (amount * token_s > exposed)))
        j = np.argmax(np.where(feasible, amount, -1), axis=1)  # the feasible copy moving the most tokens
        ok = feasible[rows, j]
        ex, g, src, amount = mine[rows, j], g_all[rows, j], src[rows, j], amount[rows, j]
        from_replica = j >= k
        act = active[ok]
        if len(act) == 0:
            break
        d, g, ex, amount, src, j = d[ok], g[ok], ex[ok], amount[ok], src[ok], j[ok]
        from_replica = from_replica[ok]
        slot = np.argmax(nrep_free[act, g], axis=1)
        rexp2[act, g, slot] = ex
        rtok2[act, g, slot] = amount
        nrep_free[act, g, slot] = False
        free_all[act, g] = nrep_free[act, g].any(axis=1)
        h = ~from_replica
        left[act[h], ex[h]] -= amount[h]
        rtok2[act[~h], d[~h], j[~h] - k] -= amount[~h]
        gpu[act, d] -= amount
        gpu[act, g] += amount
        used_s[act * ep + src] += push_s
        used_s[act * ep + g] += push_s
        added += len(act)
        still = gpu[act].max(axis=1) > target[act]
        active = act[still]
    return rexp2.reshape(m, l, ep, r), rtok2.reshape(m, l, ep, r), added


@register
@dataclass
class ReLibraHierPolicy(ReLibraPolicy):
    """relibra-h: ReLibra (every parameter of `relibra`) plus cross-node replicas (module docstring).

    cross_slots_per_gpu: extra replica slots per GPU for cross-node replicas (default 1).
    cross_rounds: at most this many cross-node moves per (micro-batch, layer) (default 256).
    """

    name: ClassVar[str] = "relibra-h"
    cross_slots_per_gpu: int = 1
    cross_rounds: int = 256

    def __post_init__(self):
        super().__post_init__()
        check_nonnegative_int(self.name, cross_slots_per_gpu=self.cross_slots_per_gpu, cross_rounds=self.cross_rounds)
        if self.replicate not in ("micro_batch", "none"):
            raise ConfigError(f"policy {self.name!r}: replicate must be 'micro_batch' or 'none', got {self.replicate!r}")

    def _beyond_node(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
                     expert_tokens: np.ndarray, home: np.ndarray, rexp: np.ndarray, rtok: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, int, float]:
        """ReLibra's stages run unchanged (relibra.ReLibraPolicy._plan); this one adds the cross-node
        pass on the in-node plan's free slots plus cross_slots_per_gpu more, then drops replica
        slots no GPU uses."""
        m, l, ep, _ = rexp.shape
        clock = _Clock()
        pad = self.cross_slots_per_gpu
        rexp = np.concatenate([rexp, np.full((m, l, ep, pad), -1, dtype=rexp.dtype)], axis=3)
        rtok = np.concatenate([rtok, np.zeros((m, l, ep, pad), dtype=rtok.dtype)], axis=3)
        added = 0
        if ep // gpus_per_node > 1 and self.cross_rounds > 0:
            model = trace.model
            push_s = model.expert_bytes / (topology.rdma_GBps * GB)
            token_s = model.expert_train_flops_per_token / (topology.matmul_tflops * TFLOP)
            window = overlap_window_s(trace, step, topology)
            mean = expert_tokens.sum(axis=2) * 1.0 / ep  # [M, L] tokens per GPU
            smallest = np.minimum(self.replication.min_replica_tokens,
                                  np.ceil(self.replication.min_replica_fraction * mean))
            min_tokens = np.maximum(smallest, 1)
            rexp, rtok, added = cross_node_replicate(expert_tokens, home, rexp, rtok, gpus_per_node, window, push_s,
                                                     token_s, min_tokens.astype(np.int64), self.cross_rounds)
        used_slots = int((rexp >= 0).sum(axis=3).max(initial=0))
        order = np.argsort(rexp < 0, axis=3, kind="stable")  # occupied slots first
        rexp = np.take_along_axis(rexp, order, axis=3)[..., :used_slots]
        rtok = np.take_along_axis(rtok, order, axis=3)[..., :used_slots]
        return rexp, rtok, int(added), clock.lap()[0]
