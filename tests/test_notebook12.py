"""Notebook 12 (the verdict map): its REPORT.md table holds one column per named card beside the paper's
claims, the conclusion and a reason per card; its README rows; coincident cards drawn once; the figure
draws the claims as contours where the grid reaches them and says so where it does not."""

from __future__ import annotations

import warnings

import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")

from relibra import plots  # noqa: E402
from relibra.experiments import get_notebook  # noqa: E402
from relibra.experiments.verdict_map import CLAIMS, MapResult, GridSpec, ShiftAxis, card_points, conclusion  # noqa: E402
from relibra.experiments.verdict_map import claim_regions, node_fields  # noqa: E402
from relibra.plots.verdict_map import merge_coincident  # noqa: E402
from relibra.report import md_table  # noqa: E402

NB = get_notebook("12_verdict_map")


def _case(kind, setup, tokens, shift, meg, eplb, gap, corr, x=None):
    return {"kind": kind, "setup": setup, "model": "m", "workload": "w", "seed": 0, "tokens": tokens,
            "shift_value": shift, "tokens_per_ep_rank": float(x if x is not None else tokens), "mb_vs_step_corr": corr,
            "mb_corr": corr - 0.1, "micro_batches": 4, "relibra_over_megatron": meg, "relibra_over_eplb_plus": eplb,
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
                     conclusion=conclusion(mr, fields), regions=claim_regions(mr, fields), grid=spec.to_dict(),
                     calibration={"label": "real RL trace", "mb_vs_step_corr": 0.77, "tokens_per_ep_rank": 70.0})


def test_report_section_is_one_column_per_card_with_the_conclusion_and_a_reason_each():
    r = _result()
    table = NB.card_table(r)
    assert list(table.columns) == ["", "`a`", "`b`", "`c`", "paper"]
    assert table.loc[0, "`c`"] == "1.65x; 1.65x" and table.loc[0, "paper"] == "up to 1.6x"
    text = NB.section(r, {"scale_note": "synthetic grid", "figures": [{"name": "verdict_map", "png": "verdict_map.png"}]},
                      md_table)
    assert text.startswith("## The verdict: the paper's claims per set-up card")
    assert r.conclusion in text and "up to 1.6x over Megatron-LM needs at least" in r.conclusion
    assert all(f"- `{c}`: " in text for c in "abc") and "12_verdict_map/verdict_map.png" in text
    why = NB.why_cards_differ(r)
    # c's point reaches 1.6x; a's does not, and the map says what it would need
    assert "1.6x" not in why["c"] and "1.6x over Megatron needs at least 32768 tokens per EP rank" in why["a"]
    assert "4 micro-batches a step" in why["a"] and "correlate with their step at 0.90" in why["a"]
    slow = r.cases.copy()
    slow.loc[slow["setup"] == "c", "tokens_per_s_eplb+"] = 50.0  # EPLB+ slower than Megatron at c's point
    why = NB.why_cards_differ(NB.Result(**{**vars(r), "cases": slow}))
    assert "EPLB+ is slower than Megatron here (50 vs 100 tokens/s)" in why["c"]
    rows = NB.rows(r, {"scale_note": "synthetic grid"})
    assert rows[0]["figure"] == r.conclusion and [x["what"] for x in rows[1:]] == [
        f"`{c}` card's point on the map" for c in "abc"]


def test_coincident_cards_are_drawn_once_and_named_together():
    merged = merge_coincident(_result().cards)
    assert list(merged["setup"]) == ["a = b", "c"]


def test_the_figure_draws_reached_claims_as_contours_without_warnings():
    r = _result()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. matplotlib's "no contour levels were found"
        fig = plots.verdict_map_plot(r.nodes, r.cards, CLAIMS, r.calibration, "synthetic")
    axes = fig.axes
    texts = [t.get_text() for ax in axes for t in ax.texts]
    assert any(t == "paper 1.60x" for t in texts)  # 1.6x lies inside the grid's 1.1-1.8x: a contour label
    assert any("1.20x: reached nowhere" in t for t in texts)  # EPLB+'s best is 1.1x
    assert any("every node is below it" in t for t in texts)  # the gap is 3% everywhere
    assert np.isclose(float(r.nodes["relibra_over_megatron_best"].max()), 1.8)
