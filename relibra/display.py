"""What the kit prints: strict JSON and names safe to show on a terminal."""

from __future__ import annotations

import json
import math

import numpy as np


def json_safe(obj):
    """`obj` with numpy scalars and arrays as Python values and NaN / infinities as None (strict JSON)."""
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    elif isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
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
