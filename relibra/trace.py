"""Routing traces: which experts every micro-batch's tokens were routed to, per layer.

The central array is `loads[step, micro_batch, layer, src_rank, expert]`: how many of the tokens
that sit on EP rank `src_rank` before dispatch chose `expert` in `layer` (each token counts once per
expert of its top-k, so a layer's loads sum to tokens x top_k). Optionally a trace also keeps
token-level ids: `token_experts[step, micro_batch, token, layer, k]` with `token_src_rank[step,
micro_batch, token]`, padded with -1 where a micro-batch holds fewer tokens.

On disk a trace is one `.npz` (loaded with allow_pickle=False) holding `format_version`, `loads`,
`meta_json` and, when present, the token-level arrays. The loader trusts no size it reads: every
array's declared shape and dtype come from its .npy header and are bounded (`max_bytes`, default
DEFAULT_MAX_TRACE_BYTES, raised with the environment variable RELIBRA_MAX_TRACE_BYTES) before
anything is allocated; see docs/traces.md, "What the loader refuses".
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import sys
import zipfile
from dataclasses import dataclass, field

import numpy as np

from relibra.cluster import ModelShape
from relibra.errors import ConfigError, TraceError

FORMAT_VERSION = 1
TRACE_FIELDS = ("format_version", "loads", "meta_json", "token_experts", "token_src_rank", "seq_lens")
META_KEYS = ("model", "ep", "tokens_per_microbatch", "provenance")
DEFAULT_MAX_TRACE_BYTES = 8 * 2**30  # decoded bytes of all arrays of one file
MAX_TRACE_BYTES_ENV = "RELIBRA_MAX_TRACE_BYTES"
_INT32_MAX = int(np.iinfo(np.int32).max)
_ID_DTYPE_HINT = "ids must have an integer dtype (bool, float and bfloat16 are refused: bfloat16 rounds ids above 256)"


@dataclass
class RoutingTrace:
    """Per-(step, micro-batch, layer, src_rank, expert) token counts, plus metadata.

    loads: int32 [steps, micro_batches, layers, ep, experts].
    model: the model's shape; layers and experts must match loads.
    ep: expert-parallel size (number of src ranks).
    tokens_per_microbatch: nominal tokens of one micro-batch over all EP ranks (before top-k).
    provenance: where the trace came from, e.g. {"generator": "workloads", "seed": 0} or
        {"importer": "verl", "source": "rollout.pt"}; JSON-serializable.
    token_experts: optional int16/int32 [steps, micro_batches, tokens, layers, top_k], -1 padded.
    token_src_rank: optional int16/int32 [steps, micro_batches, tokens], -1 where padded.
    seq_lens: optional int32 [steps, micro_batches, ep, max_seqs]: lengths in tokens of the sequences
        (or pieces of sequences) each src rank holds in each micro-batch, 0-padded; a slot's lengths
        sum to its token count (layer-0 loads / top_k). For attention costs.
    """

    loads: np.ndarray
    model: ModelShape
    ep: int
    tokens_per_microbatch: int
    provenance: dict = field(default_factory=dict)
    token_experts: np.ndarray | None = None
    token_src_rank: np.ndarray | None = None
    seq_lens: np.ndarray | None = None

    def __post_init__(self):
        self.validate()

    # ---- shape -------------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        return self.loads.shape[0]

    @property
    def num_microbatches(self) -> int:
        return self.loads.shape[1]

    @property
    def num_layers(self) -> int:
        return self.loads.shape[2]

    @property
    def num_experts(self) -> int:
        return self.loads.shape[4]

    def validate(self, where: str = "trace") -> None:
        """Raise TraceError naming the field and first offending index of any inconsistency."""
        loads = self.loads
        if not isinstance(loads, np.ndarray) or loads.ndim != 5:
            raise TraceError(f"{where}: field 'loads' must be a 5-d array [step, micro_batch, layer, src_rank, expert], "
                             f"got shape {getattr(loads, 'shape', None)}")
        if loads.dtype.kind not in "iuf":  # bool, strings, objects, complex
            raise TraceError(f"{where}: field 'loads' has dtype {loads.dtype}; counts must be integers")
        if min(loads.shape) == 0:
            raise TraceError(f"{where}: field 'loads' is empty (shape {loads.shape})")
        if loads.dtype.kind == "f":
            bad = ~np.isfinite(loads) | (loads != np.round(loads))
            if bad.any():
                first = _first(bad)
                raise TraceError(f"{where}: field 'loads' holds a non-integer count {loads[first].item()!r} at index {first}")
        # Range checks on the stored dtype, before any cast (a cast to int32 would wrap -4294967295 to 1).
        if (loads < 0).any():
            first = _first(loads < 0)
            raise TraceError(f"{where}: field 'loads' has a negative count at index {first}: {_num(loads[first])}")
        if loads.dtype != np.int32 and (loads > _INT32_MAX).any():
            first = _first(loads > _INT32_MAX)
            raise TraceError(f"{where}: field 'loads' holds {_num(loads[first])} at index {first}, beyond int32 "
                             f"({_INT32_MAX}); counts must fit int32")
        if loads.dtype != np.int32:
            self.loads = loads = loads.astype(np.int32)
        _check_int(self.ep, where, "ep", 1)
        _check_int(self.tokens_per_microbatch, where, "tokens_per_microbatch", 1)
        if not isinstance(self.model, ModelShape):
            raise TraceError(f"{where}: field 'model' must be a ModelShape, got {type(self.model).__name__}")
        if loads.shape[2] != self.model.num_layers:
            raise TraceError(f"{where}: field 'loads' has {loads.shape[2]} layers but model {self.model.name!r} "
                             f"has {self.model.num_layers}")
        if loads.shape[4] != self.model.num_experts:
            raise TraceError(f"{where}: field 'loads' has {loads.shape[4]} experts but model {self.model.name!r} "
                             f"has {self.model.num_experts}")
        if loads.shape[3] != self.ep:
            raise TraceError(f"{where}: field 'loads' has {loads.shape[3]} src ranks but ep={self.ep}")
        if self.model.num_experts % self.ep:
            raise TraceError(f"{where}: ep={self.ep} does not divide num_experts={self.model.num_experts}")
        # Every layer of a (step, micro_batch, src) sees the same tokens, so tokens x top_k per layer agree.
        per_layer = loads.sum(axis=4, dtype=np.int64)  # [S, M, L, ep]
        if (per_layer % self.model.top_k).any():
            first = tuple(int(i) for i in np.argwhere(per_layer % self.model.top_k)[0])
            raise TraceError(f"{where}: field 'loads' at [step, micro_batch, layer, src_rank]={first} sums to "
                             f"{int(per_layer[first])}, not a multiple of top_k={self.model.top_k}")
        mismatch = per_layer != per_layer[:, :, :1, :]
        if mismatch.any():
            s, m, l, r = (int(i) for i in np.argwhere(mismatch)[0])
            raise TraceError(f"{where}: field 'loads' layer {l} of [step={s}, micro_batch={m}, src_rank={r}] "
                             f"routes {int(per_layer[s, m, l, r])} token-slots but layer 0 routes "
                             f"{int(per_layer[s, m, 0, r])}; layers must see the same tokens")
        # tokens_per_microbatch is nominal (the largest, or the mean, micro-batch), so it must lie
        # within the micro-batch sizes the loads hold (1 allowed when every micro-batch is empty).
        mb_tokens = per_layer[:, :, 0, :].sum(axis=2) // self.model.top_k  # [S, M]
        lo, hi = int(mb_tokens.min()), int(mb_tokens.max())
        if not lo <= self.tokens_per_microbatch <= max(hi, 1):
            raise TraceError(f"{where}: field 'tokens_per_microbatch' is {self.tokens_per_microbatch}, but the "
                             f"micro-batches in 'loads' hold {lo} to {hi} tokens (layer-0 counts / top_k); it must "
                             f"lie in that range")
        if (self.token_experts is None) != (self.token_src_rank is None):
            raise TraceError(f"{where}: 'token_experts' and 'token_src_rank' must be given together")
        if self.token_experts is not None:
            self._validate_tokens(where)
        if self.seq_lens is not None:
            self._validate_seq_lens(where, per_layer[:, :, 0, :] // self.model.top_k)

    def _validate_seq_lens(self, where: str, slot_tokens: np.ndarray) -> None:
        """seq_lens: integers >= 0, shape [steps, micro_batches, ep, n], each slot summing to its tokens."""
        sl = self.seq_lens
        s, m = self.loads.shape[:2]
        if not isinstance(sl, np.ndarray) or sl.ndim != 4 or sl.shape[:3] != (s, m, self.ep):
            raise TraceError(f"{where}: field 'seq_lens' must have shape [{s}, {m}, {self.ep}, max_seqs], "
                             f"got {getattr(sl, 'shape', None)}")
        if sl.dtype.kind not in "iu":
            raise TraceError(f"{where}: field 'seq_lens' has dtype {sl.dtype}; lengths must be integers")
        if (sl < 0).any():
            first = _first(sl < 0)
            raise TraceError(f"{where}: field 'seq_lens' at [step, micro_batch, src_rank, seq]={first} is "
                             f"{_num(sl[first])}; lengths must be >= 0")
        if (sl > _INT32_MAX).any():
            first = _first(sl > _INT32_MAX)
            raise TraceError(f"{where}: field 'seq_lens' at {first} holds {_num(sl[first])}, beyond int32")
        total = sl.sum(axis=3, dtype=np.int64)
        bad = total != slot_tokens
        if bad.any():
            first = _first(bad)
            raise TraceError(f"{where}: field 'seq_lens' at [step, micro_batch, src_rank]={first} sums to "
                             f"{int(total[first])} tokens but that slot holds {int(slot_tokens[first])} "
                             f"(layer-0 loads / top_k)")
        if sl.dtype != np.int32:
            self.seq_lens = sl.astype(np.int32)

    def _validate_tokens(self, where: str) -> None:
        te, tsr = self.token_experts, self.token_src_rank
        s, m, l, _, e = self.loads.shape
        k = self.model.top_k
        check_id_dtype(te, where, "token_experts")
        check_id_dtype(tsr, where, "token_src_rank")
        if te.ndim != 5 or te.shape[:2] != (s, m) or te.shape[3:] != (l, k):
            raise TraceError(f"{where}: field 'token_experts' must have shape [{s}, {m}, tokens, {l}, {k}], got {te.shape}")
        if tsr.shape != te.shape[:3]:
            raise TraceError(f"{where}: field 'token_src_rank' must have shape {te.shape[:3]}, got {tsr.shape}")
        valid = tsr >= 0
        bad_src = (tsr >= self.ep) | (tsr < -1)
        if bad_src.any():
            first = _first(bad_src)
            raise TraceError(f"{where}: field 'token_src_rank' at {first} holds {_num(tsr[first])}, outside "
                             f"[0, ep={self.ep}) and not the padding -1")
        pad = (te != -1) & ~valid[..., None, None]
        if pad.any():
            first = _first(pad)
            raise TraceError(f"{where}: field 'token_experts' at {first} holds {_num(te[first])} for a padded token "
                             f"(token_src_rank -1); padding must be -1")
        ids = te[valid]  # [n, L, K]
        if ((ids < 0) | (ids >= e)).any():
            bad = np.argwhere(((te < 0) | (te >= e)) & valid[..., None, None])[0]
            raise TraceError(f"{where}: field 'token_experts' at {tuple(int(i) for i in bad)} holds "
                             f"{int(te[tuple(bad)])}, outside [0, {e})")
        srt = np.sort(ids, axis=-1)
        if (srt[..., 1:] == srt[..., :-1]).any():
            dup = np.sort(te, axis=-1)
            dmask = (dup[..., 1:] == dup[..., :-1]).any(-1) & valid[..., None]
            raise TraceError(f"{where}: field 'token_experts' repeats an expert within one token's top-k at "
                             f"[step, micro_batch, token, layer]={tuple(int(i) for i in np.argwhere(dmask)[0])}")
        if not np.array_equal(loads_from_tokens(te, tsr, self.ep, e), self.loads):
            raise TraceError(f"{where}: field 'loads' disagrees with the counts of 'token_experts'")

    # ---- derived views -----------------------------------------------------------------------
    def expert_load(self) -> np.ndarray:
        """Tokens per expert, summed over src ranks: int64 [steps, micro_batches, layers, experts]."""
        return self.loads.sum(axis=3, dtype=np.int64)

    def step_expert_load(self) -> np.ndarray:
        """Whole-step tokens per expert: int64 [steps, layers, experts]."""
        return self.loads.sum(axis=(1, 3), dtype=np.int64)

    def rank_load(self, placement: np.ndarray | None = None) -> np.ndarray:
        """Tokens computed per EP rank when every expert runs only at its home.

        placement: int [layers, experts] home rank of each expert; None = static contiguous.
        Returns int64 [steps, micro_batches, layers, ep].
        """
        if placement is None:
            placement = static_placement(self.num_layers, self.num_experts, self.ep)
        return rank_load(self.expert_load(), placement, self.ep)

    def static_skewness(self) -> float:
        """Mean over (step, micro_batch, layer) of max/mean tokens per rank under static placement."""
        return float(skewness(self.rank_load()).mean())

    def stats(self) -> dict:
        """Summary statistics as plain JSON-serializable numbers (see `shift_stats`).

        Computed in blocks of steps and layers (STATS_BLOCK_BYTES), never as whole-trace float copies,
        so memory stays near the size of the loads themselves.
        """
        s, m, l, ep, e = self.loads.shape
        skew = np.empty((s, m, l))
        rows = _block_rows(m * l * e * 8, s)
        for s0 in range(0, s, rows):  # static contiguous placement: rank r homes experts [r E/ep, (r+1) E/ep)
            per_rank = self.loads[s0:s0 + rows].reshape(-1, m, l, ep, ep, e // ep).sum(axis=(3, 5), dtype=np.int64)
            skew[s0:s0 + rows] = skewness(per_rank)
        out = {
            "model": self.model.name,
            "ep": self.ep,
            "steps": self.num_steps,
            "micro_batches": self.num_microbatches,
            "layers": self.num_layers,
            "experts": self.num_experts,
            "top_k": self.model.top_k,
            "tokens_per_microbatch": self.tokens_per_microbatch,
            "total_tokens": int(self.loads[:, :, 0].sum(dtype=np.int64) // self.model.top_k),
            "static_skewness": float(skew.mean()),
            "static_skewness_p95": float(np.percentile(skew, 95)),
            "provenance": self.provenance,
        }
        out.update(_shift_stats(lambda s0, s1, l0, l1: self.loads[s0:s1, :, l0:l1].sum(axis=3, dtype=np.int64),
                                (s, m, l, e)))
        return out

    # ---- disk --------------------------------------------------------------------------------
    def meta(self) -> dict:
        return {
            "model": self.model.to_dict(),
            "ep": int(self.ep),
            "tokens_per_microbatch": int(self.tokens_per_microbatch),
            "provenance": self.provenance,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write one compressed .npz; `load` gives back an identical trace."""
        arrays = {
            "format_version": np.array(FORMAT_VERSION, dtype=np.int64),
            "loads": self.loads,
            "meta_json": np.array(json.dumps(self.meta(), sort_keys=True)),
        }
        if self.token_experts is not None:
            arrays["token_experts"] = self.token_experts
            arrays["token_src_rank"] = self.token_src_rank
        if self.seq_lens is not None:
            arrays["seq_lens"] = self.seq_lens
        path = os.fspath(path)
        if not path.endswith(".npz"):
            raise TraceError(f"{path}: a trace file must end in .npz")
        from relibra.paths import atomic_open, check_output_path

        check_output_path(path, kind="file", flag="trace file")
        with atomic_open(path, "wb") as f:
            np.savez_compressed(f, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike, max_bytes: int | None = None) -> "RoutingTrace":
        """Read a trace written by `save`; every problem is a TraceError naming the file and field.

        max_bytes: the most decoded bytes all arrays of the file may declare (default: the
        environment variable RELIBRA_MAX_TRACE_BYTES, else DEFAULT_MAX_TRACE_BYTES = 8 GiB).
        """
        path = os.fspath(path)
        arrays = read_npz(path, max_bytes=max_bytes, fields=TRACE_FIELDS)
        for need in ("format_version", "loads", "meta_json"):
            if need not in arrays:
                raise TraceError(f"{path}: field {need!r} is missing; not a relibra trace")
        _check_format_version(arrays["format_version"], path)
        if arrays["loads"].dtype.kind not in "iu":  # a float count may already have been rounded
            raise TraceError(f"{path}: field 'loads' has dtype {arrays['loads'].dtype}; a trace file stores integer "
                             f"counts (int32)")
        model, ep, tpm, provenance = _parse_meta(arrays["meta_json"], path, max_bytes)
        for name in ("token_experts", "token_src_rank"):
            if name in arrays:
                check_id_dtype(arrays[name], path, name)
        obj = cls.__new__(cls)  # validate with the file's name in every message
        obj.loads, obj.model, obj.ep, obj.tokens_per_microbatch = arrays["loads"], model, ep, tpm
        obj.provenance = provenance
        obj.token_experts, obj.token_src_rank = arrays.get("token_experts"), arrays.get("token_src_rank")
        obj.seq_lens = arrays.get("seq_lens")
        obj.validate(path)
        if not obj.loads.any():  # nothing to balance; every consumer would fail later, further from the cause
            raise TraceError(f"{path}: field 'loads' is all zero; the trace routes no tokens")
        return obj

    def select_steps(self, steps: slice | list[int]) -> "RoutingTrace":
        """A trace holding only the given steps.

        tokens_per_microbatch is kept, or, where it lies outside the kept micro-batches' token
        counts (an imported trace's largest micro-batch was in a dropped step), set to the nearest
        of them, so that the sub-trace validates.
        """
        te = self.token_experts[steps] if self.token_experts is not None else None
        tsr = self.token_src_rank[steps] if self.token_src_rank is not None else None
        loads = self.loads[steps]
        tpm = self.tokens_per_microbatch
        if loads.size:
            mb_tokens = loads[:, :, 0].sum(axis=(2, 3), dtype=np.int64) // self.model.top_k
            tpm = min(max(tpm, int(mb_tokens.min())), max(int(mb_tokens.max()), 1))
        sl = self.seq_lens[steps] if self.seq_lens is not None else None
        return RoutingTrace(loads, self.model, self.ep, tpm, dict(self.provenance), te, tsr, sl)


# ---- checks shared with the importers -------------------------------------------------------------
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


def parse_json(text: bytes | str, where: str, max_bytes: int | None = None):
    """Untrusted JSON -> Python objects, or one TraceError naming `where`.

    Refused: text whose parsed objects could pass the loader's limit (JSON_BYTES_PER_CHAR per
    character), text that is not UTF-8 or not JSON, nesting deeper than the parser's recursion limit,
    a key repeated within one object (JSON leaves it undefined; Python would keep the last silently),
    and NaN / Infinity (not JSON).
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

    try:
        return json.loads(text, object_pairs_hook=unique_keys, parse_constant=no_constant)
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
def static_placement(num_layers: int, num_experts: int, ep: int) -> np.ndarray:
    """Megatron's static contiguous placement: expert e lives on rank e // (E/ep). int64 [layers, experts]."""
    if num_experts % ep:
        raise TraceError(f"ep={ep} does not divide num_experts={num_experts}")
    return np.broadcast_to(np.arange(num_experts) // (num_experts // ep), (num_layers, num_experts)).copy()


def rank_load(expert_load: np.ndarray, placement: np.ndarray, ep: int) -> np.ndarray:
    """Tokens per rank with each expert at its home.

    expert_load: [..., layers, experts]; placement: int [layers, experts]. Returns int64 [..., layers, ep].
    """
    lead = expert_load.shape[:-2]
    layers, experts = expert_load.shape[-2:]
    flat = expert_load.reshape(-1, layers * experts)
    rows = flat.shape[0]
    idx = (np.arange(layers)[:, None] * ep + np.asarray(placement, dtype=np.int64)).ravel()  # layer*ep + rank
    # One bincount over every row at once: bin = row * L*ep + layer*ep + rank. Counts are integers
    # far below 2**53, so the float64 weights bincount uses are exact.
    bins = (np.arange(rows, dtype=np.int64)[:, None] * (layers * ep) + idx[None]).ravel()
    out = np.bincount(bins, weights=flat.ravel(), minlength=rows * layers * ep)
    return np.rint(out).astype(np.int64).reshape(*lead, layers, ep)


def skewness(per_rank: np.ndarray) -> np.ndarray:
    """max / mean over the last axis (1.0 where a row is all zero)."""
    per_rank = np.asarray(per_rank, dtype=np.float64)
    mean = per_rank.mean(axis=-1)
    mx = per_rank.max(axis=-1)
    return np.where(mean > 0, mx / np.where(mean > 0, mean, 1.0), 1.0)


def hot_overlap(a: np.ndarray, b: np.ndarray, frac: float = 0.1) -> np.ndarray:
    """Share of a's hottest `frac` experts that are also among b's hottest. [..., E] -> [...].

    Memory: a few arrays of a's size (b's hottest marked in a boolean mask, looked up at a's hottest).
    """
    a, b = np.broadcast_arrays(a, b)
    e = a.shape[-1]
    k = max(1, int(round(frac * e)))
    ta = np.argsort(-a, axis=-1, kind="stable")[..., :k]
    tb = np.argsort(-b, axis=-1, kind="stable")[..., :k]
    hot_b = np.zeros(a.shape, dtype=bool)
    np.put_along_axis(hot_b, tb, True, axis=-1)
    return np.take_along_axis(hot_b, ta, axis=-1).sum(-1) / k


def load_correlation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of load vectors along the last axis ([..., E] -> [...]); 0 where constant."""
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    return np.where(den > 0, (a * b).sum(-1) / np.where(den > 0, den, 1.0), 0.0)


def history_prediction(step_load: np.ndarray, window: int) -> np.ndarray:
    """Moving-average prediction of each step's load from the `window` steps before it.

    step_load: [steps, ...]. Returns [steps - 1, ...] predictions for steps 1.. (step 0 has no history).
    """
    cums = np.cumsum(step_load.astype(np.float64), axis=0)
    preds = []
    for s in range(1, step_load.shape[0]):
        lo = max(0, s - window)
        total = cums[s - 1] - (cums[lo - 1] if lo > 0 else 0)
        preds.append(total / (s - lo))
    return np.stack(preds)


# Working memory of one block of trace statistics (float64 loads of some steps x layers; the
# temporaries of one block take a few times this).
STATS_BLOCK_BYTES = 32 * 2**20


def _block_rows(bytes_per_row: int, rows: int) -> int:
    """How many rows of `bytes_per_row` fit STATS_BLOCK_BYTES (at least 1, at most `rows`)."""
    return int(max(1, min(rows, STATS_BLOCK_BYTES // max(bytes_per_row, 1))))


def shift_stats(expert_load: np.ndarray, hot_frac: float = 0.1, history_window: int = 4) -> dict:
    """How far hot experts move, from expert loads [steps, micro_batches, layers, experts].

    - mb_hot_overlap / mb_corr: consecutive micro-batches of one step.
    - mb_vs_step_hot_overlap / mb_vs_step_corr: a micro-batch against its own step's total.
    - step_hot_overlap / step_corr: consecutive whole steps.
    - history_hot_overlap / history_corr: a step against the moving average of up to
      `history_window` previous steps (what a history-based balancer such as EPLB predicts from).
    - history_mb_hot_overlap: each micro-batch against that history prediction.
    Values are means; NaN where the trace is too short (one step, one micro-batch). Computed in blocks
    of steps and layers (STATS_BLOCK_BYTES).
    """
    return _shift_stats(lambda s0, s1, l0, l1: expert_load[s0:s1, :, l0:l1], expert_load.shape, hot_frac,
                        history_window)


def _shift_stats(block, shape: tuple, hot_frac: float = 0.1, history_window: int = 4) -> dict:
    """shift_stats over `block(s0, s1, l0, l1)` -> expert loads [s1 - s0, M, l1 - l0, E], taken a block of
    layers at a time and, within it, a block of steps at a time; the last `history_window` step totals of a
    layer block are carried from one step block to the next."""
    steps, mbs, layers, experts = shape
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}

    def add(key: str, values: np.ndarray) -> None:
        sums[key] = sums.get(key, 0.0) + float(values.sum())
        counts[key] = counts.get(key, 0) + values.size

    per_step_layer = mbs * experts * 8 * 4  # float64 loads and the block's temporaries
    cl = _block_rows(per_step_layer, layers)
    cs = _block_rows(per_step_layer * cl, steps)
    for l0 in range(0, layers, cl):
        l1 = min(layers, l0 + cl)
        history = np.zeros((0, l1 - l0, experts))  # the step totals before this block, at most history_window
        for s0 in range(0, steps, cs):
            s1 = min(steps, s0 + cs)
            el = block(s0, s1, l0, l1).astype(np.float64)  # [cs, M, cl, E]
            step = el.sum(axis=1)  # [cs, cl, E]
            if mbs > 1:
                add("mb_hot_overlap", hot_overlap(el[:, 1:], el[:, :-1], hot_frac))
                add("mb_corr", load_correlation(el[:, 1:], el[:, :-1]))
            add("mb_vs_step_hot_overlap", hot_overlap(el, step[:, None], hot_frac))
            add("mb_vs_step_corr", load_correlation(el, step[:, None]))
            series = np.concatenate([history, step])  # the carried totals, then this block's
            first = len(history) if s0 else 1  # step 0 has no predecessor
            if len(series) > first:
                now, before = series[first:], series[first - 1:-1]
                pred = history_prediction(series, history_window)[first - 1:]  # [n, cl, E]
                add("step_hot_overlap", hot_overlap(now, before, hot_frac))
                add("step_corr", load_correlation(now, before))
                add("history_hot_overlap", hot_overlap(now, pred, hot_frac))
                add("history_corr", load_correlation(now, pred))
                add("history_mb_hot_overlap", hot_overlap(el[first - len(history):], pred[:, None], hot_frac))
            history = series[-history_window:]
    out: dict[str, float] = {"hot_frac": hot_frac, "history_window": history_window}
    for key in ("mb_hot_overlap", "mb_corr", "mb_vs_step_hot_overlap", "mb_vs_step_corr", "step_hot_overlap",
                "step_corr", "history_hot_overlap", "history_corr", "history_mb_hot_overlap"):
        out[key] = sums[key] / counts[key] if counts.get(key) else float("nan")
    return out


def loads_from_tokens(token_experts: np.ndarray, token_src_rank: np.ndarray, ep: int, num_experts: int) -> np.ndarray:
    """Count token-level ids into loads.

    token_experts: int [steps, micro_batches, tokens, layers, top_k] (-1 padded);
    token_src_rank: int [steps, micro_batches, tokens] (-1 padded). Returns int32 [S, M, L, ep, E].
    """
    s, m, t, l, k = token_experts.shape
    valid = token_src_rank >= 0  # [S, M, T]
    si, mi, ti = np.nonzero(valid)
    ids = token_experts[si, mi, ti].astype(np.int64)  # [n, L, K]
    src = token_src_rank[si, mi, ti].astype(np.int64)
    layer = np.broadcast_to(np.arange(l)[None, :, None], ids.shape)
    flat = ((((si[:, None, None] * m + mi[:, None, None]) * l + layer) * ep + src[:, None, None]) * num_experts + ids)
    counts = np.bincount(flat.ravel(), minlength=s * m * l * ep * num_experts)
    return counts.reshape(s, m, l, ep, num_experts).astype(np.int32)
