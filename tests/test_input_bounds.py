"""Inputs refused (or read) before they cost: each crafted file runs in a subprocess whose peak memory
(resource.getrusage(RUSAGE_CHILDREN).ru_maxrss, the largest child so far, so each case runs in a fresh
helper process) is bounded: trace stats on ids that compress 700x, megatron-jsonl with ragged
micro-batches, JSONL files of one endless line (megatron-jsonl, sglang), a sparse --model-json and a
sparse --cluster preset file; and the stated bounds on steps, lengths, ranks and model shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from relibra.cluster import get_model

ROOT = Path(__file__).resolve().parents[1]

# Measures one command in a fresh process: its own peak is the only child's.
_MEASURE = """
import resource, subprocess, sys, json
p = subprocess.run([sys.executable, "-m", "relibra", *sys.argv[1:]], capture_output=True, text=True)
print(json.dumps({"rc": p.returncode, "err": p.stderr, "peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def _peak(*argv: str, env: dict | None = None) -> tuple[int, str, float]:
    """(exit code, stderr, peak resident MB) of `python -m relibra argv...`."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, *argv], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=600)
    got = json.loads(out.stdout)
    return got["rc"], got["err"], got["peak_mb"]


_BASE: list[float] = []


def _baseline() -> float:
    """Peak MB of `trace stats` on a trace of 1000 token ids: the interpreter and the kit's imports."""
    if not _BASE:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "small.npz"
            _token_trace(path, 1000)
            _BASE.append(_peak("trace", "stats", str(path))[2])
    return _BASE[0]


def _token_trace(path: Path, tokens: int) -> int:
    """A valid tiny-model trace with `tokens` token-level ids (int32, all alike: it compresses ~700x);
    returns the bytes its arrays declare."""
    m = get_model("tiny")
    te = np.zeros((1, 1, tokens, m.num_layers, m.top_k), dtype=np.int32)
    te[..., 1] = 1
    tsr = np.zeros((1, 1, tokens), dtype=np.int32)
    tsr[0, 0, tokens // 2:] = 1
    loads = np.zeros((1, 1, m.num_layers, 2, m.num_experts), dtype=np.int32)
    loads[0, 0, :, 0, :2], loads[0, 0, :, 1, :2] = tokens // 2, tokens - tokens // 2
    meta = {"model": m.to_dict(), "ep": 2, "tokens_per_microbatch": tokens, "provenance": {}}
    np.savez_compressed(path, format_version=np.array(1, dtype=np.int64), loads=loads,
                        meta_json=np.array(json.dumps(meta)), token_experts=te, token_src_rank=tsr)
    return te.nbytes + tsr.nbytes


def test_trace_stats_needs_memory_in_proportion_to_the_ids(tmp_path):
    path = tmp_path / "ids.npz"
    declared_mb = _token_trace(path, 1_500_000) / 2**20  # 54 MB of ids in a file of ~0.1 MB
    assert path.stat().st_size < 0.5 * 2**20
    rc, err, peak = _peak("trace", "stats", str(path))
    assert rc == 0, err
    # the arrays once, the loading's copy, and a few chunks: ~2x (was ~11x: 860 MB for 81 MB)
    assert peak - _baseline() < 3 * declared_mb, (peak, declared_mb)


def _ragged_jsonl(folder: Path, micro_batches: int, wide: int) -> None:
    """megatron-jsonl for tiny, one step, EP 1: one micro-batch of `wide` tokens, the others of one token."""
    folder.mkdir()
    with open(folder / "router_trace_rank0.jsonl", "w") as f:
        for j in range(micro_batches):
            rows = ([[i % 16, (i % 16 + 1 + (i // 16) % 15) % 16] for i in range(wide)] if j == 0
                    else [[j % 16, (j % 16 + 1 + j // 16) % 16]])
            for layer in range(4):
                f.write(json.dumps({"step": 0, "layer": layer, "rank": 0, "num_tokens": len(rows), "topk": 2,
                                    "top_indices": rows}) + "\n")


def test_ragged_micro_batches_are_not_padded_to_the_widest(tmp_path):
    _ragged_jsonl(tmp_path / "rag", 200, 50_000)  # 1.8 MB; padded token ids would take 200 MB
    out = tmp_path / "t.npz"
    rc, err, peak = _peak("trace", "import", "--format", "megatron-jsonl", str(tmp_path / "rag"), "--model", "tiny",
                          "--ep", "1", "--out", str(out))
    assert rc == 2 and "micro-batches are ragged" in err and "--loads-only" in err, err
    assert peak - _baseline() < 60, peak  # was 476 MB
    rc, err, peak = _peak("trace", "import", "--format", "megatron-jsonl", str(tmp_path / "rag"), "--model", "tiny",
                          "--ep", "1", "--loads-only", "--out", str(out))
    assert rc == 0 and out.exists(), err
    assert peak - _baseline() < 60, peak


def _sparse(path: Path, size: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)  # no blocks on disk: reading it costs only memory
    return str(path)


@pytest.mark.parametrize("fmt, name", [("megatron-jsonl", "router_trace_rank0.jsonl"), ("sglang", "resp.jsonl")])
def test_one_endless_jsonl_line_is_refused_at_the_record_bound(fmt, name, tmp_path):
    _sparse(tmp_path / "in" / name, 1 << 30)  # 1 GiB without a newline
    # loader limit 400 MiB -> one record at most 10 MiB of text
    rc, err, peak = _peak("trace", "import", "--format", fmt, str(tmp_path / "in"), "--model", "tiny", "--ep", "2",
                          "--out", str(tmp_path / "t.npz"), env={"RELIBRA_MAX_TRACE_BYTES": str(400 << 20)})
    assert rc == 2 and "line 1 is longer than 10485760 bytes" in err, err
    assert peak - _baseline() < 60, peak  # was 2.5 GB for 1.2 GB


def test_sparse_model_json_and_preset_files_are_refused_before_reading(tmp_path):
    big = _sparse(tmp_path / "big.json", 2500 << 20)
    rc, err, peak = _peak("trace", "import", "--format", "megatron-replay", str(tmp_path), "--model-json", big,
                          "--ep", "2", "--out", str(tmp_path / "t.npz"))
    assert rc == 2 and "larger than 1048576 bytes" in err, err
    assert peak - _baseline() < 30, peak  # was 2.6 GB
    rc, err, peak = _peak("simulate", "--model", "tiny", "--workload", "math", "--ep", "4", "--steps", "1",
                          "--cluster", big)
    assert rc == 2 and "larger than 1048576 bytes" in err, err
    assert peak - _baseline() < 30, peak


@pytest.mark.parametrize("argv, words", [
    (["trace", "generate", "--model", "tiny", "--workload", "math", "--ep", "4", "--steps", "1000000000", "--out", "g.npz"],
     "--steps must be an integer 1..10000"),
    (["trace", "generate", "--model", "tiny", "--workload", "math", "--ep", "4", "--steps", "2", "--out", "g.npz", "--length-scale",
      "8e5"], "--length-scale must be a number in [0.001, 100.0]"),
    (["trace", "generate", "--model", "tiny,num_kv_heads=3", "--workload", "math", "--ep", "4", "--steps", "2", "--out", "g.npz"],
     "num_kv_heads=3 must divide num_attention_heads=4"),
    (["trace", "generate", "--model", "tiny,vocab=100000000", "--workload", "math", "--ep", "4", "--steps", "2", "--out", "g.npz"],
     "vocab_size=100000000 is over the kit's bound"),
    (["trace", "import", "--format", "megatron-replay", "nowhere", "--model", "tiny", "--kv-heads", "1000",
      "--ep", "2", "--out", "x.npz"], "num_kv_heads=1000 must divide num_attention_heads=4"),
    (["trace", "import", "--format", "megatron-replay", "nowhere", "--heads", "8", "--kv-heads", "3",
      "--layers", "2", "--experts", "4", "--top-k", "2", "--ep", "2", "--out", "x.npz"], "--kv-heads 3 must divide"),
    (["run", "--nproc", "1000", "--model", "tiny"], "more ranks than this machine runs at once"),
])
def test_sizes_and_shapes_are_refused_before_any_work(argv, words, tmp_path, capsys, monkeypatch):
    from relibra.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err


def test_the_generator_refuses_what_would_overflow_before_drawing():
    """Below the command line's bounds, generate_trace itself checks the loads' size and the int32 token
    counts before any routing is drawn (a caller in code passes no flag check)."""
    import dataclasses

    from relibra.errors import ConfigError
    from relibra.workloads import WorkloadConfig, generate_trace

    with pytest.raises(ConfigError, match="beyond the int32 counts"):
        generate_trace("tiny", "math", 4, steps=2, config=dataclasses.replace(WorkloadConfig(), length_scale=8e5))
    with pytest.raises(ConfigError, match="generate_trace"):
        generate_trace("tiny", "math", 4, steps=10**9)


def test_model_json_shapes_are_checked(tmp_path):
    from relibra.importers.common import model_from_json
    from relibra.errors import ConfigError

    path = tmp_path / "m.json"
    path.write_text(json.dumps({"num_layers": 2, "num_experts": 8, "top_k": 2, "hidden": 64, "moe_ffn": 64,
                                "num_attention_heads": 4, "num_kv_heads": 1000}))
    with pytest.raises(ConfigError, match="num_kv_heads=1000"):
        model_from_json(str(path))


@pytest.mark.parametrize("fmt", ["megatron-replay", "verl", "sglang", "vllm", "slime"])
def test_npz_inputs_declaring_more_than_the_limit_are_refused_before_loading(fmt, tmp_path):
    """A 0.1 MB .npz whose one member declares 800 MB of ids: every importer that reads .npz reads its
    headers first (relibra.trace.read_npz) and refuses it at the loader's limit (here 100 MiB)."""
    folder = tmp_path / "in"
    folder.mkdir()
    np.savez_compressed(folder / "step_0.npz", routed_experts=np.zeros((25_000_000, 4, 2), dtype=np.int32))
    assert (folder / "step_0.npz").stat().st_size < 2 << 20
    rc, err, peak = _peak("trace", "import", "--format", fmt, str(folder), "--model", "tiny", "--ep", "2",
                          "--out", str(tmp_path / "t.npz"), env={"RELIBRA_MAX_TRACE_BYTES": str(100 << 20)})
    assert rc == 2 and "over the loader's limit of 104857600 bytes" in err, err
    assert peak - _baseline() < 60, peak
