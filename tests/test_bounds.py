"""Lower bounds: valid for every policy's plan, tight where they should be, and hand-checked."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from relibra.bounds import (fixed_home_bound, free_placement_bound, gap_to_bound, ideal_bound, plan_lower_bound,
                            shedding_bound)
from relibra.policies import POLICY_NAMES, get_policy
from relibra.trace import static_placement
from conftest import FAST, make_trace, nodes_of, random_skewed_trace  # tests/ is on sys.path under pytest



@settings(max_examples=8, deadline=None)
@given(topo=st.sampled_from([(4, 2, 8), (8, 4, 16), (8, 2, 8), (4, 4, 12)]), seed=st.integers(0, 1000))
def test_bounds_never_exceed_any_plan(topo, seed):
    ep, gpn, experts = topo
    trace = make_trace(seed, ep, experts, tokens=25)
    for name in POLICY_NAMES:
        plan = get_policy(name, **FAST.get(name, {})).plan(trace, 1, nodes_of(gpn))
        actual = plan.gpu_tokens().max(axis=2)
        for reference in ("policy", "free", "ideal"):
            if reference == "free" and name in ("eplb", "eplb+", "eplb+lp"):
                continue  # EPLB homes are unequal: the equal-homes free bound does not apply
            assert (plan_lower_bound(plan, reference) <= actual).all(), (name, reference)


def test_hand_example_node_and_shedding():
    # 1 micro-batch, 1 layer, 4 GPUs in 2 nodes, 8 experts (2 per GPU)
    x = np.array([[[90, 10, 0, 0, 20, 20, 20, 20]]])
    home = static_placement(1, 8, 4)
    assert ideal_bound(x, 4).tolist() == [[45]]
    # node 0 holds 100 tokens on 2 GPUs: at least 50 each, with a spare slot to split
    assert fixed_home_bound(x, home, 4, 2, "node", 1).tolist() == [[50]]
    # no replicas: the homes decide
    assert fixed_home_bound(x, home, 4, 2, "none", 1).tolist() == [[100]]
    # one slot elsewhere: each GPU can shed only its heaviest expert (GPU 0 keeps 10, GPUs 2 and 3 keep 20)
    assert shedding_bound(x, home, 4, np.array([[1, 1, 1, 1]])).tolist() == [[20]]
    assert shedding_bound(x, home, 4, np.array([[2, 2, 2, 2]])).tolist() == [[0]]
    assert shedding_bound(x, home, 4, np.array([[0, 0, 0, 0]])).tolist() == [[100]]
    # anywhere: the mean 45 applies
    assert fixed_home_bound(x, home, 4, 2, "any", 1).tolist() == [[45]]
    # free placement: hottest expert 90 over at most 2 copies in a node of 2
    assert free_placement_bound(x, 4, 2, "node", 1).tolist() == [[45]]
    assert free_placement_bound(x, 4, 2, "none", 0).tolist() == [[90]]


def _set_partitions(items, size):
    """Every split of `items` into groups of `size` (unordered groups)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for others in itertools.combinations(rest, size - 1):
        left = [x for x in rest if x not in others]
        for tail in _set_partitions(left, size):
            yield [(first, *others)] + tail


@settings(max_examples=20, deadline=None)
@given(x=st.lists(st.integers(0, 50), min_size=8, max_size=8))
def test_free_bound_never_exceeds_the_best_placement_found_by_enumeration(x):
    """Without replicas, the free-placement bound is at most the best max GPU load over every
    equal-homes placement of 8 experts on 4 GPUs (105 placements), and the fixed-home bound of each
    placement equals its max GPU load counted by hand."""
    tokens = np.array([[x]])
    best = None
    for groups in _set_partitions(list(range(8)), 2):
        home = np.zeros((1, 8), dtype=np.int64)
        for g, members in enumerate(groups):
            home[0, list(members)] = g
        load = max(sum(x[e] for e in members) for members in groups)
        assert fixed_home_bound(tokens, home, 4, 2, "none", 0).item() == load
        best = load if best is None else min(best, load)
    assert free_placement_bound(tokens, 4, 2, "none", 0).item() <= best
    assert ideal_bound(tokens, 4).item() <= best


def test_balanced_sits_on_the_ideal_bound():
    trace = make_trace(1, ep=8, experts=16, tokens=40)
    balanced = get_policy("balanced").plan(trace, 0, nodes_of(4))
    assert np.allclose(gap_to_bound(balanced, "ideal"), 0, atol=0.05)


def test_relibra_replication_close_to_its_bound():

    trace = random_skewed_trace("small", ep=8, micro_batches=4, tokens_per_rank=512, seed=2)
    plan = get_policy("relibra-replicate", min_replica_tokens=1).plan(trace, 0, nodes_of(4))
    assert gap_to_bound(plan).mean() < 0.03
