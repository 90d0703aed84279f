"""The small real RL workload: verifiers, record/replay, determinism, and the trace it writes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relibra.analysis import trace_stats
from relibra.cli import main
from relibra.errors import ConfigError
from relibra.rl import grpo
from relibra.rl.grpo import RLConfig, group_advantages, micro_batch_order, run_rl, train_step
from relibra.rl.model import MoEPolicy, PolicyConfig
from relibra.rl.replay import ReplayMismatchError, RouterReplayAction, check_replay, pop_recorded, set_action
from relibra.rl.rollout import generate
from relibra.rl.tasks import (DOMAINS, EOS_ID, decode, domain_of, encode, reward, reward_arithmetic, reward_copying,
                              reward_format, reward_sorting, sample_tasks)
from relibra.trace import RoutingTrace

TINY_POLICY = PolicyConfig(num_layers=2, hidden=32, num_heads=2, num_experts=8, top_k=2, moe_ffn=32)


def tiny_config(**changes) -> RLConfig:
    base = dict(steps=2, seed=3, prompts_per_step=4, group_size=4, micro_batches=2, ep=2, warmup_steps=5,
                warmup_batch=16, eval_prompts=8, policy=TINY_POLICY)
    base.update(changes)
    return RLConfig(**base)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The policy's GEMMs are tiny; a second thread only adds contention (docs/rl.md, "Threads")."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_run(one_thread):
    return run_rl(tiny_config(), progress=False)


# ---- tasks and verifiers -------------------------------------------------------------------------
def test_verifiers_score_known_responses():
    assert reward_arithmetic("47+38=", "85") == 1.0
    assert reward_arithmetic("47+38=", "84") == 0.25  # one of two digits right, half credit at most
    assert reward_arithmetic("5+5=", "1") == 0.25
    assert reward_sorting("s4193=", "1349") == 1.0
    assert reward_sorting("s4193=", "1394") == 0.25
    assert reward_copying("rkqtz=", "ztqk") == 1.0
    assert reward_copying("rkqtz=", "ztqq") == 0.375
    assert reward_format("f3u=", "[QXA]") == 1.0
    assert reward_format("f3u=", "[QXa]") == 0.375  # class check fails
    assert reward_format("f2d=", "[123]") == 0.375  # length check fails
    assert reward_format("f1l=", "x") == 0.0
    assert reward("s4193=", "") == 0.0


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_references_are_correct_and_near_misses_are_not(seed):
    rng = np.random.default_rng(seed)
    for task in sample_tasks(rng, 8):
        assert domain_of(task.prompt) == task.domain
        assert reward(task.prompt, task.reference) == 1.0
        assert decode(encode(task.reference) + [EOS_ID] + encode("99")) == task.reference
        wrong = task.reference[:-1] + ("0" if task.reference[-1] != "0" else "1")
        if task.domain == "format":
            wrong = task.reference[:-1]  # drops the closing bracket
        assert reward(task.prompt, wrong) <= 0.5


def test_bad_vocabulary_and_domains_are_config_errors():
    with pytest.raises(ConfigError, match="'#'"):
        encode("1#2")
    with pytest.raises(ConfigError, match="chess"):
        sample_tasks(np.random.default_rng(0), 2, ("arithmetic", "chess"))


def test_group_advantages_are_relative_to_the_group():
    adv = group_advantages(np.array([1.0, 0.0, 0.5, 0.5, 0.2, 0.2]), 2)
    assert adv[0] > 0 > adv[1] and adv[0] == pytest.approx(-adv[1])
    assert np.all(adv[2:] == 0)  # equal rewards carry no signal


def test_config_errors_name_the_knob():
    with pytest.raises(ConfigError, match="micro_batches"):
        tiny_config(micro_batches=3).validate()
    with pytest.raises(ConfigError, match="ep=3"):
        tiny_config(ep=3).validate()
    with pytest.raises(ConfigError, match="top_k"):
        PolicyConfig(num_experts=4, top_k=8).validate()
    with pytest.raises(ConfigError, match="rollout_dtype"):
        tiny_config(rollout_dtype="float16").validate()


def test_bf16_rollout_engine_is_a_synced_copy():
    model = MoEPolicy(TINY_POLICY, torch.Generator().manual_seed(0))
    engine = grpo.rollout_engine(model, "bfloat16")
    assert engine.embed.weight.dtype == torch.bfloat16 and model.embed.weight.dtype == torch.float32
    assert torch.equal(engine.embed.weight, model.embed.weight.to(torch.bfloat16))
    assert engine.replays[0] is not model.replays[0]
    assert grpo.rollout_engine(model, "float32") is model


# ---- rollout, record and replay ------------------------------------------------------------------
def _model_and_rollout(seed=0, n_prompts=6):
    model = MoEPolicy(TINY_POLICY, torch.Generator().manual_seed(seed))
    prompts = [t.prompt for t in sample_tasks(np.random.default_rng(seed), n_prompts)]
    ro = generate(model, prompts, 7, torch.Generator().manual_seed(seed))
    return model, ro


def test_kv_cache_rollout_matches_a_full_forward():
    """Every input token has recorded routing, and a fresh full-sequence forward agrees with the rollout."""
    model, ro = _model_and_rollout()
    mask = ro.input_mask
    assert (ro.routing[mask] >= 0).all() and (ro.routing[~mask] == -1).all()
    set_action(model.replays, RouterReplayAction.RECORD)
    t = ro.sequences.shape[1] - 1
    with torch.no_grad():
        logits, _ = model.forward_train(ro.sequences[:, :t], torch.from_numpy(mask))
    (own,) = pop_recorded(model.replays)
    set_action(model.replays, None)
    own_sets = np.sort(own.numpy(), axis=-1)
    rec_sets = np.sort(ro.routing[mask].astype(np.int64), axis=-1)
    assert (own_sets == rec_sets).all(axis=(1, 2)).mean() > 0.99
    logp = torch.log_softmax(logits, -1).gather(2, ro.sequences[:, 1:t + 1, None]).squeeze(2)
    resp = torch.from_numpy(ro.response_mask)
    assert (logp - ro.old_logprobs)[resp].abs().max() < 1e-4


def test_replay_equals_record_and_router_gradients_flow():
    model, ro = _model_and_rollout(n_prompts=4)
    cfg = tiny_config(prompts_per_step=2, group_size=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    metrics, captured = train_step(model, opt, ro, np.array([1.0, -1.0, 0.5, -0.5]),
                                   np.arange(4).reshape(2, 2), cfg, step=0)
    assert np.array_equal(np.concatenate([c[0] for c in captured]), ro.routing[ro.input_mask])
    assert all(b.moe.router.weight.grad.abs().sum() > 0 for b in model.blocks)
    assert 0.0 <= metrics["own_routing_agreement"] <= 1.0


def test_tampered_replay_is_detected(monkeypatch):
    model, ro = _model_and_rollout(n_prompts=4)
    cfg = tiny_config(prompts_per_step=2, group_size=2)
    real_set = grpo.set_replay_data

    def tampered(replays, ids):
        ids = ids.clone()
        ids[3, 1, 0] = (ids[3, 1, 0] + 1) % TINY_POLICY.num_experts
        if ids[3, 1, 0] == ids[3, 1, 1]:
            ids[3, 1, 0] = (ids[3, 1, 0] + 1) % TINY_POLICY.num_experts
        real_set(replays, ids)

    monkeypatch.setattr(grpo, "set_replay_data", tampered)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.raises(ReplayMismatchError, match="micro-batch 0: token 3 layer 1 slot 0"):
        train_step(model, opt, ro, np.zeros(4), np.arange(4).reshape(2, 2), cfg, step=0)


def test_check_replay_and_shape_errors():
    rec = np.zeros((5, 2, 2), dtype=np.int16)
    check_replay(rec, rec.copy(), "x")
    bad = rec.copy()
    bad[4, 0, 1] = 7
    with pytest.raises(ReplayMismatchError, match="token 4 layer 0 slot 1"):
        check_replay(rec, bad, "x")
    with pytest.raises(ReplayMismatchError, match="routed"):
        check_replay(rec, rec[:3], "x")
    model = MoEPolicy(TINY_POLICY)
    set_action(model.replays, RouterReplayAction.REPLAY_FORWARD)
    with pytest.raises(ReplayMismatchError, match="without replay ids"):
        model.forward_train(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool))


def test_replay_mirrors_megatron_core_router_replay():
    """Same ids and (renormalised) probabilities as megatron-core's RouterReplay for RECORD and REPLAY_FORWARD."""
    import megatron.core.transformer.moe.router_replay as mc  # a pinned dependency: fail, never skip
    from relibra.rl.model import Router

    torch.manual_seed(0)
    router = Router(TINY_POLICY, 0)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(20, TINY_POLICY.hidden)
    theirs = mc.RouterReplay()
    try:
        scores = torch.softmax(x @ router.weight.t(), dim=-1)
        router.replay.action = RouterReplayAction.RECORD
        theirs.set_router_replay_action(mc.RouterReplayAction.RECORD)
        probs, ids, _ = router(x)
        their_probs, their_ids = theirs.get_replay_topk(scores, 2, default_compute_topk=lambda s, k, *a, **kw: torch.topk(s, k, dim=1))
        assert torch.equal(ids, their_ids) and torch.equal(router.replay.recorded[0], theirs.get_recorded_indices())
        target = torch.randint(0, 4, (20, 1))
        target = torch.cat([target, target + 4], dim=1)  # some other, distinct pair per token
        router.replay.action = RouterReplayAction.REPLAY_FORWARD
        router.replay.target = target
        theirs.set_router_replay_action(mc.RouterReplayAction.REPLAY_FORWARD)
        theirs.set_target_indices(target)
        probs, ids, _ = router(x)
        their_probs, their_ids = theirs.get_replay_topk(scores, 2)
        assert torch.equal(ids, their_ids)
        torch.testing.assert_close(probs, their_probs / their_probs.sum(-1, keepdim=True))
    finally:
        mc.RouterReplay.global_router_replay_instances.remove(theirs)


# ---- a whole (tiny) run --------------------------------------------------------------------------
def test_run_is_deterministic_by_seed(tiny_run):
    again = run_rl(tiny_config(), progress=False)
    a, b = tiny_run.trace, again.trace
    assert np.array_equal(a.loads, b.loads)
    assert np.array_equal(a.token_experts, b.token_experts)
    assert np.array_equal(a.token_src_rank, b.token_src_rank)
    assert [h["reward"] for h in tiny_run.history] == [h["reward"] for h in again.history]
    other = run_rl(tiny_config(seed=4, warmup_steps=0, eval_prompts=0, steps=1), progress=False)
    assert not np.array_equal(other.trace.token_experts[0], a.token_experts[0])


def test_trace_is_valid_and_laid_out_as_documented(tiny_run, tmp_path):
    cfg = tiny_config()
    t = tiny_run.trace
    assert t.loads.shape == (cfg.steps, cfg.micro_batches, TINY_POLICY.num_layers, cfg.ep, TINY_POLICY.num_experts)
    assert t.model.name == "rl-2x8e-top2-h32" and t.model.top_k == TINY_POLICY.top_k
    # Every routed token counts top_k times per layer; routed tokens match what training saw.
    routed = np.array([h["routed_tokens"] for h in tiny_run.history])
    assert np.array_equal(t.loads[:, :, 0].sum(axis=(1, 2, 3)), routed * TINY_POLICY.top_k)
    # Src ranks are contiguous blocks in token order and each rank holds whole sequences.
    src = t.token_src_rank
    for s in range(cfg.steps):
        for m in range(cfg.micro_batches):
            valid = src[s, m][src[s, m] >= 0]
            assert (np.diff(valid) >= 0).all() and set(valid) == set(range(cfg.ep))
    assert t.provenance["generator"] == "relibra.rl"
    assert len(t.provenance["reward_per_step"]) == cfg.steps
    t.save(tmp_path / "rl.npz")
    back = RoutingTrace.load(tmp_path / "rl.npz")
    assert np.array_equal(back.token_experts, t.token_experts) and back.provenance == t.provenance
    assert np.isfinite(trace_stats(t)["static_skewness"])


def test_micro_batch_order_shuffles_only_when_asked():
    cfg = tiny_config()
    rng = np.random.default_rng(0)
    assert np.array_equal(micro_batch_order(cfg, rng), np.arange(16).reshape(2, 8))
    shuffled = micro_batch_order(tiny_config(shuffle_sequences=True), rng)
    assert sorted(shuffled.ravel()) == list(range(16)) and not np.array_equal(shuffled.ravel(), np.arange(16))


def test_cli_writes_a_trace(tmp_path, capsys):
    out = tmp_path / "rl.npz"
    code = main(["rl", "--steps", "1", "--seed", "1", "--out", str(out), "--prompts", "4", "--group-size", "4",
                 "--micro-batches", "2", "--ep", "2", "--warmup-steps", "2", "--layers", "2", "--experts", "8",
                 "--top-k", "2", "--hidden", "32", "--moe-ffn", "32", "--threads", "1", "--no-progress",
                 "--metrics", str(tmp_path / "m.json")])
    assert code == 0
    printed = capsys.readouterr().out
    assert "synthetic mixed" in printed and "mb_hot_overlap" in printed
    assert RoutingTrace.load(out).num_steps == 1
    assert main(["rl", "--out", str(tmp_path / "x.txt")]) == 2
    assert main(["rl", "--out", str(out), "--micro-batches", "5", "--no-progress"]) == 2
    assert "micro_batches=5" in capsys.readouterr().err
    assert main(["rl", "--out", str(out), "--compare", "giant", "--no-progress"]) == 2
    assert "giant" in capsys.readouterr().err


def test_domains_are_the_documented_ones_and_each_verifies_its_own_reference():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "rl.md").read_text().splitlines()
    start = next(i for i, line in enumerate(doc) if line.startswith("| domain | prompt |"))
    documented = []
    for line in doc[start + 2:]:
        if not line.startswith("|"):
            break
        documented.append(line.split("|")[1].strip())
    assert tuple(documented) == DOMAINS
    rng = np.random.default_rng(0)
    for domain in DOMAINS:
        for task in sample_tasks(rng, 5, domains=(domain,)):
            assert task.domain == domain_of(task.prompt) == domain
            assert reward(task.prompt, task.reference) == 1.0
            assert reward(task.prompt, task.reference + task.reference) < 1.0


def test_default_policy_is_the_rl_tiny_preset():
    from relibra.cluster import get_model

    assert PolicyConfig().model_shape() == get_model("rl-tiny")


def test_shipped_trace_loads_and_matches_its_recipe():
    from relibra.cluster import get_model
    from relibra.rl import DEFAULT_RL_TRACE, load_default_rl_trace

    assert DEFAULT_RL_TRACE.exists()
    t = load_default_rl_trace()
    assert t.model == get_model("rl-tiny") and t.ep == 4 and t.token_experts is not None
    cfg = t.provenance["config"]
    assert (cfg["steps"], cfg["seed"], cfg["rollout_dtype"]) == (t.num_steps, 0, "bfloat16") == (40, 0, "bfloat16")
    assert len(t.provenance["reward_per_step"]) == t.num_steps
