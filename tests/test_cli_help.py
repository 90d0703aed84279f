"""The command line takes no abbreviations, every list in its help and the docs comes from the kit's
own tables (notebooks, cluster presets), and `relibra reproduce -p` checks a parameter before any
notebook starts."""

from __future__ import annotations

import argparse
import re

import pytest

from relibra.cli import build_parser
from relibra.experiments import NOTEBOOKS, project_root


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_parser_refuses_abbreviations():
    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 10 and all(p.allow_abbrev is False for p in parsers)
    root = project_root()
    for path in list((root / "relibra").rglob("*.py")) + list((root / "scripts").glob("*.py")):
        for call in re.findall(r"ArgumentParser\([^)]*", path.read_text()):
            assert "allow_abbrev=False" in call, f"{path}: {call}"


def test_abbreviated_option_is_an_error(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["reproduce", "--profil", "tiny"])
    assert exc.value.code == 2 and "--profil" in capsys.readouterr().err


def test_help_lists_come_from_the_tables():
    from relibra.cluster import TOPOLOGY_PRESETS
    from relibra.glance import glance_notebooks

    subs = {p.prog.split()[-1]: p for p in _parsers(build_parser())}
    cluster = next(a.help for a in subs["simulate"]._actions if "--cluster" in a.option_strings)
    assert f"({', '.join(TOPOLOGY_PRESETS)})" in cluster
    reproduce = " ".join(str(x) for a in subs["reproduce"]._actions for x in (a.help,)) + subs["reproduce"].description
    assert all(name in reproduce for name in NOTEBOOKS)
    assert f"notebooks {', '.join(glance_notebooks())})" in reproduce
    readme = (project_root() / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in TOPOLOGY_PRESETS)


def test_docs_name_every_notebook():
    text = (project_root() / "docs" / "notebooks.md").read_text()
    assert all(name in text for name in NOTEBOOKS)


@pytest.mark.parametrize("argv, words", [
    (["02", "-p", "nosuch", "1"], ("02_throughput", "'nosuch'", "takes: profile, setup")),
    (["00", "-p", "spare_slots", "9"], ("00_tutorial", "spare_slots", "an integer 0..4", "9")),
    (["06", "-p", "ep_sizes", "4,x"], ("06_skewness", "ep_sizes", "integers")),
    (["04", "-p", "cluster", "moon"], ("04_reordering", "cluster", "moon")),
    (["02", "-p", "trace", "/nonexistent/t.npz"], ("02_throughput", "trace must be a routing trace file",
                                                   "/nonexistent/t.npz")),
    (["02", "-p", "cluster", "cpu-gloo,nodes=1"], ("02_throughput", "cluster must be", "room for EP 4")),
])
def test_a_bad_parameter_is_one_error_line_before_any_notebook_starts(argv, words, tmp_path, capsys):
    from relibra.cli import main

    out = tmp_path / "out"
    assert main(["reproduce", *argv, "--profile", "tiny", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and all(w in err[0] for w in words), err
    assert not out.exists()  # no notebook folder: no kernel started


def test_non_default_runs_get_their_own_folder():
    from relibra.reproduce import output_folder

    assert output_folder(None, 0, {}) == "results"
    assert output_folder(None, 0, {"ep": 16, "seed": 1}) == "results/runs/ep=16,seed=1"
    assert output_folder(None, 2, {}) == "results/runs/seed=2"
    assert output_folder("elsewhere", 0, {"ep": 16}) == "elsewhere"
