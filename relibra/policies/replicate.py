"""ReLibra's intra-batch replication: replicas inside each node, per micro-batch and layer.

See relibra/policies/relibra.py for where it sits in the policy, and docs/policies.md for the choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relibra.policies.base import check_config, experts_by_gpu


@dataclass(frozen=True)
class ReplicationConfig:
    """Intra-batch replication knobs (ReLibraPolicy.replication).

    spare_slots_per_gpu: replica slots per GPU per layer (the layer-shared buffer), default 2.
    min_replica_tokens, min_replica_fraction: a move onto a replica must carry at least
        min(min_replica_tokens, min_replica_fraction x the node's mean GPU tokens) tokens
        (defaults 128 and 0.01: 128 at the paper scale, a few tokens for the tiny test models).
    """

    spare_slots_per_gpu: int = 2
    min_replica_tokens: int = 128
    min_replica_fraction: float = 0.01

    def __post_init__(self):
        check_config("ReplicationConfig", self.spare_slots_per_gpu, "spare_slots_per_gpu", integer=True, minimum=0)
        check_config("ReplicationConfig", self.min_replica_tokens, "min_replica_tokens", integer=True, minimum=0)
        check_config("ReplicationConfig", self.min_replica_fraction, "min_replica_fraction", positive=True)


def replicate_in_node(expert_tokens: np.ndarray, home: np.ndarray, ep: int, gpus_per_node: int,
                      spare_slots: int, min_replica_tokens: int, min_replica_fraction: float = 1.0
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Greedy water-filling replication inside each node, for every (micro_batch, layer) at once.

    Each round looks at the node's most-loaded GPU (the donor) and takes the largest of three moves,
    each bounded by the donor's excess over the node mean and the receiver's room below it:
      direct: a new replica of one of the donor's experts on another GPU with a free slot;
      top-up: more tokens to a replica of one of the donor's experts that already exists;
      chain:  a receiver's existing replica of expert e (homed on h) takes more of e from h, and h,
              so freed, takes a new replica of one of the donor's experts (the receiver needs no
              new slot, which matters once the least-loaded GPUs have used theirs).
    A move below max(1, min(min_replica_tokens, min_replica_fraction x the node's mean GPU tokens))
    ends the node's greedy (the fraction keeps small models replicating). Ties go to the first
    GPU, the first expert, and top-ups and chains (by receiver, then slot) before direct moves.

    expert_tokens: int [M, L, E]; home: int [L, E] (experts / ep per GPU).
    Returns (replica_expert int32 [M, L, ep, spare_slots] (-1 empty), replica_tokens int64 same shape).

    Layout: every (micro_batch, layer, node) is one column of the working arrays ([gpn, ..., cells],
    int32), so that the maxima and first-argmax over GPUs, slots and moves are reductions over a
    leading axis (elementwise over the cells, no per-cell loop); a node whose greedy has ended leaves
    the working set.
    """
    m, layers, experts = expert_tokens.shape
    nodes = ep // gpus_per_node
    k = experts // ep
    r = spare_slots
    gpn = gpus_per_node
    rexp = np.full((m, layers, ep, r), -1, dtype=np.int32)
    rtok = np.zeros((m, layers, ep, r), dtype=np.int64)
    if r == 0 or gpn == 1:
        return rexp, rtok
    hosted = experts_by_gpu(home, ep).reshape(layers, experts)  # expert ids by (GPU, j), per layer
    b = m * layers * nodes
    at_home = np.take_along_axis(expert_tokens, hosted[None], axis=2).reshape(b, gpn, k)  # [B, gpn, k]
    node_tokens = at_home.sum(axis=(1, 2), dtype=np.int64)  # [B]
    target = (-(-node_tokens // gpn)).astype(np.int32)  # ceil of the node mean
    threshold = np.maximum(np.minimum(int(min_replica_tokens), np.ceil(min_replica_fraction * target)), 1
                           ).astype(np.int32)  # [B]
    # tokens per node stay far below 2^31: int32 halves the memory traffic; the (value, index) keys of
    # the first-argmax need a few bits more, else int64
    index_bits = max(_bits(gpn * r + gpn), _bits(k))  # a move among the options, an expert among k
    wide = (int(node_tokens.max(initial=0)) + 1) << index_bits >= 2 ** 31
    # cells run over (micro_batch, layer, node); where a cell's node-local copy (GPU, j) sits in hosted
    cell = np.arange(b)
    cell_layer, cell_node = cell // nodes % layers, cell % nodes
    first_copy = cell_layer * experts + cell_node * (gpn * k)  # [B]
    rexp_cells, rtok_cells = rexp.reshape(b, gpn, r), rtok.reshape(b, gpn, r)  # views
    for lo in range(0, b, _BLOCK):  # blocks of cells: a block's arrays stay in cache through its rounds
        hi = min(b, lo + _BLOCK)
        st = _GreedyState(np.ascontiguousarray(at_home[lo:hi].transpose(1, 2, 0), dtype=np.int32), r)
        st = _greedy(st, target[lo:hi], threshold[lo:hi], 3 * gpn * r, wide)
        n = hi - lo
        occupied = st.src_copy < gpn * k * n  # [gpn, R, n]
        copy = np.minimum(st.src_copy // n, gpn * k - 1)  # node-local h * k + j (any, where empty)
        ids = hosted.reshape(-1).take(first_copy[lo:hi] + copy)
        rexp_cells[lo:hi] = np.where(occupied, ids, -1).transpose(2, 0, 1)
        rtok_cells[lo:hi] = st.rep_tok.transpose(2, 0, 1)
    return rexp, rtok


_BLOCK = 8192  # node cells per block of replicate_in_node (measured best at EP32-256)


def _bits(count: int) -> int:
    """Bits that index `count` items: the smallest s with 2^s >= count."""
    return max(count - 1, 0).bit_length()


def _renumber(flat: np.ndarray, n: int, new_n: int, new_cell: np.ndarray) -> np.ndarray:
    """Flat indices (row * n + cell) of arrays over n cells, as indices of the same rows over new_n
    cells (row * new_n + new_cell). An index at or past the end stays so."""
    return flat // n * new_n + new_cell


class _GreedyState:
    """The greedy's state for a set of n node cells, cells on the last axis (int32): rem [gpn, k, n]
    the tokens each home copy still computes, load [gpn, n], nrep [gpn, n] the slots in use, and
    per (GPU, slot) [gpn, R, n] the replica's tokens rep_tok and source: src_copy, the flat index
    of its source copy (GPU h, expert j) in rem ((h * k + j) * n + cell; gpn * k * n or more for
    an empty slot), and src_gpu, that of h in a [gpn, n] array (gpn * n or more when empty; the
    same array as src_copy when k = 1). Every array is C-contiguous: updates go through flat views."""

    _FIELDS = ("rem", "load", "nrep", "rep_tok", "src_copy", "src_gpu")

    def __init__(self, rem: np.ndarray, slots: int, *rest):
        gpn, k, n = rem.shape
        self.rem = rem
        if rest:
            self.load, self.nrep, self.rep_tok, self.src_copy, self.src_gpu = rest
        else:
            self.load = rem.sum(axis=1, dtype=np.int32)
            self.nrep = np.zeros((gpn, n), dtype=np.int32)
            self.rep_tok = np.zeros((gpn, slots, n), dtype=np.int32)
            self.src_copy = np.full((gpn, slots, n), gpn * k * n, dtype=np.intp)
            self.src_gpu = self.src_copy if k == 1 else np.full((gpn, slots, n), gpn * n, dtype=np.intp)
        self.col = np.arange(n)

    def take(self, cells: np.ndarray) -> "_GreedyState":
        """A copy of these cells' state (flat indices renumbered for the new cell count)."""
        gpn, k, n = self.rem.shape
        new_n = len(cells)
        rem, load, nrep, rep_tok = (np.ascontiguousarray(getattr(self, f)[..., cells]) for f in self._FIELDS[:4])
        # renumbered for new_n cells (an empty slot's index stays at or above the end of rem); C order,
        # since the updates write through flat views
        new_cell = np.arange(new_n)
        src_copy = np.ascontiguousarray(_renumber(self.src_copy[..., cells], n, new_n, new_cell))
        src_gpu = src_copy if k == 1 else np.ascontiguousarray(_renumber(self.src_gpu[..., cells], n, new_n, new_cell))
        return _GreedyState(rem, rep_tok.shape[1], load, nrep, rep_tok, src_copy, src_gpu)

    def put(self, cells: np.ndarray, other: "_GreedyState") -> None:
        """Write other's state (of these cells) back."""
        n = self.rem.shape[2]
        for f in self._FIELDS[:4]:
            getattr(self, f)[..., cells] = getattr(other, f)
        other_n = other.rem.shape[2]
        self.src_copy[..., cells] = _renumber(other.src_copy, other_n, n, cells)
        if self.src_gpu is not self.src_copy:
            self.src_gpu[..., cells] = _renumber(other.src_gpu, other_n, n, cells)

    def new_replica(self, cells, gpu, donor, j, amount) -> None:
        """GPU `gpu` of each cell takes `amount` of the donor's expert j in its next free slot
        (cells distinct; flat indices)."""
        gpn, k, n = self.rem.shape
        r = self.rep_tok.shape[1]
        at_gpu, at_donor = gpu * n + cells, donor * n + cells  # flat (GPU, cell) in [gpn, n]
        free_slot = self.nrep.reshape(-1)[at_gpu]
        slot = (gpu * r + free_slot) * n + cells  # flat (GPU, slot, cell) in [gpn, R, n]
        copy = (donor * k + j) * n + cells  # flat (donor, j, cell) in [gpn, k, n]
        self.rem.reshape(-1)[copy] -= amount
        self.load.reshape(-1)[at_donor] -= amount
        self.load.reshape(-1)[at_gpu] += amount
        self.rep_tok.reshape(-1)[slot] = amount
        self.src_copy.reshape(-1)[slot] = copy
        if self.src_gpu is not self.src_copy:
            self.src_gpu.reshape(-1)[slot] = at_donor
        self.nrep.reshape(-1)[at_gpu] += 1


def _greedy(st: _GreedyState, target: np.ndarray, threshold: np.ndarray, rounds: int, wide: bool) -> _GreedyState:
    """Up to `rounds` rounds of the greedy for the cells of st; a cell that makes no move is done
    (its state no longer changes: a later round makes the same choice and again no move) and leaves
    the working set once half of it is done. Returns the final state of every cell of st."""
    work, cells = st, np.arange(st.load.shape[1])
    for _ in range(rounds):
        ok = _greedy_round(work, target[cells] if work is not st else target,
                           threshold[cells] if work is not st else threshold, wide)
        if ok.all():
            continue
        keep = np.flatnonzero(ok)
        if len(keep) * 2 > len(ok):  # a done cell's round changes nothing: compact only when it pays
            continue
        if work is not st:
            st.put(cells, work)
        if len(keep) == 0:
            return st
        cells = cells[keep]
        work = st.take(cells)
    if work is not st:
        st.put(cells, work)
    return st


def _first_max(values: np.ndarray, axis: int, wide: bool) -> tuple[np.ndarray, np.ndarray]:
    """(max, index of its first occurrence) over `axis` (0 or 1) of an int32 array, as one max of
    the keys value * 2^s + (2^s - 1 - index)."""
    count = values.shape[axis]
    s = _bits(count)
    low = (1 << s) - 1
    shape = [1] * values.ndim
    shape[axis] = count
    tie = (low - np.arange(count, dtype=np.int64 if wide else np.int32)).reshape(shape)
    key = np.left_shift(values.astype(np.int64), s) if wide else np.left_shift(values, s)
    key += tie
    best = key.max(axis=axis)
    return (best >> s).astype(np.int32), (low - (best & low)).astype(np.int32)


def _greedy_round(st: _GreedyState, tgt: np.ndarray, threshold: np.ndarray, wide: bool) -> np.ndarray:
    """One round of replicate_in_node's greedy for every cell of st (updated in place); returns bool
    [n]: the cells that made a move (the others' greedy has ended). Masks enter as 0/1 factors (a
    masked np.where is many times slower here)."""
    gpn, k, n = st.rem.shape
    r = st.rep_tok.shape[1]
    col = st.col
    load, rem = st.load, st.rem
    big = np.int32(np.iinfo(np.int32).max)
    top, donor = _first_max(load, 0, wide)  # the first most-loaded GPU [n]
    excess = top - tgt
    room = np.subtract(tgt, load)
    np.maximum(room, 0, out=room)  # [gpn, n]
    is_donor = np.arange(gpn)[:, None] == donor
    can_host = (st.nrep < r) & ~is_donor
    # the donor's best expert for each possible new-replica GPU h (not already replicated there)
    match = st.src_gpu == donor * n + col  # [gpn, R, n] slots holding a replica of one of the donor's experts
    if k == 1:
        rem_d = rem.reshape(-1).take(donor * n + col)  # [n]
        give_tok = rem_d - match.any(axis=1) * (rem_d + 1)  # [gpn, n]; -1 where h holds it
        give_j = None
    else:
        donor_copies = (donor * k + np.arange(k)[:, None]) * n + col  # flat (donor, j, cell) [k, n] in rem
        rem_d = rem.reshape(-1).take(donor_copies)  # [k, n]
        give = np.repeat(rem_d[None], gpn, axis=0)  # [gpn, k, n]
        hit = np.flatnonzero(match)  # flat (GPU h, slot, cell) of h's replicas of the donor's experts
        if len(hit):
            h, cell = hit // (r * n), hit % n
            j = st.src_copy.reshape(-1)[hit] // n % k  # which of the donor's experts each one copies
            give.reshape(-1)[(h * k + j) * n + cell] = -1  # give[h, j, cell]: h holds it already
        give_tok, give_j = _first_max(give, 1, wide)  # [gpn, n]
    # every move as one row of options: top-ups and chains (receiver, slot) first, so that ties keep
    # slots, then direct moves (receiver)
    options = np.empty((gpn * r + gpn, n), dtype=np.int32)
    path, direct = options[:gpn * r].reshape(gpn, r, n), options[gpn * r:]
    np.minimum(room, excess, out=direct)
    np.minimum(direct, give_tok, out=direct)
    np.multiply(direct, can_host, out=direct)
    # an existing replica of copy (h, j) can take min(its source copy's tokens, what h could take as a
    # new replica from the donor), unbounded by the latter when h is the donor (a top-up); per copy,
    # then one gather per slot (an empty slot reads the 0 after the copies, and a move of 0 tokens
    # or fewer is never chosen)
    relay = give_tok * can_host + is_donor * big  # [gpn, n]
    per_copy = np.empty(gpn * k * n + 1, dtype=np.int32)
    per_copy[-1] = 0
    np.minimum(rem, relay[:, None], out=per_copy[:-1].reshape(gpn, k, n))
    per_copy.take(st.src_copy, out=path, mode="clip")
    np.minimum(path, room[:, None], out=path)
    np.minimum(path, excess, out=path)
    amount, choice = _first_max(options, 0, wide)
    ok = amount >= threshold
    c = np.flatnonzero(ok)
    if len(c) == 0:
        return ok
    choice, amount, donor = choice[c].astype(np.intp), amount[c], donor[c].astype(np.intp)
    is_direct = choice >= gpn * r
    d = np.flatnonzero(is_direct)
    if len(d):  # a new replica of the donor's expert on GPU dst
        cd, dst = c[d], choice[d] - gpn * r
        st.new_replica(cd, dst, donor[d], give_j.reshape(-1)[dst * n + cd] if give_j is not None else 0, amount[d])
    t = np.flatnonzero(~is_direct)
    if len(t):
        ct, amt, dn = c[t], amount[t], donor[t]
        slot = choice[t] * n + ct  # flat (receiver, slot, cell); choice[t] = receiver * R + slot
        recv = choice[t] // r
        copy = st.src_copy.reshape(-1)[slot]  # flat (h, j, cell) of the replica's source copy
        h = copy // n // k
        rem.reshape(-1)[copy] -= amt  # the receiver's replica takes more of h's expert
        st.rep_tok.reshape(-1)[slot] += amt
        load.reshape(-1)[recv * n + ct] += amt
        load.reshape(-1)[h * n + ct] -= amt
        ch = np.flatnonzero(h != dn)  # a chain: h refills from the donor through a new replica
        if len(ch):
            cc, hc = ct[ch], h[ch]
            st.new_replica(cc, hc, dn[ch], give_j.reshape(-1)[hc * n + cc] if give_j is not None else 0, amt[ch])
    return ok


def held_from_replicas(replica_expert: np.ndarray, home: np.ndarray, ep: int) -> np.ndarray:
    """Copies per layer from one set of replicas: replica_expert int [L, ep, R] -> bool [L, E, ep]."""
    layers, experts = home.shape
    held = np.zeros((layers, experts, ep), dtype=bool)
    held[np.arange(layers)[:, None], np.arange(experts)[None, :], home] = True
    li, gi, ri = np.nonzero(replica_expert >= 0)
    held[li, replica_expert[li, gi, ri], gi] = True
    return held
