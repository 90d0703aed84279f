"""The plain reference of EPLB's rebalance (relibra.policies.eplb.rebalance_experts), one layer at a
time in plain Python, written from EPLB's description (its README and docstrings), independent of its
code; tests/test_eplb.py checks that both give the same slots on random cases.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def balanced_packing_reference(weights: list, packs: int) -> tuple[list, list]:
    """Balanced packing of one row: one item per pack -> item i in pack i; else items in the order
    torch.sort(descending=True) gives, each into the lightest pack with room (lowest on ties),
    pack loads summed in float32."""
    n = len(weights)
    per = n // packs
    if per == 1:
        return list(range(n)), [0] * n
    import torch  # heavy; the order torch.sort gives among equal weights is part of EPLB's contract

    order = torch.tensor(weights, dtype=torch.float32).sort(descending=True).indices.tolist()
    load, count = [F32(0)] * packs, [0] * packs
    pack, rank = [None] * n, [None] * n
    for item in order:
        best = None
        for p in range(packs):
            if count[p] < per and (best is None or load[p] < load[best]):
                best = p
        pack[item], rank[item] = best, count[best]
        load[best] = F32(load[best] + F32(weights[item]))
        count[best] += 1
    return pack, rank


def replicate_experts_reference(weights: list, slots: int) -> tuple[list, list, list]:
    """Each extra slot to the expert with the largest float32 load per copy (lowest on ties)."""
    copies = [1] * len(weights)
    phy, rank = list(range(len(weights))), [0] * len(weights)
    for _ in range(len(weights), slots):
        per_copy = [F32(F32(w) / F32(c)) for w, c in zip(weights, copies)]
        hottest = per_copy.index(max(per_copy))
        phy.append(hottest)
        rank.append(copies[hottest])
        copies[hottest] += 1
    return phy, rank, copies


def rebalance_layer_reference(w: np.ndarray, replicas: int, groups: int, nodes: int, gpus: int):
    """(phy2log, copy rank, logcnt) of one layer: w float32 [E]."""
    if groups % nodes:
        groups, nodes = 1, 1  # global policy
    e = len(w)
    size = e // groups
    import torch  # the group sums in torch's float32 summation order

    group_sum = [F32(torch.from_numpy(w[g * size:(g + 1) * size].copy()).sum().item()) for g in range(groups)]
    group_node, group_rank = balanced_packing_reference(group_sum, nodes)
    node_experts = {n: [] for n in range(nodes)}  # experts of each node, in node order
    for slot in range(groups // nodes):
        for g in range(groups):
            if group_rank[g] == slot:
                node_experts[group_node[g]].extend(range(g * size, (g + 1) * size))
    for n in node_experts:  # groups sit at their rank in the pack
        ranked = sorted(range(groups), key=lambda g: group_rank[g])
        node_experts[n] = [x for g in ranked if group_node[g] == n for x in range(g * size, (g + 1) * size)]
    per_node, per_gpu = replicas // nodes, replicas // gpus
    phy2log, ranks = [None] * replicas, [None] * replicas
    logcnt = [0] * e
    for n in range(nodes):
        experts = node_experts[n]
        local_w = [w[x] for x in experts]
        phy, rank, copies = replicate_experts_reference(local_w, per_node)
        for i, x in enumerate(experts):
            logcnt[x] = copies[i]
        load = [F32(F32(local_w[p]) / F32(copies[p])) for p in phy]
        gpu, pos = balanced_packing_reference(load, gpus // nodes)
        for j in range(per_node):
            slot = n * per_node + gpu[j] * per_gpu + pos[j]
            phy2log[slot], ranks[slot] = experts[phy[j]], rank[j]
    return phy2log, ranks, logcnt


def rebalance_experts_reference(weight: np.ndarray, replicas: int, groups: int, nodes: int, gpus: int):
    """(phy2log [L, replicas], log2phy [L, E, most copies] (-1 padded), logcnt [L, E]) as
    rebalance_experts(weight, replicas, groups, nodes, gpus) returns them: weight [L, E]."""
    w = np.asarray(weight, dtype=np.float32)
    rows = [rebalance_layer_reference(w[i], replicas, groups, nodes, gpus) for i in range(len(w))]
    phy2log = np.array([r[0] for r in rows])
    logcnt = np.array([r[2] for r in rows])
    log2phy = np.full((len(w), w.shape[1], logcnt.max()), -1)
    for i, (phy, rank, _) in enumerate(rows):
        for slot, (x, k) in enumerate(zip(phy, rank)):
            log2phy[i, x, k] = slot
    return phy2log, log2phy, logcnt
