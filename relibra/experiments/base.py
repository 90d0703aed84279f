"""What a notebook module is made of (relibra/experiments/notebooks/NN_name.py):

- `Params`: a frozen dataclass of `param(default, doc, kind, ...)` fields (relibra.studies.params, the
  parameter spec the command line shares; its names are imported here for the notebook modules).
- `Result`: `table` fields saved as `<field>.csv`, `value` fields in result.json, read back by `load`.
- `TryThis`: a change a notebook suggests and the direction it moves a quantity (tests/test_lessons.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from relibra.display import json_safe
from relibra.errors import ConfigError
from relibra.paths import write_text
from relibra.studies.params import (FLAG, PATH, Kind, Params, choice, floats, integer, integers,  # noqa: F401
                                    names, number, objects, param)


# ---- results ------------------------------------------------------------------------------------------
RESULT_FILE = "result.json"


def table(doc: str):
    """A table field: saved as <field name>.csv, described in the manifest by `doc`."""
    return dataclasses.field(metadata={"doc": doc})


def value(default=None):
    """A plain field saved in result.json (JSON-serializable)."""
    return dataclasses.field(default=default)


def live(default=None):
    """A field the notebook draws from but nobody reads back (a trace, a plan): not saved."""
    return dataclasses.field(default=default, metadata={"saved": False})


@dataclass(kw_only=True)
class Result:
    """Base of every notebook's typed result."""

    def save(self, run) -> None:
        """Every table through run.save_csv, the plain fields to <out_dir>/result.json."""
        plain = {}
        for f in fields(self):
            if "doc" in f.metadata:
                run.save_csv(getattr(self, f.name), f.name, f.metadata["doc"])
            elif f.metadata.get("saved", True):
                plain[f.name] = getattr(self, f.name)
        write_text(run.out_dir / RESULT_FILE, json.dumps(jsonable(plain), indent=2, sort_keys=True))

    @classmethod
    def load(cls, folder: str | Path):
        """The result saved under `folder`, or None when the notebook has not run there. A missing
        table or field is an error naming the file."""
        folder = Path(folder)
        if not (folder / RESULT_FILE).exists():
            return None
        plain = json.loads((folder / RESULT_FILE).read_text())
        kwargs = {}
        for f in fields(cls):
            if "doc" in f.metadata:
                path = folder / f"{f.name}.csv"
                if not path.exists():
                    raise ConfigError(f"{path}: missing; rerun notebook {folder.name}")
                try:
                    kwargs[f.name] = pd.read_csv(path)
                except pd.errors.EmptyDataError:
                    kwargs[f.name] = pd.DataFrame()
            elif f.metadata.get("saved", True):
                if f.name not in plain:
                    raise ConfigError(f"{folder / RESULT_FILE}: no field {f.name!r}; rerun notebook {folder.name}")
                kwargs[f.name] = plain[f.name]
        return cls(**kwargs)


# `obj` for json.dumps with NaN kept (result.json round-trips it): the kit's one normaliser, not strict.
jsonable = functools.partial(json_safe, strict=False)


# ---- lessons ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TryThis:
    """A change a notebook suggests and what it claims the change does: `measure` (read from the
    notebook's result by `value`) rises (direction +1) or falls (-1). `change(params, sizes)` gives
    the raw parameters to set; the notebook prints `text`."""

    change: Callable[[Any, Any], dict]
    measure: str
    value: Callable[[Result], float]
    direction: int
    why: str

    def text(self, params, sizes) -> str:
        now = params.named_values()
        parts = [f"`{k} = {v!r}`" + (f" (now {_show(now[k])})" if now.get(k) is not None else "")
                 for k, v in self.change(params, sizes).items()]
        return f"Set {' and '.join(parts)}: {self.measure} {'rises' if self.direction > 0 else 'falls'}; {self.why}."


def _show(v) -> str:
    return ",".join(map(str, v)) if isinstance(v, (tuple, list)) else repr(v)



def mean_of(t: pd.DataFrame, column: str, **where) -> float:
    """Mean of `column` over the rows where every `where` column equals its value."""
    for k, v in where.items():
        t = t[t[k] == v]
    return float(t[column].mean())
