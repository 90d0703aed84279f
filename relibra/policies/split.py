"""Token splitting shared by every replicating policy: from "how many tokens each copy computes"
to the per-source flow a StepPlan carries.

Policies decide, per (micro_batch, layer), which replicas exist and how many of their expert's
tokens each one computes (`replica_tokens`). Which *source ranks'* tokens a copy takes is then a
locality choice made here, once for all policies: the copies of an expert, ordered by GPU (the
home among them), take consecutive runs of the expert's tokens ordered by source rank. Sources are
ranks and nodes are runs of consecutive ranks, so a copy draws mostly from the sources nearest to
it in rank order; every copy's token count is exact and token conservation holds by construction.
"""

from __future__ import annotations

import numpy as np

from relibra.errors import PlanError


def pack_replicas(shape: tuple[int, int, int], micro_batch: np.ndarray, layer: np.ndarray, gpu: np.ndarray,
                  expert: np.ndarray, tokens: np.ndarray, slots: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Lay replicas given as flat lists into slot arrays.

    shape: (micro_batches, layers, ep). The flat int arrays name one replica each; a (micro_batch,
    layer, gpu, expert) must appear at most once. slots: spare slots per GPU; None = as many as the
    busiest GPU needs. Returns (replica_expert int32 [M, L, ep, slots] (-1 empty),
    replica_tokens int64 [M, L, ep, slots]).
    """
    m, l, ep = shape
    cell = (np.asarray(micro_batch, np.int64) * l + layer) * ep + gpu
    order = np.argsort(cell, kind="stable")
    cell_sorted = cell[order]
    # position of each replica among those of its (m, l, gpu)
    first = np.r_[True, cell_sorted[1:] != cell_sorted[:-1]] if len(cell) else np.zeros(0, bool)
    start_pos = np.maximum.accumulate(np.where(first, np.arange(len(cell)), 0)) if len(cell) else first
    slot_sorted = np.arange(len(cell)) - start_pos
    need = int(slot_sorted.max()) + 1 if len(cell) else 0
    if slots is None:
        slots = need
    elif need > slots:
        raise PlanError(f"a GPU needs {need} replica slots but only {slots} are available")
    rexp = np.full((m * l * ep, slots), -1, dtype=np.int32)
    rtok = np.zeros((m * l * ep, slots), dtype=np.int64)
    rexp[cell_sorted, slot_sorted] = np.asarray(expert)[order]
    rtok[cell_sorted, slot_sorted] = np.asarray(tokens)[order]
    return rexp.reshape(m, l, ep, slots), rtok.reshape(m, l, ep, slots)


def replica_flow_from_tokens(loads: np.ndarray, home: np.ndarray, replica_expert: np.ndarray,
                             replica_tokens: np.ndarray, expert_tokens: np.ndarray | None = None) -> np.ndarray:
    """Per-source token flow into every replica.

    loads: int [M, L, ep_src, E] tokens routed; home: int [L, E];
    replica_expert: int [M, L, ep, R] (-1 empty); replica_tokens: int [M, L, ep, R] tokens each
    replica computes (the home computes the rest of its expert's tokens); expert_tokens: int [M, L, E]
    loads summed over sources, when the caller has it (else computed here).
    Returns int32 [M, L, ep_src, ep, R].

    A copy whose run of its expert's tokens is [start, end) takes from source s
    clip(cum[s + 1], start, end) - clip(cum[s], start, end), cum the expert's tokens of sources
    below s; per micro-batch that is one column gather from cum [ep_src + 1, L x E] and three
    passes over the micro-batch's [ep_src, L, ep x R] block of the result (an empty slot has
    start = end = 0 and so takes nothing).
    """
    m, l, ep, e = loads.shape
    r = replica_expert.shape[3]
    occupied = replica_expert >= 0
    if r == 0 or not occupied.any():
        return np.zeros((m, l, ep, ep, r), dtype=np.int32)
    mi, li, gi, ri = np.nonzero(occupied)
    ei = replica_expert[mi, li, gi, ri].astype(np.int64)
    size = replica_tokens[mi, li, gi, ri].astype(np.int64)
    if (size < 0).any():
        raise PlanError("a replica was given a negative token count")
    if expert_tokens is None:
        expert_tokens = loads.sum(axis=2, dtype=np.int64)  # [M, L, E]
    mle = (mi * l + li) * e + ei
    replicated = np.bincount(mle, weights=size, minlength=m * l * e).astype(np.int64)
    home_size = expert_tokens.reshape(-1) - replicated
    if (home_size < 0).any():
        k = int(np.argmax(home_size < 0))
        raise PlanError(f"replicas of expert {k % e} at [micro_batch, layer]=({k // e // l}, {(k // e) % l}) "
                        f"take more tokens than were routed to it")
    # start of each replica's run: the tokens its expert's copies on lower GPUs take (the replicas
    # come in (micro_batch, layer, gpu, slot) order, so a stable sort by expert keeps them by GPU;
    # the home counts when its GPU is lower)
    order = np.argsort(mle, kind="stable")
    sorted_size = size[order]
    before = np.cumsum(sorted_size) - sorted_size  # exclusive prefix over all replicas
    seg = mle[order]
    first = np.r_[True, seg[1:] != seg[:-1]]
    seg_base = before[np.maximum.accumulate(np.where(first, np.arange(len(seg)), 0))]
    start = np.empty(len(mle), dtype=np.int64)
    start[order] = before - seg_base
    home_gpu = home[li, ei]
    start += np.where(home_gpu < gi, home_size[mle], 0)
    if len(mi) * 4 < m * l * ep * r:  # mostly empty slots (measured: below a quarter): the occupied ones only
        out = np.zeros((m, l, ep, ep, r), dtype=np.int32)
        bounds = np.searchsorted(mi, np.arange(m + 1))  # the replicas of each micro-batch
        for mb in range(m):
            sel = slice(bounds[mb], bounds[mb + 1])
            if bounds[mb] == bounds[mb + 1]:
                continue
            run = _running_sums(loads[mb]).reshape(ep + 1, l * e).take(li[sel] * e + ei[sel], axis=1)
            np.clip(run, start[sel], start[sel] + size[sel], out=run)
            out[mb, li[sel], :, gi[sel], ri[sel]] = (run[1:] - run[:-1]).T
        return out
    first_slot = np.zeros((m, l, ep, r), dtype=np.int32)  # [start, end) per slot; empty: [0, 0)
    last_slot = np.zeros((m, l, ep, r), dtype=np.int32)
    first_slot[mi, li, gi, ri] = start
    last_slot[mi, li, gi, ri] = start + size
    expert_col = (np.arange(l)[:, None, None] * e + np.maximum(replica_expert, 0)).reshape(m, l * ep * r)
    first_slot, last_slot = first_slot.reshape(m, -1), last_slot.reshape(m, -1)
    out = np.empty((m, l, ep, ep, r), dtype=np.int32)
    cum = np.empty((ep + 1, l, e), dtype=np.int32)
    run = np.empty((ep + 1, l * ep * r), dtype=np.int32)  # [ep_src + 1, L x ep x R], reused
    for mb in range(m):
        _running_sums(loads[mb], cum).reshape(ep + 1, l * e).take(expert_col[mb], axis=1, out=run, mode="clip")
        np.maximum(run, first_slot[mb], out=run)
        np.minimum(run, last_slot[mb], out=run)
        view = out[mb].reshape(l, ep, ep * r).transpose(1, 0, 2)  # [ep_src, L, ep x R]
        np.subtract(run[1:].reshape(ep, l, ep * r), run[:-1].reshape(ep, l, ep * r), out=view)
    return out


def _running_sums(loads: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Tokens of the sources below s, per (layer, expert): loads int [L, ep_src, E] ->
    int32 [ep_src + 1, L, E] (a loop over sources: far faster than a strided cumsum)."""
    layers, ep, experts = loads.shape
    if out is None:
        out = np.empty((ep + 1, layers, experts), dtype=np.int32)
    out[0] = 0
    for src in range(ep):
        np.add(out[src], loads[:, src], out=out[src + 1])
    return out
