"""Local multi-process launcher: N ranks on this machine over gloo, loopback only.

`launch(fn, world_size, *args)` starts N processes with torch.multiprocessing (spawn), sets the
torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free
MASTER_PORT), joins the gloo group and calls fn(rank, world_size, *args) in each; rank 0's return
value comes back through a temporary file. A failure on any rank raises in the caller.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, threads: int, result_path: str, fn, args) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    import torch.distributed as dist

    from relibra.runtime.groups import init_distributed

    init_distributed("gloo")
    try:
        out = fn(rank, world_size, *args)
        if rank == 0:
            with open(result_path, "wb") as f:
                pickle.dump(out, f)
    finally:
        dist.destroy_process_group()


def launch(fn, world_size: int, *args, threads_per_rank: int = 1):
    """Run fn(rank, world_size, *args) on `world_size` local gloo ranks; return rank 0's result."""
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "rank0.pkl")
        mp.start_processes(_worker, args=(world_size, free_port(), threads_per_rank, result_path, fn, args),
                           nprocs=world_size, join=True, start_method="spawn")
        with open(result_path, "rb") as f:
            return pickle.load(f)
