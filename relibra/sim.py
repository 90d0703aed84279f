"""The trace-driven cluster simulator: every policy plans every simulated step of a routing trace, the
cost model (relibra.costs) turns each plan into seconds, and the results come back as one tidy frame
(relibra.metrics.METRIC_COLUMNS, source="simulated") plus one summary row per policy.

Every MoE layer is simulated on one EP group of the card's routing; with pipeline stages
(CostParams.pipeline_stages) each stage's layers run on their own GPUs and the step is the 1F1B
schedule of the stages' per-micro-batch seconds plus the per-step costs (docs/cost-model.md).
Tokens per second count the tokens of that EP group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from relibra.bounds import gap_to_bound
from relibra.cluster import Topology, resolve_topology
from relibra.costs import CostParams, PlanCost, cost_plan
from relibra.costs.memory import busiest_expert_rows
from relibra.errors import ConfigError
from relibra.metrics import METRIC_COLUMNS
from relibra.plan import StepPlan
from relibra.policies import get_policy
from relibra.progress import progress as tqdm
from relibra.trace import RoutingTrace, static_placement

REFERENCE_POLICIES = ("megatron", "balanced")
# Reference rows that are not policies: costs derived from a reference policy's plan (see simulate).
BALANCED_COMPUTE = "balanced-compute"
SUMMARY_COLUMNS = [
    "policy", "tokens_per_s", "speedup_vs_megatron", "frac_of_balanced", "frac_of_balanced_compute", "skewness",
    "step_s",
    "a2a_share", "expert_share", "exposed_transfer_share", "migration_share", "migration_s", "bubble_share",
    "replica_memory_share", "replica_buffer_bytes", "plan_s", "planner_on_critical_path", "gap_to_bound",
    "steps", "tokens_per_step",
]


@dataclass
class SimResult:
    """frame: tidy METRIC_COLUMNS rows; summary: one row per policy (SUMMARY_COLUMNS);
    per_step: one row per (policy, step) with the figures the summary averages (and busiest_expert_rows, the
    busiest GPU's routed rows per layer, which size its activations: relibra.costs.memory); config: the
    inputs."""

    frame: pd.DataFrame
    summary: pd.DataFrame
    per_step: pd.DataFrame
    config: dict = field(default_factory=dict)
    costs: dict = field(default_factory=dict)  # {policy: [PlanCost per step]} when keep_costs=True


def _select_steps(trace: RoutingTrace, steps) -> list[int]:
    """None: every step; an int n: the last n steps; an iterable: those step indices."""
    if steps is None:
        return list(range(trace.num_steps))
    if isinstance(steps, (int, np.integer)):
        if not 0 < steps <= trace.num_steps:
            raise ConfigError(f"steps={steps}: the trace holds {trace.num_steps} step(s)")
        return list(range(trace.num_steps - steps, trace.num_steps))
    chosen = [int(s) for s in steps]
    if not chosen:
        raise ConfigError("no steps to simulate")
    bad = [s for s in chosen if not 0 <= s < trace.num_steps]
    if bad:
        raise ConfigError(f"step {bad[0]} is outside the trace's {trace.num_steps} step(s)")
    return chosen


def _gap_to_bound(plan) -> float:
    """Mean over (micro_batch, layer) of the plan's max tokens per GPU over its lower bound, minus 1
    (relibra.bounds, reference "policy"), computed here, outside the planner's clock."""
    return float(gap_to_bound(plan).mean())


def simulate(trace: RoutingTrace, topology: Topology | str, policies: list[str], steps=None,
             policy_params: dict | None = None, progress: bool = True, params: CostParams | None = None,
             workload: str | None = None, references: bool = True, validate: bool = True,
             warmup: int = 1, keep_costs: bool = False,
             step_extras: Callable[[StepPlan, PlanCost], dict] | None = None) -> SimResult:
    """Plan and cost `steps` of `trace` for every policy on `topology`.

    policies: names for relibra.policies.get_policy; with references=True `megatron` and `balanced`
        are added when missing, and the `balanced-compute` reference row: per step, the real routing
        with every GPU's expert compute at the mean over GPUs (PlanCost.balanced_compute), on the
        simulated plan (not under uniform routing) where that is fastest, so it keeps that plan's
        all-to-all, transfers and migration (per_step["balanced_compute_from"] names it). No
        simulated policy beats it. So speedup_vs_megatron, frac_of_balanced and
        frac_of_balanced_compute are always defined. `balanced-compute` may also be named in
        `policies` (it then brings `megatron` along).
    steps: None (all), an int n (the last n steps, so history-based policies see history), or indices.
    policy_params: {policy name: {param: value}} passed to get_policy.
    params: cost-model knobs (CostParams). workload: label for the frame (default: the trace's provenance).
    warmup: steps planned (not costed) before the first simulated one, as many as the trace holds
        before it (Policy.plan_steps), so that the first step's migration starts from the placement
        the policy would have had, not from the static one; at step 0 training starts from the static
        (Megatron) placement. Every step is planned from the previous step's homes.
    validate: check every plan with StepPlan.validate against the trace.
    step_extras: optional f(plan, cost) -> dict of extra columns for that (policy, step) row of per_step.
    Every plan is made for `topology` (policies that weigh bytes against compute use its rates).
    Attention is charged from the trace's sequence lengths (trace.seq_lens[step]) when it has them,
    else from params.seq_len; config["attention"] says which.
    """
    topo = resolve_topology(topology)
    params = params or CostParams()
    topo.ep_layout(trace.ep)  # an EP size the cluster cannot hold fails here, before any planning
    names = [p for p in dict.fromkeys(policies)]
    if not names:
        raise ConfigError("no policies to simulate")
    with_balanced_compute = references or BALANCED_COMPUTE in names
    names = [p for p in names if p != BALANCED_COMPUTE]
    if references:
        names += [p for p in REFERENCE_POLICIES if p not in names]
    if with_balanced_compute and "megatron" not in names:
        names.append("megatron")
    chosen = _select_steps(trace, steps)
    policy_params = policy_params or {}
    unknown = set(policy_params) - set(names)
    if unknown:
        raise ConfigError(f"policy_params names policies that are not simulated: {sorted(unknown)}")
    workload = workload if workload is not None else str(trace.provenance.get("workload", ""))
    model = trace.model
    static = static_placement(model.num_layers, model.num_experts, trace.ep)
    seq_lens = getattr(trace, "seq_lens", None)
    columns: list[dict] = []
    step_rows: list[dict] = []
    kept: dict[str, list[PlanCost]] = {}
    best_compute: dict[int, tuple] = {}  # step -> (balanced-compute cost, its plan, its policy)

    def add(label: str, step: int, cost: PlanCost, plan: StepPlan) -> None:
        columns.append(cost.rows(source="simulated", hardware=topo.name, policy=label, model=model.name,
                                 workload=workload, ep=trace.ep, step=step))
        step_rows.append(_step_summary(label, step, cost, plan, params.overheads.activation_recompute))
        if step_extras is not None:
            step_rows[-1].update(step_extras(plan, cost))
        if keep_costs:
            kept.setdefault(label, []).append(cost)

    bar = tqdm(total=len(names) * len(chosen), desc="simulate", unit="plan", disable=not progress)
    for name in names:
        policy = get_policy(name, **policy_params.get(name, {}))
        bar.set_postfix_str(name)
        for step, plan in zip(chosen, policy.iter_plans(trace, chosen, topo, int(warmup), static)):
            if validate:
                plan.validate(trace.loads[step])
            # the policy's own planner clocks (Policy.plan sets both; they exclude the interface's checks)
            cost = cost_plan(plan, model, topo, params, prev_home=plan.prev_home, planner_s=plan.info.plan_seconds,
                             critical_planner_s=plan.info.plan_cpu_seconds,
                             seq_lens=None if seq_lens is None else seq_lens[step])
            if with_balanced_compute and not plan.uniform_routing:
                candidate = cost.balanced_compute()
                best = best_compute.get(step)
                if best is None or candidate.step_seconds < best[0].step_seconds:
                    best_compute[step] = (candidate, plan, name)
            add(name, step, cost, plan)
            bar.update(1)
    bar.close()
    for step in chosen if with_balanced_compute else []:
        cost, plan, source = best_compute[step]
        add(BALANCED_COMPUTE, step, cost, plan)
        # a reference, not a planner: no plan time of its own (the source policy's is in its own row)
        step_rows[-1].update({"gap_to_bound": float("nan"), "plan_s": float("nan"), "balanced_compute_from": source})
    frame = pd.DataFrame({c: np.concatenate([col[c] for col in columns]) for c in METRIC_COLUMNS})
    per_step = pd.DataFrame(step_rows)
    config = {"model": model.name, "workload": workload, "ep": trace.ep, "cluster": topo.name,
              "topology": topo.to_dict(), "steps": chosen, "micro_batches": trace.num_microbatches,
              "tokens_per_microbatch": trace.tokens_per_microbatch, "cost_params": dataclasses.asdict(params),
              "attention": "trace seq_lens" if seq_lens is not None else f"assumed seq_len={params.seq_len}",
              "policies": names}
    order = names + ([BALANCED_COMPUTE] if with_balanced_compute else [])
    return SimResult(frame=frame, summary=summarize(per_step, order=order), per_step=per_step, config=config,
                     costs=kept)


def _step_summary(name: str, step: int, cost: PlanCost, plan: StepPlan, recompute: bool) -> dict:
    totals = cost.totals()
    return {
        "policy": name, "step": step, "step_s": cost.step_seconds, "tokens": cost.tokens,
        "a2a_s": totals["dispatch"] + totals["combine"], "expert_s": totals["expert_compute"],
        "dense_s": totals["dense_compute"], "exposed_transfer_s": totals["replica_push"] + totals["replica_grad"],
        "planner_exposed_s": totals["planner"], "migration_s": cost.migration_s, "optimizer_s": cost.optimizer_s,
        "bubble_s": totals["pipeline_bubble"], "pipeline_send_s": totals["pipeline_send"],
        # the busiest GPU's routed rows per layer, what its expert activations are sized by
        "busiest_expert_rows": busiest_expert_rows(cost.gpu_tokens, recompute, cost.layer_stage),
        "skewness": float(cost.skewness().mean()), "replica_memory_share": cost.memory["replica_memory_share"],
        "replica_buffer_bytes": cost.memory["replica_buffer_bytes"], "plan_s": cost.planner_s,
        "planner_on_critical_path": bool(cost.info["exposed_planner"]),
        "gap_to_bound": _gap_to_bound(plan), "experts_moved": cost.migration_bytes["experts_moved"],
    }


def summarize(per_step: pd.DataFrame, order: list[str] | None = None) -> pd.DataFrame:
    """One row per policy (SUMMARY_COLUMNS) from the per-(policy, step) figures of `simulate`.

    tokens_per_s = all tokens / all seconds; shares are of the summed step time (bubble_share: the pipeline
    schedule's bubble, 0 without a pipeline); speedup_vs_megatron,
    frac_of_balanced and frac_of_balanced_compute divide tokens_per_s by that of `megatron` /
    `balanced` / `balanced-compute` (NaN when absent).
    """
    g = per_step.groupby("policy", sort=False)
    total = g["step_s"].sum()
    out = pd.DataFrame({
        "tokens_per_s": g["tokens"].sum() / total,
        "skewness": g["skewness"].mean(),
        "step_s": g["step_s"].mean(),
        "a2a_share": g["a2a_s"].sum() / total,
        "expert_share": g["expert_s"].sum() / total,
        "exposed_transfer_share": g["exposed_transfer_s"].sum() / total,
        "migration_share": g["migration_s"].sum() / total,
        "migration_s": g["migration_s"].mean(),
        "bubble_share": g["bubble_s"].sum() / total,
        "replica_memory_share": g["replica_memory_share"].max(),
        "replica_buffer_bytes": g["replica_buffer_bytes"].max(),
        "plan_s": g["plan_s"].mean(),
        "planner_on_critical_path": g["planner_on_critical_path"].any(),
        "gap_to_bound": g["gap_to_bound"].mean(),
        "steps": g["step"].count(),
        "tokens_per_step": g["tokens"].mean(),
    })
    nan = float("nan")
    out["speedup_vs_megatron"] = out["tokens_per_s"] / out["tokens_per_s"].get("megatron", nan)
    out["frac_of_balanced"] = out["tokens_per_s"] / out["tokens_per_s"].get("balanced", nan)
    out["frac_of_balanced_compute"] = out["tokens_per_s"] / out["tokens_per_s"].get(BALANCED_COMPUTE, nan)
    out = out.reset_index()
    if order:
        out = out.set_index("policy").loc[[p for p in order if p in set(out["policy"])]].reset_index()
    return out[SUMMARY_COLUMNS]
