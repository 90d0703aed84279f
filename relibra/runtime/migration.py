"""Reordering: move expert homes between ranks with their parameters and AdamW moments, all or nothing.

Protocol (every rank, in lock step):
  1. stage: for every layer whose placement changes, build this rank's new home slots off to the
     side: experts staying on the rank are copied locally (their slot position may change), arriving
     experts are received point-to-point from their old home. Payload per expert: fc1 and fc2
     weights, AdamW exp_avg and exp_avg_sq of each, and the step count. Live weights and optimizer
     state are not touched.
  2. vote: all-reduce(MIN) of "my staging succeeded". A failure in any transfer (packing, posting
     isend / irecv, waiting on them, unpacking; e.g. an injected exception) is caught locally; the
     rank keeps the protocol going (it sends zeros where its payload failed) so nobody blocks, and
     votes no.
  3. commit (only if every rank voted yes): copy the staged tensors into the slot parameters and
     optimizer state, and switch the placement. Otherwise every rank drops its staging and
     raises MigrationError: the old placement stays, consistent everywhere.
A rank that dies mid-transfer is beyond this protocol: the vote's all-reduce fails (at once, or after
the collective timeout) and the launcher stops the run naming the rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from relibra.errors import RelibraError
from relibra.runtime.placement import local_home_experts


class MigrationError(RelibraError):
    """A migration was rolled back; every rank kept the previous placement."""


@dataclass(frozen=True)
class InjectedFailure:
    """Fail transfer number `transfer` (in the global transfer order) on rank `rank`.

    where: "pack" (building or unpacking the payload raises) or "wait" (the point-to-point operation
    raises after it was posted, as a communication error would)."""

    rank: int
    transfer: int
    where: str = "pack"


def _slot_tensors(slots, optimizer, mlp) -> list[torch.Tensor]:
    """[fc1, fc2, exp_avg(fc1), exp_avg(fc2), exp_avg_sq(fc1), exp_avg_sq(fc2), step] of one slot (copies)."""
    params = slots.mlp_params(mlp)
    out = [p.detach().clone() for p in params]
    for key in ("exp_avg", "exp_avg_sq"):
        out += [optimizer.state[p][key].clone() if key in optimizer.state.get(p, {}) else torch.zeros_like(p)
                for p in params]
    step = optimizer.state.get(params[0], {}).get("step")
    out.append(torch.as_tensor(step if step is not None else 0.0, dtype=torch.float32).reshape(1).to(params[0].device))
    return out


def _shapes(slots, mlp) -> list[torch.Size]:
    params = slots.mlp_params(mlp)
    return [p.shape for p in params] * 3 + [torch.Size([1])]


def _pack(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.cat([t.reshape(-1).to(dtype) for t in tensors])


def _unpack(flat: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    out, offset = [], 0
    for s in shapes:
        n = int(np.prod(s)) if len(s) else 1
        out.append(flat[offset: offset + n].reshape(s).clone())
        offset += n
    return out


def migration_transfers(old_home: np.ndarray, new_home: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(layer, expert, from rank, to rank) of every expert that changes rank, in (layer, expert) order."""
    layers, experts = np.nonzero(old_home != new_home)
    return [(int(l), int(e), int(old_home[l, e]), int(new_home[l, e])) for l, e in zip(layers, experts)]


def migrate_homes(slots, optimizer, new_home: np.ndarray, failure: InjectedFailure | None = None) -> dict:
    """Move the expert slots (an ExpertSlots) and their AdamW state from slots.home to new_home. Returns {"experts_moved", "bytes", "seconds"}.

    Raises MigrationError on every rank if any transfer failed; nothing changed then.
    """
    t0 = time.perf_counter()
    rank = slots.rank
    old_home = slots.home
    new_home = np.asarray(new_home, dtype=np.int64)
    transfers = migration_transfers(old_home, new_home)
    changed_layers = sorted({l for l, *_ in transfers} | set(np.flatnonzero((old_home != new_home).any(1))))
    ok = True
    staged: dict[tuple[int, int], list[torch.Tensor]] = {}  # (layer, new slot) -> tensors
    sent_bytes = 0
    shapes = _shapes(slots, slots.home_mlps(0)[0])
    dtype = slots.mlp_params(slots.home_mlps(0)[0])[0].dtype
    device = slots.mlp_params(slots.home_mlps(0)[0])[0].device
    numel = sum(int(np.prod(s)) for s in shapes)
    # 1. stage
    new_local = {l: local_home_experts(new_home[l: l + 1], rank)[0] for l in changed_layers}
    pending = []
    for tag, (l, e, src, dst) in enumerate(transfers):
        failing = failure is not None and failure.rank == rank and failure.transfer == tag
        if rank == src:
            try:
                if failing and failure.where == "pack":
                    raise RuntimeError(f"injected failure in transfer {tag} (layer {l}, expert {e}) on rank {rank}")
                old_pos = int(np.flatnonzero(slots.local_experts(l) == e)[0])
                buf = _pack(_slot_tensors(slots, optimizer, slots.home_mlps(l)[old_pos]), dtype)
            except Exception:
                ok = False
                buf = torch.zeros(numel, dtype=dtype, device=device)  # keep the protocol going: nobody blocks
            sent_bytes += buf.numel() * buf.element_size()
            try:
                pending.append((dist.isend(buf, dst, tag=tag), (l, e, failing, "send"), buf))
            except Exception:  # a communication error: the vote below rolls everything back
                ok = False
        elif rank == dst:
            buf = torch.empty(numel, dtype=dtype, device=device)
            try:
                pending.append((dist.irecv(buf, src, tag=tag), (l, e, failing, "recv"), buf))
            except Exception:
                ok = False
    for l in changed_layers:  # experts staying on this rank
        old_local = slots.local_experts(l)
        for new_pos, e in enumerate(new_local[l]):
            if e in old_local:
                old_pos = int(np.flatnonzero(old_local == e)[0])
                staged[(l, new_pos)] = _slot_tensors(slots, optimizer, slots.home_mlps(l)[old_pos])
    for work, (l, e, failing, side), buf in pending:
        try:
            work.wait()
            if failing and failure.where == "wait":
                raise RuntimeError(f"injected communication error waiting on the {side} of layer {l} expert {e} "
                                   f"on rank {rank}")
            if side == "recv":
                if failing and failure.where == "pack":
                    raise RuntimeError(f"injected failure receiving layer {l} expert {e} on rank {rank}")
                new_pos = int(np.flatnonzero(new_local[l] == e)[0])
                staged[(l, new_pos)] = _unpack(buf, shapes)
        except Exception:  # communication or unpacking: vote no
            ok = False
    # 2. vote
    vote = torch.tensor([1 if ok else 0], dtype=torch.int64, device=device)
    dist.all_reduce(vote, op=dist.ReduceOp.MIN)
    if int(vote.item()) == 0:
        staged.clear()
        raise MigrationError(f"migration of {len(transfers)} experts rolled back: a transfer failed; every rank "
                             f"keeps the previous placement")
    # 3. commit
    with torch.no_grad():
        for (l, pos), tensors in staged.items():
            params = slots.mlp_params(slots.home_mlps(l)[pos])
            n = len(params)
            for i, p in enumerate(params):
                p.copy_(tensors[i])
                state = optimizer.state[p]
                state["exp_avg"] = tensors[n + i].clone()
                state["exp_avg_sq"] = tensors[2 * n + i].clone()
                # one step tensor per param (AdamW bumps it in place), on the host as non-capturable AdamW keeps it
                state["step"] = tensors[3 * n].reshape(()).to(device="cpu", dtype=torch.float32).clone()
    slots.home = new_home.copy()
    seconds = time.perf_counter() - t0
    return {"experts_moved": len(transfers), "bytes": sent_bytes, "seconds": seconds}
