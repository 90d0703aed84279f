"""ReLibra's inter-batch reordering: where every expert is homed for one step.

lpt_homes gives a start; anneal_homes searches from it. The annealer reads top to bottom: small
numeric kernels, what no swap changes (_problem), a placement's loads (_placement), one batch of
candidate swaps (_draw_swaps, _make_swaps), the two phases (_anneal, _polish), then anneal_homes,
which runs them. The score is relibra.policies.objective.layer_scores;
relibra.policies.reorder_reference.anneal_homes_reference is the same search one swap at a time.
See relibra/policies/relibra.py for where this sits in the policy, and docs/policies.md for the
choices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from relibra.cluster import ModelShape, Topology
from relibra.flow import homes_per_gpu
from relibra.policies.base import check_config
from relibra.policies.objective import layer_scores


def lpt_homes(step_tokens: np.ndarray, ep: int) -> np.ndarray:
    """Longest-processing-time placement: experts by decreasing step tokens, each onto the GPU with
    the fewest tokens that still has room (experts / ep homes each). [L, E] -> int64 [L, E]."""
    layers, experts = step_tokens.shape
    per_gpu = experts // ep
    order = np.argsort(-step_tokens, axis=1, kind="stable")
    gpu_load = np.zeros((layers, ep))
    gpu_count = np.zeros((layers, ep), dtype=np.int64)
    home = np.zeros((layers, experts), dtype=np.int64)
    row = np.arange(layers)
    for i in range(experts):
        e = order[:, i]
        g = np.argmin(np.where(gpu_count < per_gpu, gpu_load, np.inf), axis=1)
        home[row, e] = g
        gpu_load[row, g] += step_tokens[row, e]
        gpu_count[row, g] += 1
    return home


@dataclass(frozen=True)
class AnnealConfig:
    """Simulated-annealing knobs (see the module docstring for the score; ReLibraPolicy.anneal)."""

    iterations: int = 1000
    polish_iterations: int = 300  # greedy descent on the exact max after annealing
    candidates: int = 8  # swaps scored per layer per iteration
    initial_temperature: float = 1e-4  # relative to the layer's summed mean GPU load
    final_temperature: float = 1e-7
    node_power: int = 8  # p of the smooth max over nodes (2 = load-weighted mean, larger = closer to max)
    gpu_weight: float = 0.1
    comm_weight: float = 0.1  # times r_comm
    migration_weight: float = 1.0  # times r_mig

    def __post_init__(self):
        for key in ("iterations", "polish_iterations"):
            check_config("AnnealConfig", getattr(self, key), key, integer=True, minimum=0)
        for key in ("candidates", "node_power"):
            check_config("AnnealConfig", getattr(self, key), key, integer=True, minimum=1)
        for key in ("initial_temperature", "final_temperature"):
            check_config("AnnealConfig", getattr(self, key), key, positive=True)
        for key in ("gpu_weight", "comm_weight", "migration_weight"):
            check_config("AnnealConfig", getattr(self, key), key, minimum=0)


@dataclass(frozen=True)
class AnnealStats:
    """What one anneal_homes search did: the mean over layers of the score (layer_scores) of the best
    start and of the result, the swaps the annealing and the polish accepted, and with check_state the
    largest relative difference between the kept state and a recomputation (None without)."""

    score_before: float
    score_after: float
    accepted_swaps: int
    polish_accepted_swaps: int
    state_check_max_rel_error: float | None = None


@dataclass(frozen=True)
class AnnealStep:
    """One iteration of anneal_homes, as its `observe` callback sees it (the annealer test replays
    every one against the reference's float64 score changes).

    phase: "anneal" or "polish"; iteration: its index in the phase; pairs: int [2, L, K] the drawn
    experts (a, b); delta: float [L, K] each candidate's score change over the layer's scale (inf:
    both on one GPU, no move), as this annealer computed it; best: int [L] the candidate it chose per
    layer; take: bool [L] whether it made that swap."""

    phase: str
    iteration: int
    pairs: np.ndarray
    delta: np.ndarray
    best: np.ndarray
    take: np.ndarray


# ---- small numeric kernels ------------------------------------------------------------------------
def _pow(y: np.ndarray, p: int, out: np.ndarray | None = None) -> np.ndarray:
    """y ** p for a positive integer p, by repeated multiplication (faster than np.power).

    out: write the result there (it may be y itself); the products are the same either way."""
    if out is not None and p & (p - 1) == 0:  # a power of two: square in place
        if p == 1:
            np.copyto(out, y)
            return out
        np.multiply(y, y, out=out)
        p >>= 1
        while p > 1:
            np.multiply(out, out, out=out)
            p >>= 1
        return out
    result = None
    base = y
    while p:
        if p & 1:
            result = base if result is None else result * base
        p >>= 1
        if p:
            base = base * base
    if out is not None:
        np.copyto(out, result)
        return out
    return result


def _root(y: np.ndarray, p: int, out: np.ndarray | None = None) -> np.ndarray:
    """y ** (1 / p): repeated square roots when p is a power of two (much faster than np.power).

    out: write the result there (it may be y itself)."""
    if p & (p - 1) == 0:
        if p == 1:
            if out is not None:
                np.copyto(out, y)
                return out
            return y
        y = np.sqrt(y, out=out)
        p >>= 1
        while p > 1:
            y = np.sqrt(y, out=y if out is not None else None)
            p >>= 1
        return y
    return np.power(y, 1.0 / p, out=out)


def _group_sum(values: np.ndarray, group: np.ndarray, groups: int) -> np.ndarray:
    """Per layer, the rows of values summed by group: values [L, E, M], group int [L, E] in
    [0, groups) -> [L, groups, M]. Equal groups (the placements here) sort and reshape; others
    scatter."""
    layers, experts, m = values.shape
    counts = homes_per_gpu(group, groups)
    if experts % groups == 0 and (counts == experts // groups).all():
        order = np.argsort(group, axis=1, kind="stable")
        return np.take_along_axis(values, order[:, :, None], axis=1).reshape(layers, groups, -1, m).sum(axis=2)
    out = np.zeros((layers, groups, m), dtype=values.dtype)
    np.add.at(out, (np.arange(layers)[:, None], group), values)
    return out


def _complements(nodes: int) -> np.ndarray:
    """For every pair of nodes (i, j), i != j, the other nodes in order: int64 [nodes, nodes,
    max(nodes - 2, 0)]; for i = j (a swap inside a node, whose node terms do not change) any
    nodes - 2 nodes other than i."""
    out = np.zeros((nodes, nodes, max(nodes - 2, 0)), dtype=np.int64)
    for i in range(nodes):
        for j in range(nodes):
            others = [n for n in range(nodes) if n not in (i, j)]
            out[i, j] = others[:nodes - 2]
    return out


def _top3(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The three largest entries over axis 1 and their indices: y [n, nodes, ...] (whole numbers
    >= 0 in float32) -> values and int16 indices [n, 3, ...], largest first (the lower index first
    among equal values); fewer than three nodes pad with 0 and index -1. Three maxima of the keys
    value * 2^s + (2^s - 1 - index)."""
    n, nodes = y.shape[:2]
    s = max(nodes - 1, 0).bit_length()
    low = (1 << s) - 1
    key = y.astype(np.int64) << s
    key += (low - np.arange(nodes)).reshape((1, nodes) + (1,) * (y.ndim - 2))
    vals = np.zeros((n, 3) + y.shape[2:], dtype=y.dtype)
    order = np.full((n, 3) + y.shape[2:], -1, dtype=np.int16)
    for j in range(min(nodes, 3)):
        best = key.max(axis=1)
        vals[:, j] = best >> s
        order[:, j] = low - (best & low)
        if j < 2:
            key -= (key == best[:, None]) * (key + 1)  # out of the next maxima: -1
    return vals, order


def _rel_error(kept: np.ndarray, fresh: np.ndarray) -> float:
    """Largest |kept - fresh| / max(|fresh|, 1) over all entries."""
    kept, fresh = np.asarray(kept, dtype=np.float64), np.asarray(fresh, dtype=np.float64)
    return float((np.abs(kept - fresh) / np.maximum(np.abs(fresh), 1.0)).max()) if fresh.size else 0.0


# ---- the annealer: what no swap changes, the state swaps change, one batch of swaps ----------------
# Shapes: L layers, E experts, M micro-batches, K candidate swaps per layer, T node terms (1: the
# node's compute; 2: compute and the tokens it receives from other nodes). Token counts are whole
# numbers held in float32 (exact below 2^24 tokens per node and micro-batch, so the order of their
# sums changes no bit); "rows" are flat views, one row per (layer, expert), (layer, GPU) or
# (layer, node), so that every gather is one take with one index per (layer, candidate).

_STACKED_BYTES = 32 << 20  # up to this size the node gain table holds both terms per (expert, node) row


@dataclass(slots=True)
class _Problem:
    """Everything the search reads that no swap changes (normalisers, weights, token tables)."""

    micro_batches: int
    layers: int
    experts: int
    ep: int
    gpus_per_node: int
    nodes: int
    node_power: int  # p of the smooth maximum over nodes
    terms: int  # T
    stacked: bool  # node_gain_rows holds both terms of a row (else the received term only)
    tokens: np.ndarray  # float32 [L, E, M] tokens per expert
    token_rows: np.ndarray  # float32 [L * E, M], a view of tokens
    node_gain_rows: np.ndarray | None  # float32 [L * E * nodes, T * M or M]: what expert (l, e) adds to node n's
    #   terms when homed there (its tokens, then those not from node n's ranks); None with T = 1
    two_over_total: np.ndarray  # float32 [L, 1, M] 2 / the layer's tokens (0 where it has none)
    score_scale: np.ndarray  # float64 [L] the layer's mean GPU tokens summed over micro-batches (>= 1)
    node_norm: np.ndarray  # float32 [L, 1, T, M] placement-free normaliser mu of each term
    inv_node_norm: np.ndarray  # float32 [L, 1, T, M] 1 / node_norm
    term_weight: np.ndarray  # float32 [T]: 1, then comm_ratio
    gpu_weight: float
    migration_cost: np.ndarray | None  # float64 [2] per expert moved inside / across nodes (times its weight)
    prev_gpu_rows: np.ndarray | None  # int [L * E] each expert's previous home GPU
    prev_node_rows: np.ndarray | None  # int [L * E] and node
    layer_index: np.ndarray  # int [L] 0 .. L - 1
    first_expert_row: np.ndarray  # int [L, 1] each layer's first flat (layer, expert) row
    first_gpu_row: np.ndarray  # int [L, 1] (layer, GPU) row
    first_node_row: np.ndarray  # int [L, 1] (layer, node) row


def _problem(expert_tokens: np.ndarray, src_node_tokens: np.ndarray, ep: int, gpus_per_node: int,
             config: AnnealConfig, comm_ratio: float, migration_cost: np.ndarray | None,
             prev_home: np.ndarray | None) -> _Problem:
    """The search's fixed inputs from expert_tokens int [M, L, E] and src_node_tokens int [M, L, E,
    nodes] (see anneal_homes for the other arguments)."""
    m, layers, experts = expert_tokens.shape
    nodes = ep // gpus_per_node
    use_comm = comm_ratio > 0 and nodes > 1
    terms = 2 if use_comm else 1
    # float32 halves the memory traffic of the gathers
    tokens = np.ascontiguousarray(expert_tokens.transpose(1, 2, 0), dtype=np.float32)  # [L, E, M]
    # stacked while small (in cache): a candidate's two node rows then come from two gathers; else
    # the tokens and the received term are gathered apart (half the table: fewer cache misses)
    stacked = use_comm and layers * experts * nodes * terms * m * 4 <= _STACKED_BYTES
    node_gain_rows = _node_gain_rows(tokens, src_node_tokens, nodes, terms, stacked) if use_comm else None
    total = tokens.sum(axis=1, dtype=np.float64)  # [L, M]
    inv_total = np.where(total > 0, 1.0 / np.maximum(total, 1), 0.0).astype(np.float32)  # [L, M]
    # mu: mean node compute; mean received tokens when sources spread evenly
    node_norm = np.stack([np.maximum(total / nodes, 1.0), np.maximum(total * (nodes - 1) / nodes ** 2, 1.0)][:terms],
                         axis=1)  # [L, T, M]
    use_migration = prev_home is not None and migration_cost is not None and config.migration_weight > 0
    migration = np.asarray(migration_cost, dtype=np.float64) * config.migration_weight if use_migration else None
    layer_index = np.arange(layers)
    return _Problem(
        micro_batches=m, layers=layers, experts=experts, ep=ep, gpus_per_node=gpus_per_node, nodes=nodes,
        node_power=int(config.node_power), terms=terms, stacked=stacked,
        tokens=tokens, token_rows=tokens.reshape(layers * experts, m), node_gain_rows=node_gain_rows,
        two_over_total=2 * inv_total[:, None, :],
        score_scale=np.maximum(total.sum(axis=1) / ep, 1.0),
        node_norm=node_norm.astype(np.float32)[:, None], inv_node_norm=(1.0 / node_norm).astype(np.float32)[:, None],
        term_weight=np.array([1.0, comm_ratio][:terms], dtype=np.float32), gpu_weight=config.gpu_weight,
        migration_cost=migration,
        prev_gpu_rows=np.ravel(prev_home) if use_migration else None,
        prev_node_rows=np.ravel(prev_home // gpus_per_node) if use_migration else None,
        layer_index=layer_index, first_expert_row=layer_index[:, None] * experts,
        first_gpu_row=layer_index[:, None] * ep, first_node_row=layer_index[:, None] * nodes)


def _node_gain_rows(tokens: np.ndarray, src_node_tokens: np.ndarray, nodes: int, terms: int,
                    stacked: bool) -> np.ndarray:
    """What each expert adds to each node's terms when homed there: float32 [L * E * nodes, T * M]
    (stacked: its tokens, then those not from that node's ranks) or [L * E * nodes, M] (only the
    latter). tokens: float32 [L, E, M]; src_node_tokens: int [M, L, E, nodes]."""
    layers, experts, m = tokens.shape
    gain = np.empty((layers, experts, nodes, terms if stacked else 1, m), dtype=np.float32)
    if stacked:
        gain[:, :, :, 0] = tokens[:, :, None, :]
    src = np.asarray(src_node_tokens)
    for layer in range(layers):  # one layer at a time: the transposed reads stay in cache
        np.subtract(tokens[layer, :, None, :], src[:, layer].transpose(1, 2, 0), out=gain[layer, :, :, -1],
                    casting="unsafe")
    return gain.reshape(layers * experts * nodes, -1)


@dataclass(slots=True)
class _Placement:
    """A placement and its loads, changed in place by each accepted swap."""

    home: np.ndarray  # int64 [L, E] home GPU of each expert
    home_rows: np.ndarray  # int64 [L * E], a view of home
    gpu_tokens: np.ndarray  # float32 [L, ep, M] tokens per GPU
    gpu_rows: np.ndarray  # float32 [L * ep, M], a view of gpu_tokens
    node_load: np.ndarray  # float32 [L, nodes, T, M] each node's terms: compute, received tokens
    node_rows: np.ndarray  # float32 [L * nodes, T * M], a view of node_load


def _placement(problem: _Problem, home: np.ndarray) -> _Placement:
    """GPU tokens and node terms of home int64 [L, E], summed afresh (home is shared, not copied)."""
    m, layers, nodes, gpn = problem.micro_batches, problem.layers, problem.nodes, problem.gpus_per_node
    node_of = home // gpn
    node_load = np.empty((layers, nodes, problem.terms, m), dtype=np.float32)
    gpu_tokens = _group_sum(problem.tokens, home, problem.ep)
    node_load[:, :, 0] = gpu_tokens.reshape(layers, nodes, gpn, m).sum(axis=2)
    if problem.terms == 2:
        rows = ((problem.first_expert_row + np.arange(problem.experts)) * nodes + node_of).ravel()
        received = problem.node_gain_rows[rows, -m:].reshape(layers, problem.experts, m)
        node_load[:, :, 1] = _group_sum(received, node_of, nodes)
    return _Placement(home=home, home_rows=home.reshape(-1), gpu_tokens=gpu_tokens,
                      gpu_rows=gpu_tokens.reshape(layers * problem.ep, m), node_load=node_load,
                      node_rows=node_load.reshape(layers * nodes, problem.terms * m))


def _node_powers(problem: _Problem, node_load: np.ndarray) -> np.ndarray:
    """(node_load / mu) ** p: node_load float32 [..., L, nodes or K, T, M] -> the same shape."""
    powers = node_load * problem.inv_node_norm
    return _pow(powers, problem.node_power, out=powers)


def _smooth_max(problem: _Problem, power_sums: np.ndarray) -> np.ndarray:
    """The smooth-maximum part of the score, summed over terms and micro-batches: power_sums
    float32 [L, K, T, M] (sums over nodes of _node_powers) -> float32 [L, K]."""
    # a product with (power_sums > 0) instead of a maximum with 0 (several times faster): only the
    # sign of a zero differs, which changes no comparison downstream
    norm_pow = np.multiply(power_sums, power_sums > 0)
    norm_pow *= 1.0 / problem.nodes
    smooth = _root(norm_pow, problem.node_power, out=norm_pow)
    smooth *= problem.node_norm
    return (smooth.sum(axis=-1) * problem.term_weight).sum(axis=-1) / problem.gpus_per_node


def _migration_cost(problem: _Problem, expert_rows: np.ndarray, to_gpu: np.ndarray, to_node: np.ndarray
                    ) -> np.ndarray:
    """Cost of the experts at flat rows expert_rows [L, K] being homed on to_gpu (in node to_node)."""
    return np.where(to_node != problem.prev_node_rows[expert_rows], problem.migration_cost[1],
                    np.where(to_gpu != problem.prev_gpu_rows[expert_rows], problem.migration_cost[0], 0.0))


@dataclass(slots=True)
class _Swaps:
    """K random swaps per layer. Pair arrays are [2, L, K], side 0 the expert a on GPU p in node pn,
    side 1 the expert b on GPU q in node qn; the swap homes a on q and b on p."""

    experts: np.ndarray  # int [2, L, K] a, b
    gpus: np.ndarray  # int [2, L, K] p, q
    nodes: np.ndarray  # int [2, L, K] pn, qn
    node_rows: np.ndarray  # int [2, L, K] flat rows of nodes pn and qn in node_rows / powers
    gpu_gain: np.ndarray  # float32 [L, K, M] tokens GPU p gains (q loses): x_b - x_a
    delta: np.ndarray  # float32 [L, K] change of the GPU and migration terms
    new_node_load: np.ndarray  # float32 [2, L, K, T, M] terms of nodes pn and qn after the swap


def _draw_swaps(problem: _Problem, placement: _Placement, rng: np.random.Generator, k: int) -> _Swaps:
    """Draw k swaps per layer and score their GPU and migration terms; the node terms after each swap."""
    layers, m, nodes, terms = problem.layers, problem.micro_batches, problem.nodes, problem.terms
    experts = rng.integers(0, problem.experts, size=(2, layers, k))  # the same draws as a, then b, of shape [L, K]
    expert_rows = problem.first_expert_row + experts
    gpus = placement.home_rows[expert_rows]
    nodes_of = gpus // problem.gpus_per_node
    node_rows = problem.first_node_row + nodes_of
    if problem.stacked:  # what nodes pn and qn gain, both terms: [2, L, K, T * M]
        node_gain = problem.node_gain_rows.take(expert_rows[::-1] * nodes + nodes_of, axis=0, mode="clip")
        node_gain -= problem.node_gain_rows.take(expert_rows * nodes + nodes_of, axis=0, mode="clip")
        gpu_gain = node_gain[0, :, :, :m]
    else:
        swapped_tokens = problem.token_rows.take(expert_rows, axis=0, mode="clip")  # [2, L, K, M]: x_a, x_b
        token_gain = swapped_tokens[::-1] - swapped_tokens  # [2, L, K, M]: x_b - x_a, x_a - x_b
        gpu_gain = token_gain[0]
    # the GPU term sum_m sum_g G^2 / tokens changes by sum_m ((G_p + d)^2 + (G_q - d)^2 - G_p^2 - G_q^2)
    # / tokens = sum_m 2 d (G_p - G_q + d) / tokens
    gpu_pq = placement.gpu_rows.take(problem.first_gpu_row + gpus, axis=0, mode="clip")  # [2, L, K, M]
    gpu_term = gpu_pq[0] - gpu_pq[1]
    gpu_term += gpu_gain
    gpu_term *= gpu_gain
    gpu_term *= problem.two_over_total  # (t d) (2 / tokens) rounds as (2 t d) (1 / tokens): doubling is exact
    delta = problem.gpu_weight * gpu_term.sum(axis=2)
    if problem.migration_cost is not None:
        (row_a, row_b), (p, q), (pn, qn) = expert_rows, gpus, nodes_of
        delta += (_migration_cost(problem, row_a, q, qn) - _migration_cost(problem, row_a, p, pn)
                  + _migration_cost(problem, row_b, p, pn) - _migration_cost(problem, row_b, q, qn))
    new_node_load = placement.node_rows.take(node_rows, axis=0, mode="clip")
    if problem.stacked:
        new_node_load += node_gain
    else:
        new_node_load = new_node_load.reshape(2, layers, k, terms, m)
        new_node_load[:, :, :, 0] += token_gain
        if terms == 2:  # received tokens: rows (b, pn), (a, pn), (a, qn), (b, qn) of the gain table
            (row_a, row_b), (pn, qn) = expert_rows, nodes_of
            received = problem.node_gain_rows.take(
                np.stack([row_b * nodes + pn, row_a * nodes + pn, row_a * nodes + qn, row_b * nodes + qn]),
                axis=0, mode="clip").reshape(2, 2, layers, k, m)
            new_node_load[:, :, :, 1] += received[:, 0] - received[:, 1]
    return _Swaps(experts=experts, gpus=gpus, nodes=nodes_of, node_rows=node_rows, gpu_gain=gpu_gain, delta=delta,
                  new_node_load=new_node_load.reshape(2, layers, k, terms, m))


def _make_swaps(placement: _Placement, swaps: _Swaps, layer: np.ndarray, pick: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Make swap pick[i] of layer layer[i] (one per layer at most) on placement.

    Returns the swaps across nodes, as (their layers, their picks), and the flat rows of the node
    terms they changed (nodes pn of every such swap, then nodes qn)."""
    layers, experts = placement.home.shape
    ep = placement.gpu_tokens.shape[1]
    a, b = swaps.experts[:, layer, pick]
    p, q = swaps.gpus[:, layer, pick]
    gain = swaps.gpu_gain[layer, pick]  # [n, M]
    placement.gpu_rows[layer * ep + p] += gain
    placement.gpu_rows[layer * ep + q] -= gain
    across = swaps.nodes[0, layer, pick] != swaps.nodes[1, layer, pick]
    across_layer, across_pick = layer[across], pick[across]
    changed = swaps.node_rows[:, across_layer, across_pick].reshape(-1)
    k = swaps.experts.shape[2]
    new_rows = swaps.new_node_load.reshape(2, layers, k, -1)[:, across_layer, across_pick]
    placement.node_rows[changed] = new_rows.reshape(-1, new_rows.shape[-1])
    placement.home_rows[layer * experts + a] = q
    placement.home_rows[layer * experts + b] = p
    return across_layer, across_pick, changed


# ---- the two phases --------------------------------------------------------------------------------
def _anneal(problem: _Problem, placement: _Placement, config: AnnealConfig, rng: np.random.Generator,
            check_state: bool, observe: Callable[[AnnealStep], None] | None = None) -> tuple[int, float]:
    """Simulated annealing on the smooth score, swaps made on placement in place.

    Each iteration draws `candidates` swaps per layer and scores them incrementally: a swap changes
    the power sums over nodes only through its two nodes. Per layer the best swap is taken when it
    lowers the score, else with probability exp(-increase / temperature).
    Returns (accepted swaps, largest relative error of the kept state (check_state; else 0))."""
    layers, k, tm = problem.layers, config.candidates, problem.terms * problem.micro_batches
    powers = _node_powers(problem, placement.node_load)  # [L, nodes, T, M]
    power_rows = powers.reshape(layers * problem.nodes, tm)
    power_sums = powers.sum(axis=1)  # [L, T, M]
    smooth = _smooth_max(problem, power_sums[:, None])[:, 0]  # [L] each layer's smooth node term now
    iterations = config.iterations
    temperatures = config.initial_temperature * (config.final_temperature / config.initial_temperature) ** (
        np.arange(iterations) / max(iterations - 1, 1))
    accepted, worst = 0, 0.0
    for it in range(iterations):
        swaps = _draw_swaps(problem, placement, rng, k)
        new_powers = _node_powers(problem, swaps.new_node_load)  # [2, L, K, T, M]
        change = power_rows.take(swaps.node_rows, axis=0, mode="clip").reshape(new_powers.shape)
        np.subtract(new_powers, change, out=change)
        change = change[0] + change[1]  # [L, K, T, M]
        inside = np.flatnonzero(swaps.nodes[0] == swaps.nodes[1])
        if len(inside):  # a swap inside a node leaves the node terms as they are
            change.reshape(layers * k, tm)[inside] = 0.0
        new_sums = change
        new_sums += power_sums[:, None]  # [L, K, T, M]
        new_smooth = _smooth_max(problem, new_sums)  # [L, K]
        delta = swaps.delta
        delta += new_smooth - smooth[:, None]
        delta = np.where(swaps.gpus[0] != swaps.gpus[1], delta / problem.score_scale[:, None], np.inf)
        best = np.argmin(delta, axis=1)
        best_delta = delta[problem.layer_index, best]
        take = best_delta < 0
        uphill = np.isfinite(best_delta) & ~take
        take[uphill] = rng.random(int(uphill.sum())) < np.exp(-best_delta[uphill] / temperatures[it])
        if observe is not None:
            observe(AnnealStep("anneal", it, swaps.experts, delta, best, take.copy()))
        if not take.any():
            continue
        layer, pick = problem.layer_index[take], best[take]
        across_layer, across_pick, changed = _make_swaps(placement, swaps, layer, pick)
        power_rows[changed] = new_powers.reshape(2, layers, k, tm)[:, across_layer, across_pick].reshape(-1, tm)
        power_sums[across_layer] = new_sums[across_layer, across_pick]
        smooth[across_layer] = new_smooth[across_layer, across_pick]
        accepted += len(layer)
        if check_state:
            fresh = _placement(problem, placement.home)
            fresh_sums = _node_powers(problem, fresh.node_load).sum(axis=1)
            worst = max(worst, _rel_error(placement.gpu_tokens, fresh.gpu_tokens),
                        _rel_error(placement.node_load, fresh.node_load), _rel_error(power_sums, fresh_sums),
                        _rel_error(smooth, _smooth_max(problem, fresh_sums[:, None])[:, 0]))
    return accepted, worst


def _polish(problem: _Problem, placement: _Placement, config: AnnealConfig, rng: np.random.Generator,
            check_state: bool, observe: Callable[[AnnealStep], None] | None = None) -> tuple[int, float]:
    """Greedy descent on the exact score: the summed maxima over nodes (no smoothing), with the same
    GPU and migration terms; a swap is taken when it lowers the score by more than 1e-9.

    A swap changes the maximum over nodes through its two nodes and the largest of the others: with
    up to 6 nodes those are gathered (_complements), else kept as each (layer, term, m)'s three
    largest nodes (_top3). Returns (accepted swaps, largest relative error of the kept state)."""
    node_max = placement.node_load.max(axis=1)  # [L, T, M]
    complement = _complements(problem.nodes) if problem.nodes <= 6 else None  # [nodes, nodes, nodes - 2]
    top = _top3(placement.node_load) if complement is None else None  # values, nodes [L, 3, T, M]
    polished, worst = 0, 0.0
    for it in range(config.polish_iterations):
        swaps = _draw_swaps(problem, placement, rng, config.candidates)
        others = _largest_other_node(problem, placement, swaps, complement, top)  # [L, K, T, M]
        new_max = np.maximum(others, np.maximum(swaps.new_node_load[0], swaps.new_node_load[1]))  # [L, K, T, M]
        node_delta = (new_max - node_max[:, None]).sum(axis=3)  # [L, K, T]
        node_delta = (node_delta * problem.term_weight).sum(axis=2) / problem.gpus_per_node
        delta = swaps.delta
        delta += np.where(swaps.nodes[0] != swaps.nodes[1], node_delta, 0.0)
        delta = np.where(swaps.gpus[0] != swaps.gpus[1], delta / problem.score_scale[:, None], np.inf)
        best = np.argmin(delta, axis=1)
        take = delta[problem.layer_index, best] < -1e-9
        if observe is not None:
            observe(AnnealStep("polish", it, swaps.experts, delta, best, take.copy()))
        if not take.any():
            continue
        layer, pick = problem.layer_index[take], best[take]
        across_layer, across_pick, _ = _make_swaps(placement, swaps, layer, pick)
        node_max[across_layer] = new_max[across_layer, across_pick]
        if top is not None:
            top[0][across_layer], top[1][across_layer] = _top3(placement.node_load[across_layer])
        polished += len(layer)
        if check_state:
            fresh = _placement(problem, placement.home)
            fresh_max = fresh.node_load.max(axis=1)
            worst = max(worst, _rel_error(placement.gpu_tokens, fresh.gpu_tokens),
                        _rel_error(placement.node_load, fresh.node_load), _rel_error(node_max, fresh_max),
                        _rel_error(top[0][:, 0], fresh_max) if top is not None else 0.0)
    return polished, worst


def _largest_other_node(problem: _Problem, placement: _Placement, swaps: _Swaps, complement: np.ndarray | None,
                        top: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Per swap, each term's largest node other than pn and qn: float32 [L, K, T, M] (node terms are
    >= 0: with no node left, 0). complement: _complements(nodes), or top: _top3 of the node terms."""
    pn, qn = swaps.nodes
    layers, k = pn.shape
    if complement is not None:  # few nodes: the maximum over the others, gathered
        others = np.zeros((layers, k, problem.terms * problem.micro_batches), dtype=np.float32)
        for j in range(complement.shape[2]):
            other_rows = problem.first_node_row + complement[pn, qn, j]
            np.maximum(others, placement.node_rows.take(other_rows, axis=0, mode="clip"), out=others)
        return others.reshape(layers, k, problem.terms, problem.micro_batches)
    # the largest of the three largest nodes that is neither (one left out counts as 0)
    top_load, top_node = top
    pn, qn = pn.astype(top_node.dtype)[:, :, None, None], qn.astype(top_node.dtype)[:, :, None, None]
    others = None
    for j in range(3):
        node = top_node[:, None, j]
        load = top_load[:, None, j] * ((node != pn) & (node != qn))
        others = load if others is None else np.maximum(others, load, out=others)
    return others


# ---- the annealer ----------------------------------------------------------------------------------
def anneal_homes(expert_tokens: np.ndarray, src_node_tokens: np.ndarray, init_home: np.ndarray, ep: int,
                 gpus_per_node: int, config: AnnealConfig, rng: np.random.Generator, comm_ratio: float = 0.0,
                 migration_cost: np.ndarray | None = None, prev_home: np.ndarray | None = None,
                 check_state: bool = False, observe: Callable[[AnnealStep], None] | None = None
                 ) -> tuple[np.ndarray, AnnealStats]:
    """Swap-based simulated annealing over home placements, all layers at once.

    expert_tokens: int [M, L, E] tokens per expert per micro-batch.
    src_node_tokens: int [M, L, E, nodes] of those, the tokens coming from each node's ranks.
    init_home: int [L, E] or [starts, L, E] starting placements (equal homes per GPU; swaps keep it
        so); each layer starts from the one that scores best.
    comm_ratio: compute tokens one cross-node token costs (0 = ignore communication).
    migration_cost: float [2] cost of moving one expert inside a node / across nodes, in the same
        unit (used only with prev_home).
    check_state: after every accepted iteration, compare the incrementally kept state (GPU loads,
        node compute and received tokens, their power sums and maxima) with a full recomputation
        from the placement; the largest relative difference is AnnealStats.state_check_max_rel_error
        (slow: for tests).
    observe: called with an AnnealStep after every iteration of both phases (for tests).
    Returns (home int64 [L, E], AnnealStats: the mean score before and after, the accepted swaps).

    The score of a layer is objective.layer_scores (node_power p, comm_ratio r, gpu_weight); every
    term decomposes over nodes and GPUs, so a swap is scored incrementally: it touches two GPUs and at
    most two nodes. 1. Each layer starts from its best start. 2. Annealing on the smooth score
    (_anneal). 3. Greedy descent on the exact maxima (_polish). reorder_reference.anneal_homes_reference
    is this search one swap at a time, with the whole objective recomputed per candidate in float64.
    The draws are the same and the kept sums of whole token counts exact, but the smooth node term
    is float32 here: every score change agrees with the reference's within float32 rounding, and a
    Metropolis draw or a near tie inside that rounding can go the other way
    (tests/test_planner_reference.py replays every iteration against the reference).
    """
    layers, experts = expert_tokens.shape[1:]
    problem = _problem(expert_tokens, src_node_tokens, ep, gpus_per_node, config, float(comm_ratio),
                       migration_cost, prev_home)

    def score(home: np.ndarray) -> np.ndarray:  # the objective itself, recomputed: float64 [L]
        return layer_scores(expert_tokens, src_node_tokens, home, ep, gpus_per_node, problem.node_power,
                            float(comm_ratio), config.gpu_weight, problem.migration_cost, prev_home)

    starts = np.asarray(init_home, dtype=np.int64).reshape(-1, layers, experts)
    start_scores = np.stack([score(h) for h in starts])  # [starts, L]
    home = starts[np.argmin(start_scores, axis=0), problem.layer_index].copy()
    accepted, anneal_error = _anneal(problem, _placement(problem, home), config, rng, check_state, observe)
    polished, polish_error = _polish(problem, _placement(problem, home), config, rng, check_state, observe)
    return home, AnnealStats(score_before=float(start_scores.min(axis=0).mean()), score_after=float(score(home).mean()),
                             accepted_swaps=int(accepted), polish_accepted_swaps=int(polished),
                             state_check_max_rel_error=max(anneal_error, polish_error) if check_state else None)


def equal_homes(home: np.ndarray, ep: int) -> bool:
    """Every GPU homes experts / ep experts in every layer (home int [L, E])."""
    home = np.asarray(home)
    if home.shape[1] % ep or ((home < 0) | (home >= ep)).any():
        return False
    return bool((homes_per_gpu(home, ep) == home.shape[1] // ep).all())


def cost_ratios(shape: ModelShape, topology: Topology, ep: int) -> tuple[float, np.ndarray]:
    """(r_comm, r_mig [intra-node, inter-node]) in GPU compute tokens, from model shape and cluster.

    A token costs shape.expert_train_flops_per_token of expert compute (forward and backward). A
    cross-node token moves 4 hidden states over RDMA (dispatch and combine, forward and backward).
    Moving an expert costs shape.expert_state_bytes (weights, optimizer state sharded over the
    topology's data-parallel ranks, as the cost model charges it) over RDMA (across nodes) or NVLink
    (inside a node), spread over the ep GPUs that migrate in parallel. FLOPs, bytes and rates come
    from relibra.cluster, the definitions the cost model uses too.
    """
    token_seconds = shape.expert_train_flops_per_token / topology.matmul_flops_per_s
    comm = 4.0 * shape.token_bytes / topology.rdma_bytes_per_s / token_seconds
    state_bytes = shape.expert_state_bytes(topology.dp_size(ep))
    mig = np.array([state_bytes / topology.nvlink_bytes_per_s, state_bytes / topology.rdma_bytes_per_s])
    return comm, mig / token_seconds / ep
