"""Errors before any work: every policy name is checked before a trace is generated or a plan made, a
bad flag is reported with the usage of the subcommand it was given to, and `relibra --version` names
the package and the torch and megatron-core it runs with without importing either."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

import relibra
from relibra.cli import main
from relibra.experiments import project_root


def _never(*args, **kwargs):
    raise AssertionError("work started before every policy name was checked")


def test_simulate_checks_every_policy_before_any_work(monkeypatch, capsys):
    import relibra.sim
    import relibra.workloads

    monkeypatch.setattr(relibra.workloads, "generate_trace", _never)
    monkeypatch.setattr(relibra.sim, "simulate", _never)
    assert main(["simulate", "--model", "tiny", "--workload", "math", "--ep", "4",
                 "--policies", "megatron,nosuch,relibra,bad2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --policies: unknown policies 'nosuch', 'bad2'; known: megatron, eplb")
    assert len(err.splitlines()) == 1 and "balanced-compute" in err
    # a trace file that does not exist is not even opened when a policy name is wrong
    assert main(["simulate", "--trace", "/nonexistent/t.npz", "--policies", "eplb,nosuch"]) == 2
    assert "unknown policy 'nosuch'" in capsys.readouterr().err


def test_bench_checks_every_policy_before_any_work(monkeypatch, capsys):
    import relibra.bench.planner
    import relibra.bench.sim

    monkeypatch.setattr(relibra.bench.planner, "benchmark_planner", _never)
    monkeypatch.setattr(relibra.bench.sim, "benchmark_sim", _never)
    assert main(["bench", "planner", "--model", "tiny", "--ep", "4", "--policies", "relibra,eplb,nosuch"]) == 2
    assert capsys.readouterr().err.startswith("error: --policies: unknown policy 'nosuch'; known: megatron")
    assert main(["bench", "sim", "--model", "tiny", "--ep", "4", "--policy", "relibra,eplb"]) == 2
    assert capsys.readouterr().err.startswith("error: --policy takes one policy name, got 'relibra,eplb'")
    assert main(["bench", "sim", "--policy", "nosuch"]) == 2
    assert capsys.readouterr().err.startswith("error: --policy: unknown policy 'nosuch'")


@pytest.mark.parametrize("argv, prog, unknown", [
    (["trace", "stats", "--steps", "3"], "relibra trace stats", "--steps"),  # 3 is taken as the file
    (["bench", "planner", "--polices", "relibra"], "relibra bench planner", "--polices relibra"),
    (["simulate", "--model", "tiny", "--step", "2"], "relibra simulate", "--step 2"),
])
def test_bad_flag_prints_the_subcommands_usage(argv, prog, unknown, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith(f"usage: {prog} [-h]") and f"\n{prog}: error: unrecognized arguments: {unknown}\n" in err


def test_version_names_package_torch_and_megatron_without_importing_them():
    code = ("import sys; from relibra.cli import main; rc = main(['--version']); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'numpy', 'pandas')); "
            "print('imported:', heavy); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=project_root(), check=True).stdout.splitlines()
    line = out[0]
    assert line.startswith(f"relibra {relibra.__version__} (")
    assert f"torch {importlib.metadata.version('torch')}" in line
    assert f"megatron-core {importlib.metadata.version('megatron-core')}" in line
    assert out[1] == "imported: []"


def test_version_flag_through_the_parser(capsys):
    """`relibra --version` given with other arguments still answers, through the parser."""
    with pytest.raises(SystemExit) as exc:
        main(["--version", "simulate"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith(f"relibra {relibra.__version__} (")
