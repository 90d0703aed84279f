"""Stated bounds on what a command may start, checked before it starts anything: local ranks per
machine and replica slots per GPU. (Sizes of files and arrays are bounded by the loader's limit,
relibra.trace.io.max_trace_bytes; model shapes by relibra.cluster.MODEL_LIMITS.)"""

from __future__ import annotations

import os

from relibra.errors import ConfigError

RANKS_PER_CORE = 4  # local gloo ranks per CPU core: each rank holds a model copy and its own threads
MIN_LOCAL_RANKS = 8  # allowed whatever the core count (the kit's own runs use 2 to 8)


def local_rank_bound(cores: int | None = None) -> int:
    """The most ranks one machine launches: max(MIN_LOCAL_RANKS, RANKS_PER_CORE x cores)."""
    cores = cores or os.cpu_count() or 1
    return max(MIN_LOCAL_RANKS, RANKS_PER_CORE * cores)


def check_local_ranks(nproc: int, flag: str = "--nproc") -> None:
    """Refuse more local ranks than local_rank_bound() before any process starts."""
    bound = local_rank_bound()
    if nproc > bound:
        raise ConfigError(f"{flag} {nproc}: more ranks than this machine runs at once ({bound}: "
                          f"max({MIN_LOCAL_RANKS}, {RANKS_PER_CORE} per core x {os.cpu_count() or 1} cores)); "
                          f"use torchrun across machines for more")


def check_replica_slots(slots: int, num_experts: int, flag: str = "--replica-slots") -> None:
    """Spare expert slots per GPU: 0..num_experts (a GPU holds each expert at most once)."""
    if slots < 0 or slots > num_experts:
        raise ConfigError(f"{flag} {slots}: must be 0..{num_experts} (a GPU holds each of the {num_experts} experts "
                          f"at most once)")
