"""What a notebook module is made of (relibra/experiments/notebooks/NN_name.py):

- `Params`: a frozen dataclass of `param(default, doc, kind, ...)` fields; `Params.create(notebook,
  sizes_of, **raw)` parses raw values (literals, papermill's -p strings) with each field's `Kind` into
  checked, resolved ones (a model preset becomes its ModelShape, a cluster its Topology, a card its
  SetupCard). A raw None stands for the profile's size named by `sizes=` or for `none=`.
- `Result`: `table` fields saved as `<field>.csv`, `value` fields in result.json, read back by `load`.
- `Fact`: one number a notebook found (fact, stat, value, unit, of, scope, on, readme); a module's
  `facts(result, scale)` lists them and the Run writes them as facts.csv (`facts_frame`, read back by
  `load_facts`), from which the README rows and REPORT's tables are rendered.
- `TryThis`: a change a notebook suggests and the direction it moves a quantity (tests/test_lessons.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import re
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pandas as pd

from relibra.display import json_safe
from relibra.errors import ConfigError, RelibraError
from relibra.paths import write_text


# ---- parameters ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    """How one parameter's raw value becomes its value: `parse` (raises ValueError, TypeError or
    ConfigError) and `accepts`, what it takes, for the error that names it. The same Kind parses a
    notebook's parameter (Params.create) and the command-line flag made from it (`arg`)."""

    accepts: str
    parse: Callable[[Any], Any]

    def refusal(self, value, exc: BaseException) -> str:
        """The one line that refuses `value`: what the parameter accepts, what it got, and why."""
        return f"must be {self.accepts}; got {value!r} ({exc})"

    def arg(self, flag: str) -> Callable[[str], Any]:
        """This kind as argparse's `type=` for `flag`: the parsed value, or a ConfigError naming the flag,
        which the command line prints as its one `error:` line (exit 2) before any work. A loader's own
        error (an unknown preset, a card out of bounds: a RelibraError) already names what is wrong and is
        the same line whichever command or notebook reads the value: it passes as it is."""
        def parse(text: str):
            try:
                return self.parse(text)
            except (ValueError, TypeError, OSError) as exc:
                raise ConfigError(f"{flag} {self.refusal(text, exc)}") from None
        return parse


def param(default, doc: str, kind: Kind, *, sizes: str | None = None, none=None, affects: bool = True):
    """A Params field: its raw default (what the parameters cell assigns), a one-line doc, its Kind.
    A raw None becomes the sizes' attribute `sizes` when given, else `none` (parsed alike). affects:
    False for a setting that changes where or how results show, not what they are."""
    return dataclasses.field(default=default, metadata={"doc": doc, "kind": kind, "sizes": sizes, "none": none,
                                                         "affects": affects})


def _items(raw, sep: str = ",") -> list:
    """The items of a list, or of a `sep`-separated string (stripped; "" has none, "a," an empty one)."""
    if isinstance(raw, (list, tuple)):
        return list(raw)
    if isinstance(raw, str):
        return [v.strip() for v in raw.split(sep)] if raw.strip() else []
    return [raw]


def _listed(raw, each: Callable[[Any], Any], sort: bool = False, sep: str = ",") -> tuple:
    """`each` of every item of `raw` (a list, or a `sep`-separated string), as a tuple, ascending when
    `sort` (an axis whose neighbours matter); a ValueError when there is none or one is given twice."""
    items = _items(raw, sep)
    if "" in items:
        raise ValueError("an item is empty")
    values = tuple(each(v) for v in items)
    if not values:
        raise ValueError("empty")
    twice = [v for i, v in enumerate(values) if v in values[:i]]
    if twice:
        raise ValueError(f"{_text(twice[0])} is given twice")
    return tuple(sorted(values)) if sort else values


def _int(raw) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (numbers.Integral, str)) or (
            isinstance(raw, str) and not re.fullmatch(r"-?\d+", raw.strip())):
        raise ValueError(f"not an integer: {raw!r}")
    return int(raw)


def _float(raw) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (numbers.Real, str)):
        raise ValueError(f"not a number: {raw!r}")
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"not a number: {raw!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"not a finite number: {raw!r}")
    return v


def _span(low, high) -> str:
    return (f"{low}..{high}" if low is not None and high is not None else f">= {low}" if low is not None
            else f"<= {high}" if high is not None else "any")


def _checked(v, low=None, high=None, choices: tuple | None = None):
    """`v` when it is one of `choices` (if given) and within [low, high] (each bound if given); NaN is in no
    range."""
    if choices is not None and v not in choices:
        raise ValueError(f"{v!r} is not one of them")
    if v != v or (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{v} is outside {_span(low, high)}")
    return v


def integer(low: int | None = None, high: int | None = None, choices: tuple[int, ...] | None = None) -> Kind:
    if choices:
        return Kind(f"one of {choices}", lambda raw: _checked(_int(raw), choices=choices))
    return Kind(f"an integer {_span(low, high)}", lambda raw: _checked(_int(raw), low, high))


def number(low: float, high: float) -> Kind:
    return Kind(f"a number in [{low}, {high}]", lambda raw: _checked(_float(raw), low, high))


def integers(low: int | None = None, high: int | None = None, sort: bool = False) -> Kind:
    """A comma-separated list of distinct integers in range; ascending when `sort`."""
    return Kind(f"a comma-separated list of distinct integers {_span(low, high)}",
                lambda raw: _listed(raw, lambda v: _checked(_int(v), low, high), sort))


def floats(low: float, high: float, sort: bool = False, note: str = "") -> Kind:
    """A comma-separated list of distinct finite numbers in [low, high]; ascending when `sort`."""
    return Kind(f"a comma-separated list of distinct numbers in [{low:g}, {high:g}]{note}",
                lambda raw: _listed(raw, lambda v: _checked(_float(v), low, high), sort))


def choice(choices: tuple, what: str | None = None) -> Kind:
    """One of `choices`; the refusal says "unknown <what>" when `what` is given."""
    def parse(raw):
        if what is not None and raw not in choices:
            raise ValueError(f"unknown {what} {raw!r}")
        return _checked(raw, choices=tuple(choices))
    return Kind(f"one of {', '.join(map(str, choices))}", parse)


def names(known: tuple[str, ...], what: str) -> Kind:
    """A comma-separated list of distinct `what`s, each one of `known`, as a tuple."""
    def known_one(v: str) -> str:
        if v not in known:
            raise ValueError(f"unknown {what} {v!r}")
        return v
    plural = what[:-1] + "ies" if what.endswith("y") else what + "s"
    return Kind(f"comma-separated {plural} from {', '.join(known)}",
                lambda raw: _listed(raw, lambda v: known_one(str(v))))


def objects(get: Callable[[str], Any], what: str, sep: str = ",", single: bool = False) -> Kind:
    """Names resolved by `get` (e.g. a model preset to its ModelShape): a tuple of distinct ones, or one
    object when single."""
    def parse(raw):
        values = _items(raw, sep)
        if single and len(values) > 1:
            raise ValueError(f"this notebook studies one {what}")
        out = _listed(values, lambda v: v if not isinstance(v, str) else get(v))
        return out[0] if single else out
    return Kind(("one " if single else f"'{sep}'-separated ") + what, parse)


def _flag(raw) -> bool:
    if not isinstance(raw, bool):
        raise ValueError(f"{raw!r} is not True or False")
    return raw


FLAG = Kind("True or False", _flag)
PATH = Kind("a folder path", lambda raw: str(raw))


def spec_of(params: type, name: str) -> dict:
    """Field `name`'s declaration in a Params class: {"doc", "kind", "default", "sizes", ...}."""
    f = next((f for f in fields(params) if f.name == name), None)
    if f is None:
        raise ConfigError(f"{params.__module__}: no parameter {name!r}")
    return {**f.metadata, "default": f.default}


def flag_help(params: type, name: str, default: str | None = None) -> str:
    """A command-line flag's help, made from the parameter's declaration: its doc (without the notebook's
    "(None: ...)" note), what it accepts, and its default: `default` (what the command takes when the flag
    is not given), else the declared default unless None or False."""
    spec = spec_of(params, name)
    doc = re.sub(r" \(None: [^)]*\)$", "", spec["doc"])
    default = default or (None if spec["default"] is None or spec["default"] is False else _text(spec["default"]))
    return (doc if spec["kind"] is FLAG else f"{doc}: {spec['kind'].accepts}") + (f" (default: {default})" if default
                                                                                 else "")


def add_flag(parser, params: type, name: str, flag: str | None = None, default: str | None = None):
    """Add `flag` (default --<name with dashes>) to an argparse parser from Params field `name`: its Kind
    parses the value (type=; FLAG: a switch), its doc is the help (flag_help), its declared default is the
    flag's. The action keeps the declaration it came from (`declared`: (params, name, default))."""
    spec = spec_of(params, name)
    flag = flag or "--" + name.replace("_", "-")
    how = (dict(action="store_true") if spec["kind"] is FLAG else
           dict(default=spec["default"], type=spec["kind"].arg(flag), metavar=name.upper()))
    action = parser.add_argument(flag, dest=name,
                                 help=flag_help(params, name, default), **how)
    action.declared = (params, name, default)
    return action


def param_table(params: type) -> str:
    """The docs' parameter table of a Params class, markdown: parameter, default, what it accepts, meaning (the
    declared doc); a None default that the profile fills says so."""
    def cell(text) -> str:
        return str(text).replace("|", "\\|")

    def default(f) -> str:
        if f.default is None:
            return "the profile's" if f.metadata["sizes"] else "`None`"
        return f"`{cell(_text(f.default))}`"

    rows = [f"| `{f.name}` | {default(f)} | {cell(f.metadata['kind'].accepts)} | {cell(f.metadata['doc'])} |"
            for f in fields(params)]
    return "\n".join(["| parameter | default | accepts | meaning |", "|---|---|---|---|", *rows])


@dataclass(frozen=True)
class Params:
    """Base of every notebook's parameters; make them with `create`, never by hand."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def defaults(cls) -> dict:
        """The raw defaults: what the notebook's parameters cell assigns."""
        return {f.name: f.default for f in fields(cls)}

    @classmethod
    def settings(cls) -> tuple[str, ...]:
        """The fields that do not change what is computed (profile, out_dir, ...)."""
        return tuple(f.name for f in fields(cls) if not f.metadata["affects"])

    @classmethod
    def check_names(cls, notebook: str, names) -> None:
        """A ConfigError naming every one of `names` that is no parameter of this notebook."""
        unknown = [n for n in names if n not in cls.names()]
        if unknown:
            s = "s" if len(unknown) > 1 else ""
            raise ConfigError(f"{notebook}: unknown parameter{s} {', '.join(map(repr, unknown))}; this notebook "
                              f"takes: {', '.join(cls.names())}")

    @classmethod
    def create(cls, notebook: str, sizes_of: Callable[[Any], Any], **raw) -> tuple["Params", Any]:
        """(params, sizes) from raw values; sizes_of(the fields without `sizes=`, parsed) gives the
        notebook's sizes (the profile's). Every problem is one ConfigError naming the notebook, the parameter and what
        it accepts."""
        cls.check_names(notebook, raw)
        given = {**cls.defaults(), **raw}
        unsized = {f.name: cls._parse(notebook, f, given[f.name]) for f in fields(cls) if f.metadata["sizes"] is None}
        sizes = sizes_of(SimpleNamespace(**unsized))  # the profile's sizes are known once the unsized fields are
        params = cls(**{f.name: unsized[f.name] if f.name in unsized else cls._parse(notebook, f, given[f.name], sizes)
                        for f in fields(cls)})
        params.check(notebook, sizes)
        return params, sizes

    @staticmethod
    def _parse(notebook: str, f, value, sizes=None):
        """`value` parsed by f's Kind; None or "" stands for the sizes' attribute f names, else its `none`."""
        if value is None or value == "":
            value = getattr(sizes, f.metadata["sizes"]) if f.metadata["sizes"] else f.metadata["none"]
        if value is None:
            return None
        kind: Kind = f.metadata["kind"]
        try:
            return kind.parse(value)
        except (ValueError, TypeError, OSError, RelibraError) as exc:
            raise ConfigError(f"{notebook}: {f.name} {kind.refusal(value, exc)}") from None

    def check(self, notebook: str, sizes) -> None:
        """Checks across fields (an EP size the cluster must hold...); none by default."""

    def scale_note(self, sizes) -> str:
        """One line on how far a run is from the paper's scale, for captions: the profile and every size
        (a notebook whose sizes need words says it its own way)."""
        sized = fields(sizes) if dataclasses.is_dataclass(sizes) else ()
        return ", ".join([f"{getattr(self, 'profile', 'no')} profile",
                          *(f"{f.name} {_text(getattr(sizes, f.name))}" for f in sized)])

    def simulated_on(self) -> str:
        """What a figure of simulated numbers was simulated on, for the manifest."""
        return "the kit's simulator"

    def named_values(self) -> dict:
        """The values as JSON-friendly data: resolved objects by their names."""
        return {f.name: jsonable(getattr(self, f.name)) for f in fields(self)}


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


# ---- facts --------------------------------------------------------------------------------------------
FACTS_FILE = "facts.csv"
SCOPES = ("simulated", "measured")


@dataclass(frozen=True)
class Fact:
    """One number a notebook found, a row of its facts.csv: `value` of `fact` (a relibra.labels CLAIMS or
    METRICS id) for `of` (a policy, case, card or knob value; "" for the whole run) as `stat` (mean, low, high,
    best, ...), in `unit` (relibra.labels.UNIT_FORMATS; "%" holds a share), `scope` simulated or measured, `on`
    what (scale, card, seeds, machine; "" for the run's own, which the writer fills in). readme: the title of
    the README row that shows it ("": none; relibra.glance)."""

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
    one fact; a tuple's numbers one each (stat 0, 1, ...: their position, where it holds several), its text
    joining its `of` (a (part, seconds) pair); a nested dataclass's numbers belong to its first text field (its
    policy, model, ...). Other text, flags and None are left out."""
    if _number(obj):
        return [Fact(name, float(obj), of=of)]
    if dataclasses.is_dataclass(obj):
        own = next((v for v in (getattr(obj, f.name) for f in fields(obj)) if isinstance(v, str)), None)
        of = own if own is not None and name else of  # a nested one (a policy's row) is named by its text
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


def _text(v) -> str:
    v = jsonable(v)
    return ",".join(map(str, v)) if isinstance(v, list) else str(v)


def mean_of(t: pd.DataFrame, column: str, **where) -> float:
    """Mean of `column` over the rows where every `where` column equals its value."""
    for k, v in where.items():
        t = t[t[k] == v]
    return float(t[column].mean())
