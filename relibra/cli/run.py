"""`relibra run`: launch the expert-parallel runtime locally (gloo, loopback) and print the results."""

from __future__ import annotations

from relibra.errors import ConfigError


def _run(args) -> int:
    from relibra.runtime.launch import launch
    from relibra.runtime.options import options_from_args
    from relibra.runtime.quiet import quiet_known_warnings
    from relibra.runtime.train import prepare, report, worker

    quiet_known_warnings()
    if args.nproc <= 0:
        raise ConfigError(f"--nproc must be a positive integer, got {args.nproc}")
    if args.nodes <= 0:
        raise ConfigError(f"--nodes must be a positive integer, got {args.nodes}")
    if args.nproc % args.nodes:
        raise ConfigError(f"--nodes {args.nodes} does not divide --nproc {args.nproc}")
    opts = options_from_args(args)  # validates every option and the --out path before any work
    # Trace and plans are made once here (bad input fails before any process starts) and shipped to the ranks.
    prepared = prepare(opts, args.nproc)
    result = launch(worker, args.nproc, opts, prepared, threads_per_rank=opts.threads_per_rank,
                    timeout_s=opts.collective_timeout_s)
    return report(result, opts, prepared, args.nproc, as_json=args.json)


def register(sub) -> None:
    from relibra.runtime.options import add_run_arguments

    p = sub.add_parser("run", help="train with expert parallelism on local ranks (gloo) under policies' plans")
    p.add_argument("--nproc", type=int, default=2, help="ranks to launch (default 2)")
    add_run_arguments(p)
    p.set_defaults(func=_run)
