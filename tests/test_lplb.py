"""lplb+ (LPLB): its topologies, EPLB's reorder without replication, one copy per top expert along
the topology, and the per-micro-batch LP checked against an independent optimum (the cut formula)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from relibra.policies import get_policy
from relibra.policies.eplb import rebalance_experts
from relibra.policies.lplb import CUBE_8, lplb_r2o, torus_r2o
from conftest import make_trace, nodes_of  # tests/ is on sys.path under pytest


def test_topologies_follow_lplb():
    r2o, size = lplb_r2o(8, 8)
    assert size == 8 and r2o.tolist() == np.array(CUBE_8).T.tolist()
    assert r2o[0].tolist() == [3, 6]  # GPU 0 copies from GPUs 3 and 6
    assert lplb_r2o(16, 8)[1] == 16
    r2o, size = lplb_r2o(32, 8)  # torus: next node's same GPU, and the next GPU of the same node
    assert size == 32 and r2o[0].tolist() == [8, 1] and r2o[31].tolist() == [7, 24]
    assert (torus_r2o(4, 8) == r2o).all()
    r2o, size = lplb_r2o(32, 8, "cube")  # 4 groups of 8
    assert size == 8 and r2o[8].tolist() == [11, 14]
    assert lplb_r2o(2, 2)[0].tolist() == [[1], [0]]  # one node of 2: the torus's node side only
    assert lplb_r2o(1, 1)[0].shape == (1, 0)


@pytest.mark.parametrize("ep,gpn,experts", [(8, 4, 16), (8, 8, 32), (4, 2, 8), (16, 8, 32)])
def test_copies_and_reorder(ep, gpn, experts):
    trace = make_trace(3, ep, experts, micro_batches=3, tokens=60)
    plan = get_policy("lplb+").plan(trace, 1, nodes_of(gpn))
    plan.validate(trace.loads[1])
    weight = trace.loads[1].sum(axis=(0, 2)).astype(np.float64)
    r2o, size = lplb_r2o(ep, gpn)
    phy2log = rebalance_experts(torch.from_numpy(weight), experts, ep // size, ep // gpn, ep)[0].numpy()
    k = experts // ep
    want_home = np.empty_like(phy2log)
    np.put_along_axis(want_home, phy2log, np.arange(experts)[None] // k, axis=1)
    assert (plan.home == want_home).all()  # EPLB's placement without replication
    for layer in range(plan.num_layers):
        replicas = {(g, int(x)) for g in range(ep) for x in plan.replica_expert[0, layer, g] if x >= 0}
        # every micro-batch keeps the same copies (fixed for the step)
        assert (plan.replica_expert[:, layer] == plan.replica_expert[0, layer]).all()
        want = set()
        for g in range(ep):
            for j in range(r2o.shape[1]):
                src = r2o[g, j]
                mine = [int(x) for x in phy2log[layer, src * k:(src + 1) * k]]
                ranked = sorted(mine, key=lambda x: -weight[layer, x])
                want.add((g, ranked[j]))
        assert replicas == want
        copies = np.bincount([x for _, x in replicas], minlength=experts) + 1
        assert copies.max() <= 2
    assert plan.info.lp_fallback_micro_batches == 0
    part = plan.runtime_planner
    assert part.cells == plan.num_microbatches * plan.num_layers
    assert part.collective == "all_reduce" and part.collective_bytes == 4 * experts
    assert part.cpu_seconds >= 0 and not plan.transfers_on_critical_path
    assert plan.planner_on_critical_path  # the solve runs between routing and dispatch


def cut_optimum(base: np.ndarray, edges: list) -> float:
    """min over flows of the max load = max over GPU sets S of (load of S - capacity leaving S) / |S|
    (Gale's feasibility theorem), by enumerating every S. edges: (from GPU, to GPU, capacity)."""
    n = len(base)
    best = -np.inf
    for size in range(1, n + 1):
        for s in itertools.combinations(range(n), size):
            inside = set(s)
            out = sum(c for a, b, c in edges if a in inside and b not in inside)
            best = max(best, (sum(base[g] for g in s) - out) / size)
    return best


@pytest.mark.parametrize("ep,gpn,experts,seed", [(4, 2, 8, 0), (4, 2, 12, 1), (8, 4, 16, 2), (8, 8, 24, 3)])
def test_lp_reaches_the_optimum_of_every_cell(ep, gpn, experts, seed):
    trace = make_trace(seed, ep, experts, micro_batches=3, tokens=50, skew=1.5)
    plan = get_policy("lplb+").plan(trace, 0, nodes_of(gpn))
    x = trace.loads[0].sum(axis=2)  # [M, L, E]
    gpu = plan.gpu_tokens()
    checked = 0
    for mb in range(plan.num_microbatches):
        for layer in range(plan.num_layers):
            base = np.bincount(plan.home[layer], weights=x[mb, layer], minlength=ep)
            edges = [(int(plan.home[layer, e]), g, int(x[mb, layer, e])) for g in range(ep)
                     for e in plan.replica_expert[mb, layer, g] if e >= 0]
            best = cut_optimum(base, edges)
            got = gpu[mb, layer].max()
            # replicas take floor(flow): a home keeps at most one token more per copy it feeds (2 here)
            assert best - 1e-6 <= got <= best + 2 + 1e-6, (mb, layer, got, best)
            checked += 1
    assert checked == plan.num_microbatches * plan.num_layers
