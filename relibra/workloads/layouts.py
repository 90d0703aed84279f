"""Batch layouts: how an RL framework deals one step's sequences to (micro-batch, EP rank) slots.

Each layout follows a named system's trainer (docs/traces.md says which of its files): verl's chunking and
Karmarkar-Karp balancing, slime's strided split and token-budget packing, Megatron-LM's packed samples.
A step's batch ends as `StepBatch`: every piece of a sequence with its slot, tokens and topic mixture."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from relibra.cluster import ModelShape
from relibra.errors import ConfigError
from relibra.workloads.config import BATCH_LAYOUTS, WorkloadConfig, model_seed
from relibra.workloads.domains import draw_sequences, topic_weights


def pack_sequences(lengths: np.ndarray, slot_tokens: int, num_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lay sequences back to back into `num_slots` slots of `slot_tokens` tokens each.

    lengths: int [n] tokens per sequence, summing to at least slot_tokens * num_slots.
    Returns (slot, sequence, tokens) of every piece, int64 [pieces]: a sequence crossing a slot
    boundary is cut into pieces; the last sequence is cut at the end of the last slot.
    """
    total = slot_tokens * num_slots
    ends = np.cumsum(lengths, dtype=np.int64)
    if ends[-1] < total:
        raise ConfigError(f"pack_sequences: {int(ends[-1])} tokens cannot fill {num_slots} slots of {slot_tokens}")
    starts = ends - lengths
    cuts = np.unique(np.concatenate([starts[starts < total], np.arange(0, total + 1, slot_tokens)]))
    piece_start = cuts[:-1]
    piece_tokens = np.diff(cuts)
    sequence = np.searchsorted(ends, piece_start, side="right")
    return piece_start // slot_tokens, sequence, piece_tokens


def karmarkar_karp(lengths: np.ndarray, k: int, equal_size: bool) -> list[np.ndarray]:
    """Partition items into k parts of near-equal summed length by largest differencing (Karmarkar-Karp).

    lengths: int [n]. equal_size: every part gets n / k items (n must be a multiple of k); the items,
    sorted by (length, index), start as n / k states of k singletons; otherwise as n states of one
    item and k - 1 empty parts. The two states of largest spread (max - min part sum) are merged
    repeatedly, the largest part of one joining the smallest of the other, as verl's and slime's
    `get_seqlen_balanced_partitions` do. Returns k int64 index arrays, each sorted ascending, parts in
    decreasing order of sum (ties: more items first).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if k <= 0 or n < k:
        raise ConfigError(f"karmarkar_karp: {n} items cannot fill {k} parts")
    if equal_size and n % k:
        raise ConfigError(f"karmarkar_karp: {n} items do not split into {k} equal parts")
    order = np.lexsort((np.arange(n), lengths))  # ascending by (length, index)
    heap = []
    counter = 0

    def push(sums: list, items: list):
        nonlocal counter
        idx = sorted(range(k), key=lambda i: (sums[i], len(items[i])), reverse=True)
        sums, items = [sums[i] for i in idx], [items[i] for i in idx]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), -sums[0], counter, sums, items))
        counter += 1

    if equal_size:
        for off in range(0, n, k):
            chunk = order[off:off + k]
            push([int(lengths[i]) for i in chunk], [[int(i)] for i in chunk])
    else:
        for i in order:
            push([int(lengths[i])] + [0] * (k - 1), [[int(i)]] + [[] for _ in range(k - 1)])
    while len(heap) > 1:
        _, _, _, s0, i0 = heapq.heappop(heap)
        _, _, _, s1, i1 = heapq.heappop(heap)
        push([s0[j] + s1[k - 1 - j] for j in range(k)], [i0[j] + i1[k - 1 - j] for j in range(k)])
    parts = [np.sort(np.asarray(p, dtype=np.int64)) for p in heap[0][4]]
    if any(len(p) == 0 for p in parts):
        raise ConfigError(f"karmarkar_karp: a part came out empty ({n} items, {k} parts)")
    return parts


def first_fit_bins(lengths: np.ndarray, budget: int) -> list[list[int]]:
    """Pack sequences in their order into bins of at most `budget` tokens, first fit.

    lengths: int [n]. Each sequence goes into the first bin whose tokens plus its own stay within the
    budget, else opens a new bin; a sequence longer than the budget sits alone in its own bin (the
    contract of slime's `first_fit_pack`, slime/utils/seqlen_balancing.py). Returns the bins as lists
    of sequence indices, in opening order.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    room = np.empty(len(lengths), dtype=np.int64)  # free tokens of each open bin (at most n bins)
    bins: list[list[int]] = []
    for i, length in enumerate(lengths.tolist()):
        fits = np.flatnonzero(room[:len(bins)] >= length)
        if fits.size:
            j = int(fits[0])
            bins[j].append(i)
            room[j] -= length
        else:
            room[len(bins)] = budget - length  # negative for an over-long sequence: nothing else fits
            bins.append([i])
    return bins


def split_largest_bins(bins: list[list[int]], count: int, lengths: np.ndarray) -> list[list[int]]:
    """Split bins until there are `count`: the bin of most tokens holding two or more sequences (ties: the
    later bin) is cut where its running token sum first reaches half, its second part appended as a new
    bin (slime's expand_bins_by_splitting). Raises ConfigError when no bin can be split further."""
    lengths = np.asarray(lengths, dtype=np.int64)
    bins = [list(b) for b in bins]
    while len(bins) < count:
        sums = [(int(lengths[b].sum()), j) for j, b in enumerate(bins) if len(b) > 1]
        if not sums:
            raise ConfigError(f"token-budget layout: {len(bins)} micro-batches of single sequences cannot be "
                              f"split into {count}")
        total, j = max(sums)
        running = np.cumsum(lengths[bins[j]])
        cut = int(np.clip(np.searchsorted(running, total / 2) + 1, 1, len(bins[j]) - 1))
        bins.append(bins[j][cut:])
        bins[j] = bins[j][:cut]
    return bins


def token_budget_slots(bins: list[list[int]], weights: np.ndarray, ep: int) -> tuple[np.ndarray, np.ndarray]:
    """(rank, micro_batch) of every packed sequence: the bins dealt over `ep` data-parallel ranks.

    bins: len(bins) a multiple of ep; weights: int [n] estimated work of each sequence. The bins'
    summed work is partitioned by Karmarkar-Karp into ep parts of equal bin count (slime's
    --balance-data: `get_seqlen_balanced_partitions` on estimated FLOPs); part r runs on rank r,
    its bins in ascending order as micro-batches 0, 1, .... Sequences in no bin get rank -1.
    Returns int64 [n] each.
    """
    weights = np.asarray(weights, dtype=np.int64)
    if len(bins) % ep:
        raise ConfigError(f"token-budget layout: {len(bins)} micro-batches do not split over ep={ep} ranks")
    bin_work = np.array([int(weights[b].sum()) for b in bins], dtype=np.int64)
    rank = np.full(len(weights), -1, dtype=np.int64)
    mb = np.full(len(weights), -1, dtype=np.int64)
    for r, part in enumerate(karmarkar_karp(bin_work, ep, equal_size=True)):
        for m, j in enumerate(part.tolist()):
            rank[bins[j]] = r
            mb[bins[j]] = m
    return rank, mb


def layout_slots(lengths: np.ndarray, group: np.ndarray, ep: int, micro_batches: int, layout: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(rank, micro_batch) of every whole sequence of one step under a named batch layout.

    lengths: int [n] tokens per sequence in rollout order (a prompt group's responses adjacent);
    group: int [n] prompt group of each sequence. The EP group's ranks are the data-parallel ranks.
    n must be a multiple of ep (verl's DataProto.chunk and balance_batch, slime's strided split) and
    of ep x micro_batches for the fixed-size micro-batch layouts. Layouts (docs/traces.md says which
    code of each system this follows):
      verl          DataProto.chunk: rank r takes the r-th contiguous chunk; its micro-batches are
                    consecutive runs of ppo_micro_batch_size_per_gpu sequences.
      verl-balance  verl's trainer default (balance_batch=True): the Karmarkar-Karp partition of the
                    sequences by length into ep parts of equal count (equal_size=True), part r on
                    rank r, then fixed-size micro-batches as `verl`.
      verl-dynamic  balance_batch plus use_dynamic_bsz: each rank's sequences are split by
                    Karmarkar-Karp (equal_size=False) into micro_batches token-balanced micro-batches
                    (verl makes the count the DP-wide max of ceil(tokens / max_token_len)).
      slime         slime's default split val[dp_rank::dp_size] (a group's responses go to different
                    ranks), then consecutive runs of micro_batch_size sequences.
      slime-dynamic the strided split plus --use-dynamic-batch-size: Karmarkar-Karp into
                    micro_batches token-balanced micro-batches per rank.
    (`megatron` packs instead of dealing whole sequences; see pack_sequences.)
    Returns int64 [n] each.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if n % ep:
        raise ConfigError(f"layout {layout!r}: {n} sequences do not split over ep={ep} ranks")
    per_rank = n // ep
    if per_rank < micro_batches:
        raise ConfigError(f"layout {layout!r}: {per_rank} sequences per rank cannot fill {micro_batches} micro-batches")
    rank = np.empty(n, dtype=np.int64)
    mb = np.empty(n, dtype=np.int64)
    if layout in ("verl", "verl-balance", "verl-dynamic"):
        if layout == "verl":
            parts = np.arange(n).reshape(ep, per_rank)
        else:
            parts = karmarkar_karp(lengths, ep, equal_size=True)
    elif layout in ("slime", "slime-dynamic"):
        parts = [np.arange(r, n, ep) for r in range(ep)]
    else:
        raise ConfigError(f"unknown batch layout {layout!r} for whole sequences; known: "
                          f"{', '.join(b for b in BATCH_LAYOUTS if b != 'megatron')}")
    dynamic = layout.endswith("-dynamic")
    if not dynamic and per_rank % micro_batches:
        raise ConfigError(f"layout {layout!r}: {per_rank} sequences per rank do not split into {micro_batches} "
                          f"micro-batches of equal size")
    for r, part in enumerate(parts):
        rank[part] = r
        if dynamic:
            for m, sub in enumerate(karmarkar_karp(lengths[part], micro_batches, equal_size=False)):
                mb[part[sub]] = m
        else:
            mb[part] = np.arange(per_rank) // (per_rank // micro_batches)
    return rank, mb


def split_pieces(lengths: np.ndarray, cp: int, tp: int) -> np.ndarray:
    """Tokens of each sequence on each of the CP x TP ranks that split it: int64 [n, cp, tp].

    Megatron's context parallelism cuts a sequence of L tokens into 2 cp chunks (the first L mod 2 cp one
    token longer) and gives CP rank c chunks c and 2 cp - 1 - c, so every rank gets an equal share of the
    causal attention work; sequence parallelism then splits a CP rank's share over the tp ranks (evenly,
    the first ones one token longer). Every piece of a sequence sums back to L.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    k = 2 * cp
    chunk = lengths[:, None] // k + (np.arange(k)[None, :] < (lengths[:, None] % k))  # [n, 2 cp]
    share = chunk[:, :cp] + chunk[:, ::-1][:, :cp]  # chunk c + chunk 2 cp - 1 - c: [n, cp]
    return share[:, :, None] // tp + (np.arange(tp)[None, None, :] < (share[:, :, None] % tp))


def slot_seq_lens(slot: np.ndarray, tokens: np.ndarray, num_slots: int) -> np.ndarray:
    """Lengths of the pieces in each slot, 0-padded: int32 [num_slots, max pieces per slot].

    slot: int [pieces] slot of each piece, tokens: int [pieces] its length; pieces keep their order.
    """
    order = np.argsort(slot, kind="stable")
    counts = np.bincount(slot, minlength=num_slots)
    width = max(int(counts.max(initial=0)), 1)
    pos = np.arange(len(slot)) - np.repeat(np.cumsum(counts) - counts, counts)
    out = np.zeros((num_slots, width), dtype=np.int32)
    out[slot[order], pos] = tokens[order]
    return out


def token_budget_batches(shape: ModelShape, cfg: WorkloadConfig, domains: np.ndarray, weights: np.ndarray, ep: int,
                          steps: int, seed: int, budget: int, micro_batches: int | None) -> tuple[list, int]:
    """Every step's batch under the `token-budget` layout, packed and dealt over the EP group's ranks.

    A step holds global_batch_sequences x ep / data_parallel_size sequences (each EP rank is one
    data-parallel rank), drawn as prompt groups from their own random stream (seed, model, 1), so the
    routing stream stays the generator's. They are packed first-fit into micro-batches of at most
    `budget` tokens (first_fit_bins); the trace's one micro-batch count per rank is the largest
    ceil(bins / ep) over its steps, and steps with fewer bins split their largest ones to reach it
    (split_largest_bins; slime splits likewise to reach a multiple of the DP size); the bins are dealt
    to ranks by Karmarkar-Karp on estimated forward FLOPs (token_budget_slots). micro_batches (a
    cut-down batch for small profiles): instead draw about micro_batches x ep x budget tokens and keep
    the first micro_batches x ep bins.
    With CP x TP > 1 (cfg.context_parallel, cfg.tensor_parallel) the sequences are packed into bins of
    budget x CP x TP tokens and dealt over ep / (CP x TP) data-parallel slots (`rank` is then the slot;
    token_budget_step splits every sequence over its slot's CP x TP ranks).
    Returns ([(group, domain, length, rank, micro_batch) int64 [n] each, and draw_sequences' cut int8 [n], per
    step], micro-batches per rank).
    """
    rng = np.random.default_rng([int(seed), model_seed(shape), 1])
    dp = cfg.data_parallel_size or ep
    sequences = -(-cfg.global_batch_sequences * ep // dp)
    split = cfg.context_parallel * cfg.tensor_parallel
    if ep % split:
        raise ConfigError(f"token-budget layout: EP {ep} is no multiple of the CP x TP = {cfg.context_parallel} x "
                          f"{cfg.tensor_parallel} ranks that split every sequence")
    ep, budget = ep // split, budget * split  # bins of whole sequences, dealt over the data-parallel slots
    if micro_batches is None and sequences < ep:
        raise ConfigError(f"token-budget layout: {sequences} sequences per step (global batch "
                          f"{cfg.global_batch_sequences} x ep {ep} / data_parallel_size {dp}) cannot give each of "
                          f"{ep} ranks a micro-batch")
    per_token = (shape.attention_projection_flops_per_token + shape.moe_layer_dense_flops_per_token
                 + shape.top_k * shape.expert_flops_per_token)
    drawn = []
    for _ in range(steps):
        if micro_batches is None:
            group, domain, length, cut = (x[:sequences] for x in
                                          draw_sequences(rng, domains, weights, 0, cfg, min_sequences=sequences))
        else:
            group, domain, length, cut = draw_sequences(rng, domains, weights, micro_batches * ep * budget, cfg,
                                                         min_sequences=micro_batches * ep)
        drawn.append((group, domain, length, cut, first_fit_bins(length, budget)))
    if micro_batches is None:
        micro_batches = max(-(-len(bins) // ep) for *_, bins in drawn)
    out = []
    for group, domain, length, cut, bins in drawn:
        bins = split_largest_bins(bins[:micro_batches * ep], micro_batches * ep, length)
        work = np.rint(length * per_token + shape.attention_core_flops(length[:, None])).astype(np.int64)
        rank, mb = token_budget_slots(bins, work, ep)
        out.append((group, domain, length, rank, mb, cut))
    return out, micro_batches


@dataclass(frozen=True)
class StepBatch:
    """One step's batch as pieces of sequences, each in one (micro-batch, rank) slot. A whole sequence is one
    piece, except under `megatron`, whose packed samples cut sequences.

    slot: int64 [pieces], micro_batch * ep + rank; tokens: int64 [pieces]; topics: float64 [pieces,
    domains * topics], the topic mixture of each piece's prompt. capped / floored: sequences of the step
    whose drawn length was cut to the maximum sequence / raised to 2 tokens (draw_sequences).
    """

    slot: np.ndarray
    tokens: np.ndarray
    topics: np.ndarray
    capped: int = 0
    floored: int = 0


def token_budget_step(rng: np.random.Generator, drawn: tuple, cfg: WorkloadConfig, ep: int,
                      topic_freq: np.ndarray) -> StepBatch:
    """One step of `token_budget_batches` as a StepBatch; each prompt's topic mixture is drawn from rng.

    drawn: (group, domain, length, rank, micro_batch) int64 [n] each and cut int8 [n]; topic_freq: float64
    [domains, topics]. Sequences a cut-down batch left out (rank -1) are in no slot.
    """
    group, domain, length, rank, mb, cut = drawn
    group_topics = topic_weights(rng, domain[:: cfg.responses_per_prompt], topic_freq, cfg)
    seq = np.flatnonzero(rank >= 0)
    cp, tp = cfg.context_parallel, cfg.tensor_parallel
    if cp * tp == 1:
        return StepBatch(mb[seq] * ep + rank[seq], length[seq], group_topics[group[seq]], *_cut_counts(cut[seq]))
    pieces = split_pieces(length[seq], cp, tp)  # [n, cp, tp]
    ep_rank = (rank[seq][:, None, None] * cp + np.arange(cp)[None, :, None]) * tp + np.arange(tp)[None, None, :]
    slot = mb[seq][:, None, None] * ep + ep_rank
    owner = np.broadcast_to(seq[:, None, None], pieces.shape).ravel()
    keep = pieces.ravel() > 0  # a sequence shorter than CP x TP leaves some ranks without a piece
    return StepBatch(slot.ravel()[keep], pieces.ravel()[keep], group_topics[group[owner[keep]]],
                     *_cut_counts(cut[seq]))


def _cut_counts(cut: np.ndarray) -> tuple[int, int]:
    """(capped, floored) sequences among draw_sequences' cut flags."""
    return int(np.count_nonzero(cut > 0)), int(np.count_nonzero(cut < 0))


def dealt_step(rng: np.random.Generator, domains: np.ndarray, weights: np.ndarray, cfg: WorkloadConfig, ep: int,
               micro_batches: int, target: int | None, sequences: int | None, topic_freq: np.ndarray) -> StepBatch:
    """One step under a layout of a fixed micro-batch count (verl*, slime*, megatron), drawn from rng.

    sequences: the step's sequence count (the global batch), or None to draw until about `target`
    tokens per slot, in the fewest whole sequences that split evenly over the slots (over the ranks
    for the -dynamic layouts).
    """
    num_slots = micro_batches * ep
    per_prompt = cfg.responses_per_prompt
    group, domain, length, cut = draw_sequences(rng, domains, weights, num_slots * target if target is not None else 0,
                                                cfg, min_sequences=sequences if sequences is not None else num_slots)
    group_topics = topic_weights(rng, domain[::per_prompt], topic_freq, cfg)
    if cfg.batch_layout == "megatron":
        # Megatron-LM's pretraining sampler: the stream packed into equal samples dealt micro-batch major
        # (micro-batch m's ranks take consecutive samples), so a sample's index is its slot.
        if sequences is not None:
            group, length = group[:sequences], length[:sequences]
        per_slot = target if target is not None else int(length.sum()) // num_slots
        slot, seq, tokens = pack_sequences(length, per_slot, num_slots)
        return StepBatch(slot, tokens, group_topics[group[seq]], *_cut_counts(cut[np.unique(seq)]))
    n = sequences
    if n is None:
        unit = ep if cfg.batch_layout.endswith("-dynamic") else num_slots  # sequences must split evenly
        n = int(np.searchsorted(np.cumsum(length), num_slots * target)) + 1
        n = max(num_slots, unit * -(-n // unit))
        if n > len(length):
            more_group, more_domain, more_length, more_cut = draw_sequences(rng, domains, weights, 0, cfg,
                                                                            min_sequences=n - len(length))
            group = np.concatenate([group, more_group + group[-1] + 1])
            length = np.concatenate([length, more_length])
            cut = np.concatenate([cut, more_cut])
            group_topics = np.concatenate([group_topics, topic_weights(rng, more_domain[::per_prompt], topic_freq, cfg)])
    group, length = group[:n], length[:n]
    rank, mb = layout_slots(length, group, ep, micro_batches, cfg.batch_layout)
    return StepBatch(mb * ep + rank, length, group_topics[group], *_cut_counts(cut[:n]))
