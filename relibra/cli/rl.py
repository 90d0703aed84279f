"""`relibra rl`: train a tiny MoE policy with GRPO and routing replay, and write its real routing trace."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from relibra.errors import ConfigError

# Integer flags of `relibra rl`: (flag, default, what it sets); each at least 1 but --warmup-steps (RLConfig.validate
# checks the rest: a group of at least 2, micro-batches dividing the step, ...).
SIZES = (("--steps", 40, "GRPO steps = trace steps"), ("--prompts", 32, "prompts per step"),
         ("--group-size", 8, "sampled responses per prompt"), ("--micro-batches", 8, "micro-batches per step"),
         ("--warmup-steps", 300, "supervised warm-up steps"), ("--layers", 4, "MoE layers"),
         ("--experts", 32, "experts per layer"), ("--top-k", 4, "experts per token"), ("--hidden", 64, "hidden size"),
         ("--moe-ffn", 128, "expert FFN size"))


def register(subparsers) -> None:
    from relibra.cli.setup import shared_options
    from relibra.rl.tasks import DOMAINS
    from relibra.studies.params import add_flag, integer, names, param

    @dataclass(frozen=True)
    class RLOptions(shared_options()):
        domains: tuple[str, ...] = param(DOMAINS, "task domains", names(tuple(DOMAINS), "task domain"))

    p = subparsers.add_parser(
        "rl", help="run a small real RL workload (GRPO on a tiny MoE) and write its routing trace",
        description="Supervised warm-up, then GRPO on verifiable synthetic tasks with a tiny MoE policy. "
                    "Rollouts record every token's experts, training replays them (and checks it), and the "
                    "recorded routing is written as a RoutingTrace. See docs/rl.md.")
    p.add_argument("--seed", type=integer(0).arg("--seed"), default=0,
                   help="random seed (default 0); same seed, same trace")
    p.add_argument("--out", required=True, help="output trace .npz")
    p.add_argument("--metrics", help="also write per-step metrics, evaluations and statistics as JSON")
    add_flag(p, RLOptions, "domains")
    for flag, default, what in SIZES:
        p.add_argument(flag, type=integer(0 if flag == "--warmup-steps" else 1).arg(flag), default=default,
                       help=f"{what} (default {default})")
    p.add_argument("--ep", type=integer(1).arg("--ep"), default=None,
                   help="simulated EP source ranks per micro-batch (default 4; with --trainer megatron: --nproc)")
    p.add_argument("--lr", type=float, default=5e-4, help="GRPO learning rate (default 5e-4)")
    p.add_argument("--shuffle", action="store_true",
                   help="shuffle a step's sequences before cutting micro-batches (default: rollout order)")
    p.add_argument("--rollout-dtype", default=None, choices=("bfloat16", "float32"),
                   help="precision of the rollout engine's copy of the policy (training is float32) (default "
                        "bfloat16; with --trainer megatron: float32, the only one it runs)")
    p.add_argument("--threads", type=integer(1).arg("--threads"), default=1,
                   help="torch CPU threads (default 1: the policy's GEMMs are too small to gain from more, "
                        "see docs/rl.md)")
    p.add_argument("--compare", default="small",
                   help="synthetic model preset to compare shift statistics with, or 'none' (default small)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar and no per-step lines")
    p.add_argument("--trainer", default="torch", choices=("torch", "megatron"),
                   help="torch: the plain-torch policy in this process (default); megatron: the policy as a "
                        "megatron-core GPTModel under megatron DDP and optimizer on --nproc gloo ranks (EP = "
                        "every rank), ReLibra planning between rollout and training (docs/rl.md)")
    p.add_argument("--nproc", type=integer(1).arg("--nproc"), default=None,
                   help="--trainer megatron: gloo ranks = EP size (default 2)")
    add_flag(p, RLOptions, "policies", default="megatron,relibra; --trainer megatron only, each policy run from "
                                                 "the same seed")
    p.add_argument("--replica-slots", type=integer(0).arg("--replica-slots"), default=None,
                   help="--trainer megatron: replica slots per rank for balancing policies (default 2)")
    p.set_defaults(func=_rl)


def _table(rows: list[dict]) -> str:
    import pandas as pd

    return pd.DataFrame(rows).to_string(index=False, float_format="{:.3f}".format)


def _write_metrics(path: str, out: dict) -> None:
    from relibra.display import json_text
    from relibra.paths import write_text

    write_text(path, json_text(out, indent=1))
    print(f"wrote {path}", file=sys.stderr)


def _rl(args) -> int:
    from relibra.cli.trace import check_trace_out

    check_trace_out(args.out)
    import os

    # Idle OpenMP workers sleep instead of spinning, so extra threads cost little when the cores are busy.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import numpy as np
    import torch

    from relibra.rl.capture import shift_row, synthetic_comparison
    from relibra.rl.grpo import RLConfig, run_rl
    from relibra.rl.model import PolicyConfig

    torch.set_num_threads(args.threads)
    megatron = args.trainer == "megatron"
    given = [f for f, v in (("--nproc", args.nproc), ("--policies", args.policies), ("--replica-slots", args.replica_slots))
             if v is not None]
    if given and not megatron:
        raise ConfigError(f"{', '.join(given)} go with --trainer megatron")
    if megatron:
        args.nproc = 2 if args.nproc is None else args.nproc
        args.policies = ("megatron", "relibra") if args.policies is None else args.policies
        args.replica_slots = 2 if args.replica_slots is None else args.replica_slots
        from relibra.limits import check_local_ranks, check_replica_slots

        check_local_ranks(args.nproc)
        check_replica_slots(args.replica_slots, args.experts)
    cfg = RLConfig(steps=args.steps, seed=args.seed, domains=tuple(args.domains),
                   prompts_per_step=args.prompts, group_size=args.group_size, micro_batches=args.micro_batches,
                   ep=args.ep if args.ep is not None else (args.nproc if megatron else 4),
                   warmup_steps=args.warmup_steps, lr=args.lr, shuffle_sequences=args.shuffle,
                   rollout_dtype=args.rollout_dtype or ("float32" if megatron else "bfloat16"),
                   policy=PolicyConfig(num_layers=args.layers, hidden=args.hidden, num_experts=args.experts,
                                       top_k=args.top_k, moe_ffn=args.moe_ffn))
    cfg.validate()
    if args.compare.lower() != "none":
        from relibra.cluster import get_model

        get_model(args.compare)  # fail before the run, not after it
    progress = not args.no_progress
    if megatron:
        return _rl_megatron(args, cfg, progress)
    result = run_rl(cfg, progress=progress, log=None if progress else (lambda _line: None))
    trace = result.trace
    trace.save(args.out)
    rewards = np.array([h["reward"] for h in result.history])
    block = max(1, len(rewards) // 4)
    print(f"wrote {args.out}: {trace.num_steps} steps x {trace.num_microbatches} micro-batches, "
          f"{int(trace.loads[:, :, 0].sum()) // trace.model.top_k} routed tokens, {result.seconds:.1f} s")
    print("mean sampled reward per quarter of the run: "
          + ", ".join(f"{rewards[i:i + block].mean():.3f}" for i in range(0, len(rewards), block)))
    before, after = result.eval_before, result.eval_after
    if before:
        print(f"greedy reward on {cfg.eval_prompts} held-out prompts: {before['reward']:.3f} after warm-up, "
              f"{after['reward']:.3f} after RL (solved {before['solved']:.3f} -> {after['solved']:.3f})")
    rows = ([shift_row("real RL (relibra rl)", trace)] if args.compare.lower() == "none" else
            synthetic_comparison(trace, model=args.compare, seed=args.seed))
    print("\nrouting shift (hot = top 10% experts; overlaps are shares of hot experts kept):")
    print(_table(rows))
    if args.metrics:
        _write_metrics(args.metrics, {"config": cfg.to_dict(), "history": result.history, "eval_before": before,
                                      "eval_after": after, "warmup_loss": result.warmup_loss,
                                      "seconds": result.seconds, "shift_statistics": rows})
    return 0


def _rl_megatron(args, cfg, progress: bool) -> int:
    """`relibra rl --trainer megatron`: every policy's run on --nproc gloo ranks, step by step side by side."""
    import numpy as np

    from relibra.rl.megatron_loop import check_megatron_config, megatron_rl_worker
    from relibra.runtime.launch import launch

    policies = list(args.policies)
    check_megatron_config(cfg, args.nproc, policies, args.replica_slots)
    out = launch(megatron_rl_worker, args.nproc, cfg, policies, args.replica_slots, args.out, progress,
                 threads_per_rank=args.threads, timeout_s=600.0)
    history = out["history"]
    print(f"wrote {args.out}: routing trace of policy {policies[0]} ({cfg.steps} steps x {cfg.micro_batches} "
          f"micro-batches, EP {args.nproc}); routing identical across policies: "
          f"{'yes' if out['routing_identical'] else 'no'}")
    print("supervised warm-up loss (mean of the last 20 steps): "
          + ", ".join(f"{p} {out['warmup_loss'][p]:.4f}" for p in policies))
    rows = [{"step": s, "policy": p, "reward": f"{h['reward']:.6f}", "loss": f"{h['loss']:.6e}",
             "grad_norm": f"{h['grad_norm']:.6e}", "moved": h["experts_moved"], "replicas": h["replicas"],
             "replica_tokens": h["replica_tokens"], "rollout_s": f"{h['rollout_s']:.2f}",
             "planning_s": f"{h['planning_s']:.3f}", "training_s": f"{h['training_s']:.2f}",
             "planning_share": f"{h['planning_s'] / (h['rollout_s'] + h['planning_s'] + h['training_s']):.1%}"}
            for s in range(cfg.steps) for p in policies for h in (history[p][s],)]
    print(_table(rows))
    base = policies[0]
    for p in policies[1:]:
        gap = {k: max(abs(a[k] - b[k]) for a, b in zip(history[p], history[base]))
               for k in ("reward", "loss", "grad_norm")}
        print(f"{p} vs {base}: max |reward difference| {gap['reward']:.3g}, max |loss difference| {gap['loss']:.3g}, "
              f"max |grad-norm difference| {gap['grad_norm']:.3g} over {cfg.steps} steps (float32; bound: docs/rl.md)")
    for p in policies:
        t = {k: float(np.sum([h[k] for h in history[p]])) for k in ("rollout_s", "planning_s", "training_s")}
        print(f"{p}: rollout {t['rollout_s']:.2f} s, planning {t['planning_s']:.3f} s, training "
              f"{t['training_s']:.2f} s; planning {t['planning_s'] / sum(t.values()):.1%} of the step")
    if args.metrics:
        _write_metrics(args.metrics, {"config": cfg.to_dict(), "trainer": "megatron", "nproc": args.nproc,
                                      "policies": policies, **out})
    return 0
