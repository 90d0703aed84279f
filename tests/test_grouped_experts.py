"""Grouped-GEMM experts (megatron-core's TEGroupedMLP over Transformer Engine's GroupedLinear layout) and
megatron's gradient-accumulation fusion, with replicas, on CPU.

Transformer Engine and megatron's fused weight-gradient kernel need CUDA; relibra.runtime.standins
mirrors both on the host (TE's weight{i} parameters and fuse_wgrad_accumulation contract, computed with
torch.nn.functional.grouped_mm; the kernel's accumulation into main_grad). The multi-rank test runs the
equivalence against static placement (verify.megatron_equivalence_worker) on 2 gloo ranks, EP 2, the tiny
preset, 2 steps (step 0: replicas; step 1: every expert migrates, plus replicas), under megatron DDP.
Bounds as in tests/test_megatron_ddp.py: float64 losses 1e-12, weights 1e-10; float32 and bfloat16
losses 1e-5 / 1e-2 and weights within Adam's 2 * lr * steps.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_logical_equivalence, megatron_equivalence, megatron_single_rank

pytest.importorskip("megatron.core")

from relibra.errors import ConfigError  # noqa: E402
from relibra.runtime import standins  # noqa: E402

LR = 1e-2
STEPS = 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_host_grouped_linear_matches_a_per_expert_loop_with_empty_experts(dtype):
    """The stand-in's forward, input gradient and weight gradients against one matmul per expert; two of
    four experts take no tokens (a replica slot without tokens is such a member)."""
    g = torch.Generator().manual_seed(0)
    splits = [5, 0, 11, 0]
    x = torch.randn(sum(splits), 16, generator=g).to(dtype).requires_grad_()
    weights = [torch.randn(32, 16, generator=g).to(dtype).requires_grad_() for _ in splits]
    dy = torch.randn(sum(splits), 32, generator=g).to(dtype)
    out = standins._GroupedLinearFn.apply(x, splits, False, False, *weights)
    out.backward(dy)
    xs, dys = x.detach().double(), dy.double()
    rows = torch.split(torch.arange(sum(splits)), splits)
    ref = torch.cat([xs[r] @ w.detach().double().t() for r, w in zip(rows, weights)])
    tol = 1e-12 if dtype == torch.float64 else (1e-5 if dtype == torch.float32 else 0.1)
    assert (out.double() - ref).abs().max() <= tol
    dref = torch.cat([dys[r] @ w.detach().double() for r, w in zip(rows, weights)])
    assert (x.grad.double() - dref).abs().max() <= tol
    for r, w in zip(rows, weights):
        assert (w.grad.double() - dys[r].t() @ xs[r]).abs().max() <= tol
    assert float(weights[1].grad.abs().max()) == 0.0


def test_host_grouped_linear_fuses_weight_gradients_into_main_grad_as_te_does():
    """fuse_wgrad_accumulation: overwrite on a first micro-batch, accumulate after; the autograd weight
    gradient is None (no grad_added_to_main_grad) or a dummy (megatron DDP marks the weight)."""
    g = torch.Generator().manual_seed(1)
    splits = [3, 4]
    x = torch.randn(7, 16, generator=g)
    dy = torch.randn(7, 32, generator=g)
    w = [torch.nn.Parameter(torch.randn(32, 16, generator=g)) for _ in splits]
    for p in w:
        p.main_grad = torch.full((32, 16), 5.0)
    w[1].grad_added_to_main_grad = False
    standins._GroupedLinearFn.apply(x, splits, True, True, *w).backward(dy)  # first micro-batch: overwrite
    expected = [dy[:3].t() @ x[:3], dy[3:].t() @ x[3:]]
    assert all(torch.allclose(p.main_grad, e, atol=1e-5) for p, e in zip(w, expected))
    assert w[0].grad is None and w[1].grad is not None and w[1].grad_added_to_main_grad
    standins._GroupedLinearFn.apply(x, splits, True, False, *w).backward(dy)  # later: accumulate
    assert all(torch.allclose(p.main_grad, 2 * e, atol=1e-5) for p, e in zip(w, expected))
    bare = torch.nn.Parameter(torch.zeros(32, 16))
    with pytest.raises(RuntimeError, match="no main_grad"):
        standins._GroupedLinearFn.apply(x, [7], True, False, bare).backward(dy)


def test_host_fused_wgrad_kernel_accumulates_like_megatrons():
    from megatron.core.tensor_parallel import layers

    standins.install_cpu_wgrad_fusion()
    assert layers._grad_accum_fusion_available
    g = torch.Generator().manual_seed(2)
    x, dy = torch.randn(6, 8, generator=g).bfloat16(), torch.randn(6, 4, generator=g).bfloat16()
    main = torch.ones(4, 8)
    layers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(x, dy, main)
    assert torch.allclose(main, 1 + dy.float().t() @ x.float(), atol=1e-6)


@pytest.fixture(scope="module")
def single_rank():
    with megatron_single_rank():
        yield


def _model(grouped: bool, replica_slots: int):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from relibra.runtime.spec import physical_config, wrap_moe_spec

    config = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, num_moe_experts=4,
                               moe_router_topk=2, moe_ffn_hidden_size=8, moe_token_dispatcher_type="alltoall",
                               moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                               use_cpu_initialization=True, add_bias_linear=False, bias_activation_fusion=False,
                               gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                               moe_router_dtype="fp32", hidden_dropout=0.0, attention_dropout=0.0,
                               moe_grouped_gemm=grouped)
    spec = get_gpt_layer_local_spec(num_experts=4)
    if grouped:
        spec.submodules.mlp = standins.te_grouped_moe_spec(4)
    torch.manual_seed(0)
    return GPTModel(physical_config(config, ep=1, replica_slots=replica_slots), wrap_moe_spec(spec, 4),
                    vocab_size=32, max_sequence_length=16, position_embedding_type="rope")


def test_grouped_model_computes_and_checkpoints_as_the_sequential_one(single_rank):
    """One rank: the same weights in a grouped-GEMM model (one replica slot per layer, a member of each
    grouped linear layer) and a SequentialMLP model: equal logits; the weight push names
    `linear_fc1.weight<e>` (TE's names) with no replica member; the distributed checkpoint's expert
    tensors have SequentialMLP's keys, offsets and values."""
    from megatron.core import parallel_state

    from relibra.runtime.hook import ReLibraHook
    from relibra.runtime.plans import static_plan
    from relibra.runtime.slots import logical_state_dict
    from relibra.runtime.spec import OccupiedGroupedMLP
    from relibra.runtime.verify import sharded_expert_tensors

    grouped, sequential = _model(True, 1), _model(False, 0)
    assert isinstance(grouped.decoder.layers[0].mlp.experts, OccupiedGroupedMLP)
    assert grouped.decoder.layers[0].mlp.experts.linear_fc1.num_gemms == 5  # 4 homes + 1 replica member
    ep = parallel_state.get_expert_model_parallel_group()
    hooks = [ReLibraHook(m, ep, ranks_per_node=1) for m in (grouped, sequential)]
    replica = hooks[0].slots.replica_parameters()
    assert [tuple(p.shape) for p in replica] == [(16, 16), (16, 8)]
    assert replica[0] is grouped.decoder.layers[1].mlp.experts.linear_fc1.weight4  # shared by the layers
    with torch.no_grad():
        dense = sequential.state_dict()
        for name, t in grouped.state_dict().items():
            if torch.is_tensor(t) and ".experts." not in name:
                t.copy_(dense[name])
    g = torch.Generator().manual_seed(3)
    weights = {(l, e): (torch.randn(16, 16, generator=g), torch.randn(16, 8, generator=g))
               for l in range(2) for e in range(4)}
    for hook in hooks:
        hook.slots.load_logical_weights(lambda layer, expert: weights[(layer, expert)])
        hook.begin_step(static_plan(torch.zeros(1, 2, 1, 4, dtype=torch.int64).numpy(), 1,
                                    replica_slots=hook.replica_slots))
        hook.before_microbatch(0)
    ids = torch.arange(12).view(1, 12) % 32
    pos = torch.arange(12).view(1, 12)
    mask = torch.triu(torch.ones(12, 12, dtype=torch.bool), 1).view(1, 1, 12, 12)
    with torch.no_grad():
        diff = (grouped(ids, pos, mask) - sequential(ids, pos, mask)).abs().max().item()
    assert diff < 1e-5, diff
    push = logical_state_dict(grouped)
    names = sorted(k for k in push if ".experts." in k)
    assert names == sorted(f"decoder.layers.{l}.mlp.experts.linear_fc{i}.weight{e}"
                           for l in range(2) for i in (1, 2) for e in range(4))
    assert torch.equal(push["decoder.layers.1.mlp.experts.linear_fc2.weight3"], weights[(1, 3)][1])
    a, b = sharded_expert_tensors(grouped), sharded_expert_tensors(sequential)
    assert a.keys() == b.keys() and len(a) == 2 * 4 * 3  # fc1 split by the SwiGLU factory into 2 halves
    assert max(float(abs(a[k] - b[k]).max()) for k in a) == 0.0


def test_legacy_grouped_mlp_and_grouped_biases_are_refused(single_rank):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from relibra.runtime.spec import GroupedMLP, wrap_moe_spec

    if GroupedMLP is None:
        pytest.skip("this megatron-core release has no legacy GroupedMLP")
    with pytest.warns(UserWarning, match="legacy GroupedMLP"):
        spec = get_gpt_layer_local_spec(num_experts=4, moe_grouped_gemm=True)
    with pytest.raises(ConfigError, match="legacy GroupedMLP .*one weight tensor for all local experts"):
        wrap_moe_spec(spec, 4)


def _equivalence(world: int, ep: int, setups: list[dict]) -> dict:
    return megatron_equivalence(world, ep, setups, "tiny", STEPS)["diffs"]


def test_grouped_experts_and_grad_accum_fusion_equivalence_2_ranks():
    """EP 2 under megatron DDP: grouped experts in float64 (the stand-in's per-expert loop: grouped_mm
    takes no float64) and float32 (torch's grouped_mm) with gradient-accumulation fusion, the bf16
    distributed optimizer with both, and SequentialMLP with fusion: every set-up against static placement
    of the same layout, losses and logical weights within the bounds, the weight push and the distributed
    checkpoint's expert tensors (logical names) as static's."""
    setups = [dict(dtype="float64", grouped_gemm=True),
              dict(dtype="float32", grouped_gemm=True, gradient_accumulation_fusion=True),
              dict(dtype="bfloat16", distributed_optimizer=True, clip_grad=1.0, grouped_gemm=True,
                   gradient_accumulation_fusion=True),
              dict(dtype="float32", gradient_accumulation_fusion=True)]
    diffs = _equivalence(2, 2, setups)
    assert_logical_equivalence(diffs, LR, STEPS)
    assert len(diffs) == 4


def test_replicas_under_full_and_selective_recompute_2_ranks():
    """megatron's activation recompute with replicas and migrations, EP 2 under megatron DDP: full (every
    transformer layer re-run in backward: the replica slots get fresh leaves in the re-run and the
    gradients are pulled from those) and selective (the MoE layer; with grouped experts also their
    activation, CheckpointWithoutOutput; the re-run reads the slots' leaves, which the layer's backward
    hook puts back: SequentialMLP's shared replica modules hold the last layer's by then); the worker
    checks that the experts ran twice per forward."""
    setups = [dict(dtype="float64", recompute="full"), dict(dtype="float64", recompute="selective"),
              dict(dtype="float64", grouped_gemm=True, recompute="selective"),
              dict(dtype="float32", grouped_gemm=True, gradient_accumulation_fusion=True, recompute="selective"),
              dict(dtype="float32", gradient_accumulation_fusion=True, recompute="full")]
    diffs = _equivalence(2, 2, setups)
    for name, d in diffs.items():
        print(name, {k: f"{v:.3g}" for k, v in d.items() if not isinstance(v, list)})
        if name.startswith("float64"):
            assert d["loss"] <= 1e-12 and d["param"] <= 1e-10 and d["dense"] <= 1e-10, (name, d)
        else:
            assert d["loss"] <= 1e-5 and d["master"] <= 2 * LR * STEPS, (name, d)
    assert len(diffs) == 5


def test_megatron_setup_refuses_fusion_in_float64_and_unknown_recompute():
    from relibra.runtime.megatron_train import MegatronSetup

    with pytest.raises(ConfigError, match="gradient_accumulation_fusion"):
        MegatronSetup(dtype="float64", gradient_accumulation_fusion=True).validate()
    with pytest.raises(ConfigError, match="recompute must be"):
        MegatronSetup(dtype="float32", recompute="block").validate()
    assert MegatronSetup(dtype="bfloat16", grouped_gemm=True, gradient_accumulation_fusion=True,
                         recompute="full").validate().name == "bfloat16+grouped-gemm+grad-accum-fusion+recompute-full"


def test_migration_under_optimizer_cpu_offload_2_ranks():
    """bf16 with megatron's DistributedOptimizer and optimizer CPU offload (HybridDeviceOptimizer: each
    expert shard's master and Adam state live on a host copy that a host Adam steps), EP 2: migration
    moves the host copy's master and state and the shard, so training matches static placement as
    without offload (same bounds as the bf16 distributed optimizer)."""
    diffs = _equivalence(2, 2, [dict(dtype="bfloat16", distributed_optimizer=True, clip_grad=1.0,
                                     optimizer_cpu_offload=True)])
    d = diffs["bfloat16+distributed-optimizer+cpu-offload"]
    print({k: f"{v:.3g}" for k, v in d.items() if not isinstance(v, list)})
    assert d["loss"] <= 1e-2 and d["master"] <= 2 * LR * STEPS and d["dense"] <= 2 * LR * STEPS, d


def test_precision_aware_optimizer_is_refused_by_name():
    """Transformer Engine's FusedAdam (megatron's use_precision_aware_optimizer) needs CUDA; a stand-in
    shaped as megatron's DistributedOptimizer with that config is refused before any state moves."""
    from types import SimpleNamespace

    from relibra.runtime.optstate import OptimizerState

    class DistributedOptimizer:  # megatron's class name is what optstate dispatches on
        config = SimpleNamespace(use_precision_aware_optimizer=True)

    with pytest.raises(ConfigError, match="use_precision_aware_optimizer=False"):
        OptimizerState(DistributedOptimizer())
    with pytest.raises(ConfigError, match="optimizer CPU offload runs under the DistributedOptimizer"):
        from relibra.runtime.megatron_train import MegatronSetup

        MegatronSetup(dtype="bfloat16", optimizer_cpu_offload=True).validate()


def test_tp2_sp_x_ep2_equivalence_4_ranks():
    """TP 2 with sequence parallelism x EP 2 on 4 ranks (expert TP 1: megatron folds EP onto the TP group,
    so each EP group is a TP group running one sequence; each rank routes its sequence slice, which is
    its source in the plan; DP 2), under megatron DDP with finalize_model_grads (sequence-parallel norm
    and router gradients over TP): float64 SequentialMLP and float32 grouped experts with fusion, against
    static placement on the same grid. The grad norm is not compared: megatron-core 0.16.1 filters expert
    gradients by the dense TP rank (optimizer/__init__.py sets tp_group = pg_collection.tp on the expert
    optimizer too), so its reported norm depends on which experts sit on TP rank 0."""
    setups = [dict(dtype="float64"), dict(dtype="float32", grouped_gemm=True, gradient_accumulation_fusion=True)]
    # ep 2, the tiny preset, STEPS steps, 2 micro-batches of 16 tokens per source, 2 replica slots, seed 0, tp 2
    out = megatron_equivalence(4, 2, setups, "tiny", STEPS, 2, 16, 2, 0, 2, timeout_s=560)
    assert out["checks"]["grid"] == "EP 2 x DP 2"
    assert_logical_equivalence(out["diffs"], LR, STEPS)
