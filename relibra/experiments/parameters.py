"""Every notebook's parameters, checked before any work.

A notebook's `parameters` cell (tagged "parameters", read by papermill) declares exactly the fields of
its spec's parameters dataclass (registry.py); its first code cell after it calls

    run = ex.start("02_throughput", globals())

which (1) finds the parameters papermill injected (the cell papermill adds after the parameters
cell starts with "# Parameters") and fails with a ConfigError naming any the notebook does not
declare, listing the known ones; (2) checks every value's range; (3) resolves them against the
profile (registry.resolve) and opens the Run. Nothing is silently ignored: a name declared and not
read by `resolve` or by the notebook is caught by tests/test_notebooks.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from relibra.cluster import get_model, resolve_topology
from relibra.errors import ConfigError
from relibra.experiments.config import project_root
from relibra.experiments.registry import get_spec, resolve
from relibra.experiments.run import Run
from relibra.experiments.sensitivity import KNOB_NAMES
from relibra.experiments.tutorial import TUTORIAL_EP_SIZES, TUTORIAL_MAX_SPARE_SLOTS, TUTORIAL_PLACEMENTS
from relibra.plots import set_style
from relibra.policies import POLICY_NAMES
from relibra.setups import load_card

_IPYTHON_INJECTED_HEADER = "# Parameters"  # papermill's PythonTranslator.codify(..., comment="Parameters")


def notebook_source(notebook: str) -> Path:
    """notebooks/<notebook>.py, the Jupytext py:percent source of a notebook."""
    return project_root() / "notebooks" / f"{get_spec(notebook).name}.py"


def parameters_cell(text: str) -> str:
    """The source of the cell tagged "parameters" in py:percent text (`# %% tags=["parameters"]`)."""
    cells = re.split(r"^# %%", text, flags=re.M)
    tagged = [c for c in cells if re.match(r"[^\n]*tags=\[[^\]]*[\"']parameters[\"']", c)]
    if len(tagged) != 1:
        raise ConfigError(f"expected exactly one cell tagged 'parameters', found {len(tagged)}")
    return tagged[0].split("\n", 1)[1] if "\n" in tagged[0] else ""


def assigned_names(source: str) -> list[str]:
    """Names assigned at the top level of `source` (the form of papermill's parameters cells)."""
    names = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Name):
                names.append(t.id)
    return names


def declared_parameters(notebook: str) -> list[str]:
    """The names the notebook's parameters cell assigns, in order."""
    return assigned_names(parameters_cell(notebook_source(notebook).read_text()))


def check_names(notebook: str, names, what: str = "parameter") -> None:
    """ConfigError naming every one of `names` that the notebook does not declare."""
    known = get_spec(notebook).parameter_names
    unknown = [n for n in names if n not in known]
    if unknown:
        s = "s" if len(unknown) > 1 else ""
        raise ConfigError(f"{notebook}: unknown {what}{s} {', '.join(repr(n) for n in unknown)}; this notebook "
                          f"takes: {', '.join(known)}")


def injected_names(namespace: dict) -> list[str]:
    """Names papermill injected into this kernel: assignments of the cell executed just before the
    current one, if that cell is papermill's (it starts with '# Parameters'); [] otherwise (a run in
    JupyterLab, where the parameters cell is edited by hand)."""
    history = namespace.get("In") or namespace.get("_ih") or []
    if len(history) < 2:
        return []
    previous = history[-2]
    if not previous.lstrip().startswith(_IPYTHON_INJECTED_HEADER):
        return []
    return assigned_names(previous)


def _int(notebook: str, name: str, value, low: int | None = None, high: int | None = None):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)) or (isinstance(value, str) and not re.fullmatch(
            r"-?\d+", value.strip())):
        raise ConfigError(f"{notebook}: {name} must be an integer, got {value!r}")
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        rng = f"{low}..{high}" if high is not None else f">= {low}"
        raise ConfigError(f"{notebook}: {name} must be {rng}, got {v}")
    return v


def _float(notebook: str, name: str, value, low: float, high: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{notebook}: {name} must be a number, got {value!r}") from None
    if not low <= v <= high:
        raise ConfigError(f"{notebook}: {name} must be in [{low}, {high}], got {v}")
    return v


def _names(value) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def check_values(notebook: str, params: dict) -> dict:
    """Range checks of every parameter value; returns the values with integers parsed."""
    p = dict(params)
    for name in ("steps", "nproc", "nodes", "rl_steps", "tokens_per_gpu", "micro_batches"):
        if name in p:
            p[name] = _int(notebook, name, p[name], low=1)
    for name in ("tokens_per_microbatch",):  # None: the set-up card's
        if p.get(name) is not None:
            p[name] = _int(notebook, name, p[name], low=1)
    if "seed" in p:
        p["seed"] = _int(notebook, "seed", p["seed"], low=0)
    if p.get("ep") is not None:
        p["ep"] = _int(notebook, "ep", p["ep"], low=1)
    unknown = [x for x in _names(p.get("policies")) if x not in POLICY_NAMES]
    if unknown:
        raise ConfigError(f"{notebook}: unknown policy {unknown[0]!r}; known: {', '.join(POLICY_NAMES)}")
    if get_spec(notebook).single_model and len(_names(p.get("model"))) > 1:
        raise ConfigError(f"{notebook}: this notebook studies one model; got model={p['model']!r}")
    if "spare_slot_counts" in p and p["spare_slot_counts"] is not None:
        counts = [_int(notebook, "spare_slot_counts", c, low=0, high=16) for c in _names(p["spare_slot_counts"])]
        if not counts:
            raise ConfigError(f"{notebook}: spare_slot_counts is empty")
        p["spare_slot_counts"] = tuple(counts)
    if "ep_sizes" in p and p["ep_sizes"] is not None:
        p["ep_sizes"] = tuple(_int(notebook, "ep_sizes", v, low=1) for v in _names(p["ep_sizes"]))
    if "knobs" in p and p["knobs"] is not None:
        names = _names(p["knobs"])
        unknown = [k for k in names if k not in KNOB_NAMES]
        if unknown or not names:
            what = f"unknown sensitivity knob(s) {unknown}" if unknown else "knobs is empty"
            raise ConfigError(f"{notebook}: {what}; known: {', '.join(KNOB_NAMES)}")
        p["knobs"] = tuple(dict.fromkeys(names))
    if p.get("setup") is not None:
        load_card(p["setup"])  # an unknown card fails here, naming the known ones
    if p.get("models") is not None:  # notebook 11's grid

        p["models"] = tuple(_names(p["models"]))
        for m in p["models"]:
            get_model(m)
    if p.get("clusters") is not None:
        raw = p["clusters"]  # ';'-separated: a cluster spec holds commas ("paper,nodes=32")
        p["clusters"] = tuple(c.strip() for c in raw.split(";") if c.strip()) if isinstance(raw, str) else tuple(raw)
        for c in p["clusters"]:
            resolve_topology(c)
    if p.get("eps") is not None:
        p["eps"] = tuple(_int(notebook, "eps", v, low=1, high=4096) for v in _names(p["eps"]))
    for name in ("models", "clusters", "eps"):
        if name in p and p[name] is not None and not p[name]:
            raise ConfigError(f"{notebook}: {name} is empty")
    if p.get("nproc") is not None and p.get("nodes") is not None and p["nproc"] % p["nodes"]:
        raise ConfigError(f"{notebook}: nodes={p['nodes']} must divide nproc={p['nproc']}")
    if notebook == "00_tutorial":  # the toy layer's own ranges (tutorial.py)

        if p["ep"] not in TUTORIAL_EP_SIZES:
            raise ConfigError(f"00_tutorial: ep must be one of {TUTORIAL_EP_SIZES} (16 experts over 2 nodes), "
                              f"got {p['ep']}")
        if p["placement"] not in TUTORIAL_PLACEMENTS:
            raise ConfigError(f"00_tutorial: placement must be one of {', '.join(TUTORIAL_PLACEMENTS)}, "
                              f"got {p['placement']!r}")
        p["spare_slots"] = _int(notebook, "spare_slots", p["spare_slots"], 0, TUTORIAL_MAX_SPARE_SLOTS)
        p["skew"] = _float(notebook, "skew", p["skew"], 0.0, 3.0)
        p["shift"] = _float(notebook, "shift", p["shift"], 0.0, 1.0)
        p["micro_batch"] = _int(notebook, "micro_batch", p["micro_batch"], 0, p["micro_batches"] - 1)
        if not isinstance(p["interactive"], bool):
            raise ConfigError(f"00_tutorial: interactive must be True or False, got {p['interactive']!r}")
    return p


def start(notebook: str, namespace: dict | None = None, **params):
    """Check a notebook's parameters and open its Run (see the module docstring).

    namespace: the notebook's globals(); the declared parameters are read from it and the names
    papermill injected are checked against them. Or pass the parameters as keywords (tests, scripts):
    the spec's defaults fill the rest, and any keyword the notebook does not take is an error.
    """
    spec = get_spec(notebook)
    names = spec.parameter_names
    if namespace is not None:
        check_names(notebook, injected_names(namespace))
        missing = [n for n in names if n not in namespace]
        if missing:
            raise ConfigError(f"{notebook}: the parameters cell does not declare {', '.join(missing)}")
        params = {**{n: namespace[n] for n in names}, **params}
    check_names(notebook, params)
    params = check_values(notebook, {**spec.defaults, **params})
    base = check_values(notebook, dict(spec.defaults))
    changed = {k: v for k, v in params.items() if k not in ("profile", "out_dir", "interactive") and v != base[k]}
    set_style()
    return Run(resolve(notebook, **params), spec, non_default=changed)
