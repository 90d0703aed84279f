"""Measured numbers for the simulator's `cpu-gloo` preset (this machine running the gloo runtime).

    python -m relibra.runtime.calibrate --out data/cpu_gloo_calibration.json

1. Expert compute vs tokens: one SwiGLU expert as the runtime computes it (fc1 to 2 x ffn, SiLU gate,
   fc2, scaled by the routing probability), forward + backward, float32, one thread, median of
   repeats, at several token counts, for the `tiny` and `small` shapes. relibra.costs charges a
   GEMM of t rows f * (t + half_tokens) / rate forward and twice that backward, so forward + backward
   = 3 f (t + h) / rate: a line in t whose slope gives the rate and whose intercept gives h (fit with
   relibra.bench.gemm.fit_gemm_efficiency on 3 f FLOPs per token).
2. gloo all-to-all: equal splits over 4 local ranks, several sizes; t = latency + bytes sent per
   rank / bandwidth (the cost model's collective: slowest rank's bytes over the link plus one latency).
   Also one-way point-to-point (the replica push path) between two ranks.
Timings on a shared 2-core machine are noisy; medians over repeats are reported with their spread.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

GB = 1e9


def time_expert(hidden: int, ffn: int, tokens: int, repeats: int = 7) -> list[float]:
    """Seconds of one expert forward + backward at `tokens` rows (repeats, first warm-up dropped)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    fc1 = (torch.randn(2 * ffn, hidden, generator=g) / hidden**0.5).requires_grad_()
    fc2 = (torch.randn(hidden, ffn, generator=g) / ffn**0.5).requires_grad_()
    x = torch.randn(tokens, hidden, generator=g, requires_grad=True)
    prob = torch.rand(tokens, 1, generator=g)
    out = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        gate, up = F.linear(x, fc1).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, fc2) * prob
        y.sum().backward()
        dt = time.perf_counter() - t0
        x.grad = fc1.grad = fc2.grad = None
        if i:
            out.append(dt)
    return out


def runtime_modules_worker(rank: int, world: int, model: str, expert_tokens: list[int], attention_tokens: list[int],
                           repeats: int) -> dict:
    """Seconds of the runtime's own modules, from a one-rank GPTModel of `model` (relibra.runtime.model):
    - "expert": one routed expert, megatron-core's SequentialMLP expert (fc1, SwiGLU, fc2, scaled by the
      routing probability), forward + backward with gradients accumulating into existing .grad, cycling
      over the rank's experts so weights are not always hot in cache;
    - "attention": the first decoder layer's input RMSNorm and megatron-core self-attention (qkv, rotary,
      causal core, output projection) over one sequence, forward + backward.
    One list of seconds per token count each (first run dropped). Launched as its own one-rank gloo group."""
    import torch

    from relibra.runtime.config import ModelConfig, NodeLayout
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


def expert_curve(hidden: int, ffn: int, token_counts: list[int], repeats: int = 7,
                 samples: list[list[float]] | None = None) -> dict:
    """Median forward + backward seconds per token count and the GEMM fit; `samples` (one list of seconds
    per token count) when measured elsewhere (runtime_modules_worker), else a bare SwiGLU (time_expert)."""
    from relibra.bench.gemm import fit_gemm_efficiency

    if samples is None:
        samples = [time_expert(hidden, ffn, n, repeats) for n in token_counts]
    med = [float(np.median(s)) for s in samples]
    flops_fwd = 6 * hidden * ffn  # SwiGLU forward FLOPs per token
    fit = fit_gemm_efficiency(token_counts, med, 3 * flops_fwd)  # forward + backward
    return {"hidden": hidden, "ffn": ffn, "tokens": token_counts, "median_s": med,
            "p10_s": [float(np.percentile(s, 10)) for s in samples],
            "p90_s": [float(np.percentile(s, 90)) for s in samples],
            "forward_flops_per_token": flops_fwd, "fit_forward_backward": fit}


def gloo_worker(rank: int, world: int, floats_per_peer: list[int], repeats: int) -> dict:
    import torch
    import torch.distributed as dist

    a2a, p2p = [], []
    for n in floats_per_peer:
        x = torch.randn(n * world)
        y = torch.empty_like(x)
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_to_all_single(y, x)
            dt = time.perf_counter() - t0
            if i:
                times.append(dt)
        worst = torch.tensor(times)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the slowest rank sets a collective's time
        a2a.append(worst.tolist())
        buf = torch.randn(n)
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            dt = (time.perf_counter() - t0) / 2  # one way
            if i:
                times.append(dt)
        p2p.append(times)
    return {"a2a": a2a, "p2p": p2p} if rank == 0 else {}


def fit_latency_bandwidth(bytes_: list[float], seconds: list[float]) -> dict:
    """t = latency + bytes / bandwidth by least squares weighted by 1 / t (non-negative)."""
    from scipy.optimize import nnls

    b = np.asarray(bytes_, dtype=np.float64)
    s = np.asarray(seconds, dtype=np.float64)
    w = 1.0 / s
    (inv_bw, lat), _ = nnls(np.stack([b * w, w], axis=1), s * w)
    pred = lat + inv_bw * b
    return {"latency_s": float(lat), "GBps": float(1.0 / inv_bw / GB) if inv_bw > 0 else float("inf"),
            "max_rel_err": float(np.max(np.abs(pred - s) / s))}


def calibrate(world: int = 4, repeats: int = 7, quick: bool = False) -> dict:
    import torch

    from relibra.runtime.launch import launch

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
        "how": "relibra.runtime.calibrate: float32, torch.set_num_threads(1), medians of repeats after one warm-up; "
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


def time_optimizer(num_params: int, repeats: int = 7) -> list[float]:
    """Seconds of one torch AdamW step over `num_params` float32 parameters (one tensor, one thread)."""
    import torch

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


def fit_cpu_preset(model: str = "moe-cpu", world: int = 2, repeats: int = 7, quick: bool = False) -> dict:
    """Micro-benchmarks of this machine for `model` at `world` gloo ranks, one thread per rank, and the
    cluster preset fitted from them (never from the runs it predicts):

    - routed expert: forward + backward of one expert of `model` as the runtime runs it (its
      megatron-core expert module, gradients accumulating, experts in rotation) at several token
      counts -> matmul_tflops and gemm_half_tokens (relibra.bench.gemm.fit_gemm_efficiency on 3 x forward FLOPs);
    - gloo all-to-all over `world` ranks (equal splits) -> nvlink_GBps = rdma_GBps (one loopback link)
      and collective_latency_s; gloo point-to-point (the replica and migration path) is reported;
    - AdamW step over 1M..8M float32 parameters -> memory_GBps under the cost model's optimizer
      traffic (params x (2 x optimizer bytes + 2 x weight bytes) per step).
    - the runtime's attention block (megatron-core's input RMSNorm and self-attention over one sequence)
      forward + backward at several token counts -> attention_efficiency (the core's share of matmul_tflops; on CPU small
      heads make it far below a GPU's flash attention).
    Returns {"how", "machine", "expert", "gloo_all_to_all", "gloo_p2p", "optimizer", "preset"}.
    """
    import torch

    from relibra.cluster import get_model
    from relibra.runtime.launch import launch

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


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m relibra.runtime.calibrate")
    add_arguments(p)
    return run(p.parse_args(argv))


def add_arguments(p) -> None:
    p.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    p.add_argument("--model", default=None, help="fit the cpu-gloo-fit preset for this model's expert shape "
                   "(e.g. moe-cpu); without it, the older 4-rank tiny/small calibration")
    p.add_argument("--world", type=int, default=2, help="gloo ranks of the all-to-all benchmark (default 2)")


def run(args) -> int:
    from relibra.errors import ConfigError

    if args.repeats <= 0 or args.world < 2:
        raise ConfigError(f"--repeats must be positive and --world at least 2, got {args.repeats}, {args.world}")
    if args.out:
        from relibra.paths import check_output_path

        check_output_path(args.out, kind="file")
    if args.model:
        result = fit_cpu_preset(args.model, args.world, args.repeats, args.quick)
        text = json.dumps(result, indent=1)
        if args.out:
            _write_atomic(args.out, text + "\n")
        print(json.dumps({"expert_fit": result["expert"]["fit_forward_backward"],
                          "gloo_all_to_all_fit": result["gloo_all_to_all"]["fit"],
                          "gloo_p2p_fit": result["gloo_p2p"]["fit"], "optimizer_fit": result["optimizer"]["fit"],
                          "attention_fit": {k: v for k, v in result["attention"]["fit"].items()
                                            if k in ("attention_efficiency", "max_rel_err")},
                          "preset": result["preset"]}, indent=1))
        return 0
    result = calibrate(repeats=args.repeats, quick=args.quick)
    text = json.dumps(result, indent=2)
    if args.out:
        _write_atomic(args.out, text + "\n")
    print(json.dumps({"expert_tiny_fit": result["expert"]["tiny"]["fit_forward_backward"],
                      "expert_small_fit": result["expert"]["small"]["fit_forward_backward"],
                      "gloo_all_to_all_fit": result["gloo_all_to_all"]["fit"], "gloo_p2p_fit": result["gloo_p2p"]["fit"],
                      "cpu_gloo_preset": result["cpu_gloo_preset"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
