"""Importers: routing data written by training and RL systems -> RoutingTrace.

Every importer reads token-level top-k expert ids, checks them (range, duplicates within a
token's top-k, top-k width, layer count), maps them onto the trace axes (step, micro_batch,
src_rank) and keeps them as `token_experts` unless keep_tokens=False. Nothing is clipped or
repaired: bad input raises TraceError naming the file, the field and the first offending index.

Formats and how their axes map (docs/traces.md has the full table):
- megatron-replay: what megatron-core's `RouterReplay.get_recorded_data()` returns, one
  [num_tokens, topk] int64 tensor per MoE layer, saved once per (step, micro-batch, EP rank).
  A .pt file (torch.save) holds either that list or a dict {"topk_indices": list, "step": int,
  "micro_batch": int, "rank": int}; a .npz holds arrays `layer_0 .. layer_{L-1}` (or np.savez's
  positional `arr_0 ..`) and optional 0-d int arrays `step`, `micro_batch`, `rank`. Keys missing in
  the file come from the file name (`step12`, `mb3` / `micro_batch3` / `microbatch3`, `rank5`,
  separators `_` or `-` allowed), else 0. Step and micro-batch numbers are renumbered densely in
  sorted order; ranks must be 0..ep-1.
- megatron-jsonl: megatron-core's routing-trace JSONL, one record per (step, layer) and rank:
  {"step", "layer", "rank", "num_tokens", "topk", "top_indices"}. The j-th record of a given
  (step, layer, rank), in file order over the files as given, is micro-batch j (a record with a
  "micro_batch" field uses that instead).
- verl: one file per step holding `routed_experts` [batch, max_seq_len, num_layers, topk] (int64)
  and `attention_mask` [batch, max_seq_len]; only positions whose mask is 1 are tokens.
- sglang: one file per step holding the per-sample `routed_experts` [seq_len - 1, num_layers, topk]
  (int32) of each sample: a .pt list of tensors (or {"routed_experts": list}), or a .npz with one
  array per sample, taken in the order of the number in each array's name.
For verl and sglang, sequences are dealt to (EP rank, micro-batch) slots in contiguous runs:
`order="rank-major"` (default; verl's DataProto.chunk over data-parallel ranks, then each rank's
share cut into `micro_batches`) or "microbatch-major" (Megatron's sampler: each micro-batch takes
the next block of sequences and its ranks take consecutive runs of it).
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from collections import defaultdict

import numpy as np

from relibra.cluster import ModelShape, get_model
from relibra.errors import ConfigError, TraceError
from relibra.trace import RoutingTrace

FORMATS = ("megatron-replay", "megatron-jsonl", "verl", "sglang")
ORDERS = ("rank-major", "microbatch-major")


# ---- model shape ---------------------------------------------------------------------------------
def resolve_model(model: str | ModelShape | None = None, layers: int | None = None, experts: int | None = None,
                  top_k: int | None = None, hidden: int = 2048, moe_ffn: int = 768) -> ModelShape:
    """A preset (by name), a ModelShape, or an explicit (layers, experts, top_k) shape.

    hidden and moe_ffn only size the cost model of an explicit shape (defaults as Qwen3-30B-A3B).
    """
    explicit = (layers, experts, top_k)
    if model is not None:
        if any(v is not None for v in explicit):
            raise ConfigError("give either a model preset or --layers/--experts/--top-k, not both")
        return get_model(model) if isinstance(model, str) else model
    if any(v is None for v in explicit):
        raise ConfigError("the model shape is needed: a preset name, or all of layers, experts and top_k")
    return ModelShape(f"custom-{layers}x{experts}-top{top_k}", num_layers=int(layers), num_experts=int(experts),
                      top_k=int(top_k), hidden=int(hidden), moe_ffn=int(moe_ffn))


# ---- reading files -------------------------------------------------------------------------------
def _expand(paths, suffixes: tuple[str, ...]) -> list[str]:
    """Files named directly, plus the files with one of `suffixes` inside named directories (sorted)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in map(os.fspath, paths):
        if os.path.isdir(p):
            found = sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(suffixes))
            if not found:
                raise TraceError(f"{p}: directory holds no {' or '.join(suffixes)} files")
            out.extend(found)
        else:
            out.append(p)
    if not out:
        raise TraceError("no input files given")
    for p in out:
        if not os.path.exists(p):
            raise TraceError(f"{p}: no such file")
        if os.path.getsize(p) == 0:
            raise TraceError(f"{p}: the file is empty")
    return out


def _to_numpy(obj, path: str):
    """Tensors (also inside lists, tuples and dicts) -> numpy arrays; ints and strings kept."""
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.is_complex():
            raise TraceError(f"{path}: holds a {obj.dtype} tensor, not integer expert ids")
        if obj.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds every value exactly
            obj = obj.float()
        return obj.detach().cpu().numpy()
    if isinstance(obj, (list, tuple)):
        return [_to_numpy(x, path) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_numpy(v, path) for k, v in obj.items()}
    return obj


def load_container(path: str):
    """Read a .pt (torch.load, weights_only=True) or .npz (allow_pickle=False) file.

    Returns, for .npz, a dict name -> array (every array read now, so corruption shows here); for
    .pt, the saved object with tensors turned into numpy arrays. Errors name the file.
    """
    if path.endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as z:
                return {name: z[name] for name in z.files}
        except ValueError as exc:
            if "pickle" in str(exc).lower():
                raise TraceError(f"{path}: holds object arrays that need pickle, which this kit refuses to load") from None
            raise TraceError(f"{path}: unreadable ({exc})") from None
        except (zipfile.BadZipFile, OSError, EOFError, KeyError) as exc:
            raise TraceError(f"{path}: truncated or corrupted ({type(exc).__name__}: {exc})") from None
        except Exception as exc:  # zlib errors on a damaged member
            raise TraceError(f"{path}: truncated or corrupted ({type(exc).__name__}: {exc})") from None
    if path.endswith(".pt") or path.endswith(".pth"):
        import pickle

        import torch

        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            if "weights only" in str(exc).lower() or "weights_only" in str(exc).lower():
                raise TraceError(f"{path}: holds objects that need full pickle; this kit loads .pt files with "
                                 f"weights_only=True (save plain tensors, lists, dicts and ints)") from None
            raise TraceError(f"{path}: truncated or corrupted ({exc})") from None
        except Exception as exc:  # RuntimeError from a damaged zip archive, EOFError, ...
            raise TraceError(f"{path}: truncated or corrupted ({type(exc).__name__}: {exc})") from None
        return _to_numpy(obj, path)
    raise TraceError(f"{path}: unknown file type; expected .pt or .npz")


# ---- checking ids --------------------------------------------------------------------------------
def _fmt_index(axes: tuple[str, ...], index) -> str:
    return "[" + ", ".join(f"{a}={int(i)}" for a, i in zip(axes, index)) + "]"


def check_ids(ids, model: ModelShape, where: str, field: str, axes: tuple[str, ...],
              valid: np.ndarray | None = None, offset: tuple[int, ...] | None = None) -> np.ndarray:
    """Validate top-k expert ids and return them as int16 (int32 beyond 32767 experts).

    ids: array [..., top_k]; axes names every axis (for messages); valid: optional bool mask over
    leading axes of ids (padding positions are not checked); offset is added to the reported index
    (for arrays that are a slice of a larger one). Raises TraceError on a non-integer dtype or value,
    the wrong top-k width, an id outside [0, num_experts), or an expert repeated in one token's top-k.
    """
    ids = np.asarray(ids)
    off = np.zeros(ids.ndim, dtype=np.int64) if offset is None else np.asarray(offset, dtype=np.int64)
    if ids.dtype == object or ids.dtype.kind not in "iuf":
        raise TraceError(f"{where}: field {field!r} holds {ids.dtype} values, not integer expert ids")
    if ids.ndim != len(axes):
        raise TraceError(f"{where}: field {field!r} must have {len(axes)} axes [{', '.join(axes)}], got shape {ids.shape}")
    if ids.shape[-1] != model.top_k:
        raise TraceError(f"{where}: field {field!r} has top-k width {ids.shape[-1]} (shape {ids.shape}), but model "
                         f"{model.name!r} has top_k={model.top_k}")
    if valid is not None:  # leading axes of ids; broadcast over the rest
        valid = np.asarray(valid, bool)
        valid = valid.reshape(valid.shape + (1,) * (ids.ndim - valid.ndim))
    mask = np.ones(ids.shape, dtype=bool) if valid is None else np.broadcast_to(valid, ids.shape)
    if ids.dtype.kind == "f":
        frac = mask & ~(np.isfinite(ids) & (ids == np.round(np.nan_to_num(ids))))
        if frac.any():
            first = np.argwhere(frac)[0]
            raise TraceError(f"{where}: field {field!r} at {_fmt_index(axes, first + off)} holds {ids[tuple(first)].item()!r}, "
                             f"not an integer expert id")
    bad = mask & ((ids < 0) | (ids >= model.num_experts))
    if bad.any():
        first = np.argwhere(bad)[0]
        value = ids[tuple(first)]
        kind = "a negative expert id" if value < 0 else "an expert id"
        raise TraceError(f"{where}: field {field!r} at {_fmt_index(axes, first + off)} holds {kind} {int(value)}, "
                         f"outside [0, {model.num_experts})")
    dtype = np.int16 if model.num_experts <= np.iinfo(np.int16).max else np.int32
    ids = ids.astype(dtype) if ids.dtype != dtype else ids
    srt = np.sort(ids, axis=-1)
    dup = (srt[..., 1:] == srt[..., :-1]).any(-1)
    if valid is not None:
        dup &= valid[..., 0]
    if dup.any():
        first = np.argwhere(dup)[0]
        row = srt[tuple(first)]
        value = int(row[1:][row[1:] == row[:-1]][0])
        raise TraceError(f"{where}: field {field!r} at {_fmt_index(axes[:-1], first + off[:-1])} repeats expert "
                         f"{value} within one token's top-k")
    return ids


def _as_count(value, where: str, field: str) -> int:
    """A non-negative integer count (JSON int, numpy integer, or 0-d integer array)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TraceError(f"{where}: field {field!r} is {value!r}, not an integer")
    if value < 0:
        raise TraceError(f"{where}: field {field!r} is {int(value)}, a negative count")
    return int(value)


# ---- assembling a trace --------------------------------------------------------------------------
def assemble(slots: dict[tuple[int, int, int], np.ndarray], model: ModelShape, ep: int, provenance: dict,
             keep_tokens: bool = True) -> RoutingTrace:
    """Build a trace from token ids per slot.

    slots: (step, micro_batch, rank) -> int ids [tokens, layers, top_k], already checked, with steps
    0..S-1, micro-batches 0..M-1 and ranks 0..ep-1 all present. Tokens of a micro-batch are laid out
    rank by rank in `token_experts`; tokens_per_microbatch is the largest micro-batch's token count.
    """
    steps = 1 + max(s for s, _, _ in slots)
    mbs = 1 + max(m for _, m, _ in slots)
    for s in range(steps):
        for m in range(mbs):
            for r in range(ep):
                if (s, m, r) not in slots:
                    raise TraceError(f"{provenance.get('source', 'input')}: no routing for step {s}, micro-batch {m}, "
                                     f"rank {r}; every (step, micro-batch, rank) must be present")
    l, e, k = model.num_layers, model.num_experts, model.top_k
    loads = np.zeros((steps, mbs, l, ep, e), dtype=np.int32)
    mb_tokens = np.zeros((steps, mbs), dtype=np.int64)
    for (s, m, r), ids in slots.items():
        n = ids.shape[0]
        mb_tokens[s, m] += n
        if n:
            flat = (np.arange(l)[None, :, None] * e + ids.astype(np.int64)).ravel()
            loads[s, m, :, r, :] = np.bincount(flat, minlength=l * e).reshape(l, e)
    if mb_tokens.max() == 0:
        raise TraceError(f"{provenance.get('source', 'input')}: holds no tokens")
    te = tsr = None
    if keep_tokens:
        t = int(mb_tokens.max())
        te = np.full((steps, mbs, t, l, k), -1, dtype=next(iter(slots.values())).dtype)
        tsr = np.full((steps, mbs, t), -1, dtype=np.int16 if ep <= np.iinfo(np.int16).max else np.int32)
        fill = np.zeros((steps, mbs), dtype=np.int64)
        for (s, m, r) in sorted(slots):
            ids = slots[(s, m, r)]
            a, b = fill[s, m], fill[s, m] + ids.shape[0]
            te[s, m, a:b] = ids
            tsr[s, m, a:b] = r
            fill[s, m] = b
    return RoutingTrace(loads, model, ep, int(mb_tokens.max()), provenance, te, tsr)


def deal_sequences(num_sequences: int, ep: int, micro_batches: int, order: str = "rank-major",
                   where: str = "input") -> tuple[np.ndarray, np.ndarray]:
    """(rank, micro_batch) of each sequence of a step when dealt in contiguous runs.

    rank-major: rank r takes the r-th of ep near-equal contiguous chunks and cuts it into
    micro_batches runs; microbatch-major: micro-batch m takes the m-th chunk and cuts it into ep runs.
    Returns int64 [num_sequences] each. Every slot gets at least one sequence.
    """
    if order not in ORDERS:
        raise ConfigError(f"unknown order {order!r}; known: {', '.join(ORDERS)}")
    if micro_batches <= 0:
        raise ConfigError(f"micro_batches must be positive, got {micro_batches}")
    if num_sequences < ep * micro_batches:
        raise TraceError(f"{where}: {num_sequences} sequences cannot fill ep={ep} x micro_batches={micro_batches} "
                         f"slots (one sequence at least per slot)")
    outer, inner = (ep, micro_batches) if order == "rank-major" else (micro_batches, ep)
    pos = np.arange(num_sequences)
    chunk = np.searchsorted(np.linspace(0, num_sequences, outer + 1).round()[1:], pos, side="right")
    start = np.linspace(0, num_sequences, outer + 1).round()[chunk]
    size = np.diff(np.linspace(0, num_sequences, outer + 1).round())[chunk]
    run = np.floor((pos - start) * inner / size).astype(np.int64)
    return (chunk, run) if order == "rank-major" else (run, chunk)


def _check_ep(model: ModelShape, ep: int) -> None:
    if not isinstance(ep, (int, np.integer)) or ep <= 0:
        raise ConfigError(f"ep must be a positive integer, got {ep!r}")
    if model.num_experts % ep:
        raise ConfigError(f"ep={ep} does not divide the {model.num_experts} experts of {model.name!r}")


# ---- megatron-core RouterReplay recordings -------------------------------------------------------
_KEY_PATTERNS = {
    "step": re.compile(r"(?:^|[^a-z])step[_-]?(\d+)", re.I),
    "micro_batch": re.compile(r"(?:^|[^a-z])(?:micro_?batch|mb)[_-]?(\d+)", re.I),
    "rank": re.compile(r"(?:^|[^a-z])rank[_-]?(\d+)", re.I),
}


def _natural_index(name: str) -> int:
    digits = re.findall(r"\d+", name)
    return int(digits[-1]) if digits else -1


def _replay_layers(obj, path: str) -> tuple[list, dict]:
    """(per-layer arrays, metadata dict) from one megatron-replay file's content."""
    meta = {}
    if isinstance(obj, dict):
        if "topk_indices" in obj:  # the .pt dict form
            layers = obj["topk_indices"]
            meta = {k: obj[k] for k in ("step", "micro_batch", "rank") if k in obj}
        else:  # the .npz form: layer_i or arr_i arrays
            meta = {k: obj[k] for k in ("step", "micro_batch", "rank") if k in obj}
            names = [n for n in obj if n not in meta]
            if not names:
                raise TraceError(f"{path}: holds no per-layer arrays (expected layer_0, layer_1, ...)")
            bad = [n for n in names if not re.fullmatch(r"(layer|arr)_\d+", n)]
            if bad:
                raise TraceError(f"{path}: unexpected field {bad[0]!r}; per-layer arrays are named layer_0, layer_1, ...")
            names.sort(key=_natural_index)
            idx = [_natural_index(n) for n in names]
            if idx != list(range(len(names))):
                raise TraceError(f"{path}: per-layer arrays must be numbered 0..{len(names) - 1}, got {names}")
            layers = [obj[n] for n in names]
    elif isinstance(obj, (list, tuple)):
        layers = list(obj)
    else:
        raise TraceError(f"{path}: expected a list of per-layer [num_tokens, topk] tensors, got {type(obj).__name__}")
    if not isinstance(layers, (list, tuple)) or not all(isinstance(x, np.ndarray) for x in layers):
        raise TraceError(f"{path}: field 'topk_indices' must be a list of tensors")
    return list(layers), meta


def import_megatron_replay(paths, model: str | ModelShape, ep: int, keep_tokens: bool = True) -> RoutingTrace:
    """Import megatron-core RouterReplay recordings, one file per (step, micro-batch, EP rank).

    paths: files (.pt or .npz) or directories of them. See the module docstring for the keys.
    """
    shape = resolve_model(model)
    _check_ep(shape, ep)
    files = _expand(paths, (".pt", ".npz"))
    raw: dict[tuple[int, int, int], tuple[str, np.ndarray]] = {}
    for path in files:
        layers, meta = _replay_layers(load_container(path), path)
        key = []
        for name in ("step", "micro_batch", "rank"):
            if name in meta:
                key.append(_as_count(meta[name], path, name))
            else:
                hit = _KEY_PATTERNS[name].search(os.path.basename(path))
                key.append(int(hit.group(1)) if hit else 0)
        if key[2] >= ep:
            raise TraceError(f"{path}: field 'rank' is {key[2]}, outside the EP group [0, {ep})")
        if len(layers) != shape.num_layers:
            raise TraceError(f"{path}: field 'topk_indices' holds {len(layers)} layer tensors, but model {shape.name!r} "
                             f"has {shape.num_layers} MoE layers")
        checked = []
        for i, arr in enumerate(layers):
            ids = check_ids(arr, shape, path, f"layer {i}", ("token", "k"))
            if checked and ids.shape[0] != checked[0].shape[0]:
                raise TraceError(f"{path}: field 'layer {i}' has {ids.shape[0]} tokens but layer 0 has "
                                 f"{checked[0].shape[0]}; every layer sees the same tokens")
            checked.append(ids)
        if tuple(key) in raw:
            raise TraceError(f"{path}: (step {key[0]}, micro-batch {key[1]}, rank {key[2]}) is also in "
                             f"{raw[tuple(key)][0]}; name files stepS_mbM_rankR or store step/micro_batch/rank in them")
        raw[tuple(key)] = (path, np.stack(checked, axis=1))  # [tokens, L, K]
    step_ids = sorted({s for s, _, _ in raw})
    slots = {}
    mb_ids = {}
    for s_new, s in enumerate(step_ids):
        mb_ids[s] = sorted({m for s2, m, _ in raw if s2 == s})
        for m_new, m in enumerate(mb_ids[s]):
            for r in range(ep):
                if (s, m, r) in raw:
                    slots[(s_new, m_new, r)] = raw[(s, m, r)][1]
    if len({len(v) for v in mb_ids.values()}) > 1:
        counts = {s: len(v) for s, v in mb_ids.items()}
        raise TraceError(f"megatron-replay: steps hold different numbers of micro-batches {counts}")
    provenance = {"importer": "megatron-replay", "source": files[0] if len(files) == 1 else f"{len(files)} files",
                  "files": [os.path.basename(f) for f in files][:64], "steps": step_ids}
    return assemble(slots, shape, ep, provenance, keep_tokens)


# ---- megatron-core routing-trace JSONL -----------------------------------------------------------
def import_megatron_jsonl(paths, model: str | ModelShape, ep: int, keep_tokens: bool = True) -> RoutingTrace:
    """Import megatron-core routing-trace JSONL files (usually one per rank).

    One record per (step, layer, rank) and micro-batch: {"step", "layer", "rank", "num_tokens",
    "topk", "top_indices": [[...], ...]}. Micro-batch j of (step, rank) is the j-th record of each
    layer in file order, unless records carry "micro_batch".
    """
    shape = resolve_model(model)
    _check_ep(shape, ep)
    files = _expand(paths, (".jsonl", ".json"))
    seen = defaultdict(int)  # (step, layer, rank) -> records so far
    records: dict[tuple[int, int, int], dict[int, tuple[str, np.ndarray]]] = defaultdict(dict)
    for path in files:
        with open(path, "rb") as fh:
            data = fh.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}: not UTF-8 text (byte {exc.start}); corrupted?") from None
        lines = text.splitlines()
        if not any(line.strip() for line in lines):
            raise TraceError(f"{path}: the file holds no records")
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}: line {n}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); truncated or corrupted?") from None
            if not isinstance(rec, dict):
                raise TraceError(f"{where}: a record must be a JSON object")
            for key in ("step", "layer", "rank", "num_tokens", "topk", "top_indices"):
                if key not in rec:
                    raise TraceError(f"{where}: field {key!r} is missing")
            step, layer, rank = (_as_count(rec[k], where, k) for k in ("step", "layer", "rank"))
            num_tokens = _as_count(rec["num_tokens"], where, "num_tokens")
            topk = _as_count(rec["topk"], where, "topk")
            if topk != shape.top_k:
                raise TraceError(f"{where}: field 'topk' is {topk}, but model {shape.name!r} has top_k={shape.top_k}")
            if layer >= shape.num_layers:
                raise TraceError(f"{where}: field 'layer' is {layer}, but model {shape.name!r} has "
                                 f"{shape.num_layers} MoE layers")
            if rank >= ep:
                raise TraceError(f"{where}: field 'rank' is {rank}, outside the EP group [0, {ep})")
            ids = _json_ids(rec["top_indices"], topk, where)
            if ids.shape[0] != num_tokens:
                raise TraceError(f"{where}: field 'num_tokens' is {num_tokens} but 'top_indices' has {ids.shape[0]} rows")
            ids = check_ids(ids, shape, where, "top_indices", ("token", "k"))
            if "micro_batch" in rec:
                mb = _as_count(rec["micro_batch"], where, "micro_batch")
            else:
                mb = seen[(step, layer, rank)]
            seen[(step, layer, rank)] += 1
            if layer in records[(step, mb, rank)]:
                raise TraceError(f"{where}: a second record for step {step}, micro-batch {mb}, layer {layer}, rank {rank}")
            records[(step, mb, rank)][layer] = (where, ids)
    step_ids = sorted({s for s, _, _ in records})
    slots = {}
    mb_count = None
    for s_new, s in enumerate(step_ids):
        mbs = sorted({m for s2, m, _ in records if s2 == s})
        if mb_count is None:
            mb_count = len(mbs)
        elif len(mbs) != mb_count:
            raise TraceError(f"megatron-jsonl: step {s} holds {len(mbs)} micro-batches but step {step_ids[0]} holds {mb_count}")
        for m_new, m in enumerate(mbs):
            for r in range(ep):
                layers = records.get((s, m, r))
                if layers is None:
                    raise TraceError(f"megatron-jsonl: no records for step {s}, micro-batch {m}, rank {r}")
                missing = [i for i in range(shape.num_layers) if i not in layers]
                if missing:
                    raise TraceError(f"megatron-jsonl: step {s}, micro-batch {m}, rank {r} has records for "
                                     f"{len(layers)} layers, model {shape.name!r} has {shape.num_layers}; "
                                     f"layer {missing[0]} is missing")
                n0 = layers[0][1].shape[0]
                for i in range(1, shape.num_layers):
                    if layers[i][1].shape[0] != n0:
                        raise TraceError(f"{layers[i][0]}: field 'num_tokens' is {layers[i][1].shape[0]} but layer 0 "
                                         f"of the same step, micro-batch and rank has {n0}")
                slots[(s_new, m_new, r)] = np.stack([layers[i][1] for i in range(shape.num_layers)], axis=1)
    provenance = {"importer": "megatron-jsonl", "source": files[0] if len(files) == 1 else f"{len(files)} files",
                  "files": [os.path.basename(f) for f in files][:64], "steps": step_ids}
    return assemble(slots, shape, ep, provenance, keep_tokens)


def _json_ids(rows, topk: int, where: str) -> np.ndarray:
    """top_indices (a JSON list of lists) -> array [tokens, topk], with the first bad row named."""
    if not isinstance(rows, list):
        raise TraceError(f"{where}: field 'top_indices' must be a list of lists")
    if not rows:
        return np.zeros((0, topk), dtype=np.int64)
    try:
        arr = np.asarray(rows)
    except ValueError:  # ragged rows
        arr = None
    if arr is not None and arr.ndim == 2 and arr.dtype.kind in "iuf":
        return arr
    for i, row in enumerate(rows):  # slow path only to name the first bad row
        if not isinstance(row, list):
            raise TraceError(f"{where}: field 'top_indices' at [token={i}] is not a list")
        if len(row) != topk:
            raise TraceError(f"{where}: field 'top_indices' at [token={i}] has top-k width {len(row)}, expected {topk}")
        for j, v in enumerate(row):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TraceError(f"{where}: field 'top_indices' at [token={i}, k={j}] holds {v!r}, not an integer expert id")
    raise TraceError(f"{where}: field 'top_indices' is not a [num_tokens, topk] array of integers")


# ---- verl ----------------------------------------------------------------------------------------
def _get_field(obj, path: str, key: str) -> np.ndarray:
    if not isinstance(obj, dict):
        raise TraceError(f"{path}: expected a dict of tensors with field {key!r}, got {type(obj).__name__}")
    if key not in obj:
        raise TraceError(f"{path}: field {key!r} is missing (fields: {', '.join(map(str, obj))})")
    return obj[key]


def import_verl(paths, model: str | ModelShape, ep: int, micro_batches: int = 1, order: str = "rank-major",
                ids_key: str = "routed_experts", mask_key: str = "attention_mask",
                keep_tokens: bool = True) -> RoutingTrace:
    """Import verl router-replay batches, one file (.pt dict or .npz) per step.

    routed_experts: int [batch, max_seq_len, num_layers, topk]; attention_mask: 0/1 [batch,
    max_seq_len]. Sequences are dealt to (rank, micro-batch) slots by `deal_sequences(order)`.
    """
    shape = resolve_model(model)
    _check_ep(shape, ep)
    files = _expand(paths, (".pt", ".npz"))
    slots = {}
    for s, path in enumerate(files):
        obj = load_container(path)
        ids = np.asarray(_get_field(obj, path, ids_key))
        mask = np.asarray(_get_field(obj, path, mask_key))
        if ids.ndim != 4:
            raise TraceError(f"{path}: field {ids_key!r} must be [batch, max_seq_len, num_layers, topk], got shape {ids.shape}")
        if ids.shape[2] != shape.num_layers:
            raise TraceError(f"{path}: field {ids_key!r} has {ids.shape[2]} layers (shape {ids.shape}), but model "
                             f"{shape.name!r} has {shape.num_layers} MoE layers")
        if mask.shape != ids.shape[:2]:
            raise TraceError(f"{path}: field {mask_key!r} has shape {mask.shape}, expected {ids.shape[:2]} "
                             f"(batch, max_seq_len of {ids_key!r})")
        if mask.dtype.kind not in "biuf" or not np.isin(mask, (0, 1)).all():
            bad = np.argwhere(~np.isin(mask, (0, 1)))[0] if mask.dtype.kind in "biuf" else (0, 0)
            raise TraceError(f"{path}: field {mask_key!r} at {_fmt_index(('sequence', 'position'), bad)} holds "
                             f"{np.asarray(mask)[tuple(bad)].item()!r}; a mask holds 0 or 1")
        valid = mask.astype(bool)
        ids = check_ids(ids, shape, path, ids_key, ("sequence", "position", "layer", "k"), valid=valid)
        rank, mb = deal_sequences(ids.shape[0], ep, micro_batches, order, path)
        for r in range(ep):
            for m in range(micro_batches):
                seqs = np.nonzero((rank == r) & (mb == m))[0]
                slots[(s, m, r)] = ids[seqs][valid[seqs]]  # [tokens, L, K], sequence by sequence
    provenance = {"importer": "verl", "source": files[0] if len(files) == 1 else f"{len(files)} files",
                  "files": [os.path.basename(f) for f in files][:64], "order": order, "micro_batches": micro_batches}
    return assemble(slots, shape, ep, provenance, keep_tokens)


# ---- SGLang --------------------------------------------------------------------------------------
def _sglang_samples(obj, path: str, key: str) -> list[np.ndarray]:
    if isinstance(obj, dict) and key in obj and isinstance(obj[key], (list, tuple)):
        obj = obj[key]
    if isinstance(obj, (list, tuple)):
        samples = list(obj)
    elif isinstance(obj, dict):  # .npz: one array per sample, ordered by the number in its name
        names = sorted(obj, key=lambda n: (_natural_index(n), n))
        samples = [obj[n] for n in names]
    elif isinstance(obj, np.ndarray) and obj.ndim == 3:
        samples = [obj]
    else:
        raise TraceError(f"{path}: expected a list of per-sample {key!r} tensors, got {type(obj).__name__}")
    if not samples:
        raise TraceError(f"{path}: holds no samples")
    for i, x in enumerate(samples):
        if not isinstance(x, np.ndarray):
            raise TraceError(f"{path}: sample {i} is a {type(x).__name__}, not a tensor")
    return samples


def import_sglang(paths, model: str | ModelShape, ep: int, micro_batches: int = 1, order: str = "rank-major",
                  key: str = "routed_experts", keep_tokens: bool = True) -> RoutingTrace:
    """Import SGLang `routed_experts`, one file per step holding every sample's [seq_len-1, layers, topk].

    Samples are dealt to (rank, micro-batch) slots by `deal_sequences(order)`; each sample
    contributes its seq_len - 1 routed tokens (SGLang does not route the last, never-fed token).
    """
    shape = resolve_model(model)
    _check_ep(shape, ep)
    files = _expand(paths, (".pt", ".npz"))
    slots = {}
    for s, path in enumerate(files):
        samples = _sglang_samples(load_container(path), path, key)
        checked = []
        for i, x in enumerate(samples):
            if x.ndim != 3:
                raise TraceError(f"{path}: field {key!r} of sample {i} must be [seq_len-1, num_layers, topk], "
                                 f"got shape {x.shape}")
            if x.shape[1] != shape.num_layers:
                raise TraceError(f"{path}: field {key!r} of sample {i} has {x.shape[1]} layers (shape {x.shape}), "
                                 f"but model {shape.name!r} has {shape.num_layers} MoE layers")
            checked.append(check_ids(x[None], shape, path, key, ("sample", "token", "layer", "k"), offset=(i, 0, 0, 0))[0])
        rank, mb = deal_sequences(len(checked), ep, micro_batches, order, path)
        for r in range(ep):
            for m in range(micro_batches):
                seqs = np.nonzero((rank == r) & (mb == m))[0]
                slots[(s, m, r)] = np.concatenate([checked[i] for i in seqs], axis=0)
    provenance = {"importer": "sglang", "source": files[0] if len(files) == 1 else f"{len(files)} files",
                  "files": [os.path.basename(f) for f in files][:64], "order": order, "micro_batches": micro_batches}
    return assemble(slots, shape, ep, provenance, keep_tokens)


IMPORTERS = {
    "megatron-replay": import_megatron_replay,
    "megatron-jsonl": import_megatron_jsonl,
    "verl": import_verl,
    "sglang": import_sglang,
}


def import_trace(fmt: str, paths, **opts) -> RoutingTrace:
    """Dispatch to the importer of `fmt` (one of FORMATS); opts go to it (model, ep, ...)."""
    if fmt not in IMPORTERS:
        raise ConfigError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    return IMPORTERS[fmt](paths, **opts)
