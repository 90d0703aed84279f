"""`relibra trace ...`: generate synthetic routing traces, import real ones, print their statistics."""

from __future__ import annotations

import functools
import json
import math
import sys

from relibra.display import json_text, printable
from relibra.errors import ConfigError

# Dense-shape flags of `trace import`: (flag, ModelShape field, default of an explicit shape, help).
DENSE_FLAGS = (("--hidden", "hidden", 2048, "hidden size"), ("--moe-ffn", "moe_ffn", 768, "expert ffn size"),
               ("--heads", "num_attention_heads", 16, "attention (query) heads"),
               ("--kv-heads", "num_kv_heads", 4, "key-value heads (GQA)"),
               ("--head-dim", "head_dim", 128, "attention head dim"),
               ("--vocab", "vocab_size", 151936, "vocabulary size (embedding and output layer)"))
DENSE_FLAG = {field: flag for flag, field, _, _ in DENSE_FLAGS}
SEQUENCE_FORMATS = ("verl", "sglang", "vllm", "slime")  # sequences the importer deals to (rank, micro-batch) slots


def register(subparsers) -> None:
    from relibra.cli.setup import add_setup_arguments, shared_options
    from relibra.cluster import PAPER_MODELS
    from relibra.studies.params import add_flag, integer

    parser = subparsers.add_parser("trace", help="routing traces: generate, import, stats, calibrate",
                                   description="Routing traces: loads[step, micro_batch, layer, src_rank, expert].")
    sub = parser.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    shared = shared_options()

    gen = sub.add_parser("generate", help="write a synthetic RL routing trace",
                         description="Generate a synthetic RL routing trace (relibra.workloads) and save it as .npz.")
    for name in ("model", "workload", "ep", "steps"):
        add_flag(gen, shared, name).required = True
    add_flag(gen, shared, "seed")
    add_flag(gen, shared, "micro_batches", default="the card's; token-budget derives them from the budget, a number "
                                                  "sizes a cut-down batch")
    add_flag(gen, shared, "tokens_per_rank", default="the card's budget, or derived from its batch for the "
                                                     "fixed-count layouts")
    add_setup_arguments(gen)
    add_flag(gen, _generate_options(), "length_scale", default="1; e.g. 1/32 with --tokens-per-rank 256")
    gen.add_argument("--token-level", action="store_true",
                     help="also keep per-token top-k ids (small configs only, e.g. the runtime's)")
    gen.add_argument("--out", required=True, help="output .npz file")
    gen.set_defaults(func=_generate)

    st = sub.add_parser("stats", help="print a trace's statistics",
                        description="Static-placement rank skewness and hot-expert shift statistics of a trace.")
    st.add_argument("file", help="trace .npz")
    st.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    st.set_defaults(func=_stats)

    imp = sub.add_parser("import", help="convert routing data from megatron-core, verl, SGLang, vLLM or slime into a trace",
                         description="Convert what megatron-core (RouterReplay recordings or router-trace JSONL), verl, "
                                     "SGLang, vLLM or slime write into one trace file, reading the sources file by file. "
                                     "See docs/traces.md for each format's axes and the flags it needs.")
    imp.add_argument("--format", required=True, choices=("megatron-replay", "megatron-jsonl", *SEQUENCE_FORMATS))
    imp.add_argument("sources", nargs="+", metavar="SOURCE", help="input files or directories")
    imp.add_argument("--out", required=True, help="output .npz file")
    imp.add_argument("--model", help="model preset; or give --layers, --experts and --top-k (megatron-jsonl: "
                                     "--experts alone, or nothing when router_state_rank*.pt lies beside the trace)")
    for flag, what in (("--layers", "MoE layers"), ("--experts", "routed experts per layer"),
                       ("--top-k", "experts per token")):
        imp.add_argument(flag, type=integer(1).arg(flag), help=f"{what} (explicit model shape)")
    imp.add_argument("--model-json", metavar="FILE",
                     help="the whole model shape from a JSON file instead of --model or --layers/--experts/--top-k: "
                          "the kit's ModelShape fields (name, num_layers, num_experts, top_k, hidden, moe_ffn, "
                          "num_attention_heads, num_kv_heads, head_dim, vocab_size, ...) or a Hugging Face "
                          "config.json (Qwen3-MoE, Mixtral, DeepSeek-V3 keys)")
    dense = imp.add_argument_group(
        "model sizes", "what the cost model charges beside the routing: expert GEMMs, attention, embedding and output "
        "layer; each flag replaces that field of --model, --model-json or the explicit shape, and the trace keeps it")
    for flag, field, default, what in DENSE_FLAGS:
        dense.add_argument(flag, type=integer(1).arg(flag), default=None, dest=field, metavar="N",
                           help=f"{what} (default: the preset's or the JSON's; explicit shape {default})")
    imp.add_argument("--ep", type=integer(1).arg("--ep"),
                     help="expert-parallel size (required; megatron-jsonl: default highest rank + 1)")
    imp.add_argument("--micro-batches", type=integer(1).arg("--micro-batches"), default=1,
                     help="verl/sglang/vllm/slime: micro-batches each rank cuts its sequences into (default 1)")
    imp.add_argument("--order", choices=("rank-major", "microbatch-major"), default="rank-major",
                     help="verl/sglang/vllm/slime: how sequences are dealt to (rank, micro-batch) slots (default rank-major)")
    imp.add_argument("--mtp", choices=("drop", "layers"), default="drop",
                     help="megatron-jsonl: drop MTP-block records (default; counted in provenance) or keep them as "
                          "extra layers after the decoder's")
    imp.add_argument("--recompute", choices=("error", "drop"), default="error",
                     help="megatron-jsonl: a record repeating an earlier one of the same (step, layer, rank) is an "
                          "error (default), or an activation-recompute repeat to drop")
    imp.add_argument("--start-len", type=integer(0).arg("--start-len"), default=0,
                     help="sglang JSON: the request's routed_experts_start_len, which SGLang does not echo (default 0)")
    imp.add_argument("--loads-only", action="store_true",
                     help="drop the token-level ids, keep only the counts (holds one file's ids at a time)")
    imp.set_defaults(func=_import)

    cal = sub.add_parser("calibrate", help="skewness and shift statistics of generated traces per model and EP",
                         description="Generate traces for each (model, workload, EP) and print static-placement "
                                     "skewness and shift statistics (the figures in docs/traces.md).")
    add_flag(cal, shared, "models", default=",".join(PAPER_MODELS))
    add_flag(cal, shared, "workloads", default="mixed")
    add_flag(cal, shared, "eps", default="8,16,32,64")
    add_flag(cal, shared, "steps", default="4")
    add_flag(cal, shared, "micro_batches", default="the card's; token-budget derives them from the budget")
    add_flag(cal, shared, "tokens_per_rank", default="the card's")
    add_setup_arguments(cal)
    add_flag(cal, shared, "seed")
    cal.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    cal.set_defaults(func=_calibrate, models=PAPER_MODELS, workloads=("mixed",), eps=(8, 16, 32, 64), steps=4)


@functools.cache
def _generate_options() -> type:
    """`trace generate`'s own option (the rest are shared_options)."""
    from dataclasses import dataclass

    from relibra.studies.params import Params, number, param

    @dataclass(frozen=True)
    class GenerateOptions(Params):
        length_scale: float = param(1.0, "multiply sequence lengths (an assumption's range: 1/1000 to 100 times the "
                                         "card's)", number(0.001, 100.0))

    return GenerateOptions


def _import_shape(args):
    """(model for the importer: a ModelShape, a preset name or None, {dense field: value} the flags set),
    every flag's shape checked (KV heads divide heads, ...) before any file is read."""
    import dataclasses

    from relibra.cluster import MODEL_LIMITS, get_model

    dense = {field: getattr(args, field) for field in DENSE_FLAG if getattr(args, field) is not None}
    explicit = [f for f, v in (("--layers", args.layers), ("--experts", args.experts), ("--top-k", args.top_k))
                if v is not None]
    model = args.model
    if args.model_json is not None:
        if model is not None or explicit:
            raise ConfigError(f"--model-json gives the whole shape; drop "
                              f"{', '.join(['--model'] * (model is not None) + explicit)}")
        from relibra.importers.common import model_from_json

        model = model_from_json(args.model_json, f"--model-json {args.model_json}")
    if model is not None:  # an unknown preset, or flags that make no model with it
        dataclasses.replace(get_model(model) if isinstance(model, str) else model, **dense)
        return model, dense
    # no model to apply the flags to yet: each within relibra.cluster.MODEL_LIMITS, --kv-heads dividing --heads
    for field, value in dense.items():
        if value > MODEL_LIMITS[field]:
            raise ConfigError(f"{DENSE_FLAG[field]} {value} is over the kit's bound of {MODEL_LIMITS[field]} "
                              f"(relibra.cluster.MODEL_LIMITS)")
    heads, kv = dense.get("num_attention_heads"), dense.get("num_kv_heads")
    if heads is not None and kv is not None and heads % kv:
        raise ConfigError(f"--kv-heads {kv} must divide --heads {heads} (each KV head serves a whole group of "
                          f"query heads)")
    return model, dense


def _with_dense(trace, dense: dict):
    """The trace with the dense fields the flags set; the model's name says which ones changed."""
    import dataclasses

    changed = {k: v for k, v in dense.items() if getattr(trace.model, k) != v}
    if not changed:
        return trace
    base = trace.model.name
    flags = ", ".join(f"{DENSE_FLAG[k]} {v}" for k, v in changed.items())
    name = base if base.startswith("custom-") else f"{base} ({flags})"
    return trace.with_model(dataclasses.replace(trace.model, name=name, **changed))


def check_trace_out(path: str) -> None:
    """Refuse a trace path before any work is done, not when saving."""
    if not path.endswith(".npz"):
        raise ConfigError(f"--out {path}: a trace file must end in .npz")


def _wrote(path: str, trace, what: str = "") -> str:
    return (f"wrote {path}: {trace.num_steps} steps x {trace.num_microbatches} micro-batches x {trace.num_layers} "
            f"layers x EP{trace.ep} x {trace.num_experts} experts{what}; static skewness {trace.static_skewness():.3f}")


def _generate(args) -> int:
    from relibra.cli.setup import card_with_overrides
    from relibra.workloads import generate_trace

    check_trace_out(args.out)
    card = card_with_overrides(args.setup, args.layout, args.tokens_per_microbatch)
    trace = generate_trace(args.model, args.workload, args.ep, args.steps, seed=args.seed,
                           micro_batches=card.micro_batches if args.micro_batches is None else args.micro_batches,
                           tokens_per_rank=args.tokens_per_rank, progress=sys.stderr.isatty(),
                           config=card.workload_config(length_scale=args.length_scale), token_level=args.token_level)
    trace.save(args.out)
    print(_wrote(args.out, trace))
    return 0


# The readable table's rows: key of relibra.analysis.trace_stats -> label.
STAT_LABELS = {
    "model": "model", "ep": "EP size", "steps": "steps", "micro_batches": "micro-batches per step",
    "layers": "MoE layers", "experts": "experts", "top_k": "top-k", "tokens_per_microbatch": "tokens per micro-batch",
    "total_tokens": "tokens in trace", "static_skewness": "static skewness (mean max/mean per rank)",
    "static_skewness_p95": "static skewness p95",
    "mb_hot_overlap": "hot-expert overlap, consecutive micro-batches",
    "mb_corr": "load correlation, consecutive micro-batches",
    "mb_vs_step_hot_overlap": "hot-expert overlap, micro-batch vs its step",
    "mb_vs_step_corr": "load correlation, micro-batch vs its step",
    "step_hot_overlap": "hot-expert overlap, consecutive steps", "step_corr": "load correlation, consecutive steps",
    "history_hot_overlap": "hot-expert overlap, step vs history average",
    "history_corr": "load correlation, step vs history average",
    "history_mb_hot_overlap": "hot-expert overlap, micro-batch vs history average",
}


def _stats(args) -> int:
    from relibra.analysis import trace_stats
    from relibra.trace import RoutingTrace

    stats = trace_stats(RoutingTrace.load(args.file))
    if args.json:
        print(json_text(stats, sort_keys=True))
        return 0
    width = max(map(len, STAT_LABELS.values()))
    print(f"{printable(args.file)}  (hot experts = hottest {stats['hot_frac']:.0%}; history = last "
          f"{stats['history_window']} steps)")
    for key, label in STAT_LABELS.items():
        value = stats.get(key)
        if isinstance(value, float):
            value = "n/a (trace too short)" if math.isnan(value) else f"{value:.3f}"
        print(f"  {label:<{width}}  {printable(value)}")
    print(f"  {'provenance':<{width}}  {json.dumps(stats['provenance'], sort_keys=True)[:200]}")
    return 0


def _import(args) -> int:
    from relibra.importers import import_trace, resolve_model

    check_trace_out(args.out)
    fmt = args.format
    for given, formats, why in (
            (args.micro_batches != 1 or args.order != "rank-major", SEQUENCE_FORMATS,
             f"--micro-batches and --order apply to {', '.join(SEQUENCE_FORMATS)}; {fmt} files carry their own "
             f"micro-batches"),
            (args.mtp != "drop" or args.recompute != "error", ("megatron-jsonl",),
             "--mtp and --recompute apply to megatron-jsonl"),
            (args.start_len, ("sglang",), "--start-len applies to sglang")):
        if given and fmt not in formats:
            raise ConfigError(why)
    model, dense = _import_shape(args)
    opts = {"keep_tokens": not args.loads_only}
    if fmt == "megatron-jsonl":
        if args.layers is not None or args.top_k is not None:
            raise ConfigError("megatron-jsonl reads layers and top-k from the file; give --model or --experts only")
        if args.model is not None and args.experts is not None:
            raise ConfigError("give either a model preset or --experts, not both")
        opts.update(model=model, ep=args.ep, experts=args.experts, mtp=args.mtp, recompute=args.recompute)
    else:
        if args.ep is None:
            raise ConfigError(f"--ep is required for {fmt}")
        opts.update(model=resolve_model(model, args.layers, args.experts, args.top_k), ep=args.ep)
        if fmt in SEQUENCE_FORMATS:
            opts.update(micro_batches=args.micro_batches, order=args.order)
        if fmt == "sglang":
            opts.update(start_len=args.start_len)
    trace = _with_dense(import_trace(fmt, args.sources, **opts), dense)
    trace.save(args.out)
    m = trace.model
    print(_wrote(args.out, trace, " (with token-level ids)" if trace.token_experts is not None else " (counts only)"))
    print(f"model {m.name!r}: hidden {m.hidden}, expert ffn {m.moe_ffn}, {m.num_attention_heads} heads "
          f"({m.num_kv_heads} KV) of dim {m.head_dim}, vocabulary {m.vocab_size}")
    return 0


def _calibrate(args) -> int:
    import pandas as pd

    from relibra.bench.workload import SHIFT_KEYS, calibration_table
    from relibra.cli.setup import card_with_overrides

    card = card_with_overrides(args.setup, args.layout, args.tokens_per_microbatch)
    rows = calibration_table(args.models, args.workloads, args.eps, steps=args.steps,
                             micro_batches=card.micro_batches if args.micro_batches is None else args.micro_batches,
                             seed=args.seed, tokens_per_rank=args.tokens_per_rank, progress=sys.stderr.isatty(),
                             config=card.workload_config())
    if args.json:
        print(json_text(rows))
        return 0
    short = {"static_skewness": "skew", "static_skewness_p95": "skew_p95", "mb_hot_overlap": "mb_hot",
             "mb_vs_step_hot_overlap": "mb_vs_step_hot", "step_hot_overlap": "step_hot",
             "history_hot_overlap": "hist_hot", "history_mb_hot_overlap": "hist_mb_hot"}
    table = pd.DataFrame(rows)[["model", "workload", "ep", "static_skewness", "static_skewness_p95", *SHIFT_KEYS,
                                "seconds"]]
    print(table.rename(columns=short).to_string(index=False, float_format="{:.2f}".format))
    return 0
