"""`relibra setup ...`: the set-up cards (data/setups/*.toml), every modelling input with its source."""

from __future__ import annotations

import json

from relibra.errors import ConfigError


def add_setup_arguments(p) -> None:
    """--setup, --layout and --tokens-per-microbatch, shared by the commands that simulate a set-up."""
    from relibra.setups import DEFAULT_CARD, card_names

    p.add_argument("--setup", default=DEFAULT_CARD,
                   help=f"set-up card: a name under data/setups/ ({', '.join(card_names())}) or a .toml path "
                        f"(default {DEFAULT_CARD})")
    p.add_argument("--layout", default=None,
                   help="batch layout instead of the card's: token-budget, verl-balance, verl, verl-dynamic, slime, "
                        "slime-dynamic, megatron (docs/traces.md)")
    p.add_argument("--tokens-per-microbatch", type=int, default=None,
                   help="token budget per GPU per micro-batch instead of the card's (token-budget layout)")


def card_with_overrides(setup: str, layout: str | None, tokens_per_microbatch: int | None):
    """The card `setup` with --layout and --tokens-per-microbatch applied (each re-sourced to the flag)."""
    from relibra.setups import load_card

    card = load_card(setup)
    changes, flags = {}, []
    if layout is not None:
        changes["batch__layout"] = layout
        flags.append("--layout")
    if tokens_per_microbatch is not None:
        if isinstance(tokens_per_microbatch, bool) or tokens_per_microbatch <= 0:
            raise ConfigError(f"--tokens-per-microbatch must be a positive integer, got {tokens_per_microbatch}")
        changes["batch__tokens_per_gpu_per_microbatch"] = tokens_per_microbatch
        flags.append("--tokens-per-microbatch")
    if not changes:
        return card
    return card.with_values(f"command line ({' '.join(flags)})", **changes)


def _show(args) -> int:
    from relibra.setups import load_card

    card = load_card(args.card)
    rows = card.rows() + card.derived_rows()
    budgets = [card.memory_budget(m) for m in card.memory_models()]
    if args.json:
        print(json.dumps({"name": card.name, "description": card.description, "path": card.path, "entries": rows,
                          "memory": [b.to_dict() for b in budgets]}, indent=2))
        return 0
    print(f"set-up card {card.name} ({card.path})\n{card.description}\n")
    for row in rows:
        value = row["value"]
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        rng = "" if row["range"] is None else f"  [sweep {row['range'][0]} .. {row['range'][1]}]"
        print(f"{row['key']} = {value} {row['unit']}".rstrip() + f"  ({row['kind']}){rng}")
        print(f"    source: {row['source']}")
    ep = card.value("batch.expert_parallel")
    for b in budgets:
        layout = card.memory_layout()
        print(f"\nmemory per GPU, {b.model} at EP {ep}, TP {layout.tp}, PP {layout.pp}, CP {layout.cp}, DP {layout.dp}, "
              f"{layout.tokens_per_gpu:.0f} token rows per GPU per micro-batch (relibra.costs.memory):")
        for line in b.lines():
            print("  " + line)
        for r in card.memory_sweep(b.model):
            print(f"  sweep {r['key']} = {r['value']}: {r['total_GB']:.1f} GB, "
                  + ("fits" if r["fits"] else "does NOT fit"))
    return 0


def _list(args) -> int:
    from relibra.setups import card_names, load_card

    for name in card_names():
        card = load_card(name)
        print(f"{name}: {card.description}")
    return 0


def register(subparsers) -> None:
    from relibra.setups import DEFAULT_CARD

    parser = subparsers.add_parser("setup", help="set-up cards: every input of a simulated set-up with its source",
                                   description="Set-up cards (data/setups/*.toml): each modelling input of a "
                                               "simulated set-up with its value, unit, kind (published, measured, "
                                               "assumed) and source.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="setup_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print a card", allow_abbrev=False)
    show.add_argument("card", nargs="?", default=DEFAULT_CARD, help=f"card name or .toml path (default {DEFAULT_CARD})")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=_show)
    lst = sub.add_parser("list", help="the shipped cards", allow_abbrev=False)
    lst.set_defaults(func=_list)
