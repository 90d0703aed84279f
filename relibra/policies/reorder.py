"""ReLibra's inter-batch reordering: where every expert is homed for one step.

See relibra/policies/relibra.py for the score and the search, and docs/policies.md for the choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relibra.cluster import ModelShape, Topology
from relibra.plan import homes_per_gpu
from relibra.policies.reference import layer_scores


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

    The score of a layer is reference.layer_scores (node_power p, comm_ratio r, gpu_weight); every
    term decomposes over nodes and GPUs, so a swap is scored incrementally: it touches two GPUs and at
    most two nodes. After annealing, `polish_iterations` of greedy descent use the exact maxima.
    reference.anneal_homes_reference is this search one swap at a time, with the whole objective
    recomputed per candidate; both give the same homes for a seed (tests/test_planner_reference.py).

    Node state is kept as one array Y [L, nodes, terms, M] (terms: C, and R when r > 0) so that
    both terms move through the same few numpy calls. Speed (docs/policies.md, relibra section):
    every gather is a row take from a flat [rows, M] view (one index per (layer, candidate)); a
    swap's two sides are the halves of [2, L, K] arrays; the polish takes the maximum over the
    nodes a swap leaves untouched from those nodes (up to 6) or from each (layer, term, m)'s three
    largest nodes. GPU loads and node state are whole token counts held in float32, exact below
    2^24 tokens per node and micro-batch, so regrouping their sums changes no bit; the smoothed
    terms keep their order of operations, so a seed gives the same homes as the plain version.
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
    xf = x.reshape(layers * experts, m)
    # what expert e adds to node n's received tokens if homed there: [L, E, nodes, M], one row per
    # (layer, expert, node); while small (in cache) rows of both terms (compute, received) instead,
    # so that a candidate's two node rows come from two gathers, else from x and recv separately
    # (half the table: fewer cache misses)
    stacked = use_comm and layers * experts * nodes * terms * m * 4 <= _STACKED_BYTES
    if use_comm:
        contrib = np.empty((layers, experts, nodes, terms if stacked else 1, m), dtype=np.float32)
        if stacked:
            contrib[:, :, :, 0] = x[:, :, None, :]
        src = np.asarray(src_node_tokens)
        for li in range(layers):  # one layer at a time: the transposed reads stay in cache
            np.subtract(x[li, :, None, :], src[:, li].transpose(1, 2, 0), out=contrib[li, :, :, -1], casting="unsafe")
        contrib_f = contrib.reshape(layers * experts * nodes, -1)
    total = x.sum(axis=1, dtype=np.float64)  # [L, M]
    inv_total = np.where(total > 0, 1.0 / np.maximum(total, 1), 0.0).astype(np.float32)  # [L, M]
    scale = np.maximum(total.sum(axis=1) / ep, 1.0)  # [L] sum over m of the mean GPU load
    lidx = np.arange(layers)
    li2 = lidx[:, None]
    row_e, row_g, row_n = li2 * experts, li2 * ep, li2 * nodes  # first flat row of each layer
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
        prev_home_f, prev_node_f = np.ravel(prev_home), np.ravel(prev_node)

    def smax(ps, mu_rows):  # power sums [..., terms, M] -> weighted smooth maxima summed over m: [...]
        per_term = (mu_rows * _root(np.maximum(ps, 0.0) * (1.0 / nodes), p_node)).sum(axis=-1)
        return (per_term * weight).sum(axis=-1) / gpn

    def smax32(ps, mu_rows):  # smax of float32 power sums, through one scratch array (same values)
        # max(ps, 0) up to the sign of a zero, which changes no comparison downstream (np.maximum
        # is several times slower)
        v = np.multiply(ps, ps > 0)
        v *= 1.0 / nodes
        v = _root(v, p_node, out=v)
        v *= mu_rows
        return (v.sum(axis=-1) * weight).sum(axis=-1) / gpn

    def moved(ie, to_gpu, to_node):  # migration cost of the experts at flat rows ie [L, K] landing on to_gpu
        return np.where(to_node != prev_node_f[ie], mig[1], np.where(to_gpu != prev_home_f[ie], mig[0], 0.0))

    def state(h):
        """GPU loads [L, ep, M] and node state Y [L, nodes, terms, M] of placement h (sums of whole
        token counts: exact in float32 whatever the order)."""
        node_of = h // gpn
        y = np.empty((layers, nodes, terms, m), dtype=np.float32)
        gl = _group_sum(x, h, ep)
        y[:, :, 0] = gl.reshape(layers, nodes, gpn, m).sum(axis=2)
        if use_comm:
            rows = ((row_e + np.arange(experts)) * nodes + node_of).ravel()
            y[:, :, 1] = _group_sum(contrib_f[rows, -m:].reshape(layers, experts, m), node_of, nodes)
        return gl, y

    def powers(y):  # (y / mu)^p: [L, nodes, terms, M]
        return _pow(y * inv_mu[:, None], p_node)

    def score(h):  # the objective itself, recomputed (reference.layer_scores): float64 [L]
        return layer_scores(expert_tokens, src_node_tokens, h, ep, gpn, p_node, r, w_gpu,
                            mig if use_mig else None, prev_home)

    def candidates():
        """k random swaps per layer, as the halves of [2, L, K] arrays (half 0: expert a, its GPU p
        and node pn; half 1: b, q, qn): experts ab, GPUs pq, nodes pqn; the tokens d [L, K, M] GPU
        p gains (q loses); the GPU and migration part of the score change delta [L, K]; the rows
        of Y of nodes pn and qn ([2, L, K]) and their new values new_y [2, L, K, terms, M]."""
        ab = rng.integers(0, experts, size=(2, layers, k))  # the same draws as a, then b, of shape [L, K]
        iab = row_e + ab  # flat expert rows
        pq = home_f[iab]
        pqn = pq // gpn
        rows = row_n + pqn
        if stacked:  # what nodes pn and qn gain, both terms: [2, L, K, terms * M]
            plus = contrib_f.take(iab[::-1] * nodes + pqn, axis=0, mode="clip")
            plus -= contrib_f.take(iab * nodes + pqn, axis=0, mode="clip")
            d = plus[0, :, :, :m]  # [L, K, M] tokens GPU p gains (q loses): x_b - x_a
        else:
            xab = xf.take(iab, axis=0, mode="clip")
            gain = xab[::-1] - xab  # [2, L, K, M]: x_b - x_a (what GPU p, node pn gain), x_a - x_b
            d = gain[0]  # [L, K, M] tokens GPU p gains (q loses)
        gpq = gl_f.take(row_g + pq, axis=0, mode="clip")
        t = gpq[0] - gpq[1]
        t += d
        t *= d
        t *= inv_t2  # (t * d) * (2 / T) rounds as (t * 2d) * (1 / T): doubling is exact
        delta = w_gpu * t.sum(axis=2)
        if use_mig:
            (ia, ib), (p, q), (pn, qn) = iab, pq, pqn
            delta += moved(ia, q, qn) - moved(ia, p, pn) + moved(ib, p, pn) - moved(ib, q, qn)
        new_y = y_f.take(rows, axis=0, mode="clip")
        if stacked:
            new_y += plus
        else:
            new_y = new_y.reshape(2, layers, k, terms, m)
            new_y[:, :, :, 0] += gain
            if use_comm:  # received tokens: rows (b, pn), (a, pn), (a, qn), (b, qn) of recv
                (ia, ib), (pn, qn) = iab, pqn
                recv = contrib_f.take(np.stack([ib * nodes + pn, ia * nodes + pn, ia * nodes + qn, ib * nodes + qn]),
                                      axis=0, mode="clip").reshape(2, 2, layers, k, m)
                new_y[:, :, :, 1] += recv[:, 0] - recv[:, 1]
        return ab, pq, pqn, rows, d, delta, new_y.reshape(2, layers, k, terms, m)

    def apply(la, kb, ab, pq, pqn, rows, d, new_y):
        """Make the chosen swaps (layers la, candidates kb). Returns the cross-node ones (lc, kc)
        and, for those, the changed rows of Y (flat: pn's, then qn's)."""
        ba, bb, bp, bq = ab[0, la, kb], ab[1, la, kb], pq[0, la, kb], pq[1, la, kb]
        bd = d[la, kb]  # [n, M]
        gl_f[la * ep + bp] += bd
        gl_f[la * ep + bq] -= bd
        cn = pqn[0, la, kb] != pqn[1, la, kb]
        lc, kc = la[cn], kb[cn]
        changed = rows[:, lc, kc].reshape(-1)
        y_f[changed] = new_y.reshape(2, layers, k, terms * m)[:, lc, kc].reshape(-1, terms * m)
        home_f[la * experts + ba] = bq
        home_f[la * experts + bb] = bp
        return lc, kc, changed

    # start, per layer, from the best-scoring of the given placements
    starts = np.asarray(init_home, dtype=np.int64).reshape(-1, layers, experts)
    scores = np.stack([score(h) for h in starts])  # [starts, L]
    home = starts[np.argmin(scores, axis=0), lidx].copy()
    home_f = home.reshape(-1)  # a view: swaps made on home show here
    before = scores.min(axis=0)
    g_load, y_node = state(home)
    gl_f, y_f = g_load.reshape(layers * ep, m), y_node.reshape(layers * nodes, terms * m)  # views
    pw = powers(y_node)  # [L, nodes, terms, M]
    pw_f = pw.reshape(layers * nodes, terms * m)
    ps = pw.sum(axis=1)  # [L, terms, M]
    current = smax(ps, mu32)  # [L]
    k = config.candidates
    iters = config.iterations
    temps = config.initial_temperature * (config.final_temperature / config.initial_temperature) ** (
        np.arange(iters) / max(iters - 1, 1))
    inv_t2 = 2 * inv_total[:, None, :]  # [L, 1, M]
    inv_mu4 = inv_mu[:, None]  # [L, 1, terms, M] (broadcast over [2, L, K, terms, M] too)
    mu_k = mu32[:, None]  # [L, 1, terms, M]
    accepted = 0
    worst = 0.0  # check_state: largest relative difference between kept and recomputed state
    for it in range(iters):
        ab, pq, pqn, rows, d, delta, new_y = candidates()
        new_pw = new_y * inv_mu4
        new_pw = _pow(new_pw, p_node, out=new_pw)  # [2, L, K, terms, M]
        change = pw_f.take(rows, axis=0, mode="clip").reshape(new_pw.shape)
        np.subtract(new_pw, change, out=change)
        change = change[0] + change[1]
        same = np.flatnonzero(pqn[0] == pqn[1])
        if len(same):  # a swap inside a node leaves the node terms as they are
            change.reshape(layers * k, terms * m)[same] = 0.0
        new_ps = change
        new_ps += ps[:, None]  # [L, K, terms, M]
        new_node = smax32(new_ps, mu_k)  # [L, K]
        delta += new_node - current[:, None]
        delta = np.where(pq[0] != pq[1], delta / scale[:, None], np.inf)
        best = np.argmin(delta, axis=1)
        best_delta = delta[lidx, best]
        take = best_delta < 0
        warm = np.isfinite(best_delta) & ~take
        take[warm] = rng.random(int(warm.sum())) < np.exp(-best_delta[warm] / temps[it])
        if not take.any():
            continue
        la, kb = lidx[take], best[take]
        lc, kc, changed = apply(la, kb, ab, pq, pqn, rows, d, new_y)
        pw_f[changed] = new_pw.reshape(2, layers, k, terms * m)[:, lc, kc].reshape(-1, terms * m)
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
    gl_f, y_f = g_load.reshape(layers * ep, m), y_node.reshape(layers * nodes, terms * m)
    node_max = y_node.max(axis=1)  # [L, terms, M]
    complement = _complements(nodes) if nodes <= 6 else None  # [nodes, nodes, nodes - 2] or None
    top_v, top_i = _top3(y_node) if complement is None else (None, None)  # [L, 3, terms, M]: the three largest
    polished = 0
    for it in range(config.polish_iterations):
        ab, pq, pqn, rows, d, delta, new_y = candidates()
        pn, qn = pqn
        # the largest node other than pn and qn (node loads are >= 0: with none left, 0)
        if complement is not None:  # few nodes: the max over the others, gathered
            others = np.zeros((layers, k, terms * m), dtype=np.float32)
            for j in range(complement.shape[2]):
                np.maximum(others, y_f.take(row_n + complement[pn, qn, j], axis=0, mode="clip"), out=others)
            others = others.reshape(layers, k, terms, m)
        else:  # the largest of the three largest nodes that is neither (one left out counts as 0)
            pnb, qnb = pn.astype(top_i.dtype)[:, :, None, None], qn.astype(top_i.dtype)[:, :, None, None]
            others = None
            for j in range(3):
                ij = top_i[:, None, j]
                v = top_v[:, None, j] * ((ij != pnb) & (ij != qnb))
                others = v if others is None else np.maximum(others, v, out=others)  # [L, K, terms, M]
        new_max = np.maximum(others, np.maximum(new_y[0], new_y[1]))  # [L, K, terms, M]
        node_delta = ((new_max - node_max[:, None]).sum(axis=3) * weight).sum(axis=2) / gpn
        delta += np.where(pn != qn, node_delta, 0.0)
        delta = np.where(pq[0] != pq[1], delta / scale[:, None], np.inf)
        best = np.argmin(delta, axis=1)
        take = delta[lidx, best] < -1e-9
        if not take.any():
            continue
        la, kb = lidx[take], best[take]
        lc, kc, _ = apply(la, kb, ab, pq, pqn, rows, d, new_y)
        node_max[lc] = new_max[lc, kc]
        if complement is None:
            top_v[lc], top_i[lc] = _top3(y_node[lc])
        polished += len(la)
        if check_state:
            gl, yy = state(home)
            worst = max(worst, _rel_error(g_load, gl), _rel_error(y_node, yy), _rel_error(node_max, yy.max(axis=1)),
                        _rel_error(top_v[:, 0], yy.max(axis=1)) if complement is None else 0.0)
    after = score(home)
    info = {"anneal_score_before": float(before.mean()), "anneal_score_after": float(after.mean()),
            "anneal_accepted_swaps": int(accepted), "polish_accepted_swaps": int(polished)}
    if check_state:
        info["state_check_max_rel_error"] = float(worst)
    return home, info


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


_STACKED_BYTES = 32 << 20  # anneal_homes stacks both node terms per (expert, node) row up to this size


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
