"""`relibra bench {workload,planner,sim}`: benchmarks that print their figures (speed targets are
measured here, never in timed unit tests).

The benchmarks are imported inside the commands: `relibra` imports every command module to build
its parser, and numpy, pandas and the policies would add seconds to every `relibra --help`."""

from __future__ import annotations

import json


def _print(rows: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"results": rows}, indent=2, default=float))
        return
    import pandas as pd

    print(pd.DataFrame(rows).to_string(index=False))


def _workload(args) -> int:
    from relibra.bench.workload import benchmark_generate

    _print([benchmark_generate(model=args.model, workload=args.workload, ep=args.ep, steps=args.steps,
                               seed=args.seed)], args.json)
    return 0


def _planner(args) -> int:
    from relibra.bench.planner import benchmark_planner

    from relibra.cli import policy_list

    policies = tuple(policy_list(args.policies))  # every name, before any trace is generated
    _print(benchmark_planner(args.model, args.ep, seed=args.seed, policies=policies, cluster=args.cluster,
                             layout=args.layout, micro_batches=args.micro_batches), args.json)
    return 0


def _sim(args) -> int:
    from relibra.bench.sim import benchmark_sim
    from relibra.cli import policy_list

    from relibra.errors import ConfigError

    if len(policy_list(args.policy, flag="--policy")) != 1:
        raise ConfigError(f"--policy takes one policy name, got {args.policy!r}")
    _print([benchmark_sim(model=args.model, ep=args.ep, policy=args.policy, cluster=args.cluster,
                          seed=args.seed, micro_batches=args.micro_batches)], args.json)
    return 0


def register(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print their figures")
    bsub = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)

    def common(p, model="qwen3-235b-a22b", ep=32):
        p.add_argument("--model", default=model, help=f"model preset (default {model})")
        p.add_argument("--ep", type=int, default=ep, help=f"expert-parallel size (default {ep})")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--json", action="store_true", help="print one JSON object {\"results\": [...]}")

    p = bsub.add_parser("workload", help="seconds to generate synthetic routing traces")
    common(p)
    p.add_argument("--workload", default="mixed")
    p.add_argument("--steps", type=int, default=1)
    p.set_defaults(func=_workload)

    p = bsub.add_parser("planner", help="planner seconds per step and per (micro-batch, layer), peak memory, plan size, validate seconds")
    common(p)
    p.add_argument("--policies", default="relibra,eplb", help="comma-separated policy names")
    p.add_argument("--cluster", default="paper", help="cluster preset or spec the plans are made for")
    p.add_argument("--layout", default=None,
                   help="batch layout of the planned trace (token-budget, verl-balance, ...; default: the generator's, "
                        "token-budget); verl-balance gives 32 micro-batches per step, the planner targets' count")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="micro-batches per step (default: the layout's own count)")
    p.set_defaults(func=_planner)

    p = bsub.add_parser("sim", help="seconds to simulate one step for one policy (planning excluded)")
    common(p)
    p.add_argument("--policy", default="relibra")
    p.add_argument("--cluster", default="paper")
    p.add_argument("--micro-batches", type=int, default=32, help="micro-batches of the simulated step (default 32)")
    p.set_defaults(func=_sim)
