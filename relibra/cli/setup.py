"""`relibra setup ...`: the set-up cards (data/setups/*.toml), every modelling input with its source."""

from __future__ import annotations

import functools
import json


def _card(v) -> str:
    from relibra.setups import load_card

    load_card(str(v))  # an unknown card or a bad .toml fails here, before any work
    return str(v)


MAX_STEPS = 10_000  # steps of a generated trace or a run: an assumption, far above the hundreds an RL run records
MAX_MICRO_BATCHES = 4096  # micro-batches per step: above any recipe's (docs/setup.md), within int32 slot counts


@functools.cache
def shared_options() -> type:
    """The declarations (relibra.studies.params.param) of the flags several commands share: the set-up
    card and its overrides, the case (model, workload, EP, steps, micro-batches, seed), worker processes.
    Built on first use: `relibra --version` imports none of the kit's work."""
    from dataclasses import dataclass

    from relibra.cluster import get_model
    from relibra.studies.params import Kind, Params, choice, integer, integers, listed, names, param
    from relibra.policies import POLICY_NAMES
    from relibra.setup_schema import BOUNDS
    from relibra.setups import DEFAULT_CARD, card_names
    from relibra.workloads import BATCH_LAYOUTS, WORKLOADS

    one_card = Kind(f"a set-up card: a name under data/setups/ ({', '.join(card_names())}) or a .toml path", _card)
    ep_bound = next(b for b in BOUNDS if b.key == "batch.expert_parallel")  # the card schema's bound on an EP size
    ep_range = (int(ep_bound.low), int(ep_bound.high))

    def one_model(v) -> str:
        get_model(str(v))  # an unknown preset or a bad shape spec fails here
        return str(v)

    @dataclass(frozen=True)
    class Shared(Params):
        setup: str = param(DEFAULT_CARD, "set-up card", one_card)
        cards: tuple[str, ...] = param(None, "set-up cards", Kind(
            "comma-separated set-up cards (names under data/setups/ or .toml paths)", lambda raw: listed(raw, _card)))
        layout: str = param(None, "batch layout instead of the card's (docs/traces.md)",
                            choice(BATCH_LAYOUTS, "batch layout"))
        tokens_per_microbatch: int = param(None, "token budget per GPU per micro-batch instead of the card's "
                                                 "(token-budget layout; the card's schema bounds it)", integer(1))
        model: str = param(None, "model preset (or a shape spec such as 'deepseek-v3,layers=4')",
                           Kind("a model preset or shape spec", one_model))
        models: tuple[str, ...] = param(None, "model presets", Kind("comma-separated model presets",
                                                                    lambda raw: listed(raw, one_model)))
        workload: str = param(None, "workload", choice(tuple(WORKLOADS), "workload"))
        workloads: tuple[str, ...] = param(None, "workloads", names(tuple(WORKLOADS), "workload"))
        ep: int = param(None, "expert-parallel size (divides the expert count)", integer(*ep_range))
        eps: tuple[int, ...] = param(None, "EP sizes", integers(*ep_range))
        steps: int = param(None, "training steps", integer(1, MAX_STEPS))
        warmup_steps: int = param(None, "steps before the measured or simulated ones", integer(0, MAX_STEPS))
        micro_batches: int = param(None, "micro-batches per step", integer(1, MAX_MICRO_BATCHES))
        tokens_per_rank: int = param(None, "about this many tokens per micro-batch and EP rank (the generator bounds "
                                           "the tokens per step)", integer(1))
        seed: int = param(0, "random seed; same seed, same numbers", integer(0, 2**32 - 1))
        policies: tuple[str, ...] = param(None, "policies", names(tuple(POLICY_NAMES), "policy"))
        workers: int = param(None, "worker processes", integer(1, 1024))

    return Shared


def add_setup_arguments(p) -> None:
    """--setup, --layout and --tokens-per-microbatch, shared by the commands that simulate a set-up."""
    from relibra.studies.params import add_flag

    for name in ("setup", "layout", "tokens_per_microbatch"):
        add_flag(p, shared_options(), name)


def card_with_overrides(setup: str, layout: str | None, tokens_per_microbatch: int | None):
    """The card `setup` with --layout and --tokens-per-microbatch applied (each re-sourced to the flag; their
    values checked by their flags' Kinds)."""
    from relibra.setups import load_card

    card = load_card(setup)
    given = {flag: (key, value) for flag, key, value in (
        ("--layout", "batch__layout", layout),
        ("--tokens-per-microbatch", "batch__tokens_per_gpu_per_microbatch", tokens_per_microbatch))
        if value is not None}
    if not given:
        return card
    return card.with_values(f"command line ({' '.join(given)})", **dict(given.values()))


def _show(args) -> int:
    from relibra.setups import load_card

    card = load_card(args.card)
    rows = card.rows() + card.derived_rows()
    budgets = [card.memory_budget(m) for m in card.memory_models()]
    if args.json:
        print(json.dumps({"name": card.name, "description": card.description, "path": card.path, "entries": rows,
                          "memory": [{**b.to_dict(), "mean_rows": b.mean_rows, "sweep": card.memory_sweep(b.model)}
                                     for b in budgets]}, indent=2))
        return 0
    print(f"set-up card {card.name} ({card.path})\n{card.description}\n")
    for row in rows:
        value = row["value"]
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        rng = "" if row["range"] is None else f"  [sweep {row['range'][0]} .. {row['range'][1]}]"
        print(f"{row['key']} = {value} {row['unit']}".rstrip() + f"  ({row['kind']}){rng}")
        print(f"    source: {row['source']}")
    ep, layout = card.value("batch.expert_parallel"), card.memory_layout()
    for b in budgets:
        print(f"\nmemory per GPU, {b.model} at EP {ep}, TP {layout.tp}, PP {layout.pp}, CP {layout.cp}, DP {layout.dp}, "
              f"{layout.tokens_per_gpu:.0f} token rows per GPU per micro-batch (relibra.costs.memory):")
        for line in b.lines():
            print("  " + line)
        for r in card.memory_sweep(b.model):
            print(f"  sweep {r['key']} = {r['value']}: {r['total_GB']:.1f} GB, "
                  + ("fits" if r["fits"] else "does NOT fit"))
    from relibra.studies.replan import record_lines

    print("\n" + "\n".join(record_lines(card)))
    return 0


def _list(args) -> int:
    from relibra.setups import card_names, load_card

    for name in card_names():
        print(f"{name}: {load_card(name).description}")
    return 0


def register(subparsers) -> None:
    from relibra.setups import DEFAULT_CARD

    parser = subparsers.add_parser("setup", help="set-up cards: every input of a simulated set-up with its source",
                                   description="Set-up cards (data/setups/*.toml): each modelling input of a "
                                               "simulated set-up with its value, unit, kind (published, measured, "
                                               "assumed) and source.")
    sub = parser.add_subparsers(dest="setup_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print a card")
    show.add_argument("card", nargs="?", default=DEFAULT_CARD, help=f"card name or .toml path (default {DEFAULT_CARD})")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=_show)
    sub.add_parser("list", help="the shipped cards").set_defaults(func=_list)
