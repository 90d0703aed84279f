"""Checks on trace content shared by RoutingTrace and the importers: integer fields, expert-id arrays
(their dtype and range) and expert ids read from JSON rows. Every failure is one TraceError naming
where and which field."""

from __future__ import annotations

import itertools
import json

import numpy as np

from relibra.errors import TraceError

_INT32_MAX = int(np.iinfo(np.int32).max)
_ID_DTYPE_HINT = "ids must have an integer dtype (bool, float and bfloat16 are refused: bfloat16 rounds ids above 256)"


def _first(mask: np.ndarray) -> tuple[int, ...]:
    """Index of the first True of a boolean array."""
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _num(value):
    """A numpy scalar as a plain int (or float) for messages."""
    value = value.item() if hasattr(value, "item") else value
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _check_int(value, where: str, name: str, low: int = 0, high: int = 2**62, what: str = "field") -> int:
    """A plain integer (Python or numpy; not bool, not float, not 2.0) in [low, high]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TraceError(f"{where}: {what} {name!r} is {value!r} ({type(value).__name__}), not an integer")
    if not low <= int(value) <= high:
        raise TraceError(f"{where}: {what} {name!r} is {int(value)}, outside [{low}, {high}]")
    return int(value)


def check_id_dtype(ids, where: str, name: str) -> None:
    """Refuse an id array (expert ids, source ranks) whose dtype is not an integer.

    ids: numpy array or torch tensor. bool, float and bfloat16 are refused, even when every value is
    integral: bfloat16 holds only 256 consecutive integers, so ids above 256 come back rounded.
    """
    dtype = getattr(ids, "dtype", None)
    if dtype is None:
        raise TraceError(f"{where}: field {name!r} is a {type(ids).__name__}, not an array of integer ids")
    if not isinstance(dtype, np.dtype) or dtype.kind not in "iu":  # torch dtypes are not np.dtype
        kind = str(dtype).replace("torch.", "")
        raise TraceError(f"{where}: field {name!r} holds {kind} values; {_ID_DTYPE_HINT}")


def check_expert_ids(ids, num_experts: int, where: str, name: str, valid: np.ndarray | None = None) -> np.ndarray:
    """Validate an array of expert ids: integer dtype only, every id in [0, num_experts).

    ids: int array [..., top_k] (or a torch tensor: a bfloat16 one is refused before conversion).
    valid: optional bool mask over the leading axes of ids; masked-out positions (padding) are not
    checked. Returns ids as a numpy array, unchanged. Raises TraceError naming the field, the first
    bad index and its value. Importers call this on every array of expert ids they read.
    """
    check_id_dtype(ids, where, name)
    ids = np.asarray(ids)
    mask = (ids < 0) | (ids >= num_experts)
    if valid is not None:
        valid = np.asarray(valid, dtype=bool)
        mask &= valid.reshape(valid.shape + (1,) * (ids.ndim - valid.ndim))
    if mask.any():
        first = _first(mask)
        raise TraceError(f"{where}: field {name!r} at {first} holds expert id {_num(ids[first])}, outside "
                         f"[0, {num_experts})")
    return ids


def expert_ids_from_json(rows, width: int, where: str, name: str = "top_indices") -> np.ndarray:
    """A JSON list of lists of expert ids -> int64 [rows, width], refusing anything but JSON integers.

    numpy would turn `true` into 1 and 3.0 into 3; here a bool, float, string or null at any place
    is an error naming [token, k]. Range is not checked (use check_expert_ids).
    """
    if not isinstance(rows, list):
        raise TraceError(f"{where}: field {name!r} must be a list of lists, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, list):
            raise TraceError(f"{where}: field {name!r} at [token={i}] is {type(row).__name__}, not a list")
    widths = set(map(len, rows))
    if widths - {width}:
        i = next(i for i, row in enumerate(rows) if len(row) != width)
        raise TraceError(f"{where}: field {name!r} at [token={i}] has top-k width {len(rows[i])}, expected {width}")
    if set(map(type, itertools.chain.from_iterable(rows))) - {int}:  # one C-speed pass over all ids
        for i, row in enumerate(rows):
            for j, v in enumerate(row):
                if type(v) is not int:
                    raise TraceError(f"{where}: field {name!r} at [token={i}, k={j}] holds {json.dumps(v)}, "
                                     f"not an integer expert id")
    if not rows:
        return np.zeros((0, width), dtype=np.int64)
    try:
        return np.array(rows, dtype=np.int64)
    except OverflowError:
        i, j = next((i, j) for i, row in enumerate(rows) for j, v in enumerate(row) if not -2**63 <= v < 2**63)
        raise TraceError(f"{where}: field {name!r} at [token={i}, k={j}] holds {rows[i][j]}, far outside any "
                         f"expert id") from None


