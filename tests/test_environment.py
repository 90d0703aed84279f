"""The environment files agree, and the CLI behaves: --help everywhere, one-line errors."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from relibra.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def _pins_from_pyproject() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        name, _, version = dep.partition("==")
        assert version, f"pyproject.toml dependency {dep!r} is not pinned exactly"
        pins[name.strip().lower()] = version.strip()
    return pins


def _pins_from_environment_yml() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"^\s*-\s*([A-Za-z0-9_.\-]+)==([^\s#]+)", line)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_environment_yml_matches_pyproject():
    assert _pins_from_environment_yml() == _pins_from_pyproject()


def test_torch_pin_is_what_reproduce_installs_and_what_runs():
    from importlib.metadata import version

    pin = _pins_from_pyproject()["torch"]
    installed = re.findall(r"pip install --quiet torch==([^\s]+)", (ROOT / "reproduce.sh").read_text())
    assert installed == [pin]
    assert version("torch").split("+")[0] == pin


def _subcommand_paths():
    parser = build_parser()
    paths = []

    def walk(p, prefix):
        for action in p._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                for name, child in action.choices.items():
                    paths.append(prefix + [name])
                    walk(child, prefix + [name])

    walk(parser, [])
    return paths


@pytest.mark.parametrize("path", _subcommand_paths(), ids=lambda p: " ".join(p))
def test_help_works_for_every_subcommand(path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(path + ["--help"])
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_cli_error_is_one_line_without_traceback(tmp_path):
    missing = tmp_path / "nope.npz"
    proc = subprocess.run([sys.executable, "-m", "relibra", "trace", "stats", str(missing)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "nope.npz" in lines[0]
