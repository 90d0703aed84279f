"""`relibra rl --trainer megatron`: GRPO with the policy as a megatron-core GPTModel under megatron DDP
and optimizer, the balancer planning between rollout and training (relibra.rl.megatron_loop).

The multi-process test (named *_2_ranks) is one local launch of 2 gloo ranks (EP 2) with a toy
policy (2 layers, 8 experts, top-2, hidden 32) and 2 GRPO steps of 8 sequences per policy.
"""

from __future__ import annotations

import numpy as np
import pytest

from relibra.errors import ConfigError
from relibra.rl.grpo import RLConfig
from relibra.rl.model import PolicyConfig

CFG = RLConfig(steps=2, seed=0, prompts_per_step=2, group_size=4, micro_batches=2, ep=2, warmup_steps=2,
               warmup_batch=8, eval_prompts=0, rollout_dtype="float32",
               policy=PolicyConfig(num_layers=2, hidden=32, num_heads=4, num_experts=8, top_k=2, moe_ffn=32))


def test_rl_megatron_trainer_balancer_in_the_loop_2_ranks(tmp_path):
    from relibra.rl.megatron_loop import megatron_rl_worker
    from relibra.runtime.launch import launch
    from relibra.trace import RoutingTrace, loads_from_tokens

    out_path = tmp_path / "rl.npz"
    out = launch(megatron_rl_worker, 2, CFG, ["megatron", "relibra"], 2, str(out_path), timeout_s=300)
    static, balanced = out["history"]["megatron"], out["history"]["relibra"]
    assert len(static) == len(balanced) == CFG.steps
    for a, b in zip(static, balanced):
        assert a["reward"] == b["reward"]  # the same samples: the rollouts saw the same weights
        assert abs(a["loss"] - b["loss"]) <= 1e-6 and abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * a["grad_norm"]
        for h in (a, b):
            assert h["rollout_s"] > 0 and h["planning_s"] > 0 and h["training_s"] > 0
        assert a["replicas"] == 0 and a["experts_moved"] == 0
    assert sum(h["replica_tokens"] for h in balanced) > 0  # the relibra plans did use replicas
    assert out["routing_identical"]
    trace = RoutingTrace.load(out_path)
    assert trace.loads.shape == (CFG.steps, CFG.micro_batches, 2, 2, 8)
    assert trace.provenance["trainer"] == "megatron"
    assert np.array_equal(loads_from_tokens(trace.token_experts, trace.token_src_rank, 2, 8), trace.loads)
    # every input token routed once per layer: prompt + response - 1 tokens per sequence
    assert int(trace.loads[0, :, 0].sum()) // 2 == int((trace.token_src_rank[0] >= 0).sum())


def test_rl_megatron_trainer_refuses_a_layout_it_cannot_run():
    from relibra.rl.megatron_loop import check_megatron_config

    check_megatron_config(CFG, 2, ["megatron", "relibra"])
    with pytest.raises(ConfigError, match="--ep must equal --nproc"):
        check_megatron_config(CFG, 4, ["megatron"])
    with pytest.raises(ConfigError, match="unknown policy 'nope'"):
        check_megatron_config(CFG, 2, ["nope"])
    with pytest.raises(ConfigError, match="float32"):
        import dataclasses

        check_megatron_config(dataclasses.replace(CFG, rollout_dtype="bfloat16"), 2, ["megatron"])
