"""The re-plan interval chosen per set-up card (relibra.studies.replan, `relibra replan`): the record of
each shipped card, how a case finds its k (the record for the card as written, k = 1 with the reason
otherwise, an error for a stale or missing record), the whole re-plan cycles a case then simulates, and the
headline's own path at every card's recorded k against Megatron."""

from __future__ import annotations

import json

import pytest

from relibra.cli import main
from relibra.errors import ConfigError
from relibra.studies.replan import (REHOMING_POLICIES, RECORD_DIR, ReplanForm, card_sha256, card_values,
                                        load_replan_record, record_table, replan_form, replan_record,
                                        simulate_in_form, write_replan_record)
from relibra.setups import card_names, load_card
from conftest import make_trace, nodes_of  # tests/ is on sys.path under pytest

SMALL = dict(models=("qwen3-30b-a3b",), candidates=(1, 2), layers=2, workers=1, progress=False)


@pytest.fixture(scope="module")
def small_records(tmp_path_factory):
    """Cut-down records (2 layers, k in 1, 2) of one-sequence and of paper-stated (the same values) in a folder."""
    folder = tmp_path_factory.mktemp("replan")
    first = replan_record("one-sequence", command="test", **SMALL)
    write_replan_record(first, folder)
    second = replan_record("paper-stated", command="test", reuse_from=folder, **SMALL)
    write_replan_record(second, folder)
    return folder, first, second


def test_form_gives_each_rehoming_policy_its_k():
    form = ReplanForm((("eplb+", 4), ("lplb+", 2)), "record")
    assert form.longest == 4 and form.trace_steps(3) == 5 and form.trace_steps(20) == 20
    params = form.policy_params({"relibra": {"spare_slots_per_gpu": 2}, "eplb+": {"relabel": True}})
    assert params == {"relibra": {"spare_slots_per_gpu": 2}, "eplb+": {"relabel": True, "replan_interval": 4},
                      "lplb+": {"replan_interval": 2}}
    assert form.interval("eplb+") == 4 and form.interval("megatron") == 0
    one = ReplanForm.at_one(["megatron", "eplb+", "relibra"], "why")
    assert one.intervals == (("eplb+", 1),) and one.longest == 1 and one.trace_steps(3) == 3
    assert one.source == "k = 1: why" and ReplanForm.at_one(["megatron"], "why").intervals == ()


def test_a_step_at_k_is_the_mean_over_its_cycle_phases():
    """simulate_in_form: a policy at k is simulated on the same step once per phase (one re-plan paying its
    migration, k - 1 phases without), the others once; its tokens/s is all tokens over all seconds."""
    from relibra.sim import simulate

    trace, topo = make_trace(7, ep=8, experts=32, layers=2, steps=6), nodes_of(4)
    form = ReplanForm((("eplb+", 4), ("lplb+", 1)), "test")
    result = simulate_in_form(trace, topo, ["megatron", "eplb+", "lplb+"], form, steps=1, progress=False)
    per_step = result.per_step
    assert (per_step["step"] == 5).all()
    assert per_step["policy"].value_counts().to_dict() == {"eplb+": 4, "megatron": 1, "lplb+": 1, "balanced": 1,
                                                          "balanced-compute": 1}
    mine = per_step[per_step["policy"] == "eplb+"]
    assert (mine["migration_s"] > 0).sum() == 1 and (mine["experts_moved"] == 0).sum() == 3
    row = result.summary.set_index("policy").loc["eplb+"]
    assert row["tokens_per_s"] == pytest.approx(mine["tokens"].sum() / mine["step_s"].sum())
    assert row["steps"] == 4
    # the phase that re-plans at the step is the policy's own plan of that step from the cycle before
    alone = simulate(trace, topo, ["eplb+"], steps=1, references=False, progress=False,
                     policy_params={"eplb+": {"replan_interval": 4, "replan_phase": 1}})
    assert alone.per_step["step_s"].iloc[0] == pytest.approx(float(mine.loc[mine["migration_s"] > 0, "step_s"].iloc[0]))
    # at k = 1 the form is plain simulate
    one = simulate_in_form(trace, topo, ["megatron", "eplb+"], ReplanForm.at_one(["eplb+"], "x"), progress=False)
    assert one.per_step["policy"].value_counts()["eplb+"] == 1


def test_record_holds_its_provenance_and_table(small_records):
    folder, first, second = small_records
    assert sorted(p.name for p in folder.iterdir()) == ["one-sequence.json", "paper-stated.json"]  # no temp files
    loaded = load_replan_record("one-sequence", folder)
    assert loaded == json.loads(json.dumps(first))
    assert loaded["card_sha256"] == card_sha256(card_values(load_card("one-sequence")))
    assert loaded["trace"]["seed"] == 0 and loaded["trace"]["steps"] == 4 and loaded["trace"]["workload"] == "math"
    assert loaded["command"] == "test" and loaded["date_utc"].endswith("Z") and loaded["candidates"] == [1, 2]
    [case] = loaded["cases"]
    assert case["model"] == "qwen3-30b-a3b" and case["ep"] == 32 and case["layers"] == 2
    assert sorted(case["chosen"]) == sorted(REHOMING_POLICIES)
    table = record_table(loaded)
    assert len(table) == len(REHOMING_POLICIES)
    for _, r in table.iterrows():  # the chosen k has the highest tokens/s of its row
        assert r[f"tokens_per_s_k{r['k']}"] == max(r["tokens_per_s_k1"], r["tokens_per_s_k2"])
    # paper-stated holds one-sequence's values: its cases are taken, and it says from where
    assert second["cases"] == first["cases"] and second["cases_from"]["card"] == "one-sequence"


def test_form_reads_the_record_for_the_card_as_written(small_records, tmp_path):
    folder, first, _ = small_records
    card = load_card("one-sequence")
    chosen = first["cases"][0]["chosen"]
    form = replan_form(card, "qwen3-30b-a3b", 32, ["megatron", "eplb+", "lplb+", "relibra"], folder)
    assert dict(form.intervals) == {"eplb+": chosen["eplb+"], "lplb+": chosen["lplb+"]}
    assert form.source.endswith("one-sequence.json")
    # not the card as written, or not a case of the record: k = 1, and why
    varied = card.with_values("test", cluster__rdma_GBps=25.0)
    assert replan_form(varied, "qwen3-30b-a3b", 32, ["eplb+"], folder).intervals == (("eplb+", 1),)
    assert "changed in code" in replan_form(varied, "qwen3-30b-a3b", 32, ["eplb+"], folder).source
    assert "holds no case of glm-4.5-air at EP 32" in replan_form(card, "glm-4.5-air", 32, ["eplb+"], folder).source
    outside = tmp_path / "mine.toml"
    outside.write_text(f'base = "{load_card("one-sequence").path}"\n')
    assert "not under data/setups/" in replan_form(load_card(outside), "qwen3-30b-a3b", 32, ["eplb"], folder).source
    assert replan_form(card, "qwen3-30b-a3b", 32, ["megatron", "relibra"], folder) == ReplanForm()


def test_stale_missing_or_broken_records_are_errors(small_records, tmp_path):
    _, first, _ = small_records
    card = load_card("one-sequence")
    stale = dict(first, card_values={**first["card_values"], "cluster.rdma_GBps": 1.0})
    stale["card_sha256"] = card_sha256(stale["card_values"])
    write_replan_record(stale, tmp_path)
    with pytest.raises(ConfigError, match=r"made from other values of card one-sequence \(entries "
                                          r"cluster.rdma_GBps\); run `relibra replan --setup one-sequence` again"):
        replan_form(card, "qwen3-30b-a3b", 32, ["eplb+"], tmp_path)
    with pytest.raises(ConfigError, match="paper-stated.json: missing; .*relibra replan --setup paper-stated"):
        replan_form(load_card("paper-stated"), "qwen3-30b-a3b", 32, ["eplb+"], tmp_path)
    (tmp_path / "paper-stated.json").write_text("{")
    with pytest.raises(ConfigError, match="paper-stated.json: not a JSON record"):
        load_replan_record("paper-stated", tmp_path)
    (tmp_path / "paper-stated.json").write_text(json.dumps({**first, "cases": [{"model": "m", "ep": 8,
                                                                                 "chosen": {"eplb+": 0}}]}))
    with pytest.raises(ConfigError, match="bad model, ep or chosen interval"):
        load_replan_record("paper-stated", tmp_path)


def test_every_shipped_card_has_a_current_record(capsys):
    assert main(["replan", "--check"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}: current" in out for name in card_names())
    assert main(["replan"]) == 2
    assert "give --setup CARD, --cards A,B,... or --all" in capsys.readouterr().err


@pytest.mark.parametrize("name", card_names())
def test_recorded_k_is_at_least_megatron_and_migration_is_what_slows_a_replan(name):
    """At full scale (the committed record): at its chosen k each re-homing policy is at least as fast as Megatron
    on the same steps, and at every k its step without migration is shorter than Megatron's."""
    record = load_replan_record(name, RECORD_DIR)
    table = record_table(record)
    assert (table["speedup_vs_megatron"] >= 1.0).all(), table
    for case in record["cases"]:
        megatron = next(r for r in case["rows"] if r["policy"] == "megatron")
        for r in case["rows"]:
            if r["policy"] in REHOMING_POLICIES:
                assert r["step_s"] - r["migration_s"] < megatron["step_s"], (case["model"], r)


@pytest.mark.parametrize("name", card_names())
def test_headline_path_at_the_recorded_k_is_at_least_megatron(name):
    """The headline's own case (simulate_case) on every card's cluster, batch and EP at 2 layers (one per pipeline
    stage where the card has more): each re-homing policy runs at its record's k, averaged over its cycle's
    phases, and is at least as fast as Megatron on the same step."""
    from relibra.studies.throughput import Case, simulate_case

    card = load_card(name)
    model, ep = card.memory_models()[0], card.value("batch.expert_parallel")
    rows = simulate_case(Case(name, model, "math", 0, ep=ep, layers=max(2, card.value("batch.pipeline_parallel")),
                              policies=("megatron", *REHOMING_POLICIES))).set_index("policy")
    chosen = next(c["chosen"] for c in load_replan_record(name)["cases"] if c["model"] == model and c["ep"] == ep)
    rehoming = rows.loc[list(REHOMING_POLICIES)]
    assert rehoming["replan_interval"].to_dict() == chosen
    assert (rehoming["replan_source"] == f"data/replan/{name}.json").all()
    assert (rehoming["tokens_per_s"] >= rows.loc["megatron", "tokens_per_s"]).all(), rehoming
