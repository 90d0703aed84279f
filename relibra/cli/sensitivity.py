"""`relibra sensitivity`: the headline ratios with one knob at a time moved around the default."""

from __future__ import annotations

import json


def _sensitivity(args) -> int:
    from relibra.experiments.sensitivity import RATIOS, sensitivity

    from relibra.cli.setup import card_with_overrides

    knobs = [k.strip() for k in args.knobs.split(",")] if args.knobs else None
    setup = card_with_overrides(args.setup, args.layout, args.tokens_per_microbatch)
    frame = sensitivity(args.model, args.ep, setup=setup, workload=args.workload,
                        micro_batches=args.micro_batches, layers=args.layers, steps=args.steps, seed=args.seed,
                        quick=args.quick, knobs=knobs, progress=not args.json)
    if args.json:
        rows = [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                for row in frame.to_dict(orient="records")]
        print(json.dumps({"results": rows, "config": {"model": args.model, "ep": args.ep, "setup": args.setup,
                                                      "layout": args.layout,
                                                      "tokens_per_microbatch": args.tokens_per_microbatch,
                                                      "workload": args.workload, "micro_batches": args.micro_batches,
                                                      "layers": args.layers, "steps": args.steps, "seed": args.seed,
                                                      "quick": args.quick, "source": "simulated"}}))
        return 0
    shown = frame[["knob", "value", "is_default", *RATIOS]].copy()
    print(f"simulated, {args.model}, EP {args.ep}, set-up card {args.setup}, {args.workload}")
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


def register(sub) -> None:
    from relibra.cli.setup import add_setup_arguments
    from relibra.experiments.sensitivity import KNOB_NAMES

    p = sub.add_parser("sensitivity", help="headline ratios varying one set-up input at a time (simulated)",
                       description="ReLibra/Megatron, ReLibra/EPLB+ and ReLibra/balanced-compute with one input of "
                                   "the set-up card at a time moved over its range: " + ", ".join(KNOB_NAMES) + ".",
                       allow_abbrev=False)
    p.add_argument("--model", required=True, help="model preset")
    p.add_argument("--ep", type=int, required=True, help="EP size")
    add_setup_arguments(p)
    p.add_argument("--workload", default="mixed")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="micro-batches per step (default: the card's; token-budget derives them from the budget)")
    p.add_argument("--layers", type=int, default=None, help="keep only the first N MoE layers (default: all)")
    p.add_argument("--steps", type=int, default=2, help="trace steps; the first is history only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--knobs", default=None, help="comma-separated subset of the knobs")
    p.add_argument("--quick", action="store_true", help="two values per knob, the default and one other (for tests and a first look)")
    p.add_argument("--json", action="store_true", help='print {"results": [{"knob", "value", "policy", ...}]}')
    p.set_defaults(func=_sensitivity)
