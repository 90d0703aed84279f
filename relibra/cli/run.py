"""`relibra run`: plan, train with expert parallelism (relibra.runtime), report next to the simulator.

    relibra run --nproc 2 --nodes 1 --model moe-cpu --policies megatron,relibra --json   # local gloo ranks
    torchrun --nproc-per-node 8 -m relibra run --torchrun --model ... --out DIR          # one process per rank
    python -m relibra.runtime.torchrun --nproc-per-node 8 -m relibra run --torchrun ...  # the same, failures in one line

Policies alternate step by step on the same data in one launch; the JSON holds each policy's median
step seconds, process CPU seconds per rank, the whole step split into segments with waiting apart,
the simulator's prediction, and the speed-up over megatron with its bootstrap 95% interval.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys

from relibra.errors import ConfigError

MAX_RUN_STEPS = 1000  # timed steps per policy: a CPU run of 1000 steps already takes hours (docs/runtime.md)
QUIET_WAIT_S = 60.0  # the default bound on waiting for a quiet machine (--quiet-wait)
QUIET_WAIT_ENV = "RELIBRA_QUIET_WAIT_S"  # overrides it (the tests set 0: their machine is shared)


def register(sub) -> None:
    from relibra.cli.setup import shared_options
    from relibra.runtime.config import FaultOptions, MeasurementOptions, ModelOptions, ParallelismOptions
    from relibra.runtime.measure import DataOptions
    from relibra.studies.params import add_flag, integer

    model, par, meas, faults, data = ModelOptions(), ParallelismOptions(), MeasurementOptions(), FaultOptions(), \
        DataOptions()
    shared, own = shared_options(), run_options()
    p = sub.add_parser("run", help="train with expert parallelism on local ranks (gloo) under policies' plans")
    p.add_argument("--nproc", type=integer(1).arg("--nproc"), default=2, help="ranks to launch (default 2)")
    p.add_argument("--torchrun", action="store_true",
                   help="join the torchrun job this process belongs to (RANK, WORLD_SIZE, ...) instead of launching")
    p.add_argument("--quiet-wait", type=float, default=None, metavar="SECONDS",
                   help="before measuring, wait at most this long while the 1-minute load average is above the "
                        f"usable cores, then go on (with a warning in the output and summary.json when still busy); "
                        f"default ${QUIET_WAIT_ENV} or {QUIET_WAIT_S:g} s, 0: do not wait")
    p.add_argument("--nodes", type=integer(1).arg("--nodes"), default=par.nodes,
                   help=f"simulated nodes (ranks are split evenly; default {par.nodes})")
    add_flag(p, shared, "policies", default="megatron,relibra; they alternate step by step on the same data")
    p.add_argument("--policy", dest="policies", type=p._option_string_actions["--policies"].type,
                   metavar="POLICIES", help="the same as --policies")
    add_flag(p, own, "steps", default=str(meas.steps))
    add_flag(p, own, "warmup_steps", default=str(meas.warmup_steps))
    p.add_argument("--no-split-waiting", dest="split_waiting", action="store_false",
                   help="no timed barrier before all-to-alls and replica transfers (waiting then hides in them)")
    p.add_argument("--trace", default=None, help="RoutingTrace .npz (EP must equal the number of ranks)")
    p.add_argument("--model", default=model.name, help=f"model preset (default {model.name})")
    p.add_argument("--workload", default=data.workload, help=f"workload of the synthetic trace (default {data.workload})")
    add_flag(p, shared, "micro_batches", default=str(data.micro_batches))
    p.add_argument("--tokens-per-rank", type=integer(1).arg("--tokens-per-rank"), default=data.tokens_per_rank,
                   help=f"tokens per rank and micro-batch (default {data.tokens_per_rank})")
    p.add_argument("--expert-order", choices=("hot-first", "trace"), default=data.expert_order,
                   help="synthetic traces: relabel experts hottest first (static placement's worst case) or keep "
                        f"the generator's ids (default {data.expert_order})")
    p.add_argument("--seed", type=int, default=model.seed)
    p.add_argument("--lr", type=float, default=model.lr, help=f"AdamW learning rate (default {model.lr:g})")
    p.add_argument("--dtype", choices=("float32", "float64"), default=None,
                   help="default float32; float64 when --check-equivalence is given")
    p.add_argument("--threads-per-rank", type=integer(1).arg("--threads-per-rank"), default=par.threads_per_rank,
                   help=f"torch threads per rank (default {par.threads_per_rank})")
    p.add_argument("--policy-param", action="append", default=[], metavar="KEY=VALUE",
                   help="policy parameter, repeatable (e.g. min_replica_tokens=16); given to every policy that has it")
    p.add_argument("--check-equivalence", action="store_true",
                   help="also train the static placement on the same data and compare")
    p.add_argument("--collective-timeout", type=float, default=faults.collective_timeout_s,
                   help=f"seconds before a collective waiting on a stalled rank fails (default "
                        f"{faults.collective_timeout_s:g})")
    p.add_argument("--on-migration-failure", choices=("continue", "stop"), default=faults.on_migration_failure,
                   help="after a rolled-back migration: keep training on the old placement (one warning) or stop")
    p.add_argument("--json", action="store_true", help="print one JSON object {\"results\": [...]} instead of tables")
    p.add_argument("--out", default=None, help="folder for metrics.csv and summary.json")
    p.set_defaults(func=_run, policies=("megatron", "relibra"), steps=meas.steps, warmup_steps=meas.warmup_steps,
                   micro_batches=data.micro_batches)


@functools.cache
def run_options() -> type:
    """`relibra run`'s own declared options (the rest are shared_options)."""
    from dataclasses import dataclass

    from relibra.studies.params import Params, integer, param

    @dataclass(frozen=True)
    class RunFlags(Params):
        steps: int = param(None, "timed steps per policy", integer(1, MAX_RUN_STEPS))
        warmup_steps: int = param(None, "untimed steps per policy run first", integer(0, MAX_RUN_STEPS))

    return RunFlags


def _parse_value(text: str):
    """--policy-param's value: an int, else a float, else the text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def request_from_args(args):
    """The RuntimeRequest of parsed arguments, validated (and the --out path checked) before any work."""
    from relibra.paths import check_output_path
    from relibra.runtime.config import (FaultOptions, MeasurementOptions, ModelOptions, ParallelismOptions,
                                        RunOptions)
    from relibra.runtime.measure import DataOptions, RuntimeRequest

    bad = next((item for item in args.policy_param if "=" not in item), None)
    if bad is not None:
        raise ConfigError(f"--policy-param expects KEY=VALUE, got {bad!r}")
    params = {key: _parse_value(value) for key, value in (item.split("=", 1) for item in args.policy_param)}
    run = RunOptions(
        model=ModelOptions(name=args.model, dtype=args.dtype or ("float64" if args.check_equivalence else "float32"),
                           seed=args.seed, lr=args.lr),
        parallelism=ParallelismOptions(nodes=args.nodes, threads_per_rank=args.threads_per_rank),
        measurement=MeasurementOptions(steps=args.steps, warmup_steps=args.warmup_steps,
                                       split_waiting=args.split_waiting, check_equivalence=args.check_equivalence),
        faults=FaultOptions(collective_timeout_s=args.collective_timeout, on_migration_failure=args.on_migration_failure))
    data = DataOptions(trace=args.trace, workload=args.workload, micro_batches=args.micro_batches,
                       tokens_per_rank=args.tokens_per_rank, expert_order=args.expert_order)
    request = RuntimeRequest(policies=tuple(args.policies), policy_params=params, data=data, run=run).validate()
    if args.out is not None:
        check_output_path(args.out, kind="dir")
    return request


def quiet_wait_s(args) -> float:
    """--quiet-wait, else $RELIBRA_QUIET_WAIT_S, else QUIET_WAIT_S; a ConfigError when negative or no number."""
    raw = args.quiet_wait if args.quiet_wait is not None else os.environ.get(QUIET_WAIT_ENV, QUIET_WAIT_S)
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"${QUIET_WAIT_ENV} must be a number of seconds, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"--quiet-wait must be >= 0 seconds, got {value:g}")
    return value


def _run(args) -> int:
    from relibra.limits import check_local_ranks
    from relibra.runtime.measure import prepare, report
    from relibra.runtime.quiet import quiet_known_warnings
    from relibra.runtime.results import RunResult

    quiet_known_warnings()
    if args.torchrun:
        return _under_torchrun(args)
    check_local_ranks(args.nproc)
    if args.nproc % args.nodes:
        raise ConfigError(f"--nodes {args.nodes} does not divide --nproc {args.nproc}")
    request = request_from_args(args)
    wait_s = quiet_wait_s(args)
    # Trace and plans are made once here (bad input fails before any process starts) and shipped to the ranks.
    prepared = prepare(request, args.nproc)
    from relibra.machine import quiet_machine
    from relibra.runtime.launch import launch
    from relibra.runtime.train import worker

    quiet = quiet_machine(wait_s, say=lambda text: print(text, file=sys.stderr))
    if quiet.busy:
        print(f"warning: {quiet.warning}", file=sys.stderr)
    result = launch(worker, args.nproc, request.run, prepared.runs,
                    threads_per_rank=request.run.parallelism.threads_per_rank,
                    timeout_s=request.run.faults.collective_timeout_s)
    return report(RunResult.from_dict(result), prepared, request, as_json=args.json, out=args.out,
                  machine_load=dataclasses.asdict(quiet))


def _under_torchrun(args) -> int:
    """One rank of a torchrun job (gloo on CPU, NCCL on GPUs): every rank plans the same, trains, rank 0 reports."""
    import torch
    import torch.distributed as dist

    from relibra.errors import RelibraError
    from relibra.runtime.groups import init_distributed
    from relibra.runtime.measure import prepare, report
    from relibra.runtime.results import RunResult
    from relibra.runtime.train import worker

    first = os.environ.get("RANK", "0") == "0"  # errors every rank meets alike are printed once, by rank 0
    try:
        request = request_from_args(args)
    except RelibraError:
        if first:
            raise
        return 2
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    rank, world = init_distributed(timeout_s=request.run.faults.collective_timeout_s)
    try:
        try:
            prepared = prepare(request, world)  # the same on every rank
        except RelibraError as exc:
            if first:
                print(f"error: {exc}", file=sys.stderr)
            return 2
        result = worker(rank, world, request.run, prepared.runs)
        code = report(RunResult.from_dict(result), prepared, request, as_json=args.json, out=args.out) \
            if rank == 0 else 0
    except RelibraError as exc:
        print(f"error: rank {rank}: {exc}", file=sys.stderr)
        code = 2
    finally:
        dist.destroy_process_group()
    return code
