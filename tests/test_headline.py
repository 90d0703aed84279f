"""relibra.studies.throughput: the grid over cases and seeds, the verdict per claim, the budget sweep of
both families and its overheads table (relibra.studies.overheads), on tiny cases (the full-scale grid is
./reproduce.sh's)."""

from __future__ import annotations

import pandas as pd
import pytest

from relibra.studies import throughput as hl
from relibra.studies.overheads import PAPER_OVERHEADS, overheads_table
from relibra.setups import DEFAULT_CARD

TINY = dict(ep=4, steps=2, micro_batches=2, policies=("megatron", "eplb+", "relibra", "balanced"))


def test_verdict_names_mean_range_and_best_case_with_its_seed():
    speeds = {("a", "w", 0): (100, 120, 130, 150, 140), ("a", "w", 1): (100, 125, 140, 150, 145),
              ("b", "w", 0): (100, 100, 110, 120, 115)}
    grid = pd.DataFrame([{"model": m, "workload": w, "seed": s, "policy": p, "tokens_per_s": v}
                         for (m, w, s), vals in speeds.items()
                         for p, v in zip(("megatron", "eplb+", "relibra", "balanced", "balanced-compute"), vals)])
    v = hl.verdict_table(grid).set_index("claim")
    meg = v.loc["ReLibra / Megatron"]
    assert meg["mean"] == pytest.approx((1.3 + 1.4 + 1.1) / 3) and (meg["low"], meg["high"]) == (1.1, 1.4)
    assert meg["best_case"] == "a, w, seed 1" and (meg["seeds_of_best_low"], meg["seeds_of_best_high"]) == (1.3, 1.4)
    assert (meg["cases"], meg["seeds"]) == (3, 2) and meg["paper"] == "up to 1.6x"
    gap = v.loc["gap to Balanced (1 - ReLibra / Balanced)"]
    assert gap["best"] == pytest.approx(1 - 140 / 150) and gap["best_case"] == "a, w, seed 1"
    assert v.loc["ReLibra / EPLB+ (oracle loads)", "high"] == pytest.approx(1.12)


def test_verdict_keeps_cases_without_a_token_budget():
    """A card without a token budget (one sequence per micro-batch) leaves tokens_per_microbatch None; its
    cases still make the verdict, the same as with a budget."""
    rows = [{"model": "a", "workload": "w", "seed": 0, "policy": p, "tokens_per_s": v}
            for p, v in zip(("megatron", "eplb+", "relibra", "balanced"), (100, 120, 130, 150))]
    with_budget = hl.verdict_table(pd.DataFrame(rows).assign(tokens_per_microbatch=4096))
    without = hl.verdict_table(pd.DataFrame(rows).assign(tokens_per_microbatch=None))
    assert len(without) == 3
    pd.testing.assert_frame_equal(without, with_budget)


def test_cases_are_deterministic_and_workers_do_not_change_them():
    cases = hl.headline_cases(DEFAULT_CARD, models=("tiny",), workloads=("math",), seeds=(0, 1), **TINY)
    serial = hl.run_cases(cases, workers=1, progress=False)
    pooled = hl.run_cases(cases, workers=2, progress=False)
    timed = ["plan_s"]  # the planners' measured wall time; every simulated figure must agree
    pd.testing.assert_frame_equal(serial.drop(columns=timed), pooled.drop(columns=timed))
    assert list(serial["seed"].unique()) == [0, 1]
    a, b = (serial[serial["seed"] == s].set_index("policy")["tokens_per_s"] for s in (0, 1))
    assert not a.equals(b)  # another seed, another routing
    assert set(hl.OVERHEAD_EXTRAS) <= set(serial.columns)


def test_budget_sweep_families_hold_what_they_say():
    cases = [c for c in hl.budget_cases(DEFAULT_CARD, "one-sequence", model="tiny", workload="math", seed=0,
                                        tokens=(8192, 32768), ep=4, policies=TINY["policies"])]
    rows = hl.run_cases([hl.Case(c.setup, c.model, c.workload, c.seed, c.ep, tokens_per_microbatch=c.tokens_per_microbatch,
                                 policies=c.policies, steps=2, micro_batches=4 if c.setup == DEFAULT_CARD else 8)
                         for c in cases], workers=1, progress=False)
    sweep = hl.budget_ratios(rows).set_index(["layout", "tokens_per_microbatch"])
    packed = sweep.loc["token-budget", "mean_tokens_per_slot"]
    single = sweep.loc["verl-balance", "mean_tokens_per_slot"]
    assert packed.loc[32768] > 2 * packed.loc[8192]  # a larger budget packs more tokens per micro-batch
    assert single.loc[32768] > 2.5 * single.loc[8192]  # one-sequence family: sequences scaled to the size
    assert ((sweep["relibra_over_megatron"] > 0.5) & (sweep["relibra_over_megatron"] < 3)).all()


def test_overheads_table_has_one_row_per_overhead():
    cases = hl.headline_cases(DEFAULT_CARD, models=("tiny",), workloads=("mixed",), seeds=(0,), **TINY)
    grid = hl.run_cases(cases, workers=1, progress=False)
    table = overheads_table(grid, "headline")
    assert list(table["overhead"]) == list(PAPER_OVERHEADS)
    assert table.loc[table["overhead"] == "migration", "paper"].item() == "1.4-2.1% of the training-batch time"
    relibra = grid[grid["policy"] == "relibra"].iloc[0]
    assert f"{100 * relibra['migration_share']:.2f}%" in table.loc[table["overhead"] == "migration", "kit"].item()
    assert relibra["replica_transfers"] > 0 and relibra["replica_transfers"] % 3 == 0  # push, push again, pull
    static = grid[grid["policy"] == "megatron"].iloc[0]  # no replicas: no transfers, no fragmentation
    assert static["replica_transfers"] == 0 and static["fragmentation_s"] == 0 and static["launch_s"] == 0
    # the hidden share counts transfers only: the exposed replica seconds less the gradient adds (compute), as
    # notebook 07's per-policy overlap counts them
    assert relibra["grad_add_s"] > 0  # the default card charges the adds
    exposed = relibra["exposed_transfer_share"] * relibra["step_s"] - relibra["grad_add_s"]
    hidden = table.loc[table["overhead"] == "transfers hidden behind attention", "kit"].item()
    assert hidden.startswith(f"{100 * (1 - exposed / relibra['transfer_s']):.2f}% ")
