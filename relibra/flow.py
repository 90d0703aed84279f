"""The token-flow kernels a StepPlan is read through: per-source rows of a replica's run of tokens,
tokens per home and per GPU, experts grouped by home GPU, and a scatter of rows without ufunc.at.

Shapes: M micro-batches, L layers, ep EP ranks (GPUs), E experts, R replica slots per GPU; the run
of a replica is [start, end) of its expert's tokens of one (micro_batch, layer) counted in
source-rank order (relibra.plan describes the layout). The StepPlan methods, the simulator's cost
model (relibra.costs) and the runtime call these.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relibra.trace import rank_load


@dataclass
class LayerFlow:
    """One layer's token flow (StepPlan.layer_flows)."""

    layer: int
    home_flow: np.ndarray  # signed int [M, E, ep_src] tokens of each (expert, src) left for its home
    slots: tuple  # (micro_batch, gpu, slot) int64 [n] each: the occupied replica slots
    rows: np.ndarray  # signed int [n, ep_src] tokens each occupied slot receives from each source


class HomeGroups:
    """Experts grouped by their home GPU, per layer, to combine per-expert values into per-GPU ones.

    home: int [L, E] home rank of each expert; ep: EP size. order[l]: the experts sorted by home
    (stable); position[l, x]: where expert x sits in that order; in_order[l]: order[l] is the
    identity (static placement); counts[l, g]: experts homed on g; per_gpu: the count when every
    GPU homes the same number of experts in every layer, else 0.
    """

    def __init__(self, home: np.ndarray, ep: int):
        home = np.asarray(home, dtype=np.int64)
        layers, e = home.shape
        self.ep = ep
        self.order = np.argsort(home, axis=1, kind="stable")  # [L, E]
        self.position = np.empty_like(self.order)
        np.put_along_axis(self.position, self.order, np.arange(e)[None, :], axis=1)
        self.in_order = (self.order == np.arange(e)).all(axis=1)  # [L]
        self.counts = homes_per_gpu(home, ep)  # [L, ep]
        self.per_gpu = int(self.counts[0, 0]) if layers and (self.counts == self.counts[0, 0]).all() else 0

    def reduce(self, ufunc: np.ufunc, grouped: np.ndarray, layer: int, out: np.ndarray) -> np.ndarray:
        """out[..., g, :] = ufunc over grouped[..., x, :] for the experts x homed on GPU g (ufunc's
        identity where g homes none). grouped [..., E, S] with experts in order[layer] (as
        StepPlan.layer_flows(groups) gives them); out [..., ep, S], written (may be grouped itself
        when every GPU homes one expert)."""
        k = self.per_gpu
        if k == 1:
            if out is not grouped:
                np.copyto(out, grouped)
        elif k:
            shape = grouped.shape
            ufunc.reduce(grouped.reshape(*shape[:-2], self.ep, k, shape[-1]), axis=-2, out=out)
        else:
            counts = self.counts[layer]
            has = counts > 0
            out[..., has, :] = ufunc.reduceat(grouped, (np.cumsum(counts) - counts)[has], axis=-2)
            out[..., ~has, :] = ufunc.identity
        return out


def count_type(dtype: np.dtype) -> np.dtype:
    """The signed integer type token counts of `dtype` are worked in: itself when signed and at least
    32 bits (no copy of int32 plans into int64), else int64 (so that no difference wraps around)."""
    dtype = np.dtype(dtype)
    return dtype if dtype.kind == "i" and dtype.itemsize >= 4 else np.dtype(np.int64)


def run_rows(per_source: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Tokens each run takes from each source: int [n, ep_src].

    per_source: int [n, ep_src] tokens of each run's expert from each source; start, end: int [n]
    the run [start, end) among those tokens counted in source order. Source s holds tokens
    [below_s, below_s + per_source[s]), below_s the tokens of the sources before it; the run takes
    the overlap."""
    upto = np.cumsum(per_source, axis=1, dtype=start.dtype)  # tokens of sources <= s
    below = upto - per_source
    start, end = start[:, None], end[:, None]
    return np.clip(upto, start, end) - np.clip(below, start, end)


def rank_within(key: np.ndarray) -> np.ndarray:
    """How many earlier entries share each entry's key: int64 [n] (0 for the first of each key)."""
    n = len(key)
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    fresh = np.ones(n, dtype=bool)
    fresh[1:] = ordered[1:] != ordered[:-1]
    index = np.arange(n)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = index - np.maximum.accumulate(np.where(fresh, index, 0))
    return rank


def scatter_rows(ufunc: np.ufunc, target: np.ndarray, first: np.ndarray, second: np.ndarray, rows: np.ndarray) -> None:
    """target[first[i], second[i]] = ufunc(target[first[i], second[i]], rows[i]) for every i, in place;
    entries that share a place are applied one after another, in order of i. target [A, B, S];
    first, second int [n]; rows [n, S].

    Fancy indexing without ufunc.at: when no place repeats, one gather and one scatter; when the
    entries come in rounds (the first entry of every place, then the second, ... as consecutive
    blocks), one round per block; otherwise every entry at once, then the repeated places again
    from their saved values, round by round."""
    n = len(first)
    if not n:
        return
    if not target.flags.c_contiguous:
        work = np.ascontiguousarray(target)
        scatter_rows(ufunc, work, first, second, rows)
        target[...] = work
        return
    flat = target.reshape(-1, target.shape[2])  # a view: one index per (first, second) place
    key = np.asarray(first, dtype=np.int64) * target.shape[1] + second
    rank = rank_within(key)
    top = int(rank.max())
    if top == 0:
        flat[key] = ufunc(flat[key], rows)
        return
    if (rank[1:] >= rank[:-1]).all():
        bounds = np.searchsorted(rank, np.arange(top + 2))
        for k in range(top + 1):
            at, block = key[bounds[k]:bounds[k + 1]], rows[bounds[k]:bounds[k + 1]]
            flat[at] = ufunc(flat[at], block)
        return
    repeated = np.unique(key[rank > 0])
    saved = flat[repeated]
    flat[key] = ufunc(flat[key], rows)  # right wherever a place has one entry
    flat[repeated] = saved
    again = np.nonzero(np.isin(key, repeated))[0]
    for k in range(top + 1):
        sel = again[rank[again] == k]
        at = key[sel]
        flat[at] = ufunc(flat[at], rows[sel])


def homes_per_gpu(home: np.ndarray, ep: int) -> np.ndarray:
    """Experts homed on each GPU: [L, E] home ranks -> int64 [L, ep]."""
    home = np.asarray(home, dtype=np.int64)
    layers = home.shape[0]
    bins = (np.arange(layers, dtype=np.int64)[:, None] * ep + home).ravel()
    return np.bincount(bins, minlength=layers * ep).reshape(layers, ep)


def home_tokens_of(expert_tokens: np.ndarray, replica_expert: np.ndarray, replica_tokens: np.ndarray) -> np.ndarray:
    """Tokens left for each expert's home once its replicas take theirs: int64 [M, L, E].

    expert_tokens: int [M, L, E] tokens routed to each expert; replica_expert: int [M, L, ep, R]
    expert in each replica slot (-1 empty); replica_tokens: int [M, L, ep, R] tokens each replica takes.
    """
    m, l, e = expert_tokens.shape
    out = np.asarray(expert_tokens, dtype=np.int64)
    occupied = replica_expert >= 0
    if not occupied.any():
        return out
    mi, li, _, _ = np.nonzero(occupied)
    idx = (mi * l + li) * e + replica_expert[occupied].astype(np.int64)
    taken = np.bincount(idx, weights=replica_tokens[occupied].astype(np.float64), minlength=m * l * e)
    return out - np.rint(taken).astype(np.int64).reshape(m, l, e)


def gpu_tokens_from(expert_tokens: np.ndarray, home: np.ndarray, replica_expert: np.ndarray,
                    replica_tokens: np.ndarray) -> np.ndarray:
    """Tokens each GPU computes: int64 [M, L, ep]: its homed experts' tokens (home_tokens_of) plus its
    replicas'. expert_tokens int [M, L, E]; home int [L, E]; replica_expert, replica_tokens int [M, L, ep, R]."""
    ep = replica_expert.shape[2]
    at_home = rank_load(home_tokens_of(expert_tokens, replica_expert, replica_tokens), home, ep)
    return at_home + (np.asarray(replica_tokens, dtype=np.int64) * (replica_expert >= 0)).sum(axis=3)
