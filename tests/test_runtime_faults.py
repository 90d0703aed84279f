"""Failures of the runtime end in bounded time with one line naming the rank and cause:
killed, crashed and stalled ranks (2 ranks, plain torch.distributed, short timeouts), a migration that
fails mid-transfer (rolled back through the vote; the step goes on on the old placement, or stops),
bad run options, and torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from relibra.errors import ConfigError


# ---- workers (module level: the spawned ranks import them) ----------------------------------------------
def _barriers(rank: int, world: int, fate: str, stamp: str) -> dict:
    """Two barriers; then rank 1 meets its fate (after writing the time to `stamp`) while rank 0 keeps
    calling collectives."""
    import torch.distributed as dist

    dist.barrier()
    if rank == 1:
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        if fate == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fate == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif fate == "raise":
            raise ConfigError("bad thing on purpose")
    for _ in range(400):
        dist.barrier()
        time.sleep(0.05)
    return {"ok": True}


def _pids_gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


FATES = {"kill": "rank 1 killed by signal SIGKILL", "raise": "rank 1: bad thing on purpose", "stop": "rank 1 stalled"}


def _failed_launch(fate: str, timeout_s: float, folder) -> tuple[str, float, list[int]]:
    """(message, seconds from rank 1's fate to the launcher's error, pids of the ranks)."""
    from relibra.runtime.launch import RankFailure, launch

    pids, stamp = [], str(folder / f"{fate}.time")
    with pytest.raises(RankFailure) as info:
        launch(_barriers, 2, fate, stamp, timeout_s=timeout_s, on_start=pids.extend)
    assert os.path.exists(stamp), info.value
    with open(stamp) as f:
        return str(info.value), time.time() - float(f.read()), pids


def test_runtime_failed_rank_stops_the_run_in_bounded_time(tmp_path):
    """Killed, crashed and stalled rank 1 (three launches side by side, to keep the test short)."""
    from concurrent.futures import ThreadPoolExecutor

    timeout_s = 3.0  # also the heartbeat limit: a loaded 2-core machine can delay a beat by a second
    with ThreadPoolExecutor(len(FATES)) as pool:
        runs = dict(zip(FATES, pool.map(lambda f: _failed_launch(f, timeout_s, tmp_path), FATES)))
    for fate, (message, seconds, pids) in runs.items():
        assert FATES[fate] in message, (fate, message)
        assert "\n" not in message and "none left running" in message, message
        assert seconds < 10 + timeout_s, (fate, seconds)  # detection and stop (+ the collective timeout)
        assert _pids_gone(pids), fate
    assert "--collective-timeout" in runs["stop"][0]


# A migration that fails mid-transfer inside a training step (communication error, continue / stop) is
# checked inside the equivalence launches of tests/test_runtime.py (relibra.runtime.verify), which already
# pay megatron-core's start-up; rank 0's result there comes back through launch()'s JSON file.


@pytest.mark.parametrize("argv, field", [
    (["--nodes", "0"], "--nodes"),
    (["--nproc", "0"], "--nproc"),
    (["--steps", "0"], "--steps"),
    (["--warmup-steps", "-1"], "--warmup-steps"),
    (["--policies", "megatron,"], "--policies"),
    (["--policies", "megatron,megatron"], "twice"),
    (["--collective-timeout", "0"], "--collective-timeout"),
    (["--policy-param", "nosuch=3"], "nosuch"),
    (["--lr", "inf"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--seed", "-1"], "--seed"),
    (["--collective-timeout", "inf"], "--collective-timeout"),
    (["--collective-timeout", "nan"], "--collective-timeout"),
    (["--tokens-per-rank", str(10**12)], "tokens per step"),
])
def test_runtime_run_bad_options_give_one_error_line(argv, field, capsys):
    from relibra.cli import main

    assert main(["run", "--model", "tiny", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and field in err[0], err


def _tiny_trace_with(path, **model_changes):
    import dataclasses

    from relibra.cluster import get_model
    from relibra.workloads import generate_trace

    shape = dataclasses.replace(get_model("tiny"), **model_changes)  # still named "tiny"
    generate_trace(shape, "math", ep=2, steps=3, micro_batches=1, tokens_per_rank=16, token_level=True).save(path)
    return str(path)


@pytest.mark.parametrize("change, field", [({"top_k": 1}, "top_k"), ({"vocab_size": 99}, "vocab_size")])
def test_runtime_refuses_a_trace_shaped_unlike_its_model(change, field, tmp_path, capsys):
    from relibra.cli import main

    path = _tiny_trace_with(tmp_path / "t.npz", **change)
    assert main(["run", "--trace", path, "--steps", "1", "--warmup-steps", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and "t.npz" in err[0], err


def test_runtime_run_checks_out_path_before_work(tmp_path, capsys):
    from relibra.cli import main

    blocker = tmp_path / "base.npz"
    blocker.write_text("x")
    t0 = time.monotonic()
    assert main(["run", "--model", "tiny", "--out", str(blocker / "x")]) == 2
    assert time.monotonic() - t0 < 5
    assert "error:" in capsys.readouterr().err


TORCHRUN = [sys.executable, "-m", "relibra.runtime.torchrun", "--standalone", "--nproc-per-node", "2", "-m",
            "relibra", "run", "--torchrun", "--model", "tiny", "--policies", "megatron", "--steps", "1",
            "--warmup-steps", "0", "--micro-batches", "1", "--tokens-per-rank", "16"]


def test_runtime_under_torchrun_prints_json():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*TORCHRUN, "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(line) == 1, proc.stdout
    res = json.loads(line[0])["results"]
    assert [r["policy"] for r in res] == ["megatron"]
    assert res[0]["ranks"] == 2 and res[0]["step_s_median"] > 0 and res[0]["sim_step_s"] > 0
    assert len(res[0]["cpu_s_per_rank"]) == 2 and all(c > 0 for c in res[0]["cpu_s_per_rank"])


def test_runtime_under_torchrun_fails_in_one_line(tmp_path):
    """A clean error on every rank: one `error:` line, no torchrun traceback or failure report."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*TORCHRUN, "--trace", str(tmp_path / "none.npz")], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'none.npz'}: no such file"], proc.stderr
