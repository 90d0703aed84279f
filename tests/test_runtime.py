"""Tests of the distributed runtime (relibra.runtime) on CPU over gloo.

The multi-rank tests each start one local launch (2 or 4 ranks) that runs every check inside it
(relibra.runtime.verify), because importing megatron-core costs seconds per process.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relibra.errors import ConfigError, PlanError
from relibra.runtime.data import token_ids_from_loads
from relibra.runtime.placement import check_plan_for_runtime, home_slot_index, slot_experts
from relibra.runtime.plans import cross_node_replica_plan, in_node_replica_plan, reordered_home, static_plan
from relibra.trace import loads_from_tokens

TOL = 1e-5


# ---- placement arithmetic (no processes) ---------------------------------------------------------
def test_runtime_home_slots_are_contiguous_per_rank():
    home = reordered_home(2, 8, 4, shift=3)
    hs = home_slot_index(home, ep=4, replica_slots=2)  # S = 2 + 2
    assert (hs // 4 == home).all()  # each home slot lies in its rank's block
    assert ((hs % 4) < 2).all()  # homes first, replicas after
    for l in range(2):
        assert len(set(hs[l].tolist())) == 8
        for g in range(4):  # slot order = expert id order on the rank
            mine = np.flatnonzero(home[l] == g)
            assert (np.diff(hs[l, mine]) > 0).all()


def test_runtime_slot_experts_inverts_home_slots():
    home = reordered_home(3, 8, 2, shift=1)
    rexp = np.full((3, 2, 1), -1)
    rexp[0, 1, 0] = 0
    slots = slot_experts(home, rexp)
    hs = home_slot_index(home, 2, 1)
    for l in range(3):
        assert (slots[l, hs[l]] == np.arange(8)).all()
    assert slots[0, 2 * 5 - 1] == 0 and slots[1, 4] == -1


def _random_loads(rng, m, l, ep, e, k, tokens):
    te = np.stack([rng.permutation(e)[:k] for _ in range(m * ep * tokens * l)]).reshape(1, m, ep * tokens, l, k)
    tsr = np.broadcast_to(np.repeat(np.arange(ep), tokens), (1, m, ep * tokens)).copy()
    return loads_from_tokens(te, tsr, ep, e)[0]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), tokens=st.integers(1, 12), k=st.integers(1, 3))
def test_runtime_physical_map_follows_the_plan_split(seed, tokens, k):
    from relibra.runtime.placement import replica_routes
    from relibra.runtime.router import make_layer_route, physical_routing_map

    rng = np.random.default_rng(seed)
    ep, e, r = 4, 8, 2
    loads = _random_loads(rng, 1, 1, ep, e, k, tokens)
    plan = in_node_replica_plan(loads, 2, r, home=reordered_home(1, e, ep, shift=seed % 5))
    check_plan_for_runtime(plan, ep, 2, r, 1, e)
    te, tsr = token_ids_from_loads(loads[None], k, seed)
    for src in range(ep):
        ids = te[0, 0, tsr[0, 0] == src, 0]  # [T, K]
        logical = torch.zeros(len(ids), e, dtype=torch.bool)
        logical[torch.arange(len(ids))[:, None], torch.as_tensor(ids, dtype=torch.long)] = True
        slots = slot_experts(plan.home, plan.replica_expert[0])[0]
        route = make_layer_route(slots, home_slot_index(plan.home, ep, r)[0], replica_routes(plan, 0, 0, src, r), None)
        phys = physical_routing_map(logical, route, ep * (e // ep + r)).numpy()
        assert (phys.sum(1) == k).all()  # every (token, expert) pair has exactly one slot
        held = np.sort(slots[np.nonzero(phys)[1]].reshape(-1, k), axis=1)
        assert (held == np.sort(np.nonzero(logical.numpy())[1].reshape(-1, k), axis=1)).all()  # ...of its experts
        per_slot = phys.sum(0)
        for g in range(ep):
            for j in range(r):
                if plan.replica_expert[0, 0, g, j] >= 0:
                    assert per_slot[g * (e // ep + r) + e // ep + j] == plan.dense_replica_flow()[0, 0, src, g, j]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), tokens=st.integers(1, 10), k=st.integers(1, 4))
def test_runtime_token_ids_from_loads_reproduce_loads(seed, tokens, k):
    rng = np.random.default_rng(seed)
    loads = _random_loads(rng, 2, 3, 2, 8, k, tokens)[None]
    te, tsr = token_ids_from_loads(loads, k, seed)
    assert np.array_equal(loads_from_tokens(te, tsr, 2, 8), loads)


def test_runtime_refuses_cross_node_replicas_and_bad_shapes():
    rng = np.random.default_rng(0)
    loads = _random_loads(rng, 1, 2, 4, 8, 2, 6)
    with pytest.raises(PlanError, match="inside a node"):
        check_plan_for_runtime(cross_node_replica_plan(loads, 2, 1), 4, 2, 1, 2, 8)
    with pytest.raises(PlanError, match="ep=2"):
        check_plan_for_runtime(static_plan(loads, 2), 2, 1, 0, 2, 8)
    with pytest.raises(PlanError, match="replica slots"):
        check_plan_for_runtime(in_node_replica_plan(loads, 2, 2), 4, 2, 1, 2, 8)
    unequal = static_plan(loads, 2)
    unequal.home = unequal.home.copy()
    unequal.home[0, 0] = 1
    unequal.equal_homes = False
    unequal.slots_per_gpu = 3
    with pytest.raises(PlanError, match="homes"):
        check_plan_for_runtime(unequal, 4, 2, 0, 2, 8)


def test_runtime_compat_refuses_other_megatron_versions(monkeypatch):
    from relibra.runtime import compat

    monkeypatch.setattr(compat, "_applied", False)
    monkeypatch.setattr(compat, "cuda_absent", lambda: True)
    monkeypatch.setattr(compat, "megatron_version", lambda: "0.99.0")
    with pytest.raises(ConfigError, match="0.16.1"):
        compat.apply()


def test_runtime_launcher_side_and_command_line_load_without_torch():
    """The launcher's process (planning, the launcher, the modules a rank unpickles its function from)
    and `relibra`'s parser never import torch or megatron-core: the ranks load them."""
    code = ("import sys, relibra.cli, relibra.runtime.measure, relibra.runtime.launch, relibra.runtime.train, "
            "relibra.bench.gloo, relibra.bench.runtime_modules; relibra.cli.build_parser(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


# ---- multi-rank launches ---------------------------------------------------------------------------
def _check(result: dict) -> None:
    bad = {k: v for k, v in result["diffs"].items() if not v <= TOL}
    assert not bad, bad
    failed = [k for k, v in result["checks"].items() if not v]
    assert not failed, failed


def test_runtime_equivalence_world2():
    from relibra.runtime.launch import launch
    from relibra.runtime.verify import equivalence_worker

    _check(launch(equivalence_worker, 2, 1))


def test_runtime_equivalence_two_nodes():
    from relibra.runtime.launch import launch
    from relibra.runtime.verify import equivalence_worker

    _check(launch(equivalence_worker, 2, 2))


def test_runtime_cli_check_equivalence(capsys):
    from relibra.cli import main

    code = main(["run", "--nproc", "2", "--nodes", "1", "--policy", "relibra", "--steps", "2", "--warmup-steps", "0",
                 "--micro-batches", "1",
                 "--tokens-per-rank", "32", "--policy-param", "min_replica_tokens=4",
                 "--policy-param", "iterations=100", "--check-equivalence"])
    out = capsys.readouterr().out
    assert code == 0, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("equivalence ok (relibra): max abs diff"), out
    assert "step_s_median" in out and "sim_step_s" in out


def test_runtime_cli_rejects_bad_layout(capsys):
    from relibra.cli import main

    assert main(["run", "--nproc", "3", "--nodes", "2"]) == 2
    assert "does not divide" in capsys.readouterr().err


# ---- calibration and the notebook-08 text (no processes) ------------------------------------------
def test_runtime_attention_fit_recovers_a_known_efficiency():
    from relibra.cluster import get_model
    from relibra.bench.runtime_modules import fit_attention_efficiency

    shape, tflops, half = get_model("moe-cpu"), 0.05, 8.0
    tokens = [128, 512, 2048]
    rate = tflops * 1e12
    secs = [3 * (shape.attention_projection_flops_per_token * (n + half) / rate
                 + float(shape.attention_core_flops(np.array([n]))) / (rate * 0.04)) for n in tokens]
    fit = fit_attention_efficiency(shape, tokens, secs, tflops, half)
    assert abs(fit["attention_efficiency"] - 0.04) < 1e-9 and fit["max_rel_err"] < 1e-9


def test_runtime_agreement_text_follows_the_numbers():
    import pandas as pd

    from relibra.runtime.measure import agreement_facts, runtime_agreement

    rows = pd.DataFrame([
        {"policy": "megatron", "step_s_median": 2.0, "step_s_min": 1.9, "step_s_max": 2.2, "sim_step_s": 1.9,
         "oversubscribed": False, "speedup_vs_megatron": 1.0, "speedup_ci_low": 1.0, "speedup_ci_high": 1.0,
         "sim_speedup_vs_megatron": 1.0, "repeat": 0},
        {"policy": "relibra", "step_s_median": 1.6, "step_s_min": 1.5, "step_s_max": 1.7, "sim_step_s": 1.0,
         "oversubscribed": False, "speedup_vs_megatron": 1.25, "speedup_ci_low": 1.18, "speedup_ci_high": 1.31,
         "sim_speedup_vs_megatron": 1.9, "repeat": 0}])
    f = agreement_facts(rows)
    steps = {r["policy"]: r for r in f["steps"]}
    assert (steps["megatron"]["ratio"], steps["megatron"]["ok"]) == (pytest.approx(0.95), True)
    assert (steps["relibra"]["ratio"], steps["relibra"]["ok"]) == (pytest.approx(0.625), False)
    (x,) = f["launches"]
    assert (x["launch"], x["policy"], x["measured"], x["low"], x["high"]) == (1, "relibra", 1.25, 1.18, 1.31)
    assert (x["simulated"], x["inside"], f["agrees"], f["oversubscribed"]) == (1.9, False, False, False)
    rows["sim_step_s"] = [2.1, 1.7]
    rows["sim_speedup_vs_megatron"] = [1.0, 2.1 / 1.7]
    f = agreement_facts(rows)  # 1.24 inside 1.18-1.31
    assert f["agrees"] and f["launches"][0]["inside"]
    assert "agrees with" in runtime_agreement(rows)  # the words follow the facts
    rows["oversubscribed"] = True
    assert agreement_facts(rows)["oversubscribed"] and runtime_agreement(rows).startswith("OVERSUBSCRIBED")


# ---- measurement statistics and typed results (no processes) ----------------------------------------
def test_runtime_paired_ratio_ci_brackets_the_ratio_and_narrows_with_steps():
    from relibra.runtime.measure import paired_ratio_ci

    rng = np.random.default_rng(0)
    drift = np.linspace(1.0, 2.0, 40)  # a shared machine slowing down: hits both policies alike
    ref = 0.30 * drift * (1 + 0.05 * rng.standard_normal(40))
    pol = 0.20 * drift * (1 + 0.05 * rng.standard_normal(40))
    ratio, low, high = paired_ratio_ci(ref, pol)
    assert ratio == pytest.approx(np.median(ref) / np.median(pol))
    assert low <= ratio <= high and low > 1.2 and high < 1.8
    _, low20, high20 = paired_ratio_ci(ref[::2], pol[::2])
    assert high20 - low20 > high - low  # fewer steps, wider interval
    assert paired_ratio_ci([0.3] * 20, [0.2] * 20)[1:] == pytest.approx((1.5, 1.5))
    with pytest.raises(ConfigError, match="paired"):
        paired_ratio_ci([0.3] * 20, [0.2] * 19)


def test_runtime_result_round_trips_through_json():
    import json

    from relibra.runtime.results import Equivalence, RunResult, StepRecord

    rec = StepRecord("relibra", 0, 1, 0.5, 0.4, 128, 3, {"forward/dispatch": 0.1, "forward/dispatch_wait": 0.05,
                                                          "backward/replica_grad_wait": 0.02})
    res = RunResult([rec], {"relibra": [5.0]}, {"relibra": 2}, "cpu", 2, 1, 1,
                    {"relibra": Equivalence(1e-12, 1e-12, 0.0, 0.0, "float64")})
    back = RunResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back == res and back.records[0].wait_s == pytest.approx(0.07) and back.equivalence["relibra"].ok()
    rows = back.metric_rows("tiny", "math")
    assert {r["component"] for r in rows} == {"dispatch", "dispatch_wait", "replica_grad_wait", "step_cpu"}


def test_runtime_spec_is_megatrons_moe_layer_with_relibras_router_and_slots():
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from relibra.runtime.model import transformer_config
    from relibra.runtime.config import ModelConfig
    from relibra.runtime.router import PlacementRouter
    from relibra.runtime.spec import OccupiedSequentialMLP, gpt_layer_spec, moe_layer_spec, physical_config

    spec = moe_layer_spec(num_experts=16)
    assert spec.module is MoELayer and spec.submodules.experts.module is OccupiedSequentialMLP
    router = getattr(spec.submodules, "router", None) or spec.submodules.relibra_router  # 0.16 / 0.15 (compat)
    assert router.func is PlacementRouter and router.keywords == {"num_experts": 16}
    assert gpt_layer_spec(16).submodules.mlp.module is MoELayer
    config = transformer_config(ModelConfig.from_preset("tiny"))
    assert physical_config(config, ep=4, replica_slots=2).num_moe_experts == 4 * (16 // 4 + 2)
    with pytest.raises(ConfigError, match="do not divide"):
        physical_config(config, ep=3, replica_slots=0)
