"""What the kit prints: strict JSON, names safe to show on a terminal, markdown tables, and the marked
blocks of generated text in docs/ and the README.

A generated block sits between two marker lines, whatever generates it:

    <!-- table:NAME begin -->
    ...generated text...
    <!-- table:NAME end -->
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import PurePath

import numpy as np

from relibra.errors import ConfigError


def json_safe(obj, strict: bool = True):
    """The kit's one JSON normaliser: `obj` for json.dumps, with dict keys as strings, tuples as lists, paths
    as strings, numpy scalars and arrays as Python values, the kit's named objects (a dataclass with a
    `name`: ModelShape, Topology, SetupCard) by their names and a routing trace read from a file by its path;
    NaN and infinities as None when `strict` (strict JSON has none), kept otherwise."""
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    elif isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and strict and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v, strict) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v, strict) for v in obj]
    if isinstance(obj, PurePath):
        return str(obj)
    if dataclasses.is_dataclass(obj) and hasattr(obj, "name"):
        return obj.name
    if "file" in getattr(obj, "provenance", {}):  # a routing trace read from a file
        return obj.provenance["file"]
    return obj


def json_text(obj, **kwargs) -> str:
    """json.dumps of json_safe(obj); never writes NaN or Infinity."""
    return json.dumps(json_safe(obj), allow_nan=False, **kwargs)


def printable(text) -> str:
    """`text` with control characters (ESC, CR, LF, ...) escaped, so that a name read from a file or an
    argument cannot move the cursor or forge lines on a terminal."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def md_table(header: Sequence, rows: Sequence[Sequence]) -> str:
    """A GitHub-flavoured markdown table of `rows` (cells as text; "|" and newlines escaped), no final newline."""
    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(cell, row)) + " |" for row in rows])


MARKER = re.compile(r"^<!-- table:([a-z0-9-]+) (begin|end) -->$", re.MULTILINE)


def marker(name: str, kind: str) -> str:
    """The marker line that begins (kind "begin") or ends ("end") block NAME."""
    return f"<!-- table:{name} {kind} -->"


def marked_blocks(text: str, where: str) -> list[tuple[str, int, int]]:
    """(name, start, end) of each marked block of `text`: text[start:end] is what lies between its marker lines.
    A block without its end, an end without its begin, or a block inside another is an error naming `where`."""
    found, open_name, start = [], None, 0
    for m in MARKER.finditer(text):
        name, kind = m.groups()
        if kind == "begin":
            if open_name is not None:
                raise ConfigError(f"{where}: block {open_name!r} has no end marker before block {name!r} begins")
            open_name, start = name, m.end() + 1
        else:
            if open_name != name:
                raise ConfigError(f"{where}: end marker of block {name!r} without its begin marker")
            found.append((name, start, m.start()))
            open_name = None
    if open_name is not None:
        raise ConfigError(f"{where}: block {open_name!r} has no end marker")
    return found


def with_blocks(text: str, render: Callable[[str, str], str], where: str) -> str:
    """`text` with every marked block replaced by render(name, its current text) (a text ending with a newline)."""
    out, last = [], 0
    for name, start, end in marked_blocks(text, where):
        out += [text[last:start], render(name, text[start:end])]
        last = end
    return "".join(out) + text[last:]
