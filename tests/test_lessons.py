"""Every "Try this" a notebook prints is a claim: setting its parameters moves a quantity up or down.
Here each one runs at the tiny profile (the tutorial at its own toy scale) and the direction is
checked, so a suggestion whose claim does not hold fails CI."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from relibra.experiments import NOTEBOOKS, get_notebook
from relibra.experiments.base import TryThis

# The tiny profile, with a cluster that holds twice its EP size where a suggestion doubles EP.
BASE = {"profile": "tiny"}
ROOMY = {**BASE, "cluster": "paper"}
TEST_BASE = {"00_tutorial": {}, "05_replication": {**BASE, "spare_slot_counts": "1"}, "03_ablation": ROOMY, "06_skewness": ROOMY,
             "07_overheads": ROOMY}  # 02 and 10 run on the set-up card, whose cluster holds 4x the EP
CASES = [(name, i) for name in NOTEBOOKS for i in range(len(get_notebook(name).TRIES))]


@functools.lru_cache(maxsize=None)
def _value(notebook: str, index: int, changed: bool) -> tuple[float, dict]:
    nb = get_notebook(notebook)
    raw = dict(TEST_BASE.get(notebook, BASE))
    params, sizes = nb.create(**raw)
    change = nb.TRIES[index].change(params, sizes)
    if changed:
        params, sizes = nb.create(**raw, **change)
    return nb.TRIES[index].value(nb.compute(params, sizes)), change


def outcome(notebook: str, index: int) -> tuple[float, float, dict]:
    """(value before, value after the change, the change) at the test base."""
    before, change = _value(notebook, index, False)
    after, _ = _value(notebook, index, True)
    return before, after, change


def holds(t: TryThis, before: float, after: float) -> bool:
    """The claimed direction, by more than rounding noise."""
    return (after - before) * t.direction > 1e-9 * max(1.0, abs(before))


def test_every_notebook_but_the_measured_ones_suggests_something():
    without = sorted(name for name in NOTEBOOKS if not get_notebook(name).TRIES)
    assert without == ["08_runtime", "09_rl_workload"], without


@pytest.mark.parametrize("notebook, index", CASES)
def test_try_this_moves_what_it_says(notebook, index):
    t = get_notebook(notebook).TRIES[index]
    before, after, change = outcome(notebook, index)
    assert holds(t, before, after), (f"{notebook}: setting {change} should make {t.measure} "
                                     f"{'rise' if t.direction > 0 else 'fall'}, but it went {before:.4g} -> {after:.4g}")


def test_a_reversed_claim_fails():
    """The check is not vacuous: the tutorial's first suggestion, with its direction reversed, fails."""
    t = get_notebook("00_tutorial").TRIES[0]
    before, after, _ = outcome("00_tutorial", 0)
    assert holds(t, before, after) and not holds(dataclasses.replace(t, direction=-t.direction), before, after)


def test_replay_holds_while_history_worsens():
    """The tutorial's routing-replay section (its fourth "Try this"): as the micro-batch shift grows from 0
    to 1, the slowest GPU of the plan made from history worsens, while the plan made from the replayed exact
    loads moves less than a quarter as much and stays within 25% of balanced at every shift."""
    from relibra.experiments.tutorial import tutorial_replay

    for ep in (4, 16):
        t = tutorial_replay(ep=ep).pivot(index="shift", columns="plan", values="slowest_gpu_ms")
        balanced = tutorial_replay(ep=ep, shifts=(0.0,))["balanced_ms"].iloc[0]
        history, replay = t["history"], t["replay"]
        assert history.iloc[-1] > 1.3 * history.iloc[0], history.to_dict()
        assert abs(replay.iloc[-1] - replay.iloc[0]) < 0.25 * (history.iloc[-1] - history.iloc[0]), t.to_dict()
        assert (replay <= 1.25 * balanced).all() and (history >= 0.99 * replay).all(), t.to_dict()
