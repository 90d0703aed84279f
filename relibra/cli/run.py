"""`relibra run`: launch the expert-parallel runtime locally (gloo, loopback) and print a summary."""

from __future__ import annotations

from relibra.errors import ConfigError


def _run(args) -> int:
    from relibra.runtime.launch import launch
    from relibra.runtime.options import options_from_args
    from relibra.runtime.train import prepare, report, worker

    if args.nproc <= 0:
        raise ConfigError(f"--nproc must be positive, got {args.nproc}")
    if args.nproc % args.nodes:
        raise ConfigError(f"--nodes {args.nodes} does not divide --nproc {args.nproc}")
    opts = options_from_args(args)
    if opts.trace is None:
        from relibra.cluster import get_model

        shape = get_model(opts.model)
        if shape.num_experts % args.nproc:
            raise ConfigError(f"--nproc {args.nproc} does not divide the {shape.num_experts} experts of {opts.model!r}")
    # Trace and plans are made once here (bad input fails before any process starts) and shipped to the ranks.
    prepared = prepare(opts, args.nproc)
    result = launch(worker, args.nproc, opts, prepared, threads_per_rank=opts.threads_per_rank)
    return report(result, opts)


def register(sub) -> None:
    from relibra.runtime.options import add_run_arguments

    p = sub.add_parser("run", help="train with expert parallelism on local ranks (gloo) under a policy's plans")
    p.add_argument("--nproc", type=int, default=4, help="ranks to launch (default 4)")
    add_run_arguments(p)
    p.set_defaults(func=_run)
