"""Bad input and faults outside the runtime, one table per family (the runtime's own are in
test_runtime_watchdog.py and test_runtime_faults.py):
- bounded memory: statistics in blocks, equal to whole-array references; every input format refused by
  the one size limit before it is decoded; impossible sizes refused before any work;
- atomic output: a write that fails or is interrupted leaves the old file and no temporary one;
- accepted silently: zero or negative sizes, non-finite numbers, repeated JSON keys are refused;
- one line, never a traceback, for malformed importer input and bad settings;
- unclear: control characters in names, an all-zero trace, late refusals."""

from __future__ import annotations

import base64
import io
import json
import os
import tempfile
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from relibra import analysis as analysis_mod
from relibra import trace as trace_mod
from relibra.cli import main
from relibra.cluster import ModelShape, get_model
from relibra.errors import ConfigError, TraceError
from relibra.trace import RoutingTrace


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), captured.err
    assert "Traceback" not in captured.err + captured.out
    return err[0]


def _random_trace(steps, mbs, layers, ep, experts, seed=0, top_k=2) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    model = ModelShape("t", num_layers=layers, num_experts=experts, top_k=top_k, hidden=8, moe_ffn=8)
    pop = rng.dirichlet(np.full(experts, 0.3), size=(steps, mbs, layers, ep))
    loads = rng.multinomial(10 * top_k, pop).astype(np.int32)
    return RoutingTrace(loads, model, ep, 10 * ep, {"test": True})


# ---- family: bounded memory ------------------------------------------------------------------------
def _reference_shift_stats(el: np.ndarray, hot_frac=0.1, window=4) -> dict:
    """Whole-array statistics, written the obvious way (pairwise k x k comparison of hot sets)."""
    def hot(a, b):
        k = max(1, int(round(hot_frac * a.shape[-1])))
        ta = np.argsort(-a, axis=-1, kind="stable")[..., :k]
        tb = np.argsort(-np.broadcast_to(b, a.shape), axis=-1, kind="stable")[..., :k]
        return (ta[..., :, None] == tb[..., None, :]).any(-1).sum(-1) / k

    el = el.astype(np.float64)
    step = el.sum(axis=1)
    corr = analysis_mod.load_correlation
    out = {"mb_vs_step_hot_overlap": hot(el, step[:, None]).mean(), "mb_vs_step_corr": corr(el, step[:, None]).mean()}
    if el.shape[1] > 1:
        out.update(mb_hot_overlap=hot(el[:, 1:], el[:, :-1]).mean(), mb_corr=corr(el[:, 1:], el[:, :-1]).mean())
    if el.shape[0] > 1:
        pred = np.stack([step[max(0, s - window):s].mean(axis=0) for s in range(1, len(step))])
        out.update(step_hot_overlap=hot(step[1:], step[:-1]).mean(), step_corr=corr(step[1:], step[:-1]).mean(),
                   history_hot_overlap=hot(step[1:], pred).mean(), history_corr=corr(step[1:], pred).mean(),
                   history_mb_hot_overlap=hot(el[1:], pred[:, None]).mean())
    return out


STATS_SHAPES = [  # steps, micro-batches, layers, ep, experts
    (1, 1, 1, 1, 4),
    (2, 1, 3, 2, 8),
    (7, 3, 2, 2, 16),
    (9, 4, 3, 1, 10),
]


@pytest.mark.parametrize("block_bytes", [1, 700, analysis_mod.STATS_BLOCK_BYTES])
@pytest.mark.parametrize("shape", STATS_SHAPES)
def test_trace_stats_in_blocks_equal_the_whole_array_reference(shape, block_bytes, monkeypatch):
    monkeypatch.setattr(analysis_mod, "STATS_BLOCK_BYTES", block_bytes)  # 1: one step of one layer per block
    t = _random_trace(*shape, seed=sum(shape))
    got = analysis_mod.trace_stats(t)
    want = _reference_shift_stats(t.expert_load())
    for key in ("mb_hot_overlap", "mb_corr", "mb_vs_step_hot_overlap", "step_hot_overlap", "step_corr",
                "history_hot_overlap", "history_corr", "history_mb_hot_overlap"):
        if key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-12), key
        else:
            assert np.isnan(got[key]), key
    skew = trace_mod.skewness(t.rank_load())
    assert got["static_skewness"] == pytest.approx(skew.mean(), rel=1e-12)
    assert got["static_skewness_p95"] == pytest.approx(np.percentile(skew, 95), rel=1e-12)


def _sparse_wide_trace(declared_bytes: int, experts: int = 16384) -> RoutingTrace:
    """One token per step over many experts: loads of `declared_bytes` that compress to almost nothing."""
    steps = declared_bytes // (4 * experts)
    model = ModelShape("wide", num_layers=1, num_experts=experts, top_k=1, hidden=8, moe_ffn=8)
    loads = np.zeros((steps, 1, 1, 1, experts), dtype=np.int32)
    loads[np.arange(steps), 0, 0, 0, np.arange(steps) % experts] = 1
    return RoutingTrace(loads, model, 1, 1, {"test": "wide"})


def test_trace_stats_peak_memory_stays_near_the_loads(tmp_path):
    """A file of about 100 KB declaring 32 MiB of loads over 16384 experts (hot sets of 1638 experts
    each): statistics take a few blocks' worth beyond the loads (whole-array ones took ~1 GB here)."""
    path = tmp_path / "wide.npz"
    _sparse_wide_trace(32 * 2**20).save(path)
    assert os.path.getsize(path) < 2**20
    t = RoutingTrace.load(path)
    tracemalloc.start()
    try:
        analysis_mod.trace_stats(t)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < t.loads.nbytes + 12 * analysis_mod.STATS_BLOCK_BYTES, peak


def _deflated_pt(path, obj) -> str:
    """torch.save, then the archive rewritten with deflate (as an attacker or a zip tool would)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as src, \
            zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    return str(path)


def _text(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _sglang_line(rows: int) -> dict:
    routes = np.zeros((rows, 4, 2), dtype=np.int32)
    routes[..., 1] = 1
    return {"meta_info": {"prompt_tokens": 1, "completion_tokens": rows,
                          "routed_experts": base64.b64encode(routes.tobytes()).decode()}}


LIMIT_BYTES = 2**20  # the limit every case below runs under (RELIBRA_MAX_TRACE_BYTES)
OVER_LIMIT = [  # (format, writer of a file that decodes to more than the limit)
    ("verl", lambda p: _deflated_pt(p / "big.pt", {"routed_experts": torch.zeros(64, 1024, 4, 2, dtype=torch.int16),
                                                   "attention_mask": torch.ones(64, 1024, dtype=torch.int64)})),
    ("verl", lambda p: (np.savez_compressed(p / "big.npz", routed_experts=np.zeros((64, 1024, 4, 2), np.int16),
                                            attention_mask=np.ones((64, 1024), np.int8)), str(p / "big.npz"))[1]),
    ("megatron-jsonl", lambda p: _text(p / "t.jsonl", json.dumps({"top_indices": [[1, 2]] * 20000}) + "\n")),
    ("sglang", lambda p: _text(p / "r.json", json.dumps([_sglang_line(2)] * 2000))),
    ("sglang", lambda p: _text(p / "r.jsonl", json.dumps(_sglang_line(40000)) + "\n")),
]


@pytest.mark.parametrize("fmt, write", OVER_LIMIT)
def test_every_input_format_is_bounded_before_it_is_decoded(fmt, write, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RELIBRA_MAX_TRACE_BYTES", str(LIMIT_BYTES))
    path = write(tmp_path)
    assert os.path.getsize(path) < 4 * LIMIT_BYTES
    extra = ["--experts", "4"] if fmt == "megatron-jsonl" else ["--model", "tiny", "--ep", "1"]
    assert main(["trace", "import", "--format", fmt, path, *extra, "--out", str(tmp_path / "t.npz")]) == 2
    line = _one_error_line(capsys)
    assert "limit" in line and "RELIBRA_MAX_TRACE_BYTES" in line and os.path.basename(path) in line, line


IMPOSSIBLE = [  # (argv, what the error names, seconds allowed)
    (["trace", "generate", "--model", "tiny", "--workload", "math", "--ep", "2", "--steps", "2",
      "--tokens-per-rank", str(10**12), "--out", "x.npz"], "tokens per step"),
    (["trace", "generate", "--model", "tiny", "--workload", "math", "--ep", "2", "--steps", "2",
      "--out", "x.txt"], ".npz"),
    (["trace", "generate", "--model", "tiny", "--workload", "math", "--ep", "2", "--steps", "100000",
      "--out", "x.npz"], "--steps must be an integer 1..10000"),
    (["bench", "planner", "--model", "deepseek-v3", "--ep", "256", "--cluster", "paper"], "exceeds"),
]


@pytest.mark.parametrize("argv, named", IMPOSSIBLE)
def test_impossible_sizes_are_refused_before_any_work(argv, named, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - t0 < 3
    assert named in _one_error_line(capsys)


# ---- family: atomic output ---------------------------------------------------------------------------
class _Interrupted(BaseException):
    pass


@pytest.mark.parametrize("fault", [KeyboardInterrupt, _Interrupted, OSError])
def test_an_interrupted_trace_write_keeps_the_old_file(fault, tmp_path, monkeypatch):
    path = tmp_path / "t.npz"
    old = _random_trace(2, 1, 1, 1, 4)
    old.save(path)
    before = path.read_bytes()
    real = np.savez_compressed

    def half_then_fault(f, **arrays):
        real(f, **arrays)
        f.truncate(f.tell() // 2)
        raise fault(28, "No space left on device") if fault is OSError else fault()

    monkeypatch.setattr(np, "savez_compressed", half_then_fault)
    with pytest.raises(fault) as info:
        _random_trace(3, 1, 1, 1, 4, seed=1).save(path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["t.npz"]  # no temporary file left
    if fault is OSError:
        assert info.value.filename == str(path)  # a full disk names the file


def test_a_full_disk_names_the_file(tmp_path, monkeypatch, capsys):
    def full(f, **arrays):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", full)
    out = tmp_path / "t.npz"
    assert main(["trace", "generate", "--model", "tiny", "--workload", "math", "--ep", "2", "--steps", "1",
                 "--micro-batches", "1", "--tokens-per-rank", "16", "--out", str(out)]) == 2
    assert _one_error_line(capsys) == f"error: {out}: No space left on device"
    assert os.listdir(tmp_path) == []


def test_a_run_prints_its_results_before_a_failing_out(tmp_path, capsys):
    """--out whose metrics.csv cannot be written (a folder stands there): the results are on stdout."""
    out = tmp_path / "out"
    (out / "metrics.csv").mkdir(parents=True)
    assert main(["run", "--model", "tiny", "--policies", "megatron", "--steps", "1", "--warmup-steps", "0",
                 "--micro-batches", "1", "--tokens-per-rank", "16", "--json", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["results"][0]["policy"] == "megatron"
    assert captured.err.strip().splitlines()[-1].startswith(f"error: {out / 'metrics.csv'}")
    assert sorted(os.listdir(out)) == ["metrics.csv"]  # nothing half-written beside it


@pytest.mark.parametrize("out, refused", [
    ("docs", True),  # holds the tracked glance.md
    ("notebooks", True),
    (".", True),
    ("relibra/experiments", True),
    ("results", False),
    ("results/runs/x", False),
    ("untracked-folder", False),
])
def test_reproduce_refuses_an_output_folder_among_tracked_files(out, refused):
    from relibra.reproduce import check_output_folder
    from relibra.experiments import project_root

    path = str(project_root() / out)
    if refused:
        with pytest.raises(ConfigError, match="tracked"):
            check_output_folder(path)
    else:
        check_output_folder(path)
    check_output_folder(str(Path(tempfile.gettempdir()) / "elsewhere"))  # outside the repository: fine


@pytest.mark.parametrize("before", [True, False])
@pytest.mark.parametrize("ending", ["finished", "failed", "killed"])
def test_a_notebook_folder_is_replaced_only_by_a_finished_run(ending, before, tmp_path):
    """finished: the new folder replaces the old; failed: it goes to <name>.failed, the old one (or none)
    stays; killed outright: the next run's start discards the half-written folder, keeping the old one."""
    from relibra.reproduce import _end_notebook_folder, _start_notebook_folder

    nb = tmp_path / "02_x"
    if before:
        nb.mkdir()
        (nb / "old.csv").write_text("old")
    old = ["old.csv"] if before else None
    previous = _start_notebook_folder(nb)
    (nb / "new.csv").write_text("new")
    if ending == "killed":
        previous = _start_notebook_folder(nb)  # the next run
        assert os.listdir(nb) == [] and os.listdir(previous) == (old or [])
        _end_notebook_folder(nb, previous, finished=False)  # ... which fails as well
    else:
        _end_notebook_folder(nb, previous, ending == "finished")
    kept = ["new.csv"] if ending == "finished" else old
    assert (os.listdir(nb) if nb.exists() else None) == kept
    assert not previous.exists()
    assert (tmp_path / "02_x.failed").exists() == (ending != "finished")


# ---- family: accepted silently ---------------------------------------------------------------------
@pytest.mark.parametrize("spec, field", [
    ("tiny,heads=0", "num_attention_heads"),
    ("tiny,vocab=0", "vocab_size"),
    ("tiny,kv_heads=-1", "num_kv_heads"),
    ("tiny,head_dim=0", "head_dim"),
    ("tiny,shared=-1", "num_shared_experts"),
])
def test_model_specs_with_zero_or_negative_sizes_are_refused(spec, field):
    with pytest.raises(ConfigError, match=field):
        get_model(spec)


def _saved_with_meta(tmp_path, meta_text: str) -> str:
    t = _random_trace(2, 1, 1, 1, 4)
    path = tmp_path / "m.npz"
    np.savez(path, format_version=np.array(1, dtype=np.int64), loads=t.loads, meta_json=np.array(meta_text))
    return str(path)


@pytest.mark.parametrize("edit, named", [
    (lambda text: text.replace('{"ep": 1', '{"ep": 2, "ep": 1'), "'ep' appears twice"),
    (lambda text: text.replace('"top_k": 2', '"top_k": 2, "top_k": 3'), "'top_k' appears twice"),
    (lambda text: text.replace('"tokens_per_microbatch": 10', '"tokens_per_microbatch": NaN'), "NaN"),
    (lambda text: "[" * 100000 + "]" * 100000, "nested too deeply"),
])
def test_trace_metadata_is_read_strictly(edit, named, tmp_path):
    meta = json.dumps(_random_trace(2, 1, 1, 1, 4).meta(), sort_keys=True)
    with pytest.raises(TraceError, match=named):
        RoutingTrace.load(_saved_with_meta(tmp_path, edit(meta)))


def test_json_output_stays_json_when_a_statistic_is_undefined(tmp_path, capsys):
    path = tmp_path / "one.npz"
    _random_trace(1, 1, 1, 1, 4).save(path)  # one step, one micro-batch: several statistics are undefined
    assert main(["trace", "stats", str(path), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in JSON output"))
    assert stats["step_corr"] is None and stats["mb_corr"] is None


# ---- family: one line, never a traceback -----------------------------------------------------------
def _pt(path, obj):
    torch.save(obj, path)
    return str(path)


def _quantized():
    import warnings

    with warnings.catch_warnings():  # torch deprecates making quantized tensors; files may still hold them
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(torch.zeros(2, 3, 4, 2), 1.0, 0, torch.qint8)


VERL_PT = [  # (maker of the routed_experts value, what the error says)
    (lambda: [[1, 2], [3]], "must be a tensor, got list"),
    (lambda: torch.tensor(3), "must be [batch, total_len, num_layers, topk]"),
    (lambda: torch.zeros(2, 3, 4, 2, dtype=torch.int16).to_sparse(), "sparse"),
    (lambda: torch.zeros(2, 3, 4, 2).to(torch.float8_e4m3fn), "float8"),
    (lambda: torch.empty(2, 3, 4, 2, device="meta"), "meta"),
    pytest.param(_quantized, "quantized",  # torch.load of a quantized tensor warns of its own TypedStorage use
                 marks=pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")),
]


@pytest.mark.parametrize("ids, said", VERL_PT)
def test_verl_files_weights_only_allows_but_the_kit_cannot_read(ids, said, tmp_path, capsys):
    path = _pt(tmp_path / "b.pt", {"routed_experts": ids(), "attention_mask": torch.ones(2, 3, dtype=torch.int64)})
    assert main(["trace", "import", "--format", "verl", path, "--model", "tiny", "--ep", "1",
                 "--out", str(tmp_path / "t.npz")]) == 2
    line = _one_error_line(capsys)
    assert said in line and "b.pt" in line, line


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


MALFORMED_TEXT = [  # (format, file name, text, what the error says)
    ("megatron-jsonl", "t.jsonl", _nested(100000) + "\n", "nested too deeply"),
    ("sglang", "r.jsonl", _nested(100000) + "\n", "nested too deeply"),
    ("sglang", "r.json", _nested(100000), "nested too deeply"),
    ("sglang", "r.json", json.dumps({"meta_info": {"routed_experts_dtype": ["int32"], "routed_experts": "",
                                                   "prompt_tokens": 1, "completion_tokens": 1}}),
     "routed_experts_dtype"),
    ("sglang", "r.json", '{"meta_info": {"prompt_tokens": 1, "prompt_tokens": 2}}', "appears twice"),
]


@pytest.mark.parametrize("fmt, name, text, said", MALFORMED_TEXT)
def test_malformed_importer_text_gives_one_line(fmt, name, text, said, tmp_path, capsys):
    path = tmp_path / name
    path.write_text(text)
    extra = ["--experts", "4"] if fmt == "megatron-jsonl" else ["--model", "tiny", "--ep", "1"]
    assert main(["trace", "import", "--format", fmt, str(path), *extra, "--out", str(tmp_path / "t.npz")]) == 2
    line = _one_error_line(capsys)
    assert said in line and name in line, line


GEN = ["trace", "generate", "--model", "tiny", "--workload", "math", "--ep", "2", "--steps", "1", "--out", "x.npz"]


@pytest.mark.parametrize("argv, env, said", [
    (GEN + ["--seed", "-1"], {}, "seed"),
    (GEN + ["--length-scale", "inf"], {}, "--length-scale"),
    (GEN + ["--length-scale", "nan"], {}, "--length-scale"),
    (["trace", "stats", "x.npz"], {"RELIBRA_MAX_TRACE_BYTES": "1e400"}, "RELIBRA_MAX_TRACE_BYTES"),
    (["trace", "stats", "x.npz"], {"RELIBRA_MAX_TRACE_BYTES": "nan"}, "RELIBRA_MAX_TRACE_BYTES"),
    (["run", "--model", "tiny", "--steps", "1"], {"RELIBRA_CPU_FIT": "fit.json"}, "nosuch_field"),
    (["rl", "--seed", "-1", "--steps", "1", "--out", "rl.npz"], {}, "seed"),
    (["rl", "--lr", "inf", "--steps", "1", "--out", "rl.npz"], {}, "lr"),
])
def test_bad_settings_give_one_line_naming_them(argv, env, said, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _random_trace(2, 1, 1, 1, 4).save(tmp_path / "x.npz")
    (tmp_path / "fit.json").write_text(json.dumps({"preset": {"name": "f", "nosuch_field": 1}}))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(argv) == 2
    assert said in _one_error_line(capsys)


# ---- family: unclear ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["evil\x1b[2J", "two\nlines", "back\rover", "bell\x07"])
def test_control_characters_in_a_model_name_are_refused(name, tmp_path, capsys):
    t = _random_trace(2, 1, 1, 1, 4)
    meta = {**t.meta(), "model": {**t.model.to_dict(), "name": name}}
    path = _saved_with_meta(tmp_path, json.dumps(meta))
    assert main(["trace", "stats", path]) == 2
    line = _one_error_line(capsys)
    assert "printable" in line and not any(c in line for c in "\x1b\r\x07"), repr(line)


def test_an_all_zero_trace_is_refused_when_loaded(tmp_path):
    t = _random_trace(2, 1, 1, 1, 4)
    path = tmp_path / "zero.npz"
    np.savez(path, format_version=np.array(1, dtype=np.int64), loads=np.zeros_like(t.loads),
             meta_json=np.array(json.dumps({**t.meta(), "tokens_per_microbatch": 1})))
    with pytest.raises(TraceError, match="all zero"):
        RoutingTrace.load(path)
