"""Pipeline parallelism: PP 2 x EP 2 on 4 gloo ranks through megatron-core's own 1F1B schedule
(get_forward_backward_func -> forward_backward_pipelining_without_interleaving), under megatron DDP.

Each stage's hook executes the plan's rows of its own MoE layers; stage 0 runs micro-batch 1's forward
before micro-batch 0's backward, so two micro-batches with different replica layouts are in flight
and the replica leaves, layouts and buffer contents are keyed by micro-batch. The equivalence test runs
verify.megatron_equivalence_worker with pp=2 (tiny preset: 4 layers, 2 per stage; 2 steps, 2
micro-batches of 16 tokens per source, 2 replica slots; step 0 in-node replicas, step 1 every expert
migrates plus replicas) against static placement through the same schedule, without and with
activation recompute. Bounds as in
tests/test_megatron_ddp.py: float64 losses 1e-12, weights 1e-10; float32 losses 1e-5 and weights
within Adam's 2 * lr * steps.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("megatron.core")

from conftest import assert_logical_equivalence, megatron_equivalence  # noqa: E402
from relibra.errors import PlanError  # noqa: E402

LR = 1e-2
STEPS = 2


def test_stage_plan_takes_the_stage_rows_and_refuses_a_plan_too_short():
    from relibra.runtime.placement import stage_plan
    from relibra.runtime.plans import in_node_replica_plan

    rng = np.random.default_rng(0)
    loads = rng.integers(0, 9, size=(2, 4, 2, 8))  # [M, L, ep, E]
    plan = in_node_replica_plan(loads, 2, 2)
    assert stage_plan(plan, 0, 4) is plan
    second = stage_plan(plan, 2, 2)
    assert second.num_layers == 2 and np.array_equal(second.home, plan.home[2:])
    assert np.array_equal(second.loads, plan.loads[:, 2:])
    assert np.array_equal(second.replica_expert, plan.replica_expert[:, 2:])
    assert np.array_equal(second.replica_tokens, plan.replica_tokens[:, 2:])
    second.validate()
    with pytest.raises(PlanError, match="layers 3 .. 4"):
        stage_plan(plan, 3, 2)


def test_pp2_x_ep2_equivalence_through_1f1b_4_ranks():
    """float64 SequentialMLP without and with selective recompute of the MoE layer (the recompute runs in
    the backward, after later micro-batches' forwards replaced the routes and the shared replica
    modules' leaves), and float32 grouped experts with gradient-accumulation fusion and full recompute,
    each against static placement on the same PP 2 x EP 2 grid: losses, logical expert weights (every
    stage), master copies, the weight push and the distributed checkpoint's expert tensors, and every
    stage's dense weights within the bounds; replicas carried tokens, every expert migrated, and under
    recompute the experts ran twice per forward."""
    setups = [dict(dtype="float64"), dict(dtype="float64", recompute="selective"),
              dict(dtype="float32", grouped_gemm=True, gradient_accumulation_fusion=True, recompute="full")]
    # ep 2, tiny, STEPS steps, 2 micro-batches of 16 tokens per source, 2 replica slots, seed 0, tp 1, cpu, pp 2
    out = megatron_equivalence(4, 2, setups, "tiny", STEPS, 2, 16, 2, 0, 1, "cpu", 2)
    assert out["checks"]["grid"] == "PP 2 x EP 2"
    assert len(out["diffs"]) == 3
    assert_logical_equivalence(out["diffs"], LR, STEPS)
