"""verl's and slime's own routing replay drive ReLibra's plan and routing, on 2 gloo ranks (EP 2), float64.

Each stack runs in its own launch, through test doubles written from the stacks' sources
(tests/stack_doubles.py: verl's verl/utils/megatron/router_replay_patch.py at volcengine/verl @b178a3c,
slime's slime/utils/routing_replay.py and docker/patch/latest/megatron.patch at THUDM/slime @624b824):

- verl: the config carries `enable_routing_replay` as verl's patched TransformerConfig leaves it; it
  survives physical_config and the router's rebuild, so every router holds verl's RouterReplay. verl's
  REPLAY_FORWARD + set_replay_data drives routing (the hook gets no ids), then the hook's given ids go
  through verl's patched routing: 100% of tokens follow the recorded routing both ways, and outputs equal
  a static-placement run. Departures (REPLAY_FORWARD with no ids, where verl silently computes its own
  top-k; a routing that skips the replay object) are refused with one ReplayError.
- slime: fill_routing_replay fills slime's per-router RoutingReplay; the log-prob recompute runs with no
  plan and no hook call (routes home); slime's before-train-step hook plans from the same RoutingReplay and
  training replays it (ROUTING_REPLAY_STAGE=replay_forward inside forward_step): 100% followed, outputs
  equal the log-prob forward's. Without slime's megatron patch the replay is refused, not ignored.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("megatron.core")

E, K, HIDDEN, LAYERS, TOKENS, MICRO, R = 4, 2, 16, 2, 12, 2, 1
TOL = 1e-10


def _config(**extra):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=2, num_moe_experts=E, moe_router_topk=K,
        moe_ffn_hidden_size=8, ffn_hidden_size=8, moe_token_dispatcher_type="alltoall",
        moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_router_dtype="fp64",
        gated_linear_unit=True, activation_func=F.silu, bias_activation_fusion=False, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False, apply_rope_fusion=False,
        use_cpu_initialization=True, params_dtype=torch.float64, **extra)


def _build(config):
    """(model, hook, pg collection): the user's local spec wrapped, EP 2, R replica slots, float64."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel import random as mrandom

    from relibra.runtime.hook import ReLibraHook
    from relibra.runtime.spec import physical_config, wrap_moe_spec

    parallel_state.initialize_model_parallel(expert_model_parallel_size=2)
    mrandom.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    pgc = ProcessGroupCollection.use_mpu_process_groups()
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = GPTModel(physical_config(config, ep=2, replica_slots=R),
                         wrap_moe_spec(get_gpt_layer_local_spec(num_experts=E), E), vocab_size=32,
                         max_sequence_length=TOKENS, position_embedding_type="rope", pg_collection=pgc)
    finally:
        torch.set_default_dtype(previous)
    hook = ReLibraHook(model, pgc.ep, ranks_per_node=2)

    def weights(layer, expert):
        g = torch.Generator().manual_seed(1000 * layer + expert)
        return (torch.randn(16, HIDDEN, generator=g, dtype=torch.float64) / 4,
                torch.randn(HIDDEN, 8, generator=g, dtype=torch.float64) / 3)

    hook.slots.load_logical_weights(weights)
    hook.optimizer = torch.optim.SGD(hook.slots.home_expert_parameters(), lr=0.0)
    return model, hook, pgc


def _run(model, ids):
    import torch

    t = len(ids)
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1).view(1, 1, t, t)
    return model(torch.as_tensor(ids).view(1, t), torch.arange(t).view(1, t), mask)


def _routed(rank):
    """The rollout engine's routed experts of this rank: per micro-batch int64 [T, L, K], distinct per token."""
    import torch

    g = torch.Generator().manual_seed(100 + rank)
    return [torch.argsort(torch.rand(TOKENS, LAYERS, E, generator=g), dim=-1)[..., :K] for _ in range(MICRO)]


def _plan(model, hook, replay, ep_group):
    from relibra.integrations.megatron import replay_trace
    from relibra.runtime.plans import in_node_replica_plan, reordered_home

    loads = replay_trace(model, replay, ep_group).loads[0]
    return in_node_replica_plan(loads, 2, R, home=reordered_home(LAYERS, E, 2, shift=1))


def verl_worker(rank: int, world: int) -> dict:
    import torch

    from relibra.runtime import compat

    compat.apply()
    from stack_doubles import VerlRouterReplay, VerlRouterReplayAction, apply_verl_router_replay_patch

    apply_verl_router_replay_patch()
    from megatron.core.transformer.moe.router import TopKRouter

    from relibra.integrations.megatron import placement_routers
    from relibra.runtime.plans import static_plan
    from relibra.runtime.replay import ReplayError

    # verl's megatron worker: override_transformer_config["enable_routing_replay"] = True
    model, hook, pgc = _build(_config(enable_routing_replay=True))
    routers = placement_routers(model)
    out = {"replay_objects": [type(r.router_replay).__name__ for r in routers],
           "config_flag": [bool(r.config.enable_routing_replay) for r in routers]}
    rng = np.random.default_rng(rank)
    batches = [rng.integers(0, 32, TOKENS) for _ in range(MICRO)]
    routed = _routed(rank)
    replay = [[r[:, layer] for layer in range(LAYERS)] for r in routed]  # set_router_replay_data's per-layer ids
    zero = np.zeros((MICRO, LAYERS, 2, E), dtype=np.int64)

    def verl_step(plan, given: bool, train: bool):
        hook.begin_step(plan)
        VerlRouterReplay.set_global_router_replay_action(VerlRouterReplayAction.REPLAY_FORWARD)
        outs = []
        for m, batch in enumerate(batches):
            VerlRouterReplay.set_replay_data(replay[m])
            hook.before_microbatch(m, np.stack([ids.numpy() for ids in replay[m]]) if given else None)
            with torch.set_grad_enabled(train):
                y = _run(model, batch)
                if train:
                    y.square().mean().backward()
            outs.append(y.detach())
            hook.after_backward(m)
        VerlRouterReplay.clear_global_router_replay_action()
        VerlRouterReplay.clear_global_indices()
        return outs, hook.replay_counts()

    reference, _ = verl_step(static_plan(zero, 2, R), given=False, train=False)
    plan = _plan(model, hook, replay, pgc.ep)
    driven, counts = verl_step(plan, given=False, train=True)
    out["verl_driven"] = counts
    out["verl_driven_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(driven, reference))
    out["experts_moved"] = int((plan.home != static_plan(zero, 2, R).home).sum())
    out["replica_tokens"] = int(plan.replica_tokens.sum())
    given, counts = verl_step(plan, given=True, train=True)
    out["hook_given"] = counts
    out["hook_given_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(given, reference))

    # departures are refused: REPLAY_FORWARD without ids (verl would compute its own top-k) ...
    hook.begin_step(plan)
    VerlRouterReplay.set_global_router_replay_action(VerlRouterReplayAction.REPLAY_FORWARD)
    hook.before_microbatch(0)
    try:
        with torch.no_grad():
            _run(model, batches[0])
        out["no_ids"] = "ran"
    except ReplayError as exc:
        out["no_ids"] = str(exc)
    # ... and a routing that skips the replay object
    VerlRouterReplay.set_replay_data(replay[0])
    verl_routing = TopKRouter.routing

    def skipping(self, logits):
        installed, self.router_replay = self.router_replay, None
        try:
            return verl_routing(self, logits)
        finally:
            self.router_replay = installed

    TopKRouter.routing = skipping
    try:
        with torch.no_grad():
            _run(model, batches[0])
        out["skipped"] = "ran"
    except ReplayError as exc:
        out["skipped"] = str(exc)
    finally:
        TopKRouter.routing = verl_routing
    VerlRouterReplay.clear_global_router_replay_action()
    return out


def test_verl_replay_drives_the_plan_and_every_token_follows_it():
    from relibra.runtime.launch import launch

    out = launch(verl_worker, 2, timeout_s=180)
    print(out)
    assert out["replay_objects"] == ["VerlRouterReplay"] * LAYERS  # the flag survived every config rebuild
    assert out["config_flag"] == [True] * LAYERS
    assert out["experts_moved"] > 0 and out["replica_tokens"] > 0
    tokens = MICRO * LAYERS * TOKENS
    for path in ("verl_driven", "hook_given"):
        assert out[path] == {"tokens": tokens, "followed": tokens}, (path, out[path])  # 100% followed
        assert out[f"{path}_max_abs_diff"] < TOL
    assert "REPLAY_FORWARD but holds no ids" in out["no_ids"]
    assert "did not follow the replayed routing (the stack's replay object)" in out["skipped"]


def slime_worker(rank: int, world: int) -> dict:
    import torch

    from relibra.runtime import compat

    compat.apply()
    os.environ["ENABLE_ROUTING_REPLAY"] = "1"  # slime's --use-rollout-routing-replay
    from stack_doubles import SlimeRoutingReplay, apply_slime_megatron_patch

    apply_slime_megatron_patch()
    from megatron.core.transformer.moe import router as router_module

    from relibra.integrations.megatron import placement_routers
    from relibra.integrations.slime import before_train_step_hook
    from relibra.policies import get_policy
    from relibra.runtime.replay import ReplayError
    from relibra.setups import load_card

    SlimeRoutingReplay.all_routing_replays.clear()
    model, hook, pgc = _build(_config())
    routers = placement_routers(model)
    out = {"replay_objects": [type(r.routing_replay).__name__ for r in routers]}
    rng = np.random.default_rng(rank)
    batches = [rng.integers(0, 32, TOKENS) for _ in range(MICRO)]
    routed = _routed(rank)
    # actor.fill_routing_replay: every micro-batch's routed experts, layer by layer, into the RoutingReplays
    for m in range(MICRO):
        for layer, replay in enumerate(SlimeRoutingReplay.all_routing_replays):
            replay.record(routed[m][:, layer])
    # the log-prob recompute: no plan, no hook call (slime's compute_log_prob), replay_forward
    os.environ["ROUTING_REPLAY_STAGE"] = "replay_forward"
    with torch.no_grad():
        logprob_out = [_run(model, batch) for batch in batches]
    out["logprob"] = hook.replay_counts()
    SlimeRoutingReplay.clear_all_forward()
    # train_one_step: the before-train-step hook plans from the RoutingReplays, then forward_step / backward
    planner = get_policy("relibra", spare_slots_per_gpu=R)
    plan_step = before_train_step_hook(hook, planner, load_card().topology(gpus_per_node=2),
                                       micro_batches_per_step=MICRO, ep_group=pgc.ep)
    plan_step(None, 0, 0, [model], hook.optimizer, None)
    plan = plan_step.last_plan
    out["plan_loads_equal_routed"] = bool(
        (plan.loads[:, :, rank].sum(axis=-1) == TOKENS * K).all())
    from relibra.trace import static_placement

    out["experts_moved"] = int((plan.home != static_placement(LAYERS, E, 2)).sum())
    out["replica_tokens"] = int(plan.replica_tokens.sum())
    os.environ["ROUTING_REPLAY_STAGE"] = "replay_backward"
    diffs = []
    for m, batch in enumerate(batches):
        old = os.environ["ROUTING_REPLAY_STAGE"]  # slime's forward_step sets replay_forward around the forward
        os.environ["ROUTING_REPLAY_STAGE"] = "replay_forward"
        hook.before_microbatch(m)
        y = _run(model, batch)
        os.environ["ROUTING_REPLAY_STAGE"] = old
        y.square().mean().backward()
        hook.after_backward(m)
        diffs.append(float((y.detach() - logprob_out[m]).abs().max()))
    out["train"] = hook.replay_counts()
    out["train_max_abs_diff"] = max(diffs)
    out["forward_index"] = [r.routing_replay.forward_index for r in routers]
    # the next rollout's log-prob recompute, after the step: no hook call, homes as migrated, no replicas
    SlimeRoutingReplay.clear_all_forward()
    os.environ["ROUTING_REPLAY_STAGE"] = "replay_forward"
    with torch.no_grad():
        after = [_run(model, batch) for batch in batches]
    out["after_step_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(after, logprob_out))
    out["after_step"] = hook.replay_counts()
    # without slime's megatron patch the replay is not applied: refused
    SlimeRoutingReplay.clear_all_forward()
    patched = router_module.topk_routing_with_score_function
    router_module.topk_routing_with_score_function = router_module._megatron_topk_routing
    os.environ["ROUTING_REPLAY_STAGE"] = "replay_forward"
    try:
        with torch.no_grad():
            _run(model, batches[0])
        out["unpatched"] = "ran"
    except ReplayError as exc:
        out["unpatched"] = str(exc)
    finally:
        router_module.topk_routing_with_score_function = patched
    # a replay stage with nothing left to replay: one clear error, not an IndexError
    for replay in SlimeRoutingReplay.all_routing_replays:
        replay.forward_index = MICRO
    try:
        with torch.no_grad():
            _run(model, batches[0])
        out["exhausted"] = "ran"
    except ReplayError as exc:
        out["exhausted"] = str(exc)
    os.environ.pop("ROUTING_REPLAY_STAGE")
    return out


def test_slime_replay_drives_the_plan_and_a_planless_logprob_forward_runs():
    from relibra.runtime.launch import launch

    out = launch(slime_worker, 2, timeout_s=180)
    print(out)
    tokens = MICRO * LAYERS * TOKENS
    assert out["replay_objects"] == ["SlimeRoutingReplay"] * LAYERS
    assert out["logprob"] == {"tokens": tokens, "followed": tokens}  # no plan: routed home, replay followed
    assert out["train"] == {"tokens": tokens, "followed": tokens}  # 100% of tokens followed slime's replay
    assert out["plan_loads_equal_routed"] and out["experts_moved"] + out["replica_tokens"] > 0
    assert out["train_max_abs_diff"] < TOL  # same function as the planless forward
    assert out["forward_index"] == [MICRO] * LAYERS  # each micro-batch replayed exactly once
    assert out["after_step"] == {"tokens": 2 * tokens, "followed": 2 * tokens}  # counted since begin_step
    assert out["after_step_max_abs_diff"] < TOL  # planless forward after migrations: homes, same function
    assert "did not follow the replayed routing" in out["unpatched"]
    assert "holds 2 micro-batches, none at index 2" in out["exhausted"]
