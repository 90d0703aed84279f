"""`relibra map`: the verdict as a map over tokens per EP rank and micro-batch shift, printed as JSON; with
--overheads, the overheads table and EPLB+ at 0, 2 and 4 spare slots instead."""

from __future__ import annotations

import dataclasses
import json
import time


def _ints(text: str | None):
    return None if text is None else tuple(int(x) for x in text.split(",") if x.strip())


def _names(text: str | None):
    return None if text is None else tuple(x.strip() for x in text.split(",") if x.strip())


def _map(args) -> int:
    if args.overheads:
        return _overheads(args)
    from relibra.experiments.verdict_map import GRIDS, map_json, run_map

    changes = {k: v for k, v in (("models", _names(args.models)), ("workloads", _names(args.workloads)),
                                 ("seeds", _ints(args.seeds)), ("tokens", _ints(args.tokens)),
                                 ("cards", _names(args.cards)), ("ep", args.ep),
                                 ("step_sequences", _ints(args.step_sequences))) if v is not None}
    spec = GRIDS[args.grid](**changes)
    if args.shift_values is not None:
        values = tuple(float(x) for x in args.shift_values.split(","))
        spec = dataclasses.replace(spec, shift=dataclasses.replace(spec.shift, values=values))
    start = time.perf_counter()
    result = run_map(spec, workers=args.workers, progress=not args.no_progress)
    out = map_json(result)
    out["wall_s"] = time.perf_counter() - start
    print(json.dumps(out, indent=1 if args.indent else None))
    return 0


def _overheads(args) -> int:
    from relibra.experiments.own_overheads import (eplb_plus_table, overhead_cases, overhead_costs, overheads_table,
                                                   ratios)
    from relibra.setups import DEFAULT_CARD

    models = _names(args.models) or ("qwen3-30b-a3b", "glm-4.5-air", "qwen3-235b-a22b")
    cases = overhead_cases(args.setup or DEFAULT_CARD, models, (_names(args.workloads) or ("mixed",))[0],
                           _ints(args.seeds) or (0,), args.ep or 32)
    costs = overhead_costs(cases, progress=not args.no_progress)
    out = {"source": "simulated", "cases": [c.__dict__ for c in cases],
           "overheads": overheads_table(costs).to_dict(orient="records"),
           "eplb_plus_slots": eplb_plus_table(costs).to_dict(orient="records"),
           "ratios": ratios(costs).to_dict(orient="records")}
    print(json.dumps(out, indent=1 if args.indent else None, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
    return 0


def register(sub) -> None:
    p = sub.add_parser("map", help="the verdict as a map over tokens per EP rank and micro-batch shift (simulated, "
                                   "JSON)",
                       description="Simulate ReLibra / Megatron, ReLibra / EPLB+ and the gap to Balanced on a grid of "
                                   "tokens per EP rank per micro-batch x micro-batch shift, at full scale, plus each "
                                   "named set-up card as a point; print the cases, the node fields, the paper's "
                                   "claims as contours and the one-sentence conclusion as JSON.",
                       allow_abbrev=False)
    p.add_argument("--grid", choices=("default", "paper"), default="default",
                   help="default: coarse (3 budgets x 2 shift values, mixed, seed 0); paper: the whole grid")
    p.add_argument("--models", default=None, help="comma-separated model presets (default: the grid's three)")
    p.add_argument("--workloads", default=None, help="comma-separated workloads (default: the grid's)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: the grid's)")
    p.add_argument("--tokens", default=None, help="comma-separated tokens per EP rank per micro-batch")
    p.add_argument("--shift-values", default=None, help="comma-separated values of the grid's shift field")
    p.add_argument("--step-sequences", default=None,
                   help="comma-separated step sizes (sequences per step) of the nodes, one facet each (default: the "
                        "grid's 128,1024)")
    p.add_argument("--cards", default=None, help="comma-separated set-up cards to put on the map (default: all)")
    p.add_argument("--ep", type=int, default=None, help="EP size (default 32)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    p.add_argument("--overheads", action="store_true",
                   help="print the overheads table and EPLB+ at 0/2/4 spare slots instead of the map")
    p.add_argument("--setup", default=None, help="set-up card of --overheads (default: the default card)")
    p.add_argument("--indent", action="store_true", help="indent the JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_map)
