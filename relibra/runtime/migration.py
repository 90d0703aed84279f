"""Reordering: move expert homes between ranks with their weights, master copies and Adam state, all or nothing.

Protocol (every rank, in lock step):
  1. stage: for every layer whose placement changes, build this rank's new home slots off to the
     side: experts staying on the rank are copied locally (their slot position may change), arriving
     experts are received point-to-point from their old home, on the EP group. Payload per expert:
     fc1 and fc2 weights, and of each the optimizer's master copy, exp_avg, exp_avg_sq and step
     count, wherever the optimizer keeps them (relibra.runtime.optstate: torch optimizers, megatron's
     fp32, bf16 and distributed optimizers). Live weights and optimizer state are not touched.
  2. vote: all-reduce(MIN) of "my staging succeeded" over the EP group, then over the expert
     data-parallel group when experts are data-parallel too. A failure in any transfer (packing,
     posting isend / irecv, waiting on them, unpacking; e.g. an injected exception) is caught
     locally; the rank keeps the protocol going (it sends zeros where its payload failed) so nobody
     blocks, and votes no.
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
from relibra.runtime.optstate import MOMENTS, OptimizerState
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


def _payload_dtype(param: torch.Tensor) -> torch.dtype:
    """Payload dtype: fp32 masters and moments of a bf16 / fp16 model travel without rounding."""
    return torch.promote_types(param.dtype, torch.float32)


def _pack(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.cat([t.reshape(-1).to(dtype) for t in tensors])


def _unpack(flat: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return [t.clone() for t in torch.split(flat, sizes)]


def migration_transfers(old_home: np.ndarray, new_home: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(layer, expert, from rank, to rank) of every expert that changes rank, in (layer, expert) order."""
    layers, experts = np.nonzero(old_home != new_home)
    return [(int(l), int(e), int(old_home[l, e]), int(new_home[l, e])) for l, e in zip(layers, experts)]


def migrate_homes(slots, ep_group, optimizer, new_home: np.ndarray, failure: InjectedFailure | None = None,
                  dp_group=None) -> dict:
    """Move the expert slots (an ExpertSlots) with their master copies and Adam state from slots.home to
    new_home. Returns {"experts_moved", "bytes", "seconds"}.

    Transfers run point-to-point on ep_group (EP-local ranks converted with dist.get_global_rank).
    dp_group: the expert data-parallel group (megatron's pg_collection.expt_dp) when the experts are
    data-parallel too: its ranks run the same migration in their own EP groups, a sharded optimizer
    assembles whole state over it, and the vote spans it, so every copy of an expert moves or none.
    Raises MigrationError on every rank if any transfer failed; nothing changed then.
    """
    t0 = time.perf_counter()
    rank = slots.rank
    group = ep_group
    old_home = slots.home
    new_home = np.asarray(new_home, dtype=np.int64)
    transfers = migration_transfers(old_home, new_home)
    changed_layers = sorted(set(np.flatnonzero((old_home != new_home).any(1)).tolist()))
    state = OptimizerState(optimizer, dp_group)
    first = slots.mlp_params(slots.home_mlps(0)[0])
    dtype = _payload_dtype(first[0])
    device = first[0].device
    sizes = [p.numel() for p in first] + [p.numel() for p in first for _ in range(1 + len(MOMENTS))] + [1] * len(first)
    numel = sum(sizes)
    ok = True

    def slot_payload(layer: int, pos: int) -> list[torch.Tensor]:
        """[params..., per param: master, moments..., then per param: step] of a home slot (copies)."""
        params = slots.mlp_params(slots.home_mlps(layer)[pos])
        whole = gathered[(layer, pos)]
        return ([p.detach().reshape(-1).to(dtype, copy=True) for p in params] + [t for w in whole for t in w[:-1]]
                + [w[-1] for w in whole])

    # 0. whole master and state of this rank's home slots in changed layers (one all-reduce if sharded)
    keys = [(l, pos) for l in changed_layers for pos in range(slots.homes_per_rank)]
    per_slot = len(first)
    flat_state = state.gather([p for l, pos in keys for p in slots.mlp_params(slots.home_mlps(l)[pos])], dtype)
    gathered = {key: flat_state[i * per_slot:(i + 1) * per_slot] for i, key in enumerate(keys)}
    staged: dict[tuple[int, int], list[torch.Tensor]] = {}  # (layer, new slot) -> payload
    sent_bytes = 0
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
                buf = _pack(slot_payload(l, old_pos), dtype)
            except Exception:
                ok = False
                buf = torch.zeros(numel, dtype=dtype, device=device)  # keep the protocol going: nobody blocks
            sent_bytes += buf.numel() * buf.element_size()
            try:
                pending.append((dist.isend(buf, dist.get_global_rank(group, dst), group=group, tag=tag),
                                (l, e, failing, "send"), buf))
            except Exception:  # a communication error: the vote below rolls everything back
                ok = False
        elif rank == dst:
            buf = torch.empty(numel, dtype=dtype, device=device)
            try:
                pending.append((dist.irecv(buf, dist.get_global_rank(group, src), group=group, tag=tag),
                                (l, e, failing, "recv"), buf))
            except Exception:
                ok = False
    for l in changed_layers:  # experts staying on this rank
        old_local = slots.local_experts(l)
        for new_pos, e in enumerate(new_local[l]):
            if e in old_local:
                old_pos = int(np.flatnonzero(old_local == e)[0])
                staged[(l, new_pos)] = slot_payload(l, old_pos)
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
                staged[(l, new_pos)] = _unpack(buf, sizes)
        except Exception:  # communication or unpacking: vote no
            ok = False
    # 2. vote: MIN over the EP group, then over the expert data-parallel group (every copy of the grid)
    vote = torch.tensor([1 if ok else 0], dtype=torch.int64, device=device)
    dist.all_reduce(vote, op=dist.ReduceOp.MIN, group=group)
    if dp_group is not None and dp_group.size() > 1:
        dist.all_reduce(vote, op=dist.ReduceOp.MIN, group=dp_group)
    if int(vote.item()) == 0:
        staged.clear()
        raise MigrationError(f"migration of {len(transfers)} experts rolled back: a transfer failed; every rank "
                             f"keeps the previous placement")
    # 3. commit
    n = per_slot
    k = 1 + len(MOMENTS)
    with torch.no_grad():
        for (l, pos), tensors in staged.items():
            params = slots.mlp_params(slots.home_mlps(l)[pos])
            for i, p in enumerate(params):
                p.data.copy_(tensors[i].view_as(p))
                state.write(p, tensors[n + i * k: n + (i + 1) * k] + [tensors[n + n * k + i]])
    slots.home = new_home.copy()
    seconds = time.perf_counter() - t0
    return {"experts_moved": len(transfers), "bytes": sent_bytes, "seconds": seconds}
