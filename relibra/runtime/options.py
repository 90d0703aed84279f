"""Options of one runtime launch and their command-line flags (no torch import: the CLI loads this
at start-up)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from relibra.errors import ConfigError


@dataclass
class RunOptions:
    """Everything one launch needs (the same on every rank)."""

    nodes: int = 2
    policy: str = "relibra"
    steps: int = 3
    trace: str | None = None
    model: str = "tiny"
    workload: str = "math"
    micro_batches: int = 4
    tokens_per_rank: int = 256
    seed: int = 0
    lr: float = 1e-3
    dtype: str = "float32"
    threads_per_rank: int = 1
    check_equivalence: bool = False
    policy_params: dict = field(default_factory=dict)
    out: str | None = None
    warmup_steps: int = 0  # extra untimed steps first (not recorded)


def parse_args(argv: list[str] | None = None) -> RunOptions:
    p = argparse.ArgumentParser(prog="relibra.runtime.train")
    add_run_arguments(p)
    return options_from_args(p.parse_args(argv))


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=1, help="simulated nodes (ranks are split evenly; default 1)")
    p.add_argument("--policy", default="relibra", help="policy name (relibra.policies; default relibra)")
    p.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    p.add_argument("--trace", default=None, help="RoutingTrace .npz (EP must equal the number of ranks)")
    p.add_argument("--model", default="tiny", help="model preset when no trace is given (default tiny)")
    p.add_argument("--workload", default="math", help="workload of the synthetic trace (default math)")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per step (default 4)")
    p.add_argument("--tokens-per-rank", type=int, default=256, help="tokens per rank and micro-batch (default 256)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--dtype", choices=("float32", "float64"), default=None,
                   help="default float32; float64 when --check-equivalence is given")
    p.add_argument("--threads-per-rank", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--warmup-steps", type=int, default=0, help="untimed steps run first (default 0)")
    p.add_argument("--policy-param", action="append", default=[], metavar="KEY=VALUE",
                   help="policy parameter, repeatable (e.g. min_replica_tokens=16)")
    p.add_argument("--check-equivalence", action="store_true",
                   help="also train the static placement on the same data and compare")
    p.add_argument("--out", default=None, help="folder for metrics.csv and summary.json")


def _parse_value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def options_from_args(args) -> RunOptions:
    params = {}
    for item in args.policy_param:
        if "=" not in item:
            raise ConfigError(f"--policy-param expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        params[key] = _parse_value(value)
    dtype = args.dtype or ("float64" if args.check_equivalence else "float32")
    return RunOptions(nodes=args.nodes, policy=args.policy, steps=args.steps, trace=args.trace, model=args.model,
                      workload=args.workload, micro_batches=args.micro_batches, tokens_per_rank=args.tokens_per_rank,
                      seed=args.seed, lr=args.lr, dtype=dtype, threads_per_rank=args.threads_per_rank,
                      check_equivalence=args.check_equivalence, policy_params=params, out=args.out,
                      warmup_steps=args.warmup_steps)


