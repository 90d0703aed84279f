"""`relibra simulate`: plan and cost a routing trace for several policies on a named cluster."""

from __future__ import annotations

from relibra.display import json_text

DEFAULT_STEPS = 2


def _simulate(args) -> int:
    from relibra.cli import policy_list
    from relibra.cli.setup import card_with_overrides
    from relibra.cluster import get_model, parse_topology
    from relibra.errors import ConfigError
    from relibra.sim import BALANCED_COMPUTE
    from relibra.studies.replan import ReplanForm, replan_form, simulate_in_form
    from relibra.trace import RoutingTrace

    policies = policy_list(args.policies, extra=(BALANCED_COMPUTE,))  # every name, before any work
    card = card_with_overrides(args.setup, args.layout, args.tokens_per_microbatch)
    topology = card.topology() if args.cluster is None else parse_topology(args.cluster)
    if args.trace:
        trace = RoutingTrace.load(args.trace)
        if args.model and trace.model.name != args.model:
            raise ConfigError(f"{args.trace}: the trace is of model {trace.model.name!r}, not --model {args.model!r}")
        if args.ep and trace.ep != args.ep:
            raise ConfigError(f"{args.trace}: the trace has EP {trace.ep}, not --ep {args.ep}")
        steps = min(DEFAULT_STEPS, trace.num_steps) if args.steps is None else args.steps
        if steps > trace.num_steps:
            raise ConfigError(f"--steps {args.steps}: {args.trace} holds only {trace.num_steps} step(s); give "
                              f"--steps {trace.num_steps} or fewer")
        workload = args.workload or str(trace.provenance.get("workload", ""))
        form = ReplanForm.at_one(policies, "a recorded trace")
    else:
        from relibra.workloads import generate_trace

        if not args.model or not args.workload or not args.ep:
            raise ConfigError("without --trace, give --model, --workload and --ep to generate a synthetic trace")
        get_model(args.model)  # a clear error for an unknown preset before any work
        if args.cluster is None:
            card.check_ep(args.ep)
        topology.ep_layout(args.ep)
        # the re-homing policies re-plan every k steps, k from the card's record (relibra replan), each simulated
        # step averaged over the k phases of the cycle (its previous re-plan inside the trace)
        form = (replan_form(card, args.model, args.ep, policies) if args.cluster is None else
                ReplanForm.at_one(policies, "another cluster than the card's"))
        steps = DEFAULT_STEPS if args.steps is None else args.steps
        trace = generate_trace(args.model, args.workload, args.ep, steps=max(args.warmup_steps, form.longest) + steps,
                               seed=args.seed,
                               micro_batches=card.micro_batches if args.micro_batches is None else args.micro_batches,
                               tokens_per_rank=args.tokens_per_rank, progress=not args.json,
                               config=card.workload_config())
        workload = args.workload
    if args.cluster is None:
        card.check_ep(trace.ep)
    topology.ep_layout(trace.ep)  # a clear error for a bad (cluster, EP) combination
    params = card.cost_params(trace.ep, seq_len=args.seq_len, route=args.route,
                              dedup=None if args.dedup is None else args.dedup == "on",
                              **({} if args.replica_buffer is None else {"replica_buffer": args.replica_buffer}))
    result = simulate_in_form(trace, topology, policies, form, steps=steps, params=params, workload=workload,
                              policy_params=card.policy_params(policies), progress=not args.json)
    result.summary.insert(1, "replan_interval", [form.interval(p) for p in result.summary["policy"]])
    if args.json:
        result.config["replan_source"] = form.source
        print(json_text({"config": {k: v for k, v in result.config.items() if k != "topology"},
                         "results": result.summary.to_dict(orient="records")}, indent=2))
        return 0
    cfg = result.config
    print(f"model {cfg['model']}, workload {cfg['workload'] or '-'}, EP {cfg['ep']}, cluster {cfg['cluster']} "
          f"({topology.num_nodes} x {topology.gpus_per_node} GPUs), steps {cfg['steps']}, "
          f"{cfg['micro_batches']} micro-batches of {cfg['tokens_per_microbatch']} tokens; simulated; re-homing "
          f"policies' re-plan interval k: {form.source}")
    table = result.summary[["policy", "replan_interval", "tokens_per_s", "speedup_vs_megatron", "frac_of_balanced",
                            "skewness", "step_s", "a2a_share", "bubble_share", "migration_share", "exposed_transfer_share",
                            "replica_memory_share", "plan_s", "gap_to_bound"]].copy()
    for col in ("a2a_share", "bubble_share", "migration_share", "exposed_transfer_share", "replica_memory_share"):
        table[col] = (100 * table[col]).map(lambda v: f"{v:.2f}%")
    table["tokens_per_s"] = table["tokens_per_s"].map(lambda v: f"{v:,.0f}")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


def register(sub) -> None:
    from relibra.cli.setup import add_setup_arguments, shared_options
    from relibra.cluster import TOPOLOGY_PRESETS

    p = sub.add_parser("simulate", help="simulate policies on a cluster from a routing trace", allow_abbrev=False,
                       description="Plan every simulated step of a routing trace with each policy and cost the "
                                   "plans on a cluster (relibra.sim); every input not given is the set-up card's "
                                   "(relibra setup show). Without --trace, a synthetic trace of "
                                   "--workload is generated from --seed (--warmup-steps extra steps come first, "
                                   "so history-based policies have a history).")
    from relibra.studies.params import add_flag, integer

    shared = shared_options()
    add_flag(p, shared, "model", default="required without --trace")
    add_flag(p, shared, "workload", default="required without --trace")
    add_flag(p, shared, "ep", default="required without --trace")
    add_setup_arguments(p)
    p.add_argument("--cluster", default=None,
                   help="cluster instead of the card's: a preset (" + ", ".join(TOPOLOGY_PRESETS) + "), a preset "
                        "with changes such as 'paper,rdma_GBps=25', or a custom 'nodes=4,gpus_per_node=8,"
                        "nvlink_GBps=450,rdma_GBps=50,matmul_tflops=790' (default: the set-up card's cluster)")
    p.add_argument("--policies", default="megatron,eplb,eplb+,lplb+,llep,relibra,balanced",
                   help="comma-separated policy names (megatron and balanced are always added as references)")
    add_flag(p, shared, "steps", default=f"{DEFAULT_STEPS}, or every step of a shorter --trace; the last ones of "
                                         "--trace, more than it holds is an error")
    add_flag(p, shared, "warmup_steps", default="4: generated steps before the simulated ones, history for eplb")
    p.add_argument("--trace", help="a trace file (.npz) instead of a synthetic one")
    add_flag(p, shared, "seed")
    add_flag(p, shared, "micro_batches", default="the card's; token-budget derives them from the budget")
    add_flag(p, shared, "tokens_per_rank", default="the generator's")
    # at most 2^20 tokens: the card schema's bound on a sequence's lengths (setup_schema.LENGTH_FIELDS)
    p.add_argument("--seq-len", type=integer(1, 1 << 20).arg("--seq-len"), default=4096,
                   help="sequence length for attention's cost (default 4096)")
    p.add_argument("--replica-buffer", default=None, choices=["layer-shared", "per-layer"],
                   help="replica buffer of the overlapped policies (default: the card's, layer-shared)")
    p.add_argument("--route", default=None, choices=["rail", "direct"],
                   help="how bytes cross nodes: rail (DeepEP: sender's NIC to the same-index GPU of the "
                        "destination node, then NVLink) or direct (NIC to NIC) (default: the cluster's, "
                        "rail for the GPU presets, direct for cpu-gloo)")
    p.add_argument("--dedup", default=None, choices=["on", "off"],
                   help="on: send a token once per destination node and GPU (DeepEP), distinct tokens estimated "
                        "from counts; off: one row per token-expert pair (default: the cluster's dispatcher, "
                        "on for the GPU presets, off for cpu-gloo)")
    p.add_argument("--json", action="store_true", help="print one JSON object {\"config\": ..., \"results\": [...]}")
    p.set_defaults(func=_simulate, warmup_steps=4)
