"""Notebook 02 on a routing trace file and on another cluster than the set-up card's: the headline's
ratios are the simulator's on that trace, the captions name the file, and a bad `trace` or a cluster
too small for the EP size is one error before any work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relibra import experiments as ex
from relibra.cluster import get_model, get_topology
from relibra.errors import ConfigError
from relibra.studies.throughput import HEADLINE_POLICIES, LINK_ALTERNATIVES
from relibra.studies.simulation import simulate_trace
from relibra.importers import import_megatron_replay
from relibra.setups import load_card

TINY = get_model("tiny")  # 4 MoE layers, 16 experts, top-2
EP, STEPS, MICRO_BATCHES, TOKENS = 4, 2, 2, 64


@pytest.fixture(scope="module")
def replay_trace(tmp_path_factory):
    """A RouterReplay dump (one .pt per step, micro-batch and EP rank: per-layer [tokens, top-k] ids, skewed
    towards low expert ids) imported with the kit's importer into replay.npz."""
    dump = tmp_path_factory.mktemp("router_replay")
    rng = np.random.default_rng(3)
    weights = np.linspace(3.0, 0.2, TINY.num_experts)
    for s in range(STEPS):
        for m in range(MICRO_BATCHES):
            for r in range(EP):
                ids = np.stack([np.stack([rng.choice(TINY.num_experts, TINY.top_k, replace=False, p=weights / weights.sum())
                                          for _ in range(TOKENS)]) for _ in range(TINY.num_layers)])
                torch.save([torch.from_numpy(x) for x in ids], dump / f"router_replay_step{s}_mb{m}_rank{r}.pt")
    path = dump / "replay.npz"
    import_megatron_replay(dump, "tiny", ep=EP).save(path)
    return path


def _ratios(summary):
    tps = summary.set_index("policy")["tokens_per_s"]
    return tps["relibra"] / tps["megatron"], tps["relibra"] / tps["eplb+"]


@pytest.mark.parametrize("cluster", [None, "cpu-gloo"])
def test_headline_on_a_trace_is_the_simulators_on_that_trace(replay_trace, cluster):
    nb = ex.get_notebook("02_throughput")
    p, sizes = nb.create(profile="tiny", trace=str(replay_trace), cluster=cluster)
    assert (sizes.models, sizes.ep, sizes.steps, sizes.micro_batches) == (("tiny",), EP, STEPS, MICRO_BATCHES)
    r = nb.compute(p, sizes, progress=False, workers=1)
    # the oracle: the trace straight through the simulator, its last step, on the same cluster and card knobs
    card = load_card()
    topology = card.topology() if cluster is None else get_topology(cluster)
    direct = simulate_trace(p.trace, topology, HEADLINE_POLICIES, card, steps=STEPS)
    over_megatron, over_eplb_plus = _ratios(direct)
    row = r.case_ratios.iloc[0]
    assert len(r.case_ratios) == 1 and row["model"] == "tiny"
    assert row["relibra_over_megatron"] == pytest.approx(over_megatron, rel=1e-12)
    assert row["relibra_over_eplb_plus"] == pytest.approx(over_eplb_plus, rel=1e-12)
    assert over_megatron != pytest.approx(1.0, abs=1e-3)  # the skewed routing gives ReLibra something to do
    assert r.verdict.set_index("claim").loc["ReLibra / Megatron", "mean"] == pytest.approx(over_megatron, rel=1e-12)
    assert set(r.throughput["policy"]) >= set(HEADLINE_POLICIES) and set(r.throughput["layout"]) == {"trace"}
    # the captions name the file and its importer, not the synthetic workloads
    for text in (r.caption, r.sweep_caption):
        assert f"the trace {replay_trace} (imported (megatron-replay) from" in text and "synthetic RL" not in text
    assert ("cpu-gloo cluster (2 x 2 GPUs)" in r.caption) == (cluster is not None)
    assert p.simulated_on() == topology.name
    # no budget sweep and no other layouts on a recorded trace; the link-rate alternatives run on it
    assert r.ratio_vs_budget.empty and "no budget sweep" in r.sweep_caption
    assert list(r.alternatives["label"]) == [label for label, _ in LINK_ALTERNATIVES]
    from relibra.studies.overheads import PAPER_OVERHEADS

    assert set(r.verdict["scale"]) == {"the trace's"} and list(r.overheads["overhead"]) == list(PAPER_OVERHEADS)


def test_the_plots_draw_an_empty_sweep(replay_trace):
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from relibra.plots import headline as hplots

    empty = pd.DataFrame(columns=["family", "tokens_per_microbatch", "relibra_over_megatron",
                                  "relibra_over_eplb_plus"])
    fig = hplots.budget_plot(empty, "no budget sweep: the trace fixes its own batch")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts == ["no budget sweep (the subtitle says why)"] * 2
    assert "the trace fixes its own batch" in fig._suptitle.get_text()


@pytest.mark.parametrize("raw, message", [
    ({"trace": "/nonexistent/t.npz"}, "02_throughput: trace must be a routing trace file the kit wrote"),
    ({"trace": "README.md"}, "02_throughput: trace must be a routing trace file"),
    ({"cluster": "cpu-gloo,nodes=1"}, "02_throughput: cluster must be one cluster (a preset, a fitted .json or "
                                      "key=value items) with room for EP 4 (the tiny profile's); got 'cpu-gloo,nodes=1' "
                                      "(EP size 4 exceeds the 2 GPUs of topology 'cpu-gloo,nodes=1' (1 nodes x 2); add nodes, e.g. "
                                      "'cpu-gloo,nodes=2')"),
    ({"cluster": "moon"}, "02_throughput: cluster must be one cluster"),
    ({"tokens_per_microbatch": 4096, "trace": "data/tiny_math_ep4.npz"},
     "tokens_per_microbatch must be None with a trace (the trace data/tiny_math_ep4.npz"),
])
def test_a_bad_trace_or_cluster_is_one_error_before_any_work(raw, message, tmp_path):
    with pytest.raises(ConfigError) as exc:
        ex.start("02_throughput", profile="tiny", out_dir=tmp_path / "out", **raw)
    text = str(exc.value)
    assert text.startswith("02_throughput: ") and message in text and "\n" not in text, text
    assert not (tmp_path / "out").exists()
