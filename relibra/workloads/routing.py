"""Expert routing of the synthetic workload: the drifting expert logits of every domain and topic, and
top-k sampling of a slot's tokens from its expert shares (counts, or per-token ids for small configs)."""

from __future__ import annotations

import numpy as np

from relibra.cluster import ModelShape
from relibra.workloads.config import DOMAINS, WorkloadConfig


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


class RoutingState:
    """Logits of every (domain, topic, layer, expert) and of topic frequencies, walked across steps.

    All are unit-variance Gaussians scaled by the config's standard deviations when used, so the
    AR(1) walk keeps their spread (and the calibrated skew) stationary over long traces.
    """

    def __init__(self, rng: np.random.Generator, model: ModelShape, cfg: WorkloadConfig):
        d, t, l, e = len(DOMAINS), cfg.topics_per_domain, model.num_layers, model.num_experts
        self.rng, self.cfg = rng, cfg
        self.shared = rng.standard_normal((l, e))
        self.domain = rng.standard_normal((d, l, e))
        self.topic = rng.standard_normal((d, t, l, e))
        self.topic_prior = rng.standard_normal((d, t))

    def advance(self) -> None:
        """One step of policy drift: x <- rho * x + sqrt(1 - rho^2) * noise."""
        rho = 1.0 - self.cfg.drift_per_step
        if rho == 1.0:
            return
        sd = np.sqrt(1.0 - rho * rho)
        for name in ("shared", "domain", "topic", "topic_prior"):
            x = getattr(self, name)
            setattr(self, name, rho * x + sd * self.rng.standard_normal(x.shape))

    def topic_distributions(self) -> np.ndarray:
        """Expert shares of every topic: float64 [domains * topics, layers, experts]."""
        c = self.cfg
        logits = (c.shared_logit_std * self.shared[None, None] + c.domain_logit_std * self.domain[:, None]
                  + c.topic_logit_std * self.topic)
        d, t, l, e = logits.shape
        return _softmax(logits).reshape(d * t, l, e)

    def topic_frequencies(self) -> np.ndarray:
        """Share of each topic inside its domain: float64 [domains, topics]."""
        return _softmax(self.cfg.topic_prior_std * self.topic_prior)


def water_fill(p: np.ndarray, k: int) -> np.ndarray:
    """Inclusion probabilities of top-k sampling without replacement, min(1, c * p) summing to k.

    p: float [..., E], rows summing to 1 with at least k non-zero entries. Returns float64 [..., E]:
    experts whose share k*p would exceed 1 are capped at 1 and the rest rescaled to fill k.
    """
    pi = np.asarray(p, dtype=np.float64) * k
    rows = np.nonzero((pi > 1.0).any(axis=-1).reshape(-1))[0]
    if rows.size == 0:
        return pi
    flat = pi.reshape(-1, pi.shape[-1])
    sub = flat[rows] / k
    saturated = np.zeros(sub.shape, dtype=bool)
    while True:  # each pass saturates at least one more expert, so at most k + 1 passes
        rest = np.where(saturated, 0.0, sub)
        rest_sum = rest.sum(axis=-1)
        free_slots = k - saturated.sum(axis=-1)
        scaled = rest * (free_slots / np.where(rest_sum > 0, rest_sum, 1.0))[:, None]
        newly = (scaled >= 1.0) & ~saturated
        if not newly.any():
            break
        saturated |= newly
    flat[rows] = np.where(saturated, 1.0, scaled)
    return flat.reshape(pi.shape)


def sample_topk_counts(rng: np.random.Generator, p: np.ndarray, tokens, k: int) -> np.ndarray:
    """Tokens per expert when `tokens` tokens each pick k distinct experts with shares p.

    p: float [rows, E] (rows sum to 1); tokens: an int, or int [rows] per row. Returns int64 [rows, E]:
    every row sums to its tokens * k and no entry exceeds its tokens. Saturated experts (inclusion 1 after `water_fill`) take every token;
    the other slots are one multinomial draw; an over-full draw is redrawn over experts with room.
    """
    pi = water_fill(p, k)
    saturated = pi >= 1.0
    free = np.where(saturated, 0.0, pi)
    free_sum = free.sum(axis=-1, keepdims=True)
    free = free / np.where(free_sum > 0, free_sum, 1.0)
    tok = np.broadcast_to(np.asarray(tokens, dtype=np.int64), pi.shape[:-1])[:, None]  # [rows, 1]
    slots = tok[:, 0] * (k - saturated.sum(axis=-1))
    counts = rng.multinomial(slots, free)
    counts = np.where(saturated, tok, counts)
    over_rows = np.nonzero((counts > tok).any(axis=-1))[0]
    while over_rows.size:  # rare: redraw the excess over the experts that still have room
        sub = counts[over_rows]
        cap = tok[over_rows]
        excess = np.maximum(sub - cap, 0)
        sub -= excess
        room = np.where(sub < cap, free[over_rows], 0.0)
        room /= room.sum(axis=-1, keepdims=True)
        sub += rng.multinomial(excess.sum(axis=-1), room)
        counts[over_rows] = sub
        over_rows = over_rows[(sub > cap).any(axis=-1)]
    return counts


def sample_token_ids(rng: np.random.Generator, piece_p: np.ndarray, piece_tokens: np.ndarray, l: int, e: int,
                      k: int) -> np.ndarray:
    """Top-k ids of every token by Gumbel top-k (successive sampling without replacement).

    piece_p: float [pieces, L*E] expert shares of each piece's sequence; piece_tokens: int [pieces].
    Returns int16 [sum(piece_tokens), L, k], tokens in piece order.
    """
    p = np.repeat(piece_p.reshape(-1, l, e), piece_tokens, axis=0)  # [tokens, L, E]
    with np.errstate(divide="ignore"):
        keys = np.log(p) + rng.gumbel(size=p.shape)
    return np.argpartition(-keys, k - 1, axis=-1)[..., :k].astype(np.int16)


def _slot_mixtures(slot: np.ndarray, tokens: np.ndarray, topics: np.ndarray, topic_p: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Only the topics present this step: (piece topics float64 [pieces, used], their expert shares float64
    [used, layers * experts])."""
    used = np.nonzero(topics.any(axis=0))[0]
    return topics[:, used], topic_p[used].reshape(len(used), -1)


def shift_permutations(rng: np.random.Generator, micro_batches: int, layers: int, experts: int,
                       shift: float) -> np.ndarray | None:
    """The micro-batch shift of one step: int64 [micro_batches, layers, experts] index maps (expert e of a
    micro-batch takes the share of expert idx[e]), each trading the shares of round(shift x experts) randomly
    chosen experts by a random permutation among them and keeping the rest; None (nothing drawn) when fewer
    than 2 experts would move."""
    moved = int(round(shift * experts))
    if moved < 2:
        return None
    chosen = np.argsort(rng.random((micro_batches, layers, experts)), axis=-1)[..., :moved]  # the experts that trade
    order = np.argsort(rng.random((micro_batches, layers, moved)), axis=-1)
    idx = np.broadcast_to(np.arange(experts), (micro_batches, layers, experts)).copy()
    np.put_along_axis(idx, chosen, np.take_along_axis(chosen, order, axis=-1), axis=-1)
    return idx


def step_counts(rng: np.random.Generator, slot: np.ndarray, tokens: np.ndarray, topics: np.ndarray,
                topic_p: np.ndarray, slot_tokens: np.ndarray, top_k: int, out: np.ndarray,
                shift: np.ndarray | None = None) -> None:
    """Sample one step's loads into out, int32 [micro_batches, layers, ep, experts].

    slot, tokens: int [pieces]; topics: float64 [pieces, domains * topics]; topic_p: float64
    [domains * topics, layers, experts]; slot_tokens: int64 [micro_batches * ep]. A slot's expert shares
    are the token-weighted mixture of its pieces' topic distributions; its tokens pick top_k experts each.
    shift: shift_permutations (int [micro_batches, layers, experts]), applied to every slot of a micro-batch.
    """
    micro_batches, layers, ep, experts = out.shape
    piece_topics, topic_flat = _slot_mixtures(slot, tokens, topics, topic_p)
    slot_mix = np.zeros((len(slot_tokens), piece_topics.shape[1]))
    np.add.at(slot_mix, slot, piece_topics * (tokens / slot_tokens[slot])[:, None])
    # One matrix product per step where it is small: many small ones wake BLAS threads over and over,
    # which costs more than the product itself on a shared machine; per micro-batch where it is large.
    whole = len(slot_tokens) * layers * experts <= 2**24
    slot_p = (slot_mix @ topic_flat).reshape(micro_batches, ep * layers, experts) if whole else None
    row_tokens = np.repeat(slot_tokens.reshape(micro_batches, ep), layers, axis=1)  # [M, ep*L]
    for m in range(micro_batches):
        p_m = slot_p[m] if whole else (slot_mix[m * ep:(m + 1) * ep] @ topic_flat).reshape(ep * layers, experts)
        if shift is not None:  # every rank's slot of micro-batch m trades the same experts' shares
            p_m = np.take_along_axis(p_m.reshape(ep, layers, experts), shift[m][None], axis=-1).reshape(
                ep * layers, experts)
        counts = sample_topk_counts(rng, p_m, row_tokens[m], top_k).reshape(ep, layers, experts)
        out[m] = counts.transpose(1, 0, 2)


def step_token_ids(rng: np.random.Generator, slot: np.ndarray, tokens: np.ndarray, topics: np.ndarray,
                   topic_p: np.ndarray, slot_tokens: np.ndarray, ep: int, top_k: int,
                   shift: np.ndarray | None = None) -> tuple[list, list]:
    """Per-token top-k ids of one step, tokens grouped by micro-batch, then rank.

    Arguments as step_counts. Returns (ids int16 [tokens, layers, top_k], source rank int [tokens]) per micro-batch.
    """
    _, layers, experts = topic_p.shape
    order = np.argsort(slot, kind="stable")
    piece_topics, topic_flat = _slot_mixtures(slot, tokens, topics, topic_p)
    piece_p = piece_topics[order] @ topic_flat
    if shift is not None:
        piece_p = np.take_along_axis(piece_p.reshape(-1, layers, experts), shift[slot[order] // ep],
                                     axis=-1).reshape(len(order), -1)
    ids = sample_token_ids(rng, piece_p, tokens[order], layers, experts, top_k)
    micro_batches = len(slot_tokens) // ep
    ends = np.cumsum(slot_tokens.reshape(micro_batches, ep).sum(axis=1))[:-1]
    src = np.repeat(np.tile(np.arange(ep), micro_batches), slot_tokens)
    return np.split(ids, ends), np.split(src, ends)
