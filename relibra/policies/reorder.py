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
                 migration_cost: np.ndarray | None = None, prev_home: np.ndarray | None = None
                 ) -> tuple[np.ndarray, dict]:
    """Swap-based simulated annealing over home placements, all layers at once.

    expert_tokens: int [M, L, E] tokens per expert per micro-batch.
    src_node_tokens: int [M, L, E, nodes] of those, the tokens coming from each node's ranks.
    init_home: int [L, E] or [starts, L, E] starting placements (equal homes per GPU; swaps keep it
        so); each layer starts from the one that scores best.
    comm_ratio: compute tokens one cross-node token costs (0 = ignore communication).
    migration_cost: float [2] cost of moving one expert inside a node / across nodes, in the same
        unit (used only with prev_home).
    Returns (home int64 [L, E], info with the mean relative score before and after).

    Score of a layer (per-GPU compute tokens, summed over micro-batches m):
        sum_m mu[m] * (mean_n (W[m,n] / mu[m])^p)^(1/p) / gpn  +  w_gpu * sum_m sum_g G[m,g]^2 / T[m]
    with W[m,n] = sum over experts homed in node n of (1 + r) x[m,e] - r s[m,e,n] (compute plus
    r x the tokens arriving from other nodes), mu[m] the mean of W over nodes when sources are
    spread evenly (a fixed normaliser), G the GPU loads and T the layer's tokens. The first term is
    a p-norm smooth max over nodes; both are updated incrementally: a swap touches two GPUs and at
    most two nodes. After annealing, `polish_iterations` of greedy descent use the exact max.
    """
    m, layers, experts = expert_tokens.shape
    nodes = ep // gpus_per_node
    gpn = gpus_per_node
    p_node = int(config.node_power)
    r = float(comm_ratio)
    # float32 halves the memory traffic of the gathers (integers stay exact up to 2^24 tokens per node)
    x = np.ascontiguousarray(expert_tokens.transpose(1, 2, 0), dtype=np.float32)  # [L, E, M]
    # per-node cost of each expert: its compute plus r x its tokens from other nodes
    w = ((1.0 + r) * x[:, :, None, :]
         - r * src_node_tokens.transpose(1, 2, 3, 0).astype(np.float32)).astype(np.float32)  # [L, E, nodes, M]
    total = x.sum(axis=1, dtype=np.float64)  # [L, M]
    inv_total = np.where(total > 0, 1.0 / np.maximum(total, 1), 0.0).astype(np.float32)  # [L, M]
    scale = np.maximum(total.sum(axis=1) / ep, 1.0)  # [L] sum over m of the mean GPU load
    lidx = np.arange(layers)
    li2 = lidx[:, None]
    # placement-independent normaliser: the mean node cost when every expert's sources are spread evenly
    mu = np.maximum(total / nodes * (1.0 + r * (nodes - 1) / nodes), 1.0)  # [L, M]
    inv_mu = (1.0 / mu).astype(np.float32)
    mu32 = mu.astype(np.float32)
    w_gpu = config.gpu_weight
    use_mig = prev_home is not None and migration_cost is not None and config.migration_weight > 0
    if use_mig:
        mig = np.asarray(migration_cost, dtype=np.float64) * config.migration_weight
        prev_node = prev_home // gpn

    def smooth_max(ps, mu_rows):  # power sums [..., M] -> smooth max summed over m, per-GPU units
        return (mu_rows * _root(np.maximum(ps, 0.0) * (1.0 / nodes), p_node)).sum(axis=-1) / gpn

    def migration(h):
        if not use_mig:
            return 0.0
        return (mig[0] * ((h != prev_home) & (h // gpn == prev_node)) + mig[1] * (h // gpn != prev_node)).sum(axis=1)

    def moved(e, to_gpu, to_node):  # migration cost of expert ids e [L, K] landing on to_gpu
        return np.where(to_node != prev_node[li2, e], mig[1], np.where(to_gpu != prev_home[li2, e], mig[0], 0.0))

    def state(h):  # (GPU loads [L, ep, M], node costs [L, nodes, M], power sums [L, M]) of placement h
        onehot = (h[:, :, None] == np.arange(ep)).astype(np.float32)  # [L, E, ep]
        gl = np.einsum("lem,leg->lgm", x, onehot)
        node_of_expert = h // gpn
        nc = np.zeros((layers, nodes, m), dtype=np.float32)
        for n in range(nodes):
            nc[:, n] = (w[:, :, n, :] * (node_of_expert == n)[:, :, None]).sum(axis=1)
        return gl, nc, _pow(nc * inv_mu[:, None, :], p_node).sum(axis=1)

    def score(h, gl, ps):
        gpu_term = ((gl.astype(np.float64) ** 2).sum(axis=1) * inv_total).sum(axis=1)
        return (smooth_max(ps.astype(np.float64), mu) + w_gpu * gpu_term + migration(h)) / scale

    # start, per layer, from the best-scoring of the given placements
    starts = np.asarray(init_home, dtype=np.int64).reshape(-1, layers, experts)
    scores = np.stack([score(h, st[0], st[2]) for h in starts for st in [state(h)]])  # [starts, L]
    home = starts[np.argmin(scores, axis=0), lidx].copy()
    g_load, n_cost, power_sum = state(home)
    before = score(home, g_load, power_sum)
    current_node = smooth_max(power_sum, mu32)  # [L]
    k = config.candidates
    iters = config.iterations
    temps = config.initial_temperature * (config.final_temperature / config.initial_temperature) ** (
        np.arange(iters) / max(iters - 1, 1))
    inv_t = inv_total[:, None, :]  # [L, 1, M]
    inv_mu3 = inv_mu[:, None, :]
    accepted = 0
    for it in range(iters):
        a = rng.integers(0, experts, size=(layers, k))
        b = rng.integers(0, experts, size=(layers, k))
        p = home[li2, a]
        q = home[li2, b]
        pn, qn = p // gpn, q // gpn
        d = x[li2, b] - x[li2, a]  # [L, K, M] tokens GPU p gains (q loses)
        delta = w_gpu * ((2 * d * (g_load[li2, p] - g_load[li2, q] + d)) * inv_t).sum(axis=2)
        # node term: W[pn] += w[b, pn] - w[a, pn], W[qn] += w[a, qn] - w[b, qn] (no change inside a node)
        cross_node = pn != qn
        wp_old = n_cost[li2, pn]
        wq_old = n_cost[li2, qn]
        wp_new = wp_old + w[li2, b, pn] - w[li2, a, pn]
        wq_new = wq_old + w[li2, a, qn] - w[li2, b, qn]
        new_ps = (power_sum[:, None, :] + _pow(wp_new * inv_mu3, p_node) - _pow(wp_old * inv_mu3, p_node)
                  + _pow(wq_new * inv_mu3, p_node) - _pow(wq_old * inv_mu3, p_node))
        node_delta = smooth_max(np.where(cross_node[:, :, None], new_ps, power_sum[:, None, :]),
                                mu32[:, None, :]) - current_node[:, None]
        delta += node_delta
        if use_mig:
            delta += moved(a, q, qn) - moved(a, p, pn) + moved(b, p, pn) - moved(b, q, qn)
        delta = np.where(p != q, delta / scale[:, None], np.inf)
        best = np.argmin(delta, axis=1)
        best_delta = delta[lidx, best]
        take = best_delta < 0
        warm = np.isfinite(best_delta) & ~take
        take[warm] = rng.random(int(warm.sum())) < np.exp(-best_delta[warm] / temps[it])
        if not take.any():
            continue
        la = lidx[take]
        kb = best[take]
        ba, bb = a[la, kb], b[la, kb]
        bp, bq = p[la, kb], q[la, kb]
        bd = d[la, kb]  # [n, M]
        g_load[la, bp] += bd
        g_load[la, bq] -= bd
        moved_nodes = cross_node[la, kb]
        if moved_nodes.any():
            lc, kc = la[moved_nodes], kb[moved_nodes]
            n_cost[lc, pn[lc, kc]] = wp_new[lc, kc]
            n_cost[lc, qn[lc, kc]] = wq_new[lc, kc]
            power_sum[lc] = new_ps[lc, kc]
            current_node[lc] = smooth_max(power_sum[lc], mu32[lc])
        home[la, ba] = bq
        home[la, bb] = bp
        accepted += len(la)
    # Polish: greedy descent on the exact objective, the summed max over nodes (no smoothing), with
    # the same GPU and migration terms. Swaps inside a node leave the node maxima unchanged.
    g_load, n_cost, _ = state(home)
    node_max = n_cost.max(axis=1)  # [L, M]
    polished = 0
    for it in range(config.polish_iterations):
        a = rng.integers(0, experts, size=(layers, k))
        b = rng.integers(0, experts, size=(layers, k))
        p = home[li2, a]
        q = home[li2, b]
        pn, qn = p // gpn, q // gpn
        d = x[li2, b] - x[li2, a]
        delta = w_gpu * ((2 * d * (g_load[li2, p] - g_load[li2, q] + d)) * inv_t).sum(axis=2)
        wp_new = n_cost[li2, pn] + w[li2, b, pn] - w[li2, a, pn]  # [L, K, M]
        wq_new = n_cost[li2, qn] + w[li2, a, qn] - w[li2, b, qn]
        others = n_cost[:, None, :, :].repeat(k, axis=1)  # [L, K, nodes, M]
        kk = np.arange(k)[None, :]
        others[li2, kk, pn] = -np.inf
        others[li2, kk, qn] = -np.inf
        new_max = np.maximum(others.max(axis=2), np.maximum(wp_new, wq_new))
        node_delta = (new_max - node_max[:, None, :]).sum(axis=2) / gpn
        delta += np.where(pn != qn, node_delta, 0.0)
        if use_mig:
            delta += moved(a, q, qn) - moved(a, p, pn) + moved(b, p, pn) - moved(b, q, qn)
        delta = np.where(p != q, delta / scale[:, None], np.inf)
        best = np.argmin(delta, axis=1)
        take = delta[lidx, best] < -1e-9
        if not take.any():
            continue
        la, kb = lidx[take], best[take]
        ba, bb, bp, bq = a[la, kb], b[la, kb], p[la, kb], q[la, kb]
        bd = d[la, kb]
        g_load[la, bp] += bd
        g_load[la, bq] -= bd
        cn = (bp // gpn) != (bq // gpn)
        lc, kc = la[cn], kb[cn]
        n_cost[lc, pn[lc, kc]] = wp_new[lc, kc]
        n_cost[lc, qn[lc, kc]] = wq_new[lc, kc]
        node_max[lc] = new_max[lc, kc]
        home[la, ba] = bq
        home[la, bb] = bp
        polished += len(la)
    g_load, n_cost, power_sum = state(home)
    after = score(home, g_load, power_sum)
    return home, {"anneal_score_before": float(before.mean()), "anneal_score_after": float(after.mean()),
                  "anneal_accepted_swaps": int(accepted), "polish_accepted_swaps": int(polished)}


def equal_homes(home: np.ndarray, ep: int) -> bool:
    per_gpu = home.shape[1] // ep
    return all((np.bincount(h, minlength=ep) == per_gpu).all() for h in home)


def cost_ratios(shape: ModelShape, topology: Topology, ep: int) -> tuple[float, np.ndarray]:
    """(r_comm, r_mig [intra-node, inter-node]) in GPU compute tokens, from model shape and cluster.

    A token costs 18 * hidden * moe_ffn FLOPs of expert compute (6 forward, 12 backward). A
    cross-node token moves 4 hidden states over RDMA (dispatch and combine, forward and backward).
    Moving an expert's weights and optimizer state costs its bytes over RDMA (across nodes) or
    NVLink (inside a node), spread over the ep GPUs that migrate in parallel.
    """
    topo = topology
    token_seconds = 18.0 * shape.hidden * shape.moe_ffn / (topo.matmul_tflops * 1e12)
    comm = 4.0 * shape.token_bytes / (topo.rdma_GBps * 1e9) / token_seconds
    state_bytes = shape.expert_params * (shape.bytes_per_param + shape.optimizer_bytes_per_param)
    mig = np.array([state_bytes / (topo.nvlink_GBps * 1e9), state_bytes / (topo.rdma_GBps * 1e9)])
    return comm, mig / token_seconds / ep
