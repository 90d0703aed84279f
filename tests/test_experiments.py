"""Unit tests of relibra.experiments (what the notebooks compute), relibra.plots, relibra.report and
the `relibra reproduce` notebook selection. Everything runs at the `tiny` profile."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relibra.setups import DEFAULT_CARD
from relibra import experiments as ex
from relibra import plots
from relibra.errors import ConfigError
from relibra.experiments import tutorial
from relibra.experiments.dynamics import (distribution_distance, expert_load_table, prediction_error_table,
                                          shift_table, static_skewness_table)


def nb(name):
    return ex.get_notebook(name)


def tiny(name, **raw):
    """(params, sizes) of notebook `name` at the tiny profile."""
    return nb(name).create(profile="tiny", **raw)


# ---- parameters ------------------------------------------------------------------------------------
def test_params_fill_from_profile_and_resolve_objects():
    from relibra.cluster import ModelShape, Topology

    p, sizes = tiny("03_ablation")
    assert sizes == ex.SCALES["tiny"] and p.ep == sizes.ep and p.steps == sizes.steps
    assert [m.name for m in p.models()] == list(sizes.models) and isinstance(p.models()[0], ModelShape)
    assert isinstance(p.cluster, Topology) and p.cluster.name == sizes.cluster
    assert p.policies == ("megatron", "relibra-reorder", "relibra-replicate", "relibra", "balanced")
    assert p.workloads(sizes) == sizes.workloads and p.the_workload(sizes) == sizes.workload
    p, sizes = nb("03_ablation").create(profile="laptop", model="qwen3-30b-a3b,glm-4.5-air", workload=["code"],
                                        policies="megatron, relibra", ep="16", steps="3")
    assert [m.name for m in p.models()] == ["qwen3-30b-a3b", "glm-4.5-air"]
    assert p.workloads(sizes) == ("code",) and p.the_workload(sizes) == "code"
    assert p.policies == ("megatron", "relibra") and p.ep == 16 and p.steps == 3


def test_default_scale_note_names_the_profile_and_every_size():
    from dataclasses import dataclass

    from relibra.studies.params import Params, choice, param

    @dataclass(frozen=True)
    class Plain(Params):
        profile: str = param("tiny", "sizes", choice(("tiny",)), affects=False)

    sizes = ex.SCALES["tiny"]
    note = Plain().scale_note(sizes)
    assert note.startswith("tiny profile, models tiny, workloads math, model tiny, ")
    assert "ep_sizes 2,4" in note and "layers None" in note and "tokens_per_rank 64" in note
    assert Plain().scale_note(None) == "tiny profile"


def test_every_notebook_creates_its_defaults_at_every_profile():
    for name in ex.NOTEBOOKS:
        for profile in ex.PROFILES:
            raw = {"profile": profile} if "profile" in nb(name).Params.names() else {}
            p, _ = nb(name).create(**raw)
            assert p.named_values()  # every value resolved to something JSON can hold


def test_relative_out_dir_is_under_the_project_root(tmp_path):
    assert ex.start("06_skewness", profile="tiny", out_dir="results/x").out_dir == ex.project_root() / "results" / "x"


@pytest.mark.parametrize("name, raw, words", [
    ("02_throughput", {"profile": "huge"}, ("02_throughput", "profile", "one of tiny")),
    ("03_ablation", {"workload": "poetry"}, ("03_ablation", "workload", "poetry")),
    ("03_ablation", {"model": "gpt-5"}, ("model", "unknown model")),
    ("03_ablation", {"cluster": "moon"}, ("cluster", "moon")),
    ("03_ablation", {"steps": 0}, ("steps", "an integer 1..10000")),
    ("06_skewness", {"ep_sizes": "4,x"}, ("ep_sizes", "integers")),
    ("00_tutorial", {"micro_batch": 4}, ("micro_batch must be 0..3",)),
])
def test_bad_parameters_name_the_notebook_the_parameter_and_what_it_takes(name, raw, words):
    with pytest.raises(ConfigError) as err:
        nb(name).create(**raw)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_an_unknown_notebook_is_an_error():
    with pytest.raises(ConfigError, match="unknown notebook"):
        ex.get_notebook("99_nope")


def test_scaled_model_keeps_the_shape_but_cuts_layers():
    from relibra.studies.case import scaled_model

    full = scaled_model("qwen3-235b-a22b", None)
    cut = scaled_model("qwen3-235b-a22b", 4)
    assert full.num_layers == 94 and cut.num_layers == 4
    assert (cut.num_experts, cut.top_k, cut.hidden, cut.moe_ffn) == (full.num_experts, full.top_k, full.hidden, full.moe_ffn)
    assert scaled_model("tiny", 100).num_layers == 4


def test_every_profile_is_consistent():
    from relibra.cluster import get_topology

    for p in ex.SCALES.values():
        topo = get_topology(p.cluster)
        for ep in (p.ep,) + p.ep_sizes:
            topo.ep_layout(ep)  # raises when the EP size does not fit the cluster
        assert p.model in p.models or p.model == "tiny"
    for name in ex.NOTEBOOKS:
        if name != "00_tutorial":
            assert set(nb(name).SIZES) == set(ex.PROFILES), name


# ---- 01 routing dynamics -----------------------------------------------------------------------------
def test_distribution_distance_bounds():
    a = np.array([[1.0, 2.0, 3.0, 0.0]])
    assert distribution_distance(a, 10 * a)[0] == pytest.approx(0.0)
    assert distribution_distance(np.array([1.0, 0.0]), np.array([0.0, 5.0])) == pytest.approx(1.0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=4, max_size=4), st.lists(st.integers(0, 50), min_size=4, max_size=4))
def test_distribution_distance_is_a_symmetric_share(a, b):
    a, b = np.array(a, float) + 1, np.array(b, float) + 1
    d = distribution_distance(a, b)
    assert 0.0 <= d <= 1.0
    assert d == pytest.approx(distribution_distance(b, a))


def test_routing_tables_on_a_tiny_trace():
    p, sizes = tiny("01_routing_dynamics")
    traces = nb("01_routing_dynamics").compute(p, sizes).traces
    trace = traces[p.the_workload(sizes)]
    loads = expert_load_table(trace, step=1, layer=2)
    mb = loads[loads.scope == "micro-batch"]
    assert len(mb) == trace.num_microbatches * trace.num_experts
    assert np.allclose(mb.groupby("micro_batch")["share"].sum(), 1.0)
    assert mb["tokens"].sum() == trace.expert_load()[1, :, 2].sum()
    shift = shift_table(traces)
    assert set(shift["trace"]) == set(traces)
    assert shift["value"].dropna().between(-1, 1).all()
    err = prediction_error_table(traces)
    assert set(err["predictor"]) == {"history", "this step (oracle)"}
    assert err["error"].between(0, 1).all() and (err["step"] >= 1).all()
    skew = static_skewness_table(traces)
    assert (skew["skewness"] >= 1.0 - 1e-12).all()


def test_traces_are_deterministic_by_seed():
    from relibra.experiments import traces
    from relibra.setups import load_card

    p, sizes = tiny("01_routing_dynamics")

    def make(seed):
        return traces.make_trace(p.model, "math", p.ep, p.steps, seed, sizes, load_card())

    a = make(3)
    traces.cached_trace.cache_clear()
    b = make(3)
    assert a is not b and np.array_equal(a.loads, b.loads)
    assert not np.array_equal(a.loads, make(4).loads)


# ---- 00 tutorial -------------------------------------------------------------------------------------
def test_tutorial_trace_is_exact_and_seeded():
    t = tutorial.tutorial_trace(skew=1.5, shift=0.0, seed=1)
    assert t.loads.shape == (1, 4, 1, 4, 16)
    assert (t.loads.sum(axis=-1) == 4096 * 2).all()  # every rank's tokens x top-2
    assert np.array_equal(t.loads, tutorial.tutorial_trace(skew=1.5, shift=0.0, seed=1).loads)
    # shift=0: the same expert is hottest in every micro-batch
    hottest = t.expert_load()[0, :, 0].argmax(axis=-1)
    assert (hottest == hottest[0]).all()
    with pytest.raises(ConfigError):
        tutorial.tutorial_trace(shift=1.5)


def test_tutorial_policy_mapping():
    assert tutorial.tutorial_policy("static", 0) == ("megatron", {})
    assert tutorial.tutorial_policy("search", 0) == ("relibra-reorder", {})
    assert tutorial.tutorial_policy("search", 2) == ("relibra", {"spare_slots_per_gpu": 2})
    assert tutorial.tutorial_policy("static", 1) == ("relibra-replicate", {"spare_slots_per_gpu": 1})
    assert tutorial.tutorial_policy("lpt", 0)[1]["replicate"] == "none"
    with pytest.raises(ConfigError):
        tutorial.tutorial_policy("random", 0)


def test_tutorial_replicas_never_slow_the_slowest_gpu():
    static = tutorial.tutorial_case("static", 0, skew=1.5, shift=0.5)
    both = tutorial.tutorial_case("search", 2, skew=1.5, shift=0.5)
    g = both["gpu_table"]
    assert (g["home_tokens"] + g["replica_tokens"] == g["tokens"]).all()
    assert g.groupby("micro_batch")["tokens"].sum().equals(static["gpu_table"].groupby("micro_batch")["tokens"].sum())
    assert both["summary"]["skewness"].mean() <= static["summary"]["skewness"].mean() + 1e-9
    assert (static["gpu_table"]["replica_tokens"] == 0).all()


# ---- simulation experiments -------------------------------------------------------------------------
def test_ablation_same_seed_same_numbers():
    from relibra.experiments import traces

    p, sizes = tiny("03_ablation", workload="math", policies="megatron,eplb+,relibra")
    a = nb("03_ablation").compute(p, sizes, progress=False).ablation
    traces.cached_trace.cache_clear()
    b = nb("03_ablation").compute(p, sizes, progress=False).ablation
    cols = ["model", "workload", "policy", "tokens_per_s", "speedup_vs_megatron", "frac_of_balanced", "skewness"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert set(a["policy"]) == {"megatron", "eplb+", "relibra", "balanced", "balanced-compute"}
    mega = a.set_index("policy").loc["megatron"]
    assert mega["speedup_vs_megatron"] == pytest.approx(1.0)


def test_claims_table_computes_each_ratio_once():
    from relibra.studies.throughput import case_ratios, verdict_table
    from relibra.labels import CLAIMS

    rows = [{"model": m, "workload": "math", "seed": 0, "policy": p, "tokens_per_s": v * k}
            for m, k in (("a", 1.0), ("b", 2.0))
            for p, v in (("megatron", 100), ("eplb+", 125), ("relibra", 150), ("balanced", 160),
                         ("balanced-compute", 155))]
    ratios = case_ratios(pd.DataFrame(rows))
    assert ratios["relibra_over_megatron"].tolist() == [1.5, 1.5]
    assert ratios["relibra_over_eplb_plus"].tolist() == [1.2, 1.2]
    assert ratios["gap_to_balanced"].tolist() == pytest.approx([1 - 150 / 160] * 2)
    v = verdict_table(pd.DataFrame(rows)).set_index("claim")
    assert v.loc["ReLibra / Megatron", "paper"] == CLAIMS["relibra_over_megatron"].paper == "up to 1.6x"
    assert v.loc["ReLibra / EPLB+ (oracle loads)", "best"] == pytest.approx(1.2)
    assert v.loc["gap to Balanced (1 - ReLibra / Balanced)", "cases"] == 2
    assert v.loc["gap to balanced-compute (1 - ReLibra / balanced-compute)", "paper"] == "-"
    # a case that does not fit in memory is marked per case and enters no verdict figure
    tight = pd.DataFrame(rows).assign(feasible=lambda d: d["model"] == "a")
    assert case_ratios(tight)["feasible"].tolist() == [True, False]
    assert verdict_table(tight).set_index("claim").loc["ReLibra / Megatron", "cases"] == 1


def test_a_trace_file_replaces_the_synthetic_traces():
    """notebooks 04-06 take `trace`: its model, EP, steps and micro-batches, and captions that name it."""
    from relibra.trace import RoutingTrace

    path = "data/tiny_math_ep4.npz"
    trace = RoutingTrace.load(ex.project_root() / path)
    p, sizes = tiny("05_replication", trace=path, spare_slot_counts="1", policies="megatron,relibra")
    assert (p.model.name, p.ep, p.steps, sizes.micro_batches) == ("tiny", trace.ep, trace.num_steps,
                                                                  trace.num_microbatches)
    r = nb("05_replication").compute(p, sizes, progress=False)
    assert set(r.replication["workload"]) == {"math"} and set(r.spare_slots["ep"]) == {trace.ep}
    assert path in p.sim_subtitle(sizes) and "synthetic" not in p.sim_subtitle(sizes)
    with pytest.raises(ConfigError, match="holds tiny at EP 4"):
        tiny("06_skewness", trace=path, ep_sizes="2,4")
    with pytest.raises(ConfigError, match="trace must be a routing trace file"):
        tiny("04_reordering", trace="README.md")


def test_plan_level_tables():
    p, sizes = tiny("04_reordering", workload="math")
    table = nb("04_reordering").compute(p, sizes, progress=False).reordering
    assert set(p.policies) <= set(table["policy"])
    assert table["cross_node_share"].between(0, 1).all() and (table["node_skewness"] >= 1 - 1e-12).all()
    static = table[table.policy == "relibra-replicate"]
    assert (static["migration_gb"] == 0).all()  # static homes never migrate
    mega = table[table.policy == "megatron"]
    assert np.allclose(mega["speedup_vs_megatron"], 1.0)


def test_skewness_sweep_balanced_is_flat():
    p, sizes = tiny("06_skewness", policies="megatron,balanced")
    table = nb("06_skewness").compute(p, sizes, progress=False).skewness
    assert set(table["sweep"]) == {"ep", "workload"}
    assert set(table[table.sweep == "ep"]["ep"]) == set(p.ep_sizes)
    bal = table[table.policy == "balanced"]
    assert np.allclose(bal["skewness"], 1.0, atol=0.05)
    mega = table[table.policy == "megatron"]
    assert (mega["skewness"].to_numpy() > bal["skewness"].to_numpy()).all()


def test_overhead_table():
    p, sizes = tiny("07_overheads", policies="eplb+,relibra")
    t = nb("07_overheads").compute(p, sizes).overheads.set_index("policy")
    assert (t.loc[["eplb+", "relibra"], "plan_s"] > 0).all()
    assert (t["forward_s"] > 0).all() and (t["forward_s"] < t["step_s"]).all()
    assert t.loc["megatron", "transfer_s"] == 0 and np.isnan(t.loc["megatron", "transfer_overlap"])
    ok = t["transfer_overlap"].dropna()
    assert ok.between(0, 1 + 1e-9).all()


# ---- run bookkeeping, plots, report ---------------------------------------------------------------
def test_run_saves_figures_tables_and_manifest(tmp_path):
    run = ex.start("06_skewness", profile="tiny", out_dir=tmp_path)
    table = pd.DataFrame({"sweep": ["ep", "ep", "workload"], "model": "tiny", "workload": ["mixed", "mixed", "math"],
                          "ep": [2, 4, 4], "policy": "megatron", "skewness": [1.5, 2.0, 1.7],
                          "skewness_p95": [2.0, 2.5, 2.1]})
    run.save_csv(table, "skewness")
    fig = plots.skewness_plot(table, run.params.plan_label(run.sizes))
    run.save_figure(fig, "skewness", "a caption", source="simulated", hardware="policy plans")
    with pytest.raises(ConfigError):
        run.save_figure(fig, "x", "c", source="imagined")
    run.finish()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["figures"][0]["png"] == "skewness.png" and manifest["figures"][0]["source"] == "simulated"
    for name in ("skewness.png", "skewness.svg", "skewness.csv"):
        assert (tmp_path / name).stat().st_size > 0
    assert "simulated" in fig._suptitle.get_text()


def test_svg_is_reproducible(tmp_path):
    import matplotlib.pyplot as plt

    plots.set_style()
    paths = []
    for i in range(2):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 2], label="x")
        ax.legend()
        paths.append(plots.save_figure(fig, tmp_path / f"f{i}"))
        plt.close(fig)
    assert paths[0][1].read_bytes() == paths[1][1].read_bytes()


def test_report_lists_figures_headline_and_environment(tmp_path):
    from relibra.report import write_report

    from relibra.studies.throughput import verdict_table

    ThroughputResult = ex.get_notebook("02_throughput").Result
    folder = tmp_path / "02_throughput"
    folder.mkdir()

    t = pd.DataFrame([{"model": "m", "workload": "w", "seed": 0, "policy": p, "tokens_per_s": v}
                      for p, v in (("megatron", 1.0), ("eplb+", 1.2), ("relibra", 1.5), ("balanced", 1.6),
                                   ("balanced-compute", 1.55))])
    verdict = verdict_table(t).assign(alternatives_low=1.1, alternatives_high=1.9, why="a reason", scale="full scale")
    empty = pd.DataFrame()
    result = ThroughputResult(throughput=t, case_ratios=empty, verdict=verdict, ratio_vs_budget=empty,
                              alternatives=empty, overheads=empty, setup=DEFAULT_CARD, caption="simulated, fixture grid")
    result.save(type("Folder", (), {"out_dir": folder, "save_csv": lambda self, df, name, doc="": df.to_csv(
        folder / f"{name}.csv", index=False)})())
    manifest = {"notebook": "02_throughput", "config": {"profile": "tiny", "cluster": "paper", "ep": 32},
                "scale_note": "tiny", "figures": [{"name": "tp", "png": "tp.png", "svg": "tp.svg", "caption": "cap",
                                                   "source": "simulated", "hardware": "paper"}],
                "tables": [{"file": "throughput.csv", "rows": 4, "description": ""}],
                "sources": [{"source": "simulated", "hardware": "paper"}], "non_default": "ep=32",
                "wall_seconds": 1.0}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    from relibra.experiments.base import FACTS_FILE, facts_frame

    facts_frame(ex.get_notebook("02_throughput").facts(result, "tiny"), "").to_csv(folder / FACTS_FILE, index=False)
    text = write_report(tmp_path, "tiny", {"02_throughput": {"status": "ok", "wall_seconds": 1.0},
                                           "03_ablation": {"status": "failed", "error": "boom"}},
                        total_seconds=61.0).read_text()
    assert "![tp](02_throughput/tp.png)" in text and "1.50x (m, w, seed 0)" in text and "up to 1.6x" in text
    assert text.index("## The default card's headline in detail") < text.index("Last run")  # the report opens with it
    assert "| 1.10x | 1.90x |" in text and "a reason" in text  # the alternatives' range; why they differ
    assert "megatron-core" in text and "cpu_count" in text and "simulated (paper)" in text
    assert "03_ablation (boom)" in text and "| ep=32 |" in text  # a non-default run is marked


def test_select_notebooks():
    from relibra.reproduce import select_notebooks

    assert select_notebooks(None) == list(ex.NOTEBOOKS)
    assert select_notebooks(["02", "throughput", "notebooks/06_skewness.ipynb"]) == ["02_throughput", "06_skewness"]
    with pytest.raises(ConfigError):
        select_notebooks(["42"])


def test_gpu_profile_reads_measured_runs(tmp_path):
    import json

    fields = {"step_s": [0.2, 0.21], "cpu_step_s": [0.15, 0.16], "step_s_median": 0.205, "step_s_min": 0.2, "step_s_max": 0.21, "sim_step_s": 0.19,
              "cpu_s_per_rank": [0.2] * 4, "wall_s_per_rank": [0.2] * 4, "wait_s_per_rank": [0.01] * 4,
              "segments_s": {"expert compute": 0.1}, "sim_segments_s": {"expert compute": 0.09}, "token_skew": 1.2,
              "plan_skewness": 1.1, "static_skewness": 1.5, "replica_slots": 0, "plan_seconds": 0.01,
              "losses": [5.0, 4.9], "model": "small", "ranks": 4, "nodes": 1, "ranks_per_node": 4,
              "threads_per_rank": 1, "oversubscribed": False, "warmup_steps": 0, "steps": 2,
              "hardware": "NVIDIA H200 x4 (nccl)"}
    for i, p in enumerate(("megatron", "relibra")):
        (tmp_path / f"launch{i}").mkdir()
        with open(tmp_path / f"launch{i}" / "summary.json", "w") as f:
            json.dump({"results": [{**fields, "policy": q} for q in ("megatron", p)]}, f)
    read_measured = nb("08_runtime").read_measured
    p, sizes = nb("08_runtime").create(profile="gpu", measured_dir=str(tmp_path))
    assert sizes.measured_dir and p.measured_dir == str(tmp_path)
    got = read_measured(p.measured_dir)
    assert len(got["summaries"]) == 4 and got["hardware"] == "NVIDIA H200 x4 (nccl)" and got["launches"] == [0, 0, 1, 1]
    assert [s.policy for s in got["summaries"]] == ["megatron", "megatron", "megatron", "relibra"]
    with pytest.raises(ConfigError, match="measured"):
        read_measured(tmp_path / "missing")
