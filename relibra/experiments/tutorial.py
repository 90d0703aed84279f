"""Notebook 00, the tutorial: a toy one-layer MoE (16 experts on 2 nodes x 2 GPUs), planned and priced
for every placement x spare-slots choice."""

from __future__ import annotations

import numpy as np
import pandas as pd

from relibra.cluster import ModelShape, Topology, get_topology
from relibra.errors import ConfigError
from relibra.experiments.traces import plan_steps

TUTORIAL_MODEL = ModelShape("tutorial", num_layers=1, num_experts=16, top_k=2, hidden=2048, moe_ffn=768,
                            num_attention_heads=32, num_kv_heads=4, head_dim=128)
TUTORIAL_PLACEMENTS = ("static", "search", "lpt")


def tutorial_topology() -> Topology:
    """The paper's GPUs and links, cut to 2 nodes x 2 GPUs so the toy layer spans two nodes."""
    return get_topology("paper").with_changes(name="paper-2x2", num_nodes=2, gpus_per_node=2)


def tutorial_trace(skew: float = 1.2, shift: float = 0.5, seed: int = 0, micro_batches: int = 4,
                   tokens_per_rank: int = 4096, ep: int = 4):
    """A one-layer, one-step routing trace of TUTORIAL_MODEL (16 experts, top-2) over `ep` ranks.

    Expert popularity is Zipf: share of the expert ranked r is proportional to (r + 1) ** -skew. The
    ranking starts as a random permutation; before each further micro-batch a share `shift` of the
    ranking positions is reshuffled among themselves (0: hot experts never move; 1: new ranking).
    Every src rank's tokens pick top-k distinct experts from that micro-batch's shares.
    Returns a RoutingTrace with loads int32 [1, micro_batches, 1, ep, 16].
    """
    from relibra.trace import RoutingTrace
    from relibra.workloads import sample_topk_counts

    if skew < 0 or not 0 <= shift <= 1:
        raise ConfigError(f"tutorial: skew must be >= 0 and shift in [0, 1], got skew={skew}, shift={shift}")
    e, k = TUTORIAL_MODEL.num_experts, TUTORIAL_MODEL.top_k
    rng = np.random.default_rng(seed)
    zipf = (np.arange(e) + 1.0) ** -float(skew)
    zipf /= zipf.sum()
    ranking = rng.permutation(e)  # ranking[r] = expert at popularity rank r
    loads = np.zeros((1, micro_batches, 1, ep, e), dtype=np.int32)
    for m in range(micro_batches):
        if m > 0:
            moved = np.nonzero(rng.random(e) < shift)[0]
            ranking[moved] = ranking[rng.permutation(moved)]
        p = np.empty(e)
        p[ranking] = zipf
        loads[0, m, 0] = sample_topk_counts(rng, np.broadcast_to(p, (ep, e)).copy(), tokens_per_rank, k)
    return RoutingTrace(loads, TUTORIAL_MODEL, ep, tokens_per_rank * ep,
                        {"generator": "experiments.tutorial_trace", "skew": skew, "shift": shift, "seed": seed})


def tutorial_policy(placement: str, spare_slots: int) -> tuple[str, dict]:
    """(policy name, params) of the kit that implement a placement x spare-slots choice."""
    if placement not in TUTORIAL_PLACEMENTS:
        raise ConfigError(f"tutorial: placement must be one of {TUTORIAL_PLACEMENTS}, got {placement!r}")
    spare_slots = int(spare_slots)
    if spare_slots < 0:
        raise ConfigError(f"tutorial: spare_slots must be >= 0, got {spare_slots}")
    if spare_slots == 0:
        if placement == "lpt":  # LPT homes without replicas: relibra with both knobs set
            return "relibra", {"reorder": "lpt", "replicate": "none"}
        return {"static": "megatron", "search": "relibra-reorder"}[placement], {}
    name = {"static": "relibra-replicate", "search": "relibra", "lpt": "relibra-lpt"}[placement]
    return name, {"spare_slots_per_gpu": spare_slots}


def tutorial_case(placement: str = "static", spare_slots: int = 0, skew: float = 1.2, shift: float = 0.5,
                  micro_batch: int = 0, seed: int = 0, **_ignored) -> dict:
    """Plan and price the toy layer for one placement x spare-slots choice.

    Returns {"expert_tokens": tokens per (micro_batch, expert), "gpu_table": per (micro_batch, gpu):
    node, home_tokens, replica_tokens, tokens, expert_seconds (simulated forward GEMM seconds),
    "summary": one row per micro-batch (skewness, slowest and balanced seconds), "policy", "hardware"}.
    """
    from relibra.costs import cost_plan
    from relibra.trace import skewness

    trace = tutorial_trace(skew, shift, seed)
    topo = tutorial_topology()
    name, params = tutorial_policy(placement, spare_slots)
    _, gpn = topo.ep_layout(trace.ep)
    (_, plan, plan_s), = plan_steps(trace, name, gpn, **params)
    cost = cost_plan(plan, TUTORIAL_MODEL, topo, planner_s=plan_s)
    m, e = trace.num_microbatches, trace.num_experts
    el = trace.expert_load()[0, :, 0]  # [M, E]
    expert_tokens = pd.DataFrame({"micro_batch": np.repeat(np.arange(m), e), "expert": np.tile(np.arange(e), m),
                                  "tokens": el.ravel(),
                                  "home_gpu": np.tile(plan.home[0], m)})
    total = plan.gpu_tokens()[:, 0]  # [M, ep]
    replica = plan.replica_flow[:, 0].sum(axis=(1, 3), dtype=np.int64)  # [M, ep]
    seconds = cost.expert_seconds_per_gpu[:, 0]  # [M, ep]
    ep = trace.ep
    gpu_table = pd.DataFrame({
        "policy": name, "placement": placement, "spare_slots": int(spare_slots),
        "micro_batch": np.repeat(np.arange(m), ep), "gpu": np.tile(np.arange(ep), m),
        "node": np.tile(np.arange(ep) // gpn, m), "tokens": total.ravel(), "replica_tokens": replica.ravel(),
        "home_tokens": (total - replica).ravel(), "replicas_held": plan.num_replicas()[:, 0].ravel(),
        "expert_seconds": seconds.ravel()})
    from relibra.costs import gemm_seconds, expert_flops_per_token

    # Balanced: every GPU computes the mean tokens, spread over its own experts (one GEMM each).
    mean_tokens = total.mean(axis=1)
    experts_per_gpu = e // ep
    balanced_s = experts_per_gpu * gemm_seconds(mean_tokens / experts_per_gpu, expert_flops_per_token(TUTORIAL_MODEL), topo)
    summary = pd.DataFrame({"micro_batch": np.arange(m), "policy": name, "skewness": skewness(total),
                            "slowest_gpu_ms": 1e3 * seconds.max(axis=1), "balanced_ms": 1e3 * balanced_s,
                            "experts_moved_from_static": int((plan.home[0] != np.arange(e) // (e // ep)).sum())})
    return {"expert_tokens": expert_tokens, "gpu_table": gpu_table, "summary": summary, "policy": name,
            "micro_batch": int(micro_batch), "hardware": f"{topo.name}: the paper's GPUs and links, 2 nodes x 2 GPUs",
            "plan": plan}


def tutorial_grid(skew: float = 1.2, shift: float = 0.5, seed: int = 0, spare_slots=(0, 1, 2)) -> pd.DataFrame:
    """Every placement x spare-slots choice on the same toy trace: mean skewness and slowest-GPU ms."""
    rows = []
    for placement in TUTORIAL_PLACEMENTS:
        for slots in spare_slots:
            case = tutorial_case(placement, slots, skew, shift, seed=seed)
            s = case["summary"]
            rows.append({"placement": placement, "spare_slots": int(slots), "policy": case["policy"],
                         "skewness": float(s["skewness"].mean()), "slowest_gpu_ms": float(s["slowest_gpu_ms"].mean()),
                         "balanced_ms": float(s["balanced_ms"].mean()), "hardware": case["hardware"]})
    return pd.DataFrame(rows)
