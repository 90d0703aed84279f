"""The simulator's fast token-flow paths (StepPlan.flows, home_flow, links.distinct_tokens, the
per-GPU counts cost_plan uses) against plain slow references written cell by cell here, on random
valid plans with replicas, empty replica slots between occupied ones, and uneven home counts."""

from __future__ import annotations

import numpy as np
import pytest

from relibra.cluster import ModelShape, Topology
from relibra.costs import CostParams, collective_seconds, cost_plan, dispatch_seconds, distinct_tokens
from relibra.errors import PlanError
from relibra.plan import StepPlan

# the dedup estimate caps one copy's share of a source's tokens just below 1 (links.distinct_tokens)
SHARE_CAP = float(np.float32(1.0 - 1e-6))


def _random_plan(seed: int, m=2, l=3, ep=8, e=16, slots=3, gpn=4, equal_homes=True, fill=0.6) -> StepPlan:
    """A valid plan with random loads, homes, replicas (scope "any") and flows. Slots are filled at
    random, so empty slots sit before, between and after occupied ones; each replica takes a random
    run of what its expert has left (the runs in slot order need not follow the GPUs), the rest stays home."""
    rng = np.random.default_rng(seed)
    loads = rng.integers(0, 40, size=(m, l, ep, e)).astype(np.int32)
    loads[rng.random(loads.shape) < 0.2] = 0
    if equal_homes:
        home = np.stack([rng.permutation(np.arange(e) % ep) for _ in range(l)]).astype(np.int64)
    else:  # uneven: some GPUs home several experts, at least one homes none
        home = rng.integers(1, ep, size=(l, e)).astype(np.int64)
    rexp = np.full((m, l, ep, slots), -1, dtype=np.int32)
    rstart = np.zeros((m, l, ep, slots), dtype=np.int64)
    rtok = np.zeros((m, l, ep, slots), dtype=np.int64)
    for mi in range(m):
        for li in range(l):
            taken = np.zeros(e, dtype=np.int64)  # tokens of each expert already given to a replica
            for g in range(ep):
                candidates = list(rng.permutation(np.nonzero(home[li] != g)[0]))
                for r in range(slots):
                    if rng.random() > fill or not candidates:
                        continue
                    x = int(candidates.pop())
                    rexp[mi, li, g, r] = x
                    take = rng.integers(0, loads[mi, li, :, x].sum() - taken[x] + 1)
                    rstart[mi, li, g, r], rtok[mi, li, g, r] = taken[x], take
                    taken[x] += take
    homes = np.bincount(home.ravel(), minlength=ep)
    slots_per_gpu = int(homes.max()) * l + slots  # generous: the test is about flows, not slot limits
    plan = StepPlan("random", loads, home, rexp, rstart, rtok, gpn, slots_per_gpu, replica_scope="any",
                    equal_homes=equal_homes)
    plan.validate(loads)
    assert (rexp >= 0).any() and (rexp < 0).any()
    return plan


def _reference_source_flow(plan: StepPlan) -> np.ndarray:
    """Tokens each source sends each occupied replica, token by token: the tokens of expert x in a
    (micro_batch, layer) are numbered in source order, and a replica whose run is [start, start +
    tokens) gets those numbers. int64 [M, L, src, ep, R]."""
    m, l, ep, e = plan.loads.shape
    out = np.zeros((m, l, ep, ep, plan.replica_slots), dtype=np.int64)
    for mi, li, g, r in np.argwhere(plan.replica_expert >= 0):
        x = plan.replica_expert[mi, li, g, r]
        first = int(plan.replica_start[mi, li, g, r])
        taken = range(first, first + int(plan.replica_tokens[mi, li, g, r]))
        number = 0
        for s in range(ep):
            for _ in range(int(plan.loads[mi, li, s, x])):
                out[mi, li, s, g, r] += number in taken
                number += 1
    return out


def _reference_flows(plan: StepPlan):
    """Every token of expert x from src s goes to x's home unless a replica of x takes it: (matrix
    [M, L, src, dst], home_flow [M, L, src, E], home_tokens [M, L, E], replica_tokens [M, L, ep, R])."""
    m, l, ep, e = plan.loads.shape
    slots = plan.replica_slots
    matrix = np.zeros((m, l, ep, ep))
    home_flow = np.zeros((m, l, ep, e), dtype=np.int64)
    home_tokens = np.zeros((m, l, e), dtype=np.int64)
    replica_tokens = np.zeros((m, l, ep, slots), dtype=np.int64)
    flow = _reference_source_flow(plan)
    for mi in range(m):
        for li in range(l):
            for x in range(e):
                for s in range(ep):
                    left = int(plan.loads[mi, li, s, x])
                    for g in range(ep):
                        for r in range(slots):
                            if plan.replica_expert[mi, li, g, r] == x:
                                t = int(flow[mi, li, s, g, r])
                                matrix[mi, li, s, g] += t
                                replica_tokens[mi, li, g, r] += t
                                left -= t
                    matrix[mi, li, s, plan.home[li, x]] += left
                    home_flow[mi, li, s, x] = left
                    home_tokens[mi, li, x] += left
    return matrix, home_flow, home_tokens, replica_tokens


def _reference_distinct(plan: StepPlan, src_tokens: np.ndarray):
    """Independence estimate copy by copy: a token of src s reaches none of a set of copies with
    probability prod (1 - share_c), share_c = tokens of s the copy gets / tokens of s (capped)."""
    m, l, ep, e = plan.loads.shape
    _, home_flow, _, _ = _reference_flows(plan)
    gpn = plan.gpus_per_node
    per_gpu = np.zeros((m, l, ep, ep))
    per_node = np.zeros((m, l, ep, ep // gpn))
    flow = _reference_source_flow(plan)
    for mi in range(m):
        for li in range(l):
            for s in range(ep):
                t = float(src_tokens[mi, s])
                miss = np.ones(ep)
                for x in range(e):
                    share = home_flow[mi, li, s, x] / t if t > 0 else 0.0
                    miss[plan.home[li, x]] *= 1.0 - min(share, SHARE_CAP)
                for g in range(ep):
                    for r in range(plan.replica_slots):
                        if plan.replica_expert[mi, li, g, r] >= 0:
                            share = flow[mi, li, s, g, r] / t if t > 0 else 0.0
                            miss[g] *= 1.0 - min(share, SHARE_CAP)
                per_gpu[mi, li, s] = t * (1.0 - miss)
                per_node[mi, li, s] = t * (1.0 - miss.reshape(-1, gpn).prod(axis=1))
    return per_gpu, per_node


CASES = [dict(), dict(equal_homes=False), dict(ep=4, e=8, gpn=4, slots=2), dict(ep=8, e=8, slots=4, fill=0.3),
         dict(m=1, l=2, ep=16, e=32, gpn=8, slots=2)]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("seed", [0, 1])
def test_flows_against_a_cell_by_cell_reference(case, seed):
    plan = _random_plan(seed, **CASES[case])
    matrix, home_flow, home_tokens, replica_tokens = _reference_flows(plan)
    got_matrix, got_home, got_replica = plan.flows()
    assert got_matrix.dtype == np.float64 and np.array_equal(got_matrix, matrix)
    assert np.array_equal(got_home, home_tokens) and np.array_equal(got_replica, replica_tokens)
    assert np.array_equal(plan.home_flow(), home_flow)
    assert np.array_equal(plan.token_matrix(), matrix)
    assert np.array_equal(plan.gpu_tokens(), np.rint(matrix.sum(axis=2)).astype(np.int64))
    assert np.array_equal(plan.home_tokens(), home_tokens)


def test_flows_ignore_counts_left_in_empty_slots():
    """A run parked in an empty slot (an invalid plan the validator refuses) flows nowhere."""
    plan = _random_plan(3)
    want = plan.flows()
    empty = tuple(np.argwhere(plan.replica_expert < 0)[0])
    plan.replica_tokens[empty] = 5
    got = plan.flows()
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


def test_flows_without_replica_slots():
    plan = _random_plan(4)
    plan.replica_expert = plan.replica_expert[..., :0]
    plan.replica_start = plan.replica_start[..., :0]
    plan.replica_tokens = plan.replica_tokens[..., :0]
    plan.loads = plan.loads.copy()
    matrix, _, home_tokens, replica_tokens = _reference_flows(plan)
    got = plan.flows()
    assert np.array_equal(got[0], matrix) and np.array_equal(got[1], home_tokens)
    assert got[2].shape == replica_tokens.shape == (2, 3, 8, 0)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_distinct_tokens_against_a_copy_by_copy_reference(case):
    plan = _random_plan(10 + case, **CASES[case])
    src_tokens = plan.loads[:, 0].sum(axis=2) / 2.0  # top-2
    src_tokens[0, 1] = 0  # a silent source sends nothing
    plan.loads[0, :, 1] = 0  # the replicas' runs now cover other sources' tokens, or fewer
    per_gpu, per_node = distinct_tokens(plan, src_tokens)
    want_gpu, want_node = _reference_distinct(plan, src_tokens)
    assert per_gpu.shape == want_gpu.shape and per_node.shape == want_node.shape
    np.testing.assert_allclose(per_gpu, want_gpu, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(per_node, want_node, rtol=1e-9, atol=1e-9)
    assert (per_gpu[0, :, 1] == 0).all() and (per_node[0, :, 1] == 0).all()


MODEL = ModelShape("speedpath-test", num_layers=3, num_experts=16, top_k=2, hidden=256, moe_ffn=512,
                   num_attention_heads=4, num_kv_heads=2, head_dim=64, vocab_size=1000)
TOPO = Topology("speedpath", num_nodes=2, gpus_per_node=4, nvlink_GBps=100.0, rdma_GBps=10.0, matmul_tflops=50.0,
                gemm_half_tokens=64.0)


@pytest.mark.parametrize("dedup", [False, True])
@pytest.mark.parametrize("seed", [5, 6])
def test_cost_plan_uses_the_reference_flow(dedup, seed):
    plan = _random_plan(seed, equal_homes=seed == 5)
    matrix, _, _, _ = _reference_flows(plan)
    src_tokens = plan.loads[:, 0].sum(axis=2, dtype=np.int64) / MODEL.top_k
    cost = cost_plan(plan, MODEL, TOPO, CostParams(dedup=dedup))
    assert np.array_equal(cost.gpu_tokens, np.rint(matrix.sum(axis=2)).astype(np.int64))
    if dedup:
        per_gpu, per_node = _reference_distinct(plan, src_tokens)
        want = collective_seconds(per_gpu * MODEL.token_bytes, 4, TOPO, None, per_node * MODEL.token_bytes)
    else:
        want = collective_seconds(matrix * MODEL.token_bytes, 4, TOPO)
    np.testing.assert_allclose(cost.forward["dispatch"], want, rtol=1e-9)
    # the phase function alone, with and without the matrix handed in
    for handed in (matrix, None):
        got = dispatch_seconds(plan, MODEL, TOPO, CostParams(dedup=dedup), handed, src_tokens)
        np.testing.assert_allclose(got, want, rtol=1e-9)


@pytest.mark.parametrize("route", ["rail", "direct"])
@pytest.mark.parametrize("shared", [False, True])
def test_sparse_link_seconds_matches_the_dense_exchange(route, shared):
    """Moves given as a list (repeats and moves to oneself included) cost what the same moves cost
    as dense [cells, ep, ep] byte matrices."""
    from relibra.costs.links import link_seconds, sparse_link_seconds

    rng = np.random.default_rng(7)
    cells, ep, gpn, n = 5, 16, 4, 300
    cell, src, dst = rng.integers(0, cells, n), rng.integers(0, ep, n), rng.integers(0, ep, n)
    weight = rng.integers(1, 9, n) * 1e6
    dense = np.zeros((cells, ep, ep))
    for c, s, d, w in zip(cell, src, dst, weight):
        dense[c, s, d] += w
    topo = TOPO.with_changes(num_nodes=4, shared_link=shared)
    want = link_seconds(dense, gpn, topo, route)
    got = sparse_link_seconds(cell, src, dst, weight, cells, ep, gpn, topo, route)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert (want > 0).any()
    # one weight for every move
    np.testing.assert_allclose(sparse_link_seconds(cell, src, dst, 3e6, cells, ep, gpn, topo, route),
                               link_seconds(_count(cell, src, dst, cells, ep) * 3e6, gpn, topo, route),
                               rtol=1e-12)


def _count(cell, src, dst, cells, ep):
    out = np.zeros((cells, ep, ep))
    np.add.at(out, (cell, src, dst), 1.0)
    return out


@pytest.mark.parametrize("buffer", ["layer-shared", "per-layer"])
def test_replica_moves_against_a_slot_by_slot_reference(buffer):
    """layer-shared: every occupied slot moves; per-layer: a push where the expert was not on that GPU
    at the previous micro-batch (same layer), a pull where it is gone at the next one."""
    from relibra.costs import replica_moves

    plan = _random_plan(21, m=4, fill=0.8, e=8, ep=4, gpn=2)
    m, l, ep, r = plan.replica_expert.shape
    want_push, want_pull = np.zeros((m, l, ep, ep), dtype=np.int64), np.zeros((m, l, ep, ep), dtype=np.int64)
    for mi in range(m):
        for li in range(l):
            for g in range(ep):
                for x in plan.replica_expert[mi, li, g]:
                    if x < 0:
                        continue
                    before = mi > 0 and x in plan.replica_expert[mi - 1, li, g]
                    after = mi < m - 1 and x in plan.replica_expert[mi + 1, li, g]
                    h = plan.home[li, x]
                    want_push[mi, li, h, g] += buffer == "layer-shared" or not before
                    want_pull[mi, li, h, g] += buffer == "layer-shared" or not after
    push, pull = replica_moves(plan, buffer)
    assert np.array_equal(push, want_push) and np.array_equal(pull, want_pull)
    if buffer == "per-layer":
        assert push.sum() < (plan.replica_expert >= 0).sum()  # some replicas stay between micro-batches


@pytest.mark.parametrize("buffer", ["layer-shared", "per-layer"])
def test_replica_transfer_seconds_from_the_dense_moves(buffer):
    from relibra.costs import replica_moves, replica_transfer_seconds
    from relibra.costs.links import link_seconds

    plan = _random_plan(22, m=4, fill=0.8)
    params = CostParams(replica_buffer=buffer)
    push, pull = replica_transfer_seconds(plan, MODEL, TOPO, params)
    pushes, pulls = replica_moves(plan, buffer)
    lat = TOPO.collective_latency_s
    for got, moves, nbytes in ((push, pushes, MODEL.expert_bytes),
                               (pull, pulls, MODEL.expert_params * params.grad_bytes_per_param)):
        dense = link_seconds(moves * float(nbytes), plan.gpus_per_node, TOPO)
        assert np.array_equal(got, np.where(dense > 0, dense + lat, 0.0))


@pytest.mark.parametrize("layout", ["unique", "rounds", "mixed", "not-contiguous"])
@pytest.mark.parametrize("ufunc", [np.multiply, np.subtract])
def test_scatter_rows_applies_every_entry_in_order(layout, ufunc):
    from relibra.flow import rank_within, scatter_rows

    rng = np.random.default_rng(3)
    a, b, s, n = 4, 6, 5, 40
    if layout == "unique":
        key = rng.choice(a * b, 20, replace=False)
    else:
        key = rng.integers(0, 8, n)  # many repeats
        if layout == "rounds":
            key = key[np.argsort(rank_within(key), kind="stable")]
    first, second = key // b, key % b
    rows = rng.random((len(key), s)) + 0.5
    base = rng.random((a, b, s)) + 0.5
    want = base.copy()
    for i in range(len(key)):
        want[first[i], second[i]] = ufunc(want[first[i], second[i]], rows[i])
    if layout == "not-contiguous":
        holder = np.ascontiguousarray(base.transpose(2, 0, 1))
        got = holder.transpose(1, 2, 0)
        assert not got.flags.c_contiguous
    else:
        got = base.copy()
    scatter_rows(ufunc, got, first, second, rows)
    assert np.array_equal(got, want)


def test_flows_of_unsigned_counts():
    """Unsigned token counts are worked in a signed type: the same flow, and an over-drawn pair shows
    as negative instead of wrapping around."""
    plan = _random_plan(30)
    want = plan.flows()
    plan.loads = plan.loads.astype(np.uint16)
    plan.replica_start = plan.replica_start.astype(np.uint32)
    plan.replica_tokens = plan.replica_tokens.astype(np.uint32)
    got = plan.flows()
    for x, y in zip(got, want):
        assert np.array_equal(x, y)
    # two replicas of one expert given the same run: the home's share goes negative, not wrapped
    m, l, g, r = np.argwhere((plan.replica_expert >= 0) & (plan.replica_tokens > 0))[0]
    x = plan.replica_expert[m, l, g, r]
    other = next(h for h in range(plan.ep) if h != g and h != plan.home[l, x] and (plan.replica_expert[m, l, h] != x).all())
    plan.replica_expert[m, l, other, 0] = x
    plan.replica_start[m, l, other, 0] = plan.replica_start[m, l, g, r]
    plan.replica_tokens[m, l, other, 0] = plan.replica_tokens[m, l, g, r]
    assert plan.home_flow()[m, l, :, x].min() < 0
    with pytest.raises(PlanError, match="not conserved"):
        plan.validate()
