"""The cost model and simulator: physical sanity (balance, bandwidth, migration, linearity), the
tidy output, calibration, errors and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relibra.cluster import ModelShape, Topology, get_model, get_topology, parse_topology
from relibra.costs import (CostParams, collective_seconds, cost_plan, expert_flops_per_token, fit_gemm_efficiency,
                           link_seconds, replica_memory)
from relibra.errors import ConfigError, PlanError
from relibra.metrics import METRIC_COLUMNS
from relibra.plan import StepPlan, empty_replicas
from relibra.trace import RoutingTrace, static_placement

MODEL = ModelShape("sim-test", num_layers=3, num_experts=16, top_k=2, hidden=256, moe_ffn=512,
                   num_attention_heads=4, num_kv_heads=2, head_dim=64, vocab_size=1000)
TOPO = Topology("test", num_nodes=2, gpus_per_node=4, nvlink_GBps=100.0, rdma_GBps=10.0, matmul_tflops=50.0,
                gemm_half_tokens=64.0)


def nodes_of(gpus_per_node: int):
    """The paper cluster's rates on nodes of `gpus_per_node` GPUs (the EP ranks pack into them)."""
    return get_topology("paper").with_changes(gpus_per_node=gpus_per_node)


def _loads(rng, m, ep, tokens_per_rank, alpha=0.3, model=MODEL):
    """Skewed int32 loads [M, L, ep, E], each (m, l, src) summing to tokens_per_rank * top_k."""
    p = rng.dirichlet(np.full(model.num_experts, alpha), size=(m, model.num_layers, ep))
    flat = p.reshape(-1, model.num_experts)
    counts = np.stack([rng.multinomial(tokens_per_rank * model.top_k, row) for row in flat])
    return counts.reshape(m, model.num_layers, ep, model.num_experts).astype(np.int32)


def _static_plan(loads, gpn, slots=0, policy="megatron", home=None, uniform=False):
    m, l, ep, e = loads.shape
    rexp, rflow = empty_replicas(m, l, ep, slots)
    home = static_placement(l, e, ep) if home is None else home
    return StepPlan(policy, loads, home, rexp, rflow, gpn, e // ep + slots, uniform_routing=uniform)


def _replicated_plan(loads, gpn, rng, slots=2, scope="node", critical=False, home=None):
    """Random valid replicas: each GPU copies random experts homed elsewhere (in its node for scope
    'node') and takes a random share of their tokens from every source."""
    m, l, ep, e = loads.shape
    home = static_placement(l, e, ep) if home is None else home
    rexp, rflow = empty_replicas(m, l, ep, slots)
    for mi in range(m):
        for li in range(l):
            taken = np.zeros((ep, e), dtype=np.int64)
            for g in range(ep):
                if scope == "node":
                    candidates = np.nonzero((home[li] // gpn == g // gpn) & (home[li] != g))[0]
                else:
                    candidates = np.nonzero(home[li] != g)[0]
                pick = rng.choice(candidates, size=min(slots, len(candidates)), replace=False)
                for r, ex in enumerate(pick):
                    share = rng.random()
                    flow = np.floor((loads[mi, li, :, ex] - taken[:, ex]) * share).astype(np.int64)
                    rexp[mi, li, g, r] = ex
                    rflow[mi, li, :, g, r] = flow
                    taken[:, ex] += flow
    plan = StepPlan("test-replicas", loads, home, rexp, rflow, gpn, e // ep + slots, replica_scope=scope,
                    transfers_on_critical_path=critical)
    plan.validate(loads)
    return plan


def _uniform_loads(m, ep, tokens_per_rank, model=MODEL):
    per = tokens_per_rank * model.top_k // model.num_experts
    return np.full((m, model.num_layers, ep, model.num_experts), per, dtype=np.int32)


# ---- balance --------------------------------------------------------------------------------------
@pytest.mark.parametrize("route", ["rail", "direct"])
@pytest.mark.parametrize("nvlink_GBps", [100.0, 1.0])
def test_zero_imbalance_matches_closed_form(route, nvlink_GBps):
    """Uniform routing on static homes: every GPU sends and receives the same bytes; the closed form."""
    ep, gpn, tokens = 8, 4, 512
    topo = TOPO.with_changes(nvlink_GBps=nvlink_GBps)
    loads = _uniform_loads(2, ep, tokens)
    cost = cost_plan(_static_plan(loads, gpn), MODEL, topo, CostParams(route=route, dedup=False))
    pair_bytes = tokens * MODEL.top_k / ep * MODEL.token_bytes  # each src to each GPU
    nodes = ep // gpn
    # rail: NVLink carries the node's own traffic plus what the rail GPU relays from the other nodes
    nvl_streams = (gpn - 1) * (nodes if route == "rail" else 1)
    nvl = nvl_streams * pair_bytes / (nvlink_GBps * 1e9)
    rdma = (ep - gpn) * pair_bytes / (TOPO.rdma_GBps * 1e9)
    assert np.allclose(cost.forward["dispatch"], max(nvl, rdma) + TOPO.collective_latency_s)
    assert np.allclose(cost.forward["combine"], cost.forward["dispatch"])
    rows_per_gpu = tokens * MODEL.top_k
    experts_per_gpu = MODEL.num_experts // ep
    expert = expert_flops_per_token(MODEL) * (rows_per_gpu + TOPO.gemm_half_tokens * experts_per_gpu) / 50e12
    assert np.allclose(cost.forward["expert_compute"], expert)
    assert np.allclose(cost.backward["expert_compute"], 2 * expert)
    assert np.allclose(cost.skewness(), 1.0)


def test_zero_imbalance_gives_the_balanced_time():
    """A trace that is already uniform costs what the `balanced` policy makes of a skewed trace
    with the same per-source token counts."""
    from relibra.policies import get_policy

    ep, gpn, tokens = 8, 4, 512
    rng = np.random.default_rng(1)
    skewed = RoutingTrace(_loads(rng, 3, ep, tokens)[None], MODEL, ep, ep * tokens)
    uniform = _uniform_loads(3, ep, tokens)
    balanced = get_policy("balanced").plan(skewed, 0, nodes_of(gpn))
    assert np.array_equal(balanced.loads, uniform)
    a = cost_plan(balanced, MODEL, TOPO).step_seconds
    b = cost_plan(_static_plan(uniform, gpn), MODEL, TOPO).step_seconds
    assert a == pytest.approx(b, rel=1e-12)
    skewed_cost = cost_plan(_static_plan(skewed.loads[0], gpn), MODEL, TOPO).step_seconds
    assert skewed_cost > a


def _small_trace():
    from relibra.workloads import generate_trace

    return generate_trace("small", "mixed", 8, steps=3, seed=3, micro_batches=3, tokens_per_rank=512)


def test_balanced_is_never_slower_than_any_policy():
    from relibra.policies import POLICY_NAMES
    from relibra.sim import simulate

    trace = _small_trace()
    topo = parse_topology("paper,num_nodes=2,gpus_per_node=4")
    result = simulate(trace, topo, list(POLICY_NAMES), steps=2, progress=False)
    s = result.summary.set_index("policy")
    assert set(POLICY_NAMES) <= set(s.index)
    assert (s["tokens_per_s"] <= s.loc["balanced", "tokens_per_s"] * (1 + 1e-9)).all(), s["tokens_per_s"]
    assert s.loc["balanced", "frac_of_balanced"] == pytest.approx(1.0)
    assert s.loc["megatron", "speedup_vs_megatron"] == pytest.approx(1.0)


# ---- monotonicity -----------------------------------------------------------------------------------
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), nvl=st.floats(1.0, 8.0), rdma=st.floats(1.0, 8.0), flops=st.floats(1.0, 4.0),
       critical=st.booleans(), buffer=st.sampled_from(["layer-shared", "per-layer"]),
       route=st.sampled_from(["rail", "direct"]), dedup=st.booleans())
def test_more_bandwidth_is_never_slower(seed, nvl, rdma, flops, critical, buffer, route, dedup):
    rng = np.random.default_rng(seed)
    ep, gpn = 8, 4
    loads = _loads(rng, 2, ep, 256)
    home = np.stack([rng.permutation(static_placement(1, MODEL.num_experts, ep)[0]) for _ in range(MODEL.num_layers)])
    plan = _replicated_plan(loads, gpn, rng, scope="any" if critical else "node", critical=critical, home=home)
    prev = static_placement(MODEL.num_layers, MODEL.num_experts, ep)
    params = CostParams(replica_buffer=buffer, seq_len=512, route=route, dedup=dedup)
    # a short attention window so that replica transfers are partly exposed
    slow = TOPO.with_changes(nvlink_GBps=5.0, rdma_GBps=1.0)
    wider = slow.with_changes(nvlink_GBps=5.0 * nvl, rdma_GBps=1.0 * rdma)
    faster = wider.with_changes(matmul_tflops=50.0 * flops)
    a, b, c = (cost_plan(plan, MODEL, t, params, prev_home=prev, planner_s=0.01) for t in (slow, wider, faster))
    assert b.step_seconds <= a.step_seconds * (1 + 1e-12)
    assert c.step_seconds <= b.step_seconds * (1 + 1e-12)
    # wider links alone shrink every component; faster GEMMs may expose more of a transfer (a shorter
    # attention window) but never lengthen the step
    ta, tb = a.totals(), b.totals()
    for comp in ta:
        assert tb[comp] <= ta[comp] * (1 + 1e-12) + 1e-15, comp


def test_overlap_hides_transfers_up_to_attention_and_critical_path_does_not():
    rng = np.random.default_rng(5)
    ep, gpn = 8, 4
    loads = _loads(rng, 2, ep, 256)
    overlapped = _replicated_plan(loads, gpn, np.random.default_rng(6), scope="node")
    critical = _replicated_plan(loads, gpn, np.random.default_rng(6), scope="node", critical=True)
    long_attention = CostParams(seq_len=200_000)
    hidden = cost_plan(overlapped, MODEL, TOPO, long_attention)
    assert hidden.totals()["replica_push"] == 0 and hidden.totals()["replica_grad"] == 0
    exposed = cost_plan(critical, MODEL, TOPO, long_attention, planner_s=0.0)
    assert exposed.totals()["replica_push"] > 0 and exposed.totals()["replica_grad"] > 0
    assert exposed.totals()["planner"] > 0  # the run-time planner's count all-gather
    short = cost_plan(overlapped, MODEL, TOPO.with_changes(nvlink_GBps=0.01), CostParams(seq_len=1))
    assert short.totals()["replica_push"] > 0


def test_replica_buffers_memory_and_pushes():
    rng = np.random.default_rng(7)
    ep, gpn = 8, 4
    loads = _loads(rng, 3, ep, 256)
    plan = _replicated_plan(loads, gpn, rng, slots=2)
    # the same replicas in every micro-batch: a per-layer buffer pushes them once
    plan.replica_expert[1:] = plan.replica_expert[0]
    plan.replica_flow[:] = 0
    plan.validate(loads)
    shared = cost_plan(plan, MODEL, TOPO.with_changes(nvlink_GBps=0.01), CostParams(seq_len=1))
    per_layer = cost_plan(plan, MODEL, TOPO.with_changes(nvlink_GBps=0.01), CostParams(seq_len=1,
                                                                                       replica_buffer="per-layer"))
    assert per_layer.forward["replica_push"][1:].sum() == 0 and per_layer.forward["replica_push"][0].min() > 0
    assert (shared.forward["replica_push"] > 0).all() and (shared.backward["replica_push"] > 0).all()
    assert per_layer.backward["replica_push"].sum() == 0
    assert per_layer.memory["replica_buffer_bytes"] == MODEL.num_layers * shared.memory["replica_buffer_bytes"]
    mem = replica_memory(MODEL, ep, [2, 1, 2], "layer-shared")
    assert mem["replica_buffer_bytes"] == 2 * MODEL.expert_params * (MODEL.bytes_per_param + 2)
    assert 0 < mem["replica_memory_share"] < 1


# ---- migration --------------------------------------------------------------------------------------
def test_a_plan_that_moves_nothing_costs_no_migration():
    rng = np.random.default_rng(2)
    loads = _loads(rng, 2, 8, 128)
    home = np.stack([rng.permutation(static_placement(1, 16, 8)[0]) for _ in range(MODEL.num_layers)])
    plan = _static_plan(loads, 4, home=home)
    assert cost_plan(plan, MODEL, TOPO, prev_home=home.copy()).migration_s == 0
    assert cost_plan(plan, MODEL, TOPO, prev_home=None).migration_s == 0
    # swapping two experts across nodes moves two experts' weights + optimizer state over RDMA
    prev = home.copy()
    a, b = np.nonzero(home[0] // 4 == 0)[0][0], np.nonzero(home[0] // 4 == 1)[0][0]
    prev[0, [a, b]] = prev[0, [b, a]]
    cost = cost_plan(plan, MODEL, TOPO, prev_home=prev)
    state = MODEL.expert_params * (MODEL.bytes_per_param + MODEL.optimizer_bytes_per_param)
    assert cost.migration_bytes == {"intra_node": 0, "inter_node": 2 * state, "experts_moved": 2}
    assert cost.migration_s == pytest.approx(state / (TOPO.rdma_GBps * 1e9) + TOPO.collective_latency_s)


# ---- linearity ----------------------------------------------------------------------------------------
def test_time_is_linear_in_micro_batches_at_fixed_load():
    rng = np.random.default_rng(4)
    loads = _loads(rng, 3, 8, 256)
    prev = static_placement(MODEL.num_layers, MODEL.num_experts, 8)
    home = prev.copy()
    home[:, [0, 15]] = home[:, [15, 0]]
    one = _replicated_plan(loads, 4, np.random.default_rng(9), home=home)
    reps = 4
    many = StepPlan(one.policy, np.tile(one.loads, (reps, 1, 1, 1)), home, np.tile(one.replica_expert, (reps, 1, 1, 1)),
                    np.tile(one.replica_flow, (reps, 1, 1, 1, 1)), 4, one.slots_per_gpu, one.replica_scope)
    a = cost_plan(one, MODEL, TOPO, prev_home=prev)
    b = cost_plan(many, MODEL, TOPO, prev_home=prev)
    per_step = a.migration_s + a.optimizer_s
    assert b.migration_s + b.optimizer_s == pytest.approx(per_step)
    assert b.step_seconds - per_step == pytest.approx(reps * (a.step_seconds - per_step), rel=1e-12)
    assert b.tokens == reps * a.tokens


# ---- consistency with the plan's own accounting ------------------------------------------------------
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), scope=st.sampled_from(["node", "any"]))
def test_token_accounting_matches_the_plan(seed, scope):
    rng = np.random.default_rng(seed)
    loads = _loads(rng, 2, 8, 64)
    plan = _replicated_plan(loads, 4, rng, scope=scope)
    onehot = (plan.home[:, :, None] == np.arange(8)).astype(np.float64)
    # the one-pass flow against the plain definition: remainders go home, replica flows as given
    reference = np.einsum("mlse,leg->mlsg", plan.home_flow().astype(np.float64), onehot)
    reference += plan.replica_flow.sum(axis=4)
    assert np.array_equal(plan.token_matrix(), reference)
    cost = cost_plan(plan, MODEL, TOPO)
    assert np.array_equal(cost.gpu_tokens, plan.gpu_tokens())
    assert np.allclose(cost.skewness(), plan.skewness())


def test_frame_is_tidy_and_sums_to_the_step():
    rng = np.random.default_rng(8)
    plan = _replicated_plan(_loads(rng, 2, 8, 128), 4, rng)
    cost = cost_plan(plan, MODEL, TOPO, prev_home=static_placement(3, 16, 8), planner_s=0.5)
    df = cost.frame(policy="x", model=MODEL.name, workload="w", ep=8, step=0, hardware=TOPO.name)
    assert list(df.columns) == METRIC_COLUMNS
    assert set(df["source"]) == {"simulated"} and set(df["phase"]) == {"forward", "backward", "step"}
    total = df.loc[df["component"] == "step_total", "seconds"].item()
    charged = df[(df["component"] != "step_total") & ~((df["phase"] == "step") & (df["component"] == "planner"))]
    assert charged["seconds"].sum() == pytest.approx(total, rel=1e-12)
    assert df.loc[df["component"] == "planner", "seconds"].max() == 0.5  # reported, hidden (not run time)
    assert (df["seconds"] >= 0).all()


def test_distinct_token_estimate_against_token_level_routing():
    """On a token-level trace the distinct tokens per (src, GPU) and (src, node) are countable; the
    independence estimate lands within a few percent, and never above the token-expert pairs."""
    from relibra.costs import distinct_tokens
    from relibra.policies import get_policy
    from relibra.workloads import generate_trace

    trace = generate_trace("small", "mixed", 8, steps=1, seed=0, micro_batches=2, tokens_per_rank=256,
                           token_level=True)
    plan = get_policy("megatron").plan(trace, 0, nodes_of(4))
    onehot = (plan.home[:, :, None] == np.arange(8)).astype(np.float64)
    src_tokens = plan.loads[:, 0].sum(axis=2) / trace.model.top_k
    per_gpu, per_node = distinct_tokens(plan, onehot, src_tokens)
    ids, src = trace.token_experts[0], trace.token_src_rank[0]  # [M, T, L, K], [M, T]
    gpu_of = plan.home[np.arange(trace.num_layers)[None, None, :, None], ids]  # [M, T, L, K]
    exact_gpu = np.zeros_like(per_gpu)
    exact_node = np.zeros_like(per_node)
    for s in range(8):
        mine = (src == s)[:, :, None]  # [M, T, 1]
        for d in range(8):
            exact_gpu[:, :, s, d] = ((gpu_of == d).any(-1) & mine).sum(axis=1)
        for n in range(2):
            exact_node[:, :, s, n] = ((gpu_of // 4 == n).any(-1) & mine).sum(axis=1)
    assert abs(per_gpu.sum() / exact_gpu.sum() - 1) < 0.06
    assert abs(per_node.sum() / exact_node.sum() - 1) < 0.08
    pairs = plan.token_matrix()
    assert (per_gpu <= pairs + 1e-6).all()
    with_dedup = cost_plan(plan, trace.model, parse_topology("paper,gpus_per_node=4"), CostParams(dedup=True))
    without = cost_plan(plan, trace.model, parse_topology("paper,gpus_per_node=4"), CostParams(dedup=False))
    assert (with_dedup.forward["dispatch"] <= without.forward["dispatch"] + 1e-15).all()
    assert with_dedup.forward["dispatch"].sum() < without.forward["dispatch"].sum()


# ---- calibration ---------------------------------------------------------------------------------------
def test_fit_recovers_the_efficiency_curve():
    fpt = expert_flops_per_token(MODEL)
    tokens = np.array([16, 64, 256, 1024, 4096])
    seconds = fpt * (tokens + 300.0) / 80e12
    fit = fit_gemm_efficiency(tokens, seconds * (1 + 0.01 * np.array([1, -1, 1, -1, 1])), fpt)
    assert fit["matmul_tflops"] == pytest.approx(80.0, rel=0.03)
    assert fit["gemm_half_tokens"] == pytest.approx(300.0, rel=0.05)
    with pytest.raises(ConfigError):
        fit_gemm_efficiency([10, 10], [1.0, 1.0], fpt)
    with pytest.raises(ConfigError):
        fit_gemm_efficiency([10, 20, 40], [3.0, 2.0, 1.0], fpt)


# ---- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["", "paper,rdma_GBps=0", "paper,nvlink_GBps=-1", "paper,num_nodes=0",
                                  "paper,gpus_per_node=2.5", "paper,bogus=1", "nodes=2,gpus_per_node=4",
                                  "nowhere", "paper,matmul_tflops=inf", "paper,attention_efficiency=1.5",
                                  "paper,dispatcher=sideways", "paper,shared_link=maybe"])
def test_bad_topologies_are_errors(spec):
    with pytest.raises(ConfigError):
        parse_topology(spec)


def test_bad_cluster_ep_combinations_are_errors():
    paper = get_topology("paper")
    for ep in (0, 12, 320, 3):
        with pytest.raises(ConfigError):
            paper.ep_layout(ep)
    rng = np.random.default_rng(0)
    plan = _static_plan(_loads(rng, 1, 8, 64), 8)  # assumes one node of 8; TOPO packs 4 per node
    with pytest.raises(PlanError, match="GPUs per node"):
        cost_plan(plan, MODEL, TOPO)
    with pytest.raises(PlanError, match="layers"):
        cost_plan(_static_plan(_loads(rng, 1, 8, 64), 4), get_model("tiny"), TOPO)
    with pytest.raises(ConfigError):
        CostParams(replica_buffer="somewhere")


def _link_reference(x, gpn, route):
    """Per-GPU seconds by walking every (src, dst) byte along its links (bandwidth 1 GB/s both)."""
    ep = x.shape[-1]
    node, local = np.arange(ep) // gpn, np.arange(ep) % gpn
    nvl_s, nvl_r, rdma_s, rdma_r = (np.zeros(ep) for _ in range(4))
    for s in range(ep):
        for d in range(ep):
            b = x[s, d]
            if s == d:
                continue
            if node[s] == node[d]:
                nvl_s[s] += b
                nvl_r[d] += b
                continue
            rdma_s[s] += b
            nic = d if route == "direct" else node[d] * gpn + local[s]
            rdma_r[nic] += b
            if nic != d:
                nvl_s[nic] += b
                nvl_r[d] += b
    return np.maximum(np.maximum(nvl_s, nvl_r), np.maximum(rdma_s, rdma_r)) / 1e9


@pytest.mark.parametrize("route", ["rail", "direct"])
def test_link_model_matches_a_walk_over_every_byte(route):
    topo = Topology("unit", num_nodes=3, gpus_per_node=4, nvlink_GBps=1.0, rdma_GBps=1.0, matmul_tflops=1.0)
    rng = np.random.default_rng(0)
    for gpn in (1, 2, 4, 12):
        x = rng.random((2, 12, 12)) * 1e6
        expected = np.stack([_link_reference(x[i], gpn, route) for i in range(2)])
        assert np.allclose(link_seconds(x, gpn, topo, route), expected, rtol=1e-12, atol=0)


def test_shared_link_charges_all_bytes_on_one_link():
    """cpu-gloo: one loopback link per rank, so intra- and inter-node bytes add up."""
    topo = get_topology("cpu-gloo")
    assert topo.route == "direct" and not topo.dedup and topo.shared_link
    x = np.full((4, 4), 1e6)
    np.fill_diagonal(x, 0.0)
    assert np.allclose(link_seconds(x, 2, topo), 3e6 / (topo.nvlink_GBps * 1e9))
    split = parse_topology("cpu-gloo,shared_link=false")
    assert np.allclose(link_seconds(x, 2, split), 2e6 / (topo.rdma_GBps * 1e9))
    assert parse_topology("paper,dispatcher=alltoall").route == "direct"
    assert get_topology("paper").route == "rail" and get_topology("paper").dedup


def test_collective_is_free_when_nothing_moves():
    assert collective_seconds(np.zeros((2, 8, 8)), 4, TOPO).tolist() == [0.0, 0.0]
    local = np.diag(np.full(8, 1e9))  # only self traffic
    assert collective_seconds(local, 4, TOPO) == 0.0


# ---- CLI -------------------------------------------------------------------------------------------------
def test_cli_json(capsys):
    from relibra.cli import main

    rc = main(["simulate", "--model", "tiny", "--workload", "mixed", "--ep", "4", "--cluster", "cpu-gloo",
               "--policies", "megatron,relibra", "--steps", "1", "--warmup-steps", "1", "--micro-batches", "2",
               "--tokens-per-rank", "64", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    data = json.loads(out)
    rows = {r["policy"]: r for r in data["results"]}
    assert set(rows) == {"megatron", "relibra", "balanced"}
    for r in rows.values():
        for key in ("tokens_per_s", "speedup_vs_megatron", "frac_of_balanced", "skewness"):
            assert isinstance(r[key], float) and r[key] > 0
    assert rows["megatron"]["speedup_vs_megatron"] == pytest.approx(1.0)
    assert data["config"]["cluster"] == "cpu-gloo"


def test_cli_table_and_errors(capsys):
    from relibra.cli import main

    rc = main(["simulate", "--model", "tiny", "--workload", "math", "--ep", "4", "--cluster", "cpu-gloo",
               "--policies", "megatron", "--steps", "1", "--warmup-steps", "0", "--micro-batches", "1",
               "--tokens-per-rank", "32"])
    out = capsys.readouterr().out
    assert rc == 0 and "megatron" in out and "balanced" in out and "simulated" in out
    assert main(["simulate", "--model", "tiny", "--workload", "math", "--ep", "8", "--cluster", "cpu-gloo"]) == 2
    assert "exceeds" in capsys.readouterr().err
    assert main(["simulate", "--model", "tiny", "--workload", "math", "--ep", "4", "--cluster", "paper,rdma_GBps=0"]) == 2
    assert "rdma_GBps" in capsys.readouterr().err
    assert main(["simulate", "--model", "tiny", "--workload", "math", "--ep", "4", "--policies", "nope",
                 "--cluster", "cpu-gloo", "--steps", "1", "--warmup-steps", "0", "--micro-batches", "1",
                 "--tokens-per-rank", "16"]) == 2
    assert "nope" in capsys.readouterr().err
