"""relibra.setups: the set-up cards hold every input with a kind and a source, turn into the kit's
configuration objects, and bad cards fail with one error naming the file and the entry."""

from __future__ import annotations

import json

import pytest

from relibra.cli import main
from relibra.cluster import get_topology
from relibra.errors import ConfigError
from relibra.setups import KINDS, card_names, load_card
from relibra.workloads import DOMAINS


def test_paper_card_sources_every_entry():
    card = load_card("paper")
    assert {"paper", "one-sequence"} <= set(card_names())
    for key, e in card.entries.items():
        assert e.kind in KINDS and e.source.strip(), key
        if e.kind == "assumed":
            assert e.range is not None and len(e.range) == 2, key
    assert card.value("batch.layout") == "token-budget"
    assert card.tokens_per_ep_rank == card.value("batch.tokens_per_gpu_per_microbatch") // card.value(
        "batch.tensor_parallel") == 16384
    derived = card.rows()[-1]
    assert derived["key"] == "batch.tokens_per_ep_rank" and derived["kind"] == "derived"


def test_card_drives_generator_cluster_and_cost_model():
    card = load_card("paper")
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
    assert params.dp_size == 1 and card.cost_params(16).dp_size == 2  # expert DP = DP x TP / EP
    assert card.policy_params() == {"relibra": {"spare_slots_per_gpu": 2}}


def test_alternative_card_inherits_and_overrides():
    one, paper = load_card("one-sequence"), load_card("paper")
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
    ("name = 'x'\nbase = 'paper'\n[batch.layout]\nvalue = 'token-budget'\nunit = ''\nkind = 'published'\n",
     "entry 'batch.layout': no 'source'"),
    ("base = 'paper'\n[batch.layout]\nvalue = 'token-budget'\nunit = ''\nkind = 'guessed'\nsource = 's'\n",
     "kind must be one of published, measured, assumed"),
    ("base = 'paper'\n[batch.layout]\nvalue = 'token-budget'\nunit = ''\nkind = 'assumed'\nsource = 's'\n",
     "an assumed entry needs the range"),
    ("base = 'paper'\n[batch.colour]\nvalue = 1\nunit = ''\nkind = 'published'\nsource = 's'\n",
     "entry 'batch.colour' is not a known input"),
    ("base = 'paper'\n[cluster.rdma_GBps]\nvalue = 'fast'\nunit = ''\nkind = 'published'\nsource = 's'\n",
     "entry 'cluster.rdma_GBps': value 'fast' has the wrong type"),
    ("base = 'paper'\n[cluster.rdma_GBps]\nvalue = -3.0\nunit = ''\nkind = 'published'\nsource = 's'\n",
     r"entry 'cluster.rdma_GBps' = -3.0 is outside \[0.01, 400\] GB/s"),
    ("base = 'paper'\n[compute.gemm_half_tokens]\nvalue = 1.0\nunit = ''\nkind = 'assumed'\nsource = 's'\n"
     "range = [4.0, 2.0]\n", "must rise"),
    ("base = 'paper'\n[batch.tensor_parallel]\nvalue = 4\nunit = ''\nkind = 'assumed'\nsource = 's'\n"
     "range = [1, 4]\n", "models TP 1 only"),
    (GOOD, "missing entries"),
    ("base = 'paper'\n[batch\n", "not valid TOML"),
    ("base = 'nosuch'\n", "unknown set-up card 'nosuch'"),
])
def test_bad_cards_name_the_file_and_entry(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_card(str(path))


def test_setup_show_prints_every_entry(capsys):
    assert main(["setup", "show", "paper", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    card = load_card("paper")
    assert [r["key"] for r in shown["entries"]] == list(card.entries) + ["batch.tokens_per_ep_rank"]
    assert main(["setup", "show", "paper"]) == 0
    text = capsys.readouterr().out
    assert all(key in text for key in card.entries) and "deepseek-ai/DeepEP#16" in text
    assert main(["setup", "show", "nosuch"]) == 2
    assert "unknown set-up card 'nosuch'; known: one-sequence, paper" in capsys.readouterr().err
