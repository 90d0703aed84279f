"""relibra.runtime.spec wraps the user's own megatron-core spec: what it keeps, what it refuses.

Specs are plain data, so most checks build none of megatron's modules; one builds a GPTModel with
shared experts on a single gloo rank from get_gpt_decoder_block_spec (a dense first layer, then MoE).
"""

from __future__ import annotations

import pytest
from conftest import megatron_single_rank

pytest.importorskip("megatron.core")

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec  # noqa: E402
from megatron.core.transformer.mlp import MLPSubmodules  # noqa: E402
from megatron.core.transformer.moe.experts import SequentialMLP, TEGroupedMLP  # noqa: E402
from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules  # noqa: E402
from megatron.core.transformer.moe.router import TopKRouter  # noqa: E402
from megatron.core.transformer.moe.shared_experts import SharedExpertMLP  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from relibra.errors import ConfigError  # noqa: E402
from relibra.runtime.router import PlacementRouter  # noqa: E402
from relibra.runtime.spec import (OccupiedGroupedMLP, OccupiedSequentialMLP, check_config,  # noqa: E402
                                  physical_config, wrap_moe_spec)


def _config(**changes):
    base = dict(num_layers=3, hidden_size=16, num_attention_heads=2, num_moe_experts=4, moe_router_topk=2,
                moe_ffn_hidden_size=8, ffn_hidden_size=32, moe_layer_freq=[0, 1, 1],
                moe_shared_expert_intermediate_size=32, moe_token_dispatcher_type="alltoall",
                moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, use_cpu_initialization=True,
                add_bias_linear=False, bias_activation_fusion=False, moe_router_dtype="fp32", hidden_dropout=0.0,
                attention_dropout=0.0)
    base.update(changes)
    return TransformerConfig(**base)


def _placement_router_experts(moe_spec) -> int | None:
    """E of the PlacementRouter a wrapped MoE spec builds: its router submodule (megatron-core 0.16), or the
    submodules' relibra_router, which 0.15's MoELayer builds (relibra.runtime.compat)."""
    from relibra.runtime import compat

    assert issubclass(moe_spec.module, MoELayer)
    if compat.router_in_moe_submodules():
        router = moe_spec.submodules.router
        assert router.func is PlacementRouter
        return router.keywords["num_experts"]
    return moe_spec.submodules.relibra_router.keywords["num_experts"]


def test_wrap_keeps_the_layer_spec_but_router_and_experts():
    user = get_gpt_layer_local_spec(num_experts=4)
    wrapped = wrap_moe_spec(user, num_experts=4)
    moe, original = wrapped.submodules.mlp, user.submodules.mlp
    assert getattr(moe, "metainfo", None) == getattr(original, "metainfo", None)  # 0.16+
    assert _placement_router_experts(moe) == 4
    assert moe.submodules.experts.module is OccupiedSequentialMLP
    assert moe.submodules.experts.submodules == original.submodules.experts.submodules  # the user's linear layers
    assert moe.submodules.shared_experts == original.submodules.shared_experts
    assert moe.submodules.shared_experts.module is SharedExpertMLP
    assert wrapped.submodules.self_attention == user.submodules.self_attention
    assert original.module is MoELayer and getattr(original.submodules, "router", TopKRouter) is TopKRouter  # untouched
    assert original.submodules.experts.module is SequentialMLP


def test_wrap_block_spec_wraps_moe_layers_only():
    block = get_gpt_decoder_block_spec(_config(), use_transformer_engine=False, pp_rank=0)
    wrapped = wrap_moe_spec(block, num_experts=4)
    kinds = [layer.submodules.mlp.module for layer in wrapped.layer_specs]
    assert kinds[0].__name__ == "MLP" and all(issubclass(k, MoELayer) for k in kinds[1:])
    for layer in wrapped.layer_specs[1:]:
        assert layer.submodules.mlp.submodules.experts.module is OccupiedSequentialMLP
    assert wrapped.layer_specs[0].submodules.mlp == block.layer_specs[0].submodules.mlp


def test_wrap_keeps_te_linear_classes_wraps_te_grouped_and_refuses_legacy_grouped_gemm():
    class TELikeColumn:  # stands in for TEColumnParallelLinear (Transformer Engine needs CUDA)
        pass

    class TELikeRow:
        pass

    te_sequential = ModuleSpec(module=MoELayer, submodules=MoESubmodules(
        experts=ModuleSpec(module=SequentialMLP,
                           submodules=MLPSubmodules(linear_fc1=TELikeColumn, linear_fc2=TELikeRow)),
        shared_experts=ModuleSpec(module=SharedExpertMLP, submodules=MLPSubmodules(linear_fc1=TELikeColumn,
                                                                                    linear_fc2=TELikeRow))))
    experts = wrap_moe_spec(te_sequential, 8).submodules.experts
    assert experts.module is OccupiedSequentialMLP and experts.submodules.linear_fc1 is TELikeColumn
    te_grouped = ModuleSpec(module=MoELayer, submodules=MoESubmodules(
        experts=ModuleSpec(module=TEGroupedMLP,
                           submodules=MLPSubmodules(linear_fc1=TELikeColumn, linear_fc2=TELikeRow))))
    experts = wrap_moe_spec(te_grouped, 8).submodules.experts  # TE's layout: one weight{i} per expert
    assert experts.module is OccupiedGroupedMLP and experts.submodules.linear_fc1 is TELikeColumn
    with pytest.warns(UserWarning, match="legacy GroupedMLP"):  # megatron's own deprecation notice
        grouped = get_gpt_layer_local_spec(num_experts=4, moe_grouped_gemm=True)
    with pytest.raises(ConfigError, match="legacy GroupedMLP.*TEGroupedMLP.*moe_grouped_gemm=False"):
        wrap_moe_spec(grouped, 4)


def test_wrap_refuses_a_spec_without_moe_and_bad_expert_counts():
    with pytest.raises(ConfigError, match="no megatron-core MoELayer"):
        wrap_moe_spec(get_gpt_layer_local_spec(), 4)
    with pytest.raises(ConfigError, match="num_experts"):
        wrap_moe_spec(get_gpt_layer_local_spec(num_experts=4), 0)


@pytest.mark.parametrize("changes, match", [
    (dict(moe_expert_capacity_factor=1.0), "moe_expert_capacity_factor=1.0"),
    (dict(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True), "token dropping"),
    (dict(moe_token_dispatcher_type="flex"), "moe_token_dispatcher_type='flex'"),
])
def test_build_time_refusals(changes, match):
    try:
        config = _config(**changes)
    except Exception as exc:  # megatron's own check of the combination came first
        pytest.skip(f"megatron-core refuses {changes} itself: {exc}")
    with pytest.raises(ConfigError, match=match):
        check_config(config)
    with pytest.raises(ConfigError, match=match):
        physical_config(config, ep=1, replica_slots=1)


@pytest.fixture(scope="module")
def single_rank():
    with megatron_single_rank():
        yield


def test_shared_expert_model_from_the_stock_block_spec(single_rank):
    """A GPTModel from get_gpt_decoder_block_spec with shared experts, wrapped: it builds, keeps its
    shared experts, and computes what the stock model computes with the same weights."""
    import torch
    from megatron.core.models.gpt.gpt_model import GPTModel

    from relibra.runtime.hook import ReLibraHook
    from relibra.runtime.plans import static_plan

    config = _config()
    torch.manual_seed(0)
    stock = GPTModel(config, get_gpt_decoder_block_spec(config, use_transformer_engine=False, pp_rank=0), vocab_size=32,
                     max_sequence_length=16, position_embedding_type="rope")
    physical = physical_config(config, ep=1, replica_slots=1)
    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, pp_rank=0)
    relibra = GPTModel(physical, wrap_moe_spec(block, 4), vocab_size=32, max_sequence_length=16,
                       position_embedding_type="rope")
    _clear_native_replay()
    shared = [layer.mlp.shared_experts for layer in relibra.decoder.layers[1:]]
    assert all(isinstance(s, SharedExpertMLP) for s in shared)
    assert shared[0].linear_fc1.weight.shape == (32, 16)  # moe_shared_expert_intermediate_size x hidden
    hook = ReLibraHook(relibra, parallel_state_ep(), ranks_per_node=1)
    # the stock weights, slot by slot: dense and shared parameters by name, routed experts by logical id
    stock_state = stock.state_dict()
    relibra_state = relibra.state_dict()
    with torch.no_grad():
        for name, t in relibra_state.items():
            if torch.is_tensor(t) and ".experts.local_experts." not in name:
                t.copy_(stock_state[name])

    def weights(layer, expert):
        mlp = stock.decoder.layers[layer + 1].mlp.experts.local_experts[expert]
        return mlp.linear_fc1.weight, mlp.linear_fc2.weight

    hook.slots.load_logical_weights(weights)
    hook.begin_step(static_plan(torch.zeros(1, 2, 1, 4, dtype=torch.int64).numpy(), 1, replica_slots=1))
    hook.before_microbatch(0)
    ids = torch.arange(10).view(1, 10) % 32
    pos = torch.arange(10).view(1, 10)
    mask = torch.triu(torch.ones(10, 10, dtype=torch.bool), 1).view(1, 1, 10, 10)
    with torch.no_grad():
        diff = (relibra(ids, pos, mask) - stock(ids, pos, mask)).abs().max().item()
    print(f"shared-expert model vs stock: max abs diff {diff:.3g}")
    assert diff < 1e-5, diff


def parallel_state_ep():
    from megatron.core import parallel_state

    return parallel_state.get_expert_model_parallel_group()


@pytest.mark.parametrize("cuda", [False, True])
def test_compat_checks_megatron_version_on_every_device(monkeypatch, cuda):
    from relibra.runtime import compat

    monkeypatch.setattr(compat, "_applied", False)
    monkeypatch.setattr(compat, "cuda_absent", lambda: not cuda)
    for refused in ("0.14.0", "0.19.2"):  # releases outside the supported lines, whatever their API
        monkeypatch.setattr(compat, "megatron_version", lambda v=refused: v)
        with pytest.raises(ConfigError, match=f"supports megatron-core 0.15.x and 0.16.x releases .*found {refused}"):
            compat.apply()
        with pytest.raises(ConfigError, match=f"found {refused}"):
            PlacementRouter(_config(), None, num_experts=4)  # the router checks too, whoever builds it
    # a development build is judged by its API, not by its version string
    monkeypatch.setattr(compat, "megatron_version", lambda: "0.17.0rc0.dev4")
    assert compat.check_megatron_version() == "0.17.0rc0.dev4"
    monkeypatch.setattr(compat, "missing_api", lambda: ["TopKRouter.routing"])
    with pytest.raises(ConfigError, match=r"0.16.0rc0 \(a development build, judged by its API\) lacks .*TopKRouter"):
        monkeypatch.setattr(compat, "megatron_version", lambda: "0.16.0rc0")
        compat.check_megatron_version()
    monkeypatch.undo()
    monkeypatch.setattr(compat, "_applied", False)
    monkeypatch.setattr(compat, "cuda_absent", lambda: not cuda)
    assert compat.missing_api() == []  # the installed release has every call the kit makes
    if cuda:
        from megatron.core.transformer.moe import moe_utils

        # a CUDA machine without Transformer Engine: megatron-core leaves te_general_gemm unbound
        monkeypatch.delattr(moe_utils, "te_general_gemm", raising=False)
        assert compat.apply() is False  # a supported release on a CUDA machine: checked, host patches off
        assert moe_utils.te_general_gemm is None  # the router GEMM's torch path, on every device


def test_wrap_takes_019_partial_moe_specs():
    """megatron-core 0.19 builds layer specs as functools.partial(MoELayer, submodules=...); the wrap finds them."""
    import functools

    from relibra.runtime import compat

    if not compat.router_in_moe_submodules():
        pytest.skip("0.15's MoE spec names no router; 0.19's partial specs do")

    user = get_gpt_layer_local_spec(num_experts=4)
    moe = user.submodules.mlp
    user.submodules.mlp = functools.partial(moe.module, submodules=moe.submodules, **(moe.params or {}))
    wrapped = wrap_moe_spec(user, num_experts=4)
    sub = wrapped.submodules.mlp.keywords["submodules"]
    assert wrapped.submodules.mlp.func is MoELayer
    assert sub.router.func is PlacementRouter and sub.experts.module is OccupiedSequentialMLP
    assert user.submodules.mlp.keywords["submodules"].experts.module is SequentialMLP  # the user's spec untouched


def test_config_rebuilds_keep_a_stacks_extra_attributes():
    """verl's router_replay_patch sets enable_routing_replay on the config object (not a dataclass field);
    physical_config and the router's rebuild keep it, and re-derive what __post_init__ derives."""
    from relibra.runtime.router import rebuild_config

    config = _config()
    config.enable_routing_replay = True  # as verl's patched TransformerConfig.__init__ leaves it
    physical = physical_config(config, ep=2, replica_slots=1)
    assert physical.num_moe_experts == 6 and physical.enable_routing_replay is True
    assert rebuild_config(physical, num_moe_experts=4).enable_routing_replay is True
    assert "enable_routing_replay" not in vars(rebuild_config(_config(), num_moe_experts=6))


def test_hook_given_ids_are_checked_against_the_router():
    import torch

    from relibra.errors import PlanError
    from relibra.runtime.router import _GivenTopk

    scores = torch.rand(3, 4)
    probs, ids = _GivenTopk(torch.tensor([[0, 3], [1, 2], [2, 0]]), 1).get_replay_topk(scores, 2)
    assert torch.equal(probs, scores.gather(1, ids))  # probabilities from the router's own scores
    with pytest.raises(PlanError, match="shape \\(2, 2\\); the router routes 3 tokens to top-2"):
        _GivenTopk(torch.tensor([[0, 3], [1, 2]]), 1).get_replay_topk(scores, 2)
    with pytest.raises(PlanError, match="span \\[0, 4\\]; the router has 4 experts"):
        _GivenTopk(torch.tensor([[0, 4], [1, 2], [2, 0]]), 1).get_replay_topk(scores, 2)


def test_replay_loads_count_ids_and_refuse_bad_ones():
    import numpy as np
    import torch

    from relibra.errors import PlanError
    from relibra.integrations.megatron import replay_loads

    ids = [[torch.tensor([[0, 1], [1, 3]]), torch.tensor([[2, 3], [2, 0]])]]  # one micro-batch, two layers
    loads = replay_loads(ids, 4, None)
    assert loads.shape == (1, 2, 1, 4)
    assert loads[0, :, 0].tolist() == [[1, 2, 0, 1], [1, 0, 2, 1]]
    assert loads.dtype == np.int64
    with pytest.raises(PlanError, match="outside the 4 experts"):
        replay_loads([[torch.tensor([[0, 4]])]], 4, None)
    with pytest.raises(PlanError, match="micro-batch 1 has replay ids for 1 MoE layers, micro-batch 0 for 2"):
        replay_loads(ids + [ids[0][:1]], 4, None)
    with pytest.raises(PlanError, match=r"\[tokens, top_k\]"):
        replay_loads([[torch.tensor([0, 1])]], 4, None)


def test_slime_adapter_reads_ahead_without_consuming_and_refuses_what_it_cannot_read(single_rank):
    import torch
    from megatron.core.models.gpt.gpt_model import GPTModel

    from relibra.errors import PlanError
    from relibra.integrations.slime import step_replay_ids

    config = _config()
    model = GPTModel(physical_config(config, ep=1, replica_slots=0),
                     wrap_moe_spec(get_gpt_decoder_block_spec(config, use_transformer_engine=False, pp_rank=0), 4),
                     vocab_size=32, max_sequence_length=16, position_embedding_type="rope")
    _clear_native_replay()
    with pytest.raises(ConfigError, match="no slime RoutingReplay"):
        step_replay_ids(model, 1)

    class Replay:  # slime's RoutingReplay attributes
        def __init__(self, entries):
            self.top_indices_list, self.forward_index, self.backward_index = entries, 1, 0

    entries = [torch.tensor([[m, 1]], dtype=torch.int32) for m in range(3)]
    routers = [layer.mlp.router for layer in model.decoder.layers[1:]]
    for router in routers:
        router.routing_replay = Replay(list(entries))
    got = step_replay_ids(model, 2)  # micro-batches 1 and 2: from forward_index on
    assert [[t.tolist() for t in per_layer] for per_layer in got] == [[[[1, 1]]] * 2, [[[2, 1]]] * 2]
    assert all(r.routing_replay.forward_index == 1 for r in routers)  # nothing consumed
    with pytest.raises(PlanError, match="holds 2 unreplayed micro-batches from forward_index 1; the step needs 3"):
        step_replay_ids(model, 3)


def test_router_calls_a_one_argument_routing_patch_without_padding_mask(single_rank, monkeypatch):
    """A stack that patches TopKRouter.routing with the older signature routing(self, logits) (verl's
    verl/utils/megatron/router_replay_patch.py) still works under the ReLibra router."""
    import numpy as np
    import torch
    from megatron.core.transformer.moe.router import TopKRouter

    from relibra.runtime.router import make_layer_route

    calls = []

    def one_argument_routing(self, logits):
        calls.append(tuple(logits.shape))
        flat = logits.reshape(-1, self.config.num_moe_experts)
        routing_map = torch.zeros_like(flat, dtype=torch.bool)
        routing_map[:, :2] = True
        return flat.softmax(-1) * routing_map, routing_map

    router = PlacementRouter(physical_config(_config(), ep=1, replica_slots=0), _single_rank_groups(), num_experts=4)
    _clear_native_replay()
    monkeypatch.setattr(TopKRouter, "routing", one_argument_routing)
    router.route = make_layer_route(np.arange(4), np.arange(4), [], None)
    probs, physical = router.routing(torch.rand(3, 1, 4))
    assert calls == [(3, 1, 4)] and physical[:, :2].all() and not physical[:, 2:].any()


def _clear_native_replay():
    """Forget megatron-core's RouterReplay instances (0.16; 0.15 has none)."""
    try:
        from megatron.core.transformer.moe.router_replay import RouterReplay
    except ImportError:
        return
    RouterReplay.clear_global_router_replay_instances()


def _single_rank_groups():
    from megatron.core.process_groups_config import ProcessGroupCollection

    return ProcessGroupCollection.use_mpu_process_groups()
