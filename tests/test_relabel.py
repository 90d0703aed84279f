"""Minimal-movement relabelling (relibra.policies.relabel) and the re-plan interval of the re-homing
policies (eplb, eplb+, eplb+lp, lplb+): no expert moves between identical or permuted placements, the
matched move count never exceeds EPLB's own labels', the balance is untouched, and between re-plans
nothing moves."""

from __future__ import annotations

import numpy as np
import pytest

from relibra.errors import ConfigError
from relibra.policies import get_policy
from relibra.policies.eplb import choose_homes, eplb_copies
from relibra.policies.relabel import (apply_gpu_permutation, experts_moved, gpu_overlap, match_gpus,
                                      relabel_home, resident_after_matching)
from relibra.trace import static_placement
from conftest import make_trace, nodes_of  # tests/ is on sys.path under pytest


def eplb_placement(seed: int, ep: int, gpn: int, experts: int, layers: int = 3, slots: int = 2):
    """EPLB's copies and homes on random skewed loads: (held bool [L, E, ep], home int [L, E])."""
    rng = np.random.default_rng(seed)
    weight = rng.pareto(1.2, size=(layers, experts)) * 100 + 1
    held, home, _, _ = eplb_copies(weight, ep, gpn, slots, None)
    return held, home


def node_preserving_perm(rng, layers: int, ep: int, gpn: int) -> np.ndarray:
    """A random relabelling per layer that maps whole nodes onto nodes: int [L, ep]."""
    nodes = ep // gpn
    out = np.empty((layers, ep), dtype=np.int64)
    for layer in range(layers):
        node_to = rng.permutation(nodes)
        for n in range(nodes):
            out[layer, n * gpn:(n + 1) * gpn] = node_to[n] * gpn + rng.permutation(gpn)
    return out


def gpu_sets(held: np.ndarray) -> list[list[tuple]]:
    """Per layer, the sorted list of each GPU's set of experts (labels forgotten): the balance."""
    return [sorted(tuple(np.nonzero(held[layer, :, g])[0]) for g in range(held.shape[2]))
            for layer in range(held.shape[0])]


def test_overlap_counts_experts_resident():
    held = np.zeros((1, 4, 2), dtype=bool)
    held[0, [0, 1], 0] = True
    held[0, [2, 3], 1] = True
    held[0, 3, 0] = True  # expert 3 has copies on both GPUs
    prev = np.array([[1, 1, 0, 0]])
    np.testing.assert_array_equal(gpu_overlap(held, prev)[0], [[1, 2], [2, 0]])
    perm = match_gpus(held, prev, group_size=2)
    np.testing.assert_array_equal(perm, [[1, 0]])  # swap: experts 0, 1 stay on GPU 1, 2 and 3 on GPU 0
    assert resident_after_matching(held, prev, 2) == 4


@pytest.mark.parametrize("ep,gpn,experts", [(4, 4, 16), (8, 4, 32), (16, 8, 64)])
def test_identical_placement_moves_nothing(ep, gpn, experts):
    held, home = eplb_placement(0, ep, gpn, experts)
    perm = match_gpus(held, home, gpn)
    np.testing.assert_array_equal(perm, np.broadcast_to(np.arange(ep), perm.shape))
    assert experts_moved(home, choose_homes(apply_gpu_permutation(held, perm), home)) == 0


@pytest.mark.parametrize("ep,gpn,experts", [(4, 4, 16), (8, 4, 32), (16, 8, 64), (16, 2, 64)])
def test_permuted_placement_moves_nothing(ep, gpn, experts):
    rng = np.random.default_rng(1)
    held, home = eplb_placement(1, ep, gpn, experts)
    shuffle = node_preserving_perm(rng, held.shape[0], ep, gpn)
    shuffled = apply_gpu_permutation(held, shuffle)
    assert experts_moved(home, choose_homes(shuffled)) > 0  # the labels did change
    back = apply_gpu_permutation(shuffled, match_gpus(shuffled, home, gpn))
    np.testing.assert_array_equal(back, held)
    assert experts_moved(home, choose_homes(back, home)) == 0
    # a flat placement (one group) is matched back from any permutation
    flat = apply_gpu_permutation(held, np.stack([rng.permutation(ep) for _ in range(held.shape[0])]))
    assert experts_moved(home, choose_homes(apply_gpu_permutation(flat, match_gpus(flat, home, ep)), home)) == 0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ep,gpn,experts", [(8, 4, 32), (16, 8, 64), (32, 8, 64)])
def test_matching_never_moves_more_and_keeps_the_balance(seed, ep, gpn, experts):
    prev_held, prev_home = eplb_placement(100 + seed, ep, gpn, experts)
    held, home = eplb_placement(seed, ep, gpn, experts)
    perm = match_gpus(held, prev_home, gpn)
    assert (np.sort(perm, axis=1) == np.arange(ep)).all()  # a permutation in every layer
    nodes = perm // gpn  # whole nodes onto whole nodes
    assert (nodes.reshape(-1, ep // gpn, gpn) == nodes.reshape(-1, ep // gpn, gpn)[:, :, :1]).all()
    matched = apply_gpu_permutation(held, perm)
    assert gpu_sets(matched) == gpu_sets(held)  # the same GPUs' contents: EPLB's balance
    for reference in (None, relabel_home(home, perm)):  # the balancing choice, EPLB's own homes relabelled
        new_home = choose_homes(matched, prev_home, reference)
        assert matched[np.arange(held.shape[0])[:, None], np.arange(experts)[None], new_home].all()
        assert experts_moved(prev_home, new_home) <= experts_moved(prev_home, home)
        assert experts_moved(prev_home, new_home) <= experts_moved(prev_home, relabel_home(home, perm))
        # staying home gives no GPU more homes (optimizer state) or replicas than the reference's busiest
        homes, replicas = per_gpu(matched, new_home)
        ref = choose_homes(matched) if reference is None else reference
        homes_r, replicas_r = per_gpu(matched, ref)
        assert (homes.max(axis=1) <= homes_r.max(axis=1)).all()
        assert (replicas.max(axis=1) <= replicas_r.max(axis=1)).all()


def per_gpu(held: np.ndarray, home: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Homes and replicas per GPU: (int [L, ep], int [L, ep])."""
    homes = np.stack([np.bincount(row, minlength=held.shape[2]) for row in home])
    return homes, held.sum(axis=1) - homes


def test_bad_group_size():
    held, home = eplb_placement(0, 8, 4, 32)
    with pytest.raises(ConfigError, match="group_size=3 must divide ep=8"):
        match_gpus(held, home, 3)


@pytest.mark.parametrize("name", ["eplb", "eplb+", "eplb+lp", "lplb+"])
def test_policies_move_no_more_than_their_own_labels(name):
    trace = make_trace(3, ep=8, experts=32, layers=3, steps=4)
    topo = nodes_of(4)
    static = static_placement(trace.num_layers, trace.num_experts, trace.ep)
    matched = get_policy(name).plan_steps(trace, [1, 2, 3], topo, warmup=1, initial_home=static)
    fewer = 0
    for step, plan in enumerate(matched, start=1):
        plan.validate(trace.loads[step])
        raw = get_policy(name, relabel=False).plan(trace, step, topo, plan.prev_home)  # from the same homes
        assert experts_moved(plan.prev_home, plan.home) <= experts_moved(plan.prev_home, raw.home)
        fewer += experts_moved(plan.prev_home, plan.home) < experts_moved(plan.prev_home, raw.home)
    assert fewer > 0


@pytest.mark.parametrize("name", ["eplb", "eplb+", "eplb+lp", "lplb+"])
@pytest.mark.parametrize("relabel", [True, False])
def test_placement_stays_between_replans(name, relabel):
    trace = make_trace(4, ep=8, experts=32, layers=2, steps=8)
    plans = get_policy(name, replan_interval=3, relabel=relabel).plan_steps(trace, range(1, 8), nodes_of(4),
                                                                            warmup=1)
    for step, plan in zip(range(1, 8), plans):
        plan.validate(trace.loads[step])
        moved = experts_moved(plan.prev_home, plan.home)
        if step % 3:
            assert moved == 0, step
            assert plan.replica_expert.max() >= 0 or name == "lplb+"
        else:
            assert moved > 0, step
    # a re-plan from the interval's first step gives the same homes as that step's own plan
    one = get_policy(name, relabel=relabel).plan(trace, 3, nodes_of(4), plans[1].home)
    np.testing.assert_array_equal(one.home, plans[2].home)


@pytest.mark.parametrize("name", ["eplb", "eplb+", "eplb+lp", "lplb+"])
def test_replan_phase_moves_the_replans(name):
    trace = make_trace(4, ep=8, experts=32, layers=2, steps=8)
    plans = get_policy(name, replan_interval=3, replan_phase=2).plan_steps(trace, range(1, 8), nodes_of(4), warmup=1)
    moved = [step for step, plan in zip(range(1, 8), plans) if experts_moved(plan.prev_home, plan.home)]
    assert moved == [2, 5]
    with pytest.raises(ConfigError, match=r"replan_phase must be an integer in \[0, replan_interval = 3\), got 3"):
        get_policy(name, replan_interval=3, replan_phase=3)


@pytest.mark.parametrize("name", ["eplb", "eplb+", "eplb+lp", "lplb+"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_replan_interval_is_checked(name, bad):
    with pytest.raises(ConfigError, match="replan_interval must be a positive number of steps"):
        get_policy(name, replan_interval=bad)


def test_relabel_is_checked():
    with pytest.raises(ConfigError, match="relabel must be true or false"):
        get_policy("eplb+", relabel="yes")


# ---- the re-plan interval, chosen above the policies (relibra.studies.replan) ----------------------
def test_choose_replan_interval_keeps_the_best_throughput():
    from relibra.studies.replan import choose_replan_interval
    from relibra.setups import load_card

    trace = make_trace(5, ep=8, experts=32, layers=2, steps=8)
    card = load_card("slime-qwen3-30b")
    best, table = choose_replan_interval(trace, nodes_of(4), "eplb+", card, candidates=(1, 2, 4))
    assert list(table["replan_interval"]) == [1, 2, 4]
    assert best == int(table.loc[table["tokens_per_s"].idxmax(), "replan_interval"])
    moved = table.set_index("replan_interval")["experts_moved"]
    assert moved[4] < moved[1]  # fewer re-plans move fewer experts per step


def test_replan_inputs_are_checked():
    from relibra.studies.replan import choose_replan_interval, replan_steps, replan_window
    from relibra.setups import load_card

    assert replan_window((1, 2, 4, 8)) == 8 and replan_window((2, 3)) == 6
    with pytest.raises(ConfigError, match="positive integers"):
        replan_window((1, 0))
    with pytest.raises(ConfigError, match="needs 8 steps"):
        replan_steps(make_trace(0, ep=4, experts=8, steps=7), (1, 2, 4))
    assert replan_steps(make_trace(0, ep=4, experts=8, steps=13), (1, 2, 4)) == [8, 9, 10, 11]
    with pytest.raises(ConfigError, match="'relibra' does not re-home experts"):
        choose_replan_interval(make_trace(0, ep=4, experts=8, steps=8), nodes_of(4), "relibra",
                               load_card("slime-qwen3-30b"))
