"""`relibra calibrate`: fit a cluster preset for this machine from micro-benchmarks (relibra.bench.calibrate)."""

from __future__ import annotations


def register(sub) -> None:
    from relibra.bench.calibrate import add_arguments, run

    p = sub.add_parser("calibrate", help="micro-benchmark this machine (expert GEMM, gloo all-to-all and "
                       "point-to-point, AdamW) and fit the cpu-gloo-fit cluster preset")
    add_arguments(p)
    p.set_defaults(func=run)
