"""Routing traces: which experts every micro-batch's tokens were routed to, per layer.

The central array is `loads[step, micro_batch, layer, src_rank, expert]`: how many of the tokens
that sit on EP rank `src_rank` before dispatch chose `expert` in `layer` (each token counts once per
expert of its top-k, so a layer's loads sum to tokens x top_k). Optionally a trace also keeps
token-level ids: `token_experts[step, micro_batch, token, layer, k]` with `token_src_rank[step,
micro_batch, token]`, padded with -1 where a micro-batch holds fewer tokens.

The package: core (this module: RoutingTrace, its invariants, and the load arithmetic every layer
above uses: static placement, per-rank loads, skewness, loads from token ids), io (the file format
and its bounded reader), checks (the id and integer checks the importers share). Routing-dynamics
statistics live in relibra.analysis.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from relibra.cluster import ModelShape
from relibra.errors import TraceError
from relibra.paths import atomic_open, check_output_path
from relibra.trace.checks import _INT32_MAX, _check_int, _first, _num, check_id_dtype
from relibra.trace.io import FORMAT_VERSION, TRACE_FIELDS, _check_format_version, _parse_meta, read_npz


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
        """Token-level ids against the loads, a chunk of tokens at a time (TOKEN_CHUNK_IDS ids), so that
        the memory beyond the arrays themselves stays a few chunks whatever the trace's size."""
        te, tsr = self.token_experts, self.token_src_rank
        s, m, l, _, e = self.loads.shape
        k = self.model.top_k
        check_id_dtype(te, where, "token_experts")
        check_id_dtype(tsr, where, "token_src_rank")
        if te.ndim != 5 or te.shape[:2] != (s, m) or te.shape[3:] != (l, k):
            raise TraceError(f"{where}: field 'token_experts' must have shape [{s}, {m}, tokens, {l}, {k}], got {te.shape}")
        if tsr.shape != te.shape[:3]:
            raise TraceError(f"{where}: field 'token_src_rank' must have shape {te.shape[:3]}, got {tsr.shape}")
        t = te.shape[2]
        rows_te, rows_src = te.reshape(s * m * t, l, k), tsr.reshape(s * m * t)

        def at(row: int, *rest: int) -> tuple:
            return (*(int(i) for i in np.unravel_index(row, (s, m, t))), *(int(i) for i in rest))

        for lo, hi in token_chunks(s * m * t, l * k):
            src, ids = rows_src[lo:hi], rows_te[lo:hi]
            bad_src = (src >= self.ep) | (src < -1)
            if bad_src.any():
                first = at(lo + int(np.argmax(bad_src)))
                raise TraceError(f"{where}: field 'token_src_rank' at {first} holds {_num(tsr[first])}, outside "
                                 f"[0, ep={self.ep}) and not the padding -1")
            valid = src >= 0
            pad = (ids != -1) & ~valid[:, None, None]
            if pad.any():
                first = at(lo + int(np.argwhere(pad)[0][0]), *np.argwhere(pad)[0][1:])
                raise TraceError(f"{where}: field 'token_experts' at {first} holds {_num(te[first])} for a padded "
                                 f"token (token_src_rank -1); padding must be -1")
            out = ((ids < 0) | (ids >= e)) & valid[:, None, None]
            if out.any():
                r, li, ki = (int(i) for i in np.argwhere(out)[0])
                first = at(lo + r, li, ki)
                raise TraceError(f"{where}: field 'token_experts' at {first} holds {int(te[first])}, outside [0, {e})")
            srt = np.sort(ids, axis=-1)
            dup = (srt[..., 1:] == srt[..., :-1]).any(-1) & valid[:, None]
            if dup.any():
                r, li = (int(i) for i in np.argwhere(dup)[0])
                raise TraceError(f"{where}: field 'token_experts' repeats an expert within one token's top-k at "
                                 f"[step, micro_batch, token, layer]={at(lo + r, li)}")
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

    def with_model(self, model: ModelShape) -> "RoutingTrace":
        """The same routing with another model shape: its layers, experts and top-k must be this trace's
        (validated); its dense fields (attention heads, head dim, vocabulary, hidden, ...) may differ, so
        that the cost model prices the user's model rather than a preset's."""
        for name in ("num_layers", "num_experts", "top_k"):
            if getattr(model, name) != getattr(self.model, name):
                raise TraceError(f"model {model.name!r}: {name}={getattr(model, name)}, but the trace's routing has "
                                 f"{name}={getattr(self.model, name)}")
        return RoutingTrace(self.loads, model, self.ep, self.tokens_per_microbatch, dict(self.provenance),
                            self.token_experts, self.token_src_rank, self.seq_lens)

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


TOKEN_CHUNK_IDS = 1 << 20  # token ids validated or counted at once (a few MB of temporaries)


def token_chunks(rows: int, ids_per_row: int, chunk_ids: int = TOKEN_CHUNK_IDS):
    """(start, stop) row ranges of about chunk_ids ids each (at least one row) covering `rows` rows."""
    step = max(1, chunk_ids // max(ids_per_row, 1))
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def loads_from_tokens(token_experts: np.ndarray, token_src_rank: np.ndarray, ep: int, num_experts: int) -> np.ndarray:
    """Count token-level ids into loads, a chunk of tokens at a time (memory: the int32 loads plus a few
    chunks, not a multiple of the ids).

    token_experts: int [steps, micro_batches, tokens, layers, top_k] (-1 padded);
    token_src_rank: int [steps, micro_batches, tokens] (-1 padded). Returns int32 [S, M, L, ep, E].
    """
    s, m, t, l, k = token_experts.shape
    block = l * ep * num_experts  # the loads of one (step, micro-batch)
    counts = np.zeros(s * m * block, dtype=np.int32)
    rows_te, rows_src = token_experts.reshape(s * m * t, l, k), token_src_rank.reshape(s * m * t)
    layer = np.arange(l, dtype=np.int64)[None, :, None]
    for lo, hi in token_chunks(s * m * t, l * k):
        src = rows_src[lo:hi]
        rows = np.flatnonzero(src >= 0)
        if not rows.size:
            continue
        slot = (rows + lo) // t  # step * m + micro_batch
        first = int(slot[0])
        flat = ((((slot - first)[:, None, None] * l + layer) * ep + src[rows].astype(np.int64)[:, None, None])
                * num_experts + rows_te[lo:hi][rows])
        span = (int(slot[-1]) - first + 1) * block
        counts[first * block:first * block + span] += np.bincount(flat.ravel(), minlength=span).astype(np.int32)
    return counts.reshape(s, m, l, ep, num_experts)
