"""`relibra map`: the verdict as a map over tokens per EP rank and micro-batch shift, printed as JSON; with
--overheads, the overheads table and EPLB+ at 0, 2 and 4 spare slots instead. The grid's axes are notebook 12's
parameters (relibra.studies.claim_map.MapAxes): the same declarations make the flags and parse the values."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from relibra.cli.setup import shared_options
from relibra.errors import ConfigError

# the grid's axes: MapAxes field -> flag
AXES = {"tokens": "--tokens", "shift": "--shift-values", "models": "--models", "workloads": "--workloads",
        "seeds": "--seeds", "step_sequences": "--step-sequences"}


@functools.cache
def map_options() -> type:
    """`relibra map`'s own options (the grid's axes are MapAxes, the rest shared_options)."""
    from relibra.studies.claim_map import GRIDS
    from relibra.studies.params import FLAG, Params, choice, param

    @dataclass(frozen=True)
    class MapOptions(Params):
        grid: str = param("default", "the grid the axes start from", choice(tuple(GRIDS)))
        overheads: bool = param(False, "print the overheads table and EPLB+ at 0/2/4 spare slots instead of the "
                                       "map", FLAG)
        indent: bool = param(False, "indent the JSON", FLAG)
        no_progress: bool = param(False, "no progress bar", FLAG)

    return MapOptions


def grid_text(g) -> str:
    """What a GridSpec simulates, in words (the help of --grid, notebook 12's markdown)."""
    def seeds(s) -> str:
        return f"seed{'s' * (len(s) > 1)} {', '.join(map(str, s))}"
    steps = f"{len(g.step_sequences)} step sizes x " if g.step_sequences else ""
    return (f"{steps}{len(g.tokens)} budgets x {len(g.shift.values)} shift values x {len(g.models)} models x "
            f"{', '.join(g.workloads)} x {seeds(g.seeds)}; card points at {seeds(g.card_seeds or g.seeds)}")


def _given(args, names) -> list[str]:
    """The flags among `names` (dests) given on the command line: away from their declared defaults."""
    return [AXES.get(n, "--" + n.replace("_", "-")) for n in names if getattr(args, n) != args.flag_defaults[n]]


def _map(args) -> int:
    if args.overheads:
        return _overheads(args)
    if _given(args, ("setup",)):
        raise ConfigError("--setup goes with --overheads only")
    import dataclasses

    from relibra.display import json_text
    from relibra.studies.claim_map import GRIDS, MapAxes, map_json, run_map

    axes, grid = MapAxes.create("relibra map", lambda _: GRIDS[args.grid or "default"](),
                                **{name: getattr(args, name) for name in AXES})
    spec = dataclasses.replace(axes.spec(grid), **{k: getattr(args, k) for k in ("cards", "ep")
                                                   if getattr(args, k) is not None})
    start = time.perf_counter()
    out = map_json(run_map(spec, workers=args.workers, progress=not args.no_progress))
    out["wall_s"] = time.perf_counter() - start
    print(json_text(out, indent=1 if args.indent else None))
    return 0


def _overheads(args) -> int:
    wrong = _given(args, ("grid", "cards", "workers", "tokens", "shift", "step_sequences"))
    if wrong:
        raise ConfigError(f"--overheads takes none of {', '.join(wrong)} (it takes --models, --workloads (one), "
                          "--seeds, --ep and --setup)")
    if args.workloads is not None and len(args.workloads) > 1:
        raise ConfigError(f"--overheads simulates one workload; got --workloads {','.join(args.workloads)}")
    from relibra.display import json_text
    from relibra.studies.overheads import eplb_plus_table, overhead_cases, overhead_costs, overheads_table, ratios

    given = {"setup": args.setup, "models": args.models, "workload": args.workloads and args.workloads[0],
             "seeds": args.seeds, "ep": args.ep}
    cases = overhead_cases(**{k: v for k, v in given.items() if v is not None})
    costs = overhead_costs(cases, progress=not args.no_progress)
    keys = ("setup", "model", "workload", "seed", "ep", "steps", "card_changes")
    out = {"source": "simulated", "cases": [{k: getattr(c, k) for k in keys} for c in cases],
           "overheads": overheads_table(costs).to_dict(orient="records"),
           "eplb_plus_slots": eplb_plus_table(costs).to_dict(orient="records"),
           "ratios": ratios(costs).to_dict(orient="records")}
    print(json_text(out, indent=1 if args.indent else None, default=str))
    return 0


def register(sub) -> None:
    from relibra.studies.params import add_flag
    from relibra.studies.claim_map import GRIDS, MapAxes
    from relibra.setups import DEFAULT_CARD

    p = sub.add_parser("map", help="the verdict as a map over tokens per EP rank and micro-batch shift (simulated, "
                                   "JSON)",
                       description="Simulate ReLibra / Megatron, ReLibra / EPLB+ and the gap to Balanced on a grid of "
                                   "tokens per EP rank per micro-batch x micro-batch shift, at full scale, plus each "
                                   "named set-up card as a point; print the cases, the node fields, the paper's "
                                   "claims as contours and the one-sentence conclusion as JSON. The grid's axes are "
                                   "notebook 12's parameters.",
                       allow_abbrev=False)
    own, shared = map_options(), shared_options()
    add_flag(p, own, "grid", default="; ".join(f"{k} ({grid_text(g())})" for k, g in GRIDS.items()))
    overheads = {"models": "the three paper models", "workloads": "mixed", "seeds": "0"}
    for name, flag in AXES.items():
        add_flag(p, MapAxes, name, flag, default="the --grid's; --overheads: " + overheads.get(name, "not taken"))
    add_flag(p, shared, "cards", default="every card under data/setups/, each a point")
    add_flag(p, shared, "ep", default="32; a card's point: its own batch.expert_parallel")
    add_flag(p, shared, "workers", default="one per core, at most one per case")
    add_flag(p, own, "overheads")
    add_flag(p, shared, "setup", default=f"{DEFAULT_CARD}; --overheads only")
    add_flag(p, own, "indent")
    add_flag(p, own, "no_progress")
    p.set_defaults(grid=None, setup=None)  # not given: None, so that a flag --overheads does not take is seen
    p.set_defaults(func=_map, flag_defaults={a.dest: a.default for a in p._actions})
