"""Routing traces: which experts every micro-batch's tokens were routed to, per layer.

The central array is `loads[step, micro_batch, layer, src_rank, expert]`: how many of the tokens
that sit on EP rank `src_rank` before dispatch chose `expert` in `layer` (each token counts once per
expert of its top-k, so a layer's loads sum to tokens x top_k). Optionally a trace also keeps
token-level ids: `token_experts[step, micro_batch, token, layer, k]` with `token_src_rank[step,
micro_batch, token]`, padded with -1 where a micro-batch holds fewer tokens.

On disk a trace is one `.npz` (loaded with allow_pickle=False) holding `format_version`, `loads`,
`meta_json` and, when present, the token-level arrays.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field

import numpy as np

from relibra.cluster import ModelShape
from relibra.errors import TraceError

FORMAT_VERSION = 1


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
    """

    loads: np.ndarray
    model: ModelShape
    ep: int
    tokens_per_microbatch: int
    provenance: dict = field(default_factory=dict)
    token_experts: np.ndarray | None = None
    token_src_rank: np.ndarray | None = None

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
        if not np.issubdtype(loads.dtype, np.integer):
            if np.issubdtype(loads.dtype, np.floating) and np.all(np.isfinite(loads)) and np.all(loads == np.round(loads)):
                self.loads = loads = loads.astype(np.int32)
            else:
                bad = np.argwhere(~np.isfinite(loads) | (loads != np.round(loads)))
                first = tuple(int(i) for i in bad[0]) if len(bad) else ()
                raise TraceError(f"{where}: field 'loads' holds a non-integer count at index {first}")
        if loads.dtype != np.int32:
            if loads.size and (loads.max(initial=0) > np.iinfo(np.int32).max):
                raise TraceError(f"{where}: field 'loads' has counts beyond int32")
            self.loads = loads = loads.astype(np.int32)
        if min(loads.shape) == 0:
            raise TraceError(f"{where}: field 'loads' is empty (shape {loads.shape})")
        if (loads < 0).any():
            first = tuple(int(i) for i in np.argwhere(loads < 0)[0])
            raise TraceError(f"{where}: field 'loads' has a negative count at index {first}")
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
        if self.tokens_per_microbatch <= 0:
            raise TraceError(f"{where}: field 'tokens_per_microbatch' must be positive")
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
        if (self.token_experts is None) != (self.token_src_rank is None):
            raise TraceError(f"{where}: 'token_experts' and 'token_src_rank' must be given together")
        if self.token_experts is not None:
            self._validate_tokens(where)

    def _validate_tokens(self, where: str) -> None:
        te, tsr = self.token_experts, self.token_src_rank
        s, m, l, _, e = self.loads.shape
        k = self.model.top_k
        if te.ndim != 5 or te.shape[:2] != (s, m) or te.shape[3:] != (l, k):
            raise TraceError(f"{where}: field 'token_experts' must have shape [{s}, {m}, tokens, {l}, {k}], got {te.shape}")
        if tsr.shape != te.shape[:3]:
            raise TraceError(f"{where}: field 'token_src_rank' must have shape {te.shape[:3]}, got {tsr.shape}")
        valid = tsr >= 0
        if (tsr >= self.ep).any():
            first = tuple(int(i) for i in np.argwhere(tsr >= self.ep)[0])
            raise TraceError(f"{where}: field 'token_src_rank' at {first} is >= ep={self.ep}")
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
        """Summary statistics as plain JSON-serializable numbers (see `shift_stats`)."""
        skew = skewness(self.rank_load())
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
        out.update(shift_stats(self.expert_load()))
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
        path = os.fspath(path)
        if not path.endswith(".npz"):
            raise TraceError(f"{path}: a trace file must end in .npz")
        np.savez_compressed(path, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RoutingTrace":
        """Read a trace written by `save`; every problem is a TraceError naming the file."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise TraceError(f"{path}: no such file")
        if os.path.getsize(path) == 0:
            raise TraceError(f"{path}: the file is empty")
        try:
            with np.load(path, allow_pickle=False) as z:
                names = set(z.files)
                for need in ("format_version", "loads", "meta_json"):
                    if need not in names:
                        raise TraceError(f"{path}: field {need!r} is missing; not a relibra trace")
                version = int(z["format_version"])
                if version != FORMAT_VERSION:
                    raise TraceError(f"{path}: field 'format_version' is {version}; this kit reads version "
                                     f"{FORMAT_VERSION}")
                loads = z["loads"]
                meta = json.loads(str(z["meta_json"]))
                te = z["token_experts"] if "token_experts" in names else None
                tsr = z["token_src_rank"] if "token_src_rank" in names else None
        except TraceError:
            raise
        except ValueError as exc:
            if "pickle" in str(exc).lower():
                raise TraceError(f"{path}: holds object arrays that need pickle, which this kit refuses to load") from None
            raise TraceError(f"{path}: unreadable ({exc})") from None
        except (zipfile.BadZipFile, OSError, EOFError, KeyError, json.JSONDecodeError) as exc:
            raise TraceError(f"{path}: truncated or corrupted ({type(exc).__name__}: {exc})") from None
        try:
            model = ModelShape.from_dict(meta["model"])
            return cls(loads=loads, model=model, ep=int(meta["ep"]),
                       tokens_per_microbatch=int(meta["tokens_per_microbatch"]),
                       provenance=meta.get("provenance", {}), token_experts=te, token_src_rank=tsr)
        except TraceError as exc:
            raise TraceError(f"{path}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"{path}: field 'meta_json' is malformed ({exc})") from None
        except Exception as exc:  # ConfigError from a bad model shape
            raise TraceError(f"{path}: field 'meta_json' is malformed ({exc})") from None

    def select_steps(self, steps: slice | list[int]) -> "RoutingTrace":
        """A trace holding only the given steps."""
        te = self.token_experts[steps] if self.token_experts is not None else None
        tsr = self.token_src_rank[steps] if self.token_src_rank is not None else None
        return RoutingTrace(self.loads[steps], self.model, self.ep, self.tokens_per_microbatch,
                            dict(self.provenance), te, tsr)


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
    """Share of a's hottest `frac` experts that are also among b's hottest. [..., E] -> [...]."""
    e = a.shape[-1]
    k = max(1, int(round(frac * e)))
    ta = np.argsort(-a, axis=-1, kind="stable")[..., :k]
    tb = np.argsort(-b, axis=-1, kind="stable")[..., :k]
    hits = (ta[..., :, None] == tb[..., None, :]).any(-1).sum(-1)
    return hits / k


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


def shift_stats(expert_load: np.ndarray, hot_frac: float = 0.1, history_window: int = 4) -> dict:
    """How far hot experts move, from expert loads [steps, micro_batches, layers, experts].

    - mb_hot_overlap / mb_corr: consecutive micro-batches of one step.
    - mb_vs_step_hot_overlap / mb_vs_step_corr: a micro-batch against its own step's total.
    - step_hot_overlap / step_corr: consecutive whole steps.
    - history_hot_overlap / history_corr: a step against the moving average of up to
      `history_window` previous steps (what a history-based balancer such as EPLB predicts from).
    - history_mb_hot_overlap: each micro-batch against that history prediction.
    Values are means; NaN where the trace is too short (one step, one micro-batch).
    """
    el = expert_load.astype(np.float64)
    step = el.sum(axis=1)  # [S, L, E]
    out: dict[str, float] = {"hot_frac": hot_frac, "history_window": history_window}
    nan = float("nan")
    if el.shape[1] > 1:
        out["mb_hot_overlap"] = float(hot_overlap(el[:, 1:], el[:, :-1], hot_frac).mean())
        out["mb_corr"] = float(load_correlation(el[:, 1:], el[:, :-1]).mean())
    else:
        out["mb_hot_overlap"] = out["mb_corr"] = nan
    out["mb_vs_step_hot_overlap"] = float(hot_overlap(el, step[:, None], hot_frac).mean())
    out["mb_vs_step_corr"] = float(load_correlation(el, step[:, None]).mean())
    if el.shape[0] > 1:
        out["step_hot_overlap"] = float(hot_overlap(step[1:], step[:-1], hot_frac).mean())
        out["step_corr"] = float(load_correlation(step[1:], step[:-1]).mean())
        pred = history_prediction(step, history_window)  # [S-1, L, E]
        out["history_hot_overlap"] = float(hot_overlap(step[1:], pred, hot_frac).mean())
        out["history_corr"] = float(load_correlation(step[1:], pred).mean())
        out["history_mb_hot_overlap"] = float(hot_overlap(el[1:], pred[:, None], hot_frac).mean())
    else:
        for key in ("step_hot_overlap", "step_corr", "history_hot_overlap", "history_corr", "history_mb_hot_overlap"):
            out[key] = nan
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
