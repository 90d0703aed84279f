"""Beyond the paper's scale: model and cluster presets, shape specs, EP layouts, relibra-h."""

import numpy as np
import pytest

from relibra.cluster import get_model, get_topology, parse_model, parse_topology
from relibra.errors import ConfigError
from relibra.policies import get_policy
from relibra.sim import simulate
from relibra.workloads import generate_trace


def test_large_model_presets():
    ds, kimi = get_model("deepseek-v3"), get_model("kimi-k2")
    assert (ds.num_experts, ds.top_k, ds.num_layers, ds.num_dense_layers, ds.hidden, ds.moe_ffn,
            ds.num_shared_experts) == (256, 8, 58, 3, 7168, 2048, 1)
    assert (kimi.num_experts, kimi.top_k, kimi.num_layers, kimi.num_dense_layers, kimi.hidden, kimi.moe_ffn,
            kimi.num_shared_experts) == (384, 8, 60, 1, 7168, 2048, 1)


def test_model_spec_like_cluster_spec():
    small = get_model("deepseek-v3,layers=4")  # get_model takes specs, so every --model does
    assert small.num_layers == 4 and small.num_experts == 256 and small.name == "deepseek-v3,layers=4"
    custom = parse_model("layers=8,experts=64,top_k=4,hidden=1024,moe_ffn=512,name=m64")
    assert (custom.name, custom.num_experts, custom.moe_ffn) == ("m64", 64, 512)
    for bad, match in (("layers=8,experts=64", "needs top_k"), ("deepseek-v3,wings=2", "unknown field"),
                       ("deepseek-v3,layers=x", "integer"), ("layers=2,deepseek-v3", "must come first"),
                       ("nope,layers=2", "unknown preset")):
        with pytest.raises(ConfigError, match=match):
            parse_model(bad)


@pytest.mark.parametrize("cluster, ep, layout", [
    ("gb200-nvl72", 64, (1, 64)), ("gb200-nvl72", 72, (1, 72)), ("gb200-nvl72x4", 128, (2, 64)),
    ("gb200-nvl72x4", 256, (4, 64)), ("h100", 256, (32, 8)), ("h800", 128, (16, 8)), ("paper", 32, (4, 8)),
    ("paper", 4, (1, 4)), ("paper,nodes=32", 256, (32, 8)),
])
def test_ep_layout_need_not_divide_the_node(cluster, ep, layout):
    assert parse_topology(cluster).ep_layout(ep) == layout


def test_ep_layout_errors_name_the_fix():
    with pytest.raises(ConfigError, match="nodes=32"):
        get_topology("paper").ep_layout(256)
    with pytest.raises(ConfigError, match="cannot spread evenly"):
        parse_topology("paper,nodes=2").ep_layout(15)  # 15 GPUs need 3 nodes of 5
    with pytest.raises(ConfigError, match="positive"):
        get_topology("paper").ep_layout(0)


@pytest.fixture(scope="module")
def wide_trace():
    """A DeepSeek-V3-shaped layer at EP64 on 8-GPU nodes: hot experts overflow their node."""
    return generate_trace("deepseek-v3,layers=1", "mixed", ep=64, steps=1, micro_batches=2)


def test_relibra_h_replicates_across_nodes_and_balances_better(wide_trace):
    topo = parse_topology("paper,nodes=8")
    base = get_policy("relibra").plan(wide_trace, 0, topo)
    hier = get_policy("relibra-h").plan(wide_trace, 0, topo)
    hier.validate(wide_trace.loads[0])
    assert hier.replica_scope == "any" and hier.info.cross_node_replicas > 0
    rexp = hier.replica_expert
    mi, li, gi, ri = np.nonzero(rexp >= 0)
    homes = hier.home[li, rexp[mi, li, gi, ri]]
    assert (homes // 8 != gi // 8).any()  # some replica sits outside its home's node
    assert np.array_equal(base.home, hier.home)  # ReLibra's reordering is unchanged
    assert hier.gpu_tokens().max(axis=2).sum() < base.gpu_tokens().max(axis=2).sum()


def test_relibra_h_is_relibra_on_one_node():
    trace = generate_trace("small", "mixed", ep=8, steps=1, micro_batches=2, tokens_per_rank=256)
    topo = get_topology("paper")
    base = get_policy("relibra", min_replica_tokens=4).plan(trace, 0, topo)
    hier = get_policy("relibra-h", min_replica_tokens=4).plan(trace, 0, topo)
    assert hier.info.cross_node_replicas == 0
    assert np.array_equal(base.home, hier.home) and np.array_equal(base.replica_expert, hier.replica_expert)
    assert np.array_equal(base.replica_start, hier.replica_start)
    assert np.array_equal(base.replica_tokens, hier.replica_tokens)


def test_relibra_h_simulates_no_slower_than_relibra(wide_trace):
    res = simulate(wide_trace, "paper,nodes=8", ["relibra", "relibra-h"], progress=False)
    tps = res.summary.set_index("policy")["tokens_per_s"]
    assert tps["relibra-h"] >= tps["relibra"]
