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
