"""The simulator's CPU presets fitted from micro-benchmarks of this machine running the gloo runtime
(`relibra calibrate`, relibra.bench.calibrate):

- fit_cpu_preset (`--model`): the `cpu-gloo-fit` preset for one model, from the runtime's own modules
  (relibra.bench.runtime_modules), gloo's links (relibra.bench.gloo) and AdamW's memory traffic;
- calibrate_cpu_gloo (no `--model`): the 4-rank measurements behind the `cpu-gloo` preset
  (data/cpu_gloo_calibration.json), a bare SwiGLU expert of the `tiny` and `small` shapes.

Expert compute: relibra.costs charges a GEMM of t rows f * (t + half_tokens) / rate forward and twice
that backward, so forward + backward = 3 f (t + h) / rate: a line in t whose slope gives the rate and
whose intercept gives h (relibra.bench.gemm.fit_gemm_efficiency on 3 f FLOPs per token).
gloo all-to-all: equal splits over local ranks, several sizes; t = latency + bytes sent per rank /
bandwidth (relibra.bench.gloo.fit_latency_bandwidth). Timings on a shared machine are noisy; medians
over repeats are reported with their spread.
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np
import torch

from relibra.bench.gemm import fit_gemm_efficiency, time_expert_forward_backward
from relibra.bench.gloo import fit_latency_bandwidth, gloo_worker
from relibra.bench.runtime_modules import fit_attention_efficiency, runtime_modules_worker
from relibra.cluster import get_model
from relibra.runtime.launch import launch


def expert_curve(hidden: int, ffn: int, token_counts: list[int], repeats: int = 7,
                 samples: list[list[float]] | None = None) -> dict:
    """Median forward + backward seconds per token count and the GEMM fit; `samples` (one list of seconds
    per token count) when measured elsewhere (runtime_modules_worker), else a bare SwiGLU expert
    (time_expert_forward_backward, float32 on this CPU)."""
    if samples is None:
        samples = [time_expert_forward_backward(hidden, ffn, n, repeats=repeats) for n in token_counts]
    med = [float(np.median(s)) for s in samples]
    flops_fwd = 6 * hidden * ffn  # SwiGLU forward FLOPs per token
    fit = fit_gemm_efficiency(token_counts, med, 3 * flops_fwd)  # forward + backward
    return {"hidden": hidden, "ffn": ffn, "tokens": token_counts, "median_s": med,
            "p10_s": [float(np.percentile(s, 10)) for s in samples],
            "p90_s": [float(np.percentile(s, 90)) for s in samples],
            "forward_flops_per_token": flops_fwd, "fit_forward_backward": fit}


def time_optimizer(num_params: int, repeats: int = 7) -> list[float]:
    """Seconds of one torch AdamW step over `num_params` float32 parameters (one tensor, one thread)."""
    p = torch.nn.Parameter(torch.randn(num_params))
    p.grad = torch.randn(num_params)
    opt = torch.optim.AdamW([p], lr=1e-3)
    out = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        opt.step()
        if i:
            out.append(time.perf_counter() - t0)
    return out


def calibrate_cpu_gloo(world: int = 4, repeats: int = 7, quick: bool = False) -> dict:
    """The `cpu-gloo` preset's measurements: bare SwiGLU experts of the `tiny` (64 x 128) and `small`
    (128 x 256) shapes at several token counts, gloo all-to-all over `world` local ranks and
    point-to-point between two. Returns {"how", "machine", "expert", "gloo_all_to_all", "gloo_p2p",
    "cpu_gloo_preset"}."""
    torch.set_num_threads(1)
    tokens = [16, 64, 256, 1024] if quick else [8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    curves = {"tiny": expert_curve(64, 128, tokens, repeats), "small": expert_curve(128, 256, tokens, repeats)}
    floats = [256, 4096, 65536] if quick else [64, 256, 1024, 4096, 16384, 65536, 262144]
    g = launch(gloo_worker, world, floats, repeats)
    a2a_bytes = [n * 4 * (world - 1) for n in floats]  # sent by each rank to the others
    a2a_med = [float(np.median(t)) for t in g["a2a"]]
    p2p_bytes = [n * 4 for n in floats]
    p2p_med = [float(np.median(t)) for t in g["p2p"]]
    out = {
        "how": "relibra.bench.cpu_preset: float32, torch.set_num_threads(1), medians of repeats after one warm-up; "
               f"gloo over loopback with {world} local ranks; machine shared with other jobs (noisy)",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "expert": curves,
        "gloo_all_to_all": {"ranks": world, "bytes_sent_per_rank": a2a_bytes, "median_s": a2a_med,
                            "p10_s": [float(np.percentile(t, 10)) for t in g["a2a"]],
                            "p90_s": [float(np.percentile(t, 90)) for t in g["a2a"]],
                            "fit": fit_latency_bandwidth(a2a_bytes, a2a_med)},
        "gloo_p2p": {"bytes": p2p_bytes, "median_s": p2p_med, "fit": fit_latency_bandwidth(p2p_bytes, p2p_med)},
    }
    tiny_fit = curves["tiny"]["fit_forward_backward"]
    out["cpu_gloo_preset"] = {
        "matmul_tflops": tiny_fit["matmul_tflops"], "gemm_half_tokens": tiny_fit["gemm_half_tokens"],
        "nvlink_GBps": out["gloo_all_to_all"]["fit"]["GBps"], "rdma_GBps": out["gloo_all_to_all"]["fit"]["GBps"],
        "collective_latency_s": out["gloo_all_to_all"]["fit"]["latency_s"],
        "note": "expert fit of the `tiny` shape (the runtime's default); loopback makes intra- and inter-node "
                "links the same, so nvlink_GBps = rdma_GBps = the all-to-all fit",
    }
    return out


def fit_cpu_preset(model: str = "moe-cpu", world: int = 2, repeats: int = 7, quick: bool = False) -> dict:
    """Micro-benchmarks of this machine for `model` at `world` gloo ranks, one thread per rank, and the
    cluster preset fitted from them (never from the runs it predicts):

    - routed expert: forward + backward of one expert of `model` as the runtime runs it (its
      megatron-core expert module, gradients accumulating, experts in rotation) at several token
      counts -> matmul_tflops and gemm_half_tokens (fit_gemm_efficiency on 3 x forward FLOPs);
    - gloo all-to-all over `world` ranks (equal splits) -> nvlink_GBps = rdma_GBps (one loopback link)
      and collective_latency_s; gloo point-to-point (the replica and migration path) is reported;
    - AdamW step over 1M..8M float32 parameters -> memory_GBps under the cost model's optimizer
      traffic (params x (2 x optimizer bytes + 2 x weight bytes) per step).
    - the runtime's attention block (megatron-core's input RMSNorm and self-attention over one sequence)
      forward + backward at several token counts -> attention_efficiency (the core's share of matmul_tflops; on CPU small
      heads make it far below a GPU's flash attention).
    Returns {"how", "machine", "expert", "gloo_all_to_all", "gloo_p2p", "optimizer", "preset"}.
    """
    shape = get_model(model)
    torch.set_num_threads(1)
    tokens = [32, 128, 512, 1024] if quick else [16, 32, 64, 128, 256, 512, 1024, 2048]
    att_tokens = [256, 1024] if quick else [128, 256, 512, 1024, 2048]
    measured = launch(runtime_modules_worker, 1, model, tokens, att_tokens, repeats)
    curve = expert_curve(shape.hidden, shape.moe_ffn, tokens, repeats, samples=measured["expert"])
    curve["module"] = "the runtime's megatron-core SequentialMLP expert (runtime_modules_worker)"
    floats = [4096, 65536, 262144] if quick else [1024, 4096, 16384, 65536, 262144, 1048576]
    g = launch(gloo_worker, world, floats, repeats)
    a2a_bytes = [n * 4 * (world - 1) for n in floats]
    a2a_med = [float(np.median(t)) for t in g["a2a"]]
    p2p_bytes = [n * 4 for n in floats]
    p2p_med = [float(np.median(t)) for t in g["p2p"]]
    a2a_fit = fit_latency_bandwidth(a2a_bytes, a2a_med)
    sizes = [1 << 20, 1 << 22] if quick else [1 << 20, 1 << 21, 1 << 22, 1 << 23]
    opt_med = [float(np.median(time_optimizer(n, repeats))) for n in sizes]
    per_param = 2 * shape.optimizer_bytes_per_param + 2 * shape.bytes_per_param
    opt_fit = fit_latency_bandwidth([n * per_param for n in sizes], opt_med)
    fit = curve["fit_forward_backward"]
    att_med = [float(np.median(t)) for t in measured["attention"]]
    att_fit = fit_attention_efficiency(shape, att_tokens, att_med, fit["matmul_tflops"], fit["gemm_half_tokens"])
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "how": f"relibra calibrate --model {model} --world {world}: float32, torch.set_num_threads(1), medians of "
               f"{repeats} repeats after one warm-up; gloo over loopback with {world} local ranks",
        "machine": {"cpus": cpus, "processor": platform.processor() or platform.machine(),
                    "platform": platform.platform(), "node": platform.node(), "torch": torch.__version__,
                    "load_average_1min": round(os.getloadavg()[0], 2),
                    "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())},
        "model": model, "world": world, "expert": curve,
        "gloo_all_to_all": {"ranks": world, "bytes_sent_per_rank": a2a_bytes, "median_s": a2a_med, "fit": a2a_fit},
        "gloo_p2p": {"bytes": p2p_bytes, "median_s": p2p_med, "fit": fit_latency_bandwidth(p2p_bytes, p2p_med)},
        "optimizer": {"params": sizes, "median_s": opt_med, "bytes_per_param": per_param, "fit": opt_fit},
        "attention": {"tokens": att_tokens, "median_s": att_med, "fit": att_fit},
        "preset": {"name": "cpu-gloo-fit", "num_nodes": 1, "gpus_per_node": world,
                   "matmul_tflops": fit["matmul_tflops"], "gemm_half_tokens": fit["gemm_half_tokens"],
                   "nvlink_GBps": a2a_fit["GBps"], "rdma_GBps": a2a_fit["GBps"],
                   "collective_latency_s": a2a_fit["latency_s"], "memory_GBps": opt_fit["GBps"],
                   "attention_efficiency": att_fit["attention_efficiency"],
                   "dispatcher": "alltoall", "shared_link": True, "hbm_bytes": 16e9},
    }
