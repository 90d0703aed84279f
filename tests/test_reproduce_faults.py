"""`relibra reproduce` under faults: one writer per output folder, a notebook's earlier results kept
through SIGINT, SIGTERM, SIGKILL of the parent and a kernel's death, SIGINT and SIGTERM stopping a
worker pool within seconds with nothing left running, and -p / --seed values that clash with what
reproduce sets itself. Real runs use the tiny profile and notebook 02 (the fastest one with a
worker pool); the other cases are refused before any kernel starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relibra.reproduce import LOCK_NAME, OutputLock, recover_folders

ROOT = Path(__file__).resolve().parents[1]
NB = "02_throughput"


def _table() -> dict[int, tuple[int, str]]:
    """{pid: (parent pid, command line)} of every process (Linux /proc)."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            out[int(d)] = (ppid, cmd)
    return out


def _family(pid: int) -> tuple[set[int], dict]:
    """The processes of a reproduce run: its descendants, its kernel (in a session of its own, found by
    the kernel folder named after the parent's pid) and the kernel's descendants (its worker pool)."""
    table = _table()

    def below(p):
        kids = {q for q, (pp, _) in table.items() if pp == p}
        return kids.union(*(below(k) for k in kids)) if kids else set()

    found = below(pid)
    for p, (_, cmd) in table.items():
        if f"relibra-kernel-{pid}-" in cmd:
            found |= {p} | below(p)
    return found, table


def _start(out: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # started as from an interactive shell: a suite launched in the background (`cmd &`, nohup) runs with
    # SIGINT ignored, which a child would inherit, and Ctrl-C is what these tests send
    return subprocess.Popen([sys.executable, "-m", "relibra", "reproduce", "--profile", "tiny", "--quiet",
                             "--out", str(out), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _until_pool(proc: subprocess.Popen, timeout_s: float = 240) -> set[int]:
    """Wait until the run's kernel has started its worker pool; returns every process of the run seen."""
    seen, deadline = set(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the run ended before its worker pool started: {proc.communicate()}")
        family, table = _family(proc.pid)
        seen |= family
        if any("spawn_main" in table[p][1] for p in family if p in table):
            return seen
        time.sleep(0.1)
    proc.kill()
    pytest.fail("no worker pool within the time allowed")


def _gone(pids: set[int], within_s: float) -> list[int]:
    """The pids still running after within_s seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]
        if not alive:
            return []
        time.sleep(0.2)
    return alive


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _earlier_results(out: Path) -> None:
    (out / NB).mkdir(parents=True)
    (out / NB / "earlier.csv").write_text("kept\n")


def _only_earlier_results(out: Path) -> None:
    assert sorted(os.listdir(out / NB)) == ["earlier.csv"]
    leftovers = [n for n in os.listdir(out) if n.startswith(".") or n.endswith(".failed")]
    assert leftovers == [], leftovers


@pytest.mark.parametrize("sig, code, line", [(signal.SIGINT, 130, "error: interrupted"),
                                             (signal.SIGTERM, 143, "error: stopped by SIGTERM")])
def test_a_signal_inside_the_worker_pool_stops_the_run_within_seconds(sig, code, line, tmp_path):
    out = tmp_path / "out"
    _earlier_results(out)
    proc = _start(out, NB)
    seen = _until_pool(proc)
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert proc.returncode == code
    assert err.strip().splitlines()[-1] == line
    assert _gone(seen, 5) == []  # no kernel, no worker left
    _only_earlier_results(out)


def test_a_killed_parent_leaves_nothing_running_and_the_next_run_puts_the_results_back(tmp_path):
    out = tmp_path / "out"
    _earlier_results(out)
    proc = _start(out, NB)
    seen = _until_pool(proc)
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone(seen, 10) == []  # the kernel sees its parent gone, the workers theirs
    assert (out / f".{NB}.previous" / "earlier.csv").exists()
    from relibra.report import notebook_folders

    rows = {r["folder"]: r for r in notebook_folders(out)}
    assert rows[f"{NB}/"]["stale"].startswith("yes") and f".{NB}.previous/" in rows
    with OutputLock(out) as lock:  # the dead run's lock is taken over
        assert lock.previous_holder == str(proc.pid)
        assert recover_folders(out) == [NB]
    _only_earlier_results(out)


def test_a_dead_kernel_fails_the_notebook_and_keeps_the_earlier_results(tmp_path):
    out = tmp_path / "out"
    _earlier_results(out)
    proc = _start(out, NB)
    seen = _until_pool(proc)
    table = _table()
    kernel = next(p for p in seen if "ipykernel" in table.get(p, (0, ""))[1])
    os.kill(kernel, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and f"error: {NB}: failed" in err
    assert _gone(seen, 10) == []
    assert (out / f"{NB}.failed").is_dir()
    assert sorted(os.listdir(out / NB)) == ["earlier.csv"]
    report = (out / "REPORT.md").read_text()
    assert f"| {NB}/ | incomplete" in report and f"| {NB}.failed/ |" in report


def _hold(out: Path) -> subprocess.Popen:
    """Another process holding out's lock until killed."""
    code = ("import sys, time; from relibra.reproduce import OutputLock\n"
            f"with OutputLock({str(out)!r}):\n    print('held', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_one_writer_per_output_folder_and_a_dead_holder_is_taken_over(tmp_path, capsys):
    from relibra.cli import main

    out = tmp_path / "out"
    _earlier_results(out)
    holder = _hold(out)
    try:
        assert main(["reproduce", "00", "--profile", "tiny", "--quiet", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"(pid {holder.pid}) is writing there" in err[0], err
        assert sorted(os.listdir(out)) == sorted([LOCK_NAME, NB])  # nothing touched
    finally:
        holder.kill()
        holder.wait()
    assert (out / LOCK_NAME).read_text().strip() == str(holder.pid)  # left behind by SIGKILL
    with OutputLock(out) as lock:
        assert lock.previous_holder == str(holder.pid)
        assert (out / LOCK_NAME).read_text().strip() == str(os.getpid())
    assert not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("argv, words", [
    (["00", "-p", "out_dir", "docs"], ("-p out_dir docs", "tracked")),
    (["02", "-p", "out_dir", "tests/data/tiny_reference/02_throughput"], ("-p out_dir", "tracked")),
    (["00", "-p", "seed", "5"], ("-p seed", "--seed")),
    (["02", "-p", "profile", "laptop"], ("-p profile", "--profile")),
    (["02", "-p", "measured_dir", "x"], ("-p measured_dir", "--measured-dir")),
    (["02", "--seed", "7"], ("--seed 7", "02_throughput", "no seed")),
    (["00", "02", "--seed", "7"], ("--seed 7", "02_throughput", "no seed")),
    (["02", "-p", "out_dir", "/tmp/a", "--out", "/tmp/b"], ("two output folders",)),
])
def test_clashing_options_are_one_line_before_any_kernel(argv, words, capsys, monkeypatch):
    from relibra.cli import main

    monkeypatch.chdir(ROOT)
    before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    assert main(["reproduce", *argv, "--profile", "tiny", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and all(w in err[0] for w in words), err
    assert subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout == before
