"""The per-GPU memory model (relibra.costs.memory): numbers by hand, the cards' verdicts, `setup show`, and the
PCIe leg migration pays when the optimizer state lives in host memory."""

from __future__ import annotations

import numpy as np
import pytest

from relibra.cli import main
from relibra.cluster import ModelShape, Topology, get_model
from relibra.costs import CostParams, cost_plan
from relibra.costs.memory import (MemoryLayout, layer_activation_bytes_per_token, memory_budget,
                                  offload_migration_seconds, stage_budget, stage_layers)
from relibra.errors import ConfigError
from relibra.plan import StepPlan, empty_replicas
from relibra.setups import DEFAULT_CARD, card_names, load_card
from relibra.trace import static_placement

QWEN = get_model("qwen3-235b-a22b")
EXPERT = 3 * 4096 * 1536  # one routed expert's parameters
ATTENTION = 4096 * (64 * 128 + 2 * 4 * 128) + 64 * 128 * 4096  # Q, K, V and output projections of one layer
ROUTER = 4096 * 128
EMBEDDING = 151936 * 4096


def _layout(**changes) -> MemoryLayout:
    base = dict(tp=1, pp=1, cp=1, ep=32, dp=32, distributed_optimizer=False, optimizer_offload_fraction=0.0,
                recompute=True, tokens_per_gpu=16384.0, hbm_bytes=141e9)
    return MemoryLayout(**{**base, **changes})


def test_qwen3_235b_at_ep32_tp1_pp1_without_a_distributed_optimizer_is_past_141_GB_by_hand():
    terms = stage_budget(QWEN, _layout(), 0)
    experts = 94 * (128 // 32) * EXPERT  # 7.10e9 parameters
    dense = 94 * (ATTENTION + ROUTER) + 2 * EMBEDDING  # attention and router of every layer, embedding and head
    assert terms["weights"] == pytest.approx(2 * (experts + dense))
    assert terms["gradients"] == pytest.approx(4 * (experts + dense))
    assert terms["optimizer"] == pytest.approx(12 * (experts + dense))  # fp32 master + Adam m, v, unsharded
    model_states = 18 * (experts + dense)  # Megatron's 18 bytes per parameter (bf16 params, fp32 grads)
    assert model_states / 1e9 == pytest.approx(271.7, abs=0.1) and model_states > 141e9
    assert not memory_budget(QWEN, _layout()).fits
    # the distributed optimizer shards dense state over the 32 DP ranks, but the expert DP is 32 / 32 = 1:
    # 6 + 12 / 32 bytes per dense parameter and 18 per expert parameter, still past 141 GB
    sharded = stage_budget(QWEN, _layout(distributed_optimizer=True), 0)
    assert sharded["optimizer"] == pytest.approx(12 * experts + 12 * dense / 32)
    assert 2 * (experts + dense) + 4 * (experts + dense) + sharded["optimizer"] > 141e9
    # with all of it in host memory (the recipes' --optimizer-cpu-offload) the HBM holds none of it
    off = stage_budget(QWEN, _layout(distributed_optimizer=True, optimizer_offload_fraction=1.0), 0)
    assert off["optimizer"] == 0 and off["optimizer_host"] == pytest.approx(sharded["optimizer"])


def test_activations_by_hand_under_full_recompute():
    h, q, kv, f = 4096, 64 * 128, 4 * 128, 1536
    per_token = 2 * (2 * h + 2 * q + 2 * kv) + 4 * 64 + 2 * h + 8 * 128 + 8 * (4 * h + 6 * f)
    assert layer_activation_bytes_per_token(QWEN) == per_token
    t = 16384
    # one micro-batch in flight at PP 1: each of 94 layers keeps its bf16 input, one layer is live, fp32 logits
    row = 4 * h + 6 * f  # one routed token-expert row
    expected = 94 * 2 * h * t + (per_token - 8 * row) * t + t * 151936 * 4
    terms = stage_budget(QWEN, _layout(), 0)
    assert terms["activations"] == pytest.approx(expected)
    assert terms["expert_activations"] == pytest.approx(8 * row * t)  # the live layer's rows, at the mean
    no_recompute = stage_budget(QWEN, _layout(recompute=False), 0)
    assert no_recompute["activations"] + no_recompute["expert_activations"] == \
        pytest.approx(94 * per_token * t + t * 151936 * 4)
    # the busiest GPU computes 3x the mean rows: its routed activations are 3x, the rest unchanged
    busy = stage_budget(QWEN, _layout(expert_rows_per_gpu=3 * 8 * t, context_bytes=2.5e9), 0)
    assert busy["expert_activations"] == pytest.approx(3 * 8 * row * t) and busy["activations"] == terms["activations"]
    assert busy["cuda_context_nccl"] == 2.5e9
    assert memory_budget(QWEN, _layout(expert_rows_per_gpu=3 * 8 * t, context_bytes=2.5e9)).total_bytes == \
        pytest.approx(memory_budget(QWEN, _layout()).total_bytes + 2 * 8 * row * t + 2.5e9)
    with pytest.raises(ConfigError, match="expert_rows_per_gpu"):
        _layout(expert_rows_per_gpu=-1.0)


def test_busiest_expert_rows_by_hand_and_from_a_cards_trace():
    from relibra.costs.memory import busiest_expert_rows

    rows = np.ones((2, 3, 4))  # [M, L, ep]
    rows[1, 2] = [1, 1, 1, 5]  # one (micro-batch, layer, GPU) of 5 rows
    assert busiest_expert_rows(rows, recompute=True) == 5.0
    # without recompute a GPU keeps all its layers: GPU 3 of micro-batch 1 holds (1 + 1 + 5) / 3 a layer
    assert busiest_expert_rows(rows, recompute=False) == pytest.approx(7 / 3)
    # by stage: layer 2 alone on stage 1
    assert busiest_expert_rows(rows, False, np.array([0, 0, 1])) == 5.0
    # a card's bound: the static placement in its own trace, well above the mean (Megatron's skewness > 2)
    card = load_card("slime-qwen3-235b")
    b = card.memory_budget()
    assert b.expert_rows == pytest.approx(card.trace_expert_rows("qwen3-235b-a22b"))
    assert b.expert_rows > 2 * b.mean_rows and b.mean_rows == 4096 * 8


def test_slime_235b_as_written_fits_by_hand():
    card = load_card("slime-qwen3-235b")
    layout = card.memory_layout()
    assert (layout.tp, layout.pp, layout.cp, layout.ep, layout.dp) == (4, 4, 2, 16, 2)
    assert layout.distributed_optimizer and layout.optimizer_offload_fraction == 1.0 and layout.recompute
    assert (layout.dense_dp, layout.expert_dp) == (4, 1)  # DP x CP; DP x CP x TP / EP
    assert stage_layers(94, 4) == [24, 24, 24, 22]  # the script's --decoder-last-pipeline-num-layers 22
    b = card.memory_budget()
    assert b.stage == 0 and b.fits
    experts = 24 * (128 // 16) * EXPERT
    dense = 24 * (ATTENTION / 4 + ROUTER) + EMBEDDING / 4
    assert b.terms["weights"] == pytest.approx(2 * (experts + dense))
    assert b.terms["optimizer"] == 0
    assert b.terms["optimizer_host"] == pytest.approx(12 * (experts + dense / 4))
    # 4 micro-batches in flight on stage 0 (1F1B), 4096 rows per GPU (16384 x 2 / (2 x 4))
    t = 4096
    row = 4 * 4096 + 6 * 1536  # one routed token-expert row
    assert b.terms["activations"] == pytest.approx(4 * 24 * 2 * 4096 * t + (layer_activation_bytes_per_token(QWEN)
                                                                            - 8 * row) * t)
    # the live layer's routed rows are the busiest GPU's under the static placement: 3x the mean of 4096 x 8
    assert b.terms["expert_activations"] == pytest.approx(b.expert_rows * row)
    assert 2.5 < b.expert_rows / (8 * t) < 3.5 and b.terms["cuda_context_nccl"] == 2.5e9
    assert b.total_bytes / 1e9 == pytest.approx(35.0, abs=0.1)
    # as written it fits even with the optimizer state in HBM (its expert state is then 43.5 GB per GPU)
    on_gpu = card.with_values("test", optimizer__cpu_offload_fraction=0.0).memory_budget()
    assert on_gpu.fits and on_gpu.total_bytes / 1e9 == pytest.approx(35.0 + b.terms["optimizer_host"] / 1e9, abs=0.1)


@pytest.mark.parametrize("name", card_names())
def test_every_card_fits_as_written(name):
    card = load_card(name)
    for model in card.memory_models():
        b = card.memory_budget(model)
        assert b.fits, (name, model, b.lines())


def test_the_default_card_without_the_recipes_offload_does_not_fit():
    card = load_card(DEFAULT_CARD)
    assert card.entries["optimizer.cpu_offload_fraction"].kind == "assumed"
    on_gpu = card.with_values("test", optimizer__cpu_offload_fraction=0.0)
    b = on_gpu.memory_budget("qwen3-235b-a22b")
    assert not b.fits and b.total_bytes / 1e9 > 200
    assert on_gpu.fits("qwen3-30b-a3b")


def test_bad_layouts_are_errors():
    with pytest.raises(ConfigError, match="optimizer_offload_fraction"):
        _layout(optimizer_offload_fraction=1.5)
    with pytest.raises(ConfigError, match="tp must be a positive integer"):
        _layout(tp=0)
    with pytest.raises(ConfigError, match="cannot be split over"):
        stage_layers(4, 5)


def test_setup_show_prints_the_budget(capsys):
    assert main(["setup", "show", "slime-qwen3-235b"]) == 0
    text = capsys.readouterr().out
    assert "memory per GPU, qwen3-235b-a22b at EP 16, TP 4, PP 4, CP 2, DP 2" in text
    for term in ("weights", "gradients", "optimizer", "activations", "replica_slots", "dispatcher_buffers"):
        assert f"  {term}" in text
    assert "35.0 GB of 141 GB HBM (pipeline stage 0): fits" in text and "routed rows a layer" in text
    assert main(["setup", "show", DEFAULT_CARD]) == 0
    text = capsys.readouterr().out
    assert "sweep optimizer.cpu_offload_fraction = 0.0: 225.7 GB, does NOT fit" in text
    assert main(["setup", "show", "slime-qwen3-235b", "--json"]) == 0
    import json

    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory[0]["fits"] is True and memory[0]["total_GB"] == pytest.approx(35.0, abs=0.1)
    # the JSON holds the printed sweep too (docs/cost-model.md's card-memory table is rendered from it)
    assert memory[0]["sweep"] == load_card("slime-qwen3-235b").memory_sweep("qwen3-235b-a22b")
    assert memory[0]["mean_rows"] > 0


# ---- migration of offloaded optimizer state over PCIe -------------------------------------------------------
MODEL = ModelShape("mem-test", num_layers=2, num_experts=8, top_k=2, hidden=256, moe_ffn=512,
                   num_attention_heads=4, num_kv_heads=2, head_dim=64, vocab_size=1000)


def test_the_pcie_leg_by_hand():
    prev = static_placement(2, 8, 4)
    home = prev.copy()
    home[0, [0, 2]] = home[0, [2, 0]]  # GPU 0 and 1 swap one expert each
    home[1, [1, 4]] = home[1, [4, 1]]  # GPU 0 and 2 swap one expert each
    per_expert = MODEL.expert_params * MODEL.optimizer_bytes_per_param / 2 * 0.5  # dp 2, half offloaded
    seconds, busiest = offload_migration_seconds(prev, home, 4, MODEL, 10.0, 2, 0.5)
    assert busiest == round(2 * per_expert)  # GPU 0 sends two and receives two: max(2, 2) on a duplex link
    assert seconds == pytest.approx(2 * per_expert / 10e9)
    assert offload_migration_seconds(prev, home, 4, MODEL, 10.0, 2, 0.0) == (0.0, 0)
    assert offload_migration_seconds(None, home, 4, MODEL, 10.0, 2, 1.0) == (0.0, 0)


def test_migration_pays_the_pcie_leg_when_the_optimizer_is_offloaded():
    rng = np.random.default_rng(0)
    m, l, ep, e = 2, MODEL.num_layers, 4, MODEL.num_experts
    loads = rng.integers(0, 50, size=(m, l, ep, e)).astype(np.int32)
    home = static_placement(l, e, ep)
    rexp, rstart, rtok = empty_replicas(m, l, ep, 0)
    plan = StepPlan("megatron", loads, home, rexp, rstart, rtok, 4, e // ep)
    prev = home.copy()
    prev[0, [0, 2]] = prev[0, [2, 0]]
    fast = Topology("t", num_nodes=1, gpus_per_node=4, nvlink_GBps=100.0, rdma_GBps=10.0, matmul_tflops=50.0,
                    pcie_GBps=0.5)
    in_hbm = cost_plan(plan, MODEL, fast, prev_home=prev, params=CostParams(dp_size=1))
    host = cost_plan(plan, MODEL, fast, prev_home=prev, params=CostParams(dp_size=1, optimizer_offload_fraction=1.0))
    pcie_s = MODEL.expert_params * MODEL.optimizer_bytes_per_param / 0.5e9  # one expert's state each way
    assert host.migration_s == pytest.approx(max(in_hbm.migration_s, pcie_s))
    assert host.migration_s > in_hbm.migration_s
    # a fast host link hides behind the NVLink transfer (overlapped, --overlap-cpu-optimizer-d2h-h2d)
    quick = fast.with_changes(pcie_GBps=1000.0)
    assert cost_plan(plan, MODEL, quick, prev_home=prev, params=CostParams(
        dp_size=1, optimizer_offload_fraction=1.0)).migration_s == pytest.approx(in_hbm.migration_s)


# ---- the headline: a case that does not fit enters no "up to" ------------------------------------------------
def test_the_headline_verdict_leaves_out_cases_that_do_not_fit():
    import pandas as pd

    from relibra.studies import throughput as hl

    speeds = {("a", "w", 0, True): (100, 120, 130, 150), ("big", "w", 0, False): (100, 100, 190, 200)}
    grid = pd.DataFrame([{"model": m, "workload": w, "seed": s, "feasible": ok, "policy": p, "tokens_per_s": v}
                         for (m, w, s, ok), vals in speeds.items()
                         for p, v in zip(("megatron", "eplb+", "relibra", "balanced"), vals)])
    meg = hl.verdict_table(grid).set_index("claim").loc["ReLibra / Megatron"]
    assert meg["best"] == pytest.approx(1.3) and meg["best_case"] == "a, w, seed 0" and meg["cases"] == 1
    everything = hl.verdict_table(grid.assign(feasible=True)).set_index("claim").loc["ReLibra / Megatron"]
    assert everything["best"] == pytest.approx(1.9)  # the infeasible case would have been the "up to"


def test_a_headline_case_carries_its_memory_verdict():
    from relibra.studies import throughput as hl

    rows = hl.simulate_case(hl.Case(DEFAULT_CARD, "tiny", "math", 0, ep=4, steps=2, micro_batches=2,
                                    policies=("megatron", "relibra")))
    # the busiest GPU's routed rows of the case's own plans (every policy's, the largest)
    expected = load_card(DEFAULT_CARD).memory_budget("tiny", 4, rows["expert_rows"].iloc[0])
    assert rows["feasible"].all() and rows["memory_GB"].iloc[0] == pytest.approx(expected.total_bytes / 1e9)
    assert rows["hbm_GB"].iloc[0] == pytest.approx(141.0)


def test_the_sensitivity_study_sweeps_the_optimizer_offload():
    from relibra.studies.sensitivity import KNOBS, case_inputs, knob_values

    card = load_card(DEFAULT_CARD)
    assert knob_values(quick=True)["optimizer offload"] == [0.0, 1.0]
    for value in (0.0, 1.0):
        params = case_inputs(card, KNOBS["optimizer offload"], value, 32)[2]
        assert params.optimizer_offload_fraction == value
