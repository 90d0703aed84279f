"""The notebooks: their Jupytext sources are the only source, every parameters cell declares exactly what
the notebook reads, bad parameters fail before any work, and every notebook runs headless in the
`tiny` profile (through the same runner as `relibra reproduce`) with its figures inline in the
executed copy, saved as PNG + SVG, and exported to HTML."""

from __future__ import annotations

import ast
import json
import os
import re
import tempfile
from pathlib import Path

import nbformat
import numpy as np
import pytest

from relibra.errors import ConfigError
from relibra.experiments import NOTEBOOKS, declared_parameters, get_notebook, project_root

NB_DIR = project_root() / "notebooks"


def image_outputs(nb) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
               for out in cell.get("outputs", []))


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Run every notebook once (tiny profile) and write the report, as `relibra reproduce` does."""
    from relibra.reproduce import run_notebooks
    from relibra.report import write_report

    out = tmp_path_factory.mktemp("results")
    statuses = run_notebooks(list(NOTEBOOKS), "tiny", out, seed=0, progress=False)
    write_report(out, "tiny", statuses, total_seconds=0.0)
    return out, statuses


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_with_its_figures_inline(executed, name):
    out, statuses = executed
    assert statuses[name]["status"] == "ok", statuses[name].get("error")
    folder = out / name
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["figures"] and manifest["tables"]
    for fig in manifest["figures"]:
        for key in ("png", "svg"):
            assert (folder / fig[key]).stat().st_size > 1000
        assert fig["source"] in ("simulated", "measured", "synthetic", "real") and fig["hardware"] and fig["caption"]
        # relibra.plots.overlap: no text over another, under a legend or a marker, or past its panel
        assert fig["text_overlaps"] == [], (name, fig["name"], fig["text_overlaps"])
    assert len(list(folder.glob("*.csv"))) == len(manifest["tables"])
    nb = nbformat.read(folder / f"{name}.ipynb", as_version=4)
    # every saved figure is shown exactly once in the executed notebook
    assert image_outputs(nb) == len(manifest["figures"])
    html = (folder / f"{name}.html").read_text()
    assert html.count("data:image/png;base64") >= len(manifest["figures"])
    # the notebook interprets its results in text after them (a markdown display output)
    assert any("text/markdown" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    # clean: no progress or warnings on stderr, no widget state, and an HTML that loads nothing from a network
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("name") == "stderr"], f"{name} wrote to stderr in the notebook"
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    assert "widgets" not in nb.metadata
    assert not re.search(r"<script[^>]*src=\"https?://", html) and "cdnjs" not in html


def test_report_names_every_notebook(executed):
    out, _ = executed
    text = (out / "REPORT.md").read_text()
    for name in NOTEBOOKS:
        assert f"### {name}" in text and f"{name}/{name}.html" in text
    # the verdict map's answer, one line per claim, opens the report; the default card's headline follows it
    assert text.startswith("# ReLibra kit: reproduction report\n\n## The answer (simulated)\n\n- **up to 1.6x")
    assert text.index("## The answer") < text.index("## The default card's headline in detail")
    assert "## Environment" in text


def test_report_shows_sensitivity_beside_the_headline(executed):
    """Notebook 10's tornado: one bar per (ratio, knob) of the profile's knob set, around the default
    set-up's ratios, and REPORT.md's sensitivity table right after the headline table."""
    import pandas as pd


    from relibra.studies.sensitivity import RATIOS

    out, _ = executed
    frame = pd.read_csv(out / "10_sensitivity" / "sensitivity.csv")
    tornado = pd.read_csv(out / "10_sensitivity" / "tornado.csv")
    knobs = get_notebook("10_sensitivity").SIZES["tiny"].knobs
    assert sorted(set(frame["knob"])) == sorted(knobs) and len(tornado) == len(RATIOS) * len(knobs)
    defaults = frame[frame["is_default"]]
    assert len(defaults) == len(knobs) and (defaults[list(RATIOS)].nunique() == 1).all()
    assert ((tornado["low"] <= tornado["default"]) & (tornado["default"] <= tornado["high"])).all()
    text = (out / "REPORT.md").read_text()
    head, sens = text.index("## The answer"), text.index("## How far the headline moves: sensitivity")
    assert head < sens < text.index("## What ran")
    section = text[sens:text.index("## What ran")]
    assert all(f"| {k} |" in section for k in knobs) and "10_sensitivity/tornado.png" in section


def test_every_module_summarizes_its_result_once_for_its_text(executed):
    """Each module's Summary is a frozen dataclass that summarize makes from the tiny run's result read back, its
    story a template over it; each writes its facts (facts.csv: the module's facts of its result, one number a
    row, scope and what they were obtained on), from which its README rows and report section come."""
    import dataclasses

    from relibra.experiments.base import FACT_COLUMNS, SCOPES, facts_frame
    from relibra.experiments.registry import load_results
    from relibra.experiments.text import fact_rows
    from relibra.report import md_table

    out, _ = executed
    loaded = load_results(out)
    assert sorted(loaded) == sorted(NOTEBOOKS)
    for name, x in loaded.items():
        nb = x.notebook
        assert dataclasses.is_dataclass(nb.Summary) and nb.Summary.__dataclass_params__.frozen, name
        assert isinstance(x.summary, nb.Summary) and nb.story(x.summary), name
        f = x.facts
        assert list(f.columns) == FACT_COLUMNS and len(f) and f["scope"].isin(SCOPES).all() and f["on"].ne("").all()
        again = facts_frame(nb.facts(x.result, x.manifest["scale_note"]), "")
        assert list(again["fact"]) == list(f["fact"]) and list(again["stat"]) == list(f["stat"]), name
        assert np.allclose(again["value"], f["value"], rtol=1e-5, atol=1e-5, equal_nan=True), name  # tables: 6 digits
        assert all(set(r) == {"what", "figure", "how it was obtained"} for r in fact_rows(f))
        if nb.section is not None:
            assert nb.section(x, md_table).startswith("## "), name


def test_summary_numbers_are_the_tables(executed):
    """The Summary's numbers, computed again here from each result's tables."""
    from pytest import approx

    from relibra.experiments.registry import load_results
    from relibra.labels import CLAIMS

    out, _ = executed
    got = {name: (x.result, x.summary) for name, x in load_results(out).items()}
    r, s = got["00_tutorial"]
    g = r.placement_replica_grid
    assert s.static.skewness == g[(g["placement"] == "static") & (g["spare_slots"] == 0)]["skewness"].iloc[0]
    assert s.best.slowest_gpu_ms == g["slowest_gpu_ms"].min()
    r, s = got["01_routing_dynamics"]
    sk = r.static_skewness
    assert s.mb_skewness == approx(sk.loc[sk["scope"] == "micro-batch", "skewness"].mean())
    assert s.step_skewness == approx(sk.loc[sk["scope"] == "whole step", "skewness"].mean())
    r, s = got["02_throughput"]
    over = {v.claim: v for v in s.verdicts}
    for claim in ("relibra_over_megatron", "relibra_over_eplb_plus"):
        v, t = over[CLAIMS[claim].verdict_label], r.case_ratios[claim]
        near = lambda x: approx(x, rel=1e-5)  # noqa: E731  both tables are saved to 6 significant digits
        assert (v.mean, v.low, v.high, v.cases) == (near(t.mean()), near(t.min()), near(t.max()), len(t))
        assert v.paper == CLAIMS[claim].paper
    for name, table, column in (("03_ablation", "ablation", "skewness"), ("04_reordering", "reordering", "node_skewness"),
                                ("05_replication", "replication", "gpu_skewness")):
        r, s = got[name]
        t = getattr(r, table).groupby("policy")[["speedup_vs_megatron", column]].mean()
        shown = s.stages if name == "03_ablation" else s.policies
        assert shown and all(x.speedup == approx(t.loc[x.policy, "speedup_vs_megatron"]) for x in shown)
        assert all(getattr(x, column) == approx(t.loc[x.policy, column]) for x in shown)
    r, s = got["06_skewness"]
    t = r.skewness[r.skewness["sweep"] == "ep"].groupby("policy")["skewness"]
    assert {p: (lo, hi) for p, lo, hi in s.spans} == {p: (approx(t.min()[p]), approx(t.max()[p])) for p in t.groups}
    r, s = got["07_overheads"]
    assert [(x.policy, x.plan_s) for x in s.policies] == list(zip(r.overheads["policy"], r.overheads["plan_s"]))
    r, s = got["08_runtime"]
    med = r.step_results.groupby("policy")["step_s_median"].median()
    assert {p: m for p, m, _ in s.layouts[0].steps} == approx(med.to_dict())
    r, s = got["09_rl_workload"]
    b = r.balancing.set_index("policy")
    assert s.relibra_speedup == b.loc["relibra", "speedup_vs_megatron"]
    assert (s.first_reward, s.last_reward) == tuple(r.rewards["reward"].iloc[[0, -1]])
    r, s = got["10_sensitivity"]
    dflt = r.sensitivity[r.sensitivity["is_default"].astype(bool)]
    assert s.default == approx({q: dflt[q].iloc[0] for q in s.default}) and len(s.default) == 3
    r, s = got["11_scale"]
    t = r.relibra_h_vs_best
    assert (s.cases, s.behind) == (len(t), int((t["over_best_other"] < 1 - 1e-9).sum()))
    r, s = got["12_verdict_map"]
    cards = r.cases[r.cases["kind"] == "card"].groupby("setup")["relibra_over_megatron"]
    assert {x["setup"]: (x["relibra_over_megatron_mean"], x["relibra_over_megatron_best"])
            for _, x in s.cards.iterrows()} == {
        k: (approx(cards.mean()[k]), approx(cards.max()[k])) for k in cards.groups}


def test_one_notebook_rebuilds_the_report_from_every_result(executed, tmp_path, capfd):
    """Running one notebook keeps the others' results in REPORT.md, and shows the new output."""
    import shutil

    from relibra.reproduce import run_notebooks
    from relibra.report import write_report

    out, _ = executed
    copy = tmp_path / "results"
    shutil.copytree(out, copy)
    before = (copy / "00_tutorial" / "gpu_load.csv").read_text()
    statuses = run_notebooks(["00_tutorial"], "tiny", copy, progress=False, html=False,
                             extra_parameters={"placement": "lpt", "spare_slots": 1})
    assert statuses["00_tutorial"]["status"] == "ok", statuses["00_tutorial"].get("error")
    assert "without encryption" not in capfd.readouterr().err  # the kernel talks over IPC, not plain TCP
    assert not list(Path(tempfile.gettempdir()).glob(f"relibra-kernel-{os.getpid()}-*"))  # its folder removed
    # changing a parameter changes the output
    assert (copy / "00_tutorial" / "gpu_load.csv").read_text() != before
    text = write_report(copy, "tiny", statuses).read_text()
    for name in NOTEBOOKS:
        assert f"### {name}" in text
    assert "ok (this run)" in text and "ok (earlier run)" in text


def test_unknown_parameter_fails_before_any_work(tmp_path):
    from relibra.reproduce import run_notebooks

    statuses = run_notebooks(["02_throughput"], "tiny", tmp_path, progress=False, html=False,
                             extra_parameters={"seeed": 3})
    status = statuses["02_throughput"]
    assert status["status"] == "failed"
    assert "unknown parameter 'seeed'" in status["error"] and "setup" in status["error"].split("takes:")[1]
    failed = tmp_path / "02_throughput.failed"  # a failed run never takes the notebook's own folder
    assert not (tmp_path / "02_throughput").exists() and (failed / "02_throughput.ipynb").exists()
    assert not list(failed.glob("*.csv"))  # it stopped before any experiment


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_source_is_jupytext_percent_declaring_what_it_reads(name):
    import jupytext

    nb = jupytext.read(NB_DIR / f"{name}.py")
    assert nb.metadata["jupytext"]["formats"] == "ipynb,py:percent"
    assert nb.metadata["kernelspec"]["name"] == "python3"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    assert declared_parameters(name) == list(dict.fromkeys(declared_parameters(name)))  # each once
    assert set(declared_parameters(name)) == set(get_notebook(name).Params.names())
    # and with the defaults of its module's Params
    cell = ast.parse(tagged[0].source)
    values = {node.targets[0].id: ast.literal_eval(node.value) for node in cell.body if isinstance(node, ast.Assign)}
    assert values == get_notebook(name).Params.defaults()
    # the first code cell after the parameters checks them before anything else runs
    after = nb.cells[nb.cells.index(tagged[0]) + 1]
    assert f'ex.start("{name}", globals())' in after.source


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_papermill_reads_every_parameter_of_the_cell(name):
    """papermill's own reading of the parameters cell (what `papermill --help-notebook` lists) names every
    declared parameter: a comment it cannot parse (one holding `=`) drops that parameter with a warning."""
    import jupytext
    from papermill.translators import PythonTranslator

    nb = jupytext.read(NB_DIR / f"{name}.py")
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert [p.name for p in PythonTranslator.inspect(cell)] == declared_parameters(name)


def test_notebooks_folder_holds_sources_only():
    """No generator: the .py files are the notebooks (JupyterLab's paired .ipynb stays untracked)."""
    names = sorted(p.stem for p in NB_DIR.glob("*.py"))
    assert names == sorted(NOTEBOOKS)
    assert "*.ipynb" in (NB_DIR / ".gitignore").read_text()


@pytest.mark.parametrize("notebook, params, message", [
    ("02_throughput", {"seeed": 3}, "unknown parameter 'seeed'"),
    ("00_tutorial", {"model": "qwen3-235b-a22b"}, "unknown parameter 'model'"),
    ("00_tutorial", {"spare_slots": 9}, "spare_slots must be an integer 0..4"),
    ("00_tutorial", {"ep": 6}, "ep must be one of"),
    ("00_tutorial", {"skew": -1}, "skew must be a number in"),
    ("03_ablation", {"model": "qwen3-999b"}, "unknown model"),
    ("02_throughput", {"profile": "huge"}, "profile must be one of tiny, laptop, paper, gpu"),
    ("02_throughput", {"setup": "nosuch"}, "unknown set-up card 'nosuch'"),
    ("02_throughput", {"ep": 32}, "unknown parameter 'ep'"),  # the headline grid is the profile's
    ("03_ablation", {"policies": "relibra,eplbb"}, "unknown policy 'eplbb'"),
    ("03_ablation", {"ep": 7}, "ep=7"),
    ("10_sensitivity", {"setup": "nosuch"}, "unknown set-up card"),
    ("10_sensitivity", {"setup": "slime-qwen3-235b"},
     "10_sensitivity: setup: set-up card 'slime-qwen3-235b': entry 'batch.tokens_per_gpu_per_microbatch' has no range"),
    ("04_reordering", {"model": "qwen3-30b-a3b,glm-4.5-air"}, "studies one model"),
    ("08_runtime", {"nproc": 4, "nodes": 3}, "must divide"),
    ("09_rl_workload", {"rl_steps": 0}, "rl_steps must be an integer 1..10000"),
    ("01_routing_dynamics", {"cluster": "paper"}, "unknown parameter 'cluster'"),
    ("10_sensitivity", {"knobs": "spare slots,NVLink"}, "unknown sensitivity knob"),
    ("10_sensitivity", {"policies": "relibra"}, "unknown parameter 'policies'"),
    ("11_scale", {"eps": "16,0"}, "eps must be a comma-separated list of distinct integers 1..4096"),
    ("11_scale", {"eps": "16,16"}, "16 is given twice"),
    ("00_tutorial", {"skew": "nan"}, "not a finite number"),
    ("12_verdict_map", {"seeds": "0,0"}, "0 is given twice"),
    ("11_scale", {"clusters": "paper,nodes=0"}, "nodes"),
    ("11_scale", {"models": "nope"}, "unknown model"),
    ("11_scale", {"ep": 8}, "unknown parameter 'ep'"),
])
def test_bad_parameters_are_errors(notebook, params, message, tmp_path):
    from relibra.experiments import start

    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        start(notebook, out_dir=tmp_path, **params)


def test_injected_names_come_from_papermills_cell():
    from relibra.experiments import injected_names

    history = ["", 'profile = "laptop"\nseed = 0', '# Parameters\nseeed = 3\nprofile = "tiny"\n', "run = ..."]
    assert injected_names({"In": history}) == ["seeed", "profile"]
    assert injected_names({"In": history[:2] + ["run = ..."]}) == []  # no papermill cell: nothing injected


# Every declared parameter that affects results changes the resolved run.
_CHANGED = {"model": "qwen3-30b-a3b", "workload": "code", "ep": 8, "steps": 2, "seed": 1, "cluster": "h800",
            "policies": "megatron,eplb+", "spare_slot_counts": "1,2", "ep_sizes": "4,8", "nproc": 4, "nodes": 2,
            "rl_steps": 3, "measured_dir": "elsewhere", "placement": "lpt", "spare_slots": 1, "skew": 0.5,
            "shift": 0.1, "tokens_per_gpu": 512, "micro_batches": 2, "micro_batch": 1,
            "knobs": "spare slots,NVLink rate", "models": "tiny,qwen3-30b-a3b", "clusters": "paper,nodes=32;nvl72",
            "eps": "8,16", "setup": "one-sequence", "tokens_per_microbatch": 4096, "trace": "data/tiny_math_ep4.npz",
            "tokens": "1024,4096", "workloads": "math", "seeds": "0,1", "step_sequences": "64,256"}


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_declared_parameter_changes_the_params(name):
    nb = get_notebook(name)
    base, _ = nb.create()
    for param in nb.Params.names():
        if param in nb.Params.settings():
            continue
        changed, _ = nb.create(**{param: _CHANGED[param]})
        assert changed.named_values() != base.named_values(), f"{name}: parameter {param} changes nothing"


# ---- the same figures, tables and CSVs as the reference ----------------------------------------------
REFERENCE = Path(__file__).parent / "data" / "tiny_reference"


def test_every_figure_and_csv_is_the_references(executed):
    """The tiny run's CSVs and figures are the reference's (relibra.experiments.golden, which also
    rewrites the reference from a tiny run): numbers to 1e-12, text exact, figures byte for byte,
    measured values left out."""
    from relibra.experiments.golden import compare

    out, _ = executed
    problems = compare(REFERENCE, out)
    assert not problems, problems


def test_the_comparison_sees_a_changed_number_and_a_changed_figure(tmp_path):
    """Not vacuous: one number moved by 1e-9 relative is a difference, one moved by 1e-14 is not; a
    figure of other bytes is a difference."""
    import shutil

    import pandas as pd

    from relibra.experiments.golden import FIGURES, compare, csv_differences

    ref = REFERENCE / "06_skewness" / "skewness.csv"
    t = pd.read_csv(ref)
    for scale, differs in ((1 + 1e-9, True), (1 + 1e-14, False)):
        t2 = t.copy()
        t2.loc[0, "skewness"] *= scale
        t2.to_csv(tmp_path / "s.csv", index=False, float_format="%.17g")
        assert bool(csv_differences(ref, tmp_path / "s.csv", "06_skewness/skewness.csv")) == differs
    reference = tmp_path / "reference"
    (reference / "06_skewness").mkdir(parents=True)
    shutil.copyfile(ref, reference / "06_skewness" / "skewness.csv")
    (reference / FIGURES).write_text(json.dumps({"06_skewness/skewness.png": "0" * 64}))
    run = tmp_path / "run" / "06_skewness"
    run.mkdir(parents=True)
    shutil.copyfile(ref, run / "skewness.csv")
    (run / "skewness.png").write_bytes(b"not the figure")
    assert compare(reference, tmp_path / "run") == ["06_skewness/skewness.png: not the reference's bytes"]
