"""Every "Try this" a notebook prints is a claim: setting its parameters moves a quantity up or down.
Here each one runs at the tiny profile (the tutorial at its own toy scale) and the direction is
checked, so a suggestion whose claim does not hold fails CI."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from relibra.experiments import SPECS, start
from relibra.experiments.registry import TryThis

# The tiny profile, with a cluster that holds twice its EP size where a suggestion doubles EP.
BASE = {"profile": "tiny"}
ROOMY = {**BASE, "cluster": "paper"}
TEST_BASE = {"00_tutorial": {}, "05_replication": {**BASE, "spare_slot_counts": "1"}, "03_ablation": ROOMY, "06_skewness": ROOMY,
             "07_overheads": ROOMY}  # 02 and 10 run on the set-up card, whose cluster holds twice the EP
CASES = [(s.name, i) for s in SPECS for i in range(len(s.tries))]


@functools.lru_cache(maxsize=None)
def _value(notebook: str, index: int, changed: bool, out: str) -> tuple[float, dict]:
    spec = next(s for s in SPECS if s.name == notebook)
    params = dict(TEST_BASE.get(notebook, BASE))
    run = start(notebook, out_dir=out, **params)
    change = spec.tries[index].change(run.config)
    if changed:
        run = start(notebook, out_dir=out, **params, **change)
    return spec.tries[index].value(spec.compute(run.config)), change


def outcome(notebook: str, index: int, out) -> tuple[float, float, dict]:
    """(value before, value after the change, the change) at the test base."""
    before, change = _value(notebook, index, False, str(out))
    after, _ = _value(notebook, index, True, str(out))
    return before, after, change


def holds(t: TryThis, before: float, after: float) -> bool:
    """The claimed direction, by more than rounding noise."""
    return (after - before) * t.direction > 1e-9 * max(1.0, abs(before))


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("lessons")


def test_every_notebook_but_the_measured_ones_suggests_something():
    without = sorted(s.name for s in SPECS if not s.tries)
    assert without == ["08_runtime", "09_rl_workload"], without


@pytest.mark.parametrize("notebook, index", CASES)
def test_try_this_moves_what_it_says(notebook, index, out):
    t = next(s for s in SPECS if s.name == notebook).tries[index]
    before, after, change = outcome(notebook, index, out)
    assert holds(t, before, after), (f"{notebook}: setting {change} should make {t.measure} "
                                     f"{'rise' if t.direction > 0 else 'fall'}, but it went {before:.4g} -> {after:.4g}")


def test_a_reversed_claim_fails(out):
    """The check is not vacuous: the tutorial's first suggestion, with its direction reversed, fails."""
    t = SPECS[0].tries[0]
    before, after, _ = outcome(SPECS[0].name, 0, out)
    assert holds(t, before, after) and not holds(dataclasses.replace(t, direction=-t.direction), before, after)
