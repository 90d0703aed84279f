"""`eplb+lp`: EPLB+'s copies (EPLB on the step's exact loads, with replication), then per micro-batch
and layer a linear program that moves tokens among those copies to minimize the maximum GPU load.

The kit's own policy, not LPLB: LPLB (relibra/policies/lplb.py) reorders without replication and
places one copy along a fixed topology. `relibra-split` reuses the
LP below over its step-fixed replicas.

LP per (micro_batch, layer): one variable y_c >= 0 per copy (home included) of every expert with
more than one copy, and t:
    minimize t
    sum_{c in copies(e)} y_c = tokens(e)                  for each replicated expert e
    fixed(g) + sum_{c on g} y_c <= t                      for each GPU g
where fixed(g) is the load of single-copy experts homed on g. The copies are fixed for the step,
so all layers of one micro-batch share one constraint matrix: they are solved as one block-diagonal
LP (objective: the sum of the per-layer t's, which is separable), one HiGHS call per micro-batch.
Fractional flows are floored on replicas; the home copy takes what is left, so token counts are
exact integers (the home gets at most copies - 1 extra tokens). The whole plan is made offline
(before the step, from replayed routing), so nothing of it is charged on the critical path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from relibra.cluster import Topology
from relibra.errors import PlanError
from relibra.plan import StepPlan
from relibra.policies.base import register
from relibra.policies.eplb import EplbInfo, EplbOraclePolicy, plan_from_copies
from relibra.trace import RoutingTrace


def lp_copy_tokens(expert_tokens: np.ndarray, held: np.ndarray, home: np.ndarray, li: np.ndarray,
                   ei: np.ndarray, gi: np.ndarray) -> np.ndarray:
    """Tokens each replica computes so that every (micro_batch, layer) minimizes its max GPU load.

    expert_tokens: int [M, L, E]; held: bool [L, E, ep] copies (home included); home: int [L, E];
    li, ei, gi: the replicas (layer, expert, gpu), homes excluded. Returns int64 [M, len(li)].
    """
    m, l, e = expert_tokens.shape
    ep = held.shape[2]
    copies = held.sum(axis=2)
    multi = copies > 1  # [L, E]
    cl, ce, cg = np.nonzero(held & multi[:, :, None])  # every copy of a replicated expert, layer-major
    n_var = len(cl)
    if n_var == 0:
        return np.zeros((m, len(li)), dtype=np.int64)
    # rows: one equality per replicated expert, one inequality per (layer, GPU); columns: copies, then t per layer
    eq_id = np.full((l, e), -1, dtype=np.int64)
    eq_id[multi] = np.arange(int(multi.sum()))
    a_eq = sp.csr_matrix((np.ones(n_var), (eq_id[cl, ce], np.arange(n_var))), shape=(int(multi.sum()), n_var + l))
    ub_rows = np.concatenate([cl * ep + cg, np.arange(l * ep)])
    ub_cols = np.concatenate([np.arange(n_var), n_var + np.repeat(np.arange(l), ep)])
    ub_vals = np.concatenate([np.ones(n_var), -np.ones(l * ep)])
    a_ub = sp.csr_matrix((ub_vals, (ub_rows, ub_cols)), shape=(l * ep, n_var + l))
    cost = np.concatenate([np.zeros(n_var), np.ones(l)])
    layer = np.broadcast_to(np.arange(l)[:, None], home.shape)
    single = ~multi
    var_of = np.full((l, e, ep), -1, dtype=np.int64)
    var_of[cl, ce, cg] = np.arange(n_var)
    replica_var = var_of[li, ei, gi]
    out = np.zeros((m, len(li)), dtype=np.int64)
    for mb in range(m):
        x = expert_tokens[mb].astype(np.float64)  # [L, E]
        fixed = np.zeros((l, ep))
        np.add.at(fixed, (layer[single], home[single]), x[single])
        res = linprog(cost, A_ub=a_ub, b_ub=-fixed.reshape(-1), A_eq=a_eq, b_eq=x[multi],
                      bounds=(0, None), method="highs")
        if res.status != 0:
            raise PlanError(f"eplb+lp: the token LP of micro-batch {mb} failed ({res.message})")
        y = np.floor(res.x[:n_var] + 1e-6).astype(np.int64)
        out[mb] = np.minimum(y[replica_var], expert_tokens[mb, li, ei])
    return out


@dataclass(frozen=True)
class EplbLpInfo(EplbInfo):
    """EplbInfo plus lp_and_flow_seconds: wall seconds of the LP token split and the replicas' runs."""

    lp_and_flow_seconds: float = 0.0


@register
@dataclass
class EplbLpOraclePolicy(EplbOraclePolicy):
    """`eplb+lp`: EPLB+'s copies (exact step loads), tokens split per micro-batch and layer by an LP."""

    name: ClassVar[str] = "eplb+lp"

    def _plan(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
              prev_home: np.ndarray | None) -> StepPlan:
        loads = trace.loads[step]
        start, start_cpu = time.perf_counter(), time.process_time()
        held, home, scope, slots = self.copies(trace, step, gpus_per_node, prev_home)
        rebalance_s, rebalance_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
        expert_tokens = loads.sum(axis=2, dtype=np.int64)

        def lp_tokens(li, ei, gi):
            return lp_copy_tokens(expert_tokens, held, home, li, ei, gi)

        start = time.perf_counter()
        plan = plan_from_copies(self.name, loads, held, home, gpus_per_node, slots, scope, lp_tokens)
        plan.info = EplbLpInfo(rebalance_seconds=rebalance_s, rebalance_cpu_seconds=rebalance_cpu_s,
                               copies_per_expert_max=int(held.sum(axis=2).max()),
                               lp_and_flow_seconds=time.perf_counter() - start)
        return plan
