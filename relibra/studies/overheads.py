"""ReLibra's overheads: one table of them (`overheads_table`, in three views), and the re-costing behind
`relibra map --overheads`: the same plans of a case costed under each charge setting (the set-up card's
[overheads] and each overhead taken back or swept), with EPLB+ at 0, 2 and 4 spare slots beside ReLibra.

One case = one set-up card, model, workload and seed at full scale. Each policy plans the case's last step
once (after a warm-up plan of the step before, as relibra.sim.simulate does); the plans are then costed
under several CostParams (relibra.costs), so every row differs from the card's only in the overhead it names.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd

from relibra.cluster import PAPER_MODELS
from relibra.costs import Overheads, cost_plan, plan_metadata
from relibra.errors import RelibraError
from relibra.policies import get_policy
from relibra.policies.eplb import EPLB_PLUS_VARIANTS, PAPER_EPLB_PLUS
from relibra.setups import DEFAULT_CARD
from relibra.studies.case import Case, run_cases
from relibra.trace import static_placement

EPLB_PLUS_SLOTS = tuple(v["redundant_slots_per_gpu"] for v in EPLB_PLUS_VARIANTS.values())
# The EPLB+ the paper compares with (relibra.policies.eplb.PAPER_EPLB_PLUS): ReLibra's slots and buffer.
PAPER_EPLB_PLUS_SLOTS = EPLB_PLUS_VARIANTS[PAPER_EPLB_PLUS]["redundant_slots_per_gpu"]
# The charge settings beside "card" and "none": (label, Overheads field, value), each one overhead taken back
# to no charge or set to an end of its sweep.
CHARGE_CHANGES = (
    ("overlap efficiency 1.0", "transfer_overlap_efficiency", 1.0), ("no recompute", "activation_recompute", False),
    ("no grad add", "replica_grad_add", False), ("planner not charged", "planner_window_forward_passes", None),
    ("overlap efficiency 0.7", "transfer_overlap_efficiency", 0.7),
    ("planner window 0", "planner_window_forward_passes", 0.0),
    ("planner window 2", "planner_window_forward_passes", 2.0), ("no GEMM floor", "gemm_call_floor_s", 0.0),
    ("copy contention 0", "copy_a2a_contention", 0.0), ("copy contention 1", "copy_a2a_contention", 1.0),
    ("metadata not charged", "plan_metadata_charged", False),
)


def policy_variants(card) -> list[tuple[str, str, dict]]:
    """(label, policy name, parameters) of every plan costed: Megatron, EPLB+ at each of EPLB_PLUS_SLOTS spare
    slots per GPU, ReLibra with the card's slots, Balanced."""
    return [("megatron", "megatron", {}),
            *((label, "eplb+", dict(params)) for label, params in EPLB_PLUS_VARIANTS.items()),
            ("relibra", "relibra", card.policy_params(["relibra"])["relibra"]), ("balanced", "balanced", {})]


def charge_settings(card_overheads: Overheads) -> dict[str, Overheads]:
    """The CostParams.overheads each plan is costed under: "card" (the headline's), "none" (no overhead
    charged: transfers 100% hidden) and each of CHARGE_CHANGES applied to the card's."""
    return {"card": card_overheads, "none": Overheads(),
            **{label: dataclasses.replace(card_overheads, **{field: v}) for label, field, v in CHARGE_CHANGES}}


def case_costs(case: Case) -> pd.DataFrame:
    """Every policy variant of `case` planned once and costed under every charge_settings entry.

    One row per (variant, setting): step_s, tokens_per_s, exposed_transfer_s (replica push + grad rows),
    migration_s, the charged terms of PlanCost.info["overheads"] (recompute_s, grad_add_s, planner_s,
    planner_window_s, planner_exposed_s), forward_s, plan-metadata bytes and seconds per micro-batch,
    replica_memory_share, the case's keys, and "charge": the setting's Overheads as JSON.
    """
    card = case.card()
    trace = case.make_trace(card, case.workload_config(card))
    model = trace.model
    topology = card.topology()
    base = card.cost_params(case.ep)
    settings = charge_settings(base.overheads)
    step = trace.num_steps - 1
    static = static_placement(model.num_layers, model.num_experts, case.ep)
    seq_lens = trace.seq_lens[step] if trace.seq_lens is not None else None
    rows = []
    for label, name, params in policy_variants(card):
        policy = get_policy(name, **params)
        prev = np.asarray(policy.plan(trace, step - 1, topology, static).home) if step > 0 else static
        plan = policy.plan(trace, step, topology, prev)
        meta = plan_metadata(plan, base.overheads, topology)
        for setting, ov in settings.items():
            cost = cost_plan(plan, model, topology, dataclasses.replace(base, overheads=ov), prev_home=prev,
                             planner_s=plan.info.plan_seconds, critical_planner_s=plan.info.plan_cpu_seconds,
                             seq_lens=seq_lens)
            totals, own = cost.totals(), cost.info["overheads"]
            rows.append({"setup": card.name, "model": case.model, "workload": case.workload, "seed": case.seed,
                         "ep": case.ep, "micro_batches": trace.num_microbatches, "variant": label, "policy": name,
                         "setting": setting, "step_s": cost.step_seconds,
                         "tokens_per_s": cost.tokens / cost.step_seconds,
                         "exposed_transfer_s": totals["replica_push"] + totals["replica_grad"],
                         "migration_s": cost.migration_s,
                         "forward_s": float(sum(v.sum() for v in cost.forward.values()) + cost.extra_forward.sum()),
                         **{k: own[k] for k in ("recompute_s", "grad_add_s", "planner_s", "planner_window_s",
                                                "planner_exposed_s", "gemm_floor_s", "copy_contention_s",
                                                "plan_broadcast_s")},
                         **{f"term_{k}": v for k, v in totals.items() if k != "step_total"},
                         "metadata_bytes_per_microbatch": meta["bytes_per_microbatch"],
                         "metadata_s_per_microbatch": meta["seconds_per_microbatch"],
                         "replica_memory_share": cost.memory["replica_memory_share"],
                         "charge": json.dumps(dataclasses.asdict(ov))})
    return pd.DataFrame(rows)


def overhead_costs(cases: list[Case], progress: bool = True) -> pd.DataFrame:
    """case_costs of every case, one after another in this process (a few seconds each; the planner's seconds
    are measured on one core), in the cases' order."""
    return run_cases(case_costs, cases, workers=1, progress=progress, desc="overheads")


def ratios(costs: pd.DataFrame) -> pd.DataFrame:
    """Per (case, setting): ReLibra / Megatron, ReLibra / EPLB+ at each slot count, and the gap to
    Balanced (1 - ReLibra / Balanced)."""
    w = costs.pivot_table(index=["setup", "model", "workload", "seed", "setting"], columns="variant",
                          values="tokens_per_s", aggfunc="mean")
    out = pd.DataFrame({"relibra_over_megatron": w["relibra"] / w["megatron"],
                        "gap_to_balanced": 1.0 - w["relibra"] / w["balanced"]})
    for s in EPLB_PLUS_SLOTS:
        out[f"relibra_over_eplb_plus_{s}"] = w["relibra"] / w[f"eplb+ {s} slots"]
    return out.reset_index()


def _span(x: pd.Series, fmt: str, ranged: bool = False) -> str:
    """The mean of `x` (one value per case) as text with its range: "(range low - high)" always when `ranged`,
    else "(low - high)" only where they differ."""
    x = x.astype(float)
    mean, low, high = (fmt.format(v) for v in (x.mean(), x.min(), x.max()))
    if ranged:
        return f"{mean} (range {low} - {high})"
    return mean if len(x) == 1 or np.isclose(x.min(), x.max()) else f"{mean} ({low} - {high})"


OVERHEAD_VIEWS = ("recosted", "headline", "policies")


def overheads_table(costs: pd.DataFrame, view: str = "recosted", policy: str = "relibra") -> pd.DataFrame:
    """The overheads of `policy` from a frame of cost terms (one row per case and policy, and charge setting),
    in one of OVERHEAD_VIEWS:

    - "recosted" (`relibra map --overheads`; overhead_costs' frame): per overhead, its figure (mean, and range
      over the cases), the card entry that sets it, whether the headline charges it and the headline ratios at
      the ends of its sweep. Columns: overhead, card_entry, figure, charged, sweep.
    - "headline" (notebook 02; relibra.studies.throughput.simulate_case rows): per PAPER_OVERHEADS entry, the
      paper's figure, the kit's (mean and range over cases and seeds) and how the kit obtains it. Columns:
      overhead, paper, kit, how.
    - "policies" (notebook 07; the simulator's summary of one case with the measured plan_s): one row per
      policy, in numbers: POLICY_COLUMNS, then planner_vs_forward, transfer_s, replica_grad_add_s,
      transfers_on_critical_path, exposed_transfer_s, transfer_overlap.
    """
    if view == "policies":
        return _per_policy(costs)
    if view == "recosted":
        return _recosted(costs, costs[costs["variant"] == policy])
    if view == "headline":
        return _headline(costs[costs["policy"] == policy])
    raise ValueError(f"overheads_table: view must be one of {OVERHEAD_VIEWS}; got {view!r}")


def _recosted(costs: pd.DataFrame, mine: pd.DataFrame) -> pd.DataFrame:
    ov = Overheads(**json.loads(costs.loc[costs["setting"] == "card", "charge"].iloc[0]))
    mine = mine.set_index(["model", "workload", "seed", "setting"])
    r = ratios(costs).set_index(["model", "workload", "seed", "setting"])

    def at(setting, col):
        return mine.xs(setting, level="setting")[col]

    def share(col, setting="card", fmt="{:.2f}%"):  # `col` as a share of the setting's step, as text
        return _span(100 * at(setting, col) / at(setting, "step_s"), fmt)

    def added(without):  # share of the card's step that the one overhead adds, as text
        return _span(100 * ((at("card", "step_s") - at(without, "step_s")) / at("card", "step_s")), "{:.2f}%")

    def sweep(settings):
        return "; ".join(f"{s}: ReLibra / Megatron {_span(x['relibra_over_megatron'], '{:.3f}')}, ReLibra / EPLB+ "
                         f"{_span(x[f'relibra_over_eplb_plus_{PAPER_EPLB_PLUS_SLOTS}'], '{:.3f}')}, gap to Balanced "
                         f"{_span(100 * x['gap_to_balanced'], '{:.1f}%')}"
                         for s, x in ((s, r.xs(s, level="setting")) for s in settings))

    pushes = (at("card", "exposed_transfer_s") - at("no recompute", "exposed_transfer_s")).clip(lower=0)
    metadata = 100 * at("card", "metadata_s_per_microbatch") * at("card", "micro_batches")  # % x step seconds
    rows = [
        ("transfer overlap efficiency", "overheads.transfer_overlap_efficiency",
         f"{added('overlap efficiency 1.0')} of the step at {ov.transfer_overlap_efficiency:g} (exposed transfers "
         f"{share('exposed_transfer_s')} of the step; {share('exposed_transfer_s', 'overlap efficiency 1.0')} at 1.0)",
         f"yes ({ov.transfer_overlap_efficiency:g}; every overlapping plan)" if ov.transfer_overlap_efficiency < 1
         else "no",
         sweep(["overlap efficiency 0.7", "card", "overlap efficiency 1.0"])),
        ("activation recomputation (every policy) and its replica pushes", "overheads.activation_recompute",
         f"{added('no recompute')} of the step: the recomputed forward {share('recompute_s')} (every policy pays it); "
         f"the backward pushes moved into its shorter window {_span(100 * pushes / at('card', 'step_s'), '{:.3f}%')}",
         "yes (full, one layer at a time)" if ov.activation_recompute else "no", sweep(["card", "no recompute"])),
        ("replica gradient add into the home", "overheads.replica_grad_add", f"{share('grad_add_s')} of the step",
         "yes" if ov.replica_grad_add else "no", sweep(["card", "no grad add"])),
        ("planner beyond the post-rollout window", "overheads.planner_window_forward_passes",
         f"planner {_span(at('card', 'planner_s'), '{:.2f} s')} a step against a window of "
         f"{_span(at('card', 'planner_window_s'), '{:.1f} s')}: {added('planner not charged')} of the step exposed",
         f"yes (window {ov.planner_window_forward_passes:g} forward passes)" if ov.charges_planner else "no",
         sweep(["planner window 0", "card", "planner window 2"])),
        ("per-call floor of the grouped expert GEMM", "overheads.gemm_call_floor_s",
         f"{added('no GEMM floor')} of the step (the floor's own seconds {share('gemm_floor_s')} of the step, "
         f"{1e3 * ov.gemm_call_floor_s:.2f} ms a call)",
         f"yes ({1e3 * ov.gemm_call_floor_s:.2f} ms per GPU per (micro-batch, layer))" if ov.gemm_call_floor_s > 0
         else "no", sweep(["no GEMM floor", "card"])),
        ("replica copies contending with the all-to-all on NVLink", "overheads.copy_a2a_contention",
         f"{added('copy contention 0')} of the step at {ov.copy_a2a_contention:g} (contention "
         f"{share('copy_contention_s')} of the step; {share('copy_contention_s', 'copy contention 1')} at 1)",
         f"yes ({ov.copy_a2a_contention:g} of the copy seconds)" if ov.copy_a2a_contention > 0 else "no",
         sweep(["copy contention 0", "card", "copy contention 1"])),
        ("plan metadata broadcast", "overheads.plan_metadata_charged",
         f"{_span(at('card', 'metadata_bytes_per_microbatch') / 1e3, '{:.0f} kB')} per micro-batch, "
         f"{_span(1e6 * at('card', 'metadata_s_per_microbatch'), '{:.0f} us')} to copy; charged with its broadcast "
         f"{share('plan_broadcast_s', fmt='{:.4f}%')} of the step (were none of it hidden: "
         f"{_span(metadata / at('card', 'step_s'), '{:.4f}%')})",
         "yes (in line before each micro-batch)" if ov.plan_metadata_charged else "no",
         sweep(["metadata not charged", "card"])),
        ("migration", "(charged by the cost model)", f"{share('migration_s')} of the step", "yes", "-"),
        ("optimizer step (host Adam under CPU offload, every policy)", "optimizer.host_adam_params_per_s",
         f"{share('term_optimizer')} of the step", "yes (once per step, per stage)", "-"),
        ("stage-to-stage activation and gradient sends", "(charged by the cost model)",
         f"{share('term_pipeline_send', fmt='{:.3f}%')} of the step", "yes (0 without a pipeline)", "-"),
        ("replica memory", "training.replica_buffer",
         f"{_span(100 * at('card', 'replica_memory_share'), '{:.2f}%')} of parameter memory per GPU", "reported", "-"),
    ]
    return pd.DataFrame(rows, columns=["overhead", "card_entry", "figure", "charged", "sweep"])


# The paper's figures for ReLibra's overheads (from a second-hand summary of arXiv 2605.08639); None: not given.
PAPER_OVERHEADS = {
    "migration": "1.4-2.1% of the training-batch time",
    "replica memory": "0.13-1.62% extra parameter memory",
    "planner time": "hidden in the post-rollout phase",
    "transfers hidden behind attention": "pushes and pulls overlapped with attention",
    **dict.fromkeys(("replica GEMM fragmentation", "kernel launches per replica", "grouped GEMM per-call floor",
                     "replica copies contending with the all-to-all", "plan metadata broadcast", "pipeline bubble",
                     "optimizer step", "stage-to-stage sends")),
}


def _headline(g: pd.DataFrame) -> pd.DataFrame:
    def stat(x, scale=100.0, fmt="{:.2f}%"):
        return _span(x.astype(float) * scale, fmt, ranged=True)

    step = g["step_s"].astype(float)

    def of_step(col, fmt="{:.2f}%"):
        return stat(g[col] / step, fmt=fmt) + " of step time"

    # the exposed replica seconds include the replica gradients' adds into their homes (compute): not transfer
    exposed = g["exposed_transfer_share"] * step - g["grad_add_s"]
    hidden = 1.0 - exposed / g["transfer_s"].where(g["transfer_s"] > 0)
    rows = [
        ("migration", stat(g["migration_share"]) + " of step time",
         "charged: moved weights plus the optimizer state's share over the expert data-parallel ranks, at the "
         "link rates, once per step"),
        ("replica memory", stat(g["replica_memory_share"]) + " of parameter memory per GPU",
         "reported: the layer-shared buffer's slots x expert weights and gradients"),
        ("planner time", stat(g["plan_s"], 1.0, "{:.3f} s") + " per step, measured on this CPU (1 core)",
         "charged: the modelled planner seconds beyond the post-rollout window (the card's "
         "overheads.planner_window_forward_passes forward passes)" if g["planner_on_critical_path"].any() else
         "not charged: planned after rollout, off the critical path (as the paper does)"),
        ("transfers hidden behind attention", stat(hidden) + " of replica transfer time hidden",
         "charged: the part of each push and pull longer than its layer's attention"),
        ("replica GEMM fragmentation", of_step("fragmentation_s"),
         "charged: every replica GEMM pays the fixed GEMM cost (gemm_half_tokens, swept in the tornado)"),
        ("kernel launches per replica",
         f"{g['replica_transfers'].mean() / max(1.0, float(g['micro_batches'].mean())):.0f} transfers per micro-batch, "
         f"{stat(g['launch_s'] / step)} of step time if none overlapped",
         "charged: one collective launch per push and pull at collective_latency_s (swept in the tornado), inside "
         "the overlap window; the replica GEMMs run in the grouped GEMM's one launch"),
        ("grouped GEMM per-call floor", of_step("gemm_floor_s"),
         "charged: a GPU's grouped expert GEMM of one (micro-batch, layer) takes at least the measured per-call "
         "floor (overheads.gemm_call_floor_s, data/device/expert_gemm.json)"),
        ("replica copies contending with the all-to-all", of_step("copy_contention_s"),
         "charged: the assumed share overheads.copy_a2a_contention of the copies' seconds adds to the all-to-all "
         "(swept 0-1 in the tornado)"),
        ("plan metadata broadcast", of_step("plan_broadcast_s", "{:.4f}%"),
         "charged: each micro-batch's plan copied from the host and broadcast over the links before its first "
         "layer (overheads.plan_metadata_charged)"),
        ("pipeline bubble", of_step("bubble_s"),
         "charged: the 1F1B schedule's time beyond the busiest stage's work (every policy; 0 without a pipeline)"),
        ("optimizer step", of_step("optimizer_s"),
         "charged: once per step after the pipeline's flush, each stage's GPUs at once; the offloaded share at the "
         "host's CPU Adam rate (optimizer.host_adam_params_per_s, swept in the tornado) beside the GPU share and "
         "the PCIe copies (every policy)"),
        ("stage-to-stage sends", of_step("pipeline_send_s"),
         "charged: each micro-batch's activation forward and gradient backward between pipeline stages, over "
         "RDMA or NVLink by Megatron's rank order, holding the sending stage in plain 1F1B (0 without a pipeline)"),
    ]
    return pd.DataFrame([{"overhead": name, "paper": PAPER_OVERHEADS[name] or "not given", "kit": kit, "how": how}
                         for name, kit, how in rows])


# Notebook 07's per-policy view: these columns of the simulator's summary, then the ones _per_policy derives.
POLICY_COLUMNS = ["model", "workload", "ep", "cluster", "policy", "step_s", "forward_s", "migration_share",
                  "migration_gb", "replica_memory_share", "exposed_transfer_share", "planner_on_critical_path",
                  "speedup_vs_megatron", "plan_s"]


def _per_policy(s: pd.DataFrame) -> pd.DataFrame:
    # The simulator's exposed replica seconds include the replica gradients' adds into their homes' gradients
    # (compute charged beside the pulls); the transfers' exposed part is the rest. Each transfer's exposed part
    # is at most the transfer (relibra.costs.overheads.overlapped_seconds), so the overlap lies in [0, 1] by
    # construction: 0 for a policy that moves its replicas on the critical path (LLEP); NaN: no replica weights.
    out = s[POLICY_COLUMNS].assign(planner_vs_forward=s["plan_s"] / s["forward_s"], transfer_s=s["transfer_s"],
                                   replica_grad_add_s=s["replica_grad_add_s"],
                                   transfers_on_critical_path=s["transfers_on_critical_path"] > 0.5,
                                   exposed_transfer_s=s["exposed_transfer_s"] - s["replica_grad_add_s"])
    overlap = 1.0 - out["exposed_transfer_s"] / out["transfer_s"].where(out["transfer_s"] > 0)
    bad = (overlap < -1e-9) | (overlap > 1 + 1e-9)
    if bad.any():
        raise RelibraError(f"07_overheads: transfer overlap outside [0, 1] for {', '.join(out.loc[bad, 'policy'])} "
                           f"({', '.join(f'{v:.4g}' for v in overlap[bad])}): the cost model's exposed and total "
                           "replica seconds disagree")
    return out.assign(transfer_overlap=overlap.clip(0.0, 1.0))  # rounding only (checked above)


def gap_terms(costs: pd.DataFrame, setting: str = "card", variant: str = "relibra",
              reference: str = "balanced") -> pd.DataFrame:
    """The gap of `variant` to `reference` term by term: per step-time term (PlanCost.totals: the
    all-to-alls, expert and dense compute, replica transfers, planner, pipeline bubble, migration,
    optimizer), the variant's seconds minus the reference's as a share of the reference's step (mean and
    range over the cases), under one charge setting. The shares add up to the gap (variant step over the
    reference's, minus 1). Columns: term, gap_share."""
    rows = costs[costs["setting"] == setting].set_index(["model", "workload", "seed", "variant"])
    mine, ref = rows.xs(variant, level="variant"), rows.xs(reference, level="variant")
    terms = [c for c in costs.columns if c.startswith("term_")]
    out = [{"term": c[len("term_"):], "gap_share": _span(100 * (mine[c] - ref[c]) / ref["step_s"], "{:+.2f}%")}
           for c in terms]
    out.append({"term": "step (the gap)", "gap_share": _span(100 * (mine["step_s"] / ref["step_s"] - 1), "{:+.2f}%")})
    return pd.DataFrame(out)


def eplb_plus_table(costs: pd.DataFrame) -> pd.DataFrame:
    """ReLibra / EPLB+ with 0, 2 and 4 spare slots per GPU, under no overhead charged (transfers free behind
    attention) and under the card's charges (EPLB+'s pushes charged as ReLibra's): mean and range over the
    cases; `paper` marks the variant that matches the paper's description."""
    r = ratios(costs)
    free, charged = r[r["setting"] == "none"], r[r["setting"] == "card"]
    return pd.DataFrame([{"eplb+ spare slots": s,
                          "ReLibra / EPLB+, transfers free": _span(free[col], "{:.3f}"),
                          "ReLibra / EPLB+, charged like ReLibra": _span(charged[col], "{:.3f}"),
                          "paper": s == PAPER_EPLB_PLUS_SLOTS}
                         for s, col in ((s, f"relibra_over_eplb_plus_{s}") for s in EPLB_PLUS_SLOTS)])


def overhead_cases(setup: str = DEFAULT_CARD, models=PAPER_MODELS, workload: str = "mixed", seeds=(0,),
                   ep: int = 32) -> list[Case]:
    """The table's cases: every model at full scale on the card, one workload, the given seeds (the policies
    are the table's variants, policy_variants)."""
    return [Case(setup, m, workload, int(s), ep) for m in models for s in seeds]
