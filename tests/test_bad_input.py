"""Bad input gets one clear error naming the file, field and index, never a traceback or a silent
accept. One table row per case; then a hypothesis property test that damaged
trace files give a valid trace or a TraceError, nothing else."""

import io
import json
import os
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relibra.cli import main
from relibra.cluster import get_model
from relibra.errors import ConfigError, PlanError, TraceError
from relibra.paths import check_output_path
from relibra.plan import StepPlan, empty_replicas
from relibra.trace import (RoutingTrace, check_expert_ids, expert_ids_from_json, loads_from_tokens, read_npz,
                           static_placement)

MODEL = get_model("tiny")  # 4 layers, 16 experts, top-2


def _trace(steps=3, mbs=2, ep=2, tokens_per_rank=4, seed=0) -> RoutingTrace:
    """A small valid token-level trace."""
    rng = np.random.default_rng(seed)
    n = ep * tokens_per_rank
    ids = np.argsort(rng.random((steps, mbs, n, MODEL.num_layers, MODEL.num_experts)), axis=-1)[..., :MODEL.top_k]
    src = np.broadcast_to(np.repeat(np.arange(ep), tokens_per_rank), (steps, mbs, n))
    loads = loads_from_tokens(ids, src, ep, MODEL.num_experts)
    return RoutingTrace(loads, MODEL, ep, n, {"test": True}, ids.astype(np.int16), src.astype(np.int16))


def _arrays(trace: RoutingTrace) -> dict:
    """The arrays `save` writes, as a dict to edit."""
    out = {"format_version": np.array(1, dtype=np.int64), "loads": trace.loads,
           "meta_json": np.array(json.dumps(trace.meta()))}
    if trace.token_experts is not None:
        out.update(token_experts=trace.token_experts, token_src_rank=trace.token_src_rank)
    return out


def _write(path, arrays: dict) -> str:
    """An .npz holding exactly these arrays (each written with numpy's .npy writer)."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asanyarray(arr), allow_pickle=False)
            zf.writestr(name + ".npy", buf.getvalue())
    return str(path)


def _with(**changes):
    arrays = _arrays(_trace())
    arrays.update(changes)
    return arrays


def _with_meta(**changes):
    meta = _trace().meta()
    meta.update(changes)
    return _with(meta_json=np.array(json.dumps(meta)))


def _huge_header(path):
    """loads.npy whose header claims 1e12 int32 counts (3.64 TiB) over a few bytes of data."""
    arrays = _arrays(_trace())
    with zipfile.ZipFile(path, "w") as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            if name == "loads":
                np.lib.format.write_array_header_1_0(
                    buf, {"descr": "<i4", "fortran_order": False, "shape": (1000, 1000, 4, 2, 125000)})
                buf.write(b"\0" * 64)
            else:
                np.lib.format.write_array(buf, arr, allow_pickle=False)
            zf.writestr(name + ".npy", buf.getvalue())
    return str(path)


def _loads_with(value, dtype):
    loads = _trace().loads.astype(dtype)
    loads[1, 0, 2, 1, 5] = value
    return _with(loads=loads)


# ---- trace files through `relibra trace stats` (in-process), one row per case ---------------------
# (id, build(tmp_path) -> path, words the one-line message must hold)
FILE_CASES = [
    ("format_version [1,1]", lambda p: _write(p / "t.npz", _with(format_version=np.array([1, 1]))),
     ["format_version", "shape (2,)"]),
    ("format_version '1'", lambda p: _write(p / "t.npz", _with(format_version=np.array("1"))),
     ["format_version", "'1'", "integer 1"]),
    ("format_version 1.7", lambda p: _write(p / "t.npz", _with(format_version=np.array(1.7))),
     ["format_version", "1.7", "integer 1"]),
    ("format_version 1.0 float", lambda p: _write(p / "t.npz", _with(format_version=np.array(1.0))),
     ["format_version", "float64"]),
    ("npy header claims 3.64 TiB", lambda p: _huge_header(p / "t.npz"),
     ["'loads'", "(1000, 1000, 4, 2, 125000)", "4000000000000 bytes", "limit", "RELIBRA_MAX_TRACE_BYTES"]),
    ("int64 count -4294967295", lambda p: _write(p / "t.npz", _loads_with(-4294967295, np.int64)),
     ["'loads'", "negative count", "(1, 0, 2, 1, 5)", "-4294967295"]),
    ("int64 count 2^31", lambda p: _write(p / "t.npz", _loads_with(2**31, np.int64)),
     ["'loads'", "2147483648", "(1, 0, 2, 1, 5)", "beyond int32"]),
    ("float counts in a file", lambda p: _write(p / "t.npz", _loads_with(2.0**31, np.float64)),
     ["'loads'", "dtype float64"]),
    ("meta ep 2.9", lambda p: _write(p / "t.npz", _with_meta(ep=2.9)), ["meta_json", "'ep'", "2.9", "not an integer"]),
    ("meta ep true", lambda p: _write(p / "t.npz", _with_meta(ep=True)), ["meta_json", "'ep'", "True"]),
    ("meta tokens_per_microbatch 1e6", lambda p: _write(p / "t.npz", _with_meta(tokens_per_microbatch=10**6)),
     ["'tokens_per_microbatch'", "1000000", "8 to 8 tokens"]),
    ("meta model.num_layers 4.0", lambda p: _write(p / "t.npz", _with_meta(model={**MODEL.to_dict(), "num_layers": 4.0})),
     ["meta_json", "model.num_layers", "not an integer"]),
    ("float32 token_experts", lambda p: _write(p / "t.npz", _with(token_experts=_trace().token_experts.astype(np.float32))),
     ["'token_experts'", "float32", "bfloat16"]),
    ("bool token_src_rank", lambda p: _write(p / "t.npz", _with(token_src_rank=_trace().token_src_rank.astype(bool))),
     ["'token_src_rank'", "bool"]),
    ("text file named .npz", lambda p: _text_file(p / "t.npz"),
     ["not an .npz archive", "b'hello, n'"]),
    ("a lone .npy named .npz", lambda p: np.save(p / "t.npy", np.zeros(3)) or os.replace(p / "t.npy", p / "t.npz")
     or str(p / "t.npz"), ["single .npy array"]),
    ("unknown field", lambda p: _write(p / "t.npz", _with(extra=np.zeros(2))), ["'extra'", "not one of"]),
    ("truncated file", lambda p: _truncated(p), ["truncated or corrupted"]),
    ("loads with a wrong shape", lambda p: _write(p / "t.npz", _with(loads=np.zeros((3, 2, 4), np.int32))),
     ["'loads'", "5-d", "(3, 2, 4)"]),
]


def _text_file(path):
    path.write_text("hello, not a trace\n")
    return str(path)


def _truncated(p):
    path = p / "t.npz"
    _trace().save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return str(path)


@pytest.mark.parametrize("case", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_bad_trace_file_gives_one_error_line(case, tmp_path, capsys):
    _, build, words = case
    path = build(tmp_path)
    assert main(["trace", "stats", path]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_huge_header_limit_is_raisable(tmp_path, monkeypatch):
    path = _huge_header(tmp_path / "t.npz")
    with pytest.raises(TraceError, match="RELIBRA_MAX_TRACE_BYTES"):
        RoutingTrace.load(path)
    # a raised limit gets past the size check, to the next refusal: the member is shorter than declared
    with pytest.raises(TraceError, match="member holds"):
        RoutingTrace.load(path, max_bytes=2**43)
    monkeypatch.setenv("RELIBRA_MAX_TRACE_BYTES", "100")
    good = tmp_path / "good.npz"
    _trace().save(good)
    with pytest.raises(TraceError, match="limit of 100 bytes"):
        RoutingTrace.load(good)
    assert RoutingTrace.load(good, max_bytes=10**6).num_steps == 3
    monkeypatch.setenv("RELIBRA_MAX_TRACE_BYTES", "lots")
    with pytest.raises(ConfigError, match="RELIBRA_MAX_TRACE_BYTES"):
        RoutingTrace.load(good)


# ---- the command line: output paths and --steps ---------------------------------------------------
def _base_file(p):
    (p / "base.npz").write_bytes(b"x")
    return str(p / "base.npz" / "x.npz")


CLI_CASES = [
    ("trace generate --out under a file",
     lambda p: ["trace", "generate", "--model", "tiny", "--workload", "math", "--ep", "2", "--steps", "1",
                "--out", _base_file(p)], ["--out", "base.npz is a regular file"]),
    ("run --out under a file (checked before launching)",
     lambda p: ["run", "--nproc", "2", "--out", _base_file(p)], ["--out", "base.npz is a regular file"]),
    ("simulate --steps 99 on a 3-step trace",
     lambda p: (_trace().save(p / "t.npz"), ["simulate", "--trace", str(p / "t.npz"), "--cluster", "cpu-gloo",
                                             "--steps", "99"])[1], ["--steps 99", "t.npz", "holds only 3 step(s)"]),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_command_line_gives_one_error_line(case, tmp_path, capsys):
    _, build, words = case
    argv = build(tmp_path)
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not any(f.name == "x.npz" for f in tmp_path.rglob("*"))


def test_check_output_path_kinds(tmp_path):
    (tmp_path / "f").write_text("")
    assert check_output_path(tmp_path / "new" / "deeper" / "x.npz") == str(tmp_path / "new" / "deeper" / "x.npz")
    with pytest.raises(ConfigError, match="is a folder"):
        check_output_path(tmp_path, kind="file")
    with pytest.raises(ConfigError, match="not a folder"):
        check_output_path(tmp_path / "f", kind="dir")
    with pytest.raises(ConfigError, match="regular file"):
        check_output_path(tmp_path / "f" / "a" / "b")
    with pytest.raises(ConfigError, match="empty"):
        check_output_path("")


# ---- in-memory traces, expert ids, plans ----------------------------------------------------------
def _plan(**changes) -> StepPlan:
    """One micro-batch, one layer, EP 2, 4 experts, one replica slot: expert 0 (home GPU 0) replicated
    on GPU 1, which takes 2 of src 1's 3 tokens of expert 0 (its tokens 3 and 4 in source order)."""
    loads = np.array([[[[3, 1, 0, 2], [3, 2, 1, 0]]]], dtype=np.int32)  # [M, L, src, E]
    rexp, rstart, rtok = empty_replicas(1, 1, 2, 1)
    rexp[0, 0, 1, 0] = 0
    rstart[0, 0, 1, 0], rtok[0, 0, 1, 0] = 3, 2
    fields = dict(policy="test", loads=loads, home=static_placement(1, 4, 2), replica_expert=rexp,
                  replica_start=rstart, replica_tokens=rtok, gpus_per_node=2, slots_per_gpu=3, replica_scope="any")
    fields.update(changes)
    return StepPlan(**fields)


def _fractional_tokens():
    tokens = _plan().replica_tokens.astype(np.float64)
    tokens[0, 0, 1, 0] = 1.5
    return tokens


def _nan_loads():
    loads = _plan().loads.astype(np.float64)
    loads[0, 0, 1, 2] = np.nan
    return loads


def _bf16_ids():
    torch = pytest.importorskip("torch")
    return torch.tensor([[3, 300]], dtype=torch.bfloat16)


API_CASES = [
    ("trace: int64 count -4294967295", TraceError,
     lambda: RoutingTrace(_loads_with(-4294967295, np.int64)["loads"], MODEL, 2, 8),
     ["'loads'", "negative count", "(1, 0, 2, 1, 5)"]),
    ("trace: float count 2^31", TraceError,
     lambda: RoutingTrace(_loads_with(2.0**31, np.float64)["loads"], MODEL, 2, 8),
     ["'loads'", "2147483648", "beyond int32"]),
    ("trace: ep 2.9", TraceError, lambda: RoutingTrace(_trace().loads, MODEL, 2.9, 8), ["'ep'", "2.9"]),
    ("trace: tokens_per_microbatch too small", TraceError, lambda: RoutingTrace(_trace().loads, MODEL, 2, 3),
     ["'tokens_per_microbatch'", "is 3", "8 to 8"]),
    ("trace: float token_experts", TraceError,
     lambda: RoutingTrace(_trace().loads, MODEL, 2, 8, {}, _trace().token_experts.astype(np.float64),
                          _trace().token_src_rank), ["'token_experts'", "float64"]),
    ("plan: fractional replica tokens", PlanError, lambda: _plan(replica_tokens=_fractional_tokens()).validate(),
     ["replica_tokens", "[micro_batch, layer, gpu, slot]=(0, 0, 1, 0)", "1.5"]),
    ("plan: float home", PlanError, lambda: _plan(home=static_placement(1, 4, 2).astype(np.float64)).validate(),
     ["home", "float64"]),
    ("plan: NaN loads", PlanError, lambda: _plan(loads=_nan_loads()).validate(),
     ["loads", "[micro_batch, layer, src, expert]=(0, 0, 1, 2)", "nan"]),
    ("plan: bool replica_expert", PlanError,
     lambda: _plan(replica_expert=_plan().replica_expert >= 0).validate(), ["replica_expert", "bool"]),
    ("ids: bf16 tensor", TraceError, lambda: check_expert_ids(_bf16_ids(), 512, "f.pt", "routed_experts"),
     ["f.pt", "'routed_experts'", "bfloat16"]),
    ("ids: float array", TraceError,
     lambda: check_expert_ids(np.array([[1.0, 2.0]]), 16, "f.pt", "routed_experts"), ["'routed_experts'", "float64"]),
    ("ids: out of range", TraceError,
     lambda: check_expert_ids(np.array([[1, 2], [3, 16]]), 16, "f.pt", "routed_experts"),
     ["'routed_experts'", "(1, 1)", "16", "[0, 16)"]),
    ("jsonl: expert id true", TraceError,
     lambda: expert_ids_from_json([[3, 4], [5, True]], 2, "r.jsonl: line 3"),
     ["r.jsonl: line 3", "'top_indices'", "[token=1, k=1]", "true"]),
    ("jsonl: expert id 3.0", TraceError, lambda: expert_ids_from_json([[3.0, 4]], 2, "r.jsonl: line 1"),
     ["'top_indices'", "[token=0, k=0]", "3.0"]),
    ("jsonl: ragged row", TraceError, lambda: expert_ids_from_json([[3, 4], [5]], 2, "r.jsonl: line 1"),
     ["'top_indices'", "[token=1]", "top-k width 1, expected 2"]),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_bad_api_input_names_the_field(case):
    _, exc_type, call, words = case
    with pytest.raises(exc_type) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)


def test_good_inputs_still_pass(tmp_path):
    """The checks refuse only bad input: valid traces, plans and ids go through unchanged."""
    t = _trace()
    t.save(tmp_path / "t.npz")
    u = RoutingTrace.load(tmp_path / "t.npz")
    assert np.array_equal(u.loads, t.loads) and np.array_equal(u.token_experts, t.token_experts)
    assert u.select_steps([0]).num_steps == 1
    _plan().validate()
    assert expert_ids_from_json([[3, 4], [5, 6]], 2, "r").tolist() == [[3, 4], [5, 6]]
    assert check_expert_ids(np.array([[0, 15]], dtype=np.uint8), 16, "f", "ids").dtype == np.uint8
    assert set(read_npz(tmp_path / "t.npz")) == {"format_version", "loads", "meta_json", "token_experts",
                                                 "token_src_rank"}


# ---- property: damaged files give a valid trace or TraceError, nothing else -----------------------
_SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _valid_bytes(tmp_path) -> bytes:
    path = tmp_path / "valid.npz"
    _trace(steps=2, mbs=2, ep=2, tokens_per_rank=2).save(path)
    return path.read_bytes()


def _load_or_trace_error(path):
    try:
        trace = RoutingTrace.load(path)
    except TraceError as exc:
        assert str(exc).startswith(str(path)), exc
        return None
    assert isinstance(trace, RoutingTrace)
    return trace


@_SETTINGS
@given(data=st.one_of(st.binary(max_size=600), st.binary(min_size=4, max_size=600).map(lambda b: b"PK\x03\x04" + b)))
def test_random_bytes_give_trace_error(tmp_path, data):
    path = tmp_path / "r.npz"
    path.write_bytes(data)
    assert _load_or_trace_error(path) is None


@_SETTINGS
@given(cut=st.floats(0.0, 1.0, exclude_max=True),
       flips=st.lists(st.tuples(st.floats(0.0, 1.0, exclude_max=True), st.integers(0, 255)), max_size=4))
def test_truncated_or_flipped_files_give_trace_or_trace_error(tmp_path, cut, flips):
    data = bytearray(_valid_bytes(tmp_path))
    for where, value in flips:
        data[int(where * len(data))] = value
    if cut > 0.0:
        data = data[: int(cut * len(data))]
    path = tmp_path / "d.npz"
    path.write_bytes(bytes(data))
    _load_or_trace_error(path)


_DTYPES = st.sampled_from(["int8", "uint8", "int16", "int32", "int64", "uint64", "float32", "float64", "bool", "<U3"])
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=6)


@st.composite
def _field_edit(draw):
    """(field, new value or None to delete): a random array, one element of the original changed, or a
    meta_json key set to random JSON."""
    field = draw(st.sampled_from(["format_version", "loads", "meta_json", "token_experts", "token_src_rank"]))
    kind = draw(st.sampled_from(["array", "element", "meta", "delete"]))
    original = _arrays(_trace(steps=2, mbs=2, ep=2, tokens_per_rank=2))
    if kind == "delete":
        return field, None
    if kind == "meta" or field == "meta_json":
        meta = json.loads(str(original["meta_json"]))
        key = draw(st.sampled_from(["model", "ep", "tokens_per_microbatch", "provenance", "other",
                                    "model.num_layers", "model.top_k", "model.num_experts", "model.name"]))
        value = draw(_JSON)
        if key.startswith("model."):
            meta["model"][key[6:]] = value
        else:
            meta[key] = value
        return "meta_json", np.array(json.dumps(meta))
    if kind == "element" and original[field].size:
        arr = original[field].astype(draw(st.sampled_from(["int64", "float64", original[field].dtype.str])))
        flat = arr.reshape(-1)
        i = draw(st.integers(0, flat.size - 1))
        if arr.dtype.kind in "iu":
            flat[i] = draw(st.integers(int(np.iinfo(arr.dtype).min), int(np.iinfo(arr.dtype).max)))
        else:
            flat[i] = draw(st.floats(allow_nan=True))
        return field, arr
    from hypothesis.extra.numpy import array_shapes, arrays

    dtype = draw(_DTYPES)
    shape = draw(array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=3))
    return field, draw(arrays(dtype, shape))


@_SETTINGS
@given(edits=st.lists(_field_edit(), min_size=1, max_size=2))
def test_random_field_edits_give_trace_or_trace_error(tmp_path, edits):
    arrays = _arrays(_trace(steps=2, mbs=2, ep=2, tokens_per_rank=2))
    for field, value in edits:
        if value is None:
            arrays.pop(field, None)
        else:
            arrays[field] = value
    path = _write(tmp_path / "e.npz", arrays)
    _load_or_trace_error(path)
