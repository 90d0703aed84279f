"""What a notebook module is made of (relibra/experiments/notebooks/NN_name.py): `Params` (the parameter spec,
relibra.studies.params, whose names are imported here for the notebook modules); `Result`, whose `table`
fields are saved as <field>.csv and `value` fields in result.json; `Fact`, one number it found (facts.csv, from
which the README rows and REPORT's tables are rendered); `TryThis`, a change it suggests (tests/test_lessons.py).
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from relibra.display import json_safe
from relibra.errors import ConfigError
from relibra.paths import write_text
from relibra.studies.params import (FLAG, PATH, Kind, Params, choice, floats, integer, integers,  # noqa: F401
                                    names, number, objects, param)

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
        """Every table through run.save_csv, the plain fields to <out_dir>/result.json (NaN kept)."""
        plain = {}
        for f in fields(self):
            if "doc" in f.metadata:
                run.save_csv(getattr(self, f.name), f.name, f.metadata["doc"])
            elif f.metadata.get("saved", True):
                plain[f.name] = getattr(self, f.name)
        write_text(run.out_dir / RESULT_FILE, json.dumps(json_safe(plain, strict=False), indent=2, sort_keys=True))

    @classmethod
    def load(cls, folder: str | Path):
        """The result saved under `folder`, or None where the notebook has not run; a missing table or field is
        an error naming the file."""
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


FACTS_FILE = "facts.csv"
SCOPES = ("simulated", "measured")


@dataclass(frozen=True)
class Fact:
    """One number a notebook found, a row of its facts.csv: `value` of `fact` (a relibra.labels CLAIMS or METRICS
    id) for `of` (a policy, case, card or knob value; "": the whole run) as `stat` (mean, low, best, ...), in
    `unit` (relibra.labels.UNIT_FORMATS; "%" holds a share), `scope` simulated or measured, `on` what (""
    for the run's own); readme: the title of the README row that shows it ("": none)."""

    fact: str
    value: float
    unit: str = ""
    stat: str = "value"
    of: str = ""
    scope: str = "simulated"
    on: str = ""
    readme: str = ""


FACT_COLUMNS = [f.name for f in fields(Fact)]


def facts_frame(facts, on: str = "") -> pd.DataFrame:
    """`facts` (Fact rows) as the tidy table facts.csv holds, each empty `on` set to `on`."""
    from relibra.labels import UNIT_FORMATS

    for f in facts:
        if f.scope not in SCOPES or f.unit not in UNIT_FORMATS:
            raise ConfigError(f"fact {f.fact!r}: scope must be one of {SCOPES} and unit one of "
                              f"{tuple(UNIT_FORMATS)}; got {f.scope!r}, {f.unit!r}")
    frame = pd.DataFrame([dataclasses.asdict(f) for f in facts], columns=FACT_COLUMNS)
    frame["on"] = frame["on"].mask(frame["on"] == "", on)
    frame["value"] = frame["value"].astype(float)
    return frame


def _number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def summary_facts(obj, of: str = "", name: str = "") -> list[Fact]:
    """The numbers of a notebook's Summary (a dataclass) as simulated facts named by their fields: a number is
    one fact; a tuple's numbers one each (stat 0, 1, ... where it holds several), its text joining their `of`
    (a (part, seconds) pair); a nested dataclass's numbers belong to its first text field (its policy...).
    Other text, flags and None are left out."""
    if _number(obj):
        return [Fact(name, float(obj), of=of)]
    if dataclasses.is_dataclass(obj):
        own = next((v for v in (getattr(obj, f.name) for f in fields(obj)) if isinstance(v, str)), None)
        of = own if own is not None and name else of
        return [x for f in fields(obj) for x in summary_facts(getattr(obj, f.name), of, f.name)]
    if isinstance(obj, tuple) and any(_number(v) for v in obj):
        text = ", ".join([of] * bool(of) + [v for v in obj if isinstance(v, str)])
        values = [v for v in obj if _number(v)]
        return [Fact(name, float(v), stat=str(i) if len(values) > 1 else "value", of=text)
                for i, v in enumerate(values)]
    if isinstance(obj, tuple):
        return [x for v in obj for x in summary_facts(v, of, name)]
    return []


def load_facts(folder: str | Path) -> pd.DataFrame:
    """The facts.csv under `folder` (text columns as text, "" where empty); an error naming it when missing."""
    path = Path(folder) / FACTS_FILE
    if not path.exists():
        raise ConfigError(f"{path}: missing; rerun notebook {Path(folder).name}")
    text = {c: str for c in FACT_COLUMNS if c != "value"}
    return pd.read_csv(path, dtype=text, keep_default_na=False, na_values={"value": ["", "nan", "NaN"]})


@dataclass(frozen=True)
class TryThis:
    """A change a notebook suggests: `change(params, sizes)` gives the raw parameters to set, and `measure`
    (read from the result by `value`) rises (direction +1) or falls (-1), `why`."""

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
