"""Notebook 12, the verdict as a map over tokens per EP rank x micro-batch shift (relibra.studies.claim_map)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from relibra.experiments.base import PATH, Fact, Result, TryThis, mean_of, param, table, value
from relibra.experiments.profiles import per_profile
from relibra.experiments.text import facts_table, figure_link
from relibra.experiments.traces import PROFILE
from relibra.studies.claim_map import (GridSpec, MapAxes, ShiftAxis, card_hits, card_points, claim_contours,
                                       claim_regions, contour_table, default_grid, merge_coincident, node_fields,
                                       paper_grid, rl_calibration, run_map)
from relibra.labels import CLAIMS, PAPER_CLAIMS, verdict_line
from relibra.setups import DEFAULT_CARD
from relibra.workloads import MICROBATCH_SHIFT_RANGE

QUESTION = ("Where, over tokens per EP rank and micro-batch shift, do the paper's claims hold, and where does each "
            "named set-up card sit?")

# The tiny profile's grid: the tiny model at EP 4 on a 16-sequence batch (the cards cut to fit), two budgets,
# the shift range's ends; the cards that publish no model of their own.
TINY_CARD_CHANGES = (("batch.global_batch_sequences", 16), ("batch.data_parallel_size", 4),
                     ("batch.expert_parallel", 4), ("overheads.planner_reorder_s_per_layer", 1e-9))


# laptop (the default): claim_map's default grid; paper and gpu: its whole grid; tiny: a toy grid for tests. The
# parameters replace the grid's tokens, shift values, models, workloads and seeds.
SIZES = {**per_profile(lambda name: paper_grid() if name in ("paper", "gpu") else default_grid()),
         "tiny": GridSpec("tiny", tokens=(512, 2048), shift=ShiftAxis("microbatch_shift", MICROBATCH_SHIFT_RANGE),
                          models=("tiny",), workloads=("mixed",), seeds=(0,), ep=4, steps=2,
                          cards=(DEFAULT_CARD, "one-sequence"), card_changes=TINY_CARD_CHANGES,
                          step_sequences=(16,))}  # one facet: the 16-sequence batch of TINY_CARD_CHANGES


@dataclass(frozen=True)
class Params(MapAxes):
    profile: str = param("laptop", "sizes of the grid: tiny, laptop (default grid), paper / gpu (whole grid)", PROFILE,
                         affects=False)
    out_dir: str | None = param(None, "where results go (None: results/interactive/12_verdict_map)", PATH,
                                affects=False)

    def scale_note(self, sizes: GridSpec) -> str:
        g = self.spec(sizes)
        cut = "; TOY GRID (tiny profile: the tiny model, EP 4, a 16-sequence batch)" if g.name == "tiny" else ""
        return (f"{g.name} grid: full scale (every MoE layer, every micro-batch of the card's batch), "
                f"{g.describe()}{cut}")

    def simulated_on(self) -> str:
        return "each set-up card's cluster"


@dataclass(kw_only=True)
class Result(Result):
    cases: pd.DataFrame = table("one row per simulated case (grid node or card point; model, workload, seed): tokens/s "
                                "per policy, the three ratios, the simulated tokens per EP rank, the generated "
                                "trace's correlations, the memory per GPU and whether it fits (feasible)")
    nodes: pd.DataFrame = table("per grid node (step size, tokens per EP rank, shift): best, mean and worst of each "
                                "ratio over the feasible models x workloads x seeds, the node's simulated position "
                                "and feasible")
    cards: pd.DataFrame = table("per named set-up card: its simulated position, memory verdict and the mean, best and "
                                "worst of each ratio over its feasible cases, at full scale on the card's own inputs")
    contours: pd.DataFrame = table("the paper's claims as contours: per claim level and step size, where the "
                                   "best-over-feasible-cases field crosses it on the grid's edges (tokens: the budget "
                                   "axis), with the generated trace's correlation there")
    regions: list = value(None)  # per claim: where on the grid it holds (claim_map.claim_regions)
    hits: list = value(None)  # per speed-up claim: the named cards that reach it (claim_map.card_hits)
    grid: dict = value(None)  # the GridSpec simulated
    calibration: dict = value(None)  # the real RL trace's micro-batch vs step correlation (the shift's source)


def compute(p: Params, sizes: GridSpec, progress: bool = True, workers: int | None = None) -> Result:
    spec = p.spec(sizes)
    result = run_map(spec, workers=workers, progress=progress)
    fields = node_fields(result)
    return Result(cases=result.frame, nodes=fields, cards=card_points(result),
                  contours=contour_table(claim_contours(result, fields)), regions=claim_regions(result, fields),
                  hits=card_hits(result), grid=spec.to_dict(), calibration=rl_calibration())


# ---- reading the result ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Summary:
    verdict: tuple[str, ...]  # one line per paper claim (relibra.labels.verdict_line of its region)
    regions: tuple[dict, ...]  # per claim: where on the grid it holds (claim_map.claim_regions)
    cards: pd.DataFrame  # the feasible cards' points (merge_coincident), with EPLB+'s and Megatron's mean tokens/s
    best_over_eplb_plus: tuple[float, float, float]  # the best ReLibra / EPLB+, its shift and correlation
    shift_effect: tuple[float, float, float] | None  # lowest and highest shift, ReLibra / EPLB+'s mean change
    calibration: dict
    out_of_memory: tuple[str, ...] = ()  # cards that do not fit in memory: left out of every figure

    def why(self, x: pd.Series) -> str:
        """Why card x's figure (a row of `cards`) is not the paper's: a short template over its point, the
        grid's claim regions and the grid's best ReLibra / EPLB+."""
        (meg, eplb, gap), need = PAPER_CLAIMS, self.regions[0]  # regions follow PAPER_CLAIMS
        best, shift, corr = self.best_over_eplb_plus
        over_eplb, gap_mean = x["relibra_over_eplb_plus_mean"], x["gap_to_balanced_mean"]
        mbs = f"{x['micro_batches']:.0f} micro-batch" + ("" if round(x["micro_batches"]) == 1 else "es")
        parts = [f"it packs {x['tokens_per_ep_rank']:.0f} tokens per EP rank per micro-batch ({mbs} a step)"]
        if not meg.holds(x["relibra_over_megatron_best"]):
            parts.append(f"{meg.level:g}x over Megatron needs at least {need['min_tokens_per_ep_rank']:.0f} "
                         "simulated tokens per EP rank on the grid" if need["min_tokens"] else
                         f"the grid reaches {meg.level:g}x over Megatron nowhere (best {meg.fmt(need['best'])} at "
                         f"{need['best_tokens_per_ep_rank']:.0f} simulated tokens per EP rank)")
        if x["tokens_per_s_eplb+"] < x["tokens_per_s_megatron"]:  # ReLibra / EPLB+ is large for another reason
            parts.append(f"EPLB+ is slower than Megatron here ({x['tokens_per_s_eplb+']:.0f} vs "
                         f"{x['tokens_per_s_megatron']:.0f} tokens/s): its own costs over {mbs} a step, not "
                         f"micro-batch shift, lift ReLibra / EPLB+ to {eplb.fmt(over_eplb)}")
        elif eplb.holds(over_eplb):  # reached although the micro-batches follow their step
            parts.append(f"its micro-batches correlate with their step at {x['mb_vs_step_corr']:.2f}, yet ReLibra / "
                         f"EPLB+ is {eplb.fmt(over_eplb)}: what EPLB+'s placement for the step's total leaves "
                         f"unbalanced is paid in each of its {mbs} (and again in a pipelined card's 1F1B bubble)")
        else:
            parts.append(f"its micro-batches correlate with their step at {x['mb_vs_step_corr']:.2f}"
                         + (", so EPLB+'s placement for the step's total serves each of them largely"
                            if x["mb_vs_step_corr"] >= 0.85 else "") + f": ReLibra / EPLB+ is {eplb.fmt(over_eplb)}")
        if not eplb.holds(x["relibra_over_eplb_plus_best"]):
            parts.append(f"{eplb.level:g}x over EPLB+ is reached {'only elsewhere' if eplb.holds(best) else 'nowhere'}"
                         f" on the grid (best {eplb.fmt(best)} at the assumed shift {shift:g}, correlation {corr:.2f})")
        if not gap.inside_range(gap_mean):
            parts.append(f"its gap to Balanced ({gap.fmt(gap_mean)}) is {'below' if gap_mean < gap.lower else 'above'}"
                         f" the paper's {gap.paper[len('within '):]}")
        return "; ".join(parts)


def summarize(r: Result) -> Summary:
    fits = r.cases[r.cases["feasible"].astype(bool)]
    own, g = (fits[fits["kind"] == kind] for kind in ("card", "grid"))
    cards = merge_coincident(r.cards)
    if len(cards):
        cards = cards[cards["feasible"].astype(bool)].reset_index(drop=True)
        for p in ("eplb+", "megatron"):  # over the cases of every card merged into the point
            cards[f"tokens_per_s_{p}"] = [float(own.loc[own["setup"].isin(name.split(" = ")), f"tokens_per_s_{p}"]
                                                .mean()) for name in cards["setup"]]
    eplb = r.nodes.loc[r.nodes["relibra_over_eplb_plus_best"].idxmax()]
    lo, hi = g["shift_value"].min(), g["shift_value"].max()
    at = [float(g.loc[g["shift_value"] == v, "relibra_over_eplb_plus"].mean()) for v in (lo, hi)]
    hits = {h["id"]: h["cards"] for h in r.hits or ()}
    return Summary(tuple(verdict_line(x, hits.get(x["id"], ())) for x in r.regions), tuple(r.regions), cards,
                   (eplb["relibra_over_eplb_plus_best"], eplb["shift_value"], eplb["mb_vs_step_corr"]),
                   (lo, hi, at[1] - at[0]) if hi > lo else None, r.calibration,
                   tuple(f"{x['setup']} ({x['memory_GB']:.0f} GB of {x['hbm_GB']:.0f} GB per GPU)"
                         for _, x in r.cards.iterrows() if not x["feasible"]))


def story(s: Summary) -> str:
    """The answer per claim, each card's point and why it differs, the shift's effect, the calibration."""
    meg, eplb, gap = PAPER_CLAIMS
    lines = ["The answer, one line per paper claim (simulated):\n\n" + "\n".join(f"- {v}." for v in s.verdict)] + [
        f"- `{x['setup']}`: ReLibra / Megatron {meg.fmt(x['relibra_over_megatron_mean'])} (best "
        f"{meg.fmt(x['relibra_over_megatron_best'])}), / EPLB+ {eplb.fmt(x['relibra_over_eplb_plus_mean'])}, gap to "
        f"Balanced {gap.fmt(x['gap_to_balanced_mean'])}: {s.why(x)}." for _, x in s.cards.iterrows()]
    if s.out_of_memory:
        lines.append("Left out (they do not fit in memory, `relibra setup show CARD`): " + "; ".join(s.out_of_memory)
                     + ".")
    if s.shift_effect:
        lines.append("Moving the micro-batch shift from {:g} to {:g} changes ReLibra / EPLB+ by {:+.3f} on average "
                     "over the grid's cases: EPLB+ balances the step's total once, so it loses exactly what the "
                     "micro-batches no longer share with their step.".format(*s.shift_effect))
    if s.calibration:
        lines.append(f"Calibration: {s.calibration['label']} has micro-batch vs step correlation "
                     f"{s.calibration['mb_vs_step_corr']:.2f} at {s.calibration['tokens_per_ep_rank']:.0f} tokens per "
                     "micro-batch; the public routing data (data/public/) are data-set level and give no micro-batch "
                     "figure, and ForeMoE (arXiv 2606.11867) states that micro-step load fluctuates without a figure.")
    return "\n\n".join(lines)


SECTION_FIRST = True  # REPORT.md opens with this notebook's verdict table
GRID = "the grid"  # the `of` of a claim region's facts


def _unit(c, stat: str) -> str:
    """The unit of a claim region's `stat` (claim_map.claim_regions' keys)."""
    return (c.unit if stat in ("best", "worst") else "tokens" if "tokens" in stat else "corr" if "corr" in stat
            else "count")


def facts(r: Result, scale: str) -> list[Fact]:
    """Per paper claim its region's numbers (the README's verdict line) and the cards that reach it; per named
    card (coincident ones merged) its point: the three ratios and its position."""
    out = []
    hits = {h["id"]: h["cards"] for h in r.hits or ()}
    for region in r.regions:
        c = CLAIMS[region["id"]]
        title = f"the verdict map: {c.statement}"
        out += [Fact(c.id, region[k], _unit(c, k), k, GRID, readme=title) for k in sorted(region)  # as result.json
                if k not in ("id", "claim", "field", "verdict", "level") and region[k] is not None]
        out += [Fact(c.id, v, c.unit, "reached by the card", card, readme=title) for card, v in hits.get(c.id, ())]
    for _, x in summarize(r).cards.iterrows():
        title = f"`{x['setup']}` card's point on the map"
        out += [Fact(c.id, x[f"{c.id}_{k}"], c.unit, k, x["setup"], readme=title) for c in PAPER_CLAIMS
                for k in ("mean", "best", "worst")[:3 if c.is_gap else 2]]
        out += [Fact("tokens_per_ep_rank", x["tokens_per_ep_rank"], "tokens", of=x["setup"], readme=title),
                Fact("mb_vs_step_corr", x["mb_vs_step_corr"], "corr", of=x["setup"], readme=title),
                Fact("cases", int(x["cases"]), "count", of=x["setup"])]
    return out


def section(x, table_md) -> str:
    """REPORT.md's opening: the answer, one line per paper claim, then the cards' points (one column per card,
    coincident cards merged under both names), then per card why its figure differs, then the map."""
    s, man, f = x.summary, x.manifest, x.facts
    why = "".join(f"- `{c['setup']}`: {s.why(c)}.\n" for _, c in s.cards.iterrows())
    answer = "\n".join(f"- **{line.split(': ', 1)[0]}**: {line.split(': ', 1)[1]}." for line in s.verdict)
    cards = f[(f["of"] != GRID) & (f["stat"] != "reached by the card")]
    return ("## The answer (simulated)\n\n"
            f"{answer}\n\nAll simulated: notebook 12, {man['scale_note']}; every card at full scale on its own "
            "inputs (`relibra setup show CARD`).\n\n### Per set-up card\n\n"
            f"{table_md(facts_table(cards, 'name', 'of')) if len(s.cards) else 'No card was simulated.'}\n\n"
            f"Why each card's figure differs from the paper's:\n\n{why}"
            + figure_link(x, "verdict_map", "verdict map"))


TRIES = (
    TryThis(lambda p, s: {"tokens": ",".join(str(4 * t) for t in p.tokens)},
            "ReLibra / Megatron (mean over the grid's cases)",
            lambda r: mean_of(r.cases, "relibra_over_megatron", kind="grid"), +1,
            "more tokens per EP rank make each micro-batch's expert GEMMs longer against its fixed costs, so the "
            "busiest GPU's expert time, which balancing removes, is a larger share of the step"),
    TryThis(lambda p, s: {"shift": f"{MICROBATCH_SHIFT_RANGE[1]:g}"}, "ReLibra / EPLB+ (mean over the grid's cases)",
            lambda r: mean_of(r.cases, "relibra_over_eplb_plus", kind="grid"), +1,
            "EPLB+ places experts once for the step's total, so the more micro-batches differ from their step, the "
            "more per-micro-batch balancing gains over it"),
    TryThis(lambda p, s: {"shift": f"{MICROBATCH_SHIFT_RANGE[1]:g}"},
            "the micro-batch vs step load correlation (mean over the grid's cases)",
            lambda r: mean_of(r.cases, "mb_vs_step_corr", kind="grid"), -1,
            "the shift trades expert shares inside each micro-batch, which moves it away from its step's total"),
)


def plot_inputs(r: Result) -> dict:
    """plots.verdict_map_plot's inputs from the result, all but the subtitle."""
    return {"nodes": r.nodes, "cards": merge_coincident(r.cards), "calibration": r.calibration,
            "grid_note": f"{r.grid['name']} grid", "shift_range": MICROBATCH_SHIFT_RANGE}
