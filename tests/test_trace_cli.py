"""`relibra trace generate|stats|import|calibrate` through relibra.cli.main, and one real subprocess."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from relibra.cli import main
from relibra.experiments import project_root
from relibra.trace import RoutingTrace


def test_generate_then_stats_json(tmp_path, capsys):
    out = tmp_path / "t.npz"
    assert main(["trace", "generate", "--model", "small", "--workload", "code", "--ep", "4", "--steps", "2",
                 "--seed", "7", "--micro-batches", "3", "--tokens-per-rank", "256", "--out", str(out)]) == 0
    t = RoutingTrace.load(out)
    assert t.loads.shape[:2] == (2, 3) and t.provenance["seed"] == 7 and t.provenance["workload"] == "code"
    capsys.readouterr()
    assert main(["trace", "stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["static_skewness"] == pytest.approx(t.static_skewness())
    for key in ("mb_hot_overlap", "step_hot_overlap", "mb_vs_step_corr", "history_hot_overlap"):
        assert key in stats
    assert main(["trace", "stats", str(out)]) == 0
    table = capsys.readouterr().out
    assert "static skewness" in table and "hot-expert overlap, consecutive micro-batches" in table


def test_stats_json_is_strict_for_one_step(tmp_path, capsys):
    out = tmp_path / "one.npz"
    main(["trace", "generate", "--model", "tiny", "--workload", "math", "--ep", "2", "--steps", "1",
          "--micro-batches", "1", "--tokens-per-rank", "64", "--token-level", "--length-scale", "0.02",
          "--out", str(out)])
    capsys.readouterr()
    main(["trace", "stats", str(out), "--json"])
    text = capsys.readouterr().out
    assert "NaN" not in text and json.loads(text)["step_hot_overlap"] is None
    assert RoutingTrace.load(out).token_experts is not None


def test_import_command(tmp_path, capsys):
    rng = np.random.default_rng(0)
    samples = [np.argsort(rng.random((int(n), 4, 16)), -1)[..., :2].astype(np.int32) for n in rng.integers(1, 9, 8)]
    torch.save([torch.from_numpy(x) for x in samples], tmp_path / "rollout.pt")
    out = tmp_path / "imported.npz"
    assert main(["trace", "import", "--format", "sglang", str(tmp_path / "rollout.pt"), "--out", str(out),
                 "--layers", "4", "--experts", "16", "--top-k", "2", "--ep", "2", "--micro-batches", "2"]) == 0
    t = RoutingTrace.load(out)
    assert t.loads.shape == (1, 2, 4, 2, 16) and t.loads[:, :, 0].sum() == 2 * sum(len(x) for x in samples)
    assert main(["trace", "import", "--format", "sglang", str(tmp_path / "rollout.pt"), "--out", str(out),
                 "--model", "tiny", "--ep", "2", "--loads-only"]) == 0
    assert RoutingTrace.load(out).token_experts is None
    capsys.readouterr()


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "bad.npz").write_bytes(b"garbage")
    assert main(["trace", "stats", str(tmp_path / "bad.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "bad.npz" in err and err.count("\n") == 1
    assert main(["trace", "generate", "--model", "tiny", "--workload", "poetry", "--ep", "2", "--steps", "1",
                 "--out", str(tmp_path / "x.npz")]) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert main(["trace", "import", "--format", "verl", str(tmp_path / "bad.npz"), "--out", str(tmp_path / "y.npz"),
                 "--model", "tiny", "--layers", "4", "--ep", "2"]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.parametrize("action", ["generate", "stats", "import", "calibrate"])
def test_help(action, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["trace", action, "--help"])
    assert exc.value.code == 0 and "usage: relibra trace " + action in capsys.readouterr().out


def test_calibrate_json(capsys):
    assert main(["trace", "calibrate", "--models", "tiny", "--eps", "2,4", "--steps", "2", "--micro-batches", "2",
                 "--tokens-per-rank", "128", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["ep"] for r in rows] == [2, 4] and all(r["static_skewness"] >= 1 for r in rows)


def test_python_m_relibra_trace_stats(tmp_path):
    out = tmp_path / "t.npz"
    main(["trace", "generate", "--model", "tiny", "--workload", "mixed", "--ep", "4", "--steps", "2",
          "--micro-batches", "2", "--tokens-per-rank", "128", "--out", str(out)])
    env = dict(os.environ, PYTHONHASHSEED="0")
    proc = subprocess.run([sys.executable, "-m", "relibra", "trace", "stats", str(out), "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    assert stats["ep"] == 4 and stats["static_skewness"] >= 1.0 and stats["micro_batches"] == 2


@pytest.mark.parametrize("name", ["small_math_ep4", "tiny_math_ep4"])
def test_shipped_trace_is_what_its_readme_command_writes(name, tmp_path):
    """data/README.md names the command that made each shipped synthetic trace; it writes the same arrays."""
    readme = (project_root() / "data" / "README.md").read_text()
    command = next(line for line in readme.splitlines() if f"`{name}.npz`" in line).split("`")[3]
    argv = command.split()
    assert argv[:3] == ["relibra", "trace", "generate"] and argv[-2:] == ["--out", f"data/{name}.npz"]
    out = tmp_path / f"{name}.npz"
    assert main(argv[1:-1] + [str(out)]) == 0
    shipped, fresh = RoutingTrace.load(project_root() / "data" / f"{name}.npz"), RoutingTrace.load(out)
    for field in ("loads", "seq_lens", "token_experts", "token_src_rank"):
        a, b = getattr(shipped, field), getattr(fresh, field)
        assert (a is None and b is None) or np.array_equal(a, b), field
    assert shipped.provenance == fresh.provenance


def _replay_dump(folder, layers=4, experts=16, top_k=2, seed=0):
    """RouterReplay recordings as megatron-replay reads them: one .npz per (step, micro-batch, rank), its
    layer_<i> arrays [tokens, top_k] int64 in router order (what RouterReplay.get_recorded_data() holds)."""
    rng = np.random.default_rng(seed)
    folder.mkdir()
    for step in range(2):
        for rank in range(2):
            ids = {f"layer_{i}": np.argsort(rng.random((24, experts)), -1)[:, :top_k].astype(np.int64)
                   for i in range(layers)}
            np.savez(folder / f"step{step}_mb0_rank{rank}.npz", **ids)
    return folder


def test_import_keeps_the_users_dense_shape(tmp_path, capsys):
    """--heads/--kv-heads/--head-dim/--vocab replace the preset's dense fields; the trace file keeps them
    (JSON in the .npz, read back without pickle) and the cost model charges them."""
    from relibra.cluster import get_model, get_topology
    from relibra.costs import cost_plan
    from relibra.policies import get_policy

    dump = _replay_dump(tmp_path / "replay")
    plain, own = tmp_path / "plain.npz", tmp_path / "own.npz"
    common = ["trace", "import", "--format", "megatron-replay", str(dump), "--model", "tiny", "--ep", "2"]
    assert main(common + ["--out", str(plain)]) == 0
    assert main(common + ["--out", str(own), "--heads", "16", "--kv-heads", "2", "--head-dim", "64",
                          "--vocab", "32000"]) == 0
    out = capsys.readouterr().out
    assert "16 heads (2 KV) of dim 64, vocabulary 32000" in out
    a, b = RoutingTrace.load(plain), RoutingTrace.load(own)
    assert a.model == get_model("tiny") and np.array_equal(a.loads, b.loads)
    assert (b.model.num_attention_heads, b.model.num_kv_heads, b.model.head_dim, b.model.vocab_size) == (16, 2, 64, 32000)
    assert b.model.name == "tiny (--heads 16, --kv-heads 2, --head-dim 64, --vocab 32000)"
    assert (b.model.hidden, b.model.moe_ffn, b.model.num_layers) == (64, 128, 4)  # the rest is the preset's
    topo = get_topology("cpu-gloo")
    preset, users = (cost_plan(get_policy("megatron").plan(t, 0, topo), t.model, topo).totals() for t in (a, b))
    assert users["dense_compute"] > preset["dense_compute"]
    assert users["expert_compute"] == pytest.approx(preset["expert_compute"])


def test_import_model_json_kit_and_hugging_face(tmp_path, capsys):
    from relibra.importers.common import model_from_json
    from relibra.cluster import get_model

    dump = _replay_dump(tmp_path / "replay")
    kit = tmp_path / "mymoe.json"
    kit.write_text(json.dumps({"num_layers": 4, "num_experts": 16, "top_k": 2, "hidden": 256, "moe_ffn": 512,
                               "num_attention_heads": 8, "num_kv_heads": 8, "head_dim": 32, "vocab_size": 5000}))
    out = tmp_path / "t.npz"
    assert main(["trace", "import", "--format", "megatron-replay", str(dump), "--model-json", str(kit), "--ep", "2",
                 "--vocab", "6000", "--out", str(out)]) == 0
    m = RoutingTrace.load(out).model
    assert (m.name, m.hidden, m.num_attention_heads, m.vocab_size) == ("mymoe (--vocab 6000)", 256, 8, 6000)
    # Hugging Face config.json keys (values of the models' own configs) give the kit's presets' shapes
    qwen = {"_name_or_path": "Qwen/Qwen3-30B-A3B", "num_hidden_layers": 48, "num_experts": 128,
            "num_experts_per_tok": 8, "hidden_size": 2048, "moe_intermediate_size": 768, "intermediate_size": 6144,
            "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "model_type": "qwen3_moe"}
    dsv3 = {"num_hidden_layers": 61, "first_k_dense_replace": 3, "n_routed_experts": 256, "n_shared_experts": 1,
            "num_experts_per_tok": 8, "hidden_size": 7168, "moe_intermediate_size": 2048, "intermediate_size": 18432,
            "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280, "model_type": "deepseek_v3"}
    for config, preset in ((qwen, "qwen3-30b-a3b"), (dsv3, "deepseek-v3")):
        path = tmp_path / f"{preset}.json"
        path.write_text(json.dumps(config))
        shape = model_from_json(str(path))
        assert {**shape.to_dict(), "name": preset} == get_model(preset).to_dict()
    assert model_from_json(str(tmp_path / "qwen3-30b-a3b.json")).name == "Qwen3-30B-A3B"


@pytest.mark.parametrize("extra, message", [
    (["--model", "tiny", "--heads", "0"], "--heads must be an integer >= 1; got '0'"),
    (["--model", "tiny", "--model-json", "m.json"], "--model-json gives the whole shape; drop --model"),
    (["--model-json", "missing.json"], "--model-json missing.json: No such file or directory"),
    (["--model-json", "bad.json"], "--model-json bad.json: unknown field 'heads'"),
    (["--model-json", "sparse.json"], "decoder_sparse_step / mlp_only_layers"),
    (["--model", "nosuch"], "unknown model"),
])
def test_import_shape_errors_before_reading_any_file(extra, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.json").write_text("{}")
    (tmp_path / "bad.json").write_text(json.dumps({"num_layers": 4, "heads": 8}))
    (tmp_path / "sparse.json").write_text(json.dumps({"num_hidden_layers": 4, "hidden_size": 64, "decoder_sparse_step": 2}))
    assert main(["trace", "import", "--format", "megatron-replay", "/nonexistent/dump", "--ep", "2",
                 "--out", "t.npz", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
