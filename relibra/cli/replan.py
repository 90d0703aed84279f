"""`relibra replan`: choose each re-homing policy's re-plan interval k on set-up cards at their scale, print the
table and write the record data/replan/<card>.json the headline and the map read; --check says, without
simulating, whether every shipped card's record was made from the card as it is."""

from __future__ import annotations

import shlex
import sys

from relibra.errors import ConfigError


def _replan(args) -> int:
    from relibra.bench.records import kit_commit
    from relibra.setups import card_names, load_card
    from relibra.studies import replan

    if args.check:
        return _check(args)
    if sum((args.all, args.setup is not None, args.cards is not None)) != 1:
        raise ConfigError("give --setup CARD, --cards A,B,... or --all (every card under data/setups/)")
    commit = kit_commit()  # the code this command runs: read before any file can change under it
    names = card_names() if args.all else list(args.cards) if args.cards is not None else [args.setup]
    if args.models is not None and len(names) > 1:
        raise ConfigError("--models goes with one --setup card")
    folder = args.out_dir or replan.RECORD_DIR
    for name in names:
        card = load_card(name)
        if not replan.shipped(card) and args.out_dir is None and not args.no_write:
            raise ConfigError(f"--setup {name}: a card outside data/setups/ has no record there (the headline and the "
                              "map read records of the shipped cards only); give --out-dir or --no-write")
        given = {"--models": None if args.models is None else ",".join(args.models), "--workload": args.workload,
                 "--seed": None if args.seed == replan.RECORD_SEED else str(args.seed)}
        command = "relibra replan " + shlex.join(["--setup", card.name, *(x for flag, v in given.items()
                                                                         if v is not None for x in (flag, v))])
        record = replan.replan_record(card, args.models, args.workload or replan.RECORD_WORKLOAD, args.seed,
                                      workers=args.workers, progress=not args.no_progress, command=command,
                                      commit=commit, reuse_from=folder)
        if "cases_from" in record:
            print(f"{card.name}: every value equals card {record['cases_from']['card']}'s; its record's cases taken")
        t = record["trace"]
        print(f"{card.name}: re-plan interval k chosen by each policy's own tokens/s; {t['workload']}, seed "
              f"{t['seed']}, {t['measured_steps']} steps measured after {t['warmup_steps']} of warm-up, {t['scale']}")
        table = replan.record_table(record).drop(columns=["card"])
        for col in [c for c in table if c.startswith(("tokens_per_s", "megatron_tokens_per_s"))]:
            table[col] = table[col].map(lambda v: f"{v:,.0f}")  # thousands separators; the speed-up to 3 digits
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        if not args.no_write:
            print(f"wrote {replan.write_replan_record(record, folder)}\n")
    return 0


def _check(args) -> int:
    """Every shipped card's record exists and was made from its current values: 0, else 1 with one line each."""
    from relibra.setups import card_names, load_card
    from relibra.studies import replan

    folder, bad = args.out_dir or replan.RECORD_DIR, 0
    for name in card_names():
        record = replan.load_replan_record(name, folder)
        stale = None if record is None else replan.stale_entries(record, replan.card_values(load_card(name)))
        if record is None:
            print(f"{name}: no record ({replan.shown_path(replan.record_path(name, folder))}); run "
                  f"`relibra replan --setup {name}`")
        elif stale:
            print(f"{name}: record made from other values (entries {', '.join(stale)}); run "
                  f"`relibra replan --setup {name}`")
        else:
            chosen = "; ".join(f"{c['model']} EP {c['ep']}: " + ", ".join(f"{p} k={k}" for p, k in c["chosen"].items())
                               for c in record["cases"])
            print(f"{name}: current ({record['date_utc']}, {record['kit_commit']}): {chosen}")
        bad += record is None or bool(stale)
    print(f"{bad} card(s) need `relibra replan`" if bad else "every card's record is current", file=sys.stderr)
    return 1 if bad else 0


def register(sub) -> None:
    from relibra.cli.setup import shared_options
    from relibra.studies.params import add_flag

    p = sub.add_parser("replan", allow_abbrev=False,
                       help="choose the re-homing policies' re-plan interval per set-up card and record it",
                       description="For every re-homing policy (eplb, eplb+, eplb+lp, lplb+), simulate re-planning "
                                   "every k = 1, 2, 4, 8 steps on the card's cluster, batch and EP at full scale "
                                   "(every MoE layer, 8 measured steps after 8 of warm-up, Megatron on the same "
                                   "steps), keep the k of highest tokens/s, print the table, and write "
                                   "data/replan/<card>.json: the k the headline and the map use for that card "
                                   "(relibra.studies.replan).")
    shared = shared_options()
    add_flag(p, shared, "setup", default="none: give --setup or --all")
    add_flag(p, shared, "cards", default="none: one after another, in the order given")
    p.add_argument("--all", action="store_true", help="every card under data/setups/, one after another")
    p.add_argument("--check", action="store_true",
                   help="simulate nothing: say whether every shipped card's record was made from the card as it "
                        "is (exit 1 if not)")
    add_flag(p, shared, "models", default="the card's published model, else the map's three")
    add_flag(p, shared, "workload", default="math (the cards' sequence lengths are their recipes' math domain)")
    add_flag(p, shared, "seed")
    add_flag(p, shared, "workers", default="one per core, at most one per model")
    p.add_argument("--out-dir", default=None, help="folder of the records (default data/replan/)")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_replan, setup=None)
