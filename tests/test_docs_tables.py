"""The docs' measured tables are rendered from the committed benchmark records (data/bench/*.json), so
nobody types a measured number into docs/; each record holds the commands that wrote it.

The fixture records below are made-up numbers chosen to be recognised in the rendered tables, not
measurements."""

from __future__ import annotations

import json

import pytest

from relibra.bench import docs_tables as dt
from relibra.bench import records as rec
from relibra.cli import main as cli_main
from relibra.errors import ConfigError


def test_every_marked_table_is_what_the_committed_records_render():
    seen = set()
    for path in dt.generated_files():
        text = path.read_text()
        for name, start, end in dt.marked_tables(text, str(path)):
            assert text[start:end] == dt.render_table(name), (
                f"{path.name}: table {name} differs from data/bench; run `python -m relibra.bench.docs_tables`")
            seen.add(name)
    every = set(dt.TABLES) | set(dt.OTHER_BLOCKS)
    assert seen == every, f"blocks never shown in docs/ or the README: {sorted(every - seen)}"
    assert dt.update_docs(check=True) == []


def test_committed_records_come_from_the_listed_commands():
    """Each record in data/bench/ was written by `relibra bench record NAME` from exactly its spec's
    commands, and carries its dates, machine and load averages."""
    for spec in rec.RECORDS:
        record = rec.load_record(spec.name)
        assert record["name"] == spec.name and record["command"] == f"relibra bench record {spec.name}"
        assert [r["command"] for r in record["runs"]] == [rec.command_line(a) for a in spec.commands]
        assert record["started_utc"].endswith(" UTC") and record["finished_utc"] >= record["started_utc"]
        assert record["machine"]["logical_cpus"] >= 1 and record["machine"]["cpu"]
        assert len(record["load_average_start"]) == 3 and len(record["load_average_end"]) == 3
        assert all(run["output"] for run in record["runs"])


def test_bench_readme_lists_every_record_command():
    readme = (rec.BENCH_DIR / "README.md").read_text()
    assert "relibra bench record --all" in readme
    for spec in rec.RECORDS:
        assert f"    {spec.name}: {spec.description}\n" in readme
        for argv in spec.commands:
            assert f"        {rec.command_line(argv)}\n" in readme, rec.command_line(argv)


def _record(name: str, runs: list[tuple[str, dict]]) -> dict:
    return {"name": name, "description": "fixture", "command": f"relibra bench record {name}",
            "started_utc": "2000-01-01 00:00:00 UTC", "finished_utc": "2000-01-01 00:10:00 UTC",
            "machine": {"cpu": "Fixture CPU", "logical_cpus": 3, "os": "FixtureOS 1", "python": "3.x",
                        "numpy": "9.9", "torch": None},
            "load_average_start": [0.5, 0.4, 0.3], "load_average_end": [7.25, 1, 1],
            "runs": [{"command": c, "started_utc": "x", "seconds": 1.0, "load_average_start": [2.0, 0, 0],
                      "load_average_end": [3.0, 0, 0], "output": out} for c, out in runs]}


def _planner_row(policy: str, model: str, ep: int, **values) -> dict:
    row = {"policy": policy, "model": model, "ep": ep, "micro_batches": 32, "layers": 58, "step_plan_s": 1.234,
           "step_plan_cpu_s": 0.987, "replication_cpu_us_per_microbatch_layer": 13.25, "reorder_cpu_s": 0.5,
           "flow_cpu_s": 0.06, "peak_MB": 134.4, "plan_MB": 19.13, "validate_s": 0.25, "validate_cpu_s": 0.24,
           "mean_skewness": 1.01234, "mean_gap_to_bound": 0.00017}
    return {**row, **values}


def test_tables_render_the_record_values(tmp_path):
    models = _record("planner-models", [
        ("relibra bench planner --model qwen3-30b-a3b --ep 16", {"results": [
            _planner_row("megatron", "qwen3-30b-a3b", 16, mean_skewness=1.8543, step_plan_cpu_s=0.001),
            _planner_row("relibra", "qwen3-30b-a3b", 16, mean_skewness=1.0104, mean_gap_to_bound=0.000234)]}),
        ("relibra bench planner --model glm-4.5-air --ep 32", {"results": [
            _planner_row("relibra", "glm-4.5-air", 32, mean_skewness=1.0171, step_plan_cpu_s=0.229)]})])
    speed = _record("planner-speed", [("relibra bench planner --model deepseek-v3 --ep 256 --cluster paper,nodes=32",
                                       {"results": [_planner_row("relibra", "deepseek-v3", 256),
                                                    _planner_row("relibra-h", "deepseek-v3", 256,
                                                                 replication_cpu_us_per_microbatch_layer=853.4,
                                                                 mean_skewness=1.0273)]})])
    scale = _record("planner-scale", [("relibra bench planner --model kimi-k2 --ep 192 --cluster paper,nodes=24",
                                       {"results": [_planner_row("relibra", "kimi-k2", 192, mean_skewness=1.137),
                                                    _planner_row("relibra-h", "kimi-k2", 192)]})])
    for r in (models, speed, scale):
        rec.write_record(r, tmp_path / f"{r['name']}.json")

    skew = dt.render_table("planner-skewness", tmp_path).splitlines()
    assert skew[0] == "| policy | 30B EP16 | GLM-Air EP32 |"
    assert skew[2:4] == ["| `megatron` | 1.854 | - |", "| `relibra` | 1.010 | 1.017 |"]
    gap = dt.render_table("planner-gap", tmp_path).splitlines()
    assert gap[3] == "| `relibra` | 0.02% | 0.02% |"
    assert dt.render_table("planner-cpu", tmp_path).splitlines()[3] == "| `relibra` | 0.99 | 0.23 |"
    # provenance: record, command, dates, machine, and the 1-min load average over the record and its runs
    last = dt.render_table("planner-cpu", tmp_path).splitlines()[-1]
    assert last == ("Measured by `relibra bench record planner-models` (data/bench/planner-models.json), "
                    "2000-01-01 00:00:00 UTC to 2000-01-01 00:10:00 UTC, on Fixture CPU (3 logical CPUs, FixtureOS 1; "
                    "Python 3.x, numpy 9.9, torch None); 1-minute load average 0.5-7.2 during the runs.")
    assert dt.render_table("planner-speed", tmp_path).splitlines()[3] == (
        "| 256 | `relibra-h` | 32 x 58 | 1.23 / 0.99 | 853.4 | 134 | 19.1 | 0.25 / 0.24 | 1.0273 |")
    both = dt.render_table("planner-scale", tmp_path).splitlines()
    # sorted by EP; the cluster comes from each run's command; two provenance lines (both records)
    assert both[2].startswith("| kimi-k2, EP192, `paper,nodes=24` | 32 x 58 | 1.23 / 0.99 | 13.2 | 0.50 / 0.06 |")
    assert both[2].endswith("| 1.137 -> 1.012 |") and both[3].startswith("| deepseek-v3, EP256, `paper,nodes=32`")
    assert sum(line.startswith("Measured by") for line in both) == 2
    with pytest.raises(ConfigError, match=r"sim-speed\.json: missing; run `relibra bench record sim-speed`"):
        dt.render_table("sim-speed", tmp_path)


def test_markers_are_replaced_and_bad_markers_named(tmp_path):
    rec.write_record(_record("workload-scale", [("relibra bench workload", {"results": [
        {"model": "deepseek-v3", "ep": 256, "micro_batches": 32, "tokens_per_rank": 16512, "load_cells": 243_000_000,
         "seconds": 54.04, "cpu_seconds": 18.44, "static_skewness": 9.4567}]})]), tmp_path / "workload-scale.json")
    docs = tmp_path / "docs"
    docs.mkdir()
    page = docs / "page.md"
    page.write_text("# T\n\ntext\n<!-- table:workload-scale begin -->\n| typed | 1 |\n"
                    "<!-- table:workload-scale end -->\nafter\n")
    assert dt.update_docs(docs, tmp_path, check=True) == [f"{page}: workload-scale"]
    assert "typed" in page.read_text()  # --check changes nothing
    assert dt.main(["--check", "--docs", str(docs), "--records", str(tmp_path)]) == 1
    assert dt.update_docs(docs, tmp_path) == [f"{page}: workload-scale"]
    text = page.read_text()
    assert text.startswith("# T\n\ntext\n<!-- table:workload-scale begin -->\n| model, EP |")
    assert "| deepseek-v3, EP256 | 32 | 16,512 | 243 M | 54.0 | 18.4 | 9.46 |" in text
    assert text.endswith("during the runs.\n<!-- table:workload-scale end -->\nafter\n")
    assert dt.update_docs(docs, tmp_path, check=True) == []
    for bad, message in (("<!-- table:nope begin -->\n<!-- table:nope end -->\n", "unknown docs table 'nope'"),
                         ("<!-- table:sim-speed begin -->\n", "block 'sim-speed' has no end marker"),
                         ("<!-- table:sim-speed end -->\n", "end marker of block 'sim-speed' without")):
        page.write_text(bad)
        with pytest.raises(ConfigError, match=message):
            dt.update_docs(docs, tmp_path, check=True)


def test_bench_record_runs_its_commands_and_writes_the_record(tmp_path, monkeypatch, capsys):
    """`relibra bench record` on a one-command record of a tiny model: the command's own JSON, kept whole."""
    argv = ("bench", "planner", "--model", "tiny", "--ep", "4", "--cluster", "paper", "--policies", "megatron",
            "--micro-batches", "2", "--json")
    monkeypatch.setattr(rec, "RECORDS", (rec.RecordSpec("tiny-check", "fixture: a tiny plan", (argv,)),))
    assert cli_main(["bench", "record", "tiny-check", "--out-dir", str(tmp_path)]) == 0
    record = rec.load_record("tiny-check", tmp_path)
    assert record["runs"][0]["command"] == "relibra " + " ".join(argv)
    (row,) = record["runs"][0]["output"]["results"]
    assert row["policy"] == "megatron" and row["model"] == "tiny" and row["ep"] == 4 and row["micro_batches"] == 2
    assert record["machine"]["numpy"] and record["finished_utc"] >= record["started_utc"]
    assert not list(tmp_path.glob(".*partial*"))  # written through a temporary name
    capsys.readouterr()
    assert cli_main(["bench", "record", "--out-dir", str(tmp_path)]) == 2
    assert "give record names or --all" in capsys.readouterr().err
    assert cli_main(["bench", "record", "nope"]) == 2
    assert "unknown benchmark record 'nope'; records: tiny-check" in capsys.readouterr().err
    (tmp_path / "broken.json").write_text(json.dumps({"name": "broken"}))
    with pytest.raises(ConfigError, match=r"broken\.json: has no 'command'; run `relibra bench record broken`"):
        rec.load_record("broken", tmp_path)


def test_planner_warm_up_trace_is_the_first_cell_of_every_step():
    """The warm-up plan `relibra bench planner` makes before each timed plan reads one (micro-batch, layer)
    cell of every step, so history-based policies warm up on the same steps."""
    import numpy as np

    from relibra.bench.planner import warm_up_trace
    from relibra.workloads import generate_trace

    trace = generate_trace("tiny", "mixed", 4, steps=3, seed=0, micro_batches=2)
    warm = warm_up_trace(trace)
    assert warm.loads.shape == (3, 1, 1, 4, trace.num_experts) and warm.model.num_layers == 1
    assert np.array_equal(warm.loads, trace.loads[:, :1, :1])
    assert warm.seq_lens is None or np.array_equal(warm.seq_lens, trace.seq_lens[:, :1])


def test_simulated_records_say_so_and_render_their_rows(tmp_path):
    """A simulated record's tables end with "Simulated by" and no load average; its rows are the
    command's own (fixture numbers)."""
    def row(policy, speedup, frac, skew):
        return {"policy": policy, "speedup_vs_megatron": speedup, "frac_of_balanced": frac, "skewness": skew}

    record = _record("rl-trace-sim", [("relibra simulate --trace t.npz --cluster cpu-gloo --steps 8 --json", {
        "config": {"cluster": "cpu-gloo"}, "results": [row("megatron", 1.0, 0.9512, 1.414), row("relibra", 1.0421, 0.9917, 1.036)]})])
    rec.write_record(record, tmp_path / "rl-trace-sim.json")
    lines = dt.render_table("rl-trace-sim", tmp_path).splitlines()
    assert lines[3] == "| `cpu-gloo` | `relibra` | 1.042 | 0.992 | 1.04 |"
    assert lines[-1].startswith("Simulated by `relibra bench record rl-trace-sim` (data/bench/rl-trace-sim.json), "
                                "2000-01-01 00:00:00 UTC, on Fixture CPU") and "load average" not in lines[-1]
    assert rec.get_record_spec("rl-trace-sim").kind == "simulated" and rec.get_record_spec("sim-speed").kind == "measured"
    with pytest.raises(ConfigError, match="kind 'guessed' is none of measured, simulated, computed"):
        rec.RecordSpec("x", "fixture", (), kind="guessed")


def test_data_file_tables_name_their_file_machine_and_date():
    """The runtime table comes from data/runtime_measured.json: one row per `relibra run` launch, and the
    file's own date and machine in its last line."""
    lines = dt.render_table("runtime-measured").splitlines()
    data = dt.load_data_file("runtime-measured")
    launches = [r for r in data["runs"] if r.get("results")]
    assert len([x for x in lines if x.startswith("| 1 node") or x.startswith("| 2 nodes")]) == len(launches)
    assert lines[-1].startswith("Measured by `.venv/bin/python scripts/measure_runtime.py") and data["date"] in lines[-1]
