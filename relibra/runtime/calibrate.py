"""Measured numbers for the simulator's `cpu-gloo` preset (this machine running the gloo runtime).

    python -m relibra.runtime.calibrate --out data/cpu_gloo_calibration.json

1. Expert compute vs tokens: one SwiGLU expert as the runtime computes it (fc1 to 2 x ffn, SiLU gate,
   fc2, scaled by the routing probability), forward + backward, float32, one thread, median of
   repeats, at several token counts, for the `tiny` and `small` shapes. relibra.costs charges a
   GEMM of t rows f * (t + half_tokens) / rate forward and twice that backward, so forward + backward
   = 3 f (t + h) / rate: a line in t whose slope gives the rate and whose intercept gives h (fit with
   relibra.costs.fit_gemm_efficiency on 3 f FLOPs per token).
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


def expert_curve(hidden: int, ffn: int, token_counts: list[int], repeats: int = 7) -> dict:
    from relibra.costs import fit_gemm_efficiency

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m relibra.runtime.calibrate")
    p.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    args = p.parse_args(argv)
    result = calibrate(repeats=args.repeats, quick=args.quick)
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(json.dumps({"expert_tiny_fit": result["expert"]["tiny"]["fit_forward_backward"],
                      "expert_small_fit": result["expert"]["small"]["fit_forward_backward"],
                      "gloo_all_to_all_fit": result["gloo_all_to_all"]["fit"], "gloo_p2p_fit": result["gloo_p2p"]["fit"],
                      "cpu_gloo_preset": result["cpu_gloo_preset"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
