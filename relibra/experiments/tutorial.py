"""Notebook 00, the tutorial: a toy one-layer MoE (16 experts, top-2) over EP GPUs in 2 nodes, planned
and priced for every placement x spare-slots choice."""

from __future__ import annotations

import numpy as np
import pandas as pd

from relibra.cluster import ModelShape, Topology, get_topology
from relibra.costs import cost_plan, expert_flops_per_token, gemm_seconds
from relibra.errors import ConfigError
from relibra.policies import get_policy
from relibra.trace import RoutingTrace, skewness
from relibra.workloads import sample_topk_counts

TUTORIAL_MODEL = ModelShape("tutorial", num_layers=1, num_experts=16, top_k=2, hidden=2048, moe_ffn=768,
                            num_attention_heads=32, num_kv_heads=4, head_dim=128)
TUTORIAL_PLACEMENTS = ("static", "search", "lpt")
TUTORIAL_EP_SIZES = (4, 8, 16)  # 16 experts over 2 nodes
TUTORIAL_MAX_SPARE_SLOTS = 4
TUTORIAL_SKEWS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0)  # the skew slider's stops in the static rendering
TUTORIAL_SHIFTS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)  # the micro-batch shifts the replay section compares
# Phases of one micro-batch and layer in the cost model (relibra.costs PlanCost.forward), in order.
TUTORIAL_PHASES = ("dense_compute", "dispatch", "expert_compute", "combine", "replica_push", "replica_grad")


def tutorial_topology(ep: int = 4) -> Topology:
    """The paper's GPUs and links, cut to 2 nodes x ep/2 GPUs so the toy layer spans two nodes."""
    if ep < 2 or ep % 2:
        raise ConfigError(f"tutorial: ep must be even (2 nodes), got {ep}")
    return get_topology("paper").with_changes(name=f"paper-2x{ep // 2}", num_nodes=2, gpus_per_node=ep // 2)


def tutorial_trace(skew: float = 1.2, shift: float = 0.5, seed: int = 0, micro_batches: int = 4,
                   tokens_per_rank: int = 4096, ep: int = 4):
    """A one-layer, one-step routing trace of TUTORIAL_MODEL: loads int32 [1, micro_batches, 1, ep, 16].

    Expert popularity is Zipf: the expert ranked r gets a share proportional to (r + 1) ** -skew. The
    ranking starts as a random permutation; before each further micro-batch a share `shift` of its
    positions is reshuffled among themselves (0: hot experts never move; 1: new ranking). Each rank's
    `tokens_per_rank` tokens pick top-k distinct experts from that micro-batch's shares.
    """
    if skew < 0 or not 0 <= shift <= 1:
        raise ConfigError(f"tutorial: skew must be >= 0 and shift in [0, 1], got skew={skew}, shift={shift}")
    e, k = TUTORIAL_MODEL.num_experts, TUTORIAL_MODEL.top_k
    if ep <= 0 or e % ep:
        raise ConfigError(f"tutorial: ep must divide the {e} experts, got {ep}")
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


def _priced(plan, topo: Topology):
    """(tokens per GPU [M, ep], simulated forward expert seconds per GPU [M, ep], balanced seconds [M], the
    PlanCost) of a one-layer plan. Balanced: every GPU computes the mean tokens, one GEMM per own expert."""
    total = plan.gpu_tokens()[:, 0]
    cost = cost_plan(plan, TUTORIAL_MODEL, topo)
    per_gpu = TUTORIAL_MODEL.num_experts // total.shape[1]
    balanced = per_gpu * gemm_seconds(total.mean(axis=1) / per_gpu, expert_flops_per_token(TUTORIAL_MODEL), topo)
    return total, cost.expert_seconds_per_gpu[:, 0], balanced, cost


def replica_table(plan) -> pd.DataFrame:
    """One row per occupied replica slot of a one-layer plan: micro_batch, gpu, slot, expert, home_gpu,
    replica_tokens (the copy's), home_tokens (left at the home), expert_tokens (all of that micro-batch)."""
    home_tokens = plan.home_flow().sum(axis=2)[:, 0]  # [M, E]
    expert_tokens = plan.loads.sum(axis=2)[:, 0]  # [M, E]
    mi, gi, ri = np.nonzero(plan.replica_expert[:, 0] >= 0)
    expert = plan.replica_expert[mi, 0, gi, ri]
    return pd.DataFrame({"micro_batch": mi, "gpu": gi, "slot": ri, "expert": expert, "home_gpu": plan.home[0, expert],
                         "replica_tokens": plan.occupied_replica_tokens()[mi, 0, gi, ri],
                         "home_tokens": home_tokens[mi, expert], "expert_tokens": expert_tokens[mi, expert]})


def tutorial_case(placement: str = "static", spare_slots: int = 0, skew: float = 1.2, shift: float = 0.5,
                  micro_batch: int = 0, seed: int = 0, ep: int = 4, tokens_per_gpu: int = 4096,
                  micro_batches: int = 4) -> dict:
    """Plan and price the toy layer for one placement x spare-slots choice.

    Returns {"expert_tokens": tokens per (micro_batch, expert) and its home GPU, "gpu_table": per
    (micro_batch, gpu): node, home_tokens, replica_tokens, tokens, replicas_held, expert_seconds
    (simulated forward GEMM seconds), "replicas": `replica_table`, "phases": per (micro_batch,
    direction, phase) the slowest GPU's simulated seconds, "summary": one row per micro-batch
    (skewness, slowest and balanced ms), "plan" (the StepPlan), "policy", "hardware", "ep", ...}.
    """
    trace = tutorial_trace(skew, shift, seed, micro_batches=micro_batches, tokens_per_rank=tokens_per_gpu, ep=ep)
    topo = tutorial_topology(ep)
    name, params = tutorial_policy(placement, spare_slots)
    _, gpn = topo.ep_layout(trace.ep)
    plan = get_policy(name, **params).plan(trace, 0, topo, prev_home=None)
    total, seconds, balanced_s, cost = _priced(plan, topo)
    m, e = trace.num_microbatches, trace.num_experts
    mb_of_expert, expert = np.divmod(np.arange(m * e), e)
    expert_tokens = pd.DataFrame({"micro_batch": mb_of_expert, "expert": expert,
                                  "tokens": trace.expert_load()[0, :, 0].ravel(), "home_gpu": plan.home[0, expert]})
    replica = plan.occupied_replica_tokens()[:, 0].sum(axis=2)  # [M, ep]
    mb_of_gpu, gpu = np.divmod(np.arange(m * ep), ep)
    gpu_table = pd.DataFrame({
        "policy": name, "placement": placement, "spare_slots": int(spare_slots), "micro_batch": mb_of_gpu, "gpu": gpu,
        "node": gpu // gpn, "tokens": total.ravel(), "replica_tokens": replica.ravel(),
        "home_tokens": (total - replica).ravel(), "replicas_held": plan.num_replicas()[:, 0].ravel(),
        "expert_seconds": seconds.ravel()})
    phases = pd.DataFrame([
        {"micro_batch": mb, "direction": direction, "phase": phase, "seconds": float(parts[phase][mb, 0])}
        for direction, parts in (("forward", cost.forward), ("backward", cost.backward))
        for phase in TUTORIAL_PHASES for mb in range(m)])
    summary = pd.DataFrame({"micro_batch": np.arange(m), "policy": name, "skewness": skewness(total),
                            "slowest_gpu": total.argmax(axis=1), "slowest_gpu_ms": 1e3 * seconds.max(axis=1),
                            "balanced_ms": 1e3 * balanced_s,
                            "replicas_used": plan.num_replicas()[:, 0].sum(axis=1),
                            "experts_moved_from_static": int((plan.home[0] != np.arange(e) // (e // ep)).sum())})
    return {"expert_tokens": expert_tokens, "gpu_table": gpu_table, "summary": summary, "phases": phases,
            "replicas": replica_table(plan), "policy": name, "placement": placement, "spare_slots": int(spare_slots),
            "micro_batch": int(micro_batch), "ep": ep, "gpus_per_node": gpn, "tokens_per_gpu": tokens_per_gpu,
            "hardware": f"{topo.name}: the paper's GPUs and links, 2 nodes x {gpn} GPUs", "plan": plan}


def _means(summary: pd.DataFrame, columns=("skewness", "slowest_gpu_ms", "balanced_ms")) -> dict:
    return {c: float(summary[c].mean()) for c in columns}


def tutorial_grid(spare_slots=(0, 1, 2), **toy) -> pd.DataFrame:
    """Every placement x spare-slots choice on the same toy trace (toy: tutorial_case's other arguments but
    placement): mean skewness, slowest-GPU ms, and max_replicas_per_gpu, the most slots any GPU filled."""
    rows = []
    for placement in TUTORIAL_PLACEMENTS:
        for slots in spare_slots:
            case = tutorial_case(placement, slots, **toy)
            rows.append({"placement": placement, "spare_slots": int(slots), "policy": case["policy"],
                         **_means(case["summary"], ("skewness", "slowest_gpu_ms", "balanced_ms", "replicas_used")),
                         "max_replicas_per_gpu": int(case["gpu_table"]["replicas_held"].max()),
                         "hardware": case["hardware"]})
    return pd.DataFrame(rows)


def tutorial_skew_sweep(placement: str = "search", spare_slots: int = 2, skews=TUTORIAL_SKEWS, **toy) -> pd.DataFrame:
    """What the skew slider shows: per skew, static placement without replicas and the chosen plan (toy:
    tutorial_case's other trace arguments), mean skewness and slowest-GPU ms."""
    rows = []
    for skew in skews:
        for place, slots in dict.fromkeys((("static", 0), (placement, int(spare_slots)))):
            case = tutorial_case(place, slots, skew, **toy)
            rows.append({"skew": float(skew), "placement": place, "spare_slots": slots, **_means(case["summary"])})
    return pd.DataFrame(rows)


# ---- routing replay: a plan from history beside a plan from the replayed exact loads ----------------
def history_plan(policy, trace: RoutingTrace, step: int, topology: Topology):
    """The plan a balancer makes for `step` when all it knows is the previous step's routing: a StepPlan
    over trace.loads[step], replicas fixed for the step.

    The policy plans one micro-batch holding the whole previous step's loads; every micro-batch of `step`
    then keeps its homes and copies, each copy taking the same share (rounded down) of its expert's
    actual tokens."""
    from relibra.policies.eplb import plan_from_copies

    if step < 1:
        raise ConfigError(f"tutorial: a plan from history needs a previous step, got step {step}")
    m, e, ep = trace.num_microbatches, trace.num_experts, trace.ep
    seen = trace.loads[step - 1].sum(axis=0, dtype=np.int64).astype(np.int32)[None, None]  # [1, 1, L, ep, E]
    past = RoutingTrace(seen, trace.model, ep, trace.tokens_per_microbatch * m, {"history of step": step})
    guess = policy.plan(past, 0, topology)
    _, gpn = topology.ep_layout(ep)
    seen_tokens = seen[0, 0].sum(axis=1, dtype=np.int64)  # [L, E]
    share = np.zeros((trace.num_layers, e, ep))  # [L, E, ep] share of an expert's tokens its copy on a GPU takes
    rexp, rtok = guess.replica_expert[0], guess.occupied_replica_tokens()[0]  # [L, ep, slots]
    layer, g, r = np.nonzero(rexp >= 0)
    x = rexp[layer, g, r]
    np.add.at(share, (layer, x, g), rtok[layer, g, r] / seen_tokens[layer, x])
    held = share > 0
    held[np.arange(trace.num_layers)[:, None], np.arange(e)[None, :], guess.home] = True
    actual = trace.loads[step].sum(axis=2, dtype=np.int64)  # [M, L, E]

    def copy_tokens(li, ei, gi):  # int [M, n]: each copy's share of what its expert really gets
        return np.floor(share[li, ei, gi][None, :] * actual[:, li, ei]).astype(np.int64)

    return plan_from_copies(f"{policy.name} (from history)", trace.loads[step], held, guess.home, gpn,
                            guess.slots_per_gpu, guess.replica_scope, copy_tokens)


def tutorial_replay(placement: str = "search", spare_slots: int = 2, shifts=TUTORIAL_SHIFTS, skew: float = 1.2,
                    seed: int = 0, ep: int = 4, tokens_per_gpu: int = 4096, micro_batches: int = 4) -> pd.DataFrame:
    """Routing replay on the toy layer. Per micro-batch shift, tutorial_trace's 2 x micro_batches
    micro-batches are cut into two steps (the ranking drifts across the step boundary too), and the
    chosen policy plans step 1 twice: from step 0's loads (plan "history", history_plan) and from step 1's
    exact loads, which routing replay makes known before the step runs (plan "replay"). One row per shift
    and plan: means over step 1's micro-batches of the slowest GPU's forward expert ms, skewness, balanced ms."""
    topo = tutorial_topology(ep)
    name, params = tutorial_policy(placement, spare_slots)
    policy = get_policy(name, **params)
    rows = []
    for shift in shifts:
        one = tutorial_trace(skew, float(shift), seed, 2 * micro_batches, tokens_per_gpu, ep)
        trace = RoutingTrace(one.loads.reshape(2, micro_batches, 1, ep, TUTORIAL_MODEL.num_experts), TUTORIAL_MODEL,
                             ep, one.tokens_per_microbatch, {**one.provenance, "steps": 2})
        for kind, plan in (("history", history_plan(policy, trace, 1, topo)), ("replay", policy.plan(trace, 1, topo))):
            plan.validate(trace.loads[1])
            total, seconds, balanced_s, _ = _priced(plan, topo)
            rows.append({"shift": float(shift), "plan": kind, "policy": name, "placement": placement,
                         "spare_slots": int(spare_slots), "slowest_gpu_ms": float(1e3 * seconds.max(axis=1).mean()),
                         "skewness": float(skewness(total).mean()), "balanced_ms": float(1e3 * balanced_s.mean())})
    return pd.DataFrame(rows)


def tutorial_timescales(ep: int = 4) -> dict:
    """Why ReLibra works at two timescales, from tutorial_topology's link rates: one expert's weights
    (bytes, bf16) and the microseconds to push them once over NVLink (in a node) and RDMA (across nodes)."""
    topo = tutorial_topology(ep)
    bytes_ = TUTORIAL_MODEL.expert_bytes
    return {"nvlink_GBps": topo.nvlink_GBps, "rdma_GBps": topo.rdma_GBps, "expert_bytes": int(bytes_),
            "nvlink_us": 1e6 * bytes_ / topo.nvlink_bytes_per_s, "rdma_us": 1e6 * bytes_ / topo.rdma_bytes_per_s,
            "topology": topo.name}
