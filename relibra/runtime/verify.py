"""Numerical checks of the runtime, run inside a multi-rank launch (see launch.py).

`equivalence_worker` trains the same data three ways from the same seed:
  static   - EP over all ranks, megatron's static placement, no replica slots;
  balanced - EP over all ranks: hand-built in-node replicas at step 0, a hand-built reordering of
             every expert plus replicas at step 1, then the kit's `relibra` policy (which migrates
             from the step-1 placement and replicates inside nodes);
  reference- one process (rank 0, a single-rank EP group) running every rank's tokens in turn.
The model is megatron-core's GPTModel with ReLibra's MoE spec (relibra.runtime.model). For the first two
steps it compares forward logits and every expert's and every dense parameter's gradient; after the
last step, every parameter. It also checks the injected migration failure and the refusal of a plan
that breaks the node rule, and a training step whose migration fails mid-transfer (a communication
error: the step goes on on the old placement, or stops when asked). Rank 0 returns {name: max abs diff}
and {name: bool}.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from relibra.cluster import get_topology
from relibra.errors import ConfigError, PlanError
from relibra.policies import get_policy
from relibra.runtime.config import ModelConfig, NodeLayout, TrainConfig
from relibra.runtime.data import TraceData
from relibra.runtime.engine import Engine
from relibra.runtime.collect import gather_arrays, gather_list
from relibra.runtime.groups import build_groups
from relibra.runtime.migration import InjectedFailure, MigrationError, migrate_homes
from relibra.runtime.plans import cross_node_replica_plan, in_node_replica_plan, reordered_home, static_plan
from relibra.runtime.slots import logical_state_dict
from relibra.trace import static_placement
from relibra.workloads import generate_trace


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a)[:4], sorted(b)[:4])
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def _snapshot(engine: Engine, sources: list[int]) -> dict:
    """What one rank computed in the last step: {(micro_batch, src, "logits"): array}."""
    out = {}
    for i, c in enumerate(engine.capture):
        m, src = i // len(sources), sources[i % len(sources)]
        out[(m, src, "logits")] = c["logits"]
    engine.capture = []
    return out


def _make_trace(model: str, ep: int, steps: int, micro_batches: int, tokens_per_rank: int, seed: int):
    return generate_trace(model, "math", ep=ep, steps=steps, seed=seed, micro_batches=micro_batches,
                          tokens_per_rank=tokens_per_rank, token_level=True)


def equivalence_worker(rank: int, world: int, nodes: int, model: str = "tiny", steps: int = 3,
                       micro_batches: int = 2, tokens_per_rank: int = 24, replica_slots: int = 2,
                       seed: int = 0, dtype: str = "float64") -> dict:
    torch.use_deterministic_algorithms(False)
    layout = NodeLayout(world, nodes)
    groups = build_groups(layout)
    trace = _make_trace(model, world, steps, micro_batches, tokens_per_rank, seed)
    cfg = ModelConfig.from_preset(model, replica_slots=replica_slots, seed=seed, dtype=dtype)
    data = TraceData(trace, cfg.shape.vocab_size, seed)
    train = TrainConfig(steps=steps, lr=1e-2)
    L, E = cfg.num_layers, cfg.num_experts
    home0 = static_placement(L, E, world)
    max_tokens = world * tokens_per_rank  # the reference runs one rank's tokens at a time; bound generously

    relibra_policy = get_policy("relibra", spare_slots_per_gpu=replica_slots, min_replica_tokens=1,
                                iterations=50, seed=seed)
    topology = get_topology("cpu-gloo").with_changes(num_nodes=nodes, gpus_per_node=layout.ranks_per_node)
    used = {"replica_tokens": 0, "policy_replicas": 0}

    def plans_for(kind: str, step: int, prev_home):
        loads = trace.loads[step]
        if kind == "static":
            return static_plan(loads, layout.ranks_per_node)
        if step == 0:  # hand-built: in-node replicas on the static placement
            return in_node_replica_plan(loads, layout.ranks_per_node, replica_slots, home=home0)
        if step == 1:  # hand-built: every expert moves, plus replicas
            return in_node_replica_plan(loads, layout.ranks_per_node, replica_slots,
                                        home=reordered_home(L, E, world, shift=1))
        plan = relibra_policy.plan(trace, step, topology, prev_home)  # the kit's relibra policy
        used["policy_replicas"] += int((plan.replica_expert >= 0).sum())
        return plan

    def batches(step: int, sources: list[int]):
        return ([[data.batch(step, m, s, L) for s in sources] for m in range(micro_batches)],
                [data.tokens(step, m) for m in range(micro_batches)])

    records = {}
    for kind in ("static", "balanced"):
        engine = Engine(ModelConfig(cfg.shape, L, 0 if kind == "static" else replica_slots, seed, dtype), train,
                        groups.collection(), layout.ranks_per_node, home0, max_tokens, split_waiting=kind != "static")
        engine.capture = []
        rec = []
        for step in range(steps):
            b, ntok = batches(step, [rank])
            plan = plans_for(kind, step, engine.home)
            if kind == "balanced":
                used["replica_tokens"] += int(plan.occupied_replica_tokens().sum())
            out = engine.step(plan, b, ntok, [rank], optimizer_step=False)
            used.setdefault(kind, 0)
            used[kind] += out["experts_moved"]
            snap = gather_arrays(_snapshot(engine, [rank])) if step < 2 else None
            grads = gather_arrays(engine.logical_expert_state("grad")) if step < 2 else None
            dense_grad = engine.dense_state("grad") if step < 2 else None
            engine.optimizer.step()
            rec.append({"snap": snap, "grads": grads, "dense_grad": dense_grad,
                        "loss": sum(gather_list(out["loss"]) or [0.0])})
        params = gather_arrays(engine.logical_expert_state("param"))
        records[kind] = {"steps": rec, "params": params, "dense": engine.dense_state("param")}
        if kind == "balanced":
            balanced_engine = engine
    # single-process reference on rank 0
    ref = None
    if rank == 0:
        pgc = groups.collection(ep_group=groups.solo)
        engine = Engine(ModelConfig(cfg.shape, L, 0, seed, dtype), train, pgc, 1, np.zeros((L, E), dtype=np.int64),
                        max_tokens)
        engine.capture = []
        rec = []
        sources = list(range(world))
        for step in range(steps):
            b, ntok = batches(step, sources)
            loads = trace.loads[step].sum(axis=2, keepdims=True)
            plan = static_plan(loads, 1)
            out = engine.step(plan, b, ntok, sources, optimizer_step=False)
            snap = _snapshot(engine, sources) if step < 2 else None
            grads = engine.logical_expert_state("grad") if step < 2 else None
            dense_grad = engine.dense_state("grad") if step < 2 else None
            engine.optimizer.step()
            rec.append({"snap": snap, "grads": grads, "dense_grad": dense_grad, "loss": out["loss"]})
        ref = {"steps": rec, "params": engine.logical_expert_state("param"), "dense": engine.dense_state("param")}
    dist.barrier()

    # injected migration failure: balanced engine, move every expert again, fail one transfer
    before = gather_arrays(balanced_engine.logical_expert_state("param"))
    moments_before = gather_arrays(balanced_engine.logical_expert_state("exp_avg_sq"))
    home_before = balanced_engine.home.copy()
    slots, optimizer = balanced_engine.hook.slots, balanced_engine.optimizer
    failed_everywhere = 0
    try:
        migrate_homes(slots, groups.ep, optimizer, reordered_home(L, E, world, shift=5),
                      failure=InjectedFailure(rank=world - 1, transfer=1))
    except MigrationError:
        failed_everywhere = 1
    flag = torch.tensor([failed_everywhere])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    after = gather_arrays(balanced_engine.logical_expert_state("param"))
    moments_after = gather_arrays(balanced_engine.logical_expert_state("exp_avg_sq"))
    homes = gather_list(balanced_engine.home.tolist())
    # then the same migration without failure succeeds and keeps every expert's values
    migrate_homes(slots, groups.ep, optimizer, reordered_home(L, E, world, shift=5))
    moved = gather_arrays(balanced_engine.logical_expert_state("param"))
    moved_moments = gather_arrays(balanced_engine.logical_expert_state("exp_avg_sq"))

    # node rule: refused before any transfer
    bad = cross_node_replica_plan(trace.loads[0], layout.ranks_per_node, replica_slots) if nodes > 1 else None
    refused = 1
    pushed_before = balanced_engine.hook.replicas.bytes_pushed
    if bad is not None:
        bad.home = balanced_engine.home.copy()
        bad.replica_expert[0, 0, layout.ranks_per_node, 0] = int(np.flatnonzero(bad.home[0] == 0)[0])
        b, ntok = batches(0, [rank])
        try:
            balanced_engine.step(bad, b, ntok, [rank])
            refused = 0
        except PlanError as exc:
            refused = int("node" in str(exc))
    untouched = gather_arrays(balanced_engine.logical_expert_state("param"))
    no_push = int(balanced_engine.hook.replicas.bytes_pushed == pushed_before)

    # a communication error mid-transfer inside a training step: rolled back through the vote, the step
    # goes on on the old placement (on_migration_failure="continue"), or raises ("stop")
    home_now = balanced_engine.home.copy()
    target = static_plan(trace.loads[0], layout.ranks_per_node, home=reordered_home(L, E, world, shift=3))
    b, ntok = batches(0, [rank])
    balanced_engine.hook.failure = InjectedFailure(world - 1, 1, "wait")
    out = balanced_engine.step(target, b, ntok, [rank])
    went_on = int("rolled back" in (out["migration_error"] or "") and np.isfinite(out["loss"])
                  and np.array_equal(balanced_engine.home, home_now))
    balanced_engine.hook.failure = InjectedFailure(0, 1, "wait")
    balanced_engine.hook.on_migration_failure = "stop"
    try:
        balanced_engine.step(target, b, ntok, [rank])
        stopped = 0
    except MigrationError:
        stopped = int(np.array_equal(balanced_engine.home, home_now))
    flags = torch.tensor([refused, no_push, went_on, stopped])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)

    if rank != 0:
        return {}
    st, ba = records["static"], records["balanced"]
    diffs = {}
    for step in range(2):
        s_snap = st["steps"][step]["snap"]
        b_snap = ba["steps"][step]["snap"]
        r_snap = ref["steps"][step]["snap"]
        for what in ("logits",):
            pick = lambda d: {k: v for k, v in d.items() if k[2] == what}  # noqa: E731
            diffs[f"step{step}_{what}_balanced_vs_static"] = max_diff(pick(b_snap), pick(s_snap))
            diffs[f"step{step}_{what}_static_vs_reference"] = max_diff(pick(s_snap), pick(r_snap))
            diffs[f"step{step}_{what}_balanced_vs_reference"] = max_diff(pick(b_snap), pick(r_snap))
        diffs[f"step{step}_expert_grad_balanced_vs_static"] = max_diff(ba["steps"][step]["grads"], st["steps"][step]["grads"])
        diffs[f"step{step}_expert_grad_balanced_vs_reference"] = max_diff(ba["steps"][step]["grads"], ref["steps"][step]["grads"])
        diffs[f"step{step}_dense_grad_balanced_vs_reference"] = float(np.abs(ba["steps"][step]["dense_grad"] - ref["steps"][step]["dense_grad"]).max())
    diffs["adamw_params_balanced_vs_static"] = max_diff(ba["params"], st["params"])
    diffs["adamw_params_balanced_vs_reference"] = max_diff(ba["params"], ref["params"])
    diffs["adamw_dense_balanced_vs_reference"] = float(np.abs(ba["dense"] - ref["dense"]).max())
    for i, (a, b) in enumerate(zip(ba["steps"], ref["steps"])):
        diffs[f"loss_step{i}_balanced_vs_reference"] = abs(a["loss"] - b["loss"])
    for i, (a, b) in enumerate(zip(st["steps"], ref["steps"])):
        diffs[f"loss_step{i}_static_vs_reference"] = abs(a["loss"] - b["loss"])
    diffs["migration_roundtrip_params"] = max_diff(moved, before)
    diffs["migration_roundtrip_moments"] = max_diff(moved_moments, moments_before)
    checks = {
        "failure_raised_on_every_rank": bool(flag.item()),
        "failure_left_params": max_diff(after, before) == 0.0,
        "failure_left_moments": max_diff(moments_after, moments_before) == 0.0,
        "failure_left_placement": all(np.array_equal(np.asarray(h), home_before) for h in homes),
        "node_rule_refused": bool(flags[0].item()),
        "node_rule_no_transfer": bool(flags[1].item()) and max_diff(untouched, moved) == 0.0,
        "step_failed_migration_went_on": bool(flags[2].item()),
        "step_failed_migration_stopped": bool(flags[3].item()),
        "reordering_moved_experts": used["balanced"] > 0 and used["static"] == 0,
    }
    if layout.ranks_per_node > 1:  # one rank per node: no replica can be made (node rule)
        checks["replicas_carried_tokens"] = used["replica_tokens"] > 0
        checks["relibra_policy_made_replicas"] = used["policy_replicas"] > 0
    return {"diffs": diffs, "checks": checks}


def _tp_sequence(data: TraceData, step: int, micro_batch: int, sources: slice, rank: int, tp: int,
                 num_layers: int, num_experts: int):
    """One TP group's sequence (the group is its EP group): its sources' tokens back to back, cut to a
    multiple of tp. Under sequence parallelism TP rank r routes slice r of it, so the slices are the
    plan's sources. Returns (SourceBatch: the whole sequence's ids and labels, slice `rank`'s replayed
    ids [L, T / tp, K]; loads int [L, tp, E] of every slice)."""
    from relibra.runtime.data import SourceBatch

    parts = [data.batch(step, micro_batch, s, num_layers) for s in range(sources.start, sources.stop)]
    n = sum(len(p.ids) for p in parts) // tp * tp
    ids, labels = (np.concatenate([getattr(p, f) for p in parts])[:n] for f in ("ids", "labels"))
    replay = np.concatenate([p.replay for p in parts], axis=1)[:, :n]  # [L, n, K]
    slices = np.split(replay, tp, axis=1)
    loads = np.stack([np.stack([np.bincount(sl[layer].reshape(-1), minlength=num_experts) for sl in slices])
                      for layer in range(num_layers)])
    return SourceBatch(ids, labels, np.ascontiguousarray(slices[rank])), loads


def sharded_expert_tensors(model) -> dict[tuple, np.ndarray]:
    """{(sharded key, *global offset): float64 array} of every routed-expert tensor of the model's
    distributed-checkpoint view (megatron's sharded_state_dict, factories applied)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    sharded = model.sharded_state_dict()
    apply_factories(sharded)
    return {(t.key, *map(int, t.global_offset)): t.data.detach().double().cpu().numpy()
            for t in nested_values(sharded) if isinstance(t, ShardedTensor) and ".experts." in t.key}


def megatron_view_matches(model, moes) -> bool:
    """Whether the model's sharded expert tensors (the kit's logical view) are, key for key, offset for
    offset and value for value, those of megatron's own expert classes (each slot under megatron's static
    label, the logical relabelling off). They must be under static placement (slot i of EP rank r holds
    expert r * E / ep + i), on every rank: a TP rank other than 0 included. SequentialMLP experts only:
    the host stand-in for Transformer Engine's GroupedLinear has no sharded view of its own, so
    megatron's TEGroupedMLP view over it is not the one TE gives (the worker checks the grouped layout
    against SequentialMLP's keys instead)."""
    mine = sharded_expert_tensors(model)
    placements = [moe.experts.placement for moe in moes]
    try:
        for moe in moes:
            moe.experts.placement = None
        megatrons = sharded_expert_tensors(model)
    finally:
        for moe, placement in zip(moes, placements):
            moe.experts.placement = placement
    return mine.keys() == megatrons.keys() and all(np.array_equal(mine[k], megatrons[k]) for k in mine)


def megatron_equivalence_worker(rank: int, world: int, ep: int, setups: list, model: str = "tiny", steps: int = 3,
                                micro_batches: int = 2, tokens_per_rank: int = 16, replica_slots: int = 2,
                                seed: int = 0, tp: int = 1, device: str = "cpu", pp: int = 1) -> dict:
    """ReLibra against static placement under megatron DDP and get_megatron_optimizer, per set-up.

    Grid: EP `ep`, DP world / ep (megatron's initialize_model_parallel). The trace has one source per
    rank; DP replica d trains sources d * ep .. d * ep + ep - 1, and its EP group plans on their loads.
    Both models train the same tokens with replayed routing. ReLibra: step 0 in-node replicas on the
    static placement (Adam state is created), step 1 every expert migrates (weights, masters, Adam state)
    plus replicas, step 2 migrates again. Static: megatron's placement, no replica slots. Rank 0
    returns {set-up name: {"loss": max abs diff over steps, "param", "master", "exp_avg_sq", "dense":
    max abs diff after the last step, "grad_norm": max abs diff}, "checks": {...}}; the checks include the
    static model's checkpoint view against megatron's own (megatron_view_matches, every rank) and one
    expert-tensor layout for every set-up (grouped and sequential experts alike). device: where the models
    run ("cuda" under a "cpu:gloo,cuda:nccl" process group, scripts/device_check.py); figures stay on the host.
    pp: pipeline stages (megatron's 1F1B schedule); the EP group is then a stage's data-parallel group
    (EP = world / pp), each pipeline trains one source, and "dense" compares every stage's dense weights.
    """
    from relibra.runtime.megatron_train import MegatronSetup, MegatronTrainer, megatron_grid

    torch.use_deterministic_algorithms(False)
    pgc = megatron_grid(ep, tp, pp)
    dp = world // ep
    if pp > 1 and (tp > 1 or dist.get_process_group_ranks(pgc.dp) != dist.get_process_group_ranks(pgc.ep)):
        raise ConfigError(f"PP {pp} x EP {ep}: the worker trains one source per pipeline, so each stage's EP group "
                          "must be its data-parallel group (EP = world / PP, TP 1)")
    if tp > 1 and dist.get_process_group_ranks(pgc.tp) != dist.get_process_group_ranks(pgc.ep):
        raise ConfigError(f"TP {tp} x EP {ep}: the worker feeds each EP group one sequence, so its TP group must "
                          "be its EP group (TP = EP)")
    e_rank, d_rank = pgc.ep.rank(), pgc.expt_dp.rank()
    src = d_rank * ep + e_rank
    trace = _make_trace(model, world, steps, micro_batches, tokens_per_rank, seed)
    cfg = ModelConfig.from_preset(model, replica_slots=replica_slots, seed=seed)
    data = TraceData(trace, cfg.shape.vocab_size, seed)
    L, E = cfg.num_layers, cfg.num_experts
    homes = [static_placement(L, E, ep), reordered_home(L, E, ep, shift=1), reordered_home(L, E, ep, shift=3)]
    sources = slice(d_rank * ep, (d_rank + 1) * ep)
    out, checks = {}, {"grid": f"EP {ep} x DP {dp}" if pp == 1 else f"PP {pp} x EP {ep}", "ep_groups_agree": True,
                       "static view is megatron's": True, "every set-up checkpoints the same expert tensors": True}
    checkpoint_layout = None  # {(sharded key, *global offset): shape} of the first set-up's static model
    for setup in setups:
        setup = MegatronSetup(**setup) if isinstance(setup, dict) else setup
        record = {}
        for kind in ("static", "relibra"):
            trainer = MegatronTrainer(ModelConfig(cfg.shape, L, replica_slots if kind == "relibra" else 0, seed),
                                      setup, pgc, tokens_per_rank * 2, device=device)
            losses, norms, moved, replica_tokens = [], [], 0, 0
            expert_runs = [0]  # expert-MLP forwards: under recompute each is re-run in backward
            for moe in trainer.hook.slots.moes:
                moe.experts.register_forward_pre_hook(lambda *_: expert_runs.__setitem__(0, expert_runs[0] + 1))
            for step in range(steps):
                loads = trace.loads[step][:, :, sources]  # [M, L, ep, E]: this EP group's sources
                batches = [data.batch(step, m, src, L) for m in range(micro_batches)]
                # the loss is a mean over this DP replica's tokens of the micro-batch
                ntok = [int(sum(data.batch(step, m, s, L).ids.size for s in range(sources.start, sources.stop)))
                        for m in range(micro_batches)]
                if tp > 1:  # the TP group runs its sources' tokens as one sequence; each rank routes its slice
                    parts = [_tp_sequence(data, step, m, sources, e_rank, tp, L, E) for m in range(micro_batches)]
                    batches = [b for b, _ in parts]
                    loads = np.stack([slice_loads for _, slice_loads in parts])  # the slices are the sources
                    ntok = [len(b.ids) for b in batches]
                if kind == "static":
                    plan = static_plan(loads, ep)
                else:
                    plan = in_node_replica_plan(loads, ep, replica_slots, home=homes[step % len(homes)])
                    replica_tokens += int(plan.occupied_replica_tokens().sum())
                res = trainer.step(plan, batches, ntok)
                loss = torch.tensor([res["loss"]], dtype=torch.float64)
                dist.all_reduce(loss)
                # every TP rank holds its group's loss; under PP only the last stage holds one
                losses.append(float(loss.item()) / (dp * tp if pp == 1 else world // (ep * pp)))
                norms.append(res["grad_norm"])
                moved += res["experts_moved"]
            forwards = steps * micro_batches * len(trainer.hook.slots.moes)
            record[kind] = {"losses": losses, "norms": norms, "moved": moved, "replica_tokens": replica_tokens,
                            "recomputed": expert_runs[0] == 2 * forwards if setup.recompute else
                            expert_runs[0] == forwards,
                            "dense": gather_arrays({("dense", rank): trainer.dense_state()})}
            for what in ("param", "master", "exp_avg_sq"):
                record[kind][what] = gather_arrays(trainer.logical_expert_state(what))
            # what a weight push and a distributed checkpoint read: logical names, replica slots left out
            pushed = {(k,): v.detach().double().cpu().numpy()
                      for k, v in logical_state_dict(trainer.model, gather=True).items() if torch.is_tensor(v)}
            if pp > 1:  # every stage's push (module names restart at 0 on each stage)
                pushed = gather_arrays({(pgc.pp.rank(), *k): v for k, v in pushed.items()})
            record[kind]["logical_state_dict"] = pushed
            record[kind]["sharded_experts"] = gather_arrays(sharded_expert_tensors(trainer.model))
            if kind == "static" and not setup.grouped_gemm:
                checks["static view is megatron's"] &= megatron_view_matches(trainer.model, trainer.hook.slots.moes)
            if kind == "static" and rank == 0:  # grouped and sequential experts: one checkpoint layout
                layout = {k: v.shape for k, v in record[kind]["sharded_experts"].items()}
                checkpoint_layout = checkpoint_layout or layout
                checks["every set-up checkpoints the same expert tensors"] &= layout == checkpoint_layout
            # every DP replica holds the same experts: compare them across replicas too
            mine = trainer.logical_expert_state("param")
            flat = torch.tensor(np.concatenate([mine[k] for k in sorted(mine)]))
            top = flat.clone()
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=pgc.expt_dp)
            checks["ep_groups_agree"] &= bool(torch.equal(top, flat))
            del trainer
        if rank == 0:
            st, rl = record["static"], record["relibra"]
            out[setup.name] = {
                "loss": max(abs(a - b) for a, b in zip(rl["losses"], st["losses"])),
                "grad_norm": max(abs(a - b) for a, b in zip(rl["norms"], st["norms"])),
                "param": max_diff(rl["param"], st["param"]),
                "master": max_diff(rl["master"], st["master"]),
                "exp_avg_sq": max_diff(rl["exp_avg_sq"], st["exp_avg_sq"]),
                "dense": max_diff(rl["dense"], st["dense"]),
                "logical_state_dict": max_diff(rl["logical_state_dict"], st["logical_state_dict"]),
                "sharded_experts": max_diff(rl["sharded_experts"], st["sharded_experts"]),
                "losses": rl["losses"], "static_losses": st["losses"], "norms": rl["norms"], "static_norms": st["norms"],
            }
            checks[f"{setup.name}: migrated"] = rl["moved"] > 0 and st["moved"] == 0
            checks[f"{setup.name}: replicas carried tokens"] = rl["replica_tokens"] > 0
            checks[f"{setup.name}: experts ran {'twice (recompute)' if setup.recompute else 'once'} per forward"] = (
                rl["recomputed"] and st["recomputed"])
        if setup.gradient_accumulation_fusion and torch.cuda.device_count() == 0:
            from relibra.runtime import standins  # the fused weight-gradient path ran (host kernel)

            counter = standins.FUSED_GROUPED_WGRADS if setup.grouped_gemm else standins.FUSED_WGRAD_CALLS
            checks[f"{setup.name}: fused weight-gradient path ran on rank {rank}"] = counter[0] > 0
    for name in ("ep_groups_agree", "static view is megatron's"):  # every rank's verdict
        flag = torch.tensor([int(checks[name])])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        checks[name] = bool(flag.item())
    return {"diffs": out, "checks": checks} if rank == 0 else {}
