"""Minimal-movement relabelling: map a new placement onto the previous one so that the fewest experts
change home.

A placement made from scratch (EPLB's packing, LPLB's reorder) decides which logical experts share a
GPU and how many copies each expert gets; the GPU *labels* it prints are arbitrary, since the GPUs of
one EP group are identical. Any permutation of the labels is the same balance (every GPU keeps the
same set of copies, so the same tokens), but it moves a different number of experts away from the
GPUs that hold their weights and optimizer state. This module picks the permutation that keeps the
most experts at home, per layer, by maximum-weight bipartite matching (scipy's
linear_sum_assignment) on the overlap matrix

    overlap[l, a, b] = experts e of layer l with a copy on new GPU a and previous home on GPU b.

An expert counts in at most one matched pair (it has one previous home b, and b is matched to one a),
so the matched total is the number of experts whose previous home still holds a copy of them after
the relabelling: each of them can stay home (relibra.policies.eplb.choose_homes with prev_home).

Node structure. A hierarchical placement (EPLB's hierarchical policy: every copy of an expert inside
one node) must keep each new node's GPUs together, so GPUs are matched in two levels: nodes first
(overlap summed over the node's GPUs: experts whose new node holds a copy and whose old home is in
the old node), then GPUs inside each matched pair of nodes. The two-level matching is a valid
relabelling, not always the best flat one; a flat placement (group_size = ep) is one group and the
GPU matching alone. Homes in this kit are per GPU (slot order inside a GPU is not modelled, and costs
nothing to keep), so only the GPU labels are matched.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from relibra.errors import ConfigError


def gpu_overlap(held: np.ndarray, prev_home: np.ndarray) -> np.ndarray:
    """Experts resident under each (new GPU, old GPU) pairing: int64 [L, ep_new, ep_old].

    held: bool [L, E, ep] copies of the new placement (home included); prev_home: int [L, E].
    overlap[l, a, b] = #experts e with held[l, e, a] and prev_home[l, e] == b.
    """
    layers, _, ep = held.shape
    li, ei, ai = np.nonzero(held)  # one entry per copy
    bi = np.asarray(prev_home, dtype=np.int64)[li, ei]
    flat = np.bincount((li * ep + ai) * ep + bi, minlength=layers * ep * ep)
    return flat.reshape(layers, ep, ep)


def _max_matching(weight: np.ndarray) -> np.ndarray:
    """perm int64 [n]: row a matched to column perm[a], maximizing the summed weight [n, n]."""
    rows, cols = linear_sum_assignment(weight, maximize=True)
    perm = np.empty(len(rows), dtype=np.int64)
    perm[rows] = cols
    return perm


def match_gpus(held: np.ndarray, prev_home: np.ndarray, group_size: int) -> np.ndarray:
    """The relabelling that keeps the most experts at home: perm int64 [L, ep], new GPU a -> physical
    GPU perm[l, a], a permutation of range(ep) in every layer.

    held: bool [L, E, ep]; prev_home: int [L, E]; group_size: GPUs that move as one block (GPUs per
    node for a hierarchical placement, ep for a flat one); it must divide ep. Groups are matched
    first by their summed overlap, then GPUs inside each matched pair of groups (module docstring).
    """
    layers, _, ep = held.shape
    if group_size <= 0 or ep % group_size:
        raise ConfigError(f"relabel: group_size={group_size} must divide ep={ep}")
    groups = ep // group_size
    overlap = gpu_overlap(held, prev_home)  # [L, ep, ep]
    blocks = overlap.reshape(layers, groups, group_size, groups, group_size)
    perm = np.empty((layers, ep), dtype=np.int64)
    for layer in range(layers):
        group_of = _max_matching(blocks[layer].sum(axis=(1, 3)))  # new group -> old group
        for new_group, old_group in enumerate(group_of):
            inner = _max_matching(blocks[layer, new_group, :, old_group, :])
            perm[layer, new_group * group_size:(new_group + 1) * group_size] = old_group * group_size + inner
    return perm


def apply_gpu_permutation(held: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """held relabelled: bool [L, E, ep] with out[l, e, perm[l, a]] = held[l, e, a]."""
    out = np.empty_like(held)
    np.put_along_axis(out, np.broadcast_to(perm[:, None, :], held.shape), held, axis=2)
    return out


def relabel_home(home: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """A home placement int [L, E] under the relabelling perm [L, ep]: perm[l, home[l, e]]."""
    return np.take_along_axis(perm, np.asarray(home, dtype=np.int64), axis=1)


def experts_moved(prev_home: np.ndarray, home: np.ndarray) -> int:
    """Experts whose home differs between two placements int [L, E] (what migration moves)."""
    return int((np.asarray(prev_home) != np.asarray(home)).sum())


def resident_after_matching(held: np.ndarray, prev_home: np.ndarray, group_size: int) -> int:
    """Experts whose previous home holds a copy of them once held [L, E, ep] is relabelled by
    match_gpus: the most a home choice can keep in place."""
    moved = apply_gpu_permutation(held, match_gpus(held, prev_home, group_size))
    return int(np.take_along_axis(moved, np.asarray(prev_home, dtype=np.int64)[:, :, None], axis=2).sum())
