"""The headline (notebook 02): every policy on every (model, workload, seed) of a set-up card at full scale,
one trace per case (the last step simulated, the ones before history), in worker processes; the paper's
claims per case (`claim_table`) and per claim over the grid (`verdict_table`); the token-budget sweep of both
batch families, the other layouts and link rates, and a recorded trace or another cluster in the card's place.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from relibra.cluster import Topology, get_model
from relibra.costs.memory import memory_budget
from relibra.labels import CLAIMS
from relibra.setups import load_card
from relibra.studies.case import Case
from relibra.studies.case import run_cases as case_runner
from relibra.studies.replan import ReplanForm, replan_form, simulate_in_form
from relibra.trace import RoutingTrace
from relibra.workloads import BATCH_LAYOUTS

# Every registered policy; balanced-compute is added by the simulator as a reference row.
HEADLINE_POLICIES = ("megatron", "eplb", "eplb+", "lplb+", "eplb+lp", "llep", "relibra", "relibra-reorder",
                     "relibra-replicate", "relibra-lpt", "relibra-split", "relibra-h", "balanced")
VERDICT_CLAIMS = ("relibra_over_megatron", "relibra_over_eplb_plus", "gap_to_balanced", "gap_to_balanced_compute")
CASE_KEYS = ["setup", "model", "workload", "seed", "ep", "layout", "tokens_per_microbatch"]


def headline_case(setup, model: str, workload: str, seed: int, **fields) -> Case:
    """A Case of the headline: every policy of HEADLINE_POLICIES unless `fields` name others."""
    return Case(setup, model, workload, int(seed), **{"policies": HEADLINE_POLICIES, **fields})


def simulate_case(case: Case) -> pd.DataFrame:
    """Every policy of `case` simulated on its trace (the generator's, or case.trace): one summary row per
    policy with the case's keys; the last step is simulated, the ones before are history."""
    card = case.card()
    cfg = case.workload_config(card)
    # the re-homing policies' re-plan interval: the card's record (relibra replan), averaged over its cycle
    form = (replan_form(card, case.model, case.ep, case.policies)
            if case.trace is None and case.topology is None and case.tokens_per_microbatch is None else
            ReplanForm.at_one(case.policies, "a recorded trace, another cluster or another budget than the card's"))
    if case.topology is None:
        card.check_ep(case.ep)  # the case runs on the card's cluster
        topology = card.topology()
    else:  # the case's link-rate changes apply to its own cluster
        topology = case.topology.with_changes(**{k.removeprefix("cluster."): v for k, v in case.card_changes
                                                 if k.removeprefix("cluster.") in _TOPOLOGY_FIELDS})
        topology.ep_layout(case.ep)
    trace = case.make_trace(card, cfg, steps=form.trace_steps(case.steps))
    if case.trace is None:
        layout, tokens = cfg.batch_layout, case.tokens_per_microbatch or (
            card.tokens_per_ep_rank if cfg.batch_layout == "token-budget" else None)
        slot_tokens = trace.seq_lens[-1].sum(axis=-1)
    else:
        layout, tokens = "trace", int(round(trace.tokens_per_microbatch / trace.ep))
        slot_tokens = trace.loads[-1, :, 0].sum(axis=-1) / trace.model.top_k  # [M, ep] tokens each rank sent
    result = simulate_in_form(trace, topology, list(case.policies), form, steps=1, params=card.cost_params(case.ep),
                              policy_params=card.policy_params(case.policies), progress=False, workload=case.workload,
                              step_extras=lambda plan, cost: overhead_extras(plan, cost, trace.model, topology))
    extras = result.per_step.groupby("policy")[list(OVERHEAD_EXTRAS)].mean()
    # does the set-up fit: the full model's memory on the busiest GPU against the cluster's HBM
    # (relibra.costs.memory; a cut-down trace is budgeted as the whole model it stands for)
    full = trace.model if case.trace is not None else get_model(case.model)
    rows = float(result.per_step["busiest_expert_rows"].max())  # the busiest GPU of any policy's plans
    budget = memory_budget(full, dataclasses.replace(card.memory_layout(case.ep, rows), hbm_bytes=topology.hbm_bytes))
    return result.summary.join(extras, on="policy").assign(
        replan_interval=[form.interval(p) for p in result.summary["policy"]], replan_source=form.source,
        feasible=bool(budget.fits), memory_GB=budget.total_bytes / 1e9, hbm_GB=budget.hbm_bytes / 1e9,
        expert_rows=budget.expert_rows,
        setup=card.name, model=case.model, workload=case.workload, seed=case.seed, ep=case.ep, layout=layout,
        tokens_per_microbatch=tokens, label=case.label, layers=trace.num_layers, micro_batches=trace.num_microbatches,
        mean_tokens_per_slot=float(slot_tokens.mean()), max_tokens_per_slot=int(slot_tokens.max()))


OVERHEAD_EXTRAS = ("transfer_s", "fragmentation_s", "replica_transfers", "launch_s", "gemm_floor_s",
                   "copy_contention_s", "plan_broadcast_s", "bubble_s", "optimizer_s", "pipeline_send_s", "grad_add_s")
_TOPOLOGY_FIELDS = {f.name for f in dataclasses.fields(Topology)}


def overhead_extras(plan, cost, model, topology) -> dict:
    """OVERHEAD_EXTRAS of one simulated step (the summary does not carry them), for the overheads table.

    transfer_s: replica pushes and pulls had none been hidden behind attention; fragmentation_s: what
    splitting an expert's tokens over replica GEMMs adds to the slowest GPU's routed-expert time, forward and
    backward (each copy pays the fixed GEMM cost, relibra.costs.flops.gemm_seconds); replica_transfers: weight
    pushes and gradient pulls per step (the layer-shared buffer pushes twice, pulls once), one collective
    launch each; launch_s: those launches at the cluster's collective latency, had none overlapped.
    """
    replicas = ((plan.occupied_replica_tokens() > 0).sum(axis=3) if plan.replica_slots else
                np.zeros(cost.gpu_tokens.shape))
    fixed = model.expert_flops_per_token * topology.gemm_half_tokens * replicas / topology.matmul_flops_per_s
    expert = cost.expert_seconds_per_gpu
    fragmentation = 3.0 * float((expert.max(axis=2) - (expert - fixed).max(axis=2)).sum())  # forward + 2x backward
    transfers = int(3 * replicas.sum()) if not plan.transfers_on_critical_path else int(2 * replicas.sum())
    own = cost.info.get("overheads", {})
    return {"transfer_s": float(cost.replica_transfer_s), "fragmentation_s": fragmentation,
            "replica_transfers": transfers, "launch_s": transfers * topology.collective_latency_s,
            **{k: float(own.get(k, 0.0)) for k in ("gemm_floor_s", "copy_contention_s", "plan_broadcast_s",
                                                   "grad_add_s")},
            "bubble_s": float(cost.pipeline_seconds()[1])}


def run_cases(cases: list[Case], workers: int | None = None, progress: bool = True, desc: str = "cases"
              ) -> pd.DataFrame:
    """simulate_case over `cases` (relibra.studies.case.run_cases), each row with its case_index."""
    return case_runner(simulate_case, cases, workers, progress, desc, index="case_index")


def headline_cases(setup, models, workloads, seeds, **fields) -> list[Case]:
    """The full-scale grid: every (model, workload, seed) of the card, largest models first (they take
    longest, so two workers finish together); `fields`: the cases' other Case fields (ep, steps, ...)."""
    order = sorted(models, key=lambda m: -get_model(m).num_layers)
    return [headline_case(setup, m, w, s, **fields) for m in order for w in workloads for s in seeds]


def claim_table(rows: pd.DataFrame, keys: list[str], claims=VERDICT_CLAIMS) -> pd.DataFrame:
    """One row per `keys` of simulated summary rows (mean tokens/s per policy): the keys and each claim
    of `claims` (CLAIMS ids: a ratio or gap of two policies); with no rows, the columns only."""
    if rows.empty:
        return pd.DataFrame(columns=[*keys, *claims])
    # a missing key (a card without a token budget has no tokens per micro-batch) is a group of its own
    wide = rows.groupby([*keys, "policy"], dropna=False)["tokens_per_s"].mean().unstack("policy")
    return pd.DataFrame({k: CLAIMS[k].of(wide) for k in claims}).reset_index()


def case_ratios(grid: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, workload, seed) of a headline grid: every VERDICT_CLAIMS column, and `feasible`
    (the case fits in memory) where the grid says."""
    keys = ["model", "workload", "seed"]
    table = claim_table(grid, keys)
    if "feasible" in grid:
        table = table.join(grid.groupby(keys)["feasible"].all(), on=keys)
    return table


def verdict_table(grid: pd.DataFrame) -> pd.DataFrame:
    """One row per paper claim from a headline grid (a claim whose policies did not run has none).

    Columns: claim, paper, mean (over every case and seed), low, high, best_case (model, workload and
    seed of the "up to"), seeds_of_best (the same model and workload's range over seeds), cases.
    The gap to the ideal is 1 - ReLibra / balanced (the paper's Balanced: routing forced uniform) and,
    beside it, 1 - ReLibra / balanced-compute (the same routing with every GPU at the mean compute).
    """
    grid = grid[grid["feasible"].astype(bool)] if "feasible" in grid else grid  # what does not fit is no claim
    if grid.empty:
        return pd.DataFrame()
    ran = set(grid["policy"])
    claims = [k for k in VERDICT_CLAIMS if {CLAIMS[k].numerator, CLAIMS[k].denominator} <= ran]
    table = claim_table(grid, [k for k in CASE_KEYS if k in grid], claims)
    rows = []
    for c in (CLAIMS[k] for k in claims):
        t = table.dropna(subset=[c.id])
        if t.empty:
            continue
        value = t[c.id]
        best = t.loc[value.idxmin() if c.best == "min" else value.idxmax()]
        same = value[(t["model"] == best["model"]) & (t["workload"] == best["workload"])]
        rows.append({"id": c.id, "claim": c.verdict_label, "paper": c.paper or "-", "kind": c.kind,
                     "mean": float(value.mean()), "low": float(value.min()), "high": float(value.max()),
                     "best": float(best[c.id]),
                     "best_case": f"{best['model']}, {best['workload']}, seed {best['seed']}",
                     "seeds_of_best_low": float(same.min()), "seeds_of_best_high": float(same.max()),
                     "cases": int(len(value)), "seeds": int(grid["seed"].nunique())})
    return pd.DataFrame(rows)


# The policies of the budget sweep and the alternatives: the ones their ratios need.
RATIO_POLICIES = ("megatron", "eplb+", "relibra", "balanced")


def budget_cases(setup, alternative: str, model: str, workload: str, seed: int, tokens, **fields) -> list[Case]:
    """The budget sweep: the card (token-budget) and the alternative card (one sequence per micro-batch,
    sequences scaled so a slot holds about that many tokens), at each tokens per micro-batch; `fields`:
    the cases' other Case fields (default policies: RATIO_POLICIES)."""
    fields = {"policies": RATIO_POLICIES, **fields}
    return [headline_case(card, model, workload, seed, tokens_per_microbatch=int(t), **fields)
            for card in (setup, alternative) for t in tokens]


def budget_ratios(sweep: pd.DataFrame) -> pd.DataFrame:
    """ReLibra / Megatron and ReLibra / EPLB+ per (set-up, layout, tokens per micro-batch) of a sweep, with
    the mean tokens per slot (no rows for an empty sweep)."""
    keys = ["setup", "layout", "tokens_per_microbatch", "model", "workload", "seed"]
    out = claim_table(sweep, keys, VERDICT_CLAIMS[:2])
    out["mean_tokens_per_slot"] = sweep.groupby(keys)["mean_tokens_per_slot"].first().to_numpy()
    if "feasible" in sweep:  # whether the budget fits in memory (relibra.costs.memory)
        out["feasible"] = sweep.groupby(keys)["feasible"].all().to_numpy()
    return out


# Alternatives to the card's default beside the verdict: the other batch layouts and other link rates.
LINK_ALTERNATIVES = (
    ("H800 links (DeepEP README, re-counted)", (("cluster.nvlink_GBps", 135.6), ("cluster.rdma_GBps", 43.5))),
    ("datasheet links (450 / 50 GB/s)", (("cluster.nvlink_GBps", 450.0), ("cluster.rdma_GBps", 50.0))),
)


def alternative_cases(setup, model: str, workload: str, seed: int = 0, **fields) -> list[Case]:
    """One case per other batch layout and per other link-rate pair, each on the card's other inputs;
    `fields`: the cases' other Case fields (default policies: RATIO_POLICIES)."""
    fields = {"policies": RATIO_POLICIES, **fields}
    default = load_card(setup).value("batch.layout")
    cases = [headline_case(setup, model, workload, seed, layout=layout, label=f"layout {layout}", **fields)
             for layout in BATCH_LAYOUTS if layout != default]
    return cases + [headline_case(setup, model, workload, seed, card_changes=changes, label=label, **fields)
                    for label, changes in LINK_ALTERNATIVES]


def trace_cases(setup, trace: RoutingTrace, topology: Topology | None = None, workload: str = "trace",
                seed: int = 0) -> tuple[list[Case], list[Case]]:
    """The headline on a recorded trace: (its one case with every policy, the link-rate alternatives on
    it). Other batch layouts and budgets reshape the generator's batch, which a recorded trace fixes, so
    there are none. The cases carry the counts only (the simulator reads loads and sequence lengths, not
    token ids), so worker processes receive no more than that."""
    counts = dataclasses.replace(trace, token_experts=None, token_src_rank=None)
    case = headline_case(setup, trace.model.name, workload, seed, ep=trace.ep, steps=trace.num_steps,
                         micro_batches=trace.num_microbatches, trace=counts, topology=topology)
    return [case], [dataclasses.replace(case, policies=RATIO_POLICIES, card_changes=changes, label=label)
                    for label, changes in LINK_ALTERNATIVES]


def alternative_ratios(alternatives: pd.DataFrame) -> pd.DataFrame:
    """ReLibra / Megatron, ReLibra / EPLB+ and the gap to Balanced per alternative case (alternative_cases'
    or trace_cases' label, model, workload, seed)."""
    return claim_table(alternatives, ["label", "model", "workload", "seed"], VERDICT_CLAIMS[:3])


def why_they_differ(grid: pd.DataFrame, alternatives: pd.DataFrame) -> dict[str, str]:
    """One sentence per claim id on why the kit's figure differs from the paper's, computed from the grid."""
    by = grid.groupby("policy")
    share = by[["expert_share", "a2a_share"]].mean()
    tps = grid.pivot_table(index=["model", "workload", "seed"], columns="policy", values="tokens_per_s")
    ceiling = float((tps["balanced-compute"] / tps["megatron"]).mean())
    skew = by["skewness"].mean()
    best_alt = alternatives.loc[alternatives["relibra_over_megatron"].idxmax()] if len(alternatives) else None
    alt_text = (f"; the largest alternative, {best_alt['label']}, gives {best_alt['relibra_over_megatron']:.2f}x"
                if best_alt is not None else "")
    return {
        "relibra_over_megatron": (
            f"routed experts are {100 * share.loc['megatron', 'expert_share']:.0f}% of Megatron's simulated step and "
            f"its all-to-all {100 * share.loc['megatron', 'a2a_share']:.0f}%, so even balanced-compute (every GPU at "
            f"the mean expert compute) is only {ceiling:.2f}x Megatron on average{alt_text}"),
        "relibra_over_eplb_plus": (
            f"micro-batches of ~{grid['mean_tokens_per_slot'].mean():,.0f} tokens per rank move little from the "
            f"step's load, so EPLB+'s per-step placement already brings skewness from "
            f"{skew.get('megatron', float('nan')):.2f} to {skew.get('eplb+', float('nan')):.2f} "
            f"(ReLibra {skew.get('relibra', float('nan')):.2f})"),
        "gap_to_balanced": (
            "Balanced forces uniform routing, which also evens the all-to-all; ReLibra keeps the real routing's "
            "exchange, and the simulator charges no cost the paper measured beyond the overheads table"),
        "gap_to_balanced_compute": (
            "the same routing and all-to-all with perfectly even expert compute: what placement and replication "
            "could at best remove"),
    }


def verdict_with_alternatives(grid: pd.DataFrame, alternatives: pd.DataFrame, scale: str) -> pd.DataFrame:
    """verdict_table(grid) with, per claim, the range over the alternatives (other layouts and link
    rates), why the kit's figure differs from the paper's, and the scale (text)."""
    v = verdict_table(grid)
    ids = list(v["id"]) if len(v) else []
    why = why_they_differ(grid, alternatives)
    v["alternatives_low"] = [float(alternatives[k].min()) if k in alternatives else float("nan") for k in ids]
    v["alternatives_high"] = [float(alternatives[k].max()) if k in alternatives else float("nan") for k in ids]
    v["why"] = [why[k] for k in ids]
    v["scale"] = scale
    return v
