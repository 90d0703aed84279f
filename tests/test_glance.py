"""relibra.glance: the README's results table is built from a reproduction run's tables, and the
README holds exactly the committed docs/glance.md (so nobody types numbers into it).

The results folders below are FIXTURE DATA written by the tests: made-up numbers chosen so that each
one can be recognised in the table, not results of the kit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from relibra.errors import ConfigError
from relibra.experiments import get_notebook, project_root
from relibra.experiments.base import FACTS_FILE, facts_frame
from relibra.experiments.registry import load_results
from relibra.studies.throughput import verdict_table
from relibra.labels import CLAIMS
from relibra.glance import (BEGIN, END, glance_markdown, glance_rows, readme_block, replace_block, update_readme,
                            write_glance)


ThroughputResult, SkewnessResult, OverheadResult, RuntimeResult, SensitivityResult, ScaleResult = (
    get_notebook(name).Result for name in ("02_throughput", "06_skewness", "07_overheads", "08_runtime",
                                           "10_sensitivity", "11_scale"))


class _Folder:
    """What Result.save needs of a Run: the folder and save_csv."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)

    def save_csv(self, table: pd.DataFrame, name: str, description: str = "") -> None:
        table.to_csv(self.out_dir / f"{name}.csv", index=False)


def _write(out: Path, notebook: str, result, config: dict | None = None,
           scale_note: str = "fixture profile: made-up numbers") -> None:
    """Save `result` as notebook's typed result and its facts (the module's, as a run writes them) under out (and
    a manifest when config is given)."""
    result.save(_Folder(out / notebook))
    facts = facts_frame(get_notebook(notebook).facts(result, scale_note), f"fixture machine; {scale_note}")
    facts.to_csv(out / notebook / FACTS_FILE, index=False)
    if config is not None:
        (out / notebook / "manifest.json").write_text(json.dumps({"config": config, "scale_note": scale_note}))


def _runtime(step_results: pd.DataFrame | None = None, recorded: pd.DataFrame | None = None) -> RuntimeResult:
    empty = pd.DataFrame()
    return RuntimeResult(measured=empty, step_results=step_results if step_results is not None else empty,
                         step_segments=empty, rank_times=empty,
                         recorded_step_results=recorded if recorded is not None else empty,
                         label="fixture", hardware="fixture cpu")


POLICIES = ("megatron", "eplb+", "relibra", "balanced", "balanced-compute")
SPEEDS = {("m1", "w1", 0): dict(zip(POLICIES, (100.0, 125.0, 137.0, 150.0, 140.0))),
          ("m1", "w1", 1): dict(zip(POLICIES, (100.0, 120.0, 130.0, 150.0, 140.0))),
          ("m1", "w2", 0): dict(zip(POLICIES, (100.0, 110.0, 121.0, 130.0, 125.0)))}


def _fixture_results(out: Path) -> None:
    """Made-up typed results in the layout the notebooks write (column names as in relibra.experiments)."""
    t = pd.DataFrame([{"model": m, "workload": w, "seed": seed, "policy": p, "tokens_per_s": v}
                      for (m, w, seed), d in SPEEDS.items() for p, v in d.items()])
    verdict = verdict_table(t).assign(alternatives_low=1.05, alternatives_high=1.45, why="fixture reason",
                                      scale="full scale")
    empty = pd.DataFrame()
    _write(out, "02_throughput", ThroughputResult(
        throughput=t, case_ratios=empty, verdict=verdict, ratio_vs_budget=empty, alternatives=empty, overheads=empty,
        setup="paper", caption="simulated on the `paper` set-up card, EP 32; fixture grid"), config={"profile": "fixture"})
    _write(out, "06_skewness", SkewnessResult(skewness=pd.DataFrame(
        [{"sweep": "ep", "model": "m1", "workload": "w1", "ep": ep, "policy": p, "skewness": s, "skewness_p95": s}
         for ep, p, s in ((8, "megatron", 2.71), (64, "megatron", 3.14), (8, "relibra", 1.01), (64, "relibra", 1.07))]
        + [{"sweep": "workload", "model": "m1", "workload": "w9", "ep": 32, "policy": "megatron", "skewness": 9.99,
            "skewness_p95": 9.99}])), config={"cluster": "paper"})
    _write(out, "07_overheads", OverheadResult(overheads=pd.DataFrame(
        [{"model": "m1", "ep": 32, "cluster": "paper", "policy": p, "plan_s": s, "planner_vs_forward": f,
          "forward_s": 7.5, "planner_on_critical_path": False, "migration_share": 0.0123,
          "replica_memory_share_full_model": 0.0456, "transfer_overlap": 0.78,
          "planner_hardware": "fixture machine"} for p, s, f in (("eplb+", 0.0042, 0.01), ("relibra", 1.234, 0.56))])),
           config={})
    _write(out, "08_runtime", _runtime(pd.DataFrame(
        [{"policy": p, "repeat": r, "step_s_median": v, "step_s_min": v, "step_s_max": v, "sim_step_s": s,
          "model": "moe-cpu", "hardware": "fixture cpu", "ranks": 2, "nodes": 1, "oversubscribed": False,
          "speedup_vs_megatron": x, "speedup_ci_low": lo, "speedup_ci_high": hi, "sim_speedup_vs_megatron": 1.6 / s}
         for p, r, v, s, x, lo, hi in (("megatron", 0, 2.0, 1.6, 1.0, 1.0, 1.0), ("megatron", 1, 2.2, 1.6, 1.0, 1.0, 1.0),
                                       ("relibra", 0, 1.25, 1.0, 1.6, 1.5, 1.7),
                                       ("relibra", 1, 1.35, 1.0, 1.63, 1.55, 1.72))])))
    _write(out, "10_sensitivity", SensitivityResult(sensitivity=pd.DataFrame(), tornado=pd.DataFrame(
        [{"ratio": "relibra_over_megatron", "knob": k, "default": 1.3, "low": lo, "high": hi, "low_value": lv,
          "high_value": hv, "swing": hi - lo}
         for k, lo, hi, lv, hv in (("RDMA rate", 1.11, 1.52, "100", "25"), ("spare slots", 1.2, 1.31, "1", "4"),
                                   ("batch layout", 1.29, 1.3, "verl", "slime"))]),
        case={"model": "m1", "workload": "w1", "ep": 32, "setup": "card-x", "nodes_x_gpus": "20 x 8"}), config={})


def _facts(out: Path, notebook: str, fact: str, **where) -> dict:
    """{(of, stat): value} of one fact of a notebook's facts.csv under out, on the rows matching `where`."""
    f = load_results(out)[notebook].facts
    f = f[f["fact"] == fact]
    for k, v in where.items():
        f = f[f[k] == v]
    return {(of, stat): value for of, stat, value in zip(f["of"], f["stat"], f["value"])}


def test_glance_values_flow_from_the_tables(tmp_path):
    _fixture_results(tmp_path)
    # 02: per claim, the kit's mean, range and best case over the cases and seeds, and the alternatives' range
    over_megatron = {case: d["relibra"] / d["megatron"] for case, d in SPEEDS.items()}  # 1.37, 1.30, 1.21
    best = max(over_megatron, key=over_megatron.get)
    meg = _facts(tmp_path, "02_throughput", "relibra_over_megatron")
    assert meg == {("", "mean"): pytest.approx(np.mean(list(over_megatron.values()))),
                   ("", "low"): pytest.approx(min(over_megatron.values())),
                   ("", "high"): pytest.approx(max(over_megatron.values())),
                   (f"{best[0]}, {best[1]}, seed {best[2]}", "best"): pytest.approx(over_megatron[best]),
                   ("", "other layouts and link rates low"): 1.05, ("", "other layouts and link rates high"): 1.45}
    gap = _facts(tmp_path, "02_throughput", "gap_to_balanced")
    assert gap[("", "mean")] == pytest.approx(np.mean([1 - d["relibra"] / d["balanced"] for d in SPEEDS.values()]))
    # 06: the EP sweep only, per policy its lowest and highest; the workload row is a fact outside the README
    skew = _facts(tmp_path, "06_skewness", "skewness")
    assert {k: v for k, v in skew.items() if k[1] in ("low", "high")} == {
        ("Megatron", "low"): 2.71, ("Megatron", "high"): 3.14, ("ReLibra", "low"): 1.01, ("ReLibra", "high"): 1.07}
    assert skew[("Megatron, w9", "value")] == 9.99
    # 07: measured planner seconds and their ratio to the forward pass; ReLibra's shares, simulated
    assert _facts(tmp_path, "07_overheads", "planner_s", scope="measured") == {
        ("EPLB+", "value"): 0.0042, ("ReLibra", "value"): 1.234}
    assert _facts(tmp_path, "07_overheads", "planner_vs_forward")[("ReLibra", "value")] == 0.56
    assert [_facts(tmp_path, "07_overheads", k, scope="simulated")[("ReLibra", "value")] for k in (
        "migration_share", "replica_memory_share", "transfer_overlap")] == [0.0123, 0.0456, 0.78]
    # 08: medians over repeats (2.1 / 1.3 measured, 1.6 / 1.0 simulated), each launch's speed-up with its
    # interval, the simulated ratio
    assert _facts(tmp_path, "08_runtime", "step_s") == {
        ("Megatron", "measured"): pytest.approx(2.1), ("Megatron", "simulated"): 1.6,
        ("ReLibra", "measured"): pytest.approx(1.3), ("ReLibra", "simulated"): 1.0}
    speedup = _facts(tmp_path, "08_runtime", "speedup_vs_megatron")
    assert [speedup[("ReLibra, launch 2", s)] for s in ("measured", "95% low", "95% high")] == [1.63, 1.55, 1.72]
    assert speedup[("ReLibra", "simulated")] == pytest.approx(1.6)
    # 10: the default, then per knob (largest swing first) its low and high at which value
    knobs = _facts(tmp_path, "10_sensitivity", "relibra_over_megatron")
    assert list(knobs.items())[:3] == [(("", "default"), 1.3), (("RDMA rate = 100", "low"), 1.11),
                                       (("RDMA rate = 25", "high"), 1.52)]
    # the README: the facts with a title, in notebook order (12 and its SECTION_FIRST absent here)
    rows = glance_rows(tmp_path)
    text = dict(zip(rows["what"], rows["figure"]))
    how = dict(zip(rows["what"], rows["how it was obtained"]))
    assert list(rows["what"])[:4] == [c.verdict_label for c in (CLAIMS[k] for k in (
        "relibra_over_megatron", "relibra_over_eplb_plus", "gap_to_balanced", "gap_to_balanced_compute"))]
    assert "1.37x" in text["ReLibra / Megatron"] and "paper: up to 1.6x" in text["ReLibra / Megatron"]
    assert how["ReLibra / Megatron"].startswith("**simulated** on the `paper` set-up card")
    assert how["ReLibra / EPLB+ (oracle loads)"] == "same as above"
    skew_row = text["rank skewness (max / mean tokens per GPU), mean over plans, EP 8-64"]
    assert "3.14" in skew_row and "9.99" not in skew_row
    assert how["planner wall time per step, m1, EP 32"].startswith("**measured** on fixture machine")
    knob_row = text["what moves ReLibra / Megatron most (one knob at a time)"]
    assert "RDMA rate" in knob_row and "spare slots" in knob_row and "batch layout" not in knob_row
    md = glance_markdown(tmp_path)
    assert md.splitlines()[1] == "| what | figure | how it was obtained |" and md.count("\n| ") == len(rows) + 1


def test_glance_skips_missing_tables_and_names_broken_ones(tmp_path):
    _fixture_results(tmp_path)
    import shutil

    shutil.rmtree(tmp_path / "08_runtime")
    shutil.rmtree(tmp_path / "10_sensitivity")
    whats = list(glance_rows(tmp_path)["what"])
    assert len(whats) == 7 and not any("runtime" in w or "knob" in w for w in whats)  # 4 verdict rows, 06, 07 x 2
    assert "No reproduction results" in write_glance(tmp_path / "02_throughput").read_text()
    (tmp_path / "02_throughput" / "verdict.csv").unlink()
    with pytest.raises(ConfigError, match=r"verdict\.csv: missing; rerun notebook 02_throughput"):
        glance_rows(tmp_path)
    (tmp_path / "02_throughput" / "verdict.csv").write_text("x\n1\n")
    (tmp_path / "02_throughput" / FACTS_FILE).unlink()
    with pytest.raises(ConfigError, match=r"facts\.csv: missing; rerun notebook 02_throughput"):
        glance_rows(tmp_path)


def test_update_readme_replaces_only_the_block(tmp_path):
    _fixture_results(tmp_path)
    glance = write_glance(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{BEGIN}\n| old | typed | numbers |\n{END}\n\nafter\n")
    update_readme(glance, readme, tmp_path / "docs" / "glance.md")
    text = readme.read_text()
    assert text.startswith("# Title\n\nbefore\n") and text.endswith(f"{END}\n\nafter\n") and "typed" not in text
    assert readme_block(text) == glance.read_text() == (tmp_path / "docs" / "glance.md").read_text()
    assert "1.37x" in readme_block(text)
    with pytest.raises(ConfigError, match="README.md: needs exactly one"):
        replace_block("no markers here\n", "x\n")
    with pytest.raises(ConfigError, match="README.md: end marker of block 'glance' without its begin marker"):
        readme_block(f"{END}\n{BEGIN}\n")


def test_readme_table_is_the_committed_glance_file():
    """README.md's results table is docs/glance.md, which `relibra reproduce --update-readme` writes."""
    root = project_root()
    committed = (root / "docs" / "glance.md").read_text()
    assert readme_block((root / "README.md").read_text()) == committed
    assert committed.startswith("<!-- written by `relibra reproduce`") and "| what | figure |" in committed


def test_recorded_runtime_and_scale_rows(tmp_path):
    # made-up idle-machine runtime rows: 1 x 2 layout, two launches; medians 0.9 / 0.75 measured, 0.8 / 0.6 simulated
    _write(tmp_path, "08_runtime", _runtime(recorded=pd.DataFrame(
        [{"nodes_x_ranks": "1 x 2", "launch": l, "policy": p, "step_s_median": m, "sim_step_s": s, "steps": 5,
          "load_before": 0.2, "load_after": 1.1, "date": "fixture date", "cpus": 2}
         for l, p, m, s in ((0, "megatron", 0.9, 0.8), (1, "megatron", 0.9, 0.8), (0, "relibra", 0.7, 0.6),
                            (1, "relibra", 0.8, 0.6))])))
    _write(tmp_path, "11_scale", ScaleResult(scale=pd.DataFrame(), relibra_h_vs_best=pd.DataFrame(
        [{"model": "m1", "cluster": "c1", "ep": ep, "policy": "relibra-h", "speedup": sp,
          "frac_of_balanced_compute": f, "best_other": "llep", "best_other_speedup": 1.1, "over_best_other": o}
         for ep, sp, f, o in ((16, 1.2, 0.99, 0.98), (256, 1.27, 0.998, 1.08))])))
    from relibra.experiments.registry import load_results

    loaded = load_results(tmp_path)
    (rt,) = loaded["08_runtime"].summary.layouts
    assert (rt.table, rt.layout, rt.oversubscribed) == ("the shipped reference", "1 x 2", False)
    assert rt.steps == (("megatron", 0.9, 0.8), ("relibra", 0.75, 0.6))
    (v,) = rt.versus  # no interval in the table: the ratio of the medians
    assert (v.policy, v.launches) == ("relibra", ()) and (v.measured, v.simulated) == (0.9 / 0.75, 0.8 / 0.6)
    sc = loaded["11_scale"].summary
    assert (sc.cases, sc.behind) == (2, 1)
    assert [(x.model, x.cluster, x.ep, x.speedup, x.over_best_other, x.best_other) for x in sc.top] == [
        ("m1", "c1", 256, 1.27, 1.08, "llep")]
    assert _facts(tmp_path, "08_runtime", "step_s") == {("Megatron", "measured"): 0.9, ("Megatron", "simulated"): 0.8,
                                                         ("ReLibra", "measured"): 0.75, ("ReLibra", "simulated"): 0.6}
    speedup = _facts(tmp_path, "08_runtime", "speedup_vs_megatron")
    assert speedup == {("ReLibra", "measured"): 0.9 / 0.75, ("ReLibra", "simulated"): pytest.approx(0.8 / 0.6)}
    scale = load_results(tmp_path)["11_scale"].facts
    top = scale[scale["of"] == "m1 EP256 on c1"]
    assert dict(zip(top["fact"], top["value"])) == {"speedup_vs_megatron": 1.27, "frac_of_balanced_compute": 0.998,
                                                    "over_best_other": 1.08}
    assert top.loc[top["fact"] == "over_best_other", "stat"].item() == "vs LLEP"
    behind = scale[scale["fact"] == "behind_best_other"]
    assert (behind["value"].item(), behind["of"].item()) == (1, "of 2 cases")
    whats = list(glance_rows(tmp_path)["what"])
    assert whats == ["runtime step time on the CPU, the shipped reference (median over launches), 1 x 2 (nodes x "
                     "ranks)", "relibra-h (cross-node replicas) at the largest EP, against the best other policy"]
