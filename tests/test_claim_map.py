"""relibra.studies.claim_map: contours on a grid, where each claim holds and the sentence that says it,
a cut-down grid run end to end (same seed, same rows; JSON without NaN), bad specs refused."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from relibra.errors import ConfigError
from relibra.setups import DEFAULT_CARD
from relibra.studies import claim_map as vm
from relibra.labels import verdict_line

TINY_CHANGES = (("batch.global_batch_sequences", 16), ("batch.data_parallel_size", 4), ("batch.expert_parallel", 4),
                ("overheads.planner_reorder_s_per_layer", 1e-9))


def _tiny_spec(**changes):
    spec = vm.GridSpec("test", tokens=(512, 2048), shift=vm.ShiftAxis("microbatch_shift", (0.0, 0.3)),
                       models=("tiny",), workloads=("mixed",), seeds=(0,), ep=4, cards=(DEFAULT_CARD,), steps=2,
                       card_changes=TINY_CHANGES)
    return vm.dataclasses.replace(spec, **changes)


def test_contour_points_interpolate_along_edges_in_log_tokens():
    xs, ys = (1024, 4096, 16384), (0.2, 0.05)
    # value = log2(x) - 10 in every column: level 3 lies at log2 x = 13 (8192) on both columns
    values = np.array([[0.0, 0.0], [2.0, 2.0], [4.0, 4.0]])
    pts = vm.contour_points(values, xs, ys, 3.0)
    assert pts == [(pytest.approx(8192.0), 0.05), (pytest.approx(8192.0), 0.2)]
    # a level between the columns crosses the shift edges, at the interpolated shift value
    values = np.array([[1.0, 3.0], [1.0, 3.0], [np.nan, 3.0]])
    pts = vm.contour_points(values, xs, ys, 2.0)
    assert [p[0] for p in pts] == [1024.0, 4096.0] and all(p[1] == pytest.approx(0.125) for p in pts)
    assert vm.contour_points(values, xs, ys, 10.0) == []
    with pytest.raises(ConfigError, match="do not match"):
        vm.contour_points(values, xs[:2], ys, 2.0)


def _synthetic_result():
    spec = vm.GridSpec("synthetic", tokens=(2048, 8192, 32768), shift=vm.ShiftAxis("topic_concentration", (0.2, 0.05)),
                       models=("m",), workloads=("w",), seeds=(0,), cards=())
    rows = []
    for t, speed in zip(spec.tokens, (1.1, 1.4, 1.7)):
        for v, corr, over_eplb in ((0.2, 0.95, 1.05), (0.05, 0.7, 1.25)):
            rows.append({"kind": "grid", "tokens": t, "shift_value": v, "model": "m", "workload": "w", "seed": 0,
                         "tokens_per_ep_rank": float(t), "mb_vs_step_corr": corr - 0.01 * np.log2(t / 2048),
                         "micro_batches": 4, "step_sequences": 1024, "sequences_per_rank": 32.0, "feasible": True,
                         "relibra_over_megatron": speed + (0.05 if v == 0.05 else 0.0),
                         "relibra_over_eplb_plus": over_eplb, "gap_to_balanced": 0.04})
    return vm.MapResult(spec, pd.DataFrame(rows))


def test_claim_regions_and_the_one_sentence_conclusion():
    result = _synthetic_result()
    regions = {r["claim"]: r for r in vm.claim_regions(result)}
    mega = regions["up to 1.6x over Megatron-LM"]
    assert (mega["nodes"], mega["min_tokens"], mega["best"]) == (2, 32768, pytest.approx(1.75))
    eplb = regions["up to 1.2x over EPLB+ (oracle loads)"]
    assert eplb["nodes"] == 3 and eplb["max_corr"] == pytest.approx(0.7)
    gap = regions["within 6-10% of Balanced"]
    assert gap["nodes"] == gap["of_nodes"] == 6 and gap["inside_range_nodes"] == 0
    # the correlation falls with the tokens: the region's largest correlation (0.91 at 32768) bounds it
    assert mega["verdict"] == "holds only where" and mega["max_corr"] == pytest.approx(0.91)
    assert eplb["verdict"] == "holds only where" and eplb["min_tokens"] == eplb["grid_min_tokens"]
    assert gap["verdict"] == "holds" and gap["best"] == gap["worst"] == pytest.approx(0.04)
    assert gap["below_range_nodes"] == 6  # 4% everywhere: closer to Balanced than the paper's 6-10%
    # the lines are the regions' facts rendered (labels.verdict_line), the same from facts.csv's shape: floats,
    # a fact without a value absent
    lines = vm.conclusion_lines(result)
    assert lines == [verdict_line(r) for r in regions.values()]
    as_read = [{k: float(v) if isinstance(v, (int, float)) else v for k, v in r.items() if v is not None}
               for r in regions.values()]
    assert lines == [verdict_line(r) for r in as_read]
    cards = pd.DataFrame([{"kind": "card", "setup": "a-card", "model": "m", "workload": "w", "seed": 0,
                           "tokens_per_ep_rank": 4096.0, "mb_vs_step_corr": 0.9, "micro_batches": 3,
                           "step_sequences": 64, "sequences_per_rank": 4.0, "feasible": True,
                           "relibra_over_megatron": 1.1, "relibra_over_eplb_plus": 1.3, "gap_to_balanced": 0.02}])
    with_card = vm.MapResult(result.spec, pd.concat([result.frame, cards], ignore_index=True))
    hits = {h["id"]: h["cards"] for h in vm.card_hits(with_card)}
    assert hits == {"relibra_over_megatron": [], "relibra_over_eplb_plus": [("a-card", pytest.approx(1.3))]}
    # a node that does not fit in memory leaves every claim's region
    fields = vm.node_fields(result)
    fields["feasible"] = fields["tokens"] != 32768
    mega = vm.claim_regions(result, fields)[0]
    assert (mega["nodes"], mega["of_nodes"], mega["infeasible_nodes"], mega["verdict"]) == (0, 4, 2, "does not hold")
    contours = vm.claim_contours(result)
    mega_points = next(c for c in contours if c["level"] == 1.6)["points"]
    assert mega_points and all(8192 < p["tokens_per_ep_rank"] < 32768 for p in mega_points)
    assert all(0.6 < p["mb_vs_step_corr"] < 1.0 for p in mega_points)


def test_contours_join_neighbouring_shift_values_whatever_order_the_spec_lists_them_in():
    base = _synthetic_result()
    extra = base.frame[base.frame["shift_value"] == 0.05].assign(shift_value=0.5, relibra_over_eplb_plus=1.05)
    frame = pd.concat([base.frame, extra], ignore_index=True)
    listed, ascending = ((0.2, 0.05, 0.5), (0.05, 0.2, 0.5))
    contours = [vm.claim_contours(vm.MapResult(vm.dataclasses.replace(
        base.spec, shift=vm.ShiftAxis("topic_concentration", values)), frame)) for values in (listed, ascending)]
    assert contours[0] == contours[1]
    # 1.2x over EPLB+ holds at shift 0.05 only (1.25x; 1.05x at 0.2 and 0.5): one crossing, between 0.05 and
    # 0.2; joining 0.05 to 0.5 (the listed order's neighbours) would add a false one at 0.1625
    eplb = next(c for c in contours[0] if c["field"] == "relibra_over_eplb_plus_best")["points"]
    assert {round(p["shift_value"], 6) for p in eplb} == {0.0875}


def test_an_infeasible_node_or_card_enters_no_statement_of_the_verdict():
    result = _synthetic_result()
    frame = result.frame.copy()
    # the 32768 budget does not fit in memory: its 1.7-1.75x over Megatron must leave the verdict
    frame.loc[frame["tokens"] == 32768, "feasible"] = False
    cards = pd.DataFrame([{"kind": "card", "setup": "big-card", "model": "m", "workload": "w", "seed": 0,
                           "tokens_per_ep_rank": 30000.0, "mb_vs_step_corr": 0.9, "micro_batches": 3,
                           "step_sequences": 1024, "sequences_per_rank": 32.0, "feasible": False,
                           "relibra_over_megatron": 1.9, "relibra_over_eplb_plus": 1.5, "gap_to_balanced": 0.02}])
    cut = vm.MapResult(result.spec, pd.concat([frame, cards], ignore_index=True))
    nodes = vm.node_fields(cut)
    assert list(nodes["feasible"]) == [True] * 4 + [False] * 2
    assert list(nodes["feasible_cases"]) == [1] * 4 + [0] * 2
    assert nodes.loc[~nodes["feasible"], "relibra_over_megatron_best"].isna().all()
    regions = {r["claim"]: r for r in vm.claim_regions(cut)}
    mega = regions["up to 1.6x over Megatron-LM"]
    assert (mega["nodes"], mega["of_nodes"], mega["best"]) == (0, 4, pytest.approx(1.45))  # 8192 at shift 0.05
    assert mega["best_tokens"] == 8192
    assert (mega["verdict"], mega["infeasible_nodes"]) == ("does not hold", 2)
    hits = {h["id"]: h["cards"] for h in vm.card_hits(cut)}
    assert hits == {"relibra_over_megatron": [], "relibra_over_eplb_plus": []}  # big-card's 1.9x does not fit
    points = vm.card_points(cut)
    assert not points.loc[0, "feasible"] and np.isnan(points.loc[0, "relibra_over_megatron_best"])
    # every contour point lies at a feasible node's budget or between two feasible ones
    for c in vm.claim_contours(cut):
        assert all(p["tokens"] <= 8192 for p in c["points"])


def test_a_cut_down_grid_end_to_end():
    spec = _tiny_spec()
    cases = vm.map_cases(spec)
    assert [c.label for c in cases] == ["grid"] * 4 + ["card"]
    result = vm.run_map(spec, workers=1, progress=False)
    assert len(result.grid) == 4 and len(result.cards) == 1
    g = result.grid
    assert set(g["tokens"]) == {512, 2048} and set(g["shift_value"]) == {0.0, 0.3}
    # the shift lowers the micro-batch vs step correlation at every budget
    corr = g.groupby(["tokens", "shift_value"])["mb_vs_step_corr"].mean()
    assert all(corr.loc[(t, 0.3)] < corr.loc[(t, 0.0)] for t in (512, 2048))
    assert ((g["mb_vs_step_corr"] > -1) & (g["mb_vs_step_corr"] <= 1)).all()
    assert (g["relibra_over_megatron"] > 0).all() and (g["gap_to_balanced"] < 1).all()
    # a node's row is its case simulated alone: same seed, same figures
    again = vm.simulate_map_case(cases[0])
    first = result.frame.iloc[0]
    for key in ("relibra_over_megatron", "relibra_over_eplb_plus", "gap_to_balanced", "mb_vs_step_corr"):
        assert again[key] == first[key]
    # the tiny model fits the card's HBM at every node; every row carries its memory verdict
    assert result.frame["feasible"].all() and (result.frame["memory_GB"] < result.frame["hbm_GB"]).all()
    out = vm.map_json(result)
    text = json.dumps(out, allow_nan=False)
    assert json.loads(text)["conclusion"] == out["conclusion"]
    assert out["card_points"][0]["setup"] == DEFAULT_CARD and len(out["nodes"]) == 4
    assert {c["claim"] for c in out["contours"]} == {c.statement for c in vm.PAPER_CLAIMS}
    assert len(out["verdict"]) == len(vm.PAPER_CLAIMS)


def test_grids_and_bad_specs():
    d, p = vm.default_grid(), vm.paper_grid()
    assert d.models == p.models == vm.PAPER_MODELS and len(p.seeds) >= 3 and len(d.seeds) >= 3
    assert d.workloads == p.workloads == ("mixed", "math")
    assert min(p.tokens) == 1024 and max(p.tokens) == 32768 and set(d.tokens) <= set(p.tokens)
    assert d.shift.values[0] == p.shift.values[0] == 0.0  # both start at the kit's value
    # the assumed range's end, then its sensitivity to 0.7; both step sizes (4 and 32 sequences per rank)
    assert vm.MICROBATCH_SHIFT_RANGE[1] in d.shift.values and vm.MICROBATCH_SHIFT_RANGE[1] in p.shift.values
    assert d.shift.values[-1] == p.shift.values[-1] == vm.SHIFT_SENSITIVITY_END >= 0.7
    assert d.shift.field == "microbatch_shift" and d.step_sequences == p.step_sequences == (128, 1024)
    with pytest.raises(ConfigError, match="tokens must be positive"):
        _tiny_spec(tokens=(0,))
    with pytest.raises(ConfigError, match="not a WorkloadConfig field"):
        vm.ShiftAxis("no_such_knob", (1.0,))
    with pytest.raises(ConfigError, match="must be token-budget"):
        vm.simulate_map_case(vm.map_cases(_tiny_spec(setup="one-sequence"))[0])
