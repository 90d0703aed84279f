"""ReLibra's intra-batch replication: replicas inside each node, per micro-batch and layer.

See relibra/policies/relibra.py for where it sits in the policy, and docs/policies.md for the choices.
"""

from __future__ import annotations

import numpy as np

from relibra.policies.base import experts_by_gpu


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
    ends the node's greedy (the fraction keeps small models replicating).

    expert_tokens: int [M, L, E]; home: int [L, E] (experts / ep per GPU).
    Returns (replica_expert int32 [M, L, ep, spare_slots] (-1 empty), replica_tokens int64 same shape).
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
    hosted = experts_by_gpu(home, ep)  # [L, ep, k]
    # int32 working arrays halve the memory traffic; counts per (micro_batch, layer) stay far below 2^31
    at_home = expert_tokens[:, np.arange(layers)[:, None, None], hosted].astype(np.int32)  # [M, L, ep, k]
    b = m * layers * nodes
    rem = at_home.reshape(b, gpn, k).copy()  # tokens each home copy still computes
    load = rem.sum(axis=2, dtype=np.int32)  # [B, gpn]
    target = (-(-load.sum(axis=1, dtype=np.int64) // gpn)).astype(np.int32)  # ceil of the node mean
    rep_src = np.full((b, gpn, r), -1, dtype=np.int32)  # node-local source: gpu_local * k + j
    rep_tok = np.zeros((b, gpn, r), dtype=np.int32)
    nrep = np.zeros((b, gpn), dtype=np.int32)
    active = np.arange(b)
    threshold = np.maximum(np.minimum(int(min_replica_tokens), np.ceil(min_replica_fraction * target)), 1
                           ).astype(np.int32)  # [B]
    gg = np.arange(gpn)
    for _ in range(3 * gpn * r):
        if len(active) == 0:
            break
        n = len(active)
        rows = np.arange(n)
        sel = slice(None) if n == b else active  # every cell still active: views instead of copies
        gl = load[sel]
        gmax = np.argmax(gl, axis=1)
        tgt = target[sel]
        excess = gl[rows, gmax] - tgt
        room = np.maximum(tgt[:, None] - gl, 0)  # [n, gpn]
        free = nrep[sel] < r
        rs = rep_src[sel]  # [n, gpn, R]
        rem_a = rem[sel]  # [n, gpn, k]
        # the donor's best expert for each possible new-replica GPU h (not already replicated there)
        # on_h[i, h, j]: GPU h already holds a replica of the donor's expert j (few such slots: scatter them)
        on_h = np.zeros((n, gpn, k), dtype=bool)
        ni, hi, si = np.nonzero(rs // k == gmax[:, None, None])  # empty slots (-1) never match
        on_h[ni, hi, rs[ni, hi, si] % k] = True
        give = np.where(on_h, -1, rem_a[rows, gmax][:, None, :])  # [n, gpn, k]
        give_j = np.argmax(give, axis=2)  # [n, gpn]
        give_tok = np.take_along_axis(give, give_j[:, :, None], axis=2)[:, :, 0]
        can_host = free & (gg[None, :] != gmax[:, None])
        direct = np.where(can_host, np.minimum(np.minimum(excess[:, None], room), give_tok), 0)  # [n, gpn]
        # existing replicas (receiver, slot): source GPU h and expert j
        occupied = rs >= 0
        rs0 = np.where(occupied, rs, 0).reshape(n, gpn * r)
        src_h, src_j = np.divmod(rs0, k)  # [n, gpn * R]
        rem_src = np.where(occupied, np.take_along_axis(rem_a.reshape(n, gpn * k), rs0, axis=1).reshape(rs.shape), 0)
        hostable = np.where(can_host, give_tok, 0)  # what GPU h could take as a new replica from the donor
        relay = np.where((src_h == gmax[:, None]).reshape(rs.shape), np.iinfo(np.int32).max,
                         np.take_along_axis(hostable, src_h, axis=1).reshape(rs.shape))
        src_h, src_j = src_h.reshape(rs.shape), src_j.reshape(rs.shape)
        path = np.minimum(np.minimum(excess[:, None, None], room[:, :, None]), np.minimum(rem_src, relay))
        path = np.where(occupied, path, 0).reshape(n, gpn * r)
        options = np.concatenate([path, direct], axis=1)  # top-ups and chains first: ties keep slots
        choice = np.argmax(options, axis=1)
        amount = options[rows, choice]
        ok = amount >= threshold[sel]
        act = active[ok]
        if len(act):
            rows_ok, choice, amount, donor = rows[ok], choice[ok], amount[ok], gmax[ok]
            is_direct = choice >= gpn * r
            # direct: new replica of the donor's expert on GPU `dst`
            d = np.nonzero(is_direct)[0]
            if len(d):
                a_, dst = act[d], choice[d] - gpn * r
                j = give_j[rows_ok[d], dst]
                slot = nrep[a_, dst]
                rem[a_, donor[d], j] -= amount[d]
                load[a_, donor[d]] -= amount[d]
                load[a_, dst] += amount[d]
                rep_src[a_, dst, slot] = donor[d] * k + j
                rep_tok[a_, dst, slot] = amount[d]
                nrep[a_, dst] += 1
            t = np.nonzero(~is_direct)[0]
            if len(t):
                a_, recv, slot = act[t], choice[t] // r, choice[t] % r
                h, j = src_h[rows_ok[t], recv, slot], src_j[rows_ok[t], recv, slot]
                rem[a_, h, j] -= amount[t]  # the receiver's replica takes more of h's expert
                rep_tok[a_, recv, slot] += amount[t]
                load[a_, recv] += amount[t]
                load[a_, h] -= amount[t]
                chain = h != donor[t]  # h refills from the donor through a new replica
                c = np.nonzero(chain)[0]
                if len(c):
                    a_c, h_c, amt = a_[c], h[c], amount[t][c]
                    jd = give_j[rows_ok[t][c], h_c]
                    slot_c = nrep[a_c, h_c]
                    rem[a_c, donor[t][c], jd] -= amt
                    load[a_c, donor[t][c]] -= amt
                    load[a_c, h_c] += amt
                    rep_src[a_c, h_c, slot_c] = donor[t][c] * k + jd
                    rep_tok[a_c, h_c, slot_c] = amt
                    nrep[a_c, h_c] += 1
        active = act
    # node-local source index -> expert id
    bi, gi, ri = np.nonzero(rep_src >= 0)
    node = bi % nodes
    layer = (bi // nodes) % layers
    mb = bi // nodes // layers
    src = rep_src[bi, gi, ri]
    rexp[mb, layer, node * gpn + gi, ri] = hosted[layer, node * gpn + src // k, src % k]
    rtok[mb, layer, node * gpn + gi, ri] = rep_tok[bi, gi, ri]
    return rexp, rtok


def held_from_replicas(replica_expert: np.ndarray, home: np.ndarray, ep: int) -> np.ndarray:
    """Copies per layer from one set of replicas: replica_expert int [L, ep, R] -> bool [L, E, ep]."""
    layers, experts = home.shape
    held = np.zeros((layers, experts, ep), dtype=bool)
    held[np.arange(layers)[:, None], np.arange(experts)[None, :], home] = True
    li, gi, ri = np.nonzero(replica_expert >= 0)
    held[li, replica_expert[li, gi, ri], gi] = True
    return held
