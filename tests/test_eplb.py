"""EPLB's public contract: the README example exactly, the hierarchical/global split, and the plan
built from its slots."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relibra.cluster import get_topology
from relibra.errors import ConfigError
from relibra.policies import get_policy
from relibra.policies.eplb import balanced_packing, copies_from_phy2log, rebalance_experts, replicate_experts

README_WEIGHT = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                 [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
README_PHY2LOG = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                  [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]


def nodes_of(gpus_per_node: int):
    """The paper cluster's rates on nodes of `gpus_per_node` GPUs (the EP ranks pack into them)."""
    return get_topology("paper").with_changes(gpus_per_node=gpus_per_node)


def test_readme_example_exactly():
    phy2log, log2phy, logcnt = rebalance_experts(torch.tensor(README_WEIGHT), 16, 4, 2, 8)
    assert isinstance(phy2log, torch.Tensor) and phy2log.dtype == torch.int64
    assert phy2log.tolist() == README_PHY2LOG
    assert logcnt.tolist() == [[1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1], [1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1]]
    assert log2phy.shape == (2, 12, 16 - 12 + 1)
    # log2phy is the inverse of phy2log, -1 padded
    for layer in range(2):
        for expert in range(12):
            slots = [s for s in log2phy[layer, expert].tolist() if s >= 0]
            assert len(slots) == logcnt[layer, expert]
            assert all(phy2log[layer, s] == expert for s in slots)


def test_hierarchical_keeps_copies_in_the_group_node():
    rng = np.random.default_rng(0)
    weight = torch.from_numpy(rng.integers(1, 500, size=(3, 16)))
    phy2log, _, logcnt = rebalance_experts(weight, 24, 4, 2, 8)
    node = (torch.arange(24) // 12).expand(3, -1)
    for layer in range(3):
        for expert in range(16):
            nodes = set(node[layer][phy2log[layer] == expert].tolist())
            assert len(nodes) == 1  # every copy of an expert sits in one node
    assert (logcnt.sum(axis=1) == 24).all()


def test_global_policy_when_groups_do_not_split_over_nodes():
    weight = torch.tensor(README_WEIGHT)
    phy2log, _, logcnt = rebalance_experts(weight, 16, 3, 2, 8)  # 3 groups, 2 nodes: global
    assert (torch.bincount(phy2log[0], minlength=12) == logcnt[0]).all()
    # the heaviest experts got the redundant slots
    assert set(torch.nonzero(logcnt[0] > 1).flatten().tolist()) == {1, 4, 5, 10}


def test_packing_and_replication_rules():
    pack, rank = balanced_packing(np.array([[5.0, 4.0, 3.0, 2.0]]), 2)
    assert pack.tolist() == [[0, 1, 1, 0]] and rank.tolist() == [[0, 0, 1, 1]]
    phy2log, copy_rank, copies = replicate_experts(np.array([[10.0, 10.0, 1.0]]), 5)
    assert phy2log.tolist() == [[0, 1, 2, 0, 1]]  # ties to the lowest index
    assert copies.tolist() == [[2, 2, 1]] and copy_rank.tolist() == [[0, 0, 0, 1, 1]]


def test_bad_sizes_raise():
    w = torch.ones(1, 12)
    with pytest.raises(ConfigError, match="fewer than the 12 experts"):
        rebalance_experts(w, 10, 4, 2, 2)
    with pytest.raises(ConfigError, match="does not divide num_replicas"):
        rebalance_experts(w, 15, 4, 2, 8)
    with pytest.raises(ConfigError, match="does not divide the 12 experts"):
        rebalance_experts(w, 16, 5, 1, 8)


def test_plan_maps_slots_to_homes_and_replicas():
    from test_policies import make_trace  # tests/ is on sys.path under pytest

    trace = make_trace(3, ep=8, experts=16, micro_batches=4, tokens=80)
    plan = get_policy("eplb+", redundant_slots_per_gpu=1).plan(trace, 1, nodes_of(4))
    plan.validate(trace.loads[1])
    assert plan.replica_scope == "node" and plan.slots_per_gpu == 16 // 8 + 1
    assert not plan.equal_homes
    phy2log, _, _ = rebalance_experts(torch.from_numpy(trace.loads[1].sum(axis=(0, 2)).astype(np.float64)),
                                      24, 16, 2, 8)
    held = copies_from_phy2log(phy2log.numpy(), 8, 16)
    assert held[np.arange(2)[:, None], np.arange(16)[None], plan.home].all()  # homes are copies
    copies = held.sum(axis=2)
    # replicas are the other copies, the same in every micro-batch, and split tokens evenly
    for layer in range(2):
        for expert in np.nonzero(copies[layer] > 1)[0]:
            x = trace.loads[1, :, layer, :, expert].sum(axis=1)  # [M]
            per_copy = plan.replica_flow[:, layer].sum(axis=1)[plan.replica_expert[:, layer] == expert]
            per_copy = per_copy.reshape(4, -1)
            assert per_copy.shape[1] == copies[layer, expert] - 1
            assert (np.abs(per_copy - x[:, None] / copies[layer, expert]) <= 1).all()
    global_plan = get_policy("eplb+", num_groups=1).plan(trace, 1, nodes_of(4))
    assert global_plan.replica_scope == "any"
    global_plan.validate(trace.loads[1])
