"""The plain reference of ReLibra's in-node replication (relibra.policies.replicate.replicate_in_node),
one (micro_batch, layer, node) at a time: what the vectorised greedy computes, the same plans exactly
(tests/test_planner_reference.py). Read this first: the fast version is the same steps, batched over
every cell at once.
"""

from __future__ import annotations

import numpy as np

from relibra.policies.base import experts_by_gpu


def replicate_node(home_tokens: np.ndarray, slots: int, threshold: int) -> list[list[list[int]]]:
    """The replication greedy for one node of one (micro_batch, layer).

    home_tokens: int [gpn, k] tokens of each GPU's k homed experts; slots: spare slots per GPU;
    threshold: the smallest move worth a replica. Returns per GPU its replicas as
    [source GPU, expert index there, tokens], in slot order.

    Each round the first most-loaded GPU (the donor) sheds tokens towards the node mean (the target)
    by the largest of three moves, each bounded by the donor's excess over the target and the
    receiver's room below it:
      direct: a new replica of one of the donor's experts on a GPU with a free slot (the donor's
              largest expert that GPU does not replicate yet);
      top-up: more tokens to an existing replica of one of the donor's experts;
      chain:  a receiver's existing replica of an expert of GPU h takes more of it, and h, so freed,
              takes a new replica of one of the donor's experts.
    Ties go to top-ups and chains (by receiver, then slot) before direct moves, then to the first.
    The greedy ends at the first round whose best move is below the threshold, or after
    3 x gpn x slots rounds.
    """
    gpn, k = home_tokens.shape
    rem = home_tokens.astype(np.int64).copy()  # tokens each home copy still computes
    load = rem.sum(axis=1)  # tokens each GPU computes
    target = -(-int(load.sum()) // gpn)  # ceil of the node mean
    replicas: list[list[list[int]]] = [[] for _ in range(gpn)]
    for _ in range(3 * gpn * slots):
        donor = int(np.argmax(load))
        excess = int(load[donor]) - target
        room = [max(target - int(load[h]), 0) for h in range(gpn)]
        can_host = [len(replicas[h]) < slots and h != donor for h in range(gpn)]
        # for each GPU h: the donor's largest expert h does not replicate yet (-1 tokens if none)
        give_tokens, give_expert = [], []
        for h in range(gpn):
            held = {j for (src, j, _) in replicas[h] if src == donor}
            best_tokens, best_j = -1, 0
            for j in range(k):
                if j not in held and rem[donor, j] > best_tokens:
                    best_tokens, best_j = int(rem[donor, j]), j
            give_tokens.append(best_tokens)
            give_expert.append(best_j)
        moves = []  # (tokens, kind, receiver, slot), in tie-breaking order
        for receiver in range(gpn):
            for slot in range(slots):
                if slot >= len(replicas[receiver]):
                    moves.append((0, "empty", receiver, slot))
                    continue
                src, j, _ = replicas[receiver][slot]
                # a top-up is bounded by the donor's copy; a chain also by what src can take from the donor
                relay = np.iinfo(np.int64).max if src == donor else (give_tokens[src] if can_host[src] else 0)
                moves.append((min(excess, room[receiver], int(rem[src, j]), relay), "path", receiver, slot))
        for receiver in range(gpn):
            tokens = min(excess, room[receiver], give_tokens[receiver]) if can_host[receiver] else 0
            moves.append((tokens, "direct", receiver, 0))
        tokens, kind, receiver, slot = max(moves, key=lambda move: move[0])  # the first of equals
        if tokens < threshold:
            break
        if kind == "direct":
            j = give_expert[receiver]
            rem[donor, j] -= tokens
            load[donor] -= tokens
            load[receiver] += tokens
            replicas[receiver].append([donor, j, tokens])
            continue
        src, j, _ = replicas[receiver][slot]
        rem[src, j] -= tokens
        replicas[receiver][slot][2] += tokens
        load[receiver] += tokens
        load[src] -= tokens
        if src != donor:  # a chain: src refills from the donor through a new replica
            jd = give_expert[src]
            rem[donor, jd] -= tokens
            load[donor] -= tokens
            load[src] += tokens
            replicas[src].append([donor, jd, tokens])
    return replicas


def replicate_in_node_reference(expert_tokens: np.ndarray, home: np.ndarray, ep: int, gpus_per_node: int,
                                spare_slots: int, min_replica_tokens: int, min_replica_fraction: float = 1.0
                                ) -> tuple[np.ndarray, np.ndarray]:
    """replicate_in_node, one (micro_batch, layer, node) at a time.

    expert_tokens: int [M, L, E]; home: int [L, E] (experts / ep per GPU). A node's threshold is
    max(1, min(min_replica_tokens, ceil(min_replica_fraction x its target))).
    Returns (replica_expert int32 [M, L, ep, spare_slots] (-1 empty), replica_tokens int64 same shape).
    """
    m, layers, experts = expert_tokens.shape
    gpn = gpus_per_node
    hosted = experts_by_gpu(home, ep)  # [L, ep, k] expert ids by (GPU, j)
    replica_expert = np.full((m, layers, ep, spare_slots), -1, dtype=np.int32)
    replica_tokens = np.zeros((m, layers, ep, spare_slots), dtype=np.int64)
    if spare_slots == 0 or gpn == 1:
        return replica_expert, replica_tokens
    for mb in range(m):
        for layer in range(layers):
            for node in range(ep // gpn):
                first = node * gpn
                home_tokens = expert_tokens[mb, layer][hosted[layer, first:first + gpn]]  # [gpn, k]
                target = -(-int(home_tokens.sum()) // gpn)
                threshold = max(min(int(min_replica_tokens), int(np.ceil(min_replica_fraction * target))), 1)
                for g, replicas in enumerate(replicate_node(home_tokens, spare_slots, threshold)):
                    for slot, (src, j, tokens) in enumerate(replicas):
                        replica_expert[mb, layer, first + g, slot] = hosted[layer, first + src, j]
                        replica_tokens[mb, layer, first + g, slot] = tokens
    return replica_expert, replica_tokens
