"""Notebook 12 (the verdict map): its Summary holds each card's point and the grid's best, computed from the
cases; REPORT.md's table has one column per named card beside the paper's figures; coincident cards drawn
once; the figure draws the claims as contours where the grid reaches them and says so where it does not."""

from __future__ import annotations

import warnings

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

from relibra import plots  # noqa: E402
from relibra.experiments import get_notebook  # noqa: E402
from relibra.experiments.base import facts_frame  # noqa: E402
from relibra.experiments.registry import Loaded  # noqa: E402
from relibra.studies.claim_map import MapResult, GridSpec, ShiftAxis, card_hits, card_points  # noqa: E402
from relibra.studies.claim_map import claim_regions, merge_coincident, node_fields  # noqa: E402
from relibra.labels import PAPER_CLAIMS  # noqa: E402
from relibra.report import md_table  # noqa: E402

NB = get_notebook("12_verdict_map")


def _case(kind, setup, tokens, shift, meg, eplb, gap, corr, x=None):
    return {"kind": kind, "setup": setup, "model": "m", "workload": "w", "seed": 0, "tokens": tokens,
            "shift_value": shift, "tokens_per_ep_rank": float(x if x is not None else tokens), "mb_vs_step_corr": corr,
            "mb_corr": corr - 0.1, "micro_batches": 4, "step_sequences": 1024, "sequences_per_rank": 32.0,
            "feasible": True, "relibra_over_megatron": meg, "relibra_over_eplb_plus": eplb,
            "gap_to_balanced": gap, "tokens_per_s_megatron": 100.0, "tokens_per_s_eplb+": 100.0 * meg / eplb}


def _result():
    spec = GridSpec("synthetic", tokens=(2048, 8192, 32768), shift=ShiftAxis("microbatch_shift", (0.0, 0.3)),
                    models=("m",), workloads=("w",), seeds=(0,), cards=("a", "b", "c"))
    rows = [_case("grid", "token-budget-tp1", t, v, m + (0.1 if v else 0.0), 1.0 + (0.1 if v else 0.02), 0.03,
                  0.95 - v)
            for t, m in zip(spec.tokens, (1.1, 1.4, 1.7)) for v in spec.shift.values]
    rows += [_case("card", "a", None, None, 1.2, 1.05, 0.04, 0.9, x=4096),
             _case("card", "b", None, None, 1.2, 1.05, 0.04, 0.9, x=4096),  # the same point as a
             _case("card", "c", None, None, 1.65, 1.1, 0.02, 0.7, x=30000)]
    mr = MapResult(spec, pd.DataFrame(rows))
    fields = node_fields(mr)
    return NB.Result(cases=mr.frame, nodes=fields, cards=card_points(mr), contours=pd.DataFrame(),
                     regions=claim_regions(mr, fields), hits=card_hits(mr), grid=spec.to_dict(),
                     calibration={"label": "real RL trace", "mb_vs_step_corr": 0.77, "tokens_per_ep_rank": 70.0})


def test_summary_holds_each_cards_point_and_the_grids_best():
    r = _result()
    s = NB.summarize(r)
    cards = r.cases[r.cases["kind"] == "card"].set_index("setup")
    assert list(s.cards["setup"]) == ["a = b", "c"]  # a and b give the same point: one entry
    for _, x in s.cards.iterrows():  # one case per card: mean = best = worst = the case's own figure
        case = cards.loc[x["setup"].split(" = ")[0]]
        for c in PAPER_CLAIMS:
            assert x[f"{c.id}_mean"] == x[f"{c.id}_best"] == x[f"{c.id}_worst"] == case[c.id]
        for key in ("tokens_per_ep_rank", "mb_vs_step_corr", "micro_batches", "tokens_per_s_eplb+",
                    "tokens_per_s_megatron"):
            assert x[key] == case[key]
        assert x["cases"] == 1
    grid = r.cases[r.cases["kind"] == "grid"]  # one case per node: a node's best is its case
    top = grid.loc[grid["relibra_over_megatron"].idxmax()]
    meg = s.regions[0]  # the grid's best ReLibra / Megatron and its node, as Summary.why reads them
    assert meg["field"] == "relibra_over_megatron_best"
    assert (meg["best"], meg["best_tokens"]) == (top["relibra_over_megatron"], top["tokens"]) == (pytest.approx(1.8),
                                                                                                   32768)
    top = grid.loc[grid["relibra_over_eplb_plus"].idxmax()]
    assert s.best_over_eplb_plus == (top["relibra_over_eplb_plus"], top["shift_value"], top["mb_vs_step_corr"])
    at = grid.groupby("shift_value")["relibra_over_eplb_plus"].mean()
    assert s.shift_effect == (0.0, 0.3, pytest.approx(at[0.3] - at[0.0]))
    assert meg["min_tokens"] == grid.loc[grid["relibra_over_megatron"] >= 1.6, "tokens"].min() == 32768
    assert s.calibration == r.calibration
    # the verdict: one line per claim, from its region's facts; card c reaches 1.6x over Megatron
    assert [v.split(": ", 1)[0] for v in s.verdict] == [c.statement for c in PAPER_CLAIMS]
    assert [h["cards"] for h in r.hits] == [[("c", pytest.approx(1.65))], []]
    slow = r.cases.copy()
    slow.loc[slow["setup"] == "c", "tokens_per_s_eplb+"] = 50.0  # EPLB+ slower than Megatron at c's point
    slow_c = NB.summarize(NB.Result(**{**vars(r), "cases": slow})).cards.iloc[1]
    assert (slow_c["tokens_per_s_eplb+"], slow_c["tokens_per_s_megatron"]) == (50.0, 100.0)


def test_report_opens_with_one_line_per_claim_then_one_column_per_card():
    r = _result()
    man = {"scale_note": "synthetic grid", "figures": [{"name": "verdict_map", "png": "verdict_map.png"}]}
    facts = facts_frame(NB.facts(r, "synthetic grid"), "synthetic")
    x = Loaded(NB, r, man, None)
    x.__dict__["facts"] = facts  # what load_facts reads back from facts.csv
    section = NB.section(x, md_table)
    assert "12_verdict_map/verdict_map.png" in section
    opening = section.splitlines()[:5]  # the heading, a blank line, then one line per paper claim
    assert [line.split("**")[1] for line in opening[2:5]] == [c.statement for c in PAPER_CLAIMS]
    table = section[section.index("### Per set-up card"):]
    assert "|  | a = b | c | paper |" in table and table.count("| ReLibra / Megatron mean |") == 1
    # the facts: per card its ratios; per claim its region and the cards that reach it
    point = facts[(facts["of"] == "c") & (facts["fact"] == "relibra_over_megatron") & (facts["readme"] == "`c` card's "
                                                                                          "point on the map")]
    assert dict(zip(point["stat"], point["value"])) == {"mean": pytest.approx(1.65), "best": pytest.approx(1.65)}
    meg = facts[(facts["fact"] == "relibra_over_megatron") & (facts["of"] == NB.GRID)].set_index("stat")["value"]
    assert (meg["nodes"], meg["of_nodes"], meg["best"]) == (2, 6, pytest.approx(1.8))  # 1.7x and 1.8x at 32768
    reach = facts[facts["stat"] == "reached by the card"]
    assert list(zip(reach["fact"], reach["of"])) == [("relibra_over_megatron", "c")]
    titles = set(facts["readme"]) - {""}
    assert len(titles) == len(PAPER_CLAIMS) + len(NB.summarize(r).cards)
    assert NB.story(NB.summarize(r))


def test_coincident_cards_are_drawn_once_and_named_together():
    merged = merge_coincident(_result().cards)
    assert list(merged["setup"]) == ["a = b", "c"]


def test_the_figure_draws_reached_claims_as_contours_without_warnings():
    r = _result()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. matplotlib's "no contour levels were found"
        fig = plots.verdict_map_plot(r.nodes, merge_coincident(r.cards), r.calibration, "synthetic")
    axes = fig.axes
    texts = [t.get_text() for ax in axes for t in ax.texts]
    notes = [ax.get_xlabel() for ax in axes]  # a claim the grid does not reach is noted under the axis label
    assert any(t == "paper 1.60x" for t in texts)  # 1.6x lies inside the grid's 1.1-1.8x: a contour label
    assert any("1.20x: reached at no feasible node" in t for t in notes)  # EPLB+'s best is 1.1x
    assert any("every feasible node is below it" in t for t in notes)  # the gap is 3% everywhere
    assert not any(t == "does not fit" for t in texts)  # every synthetic case fits
    assert np.isclose(float(r.nodes["relibra_over_megatron_best"].max()), 1.8)


def test_the_figure_draws_a_node_that_does_not_fit_as_such():
    r = _result()
    cases = r.cases.copy()
    cases.loc[(cases["kind"] == "grid") & (cases["tokens"] == 32768), "feasible"] = False
    mr = MapResult(GridSpec("synthetic", tokens=(2048, 8192, 32768), shift=ShiftAxis("microbatch_shift", (0.0, 0.3)),
                            models=("m",), workloads=("w",), seeds=(0,), cards=("a", "b", "c")), cases)
    nodes = node_fields(mr)
    assert nodes.loc[nodes["tokens"] == 32768, "relibra_over_megatron_best"].isna().all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plots.verdict_map_plot(nodes, card_points(mr), r.calibration, "synthetic")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert sum(t == "does not fit" for t in texts) == 2 * 3  # two nodes, three panels
    assert not any(t == "paper 1.60x" for t in texts)  # 1.6x was reached only at the infeasible 32768 nodes
