"""The headline: the paper's three claims against the kit's figures at full scale, over seeds.

`headline_grid` simulates every policy on every (model, workload, seed) of a set-up card at full scale
(every MoE layer, every micro-batch the card's batch gives), one trace per case: `steps` steps, the
last one simulated, the ones before history for EPLB. Cases run in worker processes, one per core.
`verdict_table` turns the grid into one row per paper claim: the kit's mean over cases and seeds, the
range, the best case and seed behind every "up to", and the range over seeds of the best case.
`budget_sweep` gives ReLibra / Megatron and ReLibra / EPLB+ against the tokens per micro-batch for the
token-budget family and the one-sequence-per-micro-batch family.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ProcessPoolExecutor, as_completed

import numpy as np
import pandas as pd

from relibra.cluster import get_model
from relibra.experiments.config import scaled_model
from relibra.progress import progress as tqdm
from relibra.setups import load_card
from relibra.sim import simulate
from relibra.workloads import BATCH_LAYOUTS, generate_trace, mean_sequence_tokens

# The paper's headline claims (abstract), next to which REPORT.md puts the kit's figures.
PAPER_CLAIMS = {
    "relibra_vs_megatron": "up to 1.6x",
    "relibra_vs_eplb+": "up to 1.2x",
    "relibra_gap_to_balanced": "within 6-10%",
}
HEADLINE_MODELS = ("qwen3-30b-a3b", "glm-4.5-air", "qwen3-235b-a22b")
HEADLINE_WORKLOADS = ("math", "science", "instruct", "code", "mixed")
HEADLINE_SEEDS = (0, 1, 2)
# Every registered policy; balanced-compute is added by the simulator as a reference row.
HEADLINE_POLICIES = ("megatron", "eplb", "eplb+", "lplb+", "eplb+lp", "llep", "relibra", "relibra-reorder",
                     "relibra-replicate", "relibra-lpt", "relibra-split", "relibra-h", "balanced")
# Tokens per micro-batch of the budget sweep (per GPU; one-sequence family: sequences scaled to them).
SWEEP_TOKENS = (4096, 8192, 16384, 32768)
CASE_KEYS = ["setup", "model", "workload", "seed", "ep", "layout", "tokens_per_microbatch"]


@dataclasses.dataclass(frozen=True)
class Case:
    """One simulated case: a set-up card (name or path) with its layout and budget, model, workload, seed."""

    setup: str
    model: str
    workload: str
    seed: int
    ep: int = 32
    layout: str | None = None  # None: the card's
    tokens_per_microbatch: int | None = None  # None: the card's
    steps: int = 3
    layers: int | None = None  # None: every MoE layer
    micro_batches: int | None = None  # None: the card's (token-budget: every micro-batch of the batch)
    policies: tuple[str, ...] = HEADLINE_POLICIES
    card_changes: tuple[tuple[str, object], ...] = ()  # (card key, value) pairs, e.g. other link rates
    label: str = ""  # what this case varies, for tables of alternatives


def simulate_case(case: Case) -> pd.DataFrame:
    """Every policy of `case` simulated on its trace: one summary row per policy with the case's keys."""
    card = load_card(case.setup)
    if case.card_changes:
        card = card.with_values(f"headline case: {case.label}",
                                **{k.replace(".", "__"): v for k, v in case.card_changes})
    if case.layout is not None:
        card = card.with_values("headline case", batch__layout=case.layout)
    cfg = card.workload_config()
    if case.tokens_per_microbatch is not None:
        if cfg.batch_layout == "token-budget":
            card = card.with_values("headline case", batch__tokens_per_gpu_per_microbatch=case.tokens_per_microbatch)
            cfg = card.workload_config()
        else:  # whole sequences in fixed slots: the sequences themselves carry the tokens per micro-batch
            scale = case.tokens_per_microbatch / mean_sequence_tokens(cfg, case.workload)
            cfg = dataclasses.replace(cfg, length_scale=scale)
    micro_batches = case.micro_batches or card.micro_batches
    card.check_ep(case.ep)  # the case runs on the card's cluster
    shape = scaled_model(case.model, case.layers)
    trace = generate_trace(shape, case.workload, case.ep, steps=case.steps, seed=case.seed,
                           micro_batches=micro_batches, config=cfg)
    topology = card.topology()
    result = simulate(trace, topology, list(case.policies), steps=1, params=card.cost_params(case.ep),
                      policy_params=card.policy_params(case.policies), progress=False, workload=case.workload,
                      step_extras=lambda plan, cost: overhead_extras(plan, cost, trace.model, topology))
    summary = result.summary.copy()
    extras = result.per_step.groupby("policy")[list(OVERHEAD_EXTRAS)].mean()
    summary = summary.join(extras, on="policy")
    slot_tokens = trace.seq_lens[-1].sum(axis=-1)
    for key, value in (("setup", card.name), ("model", case.model), ("workload", case.workload),
                       ("seed", case.seed), ("ep", case.ep), ("layout", cfg.batch_layout),
                       ("tokens_per_microbatch", case.tokens_per_microbatch or (
                           card.tokens_per_ep_rank if cfg.batch_layout == "token-budget" else None))):
        summary[key] = value
    summary["label"] = case.label
    summary["layers"] = trace.num_layers
    summary["micro_batches"] = trace.num_microbatches
    summary["mean_tokens_per_slot"] = float(slot_tokens.mean())
    summary["max_tokens_per_slot"] = int(slot_tokens.max())
    return summary


OVERHEAD_EXTRAS = ("transfer_s", "fragmentation_s", "replica_transfers", "launch_s")


def overhead_extras(plan, cost, model, topology) -> dict:
    """Overheads of one simulated step the summary does not carry, for the overheads table.

    transfer_s: replica pushes and pulls had none been hidden behind attention (their exposed part is
    the summary's exposed_transfer_share); fragmentation_s: what splitting an expert's tokens over
    replica GEMMs adds to the slowest GPU's routed-expert time (each copy pays the fixed GEMM cost,
    relibra.costs.flops.gemm_seconds), forward and backward; replica_transfers: weight pushes and
    gradient pulls per step (the layer-shared buffer pushes twice, pulls once), each one collective
    launch; launch_s: those launches at the cluster's collective latency, had they not overlapped.
    """
    replicas = (plan.occupied_replica_tokens() > 0).sum(axis=3) if plan.replica_slots else np.zeros(cost.gpu_tokens.shape)
    fixed = model.expert_flops_per_token * topology.gemm_half_tokens * replicas / topology.matmul_flops_per_s
    expert = cost.expert_seconds_per_gpu
    fragmentation = 3.0 * float((expert.max(axis=2) - (expert - fixed).max(axis=2)).sum())  # forward + 2x backward
    transfers = int(3 * replicas.sum()) if not plan.transfers_on_critical_path else int(2 * replicas.sum())
    return {"transfer_s": float(cost.replica_transfer_s), "fragmentation_s": fragmentation,
            "replica_transfers": transfers, "launch_s": transfers * topology.collective_latency_s}


# The paper's figures for ReLibra's overheads (from a second-hand summary of arXiv 2605.08639); None: not given.
PAPER_OVERHEADS = {
    "migration": "1.4-2.1% of the training-batch time",
    "replica memory": "0.13-1.62% extra parameter memory",
    "planner time": "hidden in the post-rollout phase",
    "transfers hidden behind attention": "pushes and pulls overlapped with attention",
    "replica GEMM fragmentation": None,
    "kernel launches per replica": None,
}


def overheads_table(grid: pd.DataFrame, policy: str = "relibra") -> pd.DataFrame:
    """One row per ReLibra overhead: the paper's figure and the kit's (mean and range over the grid's
    cases and seeds), with how the kit obtains it (charged in the simulated step, or reported)."""

    def stat(series, scale=100.0, fmt="{:.2f}%"):
        x = series.astype(float) * scale
        return f"{fmt.format(x.mean())} (range {fmt.format(x.min())} - {fmt.format(x.max())})"

    g = grid[grid["policy"] == policy].copy()
    step = g["step_s"].astype(float)
    hidden = 1.0 - g["exposed_transfer_share"] * step / g["transfer_s"].where(g["transfer_s"] > 0)
    rows = [
        ("migration", stat(g["migration_share"]) + " of step time",
         "charged: moved weights plus the optimizer state's share over the expert data-parallel ranks, at the "
         "link rates, once per step"),
        ("replica memory", stat(g["replica_memory_share"]) + " of parameter memory per GPU",
         "reported: the layer-shared buffer's slots x expert weights and gradients"),
        ("planner time", stat(g["plan_s"], 1.0, "{:.3f} s") + " per step, measured on this CPU (1 core)",
         "not charged: planned after rollout, off the critical path (as the paper does)"),
        ("transfers hidden behind attention", stat(hidden) + " of replica transfer time hidden",
         "charged: the part of each push and pull longer than its layer's attention"),
        ("replica GEMM fragmentation", stat(g["fragmentation_s"] / step) + " of step time",
         "charged: every replica GEMM pays the fixed GEMM cost (gemm_half_tokens, swept in the tornado)"),
        ("kernel launches per replica", f"{g['replica_transfers'].mean() / max(1.0, float(g['micro_batches'].mean())):.0f} "
         f"transfers per micro-batch, {stat(g['launch_s'] / step)} of step time if none overlapped",
         "charged: one collective launch per push and pull at collective_latency_s (swept in the tornado), inside "
         "the overlap window; the replica GEMMs run in the grouped GEMM's one launch"),
    ]
    return pd.DataFrame([{"overhead": name, "paper": PAPER_OVERHEADS[name] or "not given", "kit": kit, "how": how}
                         for name, kit, how in rows])


def run_cases(cases: list[Case], workers: int | None = None, progress: bool = True, desc: str = "cases"
              ) -> pd.DataFrame:
    """simulate_case over `cases`, in `workers` processes (default: one per core, at most len(cases)); rows
    in the cases' order whatever the workers' timing, so the same cases give the same frame."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(cases)))
    bar = tqdm(total=len(cases), desc=desc, unit="case", disable=not progress)
    frames: list = [None] * len(cases)
    if workers == 1:
        for i, case in enumerate(cases):
            frames[i] = simulate_case(case)
            bar.update()
    else:
        # Each worker keeps one BLAS thread: the cores are the workers'.
        env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        os.environ.update({k: "1" for k in env})
        try:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(simulate_case, case): i for i, case in enumerate(cases)}
                for fut in as_completed(futures):
                    frames[futures[fut]] = fut.result()
                    bar.update()
        finally:
            for k, v in env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    bar.close()
    for i, f in enumerate(frames):
        f["case_index"] = i
    return pd.concat(frames, ignore_index=True)


def headline_cases(setup: str = "token-budget-tp1", models=HEADLINE_MODELS, workloads=HEADLINE_WORKLOADS, seeds=HEADLINE_SEEDS,
                   ep: int = 32, policies=HEADLINE_POLICIES, steps: int = 3, layers: int | None = None,
                   micro_batches: int | None = None) -> list[Case]:
    """The full-scale grid: every (model, workload, seed) of the card, largest models first (they take
    longest, so two workers finish together)."""
    order = sorted(models, key=lambda m: -get_model(m).num_layers)
    return [Case(setup, m, w, int(s), ep, steps=steps, layers=layers, micro_batches=micro_batches,
                 policies=tuple(policies)) for m in order for w in workloads for s in seeds]


def headline_grid(setup: str = "token-budget-tp1", workers: int | None = None, progress: bool = True, **grid) -> pd.DataFrame:
    """Every policy simulated on every case of headline_cases(setup, **grid); one row per (case, policy)."""
    return run_cases(headline_cases(setup, **grid), workers, progress, desc="headline")


def _ratio(grid: pd.DataFrame, num: str, den: str) -> pd.Series:
    keys = [k for k in CASE_KEYS if k in grid]
    wide = grid.pivot_table(index=keys, columns="policy", values="tokens_per_s", aggfunc="mean")
    if num not in wide or den not in wide:
        return pd.Series(dtype=float)
    return (wide[num] / wide[den]).dropna()


def _case_text(idx, names) -> str:
    values = dict(zip(names, idx if isinstance(idx, tuple) else (idx,)))
    return f"{values.get('model')}, {values.get('workload')}, seed {values.get('seed')}"


def verdict_table(grid: pd.DataFrame) -> pd.DataFrame:
    """One row per paper claim from a headline grid.

    Columns: claim, paper, mean (over every case and seed), low, high, best_case (model, workload and
    seed of the "up to"), seeds_of_best (the same model and workload's range over seeds), cases.
    The gap to the ideal is 1 - ReLibra / balanced (the paper's Balanced: routing forced uniform) and,
    beside it, 1 - ReLibra / balanced-compute (the same routing with every GPU at the mean compute).
    """
    rows = []
    claims = (("ReLibra / Megatron", "relibra_vs_megatron", "relibra", "megatron", "ratio"),
              ("ReLibra / EPLB+ (oracle loads)", "relibra_vs_eplb+", "relibra", "eplb+", "ratio"),
              ("gap to Balanced (1 - ReLibra / Balanced)", "relibra_gap_to_balanced", "relibra", "balanced", "gap"),
              ("gap to balanced-compute (1 - ReLibra / balanced-compute)", None, "relibra", "balanced-compute", "gap"))
    for label, claim, num, den, kind in claims:
        ratio = _ratio(grid, num, den)
        if ratio.empty:
            continue
        value = 1.0 - ratio if kind == "gap" else ratio
        best = value.idxmin() if kind == "gap" else value.idxmax()
        names = list(value.index.names)
        same = value[[all(i[names.index(k)] == best[names.index(k)] for k in ("model", "workload"))
                      for i in value.index]]
        rows.append({"claim": label, "paper": PAPER_CLAIMS.get(claim, "-"), "kind": kind,
                     "mean": float(value.mean()), "low": float(value.min()), "high": float(value.max()),
                     "best": float(value[best]), "best_case": _case_text(best, names),
                     "seeds_of_best_low": float(same.min()), "seeds_of_best_high": float(same.max()),
                     "cases": int(len(value)), "seeds": int(grid["seed"].nunique())})
    return pd.DataFrame(rows)


def seed_spread(grid: pd.DataFrame, num: str = "relibra", den: str = "megatron") -> pd.DataFrame:
    """num / den per (model, workload): mean, min and max over seeds."""
    ratio = _ratio(grid, num, den).rename("ratio").reset_index()
    out = ratio.groupby(["model", "workload"], sort=False)["ratio"].agg(["mean", "min", "max", "count"])
    return out.reset_index()


def budget_cases(setup: str = "token-budget-tp1", alternative: str = "one-sequence", model: str = "qwen3-235b-a22b",
                 workload: str = "mixed", seed: int = 0, tokens=SWEEP_TOKENS, ep: int = 32,
                 policies=("megatron", "eplb+", "relibra", "balanced"), layers: int | None = None) -> list[Case]:
    """The budget sweep: the card (token-budget) and the alternative card (one sequence per micro-batch,
    sequences scaled so a slot holds about that many tokens), at each tokens per micro-batch."""
    return [Case(card, model, workload, seed, ep, tokens_per_microbatch=int(t), policies=tuple(policies),
                 layers=layers) for card in (setup, alternative) for t in tokens]


def budget_ratios(sweep: pd.DataFrame) -> pd.DataFrame:
    """ReLibra / Megatron and ReLibra / EPLB+ per (set-up, layout, tokens per micro-batch) of a sweep."""
    keys = ["setup", "layout", "tokens_per_microbatch", "model", "workload", "seed"]
    wide = sweep.pivot_table(index=keys, columns="policy", values="tokens_per_s", aggfunc="mean")
    out = pd.DataFrame({"relibra_over_megatron": wide["relibra"] / wide["megatron"],
                        "relibra_over_eplb_plus": wide["relibra"] / wide["eplb+"]}).reset_index()
    tokens = sweep.groupby(keys)["mean_tokens_per_slot"].first().reset_index(drop=True)
    out["mean_tokens_per_slot"] = tokens.to_numpy()
    return out


def headline_ratios(throughput: pd.DataFrame) -> pd.DataFrame:
    """The paper's three headline ratios from a throughput table of one seed (notebooks at a profile's scale).

    throughput: one row per (model, workload, policy) with `tokens_per_s` (other grouping columns such
    as ep or cluster are kept as part of the case). Returns one row per claim: the best case ("up to"),
    the range over cases, the number of cases, and the paper's figure.
    """
    keys = [c for c in ("model", "workload", "ep", "cluster") if c in throughput]
    wide = throughput.pivot_table(index=keys, columns="policy", values="tokens_per_s", aggfunc="mean")
    rows = []

    def case(idx) -> str:
        return ", ".join(str(v) for v in (idx if isinstance(idx, tuple) else (idx,)))

    for other, claim, label in (("megatron", "relibra_vs_megatron", "ReLibra / Megatron"),
                                ("eplb+", "relibra_vs_eplb+", "ReLibra / EPLB+ (oracle)")):
        if "relibra" in wide and other in wide:
            ratio = (wide["relibra"] / wide[other]).dropna()
            if len(ratio):
                rows.append({"claim": label, "paper": PAPER_CLAIMS[claim], "kit": f"up to {ratio.max():.2f}x",
                             "range": f"{ratio.min():.2f}x - {ratio.max():.2f}x", "mean": float(ratio.mean()),
                             "where_best": case(ratio.idxmax()), "cases": int(len(ratio))})
    if "relibra" in wide and "balanced" in wide:
        gap = (1.0 - wide["relibra"] / wide["balanced"]).dropna()
        if len(gap):
            rows.append({"claim": "gap to Balanced (1 - ReLibra / Balanced)",
                         "paper": PAPER_CLAIMS["relibra_gap_to_balanced"],
                         "kit": f"within {100 * gap.min():.1f}-{100 * gap.max():.1f}%",
                         "range": f"{100 * gap.min():.1f}% - {100 * gap.max():.1f}%", "mean": float(gap.mean()),
                         "where_best": case(gap.idxmin()), "cases": int(len(gap))})
    return pd.DataFrame(rows, columns=["claim", "paper", "kit", "range", "mean", "where_best", "cases"])


# Alternatives to the card's default beside the verdict: the other batch layouts and other link rates.
LINK_ALTERNATIVES = (
    ("H800 links (DeepEP README, re-counted)", (("cluster.nvlink_GBps", 135.6), ("cluster.rdma_GBps", 43.5))),
    ("datasheet links (450 / 50 GB/s)", (("cluster.nvlink_GBps", 450.0), ("cluster.rdma_GBps", 50.0))),
)


def alternative_cases(setup: str, model: str, workload: str, seed: int = 0, ep: int = 32,
                      layers: int | None = None, policies=("megatron", "eplb+", "relibra", "balanced")) -> list[Case]:
    """One case per other batch layout and per other link-rate pair, each on the card's other inputs."""
    default = load_card(setup).value("batch.layout")
    cases = [Case(setup, model, workload, seed, ep, layout=layout, layers=layers, policies=tuple(policies),
                  label=f"layout {layout}") for layout in BATCH_LAYOUTS if layout != default]
    cases += [Case(setup, model, workload, seed, ep, layers=layers, policies=tuple(policies), card_changes=changes,
                   label=label) for label, changes in LINK_ALTERNATIVES]
    return cases


def alternative_ratios(alternatives: pd.DataFrame) -> pd.DataFrame:
    """ReLibra / Megatron, ReLibra / EPLB+ and the gap to Balanced per alternative case."""
    wide = alternatives.pivot_table(index=["label", "model", "workload", "seed"], columns="policy",
                                    values="tokens_per_s", aggfunc="mean")
    return pd.DataFrame({"relibra_over_megatron": wide["relibra"] / wide["megatron"],
                         "relibra_over_eplb_plus": wide["relibra"] / wide["eplb+"],
                         "gap_to_balanced": 1.0 - wide["relibra"] / wide["balanced"]}).reset_index()


def case_ratios(grid: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, workload, seed) of a headline grid: ReLibra over Megatron and over EPLB+, and the
    gaps to balanced and balanced-compute."""
    wide = grid.pivot_table(index=["model", "workload", "seed"], columns="policy", values="tokens_per_s",
                            aggfunc="mean")
    out = pd.DataFrame({"relibra_over_megatron": wide["relibra"] / wide["megatron"],
                        "relibra_over_eplb_plus": wide["relibra"] / wide["eplb+"],
                        "gap_to_balanced": 1.0 - wide["relibra"] / wide["balanced"],
                        "gap_to_balanced_compute": 1.0 - wide["relibra"] / wide["balanced-compute"]})
    return out.reset_index()


@dataclasses.dataclass
class HeadlineResult:
    """What notebook 02 computes: the grid (one row per case, seed and policy), its per-case ratios, the
    verdict per paper claim, the budget sweep, the alternatives and ReLibra's overheads."""

    grid: pd.DataFrame
    ratios: pd.DataFrame
    verdict: pd.DataFrame
    sweep: pd.DataFrame
    alternatives: pd.DataFrame
    overheads: pd.DataFrame
    setup: str
    full_scale: bool
    caption: str = ""
    sweep_caption: str = ""

    def verdict_with_alternatives(self) -> pd.DataFrame:
        """The verdict table with the range over the alternatives (other layouts and link rates) per claim."""
        v = self.verdict.copy()
        cols = {"ReLibra / Megatron": "relibra_over_megatron", "ReLibra / EPLB+ (oracle loads)": "relibra_over_eplb_plus",
                "gap to Balanced (1 - ReLibra / Balanced)": "gap_to_balanced"}
        v["alternatives_low"] = [float(self.alternatives[cols[c]].min()) if c in cols else float("nan")
                                 for c in v["claim"]]
        v["alternatives_high"] = [float(self.alternatives[cols[c]].max()) if c in cols else float("nan")
                                  for c in v["claim"]]
        v["why"] = v["claim"].map(why_they_differ(self))
        v["scale"] = "full scale" if self.full_scale else "CUT-DOWN"
        return v


def config_headline(cfg, progress: bool = True, workers: int | None = None) -> HeadlineResult:
    """Notebook 02: the profile's HeadlineGrid on the set-up card (parameter `setup`, default paper): the
    grid, the budget sweep of both families and the alternatives, all cases in one pool of workers."""
    g = cfg.sizes.headline
    setup = cfg.extra.get("setup") or "token-budget-tp1"
    budget = cfg.extra.get("tokens_per_microbatch")
    grid_cases = [dataclasses.replace(c, tokens_per_microbatch=budget) for c in
                  headline_cases(setup, g.models, g.workloads, g.seeds, g.ep, steps=g.steps, layers=g.layers,
                                 micro_batches=g.micro_batches)]
    sweep_cases = [dataclasses.replace(c, steps=g.steps, micro_batches=g.micro_batches) for c in
                   budget_cases(setup, g.alternative, g.sweep_model, g.sweep_workload, 0, g.sweep_tokens, g.ep,
                                layers=g.layers)]
    alt_cases = [dataclasses.replace(c, steps=g.steps, micro_batches=g.micro_batches) for c in
                 alternative_cases(setup, g.sweep_model, g.sweep_workload, 0, g.ep, layers=g.layers)]
    frame = run_cases(grid_cases + sweep_cases + alt_cases, workers, progress, desc="headline")
    part = np.digitize(frame["case_index"], [len(grid_cases), len(grid_cases) + len(sweep_cases)])
    grid, sweep_rows, alternatives = (frame[part == i].drop(columns="case_index").reset_index(drop=True)
                                      for i in range(3))
    sweep = budget_ratios(sweep_rows)
    sweep["family"] = np.where(sweep["layout"] == "token-budget", "token-budget", "one sequence per micro-batch")
    scale = ("full scale: every MoE layer, every micro-batch of the batch" if g.full_scale else
             f"CUT-DOWN ({cfg.profile} profile): "
             + ("every MoE layer" if g.layers is None else f"first {g.layers} MoE layers") + ", "
             + ("every micro-batch" if g.micro_batches is None else f"{g.micro_batches} micro-batches"))
    card_text = f"`{setup}` set-up card" + ("" if budget is None else f" with {budget} tokens per micro-batch")
    caption = (f"simulated on the {card_text}, EP {g.ep}; {len(g.models)} models x {len(g.workloads)} "
               f"workloads x {len(g.seeds)} seeds ({', '.join(map(str, g.seeds))}); {scale}")
    # the sweep is one case at each budget: its caption names that case, not the grid
    sweep_caption = (f"simulated on the `{setup}` and `{g.alternative}` set-up cards, EP {g.ep}; {g.sweep_model}, "
                     f"{g.sweep_workload}, seed 0, {len(g.sweep_tokens)} budgets; {scale}")
    return HeadlineResult(grid=grid, ratios=case_ratios(grid), verdict=verdict_table(grid), sweep=sweep,
                          alternatives=alternative_ratios(alternatives), overheads=overheads_table(grid),
                          setup=setup, full_scale=g.full_scale, caption=caption, sweep_caption=sweep_caption)


def why_they_differ(result: HeadlineResult) -> dict[str, str]:
    """One sentence per claim on why the kit's figure differs from the paper's, computed from the grid."""
    g = result.grid
    by = g.groupby("policy")
    share = by[["expert_share", "a2a_share"]].mean()
    tps = g.pivot_table(index=["model", "workload", "seed"], columns="policy", values="tokens_per_s")
    ceiling = float((tps["balanced-compute"] / tps["megatron"]).mean())
    skew = by["skewness"].mean()
    alt = result.alternatives
    best_alt = alt.loc[alt["relibra_over_megatron"].idxmax()] if len(alt) else None
    alt_text = (f"; the largest alternative, {best_alt['label']}, gives {best_alt['relibra_over_megatron']:.2f}x"
                if best_alt is not None else "")
    return {
        "ReLibra / Megatron": (
            f"routed experts are {100 * share.loc['megatron', 'expert_share']:.0f}% of Megatron's simulated step and "
            f"its all-to-all {100 * share.loc['megatron', 'a2a_share']:.0f}%, so even balanced-compute (every GPU at "
            f"the mean expert compute) is only {ceiling:.2f}x Megatron on average{alt_text}"),
        "ReLibra / EPLB+ (oracle loads)": (
            f"packed micro-batches of ~{g['mean_tokens_per_slot'].mean():,.0f} tokens per rank move little from the "
            f"step's load, so EPLB+'s per-step placement already brings skewness from "
            f"{skew.get('megatron', float('nan')):.2f} to {skew.get('eplb+', float('nan')):.2f} "
            f"(ReLibra {skew.get('relibra', float('nan')):.2f})"),
        "gap to Balanced (1 - ReLibra / Balanced)": (
            "Balanced forces uniform routing, which also evens the all-to-all; ReLibra keeps the real routing's "
            "exchange, and the simulator charges no cost the paper measured beyond the overheads table"),
        "gap to balanced-compute (1 - ReLibra / balanced-compute)": (
            "the same routing and all-to-all with perfectly even expert compute: what placement and replication "
            "could at best remove"),
    }


VERDICT_COLUMNS = ("claim", "paper", "kind", "mean", "low", "high", "best", "best_case", "cases", "seeds",
                   "alternatives_low", "alternatives_high", "why", "scale")


def verdict_cells(row) -> dict:
    """The verdict row of one claim as text cells: the kit's mean and range, its best case and seed, the
    range over the alternatives ("x" for ratios, "%" for gaps)."""
    def f(v):
        return f"{100 * v:.1f}%" if row["kind"] == "gap" else f"{v:.2f}x"

    alt = ("-" if pd.isna(row["alternatives_low"]) else
           f"{f(row['alternatives_low'])} - {f(row['alternatives_high'])}")
    return {"claim": row["claim"], "paper": row["paper"],
            "kit (mean; range over cases x seeds)": f"{f(row['mean'])}; {f(row['low'])} - {f(row['high'])} over "
                                                     f"{int(row['cases'])} cases ({int(row['seeds'])} seeds)",
            "best case": f"{f(row['best'])} ({row['best_case']})",
            "other layouts and link rates": alt, "why they differ": row["why"]}


def verdict_story(verdict: pd.DataFrame) -> str:
    """Markdown: each paper claim against the kit's figure, and why they differ (notebook 02's narrative)."""
    lines = []
    for _, row in verdict.iterrows():
        c = verdict_cells(row)
        lines.append(f"- **{row['claim']}**: paper {row['paper']}; the kit {c['kit (mean; range over cases x seeds)']}, "
                     f"best {c['best case']}, {c['other layouts and link rates']} under other layouts and link rates. "
                     f"Why: {row['why']}.")
    return "\n".join(lines)
