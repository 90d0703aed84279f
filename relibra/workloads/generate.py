"""generate_trace: a synthetic RL routing trace, step by step: draw the step's batch, deal it to slots under the
batch layout, sample each slot's routing from its sequences' topics, then assemble the RoutingTrace."""

from __future__ import annotations

import dataclasses

import numpy as np

from relibra.cluster import ModelShape, get_model
from relibra.errors import ConfigError
from relibra.progress import progress as tqdm
from relibra.trace import RoutingTrace, loads_from_tokens
from relibra.workloads.config import FIXED_COUNT_MICRO_BATCHES, WORKLOADS, WorkloadConfig, allowed_ep, model_seed
from relibra.workloads.domains import domain_mix, mean_sequence_tokens
from relibra.workloads.layouts import dealt_step, slot_seq_lens, token_budget_batches, token_budget_step
from relibra.workloads.routing import RoutingState, shift_permutations, step_counts, step_token_ids

_INT32_MAX = np.iinfo(np.int32).max


def generate_trace(model: str | ModelShape, workload: str, ep: int, steps: int, seed: int = 0,
                   micro_batches: int | None = None, tokens_per_rank: int | None = None, progress: bool = False,
                   config: WorkloadConfig | None = None, token_level: bool = False) -> RoutingTrace:
    """A synthetic RL routing trace: loads int32 [steps, micro_batches, layers, ep, experts], with seq_lens.

    model: preset name, shape spec or ModelShape; workload: one of WORKLOADS; ep: EP size (divides
    experts); micro_batches: per step; None = derived (token-budget: the packed count of the global
    batch, the largest over the steps; other layouts: FIXED_COUNT_MICRO_BATCHES); under token-budget a
    number sizes a cut-down batch that fills that many micro-batches per rank.
    tokens_per_rank: None = config.tokens_per_rank (None: derived from the global batch of
    config.global_batch_sequences sequences), else about that many tokens per (micro-batch, rank)
    (the budget, under token-budget);
    config: generator knobs (WorkloadConfig()), config.batch_layout says how sequences reach slots;
    token_level: also keep per-token top-k ids (successive sampling per token; only for small configs).
    The random stream is seeded by (seed, model_seed(model)): same arguments, same trace; two models
    never share one routing.
    """
    shape = get_model(model) if isinstance(model, str) else model
    cfg, target, micro_batches = _checked(shape, config or WorkloadConfig(), workload, ep, steps, seed, micro_batches,
                                          tokens_per_rank)
    domains, weights = domain_mix(workload, cfg)
    if cfg.batch_layout == "token-budget" or target is not None:  # the tokens a micro-batch could hold, before drawing
        check_trace_size(shape, cfg, ep, steps, None, target, None)
    else:
        check_trace_size(shape, cfg, ep, steps, micro_batches, target,
                         micro_batches * ep * -(-cfg.global_batch_sequences // (micro_batches * ep)))
    budget_batches, sequences = None, None
    if cfg.batch_layout == "token-budget":  # every step's batch first: they fix the trace's one micro-batch count
        budget = int(target) if target is not None else cfg.tokens_per_microbatch
        budget_batches, micro_batches = token_budget_batches(shape, cfg, domains, weights, ep, steps, seed, budget,
                                                             micro_batches)
    elif target is None:  # the global batch, rounded up to whole sequences in every slot
        sequences = micro_batches * ep * -(-cfg.global_batch_sequences // (micro_batches * ep))
    check_trace_size(shape, cfg, ep, steps, micro_batches, target, sequences)
    if token_level:
        _check_token_level(shape, cfg, workload, steps, micro_batches, ep, target, sequences)

    rng = np.random.default_rng([int(seed), model_seed(shape)])
    # The micro-batch shift has its own stream: moving it leaves the batch as it is.
    shift_rng = np.random.default_rng([int(seed), model_seed(shape), 2])
    state = RoutingState(rng, shape, cfg)
    loads = np.empty((steps, micro_batches, shape.num_layers, ep, shape.num_experts), dtype=np.int32)
    slot_tokens = np.zeros((steps, micro_batches * ep), dtype=np.int64)
    step_lens, step_ids = [], []
    cut = {"capped": 0, "floored": 0}  # sequences whose drawn length was cut (draw_sequences)
    for s in tqdm(range(steps), desc=f"{shape.name} {workload} EP{ep}", unit="step", disable=not progress):
        if s:
            state.advance()
        topic_p = state.topic_distributions()  # [domains * topics, layers, experts]
        if budget_batches is not None:
            batch = token_budget_step(rng, budget_batches[s], cfg, ep, state.topic_frequencies())
        else:
            batch = dealt_step(rng, domains, weights, cfg, ep, micro_batches, target, sequences,
                               state.topic_frequencies())
        cut["capped"] += batch.capped
        cut["floored"] += batch.floored
        slot_tokens[s] = np.bincount(batch.slot, weights=batch.tokens, minlength=micro_batches * ep)
        shift = shift_permutations(shift_rng, micro_batches, shape.num_layers, shape.num_experts,
                                   cfg.microbatch_shift)
        step_lens.append(slot_seq_lens(batch.slot, batch.tokens, micro_batches * ep))
        if token_level:
            step_ids.append(step_token_ids(rng, batch.slot, batch.tokens, batch.topics, topic_p, slot_tokens[s], ep,
                                           shape.top_k, shift))
        else:
            step_counts(rng, batch.slot, batch.tokens, batch.topics, topic_p, slot_tokens[s], shape.top_k, loads[s],
                        shift)
    return _assemble(shape, cfg, workload, ep, seed, target, loads, slot_tokens, step_lens, step_ids or None, cut)


MAX_STEPS = 100_000  # steps of one generated trace (the paper's runs: hundreds)


def check_trace_size(shape: ModelShape, cfg: WorkloadConfig, ep: int, steps: int, micro_batches: int | None,
                     target: int | None, sequences: int | None) -> None:
    """Before any routing is drawn: the loads int32 [steps, micro_batches, layers, ep, experts] within the
    loader's limit (what the trace file could be read back with), and the most tokens one micro-batch
    could hold within int32 (the trace's counts): sequences are cut at length_scale x max_sequence_tokens,
    so a slot holds at most its sequences (or its token target plus one sequence) at that cap.
    micro_batches None: not known yet (token-budget derives it from the drawn batches); one is assumed."""
    from relibra.trace.io import check_decoded_bytes

    loads_bytes = steps * (micro_batches or 1) * shape.num_layers * ep * shape.num_experts * 4
    check_decoded_bytes(loads_bytes, "generate_trace", f"the loads of {steps} steps x {micro_batches} micro-batches "
                        f"x {shape.num_layers} layers x EP {ep} x {shape.num_experts} experts")
    cap = max(2, round(cfg.length_scale * cfg.max_sequence_tokens))
    if sequences is not None:  # the global batch dealt evenly to the slots
        per_rank = sequences // (micro_batches * ep) * cap
    else:
        per_rank = (target if target is not None else cfg.tokens_per_microbatch) + cap
    if per_rank * ep > _INT32_MAX:
        raise ConfigError(f"generate_trace: a micro-batch could hold up to {per_rank * ep} tokens (sequences cut at "
                          f"length_scale {cfg.length_scale:g} x max_sequence_tokens {cfg.max_sequence_tokens} = {cap} "
                          f"tokens, over {ep} ranks), beyond the int32 counts of a trace ({_INT32_MAX})")


def _int_at_least(value, low: int) -> bool:
    """An integer (not a bool) of at least `low`."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= low


def _checked(shape: ModelShape, cfg: WorkloadConfig, workload: str, ep: int, steps: int, seed: int,
             micro_batches: int | None, tokens_per_rank: int | None) -> tuple[WorkloadConfig, int | None, int | None]:
    """Refuse a bad request before any work. Returns (config, tokens per slot or None, micro_batches): the
    config's lengths scaled down where a slot holds fewer tokens than one mean sequence, and the fixed
    layouts' default micro-batch count filled in."""
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    if _int_at_least(steps, 1) and steps > MAX_STEPS:  # checked before any step's batch is drawn
        raise ConfigError(f"generate_trace: steps={steps} is over the bound of {MAX_STEPS} steps per trace")
    if micro_batches is None and cfg.batch_layout != "token-budget":
        micro_batches = FIXED_COUNT_MICRO_BATCHES
    for name, value in (("ep", ep), ("steps", steps), ("micro_batches", micro_batches)):
        if not (name == "micro_batches" and value is None) and not _int_at_least(value, 1):
            raise ConfigError(f"generate_trace: {name} must be a positive integer, got {value!r}")
    if not _int_at_least(seed, 0):
        raise ConfigError(f"generate_trace: the seed must be an integer >= 0, got {seed!r}")
    if shape.num_experts % ep:
        near = [d for d in allowed_ep(shape.num_experts) if ep / 4 <= d <= ep * 4]
        raise ConfigError(f"generate_trace: ep={ep} does not divide the {shape.num_experts} experts of {shape.name!r} "
                          f"(every rank homes the same number of experts); EP sizes near it that do: "
                          f"{', '.join(map(str, near))}")
    target = tokens_per_rank if tokens_per_rank is not None else cfg.tokens_per_rank
    if target is None:
        return cfg, None, micro_batches
    if not _int_at_least(target, 1):
        raise ConfigError(f"generate_trace: tokens_per_rank must be a positive integer, got {target!r}")
    step_tokens = (micro_batches or 1) * ep * target
    if step_tokens > _INT32_MAX:  # a micro-batch's tokens are counted in int32; drawing them takes memory in proportion
        raise ConfigError(f"generate_trace: {micro_batches or 1} micro-batches x {ep} ranks x {target} tokens per rank "
                          f"= {step_tokens} tokens per step, beyond the int32 counts of a trace ({_INT32_MAX})")
    mean_tokens = mean_sequence_tokens(cfg, workload)
    if target < mean_tokens:
        # fewer tokens per slot than one mean sequence: shorten every sequence so a slot still holds about
        # one whole sequence (small test configs; the sensitivity knob below the derived size)
        cfg = dataclasses.replace(cfg, length_scale=cfg.length_scale * target / mean_tokens)
    return cfg, target, micro_batches


def _check_token_level(shape: ModelShape, cfg: WorkloadConfig, workload: str, steps: int, micro_batches: int,
                       ep: int, target: int | None, sequences: int | None) -> None:
    """Per-token ids hold every token of every layer: refuse configs beyond about 4e8 cells."""
    if target is not None:
        slot_tokens = target
    elif sequences is None:  # token-budget
        slot_tokens = cfg.tokens_per_microbatch
    else:
        slot_tokens = sequences // (micro_batches * ep) * mean_sequence_tokens(cfg, workload)
    if steps * micro_batches * ep * slot_tokens * shape.num_layers * shape.num_experts > 4e8:
        raise ConfigError("generate_trace: token_level is for small configs (steps x micro_batches x ep x "
                          "tokens per slot x layers x experts <= 4e8)")


def _assemble(shape: ModelShape, cfg: WorkloadConfig, workload: str, ep: int, seed: int, target: int | None,
              loads: np.ndarray, slot_tokens: np.ndarray, step_lens: list, step_ids: list | None,
              cut: dict) -> RoutingTrace:
    """The RoutingTrace of the sampled steps.

    loads: int32 [steps, micro_batches, layers, ep, experts] (unused with step_ids: counted from the ids);
    slot_tokens: int64 [steps, micro_batches * ep]; step_lens: per step, int32 [slots, pieces] lengths;
    step_ids: per step, step_token_ids' (ids, source ranks) per micro-batch, or None; cut: {"capped",
    "floored"} sequences of the trace whose drawn length was cut to the maximum sequence / raised to 2
    tokens, kept in the provenance as sequences_capped / sequences_floored.
    """
    steps, micro_batches = loads.shape[:2]
    width = max(x.shape[1] for x in step_lens)
    seq_lens = np.zeros((steps, micro_batches, ep, width), dtype=np.int32)
    for s, x in enumerate(step_lens):
        seq_lens[s, :, :, :x.shape[1]] = x.reshape(micro_batches, ep, -1)
    token_experts = token_src = None
    if step_ids is not None:
        t_max = max(len(src) for _, srcs in step_ids for src in srcs)
        token_experts = np.full((steps, micro_batches, t_max, shape.num_layers, shape.top_k), -1, dtype=np.int16)
        token_src = np.full((steps, micro_batches, t_max), -1, dtype=np.int16)
        for s, (ids_list, src_list) in enumerate(step_ids):
            for m, (ids, src) in enumerate(zip(ids_list, src_list)):
                token_experts[s, m, :len(src)] = ids
                token_src[s, m, :len(src)] = src
        loads = loads_from_tokens(token_experts, token_src, ep, shape.num_experts)
    mb_tokens = slot_tokens.reshape(steps, micro_batches, ep).sum(axis=2)
    tokens_per_mb = max(round(float(mb_tokens.mean())), 1)  # the rounded mean; a trace declares at least 1 token
    provenance = {"generator": "relibra.workloads", "workload": workload, "seed": int(seed),
                  "model_seed": model_seed(shape), "batch_layout": cfg.batch_layout,
                  "sequences_per_step": int(np.count_nonzero(seq_lens[0])) if cfg.batch_layout != "megatron" else None,
                  "tokens_per_rank": None if target is None else int(target),
                  "mean_tokens_per_slot": float(slot_tokens.mean()),
                  "token_level": step_ids is not None, "sequences_capped": int(cut["capped"]),
                  "sequences_floored": int(cut["floored"]), "config": cfg.to_dict()}
    return RoutingTrace(loads, shape, ep, tokens_per_mb, provenance, token_experts, token_src, seq_lens)
