"""A lab that behaves: JupyterLab opens the notebooks' .py sources as notebooks (the kit's setting), a run
without out_dir never writes over the reproduction, the docs name the widget-workspace quirk, figures are
checked for text a reader cannot read (relibra.plots.overlap), measured runs check the machine's load,
and a study's list parameters are checked before any work."""

from __future__ import annotations

import json
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from relibra.errors import ConfigError  # noqa: E402
from relibra.experiments import get_notebook, project_root  # noqa: E402

ROOT = project_root()
OVERRIDES = ROOT / "notebooks" / "jupyterlab-overrides.json"


# ---- JupyterLab ----------------------------------------------------------------------------------------
def test_reproduce_sh_installs_the_default_viewer_into_the_environment():
    text = (ROOT / "reproduce.sh").read_text()
    assert 'cp notebooks/jupyterlab-overrides.json "$VENV/share/jupyter/lab/settings/overrides.d/relibra.json"' \
        in text
    # setup() runs it on every call (outside the install-once block), so an existing .venv gets it too
    setup = text[text.index("setup() {"):text.index("\n}\n", text.index("setup() {"))]
    assert setup.rindex("overrides.d/relibra.json") > setup.rindex("fi")


def test_the_setting_makes_jupytext_the_default_viewer_of_python_files(tmp_path):
    """Installed as ./reproduce.sh installs it, JupyterLab's settings server reads it back, and the viewer
    it names is one the installed Jupytext extension registers."""
    import shutil
    import sys
    from pathlib import Path

    from jupyterlab_server.settings_utils import _get_overrides

    settings = tmp_path / "share" / "jupyter" / "lab" / "settings"
    (settings / "overrides.d").mkdir(parents=True)
    shutil.copy(OVERRIDES, settings / "overrides.d" / "relibra.json")
    overrides, error = _get_overrides(str(settings))
    assert not error, error
    viewers = overrides["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]
    assert viewers == {"python": "Jupytext Notebook"}
    # JupyterLab's app settings of an environment live in <prefix>/share/jupyter/lab/settings
    from jupyterlab.commands import get_app_dir

    assert Path(get_app_dir()).resolve() == (Path(sys.prefix) / "share" / "jupyter" / "lab").resolve()
    static = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "jupyterlab-jupytext" / "static"
    if static.exists():
        assert any('"Jupytext Notebook"' in f.read_text(errors="ignore") for f in static.glob("*.js"))


def test_a_run_without_out_dir_writes_under_results_interactive(tmp_path, monkeypatch):
    from relibra import paths
    from relibra.experiments.run import Run

    monkeypatch.setattr(paths, "project_root", lambda: tmp_path)
    nb = get_notebook("00_tutorial")
    params, sizes = nb.create()
    run = Run(nb, params, sizes, {})
    assert run.out_dir == tmp_path / "results" / "interactive" / "00_tutorial"
    assert not (tmp_path / "results" / "00_tutorial").exists()


def test_the_docs_name_the_widget_workspace_quirk_and_its_reset():
    text = (ROOT / "docs" / "notebooks.md").read_text()
    assert "Error displaying widget: model not found" in text and "?reset" in text
    assert "results/interactive/<notebook>/" in text and "double-click" in text.lower()


# ---- figures: text a reader cannot read ----------------------------------------------------------------
def test_the_overlap_check_finds_what_it_should_and_nothing_else():
    from relibra.plots.overlap import text_overlaps

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], label="data")
    ax.set_title("a title")
    assert text_overlaps(fig) == []
    ax.text(0.5, 0.5, "one label", transform=ax.transAxes)
    ax.text(0.52, 0.5, "another label", transform=ax.transAxes)
    found = text_overlaps(fig)
    assert any("'one label' overlaps text 'another label'" in p for p in found), found
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 1.0))  # over the title
    assert any("covers text 'a title'" in p for p in text_overlaps(fig))
    ax.text(0.5, 0.99, "at the top", transform=ax.transAxes, va="bottom")
    assert any("'at the top' runs past" in p for p in text_overlaps(fig))
    plt.close(fig)
    # slanted tick labels side by side are not an overlap; level ones that run together are
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.bar(range(6), range(6))
    ax.set_xticks(range(6), [f"policy number {i}" for i in range(6)], rotation=30, ha="right")
    assert text_overlaps(fig) == []
    ax.set_xticks(range(6), [f"policy number {i}" for i in range(6)], rotation=0, ha="center")
    assert any("overlaps text 'policy number" in p for p in text_overlaps(fig))
    plt.close(fig)


@pytest.mark.parametrize("ep", [4, 16])
def test_the_tutorial_figures_are_readable_at_every_ep_its_try_this_suggests(ep):
    from relibra import plots
    from relibra.plots.overlap import text_overlaps
    from relibra.plots.style import set_style

    set_style()
    nb = get_notebook("00_tutorial")
    p, sizes = nb.create(ep=ep)
    r = nb.compute(p, sizes)
    note = p.scale_note(sizes)
    figs = {"grid": plots.tutorial_grid_figure(r.placement_replica_grid, note),
            "load": plots.tutorial_figure(r.case, 0), "plan": plots.plan_figure(r.case, 0),
            "phases": plots.phase_figure(r.case, 0), "replay": plots.replay_figure(r.replay, note),
            "skew": plots.skew_sweep_figure(r.skew_sweep, note)}
    found = {k: text_overlaps(f) for k, f in figs.items()}
    plt.close("all")
    assert not any(found.values()), found


# ---- measured runs on a quiet machine --------------------------------------------------------------------
def test_quiet_machine_waits_for_the_load_to_fall_then_goes_on():
    from relibra.machine import quiet_machine

    clock = [0.0]
    loads = iter([8.9, 6.0, 3.0, 1.5, 1.0])
    said = []
    q = quiet_machine(60, poll_s=5, cores=2, load=lambda: next(loads),
                      sleep=lambda s: clock.__setitem__(0, clock[0] + s), clock=lambda: clock[0], say=said.append)
    assert not q.busy and q.load_at_start == 1.5 and q.waited_s == 15.0 and len(said) == 1


def test_quiet_machine_waits_no_longer_than_its_bound_and_warns():
    from relibra.machine import quiet_machine

    clock = [0.0]
    q = quiet_machine(20, poll_s=5, cores=2, load=lambda: 8.9, sleep=lambda s: clock.__setitem__(0, clock[0] + s),
                      clock=lambda: clock[0])
    assert q.busy and q.waited_s == 20.0 and "8.9" in q.warning and "2 usable cores" in q.warning
    assert quiet_machine(0, cores=2, load=lambda: 1.0).warning == ""
    with pytest.raises(ConfigError):
        quiet_machine(-1)


def test_notebook_08_keeps_the_load_check_with_its_result():
    nb = get_notebook("08_runtime")
    assert "machine_load" in {f for f in nb.Result.__dataclass_fields__}
    s = nb.Summary("cpu", "", (), "", "", "measured on a busy machine: ...")
    assert nb.story(s).startswith("**Warning: measured on a busy machine")


# ---- list parameters checked before any work -------------------------------------------------------------
def test_a_replication_sweep_without_spare_slots_fails_before_any_work():
    nb = get_notebook("05_replication")
    with pytest.raises(ConfigError, match="spare_slot_counts must be 1 or more"):
        nb.create(profile="tiny", spare_slot_counts="0,1,2,4")
    nb.create(profile="tiny", spare_slot_counts="1,2")


def test_reproduce_refuses_it_in_one_error_line(tmp_path, capsys):
    from relibra.cli import main

    code = main(["reproduce", "05", "-p", "spare_slot_counts", "0,1,2,4", "--out", str(tmp_path / "try")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: 05_replication: spare_slot_counts")
    assert not (tmp_path / "try").exists()


def test_a_failed_run_lists_its_real_parameters_in_the_report():
    from relibra.reproduce import non_default_text
    from relibra.report import sources_section

    given = {"profile": "tiny", "seed": 0, "interactive": False, "ep": 16, "skew": 2.0}
    assert non_default_text("00_tutorial", given) == "ep=16, skew=2.0"
    status = {"status": "failed", "profile": "none", "parameters": non_default_text("00_tutorial", given),
              "error": "X", "wall_seconds": 1.0}
    row = next(ln for ln in sources_section({}, {"00_tutorial": status}).splitlines() if "00_tutorial" in ln)
    assert "ep=16, skew=2.0" in row and "defaults" not in row


def test_relibra_run_on_a_busy_machine_says_so_in_its_summary(tmp_path, monkeypatch, capsys):
    """`relibra run` checks the load before it measures: busier than its cores after --quiet-wait, it goes on
    and summary.json (and the console) carry the warning."""
    import os

    from relibra.cli import main

    monkeypatch.setattr(os, "getloadavg", lambda: (99.0, 99.0, 99.0))
    code = main(["run", "--nproc", "2", "--nodes", "1", "--policies", "megatron,relibra", "--steps", "1",
                 "--warmup-steps", "0", "--micro-batches", "1", "--tokens-per-rank", "32", "--quiet-wait", "0",
                 "--out", str(tmp_path / "run")])
    assert code == 0
    load = json.loads((tmp_path / "run" / "summary.json").read_text())["machine_load"]
    assert load["load_at_start"] == 99.0 and "busy machine" in load["warning"] and load["max_wait_s"] == 0.0
    assert "warning: measured on a busy machine" in capsys.readouterr().err


def test_the_share_of_replica_transfers_hidden_lies_in_0_1_for_llep_too():
    """Notebook 07: LLEP fetches its replicas on the critical path, so it hides none of them: 0, not the
    negative share the replica gradients' adds (compute, charged beside the pulls) used to make."""
    nb = get_notebook("07_overheads")
    p, sizes = nb.create(profile="tiny", policies="llep,relibra")
    t = nb.compute(p, sizes).overheads.set_index("policy")
    assert t.loc["llep", "transfers_on_critical_path"] and abs(t.loc["llep", "transfer_overlap"]) < 1e-9
    assert t["transfer_overlap"].dropna().between(0, 1).all()
    assert (t["exposed_transfer_s"] <= t["transfer_s"] * (1 + 1e-9)).all()
