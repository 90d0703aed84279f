"""FLOPs to seconds: GEMM timing on a topology, and the per-token FLOPs of the model's parts.

The FLOPs and bytes themselves are defined once, on relibra.cluster.ModelShape (the planner uses
the same definitions); this module turns them into seconds with the topology's rates.
"""

from __future__ import annotations

import numpy as np

from relibra.cluster import ModelShape, Topology


def gemm_seconds(tokens, flops_per_token: float, topology: Topology, copies=1) -> np.ndarray:
    """Seconds of GEMMs with `tokens` rows in all, split over `copies` weight matrices (0 rows cost nothing).

    A GEMM of t rows and f FLOPs per row takes f * (t + gemm_half_tokens) / rate seconds: a fixed
    cost worth gemm_half_tokens rows (weight reads, launch, tile waste) plus a linear part, so it
    reaches half the large-GEMM rate at gemm_half_tokens rows. With several copies (experts) the
    fixed cost is paid once per copy. tokens, copies: any shapes that broadcast; float64 out.
    """
    t = np.asarray(tokens, dtype=np.float64)
    c = np.asarray(copies, dtype=np.float64)
    return np.where(t > 0, flops_per_token * (t + topology.gemm_half_tokens * c) / topology.matmul_flops_per_s, 0.0)


def attention_core_seconds(flops, topology: Topology) -> np.ndarray:
    """Seconds of attention-core FLOPs (flash attention reaches topology.attention_efficiency of the rate)."""
    return np.asarray(flops, dtype=np.float64) / (topology.matmul_flops_per_s * topology.attention_efficiency)


def attention_core_flops(model: ModelShape, src_tokens: np.ndarray, seq_len: int,
                         seq_lens: np.ndarray | None = None, split: int = 1) -> np.ndarray:
    """Forward attention-core FLOPs of one layer per (micro-batch, source rank): float64 [M, ep].

    seq_lens: int [M, ep, max_seqs] the lengths of the sequences on each source rank in each
    micro-batch (0-padded), from the trace; None: every token sits in a sequence of seq_len tokens
    (src_tokens / seq_len sequences per rank), the CostParams assumption. split: ranks every sequence
    is split over (CP x TP, CostParams.sequence_split): seq_lens then hold each rank's piece, and the rank's
    core is the whole sequence's (piece x split) over split.
    """
    if seq_lens is not None:
        if split > 1:
            return model.attention_core_flops(np.asarray(seq_lens, dtype=np.int64) * split) / split
        return model.attention_core_flops(seq_lens)
    return np.asarray(src_tokens, dtype=np.float64) * model.attention_core_flops(np.array([seq_len])) / seq_len


# ---- per-token FLOPs and parameters: thin names over relibra.cluster.ModelShape -------------------
def expert_flops_per_token(model: ModelShape) -> float:
    """Forward FLOPs of one routed expert per token: ModelShape.expert_flops_per_token (6 * hidden * moe_ffn)."""
    return model.expert_flops_per_token


def moe_layer_dense_flops_per_token(model: ModelShape) -> float:
    """Forward FLOPs per token of an MoE layer's router and shared experts (ModelShape)."""
    return model.moe_layer_dense_flops_per_token


def attention_flops_per_token(model: ModelShape, seq_len: int) -> tuple[float, float]:
    """(projection FLOPs, attention-core FLOPs) of one layer's attention forward for one token of a
    sequence of seq_len tokens (causal: the core attends to (seq_len + 1) / 2 positions on average)."""
    core = float(model.attention_core_flops(np.array([seq_len]))) / seq_len
    return model.attention_projection_flops_per_token, core


def dense_params_per_gpu(model: ModelShape) -> int:
    """Parameters every EP rank holds whole (ModelShape.dense_params)."""
    return model.dense_params
