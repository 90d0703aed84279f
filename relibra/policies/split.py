"""Token splitting shared by every replicating policy: from "how many tokens each copy computes"
to the runs of tokens a StepPlan carries.

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


def replica_runs(home: np.ndarray, replica_expert: np.ndarray, replica_tokens: np.ndarray,
                 expert_tokens: np.ndarray) -> np.ndarray:
    """Where each replica's run of its expert's tokens starts (StepPlan.replica_start).

    home: int [L, E]; replica_expert: int [M, L, ep, R] (-1 empty); replica_tokens: int [M, L, ep, R]
    tokens each replica computes (the home computes the rest of its expert's tokens); expert_tokens:
    int [M, L, E] tokens routed to each expert. Returns int64 [M, L, ep, R] (0 for an empty slot).

    The copies of an expert, home included, take consecutive runs of its tokens in source order,
    ordered by GPU: a replica's run starts after the tokens of the copies on lower GPUs.
    """
    m, l, ep, r = replica_expert.shape
    e = home.shape[1]
    start = np.zeros((m, l, ep, r), dtype=np.int64)
    occupied = replica_expert >= 0
    if r == 0 or not occupied.any():
        return start
    mi, li, gi, ri = np.nonzero(occupied)  # in (micro_batch, layer, gpu, slot) order
    ei = replica_expert[mi, li, gi, ri].astype(np.int64)
    size = replica_tokens[mi, li, gi, ri].astype(np.int64)
    if (size < 0).any():
        raise PlanError("a replica was given a negative token count")
    mle = (mi * l + li) * e + ei
    replicated = np.bincount(mle, weights=size, minlength=m * l * e).astype(np.int64)
    home_size = np.asarray(expert_tokens, dtype=np.int64).reshape(-1) - replicated
    if (home_size < 0).any():
        k = int(np.argmax(home_size < 0))
        raise PlanError(f"replicas of expert {k % e} at [micro_batch, layer]=({k // e // l}, {(k // e) % l}) "
                        f"take more tokens than were routed to it")
    # the tokens of the same expert's replicas on lower GPUs: an exclusive prefix sum within each
    # expert's group (a stable sort by expert keeps the replicas in GPU order)
    order = np.argsort(mle, kind="stable")
    sorted_size = size[order]
    before = np.cumsum(sorted_size) - sorted_size
    group = mle[order]
    first = np.r_[True, group[1:] != group[:-1]]
    group_base = before[np.maximum.accumulate(np.where(first, np.arange(len(group)), 0))]
    within = np.empty(len(mle), dtype=np.int64)
    within[order] = before - group_base
    # and the home's tokens when the home's GPU is lower
    start[mi, li, gi, ri] = within + np.where(home[li, ei] < gi, home_size[mle], 0)
    return start
