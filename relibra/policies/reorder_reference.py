"""The plain reference of ReLibra's annealer (relibra.policies.reorder.anneal_homes): one layer and
one candidate swap at a time, each scored by recomputing the whole objective
(relibra.policies.objective.layer_scores) in float64.

It defines what the fast annealer computes. The draws are the same; the fast one keeps its smooth
node term in float32, so its score changes agree with these within float32 rounding, and a
Metropolis draw or a near tie inside that rounding can go either way. tests/test_planner_reference.py
replays every iteration of the fast search against candidate_score_changes on every seed of its grid.
Read this first: the fast version is the same steps, batched over every layer and candidate at once.
"""

from __future__ import annotations

import numpy as np

from relibra.policies.objective import layer_scores


def candidate_score_changes(expert_tokens: np.ndarray, src_node_tokens: np.ndarray, home: np.ndarray,
                            pairs: np.ndarray, ep: int, gpus_per_node: int, node_power: int | None,
                            comm_ratio: float, gpu_weight: float, migration_cost: np.ndarray | None,
                            prev_home: np.ndarray | None) -> np.ndarray:
    """How much swapping the homes of each candidate pair changes its layer's score: float64 [L, K]
    (inf for a pair on one GPU, which is no move).

    pairs: int [2, L, K] experts (a, b) per layer and candidate; the score is layer_scores (node_power
    None: the exact maxima), recomputed for each layer's swapped placement alone."""
    layers, k = pairs.shape[1:]
    out = np.full((layers, k), np.inf)
    for layer in range(layers):
        def score(h: np.ndarray) -> float:
            before = None if prev_home is None else prev_home[layer:layer + 1]
            return float(layer_scores(expert_tokens[:, layer:layer + 1], src_node_tokens[:, layer:layer + 1],
                                      h[None], ep, gpus_per_node, node_power, comm_ratio, gpu_weight,
                                      migration_cost, before)[0])
        current = score(home[layer])
        for c in range(k):
            a, b = pairs[0, layer, c], pairs[1, layer, c]
            if home[layer, a] == home[layer, b]:
                continue
            swapped = home[layer].copy()
            swapped[[a, b]] = home[layer, [b, a]]
            out[layer, c] = score(swapped) - current
    return out


def anneal_homes_reference(expert_tokens: np.ndarray, src_node_tokens: np.ndarray, init_home: np.ndarray, ep: int,
                           gpus_per_node: int, config, rng: np.random.Generator, comm_ratio: float = 0.0,
                           migration_cost: np.ndarray | None = None, prev_home: np.ndarray | None = None
                           ) -> np.ndarray:
    """anneal_homes, one layer and one candidate swap at a time (candidate_score_changes).

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
    mig = migration_weighted(config, migration_cost, prev_home)
    starts = np.asarray(init_home, dtype=np.int64).reshape(-1, layers, experts)
    start_scores = np.stack([layer_scores(expert_tokens, src_node_tokens, h, ep, gpus_per_node, config.node_power,
                                          comm_ratio, config.gpu_weight, mig, prev_home) for h in starts])
    home = starts[np.argmin(start_scores, axis=0), np.arange(layers)].copy()

    def best_swaps(power: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Draw the candidates; per layer the best one's (a, b) and its score change (inf: no move)."""
        pairs = rng.integers(0, experts, size=(2, layers, config.candidates))
        delta = candidate_score_changes(expert_tokens, src_node_tokens, home, pairs, ep, gpus_per_node, power,
                                        comm_ratio, config.gpu_weight, mig, prev_home)
        best = np.argmin(delta, axis=1)  # the first of equals
        return pairs[:, np.arange(layers), best].T, delta[np.arange(layers), best]

    def swap(layer: int, pair: np.ndarray) -> None:
        a, b = pair
        home[layer, [a, b]] = home[layer, [b, a]]

    temperatures = anneal_temperatures(config)
    for it in range(config.iterations):
        pair, delta = best_swaps(config.node_power)
        take = delta < 0
        warm = np.isfinite(delta) & ~take
        take[warm] = rng.random(int(warm.sum())) < np.exp(-delta[warm] / temperatures[it])
        for layer in np.flatnonzero(take):
            swap(layer, pair[layer])
    for _ in range(config.polish_iterations):
        pair, delta = best_swaps(None)
        for layer in np.flatnonzero(delta < -1e-9):
            swap(layer, pair[layer])
    return home


def migration_weighted(config, migration_cost: np.ndarray | None, prev_home: np.ndarray | None) -> np.ndarray | None:
    """The migration cost per expert moved inside / across nodes times the migration weight, float64
    [2], or None when the score has no migration term."""
    if prev_home is None or migration_cost is None or not config.migration_weight > 0:
        return None
    return np.asarray(migration_cost, dtype=np.float64) * config.migration_weight


def anneal_temperatures(config) -> np.ndarray:
    """The geometric cooling schedule: float64 [iterations] from initial_temperature to final_temperature."""
    iterations = config.iterations
    return config.initial_temperature * (config.final_temperature / config.initial_temperature) ** (
        np.arange(iterations) / max(iterations - 1, 1))
