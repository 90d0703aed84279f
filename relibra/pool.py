"""One function over many items in worker processes, the results in the items' order."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable, Sequence, TypeVar

from relibra.progress import progress as tqdm

T = TypeVar("T")
R = TypeVar("R")

_BLAS_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
PARENT_POLL_S = 0.5  # how often a worker checks that the process that started it still runs


def _watch_parent(parent_pid: int) -> None:
    """End this worker once its parent is gone (killed outright, e.g. SIGKILL, so it could not stop us)."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _worker_start(parent_pid: int) -> None:
    """Each worker's initializer: Ctrl-C (SIGINT, sent to the whole process group) is the parent's to
    handle, which then stops the workers; a worker whose parent died ends itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and end every worker now (SIGTERM, then SIGKILL after 2 s), rather
    than waiting for the running items as ProcessPoolExecutor's shutdown does."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)


def map_in_order(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None, progress: bool = True,
                 desc: str = "cases", unit: str = "case") -> list[R]:
    """[fn(item) for item in items] in `workers` processes (default: one per core, at most len(items)), with a
    tqdm bar; the results come back in the items' order whatever the workers' timing, so the same items give
    the same list. fn and the items must pickle (module-level functions, plain data): workers are spawned.
    An exception in the caller (KeyboardInterrupt from SIGINT, SIGTERM's, a failing item) ends the workers
    at once: none outlives the call, and none outlives its parent."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(items)))
    bar = tqdm(total=len(items), desc=desc, unit=unit, disable=not progress)
    results: list = [None] * len(items)
    if workers == 1:
        for i, item in enumerate(items):
            results[i] = fn(item)
            bar.update()
    else:
        # one BLAS thread per worker: the cores are the workers'
        saved = {k: os.environ.get(k) for k in _BLAS_THREADS}
        os.environ.update({k: "1" for k in saved})
        try:
            # spawned, not forked: a fork of a process that runs threads (torch's, tqdm's monitor, a test
            # runner's) can copy a held lock into the child and hang it (seen in the test suite)
            pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_worker_start, initargs=(os.getpid(),))
            try:
                futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.update()
            except BaseException:
                _stop_workers(pool)
                raise
            pool.shutdown(wait=True)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    bar.close()
    return results
