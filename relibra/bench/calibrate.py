"""`relibra calibrate`: micro-benchmark this machine and fit the simulator's CPU preset
(relibra.bench.cpu_preset measures and fits; this module is the command).

    relibra calibrate --model moe-cpu --out data/cpu_gloo_fit.json      # the cpu-gloo-fit preset
    relibra calibrate --out data/cpu_gloo_calibration.json              # the cpu-gloo preset's measurements
    python -m relibra.bench.calibrate ...                               # the same without the CLI
"""

from __future__ import annotations

import argparse
import json

from relibra.errors import ConfigError
from relibra.paths import check_output_path, write_text


def add_arguments(p) -> None:
    p.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    p.add_argument("--model", default=None, help="fit the cpu-gloo-fit preset for this model's expert shape "
                   "(e.g. moe-cpu); without it, the 4-rank tiny/small measurements of the cpu-gloo preset")
    p.add_argument("--world", type=int, default=None,
                   help="with --model: gloo ranks of the all-to-all benchmark (default 2); without it the cpu-gloo "
                        f"measurements run on {CPU_GLOO_WORLD} ranks")


CPU_GLOO_WORLD = 4  # ranks of the cpu-gloo preset's measurements (relibra.bench.cpu_preset.calibrate_cpu_gloo)


def run(args) -> int:
    if args.world is not None and not args.model:
        raise ConfigError(f"--world goes with --model; the cpu-gloo measurements run on {CPU_GLOO_WORLD} ranks")
    args.world = 2 if args.world is None else args.world
    if args.repeats <= 0 or args.world < 2:
        raise ConfigError(f"--repeats must be positive and --world at least 2, got {args.repeats}, {args.world}")
    if args.out:
        check_output_path(args.out, kind="file")
    # torch and the runtime load only when the command runs: relibra's parser imports this module (for
    # add_arguments) at every start.
    from relibra.bench.cpu_preset import calibrate_cpu_gloo, fit_cpu_preset

    if args.model:
        result = fit_cpu_preset(args.model, args.world, args.repeats, args.quick)
        if args.out:
            write_text(args.out, json.dumps(result, indent=1) + "\n")
        print(json.dumps({"expert_fit": result["expert"]["fit_forward_backward"],
                          "gloo_all_to_all_fit": result["gloo_all_to_all"]["fit"],
                          "gloo_p2p_fit": result["gloo_p2p"]["fit"], "optimizer_fit": result["optimizer"]["fit"],
                          "attention_fit": {k: v for k, v in result["attention"]["fit"].items()
                                            if k in ("attention_efficiency", "max_rel_err")},
                          "preset": result["preset"]}, indent=1))
        return 0
    result = calibrate_cpu_gloo(world=CPU_GLOO_WORLD, repeats=args.repeats, quick=args.quick)
    if args.out:
        write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps({"expert_tiny_fit": result["expert"]["tiny"]["fit_forward_backward"],
                      "expert_small_fit": result["expert"]["small"]["fit_forward_backward"],
                      "gloo_all_to_all_fit": result["gloo_all_to_all"]["fit"], "gloo_p2p_fit": result["gloo_p2p"]["fit"],
                      "cpu_gloo_preset": result["cpu_gloo_preset"]}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m relibra.bench.calibrate")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
