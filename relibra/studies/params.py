"""The parameter spec a study, a notebook and a command line share: a `Params` dataclass of
`param(default, doc, kind, ...)` fields, each `Kind` parsing and checking one raw value (a literal,
papermill's -p string, a flag's text). `Params.create` parses raw values into checked, resolved ones (a model
preset becomes its ModelShape, a cluster its Topology); `add_flag` makes an argparse flag of a field,
`param_table` the docs' table.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any, Callable

from relibra.display import json_safe, md_table
from relibra.errors import ConfigError, RelibraError


@dataclass(frozen=True)
class Kind:
    """How one raw value becomes a parameter's value: `parse` (raises ValueError, TypeError or ConfigError)
    and `accepts`, what it takes, for the error that names it."""

    accepts: str
    parse: Callable[[Any], Any]

    def refusal(self, value, exc: BaseException) -> str:
        """The one line that refuses `value`: what the parameter accepts, what it got, and why."""
        return f"must be {self.accepts}; got {value!r} ({exc})"

    def arg(self, flag: str) -> Callable[[str], Any]:
        """This kind as argparse's `type=` for `flag`: a bad value is a ConfigError naming the flag (the command
        line's one `error:` line). A loader's own RelibraError already names what is wrong: it passes as it is."""
        def parse(text: str):
            try:
                return self.parse(text)
            except (ValueError, TypeError, OSError) as exc:
                raise ConfigError(f"{flag} {self.refusal(text, exc)}") from None
        return parse


def param(default, doc: str, kind: Kind, *, sizes: str | None = None, none=None, affects: bool = True):
    """A Params field: its raw default (what the parameters cell assigns), a one-line doc, its Kind. A raw None
    becomes the sizes' attribute `sizes` when given, else `none` (parsed alike). affects: False for a setting
    that changes where or how results show, not what they are."""
    return dataclasses.field(default=default, metadata={"doc": doc, "kind": kind, "sizes": sizes, "none": none,
                                                         "affects": affects})


def split_items(raw, sep: str = ",") -> list:
    """The items of a list, or of a `sep`-separated string (stripped; "" has none, "a," an empty one)."""
    if isinstance(raw, (list, tuple)):
        return list(raw)
    if isinstance(raw, str):
        return [v.strip() for v in raw.split(sep)] if raw.strip() else []
    return [raw]


def listed(raw, each: Callable[[Any], Any], sort: bool = False, sep: str = ",") -> tuple:
    """`each` of every item of `raw` (a list or a `sep`-separated string) as a tuple, ascending when `sort` (an
    axis whose neighbours matter); a ValueError when there is none, one is empty or one is given twice."""
    items = split_items(raw, sep)
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
    try:
        if isinstance(raw, bool) or not isinstance(raw, (numbers.Real, str)):
            raise ValueError
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
                lambda raw: listed(raw, lambda v: _checked(_int(v), low, high), sort))


def floats(low: float, high: float, sort: bool = False, note: str = "") -> Kind:
    """A comma-separated list of distinct finite numbers in [low, high]; ascending when `sort`."""
    return Kind(f"a comma-separated list of distinct numbers in [{low:g}, {high:g}]{note}",
                lambda raw: listed(raw, lambda v: _checked(_float(v), low, high), sort))


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
                lambda raw: listed(raw, lambda v: known_one(str(v))))


def objects(get: Callable[[str], Any], what: str, sep: str = ",", single: bool = False) -> Kind:
    """Names resolved by `get` (a model preset to its ModelShape...): a tuple of distinct ones, or one object
    when single."""
    def parse(raw):
        values = split_items(raw, sep)
        if single and len(values) > 1:
            raise ValueError(f"this notebook studies one {what}")
        out = listed(values, lambda v: v if not isinstance(v, str) else get(v))
        return out[0] if single else out
    return Kind(("one " if single else f"'{sep}'-separated ") + what, parse)


def _flag(raw) -> bool:
    if not isinstance(raw, bool):
        raise ValueError(f"{raw!r} is not True or False")
    return raw


FLAG = Kind("True or False", _flag)
PATH = Kind("a folder path", str)


def _field(params: type, name: str):
    f = next((f for f in fields(params) if f.name == name), None)
    if f is None:
        raise ConfigError(f"{params.__module__}: no parameter {name!r}")
    return f


def flag_help(params: type, name: str, default: str | None = None) -> str:
    """A flag's help from the parameter's declaration: its doc (without the notebook's "(None: ...)" note), what
    it accepts, and `default` (what the command takes without the flag), else the declared one unless None or
    False."""
    f = _field(params, name)
    doc, kind = re.sub(r" \(None: [^)]*\)$", "", f.metadata["doc"]), f.metadata["kind"]
    default = default or (None if f.default is None or f.default is False else _text(f.default))
    return (doc if kind is FLAG else f"{doc}: {kind.accepts}") + (f" (default: {default})" if default else "")


def add_flag(parser, params: type, name: str, flag: str | None = None, default: str | None = None):
    """Add `flag` (default --<name with dashes>) to an argparse parser from Params field `name`: its Kind parses
    the value (type=; FLAG: a switch), its help is flag_help, its default the declared one. The action keeps
    its declaration (`declared`: (params, name, default))."""
    f = _field(params, name)
    flag = flag or "--" + name.replace("_", "-")
    how = (dict(action="store_true") if f.metadata["kind"] is FLAG else
           dict(default=f.default, type=f.metadata["kind"].arg(flag), metavar=name.upper()))
    action = parser.add_argument(flag, dest=name, help=flag_help(params, name, default), **how)
    action.declared = (params, name, default)
    return action


def param_table(params: type) -> str:
    """The docs' markdown table of a Params class: parameter, default (a None the profile fills says so), what
    it accepts, meaning."""
    def default(f) -> str:
        if f.default is None:
            return "the profile's" if f.metadata["sizes"] else "`None`"
        return f"`{_text(f.default)}`"

    rows = [[f"`{f.name}`", default(f), f.metadata["kind"].accepts, f.metadata["doc"]] for f in fields(params)]
    return md_table(["parameter", "default", "accepts", "meaning"], rows)


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
    def non_default(cls, raw: dict) -> dict:
        """The items of `raw` (raw values by name) that set a parameter, other than a setting, away from its
        default."""
        defaults, settings = cls.defaults(), cls.settings()
        return {k: v for k, v in raw.items() if k in defaults and k not in settings and v != defaults[k]}

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
        """(params, sizes) from raw values; sizes_of(the fields without `sizes=`, parsed) gives the notebook's
        sizes. Every problem is one ConfigError naming the notebook, the parameter and what it accepts."""
        cls.check_names(notebook, raw)
        given = {**cls.defaults(), **raw}
        unsized = {f.name: cls._parse(notebook, f, given[f.name]) for f in fields(cls) if f.metadata["sizes"] is None}
        sizes = sizes_of(SimpleNamespace(**unsized))
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
        """One line on how far a run is from the paper's scale, for captions: the profile and every size."""
        sized = fields(sizes) if dataclasses.is_dataclass(sizes) else ()
        return ", ".join([f"{getattr(self, 'profile', 'no')} profile",
                          *(f"{f.name} {_text(getattr(sizes, f.name))}" for f in sized)])

    def simulated_on(self) -> str:
        """What a figure of simulated numbers was simulated on, for the manifest."""
        return "the kit's simulator"

    def named_values(self) -> dict:
        """The values as JSON-friendly data: resolved objects by their names."""
        return {f.name: json_safe(getattr(self, f.name), strict=False) for f in fields(self)}


def _text(v) -> str:
    v = json_safe(v, strict=False)
    return ",".join(map(str, v)) if isinstance(v, list) else str(v)
