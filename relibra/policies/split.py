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
                             replica_tokens: np.ndarray) -> np.ndarray:
    """Per-source token flow into every replica.

    loads: int [M, L, ep_src, E] tokens routed; home: int [L, E];
    replica_expert: int [M, L, ep, R] (-1 empty); replica_tokens: int [M, L, ep, R] tokens each
    replica computes (the home computes the rest of its expert's tokens).
    Returns int32 [M, L, ep_src, ep, R].
    """
    m, l, ep, e = loads.shape
    r = replica_expert.shape[3]
    out = np.zeros((m, l, ep, ep, r), dtype=np.int32)
    occupied = replica_expert >= 0
    if r == 0 or not occupied.any():
        return out
    mi, li, gi, ri = np.nonzero(occupied)
    ei = replica_expert[mi, li, gi, ri].astype(np.int64)
    size = replica_tokens[mi, li, gi, ri].astype(np.int64)
    if (size < 0).any():
        raise PlanError("a replica was given a negative token count")
    expert_tokens = loads.sum(axis=2, dtype=np.int64)  # [M, L, E]
    mle = (mi * l + li) * e + ei
    replicated = np.bincount(mle, weights=size, minlength=m * l * e).astype(np.int64)
    home_size = expert_tokens.reshape(-1) - replicated
    if (home_size < 0).any():
        k = int(np.argmax(home_size < 0))
        raise PlanError(f"replicas of expert {k % e} at [micro_batch, layer]=({k // e // l}, {(k // e) % l}) "
                        f"take more tokens than were routed to it")
    # Every copy of a replicated expert, keyed by (m, l, e, gpu): the replicas plus the home.
    uniq = np.unique(mle)
    home_gpu = home[(uniq // e) % l, uniq % e]
    keys = np.concatenate([mle * ep + gi, uniq * ep + home_gpu])
    sizes = np.concatenate([size, home_size[uniq]])
    order = np.argsort(keys, kind="stable")
    sorted_sizes = sizes[order]
    before = np.cumsum(sorted_sizes) - sorted_sizes  # exclusive prefix over all copies
    seg = keys[order] // ep
    first = np.r_[True, seg[1:] != seg[:-1]]
    seg_base = before[np.maximum.accumulate(np.where(first, np.arange(len(seg)), 0))]
    start_sorted = before - seg_base  # tokens taken by this expert's copies on lower GPUs
    start = np.empty_like(start_sorted)
    start[order] = start_sorted
    start = start[: len(mi)]
    end = start + size
    # The expert's tokens, ordered by source rank, as intervals [cum[s], cum[s+1]).
    src = loads[mi, li, :, ei].astype(np.int64)  # [n, ep_src]
    cum = np.concatenate([np.zeros((len(mi), 1), np.int64), np.cumsum(src, axis=1)], axis=1)
    flow = np.minimum(cum[:, 1:], end[:, None]) - np.maximum(cum[:, :-1], start[:, None])
    out[mi, li, :, gi, ri] = np.clip(flow, 0, None).astype(np.int32)
    return out

