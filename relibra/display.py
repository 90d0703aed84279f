"""What the kit prints: strict JSON and names safe to show on a terminal."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import PurePath

import numpy as np


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
