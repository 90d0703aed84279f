"""Set-up cards against their schema (relibra.setup_schema): every entry has a bound with a reason, a value
outside it, a broken cross-entry check, an unreadable card file or a bad JSON number ends in one `error:`
line naming the file and the entry, with exit code 2 and no traceback, in every command that reads it.
Then a hypothesis property test: random values within and beyond each numeric entry's bound of the
shipped cards are either refused in one line or simulated at a tiny size with finite results."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relibra import setups
from relibra.cli import main
from relibra.errors import ConfigError
from relibra.paths import project_root
from relibra.experiments import get_notebook
from relibra.setup_schema import BOUNDS, BY_KEY
from relibra.setups import DEFAULT_CARD, card_names, load_card
from relibra.sim import simulate
from relibra.workloads import DOMAINS, generate_trace

# A tiny simulation of a card: 4 EP ranks of the `tiny` model, 2 micro-batches of 64 tokens per rank.
TINY_SIM = ["--model", "tiny", "--workload", "math", "--ep", "4", "--steps", "1", "--warmup-steps", "0",
            "--micro-batches", "2", "--tokens-per-rank", "64"]


def toml_value(v) -> str:
    """One TOML value: true/false, a quoted string, an inline table, inf/nan, an int or a float."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return repr(v)


def write_card(directory, name: str, changes: dict, base: str = DEFAULT_CARD, ranges: dict | None = None) -> str:
    """A card over `base` with the entries of `changes` {key: value}: each keeps the base entry's unit, kind and
    range (ranges {key: (low, high)} replaces it), so only the value moves."""
    base_card = load_card(base)
    text = f'base = "{base}"\n'
    for key, value in changes.items():
        old = base_card.entries.get(key)
        rng = (ranges or {}).get(key, old.range if old is not None else None)
        text += (f"[{key}]\nvalue = {toml_value(value)}\nunit = {json.dumps(old.unit if old else '')}\n"
                 f'kind = "{old.kind if old else "published"}"\nsource = "test"\n')
        if rng is not None:
            text += f"range = [{toml_value(rng[0])}, {toml_value(rng[1])}]\n"
    path = Path(directory) / f"{name}.toml"
    path.write_text(text)
    return str(path)


def cli(capsys, argv) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(rc: int, err: str) -> str:
    """The single `error:` line of a refused command (exit code 2, no traceback)."""
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def refused_everywhere(capsys, path: str) -> str:
    """`setup show`, `simulate`, `sensitivity` and the card-taking notebooks (02, 10) refuse the card with the
    same line; returns it."""
    line = one_error_line(*cli(capsys, ["setup", "show", path])[::2])
    assert one_error_line(*cli(capsys, ["simulate", "--setup", path, *TINY_SIM, "--policies", "megatron"])[::2]) == line
    assert one_error_line(*cli(capsys, ["sensitivity", "--model", "tiny", "--ep", "4", "--setup", path, "--quick",
                                        "--knobs", "RDMA rate"])[::2]) == line
    for notebook in ("02_throughput", "10_sensitivity"):
        with pytest.raises(ConfigError) as info:
            get_notebook(notebook).create(profile="tiny", setup=path)
        # the notebook's Params name the notebook and the parameter, then give load_card's own words
        assert str(info.value).startswith(f"{notebook}: setup must be ")
        assert line.removeprefix("error: ") in str(info.value)
    return line


# ---- the schema itself ---------------------------------------------------------------------------
_KINDS = {int: "int", bool: "bool", str: "choice", dict: "lengths", (int, float): "number"}


def test_every_card_entry_has_a_bound_with_a_reason():
    assert set(setups._SCHEMA) <= set(BY_KEY), f"entries without a bound row: {set(setups._SCHEMA) - set(BY_KEY)}"
    for key, expected in setups._SCHEMA.items():
        assert BY_KEY[key].kind == _KINDS[expected], key
    for bound in BOUNDS:
        assert bound.reason.strip() and "\n" not in bound.reason, bound.key
        if bound.kind in ("int", "number"):
            assert math.isfinite(bound.low) and math.isfinite(bound.high) and bound.low < bound.high, bound.key
    for name in card_names():  # every shipped value and sweep range inside its bound
        load_card(name)


def test_an_entry_without_a_bound_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(setups._SCHEMA, "batch.colour_index", int)
    path = tmp_path / "new.toml"
    path.write_text(f'base = "{DEFAULT_CARD}"\n[batch.colour_index]\nvalue = 3\nunit = ""\nkind = "published"\n'
                    f'source = "s"\n')
    line = one_error_line(*cli(capsys, ["setup", "show", str(path)])[::2])
    assert f"set-up card {path}: no bound declared for entry 'batch.colour_index'" in line


def test_docs_table_is_the_schema():
    from relibra.bench.docs_tables import rendered_text

    doc = (project_root() / "docs" / "setup.md").read_text()
    assert rendered_text(doc, "docs/setup.md") == doc, \
        "docs/setup.md's bounds table is stale: run python -m relibra.bench.docs_tables"
    assert all(f"`{b.key}`" in doc for b in BOUNDS if b.kind != "lengths")


# ---- family 1: values outside their bound (the cases a new user tried) ---------------------------
MATH = {"prompt_median": 180, "prompt_sigma": 0.5, "response_median": 3000, "response_sigma": 0.9}


@pytest.mark.parametrize("key, value, bound", [
    ("cluster.rdma_GBps", math.inf, "inf is outside [0.01, 400] GB/s"),
    ("cluster.rdma_GBps", 1e308, "1e+308 is outside [0.01, 400] GB/s"),
    ("cluster.rdma_GBps", 1e-300, "1e-300 is outside [0.01, 400] GB/s"),
    ("cluster.rdma_GBps", math.nan, "nan is outside [0.01, 400] GB/s"),
    ("compute.matmul_tflops", math.inf, "inf is outside [0.001, 10000] TFLOP/s"),
    ("calibration.megatron_skewness_min", math.inf, "inf is outside [1, 512]"),
    ("lengths.math", {**MATH, "response_sigma": math.inf}, "field 'response_sigma' = inf is outside (0, 3]"),
    ("lengths.math", {**MATH, "response_sigma": 50}, "field 'response_sigma' = 50 is outside (0, 3]"),
    ("cluster.num_nodes", 10**12, "1000000000000 is outside [1, 16384] nodes"),
    ("cluster.gpus_per_node", 10**12, "1000000000000 is outside [1, 576] GPUs"),
    ("batch.data_parallel_size", 10**6, "1000000 is outside [1, 131072] ranks"),
    ("batch.responses_per_prompt", 10**5, "100000 is outside [1, 1024] sequences"),
    ("lengths.max_sequence_tokens", 10**11, "100000000000 is outside [2, 1048576] tokens"),
    ("compute.attention_efficiency", 5.0, "5.0 is outside (0, 1]"),
    ("cluster.num_nodes", 20.0, "value 20.0 has the wrong type"),
    ("cluster.rdma_GBps", 10**400, "1000000000...000000 (401 digits) is outside [0.01, 400] GB/s"),
])
def test_values_outside_their_bound(tmp_path, capsys, key, value, bound):
    path = write_card(tmp_path, "bad", {key: value})
    line = refused_everywhere(capsys, path)
    assert f"set-up card {path}: entry {key!r}" in line and bound in line


def test_a_command_line_value_outside_its_bound(capsys):
    line = one_error_line(*cli(capsys, ["simulate", *TINY_SIM, "--tokens-per-microbatch", "10000000"])[::2])
    assert line.startswith(f"error: set-up card {load_card(DEFAULT_CARD).path} with command line "
                           f"(--tokens-per-microbatch): entry 'batch.tokens_per_gpu_per_microbatch' = 10000000 is "
                           f"outside [1, 1048576] tokens")


def test_a_card_inside_its_bounds_runs_everywhere(tmp_path, capsys):
    path = write_card(tmp_path, "good", {"cluster.rdma_GBps": 25.0})
    assert cli(capsys, ["setup", "show", path])[0] == 0
    rc, out, err = cli(capsys, ["simulate", "--setup", path, *TINY_SIM, "--policies", "megatron", "--json"])
    assert rc == 0, err
    assert json.loads(out)["results"]
    params, _ = get_notebook("02_throughput").create(profile="tiny", setup=path)
    assert params.setup.value("cluster.rdma_GBps") == 25.0


def test_the_generator_counts_the_lengths_it_cuts():
    from relibra.workloads import WorkloadConfig

    cfg = WorkloadConfig(batch_layout="verl-balance", global_batch_sequences=64, responses_per_prompt=8,
                         max_sequence_tokens=600)  # below the math median: most are cut
    trace = generate_trace("tiny", "math", 4, steps=1, micro_batches=2, config=cfg)
    lengths = trace.seq_lens[trace.seq_lens > 0]
    assert lengths.size == 64 and lengths.max() == 600
    assert trace.provenance["sequences_capped"] == int((lengths == 600).sum()) > 16
    assert trace.provenance["sequences_floored"] == 0
    wide = generate_trace("tiny", "math", 4, steps=1, micro_batches=2, config=WorkloadConfig(
        batch_layout="verl-balance", global_batch_sequences=64, responses_per_prompt=8, max_sequence_tokens=10**6))
    assert wide.provenance["sequences_capped"] == 0


# ---- family 2: cross-entry checks ----------------------------------------------------------------
@pytest.mark.parametrize("changes, ranges, names", [
    ({"batch.data_parallel_size": 2000}, None,
     "entry 'batch.data_parallel_size' = 2000 is above 'batch.global_batch_sequences' = 1024"),
    ({"batch.responses_per_prompt": 7}, None,
     "entry 'batch.responses_per_prompt' = 7 does not divide 'batch.global_batch_sequences' = 1024"),
    ({"batch.global_batch_sequences": 4096, "lengths.max_sequence_tokens": 1048576}, None,
     "'batch.global_batch_sequences' x 'lengths.max_sequence_tokens' = 4096 x 1048576"),
    ({"lengths.max_sequence_tokens": 100}, None,
     "prompt_median + response_median = {median:g} is above 'lengths.max_sequence_tokens' = 100"),
    ({"cluster.num_nodes": 2}, None, "'batch.tensor_parallel' x 'batch.pipeline_parallel' = 32 x 1 x 1 x 1 = 32 GPUs, "
                                     "above the 2 x 8 = 16 GPUs"),
    ({"batch.data_parallel_size": 32}, {"batch.data_parallel_size": (16, 2000)},
     "(at the end 2000 of batch.data_parallel_size's sweep range)"),
    ({"compute.attention_efficiency": 0.7}, {"compute.attention_efficiency": (0.5, 1.5)},
     "entry 'compute.attention_efficiency' range end = 1.5 is outside (0, 1]"),
])
def test_cross_entry_checks(tmp_path, capsys, changes, ranges, names):
    path = write_card(tmp_path, "cross", changes, ranges=ranges)
    line = refused_everywhere(capsys, path)
    first = next(d for d in DOMAINS if sum(load_card(DEFAULT_CARD).value(f"lengths.{d}")[k]
                                           for k in ("prompt_median", "response_median")) > 100)
    lengths = load_card(DEFAULT_CARD).value(f"lengths.{first}")
    names = names.replace("{median:g}", f"{lengths['prompt_median'] + lengths['response_median']:g}")
    assert f"set-up card {path}: " in line and names in line


def test_parallel_sizes_fit_the_cluster_and_megatrons_groups(tmp_path, capsys, monkeypatch):
    for key in ("batch.context_parallel", "batch.pipeline_parallel", "batch.expert_parallel"):
        monkeypatch.setitem(setups._SCHEMA, key, int)
    sizes = {"batch.context_parallel": 1, "batch.pipeline_parallel": 1, "batch.expert_parallel": 32}
    assert load_card(write_card(tmp_path, "ok", sizes)).value("batch.expert_parallel") == 32
    line = refused_everywhere(capsys, write_card(tmp_path, "pp", {**sizes, "batch.pipeline_parallel": 8}))
    assert "= 32 x 1 x 1 x 8 = 256 GPUs, above the 20 x 8 = 160 GPUs of the card's cluster" in line
    line = refused_everywhere(capsys, write_card(tmp_path, "ep", {**sizes, "batch.expert_parallel": 24}))
    assert "entry 'batch.expert_parallel' = 24 does not divide 'batch.data_parallel_size' x 'batch.context_parallel' " \
           "x 'batch.tensor_parallel' = 32 x 1 x 1 = 32" in line
    line = refused_everywhere(capsys, write_card(tmp_path, "big", {**sizes, "batch.expert_parallel": 1024}))
    assert "entry 'batch.expert_parallel' = 1024 is outside [1, 512] ranks" in line


def test_the_ep_size_must_fit_the_cards_cluster(capsys):
    line = one_error_line(*cli(capsys, ["simulate", "--model", "tiny", "--workload", "math", "--ep", "256",
                                        "--steps", "1"])[::2])
    paper = load_card(DEFAULT_CARD).path
    assert line == (f"error: set-up card {paper}: EP 256 does not fit the card's cluster of 'cluster.num_nodes' x "
                    f"'cluster.gpus_per_node' = 20 x 8 = 160 GPUs")
    assert one_error_line(*cli(capsys, ["sensitivity", "--model", "tiny", "--ep", "256", "--quick"])[::2]) == line


# ---- family 3: card files read safely ------------------------------------------------------------
def test_unreadable_card_files(tmp_path, capsys):
    bad = tmp_path / "latin1.toml"
    head = f'base = "{DEFAULT_CARD}"\n# caf'.encode()
    bad.write_bytes(head + b'\xe9 comment\n')
    assert refused_everywhere(capsys, str(bad)) == (f"error: set-up card {bad}: not UTF-8 text (byte {len(head)}, "
                                                    f"line 2); TOML is UTF-8")
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text(f'base = "{b}"\n')
    b.write_text(f'base = "{a}"\n')
    assert refused_everywhere(capsys, str(a)) == (f"error: set-up card {a}: its base chain comes back to a card it "
                                                  f"already read: {a} -> {b} -> {a}")
    chain = [tmp_path / f"c{i}.toml" for i in range(6)]
    for i, p in enumerate(chain):
        p.write_text(f'base = "{chain[i + 1]}"\n' if i + 1 < len(chain) else f'base = "{DEFAULT_CARD}"\n')
    line = refused_everywhere(capsys, str(chain[0]))
    assert line == (f"error: set-up card {chain[0]}: its base chain is longer than {setups.MAX_BASE_DEPTH} cards: "
                    + " -> ".join(map(str, chain[:setups.MAX_BASE_DEPTH + 1])))
    deep = tmp_path / "deep.toml"
    deep.write_text(f'base = "{DEFAULT_CARD}"\n[cluster.rdma_GBps]\nvalue = ' + "[" * 5000 + "]" * 5000 + '\n')
    assert refused_everywhere(capsys, str(deep)) == (f"error: set-up card {deep}: values nested too deeply to read "
                                                     f"(a card's values nest at most two levels)")


# ---- family 4: JSON numbers in every importer ----------------------------------------------------
def _jsonl_record(layer_index, **changes) -> str:
    rec = {"step": 0, "stage": "pre_dispatch", "block": "decoder", "layer": layer_index, "rank": 0, "num_tokens": 2,
           "topk": 2, "top_indices": [[0, 1], [2, 3]]}
    text = json.dumps({**rec, **{k: v for k, v in changes.items() if not isinstance(v, str)}})
    for k, raw in changes.items():  # raw JSON text, e.g. a 5000-digit integer
        if isinstance(raw, str):
            text = text.replace(f'"{k}": {json.dumps(rec[k])}', f'"{k}": {raw}')
    return text


@pytest.mark.parametrize("changes, message", [
    ({"step": "9" * 5000}, "line 3: at column 10: 999999999999...999999 is an integer of 5000 digits, more than any "
                           "count or id (4300 at most)"),
    ({"num_tokens": -2}, "line 3: field 'num_tokens' is -2, a negative count"),
    ({"step": 1.0}, "line 3: field 'step' is 1.0, not an integer count"),
    ({"rank": 2**70}, "line 3: field 'rank' is 1180591620717411303424, above 9223372036854775807: past int64"),
    ({"layer": 9}, "line 3: field 'layer' is 9, beyond the decoder layers of model 'tiny' (indices 0..3"),
    ({"top_indices": "[[0, 1], [2, 1e400]]"}, "line 3: at column {column}: 1e400 is a number too large for a float"),
])
def test_megatron_jsonl_numbers(tmp_path, capsys, changes, message):
    path = tmp_path / "router_trace_rank0.jsonl"
    lines = [_jsonl_record(layer) for layer in range(4)]
    lines[2] = _jsonl_record(2, **changes)
    path.write_text("\n".join(lines) + "\n")
    line = one_error_line(*cli(capsys, ["trace", "import", "--format", "megatron-jsonl", str(path), "--out",
                                        str(tmp_path / "t.npz"), "--model", "tiny", "--ep", "1"])[::2])
    message = message.replace("{column}", str(lines[2].find("1e400") + 1))
    assert line.startswith(f"error: {path}: ") and message in line, line


def _sglang_response(prompt="3", completion="2") -> str:
    routes = np.array([[[0, 1]] * 4] * 4, dtype=np.int32)  # 3 + 2 - 1 rows, 4 layers, top-2
    b64 = base64.b64encode(routes.tobytes()).decode()
    return f'{{"text": "x",\n "meta_info": {{"prompt_tokens": {prompt},\n  "completion_tokens": {completion},\n' \
           f'  "routed_experts": "{b64}"}}}}'


@pytest.mark.parametrize("prompt, message", [
    ("-3", "field 'prompt_tokens' is -3, a negative count"),
    ("3.5", "field 'prompt_tokens' is 3.5, not an integer count"),
    ("1" * 4400, "at line 2, column 33: 111111111111...111111 is an integer of 4400 digits"),
])
def test_sglang_numbers(tmp_path, capsys, prompt, message):
    path = tmp_path / "step0.json"
    path.write_text(_sglang_response(prompt=prompt))
    line = one_error_line(*cli(capsys, ["trace", "import", "--format", "sglang", str(path), "--out",
                                        str(tmp_path / "t.npz"), "--model", "tiny", "--ep", "1"])[::2])
    assert line.startswith(f"error: {path}") and message in line, line


@pytest.mark.parametrize("fmt, ids_name, len_name", [("vllm", "routed_experts_", "num_tokens_"),
                                                      ("slime", "rollout_routed_experts_", "num_tokens_")])
@pytest.mark.parametrize("length, message", [(np.array(-5), "is -5, a negative count"),
                                             (np.array(5.0), "is 5.0, not an integer count")])
def test_per_sample_npz_counts(tmp_path, capsys, fmt, ids_name, len_name, length, message):
    path = tmp_path / "step0.npz"
    np.savez(path, **{f"{ids_name}0": np.zeros((4, 4, 2), np.int32) + np.array([0, 1], np.int32),
                      f"{len_name}0": length})
    line = one_error_line(*cli(capsys, ["trace", "import", "--format", fmt, str(path), "--out",
                                        str(tmp_path / "t.npz"), "--model", "tiny", "--ep", "1"])[::2])
    assert line == f"error: {path}: field '{len_name}0' {message}", line


def test_verl_ids_beyond_the_experts(tmp_path, capsys):
    ids = np.zeros((2, 3, 4, 2), np.int16) + np.array([0, 1], np.int16)
    ids[1, 2, 3, 1] = 99
    path = tmp_path / "step0.npz"
    np.savez(path, routed_experts=ids, attention_mask=np.ones((2, 3), np.int64))
    line = one_error_line(*cli(capsys, ["trace", "import", "--format", "verl", str(path), "--out",
                                        str(tmp_path / "t.npz"), "--model", "tiny", "--ep", "1"])[::2])
    assert line == (f"error: {path}: field 'routed_experts' at [sequence=1, position=2, layer=3, k=1] holds an "
                    f"expert id 99, outside [0, 16)")


def test_trace_meta_with_a_huge_integer(tmp_path, capsys):
    from relibra.trace import RoutingTrace

    trace = generate_trace("tiny", "math", 2, steps=1, micro_batches=1, tokens_per_rank=16)
    trace.save(tmp_path / "t.npz")
    arrays = dict(np.load(tmp_path / "t.npz", allow_pickle=False))
    meta = str(arrays["meta_json"].item()).replace('"seed": 0', '"seed": ' + "7" * 5000, 1)
    np.savez(tmp_path / "huge.npz", **{**arrays, "meta_json": np.array(meta)})
    line = one_error_line(*cli(capsys, ["trace", "stats", str(tmp_path / "huge.npz")])[::2])
    assert line.startswith(f"error: {tmp_path / 'huge.npz'}: field 'meta_json': at column ") and \
        "is an integer of 5000 digits" in line
    assert RoutingTrace.load(tmp_path / "t.npz").provenance["sequences_capped"] >= 0


# ---- the property test: random values within and beyond every numeric entry's bound ---------------
def _numeric_targets() -> list[tuple[str, str, str | None]]:
    """(card, entry, lengths field or None) of every numeric entry of the shipped cards."""
    out = []
    for name in card_names():
        card = load_card(name)
        for key in card.entries:
            bound = BY_KEY[key]
            if bound.kind in ("int", "number"):
                out.append((name, key, None))
            elif bound.kind == "lengths":
                out += [(name, key, f.key) for f in bound.fields]
    return out


TARGETS = _numeric_targets()
COUNTS = {"tried": 0, "accepted": 0, "refused": 0, "naming the mutated entry": 0}


def _values(bound):
    """Values within, at and beyond `bound`, of its type and of the wrong one."""
    low, high = bound.low, bound.high
    if bound.kind == "int":
        inside = st.integers(int(low), int(high))
        beyond = st.one_of(st.integers(int(high) + 1, int(high) * 1000 + 10), st.integers(-10, int(low) - 1),
                           st.sampled_from([10**12, 10**20, -2**63, 10**400]))
        wrong = st.sampled_from([float(low), 0.5])
    else:
        lo = max(low, 1e-12)
        inside = st.floats(math.log10(lo), math.log10(high)).map(lambda e: min(max(10.0 ** e, lo), high))
        beyond = st.one_of(st.floats(1.0001, 1e6).map(lambda f: high * f), st.floats(1.0001, 1e6).map(lambda f: lo / f),
                           st.sampled_from([0.0, -1.0, math.inf, -math.inf, math.nan, 1e308, 1e-300, 10**400]))
        wrong = st.sampled_from([True, "1.0"])
    return st.one_of(inside, inside, beyond, wrong)


@st.composite
def _mutations(draw):
    name, key, field = draw(st.sampled_from(TARGETS))
    bound = BY_KEY[key]
    if field is not None:
        bound = next(f for f in bound.fields if f.key == field)
    value = draw(_values(bound))
    if field is not None:
        value = {**load_card(name).value(key), field: value}
    return name, key, value


def _finite_results(card) -> list[str]:
    """Cells of a tiny simulation of `card` that are nan or inf (balanced-compute has no planner: its plan_s and
    gap_to_bound are nan by design)."""
    # the tiny model's EP 4 group holds whole CP x TP splits only where they divide it (else whole sequences)
    cfg = card.workload_config()
    split = cfg.context_parallel * cfg.tensor_parallel
    if 4 % split:
        cfg, split = dataclasses.replace(cfg, context_parallel=1, tensor_parallel=1), 1
    trace = generate_trace("tiny", "math", 4, steps=1, micro_batches=2, tokens_per_rank=64, config=cfg)
    assert all(v >= 0 for k, v in trace.provenance.items() if k.startswith("sequences_"))
    params = card.policy_params(["relibra"])
    params["relibra"].update(iterations=60, min_replica_tokens=1)
    pp = card.value("batch.pipeline_parallel")  # the card's layer split is its model's; the tiny model's 4 layers
    pipeline = dict(pipeline_stages=pp if 4 % pp == 0 else 1, last_stage_layers=None, virtual_stages=1,
                    sequence_split=split)
    result = simulate(trace, card.topology(), ["relibra"], params=card.cost_params(4, **pipeline), policy_params=params,
                      progress=False)
    bad = []
    for row in result.summary.to_dict(orient="records"):
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
                if not (row["policy"] == "balanced-compute" and k in ("plan_s", "gap_to_bound")):
                    bad.append(f"{row['policy']}.{k}={v}")
    return bad


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(_mutations())
def test_mutated_cards_are_refused_in_one_line_or_simulate_finitely(mutation):
    name, key, value = mutation
    COUNTS["tried"] += 1
    with tempfile.TemporaryDirectory() as d:
        path = write_card(d, "mutated", {key: value}, base=name)
        try:
            card = load_card(path)
        except ConfigError as exc:
            COUNTS["refused"] += 1
            text = str(exc)
            # one line naming the card and an entry (the mutated one, or the entry a check derives from it)
            assert "\n" not in text and text.startswith(f"set-up card {path}"), text
            assert any(k in text for k in BY_KEY), text
            COUNTS["naming the mutated entry"] += key in text
            return
        COUNTS["accepted"] += 1
        assert card.value(key) == value
        bad = _finite_results(card)
        assert not bad, f"{key} = {value!r}: {bad}"


def test_property_counts():
    """Runs after the property test (file order): it tried mutations and both outcomes happened."""
    print(f"\nmutated card entries: tried {COUNTS['tried']}, accepted {COUNTS['accepted']}, "
          f"refused {COUNTS['refused']} ({COUNTS['naming the mutated entry']} naming the mutated entry; "
          f"{len(TARGETS)} numeric entries of {len(card_names())} cards)")
    if COUNTS["tried"]:  # the property test ran in this pytest run
        assert COUNTS["accepted"] > 0 and COUNTS["refused"] > 0 and \
            COUNTS["tried"] == COUNTS["accepted"] + COUNTS["refused"]
