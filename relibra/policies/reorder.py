"""ReLibra's inter-batch reordering: where every expert is homed for one step.

See relibra/policies/relibra.py for the score and the search, and docs/policies.md for the choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relibra.cluster import ModelShape, Topology


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


@dataclass
class AnnealConfig:
    """Simulated-annealing knobs (see the module docstring for the score)."""

    iterations: int = 1000
    candidates: int = 8  # swaps scored per layer per iteration
    initial_temperature: float = 1e-4  # relative to the layer's summed mean GPU load
    final_temperature: float = 1e-7
    node_power: int = 8  # p of the smooth max over nodes (2 = load-weighted mean, larger = closer to max)
    polish_iterations: int = 300  # greedy descent on the exact max after annealing
    gpu_weight: float = 0.1
    comm_weight: float = 0.1  # times r_comm
    migration_weight: float = 1.0  # times r_mig


def _pow(y: np.ndarray, p: int) -> np.ndarray:
    """y ** p for a positive integer p, by repeated multiplication (faster than np.power)."""
    out = None
    base = y
    while p:
        if p & 1:
            out = base if out is None else out * base
        p >>= 1
        if p:
            base = base * base
    return out


def _root(y: np.ndarray, p: int) -> np.ndarray:
    """y ** (1 / p): repeated square roots when p is a power of two (much faster than np.power)."""
    if p & (p - 1) == 0:
        while p > 1:
            y = np.sqrt(y)
            p >>= 1
        return y
    return np.power(y, 1.0 / p)


def anneal_homes(expert_tokens: np.ndarray, src_node_tokens: np.ndarray, init_home: np.ndarray, ep: int,
                 gpus_per_node: int, config: AnnealConfig, rng: np.random.Generator, comm_ratio: float = 0.0,
                 migration_cost: np.ndarray | None = None, prev_home: np.ndarray | None = None,
                 check_state: bool = False) -> tuple[np.ndarray, dict]:
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
        from the placement; the largest relative difference is info["state_check_max_rel_error"]
        (slow: for tests).
    Returns (home int64 [L, E], info with the mean relative score before and after).

    Score of a layer, in per-GPU compute tokens summed over micro-batches m. Expert compute and the
    dispatch that feeds it are separate phases, one after the other, each as slow as its busiest
    node, so the score is a sum of two maxima over nodes, each a p-norm smooth max:
        sum_m [ smax_n C[m,n] + r smax_n R[m,n] ] / gpn  +  w_gpu sum_m sum_g G[m,g]^2 / T[m]  +  migration
    C[m,n]: tokens of the experts homed in node n (its compute); R[m,n]: of those, the tokens coming
    from other nodes' ranks (what it receives over RDMA); smax_n y = mu (mean_n (y / mu)^p)^(1/p)
    with mu a placement-independent normaliser (the mean over nodes when sources spread evenly); G
    the GPU loads and T the layer's tokens. Every term decomposes over nodes and GPUs, so a swap
    is scored incrementally: it touches two GPUs and at most two nodes. After annealing,
    `polish_iterations` of greedy descent use the exact maxima.

    Node state is kept as one array Y [L, terms, nodes, M] (terms: C, and R when r > 0) so that
    both terms move through the same few numpy calls.
    """
    m, layers, experts = expert_tokens.shape
    nodes = ep // gpus_per_node
    gpn = gpus_per_node
    p_node = int(config.node_power)
    r = float(comm_ratio)
    use_comm = r > 0 and nodes > 1
    terms = 2 if use_comm else 1
    # float32 halves the memory traffic of the gathers (integers stay exact up to 2^24 tokens per node)
    x = np.ascontiguousarray(expert_tokens.transpose(1, 2, 0), dtype=np.float32)  # [L, E, M]
    # what expert e adds to each term of node n if homed there: [L, E, nodes, terms, M]
    contrib = np.empty((layers, experts, nodes, terms, m), dtype=np.float32)
    contrib[:, :, :, 0, :] = x[:, :, None, :]
    if use_comm:
        contrib[:, :, :, 1, :] = x[:, :, None, :] - src_node_tokens.transpose(1, 2, 3, 0)
    total = x.sum(axis=1, dtype=np.float64)  # [L, M]
    inv_total = np.where(total > 0, 1.0 / np.maximum(total, 1), 0.0).astype(np.float32)  # [L, M]
    scale = np.maximum(total.sum(axis=1) / ep, 1.0)  # [L] sum over m of the mean GPU load
    lidx = np.arange(layers)
    li2 = lidx[:, None]
    # placement-free normalisers: mean node compute, mean received when sources spread evenly
    mu = np.stack([np.maximum(total / nodes, 1.0), np.maximum(total * (nodes - 1) / nodes ** 2, 1.0)][:terms],
                  axis=1)  # [L, terms, M]
    inv_mu = (1.0 / mu).astype(np.float32)
    mu32 = mu.astype(np.float32)
    weight = np.array([1.0, r][:terms], dtype=np.float32)  # of each term
    w_gpu = config.gpu_weight
    use_mig = prev_home is not None and migration_cost is not None and config.migration_weight > 0
    if use_mig:
        mig = np.asarray(migration_cost, dtype=np.float64) * config.migration_weight
        prev_node = prev_home // gpn

    def smax(ps, mu_rows):  # power sums [..., terms, M] -> weighted smooth maxima summed over m: [...]
        per_term = (mu_rows * _root(np.maximum(ps, 0.0) * (1.0 / nodes), p_node)).sum(axis=-1)
        return (per_term * weight).sum(axis=-1) / gpn

    def migration(h):
        if not use_mig:
            return 0.0
        return (mig[0] * ((h != prev_home) & (h // gpn == prev_node)) + mig[1] * (h // gpn != prev_node)).sum(axis=1)

    def moved(e, to_gpu, to_node):  # migration cost of expert ids e [L, K] landing on to_gpu
        return np.where(to_node != prev_node[li2, e], mig[1], np.where(to_gpu != prev_home[li2, e], mig[0], 0.0))

    def state(h):
        """GPU loads [L, ep, M] and node state Y [L, nodes, terms, M] of placement h."""
        onehot = (h[:, :, None] == np.arange(ep)).astype(np.float32)  # [L, E, ep]
        gl = np.einsum("lem,leg->lgm", x, onehot)
        node_of = h // gpn
        y = np.zeros((layers, nodes, terms, m), dtype=np.float32)
        for n in range(nodes):
            y[:, n] = (contrib[:, :, n] * (node_of == n)[:, :, None, None]).sum(axis=1)
        return gl, y

    def powers(y):  # (y / mu)^p: [L, nodes, terms, M]
        return _pow(y * inv_mu[:, None], p_node)

    def score(h):
        gl, y = state(h)
        gpu_term = ((gl.astype(np.float64) ** 2).sum(axis=1) * inv_total).sum(axis=1)
        return (smax(powers(y).sum(axis=1, dtype=np.float64), mu) + w_gpu * gpu_term + migration(h)) / scale

    def candidates():
        a = rng.integers(0, experts, size=(layers, k))
        b = rng.integers(0, experts, size=(layers, k))
        p, q = home[li2, a], home[li2, b]
        pn, qn = p // gpn, q // gpn
        d = x[li2, b] - x[li2, a]  # [L, K, M] tokens GPU p gains (q loses)
        delta = w_gpu * ((2 * d * (g_load[li2, p] - g_load[li2, q] + d)) * inv_t).sum(axis=2)
        if use_mig:
            delta += moved(a, q, qn) - moved(a, p, pn) + moved(b, p, pn) - moved(b, q, qn)
        # new state of nodes pn and qn, both stacked on axis 1: [L, 2K, terms, M]
        g = contrib[li2, np.concatenate([b, a], axis=1), np.concatenate([pn, qn], axis=1)] \
            - contrib[li2, np.concatenate([a, b], axis=1), np.concatenate([pn, qn], axis=1)]
        both = np.concatenate([pn, qn], axis=1)
        new_y = y_node[li2, both] + g
        return a, b, p, q, pn, qn, both, d, delta, new_y

    def apply(la, kb, a, b, p, q, pn, qn, d, new_y):
        """Make the chosen swaps (layers la, candidates kb); returns the cross-node ones (lc, kc)."""
        ba, bb, bp, bq = a[la, kb], b[la, kb], p[la, kb], q[la, kb]
        bd = d[la, kb]  # [n, M]
        g_load[la, bp] += bd
        g_load[la, bq] -= bd
        cn = pn[la, kb] != qn[la, kb]
        lc, kc = la[cn], kb[cn]
        y_node[lc, pn[lc, kc]] = new_y[lc, kc]
        y_node[lc, qn[lc, kc]] = new_y[lc, k + kc]
        home[la, ba] = bq
        home[la, bb] = bp
        return lc, kc

    # start, per layer, from the best-scoring of the given placements
    starts = np.asarray(init_home, dtype=np.int64).reshape(-1, layers, experts)
    scores = np.stack([score(h) for h in starts])  # [starts, L]
    home = starts[np.argmin(scores, axis=0), lidx].copy()
    before = scores.min(axis=0)
    g_load, y_node = state(home)
    pw = powers(y_node)  # [L, nodes, terms, M]
    ps = pw.sum(axis=1)  # [L, terms, M]
    current = smax(ps, mu32)  # [L]
    k = config.candidates
    iters = config.iterations
    temps = config.initial_temperature * (config.final_temperature / config.initial_temperature) ** (
        np.arange(iters) / max(iters - 1, 1))
    inv_t = inv_total[:, None, :]  # [L, 1, M]
    inv_mu4 = inv_mu[:, None]  # [L, 1, terms, M]
    accepted = 0
    worst = 0.0  # check_state: largest relative difference between kept and recomputed state
    for it in range(iters):
        a, b, p, q, pn, qn, both, d, delta, new_y = candidates()
        new_pw = _pow(new_y * inv_mu4, p_node)  # [L, 2K, terms, M]
        change = new_pw - pw[li2, both]
        cross = (pn != qn)[:, :, None, None]
        new_ps = ps[:, None] + np.where(cross, change[:, :k] + change[:, k:], 0.0)  # [L, K, terms, M]
        new_node = smax(new_ps, mu32[:, None])  # [L, K]
        delta += new_node - current[:, None]
        delta = np.where(p != q, delta / scale[:, None], np.inf)
        best = np.argmin(delta, axis=1)
        best_delta = delta[lidx, best]
        take = best_delta < 0
        warm = np.isfinite(best_delta) & ~take
        take[warm] = rng.random(int(warm.sum())) < np.exp(-best_delta[warm] / temps[it])
        if not take.any():
            continue
        la, kb = lidx[take], best[take]
        lc, kc = apply(la, kb, a, b, p, q, pn, qn, d, new_y)
        pw[lc, pn[lc, kc]] = new_pw[lc, kc]
        pw[lc, qn[lc, kc]] = new_pw[lc, k + kc]
        ps[lc] = new_ps[lc, kc]
        current[lc] = new_node[lc, kc]
        accepted += len(la)
        if check_state:
            gl, yy = state(home)
            fresh = powers(yy).sum(axis=1)
            worst = max(worst, _rel_error(g_load, gl), _rel_error(y_node, yy), _rel_error(ps, fresh),
                        _rel_error(current, smax(fresh, mu32)))
    # Polish: greedy descent on the exact objective, the summed maxima over nodes (no smoothing),
    # with the same GPU and migration terms. Swaps inside a node leave the node maxima unchanged.
    g_load, y_node = state(home)
    node_max = y_node.max(axis=1)  # [L, terms, M]
    kk = np.arange(k)[None, :]
    polished = 0
    for it in range(config.polish_iterations):
        a, b, p, q, pn, qn, both, d, delta, new_y = candidates()
        others = y_node[:, None].repeat(k, axis=1)  # [L, K, nodes, terms, M]
        others[li2, kk, pn] = -np.inf
        others[li2, kk, qn] = -np.inf
        new_max = np.maximum(others.max(axis=2), np.maximum(new_y[:, :k], new_y[:, k:]))  # [L, K, terms, M]
        node_delta = ((new_max - node_max[:, None]).sum(axis=3) * weight).sum(axis=2) / gpn
        delta += np.where(pn != qn, node_delta, 0.0)
        delta = np.where(p != q, delta / scale[:, None], np.inf)
        best = np.argmin(delta, axis=1)
        take = delta[lidx, best] < -1e-9
        if not take.any():
            continue
        la, kb = lidx[take], best[take]
        lc, kc = apply(la, kb, a, b, p, q, pn, qn, d, new_y)
        node_max[lc] = new_max[lc, kc]
        polished += len(la)
        if check_state:
            gl, yy = state(home)
            worst = max(worst, _rel_error(g_load, gl), _rel_error(y_node, yy), _rel_error(node_max, yy.max(axis=1)))
    after = score(home)
    info = {"anneal_score_before": float(before.mean()), "anneal_score_after": float(after.mean()),
            "anneal_accepted_swaps": int(accepted), "polish_accepted_swaps": int(polished)}
    if check_state:
        info["state_check_max_rel_error"] = float(worst)
    return home, info


def _rel_error(kept: np.ndarray, fresh: np.ndarray) -> float:
    """Largest |kept - fresh| / max(|fresh|, 1) over all entries."""
    kept, fresh = np.asarray(kept, dtype=np.float64), np.asarray(fresh, dtype=np.float64)
    return float((np.abs(kept - fresh) / np.maximum(np.abs(fresh), 1.0)).max()) if fresh.size else 0.0


def equal_homes(home: np.ndarray, ep: int) -> bool:
    per_gpu = home.shape[1] // ep
    return all((np.bincount(h, minlength=ep) == per_gpu).all() for h in home)


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
