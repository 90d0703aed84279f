"""Synthetic RL routing workloads: determinism, conservation, calibration and shift properties."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relibra.cluster import ModelShape, get_model
from relibra.errors import ConfigError
from relibra.workloads import (WORKLOADS, WorkloadConfig, benchmark_generate, generate_trace, pack_sequences,
                               sample_topk_counts, water_fill)

# A paper-like layer (128 experts, top-8) with few layers keeps the calibration checks cheap:
# layers are drawn independently, so per-layer statistics do not depend on the layer count.
PAPER_LIKE = dataclasses.replace(get_model("qwen3-30b-a3b"), name="paper-like-8l", num_layers=8)


def test_same_seed_same_trace_and_seed_matters():
    a = generate_trace("small", "mixed", ep=4, steps=2, seed=3, micro_batches=3, tokens_per_rank=512)
    b = generate_trace("small", "mixed", ep=4, steps=2, seed=3, micro_batches=3, tokens_per_rank=512)
    c = generate_trace("small", "mixed", ep=4, steps=2, seed=4, micro_batches=3, tokens_per_rank=512)
    assert np.array_equal(a.loads, b.loads)
    assert not np.array_equal(a.loads, c.loads)
    assert a.provenance == b.provenance and a.provenance["seed"] == 3


@pytest.mark.parametrize("workload", WORKLOADS)
def test_shape_and_conservation(workload):
    model = get_model("small")
    t = generate_trace(model, workload, ep=8, steps=2, micro_batches=3, tokens_per_rank=300)
    assert t.loads.shape == (2, 3, model.num_layers, 8, model.num_experts) and t.loads.dtype == np.int32
    per_layer = t.loads.sum(axis=4)  # [S, M, L, ep]
    assert (per_layer == 300 * model.top_k).all()  # every layer of every slot routes tokens x top_k
    assert t.loads.max() <= 300  # an expert takes at most one slot of each token
    assert t.tokens_per_microbatch == 8 * 300


def test_token_level_ids_match_loads_and_are_distinct():
    cfg = WorkloadConfig(length_scale=1 / 64)
    t = generate_trace("tiny", "math", ep=4, steps=2, micro_batches=3, tokens_per_rank=64, config=cfg,
                       token_level=True)
    model = get_model("tiny")
    assert t.token_experts.shape == (2, 3, 4 * 64, model.num_layers, model.top_k)
    srt = np.sort(t.token_experts, axis=-1)
    assert (srt[..., 1:] != srt[..., :-1]).all()
    assert (t.token_src_rank == np.repeat(np.arange(4), 64)).all()
    # RoutingTrace's validator already checked loads == counts of token_experts; re-check one cell.
    cell = (t.token_experts[1, 2][t.token_src_rank[1, 2] == 3][:, 2] == 5).sum()
    assert t.loads[1, 2, 2, 3, 5] == cell


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 8), st.integers(0, 10_000), st.floats(0.05, 5.0))
def test_water_fill_caps_at_one_and_sums_to_k(k, seed, concentration):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(16, concentration), size=5)
    p = np.maximum(p, 1e-12)
    p /= p.sum(-1, keepdims=True)
    pi = water_fill(p, k)
    assert np.allclose(pi.sum(-1), k)
    assert (pi <= 1 + 1e-9).all()
    free = pi < 1 - 1e-9  # unsaturated experts keep their relative shares
    for row in range(5):
        ratio = pi[row, free[row]] / p[row, free[row]]
        assert np.allclose(ratio, ratio[0])


def test_sample_topk_counts_exact_under_heavy_saturation():
    rng = np.random.default_rng(0)
    p = np.full((200, 16), 1e-3)
    p[:, 0] = 0.5  # one expert wants half of all slots: it must saturate at `tokens`
    p[:, 1] = 0.2
    p /= p.sum(-1, keepdims=True)
    counts = sample_topk_counts(rng, p, tokens=100, k=4)
    assert (counts.sum(-1) == 400).all()
    assert counts.max() <= 100 and counts.min() >= 0
    assert (counts[:, 0] == 100).all()


def test_pack_sequences_fills_every_slot():
    lengths = np.array([5, 17, 3, 40, 9, 2])
    slot, seq, tokens = pack_sequences(lengths, slot_tokens=10, num_slots=6)
    assert np.bincount(slot, weights=tokens).tolist() == [10] * 6
    got = np.bincount(seq, weights=tokens, minlength=6)
    assert (got[:3] == lengths[:3]).all() and got[3] == 60 - 25  # the last one is cut at the end
    with pytest.raises(ConfigError):
        pack_sequences(np.array([3, 4]), 10, 1)


def test_static_skewness_above_two_and_growing_with_ep():
    skew = {ep: generate_trace(PAPER_LIKE, "mixed", ep=ep, steps=1, micro_batches=8).static_skewness()
            for ep in (8, 16, 32)}
    assert skew[16] > 2.0
    assert skew[8] < skew[16] < skew[32]


def test_hot_experts_shift_more_between_micro_batches_than_steps():
    t = generate_trace(PAPER_LIKE, "mixed", ep=16, steps=3, micro_batches=16)
    s = t.stats()
    assert s["mb_hot_overlap"] < s["step_hot_overlap"] - 0.15
    assert s["mb_corr"] < s["step_corr"]
    assert s["mb_hot_overlap"] < s["mb_vs_step_hot_overlap"] < 1.0  # micro-batches differ from their step


def test_domains_have_their_own_hot_experts():
    hot = {}
    for w in ("math", "code"):
        load = generate_trace(PAPER_LIKE, w, ep=8, steps=1, micro_batches=8, seed=5).step_expert_load()[0]
        hot[w] = np.argsort(-load, axis=-1)[:, :13]  # hottest 10% per layer
    overlap = np.mean([len(set(a) & set(b)) / 13 for a, b in zip(hot["math"], hot["code"])])
    assert overlap < 0.6


def test_bad_arguments_raise_config_error():
    with pytest.raises(ConfigError, match="unknown workload"):
        generate_trace("tiny", "poetry", ep=4, steps=1)
    with pytest.raises(ConfigError, match="does not divide"):
        generate_trace("tiny", "math", ep=3, steps=1)
    with pytest.raises(ConfigError, match="steps"):
        generate_trace("tiny", "math", ep=4, steps=0)
    with pytest.raises(ConfigError, match="drift_per_step"):
        WorkloadConfig(drift_per_step=2.0)
    with pytest.raises(ConfigError, match="unknown model"):
        generate_trace("gpt-5", "math", ep=4, steps=1)
    with pytest.raises(ConfigError, match="token_level"):
        generate_trace(ModelShape("big", 94, 128, 8, 64, 64), "math", ep=32, steps=4, token_level=True)


def test_benchmark_generate_reports_seconds():
    out = benchmark_generate("tiny", "mixed", ep=4, steps=2, micro_batches=2, tokens_per_rank=128)
    assert out["seconds_per_step"] > 0 and out["load_cells"] == 2 * 2 * 4 * 4 * 16
    assert out["static_skewness"] >= 1.0
