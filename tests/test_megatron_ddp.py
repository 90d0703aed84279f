"""ReLibra under megatron-core's training stack (DistributedDataParallel + get_megatron_optimizer) on
CPU gloo ranks: the hook against static placement, per optimizer set-up and process-group grid.

Multi-process tests (named *_ranks): one local launch each, 2 or 4 gloo ranks, the tiny preset, 2 steps
(step 0: replicas, Adam state is created; step 1: every expert migrates with its weights, master copy
and Adam state, plus replicas).

Bounds. float64: the two runs differ only in the order gradients are summed (a replica's share is
added to its home's), so losses agree to 1e-12 and weights to 1e-10 (Adam's update
lr * m / (sqrt(v) + eps) turns a 1e-18 gradient difference into at most lr * 1e-18 / eps = 1e-12
per step). float32 and bfloat16: that amplification is not small (bfloat16 rounds each replica's
partial weight gradient to 8 bits), so the bound is Adam's own: each step moves a weight by at most
about lr, and two runs by at most 2 * lr * steps; losses within 1e-5 (float32) and 1e-2 (bfloat16).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import megatron_equivalence
from relibra.errors import ConfigError

LR = 1e-2
STEPS = 2


def _equivalence(world: int, ep: int, setups: list[dict]) -> dict:
    return megatron_equivalence(world, ep, setups, "tiny", STEPS, timeout_s=300)["diffs"]


def _assert_within(diffs: dict) -> None:
    for name, d in diffs.items():
        if name.startswith("float64"):
            assert d["loss"] <= 1e-12 and d["param"] <= 1e-10 and d["dense"] <= 1e-10, (name, d)
            assert d["exp_avg_sq"] <= 1e-15, (name, d)
        else:
            assert d["loss"] <= (1e-5 if name.startswith("float32") else 1e-2), (name, d)
            assert d["master"] <= 2 * LR * STEPS and d["dense"] <= 2 * LR * STEPS, (name, d)


def test_megatron_ddp_equivalence_ep2_every_optimizer_2_ranks():
    """EP 2 on 2 ranks: FP32Optimizer (float64), Float16OptimizerWithFloat16Params (bfloat16) and the
    DistributedOptimizer (bfloat16)."""
    diffs = _equivalence(2, 2, [dict(dtype="float64"), dict(dtype="bfloat16", clip_grad=1.0),
                                dict(dtype="bfloat16", distributed_optimizer=True, clip_grad=1.0)])
    assert set(diffs) == {"float64", "bfloat16", "bfloat16+distributed-optimizer"}
    _assert_within(diffs)


def test_megatron_ddp_equivalence_dp2_ep2_4_ranks():
    """DP 2 x EP 2 on 4 ranks: transfers on each EP group, the vote over EP and expert-DP, and the
    DistributedOptimizer's shards of an expert split between the two DP replicas."""
    diffs = _equivalence(4, 2, [dict(dtype="float64"), dict(dtype="float32", distributed_optimizer=True)])
    _assert_within(diffs)


def _moe(tp=1, expert_tp=1, pp=1, cp=1, sequence_parallel=False, recompute=None):
    group = lambda n: SimpleNamespace(size=lambda: n)  # noqa: E731
    config = SimpleNamespace(tensor_model_parallel_size=tp, expert_tensor_parallel_size=expert_tp,
                             pipeline_model_parallel_size=pp, context_parallel_size=cp,
                             sequence_parallel=sequence_parallel, recompute_granularity=recompute)
    return SimpleNamespace(config=config, tp_group=group(tp), experts=SimpleNamespace(tp_group=group(expert_tp)))


def test_megatron_hook_refuses_tensor_pipeline_and_context_parallelism():
    from relibra.runtime.hook import check_parallelism

    check_parallelism(_moe())  # EP x DP: accepted
    check_parallelism(_moe(tp=2, sequence_parallel=True))  # TP + SP with whole experts: accepted
    check_parallelism(_moe(pp=2))  # PP: each stage's hook runs its own layers
    check_parallelism(_moe(pp=2, recompute="full"))  # recompute under PP: routes follow the micro-batch
    for kwargs, named in [(dict(tp=2), "tensor_model_parallel_size=2"),
                          (dict(tp=2, sequence_parallel=True, expert_tp=2), "expert_tensor_parallel_size=2"),
                          (dict(expert_tp=2), "expert_tensor_parallel_size=2"),
                          (dict(cp=2), "context_parallel_size=2"),
                          (dict(sequence_parallel=True), "sequence_parallel=True")]:
        with pytest.raises(ConfigError, match="runs on EP x DP grids") as err:
            check_parallelism(_moe(**kwargs))
        assert named in str(err.value)


def test_megatron_setup_refuses_what_megatron_cannot_run():
    from relibra.runtime.megatron_train import MegatronSetup

    with pytest.raises(ConfigError, match="float32 or bfloat16"):
        MegatronSetup(dtype="float64", distributed_optimizer=True).validate()
    with pytest.raises(ConfigError, match="clip_grad=0"):
        MegatronSetup(dtype="float64", clip_grad=1.0).validate()
    with pytest.raises(ConfigError, match="dtype"):
        MegatronSetup(dtype="float16").validate()


def test_megatron_hook_refuses_expert_weights_ddp_would_all_reduce():
    import torch

    from relibra.runtime.hook import ReLibraHook

    p = torch.nn.Parameter(torch.zeros(2))
    fake = SimpleNamespace(ep=2, slots=SimpleNamespace(home_expert_parameters=lambda: [p]))
    ReLibraHook._check_ddp_marking(fake)  # no DDP (no main_grad): nothing to check
    p.main_grad = torch.zeros(2)
    with pytest.raises(ConfigError, match="expert_model_parallel_size=2"):
        ReLibraHook._check_ddp_marking(fake)  # megatron marks it allreduce=True by default
    p.allreduce = False
    ReLibraHook._check_ddp_marking(fake)


def test_optimizer_state_round_trips_a_torch_adamw_and_refuses_what_it_would_lose():
    import torch

    from relibra.runtime.optstate import OptimizerState

    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([a, b])
    a.grad, b.grad = torch.full((3,), 2.0), torch.zeros(3)
    opt.step()
    state = OptimizerState(opt)
    whole_a = state.gather([a], torch.float64)[0]  # [master, exp_avg, exp_avg_sq, step]
    assert torch.equal(whole_a[0], a.detach().double()) and float(whole_a[3]) == 1.0
    state.write(b, whole_a)  # b now holds a's master and Adam state
    assert torch.equal(b.detach(), a.detach())
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(opt.state[b][key], opt.state[a][key])
    assert float(opt.state[b]["step"]) == 1.0
    with pytest.raises(ConfigError, match="not in the optimizer"):
        state.gather([torch.nn.Parameter(torch.zeros(2))], torch.float64)
    with pytest.raises(ConfigError, match="no optimizer"):
        OptimizerState(None)
    ams = torch.optim.AdamW([a], amsgrad=True)
    ams.step()
    with pytest.raises(ConfigError, match="max_exp_avg_sq"):
        OptimizerState(ams).gather([a], torch.float64)
