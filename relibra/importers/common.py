"""What every importer shares: the model shape, reading files without pickle, checking ids,
checking route/token alignment, dealing sequences to slots, and a streaming trace builder.

Streaming: an importer reads its sources file by file and hands each file's token ids to a
`TraceBuilder`, which counts them at once into loads; the ids themselves are kept only when
keep_tokens=True. So an import with keep_tokens=False (`--loads-only`) holds at most one file's
token ids at a time.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import zipfile

import numpy as np

from relibra.cluster import ModelShape, get_model
from relibra.errors import ConfigError, TraceError
from relibra.trace import RoutingTrace, check_decoded_bytes, check_id_dtype, read_npz
from relibra.trace.io import parse_json, read_bounded

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


MAX_MODEL_JSON_BYTES = 1 << 20  # a model's config.json is a few kB; a ModelShape JSON under 1 kB


def model_from_json(path: str, where: str | None = None) -> ModelShape:
    """A ModelShape from a JSON file: the kit's ModelShape fields (as a trace's meta holds them; `name`
    defaults to the file's stem, every other key must be a field), or a Hugging Face config.json read by
    these keys (others ignored); errors start with `where` (default: the path):

    - MoE layers: num_hidden_layers less first_k_dense_replace (DeepSeek) dense layers; a
      decoder_sparse_step other than 1 or a non-empty mlp_only_layers (Qwen MoE) is refused: which
      layers are MoE is then not a count;
    - num_experts / n_routed_experts / num_local_experts; top_k: num_experts_per_tok;
    - hidden_size; moe_ffn: moe_intermediate_size, else intermediate_size (Mixtral's experts);
      n_shared_experts; dense_ffn: intermediate_size when there are dense layers;
    - num_attention_heads; num_key_value_heads (default: the heads); head_dim (default:
      hidden_size / heads); vocab_size. Multi-head latent attention (kv_lora_rank set) is shaped as the
      kit's deepseek-v3 preset shapes it: head_dim = v_head_dim and one KV head.
    """
    where = where or path
    try:
        with open(path, "rb") as fh:
            d = parse_json(read_bounded(fh, where, MAX_MODEL_JSON_BYTES, ConfigError), where)
    except OSError as exc:
        raise ConfigError(f"{where}: {exc.strerror}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: must be a JSON object, got {type(d).__name__}")
    fields = {f.name for f in dataclasses.fields(ModelShape)}
    stem = os.path.splitext(os.path.basename(path))[0]
    if "num_layers" in d or not {"num_hidden_layers", "hidden_size"} & set(d):
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ConfigError(f"{where}: unknown field {unknown[0]!r}; ModelShape fields: {', '.join(sorted(fields))}")
        try:
            return ModelShape.from_dict({"name": stem, **d})
        except TypeError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def need(*keys, default=None):
        for key in keys:
            if d.get(key) is not None:
                return d[key]
        if default is None:
            raise ConfigError(f"{where}: a Hugging Face config needs {' or '.join(map(repr, keys))}")
        return default

    if d.get("decoder_sparse_step", 1) != 1 or d.get("mlp_only_layers"):
        raise ConfigError(f"{where}: decoder_sparse_step / mlp_only_layers make only some layers MoE; write the "
                          f"kit's ModelShape JSON (num_layers = the MoE layers) instead")
    dense_layers = int(d.get("first_k_dense_replace") or 0)
    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    mla = d.get("kv_lora_rank") is not None
    shape = dict(
        name=str(d.get("_name_or_path") or d.get("model_type") or stem).rstrip("/").split("/")[-1] or stem,
        num_layers=need("num_hidden_layers") - dense_layers,
        num_experts=need("num_experts", "n_routed_experts", "num_local_experts"), top_k=need("num_experts_per_tok"),
        hidden=hidden, moe_ffn=need("moe_intermediate_size", "intermediate_size"),
        num_shared_experts=int(d.get("n_shared_experts") or 0), num_dense_layers=dense_layers,
        dense_ffn=int(d.get("intermediate_size") or 0) if dense_layers else 0, num_attention_heads=heads,
        num_kv_heads=1 if mla else need("num_key_value_heads", default=heads),
        head_dim=need("v_head_dim") if mla else need("head_dim", default=hidden // heads if isinstance(hidden, int)
                                                     and isinstance(heads, int) and heads else None),
        vocab_size=need("vocab_size"))
    try:
        return ModelShape(**shape)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


# ---- reading files -------------------------------------------------------------------------------
def expand_paths(paths, suffixes: tuple[str, ...]) -> list[str]:
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


def to_numpy(obj, path: str):
    """Tensors (also inside lists, tuples and dicts) -> numpy arrays; ints and strings kept."""
    import torch  # heavy: only .pt inputs need it

    if isinstance(obj, torch.Tensor):
        kind = str(obj.dtype).replace("torch.", "")
        if obj.layout != torch.strided:
            raise TraceError(f"{path}: holds a {str(obj.layout).replace('torch.', '')} tensor; save dense tensors")
        if obj.is_meta:
            raise TraceError(f"{path}: holds a meta tensor (a shape without data)")
        if obj.is_quantized:
            raise TraceError(f"{path}: holds a quantized {kind} tensor, not integer expert ids")
        if obj.is_complex():
            raise TraceError(f"{path}: holds a {kind} tensor, not integer expert ids")
        if obj.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds every value exactly
            obj = obj.float()
        try:
            return obj.detach().cpu().numpy()
        except (TypeError, RuntimeError):  # float8 and other dtypes numpy lacks
            raise TraceError(f"{path}: holds a {kind} tensor, which has no numpy form; ids are integers") from None
    if isinstance(obj, (list, tuple)):
        return [to_numpy(x, path) for x in obj]
    if isinstance(obj, dict):
        return {k: to_numpy(v, path) for k, v in obj.items()}
    return obj


def load_container(path: str):
    """Read a .pt (torch.load, weights_only=True) or .npz (relibra.trace.read_npz: no pickle, bounded) file.

    Returns, for .npz, a dict name -> array (every array read now, so corruption shows here); for
    .pt, the saved object with tensors turned into numpy arrays. Errors name the file.
    """
    if path.endswith(".npz"):
        return read_npz(path)  # headers checked and sizes bounded before anything is allocated
    if path.endswith(".pt") or path.endswith(".pth"):
        import torch  # heavy: only .pt inputs need it

        check_pt_size(path)
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            if "weights only" in str(exc).lower() or "weights_only" in str(exc).lower():
                raise TraceError(f"{path}: holds objects that need full pickle; this kit loads .pt files with "
                                 f"weights_only=True (save plain tensors, lists, dicts and ints)") from None
            raise TraceError(f"{path}: truncated or corrupted ({exc})") from None
        except Exception as exc:  # RuntimeError from a damaged zip archive, EOFError, ...
            raise TraceError(f"{path}: truncated or corrupted ({type(exc).__name__}: {exc})") from None
        return to_numpy(obj, path)
    raise TraceError(f"{path}: unknown file type; expected .pt or .npz")


# The pickled object tree of a .pt file (lists, dicts, ints) takes up to about this many bytes in memory per
# byte of pickle: an int pickles to 2-5 bytes and lives as a 28-byte object behind an 8-byte pointer.
PICKLE_BYTES_PER_BYTE = 16


def check_pt_size(path: str) -> None:
    """Bound a .pt file by the loader's limit (relibra.trace.max_trace_bytes) before torch.load reads it:
    the uncompressed sizes its zip archive declares (tensor storages, and the pickle at
    PICKLE_BYTES_PER_BYTE), or the file's own size for the legacy format."""
    if not zipfile.is_zipfile(path):
        check_decoded_bytes(os.path.getsize(path) * PICKLE_BYTES_PER_BYTE, path, "loading this legacy .pt file")
        return
    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise TraceError(f"{path}: truncated or corrupted ({exc})") from None
    total = sum(m.file_size * (PICKLE_BYTES_PER_BYTE if m.filename.endswith(".pkl") else 1) for m in members)
    check_decoded_bytes(total, path, f"loading the {len(members)} members of this .pt archive")


# ---- checking ids --------------------------------------------------------------------------------
def fmt_index(axes: tuple[str, ...], index) -> str:
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
    check_id_dtype(ids, where, field)  # integer dtypes only: bool, float and bfloat16 are refused
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
            raise TraceError(f"{where}: field {field!r} at {fmt_index(axes, first + off)} holds {ids[tuple(first)].item()!r}, "
                             f"not an integer expert id")
    bad = mask & ((ids < 0) | (ids >= model.num_experts))
    if bad.any():
        first = np.argwhere(bad)[0]
        value = ids[tuple(first)]
        kind = "a negative expert id" if value < 0 else "an expert id"
        raise TraceError(f"{where}: field {field!r} at {fmt_index(axes, first + off)} holds {kind} {int(value)}, "
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
        raise TraceError(f"{where}: field {field!r} at {fmt_index(axes[:-1], first + off[:-1])} repeats expert "
                         f"{value} within one token's top-k")
    return ids


# Counts and indices (steps, ranks, layers, tokens) are int64 wherever the kit holds them.
MAX_COUNT = np.iinfo(np.int64).max


def as_count(value, where: str, field: str, high: int = MAX_COUNT, why: str = "past int64, where counts are held") -> int:
    """A non-negative integer count or index (JSON int, numpy integer, or 0-d integer array) of at most
    `high` (`why` says what bounds it)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise TraceError(f"{where}: field {field!r} is {shown}, not an integer count")
    if value < 0:
        raise TraceError(f"{where}: field {field!r} is {int(value)}, a negative count")
    if value > high:
        shown = str(int(value)) if len(str(int(value))) <= 24 else f"{str(int(value))[:12]}... ({len(str(int(value)))} digits)"
        raise TraceError(f"{where}: field {field!r} is {shown}, above {high}: {why}")
    return int(value)


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


def check_ep(model: ModelShape, ep: int) -> None:
    if not isinstance(ep, (int, np.integer)) or ep <= 0:
        raise ConfigError(f"ep must be a positive integer, got {ep!r}")
    if model.num_experts % ep:
        raise ConfigError(f"ep={ep} does not divide the {model.num_experts} experts of {model.name!r}")


def natural_index(name: str) -> int:
    """The last number in a name (-1 when none): orders sample_2 before sample_10."""
    digits = re.findall(r"\d+", name)
    return int(digits[-1]) if digits else -1


def check_route_rows(rows: int, seq_len: int, where: str, what: str = "sequence") -> int:
    """Alignment of one sequence's routes with its tokens.

    A system routes every token it fed through the model: seq_len rows (a training forward) or
    seq_len - 1 rows (an inference engine, which never feeds the last sampled token). Anything
    else is an off-by-one bug upstream and raises TraceError naming the sequence. Returns rows.
    """
    if rows not in (seq_len, seq_len - 1):
        raise TraceError(f"{where}: {what} has {rows} route rows for {seq_len} tokens; routes must cover "
                         f"seq_len ({seq_len}) or seq_len - 1 ({seq_len - 1}) tokens, so routes and tokens "
                         f"are misaligned")
    return rows


def source_provenance(importer: str, files: list[str], **extra) -> dict:
    """The provenance every importer writes: importer name, source, up to 64 file names, options."""
    out = {"importer": importer, "source": files[0] if len(files) == 1 else f"{len(files)} files",
           "files": [os.path.basename(f) for f in files][:64]}
    out.update(extra)
    return out


# ---- streaming trace builder ---------------------------------------------------------------------
class TraceBuilder:
    """Counts token ids into loads as they arrive; keeps the ids only when keep_tokens.

    Slots are (step, micro_batch, rank) keys, any integers: steps and micro-batches are renumbered
    densely in sorted order by `finish`, ranks must lie in [0, ep). Layers are keys too (any
    sortable value), placed in the order `finish` is given, so a source whose layer numbering is
    known only at the end (megatron-core's decoder module indices) can still stream.
    """

    def __init__(self, num_experts: int, top_k: int, keep_tokens: bool = True):
        self.num_experts, self.top_k, self.keep_tokens = int(num_experts), int(top_k), keep_tokens
        self.counts: dict[tuple, dict] = {}  # slot -> layer key -> int64 [experts]
        self.tokens: dict[tuple, dict] = {}  # slot -> layer key -> token count
        self.ids: dict[tuple, dict] = {}  # slot -> layer key -> ids [tokens, top_k] (keep_tokens only)
        self.where: dict[tuple, str] = {}  # slot -> where its first ids came from (messages)

    def add_layer(self, slot: tuple[int, int, int], layer, ids: np.ndarray, where: str) -> None:
        """Checked ids [tokens, top_k] of one layer of one slot (a second add for it is an error)."""
        layers = self.counts.setdefault(slot, {})
        if layer in layers:
            raise TraceError(f"{where}: a second routing for step {slot[0]}, micro-batch {slot[1]}, rank {slot[2]}, "
                             f"layer {layer} (first from {self.where[slot]})")
        self.where.setdefault(slot, where)
        layers[layer] = np.bincount(ids.ravel().astype(np.int64), minlength=self.num_experts)
        self.tokens.setdefault(slot, {})[layer] = int(ids.shape[0])
        if self.keep_tokens:
            self.ids.setdefault(slot, {})[layer] = ids

    def add_slot(self, slot: tuple[int, int, int], ids: np.ndarray, where: str) -> None:
        """Checked ids [tokens, layers, top_k] of every layer of one slot; layer keys 0..layers-1."""
        for layer in range(ids.shape[1]):
            self.add_layer(slot, layer, ids[:, layer], where)

    def extend_slot(self, slot: tuple[int, int, int], ids: np.ndarray, where: str) -> None:
        """Append tokens [tokens, layers, top_k] to a slot (sequences arriving one by one)."""
        if slot not in self.counts:
            self.add_slot(slot, ids, where)
            return
        layers = self.counts[slot]
        if len(layers) != ids.shape[1]:
            raise TraceError(f"{where}: {ids.shape[1]} layers, but earlier sequences of the same slot have {len(layers)}")
        for layer in range(ids.shape[1]):
            layers[layer] += np.bincount(ids[:, layer].ravel().astype(np.int64), minlength=self.num_experts)
            self.tokens[slot][layer] += int(ids.shape[0])
            if self.keep_tokens:
                self.ids[slot][layer] = np.concatenate([self.ids[slot][layer], ids[:, layer]])

    def layer_keys(self) -> list:
        return sorted({k for layers in self.counts.values() for k in layers})

    def finish(self, model: ModelShape, ep: int, provenance: dict, layer_order: list | None = None,
               source: str = "input", layer_name=str) -> RoutingTrace:
        """The trace: every (step, micro-batch, rank) and every layer must be present.

        layer_order: layer keys in MoE layer order (default: sorted keys); its length must equal
        model.num_layers. Renumbered step / micro-batch keys go to provenance["steps"] and
        ["micro_batch_keys"] when they were not already 0..n-1.
        """
        if not self.counts:
            raise TraceError(f"{source}: holds no routing records")
        order = self.layer_keys() if layer_order is None else list(layer_order)
        if len(order) != model.num_layers:
            raise TraceError(f"{source}: holds {len(order)} MoE layers, but model {model.name!r} has {model.num_layers}")
        steps = sorted({s for s, _, _ in self.counts})
        mbs = {s: sorted({m for s2, m, _ in self.counts if s2 == s}) for s in steps}
        if len({len(v) for v in mbs.values()}) > 1:
            raise TraceError(f"{source}: steps hold different numbers of micro-batches "
                             f"{ {s: len(v) for s, v in mbs.items()} }")
        ranks = sorted({r for _, _, r in self.counts})
        if ranks[-1] >= ep:
            raise TraceError(f"{source}: field 'rank' is {ranks[-1]}, outside the EP group [0, {ep})")
        num_mb = len(mbs[steps[0]])
        l_, e = len(order), self.num_experts
        loads = np.zeros((len(steps), num_mb, l_, ep, e), dtype=np.int32)
        mb_tokens = np.zeros((len(steps), num_mb), dtype=np.int64)
        for si, s in enumerate(steps):
            for mi, m in enumerate(mbs[s]):
                for r in range(ep):
                    slot = (s, m, r)
                    if slot not in self.counts:
                        raise TraceError(f"{source}: no routing for step {s}, micro-batch {m}, rank {r}; every "
                                         f"(step, micro-batch, rank) must be present")
                    layers, tokens = self.counts[slot], self.tokens[slot]
                    missing = [k for k in order if k not in layers]
                    if missing:
                        raise TraceError(f"{self.where[slot]}: step {s}, micro-batch {m}, rank {r} has routing for "
                                         f"{len(layers)} of {l_} MoE layers; layer {layer_name(missing[0])} is missing")
                    n0 = tokens[order[0]]
                    for k in order:
                        if tokens[k] != n0:
                            raise TraceError(f"{self.where[slot]}: step {s}, micro-batch {m}, rank {r}: layer {layer_name(k)} "
                                             f"routes {tokens[k]} tokens but layer {layer_name(order[0])} routes {n0}; every "
                                             f"layer sees the same tokens")
                    loads[si, mi, :, r] = np.stack([layers[k] for k in order])
                    mb_tokens[si, mi] += n0
        if mb_tokens.max() == 0:
            raise TraceError(f"{source}: holds no tokens")
        te = tsr = None
        if self.keep_tokens:
            width = int(mb_tokens.max())
            dtype = np.int16 if e <= np.iinfo(np.int16).max else np.int32
            check_padding(mb_tokens, l_, self.top_k, np.dtype(dtype).itemsize, source)
            te = np.full((len(steps), num_mb, width, l_, self.top_k), -1, dtype=dtype)
            tsr = np.full((len(steps), num_mb, width), -1, dtype=np.int16 if ep <= np.iinfo(np.int16).max else np.int32)
            for si, s in enumerate(steps):
                for mi, m in enumerate(mbs[s]):
                    fill = 0
                    for r in range(ep):
                        ids = np.stack([self.ids[(s, m, r)][k] for k in order], axis=1)  # [tokens, L, K]
                        te[si, mi, fill: fill + ids.shape[0]] = ids
                        tsr[si, mi, fill: fill + ids.shape[0]] = r
                        fill += ids.shape[0]
        provenance = dict(provenance)
        if steps != list(range(len(steps))):
            provenance.setdefault("steps", steps)
        return RoutingTrace(loads, model, ep, int(mb_tokens.max()), provenance, te, tsr)


# Token-level ids are stored padded to the widest micro-batch ([steps, micro_batches, widest, layers, k]).
# Ragged micro-batches may make that padding this many times the ids themselves, beyond PAD_FREE_BYTES.
PAD_MAX_FACTOR = 4
PAD_FREE_BYTES = 64 << 20


def check_padding(mb_tokens: np.ndarray, layers: int, top_k: int, id_bytes: int, source: str) -> None:
    """Refuse, before allocating, token-level ids whose padding to the widest micro-batch would take more
    than PAD_MAX_FACTOR times the ids (and more than PAD_FREE_BYTES), or more than the loader's limit.
    mb_tokens: int [steps, micro_batches] tokens of each micro-batch."""
    per_token = layers * top_k * id_bytes + 4  # the ids and the token's source rank
    held = int(mb_tokens.sum()) * per_token
    padded = int(mb_tokens.size) * int(mb_tokens.max()) * per_token
    if padded > PAD_FREE_BYTES and padded > PAD_MAX_FACTOR * held:
        raise TraceError(f"{source}: micro-batches are ragged (widest {int(mb_tokens.max())} tokens, mean "
                         f"{float(mb_tokens.mean()):.0f}); their token-level ids padded to the widest would take "
                         f"{padded} bytes for {held} bytes of ids (over {PAD_MAX_FACTOR}x); import with --loads-only "
                         f"(keep_tokens=False: exact counts, no ids)")
    check_decoded_bytes(padded, source, "the token-level ids padded to the widest micro-batch")


def assemble(slots: dict[tuple[int, int, int], np.ndarray], model: ModelShape, ep: int, provenance: dict,
             keep_tokens: bool = True) -> RoutingTrace:
    """A trace from checked ids per slot: (step, micro_batch, rank) -> int [tokens, layers, top_k]."""
    builder = TraceBuilder(model.num_experts, model.top_k, keep_tokens)
    for slot in sorted(slots):
        builder.add_slot(slot, slots[slot], provenance.get("source", "input"))
    return builder.finish(model, ep, provenance, source=provenance.get("source", "input"))


# ---- per-sequence sources (SGLang, vLLM, slime) --------------------------------------------------
def check_sequence(ids, model: ModelShape, where: str, field: str, index: int, seq_len: int | None) -> np.ndarray:
    """One sequence's routes [rows, layers, top_k]: shape, ids, and (when seq_len is known) alignment."""
    ids = np.asarray(ids)
    if ids.ndim != 3:
        raise TraceError(f"{where}: field {field!r} of sample {index} must be [rows, num_layers, topk], got shape {ids.shape}")
    if ids.shape[1] != model.num_layers:
        raise TraceError(f"{where}: field {field!r} of sample {index} has {ids.shape[1]} layers (shape {ids.shape}), "
                         f"but model {model.name!r} has {model.num_layers} MoE layers")
    if seq_len is not None:
        check_route_rows(ids.shape[0], seq_len, where, f"sample {index}")
    return check_ids(ids[None], model, where, field, ("sample", "token", "layer", "k"), offset=(index, 0, 0, 0))[0]


def import_sequences(files: list[str], read, model: ModelShape, ep: int, micro_batches: int, order: str,
                     keep_tokens: bool, provenance: dict) -> RoutingTrace:
    """One step per file; `read(path)` -> list of checked per-sequence ids [rows, layers, top_k].

    The file's sequences are dealt to (rank, micro-batch) slots by `deal_sequences(order)`. Files
    are read one at a time, so only one file's ids are held unless keep_tokens.
    """
    builder = TraceBuilder(model.num_experts, model.top_k, keep_tokens)
    for s, path in enumerate(files):
        seqs = read(path)
        if not seqs:
            raise TraceError(f"{path}: holds no samples")
        rank, mb = deal_sequences(len(seqs), ep, micro_batches, order, path)
        for r in range(ep):
            for m in range(micro_batches):
                chosen = np.nonzero((rank == r) & (mb == m))[0]
                builder.add_slot((s, m, r), np.concatenate([seqs[i] for i in chosen], axis=0), path)
        del seqs
    return builder.finish(model, ep, provenance, source=provenance.get("source", "input"))


def numbered_arrays(obj, path: str, prefix: str) -> dict[int, np.ndarray]:
    """Arrays named `{prefix}{i}` in an .npz (or a dict), keyed by i."""
    if not isinstance(obj, dict):
        raise TraceError(f"{path}: expected arrays named {prefix}0, {prefix}1, ...; got {type(obj).__name__}")
    out = {}
    for name, value in obj.items():
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            out[int(name[len(prefix):])] = value
    return out


def sequence_length(value, path: str, field: str) -> int:
    """A sequence length stored as a 0-d integer array, or as the 1-d token ids themselves."""
    value = np.asarray(value)
    if value.ndim == 1:
        return int(value.shape[0])
    return as_count(value, path, field)
