"""The environment files agree, and the CLI behaves: --help everywhere, one-line errors."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from relibra.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def _requirements_from_pyproject() -> dict[str, str]:
    """{name: specifier} of the library's requirements and of every extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        deps += extra
    reqs = {}
    for dep in deps:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", dep)
        reqs[m.group(1).lower()] = m.group(2).strip()
    return reqs


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        m = re.match(r"^\s*(?:-\s*)?([A-Za-z0-9_.\-]+)==([^\s#]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def _pins_from_constraints() -> dict[str, str]:
    return _pins((ROOT / "constraints.txt").read_text().splitlines())


def _pins_from_environment_yml() -> dict[str, str]:
    return _pins((ROOT / "environment.yml").read_text().splitlines())


def test_pyproject_declares_ranges_that_admit_the_tested_pins():
    from packaging.specifiers import SpecifierSet

    reqs = _requirements_from_pyproject()
    pins = _pins_from_constraints()
    for name, spec in reqs.items():
        assert spec and "==" not in spec, f"pyproject.toml pins {name} exactly ({spec}); declare a range"
        assert name in pins, f"constraints.txt does not pin {name}"
        assert SpecifierSet(spec).contains(pins[name]), f"{name} {pins[name]} (constraints.txt) is outside {spec}"
    megatron = SpecifierSet(reqs["megatron-core"])
    assert all(megatron.contains(v) for v in ("0.15.0", "0.15.3", "0.16.0", "0.16.0rc0", "0.16.0rc0.dev132713"))
    assert not any(megatron.contains(v) for v in ("0.14.0", "0.17.0rc0", "0.19.2"))  # outside the declared range


def test_environment_yml_matches_the_constraints():
    yml = _pins_from_environment_yml()
    assert set(yml) == set(_requirements_from_pyproject())  # the direct requirements, all of them
    constraints = _pins_from_constraints()
    assert {name: constraints[name] for name in yml} == yml


def test_megatron_range_is_what_compat_accepts():
    from packaging.specifiers import SpecifierSet

    from relibra.runtime.compat import TESTED_MEGATRON_CORE

    spec = SpecifierSet(_requirements_from_pyproject()["megatron-core"])
    assert all(spec.contains(v) for v in TESTED_MEGATRON_CORE)
    assert _pins_from_constraints()["megatron-core"] in TESTED_MEGATRON_CORE


def test_torch_pin_is_what_reproduce_installs_and_what_runs():
    from importlib.metadata import version

    pin = _pins_from_constraints()["torch"]
    text = (ROOT / "reproduce.sh").read_text()
    installed = re.findall(r"pip install --quiet -c constraints.txt torch==([^\s]+)", text)
    assert installed and set(installed) == {pin}  # .venv, and .venv-mcore015 (test-mcore)
    # torch alone and first, then the kit under the same constraints
    assert text.index("torch==") < text.index('-e ".[notebooks,test]"')
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
