"""The plain reference of relibra-h's cross-node greedy (relibra.policies.relibra_h.cross_node_replicate),
one (micro-batch, layer) at a time; tests/test_planner_reference.py checks that both give the same
replicas.
"""

from __future__ import annotations

import numpy as np

from relibra.flow import gpu_tokens_from
from relibra.policies.base import experts_by_gpu


def cross_node_reference(x, home, rexp, rtok, gpn, window, push_s, token_s, min_tokens, rounds, shortlist):
    """relibra-h's cross-node greedy (relibra_h.cross_node_replicate, same arguments), one (micro-batch,
    layer) and one candidate copy at a time (relibra_h module docstring). Returns (replica_expert,
    replica_tokens, replicas added)."""
    m, layers, experts = x.shape
    ep, r = rexp.shape[2], rexp.shape[3]
    rexp, rtok = rexp.copy(), rtok.copy()
    hosted = experts_by_gpu(home, ep)
    k = hosted.shape[2]
    node = np.arange(ep) // gpn
    big = np.iinfo(np.int64).max
    gpu_all = gpu_tokens_from(x, home, rexp, rtok).astype(np.int64)
    added = 0

    def exposed_s(u, w):
        over = lambda u, w: max(u + push_s - w, 0.0) - max(u - w, 0.0)  # noqa: E731
        return over(u, w) + 2.0 * over(u, 2.0 * w)

    for mb in range(m):
        for li in range(layers):
            gpu = gpu_all[mb, li].copy()
            target = -(-int(gpu.sum()) // ep)
            left = x[mb, li].astype(np.int64).copy()
            for g in range(ep):
                for s in range(r):
                    if rexp[mb, li, g, s] >= 0:
                        left[rexp[mb, li, g, s]] -= rtok[mb, li, g, s]
            used = np.zeros(ep)
            for _ in range(rounds):
                if gpu.max() <= target:
                    break
                d = int(np.argmax(gpu))
                excess = int(gpu[d]) - target
                copies = [(int(e), int(left[e])) for e in hosted[li, d]]
                copies += [(int(e), int(t) if e >= 0 else 0) for e, t in zip(rexp[mb, li, d], rtok[mb, li, d])]
                free = (rexp[mb, li] < 0).any(axis=1)
                q = min(ep, shortlist)
                keyed = np.where(free, gpu, big)
                low = np.argpartition(keyed, q - 1)[:q] if q < ep else np.arange(ep)
                best = None
                for c, (e, tok) in enumerate(copies):
                    src = int(home[li, max(e, 0)])
                    cand = [bool(free[g]) and e not in rexp[mb, li, g] and node[g] != node[d] and node[g] != node[src]
                            for g in low]
                    vals = [int(gpu[g]) if ok else big for g, ok in zip(low, cand)]
                    i = int(np.argmin(vals))
                    g = int(low[i])
                    amount = min(excess, target - int(gpu[g]), tok)
                    exposed = max(exposed_s(used[src], window[mb, src]), exposed_s(used[g], window[mb, g]))
                    feasible = (cand[i] and e >= 0 and amount >= min_tokens[mb, li] and amount > 0
                                and (exposed == 0 or amount * token_s > exposed))
                    if feasible and (best is None or amount > best[0]):
                        best = (amount, c, e, g, src)
                if best is None:
                    break
                amount, c, e, g, src = best
                slot = int(np.argmax(rexp[mb, li, g] < 0))
                rexp[mb, li, g, slot] = e
                rtok[mb, li, g, slot] = amount
                if c < k:
                    left[e] -= amount
                else:
                    rtok[mb, li, d, c - k] -= amount
                gpu[d] -= amount
                gpu[g] += amount
                used[src] += push_s
                used[g] += push_s
                added += 1
    return rexp, rtok, added
