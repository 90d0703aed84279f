"""GEMM calibration: time a SwiGLU expert at several token counts and fit the cost model's GEMM curve
(Topology.matmul_tflops and gemm_half_tokens, relibra.costs.flops.gemm_seconds) by non-negative least
squares. `relibra calibrate` (relibra.bench.cpu_preset) and the device checks (relibra.bench.device)
fit their presets with it."""

from __future__ import annotations

import os
import platform
import time

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import nnls

from relibra.errors import ConfigError


def fit_gemm_efficiency(tokens, seconds, flops_per_token: float) -> dict:
    """Fit the rate and half-saturation point of flops.gemm_seconds to measured GEMM times.

    tokens: rows of each measured GEMM (one expert's tokens); seconds: its measured time;
    flops_per_token: FLOPs per row (2 * expert_params for a SwiGLU expert forward).
    gemm_seconds makes seconds = a * tokens + b with a = flops_per_token / rate and b = a * half_tokens,
    so a non-negative least-squares line gives both. Returns {"matmul_tflops", "gemm_half_tokens",
    "rmse_s", "max_rel_err"}; pass the first two to Topology.with_changes.
    """
    t = np.asarray(tokens, dtype=np.float64).ravel()
    s = np.asarray(seconds, dtype=np.float64).ravel()
    if t.shape != s.shape or t.size < 2:
        raise ConfigError(f"fit_gemm_efficiency: need at least two (tokens, seconds) pairs of equal length, "
                          f"got {t.size} tokens and {s.size} seconds")
    if len(np.unique(t)) < 2:
        raise ConfigError("fit_gemm_efficiency: need at least two distinct token counts")
    if (t <= 0).any() or (s <= 0).any() or not np.isfinite(s).all():
        raise ConfigError("fit_gemm_efficiency: token counts and seconds must be positive and finite")
    if flops_per_token <= 0:
        raise ConfigError(f"fit_gemm_efficiency: flops_per_token must be positive, got {flops_per_token}")
    # Relative errors matter (times span orders of magnitude): weight each row by 1 / seconds.
    w = 1.0 / s
    (a, b), _ = nnls(np.stack([t * w, w], axis=1), s * w)
    if a <= 0:
        raise ConfigError("fit_gemm_efficiency: time does not grow with tokens; the measurements do not fit the curve")
    pred = a * t + b
    return {"matmul_tflops": flops_per_token / a / 1e12, "gemm_half_tokens": max(b / a, 1e-9),
            "rmse_s": float(np.sqrt(np.mean((pred - s) ** 2))), "max_rel_err": float(np.max(np.abs(pred - s) / s))}


def measure_expert_gemm(hidden: int, ffn: int, token_counts, device: str = "cpu", dtype: str = "float32",
                        repeats: int = 5, threads: int | None = 1) -> dict:
    """Time one SwiGLU expert forward (x @ W_gate, x @ W_up, silu * , @ W_down) at several token counts.

    Returns {"tokens": [...], "seconds": [...] (median of `repeats`), "flops_per_token": 6 * hidden * ffn,
    "device", "dtype", "threads"}; feed it to fit_gemm_efficiency to calibrate a topology.
    """
    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cpu").manual_seed(0)
    w_gate = torch.randn(hidden, ffn, generator=gen).to(device=device, dtype=dt)
    w_up = torch.randn(hidden, ffn, generator=gen).to(device=device, dtype=dt)
    w_down = torch.randn(ffn, hidden, generator=gen).to(device=device, dtype=dt)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    seconds = []
    for n in token_counts:
        x = torch.randn(int(n), hidden, generator=gen).to(device=device, dtype=dt)
        times = []
        for i in range(repeats + 1):
            sync()
            t0 = time.perf_counter()
            y = (F.silu(x @ w_gate) * (x @ w_up)) @ w_down
            sync()
            if i:  # the first run warms caches and allocators
                times.append(time.perf_counter() - t0)
        del y
        seconds.append(float(np.median(times)))
    return {"tokens": [int(n) for n in token_counts], "seconds": seconds, "flops_per_token": 6 * hidden * ffn,
            "device": device, "dtype": dtype, "threads": threads}


def time_expert_forward_backward(hidden: int, ffn: int, tokens: int, device: str = "cpu", dtype: str = "float32",
                                  repeats: int = 7) -> list[float]:
    """Seconds of one routed SwiGLU expert, forward + backward, at `tokens` rows: fc1 [2 * ffn, hidden] to
    gate and up, SiLU(gate) * up, fc2 [hidden, ffn], times the routing probability, as megatron-core's
    SequentialMLP runs an expert. One entry per repeat, the first (warm-up) run dropped; on CUDA timed
    by events, elsewhere by the wall clock."""
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cpu").manual_seed(0)
    fc1 = (torch.randn(2 * ffn, hidden, generator=g) / hidden**0.5).to(device, dt).requires_grad_()
    fc2 = (torch.randn(hidden, ffn, generator=g) / ffn**0.5).to(device, dt).requires_grad_()
    x = torch.randn(tokens, hidden, generator=g).to(device, dt).requires_grad_()
    prob = torch.rand(tokens, 1, generator=g).to(device, dt)
    grad_out = torch.ones(tokens, hidden, device=device, dtype=dt)
    cuda = device.startswith("cuda")
    seconds = []
    for i in range(repeats + 1):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        gate, up = F.linear(x, fc1).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, fc2) * prob
        y.backward(grad_out)
        if cuda:
            end.record()
            end.synchronize()
            run_s = start.elapsed_time(end) / 1e3
        else:
            run_s = time.perf_counter() - t0
        x.grad = fc1.grad = fc2.grad = None
        if i:  # the first run warms caches and allocators
            seconds.append(run_s)
    return seconds


def machine_description() -> str:
    """CPU model, logical CPUs and OS of this machine, for the record of a measurement."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"
