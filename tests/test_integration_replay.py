"""ReLibra inside a Megatron-LM user's model, on 2 gloo ranks (EP 2), one launch for every check:

- the model comes from megatron-core's own get_gpt_layer_local_spec(num_experts=4), wrapped, with
  shared experts (moe_shared_expert_intermediate_size), under parallel_state.initialize_model_parallel
  and ProcessGroupCollection.use_mpu_process_groups();
- native replay drives the plan: RouterReplay RECORD in a rollout forward, the recorded ids become
  the plan's loads, and training replays them through RouterReplay.set_replay_data + REPLAY_FORWARD
  (the hook gets no ids); outputs equal the rollout's;
- slime's RoutingReplay (tests/stack_doubles.py, shaped as slime/utils/routing_replay.py's, with slime's
  megatron patch applied) drives the same way;
- logical checkpoints: after a migration, megatron's dist_checkpointing saves the ReLibra model and
  loads into a stock megatron-core model of the same spec: equal outputs; logical_state_dict(gather=True)
  loads into a stock EP 1 model: equal outputs.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

pytest.importorskip("megatron.core")
# megatron-core's own RouterReplay (0.16); on 0.15 verl's and slime's replay are tested by test_stack_replay.py
pytest.importorskip("megatron.core.transformer.moe.router_replay")

E, K, HIDDEN, LAYERS, TOKENS, MICRO, R = 4, 2, 16, 2, 12, 2, 1
TOL = 1e-10


# ---- slime's routing replay (tests/stack_doubles.py: slime/utils/routing_replay.py and its megatron patch) ----
def install_slime_stand_in(router):
    """slime's RoutingReplay on an already built router, as the line slime's patch adds to
    TopKRouter.__init__ (register_routing_replay) would have installed it; slime's compute_topk wrap is
    applied to megatron-core's topk_routing_with_score_function once."""
    import sys

    from stack_doubles import apply_slime_megatron_patch

    os.environ["ENABLE_ROUTING_REPLAY"] = "1"
    apply_slime_megatron_patch()
    sys.modules["slime.utils.routing_replay"].register_routing_replay(router)


# ---- the worker ----------------------------------------------------------------------------------
def _config(num_experts=E):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=2, num_moe_experts=num_experts,
        moe_router_topk=K, moe_ffn_hidden_size=8, ffn_hidden_size=8, moe_shared_expert_intermediate_size=32,
        moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
        moe_enable_routing_replay=True, moe_router_dtype="fp64", gated_linear_unit=True, activation_func=F.silu,
        bias_activation_fusion=False, add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
        masked_softmax_fusion=False, apply_rope_fusion=False, use_cpu_initialization=True,
        params_dtype=torch.float64)


def _gpt(config, spec, pg_collection):
    import torch
    from megatron.core.models.gpt.gpt_model import GPTModel

    torch.manual_seed(0)  # same dense weights on every rank (they are data-parallel replicas)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return GPTModel(config, spec, vocab_size=32, max_sequence_length=TOKENS, position_embedding_type="rope",
                        pg_collection=pg_collection)
    finally:
        torch.set_default_dtype(previous)


def _run(model, ids):
    import torch

    t = len(ids)
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1).view(1, 1, t, t)
    return model(torch.as_tensor(ids).view(1, t), torch.arange(t).view(1, t), mask)


def _expert_weights(layer, expert):
    import torch

    g = torch.Generator().manual_seed(1000 * layer + expert)
    return (torch.randn(16, HIDDEN, generator=g, dtype=torch.float64) / 4,
            torch.randn(HIDDEN, 8, generator=g, dtype=torch.float64) / 3)


def integration_worker(rank: int, world: int, ckpt_dir: str) -> dict:
    import torch
    import torch.distributed as dist

    from relibra.runtime import compat

    compat.apply()
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.moe.shared_experts import SharedExpertMLP

    from relibra.integrations import slime as slime_adapter
    from relibra.integrations.megatron import recorded_ids, replay_trace
    from relibra.runtime.hook import ReLibraHook
    from relibra.runtime.plans import in_node_replica_plan, reordered_home, static_plan
    from relibra.runtime.slots import logical_state_dict
    from relibra.runtime.spec import OccupiedSequentialMLP, physical_config, wrap_moe_spec

    parallel_state.initialize_model_parallel(expert_model_parallel_size=2)
    mrandom.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    pgc = ProcessGroupCollection.use_mpu_process_groups()
    ep_group = pgc.ep
    out = {}

    # -- the user's own spec, wrapped; shared experts kept --
    user_spec = get_gpt_layer_local_spec(num_experts=E)
    model = _gpt(physical_config(_config(), ep=2, replica_slots=R), wrap_moe_spec(user_spec, E), pgc)
    layers = [layer.mlp for layer in model.decoder.layers]
    out["shared_experts"] = [type(m.shared_experts).__name__ for m in layers]
    assert all(isinstance(m.shared_experts, SharedExpertMLP) for m in layers)
    assert all(isinstance(m.experts, OccupiedSequentialMLP) for m in layers)
    assert getattr(user_spec.submodules.mlp.submodules, "router", None) in (None, TopKRouter)  # the user's spec is untouched
    hook = ReLibraHook(model, ep_group, ranks_per_node=2)
    hook.slots.load_logical_weights(_expert_weights)
    hook.optimizer = torch.optim.AdamW(hook.slots.home_expert_parameters())
    rng = np.random.default_rng(rank)
    batches = [rng.integers(0, 32, TOKENS) for _ in range(MICRO)]
    zero = np.zeros((MICRO, LAYERS, 2, E), dtype=np.int64)

    # -- rollout: static placement, megatron-core's RouterReplay records the ids --
    hook.begin_step(static_plan(zero, 2, R))
    rollout_out, ids = [], []
    RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
    with torch.no_grad():
        for m, batch in enumerate(batches):
            hook.before_microbatch(m)
            rollout_out.append(_run(model, batch))
            ids.append(recorded_ids(model))
    RouterReplay.clear_global_router_replay_action()
    trace = replay_trace(model, ids, ep_group)
    loads = trace.loads[0]
    out["replay_loads_rank_sums"] = loads.sum(axis=(0, 1, 3)).tolist()  # tokens x top-k per source rank
    assert (loads.sum(axis=3) == TOKENS * K).all()

    # -- training: the plan from those loads (homes move, replicas); megatron's REPLAY_FORWARD drives routing --
    plan = in_node_replica_plan(loads, 2, R, home=reordered_home(LAYERS, E, 2, shift=1))
    moved = hook.begin_step(plan)
    out["experts_moved"] = moved["experts_moved"]
    out["replica_tokens"] = int(plan.replica_tokens.sum())
    assert moved["experts_moved"] > 0 and out["replica_tokens"] > 0
    RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    diffs = []
    with torch.no_grad():
        for m, batch in enumerate(batches):
            RouterReplay.set_replay_data(ids[m])
            hook.before_microbatch(m)  # no ids: the router reads RouterReplay's
            diffs.append(float((_run(model, batch) - rollout_out[m]).abs().max()))
    RouterReplay.clear_global_router_replay_action()
    RouterReplay.clear_global_indices()
    out["native_replay_max_abs_diff"] = max(diffs)

    # -- slime's replay object (stand-in) drives the next step the same way --
    for moe in layers:
        install_slime_stand_in(moe.router)
    hook.begin_step(static_plan(zero, 2, R, home=hook.home))  # the slime "rollout": no replicas
    os.environ["ROUTING_REPLAY_STAGE"] = "record"
    with torch.no_grad():
        for m, batch in enumerate(batches):
            hook.before_microbatch(m)
            _run(model, batch)
    slime_ids = slime_adapter.step_replay_ids(model, MICRO)
    assert all(torch.equal(a, b) for m in range(MICRO) for a, b in zip(slime_ids[m], ids[m]))
    slime_plan = in_node_replica_plan(replay_trace(model, slime_ids, ep_group).loads[0], 2, R,
                                      home=reordered_home(LAYERS, E, 2, shift=2))
    out["slime_experts_moved"] = hook.begin_step(slime_plan)["experts_moved"]
    os.environ["ROUTING_REPLAY_STAGE"] = "replay_forward"
    diffs = []
    with torch.no_grad():
        for m, batch in enumerate(batches):
            hook.before_microbatch(m)
            diffs.append(float((_run(model, batch) - rollout_out[m]).abs().max()))
    os.environ.pop("ROUTING_REPLAY_STAGE")
    os.environ.pop("ENABLE_ROUTING_REPLAY")  # back to megatron's own replay object
    out["slime_replay_max_abs_diff"] = max(diffs)
    out["slime_forward_index"] = [moe.router.routing_replay.forward_index for moe in layers]

    # -- logical checkpoint after the migrations, into a stock model of the user's spec --
    out["home_rank0_layer0"] = hook.home[0].tolist()
    hook.begin_step(static_plan(zero, 2, R, home=hook.home))  # routes by the routers' own scores
    with torch.no_grad():
        hook.before_microbatch(0)
        relibra_out = _run(model, batches[0])
    RouterReplay.clear_global_router_replay_instances()
    stock = _gpt(_config(), get_gpt_layer_local_spec(num_experts=E), pgc)
    with warnings.catch_warnings():
        # megatron-core 0.16.1's torch_dist strategy calls torch.distributed.checkpoint's deprecated
        # ShardedTensor and load_state_dict paths; nothing the kit can act on.
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch|megatron")
        dist_checkpointing.save(model.sharded_state_dict(), ckpt_dir)
        stock.load_state_dict(dist_checkpointing.load(stock.sharded_state_dict(), ckpt_dir))
    with torch.no_grad():
        stock_out = _run(stock, batches[0])
    out["checkpoint_max_abs_diff"] = float((stock_out - relibra_out).abs().max())
    local = stock.decoder.layers[0].mlp.experts.local_experts
    out["stock_rank_expert0_fc1_equals_logical"] = bool(torch.equal(
        local[0].linear_fc1.weight, _expert_weights(0, 2 * rank)[0]))

    # -- logical_state_dict(gather=True) into a stock EP 1 model on each rank --
    exported = logical_state_dict(model, gather=True)
    out["exported_expert_weights"] = sorted(k for k in exported if ".experts.local_experts." in k
                                            and k.endswith(".weight"))
    solo = [dist.new_group([r]) for r in range(world)][rank]
    one = ProcessGroupCollection()
    for name in ("tp", "pp", "mp", "embd", "pos_embd", "cp", "tp_cp", "expt_tp", "expt_dp", "ep", "tp_ep",
                 "tp_ep_pp", "tp_dp_cp", "dp", "dp_cp"):
        setattr(one, name, solo)
    RouterReplay.clear_global_router_replay_instances()
    single = _gpt(_config(), get_gpt_layer_local_spec(num_experts=E), one)
    missing, unexpected = single.load_state_dict(exported, strict=True)
    with torch.no_grad():
        single_out = _run(single, batches[0])
    out["export_max_abs_diff"] = float((single_out - relibra_out).abs().max())
    # every rank's figures, gathered so rank 0 reports both
    figures = torch.tensor([out["native_replay_max_abs_diff"], out["slime_replay_max_abs_diff"],
                            out["checkpoint_max_abs_diff"], out["export_max_abs_diff"]], dtype=torch.float64)
    gathered = [torch.empty_like(figures) for _ in range(world)]
    dist.all_gather(gathered, figures)
    out["per_rank_max_abs_diff"] = [g.tolist() for g in gathered]
    parallel_state.destroy_model_parallel()
    return out


def test_user_spec_native_replay_slime_replay_and_logical_checkpoint(tmp_path):
    from relibra.runtime.launch import launch

    (tmp_path / "ckpt").mkdir()
    out = launch(integration_worker, 2, str(tmp_path / "ckpt"), timeout_s=180)
    print(out)
    assert out["shared_experts"] == ["SharedExpertMLP"] * LAYERS
    assert out["experts_moved"] > 0 and out["replica_tokens"] > 0 and out["slime_experts_moved"] > 0
    assert out["slime_forward_index"] == [MICRO] * LAYERS  # slime's replay consumed exactly once per forward
    assert out["home_rank0_layer0"] != [0, 0, 1, 1]  # the checkpoint is taken off the static placement
    assert out["stock_rank_expert0_fc1_equals_logical"]
    assert out["exported_expert_weights"] == sorted(
        f"decoder.layers.{l}.mlp.experts.local_experts.{e}.linear_fc{i}.weight"
        for l in range(LAYERS) for e in range(E) for i in (1, 2))
    for rank_figures in out["per_rank_max_abs_diff"]:
        assert max(rank_figures) < TOL, out["per_rank_max_abs_diff"]
