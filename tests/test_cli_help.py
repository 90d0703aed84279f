"""The command line takes no abbreviations, and every count or list in its help and the docs comes from
the kit's own tables (notebooks, cluster presets), so the text cannot drift from the code."""

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


def test_docs_name_every_notebook_and_no_stale_count():
    text = (project_root() / "docs" / "notebooks.md").read_text()
    assert all(name in text for name in NOTEBOOKS)
    counts = re.findall(r"\b(ten|eleven|twelve|thirteen)\b", text, flags=re.I)
    assert not counts, f"docs/notebooks.md counts notebooks in words: {counts}; name them instead"


def test_non_default_runs_get_their_own_folder():
    from relibra.cli.reproduce import output_folder

    assert output_folder(None, 0, {}) == "results"
    assert output_folder(None, 0, {"ep": 16, "seed": 1}) == "results/runs/ep=16,seed=1"
    assert output_folder(None, 2, {}) == "results/runs/seed=2"
    assert output_folder("elsewhere", 0, {"ep": 16}) == "elsewhere"
