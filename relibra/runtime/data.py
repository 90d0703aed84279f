"""Token-level inputs for the runtime: which tokens sit on which rank, their replayed expert ids,
and language-model ids and labels, all derived deterministically from a RoutingTrace and a seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relibra.errors import TraceError
from relibra.trace import RoutingTrace


def token_ids_from_loads(loads: np.ndarray, top_k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-token top-k ids that count up to exactly `loads` (for traces that keep loads only).

    loads: int [steps, micro_batches, layers, ep, experts]. Returns (token_experts int32 [S, M, T, L, K],
    token_src_rank int32 [S, M, T]) with T the most tokens of any (step, micro_batch), -1 padded.
    For each (step, micro-batch, layer, src) the expert multiset, sorted by expert id, is dealt to the
    src's n tokens column-wise (token t gets entries t, t + n, ...): an expert routed at most n times
    then never repeats within a token. A seeded permutation of the tokens per layer keeps hot experts
    from always landing on the first tokens.
    """
    s, m, l, ep, e = loads.shape
    per_src = loads.sum(axis=4, dtype=np.int64)[:, :, 0, :] // top_k  # [S, M, ep]
    if (loads.sum(axis=4) % top_k).any() or (loads.max(axis=4, initial=0) > per_src[:, :, None, :]).any():
        raise TraceError("loads cannot come from top-k routing (an expert has more tokens than the src holds)")
    tokens = int(per_src.sum(axis=2).max())
    te = np.full((s, m, tokens, l, top_k), -1, dtype=np.int32)
    tsr = np.full((s, m, tokens), -1, dtype=np.int32)
    rng = np.random.default_rng(seed)
    for si in range(s):
        for mi in range(m):
            start = 0
            for src in range(ep):
                n = int(per_src[si, mi, src])
                tsr[si, mi, start: start + n] = src
                for li in range(l):
                    ids = np.repeat(np.arange(e), loads[si, mi, li, src])  # n * k, sorted
                    dealt = ids.reshape(top_k, n).T  # [n, k]
                    te[si, mi, start: start + n, li] = dealt[rng.permutation(n)]
                start += n
    return te, tsr


@dataclass
class SourceBatch:
    """One src rank's tokens of one micro-batch: ids, labels int64 [T]; replay int64 [L, T, K]."""

    ids: np.ndarray
    labels: np.ndarray
    replay: np.ndarray


class TraceData:
    """Per (step, micro_batch, src) batches from a trace; LM ids from `seed` (same on every rank)."""

    def __init__(self, trace: RoutingTrace, vocab_size: int, seed: int = 0):
        if trace.token_experts is None:
            self.token_experts, self.token_src = token_ids_from_loads(trace.loads, trace.model.top_k, seed)
        else:
            self.token_experts, self.token_src = trace.token_experts, trace.token_src_rank
        self.trace = trace
        self.vocab_size = vocab_size
        self.seed = seed

    def max_tokens_per_src(self) -> int:
        """Most tokens one src rank holds in any (step, micro-batch): the longest sequence a rank runs."""
        src = self.token_src
        ranks = int(src.max()) + 1 if src.size else 1
        return max(int((src == r).sum(axis=2).max()) for r in range(ranks))

    def tokens(self, step: int, micro_batch: int) -> int:
        """Tokens of the micro-batch over all ranks."""
        return int((self.token_src[step, micro_batch] >= 0).sum())

    def batch(self, step: int, micro_batch: int, src: int, num_layers: int) -> SourceBatch:
        rng = np.random.default_rng([self.seed, step, micro_batch])
        t = self.token_src.shape[2]
        ids = rng.integers(0, self.vocab_size, size=t)
        labels = rng.integers(0, self.vocab_size, size=t)
        mine = np.flatnonzero(self.token_src[step, micro_batch] == src)
        replay = self.token_experts[step, micro_batch, mine, :num_layers].astype(np.int64).transpose(1, 0, 2)
        return SourceBatch(ids[mine].astype(np.int64), labels[mine].astype(np.int64), np.ascontiguousarray(replay))
