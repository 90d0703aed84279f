"""`relibra bench {workload,planner,sim,record}`: benchmarks that print their figures (speed targets are
measured here, never in timed unit tests); `record` runs a named list of them and keeps their figures
in data/bench/NAME.json (relibra.bench.records), from which the docs' measured tables are rendered.

The benchmarks are imported inside the commands: `relibra` imports every command module to build
its parser, and numpy, pandas and the policies would add seconds to every `relibra --help`."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from relibra.cli import policy_list
from relibra.display import json_text
from relibra.errors import ConfigError


def _print(rows: list[dict], as_json: bool) -> None:
    import pandas as pd

    print(json_text({"results": rows}, indent=2) if as_json else pd.DataFrame(rows).to_string(index=False))


def _workload(args) -> int:
    from relibra.bench.workload import benchmark_generate

    _print([benchmark_generate(model=args.model, workload=args.workload, ep=args.ep, steps=args.steps,
                               seed=args.seed)], args.json)
    return 0


def _planner(args) -> int:
    from relibra.bench.planner import benchmark_planner

    policies = tuple(policy_list(args.policies))  # every name, before any trace is generated
    _print(benchmark_planner(args.model, args.ep, seed=args.seed, policies=policies, cluster=args.cluster,
                             layout=args.layout, micro_batches=args.micro_batches), args.json)
    return 0


def _sim(args) -> int:
    from relibra.bench.sim import benchmark_sim

    if len(policy_list(args.policy, flag="--policy")) != 1:
        raise ConfigError(f"--policy takes one policy name, got {args.policy!r}")
    _print([benchmark_sim(model=args.model, ep=args.ep, policy=args.policy, cluster=args.cluster,
                          seed=args.seed, micro_batches=args.micro_batches)], args.json)
    return 0


def run_json_command(argv) -> dict:
    """Run `relibra ARGV` (a command with --json) in this process; its printed JSON object."""
    from relibra.cli import build_parser

    args = build_parser().parse_args(list(argv))
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = int(args.func(args) or 0)
    if code:
        raise ConfigError(f"`relibra {' '.join(argv)}` exited with {code}")
    return json.loads(text.getvalue())


def _record(args) -> int:
    import time

    from relibra.bench import records as rec
    from relibra.display import json_safe
    from relibra.paths import check_output_path
    from relibra.progress import progress as tqdm

    if args.list:
        for spec in rec.RECORDS:
            print(f"{spec.name}: {spec.description}")
            for argv in spec.commands:
                print(f"    {rec.command_line(argv)}")
        return 0
    if args.all == bool(args.names):
        raise ConfigError("relibra bench record: give record names or --all (--list shows them)")
    specs = rec.RECORDS if args.all else tuple(rec.get_record_spec(n) for n in args.names)
    out_dir = rec.BENCH_DIR if args.out_dir is None else Path(check_output_path(args.out_dir, "dir", "--out-dir"))
    for spec in specs:
        record = {"name": spec.name, "description": spec.description,
                  "command": f"relibra bench record {spec.name}", "started_utc": rec.utc_now(),
                  "machine": rec.machine(), "load_average_start": rec.load_average(), "runs": []}
        for argv in tqdm(spec.commands, desc=spec.name, unit="command"):
            started, load, t0 = rec.utc_now(), rec.load_average(), time.perf_counter()
            output = run_json_command(argv)
            record["runs"].append({"command": rec.command_line(argv), "started_utc": started,
                                   "seconds": round(time.perf_counter() - t0, 2), "load_average_start": load,
                                   "load_average_end": rec.load_average(), "output": json_safe(output)})
        record.update(finished_utc=rec.utc_now(), load_average_end=rec.load_average())
        path = rec.write_record(record, out_dir / f"{spec.name}.json")
        print(f"wrote {path}")
    return 0


def register(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print their figures")
    bsub = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)

    from relibra.cli.setup import shared_options
    from relibra.studies.params import add_flag

    shared = shared_options()

    def common(p, *names, **defaults):
        """The declared flags `names` (with model, EP and seed), defaults `defaults`, and --json."""
        defaults = {"model": "qwen3-235b-a22b", "ep": 32, "seed": 0, **defaults}
        for name in ("model", "ep", "seed", *names):
            add_flag(p, shared, name, default=None if defaults.get(name) is None else str(defaults[name]))
        p.set_defaults(**defaults)
        p.add_argument("--json", action="store_true", help="print one JSON object {\"results\": [...]}")

    p = bsub.add_parser("workload", help="seconds to generate synthetic routing traces")
    common(p, "workload", "steps", workload="mixed", steps=1)
    p.set_defaults(func=_workload)

    p = bsub.add_parser("planner", help="planner seconds per step and per (micro-batch, layer), peak memory, plan size, validate seconds")
    common(p)
    add_flag(p, shared, "micro_batches", default="the layout's own count")
    p.add_argument("--policies", default="relibra,eplb", help="comma-separated policy names")
    p.add_argument("--cluster", default="paper", help="cluster preset or spec the plans are made for")
    add_flag(p, shared, "layout", default="the generator's, token-budget; verl-balance gives 32 micro-batches per "
                                          "step, the planner targets' count")
    p.set_defaults(func=_planner)

    p = bsub.add_parser("sim", help="seconds to simulate one step for one policy (planning excluded)")
    common(p, "micro_batches", micro_batches=32)
    p.add_argument("--policy", default="relibra")
    p.add_argument("--cluster", default="paper")
    p.set_defaults(func=_sim)

    p = bsub.add_parser("record", help="run named benchmark lists and keep their figures in data/bench/NAME.json")
    p.add_argument("names", nargs="*", metavar="NAME", help="records to run (see --list)")
    p.add_argument("--all", action="store_true", help="run every record")
    p.add_argument("--list", action="store_true", help="print each record's commands and exit")
    p.add_argument("--out-dir", default=None, help="folder of the records (default data/bench/ of the kit)")
    p.set_defaults(func=_record)
