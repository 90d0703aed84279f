"""The plain reference of LLEP's spill planner (relibra.policies.llep.llep_assign): one (micro_batch,
layer) cell and one expert at a time, in plain Python; tests/test_policies.py checks that both give
the same spills.
"""

from __future__ import annotations

import numpy as np


def llep_assign_reference(expert_tokens: np.ndarray, ep: int, capacity_factor: float, min_tokens_per_gemm: int,
                          trigger_imbalance: float) -> list[tuple[int, int, int, int]]:
    """llep_assign's spills, sorted: (cell, gpu, expert, tokens) for every cell (row) of
    expert_tokens int [cells, E]."""
    return sorted(spill for row in range(len(expert_tokens))
                  for spill in llep_cell_reference(row, expert_tokens[row].tolist(), ep, capacity_factor,
                                                   min_tokens_per_gemm, trigger_imbalance))


def llep_cell_reference(row: int, x: list, ep: int, capacity_factor: float, min_tokens: int, trigger: float) -> list:
    """LLEP's spill rule for one (micro_batch, layer), one expert at a time (see relibra/policies/llep.py):
    experts in decreasing load stay native up to the capacity (counting native experts still to come),
    the rest goes to the least-loaded other GPUs, each filled to the capacity; a chunk under
    min_tokens, or the last GPU left, takes the whole remainder. Returns (row, gpu, expert, tokens)."""
    per = len(x) // ep
    native = [sum(x[g * per:(g + 1) * per]) for g in range(ep)]
    mean = sum(native) / ep
    if not max(native) >= trigger * max(mean, 1e-9):
        return []
    cap = max(int(np.floor(capacity_factor * mean)), 1)
    pending, assigned, out = list(native), [0] * ep, []
    for e in sorted(range(len(x)), key=lambda i: (-x[i], i)):
        g = e // per
        pending[g] -= x[e]
        keep = min(max(cap - assigned[g] - pending[g], 0), x[e])
        assigned[g] += keep
        rem, used = x[e] - keep, {g}
        while rem > 0 and ep > 1:
            helper = min((h for h in range(ep) if h not in used), key=lambda h: (assigned[h] + pending[h], h))
            room = cap - assigned[helper] - pending[helper]
            chunk = min(rem, room) if room > 0 else rem
            if chunk < min_tokens or len(used) == ep - 1:
                chunk = rem
            assigned[helper] += chunk
            out.append((row, helper, e, chunk))
            used.add(helper)
            rem -= chunk
        if rem > 0:  # ep == 1
            assigned[g] += rem
    return out
