"""gloo's links on this machine: the all-to-all and point-to-point times of local ranks over loopback,
and the cost model's link fit t = latency + bytes / bandwidth (relibra.costs charges a collective as
the slowest rank's bytes over the link plus one latency).

gloo_worker runs in each rank of relibra.runtime.launch; fit_latency_bandwidth turns its medians
(or any other bytes-vs-seconds curve, such as AdamW's memory traffic) into a latency and a bandwidth.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import nnls

GB = 1e9


def gloo_worker(rank: int, world: int, floats_per_peer: list[int], repeats: int) -> dict:
    """One rank's part: for each n in floats_per_peer, the all-to-all of n float32 per peer (equal
    splits; each repeat's seconds is the slowest rank's) and a point-to-point round trip of n float32
    between ranks 0 and 1 (halved: one way). First run of each dropped.
    Returns, on rank 0, {"a2a": [[s] * repeats] per size, "p2p": [[s] * repeats] per size}; {} elsewhere."""
    # torch loads inside the rank: a spawned rank imports this module (to unpickle the function) before
    # relibra.runtime.launch sets up its watchdog and one-line error report.
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
    """t = latency + bytes / bandwidth by least squares weighted by 1 / t (non-negative).
    Returns {"latency_s", "GBps", "max_rel_err"}."""
    b = np.asarray(bytes_, dtype=np.float64)
    s = np.asarray(seconds, dtype=np.float64)
    w = 1.0 / s
    (inv_bw, lat), _ = nnls(np.stack([b * w, w], axis=1), s * w)
    pred = lat + inv_bw * b
    return {"latency_s": float(lat), "GBps": float(1.0 / inv_bw / GB) if inv_bw > 0 else float("inf"),
            "max_rel_err": float(np.max(np.abs(pred - s) / s))}
