"""`relibra sensitivity`: the headline ratios with one knob at a time moved around the default. --knobs is the
study's declaration (relibra.studies.sensitivity.KnobParams, notebook 10's `knobs`); the case's flags (--model,
--ep, --steps, --seed) are the ones every simulating command shares."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from relibra.errors import ConfigError


@functools.cache
def sensitivity_options() -> type:
    """`relibra sensitivity`'s own options (the knobs are the study's KnobParams, the rest shared_options)."""
    from relibra.studies.params import FLAG, Params, integer, param

    @dataclass(frozen=True)
    class SensitivityOptions(Params):
        layers: int = param(None, "keep only the first N MoE layers (at most the model's)", integer(1, 4096))
        quick: bool = param(False, "two values per knob, the default and one other (for tests and a first look)",
                            FLAG)
        json: bool = param(False, 'print {"results": [{"knob", "value", "policy", ...}]}', FLAG)

    return SensitivityOptions


def _sensitivity(args) -> int:
    from relibra.cli.setup import card_with_overrides
    from relibra.cluster import get_model
    from relibra.studies.sensitivity import RATIOS, sensitivity

    args.model = get_model(args.model)
    if args.layers is not None and args.layers > args.model.num_layers:
        raise ConfigError(f"--layers {args.layers}: {args.model.name} has {args.model.num_layers} MoE layers")
    setup = card_with_overrides(args.setup, args.layout, args.tokens_per_microbatch)
    frame = sensitivity(args.model, args.ep, setup=setup, workload=args.workload,
                        micro_batches=args.micro_batches, layers=args.layers, steps=args.steps, seed=args.seed,
                        quick=args.quick, knobs=None if args.knobs is None else list(args.knobs),
                        progress=not args.json)
    if args.json:
        from relibra.display import json_text

        given = ("ep", "setup", "layout", "tokens_per_microbatch", "workload", "micro_batches", "layers", "steps",
                 "seed", "quick")
        config = {"model": args.model.name, **{k: getattr(args, k) for k in given}, "source": "simulated"}
        print(json_text({"results": frame.to_dict(orient="records"), "config": config}))
        return 0
    print(f"simulated, {args.model.name}, EP {args.ep}, set-up card {args.setup}, {args.workload}")
    print(frame[["knob", "value", "is_default", *RATIOS]].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


def register(sub) -> None:
    from relibra.cli.setup import add_setup_arguments, shared_options
    from relibra.studies.params import add_flag
    from relibra.studies.sensitivity import KNOB_NAMES, KnobParams

    p = sub.add_parser("sensitivity", help="headline ratios varying one set-up input at a time (simulated)",
                       description="ReLibra/Megatron, ReLibra/EPLB+ and ReLibra/balanced-compute with one input of "
                                   "the set-up card at a time moved over its range: " + ", ".join(KNOB_NAMES) + ".",
                       allow_abbrev=False)
    own, shared = sensitivity_options(), shared_options()
    add_flag(p, shared, "model").required = True
    add_flag(p, shared, "ep").required = True
    add_setup_arguments(p)
    add_flag(p, shared, "workload", default="mixed")
    add_flag(p, shared, "micro_batches", default="the card's; token-budget derives them from the budget")
    add_flag(p, own, "layers", default="all")
    add_flag(p, shared, "steps", default="2; the first is history only")
    add_flag(p, shared, "seed")
    add_flag(p, KnobParams, "knobs", default="all")
    add_flag(p, own, "quick")
    add_flag(p, own, "json")
    p.set_defaults(func=_sensitivity, steps=2, workload="mixed")
