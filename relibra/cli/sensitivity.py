"""`relibra sensitivity`: the headline ratios with one knob at a time moved around the default."""

from __future__ import annotations

import json


def _sensitivity(args) -> int:
    from relibra.experiments.sensitivity import RATIOS, sensitivity

    knobs = [k.strip() for k in args.knobs.split(",")] if args.knobs else None
    frame = sensitivity(args.model, args.ep, cluster=args.cluster, workload=args.workload,
                        micro_batches=args.micro_batches, layers=args.layers, steps=args.steps, seed=args.seed,
                        quick=args.quick, knobs=knobs, progress=not args.json, tokens_per_rank=args.tokens_per_rank)
    if args.json:
        rows = [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                for row in frame.to_dict(orient="records")]
        print(json.dumps({"results": rows, "config": {"model": args.model, "ep": args.ep, "cluster": args.cluster,
                                                      "workload": args.workload, "micro_batches": args.micro_batches,
                                                      "layers": args.layers, "steps": args.steps, "seed": args.seed,
                                                      "tokens_per_rank": args.tokens_per_rank,
                                                      "quick": args.quick, "source": "simulated"}}))
        return 0
    shown = frame[["knob", "value", "is_default", *RATIOS]].copy()
    print(f"simulated, {args.model}, EP {args.ep}, cluster {args.cluster}, {args.workload}")
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


def register(sub) -> None:
    p = sub.add_parser("sensitivity", help="headline ratios varying one knob at a time (simulated)",
                       description="ReLibra/Megatron, ReLibra/EPLB+ and ReLibra/balanced-compute with one knob at "
                                   "a time moved around the default: batch layout, tokens per slot, topic "
                                   "concentration, spare slots, NVLink rate, RDMA rate, GEMM half-saturation, "
                                   "sequence length, cluster preset.")
    p.add_argument("--model", required=True, help="model preset")
    p.add_argument("--ep", type=int, required=True, help="EP size")
    p.add_argument("--cluster", default="paper", help="cluster preset of the default set-up")
    p.add_argument("--workload", default="mixed")
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--layers", type=int, default=None, help="keep only the first N MoE layers (default: all)")
    p.add_argument("--steps", type=int, default=2, help="trace steps; the first is history only")
    p.add_argument("--tokens-per-rank", type=int, default=None,
                   help="tokens per (micro-batch, rank) of the default set-up (default: derived from the batch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--knobs", default=None, help="comma-separated subset of the knobs")
    p.add_argument("--quick", action="store_true", help="two values per knob, the default and one other (for tests and a first look)")
    p.add_argument("--json", action="store_true", help='print {"results": [{"knob", "value", "policy", ...}]}')
    p.set_defaults(func=_sensitivity)
