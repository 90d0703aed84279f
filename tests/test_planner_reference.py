"""The vectorized planner hot paths against the slow references beside them (relibra.policies.*_reference):
ReLibra's in-node replication greedy, the per-source replica flow, relibra-h's cross-node greedy, the
annealer (every iteration replayed against the objective recomputed in float64), and, against
sorting and plain sums, the annealer's helpers (top-3 nodes, group sums, integer powers and roots,
the random draws it merges). Inputs are small and random, with block sizes shrunk so that several
blocks and the working-set compaction run."""

from __future__ import annotations

import numpy as np
import pytest

from relibra.plan import StepPlan
from relibra.policies import replicate as replicate_mod
from relibra.policies.objective import layer_scores
from relibra.policies.relibra_h import cross_node_replicate
from relibra.policies.relibra_h_reference import cross_node_reference
from relibra.policies.reorder_reference import (anneal_homes_reference, anneal_temperatures, candidate_score_changes,
                                                migration_weighted)
from relibra.policies.replicate_reference import replicate_in_node_reference
from relibra.policies.split_reference import replica_flow_reference
from relibra.policies import reorder
from relibra.policies.reorder import AnnealConfig, _complements, _group_sum, _pow, _root, _top3, anneal_homes, lpt_homes
from relibra.policies.replicate import replicate_in_node
from relibra.policies.split import replica_runs
from relibra.trace import static_placement


# ---- in-node replication ---------------------------------------------------------------------------
@pytest.mark.parametrize("ep,gpn,experts,slots", [(4, 4, 4, 2), (8, 4, 16, 2), (8, 8, 32, 3), (4, 2, 8, 1),
                                                  (6, 3, 12, 2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_replicate_in_node_matches_the_per_cell_reference(monkeypatch, ep, gpn, experts, slots, seed):
    rng = np.random.default_rng(seed)
    m, layers = 5, 7
    skew = rng.permuted(np.broadcast_to(np.arange(1.0, experts + 1), (m, layers, experts)), axis=2) ** -1.3
    x = rng.multinomial(40 * experts, skew / skew.sum(axis=2, keepdims=True)).astype(np.int64)
    x[::2] = 40  # balanced micro-batches: their nodes are done at once, the others go on after compaction
    home = np.stack([rng.permutation(static_placement(1, experts, ep)[0]) for _ in range(layers)])
    monkeypatch.setattr(replicate_mod, "_BLOCK", 16)  # several blocks, each compacting its working set
    got = replicate_in_node(x, home, ep, gpn, slots, 30, 0.05)
    want = replicate_in_node_reference(x, home, ep, gpn, slots, 30, 0.05)
    assert (got[0] == want[0]).all() and (got[1] == want[1]).all()
    assert (got[0] >= 0).sum() > 0  # the case exercises replication


# ---- replica flow ----------------------------------------------------------------------------------
@pytest.mark.parametrize("slots,fill", [(2, 0.9), (4, 0.1)])  # the dense and the mostly-empty paths
def test_replica_flow_matches_the_reference(slots, fill):
    rng = np.random.default_rng(3)
    m, layers, ep, experts = 3, 4, 6, 12
    loads = rng.integers(0, 9, size=(m, layers, ep, experts)).astype(np.int32)
    home = np.stack([rng.permutation(static_placement(1, experts, ep)[0]) for _ in range(layers)])
    x = loads.sum(axis=2, dtype=np.int64)
    rexp = np.full((m, layers, ep, slots), -1, dtype=np.int32)
    rtok = np.zeros((m, layers, ep, slots), dtype=np.int64)
    for mb in range(m):
        for li in range(layers):
            left = x[mb, li].copy()
            for g in range(ep):
                for s in range(slots):
                    e = int(rng.integers(experts))
                    if rng.random() < fill and home[li, e] != g and e not in rexp[mb, li, g] and left[e] > 0:
                        rexp[mb, li, g, s] = e
                        rtok[mb, li, g, s] = rng.integers(0, left[e] + 1)
                        left[e] -= rtok[mb, li, g, s]
    rstart = replica_runs(home, rexp, rtok, x)
    plan = StepPlan("t", loads, home, rexp, rstart, rtok, ep, experts // ep + slots, "node")
    want = replica_flow_reference(loads, home, rexp, rtok)
    assert (plan.dense_replica_flow() == want).all()
    entries = plan.replica_flow_entries()  # the same flow as a list of nonzero entries
    assert len(entries["tokens"]) == np.count_nonzero(want) and (entries["tokens"] > 0).all()
    assert (want[entries["micro_batch"], entries["layer"], entries["src"], entries["gpu"], entries["slot"]]
            == entries["tokens"]).all()


# ---- relibra-h's cross-node greedy ------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cross_node_replicate_matches_the_per_cell_reference(seed):
    rng = np.random.default_rng(seed)
    m, layers, ep, gpn, experts = 3, 4, 16, 4, 32
    x = rng.multinomial(3000, rng.dirichlet(np.full(experts, 0.2), size=(m, layers))).astype(np.int64)
    home = np.stack([rng.permutation(static_placement(1, experts, ep)[0]) for _ in range(layers)])
    rexp, rtok = replicate_in_node(x, home, ep, gpn, 2, 5, 0.01)
    rexp = np.concatenate([rexp, np.full((m, layers, ep, 1), -1, np.int32)], axis=3)
    rtok = np.concatenate([rtok, np.zeros((m, layers, ep, 1), np.int64)], axis=3)
    window = rng.uniform(0, 3e-4, size=(m, ep))
    min_tokens = np.full((m, layers), 3, dtype=np.int64)
    args = (gpn, window, 1e-4, 2e-6, min_tokens, 64)
    want = cross_node_reference(x, home, rexp, rtok, *args, 6)
    got = cross_node_replicate(x, home, rexp.copy(), rtok.copy(), *args, shortlist=6)
    assert got[2] == want[2] > 0
    assert (got[0] == want[0]).all() and (got[1] == want[1]).all()


# ---- annealer helpers ------------------------------------------------------------------------------
def test_top3_and_complements_match_sorting():
    rng = np.random.default_rng(0)
    for nodes in (1, 2, 3, 5, 32):
        y = rng.integers(0, 6, size=(4, nodes, 2, 3)).astype(np.float32)  # many ties
        vals, idx = _top3(y)
        order = np.argsort(-y, axis=1, kind="stable")[:, :3]
        top = min(nodes, 3)
        assert (vals[:, :top] == np.take_along_axis(y, order, axis=1)).all()
        assert (idx[:, :top] == order).all() and (idx[:, top:] == -1).all() and (vals[:, top:] == 0).all()
        comp = _complements(nodes)
        for i in range(nodes):
            for j in range(nodes):
                if i != j:
                    assert sorted(comp[i, j]) == [n for n in range(nodes) if n not in (i, j)]


def test_group_sum_pow_root_and_the_merged_draws():
    rng = np.random.default_rng(1)
    values = rng.integers(0, 50, size=(3, 12, 4)).astype(np.float32)
    for group in (np.tile(np.arange(4), (3, 3)), rng.integers(0, 4, size=(3, 12))):  # equal, then unequal
        want = np.stack([[values[li][group[li] == g].sum(axis=0) for g in range(4)] for li in range(3)])
        assert (_group_sum(values, group, 4) == want).all()
    y = rng.random((5, 7)).astype(np.float32)
    for p in (1, 2, 3, 6, 8):
        assert np.array_equal(_pow(y, p, out=np.empty_like(y)), _pow(y, p))
        assert np.array_equal(_pow(y.copy(), p, out=y.copy()), _pow(y, p))
        assert np.array_equal(_root(y, p, out=np.empty_like(y)), _root(y, p))
    # the annealer draws a and b of shape [L, K] in one call of shape [2, L, K]: the same stream
    for experts in (7, 128, 160, 384):
        one, two = np.random.default_rng([4, experts]), np.random.default_rng([4, experts])
        both = one.integers(0, experts, size=(2, 5, 3))
        assert (both[0] == two.integers(0, experts, size=(5, 3))).all()
        assert (both[1] == two.integers(0, experts, size=(5, 3))).all()
        assert one.random() == two.random()


# ---- the annealer against its reference (whole objective recomputed per candidate swap) --------------
def _anneal_case(ep: int, gpn: int, experts: int, comm: float, seed: int):
    """A random case with both starts (LPT, a random previous placement) and migration: (expert
    tokens, source-node tokens, starts, config, keyword arguments)."""
    rng = np.random.default_rng(seed)
    m, layers, nodes = 3, 3, ep // gpn
    src = rng.integers(0, 30, size=(m, layers, experts, nodes)) * (rng.random((m, layers, experts, 1)) < 0.8)
    x = src.sum(axis=3)
    prev = np.stack([rng.permutation(np.arange(experts) % ep) for _ in range(layers)])
    starts = np.stack([lpt_homes(x.sum(axis=0).astype(float), ep), prev])
    config = AnnealConfig(iterations=60, polish_iterations=30, candidates=6, initial_temperature=1e-2)
    return x, src, starts, config, dict(comm_ratio=comm, migration_cost=np.array([0.5, 2.0]), prev_home=prev)


ANNEAL_SHAPES = [(4, 2, 8, 0.0), (8, 2, 16, 0.3), (32, 4, 32, 0.0), (16, 2, 32, 0.3)]
ANNEAL_SEEDS = range(8)  # every seed of the grid
# float32 tolerance of a score change: a few units in the last place of float32 at the layer's score
# (measured: at most 2 on this grid)
ANNEAL_ULPS = 8


@pytest.mark.parametrize("seed", ANNEAL_SEEDS)
@pytest.mark.parametrize("ep,gpn,experts,comm", ANNEAL_SHAPES)
def test_anneal_homes_agrees_with_the_reference_within_float32(ep, gpn, experts, comm, seed):
    """Every iteration of the fast annealer replayed against the reference (reorder_reference): the
    same draws; every candidate's score change within float32 tolerance of the objective recomputed
    in float64; its choice the reference's best and its decision (downhill, Metropolis, polish) the
    reference's, except where the two values lie within that tolerance of each other (counted, rare);
    the swaps it reports rebuild its homes. Without such a near decision the reference's own run gives
    the same homes. 32 / 4 and 16 / 2 have 8 nodes (the polish's top-3 path), the others few (its
    complement path); both starts and migration count."""
    x, src, starts, config, kw = _anneal_case(ep, gpn, experts, comm, seed)
    steps = []
    fast, info = anneal_homes(x, src, starts, ep, gpn, config, np.random.default_rng(seed), observe=steps.append, **kw)
    assert info.accepted_swaps > 0 and (fast != starts[0]).any()  # the search does move
    assert [s.phase for s in steps] == ["anneal"] * config.iterations + ["polish"] * config.polish_iterations
    prev, mig = kw["prev_home"], migration_weighted(config, kw["migration_cost"], kw["prev_home"])
    layers = np.arange(x.shape[1])

    def scores(home, power):
        return layer_scores(x, src, home, ep, gpn, power, comm, config.gpu_weight, mig, prev)

    home = starts[np.argmin(np.stack([scores(h, config.node_power) for h in starts]), axis=0), layers].copy()
    rng, temperatures, near = np.random.default_rng(seed), anneal_temperatures(config), 0
    for step in steps:
        pairs = rng.integers(0, experts, size=step.pairs.shape)
        assert np.array_equal(pairs, step.pairs)
        power = config.node_power if step.phase == "anneal" else None
        exact = candidate_score_changes(x, src, home, pairs, ep, gpn, power, comm, config.gpu_weight, mig, prev)
        tol = ANNEAL_ULPS * np.finfo(np.float32).eps * np.maximum(scores(home, power), 1.0)  # [L]
        moves = np.isfinite(exact)
        assert np.array_equal(np.isfinite(step.delta), moves)
        assert (np.abs(step.delta[moves] - exact[moves]) <= np.broadcast_to(tol[:, None], moves.shape)[moves]).all()
        chosen, best = exact[layers, step.best], exact.min(axis=1)
        assert ((chosen <= best + 2 * tol) | ~np.isfinite(best)).all()
        mine = step.delta[layers, step.best]
        if step.phase == "anneal":  # taken when downhill, else when the uniform draw falls below exp(-change / T)
            uphill = np.isfinite(mine) & ~(mine < 0)
            threshold = np.zeros(len(layers))
            with np.errstate(divide="ignore"):
                threshold[uphill] = -temperatures[step.iteration] * np.log(rng.random(int(uphill.sum())))
        else:
            threshold = np.full(len(layers), -1e-9)
        wanted = chosen < threshold
        close = np.abs(chosen - threshold) <= tol
        assert (step.take == wanted)[~close].all()
        near += int((step.take != wanted).sum() + (step.best != np.argmin(exact, axis=1))[np.isfinite(best)].sum())
        for layer in np.flatnonzero(step.take):
            a, b = pairs[:, layer, step.best[layer]]
            home[layer, [a, b]] = home[layer, [b, a]]
    assert np.array_equal(home, fast)
    assert near <= len(steps) * len(layers) // 100
    if near == 0:
        reference = anneal_homes_reference(x, src, starts, ep, gpn, config, np.random.default_rng(seed), **kw)
        assert np.array_equal(fast, reference)


@pytest.mark.parametrize("ep,gpn,experts", [(8, 2, 16), (16, 2, 32)])
@pytest.mark.parametrize("seed", [0, 2])
def test_anneal_homes_gathering_the_terms_apart_changes_nothing(ep, gpn, experts, seed, monkeypatch):
    """Above reorder._STACKED_BYTES (large models) a swap gathers its tokens and its nodes' received
    tokens from separate tables instead of one stacked row: the same homes and figures, bit for bit."""
    x, src, starts, config, kw = _anneal_case(ep, gpn, experts, 0.3, seed)
    args = (x, src, ep, gpn, config, kw["comm_ratio"], kw["migration_cost"], kw["prev_home"])
    assert reorder._problem(*args).stacked
    stacked, stacked_info = anneal_homes(x, src, starts, ep, gpn, config, np.random.default_rng(seed), **kw)
    monkeypatch.setattr(reorder, "_STACKED_BYTES", 0)
    problem = reorder._problem(*args)
    assert problem.terms == 2 and not problem.stacked
    apart, apart_info = anneal_homes(x, src, starts, ep, gpn, config, np.random.default_rng(seed), **kw)
    assert np.array_equal(apart, stacked) and apart_info == stacked_info
    assert stacked_info.accepted_swaps > 0 and (stacked != starts[0]).any()


def test_layer_scores_by_hand():
    """Two nodes of one GPU, one micro-batch, experts of 6 and 2 tokens (sources: expert 0's 6 all
    from node 0's rank, expert 1's 2 from node 1's)."""
    x = np.array([[[6, 2]]])  # [M, L, E]
    src = np.array([[[[6, 0], [0, 2]]]])  # [M, L, E, nodes]
    home = np.array([[0, 1]])
    # T = 8, S = 8 / 2 = 4; exact maxima: C max 6; R = 0 (each expert homed with its source)
    # GPU term sum G^2 / T = (36 + 4) / 8 = 5
    assert layer_scores(x, src, home, 2, 1, None, 0.5, 0.1) == pytest.approx((6 / 1 + 0.1 * 5) / 4)
    # swapped homes: every token crosses nodes, R = [2, 6]: max 6 with weight r = 0.5; moving both experts
    # across nodes from `home` costs 2 x 3.0
    score = layer_scores(x, src, home[:, ::-1], 2, 1, None, 0.5, 0.1, np.array([1.0, 3.0]), home)
    assert score == pytest.approx((6 + 0.5 * 6 + 0.1 * 5 + 2 * 3.0) / 4)
    # the smooth maximum with p = 2: mu = T / nodes = 4; 4 * sqrt(mean((6/4)^2, (2/4)^2)) = sqrt(20)
    assert layer_scores(x, src, home, 2, 1, 2) == pytest.approx((np.sqrt(20) + 0.1 * 5) / 4)
