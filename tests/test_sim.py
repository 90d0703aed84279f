"""The cost model and simulator: physical sanity (balance, bandwidth, migration, linearity), the
tidy output, calibration, errors and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relibra.bench.gemm import fit_gemm_efficiency
from relibra.cluster import ModelShape, Topology, get_model, get_topology, parse_topology
from relibra.costs import (CostParams, collective_seconds, cost_plan, expert_flops_per_token,
                           link_seconds, replica_memory)
from relibra.errors import ConfigError, PlanError
from relibra.metrics import METRIC_COLUMNS
from relibra.plan import StepPlan, empty_replicas
from relibra.trace import RoutingTrace, static_placement
from conftest import nodes_of  # tests/ is on sys.path under pytest

MODEL = ModelShape("sim-test", num_layers=3, num_experts=16, top_k=2, hidden=256, moe_ffn=512,
                   num_attention_heads=4, num_kv_heads=2, head_dim=64, vocab_size=1000)
TOPO = Topology("test", num_nodes=2, gpus_per_node=4, nvlink_GBps=100.0, rdma_GBps=10.0, matmul_tflops=50.0,
                gemm_half_tokens=64.0)



def _loads(rng, m, ep, tokens_per_rank, alpha=0.3, model=MODEL):
    """Skewed int32 loads [M, L, ep, E], each (m, l, src) summing to tokens_per_rank * top_k."""
    p = rng.dirichlet(np.full(model.num_experts, alpha), size=(m, model.num_layers, ep))
    flat = p.reshape(-1, model.num_experts)
    counts = np.stack([rng.multinomial(tokens_per_rank * model.top_k, row) for row in flat])
    return counts.reshape(m, model.num_layers, ep, model.num_experts).astype(np.int32)


def _static_plan(loads, gpn, slots=0, policy="megatron", home=None, uniform=False):
    m, l, ep, e = loads.shape
    rexp, rstart, rtok = empty_replicas(m, l, ep, slots)
    home = static_placement(l, e, ep) if home is None else home
    return StepPlan(policy, loads, home, rexp, rstart, rtok, gpn, e // ep + slots, uniform_routing=uniform)


def _replicated_plan(loads, gpn, rng, slots=2, scope="node", critical=False, home=None):
    """Random valid replicas: each GPU copies random experts homed elsewhere (in its node for scope
    'node') and takes a random share of the tokens its expert has left, the next run in source order."""
    m, l, ep, e = loads.shape
    home = static_placement(l, e, ep) if home is None else home
    rexp, rstart, rtok = empty_replicas(m, l, ep, slots)
    for mi in range(m):
        for li in range(l):
            taken = np.zeros(e, dtype=np.int64)
            for g in range(ep):
                if scope == "node":
                    candidates = np.nonzero((home[li] // gpn == g // gpn) & (home[li] != g))[0]
                else:
                    candidates = np.nonzero(home[li] != g)[0]
                pick = rng.choice(candidates, size=min(slots, len(candidates)), replace=False)
                for r, ex in enumerate(pick):
                    share = rng.random()
                    tokens = int(np.floor((loads[mi, li, :, ex].sum() - taken[ex]) * share))
                    rexp[mi, li, g, r] = ex
                    rstart[mi, li, g, r], rtok[mi, li, g, r] = taken[ex], tokens
                    taken[ex] += tokens
    plan = StepPlan("test-replicas", loads, home, rexp, rstart, rtok, gpn, e // ep + slots, replica_scope=scope,
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
    assert set(POLICY_NAMES) | {"balanced-compute"} <= set(s.index)
    assert (s["tokens_per_s"] <= s.loc["balanced", "tokens_per_s"] * (1 + 1e-9)).all(), s["tokens_per_s"]
    # balanced-compute: no policy on the real routing beats it (balanced's routing is uniform)
    real = s.drop(index=["balanced", "balanced-compute"])
    assert (real["tokens_per_s"] <= s.loc["balanced-compute", "tokens_per_s"] * (1 + 1e-12)).all()
    relibra = s.loc["relibra"]
    assert relibra["speedup_vs_megatron"] == pytest.approx(relibra["tokens_per_s"] / s.loc["megatron", "tokens_per_s"])
    assert relibra["frac_of_balanced_compute"] == pytest.approx(
        relibra["tokens_per_s"] / s.loc["balanced-compute", "tokens_per_s"])


def test_balanced_compute_is_megatron_with_mean_expert_compute():
    """With Megatron the only plan, the balanced-compute row is Megatron's step with each (micro-batch,
    layer)'s expert time cut from the slowest GPU's to the mean GPU's (forward and the 2x backward),
    everything else unchanged."""
    from relibra.sim import simulate

    trace = _small_trace()
    topo = parse_topology("paper,num_nodes=2,gpus_per_node=4")
    result = simulate(trace, topo, ["megatron", "balanced-compute"], steps=1, progress=False, references=False,
                      keep_costs=True)
    mega = result.costs["megatron"][0]
    per_gpu = mega.expert_seconds_per_gpu
    saved = 3 * float((per_gpu.max(axis=2) - per_gpu.mean(axis=2)).sum())
    assert saved > 0
    reference = result.costs["balanced-compute"][0]
    assert reference.step_seconds == pytest.approx(mega.step_seconds - saved, rel=1e-12)
    assert reference.totals()["dispatch"] == mega.totals()["dispatch"]
    row = result.summary.set_index("policy").loc["megatron"]
    assert row["frac_of_balanced_compute"] == pytest.approx(reference.step_seconds / mega.step_seconds, rel=1e-12)


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
    # in line (the kit's runtime): every push (forward, and again for backward with a layer-shared
    # buffer) and every pull is paid, however long attention is
    inline = cost_plan(overlapped, MODEL, TOPO, CostParams(seq_len=200_000, overlap_transfers=False))
    t = inline.totals()
    assert t["replica_push"] + t["replica_grad"] == pytest.approx(inline.replica_transfer_s, rel=1e-9)
    assert inline.step_seconds == pytest.approx(hidden.step_seconds + inline.replica_transfer_s, rel=1e-9)


def test_replica_buffers_memory_and_pushes():
    rng = np.random.default_rng(7)
    ep, gpn = 8, 4
    loads = _loads(rng, 3, ep, 256)
    plan = _replicated_plan(loads, gpn, rng, slots=2)
    # the same replicas in every micro-batch: a per-layer buffer pushes them once
    plan.replica_expert[1:] = plan.replica_expert[0]
    plan.replica_start[:] = plan.replica_tokens[:] = 0
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
                    np.tile(one.replica_start, (reps, 1, 1, 1)), np.tile(one.replica_tokens, (reps, 1, 1, 1)), 4, one.slots_per_gpu, one.replica_scope)
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
    reference += plan.dense_replica_flow().sum(axis=4)
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


def test_distinct_token_estimate_against_token_level_routing():
    """On a token-level trace the distinct tokens per (src, GPU) and (src, node) are countable; the
    independence estimate lands within a few percent, and never above the token-expert pairs."""
    from relibra.costs import distinct_tokens
    from relibra.policies import get_policy
    from relibra.workloads import generate_trace

    trace = generate_trace("small", "mixed", 8, steps=1, seed=0, micro_batches=2, tokens_per_rank=256,
                           token_level=True)
    plan = get_policy("megatron").plan(trace, 0, nodes_of(4))
    src_tokens = plan.loads[:, 0].sum(axis=2) / trace.model.top_k
    per_gpu, per_node = distinct_tokens(plan, src_tokens)
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


def test_distinct_tokens_with_replicas_against_a_brute_force_count():
    """With replicas, realise the plan's flows token by token (each (src, expert)'s tokens dealt at
    random to its replicas in the planned numbers, the rest home), count the distinct tokens each
    source sends each GPU and node, and compare with the estimate."""
    from relibra.costs import distinct_tokens
    from relibra.workloads import generate_trace

    trace = generate_trace("small", "mixed", 8, steps=1, seed=1, micro_batches=2, tokens_per_rank=256,
                           token_level=True)
    rng = np.random.default_rng(0)
    loads = trace.loads[0]
    plan = _replicated_plan(loads, 4, rng, slots=2, scope="any")
    src_tokens = loads[:, 0].sum(axis=2) / trace.model.top_k
    per_gpu, per_node = distinct_tokens(plan, src_tokens)
    ids, src = trace.token_experts[0], trace.token_src_rank[0]  # [M, T, L, K], [M, T]
    m, t, l, k = ids.shape
    exact_gpu, exact_node = np.zeros_like(per_gpu), np.zeros_like(per_node)
    flow = plan.dense_replica_flow()
    for mi in range(m):
        for li in range(l):
            gpu_of = np.full((t, k), -1)
            for s_ in range(8):
                for e in range(trace.num_experts):
                    where = np.argwhere((src[mi] == s_)[:, None] & (ids[mi, :, li] == e))  # (token, k) pairs
                    where = where[rng.permutation(len(where))]
                    start = 0
                    for g, r in zip(*np.nonzero(plan.replica_expert[mi, li] == e)):
                        n = int(flow[mi, li, s_, g, r])
                        gpu_of[where[start:start + n, 0], where[start:start + n, 1]] = g
                        start += n
                    rest = where[start:]
                    gpu_of[rest[:, 0], rest[:, 1]] = plan.home[li, e]
            for s_ in range(8):
                mine = src[mi] == s_
                for d in range(8):
                    exact_gpu[mi, li, s_, d] = ((gpu_of == d).any(axis=1) & mine).sum()
                for n in range(2):
                    exact_node[mi, li, s_, n] = ((gpu_of // 4 == n).any(axis=1) & mine).sum()
    # the token-level realisation carries every pair of the plan
    assert plan.replica_expert.max() >= 0 and (exact_gpu <= plan.token_matrix()).all()
    assert abs(per_gpu.sum() / exact_gpu.sum() - 1) < 0.06
    assert abs(per_node.sum() / exact_node.sum() - 1) < 0.08
    assert np.abs(per_gpu - exact_gpu).max() <= 0.35 * exact_gpu.max()


# ---- each phase against a hand computation --------------------------------------------------------------
HAND = ModelShape("hand", num_layers=1, num_experts=2, top_k=2, hidden=8, moe_ffn=4, num_attention_heads=2,
                  num_kv_heads=1, head_dim=4, vocab_size=10, bytes_per_param=2, optimizer_bytes_per_param=12)
HAND_TOPO = Topology("hand", num_nodes=1, gpus_per_node=2, nvlink_GBps=1.0, rdma_GBps=1.0, matmul_tflops=1e-6,
                     gemm_half_tokens=10.0, collective_latency_s=1e-3, memory_GBps=1.0, attention_efficiency=0.5)


def _hand_plan(planner_on_critical_path=False):
    """1 micro-batch, 1 layer, 2 GPUs in one node, 2 experts (one per GPU), top-2: every token of a
    source goes to both experts. Source 0 has 100 tokens, source 1 has 20."""
    loads = np.array([[[[100, 100], [20, 20]]]], dtype=np.int32)
    plan = _static_plan(loads, 2)
    plan.planner_on_critical_path = planner_on_critical_path
    return plan


def test_dispatch_phase_by_hand():
    from relibra.costs import dispatch_seconds

    plan = _hand_plan()
    matrix, _, _ = plan.flows()
    src_tokens = np.array([[100.0, 20.0]])
    tb = HAND.token_bytes  # 16 bytes
    # src 0 sends its 100 tokens (pairs for expert 1) to GPU 1, src 1 its 20 to GPU 0; the slowest
    # GPU is 0 (sends 100 x 16 bytes) or 1 (receives them): 1600 bytes at 1 GB/s, plus the latency
    want = 100 * tb / 1e9 + 1e-3
    for dedup in (True, False):
        got = dispatch_seconds(plan, HAND, HAND_TOPO, CostParams(dedup=dedup), matrix, src_tokens)
        assert got.shape == (1, 1) and got[0, 0] == pytest.approx(want, rel=1e-6)  # the dedup estimate's float64 products


def test_expert_phase_by_hand():
    from relibra.costs import active_copies, expert_seconds_per_gpu

    plan = _hand_plan()
    _, home_tokens, replica_tokens = plan.flows()
    copies = active_copies(plan, home_tokens, replica_tokens)
    assert copies.tolist() == [[[1, 1]]]
    gpu_tokens = np.array([[[120, 120]]])
    fpt = 6 * 8 * 4  # 6 * hidden * moe_ffn
    got = expert_seconds_per_gpu(gpu_tokens, copies, HAND, HAND_TOPO)
    assert got[0, 0, 0] == pytest.approx(fpt * (120 + 10.0) / 1e6, rel=1e-12)
    assert expert_seconds_per_gpu(np.array([[[0, 5]]]), np.array([[[0, 2]]]), HAND, HAND_TOPO)[0, 0, 0] == 0.0
    assert expert_seconds_per_gpu(np.array([[[0, 5]]]), np.array([[[0, 2]]]), HAND, HAND_TOPO)[0, 0, 1] == \
        pytest.approx(fpt * (5 + 20.0) / 1e6)


def test_dense_phase_by_hand_with_and_without_sequence_lengths():
    from relibra.costs import dense_seconds, non_moe_seconds

    q, kv = 2 * 4, 1 * 4
    proj = 2 * 8 * (q + 2 * kv) + 2 * q * 8  # Q, K, V and output projections per token
    router = 2 * 8 * 2
    src_tokens = np.array([[8.0, 4.0]])
    seq_lens = np.array([[[3, 5], [4, 0]]])  # rank 0: sequences of 3 and 5 tokens; rank 1: one of 4
    attention, other = dense_seconds(src_tokens, HAND, HAND_TOPO, CostParams(), seq_lens)
    core0 = 2 * q * (3 * 4 + 5 * 6)  # causal: 2 * 2 * q * n (n + 1) / 2 per sequence
    assert attention[0, 0] == pytest.approx(proj * (8 + 10) / 1e6 + core0 / (1e6 * 0.5), rel=1e-12)
    assert attention[0, 1] == pytest.approx(proj * (4 + 10) / 1e6 + 2 * q * 4 * 5 / (1e6 * 0.5), rel=1e-12)
    assert other[0, 0] == pytest.approx(router * (8 + 10) / 1e6, rel=1e-12)
    # without lengths: sequences of seq_len tokens; a rank of 8 tokens holds 8 / 4 = 2 of them at seq_len 4
    attention, _ = dense_seconds(src_tokens, HAND, HAND_TOPO, CostParams(seq_len=4))
    assert attention[0, 0] == pytest.approx(proj * 18 / 1e6 + 2 * (2 * q * 4 * 5) / 5e5, rel=1e-12)
    # outside the MoE layers: only the LM head here (no dense layers), on the slowest rank
    extra = non_moe_seconds(src_tokens, HAND, HAND_TOPO, CostParams(), seq_lens)
    assert extra.tolist() == pytest.approx([2 * 8 * 10 * (8 + 10) / 1e6])


def test_replica_overlap_by_hand():
    from relibra.costs import exposed_seconds

    attention = np.array([[1.0, 0.2]])
    other = np.array([[0.5, 0.5]])
    transfer = np.array([[[1.5, 0.1]]])
    # GPU 0: max(1.0, 1.5) + 0.5 = 2.0; GPU 1: 0.7; dense alone: 1.5 -> 0.5 exposed
    assert exposed_seconds(transfer, attention, other).tolist() == [[pytest.approx(0.5)]]
    assert exposed_seconds(np.array([[[0.9, 0.1]]]), attention, other).tolist() == [[0.0]]


def test_planner_phase_by_hand_and_the_measured_table(tmp_path):
    from relibra.costs import planner_seconds, planner_seconds_per_cell
    from relibra.costs.calibration import load_planner_table

    gather = 4 * 2 / 1e9 + 1e-3  # every rank sends its 2 int32 expert counts to the other rank
    ahead = _hand_plan()
    assert planner_seconds(ahead, HAND_TOPO, CostParams())[0].tolist() == [[0.0]]
    runtime = _hand_plan(planner_on_critical_path=True)
    got, how = planner_seconds(runtime, HAND_TOPO, CostParams(runtime_plan_s=2e-3))
    assert how == "fixed" and got[0, 0] == pytest.approx(gather + 2e-3)
    got, how = planner_seconds(runtime, HAND_TOPO, CostParams(runtime_plan_s="measured"), measured_cpu_s=0.5)
    assert how == "measured" and got[0, 0] == pytest.approx(gather + 0.5)
    # a planner the table lacks is charged its measured time
    got, how = planner_seconds(runtime, HAND_TOPO, CostParams(), measured_cpu_s=0.25)
    assert how == "measured" and got[0, 0] == pytest.approx(gather + 0.25)
    # interpolation in (log EP, log seconds), held flat outside the measured sizes
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"policies": {"x": {"ep": [8, 32], "seconds_per_cell": [1e-5, 4e-5]}}}))
    assert planner_seconds_per_cell("x", 16, str(path)) == pytest.approx(2e-5)
    assert planner_seconds_per_cell("x", 4, str(path)) == pytest.approx(1e-5)
    assert planner_seconds_per_cell("x", 64, str(path)) == pytest.approx(4e-5)
    assert planner_seconds_per_cell("y", 16, str(path)) is None
    load_planner_table.cache_clear()
    table = load_planner_table()
    assert "llep" in table["policies"] and table["machine"]


def test_migration_and_optimizer_by_hand_with_a_distributed_optimizer():
    from relibra.costs import migration_seconds, optimizer_seconds

    prev = np.array([[0, 1]])
    home = np.array([[1, 0]])
    p = HAND.expert_params  # 96
    for dp in (1, 4):
        state = p * (2 + 12 / dp)
        seconds, moved = migration_seconds(prev, home, 2, 2, HAND, HAND_TOPO, dp_size=dp)
        assert seconds == pytest.approx(state / 1e9 + 1e-3)
        assert moved == {"intra_node": round(2 * state), "inter_node": 0, "experts_moved": 2}
    assert migration_seconds(None, home, 2, 2, HAND, HAND_TOPO)[0] == 0.0
    # one homed expert per GPU sharded over dp=4, dense parameters over ep x dp = 8; 28 bytes per parameter
    want = (1 * 1 * p / 4 + HAND.dense_params / 8) * (2 * 12 + 2 * 2) / 1e9
    assert optimizer_seconds(HAND, 1, 2, HAND_TOPO, dp_size=4) == pytest.approx(want)


def test_simulate_charges_attention_from_the_trace_sequence_lengths():
    from relibra.sim import simulate

    trace = _small_trace()
    topo = parse_topology("paper,num_nodes=2,gpus_per_node=4")
    tokens = trace.loads[:, :, 0].sum(axis=3) // trace.model.top_k  # [S, M, ep]
    long = np.zeros(tokens.shape + (1,), dtype=np.int32)
    long[..., 0] = tokens  # every rank's tokens in one sequence
    with_lens = RoutingTrace(trace.loads, trace.model, trace.ep, trace.tokens_per_microbatch, seq_lens=long)
    trace = RoutingTrace(trace.loads, trace.model, trace.ep, trace.tokens_per_microbatch)  # no lengths
    a = simulate(trace, topo, ["megatron"], steps=1, progress=False, references=False, keep_costs=True)
    b = simulate(with_lens, topo, ["megatron"], steps=1, progress=False, references=False, keep_costs=True)
    assert a.config["attention"].startswith("assumed") and b.config["attention"] == "trace seq_lens"
    direct = cost_plan(get_policy_plan(trace, topo), trace.model, topo, seq_lens=long[-1])
    assert b.costs["megatron"][0].forward["dense_compute"] == pytest.approx(direct.forward["dense_compute"])
    # one sequence of ~512 tokens per rank attends to less than the assumed 4096-token sequences
    assert (b.costs["megatron"][0].forward["dense_compute"] < a.costs["megatron"][0].forward["dense_compute"]).all()
    with pytest.raises(PlanError, match="seq_lens"):
        cost_plan(get_policy_plan(trace, topo), trace.model, topo, seq_lens=long[-1, :, :2])


def get_policy_plan(trace, topo, name="megatron", step=-1):
    from relibra.policies import get_policy

    return get_policy(name).plan(trace, trace.num_steps + step if step < 0 else step, topo)


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
    for ep in (0, 320, -8):
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
    assert set(rows) == {"megatron", "relibra", "balanced", "balanced-compute"}
    mega = rows["megatron"]["tokens_per_s"]
    for r in rows.values():
        assert r["speedup_vs_megatron"] == pytest.approx(r["tokens_per_s"] / mega)
        assert r["frac_of_balanced"] == pytest.approx(r["tokens_per_s"] / rows["balanced"]["tokens_per_s"])
    assert rows["balanced-compute"]["tokens_per_s"] >= mega
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


def test_sensitivity_quick_rows(capsys):
    """`relibra sensitivity --quick --json` on a small set-up (one MoE layer, one step, so a few plans):
    one row per (knob, value), each knob's default marked once with the same ratios, those ratios
    equal to a direct simulation of the default, every ratio finite, and a moved knob moving them."""
    import pandas as pd

    from relibra.cli import main
    from relibra.studies.case import scaled_model
    from relibra.studies.sensitivity import RATIOS, knob_values, tornado_table
    from relibra.setups import load_card
    from relibra.sim import simulate
    from relibra.workloads import generate_trace

    knobs = ("spare slots", "NVLink rate")  # EP 8 fits one node of the paper cluster: NVLink carries the a2a
    args = ["sensitivity", "--model", "small", "--ep", "8", "--micro-batches", "2", "--steps", "1", "--layers", "1",
            "--quick", "--knobs", ",".join(knobs), "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    values = knob_values(quick=True)
    assert values["NVLink rate"] == [135.6, 295.2] and values["spare slots"] == [1, 2]  # the card's range and default
    assert [(r["knob"], r["value"], r["policy"]) for r in rows] == [(k, v, "relibra") for k in knobs
                                                                   for v in values[k]]
    assert all(np.isfinite(r[c]) and r[c] > 0 for r in rows for c in RATIOS)
    defaults = [r for r in rows if r["is_default"]]
    assert [r["knob"] for r in defaults] == list(knobs)
    assert all(r[c] == defaults[0][c] for r in defaults for c in RATIOS)
    card = load_card("token-budget-tp1")
    trace = generate_trace(scaled_model("small", 1), "mixed", 8, steps=1, seed=0, micro_batches=2,
                           config=card.workload_config())
    s = simulate(trace, card.topology(), ["relibra", "eplb+", "megatron", "balanced-compute"], progress=False,
                 references=False, params=card.cost_params(8), policy_params=card.policy_params()
                 ).summary.set_index("policy")["tokens_per_s"]
    d = defaults[0]
    assert d["relibra_over_megatron"] == pytest.approx(s["relibra"] / s["megatron"], rel=1e-12)
    assert d["relibra_over_eplb_plus"] == pytest.approx(s["relibra"] / s["eplb+"], rel=1e-12)
    assert d["relibra_over_balanced_compute"] == pytest.approx(s["relibra"] / s["balanced-compute"], rel=1e-12)
    assert all(r["relibra_over_balanced_compute"] <= 1 + 1e-12 for r in rows)
    slow = next(r for r in rows if r["knob"] == "NVLink rate" and r["value"] == 135.6)
    assert slow["cluster"] == "token-budget-tp1,nvlink_GBps=135.6"
    assert slow["relibra_over_megatron"] != d["relibra_over_megatron"]  # H800's NVLink changes the step
    # the tornado: one bar per (ratio, knob), spanning the knob's values, sorted by swing within a ratio
    t = tornado_table(pd.DataFrame(rows))
    assert len(t) == len(RATIOS) * len(knobs)
    for ratio, g in t.groupby("ratio", sort=False):
        assert list(g["swing"]) == sorted(g["swing"], reverse=True)
        assert ((g["low"] <= g["default"]) & (g["default"] <= g["high"])).all()
    assert main(["sensitivity", "--model", "small", "--ep", "8", "--knobs", "NVLink", "--json"]) == 2
    assert "unknown sensitivity knob" in capsys.readouterr().err


def test_fitted_presets_load_only_when_named(tmp_path):
    from relibra.cluster import FITTED_CPU_PRESET, TOPOLOGY_PRESETS, read_preset_file

    assert FITTED_CPU_PRESET.exists()  # the committed fit, yet not a preset of its own
    fitted = json.loads(FITTED_CPU_PRESET.read_text())["preset"]
    assert fitted["name"] not in TOPOLOGY_PRESETS
    topo = parse_topology(f"{FITTED_CPU_PRESET},nodes=2")
    assert (topo.num_nodes, topo.matmul_tflops) == (2, fitted["matmul_tflops"])
    assert read_preset_file(FITTED_CPU_PRESET) == Topology(**fitted)
    bad = tmp_path / "bad_preset.json"
    bad.write_text(json.dumps({"preset": {"name": "x", "no_such_field": 1}}))
    with pytest.raises(ConfigError, match="bad_preset.json"):
        parse_topology(str(bad))
