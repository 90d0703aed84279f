"""Pipeline parallelism (relibra.costs.pipeline, PlanCost under CostParams.pipeline_stages) and the recipe's
token dispatcher (CostParams.dispatcher): hand-computed schedules and traffic, and the slime 235B card."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from relibra.cluster import ModelShape, Topology
from relibra.costs import CostParams, cost_plan
from relibra.costs.phases import allgather_seconds, dispatch_rule_of
from relibra.costs.pipeline import interleaved_seconds, layer_stages, one_f_one_b_seconds, stage_layer_counts
from relibra.errors import ConfigError, PlanError
from relibra.plan import StepPlan, empty_replicas
from relibra.setups import load_card
from relibra.trace import static_placement

MODEL = ModelShape("pipe-test", num_layers=4, num_experts=16, top_k=2, hidden=256, moe_ffn=512,
                   num_attention_heads=4, num_kv_heads=2, head_dim=64, vocab_size=1000)
TOPO = Topology("test", num_nodes=2, gpus_per_node=4, nvlink_GBps=100.0, rdma_GBps=10.0, matmul_tflops=50.0,
                gemm_half_tokens=64.0)


# ---- the schedule ---------------------------------------------------------------------------------
def test_layer_split_follows_megatron():
    assert stage_layer_counts(94, 4, 22) == (24, 24, 24, 22)  # slime's Qwen3-235B-A22B recipe
    assert stage_layer_counts(48, 2) == (24, 24)
    assert stage_layer_counts(46, 1) == (46,)
    with pytest.raises(ConfigError, match="do not split evenly"):
        stage_layer_counts(94, 4)
    with pytest.raises(ConfigError, match="do not split evenly"):
        stage_layer_counts(94, 4, 23)  # 71 over 3 stages
    moe, dense = layer_stages((24, 23), dense_layers=1, moe_layers=46)  # glm-4.5-air: one leading dense layer
    assert dense.tolist() == [0] and np.bincount(moe).tolist() == [23, 23]


def test_one_stage_is_the_sum():
    f = np.array([[1.0, 2.0, 3.0]])
    assert one_f_one_b_seconds(f, 2 * f) == 18.0


@pytest.mark.parametrize("p,m", [(2, 2), (4, 3), (4, 8), (3, 1)])
def test_equal_stages_give_m_plus_p_minus_one_slots(p, m):
    f, b = 0.5, 1.25
    t = one_f_one_b_seconds(np.full((p, m), f), np.full((p, m), b))
    assert t == pytest.approx((m + p - 1) * (f + b), rel=1e-12)


def test_two_stages_by_hand():
    # stage 0: F0 [0,1] F1 [1,3] ... ; stage 1 (f 1, b 1): F0 [1,2] B0 [2,3] F1 [3,4] B1 [4,5]; stage 0 B0 [3,5]
    # (b 2) then B1 [5,7]
    f = np.array([[1.0, 2.0], [1.0, 1.0]])
    b = np.array([[2.0, 2.0], [1.0, 1.0]])
    assert one_f_one_b_seconds(f, b) == 7.0


def test_one_slow_stage_sets_the_pace():
    p, m = 4, 16
    f = np.ones((p, m))
    f[2] = 3.0
    t = one_f_one_b_seconds(f, 2 * f)
    slow = m * 3 * 3.0
    # the slow stage's own work, plus the fill and drain of the others around it (3 stage-slots of 3 s at most)
    assert slow < t <= slow + (p - 1) * 3 * 3.0
    assert t > one_f_one_b_seconds(np.ones((p, m)), 2 * np.ones((p, m)))


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 8)])
def test_interleaved_bubble_shrinks_by_the_virtual_stages(p, v, m):
    f, b = 1.0, 2.0  # a device's whole forward / backward per micro-batch, split over its v chunks
    t = interleaved_seconds(np.full((p * v, m), f / v), np.full((p * v, m), b / v), p)
    assert t == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v, rel=1e-9)
    with pytest.raises(ConfigError, match="divisible"):
        interleaved_seconds(np.ones((p * v, m + 1)), np.ones((p * v, m + 1)), p)


# ---- the step under a pipeline ---------------------------------------------------------------------
def _plan(rng, m=3, ep=8):
    p = rng.dirichlet(np.full(MODEL.num_experts, 0.3), size=(m, MODEL.num_layers, ep))
    loads = np.stack([rng.multinomial(128 * MODEL.top_k, row) for row in p.reshape(-1, MODEL.num_experts)])
    loads = loads.reshape(m, MODEL.num_layers, ep, MODEL.num_experts).astype(np.int32)
    rexp, rstart, rtok = empty_replicas(m, MODEL.num_layers, ep, 0)
    home = static_placement(MODEL.num_layers, MODEL.num_experts, ep)
    return StepPlan("megatron", loads, home, rexp, rstart, rtok, 4, MODEL.num_experts // ep)


def test_pipeline_step_has_a_bubble_and_per_step_costs_pay_none():
    rng = np.random.default_rng(0)
    plan = _plan(rng)
    prev = np.roll(plan.home, 1, axis=1)  # every expert moves
    flat = cost_plan(plan, MODEL, TOPO, CostParams(), prev_home=prev)
    piped = cost_plan(plan, MODEL, TOPO, CostParams(pipeline_stages=2), prev_home=prev)
    assert flat.totals()["pipeline_bubble"] == 0.0 and "pipeline_bubble" not in set(flat.frame()["component"])
    fwd, bwd = piped.stage_seconds()
    assert fwd.shape == (2, 3)
    # each stage's MoE work is its layers' share; the LM head sits on the last stage
    assert (fwd.sum() + bwd.sum()) == pytest.approx(flat.microbatch_seconds.sum(), rel=1e-9)
    pipe_s, bubble = piped.pipeline_seconds()
    sends = piped.stage_send_forward.sum(axis=1) + piped.stage_send_backward.sum(axis=1)  # blocking: held
    assert pipe_s == pytest.approx(one_f_one_b_seconds(fwd, bwd, piped.stage_send_forward,
                                                       piped.stage_send_backward))
    assert bubble > 0 and bubble == pytest.approx(pipe_s - ((fwd + bwd).sum(axis=1) + sends).max())
    # per-step costs: each stage moves and updates its own layers at the same time, outside the schedule
    assert 0 < piped.migration_s < flat.migration_s and piped.optimizer_s < flat.optimizer_s
    assert piped.step_seconds == pytest.approx(pipe_s + piped.migration_s + piped.optimizer_s)
    totals = piped.totals()
    parts = sum(v for k, v in totals.items() if k != "step_total")
    assert parts == pytest.approx(totals["step_total"], rel=1e-9) and totals["pipeline_bubble"] == bubble
    frame = piped.frame()
    assert frame.loc[frame["component"] == "pipeline_bubble", "seconds"].item() == pytest.approx(bubble)
    assert piped.info["pipeline"] == {"stages": 2, "virtual_stages": 1, "moe_layers_per_chunk": [2, 2],
                                      "split": "megatron"}
    # a model cut to fewer layers than the recipe's split: near-equal runs, said so
    odd = cost_plan(plan, MODEL, TOPO, CostParams(pipeline_stages=3))
    assert odd.info["pipeline"]["moe_layers_per_chunk"] == [1, 2, 1] and odd.info["pipeline"]["split"] == "near-even"
    with pytest.raises(PlanError, match="cannot fill"):
        cost_plan(plan, MODEL, TOPO, CostParams(pipeline_stages=5))
    with pytest.raises(PlanError, match="virtual stages"):
        cost_plan(plan, MODEL, TOPO, CostParams(pipeline_stages=2, virtual_stages=2, last_stage_layers=1))


def test_planner_beyond_its_window_is_charged_once_per_step():
    from relibra.costs import Overheads

    rng = np.random.default_rng(1)
    plan = dataclasses.replace(_plan(rng), policy="relibra")
    ov = Overheads(planner_window_forward_passes=0.0, planner_reorder_s_per_layer=0.25)
    # each stage plans its own layers, the stages at once: 4 layers x 0.25 s on one stage, 2 x 0.25 on two
    for stages, want in ((1, 1.0), (2, 0.5)):
        cost = cost_plan(plan, MODEL, TOPO, CostParams(pipeline_stages=stages, overheads=ov))
        bare = cost_plan(plan, MODEL, TOPO, CostParams(pipeline_stages=stages))
        assert cost.planner_step_s == pytest.approx(want) and cost.info["overheads"]["planner_s"] == pytest.approx(want)
        assert cost.step_seconds - bare.step_seconds == pytest.approx(want, rel=1e-9)
    # interleaved: a device plans both of its chunks' layers
    inter = cost_plan(dataclasses.replace(_plan(rng, m=2), policy="relibra"), MODEL, TOPO,
                      CostParams(pipeline_stages=2, virtual_stages=2, overheads=ov))
    assert inter.planner_step_s == pytest.approx(0.5)


def test_stage_sends_by_hand():
    from relibra.costs.pipeline import boundary_crosses_nodes

    # Megatron's rank order: a stage of 16 GPUs on 8-GPU nodes always leaves its node; stages of 4 share one
    assert boundary_crosses_nodes(4, 4, 16, 8).tolist() == [True, True, True, False]
    assert boundary_crosses_nodes(4, 4, 4, 8).tolist() == [False, True, False, False]
    assert boundary_crosses_nodes(4, 2, 2, 8).tolist() == [False, False, False, False]  # interleaved: back to 0
    # one micro-batch, two stages, f = b = 1, a 0.5 s send each way: 4 s plus both sends, held or not
    one = np.ones((2, 1))
    half = np.full((2, 1), 0.5)
    assert one_f_one_b_seconds(one, one) == pytest.approx(4.0)
    for blocking in (True, False):
        assert one_f_one_b_seconds(one, one, half, half, blocking) == pytest.approx(5.0)
    # two micro-batches: a held sender waits where an overlapped one computes on
    two = np.ones((2, 2))
    assert one_f_one_b_seconds(two, two, np.full((2, 2), 0.5), np.full((2, 2), 0.5), True) > \
        one_f_one_b_seconds(two, two, np.full((2, 2), 0.5), np.full((2, 2), 0.5), False)
    rng = np.random.default_rng(3)
    plan = _plan(rng)
    tokens = plan.loads[:, 0].sum(axis=2) / MODEL.top_k  # [M, ep]
    for stage_gpus, rate in ((None, 10e9), (2, 100e9)):  # 8 GPUs span both nodes (RDMA); 2 share one (NVLink)
        cost = cost_plan(plan, MODEL, TOPO, CostParams(pipeline_stages=2, stage_gpus=stage_gpus))
        want = tokens.max(axis=1) * MODEL.hidden * MODEL.bytes_per_param / rate + TOPO.collective_latency_s
        assert cost.stage_send_forward[0] == pytest.approx(want) and (cost.stage_send_forward[1] == 0).all()
        assert cost.stage_send_backward[1] == pytest.approx(want) and (cost.stage_send_backward[0] == 0).all()
        totals = cost.totals()
        assert totals["pipeline_send"] == pytest.approx(want.sum())  # both stages send once per micro-batch
        assert sum(v for k, v in totals.items() if k != "step_total") == pytest.approx(totals["step_total"])
    # interleaved stages overlap their sends: nothing held, the wait is in the bubble
    inter = cost_plan(_plan(rng, m=2), MODEL, TOPO, CostParams(pipeline_stages=2, virtual_stages=2))
    assert not inter.p2p_blocking and inter.totals()["pipeline_send"] == 0.0


def test_offloaded_optimizer_runs_at_the_host_rate_once_per_step_per_stage():
    rng = np.random.default_rng(2)
    plan = _plan(rng)  # static placement: 2 homes per GPU per layer, EP 8 = every GPU (dp 1)
    for stages in (1, 2):
        base = CostParams(pipeline_stages=stages)
        gpu = cost_plan(plan, MODEL, TOPO, base)
        host = cost_plan(plan, MODEL, TOPO, dataclasses.replace(base, optimizer_offload_fraction=1.0,
                                                                host_adam_params_per_s=1e6))
        params = 2 * (4 // stages) * MODEL.expert_params + MODEL.dense_params / stages / 8  # one stage's GPU
        parts = host.info["optimizer"]
        assert parts["params"] == pytest.approx(params) and parts["gpu_s"] == 0.0
        assert host.optimizer_s == pytest.approx(params / 1e6)
        # once per step, outside the schedule: only the optimizer term moves
        assert host.step_seconds - gpu.step_seconds == pytest.approx(host.optimizer_s - gpu.optimizer_s)
        assert host.totals()["optimizer"] == host.optimizer_s
    # half offloaded: the GPU's half beside the host's, the longer sets the step
    half = cost_plan(plan, MODEL, TOPO, CostParams(optimizer_offload_fraction=0.5, host_adam_params_per_s=1e6))
    parts = half.info["optimizer"]
    assert parts["gpu_s"] > 0 and half.optimizer_s == max(parts["gpu_s"], parts["host_s"])
    assert parts["host_compute_s"] == pytest.approx(0.5 * parts["params"] / 1e6)
    # a fast host: the PCIe copies set it (fp32 gradients down, 4 bytes a parameter)
    fast = cost_plan(plan, MODEL, TOPO, CostParams(optimizer_offload_fraction=1.0, host_adam_params_per_s=1e15))
    assert fast.optimizer_s == pytest.approx(fast.info["optimizer"]["params"] * 4 / (TOPO.pcie_GBps * 1e9))
    with pytest.raises(ConfigError, match="host_adam_params_per_s"):
        CostParams(host_adam_params_per_s=0.0)


# ---- the dispatcher ---------------------------------------------------------------------------------
def test_dispatcher_rules():
    assert dispatch_rule_of(TOPO, CostParams(dispatcher="alltoall")) == ("direct", False)
    assert dispatch_rule_of(TOPO, CostParams(dispatcher="deepep")) == ("rail", True)
    assert dispatch_rule_of(TOPO, CostParams(dispatcher="alltoall", route="rail")) == ("rail", False)
    with pytest.raises(ConfigError, match="dispatcher"):
        CostParams(dispatcher="nccl")


def test_allgather_sends_every_token_to_every_rank():
    """2 nodes x 2 GPUs (GPUs 0, 1 | 2, 3), rank s holding (s + 1) GB, every link 1 GB/s. GPU s sends its bytes to
    its node peer over NVLink and once over RDMA to the GPU of its local index in the other node, which forwards
    them to its peer. GPU 1's NVLink sends: its own 2 GB plus GPU 3's 4 GB it relays = 6 GB (GPU 3 likewise 4 + 2);
    every RDMA direction carries at most 4 GB. So 6 s."""
    topo = Topology("ag", num_nodes=2, gpus_per_node=2, nvlink_GBps=1.0, rdma_GBps=1.0, matmul_tflops=1.0,
                    gemm_half_tokens=1.0, collective_latency_s=0.0)
    src = np.array([[1.0, 2.0, 3.0, 4.0]]) * 1e9
    assert allgather_seconds(src, 2, topo, "rail")[0] == pytest.approx(6.0)


def test_slime_235b_card_uses_alltoall_and_a_four_stage_pipeline():
    card = load_card("slime-qwen3-235b")
    params = card.cost_params(16)
    assert card.dispatcher == "alltoall" and params.dispatcher == "alltoall"
    assert (params.pipeline_stages, params.last_stage_layers) == (4, 22)
    assert card.stage_layer_counts(94) == (24, 24, 24, 22)
    assert load_card("verl-qwen3-30b").dispatcher == "deepep"
    assert load_card("slime-qwen3-30b").dispatcher == "alltoall"


def test_slime_235b_breakdown_has_a_bubble_term():
    """The card's own pipeline on a cut-down batch of its model: the bubble is a term of the breakdown."""
    from relibra.cluster import get_model
    from relibra.policies import get_policy
    from relibra.workloads import generate_trace

    card = load_card("slime-qwen3-235b")
    model = get_model("qwen3-235b-a22b")
    trace = generate_trace(model, "math", 16, steps=1, seed=0, micro_batches=2, tokens_per_rank=512,
                           config=card.workload_config())
    plan = get_policy("megatron").plan(trace, 0, card.topology())
    cost = cost_plan(plan, model, card.topology(), card.cost_params(16), seq_lens=trace.seq_lens[0])
    totals = cost.totals()
    assert cost.info["pipeline"]["moe_layers_per_chunk"] == [24, 24, 24, 22]
    assert totals["pipeline_bubble"] > 0
    assert sum(v for k, v in totals.items() if k != "step_total") == pytest.approx(cost.step_seconds, rel=1e-9)


# ---- the sequence split (CP x TP) -------------------------------------------------------------------
def test_split_pieces_by_hand():
    from relibra.workloads.layouts import split_pieces

    # CP 2: 4 chunks of a 10-token sequence: 3, 3, 2, 2; rank 0 takes chunks 0 and 3 (5), rank 1 chunks 1 and 2 (5);
    # TP 2 then halves each: [[3, 2], [3, 2]]
    assert split_pieces(np.array([10]), 2, 2).tolist() == [[[3, 2], [3, 2]]]
    # 7 tokens: chunks 2, 2, 2, 1; rank 0: 2 + 1 = 3, rank 1: 2 + 2 = 4; TP 1
    assert split_pieces(np.array([7]), 2, 1).tolist() == [[[3], [4]]]
    lengths = np.array([1, 5, 8191, 10240])
    pieces = split_pieces(lengths, 2, 4)
    assert pieces.shape == (4, 2, 4) and pieces.sum(axis=(1, 2)).tolist() == lengths.tolist()
    assert (pieces.max(axis=(1, 2)) - pieces.min(axis=(1, 2)) <= 2).all()


def test_slime_235b_trace_splits_every_sequence_over_cp_x_tp():
    """The card's batch: bins of 16384 x CP 2 = 32768 tokens per data-parallel slot, each split over its 8 ranks, so
    no rank holds more than a bin's eighth (plus rounding) and a rank's tokens are its slot's bin / 8."""
    from relibra.workloads import generate_trace

    card = load_card("slime-qwen3-235b")
    cfg = card.workload_config()
    assert (cfg.context_parallel, cfg.tensor_parallel) == (2, 4) and card.sequence_split == 8
    trace = generate_trace("qwen3-235b-a22b", "math", 16, steps=1, seed=0, config=cfg)
    tokens = trace.loads[0, :, 0].sum(axis=-1) // 8  # [M, ep] tokens per (micro-batch, rank)
    assert tokens.max() <= 32768 // 8 + 8
    slot_tokens = tokens.reshape(-1, 2, 8)  # [M, DP slot, CP x TP ranks]
    assert (slot_tokens.max(axis=2) - slot_tokens.min(axis=2)).max() <= 2 * trace.seq_lens[0].shape[-1]
    # the pieces' lengths are what the trace keeps; the attention of a piece is its whole sequence's / 8
    assert int(trace.seq_lens[0].sum()) == int(tokens.sum())
    assert card.cost_params(16).sequence_split == 8


# ---- the costs that were charged at zero --------------------------------------------------------------
def test_gemm_floor_contention_and_broadcast_by_hand():
    from relibra.costs.overheads import (Overheads, copy_contention_seconds, gemm_floor_seconds, plan_metadata,
                                         plan_broadcast_seconds)

    expert = np.array([[[1e-4, 5e-3, 0.0]]])
    tokens = np.array([[[10, 5000, 0]]])
    # forward at least a third of the 0.6 ms floor where a GPU computes anything; an idle GPU stays at 0
    assert np.allclose(gemm_floor_seconds(expert, tokens, 6e-4), [[[2e-4, 5e-3, 0.0]]], rtol=1e-12, atol=0)
    push = np.array([[[1.0, 3.0]]])
    pull = np.array([[[2.0, 0.5]]])
    fwd, bwd = copy_contention_seconds(push, pull, 0.5, push_backward=True)
    assert fwd.tolist() == [[1.5]] and bwd.tolist() == [[1.75]]  # 0.5 x max(3, 3.5)
    rng = np.random.default_rng(3)
    plan = _plan(rng, m=2)
    assert plan_broadcast_seconds(plan, Overheads(plan_metadata_charged=True), TOPO).tolist() == [0.0, 0.0]
    rexp, rstart, rtok = empty_replicas(2, MODEL.num_layers, 8, 1)
    with_slots = StepPlan("x", plan.loads, plan.home, rexp, rstart, rtok, 4, plan.slots_per_gpu + 1)
    ov = Overheads(plan_metadata_charged=True, host_to_device_GBps=1.0)
    meta = plan_metadata(with_slots, ov, TOPO)
    assert meta["bytes_per_microbatch"] == 3 * 4 * MODEL.num_layers * 8 * 1
    got = plan_broadcast_seconds(with_slots, ov, TOPO)
    first = meta["bytes_per_microbatch"] + meta["home_bytes_per_step"]
    lat = 2 * TOPO.collective_latency_s
    assert got[0] == pytest.approx(first / 1e9 + first / TOPO.rdma_bytes_per_s + lat)  # EP 8 spans 2 nodes
    assert got[1] == pytest.approx(meta["bytes_per_microbatch"] * (1 / 1e9 + 1 / TOPO.rdma_bytes_per_s) + lat)
    assert plan_broadcast_seconds(with_slots, Overheads(), TOPO).tolist() == [0.0, 0.0]


def test_new_costs_only_slow_the_step_and_are_recorded():
    from relibra.costs import Overheads

    rng = np.random.default_rng(5)
    plan = _plan(rng)
    bare = cost_plan(plan, MODEL, TOPO, CostParams())
    floored = cost_plan(plan, MODEL, TOPO, CostParams(overheads=Overheads(gemm_call_floor_s=0.05)))
    own = floored.info["overheads"]
    # a 50 ms floor binds on every busy GPU: 3 micro-batches x 4 layers, forward + 2 x backward = the floor
    assert own["gemm_floor_s"] > 0
    assert floored.step_seconds - bare.step_seconds == pytest.approx(own["gemm_floor_s"], rel=1e-9)
    assert floored.forward["expert_compute"].min() >= 0.05 / 3
    assert cost_plan(plan, MODEL, TOPO, CostParams(overheads=Overheads(copy_a2a_contention=1.0))).info[
        "overheads"]["copy_contention_s"] == 0.0  # no replicas: nothing contends


def test_attention_of_a_split_piece_is_its_sequences_share():
    from relibra.costs import attention_core_flops

    whole = MODEL.attention_core_flops(np.array([8000]))
    pieces = np.array([[[1000] * 8]])  # one rank holding its eighth of eight 8000-token sequences
    assert attention_core_flops(MODEL, None, 4096, pieces, split=8)[0, 0] == pytest.approx(8 * whole / 8)
