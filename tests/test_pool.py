import os

from relibra.pool import map_in_order


def _square_after_a_while(x: int) -> int:
    import time

    time.sleep(0.05 * (3 - x % 4))  # later items finish first
    return x * x


def test_results_come_back_in_the_items_order_from_two_workers():
    before = os.environ.get("OMP_NUM_THREADS")
    items = list(range(8))
    assert map_in_order(_square_after_a_while, items, workers=2, progress=False) == [x * x for x in items]
    assert map_in_order(_square_after_a_while, items, workers=1, progress=False) == [x * x for x in items]
    assert os.environ.get("OMP_NUM_THREADS") == before  # the workers' one-thread setting is undone
