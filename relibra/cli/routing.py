"""`relibra routing compare`: the kit's routing (generated and real RL traces) beside public routing data."""

from __future__ import annotations

import functools
import math

from relibra.display import json_text, md_table, printable

# Published routing figures that come as numbers in a paper, not as data the kit can recompute.
LITERATURE = (
    {"source": "DODOCO (arXiv 2605.20982, abstract)", "level": "per expert, real text",
     "figure": "Gini 0.105 (MHA) and 0.150 (Mamba-2) on wikitext; MLA and GDN above 0.24 on every real-text "
               "condition; Qwen3-30B (GQA) between the bands; mock tokens overstate Gini up to 2.35x; EP 4-32 moves "
               "per-expert max/mean by at most 5%"},
    {"source": "ForeMoE (arXiv 2606.11867, abstract)", "level": "step and micro-step, RL post-training",
     "figure": "step-level load stable; micro-step load fluctuates severely (tiny micro-step batches); no figure"},
)
COLUMNS = (("max_over_mean", "max/mean"), ("gini", "Gini"), ("hottest_share", "hottest"),
           ("skewness_ep16", "skew EP16"), ("skewness_ep32", "skew EP32"), ("mb_vs_step_corr", "mb vs step"),
           ("mb_corr", "mb vs next"), ("step_corr", "step vs next"))


@functools.cache
def compare_options() -> type:
    """`routing compare`'s own declared options (the rest are shared_options)."""
    from dataclasses import dataclass

    from relibra.cli.setup import _card, shared_options
    from relibra.studies.params import Kind, floats, listed, param, split_items

    def cards(raw) -> tuple:
        return () if not split_items(raw) else listed(raw, _card)  # '' names none

    @dataclass(frozen=True)
    class CompareOptions(shared_options()):
        setups: tuple[str, ...] = param(None, "set-up cards to generate on",
                                        Kind("comma-separated set-up cards ('' for none)", cards))
        microbatch_shift: tuple[float, ...] = param((0.0,), "micro-batch shifts (WorkloadConfig.microbatch_shift)",
                                                    floats(0.0, 1.0))

    return CompareOptions


def compare_rows(model: str, workloads, setups, ep: int | None, steps: int, seed: int, shifts, rl_trace: str | None,
                 traces=(), public: str | None = None, progress: bool = True) -> list[dict]:
    """The rows `relibra routing compare` prints: the public data sets, then per (setup card, workload, prompt
    shift) the generated trace's step and micro-batch rows, then each trace file's (the real RL trace first).
    ep None: each card's batch.expert_parallel."""
    from relibra.analysis import comparison_rows, read_public_frequencies
    from relibra.rl.capture import DEFAULT_RL_TRACE
    from relibra.setups import load_card
    from relibra.trace import RoutingTrace
    from relibra.workloads import generate_trace

    generated = {}
    for card in map(load_card, setups):
        card_ep = card.value("batch.expert_parallel") if ep is None else ep
        for workload in workloads:
            for shift in shifts:
                generated[f"kit: {card.name}, {model}, {workload}, EP {card_ep}, shift {shift:g}"] = generate_trace(
                    model, workload, card_ep, steps, seed=seed, config=card.workload_config(microbatch_shift=shift),
                    progress=progress)
    files = {f"trace: {printable(path)}": path for path in traces}
    if rl_trace == "default":  # the shipped trace of `relibra rl`, wherever the command runs from
        files = {"trace: data/rl_tiny_seed0.npz": str(DEFAULT_RL_TRACE), **files}
    elif rl_trace:
        files = {f"trace: {printable(rl_trace)}": rl_trace, **files}
    loaded = {label: RoutingTrace.load(path) for label, path in files.items()}
    return comparison_rows(generated, read_public_frequencies(public)) + comparison_rows(loaded, {})


def _compare(args) -> int:
    rows = compare_rows(args.model, args.workloads, args.setups, args.ep, args.steps, args.seed, args.microbatch_shift,
                        None if args.rl_trace == "none" else args.rl_trace, args.trace, args.public,
                        progress=not args.json)
    if args.json:
        print(json_text({"rows": rows, "literature": list(LITERATURE)}, sort_keys=True))
        return 0
    print(format_table(rows))
    print()
    for lit in LITERATURE:
        print(f"{lit['source']} ({lit['level']}): {lit['figure']}")
    return 0


def format_table(rows: list[dict]) -> str:
    """The rows as a markdown table (docs/traces.md carries one)."""
    head = ["source", "level", "experts", "tokens"] + [label for _, label in COLUMNS]
    body = [[r["source"], r["level"], str(r["experts"]), "~500 prompts" if math.isnan(r["tokens"]) else f"{r['tokens']:.0f}"]
            + ["-" if math.isnan(r[key]) else f"{r[key]:.{3 if key == 'hottest_share' else 2}f}" for key, _ in COLUMNS]
            for r in rows]
    return md_table(head, body)


def register(subparsers) -> None:
    from relibra.setups import DEFAULT_CARD

    parser = subparsers.add_parser("routing", help="the kit's routing beside public routing data",
                                   description="Routing statistics side by side: public per-expert routing data, the "
                                               "kit's generated traces and its real RL trace (docs/traces.md, "
                                               "'Routing against public data').")
    sub = parser.add_subparsers(dest="routing_command", metavar="ACTION", required=True)
    cmp = sub.add_parser("compare", help="print the side-by-side table",
                         description="Expert max/mean, Gini, the hottest expert's share, static skewness at EP 16 and "
                                     "32 and micro-batch correlations of the public data (data/public/), of traces "
                                     "generated on set-up cards and of trace files.")
    from relibra.studies.params import add_flag

    own = compare_options()
    add_flag(cmp, own, "model", default="qwen3-30b-a3b, the public data's")
    add_flag(cmp, own, "workloads", default="mixed,math")
    add_flag(cmp, own, "setups", default=f"{DEFAULT_CARD}, paper-stated and the Qwen3-30B-A3B recipes")
    add_flag(cmp, own, "ep", default="each card's batch.expert_parallel")
    add_flag(cmp, own, "steps", default="2")
    add_flag(cmp, own, "seed")
    add_flag(cmp, own, "microbatch_shift")
    cmp.set_defaults(model="qwen3-30b-a3b", workloads=("mixed", "math"), setups=(DEFAULT_CARD, "paper-stated", "slime-qwen3-30b",
                                                          "verl-qwen3-30b"), steps=2)
    cmp.add_argument("--rl-trace", default="default",
                     help="the kit's real RL trace (default: the shipped data/rl_tiny_seed0.npz; 'none' to leave it out)")
    cmp.add_argument("--trace", action="append", default=[], help="another trace file (repeatable)")
    cmp.add_argument("--public", default=None, help="public routing CSV (default data/public/"
                                                    "qwen3-30b-a3b-instruct-2507_top8_frequency_en.csv)")
    cmp.add_argument("--json", action="store_true", help="print one JSON object")
    cmp.set_defaults(func=_compare)
