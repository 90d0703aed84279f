"""The paper's headline claims and the same three ratios computed from a throughput table."""

from __future__ import annotations

import pandas as pd

# The paper's headline claims (abstract), next to which REPORT.md puts the kit's figures.
# The paper's headline claims (abstract), next to which REPORT.md puts the kit's figures.
PAPER_CLAIMS = {
    "relibra_vs_megatron": "up to 1.6x",
    "relibra_vs_eplb+": "up to 1.2x",
    "relibra_gap_to_balanced": "within 6-10%",
}


def headline_ratios(throughput: pd.DataFrame) -> pd.DataFrame:
    """The paper's three headline ratios from a throughput table.

    throughput: one row per (model, workload, policy) with `tokens_per_s` (other grouping columns
    such as ep or cluster are kept as part of the case). Returns one row per claim: the best case
    ("up to"), the range over cases, the number of cases, and the paper's figure.
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
