"""The local launcher's liveness in both directions, one table per fault family (2 ranks, plain
torch.distributed, seconds each):
- a stalled rank (stopped inside any collective, rank 0 or not) ends the run within timeout + 10 s
  with one line naming it;
- a launcher ended by SIGTERM, SIGHUP or SIGKILL leaves no rank running and no temporary folder;
- a run listens on loopback only;
- a failed run prints no resource-tracker warnings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- workers (module level: the spawned ranks import them) ----------------------------------------------
def _collective(op: str):
    import torch
    import torch.distributed as dist

    if op == "barrier":
        return dist.barrier
    if op == "all_reduce":
        return lambda: dist.all_reduce(torch.ones(4))
    if op == "all_to_all":
        world = dist.get_world_size()
        return lambda: dist.all_to_all_single(torch.empty(2 * world), torch.ones(2 * world),
                                              [2] * world, [2] * world)
    raise ValueError(op)


def _stall_in(rank: int, world: int, op: str, stalled: int, stamp: str) -> dict:
    """Every rank loops over `op`; rank `stalled` stops itself (SIGSTOP) after writing the time."""
    import torch.distributed as dist

    call = _collective(op)
    dist.barrier()
    for i in range(2000):
        if i == 3 and rank == stalled:
            with open(stamp, "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)
        call()
        time.sleep(0.02)
    return {"ok": True}


def _forever(rank: int, world: int, listeners: str) -> dict:
    """Collectives until stopped; rank 0 records every rank's inet listeners once the group is up."""
    import torch.distributed as dist

    call = _collective("all_to_all")
    call()
    if rank == 0:
        with open(listeners + ".tmp", "w") as f:
            for proc in [psutil.Process(os.getppid()), *psutil.Process(os.getppid()).children()]:
                for c in proc.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        f.write(f"{proc.pid} {c.laddr.ip} {c.laddr.port}\n")
        os.replace(listeners + ".tmp", listeners)
    while True:
        call()
        dist.barrier()
        time.sleep(0.02)


def _fail_after_progress(rank: int, world: int) -> dict:
    """Rank 0 shows a progress bar (as training does), then rank 1 fails."""
    import torch.distributed as dist
    from tqdm.auto import tqdm

    for _ in tqdm(range(3), disable=rank != 0):
        dist.barrier()
    if rank == 1:
        raise RuntimeError("failure on purpose")
    dist.barrier()
    return {}


def _gone(pids) -> bool:
    return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


# ---- family: stalled rank -------------------------------------------------------------------------------
STALLS = [  # (collective the survivors wait in, rank that stops)
    ("all_to_all", 1),
    ("all_to_all", 0),  # rank 0 also holds the store
    ("all_reduce", 1),
    ("barrier", 1),
]


def _stalled_launch(op: str, stalled: int, timeout_s: float, folder) -> tuple[str, float, list[int]]:
    from relibra.runtime.launch import RankFailure, launch

    pids, stamp = [], str(folder / f"{op}{stalled}.time")
    with pytest.raises(RankFailure) as info:
        launch(_stall_in, 2, op, stalled, stamp, timeout_s=timeout_s, on_start=pids.extend)
    assert os.path.exists(stamp), info.value
    with open(stamp) as f:
        return str(info.value), time.time() - float(f.read()), pids


def test_stalled_rank_in_any_collective_is_named_within_timeout(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    timeout_s = 3.0
    with ThreadPoolExecutor(len(STALLS)) as pool:
        runs = list(pool.map(lambda case: _stalled_launch(*case, timeout_s, tmp_path), STALLS))
    for (op, stalled), (message, seconds, pids) in zip(STALLS, runs):
        assert message.startswith(f"rank {stalled} stalled"), (op, stalled, message)
        assert "\n" not in message and "none left running" in message, message
        # silence counts from the rank's last beat, which may precede its stamp by one beat interval
        assert timeout_s - 0.5 <= seconds < timeout_s + 10, (op, stalled, seconds)
        assert _gone(pids), (op, stalled)


# ---- family: the launcher ends ---------------------------------------------------------------------------
LAUNCHER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    from relibra.cli import run_command
    from relibra.runtime.launch import launch
    from test_runtime_watchdog import _forever

    def started(pids):
        with open({pids!r} + ".tmp", "w") as f:
            f.write(" ".join(map(str, pids)))
        import os
        os.replace({pids!r} + ".tmp", {pids!r})

    sys.exit(run_command(lambda: launch(_forever, 2, {listeners!r}, timeout_s=30, on_start=started)))
""")


def _launcher(tmp_path):
    """A launcher process running `_forever` on 2 ranks, its private temp root, its ranks' pids."""
    pids, listeners, temp = tmp_path / "pids", tmp_path / "listeners", tmp_path / "tmp"
    temp.mkdir()
    code = LAUNCHER.format(here=HERE, pids=str(pids), listeners=str(listeners))
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(temp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not listeners.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "ranks did not start"
        time.sleep(0.1)
    return proc, temp, [int(x) for x in pids.read_text().split()], listeners.read_text()


ENDINGS = [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL]


def _end_launcher(sig, folder) -> tuple[float, list, str, int, list]:
    """(seconds until its ranks are gone, ranks still alive, stderr, exit code, what is left in its temp)."""
    folder.mkdir()
    proc, temp, pids, _ = _launcher(folder)
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    while not _gone(pids) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    seconds = time.monotonic() - t0
    while os.listdir(temp) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    alive = [p for p in pids if not _gone([p])]
    return seconds, alive, err, proc.returncode, os.listdir(temp)


def test_ending_the_launcher_ends_its_ranks_and_removes_its_folder(tmp_path):
    """SIGTERM and SIGHUP (handled like SIGINT) and SIGKILL (the ranks see their parent's pipe close);
    three launchers side by side."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(ENDINGS)) as pool:
        ends = list(pool.map(lambda sig: _end_launcher(sig, tmp_path / sig.name), ENDINGS))
    for sig, (seconds, alive, err, code, left) in zip(ENDINGS, ends):
        assert not alive and seconds < 5, (sig.name, seconds, alive)
        assert left == [], (sig.name, left)
        assert "resource_tracker" not in err, err
        if sig != signal.SIGKILL:
            assert code == 128 + sig and err.strip().endswith(f"stopped by {sig.name}"), err[-500:]


# ---- family: listeners -----------------------------------------------------------------------------------
def test_a_run_listens_on_loopback_only(tmp_path):
    proc, _, pids, listeners = _launcher(tmp_path)
    proc.terminate()
    proc.communicate(timeout=30)
    rows = [line.split() for line in listeners.splitlines()]
    assert {int(pid) for pid, _, _ in rows} <= {proc.pid, *pids}
    assert rows, "gloo's connections listen somewhere; none were found"
    assert all(ip in ("127.0.0.1", "::1") for _, ip, _ in rows), listeners


# ---- family: unclear endings ---------------------------------------------------------------------------
def test_a_failed_run_ends_with_its_one_error_line(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {HERE!r})
        from relibra.cli import run_command
        from relibra.runtime.launch import launch
        from test_runtime_watchdog import _fail_after_progress
        sys.exit(run_command(lambda: launch(_fail_after_progress, 2, timeout_s=30)))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 2
    last = proc.stderr.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("error: rank 1: RuntimeError: failure on purpose"), proc.stderr[-1000:]
    assert "resource_tracker" not in proc.stderr and "leaked" not in proc.stderr, proc.stderr[-1000:]
    assert os.listdir(tmp_path) == []
