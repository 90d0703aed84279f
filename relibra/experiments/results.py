"""A notebook's typed result: a dataclass whose table fields are saved as `<field>.csv` and whose
other saved fields go to `result.json`, so that `relibra reproduce`, REPORT.md and the README table
read a run back as the same object the notebook computed, never by file and column names."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from relibra.errors import ConfigError
from relibra.experiments.config import jsonable
from relibra.paths import write_text

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


@dataclasses.dataclass(kw_only=True)
class Result:
    """Base of every notebook's result (one subclass per notebook, see registry.py)."""

    def tables(self) -> dict[str, pd.DataFrame]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if "doc" in f.metadata}

    def save(self, run) -> None:
        """Every table through run.save_csv, the plain fields to <out_dir>/result.json."""
        plain = {}
        for f in dataclasses.fields(self):
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
        for f in dataclasses.fields(cls):
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
