"""Plain references of ReLibra's two planners, one (micro_batch, layer, node) or one swap at a time.

They define what the vectorised planners compute (relibra.policies.replicate, relibra.policies.reorder).
The replication greedy gives the same plans exactly; the annealer gives the same homes unless a
Metropolis draw falls within the fast one's float32 rounding of its smooth term (see anneal_homes).
tests/test_planner_reference.py checks both on seeded random cases.
Read these first: the fast versions are the same steps, batched over every cell at once.
"""

from __future__ import annotations

import numpy as np

from relibra.policies.base import experts_by_gpu


# ---- intra-batch replication: greedy water-filling inside one node ------------------------------------
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


# ---- inter-batch reordering: the score of a placement and the swap annealer -----------------------------
def layer_scores(expert_tokens: np.ndarray, src_node_tokens: np.ndarray, home: np.ndarray, ep: int,
                 gpus_per_node: int, node_power: int | None, comm_ratio: float = 0.0, gpu_weight: float = 0.1,
                 migration_cost: np.ndarray | None = None, prev_home: np.ndarray | None = None) -> np.ndarray:
    """ReLibra's score of every layer's placement: float64 [L] (lower is better).

    expert_tokens: int [M, L, E] tokens per expert per micro-batch; src_node_tokens: int [M, L, E,
    nodes] of those, the tokens coming from each node's ranks; home: int [L, E] home GPU of each
    expert; node_power: p of the smooth maximum over nodes, or None for the exact maximum;
    comm_ratio: r, compute tokens one cross-node token costs (0: no communication term);
    migration_cost: float [2] cost of moving one expert inside a node / across nodes (times the
    migration weight), used with prev_home int [L, E].

    In per-GPU compute tokens summed over the step's micro-batches m:

        J = ( sum_m [ smax_n C[m,n] + r smax_n R[m,n] ] / gpn          node balance per micro-batch
            + w_gpu sum_m sum_g G[m,g]^2 / T[m]                          GPU balance per micro-batch
            + sum over moved experts of migration_cost ) / S             migration from prev_home

    C[m,n]: the tokens of the experts homed in node n (its compute); R[m,n]: of those, the tokens
    coming from other nodes' ranks (what it receives over RDMA). Expert compute and the dispatch that
    feeds it are separate phases, each as slow as its busiest node: hence a sum of two maxima.
    smax_n y = mu (mean_n (y / mu)^p)^(1/p), a p-norm smooth maximum between the mean and the max,
    with mu a placement-free normaliser (C: T / nodes; R: T (nodes - 1) / nodes^2, what a node
    receives when sources spread evenly; each at least 1). G: tokens per GPU; T: the layer's tokens
    (the GPU term is left out where T = 0); S = max(sum_m T[m] / ep, 1), so that scores of layers
    and models compare. The communication term is left out with one node.
    """
    m, layers, experts = expert_tokens.shape
    gpn = gpus_per_node
    nodes = ep // gpn
    x = expert_tokens.astype(np.float64)
    use_comm = comm_ratio > 0 and nodes > 1
    out = np.zeros(layers)
    for layer in range(layers):
        h = np.asarray(home[layer])
        total = x[:, layer].sum(axis=1)  # [M]
        gpu = np.zeros((m, ep))
        np.add.at(gpu, (slice(None), h), x[:, layer])
        compute = gpu.reshape(m, nodes, gpn).sum(axis=2)  # [M, nodes]
        terms = [(compute, np.maximum(total / nodes, 1.0), 1.0)]
        if use_comm:
            own = src_node_tokens[:, layer, np.arange(experts), h // gpn].astype(np.float64)  # [M, E]
            received = np.zeros((m, nodes))
            np.add.at(received, (slice(None), h // gpn), x[:, layer] - own)
            terms.append((received, np.maximum(total * (nodes - 1) / nodes ** 2, 1.0), comm_ratio))
        node_term = 0.0
        for y, mu, weight in terms:
            if node_power is None:
                peak = y.max(axis=1)
            else:
                peak = mu * ((y / mu[:, None]) ** node_power).mean(axis=1) ** (1.0 / node_power)
            node_term += weight * peak.sum()
        inv_total = np.where(total > 0, 1.0 / np.maximum(total, 1.0), 0.0)
        score = node_term / gpn + gpu_weight * ((gpu ** 2).sum(axis=1) * inv_total).sum()
        if migration_cost is not None and prev_home is not None:
            before = np.asarray(prev_home[layer])
            across = h // gpn != before // gpn
            inside = (h != before) & ~across
            score += migration_cost[0] * inside.sum() + migration_cost[1] * across.sum()
        out[layer] = score / max(total.sum() / ep, 1.0)
    return out


def anneal_homes_reference(expert_tokens: np.ndarray, src_node_tokens: np.ndarray, init_home: np.ndarray, ep: int,
                           gpus_per_node: int, config, rng: np.random.Generator, comm_ratio: float = 0.0,
                           migration_cost: np.ndarray | None = None, prev_home: np.ndarray | None = None
                           ) -> np.ndarray:
    """anneal_homes, one layer and one candidate swap at a time, each scored by recomputing the whole
    objective (layer_scores) for the swapped placement.

    expert_tokens: int [M, L, E]; src_node_tokens: int [M, L, E, nodes]; init_home: int [L, E] or
    [starts, L, E] (equal homes per GPU; swaps keep them so); config: an AnnealConfig; comm_ratio,
    migration_cost, prev_home: see layer_scores. Returns home int64 [L, E].

    1. Each layer starts from the best-scoring of the given placements.
    2. Annealing, `iterations` times: draw `candidates` random expert pairs (a, b) per layer (one
       draw of shape [2, L, K] for all layers); per layer take the pair whose swap lowers the smooth
       score most (a pair on one GPU is no move); a swap that raises it is taken with probability
       exp(-increase / temperature) (one uniform draw per such layer, in layer order), the
       temperature falling geometrically from initial_temperature to final_temperature.
    3. Polish, `polish_iterations` times: the same draws, scored with the exact maxima over nodes;
       only a swap that lowers the score by more than 1e-9 is taken.
    """
    m, layers, experts = expert_tokens.shape
    k = config.candidates
    mig = None
    if prev_home is not None and migration_cost is not None and config.migration_weight > 0:
        mig = np.asarray(migration_cost, dtype=np.float64) * config.migration_weight

    def scores(home: np.ndarray, power: int | None) -> np.ndarray:
        return layer_scores(expert_tokens, src_node_tokens, home, ep, gpus_per_node, power, comm_ratio,
                            config.gpu_weight, mig, prev_home)

    starts = np.asarray(init_home, dtype=np.int64).reshape(-1, layers, experts)
    start_scores = np.stack([scores(h, config.node_power) for h in starts])  # [starts, L]
    home = starts[np.argmin(start_scores, axis=0), np.arange(layers)].copy()

    def best_swaps(power: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw the candidates; per layer the best one's (a, b) and its score change (inf: no move)."""
        pairs = rng.integers(0, experts, size=(2, layers, k))
        current = scores(home, power)
        best_pair = np.zeros((layers, 2), dtype=np.int64)
        best_delta = np.full(layers, np.inf)
        for layer in range(layers):
            for c in range(k):
                a, b = pairs[0, layer, c], pairs[1, layer, c]
                if home[layer, a] == home[layer, b]:
                    continue
                swapped = home.copy()
                swapped[layer, [a, b]] = home[layer, [b, a]]
                delta = scores(swapped, power)[layer] - current[layer]
                if delta < best_delta[layer]:
                    best_pair[layer], best_delta[layer] = (a, b), delta
        return best_pair, best_delta, current

    def swap(layer: int, pair: np.ndarray) -> None:
        a, b = pair
        home[layer, [a, b]] = home[layer, [b, a]]

    iterations = config.iterations
    temperatures = config.initial_temperature * (config.final_temperature / config.initial_temperature) ** (
        np.arange(iterations) / max(iterations - 1, 1))
    for it in range(iterations):
        pair, delta, _ = best_swaps(config.node_power)
        take = delta < 0
        warm = np.isfinite(delta) & ~take
        take[warm] = rng.random(int(warm.sum())) < np.exp(-delta[warm] / temperatures[it])
        for layer in np.flatnonzero(take):
            swap(layer, pair[layer])
    for _ in range(config.polish_iterations):
        pair, delta, _ = best_swaps(None)
        for layer in np.flatnonzero(delta < -1e-9):
            swap(layer, pair[layer])
    return home
