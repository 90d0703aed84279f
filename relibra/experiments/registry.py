"""The notebooks: one module each, relibra/experiments/notebooks/NN_name.py, found by its file name. A module
holds (docs/notebooks.md, "Adding a notebook"): QUESTION, one line; Params, whose fields the parameters cell of
notebooks/NN_name.py assigns with the same defaults; SIZES {profile: sizes} (or `sizes_of(values)`); Result
and compute(params, sizes); Summary and summarize(result), every number its text shows; story(summary), the
markdown of what to notice; optionally facts(result, scale) -> [base.Fact] (by default its Summary's numbers,
base.summary_facts), those with a `readme` title the README's rows, TRIES (its "Try this" lessons),
section(loaded, md_table) (its section of REPORT.md) and SECTION_FIRST (that section and its README rows open
theirs).
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
from relibra.experiments.base import load_facts, summary_facts

# What a module may leave out, and what stands for it.
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

    def sizes_of(self, values):
        """The notebook's sizes for the (partly parsed) parameter values: SIZES[profile] by default."""
        own = getattr(self.module, "sizes_of", None)
        return own(values) if own is not None else self.module.SIZES[values.profile]

    def facts(self, result, scale: str) -> list:
        """The module's facts(result, scale), or the numbers its Summary holds, one fact each."""
        own = getattr(self.module, "facts", None)
        return own(result, scale) if own is not None else summary_facts(self.module.summarize(result))

    def create(self, **raw):
        """(params, sizes) from raw parameter values, checked (Params.create)."""
        return self.Params.create(self.name, self.sizes_of, **raw)


NOTEBOOK_MODULES = {path.stem: Notebook(path.stem, importlib.import_module(f"{__package__}.notebooks.{path.stem}"))
                    for path in sorted((Path(__file__).parent / "notebooks").glob("[0-9][0-9]_*.py"))}
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
        return self.notebook.summarize(self.result)

    @cached_property
    def facts(self) -> pd.DataFrame:
        return load_facts(self.folder)


def in_shown_order(loaded) -> list[Loaded]:
    """`loaded` as REPORT.md and the README show them: the modules that set SECTION_FIRST first, each group in
    notebook order."""
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
