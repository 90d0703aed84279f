"""Data flows one way: the studies import only the layers below them, the command line and the runtime never
reach into the notebooks' modules (relibra.experiments), and relibra run's engine uses public policy API only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "relibra"


def imported(path: Path) -> set[str]:
    """Every module a file imports (absolute `import x` and `from x import y`, at any depth)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


@pytest.mark.parametrize("folder, refused", [
    ("studies", ("relibra.experiments", "relibra.plots", "relibra.cli", "relibra.report", "relibra.glance")),
    ("cli", ("relibra.experiments",)),
    ("runtime", ("relibra.experiments", "relibra.studies", "relibra.plots", "relibra.cli")),
])
def test_a_layer_imports_nothing_above_it(folder, refused):
    wrong = {f"{p.relative_to(ROOT)}: {m}" for p in (ROOT / folder).rglob("*.py") for m in imported(p)
             if any(m == r or m.startswith(r + ".") for r in refused)}
    assert not wrong, sorted(wrong)


def test_no_module_outside_the_policies_imports_their_private_names():
    wrong = {f"{p.relative_to(ROOT)}: {m}" for p in ROOT.rglob("*.py") if p.parent.name != "policies"
             for m in imported(p) if m.startswith("relibra.policies.") and m.rsplit(".", 1)[1].startswith("_")}
    assert not wrong, sorted(wrong)


def test_parameter_names_are_what_get_policy_takes():
    from relibra.errors import ConfigError
    from relibra.policies import get_policy, parameter_names

    names = parameter_names("relibra")
    assert "spare_slots_per_gpu" in names
    get_policy("relibra", spare_slots_per_gpu=2)
    with pytest.raises(ConfigError, match="unknown policy 'nope'; known: megatron"):
        parameter_names("nope")


def test_no_command_module_shadows_a_builtin():
    """relibra.cli imports every command module as an attribute of the package, so a module named like a
    builtin (map, filter, ...) would hide that builtin inside relibra/cli/__init__.py."""
    import builtins
    import pkgutil

    import relibra.cli

    clash = [m.name for m in pkgutil.iter_modules(relibra.cli.__path__) if hasattr(builtins, m.name)]
    assert clash == []
