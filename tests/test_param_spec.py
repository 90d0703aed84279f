"""One parameter spec: a declared parameter (field, Kind, bounds, doc) makes the notebook's Params, the
command-line flag (type= from the Kind, help from the doc) and the docs' table; every bad command-line
value is one `error:` line, exit 2, before any work."""

from __future__ import annotations

import argparse
import math
import re

import pytest

from relibra.cli import build_parser, main
from relibra.errors import ConfigError
from relibra.experiments import project_root
from relibra.studies.params import flag_help, floats, integer, integers, names, number
from relibra.experiments.registry import get_notebook


def _parsers(parser, prog="relibra"):
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


def _options(parser):
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_declared_flag_has_its_declared_doc_as_help():
    declared = 0
    for _, parser in _parsers(build_parser()):
        for action in _options(parser):
            if hasattr(action, "declared"):
                params, name, default = action.declared
                assert action.help == flag_help(params, name, default), action.option_strings
                declared += 1
    assert declared >= 40


@pytest.mark.parametrize("command", ["relibra map", "relibra sensitivity", "relibra trace calibrate",
                                     "relibra routing compare"])
def test_every_flag_of_these_commands_is_declared(command):
    parser = dict(_parsers(build_parser()))[command]
    loose = [a.option_strings for a in _options(parser) if not hasattr(a, "declared")]
    assert loose in ([], [["--json"]], [["--rl-trace"], ["--trace"], ["--public"], ["--json"]]), loose


def test_map_axes_are_notebook_12s_parameters():
    """`relibra map --tokens` and notebook 12's `tokens` are one declaration: the flag's help is the doc."""
    nb = get_notebook("12_verdict_map").Params
    parser = dict(_parsers(build_parser()))["relibra map"]
    helps = {a.option_strings[0]: a.help for a in _options(parser)}
    for field, flag in (("tokens", "--tokens"), ("shift", "--shift-values"), ("seeds", "--seeds")):
        doc = next(f.metadata["doc"] for f in nb.__dataclass_fields__.values() if f.name == field)
        assert helps[flag].startswith(re.sub(r" \(None: [^)]*\)$", "", doc) + ": ")


def test_map_tokens_and_notebook_tokens_share_every_hop_below_the_parser(monkeypatch, capsys):
    """Unsorted tokens reach run_map sorted, as the notebook's do: the same Params.create and Params.spec."""
    import relibra.studies.claim_map as vm

    seen = []

    def fake_run_map(spec, workers=None, progress=True):
        seen.append(spec)
        raise ConfigError("stop here")

    monkeypatch.setattr(vm, "run_map", fake_run_map)
    assert main(["map", "--tokens", "16384,64,2048", "--shift-values", "0.3,0", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == "error: stop here"
    nb = get_notebook("12_verdict_map")
    params, grid = nb.create(profile="laptop", tokens="16384,64,2048", shift="0.3,0")
    assert seen[0] == params.spec(grid)
    assert seen[0].tokens == (64, 2048, 16384) and seen[0].shift.values == (0.0, 0.3)


def test_grid_help_and_notebook_12_markdown_say_what_the_grids_are():
    from relibra.cli.claim_map import grid_text
    from relibra.studies.claim_map import default_grid, paper_grid

    assert grid_text(default_grid()) == ("2 step sizes x 3 budgets x 3 shift values x 3 models x mixed, math x "
                                         "seeds 0, 1, 2; card points at seed 0")
    text = " ".join(line.lstrip("# ").strip() for line in
                    (project_root() / "notebooks" / "12_verdict_map.py").read_text().splitlines())
    help_text = " ".join(dict(_parsers(build_parser()))["relibra map"].format_help().split())
    for g in (default_grid(), paper_grid()):
        assert grid_text(g) in text and grid_text(g) in help_text


def test_kinds_check_lists_and_numbers():
    assert integers(1, sort=True).parse("16384,64,2048") == (64, 2048, 16384)
    assert integers(0).parse("2,0") == (2, 0)  # order kept where it does not matter
    assert floats(0, 1, sort=True).parse([0.3, 0]) == (0.0, 0.3)
    for kind, raw, why in [(integers(0), "0,0", "0 is given twice"), (integers(1), ",", "an item is empty"), (integers(1), "", "empty"), (names(("a",), "letter"), "a,", "an item is empty"),
                           (integers(1), "1,x", "not an integer: 'x'"), (floats(0, 1), "nan", "not a finite number"),
                           (floats(0, 1), "0.5,0.5", "0.5 is given twice"), (number(0, 3), math.nan, "not a finite"),
                           (number(0, 3), "inf", "not a finite"), (integer(1, 10), "11", "11 is outside 1..10"),
                           (integer(1, 10), True, "not an integer"), (names(("a", "b"), "letter"), "a,a", "given twice")]:
        with pytest.raises(ValueError, match=re.escape(why)):
            kind.parse(raw)


def test_nan_fails_a_notebook_range_check():
    with pytest.raises(ConfigError, match=r"00_tutorial: skew must be a number in \[0.0, 3.0\]; got 'nan' \(not a "
                                          r"finite number"):
        get_notebook("00_tutorial").create(skew="nan")


# ---- one test per error family: exit 2, one `error:` line naming the flag, no traceback, no work ------------
FAMILIES = [
    # not a number
    (["map", "--tokens", "abc"], "error: --tokens must be a comma-separated list of distinct integers 1..1048576; "
                                 "got 'abc' (not an integer: 'abc')"),
    (["map", "--seeds", "0,x"], "error: --seeds must be a comma-separated list of distinct integers >= 0; got '0,x' "
                                "(not an integer: 'x')"),
    (["map", "--shift-values", "abc"], "(not a number: 'abc')"),
    (["run", "--steps", "1e9"], "error: --steps must be an integer 1..1000; got '1e9'"),
    # out of range, NaN
    (["map", "--workers", "-3"], "error: --workers must be an integer 1..1024; got '-3' (-3 is outside 1..1024)"),
    (["map", "--overheads", "--ep", "0"], "error: --ep must be an integer 1..512; got '0' (0 is outside 1..512)"),
    (["map", "--shift-values", "0,nan"], "(not a finite number: 'nan')"),
    (["trace", "generate", "--model", "tiny", "--workload", "math", "--ep", "4", "--steps", "2", "--micro-batches",
      "0", "--out", "x.npz"], "error: --micro-batches must be an integer 1..4096; got '0'"),
    (["trace", "generate", "--model", "tiny", "--workload", "math", "--ep", "4", "--steps", "1000000000", "--out",
      "x.npz"], "error: --steps must be an integer 1..10000; got '1000000000'"),
    (["run", "--steps", "1000000000"], "error: --steps must be an integer 1..1000"),
    (["simulate", "--model", "tiny", "--workload", "math", "--ep", "4", "--seq-len", "99999999999999999999"],
     "error: --seq-len must be an integer 1..1048576; got '99999999999999999999'"),
    (["sensitivity", "--model", "tiny", "--ep", "4", "--layers", "1000"], "error: --layers 1000: tiny has 4 MoE "
                                                                         "layers"),
    # lists: empty, repeated
    (["trace", "calibrate", "--eps", ","], "error: --eps must be a comma-separated list of distinct integers 1..512; "
                                           "got ',' (an item is empty)"),
    (["map", "--seeds", "0,0"], "(0 is given twice)"),
    (["run", "--policies", "megatron,megatron"], "(megatron is given twice)"),
    # unknown names
    (["map", "--workloads", "mixed,poetry"], "(unknown workload 'poetry')"),
    (["rl", "--out", "x.npz", "--domains", "poetry"], "(unknown task domain 'poetry')"),
    # a flag that does not apply
    (["map", "--overheads", "--grid", "default"], "error: --overheads takes none of --grid"),
    (["map", "--overheads", "--tokens", "64", "--cards", "one-sequence"], "error: --overheads takes none of "
                                                                         "--cards, --tokens"),
    (["map", "--overheads", "--workloads", "mixed,math"], "error: --overheads simulates one workload"),
    (["map", "--setup", "one-sequence"], "error: --setup goes with --overheads only"),
    (["calibrate", "--world", "2"], "error: --world goes with --model; the cpu-gloo measurements run on 4 ranks"),
]


@pytest.mark.parametrize("argv, words", FAMILIES, ids=[" ".join(a) for a, _ in FAMILIES])
def test_a_bad_value_is_one_error_line_before_any_work(argv, words, monkeypatch, capsys, tmp_path):
    import relibra.studies.overheads
    import relibra.studies.sensitivity
    import relibra.studies.claim_map
    import relibra.workloads

    def never(*a, **k):
        raise AssertionError("work started before every value was checked")

    for module, name in ((relibra.studies.claim_map, "run_map"), (relibra.studies.overheads,
                                                                        "overhead_costs"),
                         (relibra.studies.sensitivity, "sensitivity"), (relibra.workloads, "generate_trace")):
        monkeypatch.setattr(module, name, never)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], out.err
    assert "Traceback" not in out.err + out.out


def test_rl_metrics_path_is_checked_before_the_run(tmp_path, capsys):
    (tmp_path / "m.json").mkdir()
    assert main(["rl", "--out", str(tmp_path / "t.npz"), "--metrics", str(tmp_path / "m.json")]) == 2
    assert capsys.readouterr().err.strip() == f"error: --metrics {tmp_path / 'm.json'}: is a folder; give a file name"


def test_no_comma_split_in_the_command_line():
    for path in (project_root() / "relibra" / "cli").glob("*.py"):
        assert 'split(","' not in path.read_text(), path
