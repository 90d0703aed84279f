"""Synthetic RL routing workloads: determinism, conservation, calibration and shift properties."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relibra.analysis import trace_stats
from relibra.bench.workload import benchmark_generate
from relibra.cluster import ModelShape, get_model
from relibra.errors import ConfigError, TraceError
from relibra.trace import RoutingTrace
from relibra.workloads import (BATCH_LAYOUTS, DEFAULT_BATCH_LAYOUT, first_fit_bins, split_largest_bins,
                               token_budget_slots, WORKLOADS, WorkloadConfig, allowed_ep,
                               generate_trace, karmarkar_karp, layout_slots, model_seed,
                               pack_sequences, sample_topk_counts, water_fill)

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
    slot_tokens = t.seq_lens.sum(axis=3)  # [S, M, ep]: whole sequences, so slots differ
    assert (per_layer == slot_tokens[:, :, None, :] * model.top_k).all()  # every layer routes tokens x top_k
    assert (t.loads <= slot_tokens[:, :, None, :, None]).all()  # an expert takes at most one slot of each token
    assert (t.seq_lens > 0).any(axis=3).all()  # no empty slot
    assert 100 < slot_tokens.mean() < 900  # about tokens_per_rank per slot on average


def test_megatron_layout_packs_equal_slots():
    cfg = WorkloadConfig(batch_layout="megatron")
    t = generate_trace("small", "math", ep=8, steps=2, micro_batches=3, tokens_per_rank=300, config=cfg)
    assert (t.loads.sum(axis=4) == 300 * 4).all() and t.tokens_per_microbatch == 8 * 300
    assert (t.seq_lens.sum(axis=3) == 300).all()


def test_token_level_ids_match_loads_and_are_distinct():
    cfg = WorkloadConfig(length_scale=1 / 64)
    t = generate_trace("tiny", "math", ep=4, steps=2, micro_batches=3, tokens_per_rank=64, config=cfg,
                       token_level=True)
    model = get_model("tiny")
    assert t.token_experts.shape[:2] == (2, 3) and t.token_experts.shape[3:] == (model.num_layers, model.top_k)
    valid = t.token_src_rank >= 0
    srt = np.sort(t.token_experts, axis=-1)
    assert (srt[..., 1:] != srt[..., :-1])[valid].all()
    # tokens per (step, micro-batch, rank) agree with seq_lens
    per_rank = np.stack([(t.token_src_rank == r).sum(axis=2) for r in range(4)], axis=2)
    assert (per_rank == t.seq_lens.sum(axis=3)).all()
    cell = (t.token_experts[1, 2][t.token_src_rank[1, 2] == 3][:, 2] == 5).sum()
    assert t.loads[1, 2, 2, 3, 5] == cell


def test_batch_derived_from_paper_batch():
    """Fixed-count layouts: 1024 sequences in 32 micro-batches: 1 whole sequence per slot at EP32, 2 at EP16."""
    shape = dataclasses.replace(get_model("qwen3-30b-a3b"), name="q-1l", num_layers=1)
    for ep, per_slot in ((32, 1), (16, 2)):
        t = generate_trace(shape, "mixed", ep=ep, steps=1, config=WorkloadConfig(batch_layout="verl-balance"))
        assert t.num_microbatches == 32
        assert ((t.seq_lens > 0).sum(axis=3) == per_slot).all()
        assert t.provenance["batch_layout"] == "verl-balance"
        assert t.provenance["sequences_per_step"] == 1024
    assert 1500 < t.seq_lens.sum(axis=3).mean() / 2 < 6000  # mean sequence length of the mixed workload


def test_karmarkar_karp_balances_better_than_chunks():
    rng = np.random.default_rng(0)
    lengths = np.rint(3000 * np.exp(0.9 * rng.standard_normal(256))).astype(np.int64)
    parts = karmarkar_karp(lengths, 8, equal_size=True)
    assert sorted(np.concatenate(parts).tolist()) == list(range(256))
    assert all(len(p) == 32 for p in parts)
    sums = np.array([lengths[p].sum() for p in parts])
    chunks = lengths.reshape(8, 32).sum(axis=1)
    assert sums.max() - sums.min() < (chunks.max() - chunks.min()) / 2
    assert (np.diff(sums) <= 0).all()  # parts in decreasing order of sum
    free = karmarkar_karp(lengths[:40], 8, equal_size=False)
    fs = np.array([lengths[:40][p].sum() for p in free])
    assert all(len(p) > 0 for p in free) and fs.max() - fs.min() <= lengths[:40].max()
    with pytest.raises(ConfigError):
        karmarkar_karp(lengths[:10], 4, equal_size=True)


def test_token_budget_batch_packs_whole_sequences_within_the_budget():
    """The default layout: the whole 1024-sequence batch, packed first-fit to the budget, every rank the same
    micro-batch count, a sequence over the budget alone in its micro-batch, every sequence placed once."""
    shape = dataclasses.replace(get_model("qwen3-30b-a3b"), name="q-1l", num_layers=1)
    assert DEFAULT_BATCH_LAYOUT == "token-budget"
    budget = 8192
    cfg = WorkloadConfig(tokens_per_microbatch=budget, data_parallel_size=32, responses_per_prompt=8)
    t = generate_trace(shape, "mixed", ep=16, steps=2, config=cfg)
    slot_tokens = t.seq_lens.sum(axis=3)  # [steps, M, ep]
    pieces = (t.seq_lens > 0).sum(axis=3)
    assert ((slot_tokens <= budget) | (pieces == 1)).all()  # over budget only when alone
    assert (pieces >= 1).all()  # every rank runs every micro-batch
    assert (slot_tokens > budget).any()  # the 20k cap exceeds the budget: such sequences sit alone
    assert t.provenance["sequences_per_step"] == 1024 * 16 // 32  # global batch x ep / dp
    assert 0.7 * budget < slot_tokens.mean() < 1.2 * budget  # first fit fills the micro-batches
    assert t.provenance["batch_layout"] == "token-budget"


def test_first_fit_bins_and_splitting_follow_slime():
    """First fit in order, an over-long sequence alone; splitting cuts the largest multi-sequence bin at half."""
    lengths = np.array([6, 5, 3, 12, 2, 4])
    bins = first_fit_bins(lengths, 10)
    assert bins == [[0, 2], [1, 4], [3], [5]]  # 6+3, 5+2, 12 alone (over budget), 4 (fits nowhere else: 9+4, 7+4)
    assert split_largest_bins(bins, 5, lengths) == [[0], [1, 4], [3], [5], [2]]
    with pytest.raises(ConfigError, match="cannot be split"):
        split_largest_bins([[0], [1]], 3, lengths)
    # bin work 9, 7, 12, 4: Karmarkar-Karp pairs {9, 7} and {12, 4} (16 each); micro-batches in bin order
    rank, mb = token_budget_slots([[0, 2], [1, 4], [3], [5]], lengths, 2)
    assert rank[0] == rank[2] == rank[1] == rank[4] != rank[3] == rank[5]
    assert mb.tolist() == [0, 1, 0, 0, 1, 1]
    rank, _ = token_budget_slots([[0], [1]], lengths, 1)
    assert rank.tolist() == [0, 0, -1, -1, -1, -1]  # sequences in no bin are in no slot


@pytest.mark.parametrize("layout", [b for b in BATCH_LAYOUTS if b not in ("megatron", "token-budget")])
def test_layout_slots_deal_every_sequence(layout):
    rng = np.random.default_rng(1)
    ep, mb = 4, 3
    lengths = rng.integers(10, 5000, size=48)
    group = np.arange(48) // 16
    rank, micro = layout_slots(lengths, group, ep, mb, layout)
    slots = np.bincount(micro * ep + rank, minlength=ep * mb)
    assert (slots > 0).all() and slots.sum() == 48
    assert np.bincount(rank, minlength=ep).tolist() == [12] * ep  # equal sequences per data-parallel rank
    if layout == "verl":  # DataProto.chunk: contiguous chunks; consecutive micro-batches
        assert rank.tolist() == np.repeat(np.arange(ep), 12).tolist()
        assert micro.tolist() == np.tile(np.repeat(np.arange(mb), 4), ep).tolist()
    if layout.startswith("slime"):  # val[dp_rank::dp_size]
        assert rank.tolist() == (np.arange(48) % ep).tolist()
    if layout.endswith("dynamic"):  # token-balanced micro-batches inside each rank
        tok = np.zeros((ep, mb))
        np.add.at(tok, (rank, micro), lengths)
        fixed_rank, fixed_mb = layout_slots(lengths, group, ep, mb, layout.replace("-dynamic", "") if layout != "verl-dynamic" else "verl-balance")
        ftok = np.zeros((ep, mb))
        np.add.at(ftok, (fixed_rank, fixed_mb), lengths)
        assert (tok.max(1) - tok.min(1)).mean() < (ftok.max(1) - ftok.min(1)).mean()
    if layout == "verl-balance":
        per_rank = np.bincount(rank, weights=lengths)
        chunk = lengths.reshape(ep, 12).sum(axis=1)
        assert per_rank.max() - per_rank.min() <= chunk.max() - chunk.min()


def test_layouts_differ_and_are_recorded():
    shape = dataclasses.replace(get_model("qwen3-30b-a3b"), name="q-2l", num_layers=2)
    loads = {}
    for layout in ("verl", "slime", "megatron"):
        t = generate_trace(shape, "mixed", ep=8, steps=1, micro_batches=8, config=WorkloadConfig(batch_layout=layout))
        assert t.provenance["batch_layout"] == layout
        loads[layout] = t.loads
    assert not np.array_equal(loads["verl"], loads["slime"])
    with pytest.raises(ConfigError, match="batch_layout"):
        WorkloadConfig(batch_layout="rank-major")


def test_every_model_gets_its_own_routing():
    """Models of the same routing shape (the laptop profile scales the paper models to a few layers) differ."""
    base = dataclasses.replace(get_model("qwen3-30b-a3b"), num_layers=2)
    a = generate_trace(base, "code", ep=8, steps=1, micro_batches=4, tokens_per_rank=256)
    b = generate_trace(dataclasses.replace(base, name="qwen3-235b-a22b"), "code", ep=8, steps=1, micro_batches=4,
                       tokens_per_rank=256)
    again = generate_trace(base, "code", ep=8, steps=1, micro_batches=4, tokens_per_rank=256)
    assert not np.array_equal(a.loads, b.loads) and a.static_skewness() != b.static_skewness()
    assert np.array_equal(a.loads, again.loads)
    assert model_seed(base) != model_seed(dataclasses.replace(base, name="glm-4.5-air"))


def test_seq_lens_survive_save_and_load(tmp_path):
    t = generate_trace("tiny", "mixed", ep=4, steps=2, micro_batches=2, tokens_per_rank=64)
    t.save(tmp_path / "t.npz")
    back = RoutingTrace.load(tmp_path / "t.npz")
    assert np.array_equal(back.seq_lens, t.seq_lens)
    assert np.array_equal(t.select_steps([1]).seq_lens, t.seq_lens[1:])
    bad = t.seq_lens.copy()
    bad[0, 0, 0, 0] += 1  # no longer sums to the slot's tokens
    with pytest.raises(TraceError, match="seq_lens"):
        RoutingTrace(t.loads, t.model, t.ep, t.tokens_per_microbatch, seq_lens=bad)
    neg = t.seq_lens.copy()
    neg[0, 0, 0, -1] = -1
    with pytest.raises(TraceError, match=">= 0"):
        RoutingTrace(t.loads, t.model, t.ep, t.tokens_per_microbatch, seq_lens=neg)


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


def test_static_skewness_grows_with_ep():
    # The paper reports (second-hand) Megatron skewness above 2.0 at EP 16 and 32; the generator is not tuned to it
    # (docs/traces.md gives where it lands): only the growth with EP and a skew well above 1 are properties of it.
    skew = {ep: generate_trace(PAPER_LIKE, "mixed", ep=ep, steps=1, micro_batches=8).static_skewness()
            for ep in (8, 16, 32)}
    assert skew[8] > 1.3
    assert skew[8] < skew[16] < skew[32]


def test_hot_experts_shift_more_between_micro_batches_than_steps():
    """Clearly with one sequence per slot; still, though less, with token-budget micro-batches of ~4 sequences."""
    one = trace_stats(generate_trace(PAPER_LIKE, "mixed", ep=16, steps=3, micro_batches=16,
                         config=WorkloadConfig(batch_layout="verl-balance")))
    assert one["mb_hot_overlap"] < one["step_hot_overlap"]
    assert one["mb_corr"] < one["step_corr"]
    assert one["mb_vs_step_hot_overlap"] < 0.9  # micro-batches differ from their step
    packed = trace_stats(generate_trace(PAPER_LIKE, "mixed", ep=16, steps=3, micro_batches=16))
    assert packed["mb_hot_overlap"] < packed["step_hot_overlap"] and packed["mb_corr"] < packed["step_corr"]
    assert packed["mb_vs_step_hot_overlap"] > one["mb_vs_step_hot_overlap"]  # larger micro-batches: closer to the step


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
    with pytest.raises(ConfigError, match="EP sizes near it that do: .*128"):
        generate_trace("kimi-k2", "math", ep=256, steps=1)
    assert 192 in allowed_ep(384) and 256 not in allowed_ep(384)
    with pytest.raises(ConfigError, match="token_level"):
        generate_trace(ModelShape("big", 94, 128, 8, 64, 64), "math", ep=32, steps=4, token_level=True)


def test_benchmark_generate_reports_seconds():
    out = benchmark_generate("tiny", "mixed", ep=4, steps=2, micro_batches=2, tokens_per_rank=128)
    assert out["seconds_per_step"] > 0 and out["load_cells"] == 2 * 2 * 4 * 4 * 16
    assert out["static_skewness"] >= 1.0


def test_microbatch_shift_permutes_a_share_of_experts_per_micro_batch():
    from relibra.workloads import shift_permutations

    rng = np.random.default_rng(0)
    assert shift_permutations(rng, 3, 2, 16, 0.0) is None and shift_permutations(rng, 3, 2, 16, 0.05) is None
    idx = shift_permutations(rng, 3, 2, 16, 0.5)
    assert idx.shape == (3, 2, 16)
    assert (np.sort(idx, axis=-1) == np.arange(16)).all()  # a permutation of the experts in every (mb, layer)
    assert ((idx != np.arange(16)).sum(-1) <= 8).all() and (idx != np.arange(16)).any()
    assert (shift_permutations(rng, 1, 1, 16, 1.0) != shift_permutations(rng, 1, 1, 16, 1.0)).any()
    with pytest.raises(ConfigError, match="microbatch_shift must lie in"):
        WorkloadConfig(microbatch_shift=1.5)


def test_microbatch_shift_moves_hot_experts_and_keeps_the_batch():
    base = generate_trace(PAPER_LIKE, "mixed", ep=16, steps=2, micro_batches=6)
    zero = generate_trace(PAPER_LIKE, "mixed", ep=16, steps=2, micro_batches=6,
                          config=WorkloadConfig(microbatch_shift=0.0))
    assert np.array_equal(base.loads, zero.loads) and "microbatch_shift" not in base.provenance["config"]
    shifted = generate_trace(PAPER_LIKE, "mixed", ep=16, steps=2, micro_batches=6,
                             config=WorkloadConfig(microbatch_shift=0.5))
    assert shifted.provenance["config"]["microbatch_shift"] == 0.5
    assert np.array_equal(base.seq_lens, shifted.seq_lens)  # token-budget: the batch has its own stream
    assert np.array_equal(base.loads.sum(axis=-1), shifted.loads.sum(axis=-1))  # every slot routes its tokens
    a, b = trace_stats(base), trace_stats(shifted)
    assert b["mb_corr"] < a["mb_corr"] - 0.1 and b["mb_vs_step_corr"] < a["mb_vs_step_corr"] - 0.05
    # a permutation of every slot's shares: the micro-batch's imbalance stays (sampling aside)
    assert b["static_skewness"] == pytest.approx(a["static_skewness"], rel=0.1)


def test_microbatch_shift_at_token_level():
    cfg = WorkloadConfig(microbatch_shift=0.5, length_scale=1 / 128)
    t = generate_trace("tiny", "math", ep=4, steps=2, micro_batches=4, tokens_per_rank=64, config=cfg, token_level=True)
    assert t.token_experts is not None and t.loads.sum() == t.loads[:, :, :1].sum() * t.num_layers
