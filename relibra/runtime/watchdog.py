"""Liveness between the local launcher and its ranks, both ways, outside every collective.

Rank -> launcher: each rank runs a heartbeat thread that touches `heartbeat<rank>` in the run's
private folder every `beat_s`. A thread keeps beating while the rank waits inside a collective (torch
releases the GIL there), so a silent file means the whole process stopped (SIGSTOP, a debugger, a
native hang holding the GIL). The launcher's `Heartbeats` names a rank silent for `silent_s`; this
covers every collective, including gloo's all-to-all, which does not honour the process group's
timeout the way its barrier does.

Launcher -> rank: each rank runs a thread that waits on its parent's sentinel (a pipe only the
parent holds open). When the parent dies (SIGKILL included) the pipe closes: the rank removes the
run's private folder and exits at once, so no rank trains on as an orphan and nothing is left behind.
"""

from __future__ import annotations

import multiprocessing.connection
import multiprocessing.process
import os
import shutil
import threading
import time


def heartbeat_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"heartbeat{rank}")


def beat_interval_s(silent_s: float) -> float:
    """Beat often enough that a few missed beats never reach `silent_s`."""
    return max(0.05, min(0.5, silent_s / 8))


def start_heartbeat(folder: str, rank: int, beat_s: float) -> None:
    """Touch heartbeat<rank> in `folder` now and then every `beat_s` seconds (daemon thread)."""
    path = heartbeat_path(folder, rank)
    with open(path, "w"):
        pass

    def beat() -> None:
        while True:
            try:
                os.utime(path)
            except OSError:  # the folder is gone: the launcher has finished or died
                return
            time.sleep(beat_s)

    threading.Thread(target=beat, name="relibra-heartbeat", daemon=True).start()


def start_together(folder: str, rank: int, world: int, limit_s: float) -> None:
    """Wait until every rank has reached this point (a file each in `folder`), for at most `limit_s`.

    Ranks start skewed by seconds on a busy machine (interpreter start, imports); meeting here first
    keeps that skew out of the process group's rendezvous, which runs under the collective timeout.
    """
    with open(os.path.join(folder, f"ready{rank}"), "w"):
        pass
    deadline = time.monotonic() + limit_s
    while True:
        missing = [r for r in range(world) if not os.path.exists(os.path.join(folder, f"ready{r}"))]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {missing[0]} did not start within {limit_s:g} s")
        time.sleep(0.02)


def exit_with_parent(folder: str) -> None:
    """Exit this process (after removing `folder`) as soon as the process that spawned it ends.

    Uses the sentinel multiprocessing gives a spawned child; does nothing outside one.
    """
    parent = multiprocessing.process.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, name="relibra-parent-watch", daemon=True).start()


class Heartbeats:
    """The launcher's view of its ranks' heartbeat files.

    A rank is silent once its file has not changed for `silent_s` (measured on the launcher's monotonic
    clock, so a wall-clock jump is no stall). Before its first beat a rank gets `start_s` more to start
    (interpreter start-up, imports of torch; its peers wait for it in `start_together` as long).
    """

    def __init__(self, folder: str, ranks: int, silent_s: float, start_s: float = 120.0):
        self.folder, self.silent_s, self.start_s = folder, silent_s, start_s + silent_s
        now = time.monotonic()
        self._seen = {r: (None, now) for r in range(ranks)}  # rank -> (last mtime_ns, when it last changed)

    def silent(self, ranks) -> tuple[int, float, bool] | None:
        """(rank, seconds silent, started) of the first of `ranks` past its limit, else None."""
        now = time.monotonic()
        for r in ranks:
            try:
                mtime = os.stat(heartbeat_path(self.folder, r)).st_mtime_ns
            except FileNotFoundError:
                mtime = None
            last, since = self._seen[r]
            if mtime != last:
                self._seen[r] = (mtime, now)
                continue
            limit = self.silent_s if mtime is not None else self.start_s
            if now - since > limit:
                return r, now - since, mtime is not None
        return None
