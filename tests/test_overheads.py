"""relibra.costs.overheads: overlap efficiency, activation recomputation, replica gradient adds, the
post-rollout planner and plan metadata, each charged as stated, read from the set-up card, refused when
bad; the overheads table and EPLB+ by spare slots on a cut-down case."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from relibra.cluster import get_model, get_topology
from relibra.costs import CostParams, Overheads, cost_plan, plan_metadata
from relibra.costs import overheads as oh
from relibra.costs.phases import exposed_seconds, non_moe_seconds
from relibra.errors import ConfigError
from relibra.policies import get_policy
from relibra.setups import DEFAULT_CARD, load_card
from relibra.trace import static_placement
from relibra.workloads import generate_trace


@pytest.fixture(scope="module")
def case():
    model = get_model("tiny")
    trace = generate_trace(model, "mixed", 4, steps=2, seed=0, micro_batches=3, tokens_per_rank=256)
    topo = get_topology("paper")
    static = static_placement(model.num_layers, model.num_experts, 4)
    plans = {name: get_policy(name).plan(trace, 1, topo, static) for name in ("megatron", "relibra", "eplb+")}
    return model, trace, topo, static, plans


def _cost(case, name, **ov):
    model, trace, topo, static, plans = case
    return cost_plan(plans[name], model, topo, CostParams(overheads=Overheads(**ov)), prev_home=static,
                     seq_lens=trace.seq_lens[1])


def test_overlapped_seconds_spans_perfect_to_serial():
    rng = np.random.default_rng(0)
    transfer, attention, other = rng.random((3, 4, 5)), rng.random((3, 5)), rng.random((3, 5))
    assert np.array_equal(oh.overlapped_seconds(transfer, attention, other, 1.0),
                          exposed_seconds(transfer, attention, other))
    one_gpu = oh.overlapped_seconds(transfer[..., :1], attention[:, :1], other[:, :1], 0.0)
    assert np.allclose(one_gpu, transfer[..., 0])  # serial: the whole transfer is exposed
    half = oh.overlapped_seconds(transfer[..., :1], attention[:, :1], other[:, :1], 0.5)
    expected = np.maximum(attention[:, None, :1], transfer[..., :1])[..., 0] \
        + 0.5 * np.minimum(attention[:, None, :1], transfer[..., :1])[..., 0] - attention[:, None, 0]
    assert np.allclose(half, expected)


def test_defaults_charge_nothing_and_efficiency_only_costs_replicating_plans(case):
    model, trace, topo, static, plans = case
    plain = cost_plan(plans["relibra"], model, topo, CostParams(), prev_home=static, seq_lens=trace.seq_lens[1])
    assert _cost(case, "relibra").step_seconds == plain.step_seconds
    steps = [_cost(case, "relibra", transfer_overlap_efficiency=e).step_seconds for e in (1.0, 0.85, 0.7, 0.0)]
    assert steps == sorted(steps) and steps[-1] > steps[0]
    assert _cost(case, "megatron", transfer_overlap_efficiency=0.0).step_seconds == \
        _cost(case, "megatron").step_seconds


def test_recompute_adds_each_layers_forward_to_backward(case):
    model, trace, topo, *_ = case
    off, on = _cost(case, "megatron"), _cost(case, "megatron", activation_recompute=True)
    for comp in ("dispatch", "combine", "expert_compute", "dense_compute"):
        assert np.allclose(on.backward[comp], off.backward[comp] + off.forward[comp])
    src = trace.loads[1][:, 0].sum(axis=2) / model.top_k
    dense_layers = non_moe_seconds(src, model, topo, CostParams(include_lm_head=False), trace.seq_lens[1])
    assert np.allclose(on.extra_backward, off.extra_backward + dense_layers)
    assert on.step_seconds == pytest.approx(off.step_seconds + on.info["overheads"]["recompute_s"])
    # balanced-compute keeps the recomputed forward: backward experts at three times the mean forward
    ref = on.balanced_compute()
    assert np.allclose(ref.backward["expert_compute"], 3 * on.expert_seconds_per_gpu.mean(axis=2))


def test_recompute_moves_the_backward_push_into_the_forward_window(case):
    base, rec = _cost(case, "relibra"), _cost(case, "relibra", activation_recompute=True)
    # the recomputed forward's window is shorter than backward's, so no less of the push is exposed
    assert rec.backward["replica_push"].sum() >= base.backward["replica_push"].sum() - 1e-15
    assert np.allclose(rec.forward["replica_push"], base.forward["replica_push"])


def test_grad_add_counts_pulls_at_the_home(case):
    model, trace, topo, static, plans = case
    plan = plans["relibra"]
    adds = oh.grad_adds_per_home(plan, "layer-shared")
    assert adds.sum() == (plan.replica_expert >= 0).sum() > 0
    seconds = oh.replica_grad_add_seconds(adds, model, topo, 2, 4)
    per_add = model.expert_params * (2 + 2 * 4) / topo.memory_bytes_per_s
    assert np.allclose(seconds, adds.max(axis=2) * per_add)
    on, off = _cost(case, "relibra", replica_grad_add=True), _cost(case, "relibra")
    assert np.allclose(on.backward["replica_grad"], off.backward["replica_grad"] + seconds)
    assert _cost(case, "megatron", replica_grad_add=True).step_seconds == _cost(case, "megatron").step_seconds


def test_planner_beyond_its_window(case):
    plans = case[4]
    rates = dict(planner_reorder_s_per_layer=0.5, planner_replication_s_per_cell=0.01)
    plan = plans["relibra"]
    planner_s = 0.5 * plan.num_layers + 0.01 * plan.num_microbatches * plan.num_layers
    assert oh.planner_model_seconds(plan, Overheads(**rates)) == pytest.approx(planner_s)
    assert oh.planner_model_seconds(plans["eplb+"], Overheads(**rates)) == 0.0
    free = _cost(case, "relibra", **rates)  # window None: not charged
    exposed = _cost(case, "relibra", planner_window_forward_passes=0.0, **rates)
    assert exposed.step_seconds == pytest.approx(free.step_seconds + planner_s)
    wide = _cost(case, "relibra", planner_window_forward_passes=1e9, **rates)
    assert wide.step_seconds == pytest.approx(free.step_seconds)
    r = oh.post_rollout_planner(plan, 2.0, Overheads(planner_window_forward_passes=1.0, **rates))
    assert r == {"planner_s": pytest.approx(planner_s), "window_s": 2.0, "exposed_s": pytest.approx(planner_s - 2.0),
                 "rated": True}
    # rates measured on 128-expert models do not carry to the 16-expert test model: not charged
    other = _cost(case, "relibra", planner_window_forward_passes=0.0, planner_measured_experts=128, **rates)
    assert other.step_seconds == pytest.approx(free.step_seconds) and not other.info["overheads"]["planner_rated"]


def test_plan_metadata_is_three_ints_per_slot(case):
    plan, topo = case[4]["relibra"], case[2]
    _, l, ep, r = plan.replica_expert.shape
    meta = plan_metadata(plan, Overheads(host_to_device_GBps=10.0), topo)
    assert meta["bytes_per_microbatch"] == 12 * l * ep * r
    assert meta["seconds_per_microbatch"] == pytest.approx(12 * l * ep * r / 10e9 + topo.collective_latency_s)


def test_card_section_reaches_the_cost_model_and_bad_values_fail(tmp_path):
    card = load_card(DEFAULT_CARD)
    ov = card.cost_params(32).overheads
    assert ov.transfer_overlap_efficiency == card.value("overheads.transfer_overlap_efficiency")
    assert ov.activation_recompute is card.value("overheads.activation_recompute")
    assert ov.planner_window_forward_passes == card.value("overheads.planner_window_forward_passes")
    for key in oh.CARD_ENTRIES:
        e = card.entries[key]
        assert e.kind in ("published", "measured") or e.range is not None, key
    zero = card.with_values("test", overheads__planner_window_forward_passes=0.0)
    assert zero.cost_params(32).overheads.planner_window_forward_passes == 0.0
    with pytest.raises(ConfigError, match="transfer_overlap_efficiency"):
        card.with_values("test", overheads__transfer_overlap_efficiency=1.5).cost_params(32)
    bad = tmp_path / "bad.toml"
    bad.write_text(f"base = '{DEFAULT_CARD}'\n[overheads.activation_recompute]\nvalue = 1\nunit = ''\nkind = 'published'\n"
                   "source = 's'\n")
    with pytest.raises(ConfigError, match="overheads.activation_recompute.*wrong type"):
        load_card(str(bad))


@pytest.mark.parametrize("changes, message", [
    (dict(transfer_overlap_efficiency=-0.1), "transfer_overlap_efficiency"),
    (dict(activation_recompute=1), "activation_recompute"),
    (dict(planner_window_forward_passes=-1.0), "planner_window_forward_passes"),
    (dict(planner_reorder_s_per_layer=float("nan")), "planner_reorder_s_per_layer"),
    (dict(main_grad_bytes_per_param=0), "main_grad_bytes_per_param"),
    (dict(host_to_device_GBps=0.0), "host_to_device_GBps"),
])
def test_bad_overheads_fail_naming_the_knob(changes, message):
    with pytest.raises(ConfigError, match=message):
        Overheads(**changes)
    with pytest.raises(ConfigError, match="overheads"):
        CostParams(overheads={"transfer_overlap_efficiency": 1.0})


def test_overheads_table_and_eplb_plus_slots_on_a_cut_down_case():
    from relibra.studies.case import Case
    from relibra.studies.overheads import EPLB_PLUS_SLOTS, eplb_plus_table, overhead_costs, overheads_table, ratios

    case = Case(DEFAULT_CARD, "tiny", "mixed", 0, ep=4, steps=2, card_changes=(
        ("batch.global_batch_sequences", 16), ("batch.data_parallel_size", 4), ("batch.expert_parallel", 4)))
    costs = overhead_costs([case], progress=False)
    assert set(costs["variant"]) == {"megatron", "relibra", "balanced", *(f"eplb+ {s} slots" for s in EPLB_PLUS_SLOTS)}
    r = ratios(costs).set_index("setting")
    # the overheads only ever slow ReLibra down, and EPLB+ without replicas pushes nothing
    none = costs[costs["setting"] == "none"].set_index("variant")["step_s"]
    card = costs[costs["setting"] == "card"].set_index("variant")["step_s"]
    assert (card >= none - 1e-12).all()
    zero = costs[costs["variant"] == "eplb+ 0 slots"]
    assert (zero["exposed_transfer_s"] == 0).all()
    table = overheads_table(costs)
    assert list(table["overhead"])[:7] == ["transfer overlap efficiency",
                                           "activation recomputation (every policy) and its replica pushes",
                                           "replica gradient add into the home", "planner beyond the post-rollout window",
                                           "per-call floor of the grouped expert GEMM",
                                           "replica copies contending with the all-to-all on NVLink",
                                           "plan metadata broadcast"]
    assert table["charged"].iloc[0].startswith("yes") and table["charged"].iloc[6].startswith("yes")
    from relibra.studies.overheads import gap_terms

    gap = gap_terms(costs).set_index("term")["gap_share"]
    assert {"dispatch", "expert_compute", "pipeline_bubble", "migration"} <= set(gap.index)
    slots = eplb_plus_table(costs)
    assert list(slots["eplb+ spare slots"]) == list(EPLB_PLUS_SLOTS)
    assert list(slots["paper"]) == [s == 2 for s in EPLB_PLUS_SLOTS]
    assert r.loc["card", "relibra_over_eplb_plus_2"] > 0
