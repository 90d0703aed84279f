"""Workload generator benchmark (`relibra bench workload`) and the calibration table of generated traces
(`relibra trace calibrate`): static-placement skewness and routing-shift statistics per model and EP size."""

from __future__ import annotations

import time

from relibra.analysis import trace_stats
from relibra.cluster import PAPER_MODELS
from relibra.progress import progress as tqdm
from relibra.workloads import WorkloadConfig, generate_trace


def benchmark_generate(model: str = "qwen3-235b-a22b", workload: str = "mixed", ep: int = 32, steps: int = 1,
                       seed: int = 0, micro_batches: int = 32, tokens_per_rank: int | None = None) -> dict:
    """Time `generate_trace` once and report seconds per step, cells and tokens per second.

    seconds is wall-clock time; cpu_seconds is this process's CPU time (all its threads), which
    shows the generator's own cost when other work shares the machine.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    trace = generate_trace(model, workload, ep, steps, seed, micro_batches, tokens_per_rank)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    cells = trace.loads.size
    tokens = steps * micro_batches * trace.tokens_per_microbatch
    return {
        "model": trace.model.name, "workload": workload, "ep": ep, "steps": steps,
        "micro_batches": micro_batches, "tokens_per_rank": trace.tokens_per_microbatch // ep,
        "seconds": seconds, "seconds_per_step": seconds / steps,
        "cpu_seconds": cpu_seconds, "cpu_seconds_per_step": cpu_seconds / steps,
        "load_cells": int(cells), "cells_per_second": cells / seconds,
        "tokens_per_second": tokens / seconds,
        "static_skewness": trace.static_skewness(),
    }


SHIFT_KEYS = ("mb_hot_overlap", "mb_corr", "mb_vs_step_hot_overlap", "step_hot_overlap", "step_corr",
              "history_hot_overlap", "history_mb_hot_overlap")


def calibration_table(models: tuple[str, ...] = PAPER_MODELS,
                      workloads: tuple[str, ...] = ("mixed",), eps: tuple[int, ...] = (8, 16, 32, 64),
                      steps: int = 4, micro_batches: int | None = None, seed: int = 0, tokens_per_rank: int | None = None,
                      config: WorkloadConfig | None = None, progress: bool = False) -> list[dict]:
    """Static-placement skewness and shift statistics of generated traces, one row per (model, workload, EP).

    Each row: model, workload, ep, static_skewness (mean over micro-batches and layers of max/mean
    tokens per rank under static contiguous placement), static_skewness_p95, the SHIFT_KEYS of
    `relibra.analysis.shift_stats`, and seconds (generation time of the whole trace).
    """
    grid = [(m, w, ep) for m in models for w in workloads for ep in eps]
    if progress:
        grid = tqdm(grid, desc="calibration", unit="trace")
    rows = []
    for model, workload, ep in grid:
        t0 = time.perf_counter()
        trace = generate_trace(model, workload, ep, steps, seed, micro_batches, tokens_per_rank, config=config)
        seconds = time.perf_counter() - t0
        st = trace_stats(trace)
        rows.append({"model": model, "workload": workload, "ep": ep,
                     "static_skewness": st["static_skewness"], "static_skewness_p95": st["static_skewness_p95"],
                     **{key: st[key] for key in SHIFT_KEYS}, "seconds": seconds})
    return rows
