"""One function over many items in worker processes, the results in the items' order."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable, Sequence, TypeVar

from relibra.progress import progress as tqdm

T = TypeVar("T")
R = TypeVar("R")

_BLAS_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def map_in_order(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None, progress: bool = True,
                 desc: str = "cases", unit: str = "case") -> list[R]:
    """[fn(item) for item in items] in `workers` processes (default: one per core, at most len(items)), with a
    tqdm bar; the results come back in the items' order whatever the workers' timing, so the same items give
    the same list. fn and the items must pickle (module-level functions, plain data): workers are spawned."""
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
            with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.update()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    bar.close()
    return results
