"""Pipeline parallelism: how a recipe's decoder layers split over pipeline stages, and the step time of a
1F1B schedule (PipeDream-flush, Megatron's default without virtual stages) over per-stage, per-micro-batch
forward and backward seconds.

  stage_layer_counts  decoder layers per stage (Megatron's even split, or --decoder-last-pipeline-num-layers)
  layer_stages        the stage of every simulated MoE layer and of every leading dense layer
  one_f_one_b_seconds the 1F1B step time of forward / backward seconds [stage, micro_batch]
  interleaved_seconds the interleaved 1F1B step time with virtual stages (chunks) per device
  boundary_crosses_nodes  whether each chunk-to-chunk send leaves its node (Megatron's rank order)

The schedules are event simulations of each device's fixed op order: an op starts when its device is free
and its input has arrived (forward of micro-batch m on stage s after stage s - 1's forward of m; backward
after stage s + 1's backward of m, or after the device's own forward of m on the last stage). Stage-to-stage
sends (send_forward / send_backward seconds [chunks, M], the activation after a chunk's forward, the input
gradient after its backward) follow Megatron-LM's schedules (megatron/core/pipeline_parallel/schedules.py):
plain 1F1B refuses overlapped p2p and waits on every send and receive before the stage's next op
(p2p_communication.py, _communicate with wait_on_reqs), so a send extends its op and its input arrives when
it ends ("blocking"); the interleaved schedule overlaps p2p with compute by default
(--no-overlap-p2p-communication turns it off), so a send delays only its receiver ("overlapped").
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


def _run(orders: list[list[tuple[str, int, int]]], dur: dict, dep, lag: dict | None = None) -> float:
    """Event simulation: device d runs orders[d] (ops (kind, chunk, micro_batch)) in order; an op starts when
    the device is free and dep(op) (another device's op, or None) has finished, plus lag[dep(op)] (the seconds
    its output takes to arrive; none by default). Returns the last finish."""
    lag = lag or {}
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
                start = max(free[d], done[need] + lag.get(need, 0.0) if need is not None else 0.0)
                free[d] = done[op] = start + dur[op]
                pos[d] += 1
                left -= 1
                moved = True
        if not moved:  # an order whose ops wait on each other: a bug in the order, not in the input
            raise ConfigError("pipeline: the schedule deadlocked")
    return max(free)


def one_f_one_b_seconds(forward: np.ndarray, backward: np.ndarray, send_forward: np.ndarray | None = None,
                        send_backward: np.ndarray | None = None, blocking: bool = True) -> float:
    """Seconds of one step under the 1F1B schedule (no virtual stages).

    forward, backward: float [stages P, micro_batches M], each stage's seconds for each micro-batch. Stage s
    runs min(P - s - 1, M) warm-up forwards, then alternates one forward and one backward, then the
    remaining backwards. Equal times f, b everywhere give (M + P - 1)(f + b); one stage gives the sum.
    send_forward, send_backward: [P, M] seconds of each stage's send after its forward (to s + 1; the last
    stage's row unused) and after its backward (to s - 1; the first stage's unused), None: free; blocking:
    see the module's docstring (Megatron's plain 1F1B blocks).
    """
    f, b = _check_times(forward, backward)
    sf, sb = _check_sends(send_forward, send_backward, f.shape)
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
    return _run_chunks(orders, f, b, sf, sb, blocking)


def _check_sends(send_forward, send_backward, shape) -> tuple[np.ndarray, np.ndarray]:
    """The send seconds as float [chunks, M] (zeros where None), checked like the op times; the last chunk
    sends no activation and the first no gradient (zeroed)."""
    out = []
    for x in (send_forward, send_backward):
        x = np.zeros(shape) if x is None else np.array(x, dtype=np.float64)
        if x.shape != shape or not np.isfinite(x).all() or (x < 0).any():
            raise ConfigError(f"pipeline: send seconds must be finite, >= 0 and of shape {shape}, got {x.shape}")
        out.append(x)
    out[0][-1] = 0.0
    out[1][0] = 0.0
    return out[0], out[1]


def sends_on_device(send_forward: np.ndarray, send_backward: np.ndarray, devices: int) -> np.ndarray:
    """[devices] seconds each device spends in blocking sends over the step (its chunks' sends summed;
    chunk c on device c % devices)."""
    sf, sb = _check_sends(send_forward, send_backward, np.shape(send_forward))
    chunks = sf.shape[0]
    return np.bincount(np.arange(chunks) % devices, weights=(sf + sb).sum(axis=1), minlength=devices)


def _run_chunks(orders: list, f: np.ndarray, b: np.ndarray, sf: np.ndarray, sb: np.ndarray,
                blocking: bool) -> float:
    """_run over model chunks in pipeline order: f, b float [chunks, micro_batches] seconds; a chunk's forward
    of a micro-batch waits for the chunk before it, its backward for the chunk after it (the last chunk's for
    its own forward); sf, sb the sends after each op, in the op (blocking) or on the way to its receiver."""
    chunks, m = f.shape
    if blocking:
        f, b, sf, sb = f + sf, b + sb, np.zeros_like(sf), np.zeros_like(sb)
    dur = {("F", c, i): f[c, i] for c in range(chunks) for i in range(m)}
    dur.update({("B", c, i): b[c, i] for c in range(chunks) for i in range(m)})
    lag = {("F", c, i): sf[c, i] for c in range(chunks) for i in range(m)}
    lag.update({("B", c, i): sb[c, i] for c in range(chunks) for i in range(m)})

    def dep(op):
        kind, c, i = op
        if kind == "F":
            return ("F", c - 1, i) if c > 0 else None
        return ("B", c + 1, i) if c < chunks - 1 else ("F", c, i)

    return _run(orders, dur, dep, lag)


def interleaved_seconds(forward: np.ndarray, backward: np.ndarray, devices: int,
                        send_forward: np.ndarray | None = None, send_backward: np.ndarray | None = None,
                        blocking: bool | None = None) -> float:
    """Seconds of one step under Megatron's interleaved 1F1B with virtual stages.

    forward, backward: float [chunks, micro_batches], chunks = devices x v model chunks in pipeline order;
    chunk c runs on device c % devices. micro_batches must be a multiple of devices (Megatron's condition).
    Device d's order: micro-batches go in groups of `devices`, each group through chunk 0, 1, ..., v - 1 of
    the device (forward ids k -> (chunk (k // devices) % v, micro-batch (k // (devices v)) devices + k %
    devices)); warm-up (devices - d - 1) x 2 + (v - 1) x devices forwards (all of them when that reaches
    M v), then one forward and one backward, then the remaining backwards (backward ids in reverse chunk
    order). v = 1 is one_f_one_b_seconds. send_forward, send_backward: [chunks, M] as one_f_one_b_seconds';
    blocking None: Megatron's default, blocking for plain 1F1B, overlapped for the interleaved schedule.
    """
    f, b = _check_times(forward, backward)
    chunks, m = f.shape
    sf, sb = _check_sends(send_forward, send_backward, f.shape)
    if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or devices < 1 or chunks % devices:
        raise ConfigError(f"pipeline: {chunks} chunks do not split over {devices} devices")
    v = chunks // devices
    if blocking is None:
        blocking = p2p_blocking(v)
    if v == 1:
        return one_f_one_b_seconds(f, b, sf, sb, blocking)
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
    return _run_chunks(orders, f, b, sf, sb, blocking)


def p2p_blocking(virtual_stages: int) -> bool:
    """Whether Megatron's schedule waits on its stage-to-stage sends: plain 1F1B always (it refuses
    overlap_p2p_comm), the interleaved schedule not (overlap_p2p_comm defaults to on)."""
    return virtual_stages == 1


def boundary_crosses_nodes(chunks: int, devices: int, stage_gpus: int, gpus_per_node: int) -> np.ndarray:
    """Whether the send from chunk c to chunk c + 1 leaves a node: bool [chunks] (the last entry False).

    Megatron-LM's default rank order "tp-cp-ep-dp-pp" (megatron/core/parallel_state.py,
    initialize_model_parallel) puts the pipeline outermost, so pipeline rank d holds the contiguous global
    ranks [d x stage_gpus, (d + 1) x stage_gpus), nodes gpus_per_node ranks each; rank r of one stage sends
    to the rank at the same place in the next. A boundary crosses nodes where any such pair does (its
    slowest pair sets the send).
    """
    out = np.zeros(chunks, dtype=bool)
    ranks = np.arange(stage_gpus)
    for c in range(chunks - 1):
        a, b = c % devices, (c + 1) % devices
        out[c] = bool(((a * stage_gpus + ranks) // gpus_per_node != (b * stage_gpus + ranks) // gpus_per_node).any())
    return out
