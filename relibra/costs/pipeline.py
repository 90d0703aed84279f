"""Pipeline parallelism: how a recipe's decoder layers split over pipeline stages, and the step time of a
1F1B schedule (PipeDream-flush, Megatron's default without virtual stages) over per-stage, per-micro-batch
forward and backward seconds.

  stage_layer_counts  decoder layers per stage (Megatron's even split, or --decoder-last-pipeline-num-layers)
  layer_stages        the stage of every simulated MoE layer and of every leading dense layer
  one_f_one_b_seconds the 1F1B step time of forward / backward seconds [stage, micro_batch]
  interleaved_seconds the interleaved 1F1B step time with virtual stages (chunks) per device

The schedules are event simulations of each device's fixed op order: an op starts when its device is free
and its input has arrived (forward of micro-batch m on stage s after stage s - 1's forward of m; backward
after stage s + 1's backward of m, or after the device's own forward of m on the last stage). Stage-to-stage
activation sends are not charged (see docs/cost-model.md for their size).
"""

from __future__ import annotations

import numpy as np

from relibra.errors import ConfigError


def stage_layer_counts(decoder_layers: int, stages: int, last_stage_layers: int | None = None) -> tuple[int, ...]:
    """Decoder layers of each pipeline stage, first to last: tuple of `stages` ints summing to decoder_layers.

    Megatron-LM's rule: without last_stage_layers every stage holds decoder_layers / stages (it must
    divide); with --decoder-last-pipeline-num-layers k the last stage holds k and the other stages split
    the rest evenly (it must divide). e.g. (94, 4, 22) -> (24, 24, 24, 22).
    """
    for name, v in (("decoder_layers", decoder_layers), ("stages", stages)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ConfigError(f"pipeline: {name} must be a positive integer, got {v!r}")
    if stages == 1:
        if last_stage_layers not in (None, decoder_layers):
            raise ConfigError(f"pipeline: one stage holds all {decoder_layers} layers, not last_stage_layers "
                              f"{last_stage_layers}")
        return (int(decoder_layers),)
    if last_stage_layers is None:
        if decoder_layers % stages:
            raise ConfigError(f"pipeline: {decoder_layers} decoder layers do not split evenly over {stages} stages "
                              f"(Megatron needs --decoder-last-pipeline-num-layers or a stage count that divides them)")
        return (decoder_layers // stages,) * stages
    k = last_stage_layers
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k < decoder_layers:
        raise ConfigError(f"pipeline: last_stage_layers must be an integer in [1, {decoder_layers - 1}], got {k!r}")
    rest = decoder_layers - k
    if rest % (stages - 1) or rest // (stages - 1) < 1:
        raise ConfigError(f"pipeline: the {rest} decoder layers before the last stage's {k} do not split evenly "
                          f"over {stages - 1} stages")
    return (rest // (stages - 1),) * (stages - 1) + (int(k),)


def layer_stages(counts: tuple[int, ...], dense_layers: int, moe_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """(stage of each MoE layer int64 [moe_layers], stage of each leading dense layer int64 [dense_layers]).

    The decoder is dense_layers dense layers, then moe_layers MoE layers (the simulator's layers, in
    order); counts (stage_layer_counts) cut that sequence into stages, first to last.
    """
    if sum(counts) != dense_layers + moe_layers:
        raise ConfigError(f"pipeline: stages of {'+'.join(map(str, counts))} = {sum(counts)} layers, but the model has "
                          f"{dense_layers} dense + {moe_layers} MoE = {dense_layers + moe_layers} decoder layers")
    stage = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    return stage[dense_layers:], stage[:dense_layers]


def _check_times(forward: np.ndarray, backward: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    f = np.asarray(forward, dtype=np.float64)
    b = np.asarray(backward, dtype=np.float64)
    if f.ndim != 2 or f.shape != b.shape or f.shape[0] < 1 or f.shape[1] < 1:
        raise ConfigError(f"pipeline: forward and backward must be [stages, micro_batches] of one shape, got "
                          f"{f.shape} and {b.shape}")
    if not (np.isfinite(f).all() and np.isfinite(b).all()) or (f < 0).any() or (b < 0).any():
        raise ConfigError("pipeline: forward and backward seconds must be finite and >= 0")
    return f, b


def _run(orders: list[list[tuple[str, int, int]]], dur: dict, dep) -> float:
    """Event simulation: device d runs orders[d] (ops (kind, chunk, micro_batch)) in order; an op starts when
    the device is free and dep(op) (another device's op, or None) has finished. Returns the last finish."""
    done: dict = {}
    free = [0.0] * len(orders)
    pos = [0] * len(orders)
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for d, order in enumerate(orders):
            while pos[d] < len(order):
                op = order[pos[d]]
                need = dep(op)
                if need is not None and need not in done:
                    break
                start = max(free[d], done[need] if need is not None else 0.0)
                free[d] = done[op] = start + dur[op]
                pos[d] += 1
                left -= 1
                moved = True
        if not moved:  # an order whose ops wait on each other: a bug in the order, not in the input
            raise ConfigError("pipeline: the schedule deadlocked")
    return max(free)


def one_f_one_b_seconds(forward: np.ndarray, backward: np.ndarray) -> float:
    """Seconds of one step under the 1F1B schedule (no virtual stages).

    forward, backward: float [stages P, micro_batches M], each stage's seconds for each micro-batch. Stage s
    runs min(P - s - 1, M) warm-up forwards, then alternates one forward and one backward, then the
    remaining backwards. Equal times f, b everywhere give (M + P - 1)(f + b); one stage gives the sum.
    """
    f, b = _check_times(forward, backward)
    p, m = f.shape
    if p == 1:
        return float(f.sum() + b.sum())
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        order = [("F", s, i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", s, warm + i), ("B", s, i)]
        order += [("B", s, i) for i in range(m - warm, m)]
        orders.append(order)
    return _run_chunks(orders, f, b)


def _run_chunks(orders: list, f: np.ndarray, b: np.ndarray) -> float:
    """_run over model chunks in pipeline order: f, b float [chunks, micro_batches] seconds; a chunk's forward
    of a micro-batch waits for the chunk before it, its backward for the chunk after it (the last chunk's for
    its own forward)."""
    chunks, m = f.shape
    dur = {("F", c, i): f[c, i] for c in range(chunks) for i in range(m)}
    dur.update({("B", c, i): b[c, i] for c in range(chunks) for i in range(m)})

    def dep(op):
        kind, c, i = op
        if kind == "F":
            return ("F", c - 1, i) if c > 0 else None
        return ("B", c + 1, i) if c < chunks - 1 else ("F", c, i)

    return _run(orders, dur, dep)


def interleaved_seconds(forward: np.ndarray, backward: np.ndarray, devices: int) -> float:
    """Seconds of one step under Megatron's interleaved 1F1B with virtual stages.

    forward, backward: float [chunks, micro_batches], chunks = devices x v model chunks in pipeline order;
    chunk c runs on device c % devices. micro_batches must be a multiple of devices (Megatron's condition).
    Device d's order: micro-batches go in groups of `devices`, each group through chunk 0, 1, ..., v - 1 of
    the device (forward ids k -> (chunk (k // devices) % v, micro-batch (k // (devices v)) devices + k %
    devices)); warm-up (devices - d - 1) x 2 + (v - 1) x devices forwards (all of them when that reaches
    M v), then one forward and one backward, then the remaining backwards (backward ids in reverse chunk
    order). v = 1 is one_f_one_b_seconds.
    """
    f, b = _check_times(forward, backward)
    chunks, m = f.shape
    if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or devices < 1 or chunks % devices:
        raise ConfigError(f"pipeline: {chunks} chunks do not split over {devices} devices")
    v = chunks // devices
    if v == 1:
        return one_f_one_b_seconds(f, b)
    if m % devices:
        raise ConfigError(f"pipeline: interleaved 1F1B needs micro-batches ({m}) divisible by the stages ({devices})")
    total = m * v

    def fwd_id(k):  # (device-local chunk, micro-batch) of the device's k-th forward
        group, within = divmod(k, devices * v)
        return within // devices, group * devices + within % devices

    def bwd_id(k):
        local, mb = fwd_id(k)
        return v - 1 - local, mb

    orders = []
    for d in range(devices):
        warm = min((devices - d - 1) * 2 + (v - 1) * devices, total)
        order = []
        for k in range(warm):
            local, mb = fwd_id(k)
            order.append(("F", local * devices + d, mb))
        for k in range(total - warm):
            local, mb = fwd_id(warm + k)
            order.append(("F", local * devices + d, mb))
            local, mb = bwd_id(k)
            order.append(("B", local * devices + d, mb))
        for k in range(total - warm, total):
            local, mb = bwd_id(k)
            order.append(("B", local * devices + d, mb))
        orders.append(order)
    return _run_chunks(orders, f, b)
