"""ReLibra's objective: the score of a placement of every layer's experts, written once.

The annealer (relibra.policies.reorder) picks its start with it and keeps its terms incrementally
per swap; its plain reference (relibra.policies.reorder_reference) recomputes it whole per candidate.
docs/policies.md derives the terms.
"""

from __future__ import annotations

import numpy as np


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
