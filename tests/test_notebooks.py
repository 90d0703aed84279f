"""Every notebook runs headless through papermill with the `tiny` profile (via the same runner as
`relibra reproduce`) and writes its figures (PNG + SVG), CSVs, manifest and executed copy; the
committed .ipynb files match their builder and carry no outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest

from relibra.experiments import NOTEBOOKS, project_root

NB_DIR = project_root() / "notebooks"
REQUIRED_PARAMETERS = ("model", "workload", "ep", "cluster", "policies", "steps", "seed", "out_dir", "profile")


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Run all ten notebooks once (tiny profile) and write the report, as `relibra reproduce` does."""
    from relibra.cli.reproduce import run_notebooks
    from relibra.report import write_report

    out = tmp_path_factory.mktemp("results")
    statuses = run_notebooks(list(NOTEBOOKS), "tiny", out, seed=0, progress=False)
    write_report(out, "tiny", statuses, total_seconds=0.0)
    return out, statuses


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_and_writes_results(executed, name):
    out, statuses = executed
    assert statuses[name]["status"] == "ok", statuses[name].get("error")
    folder = out / name
    assert (folder / f"{name}.ipynb").exists()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["figures"] and manifest["tables"]
    for fig in manifest["figures"]:
        for key in ("png", "svg"):
            assert (folder / fig[key]).stat().st_size > 1000
        assert fig["source"] in ("simulated", "measured", "synthetic", "real") and fig["hardware"]
        assert fig["caption"]
    for table in manifest["tables"]:
        assert (folder / table["file"]).stat().st_size > 0
    assert len(list(folder.glob("*.csv"))) == len(manifest["tables"])
    assert manifest["config"]["profile"] == "tiny"


def test_report_names_every_notebook(executed):
    out, statuses = executed
    text = (out / "REPORT.md").read_text()
    for name in NOTEBOOKS:
        assert f"### {name}" in text
    assert "Headline ratios next to the paper's claims" in text and "## Environment" in text


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_has_parameters_and_no_outputs(name):
    nb = nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    for param in REQUIRED_PARAMETERS:
        assert f"\n{param} = " in "\n" + tagged[0].source
    assert 'profile = "laptop"' in tagged[0].source
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_notebooks_match_their_builder():
    proc = subprocess.run([sys.executable, str(NB_DIR / "build_notebooks.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
