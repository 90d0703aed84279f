"""SGLang: `/generate` responses saved as JSON or JSONL, and the per-sample tensor forms.

JSON / JSONL (what a client saves from `/generate` with return_routed_experts): one response
object per JSONL line, or a .json holding one object or a list of them (a batched request). Each
`meta_info` holds `prompt_tokens`, `completion_tokens` and `routed_experts`, the base64 of a flat
row-major array [rows, layers, topk] of dtype `meta_info.routed_experts_dtype` (int32 when absent;
int16, uint16, uint8 also read). rows = prompt_tokens + completion_tokens - 1 - start_len: the
routes cover positions [start_len, seq_len - 1). SGLang does not echo the request's
`routed_experts_start_len`, so it is an option (default 0); a `meta_info.routed_experts_start_len`
written by a wrapper wins. Layers and top-k cannot be read from the flat array, so the model shape
is needed.

Tensor forms: one file per step holding each sample's `routed_experts` [seq_len - 1, layers,
topk]: a .pt list of tensors (or {"routed_experts": list}), or a .npz with one array per sample,
taken in the order of the number in each array's name. No token counts travel with them, so their
alignment cannot be checked.
"""

from __future__ import annotations

import base64
import binascii
import os

import numpy as np

from relibra.cluster import ModelShape
from relibra.errors import TraceError
from relibra.importers.common import (as_count, check_ep, check_sequence, expand_paths, import_sequences,
                                      load_container, natural_index, resolve_model, source_provenance)
from relibra.trace import JSON_BYTES_PER_CHAR, RoutingTrace, check_decoded_bytes, parse_json
from relibra.trace.io import bounded_lines

DTYPES = {"int32": np.int32, "int16": np.int16, "uint16": np.uint16, "uint8": np.uint8}


def decode_routed_experts(meta: dict, model: ModelShape, where: str, start_len: int = 0) -> np.ndarray:
    """One response's meta_info -> routes [rows, layers, topk] (unchecked ids), rows aligned to its tokens."""
    for key in ("routed_experts", "prompt_tokens", "completion_tokens"):
        if key not in meta:
            raise TraceError(f"{where}: field 'meta_info.{key}' is missing (was the request sent with "
                             f"return_routed_experts=True?)" if key == "routed_experts" else
                             f"{where}: field 'meta_info.{key}' is missing")
    name = meta.get("routed_experts_dtype", "int32")
    if not isinstance(name, str) or name not in DTYPES:
        raise TraceError(f"{where}: field 'meta_info.routed_experts_dtype' is {name!r}; known: {', '.join(DTYPES)}")
    payload = meta["routed_experts"]
    if not isinstance(payload, str):
        raise TraceError(f"{where}: field 'meta_info.routed_experts' must be a base64 string, got "
                         f"{type(payload).__name__}")
    check_decoded_bytes(len(payload) * 3 // 4, where, "decoding field 'meta_info.routed_experts'")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TraceError(f"{where}: field 'meta_info.routed_experts' is not valid base64 ({exc})") from None
    dtype = np.dtype(DTYPES[name]).newbyteorder("<")
    if len(raw) % dtype.itemsize:
        raise TraceError(f"{where}: field 'meta_info.routed_experts' holds {len(raw)} bytes, not a whole number of "
                         f"{name} values")
    flat = np.frombuffer(raw, dtype=dtype)
    per_row = model.num_layers * model.top_k
    if flat.size % per_row:
        raise TraceError(f"{where}: field 'meta_info.routed_experts' holds {flat.size} values, not a multiple of "
                         f"layers x topk = {model.num_layers} x {model.top_k} of model {model.name!r}")
    start = as_count(meta.get("routed_experts_start_len", start_len), where, "routed_experts_start_len")
    seq_len = as_count(meta["prompt_tokens"], where, "prompt_tokens") + \
        as_count(meta["completion_tokens"], where, "completion_tokens")
    rows = flat.size // per_row
    if rows + start not in (seq_len, seq_len - 1):
        raise TraceError(f"{where}: field 'meta_info.routed_experts' has {rows} rows; prompt_tokens + completion_tokens "
                         f"- 1 - start_len = {seq_len - 1 - start} expected (start_len {start}): routes and tokens are "
                         f"misaligned")
    return flat.reshape(rows, model.num_layers, model.top_k)


def _responses(path: str):
    """(where, response dict) of a .json (object or list) or .jsonl (one object per line)."""
    if path.endswith(".jsonl"):
        with open(path, "rb") as fh:
            for n, raw in bounded_lines(fh, path):
                if not raw.strip():
                    continue
                yield f"{path}: line {n}", parse_json(raw, f"{path}: line {n}")
        return
    check_decoded_bytes(os.path.getsize(path) * JSON_BYTES_PER_CHAR, path, "parsing the JSON file")
    with open(path, "rb") as fh:
        obj = parse_json(fh.read(), path)
    items = obj if isinstance(obj, list) else [obj]
    for i, item in enumerate(items):
        yield f"{path}: response {i}", item


def _read_json(path: str, model: ModelShape, start_len: int) -> list[np.ndarray]:
    out = []
    for where, obj in _responses(path):
        if not isinstance(obj, dict) or not isinstance(obj.get("meta_info"), dict):
            raise TraceError(f"{where}: a /generate response is an object with a 'meta_info' object")
        routes = decode_routed_experts(obj["meta_info"], model, where, start_len)
        out.append(check_sequence(routes, model, where, "routed_experts", len(out), None))
    return out


def _read_tensors(path: str, model: ModelShape, key: str) -> list[np.ndarray]:
    obj = load_container(path)
    if isinstance(obj, dict) and key in obj and isinstance(obj[key], (list, tuple)):
        obj = obj[key]
    if isinstance(obj, (list, tuple)):
        samples = list(obj)
    elif isinstance(obj, dict):  # .npz: one array per sample, ordered by the number in its name
        samples = [obj[n] for n in sorted(obj, key=lambda n: (natural_index(n), n))]
    else:
        raise TraceError(f"{path}: expected a list of per-sample {key!r} tensors, got {type(obj).__name__}")
    for i, x in enumerate(samples):
        if not isinstance(x, np.ndarray):
            raise TraceError(f"{path}: sample {i} is a {type(x).__name__}, not a tensor")
    return [check_sequence(x, model, path, key, i, None) for i, x in enumerate(samples)]


def import_sglang(paths, model: str | ModelShape, ep: int, micro_batches: int = 1, order: str = "rank-major",
                  key: str = "routed_experts", start_len: int = 0, keep_tokens: bool = True) -> RoutingTrace:
    """Import SGLang routes, one file per step: /generate responses (.json, .jsonl) or tensors (.pt, .npz).

    Each response (sample) contributes its routed rows; samples are dealt to (rank, micro-batch)
    slots by `deal_sequences(order)`.
    """
    shape = resolve_model(model)
    check_ep(shape, ep)
    files = expand_paths(paths, (".json", ".jsonl", ".pt", ".npz"))

    def read(path):
        if path.endswith((".json", ".jsonl")):
            return _read_json(path, shape, start_len)
        return _read_tensors(path, shape, key)

    provenance = source_provenance("sglang", files, order=order, micro_batches=micro_batches, start_len=start_len)
    return import_sequences(files, read, shape, ep, micro_batches, order, keep_tokens, provenance)
