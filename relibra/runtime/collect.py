"""Gathers to rank 0 without pickle on the wire: bytes as uint8 tensors, arrays as .npz, lists as JSON."""

from __future__ import annotations

import io
import json

import numpy as np
import torch
import torch.distributed as dist


def _gather_bytes(payload: bytes) -> list[bytes] | None:
    """Every rank's `payload` on rank 0 (None elsewhere), as uint8 tensors: no pickle on the wire.
    Tensors live where the backend wants them (NCCL: the current GPU)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    buf = torch.zeros(longest, dtype=torch.uint8)
    buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else buf[:0]
    buf = buf.to(device)
    parts = [torch.zeros(longest, dtype=torch.uint8, device=device) for _ in sizes]
    dist.all_gather(parts, buf)  # NCCL has no gather; every rank receives, rank 0 keeps them
    if dist.get_rank() != 0:
        return None
    return [bytes(p[: int(s.item())].cpu().numpy()) for p, s in zip(parts, sizes)]


def gather_arrays(local: dict) -> dict:
    """Merge every rank's {key tuple of ints and strings: array} on rank 0 (others get {}); sent as
    .npz bytes, each key as the JSON of its tuple, read back without pickle."""
    out = io.BytesIO()
    np.savez(out, **{json.dumps(list(key)): np.asarray(a) for key, a in local.items()})
    merged = {}
    for part in _gather_bytes(out.getvalue()) or []:
        with np.load(io.BytesIO(part), allow_pickle=False) as z:
            for name in z.files:
                merged[tuple(json.loads(name))] = z[name]
    return merged


def gather_list(local) -> list | None:
    """Every rank's JSON-able `local` on rank 0, in rank order (None elsewhere)."""
    parts = _gather_bytes(json.dumps(local).encode())
    return None if parts is None else [json.loads(p) for p in parts]
