"""Options of one runtime launch and their command-line flags (no torch import: the CLI loads this
at start-up). RunOptions holds the one set of defaults: the flags read theirs from it."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from relibra.errors import ConfigError

POLICY_CHOICES_HINT = "megatron, relibra, balanced, eplb+, ... (relibra.policies)"


@dataclass
class RunOptions:
    """Everything one launch needs (the same on every rank).

    policies: trained one after another on the same data (same trace, seed and initial weights).
    warmup_steps + steps: untimed steps first, then timed ones; the trace holds both.
    expert_order: "hot-first" relabels a synthetic trace's experts per layer by popularity, so the
        static contiguous placement puts the hot experts together (the worst case a placement that
        ignores routing can meet); "trace" keeps the generator's ids. Trace files are never relabelled.
    collective_timeout_s: gloo/NCCL timeout of every collective; a stalled rank ends the run after it.
    on_migration_failure: "continue" (keep the old placement, one warning line) or "stop".
    """

    nodes: int = 1
    policies: tuple = ("relibra",)
    steps: int = 5
    warmup_steps: int = 2
    trace: str | None = None
    model: str = "tiny"
    workload: str = "math"
    micro_batches: int = 4
    tokens_per_rank: int = 256
    expert_order: str = "hot-first"
    seed: int = 0
    lr: float = 1e-3
    dtype: str = "float32"
    threads_per_rank: int = 1
    check_equivalence: bool = False
    policy_params: dict = field(default_factory=dict)
    out: str | None = None
    collective_timeout_s: float = 120.0
    on_migration_failure: str = "continue"
    inject_migration_failure: tuple | None = None  # (rank, transfer index): tests of the rollback path

    @property
    def policy(self) -> str:
        return self.policies[0]

    def for_policy(self, policy: str) -> "RunOptions":
        return dataclasses.replace(self, policies=(policy,))

    def validate(self) -> "RunOptions":
        """Raise ConfigError naming the first bad option."""
        for name in ("nodes", "steps", "micro_batches", "tokens_per_rank", "threads_per_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError(f"--warmup-steps must be >= 0, got {self.warmup_steps!r}")
        if not (self.lr > 0):
            raise ConfigError(f"--lr must be positive, got {self.lr!r}")
        if not (self.collective_timeout_s > 0):
            raise ConfigError(f"--collective-timeout must be positive seconds, got {self.collective_timeout_s!r}")
        if not self.policies or any(not p for p in self.policies):
            raise ConfigError(f"--policies needs at least one policy name, got {','.join(self.policies)!r}")
        if len(set(self.policies)) != len(self.policies):
            raise ConfigError(f"--policies names a policy twice: {','.join(self.policies)}")
        if self.expert_order not in ("hot-first", "trace"):
            raise ConfigError(f"--expert-order must be hot-first or trace, got {self.expert_order!r}")
        if self.on_migration_failure not in ("continue", "stop"):
            raise ConfigError(f"--on-migration-failure must be continue or stop, got {self.on_migration_failure!r}")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"--dtype must be float32 or float64, got {self.dtype!r}")
        return self


_DEFAULTS = RunOptions()


def parse_args(argv: list[str] | None = None) -> RunOptions:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="relibra.runtime.train")
    add_run_arguments(p)
    return options_from_args(p.parse_args(argv))


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    p.add_argument("--nodes", type=int, default=d.nodes,
                   help=f"simulated nodes (ranks are split evenly; default {d.nodes})")
    p.add_argument("--policies", "--policy", dest="policies", default=",".join(d.policies),
                   help=f"comma-separated policies, each trained on the same data ({POLICY_CHOICES_HINT}; "
                        f"default {','.join(d.policies)})")
    p.add_argument("--steps", type=int, default=d.steps, help=f"timed training steps (default {d.steps})")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps,
                   help=f"untimed steps run first (default {d.warmup_steps})")
    p.add_argument("--trace", default=None, help="RoutingTrace .npz (EP must equal the number of ranks)")
    p.add_argument("--model", default=d.model, help=f"model preset when no trace is given (default {d.model})")
    p.add_argument("--workload", default=d.workload, help=f"workload of the synthetic trace (default {d.workload})")
    p.add_argument("--micro-batches", type=int, default=d.micro_batches,
                   help=f"micro-batches per step (default {d.micro_batches})")
    p.add_argument("--tokens-per-rank", type=int, default=d.tokens_per_rank,
                   help=f"tokens per rank and micro-batch (default {d.tokens_per_rank})")
    p.add_argument("--expert-order", choices=("hot-first", "trace"), default=d.expert_order,
                   help="synthetic traces: relabel experts hottest first (static placement's worst case) or keep "
                        f"the generator's ids (default {d.expert_order})")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--lr", type=float, default=d.lr, help=f"AdamW learning rate (default {d.lr:g})")
    p.add_argument("--dtype", choices=("float32", "float64"), default=None,
                   help="default float32; float64 when --check-equivalence is given")
    p.add_argument("--threads-per-rank", type=int, default=d.threads_per_rank,
                   help=f"torch threads per rank (default {d.threads_per_rank})")
    p.add_argument("--policy-param", action="append", default=[], metavar="KEY=VALUE",
                   help="policy parameter, repeatable (e.g. min_replica_tokens=16); given to every policy that "
                        "has it")
    p.add_argument("--check-equivalence", action="store_true",
                   help="also train the static placement on the same data and compare")
    p.add_argument("--collective-timeout", type=float, default=d.collective_timeout_s,
                   help=f"seconds before a collective waiting on a stalled rank fails (default "
                        f"{d.collective_timeout_s:g})")
    p.add_argument("--on-migration-failure", choices=("continue", "stop"), default=d.on_migration_failure,
                   help="after a rolled-back migration: keep training on the old placement (one warning) or stop")
    p.add_argument("--json", action="store_true", help="print one JSON object {\"results\": [...]} instead of tables")
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
    policies = tuple(p.strip() for p in str(args.policies).split(","))
    opts = RunOptions(nodes=args.nodes, policies=policies, steps=args.steps, trace=args.trace, model=args.model,
                      workload=args.workload, micro_batches=args.micro_batches, tokens_per_rank=args.tokens_per_rank,
                      expert_order=args.expert_order, seed=args.seed, lr=args.lr, dtype=dtype,
                      threads_per_rank=args.threads_per_rank, check_equivalence=args.check_equivalence,
                      policy_params=params, out=args.out, warmup_steps=args.warmup_steps,
                      collective_timeout_s=args.collective_timeout, on_migration_failure=args.on_migration_failure)
    opts.validate()
    if opts.out is not None:
        from relibra.paths import check_output_path

        check_output_path(opts.out, kind="dir")
    return opts
