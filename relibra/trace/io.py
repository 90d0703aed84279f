"""The trace file format and its bounded reader: a trace is one `.npz` (read with allow_pickle=False)
holding `format_version`, `loads`, `meta_json` and, when present, the token-level arrays. The reader
trusts no size it reads: every array's declared shape and dtype come from its .npy header and are
bounded (`max_bytes`, default DEFAULT_MAX_TRACE_BYTES, raised with the environment variable
RELIBRA_MAX_TRACE_BYTES) before anything is allocated; see docs/traces.md, "What the loader refuses".
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import zipfile

import numpy as np

from relibra.cluster import ModelShape
from relibra.errors import ConfigError, TraceError
from relibra.trace.checks import _check_int

FORMAT_VERSION = 1
TRACE_FIELDS = ("format_version", "loads", "meta_json", "token_experts", "token_src_rank", "seq_lens")
META_KEYS = ("model", "ep", "tokens_per_microbatch", "provenance")
DEFAULT_MAX_TRACE_BYTES = 8 * 2**30  # decoded bytes of all arrays of one file
MAX_TRACE_BYTES_ENV = "RELIBRA_MAX_TRACE_BYTES"


# ---- reading .npz without trusting it --------------------------------------------------------------
def max_trace_bytes(max_bytes: int | None = None) -> int:
    """The loader's size limit: max_bytes if given, else $RELIBRA_MAX_TRACE_BYTES, else 8 GiB."""
    if max_bytes is None:
        env = os.environ.get(MAX_TRACE_BYTES_ENV, "").strip()
        if not env:
            return DEFAULT_MAX_TRACE_BYTES
        try:
            max_bytes = int(float(env)) if "e" in env.lower() else int(env)
        except (ValueError, OverflowError):  # "lots", "nan", "1e400" (infinite)
            raise ConfigError(f"{MAX_TRACE_BYTES_ENV}={env!r}: give a finite number of bytes, e.g. "
                              f"17179869184") from None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer)) or max_bytes <= 0:
        raise ConfigError(f"max_bytes must be a positive integer, got {max_bytes!r}")
    return int(max_bytes)


# Python objects parsed from JSON take up to about this many bytes per character of text (measured:
# nested lists of small lists and ints >= 256, 8-byte pointers, 28-byte ints, 56+ byte lists).
JSON_BYTES_PER_CHAR = 40


def check_decoded_bytes(nbytes: int, where: str, what: str, max_bytes: int | None = None) -> None:
    """Refuse, before decoding, input whose decoded form would take more than the loader's limit
    (max_trace_bytes): the one limit every input format shares."""
    limit = max_trace_bytes(max_bytes)
    if nbytes > limit:
        raise TraceError(f"{where}: {what} would take about {nbytes} bytes, over the loader's limit of {limit} "
                         f"bytes; raise it with {MAX_TRACE_BYTES_ENV} or max_bytes= if the file is trusted")


def read_bounded(fh, where: str, max_bytes: int, error=TraceError) -> bytes:
    """The whole of a binary file object, refused (`error`, naming `where`) once it passes max_bytes: at
    most max_bytes + 1 bytes are read, so a huge or endless input (a sparse file, /dev/zero) costs no
    more than the bound."""
    data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise error(f"{where}: larger than {max_bytes} bytes, the most this input may hold")
    return data


def bounded_lines(fh, where: str, max_line_bytes: int | None = None):
    """(line number, raw bytes) of each line of a binary file object, each line read with a bound
    (default: the loader's limit over JSON_BYTES_PER_CHAR, what parse_json would accept) so that one
    line without an end costs no more than the bound; a longer line is a TraceError naming it."""
    if max_line_bytes is None:
        max_line_bytes = max_trace_bytes() // JSON_BYTES_PER_CHAR
    n = 0
    while True:
        raw = fh.readline(max_line_bytes + 1)
        if not raw:
            return
        n += 1
        if len(raw) > max_line_bytes:
            raise TraceError(f"{where}: line {n} is longer than {max_line_bytes} bytes, the most one record may "
                             f"hold (the loader's limit / {JSON_BYTES_PER_CHAR}); raise it with {MAX_TRACE_BYTES_ENV} "
                             f"if the file is trusted")
        yield n, raw


# No count, id or seed needs more digits; Python itself refuses to convert more than 4300 by default.
MAX_JSON_INT_DIGITS = 4300


class _BadNumber(Exception):
    """A JSON number parse_json refuses: its text and why."""


def _number_at(text: str, token: str) -> str:
    """Where the first JSON number spelled `token` is in text (strings skipped): 'line L, column C', or
    'column C' in one-line text (a JSONL record, whose line the caller names); '' when not found."""
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?', text):
        if m.group() == token:
            start = m.start()
            column = f"column {start - text.rfind(chr(10), 0, start)}"
            if "\n" not in text.strip():
                return column
            return f"line {text.count(chr(10), 0, start) + 1}, {column}"
    return ""


def parse_json(text: bytes | str, where: str, max_bytes: int | None = None):
    """Untrusted JSON -> Python objects, or one TraceError naming `where`.

    Refused: text whose parsed objects could pass the loader's limit (JSON_BYTES_PER_CHAR per
    character), text that is not UTF-8 or not JSON, nesting deeper than the parser's recursion limit,
    a key repeated within one object (JSON leaves it undefined; Python would keep the last silently),
    NaN / Infinity (not JSON), an integer of more than MAX_JSON_INT_DIGITS digits and a number too
    large for a float (1e400, which Python would read as inf); a number's error gives its line and
    column. Whether a number can be the count or id it stands for is the reader's check
    (relibra.importers.common.as_count, check_ids).
    """
    check_decoded_bytes(len(text) * JSON_BYTES_PER_CHAR, where, f"parsing {len(text)} bytes of JSON", max_bytes)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"{where}: not UTF-8 text (byte {exc.start}); truncated or corrupted?") from None

    def unique_keys(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise TraceError(f"{where}: key {key!r} appears twice in one JSON object")
            seen.add(key)
        return dict(pairs)

    def no_constant(name):
        raise TraceError(f"{where}: {name} is not a JSON number")

    def integer(token):
        digits = len(token.lstrip("-"))
        if digits > MAX_JSON_INT_DIGITS:
            raise _BadNumber(token, f"an integer of {digits} digits, more than any count or id "
                                    f"({MAX_JSON_INT_DIGITS} at most)")
        try:
            return int(token)
        except ValueError:  # the interpreter's own limit (PYTHONINTMAXSTRDIGITS) set below ours
            raise _BadNumber(token, f"an integer of {digits} digits, more than this Python converts") from None

    def number(token):
        value = float(token)
        if not math.isfinite(value):
            raise _BadNumber(token, "a number too large for a float")
        return value

    try:
        return json.loads(text, object_pairs_hook=unique_keys, parse_constant=no_constant, parse_int=integer,
                          parse_float=number)
    except _BadNumber as exc:
        token, why = exc.args
        at = _number_at(text, token)
        shown = token if len(token) <= 24 else f"{token[:12]}...{token[-6:]}"
        raise TraceError(f"{where}: {'at ' + at + ': ' if at else ''}{shown} is {why}") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
                         f"truncated or corrupted?") from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply to read (over ~{sys.getrecursionlimit()} levels)") from None


def _npy_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: str, name: str):
    """(shape, dtype, header bytes) of one .npy member, from its header only."""
    with zf.open(info) as fp:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise TraceError(f"{path}: field {name!r} is a .npy of format version {version}; this kit reads 1.0 and 2.0")
        return shape, dtype, fp.tell()


def read_npz(path: str | os.PathLike, max_bytes: int | None = None, fields=None) -> dict[str, np.ndarray]:
    """Read every array of an .npz (no pickle), checking each .npy header before allocating.

    fields: the allowed array names (None: any). Refused, as a TraceError naming the file and
    field: a file that is not a zip archive (a lone .npy or a text file named .npz), a member that
    is not .npy, an unknown or repeated field, object arrays (they need pickle), structured dtypes,
    arrays whose declared sizes add up to more than `max_bytes` (see max_trace_bytes), a member
    shorter than its header declares, and any other damage (truncation, bad CRC, zlib errors).
    """
    path = os.fspath(path)
    limit = max_trace_bytes(max_bytes)
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such file")
    if os.path.isdir(path):
        raise TraceError(f"{path}: is a folder, not an .npz file")
    if os.path.getsize(path) == 0:
        raise TraceError(f"{path}: the file is empty")
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
        if not zipfile.is_zipfile(path):
            if head.startswith(b"\x93NUMPY"):
                raise TraceError(f"{path}: is a single .npy array, not an .npz archive")
            if head.startswith(b"PK"):
                raise TraceError(f"{path}: truncated or corrupted (a zip archive without its central directory)")
            raise TraceError(f"{path}: is not an .npz archive (no zip directory; it starts with {head!r})")
        with zipfile.ZipFile(path) as zf:
            headers = {}
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise TraceError(f"{path}: archive member {info.filename!r} is not a .npy array")
                name = info.filename[:-4]
                if fields is not None and name not in fields:
                    raise TraceError(f"{path}: field {name!r} is not one of {', '.join(fields)}")
                if name in headers:
                    raise TraceError(f"{path}: field {name!r} appears twice")
                shape, dtype, header = _npy_header(zf, info, path, name)
                if dtype.hasobject:
                    raise TraceError(f"{path}: field {name!r} holds object arrays that need pickle, which this kit "
                                     f"refuses to load")
                if dtype.names is not None or dtype.subdtype is not None:
                    raise TraceError(f"{path}: field {name!r} has a structured dtype {dtype}, not a plain array")
                nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
                total = nbytes + sum(h[3] for h in headers.values())
                if total > limit:
                    raise TraceError(f"{path}: field {name!r} declares shape {shape} of {dtype} ({nbytes} bytes; "
                                     f"{total} bytes with the fields before it), over the loader's limit of {limit} "
                                     f"bytes; raise it with {MAX_TRACE_BYTES_ENV} or max_bytes= if the file is trusted")
                if nbytes > info.file_size - header:
                    raise TraceError(f"{path}: field {name!r} declares shape {shape} of {dtype} ({nbytes} bytes) but "
                                     f"its member holds {max(info.file_size - header, 0)} bytes; truncated or corrupted")
                headers[name] = (info, shape, dtype, nbytes)
            out = {}
            for name, (info, _, _, _) in headers.items():
                with zf.open(info) as fp:
                    out[name] = np.lib.format.read_array(fp, allow_pickle=False)
                    if fp.read(1) != b"":  # reading to the end also checks the member's CRC
                        raise TraceError(f"{path}: field {name!r} has bytes after its array data; corrupted")
            return out
    except (TraceError, ConfigError):
        raise
    except PermissionError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror})") from None
    except Exception as exc:  # BadZipFile, zlib.error, EOFError, ValueError from a damaged header, ...
        raise TraceError(f"{path}: truncated or corrupted ({type(exc).__name__}: {exc})") from None


def _check_format_version(arr: np.ndarray, path: str) -> None:
    where = f"{path}: field 'format_version'"
    if arr.shape != ():
        raise TraceError(f"{where} must be one integer, got an array of shape {arr.shape}")
    value = arr.item()
    if arr.dtype.kind not in "iu":
        raise TraceError(f"{where} is {value!r} ({arr.dtype}); it must be the integer {FORMAT_VERSION}")
    if value != FORMAT_VERSION:
        raise TraceError(f"{where} is {value}; this kit reads version {FORMAT_VERSION}")


def _parse_meta(arr: np.ndarray, path: str, max_bytes: int | None = None) -> tuple[ModelShape, int, int, dict]:
    """meta_json (a 0-d string array) -> (model, ep, tokens_per_microbatch, provenance), types checked."""
    where = f"{path}: field 'meta_json'"
    if arr.shape != () or arr.dtype.kind != "U":
        raise TraceError(f"{where} must be one string, got {arr.dtype} of shape {arr.shape}")
    meta = parse_json(str(arr.item()), where, max_bytes)
    if not isinstance(meta, dict):
        raise TraceError(f"{where} must be a JSON object, got {type(meta).__name__}")
    unknown = sorted(set(meta) - set(META_KEYS))
    if unknown:
        raise TraceError(f"{where} has unknown key {unknown[0]!r} (keys: {', '.join(META_KEYS)})")
    for key in ("model", "ep", "tokens_per_microbatch"):
        if key not in meta:
            raise TraceError(f"{where}: key {key!r} is missing")
    ep = _check_int(meta["ep"], where, "ep", 1, 2**20, what="key")
    tpm = _check_int(meta["tokens_per_microbatch"], where, "tokens_per_microbatch", 1, what="key")
    provenance = meta.get("provenance", {})
    if not isinstance(provenance, dict):
        raise TraceError(f"{where}: key 'provenance' must be a JSON object, got {type(provenance).__name__}")
    d = meta["model"]
    if not isinstance(d, dict):
        raise TraceError(f"{where}: key 'model' must be a JSON object, got {type(d).__name__}")
    known = {f.name for f in dataclasses.fields(ModelShape)}
    required = [f.name for f in dataclasses.fields(ModelShape) if f.default is dataclasses.MISSING]
    for key in required:
        if key not in d:
            raise TraceError(f"{where}: model field {key!r} is missing")
    for key, value in d.items():
        if key not in known:
            raise TraceError(f"{where}: model field {key!r} is unknown")
        if key == "name":
            if not isinstance(value, str):
                raise TraceError(f"{where}: model field 'name' is {value!r}, not a string")
        else:
            _check_int(value, where, f"model.{key}", 0, 2**40, what="key")
    try:
        model = ModelShape.from_dict(d)
    except (ConfigError, TypeError) as exc:
        raise TraceError(f"{where}: model is malformed ({exc})") from None
    return model, ep, tpm, provenance


# ---- free functions on arrays --------------------------------------------------------------------
