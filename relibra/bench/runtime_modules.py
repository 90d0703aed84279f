"""The runtime's own modules timed on this machine, and the attention fit made from them.

runtime_modules_worker builds a one-rank GPTModel (relibra.runtime.model) and times, forward +
backward, one routed expert (megatron-core's SequentialMLP expert, as the runtime runs it) and the first
decoder layer's attention block. fit_attention_efficiency finds the cost model's attention_efficiency
that makes its dense block match the measured attention seconds.
"""

from __future__ import annotations

import time

import numpy as np

from relibra.runtime.config import ModelConfig, NodeLayout


def runtime_modules_worker(rank: int, world: int, model: str, expert_tokens: list[int], attention_tokens: list[int],
                           repeats: int) -> dict:
    """Seconds of the runtime's own modules, from a one-rank GPTModel of `model` (relibra.runtime.model):
    - "expert": one routed expert, megatron-core's SequentialMLP expert (fc1, SwiGLU, fc2, scaled by the
      routing probability), forward + backward with gradients accumulating into existing .grad, cycling
      over the rank's experts so weights are not always hot in cache;
    - "attention": the first decoder layer's input RMSNorm and megatron-core self-attention (qkv, rotary,
      causal core, output projection) over one sequence, forward + backward.
    One list of seconds per token count each (first run dropped). Launched as its own one-rank gloo group."""
    # torch and megatron-core load inside the rank, as in relibra.runtime.train.worker: a spawned rank
    # imports this module (to unpickle the function) before relibra.runtime.launch sets up its watchdog,
    # warning filters and one-line error report.
    import torch

    from relibra.runtime.groups import build_groups
    from relibra.runtime.model import build_model
    from relibra.runtime.slots import ExpertSlots

    cfg = ModelConfig.from_preset(model)
    pgc = build_groups(NodeLayout(world, 1)).collection()
    net = build_model(cfg, pgc, max(attention_tokens))
    home = np.zeros((cfg.num_layers, cfg.shape.num_experts), dtype=np.int64)
    mlps = ExpertSlots(net, pgc.ep, home, 0).home_mlps(0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)

    def timed(fn) -> list[float]:
        times = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            fn(i)
            if i:
                times.append(time.perf_counter() - t0)
        return times

    expert = []
    for n in expert_tokens:
        x = torch.randn(n, cfg.hidden, generator=g, requires_grad=True)
        prob = torch.rand(n, generator=g)
        expert.append(timed(lambda i: mlps[i % len(mlps)](x, prob)[0].sum().backward()))
    layer = net.decoder.layers[0]
    attention = []
    for n in attention_tokens:
        x = torch.randn(n, 1, cfg.hidden, generator=g, requires_grad=True)
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1).view(1, 1, n, n)
        rotary = net.rotary_pos_emb(n)
        attention.append(timed(lambda i: layer.self_attention(layer.input_layernorm(x), attention_mask=mask,
                                                              rotary_pos_emb=rotary)[0].sum().backward()))
    return {"expert": expert, "attention": attention}


def fit_attention_efficiency(shape, token_counts: list[int], seconds: list[float], matmul_tflops: float,
                             gemm_half_tokens: float) -> dict:
    """attention_efficiency such that the cost model's dense block (projection GEMMs at the expert-fitted
    rate and half-tokens, plus the causal core at rate x efficiency; backward twice the forward) matches the
    measured forward + backward seconds, least squares over token counts (one sequence per rank, as the
    runtime runs it). Returns {"attention_efficiency", "max_rel_err", "projection_s", "core_flops"}."""
    rate = matmul_tflops * 1e12
    t = np.asarray(token_counts, dtype=np.float64)
    proj = shape.attention_projection_flops_per_token * (t + gemm_half_tokens) / rate  # forward seconds
    core = np.array([float(shape.attention_core_flops(np.array([n]))) for n in token_counts])  # forward FLOPs
    resid = np.asarray(seconds, dtype=np.float64) / 3.0 - proj  # forward-equivalent seconds left for the core
    c = core / rate
    inv_eff = float(np.dot(resid, c) / np.dot(c, c))
    eff = float(min(1.0, max(inv_eff, 1e-6) ** -1))
    pred = 3.0 * (proj + c / eff)
    return {"attention_efficiency": eff, "max_rel_err": float(np.max(np.abs(pred - seconds) / np.asarray(seconds))),
            "projection_s": (3.0 * proj).tolist(), "core_flops": core.tolist()}
