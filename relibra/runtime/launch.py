"""Local multi-process launcher: N ranks on this machine over gloo, loopback only.

`launch(fn, world_size, *args)` starts N processes (multiprocessing, spawn), sets the torchrun-style
environment (RANK, WORLD_SIZE, LOCAL_RANK), joins the gloo group and calls fn(rank, world_size, *args)
in each. Rank 0's return value comes back as JSON through a temporary file (no pickle); it must be
JSON-able (numpy scalars and arrays are converted).

Nothing listens beyond loopback: the ranks meet through a FileStore in the run's private temporary
folder (mode 0700) instead of a TCP store, and gloo's own connections are bound to the loopback
interface (GLOO_SOCKET_IFNAME).

Failures end the whole run in bounded time: the parent watches every rank's process sentinel; the
first rank that exits non-zero (an exception: its JSON error file names it; a signal or crash: its exit
code) stops the others (SIGTERM, then SIGKILL after a second; SIGKILL also ends a stopped process)
and raises RankFailure with one line naming the rank and the cause. A rank that stalls (stopped, or
hung holding the interpreter) stops its heartbeat (relibra.runtime.watchdog); the launcher names it
once it has been silent for `timeout_s`, whatever collective the others wait in. A rank whose
collective fails after gloo's timeout ends the run the same way.

The launcher's own end ends the ranks: SIGTERM and SIGHUP are handled like SIGINT by the CLI (the
ranks are stopped and the temporary folder removed), and each rank watches its parent and exits,
removing the folder, when the launcher is killed outright.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import tempfile
import threading
import time

from tqdm import tqdm

from relibra.display import json_safe
from relibra.errors import RelibraError
from relibra.runtime import watchdog
from relibra.runtime.quiet import quiet_known_warnings

# How often the launcher looks at its ranks' exits and heartbeats.
POLL_S = 0.1
# How long ranks may take to start (spawn, import torch) before the launcher gives up on them.
START_S = 120.0


class RankFailure(RelibraError):
    """A rank of a local launch failed; the message names the rank and its exit cause."""


def loopback_interface() -> str:
    """Name of the loopback network interface (gloo binds its connections to it)."""
    names = [name for _, name in socket.if_nameindex()]
    for name in names:
        if name.startswith("lo"):  # lo on Linux, lo0 on macOS
            return name
    raise RelibraError(f"no loopback network interface among {', '.join(names)}; the runtime listens on "
                       "loopback only")


def _worker(rank: int, world_size: int, interface: str, threads: int, timeout_s: float, tmp: str, fn,
            args) -> None:
    watchdog.exit_with_parent(tmp)
    quiet_known_warnings()
    # Progress bars lock with a thread lock: a multiprocessing one is a named semaphore that a rank
    # stopped by the launcher could not release, and Python's resource tracker then warns about it.
    tqdm.set_lock(threading.RLock())
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      GLOO_SOCKET_IFNAME=interface)
    try:
        # torch loads in the rank only, inside the one-line error report: the launcher's own process
        # never needs it.
        import torch
        import torch.distributed as dist

        from relibra.runtime.groups import init_distributed

        torch.set_num_threads(threads)
        # Beats start once torch is imported: loading its libraries holds the interpreter for seconds.
        watchdog.start_heartbeat(tmp, rank, watchdog.beat_interval_s(timeout_s))
        watchdog.start_together(tmp, rank, world_size, START_S)
        init_distributed("gloo", timeout_s=timeout_s, store_file=os.path.join(tmp, "store"))
        try:
            out = fn(rank, world_size, *args)
            if rank == 0:
                with open(os.path.join(tmp, "result.json.tmp"), "w") as f:
                    json.dump(json_safe(out, strict=False), f)
                os.replace(os.path.join(tmp, "result.json.tmp"), os.path.join(tmp, "result.json"))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    except BaseException as exc:  # report the cause in one line to the parent, then exit non-zero
        message = " ".join(str(exc).split()) or type(exc).__name__
        with open(os.path.join(tmp, f"error{rank}.json"), "w") as f:
            json.dump({"type": type(exc).__name__, "message": message,
                       "relibra": isinstance(exc, RelibraError)}, f)
        sys.stderr.flush()
        os._exit(1)


def _cause(rank: int, exitcode: int, tmp: str) -> str:
    path = os.path.join(tmp, f"error{rank}.json")
    if os.path.exists(path):
        with open(path) as f:
            err = json.load(f)
        return err["message"] if err["relibra"] else f"{err['type']}: {err['message']}"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _stopped(pid: int) -> bool:
    """Whether a process is stopped (SIGSTOP, a debugger): it cannot act on SIGTERM until continued."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _stop(procs: list) -> None:
    """SIGTERM every live rank (SIGKILL a stopped one at once), SIGKILL what is left after a second; join all."""
    for p in procs:
        if p.is_alive() and _stopped(p.pid):
            p.kill()
        elif p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 1.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()


def launch(fn, world_size: int, *args, threads_per_rank: int = 1, timeout_s: float = 120.0,
           on_start=None):
    """Run fn(rank, world_size, *args) on `world_size` local gloo ranks; return rank 0's result.

    timeout_s: the collective timeout of every rank, and how long a rank may go without a heartbeat.
    on_start(pids): called once the ranks are started (tests use it to kill or stop one). Raises
    RankFailure naming the first failing (or silent) rank.
    """
    ctx = multiprocessing.get_context("spawn")
    interface = loopback_interface()
    with tempfile.TemporaryDirectory(prefix="relibra-run-") as tmp:
        procs = [ctx.Process(target=_worker, args=(r, world_size, interface, threads_per_rank, timeout_s, tmp, fn,
                                                   args), daemon=False) for r in range(world_size)]
        try:
            for p in procs:
                p.start()
            if on_start is not None:
                on_start([p.pid for p in procs])
            heartbeats = watchdog.Heartbeats(tmp, world_size, timeout_s, start_s=START_S)
            waiting = {p.sentinel: r for r, p in enumerate(procs)}
            while waiting:
                for sentinel in multiprocessing.connection.wait(list(waiting), timeout=POLL_S):
                    rank = waiting.pop(sentinel)
                    procs[rank].join()
                    code = procs[rank].exitcode
                    if code != 0:
                        time.sleep(0.2)  # let a rank that died first be seen as dead, not as a peer
                        raise RankFailure(_diagnose(procs, rank, tmp, timeout_s))
                silent = heartbeats.silent(sorted(waiting.values()))
                if silent is not None:
                    raise RankFailure(_silent(procs, *silent, timeout_s))
        except BaseException:
            _stop(procs)
            raise
        with open(os.path.join(tmp, "result.json")) as f:
            return json.load(f)


def _silent(procs: list, rank: int, seconds: float, started: bool, timeout_s: float) -> str:
    """One line naming a rank whose heartbeat stopped (or never started); stops every rank first."""
    _stop(procs)
    tail = f"; the run was stopped ({len(procs)} ranks, none left running)"
    if not started:
        return f"rank {rank} did not start: no heartbeat within {seconds:.0f} s" + tail
    return f"rank {rank} stalled: no heartbeat for {seconds:.1f} s (--collective-timeout {timeout_s:g})" + tail


_PEER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe")


def _diagnose(procs: list, observed: int, tmp: str, timeout_s: float) -> str:
    """One line naming the rank that caused a failure and why; stops every rank first."""
    codes = {r: p.exitcode for r, p in enumerate(procs)}
    alive = [r for r, c in codes.items() if c is None]
    _stop(procs)
    cause = _cause(observed, codes[observed], tmp)
    tail = f"; the run was stopped ({len(procs)} ranks, none left running)"
    signalled = [r for r, c in codes.items() if c is not None and c < 0]
    if signalled:
        r = signalled[0]
        return f"rank {r} {_cause(r, codes[r], tmp)}" + tail
    if any(s in cause.lower() for s in _PEER_LOST):
        dead = [r for r, c in codes.items() if c not in (None, 0) and r != observed]
        if dead:
            return f"rank {dead[0]}: {_cause(dead[0], codes[dead[0]], tmp)}" + tail
    if "timed out" in cause.lower() or "timeout" in cause.lower():
        who = ", ".join(str(r) for r in alive) or "?"
        return (f"rank {who} stalled: rank {observed}'s collective timed out after {timeout_s:g} s "
                f"(--collective-timeout)") + tail
    return f"rank {observed}: {cause}" + tail
