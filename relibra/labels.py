"""The kit's tables of names: the policies (label, short name, colour, whether it is an ideal: a bound, not a
system), the claims (CLAIMS: a ratio or gap of two policies' throughput, its label and the paper's figure) and
the other metrics. Figures, narrative, REPORT.md and the README read them; nothing else holds a label, a colour
or a paper's figure. A policy keeps its colour across the kit; the two ideals are greys no system shares.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyLook:
    name: str      # the policy's registry name (relibra.policies)
    label: str     # legends and axis ticks
    short: str     # running text
    colour: str    # hex
    ideal: bool = False


@dataclass(frozen=True)
class Claim:
    """A metric of tokens per second: `numerator` / `denominator` (kind "ratio") or 1 - that ("gap").

    id: its column in every table; label: its name in text; note: what the verdict adds to the label; level:
    the paper's figure (a ratio's "up to", a gap's "within" upper end; None: the paper gives none); lower: a
    gap's stated lower end (the paper's "6-10%"); against: what the paper compares with; source: where in the
    paper the figure stands.
    """

    id: str
    numerator: str
    denominator: str
    kind: str
    label: str
    note: str = ""
    level: float | None = None
    lower: float | None = None
    against: str = ""
    source: str = ""

    @property
    def verdict_label(self) -> str:
        return f"{self.label} {self.note}".strip()

    @property
    def is_gap(self) -> bool:
        return self.kind == "gap"

    @property
    def paper(self) -> str | None:
        """The paper's figure as text ("up to 1.6x", "within 6-10%"), None where it gives none."""
        if self.level is None:
            return None
        if self.is_gap:
            span = f"{100 * self.lower:g}-" if self.lower is not None else ""
            return f"within {span}{100 * self.level:g}%"
        return f"up to {self.level:g}x"

    @property
    def statement(self) -> str:
        """ "up to 1.6x over Megatron-LM", "within 6-10% of Balanced"."""
        return f"{self.paper} {'of' if self.is_gap else 'over'} {self.against}"

    @property
    def unit(self) -> str:
        """A fact's unit: "%" for a gap (a share), "x" for a ratio."""
        return "%" if self.is_gap else "x"

    def fmt(self, value: float) -> str:
        return f"{100 * value:.1f}%" if self.is_gap else f"{value:.2f}x"

    @property
    def best(self) -> str:
        """The aggregation that picks the best case ("max" for a speed-up, "min" for a gap)."""
        return "min" if self.is_gap else "max"

    @property
    def worst(self) -> str:
        return "max" if self.is_gap else "min"

    def holds(self, value: float) -> bool:
        """Whether `value` meets the paper's figure: a speed-up at least its level, a gap at most it."""
        if self.level is None:
            raise ValueError(f"claim {self.id!r}: the paper states no figure")
        return bool(value <= self.level) if self.is_gap else bool(value >= self.level)

    def inside_range(self, value: float) -> bool:
        """lower <= value <= level (a gap inside the paper's stated range)."""
        return self.lower is not None and bool(self.lower <= value <= self.level)

    def of(self, wide):
        """The metric per row of `wide` (columns: the policies' tokens per second)."""
        ratio = wide[self.numerator] / wide[self.denominator]
        return 1.0 - ratio if self.is_gap else ratio


CLAIMS = {c.id: c for c in (
    Claim("relibra_over_megatron", "relibra", "megatron", "ratio", "ReLibra / Megatron", level=1.6,
          against="Megatron-LM", source="abstract"),
    Claim("relibra_over_eplb_plus", "relibra", "eplb+", "ratio", "ReLibra / EPLB+", "(oracle loads)", level=1.2,
          against="EPLB+ (oracle loads)", source="abstract"),
    Claim("gap_to_balanced", "relibra", "balanced", "gap", "gap to Balanced", "(1 - ReLibra / Balanced)",
          level=0.10, lower=0.06, against="Balanced", source="abstract"),
    Claim("gap_to_balanced_compute", "relibra", "balanced-compute", "gap", "gap to balanced-compute",
          "(1 - ReLibra / balanced-compute)"),
    Claim("relibra_over_balanced_compute", "relibra", "balanced-compute", "ratio", "ReLibra / balanced-compute"),
)}
# Every other metric a notebook's facts name (relibra.experiments.base.Fact): id -> its name in text.
METRICS = {
    "skewness": "rank skewness (max / mean tokens per GPU), mean over plans",
    "planner_s": "planner wall time per step",
    "planner_vs_forward": "planner wall time / one forward pass",
    "migration_share": "ReLibra's migration, share of step time",
    "replica_memory_share": "ReLibra's replica buffer, share of parameter memory per GPU (whole model)",
    "transfer_overlap": "ReLibra's replica transfers hidden behind attention",
    "step_s": "step time",
    "speedup_vs_megatron": "speed-up over Megatron",
    "cpu_speedup_vs_megatron": "speed-up over Megatron on process CPU time",
    "frac_of_balanced_compute": "share of balanced-compute's throughput",
    "over_best_other": "relibra-h / the best other policy",
    "behind_best_other": "cases where relibra-h trails the best other policy",
    "tokens_per_ep_rank": "tokens per EP rank per micro-batch (simulated mean)",
    "mb_vs_step_corr": "micro-batch vs step correlation (generated trace)",
    "cases": "cases (models x workloads x seeds)",
}
# How a value of each unit reads (a claim's own format, Claim.fmt, comes first).
UNIT_FORMATS = {"x": "{:.3g}x", "ratio": "{:.3f}", "skewness": "{:.2f}", "%": "{:.3g}%", "s": "{:.3g} s", "": "{:.3g}",
                "count": "{:.0f}", "tokens": "{:.0f}", "corr": "{:.2f}"}


def fact_label(fact: str) -> str:
    """A fact's name in text: its claim's label, else METRICS', else the id."""
    return CLAIMS[fact].label if fact in CLAIMS else METRICS.get(fact, fact)


def fact_text(fact: str, unit: str, value: float) -> str:
    """One value of a fact as text: a claim's own format (1.23x, 4.5%), else its unit's (a "%" fact holds a
    share: 0.25 reads 25%); NaN reads "-"."""
    if value != value:
        return "-"
    if fact in CLAIMS and unit == CLAIMS[fact].unit:
        return CLAIMS[fact].fmt(value)
    return UNIT_FORMATS[unit].format(100 * value if unit == "%" else value)


# The paper's three claims (the ones with a stated figure), in the order every verdict lists them.
PAPER_CLAIMS = tuple(c for c in CLAIMS.values() if c.level is not None)
# The ratios the sensitivity study moves (relibra.studies.sensitivity), as text.
RATIO_LABELS = {k: CLAIMS[k].label for k in ("relibra_over_megatron", "relibra_over_eplb_plus",
                                              "relibra_over_balanced_compute")}

# Batch layouts as text: the layout `megatron` is Megatron-LM's way of filling micro-batches, not the policy.
LAYOUT_LABELS = {"megatron": "Megatron-LM's layout", "verl": "verl's layout", "slime": "slime's layout"}


def knob_value(value, knob: str = "") -> str:
    """A sensitivity knob's value as text: numbers in %g, batch layouts by LAYOUT_LABELS."""
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return LAYOUT_LABELS.get(str(value), str(value)) if knob == "batch layout" else str(value)


POLICY_TABLE = (
    PolicyLook("megatron", "Megatron (static)", "Megatron", "#1f77b4"),
    PolicyLook("eplb", "EPLB (history)", "EPLB", "#ff7f0e"),
    PolicyLook("eplb+", "EPLB+ (oracle)", "EPLB+", "#2ca02c"),
    PolicyLook("lplb+", "LPLB (oracle, run-time LP)", "LPLB+", "#9467bd"),
    PolicyLook("eplb+lp", "EPLB+ with LP split (oracle)", "EPLB+ with LP split", "#bcbd22"),
    PolicyLook("llep", "LLEP", "LLEP", "#8c564b"),
    PolicyLook("relibra-h", "ReLibra-H (cross-node replicas)", "ReLibra-H", "#e377c2"),
    PolicyLook("relibra-reorder", "ReLibra reorder only", "reordering only", "#17becf"),
    PolicyLook("relibra-replicate", "ReLibra replicate only", "replication only", "#e6ab02"),
    PolicyLook("relibra-lpt", "ReLibra, LPT placement", "ReLibra with LPT placement", "#393b79"),
    PolicyLook("relibra-split", "ReLibra split only", "splitting only", "#c49c94"),
    PolicyLook("relibra", "ReLibra", "ReLibra", "#d62728"),
    PolicyLook("balanced", "Balanced (ideal: uniform routing)", "Balanced", "#404040", ideal=True),
    PolicyLook("balanced-compute", "Balanced compute (ideal: mean expert compute)", "balanced-compute", "#a6a6a6",
               ideal=True),
)
LOOKS = {p.name: p for p in POLICY_TABLE}
POLICY_ORDER = tuple(p.name for p in POLICY_TABLE)
IDEALS = tuple(p.name for p in POLICY_TABLE if p.ideal)


def short(policy: str) -> str:
    """`policy`'s name in running text (its own name when the table does not know it)."""
    return LOOKS[policy].short if policy in LOOKS else policy


def colour(policy: str) -> str:
    """Colour of `policy` (a grey no policy has when the table does not know it)."""
    return LOOKS[policy].colour if policy in LOOKS else "#7f7f7f"


def policy_order(policies) -> list[str]:
    """`policies` in the table's order (unknown names last, alphabetically)."""
    known = [p for p in POLICY_ORDER if p in set(policies)]
    return known + sorted(set(policies) - set(known))


def verdict_line(region: dict, cards=()) -> str:
    """One paper claim's verdict on the map as one line, from its region's facts (relibra.studies.claim_map.
    claim_regions: id, nodes, of_nodes, best, ...; absent or NaN where it has none) and the (card, best) pairs
    that reach it: holds / holds only where (the condition in numbers) / does not hold, with the best value
    and, for a gap, its span against the paper's range."""
    r = {k: v for k, v in region.items() if v is not None and v == v}
    c, nodes, of_nodes, off = CLAIMS[r["id"]], int(r["nodes"]), int(r["of_nodes"]), int(r.get("infeasible_nodes", 0))
    scope = "feasible node" if off else "node"
    if "best" not in r:
        return f"{c.statement}: not decided: no {scope} of the grid"
    if nodes == 0:
        where = (f"does not hold: reached at no {scope} of the grid (best {c.fmt(r['best'])}, at "
                 f"{r['best_tokens_per_ep_rank']:.0f} simulated tokens per EP rank, correlation {r['best_corr']:.2f})")
    elif nodes == of_nodes:
        where = f"holds at every {scope} of the grid ({of_nodes})"
    else:
        cond = []
        if r["min_tokens"] != r["grid_min_tokens"]:
            cond.append(f"at least {r['min_tokens_per_ep_rank']:.0f} simulated tokens per EP rank")
        if r["max_corr"] < r["grid_max_corr"]:
            cond.append(f"micro-batch vs step correlation at most {r['max_corr']:.2f}")
        where = (f"holds only where {' and '.join(cond) or 'the nodes listed in the table are'} "
                 f"({nodes} of {of_nodes} {scope}s; best {c.fmt(r['best'])})")
    if c.lower is not None and "worst" in r:
        where += (f"; the gap spans {c.fmt(r['best'])}-{c.fmt(r['worst'])} over the grid's cases: inside the paper's "
                  f"{c.paper[len('within '):]} at {int(r['inside_range_nodes'])} {scope}s, below it (closer to "
                  f"Balanced than the paper reports) at {int(r['below_range_nodes'])}")
    elif nodes == of_nodes:
        where += f" (best {c.fmt(r['best'])})"
    if off:
        where += f"; {off} node(s) that do not fit in GPU memory left out"
    if cards:
        where += "; reached by the card(s) " + ", ".join(f"{s} ({c.fmt(v)})" for s, v in cards)
    return f"{c.statement}: {where}"
