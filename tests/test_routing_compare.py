"""The routing statistics beside public data: Gini, placement skewness and expert balance on known loads, the
shipped public CSV, and `relibra routing compare`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from relibra.analysis import (comparison_rows, expert_balance, gini, placement_skewness, read_public_frequencies,
                              routing_profile)
from relibra.cli import main
from relibra.errors import ConfigError


def test_gini_and_skewness_on_known_loads():
    assert gini(np.ones(8)) == pytest.approx(0.0)
    assert gini(np.eye(4)[0]) == pytest.approx(3 / 4)  # one expert holds everything: (E - 1) / E
    assert gini(np.array([1.0, 3.0])) == pytest.approx(0.25)
    assert gini(np.zeros(3)) == 0.0
    load = np.array([4.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0])  # ranks at EP 4: 4, 2, 2, 0
    assert placement_skewness(load, 4) == pytest.approx(4 / 2)
    assert placement_skewness(load, 8) == pytest.approx(4 / 1)
    with pytest.raises(ValueError, match="does not divide"):
        placement_skewness(load, 3)
    b = expert_balance(np.stack([load, np.ones(8)]), eps=(4, 3))
    assert b["max_over_mean"] == pytest.approx((4 + 1) / 2) and b["hottest_share"] == pytest.approx((0.5 + 1 / 8) / 2)
    assert b["skewness_ep4"] == pytest.approx((2 + 1) / 2) and np.isnan(b["skewness_ep3"])


def test_public_frequencies_hold_four_data_sets_of_top8_rows():
    freq = read_public_frequencies()
    assert list(freq) == ["gsm8k", "mmlu", "arc", "copa"]
    for x in freq.values():
        assert x.shape == (48, 128) and np.allclose(x.sum(-1), 8.0, atol=0.01)  # each token picks 8 experts
    gsm = expert_balance(freq["gsm8k"])
    assert gsm["gini"] == pytest.approx(0.61, abs=0.01) and gsm["skewness_ep32"] == pytest.approx(3.13, abs=0.01)


def test_bad_public_csv_is_one_error(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("dataset,layer,e0\ngsm,0,1.0\n")
    with pytest.raises(ConfigError, match="columns must be dataset, layer, expert_0"):
        read_public_frequencies(bad)
    bad.write_text("dataset,layer,expert_0,expert_1\ngsm,0,-1.0,9.0\n")
    with pytest.raises(ConfigError, match="negative or non-finite"):
        read_public_frequencies(bad)


def test_routing_profile_levels_of_a_trace():
    from relibra.trace import RoutingTrace

    trace = RoutingTrace.load("data/rl_tiny_seed0.npz")
    prof = routing_profile(trace.expert_load())
    assert prof["micro_batch"]["gini"] > prof["step"]["gini"]  # a micro-batch is less even than its step
    assert 0 < prof["mb_corr"] < prof["mb_vs_step_corr"] < 1
    rows = comparison_rows({"rl": trace}, {})
    assert [r["level"] for r in rows] == ["step", "micro-batch"] and np.isnan(rows[0]["mb_corr"])


def test_routing_compare_command(capsys):
    assert main(["routing", "compare", "--setups", "", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["source"].split(",")[0] for r in out["rows"][:4]] == ["public: Qwen3-30B-A3B-Instruct-2507"] * 4
    assert out["rows"][-1]["source"] == "trace: data/rl_tiny_seed0.npz" and len(out["literature"]) == 2
    assert main(["routing", "compare", "--model", "small", "--setups", "token-budget-tp1", "--ep", "4", "--steps",
                 "1", "--workloads", "math", "--microbatch-shift", "0,0.5", "--rl-trace", "none"]) == 0
    text = capsys.readouterr().out
    assert "kit: token-budget-tp1, small, math, EP 4, shift 0.5 | micro-batch" in text and "DODOCO" in text
    assert main(["routing", "compare", "--microbatch-shift", "2"]) == 2
    assert "--microbatch-shift must be a comma-separated list of distinct numbers in [0, 1]" in capsys.readouterr().err
