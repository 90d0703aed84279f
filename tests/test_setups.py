"""relibra.setups: the set-up cards hold every input with a kind and a source, turn into the kit's
configuration objects, and bad cards fail with one error naming the file and the entry."""

from __future__ import annotations

import json

import pytest

from relibra.cli import main
from relibra.cluster import get_topology
from relibra.errors import ConfigError
from relibra.setups import DEFAULT_CARD, KINDS, card_names, load_card
from relibra.workloads import DOMAINS


NAMED_CARDS = ("token-budget-tp1", "paper-stated", "slime-qwen3-235b", "slime-qwen3-30b", "verl-qwen3-30b",
               "one-sequence")


@pytest.mark.parametrize("name", NAMED_CARDS)
def test_every_card_sources_every_entry(name):
    card = load_card(name)
    assert set(NAMED_CARDS) <= set(card_names()) and DEFAULT_CARD == "token-budget-tp1"
    for key, e in card.entries.items():
        assert e.kind in KINDS and e.source.strip(), key
        if e.kind == "assumed":
            assert e.range is not None and len(e.range) == 2, key
    tokens = card.entries["batch.tokens_per_ep_rank_per_microbatch"]
    assert tokens.kind == "derived" and card.tokens_per_ep_rank == card.value(
        "batch.tokens_per_gpu_per_microbatch") // card.value("batch.tensor_parallel")


@pytest.mark.parametrize("name, tokens, token_ranks, ep, pp, layers", [
    ("token-budget-tp1", 16384, 32, 32, 1, None),
    ("slime-qwen3-235b", 4096, 16, 16, 4, 94),  # 16384 x CP 2 / (CP 2 x TP 4); DP 2 x CP 2 x TP 4 ranks a stage
    ("slime-qwen3-30b", 5120, 8, 8, 1, 48),  # 20480 / TP 4; DP 2 x TP 4
    ("verl-qwen3-30b", 10240, 8, 8, 1, 48),
])
def test_recipe_cards_derive_tokens_per_ep_rank_as_the_recipe_does(name, tokens, token_ranks, ep, pp, layers):
    from relibra.cluster import get_model

    card = load_card(name)
    assert (card.tokens_per_ep_rank, card.token_ranks, card.value("batch.expert_parallel"),
            card.value("batch.pipeline_parallel")) == (tokens, token_ranks, ep, pp)
    cfg = card.workload_config()
    assert (cfg.tokens_per_microbatch, cfg.data_parallel_size) == (tokens, token_ranks)
    assert card.expert_dp_size(ep) == 1
    if layers is not None:
        assert get_model(card.value("model.name")).num_layers == layers
    if layers is not None:
        counts = card.stage_layer_counts(layers)
        assert len(counts) == pp and sum(counts) == layers


def test_paper_stated_card_is_one_sequence_per_slot_with_even_pipeline_splits():
    card = load_card("paper-stated")
    assert (card.value("batch.global_batch_sequences"), card.micro_batches, card.token_ranks) == (1024, 32, 32)
    assert card.entries["batch.micro_batches"].kind == "published"
    pp_low, pp_high = card.entries["batch.pipeline_parallel"].range
    for pp in range(pp_low, pp_high + 1):
        assert all(layers % pp == 0 for layers in (48, 46, 94))
    mean = card.mean_tokens_per_ep_rank("math")
    p = card.workload_config().profile("math")
    import math
    assert mean == pytest.approx(p.prompt_tokens_median * math.exp(p.prompt_tokens_sigma ** 2 / 2)
                                 + p.response_tokens_median * math.exp(p.response_tokens_sigma ** 2 / 2))
    keys = [r["key"] for r in card.derived_rows()]
    assert keys == ["derived.mean_tokens_per_ep_rank_per_microbatch.mixed",
                    "derived.mean_tokens_per_ep_rank_per_microbatch.math"]


def test_math_lengths_match_their_sources_mean():
    # verl docs/perf/dpsk.md: mean response 1960 tokens on DAPO-Math-17k; the log-normal mean is median x e^(s^2/2)
    import math
    x = load_card(DEFAULT_CARD).value("lengths.math")
    assert x["response_median"] * math.exp(x["response_sigma"] ** 2 / 2) == pytest.approx(1960, rel=0.01)


def test_derived_tokens_follow_their_inputs_and_a_direct_setting_is_assumed():
    card = load_card("slime-qwen3-235b")
    moved = card.with_values("command line (--tokens-per-microbatch)", batch__tokens_per_gpu_per_microbatch=32768)
    assert moved.tokens_per_ep_rank == 8192 and moved.entries["batch.tokens_per_ep_rank_per_microbatch"].kind == "derived"
    direct = card.with_values("map", batch__tokens_per_ep_rank_per_microbatch=1024)
    assert direct.tokens_per_ep_rank == 1024 and direct.entries["batch.tokens_per_ep_rank_per_microbatch"].kind == "assumed"
    assert direct.workload_config().tokens_per_microbatch == 1024


def test_card_drives_generator_cluster_and_cost_model():
    card = load_card(DEFAULT_CARD)
    cfg = card.workload_config()
    assert (cfg.batch_layout, cfg.tokens_per_microbatch, cfg.data_parallel_size, cfg.responses_per_prompt,
            cfg.global_batch_sequences, cfg.max_sequence_tokens) == ("token-budget", 16384, 32, 8, 1024, 20480)
    math = card.value("lengths.math")
    assert cfg.profile("math").response_tokens_median == math["response_median"]
    assert [p.name for p in cfg.domain_profiles] == list(DOMAINS)
    topo, preset = card.topology(), get_topology("paper")
    for field in ("num_nodes", "gpus_per_node", "nvlink_GBps", "rdma_GBps", "matmul_tflops", "gemm_half_tokens",
                  "attention_efficiency", "collective_latency_s"):
        assert getattr(topo, field) == getattr(preset, field), field  # the `paper` preset is the card's
    params = card.cost_params(32)
    assert params.attention_backward_factor == 2.5 and params.replica_buffer == "layer-shared"
    assert params.dp_size == 1 and card.cost_params(16).dp_size == 2  # expert DP = DP x CP x TP / EP
    assert card.policy_params() == {"relibra": {"spare_slots_per_gpu": 2}}


def test_alternative_card_inherits_and_overrides():
    one, paper = load_card("one-sequence"), load_card(DEFAULT_CARD)
    assert one.value("batch.layout") == "verl-balance" and one.micro_batches == 32 and paper.micro_batches is None
    assert one.value("cluster.rdma_GBps") == paper.value("cluster.rdma_GBps")
    moved = paper.with_values("command line (--layout)", batch__layout="slime")
    assert moved.value("batch.layout") == "slime" and moved.entries["batch.layout"].source == "command line (--layout)"
    with pytest.raises(ConfigError, match="entry 'batch.layout' = 'rank-major' is not one of token-budget"):
        paper.with_values("x", batch__layout="rank-major")


GOOD = '''
[batch.layout]
value = "token-budget"
unit = ""
kind = "published"
source = "a recipe"
'''


@pytest.mark.parametrize("text, message", [
    ("name = 'x'\nbase = 'token-budget-tp1'\n[batch.layout]\nvalue = 'token-budget'\nunit = ''\nkind = 'published'\n",
     "entry 'batch.layout': no 'source'"),
    ("base = 'token-budget-tp1'\n[batch.layout]\nvalue = 'token-budget'\nunit = ''\nkind = 'guessed'\nsource = 's'\n",
     "kind must be one of published, measured, derived, assumed"),
    ("base = 'token-budget-tp1'\n[batch.layout]\nvalue = 'token-budget'\nunit = ''\nkind = 'assumed'\nsource = 's'\n",
     "an assumed entry needs the range"),
    ("base = 'token-budget-tp1'\n[batch.colour]\nvalue = 1\nunit = ''\nkind = 'published'\nsource = 's'\n",
     "entry 'batch.colour' is not a known input"),
    ("base = 'token-budget-tp1'\n[cluster.rdma_GBps]\nvalue = 'fast'\nunit = ''\nkind = 'published'\nsource = 's'\n",
     "entry 'cluster.rdma_GBps': value 'fast' has the wrong type"),
    ("base = 'token-budget-tp1'\n[cluster.rdma_GBps]\nvalue = -3.0\nunit = ''\nkind = 'published'\nsource = 's'\n",
     r"entry 'cluster.rdma_GBps' = -3.0 is outside \[0.01, 400\] GB/s"),
    ("base = 'token-budget-tp1'\n[compute.gemm_half_tokens]\nvalue = 1.0\nunit = ''\nkind = 'assumed'\nsource = 's'\n"
     "range = [4.0, 2.0]\n", "must rise"),
    ("base = 'token-budget-tp1'\n[batch.tensor_parallel]\nvalue = 4\nunit = ''\nkind = 'assumed'\nsource = 's'\n"
     "range = [1, 4]\n", "is 16384, but budget x CP / \\(CP x TP\\) = 16384 x 1 / \\(1 x 4\\) = 4096"),
    ("base = 'token-budget-tp1'\n[batch.tensor_parallel]\nvalue = 3\nunit = ''\nkind = 'assumed'\nsource = 's'\n"
     "range = [1, 4]\n", "not a whole number of tokens"),
    (GOOD, "missing entries"),
    ("base = 'token-budget-tp1'\n[batch\n", "not valid TOML"),
    ("base = 'nosuch'\n", "unknown set-up card 'nosuch'"),
])
def test_bad_cards_name_the_file_and_entry(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_card(str(path))


@pytest.mark.parametrize("name", NAMED_CARDS)
def test_setup_show_prints_every_entry(capsys, name):
    assert main(["setup", "show", name, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    card = load_card(name)
    assert [r["key"] for r in shown["entries"]] == list(card.entries) + [r["key"] for r in card.derived_rows()]
    assert main(["setup", "show", name]) == 0
    text = capsys.readouterr().out
    assert all(key in text for key in card.entries) and "deepseek-ai/DeepEP#16" in text
    assert "stas00/ml-engineering compute/accelerator/README.md:354" in text and "data/device/expert_gemm.json" in text


def test_gemm_rate_and_half_saturation_are_the_h200_fit():
    # the cost model's form t = 3 f (n + h) / R (relibra.costs.flops) fitted to the measured calls of >= 4096 tokens
    import numpy as np

    from relibra.setups import CARD_DIR
    shapes = json.loads((CARD_DIR.parents[0] / "device" / "expert_gemm.json").read_text())["shapes"]
    fit = {}
    for name, s in shapes.items():
        n, t = np.array(s["tokens"], float), np.array(s["median_s"])
        f, m = 3 * s["forward_flops_per_token"], n >= 4096
        (a, b), *_ = np.linalg.lstsq(np.vstack([np.ones(m.sum()), n[m] * f]).T, t[m], rcond=None)
        fit[name] = (1 / b / 1e12, a / b / f)
    card = load_card(DEFAULT_CARD)
    rate, half = fit["glm-4.5-air"]
    assert card.value("compute.matmul_tflops") == pytest.approx(rate, abs=0.5)
    assert card.value("compute.gemm_half_tokens") == pytest.approx(half, abs=0.5)
    low, high = card.entries["compute.matmul_tflops"].range
    assert low == pytest.approx(min(r for r, _ in fit.values()), abs=0.5) and high == 794.5
    low, high = card.entries["compute.gemm_half_tokens"].range
    assert (low, high) == pytest.approx((min(h for _, h in fit.values()), max(h for _, h in fit.values())), abs=0.5)


def test_setup_show_refuses_an_unknown_card(capsys):
    assert main(["setup", "show"]) == 0 and f"set-up card {DEFAULT_CARD} " in capsys.readouterr().out
    assert main(["setup", "show", "nosuch"]) == 2
    assert ("unknown set-up card 'nosuch'; known: one-sequence, paper-stated, slime-qwen3-235b, slime-qwen3-30b, "
            "token-budget-tp1, verl-qwen3-30b") in capsys.readouterr().err
