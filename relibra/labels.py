"""The kit's two tables of names: the policies a figure or a sentence can name (label, short name,
colour, whether the row is an ideal: a bound, not a system), and the claims and metrics (CLAIMS: one
ratio or gap of two policies' throughput each, with its label and the paper's figure). Figures,
narrative, REPORT.md and the README table read them; nothing else holds a label, a colour or a
paper's figure.

Colours are distinct per policy across the whole kit (a policy keeps its colour from notebook to
notebook) and the two ideals are greys that no system shares.
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
    id: its column name in every table; label: its name in text; note: what the verdict adds to the
    label; paper: the paper's figure (its abstract), None where the paper gives none."""

    id: str
    numerator: str
    denominator: str
    kind: str
    label: str
    note: str = ""
    paper: str | None = None

    @property
    def verdict_label(self) -> str:
        return f"{self.label} {self.note}".strip()

    def of(self, wide):
        """The metric per row of `wide` (columns: policies' tokens per second)."""
        ratio = wide[self.numerator] / wide[self.denominator]
        return 1.0 - ratio if self.kind == "gap" else ratio


CLAIMS = {c.id: c for c in (
    Claim("relibra_over_megatron", "relibra", "megatron", "ratio", "ReLibra / Megatron", paper="up to 1.6x"),
    Claim("relibra_over_eplb_plus", "relibra", "eplb+", "ratio", "ReLibra / EPLB+", "(oracle loads)", "up to 1.2x"),
    Claim("gap_to_balanced", "relibra", "balanced", "gap", "gap to Balanced", "(1 - ReLibra / Balanced)",
          "within 6-10%"),
    Claim("gap_to_balanced_compute", "relibra", "balanced-compute", "gap", "gap to balanced-compute",
          "(1 - ReLibra / balanced-compute)"),
    Claim("relibra_over_balanced_compute", "relibra", "balanced-compute", "ratio", "ReLibra / balanced-compute"),
)}
# The ratios the sensitivity study moves (relibra.experiments.sensitivity), as text.
RATIO_LABELS = {k: CLAIMS[k].label for k in ("relibra_over_megatron", "relibra_over_eplb_plus",
                                              "relibra_over_balanced_compute")}

# Batch layouts (relibra.workloads.BATCH_LAYOUTS) as text: the layout `megatron` is Megatron-LM's way of
# filling micro-batches, not the Megatron baseline policy.
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
    """Name of `policy` in running text (its own name when the table does not know it)."""
    return LOOKS[policy].short if policy in LOOKS else policy


def colour(policy: str) -> str:
    """Colour of `policy` (a grey no policy has when the table does not know it)."""
    return LOOKS[policy].colour if policy in LOOKS else "#7f7f7f"


def policy_order(policies) -> list[str]:
    """`policies` in the table's order (unknown names last, alphabetically)."""
    known = [p for p in POLICY_ORDER if p in set(policies)]
    return known + sorted(set(policies) - set(known))
