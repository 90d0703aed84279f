"""Notebook 12, the verdict as a map: ReLibra / Megatron, ReLibra / EPLB+ and the gap to Balanced over
tokens per EP rank per micro-batch x micro-batch shift, the paper's claims as contours, every named set-up
card as a point (relibra.experiments.verdict_map)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from relibra.analysis import shift_stats
from relibra.cluster import get_model
from relibra.experiments.base import PATH, Kind, Params, Result, TryThis, integers, param, table, value
from relibra.experiments.profiles import per_profile
from relibra.experiments.text import row
from relibra.experiments.traces import PROFILE
from relibra.experiments.verdict_map import (CLAIMS, GridSpec, ShiftAxis, card_points, claim_contours, claim_regions,
                                             conclusion, default_grid, node_fields, paper_grid, run_map)
from relibra.setups import DEFAULT_CARD
from relibra.trace import RoutingTrace
from relibra.workloads import MICROBATCH_SHIFT_RANGE, WORKLOADS

QUESTION = ("Where, over tokens per EP rank and micro-batch shift, do the paper's claims hold, and where does each "
            "named set-up card sit?")

# The kit's real RL trace (`relibra rl`, notebook 09): its micro-batch vs step correlation is the calibration
# the shift range comes from (docs/traces.md); the map draws it as a line.
RL_TRACE = Path(__file__).resolve().parents[3] / "data" / "rl_tiny_seed0.npz"

# The tiny profile's grid: the tiny model at EP 4 on a 16-sequence batch (the cards cut to fit), two budgets,
# the shift range's ends; the cards that publish no model of their own.
TINY_CARD_CHANGES = (("batch.global_batch_sequences", 16), ("batch.data_parallel_size", 4),
                     ("batch.expert_parallel", 4), ("overheads.planner_reorder_s_per_layer", 1e-9))


def tiny_grid() -> GridSpec:
    return GridSpec("tiny", tokens=(512, 2048), shift=ShiftAxis("microbatch_shift", MICROBATCH_SHIFT_RANGE),
                    models=("tiny",), workloads=("mixed",), seeds=(0,), ep=4, steps=2,
                    cards=(DEFAULT_CARD, "one-sequence"), card_changes=TINY_CARD_CHANGES)


@dataclass(frozen=True)
class Sizes:
    """The profile's grid (verdict_map.GridSpec); tokens, shift, models, workloads and seeds are its axes
    (the parameters replace them)."""

    grid: GridSpec

    @property
    def tokens(self):
        return self.grid.tokens

    @property
    def shift(self):
        return self.grid.shift.values

    @property
    def models(self):
        return self.grid.models

    @property
    def workloads(self):
        return self.grid.workloads

    @property
    def seeds(self):
        return self.grid.seeds


# laptop (the default): verdict_map's default grid; paper and gpu: its whole grid; tiny: a toy grid for tests.
SIZES = {**per_profile(lambda name: Sizes(paper_grid() if name in ("paper", "gpu") else default_grid())),
         "tiny": Sizes(tiny_grid())}


def _shares(raw) -> tuple[float, ...]:
    items = raw if isinstance(raw, (list, tuple)) else [v for v in str(raw).split(",") if v.strip()]
    values = tuple(dict.fromkeys(float(v) for v in items))
    if not values:
        raise ValueError("empty")
    for v in values:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{v} is outside [0, 1]")
    return values


SHARES = Kind(f"comma-separated shares in [0, 1] (the sourced range is {MICROBATCH_SHIFT_RANGE[0]:g}-"
              f"{MICROBATCH_SHIFT_RANGE[1]:g})", _shares)


def _model_names(raw) -> tuple[str, ...]:
    items = raw if isinstance(raw, (list, tuple)) else [v.strip() for v in str(raw).split(",") if v.strip()]
    if not items:
        raise ValueError("empty")
    return tuple(dict.fromkeys(get_model(str(v)).name for v in items))


def _workload_names(raw) -> tuple[str, ...]:
    items = raw if isinstance(raw, (list, tuple)) else [v.strip() for v in str(raw).split(",") if v.strip()]
    unknown = [v for v in items if v not in WORKLOADS]
    if unknown or not items:
        raise ValueError(f"unknown workload {unknown[0]!r}" if unknown else "empty")
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class Params(Params):
    profile: str = param("laptop", "sizes of the grid: tiny, laptop (default grid), paper / gpu (whole grid)", PROFILE,
                         affects=False)
    tokens: tuple[int, ...] | None = param(None, "tokens per EP rank per micro-batch of the grid's nodes (None: the "
                                           "profile's)", integers(1), sizes="tokens")
    shift: tuple[float, ...] | None = param(None, "micro-batch shift values of the nodes (None: the profile's)",
                                            SHARES, sizes="shift")
    models: tuple[str, ...] | None = param(None, "model presets (None: the profile's)", Kind("comma-separated model "
                                           "presets", _model_names), sizes="models")
    workloads: tuple[str, ...] | None = param(None, "workloads (None: the profile's)",
                                              Kind(f"comma-separated workloads from {', '.join(WORKLOADS)}",
                                                   _workload_names), sizes="workloads")
    seeds: tuple[int, ...] | None = param(None, "seeds (None: the profile's)", integers(0), sizes="seeds")
    out_dir: str | None = param(None, "where results go (None: results/12_verdict_map)", PATH, affects=False)

    def spec(self, sizes: Sizes) -> GridSpec:
        """The profile's grid with this notebook's axes."""
        g = sizes.grid
        return dataclasses.replace(g, tokens=tuple(sorted(self.tokens)), models=self.models, workloads=self.workloads,
                                   seeds=self.seeds, shift=dataclasses.replace(g.shift, values=tuple(self.shift)))

    def scale_note(self, sizes: Sizes) -> str:
        g = self.spec(sizes)
        cut = ("" if g.name != "tiny" else "; TOY GRID (tiny profile: the tiny model, EP 4, a 16-sequence batch)")
        return (f"{g.name} grid: full scale (every MoE layer, every micro-batch of the card's batch), "
                f"{len(g.models)} models x {len(g.workloads)} workloads x {len(g.seeds)} seeds "
                f"({', '.join(map(str, g.seeds))}), {len(g.tokens)} budgets x {len(g.shift.values)} shift values{cut}")

    def simulated_on(self) -> str:
        return "each set-up card's cluster"


@dataclass(kw_only=True)
class Result(Result):
    cases: pd.DataFrame = table("one row per simulated case (grid node or card point; model, workload, seed): tokens/s "
                                "per policy, the three ratios, the measured tokens per EP rank and correlations")
    nodes: pd.DataFrame = table("per grid node (tokens per EP rank, shift): best, mean and worst of each ratio over "
                                "models x workloads x seeds, and the node's measured position")
    cards: pd.DataFrame = table("per named set-up card: its measured position and the mean, best and worst of each "
                                "ratio over its cases, simulated at full scale on the card's own inputs")
    contours: pd.DataFrame = table("the paper's claims as contours: per claim level, where the best-over-cases field "
                                   "crosses it on the grid's edges, with the measured correlation there")
    conclusion: str = value("")  # the map's one-sentence answer
    regions: list = value(None)  # per claim: where on the grid it holds (verdict_map.claim_regions)
    grid: dict = value(None)  # the GridSpec simulated
    calibration: dict = value(None)  # the real RL trace's micro-batch vs step correlation (the shift's source)


def rl_calibration(path: Path = RL_TRACE) -> dict:
    """The kit's real RL trace's micro-batch statistics (relibra.analysis.shift_stats), the calibration the
    micro-batch shift's range comes from; {} when the trace is not shipped."""
    if not path.exists():
        return {}
    trace = RoutingTrace.load(path)
    stats = shift_stats(trace.loads.sum(axis=3, dtype=np.int64))
    # tokens per (micro-batch, EP rank): the first layer's selections over top-k
    tokens = float((trace.loads[:, :, 0].sum(axis=-1) / trace.model.top_k).mean())
    return {"label": "the kit's real RL trace (relibra rl, data/rl_tiny_seed0.npz)",
            "mb_vs_step_corr": float(stats["mb_vs_step_corr"]), "mb_corr": float(stats["mb_corr"]),
            "tokens_per_ep_rank": tokens}


def contour_frame(contours: list[dict]) -> pd.DataFrame:
    rows = [{"claim": c["claim"], "field": c["field"], "level": c["level"], **pt} for c in contours
            for pt in c["points"]] or [{"claim": c["claim"], "field": c["field"], "level": c["level"],
                                         "tokens_per_ep_rank": np.nan, "shift_value": np.nan, "mb_vs_step_corr": np.nan}
                                        for c in contours]
    return pd.DataFrame(rows)


def compute(p: Params, sizes: Sizes, progress: bool = True, workers: int | None = None) -> Result:
    spec = p.spec(sizes)
    result = run_map(spec, workers=workers, progress=progress)
    fields = node_fields(result)
    contours = claim_contours(result, fields)
    return Result(cases=result.frame, nodes=fields, cards=card_points(result), contours=contour_frame(contours),
                  conclusion=conclusion(result, fields), regions=claim_regions(result, fields), grid=spec.to_dict(),
                  calibration=rl_calibration())


# ---- reading the result ---------------------------------------------------------------------------------
def _x(v: float) -> str:
    return f"{v:.2f}x"


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def node_mean(r: Result, column: str) -> float:
    """Mean of a case column over the grid's nodes (every model, workload and seed)."""
    g = r.cases[r.cases["kind"] == "grid"]
    return float(g[column].mean())


def at_extreme(r: Result, column: str, axis: str, largest: bool) -> float:
    """Mean of a case column over the grid cases at the largest (or smallest) value of `axis`."""
    g = r.cases[r.cases["kind"] == "grid"]
    edge = g[axis].max() if largest else g[axis].min()
    return float(g.loc[g[axis] == edge, column].mean())


def card_table(r: Result) -> pd.DataFrame:
    """REPORT.md's verdict table: one row per figure, one column per named card (its point on the map)."""
    c = r.cards
    if c.empty:
        return pd.DataFrame()
    out = {"": ["ReLibra / Megatron (mean; best)", "ReLibra / EPLB+ (mean; best)", "gap to Balanced (mean; range)",
                "tokens per EP rank per micro-batch (measured)", "micro-batch vs step correlation (measured)",
                "cases (models x workloads x seeds)"]}
    for _, x in c.iterrows():
        out[f"`{x['setup']}`"] = [
            f"{_x(x['relibra_over_megatron_mean'])}; {_x(x['relibra_over_megatron_best'])}",
            f"{_x(x['relibra_over_eplb_plus_mean'])}; {_x(x['relibra_over_eplb_plus_best'])}",
            f"{_pct(x['gap_to_balanced_mean'])}; {_pct(x['gap_to_balanced_best'])}-{_pct(x['gap_to_balanced_worst'])}",
            f"{x['tokens_per_ep_rank']:.0f}", f"{x['mb_vs_step_corr']:.2f}", f"{int(x['cases'])}"]
    out["paper"] = ["up to 1.6x", "up to 1.2x", "within 6-10%", "not stated", "not stated", "-"]
    return pd.DataFrame(out)


def _plural(n: float, word: str) -> str:
    return f"{n:.0f} {word}" + ("" if round(n) == 1 else "es" if word.endswith("h") else "s")


def why_cards_differ(r: Result) -> dict[str, str]:
    """Per card, one sentence computed from its point and the grid: why its figure is not the paper's."""
    c, nodes = r.cards, r.nodes
    out = {}
    if c.empty or nodes.empty:
        return out
    regions = {reg["field"]: reg for reg in (r.regions or [])}
    best_meg = nodes.loc[nodes["relibra_over_megatron_best"].idxmax()]
    best_eplb = nodes.loc[nodes["relibra_over_eplb_plus_best"].idxmax()]
    meg = regions.get("relibra_over_megatron_best", {})
    for _, x in c.iterrows():
        parts = [f"it packs {x['tokens_per_ep_rank']:.0f} tokens per EP rank per micro-batch "
                 f"({_plural(x['micro_batches'], 'micro-batch')} a step)"]
        if x["relibra_over_megatron_best"] < 1.6:
            parts.append(f"1.6x over Megatron needs at least {meg['min_tokens']} tokens per EP rank on the grid"
                         if meg.get("min_tokens") else
                         f"the grid reaches 1.6x over Megatron nowhere (best {_x(best_meg['relibra_over_megatron_best'])} "
                         f"at {int(best_meg['tokens'])} tokens per EP rank)")
        own = r.cases[(r.cases["kind"] == "card") & (r.cases["setup"] == x["setup"])]
        eplb_tps, meg_tps = float(own["tokens_per_s_eplb+"].mean()), float(own["tokens_per_s_megatron"].mean())
        if eplb_tps < meg_tps:  # then ReLibra / EPLB+ is large for a reason other than the micro-batch shift
            parts.append(f"EPLB+ is slower than Megatron here ({eplb_tps:.0f} vs {meg_tps:.0f} tokens/s): over "
                         f"{_plural(x['micro_batches'], 'micro-batch')} a step its own costs exceed what its balance "
                         f"saves, which, not micro-batch shift, lifts ReLibra / EPLB+ to "
                         f"{_x(x['relibra_over_eplb_plus_mean'])}")
        elif x["mb_vs_step_corr"] >= 0.85:
            parts.append(f"its micro-batches correlate with their step at {x['mb_vs_step_corr']:.2f}, so a "
                         "once-per-step EPLB+ already balances most of each micro-batch's load")
        else:
            parts.append(f"its micro-batches correlate with their step at only {x['mb_vs_step_corr']:.2f}, where "
                         "per-micro-batch balancing has the most to gain over EPLB+")
        if x["relibra_over_eplb_plus_best"] < 1.2:
            parts.append(f"1.2x over EPLB+ is reached {'nowhere on the grid' if best_eplb['relibra_over_eplb_plus_best'] < 1.2 else 'only elsewhere on the grid'} "
                         f"(best {_x(best_eplb['relibra_over_eplb_plus_best'])} at shift {best_eplb['shift_value']:g}, "
                         f"correlation {best_eplb['mb_vs_step_corr']:.2f}, the sharpest shift the routing data support "
                         f"being {MICROBATCH_SHIFT_RANGE[1]:g})")
        if x["gap_to_balanced_mean"] < 0.06:
            parts.append(f"its gap to Balanced ({_pct(x['gap_to_balanced_mean'])}) is below the paper's 6-10%")
        elif x["gap_to_balanced_mean"] > 0.10:
            parts.append(f"its gap to Balanced ({_pct(x['gap_to_balanced_mean'])}) is above the paper's 6-10%")
        out[x["setup"]] = "; ".join(parts)
    return out


def story(r: Result) -> str:
    """The conclusion, each claim's region, each card's point and why it differs, the calibration line."""
    lines = [f"**{r.conclusion}**"]
    for reg in r.regions or []:
        fmt = _pct if reg["field"].startswith("gap") else _x
        lines.append(f"- {reg['claim']}: met at {reg['nodes']} of {reg['of_nodes']} grid nodes; best "
                     f"{fmt(reg['best'])} at {reg['best_tokens']} tokens per EP rank (micro-batch vs step correlation "
                     f"{reg['best_corr']:.2f}).")
    why = why_cards_differ(r)
    for _, x in r.cards.iterrows():
        lines.append(f"- `{x['setup']}`: ReLibra / Megatron {_x(x['relibra_over_megatron_mean'])} (best "
                     f"{_x(x['relibra_over_megatron_best'])}), / EPLB+ {_x(x['relibra_over_eplb_plus_mean'])}, gap to "
                     f"Balanced {_pct(x['gap_to_balanced_mean'])}: {why.get(x['setup'], '')}.")
    g = r.cases[r.cases["kind"] == "grid"]
    lo, hi = g["shift_value"].min(), g["shift_value"].max()
    if hi > lo:
        d_eplb = (float(g.loc[g["shift_value"] == hi, "relibra_over_eplb_plus"].mean())
                  - float(g.loc[g["shift_value"] == lo, "relibra_over_eplb_plus"].mean()))
        lines.append(f"Moving the micro-batch shift from {lo:g} to {hi:g} changes ReLibra / EPLB+ by {d_eplb:+.3f} on "
                     "average over the grid's cases: EPLB+ balances the step's total once, so it loses exactly what "
                     "the micro-batches no longer share with their step.")
    cal = r.calibration or {}
    if cal:
        lines.append(f"Calibration: {cal['label']} has micro-batch vs step correlation {cal['mb_vs_step_corr']:.2f} at "
                     f"{cal['tokens_per_ep_rank']:.0f} tokens per micro-batch; the public routing data "
                     "(data/public/) are data-set level and give no micro-batch figure, and ForeMoE (arXiv "
                     "2606.11867) states that micro-step load fluctuates without a figure.")
    return "\n\n".join(lines)


def rows(r: Result, man: dict) -> list[dict]:
    """README rows: the map's conclusion, then each named card's point."""
    how = f"**simulated**, {man['scale_note']}"
    out = [row("where the paper's claims hold (the verdict map)", r.conclusion, how)]
    for _, x in r.cards.iterrows():
        out.append(row(f"`{x['setup']}` card's point on the map",
                       f"ReLibra / Megatron {_x(x['relibra_over_megatron_mean'])} (best "
                       f"{_x(x['relibra_over_megatron_best'])}); / EPLB+ {_x(x['relibra_over_eplb_plus_mean'])}; gap to "
                       f"Balanced {_pct(x['gap_to_balanced_mean'])}; at {x['tokens_per_ep_rank']:.0f} tokens per EP "
                       f"rank, correlation {x['mb_vs_step_corr']:.2f}", how))
    return out


SECTION_FIRST = True  # REPORT.md opens with this notebook's verdict table


def section(r: Result, man: dict, table_md) -> str:
    """REPORT.md's opening: the verdict table (one column per named card), the map's one-sentence conclusion,
    and per card why its figure differs from the paper's."""
    figure = next((f for f in man.get("figures", []) if f["name"] == "verdict_map"), None)
    why = why_cards_differ(r)
    cards = table_md(card_table(r)) if not r.cards.empty else "No card was simulated."
    return ("## The verdict: the paper's claims per set-up card, and where they hold\n\n"
            f"From notebook 12 (**simulated**, {man['scale_note']}; every card's point at full scale on the card's own "
            "inputs, `relibra setup show CARD`). No card's figure is the answer alone: each is one point of the map "
            f"below.\n\n{cards}\n\n**Conclusion.** {r.conclusion}\n\n"
            "Why each card's figure differs from the paper's:\n\n"
            + "".join(f"- `{name}`: {text}.\n" for name, text in why.items())
            + (f"\n![verdict map](12_verdict_map/{figure['png']})\n" if figure else ""))


def _scaled_tokens(p, s) -> dict:
    return {"tokens": ",".join(str(4 * t) for t in p.tokens)}


def _sharpest_shift(p, s) -> dict:
    return {"shift": f"{MICROBATCH_SHIFT_RANGE[1]:g}"}


TRIES = (
    TryThis(_scaled_tokens, "ReLibra / Megatron (mean over the grid's cases)",
            lambda r: node_mean(r, "relibra_over_megatron"), +1,
            "more tokens per EP rank make each micro-batch's expert GEMMs longer against its fixed costs, so the "
            "busiest GPU's expert time, which balancing removes, is a larger share of the step"),
    TryThis(_sharpest_shift, "ReLibra / EPLB+ (mean over the grid's cases)",
            lambda r: node_mean(r, "relibra_over_eplb_plus"), +1,
            "EPLB+ places experts once for the step's total, so the more micro-batches differ from their step, the "
            "more per-micro-batch balancing gains over it"),
    TryThis(_sharpest_shift, "the micro-batch vs step load correlation (mean over the grid's cases)",
            lambda r: node_mean(r, "mb_vs_step_corr"), -1,
            "the shift trades expert shares inside each micro-batch, which moves it away from its step's total"),
)


def plot_inputs(r: Result) -> dict:
    """What plots.verdict_map_plot draws, from the result: nodes, cards, claims, calibration."""
    return {"nodes": r.nodes, "cards": r.cards, "claims": CLAIMS, "calibration": r.calibration or {}}

