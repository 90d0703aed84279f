"""The notebooks: one module each, relibra/experiments/notebooks/NN_name.py, found by its file name.

A module holds the whole of one notebook's logic (docs/notebooks.md, "Adding a notebook"):

- QUESTION: what the notebook answers, one line;
- Params: its parameters (relibra.experiments.base.Params); the parameters cell of notebooks/NN_name.py
  assigns exactly these fields, with the same defaults;
- SIZES: {profile: sizes} (or `sizes_of(values)` where the sizes depend on no profile);
- Result and compute(params, sizes) -> Result;
- Summary and summarize(result) -> Summary: every number (and short name) its text shows, computed
  once from the result;
- story(summary) -> markdown: what to notice, a template over the Summary;
- facts(result, scale) -> [base.Fact]: every number it found, one row each, `scale` the run's scale note
  (facts.csv beside its tables); those
  with a `readme` title are the README's results rows (relibra.glance renders them);
- optionally TRIES (its "Try this" lessons) and section(loaded, table_md) (its section of REPORT.md, whose
  tables come from its facts: relibra.experiments.text.facts_table).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType

import pandas as pd

from relibra.errors import ConfigError
from relibra.experiments.base import load_facts

_PACKAGE = "relibra.experiments.notebooks"
_FOLDER = Path(__file__).parent / "notebooks"
# What a module may leave out, and what stands for it (SECTION_FIRST: its report section and README rows
# open theirs).
_OPTIONAL = {"TRIES": (), "section": None, "SECTION_FIRST": False}


@dataclass(frozen=True)
class Notebook:
    """One notebook module and what the kit reads from it."""

    name: str
    module: ModuleType

    def __getattr__(self, key):  # QUESTION, Params, Result, compute, Summary, summarize, story, ...
        if key in _OPTIONAL:
            return getattr(self.module, key, _OPTIONAL[key])
        return getattr(self.module, key)

    @property
    def tries(self) -> tuple:
        return self.TRIES

    def sizes_of(self, values):
        """The notebook's sizes for the (partly parsed) parameter values: SIZES[profile] by default."""
        own = getattr(self.module, "sizes_of", None)
        return own(values) if own is not None else self.module.SIZES[values.profile]

    def create(self, **raw):
        """(params, sizes) from raw parameter values, checked (base.Params.create)."""
        return self.Params.create(self.name, self.sizes_of, **raw)


def _discover() -> dict[str, Notebook]:
    found = {}
    for path in sorted(_FOLDER.glob("[0-9][0-9]_*.py")):
        found[path.stem] = Notebook(path.stem, importlib.import_module(f"{_PACKAGE}.{path.stem}"))
    return found


NOTEBOOK_MODULES = _discover()
NOTEBOOKS = tuple(NOTEBOOK_MODULES)


def get_notebook(name: str) -> Notebook:
    if name not in NOTEBOOK_MODULES:
        raise ConfigError(f"unknown notebook {name!r}; known: {', '.join(NOTEBOOKS)}")
    return NOTEBOOK_MODULES[name]


@dataclass(frozen=True)
class Loaded:
    """One notebook's run read back: its module, typed result and manifest."""

    notebook: Notebook
    result: object
    manifest: dict
    folder: Path

    @cached_property
    def summary(self):
        """The module's summarize(result): the numbers its story shows."""
        return self.notebook.summarize(self.result)

    @cached_property
    def facts(self) -> pd.DataFrame:
        """Its facts.csv (base.load_facts): the numbers its README rows and report section show."""
        return load_facts(self.folder)


def in_shown_order(loaded) -> list[Loaded]:
    """`loaded` (Loaded values) as REPORT.md and the README table show them: the modules that set
    SECTION_FIRST first, then the others, each group in notebook order."""
    return sorted(loaded, key=lambda x: not x.notebook.SECTION_FIRST)


def load_results(out_dir: str | Path) -> dict[str, Loaded]:
    """{notebook: Loaded} for every notebook whose typed result is under out_dir, in registry order."""
    found = {}
    for nb in NOTEBOOK_MODULES.values():
        folder = Path(out_dir) / nb.name
        result = nb.Result.load(folder)
        if result is not None:
            path = folder / "manifest.json"
            man = json.loads(path.read_text()) if path.exists() else {}
            man.setdefault("config", {})
            man.setdefault("scale_note", "profile unknown (no manifest.json)")
            found[nb.name] = Loaded(nb, result, man, folder)
    return found
