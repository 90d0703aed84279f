"""The plain reference of the token split between an expert's copies (relibra.policies.split.replica_runs,
read through StepPlan.dense_replica_flow): one (micro_batch, layer, expert) at a time.
tests/test_planner_reference.py checks both against it.
"""

from __future__ import annotations

import numpy as np


def replica_flow_reference(loads: np.ndarray, home: np.ndarray, rexp: np.ndarray, rtok: np.ndarray) -> np.ndarray:
    """Tokens each source sends each replica: int32 [M, L, ep_src, ep, R], one expert at a time.

    Copies of an expert ordered by GPU (a replica before the home on the same GPU) take consecutive
    runs of its tokens ordered by source rank. loads: int [M, L, ep, E]; home: int [L, E];
    rexp, rtok: int [M, L, ep, R] replica experts (-1 empty) and the tokens each computes."""
    m, layers, ep, experts = loads.shape
    r = rexp.shape[3]
    out = np.zeros((m, layers, ep, ep, r), dtype=np.int32)
    for mb in range(m):
        for li in range(layers):
            for e in range(experts):
                copies = [(g, 0, s, int(rtok[mb, li, g, s])) for g in range(ep) for s in range(r)
                          if rexp[mb, li, g, s] == e]
                if not copies:
                    continue
                home_size = int(loads[mb, li, :, e].sum()) - sum(c[3] for c in copies)
                copies.append((int(home[li, e]), 1, -1, home_size))
                copies.sort(key=lambda c: (c[0], c[1]))
                start = 0
                cum = np.concatenate([[0], np.cumsum(loads[mb, li, :, e])])
                for g, is_home, s, size in copies:
                    if not is_home:
                        lo, hi = start, start + size
                        for src in range(ep):
                            out[mb, li, src, g, s] = max(0, min(cum[src + 1], hi) - max(cum[src], lo))
                    start += size
    return out
