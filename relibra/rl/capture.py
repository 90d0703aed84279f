"""Turn the routing an RL run recorded into a RoutingTrace, and find the trace the kit ships.

Micro-batches and simulated EP ranks. One RL step trains on N = prompts x group sequences. They are
cut into M micro-batches of N/M sequences (gradient accumulation: one forward and backward each),
and each micro-batch is spread over `ep` simulated source ranks, N/(M ep) whole sequences per rank,
in order: sequence i of a micro-batch sits on rank i // (N / (M ep)). That is how data parallelism
over the EP group places a micro-batch before dispatch (every EP rank holds its own sequences), so
`loads[step, micro_batch, layer, src_rank, expert]` counts real routed tokens per source rank.

Token order inside a micro-batch is the order the training forward routes them: sequence by
sequence, position by position, real tokens only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from relibra.analysis import trace_stats
from relibra.cluster import ModelShape
from relibra.errors import ConfigError
from relibra.trace import RoutingTrace, loads_from_tokens
from relibra.workloads import generate_trace

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
DEFAULT_RL_TRACE = DATA_DIR / "rl_tiny_seed0.npz"  # written by `relibra rl --steps 40 --seed 0`


def load_default_rl_trace() -> RoutingTrace:
    """The real RL routing trace shipped in data/ (see data/README.md and docs/rl.md)."""
    return RoutingTrace.load(DEFAULT_RL_TRACE)


def src_rank_of_sequences(sequences_per_microbatch: int, ep: int) -> np.ndarray:
    """Source rank of each sequence of a micro-batch: int64 [sequences_per_microbatch], contiguous blocks."""
    if ep <= 0 or sequences_per_microbatch % ep:
        raise ConfigError(f"ep={ep} must divide the {sequences_per_microbatch} sequences of a micro-batch")
    return np.arange(sequences_per_microbatch) // (sequences_per_microbatch // ep)


def build_trace(steps: list[list[tuple[np.ndarray, np.ndarray]]], model: ModelShape, ep: int,
                provenance: dict) -> RoutingTrace:
    """A RoutingTrace from recorded routing.

    steps[s][m] = (token_experts int [tokens, layers, top_k], token_src_rank int [tokens]) of
    micro-batch m of step s. Token arrays are padded with -1 to the longest micro-batch.
    """
    if not steps or not steps[0]:
        raise ConfigError("an RL trace needs at least one step with one micro-batch")
    num_mb = len(steps[0])
    if any(len(s) != num_mb for s in steps):
        raise ConfigError("every RL step must have the same number of micro-batches")
    width = max(len(src) for s in steps for _, src in s)
    te = np.full((len(steps), num_mb, width, model.num_layers, model.top_k), -1, dtype=np.int16)
    tsr = np.full((len(steps), num_mb, width), -1, dtype=np.int16)
    for i, s in enumerate(steps):
        for m, (ids, src) in enumerate(s):
            te[i, m, : len(src)] = ids
            tsr[i, m, : len(src)] = src
    loads = loads_from_tokens(te, tsr, ep, model.num_experts)
    tokens_per_mb = int(round(float((tsr >= 0).sum()) / (len(steps) * num_mb)))
    return RoutingTrace(loads, model, ep, max(tokens_per_mb, 1), provenance, te, tsr)


SHIFT_COLUMNS = ("static_skewness", "mb_hot_overlap", "mb_corr", "mb_vs_step_hot_overlap", "step_hot_overlap",
                 "step_corr", "history_hot_overlap", "history_mb_hot_overlap")


def shift_row(name: str, trace: RoutingTrace) -> dict:
    """One row of routing-shift statistics (RoutingTrace.stats) for a comparison table."""
    stats = trace_stats(trace)
    row = {"trace": name, "model": trace.model.name, "ep": trace.ep, "steps": trace.num_steps,
           "micro_batches": trace.num_microbatches,
           "tokens_per_rank": int(round(trace.tokens_per_microbatch / trace.ep))}
    row.update({k: stats[k] for k in SHIFT_COLUMNS})
    return row


def synthetic_comparison(trace: RoutingTrace, model: str = "small", workload: str = "mixed",
                         seed: int = 0) -> list[dict]:
    """Shift statistics of `trace` beside synthetic traces of the same EP, steps and micro-batches.

    Two synthetic rows (relibra.workloads.generate_trace): the generator's default batch (tokens per
    rank derived from the paper's batch and sequence lengths), and the real trace's tokens per rank
    (the generator shortens sequences when a slot holds less than one mean sequence).
    """
    rows = [shift_row("real RL (relibra rl)", trace)]
    shape = dict(seed=seed, micro_batches=trace.num_microbatches)
    default = generate_trace(model, workload, trace.ep, trace.num_steps, **shape)
    default_tokens = max(1, default.tokens_per_microbatch // trace.ep)
    rows.append(shift_row(f"synthetic {workload}, {default_tokens} tokens/rank (default batch)", default))
    tokens = max(1, int(round(trace.tokens_per_microbatch / trace.ep)))
    synth = generate_trace(model, workload, trace.ep, trace.num_steps, tokens_per_rank=tokens, **shape)
    rows.append(shift_row(f"synthetic {workload}, {tokens} tokens/rank", synth))
    return rows
