"""megatron-core: RouterReplay recordings (`megatron-replay`) and router-trace JSONL (`megatron-jsonl`).

megatron-replay: what `RouterReplay.get_recorded_data()` returns (megatron-core 0.16,
megatron/core/transformer/moe/router_replay.py), one [num_tokens, topk] tensor per MoE layer in
router instantiation order, saved once per (step, micro-batch, EP rank). A .pt file (torch.save)
holds that list or {"topk_indices": list, "step", "micro_batch", "rank"}; a .npz holds arrays
`layer_0 ..` (or `arr_0 ..`) and optional 0-d `step`, `micro_batch`, `rank`. Keys missing in the
file come from the file name (`step12`, `mb3` / `micro_batch3`, `rank5`), else 0.

megatron-jsonl: `router_trace_rank{r}.jsonl` as megatron-core's RouterTracer writes it
(megatron/core/transformer/moe/router_trace.py, 2026): one record per router call,
{"step", "stage": "pre_dispatch", "block": "decoder" | "mtp", "layer", "rank", "num_tokens",
"topk", "top_indices"}, "mtp_idx" on MTP records, and sidecar offsets (`hs_*`, `logit_*`) that
are not needed here. `layer` is the index of the module in `decoder.layers` (dense layers have
no router, so a first-dense model's MoE routers start at 1); it is mapped to MoE layer order.
Micro-batch j of (step, rank) is the j-th record of each layer; a record whose top_indices equal
an earlier record of the same (step, block, layer, rank) is a repeat (activation recompute fires
the router's forward hook again, or records were written twice): an error, or dropped with
recompute="drop". Layers and top-k come from the file; the expert count from the model preset,
`experts`, or `router_state_rank{r}.pt` beside the trace (`--moe-routing-trace-dump-weights`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import defaultdict

import numpy as np

from relibra.cluster import ModelShape
from relibra.errors import ConfigError, TraceError
from relibra.importers.common import (TraceBuilder, as_count, check_ep, check_ids, expand_paths, load_container,
                                      natural_index, resolve_model, source_provenance)
from relibra.trace import RoutingTrace, expert_ids_from_json, parse_json
from relibra.trace.io import bounded_lines

_KEY_PATTERNS = {
    "step": re.compile(r"(?:^|[^a-z])step[_-]?(\d+)", re.I),
    "micro_batch": re.compile(r"(?:^|[^a-z])(?:micro_?batch|mb)[_-]?(\d+)", re.I),
    "rank": re.compile(r"(?:^|[^a-z])rank[_-]?(\d+)", re.I),
}


def _replay_layers(obj, path: str) -> tuple[list, dict]:
    """(per-layer arrays, metadata dict) from one megatron-replay file's content."""
    meta = {}
    if isinstance(obj, dict):
        if "topk_indices" in obj:  # the .pt dict form
            layers = obj["topk_indices"]
            meta = {k: obj[k] for k in ("step", "micro_batch", "rank") if k in obj}
        else:  # the .npz form: layer_i or arr_i arrays
            meta = {k: obj[k] for k in ("step", "micro_batch", "rank") if k in obj}
            names = [n for n in obj if n not in meta]
            if not names:
                raise TraceError(f"{path}: holds no per-layer arrays (expected layer_0, layer_1, ...)")
            bad = [n for n in names if not re.fullmatch(r"(layer|arr)_\d+", n)]
            if bad:
                raise TraceError(f"{path}: unexpected field {bad[0]!r}; per-layer arrays are named layer_0, layer_1, ...")
            names.sort(key=natural_index)
            idx = [natural_index(n) for n in names]
            if idx != list(range(len(names))):
                raise TraceError(f"{path}: per-layer arrays must be numbered 0..{len(names) - 1}, got {names}")
            layers = [obj[n] for n in names]
    elif isinstance(obj, (list, tuple)):
        layers = list(obj)
    else:
        raise TraceError(f"{path}: expected a list of per-layer [num_tokens, topk] tensors, got {type(obj).__name__}")
    if not isinstance(layers, (list, tuple)) or not all(isinstance(x, np.ndarray) for x in layers):
        raise TraceError(f"{path}: field 'topk_indices' must be a list of tensors")
    return list(layers), meta


def import_megatron_replay(paths, model: str | ModelShape, ep: int, keep_tokens: bool = True) -> RoutingTrace:
    """Import megatron-core RouterReplay recordings, one file per (step, micro-batch, EP rank).

    paths: files (.pt or .npz) or directories of them, read one at a time.
    """
    shape = resolve_model(model)
    check_ep(shape, ep)
    files = expand_paths(paths, (".pt", ".npz"))
    builder = TraceBuilder(shape.num_experts, shape.top_k, keep_tokens)
    seen: dict[tuple[int, int, int], str] = {}
    for path in files:
        layers, meta = _replay_layers(load_container(path), path)
        key = []
        for name in ("step", "micro_batch", "rank"):
            if name in meta:
                key.append(as_count(meta[name], path, name))
            else:
                hit = _KEY_PATTERNS[name].search(os.path.basename(path))
                key.append(int(hit.group(1)) if hit else 0)
        if key[2] >= ep:
            raise TraceError(f"{path}: field 'rank' is {key[2]}, outside the EP group [0, {ep})")
        if len(layers) != shape.num_layers:
            raise TraceError(f"{path}: field 'topk_indices' holds {len(layers)} layer tensors, but model {shape.name!r} "
                             f"has {shape.num_layers} MoE layers")
        checked = []
        for i, arr in enumerate(layers):
            ids = check_ids(arr, shape, path, f"layer {i}", ("token", "k"))
            if checked and ids.shape[0] != checked[0].shape[0]:
                raise TraceError(f"{path}: field 'layer {i}' has {ids.shape[0]} tokens but layer 0 has "
                                 f"{checked[0].shape[0]}; every layer sees the same tokens")
            checked.append(ids)
        if tuple(key) in seen:
            raise TraceError(f"{path}: (step {key[0]}, micro-batch {key[1]}, rank {key[2]}) is also in "
                             f"{seen[tuple(key)]}; name files stepS_mbM_rankR or store step/micro_batch/rank in them")
        seen[tuple(key)] = path
        builder.add_slot(tuple(key), np.stack(checked, axis=1), path)
    steps = sorted({s for s, _, _ in seen})
    return builder.finish(shape, ep, source_provenance("megatron-replay", files, steps=steps), source="megatron-replay")


# ---- megatron-core router-trace JSONL ------------------------------------------------------------
MTP_MODES = ("drop", "layers")
RECOMPUTE_MODES = ("error", "drop")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.I)


def router_state_experts(files: list[str]) -> tuple[int, str] | None:
    """(experts, path) from `router_state_rank{r}.pt` files beside the traces, or None when absent.

    RouterTracer dumps {layer: {"weight": [experts, hidden] float32, "expert_bias", "score_function",
    "topk"}}; read with torch.load(weights_only=True). Every layer must agree on the expert count.
    """
    dirs = sorted({os.path.dirname(os.path.abspath(f)) for f in files})
    found = None
    for d in dirs:
        for name in sorted(os.listdir(d)):
            if not re.fullmatch(r"router_state_rank\d+\.pt", name):
                continue
            path = os.path.join(d, name)
            state = load_container(path)
            if not isinstance(state, dict) or not state:
                raise TraceError(f"{path}: expected a dict layer -> router state, got {type(state).__name__}")
            for layer, entry in state.items():
                weight = entry.get("weight") if isinstance(entry, dict) else None
                if not isinstance(weight, np.ndarray) or weight.ndim != 2:
                    raise TraceError(f"{path}: layer {layer}: field 'weight' must be a [experts, hidden] tensor")
                experts = int(weight.shape[0])
                if found is not None and experts != found[0]:
                    raise TraceError(f"{path}: layer {layer}: router weight has {experts} experts but {found[1]} has "
                                     f"{found[0]}")
                found = (experts, path)
    return found


def _jsonl_records(path: str):
    """(line number, record dict) of one JSONL file, read line by line."""
    any_record = False
    with open(path, "rb") as fh:
        for n, raw in bounded_lines(fh, path):
            if not raw.strip():
                continue
            rec = parse_json(raw, f"{path}: line {n}")
            if not isinstance(rec, dict):
                raise TraceError(f"{path}: line {n}: a record must be a JSON object")
            any_record = True
            yield n, rec
    if not any_record:
        raise TraceError(f"{path}: the file holds no records")


def _layer_name(key: tuple) -> str:
    block, mtp_idx, layer = key
    return f"decoder.layers.{layer}" if block == "decoder" else f"mtp.layers.{mtp_idx}.mtp_model_layer.layers.{layer}"


def import_megatron_jsonl(paths, model: str | ModelShape | None = None, ep: int | None = None,
                          experts: int | None = None, mtp: str = "drop", recompute: str = "error",
                          keep_tokens: bool = True, hidden: int = 2048, moe_ffn: int = 768) -> RoutingTrace:
    """Import megatron-core `router_trace_rank{r}.jsonl` files (one per rank), read line by line.

    model: a preset (its layers and top-k are checked against the file) or None (shape inferred:
    layers = distinct MoE routers, top-k from `topk`, experts from `experts` or the router state).
    ep: EP size; None = highest rank + 1. mtp: "drop" MTP records (counted in provenance) or keep
    them as "layers" after the decoder's. recompute: "error" on a repeated record, or "drop" it.
    """
    if mtp not in MTP_MODES:
        raise ConfigError(f"mtp must be one of {', '.join(MTP_MODES)}, got {mtp!r}")
    if recompute not in RECOMPUTE_MODES:
        raise ConfigError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {recompute!r}")
    files = expand_paths(paths, (".jsonl",))
    preset = resolve_model(model) if model is not None else None
    if preset is not None and experts is not None and experts != preset.num_experts:
        raise ConfigError(f"--experts {experts} disagrees with model {preset.name!r} ({preset.num_experts} experts)")
    state = router_state_experts(files)
    num_experts = preset.num_experts if preset is not None else experts
    expert_source = "model preset" if preset is not None else "--experts"
    if num_experts is None and state is not None:
        num_experts, expert_source = state[0], os.path.basename(state[1])
    if num_experts is None:
        raise ConfigError("the expert count is not in router-trace JSONL: give a model preset or --experts, or keep "
                          "router_state_rank{r}.pt (--moe-routing-trace-dump-weights) beside the trace")
    if state is not None and state[0] != num_experts:
        raise TraceError(f"{state[1]}: router weights have {state[0]} experts, but {expert_source} says {num_experts}")

    topk = preset.top_k if preset is not None else None
    builder = None
    mb_of = defaultdict(int)  # (step, rank, layer key) -> records kept so far
    digests: dict[tuple, dict[bytes, list]] = defaultdict(dict)  # same key -> digest -> [where, claimed]
    stages, mtp_dropped, repeats_dropped = set(), 0, 0
    for path in files:
        for n, rec in _jsonl_records(path):
            where = f"{path}: line {n}"
            for key in ("step", "layer", "rank", "num_tokens", "topk", "top_indices"):
                if key not in rec:
                    raise TraceError(f"{where}: field {key!r} is missing")
            step, layer, rank = (as_count(rec[k], where, k) for k in ("step", "layer", "rank"))
            num_tokens, k = as_count(rec["num_tokens"], where, "num_tokens"), as_count(rec["topk"], where, "topk")
            block = rec.get("block", "decoder")
            if block not in ("decoder", "mtp"):
                raise TraceError(f"{where}: field 'block' is {block!r}; megatron-core writes 'decoder' or 'mtp'")
            if preset is not None and block == "decoder" and layer >= preset.num_layers + preset.num_dense_layers:
                raise TraceError(f"{where}: field 'layer' is {layer}, beyond the decoder layers of model "
                                 f"{preset.name!r} (indices 0..{preset.num_layers + preset.num_dense_layers - 1}: "
                                 f"{preset.num_dense_layers} dense, {preset.num_layers} MoE)")
            stages.add(rec.get("stage", "pre_dispatch"))
            if len(stages) > 1:
                raise TraceError(f"{where}: field 'stage' is {rec.get('stage')!r}, but earlier records have "
                                 f"{sorted(stages - {rec.get('stage')})}; one routing decision per stage would count "
                                 f"tokens twice")
            if block == "mtp":
                if mtp == "drop":
                    mtp_dropped += 1
                    continue
                if "mtp_idx" not in rec:
                    raise TraceError(f"{where}: an MTP record without field 'mtp_idx'")
                lkey = ("mtp", as_count(rec["mtp_idx"], where, "mtp_idx"), layer)
            else:
                lkey = ("decoder", -1, layer)
            if topk is None:
                topk = k
            if k != topk:
                raise TraceError(f"{where}: field 'topk' is {k}, but "
                                 f"{'model ' + repr(preset.name) + ' has top_k=' if preset else 'earlier records have '}"
                                 f"{topk}")
            if builder is None:
                if topk > num_experts:
                    raise TraceError(f"{where}: field 'topk' is {topk}, more than the {num_experts} experts "
                                     f"({expert_source})")
                builder = TraceBuilder(num_experts, topk, keep_tokens)
                check_shape = ModelShape("jsonl-check", 1, num_experts, topk, 1, 1)
            if ep is not None and rank >= ep:
                raise TraceError(f"{where}: field 'rank' is {rank}, outside the EP group [0, {ep}); files from a run "
                                 f"with tensor or pipeline parallelism need their global ranks mapped to EP ranks first")
            ids = expert_ids_from_json(rec["top_indices"], topk, where)  # refuses true/false and floats
            if ids.shape[0] != num_tokens:
                raise TraceError(f"{where}: field 'num_tokens' is {num_tokens} but 'top_indices' has {ids.shape[0]} rows")
            ids = check_ids(ids, check_shape, where, "top_indices", ("token", "k"))
            group = (step, rank, lkey)
            digest = hashlib.blake2b(ids.astype(np.int32).tobytes(), digest_size=16).digest() + bytes(str(ids.shape), "ascii")
            earlier = digests[group].get(digest) if num_tokens else None  # empty records cannot be told apart
            if earlier is not None and not earlier[1]:
                if recompute == "error":
                    raise TraceError(f"{where}: repeats {earlier[0]} (step {step}, {_layer_name(lkey)}, rank {rank}, "
                                     f"identical top_indices): records written twice, or activation recompute firing "
                                     f"the router again; if the run recomputed activations pass recompute='drop' "
                                     f"(--recompute drop)")
                earlier[1] = True
                repeats_dropped += 1
                continue
            digests[group].setdefault(digest, [where, False])
            mb = as_count(rec["micro_batch"], where, "micro_batch") if "micro_batch" in rec else mb_of[group]
            mb_of[group] += 1
            builder.add_layer((step, mb, rank), lkey, ids, where)
    if builder is None:
        raise TraceError(f"{files[0]}: holds only MTP records, which mtp='drop' leaves out")
    keys = builder.layer_keys()  # decoder first ("decoder" < "mtp"), then by index
    if ep is None:
        ep = 1 + max(r for _, _, r in builder.counts)
    if preset is not None:
        shape = preset
    else:
        shape = resolve_model(layers=len(keys), experts=num_experts, top_k=topk, hidden=hidden, moe_ffn=moe_ffn)
    if len(keys) != shape.num_layers:
        raise TraceError(f"{files[0] if len(files) == 1 else 'megatron-jsonl'}: holds {len(keys)} MoE routers "
                         f"({', '.join(_layer_name(k) for k in keys[:4])}{', ...' if len(keys) > 4 else ''}), but "
                         f"model {shape.name!r} has {shape.num_layers} MoE layers")
    check_ep(shape, ep)
    steps = sorted({s for s, _, _ in builder.counts})
    provenance = source_provenance("megatron-jsonl", files, steps=steps, layers=[_layer_name(k) for k in keys],
                                   experts_from=expert_source, mtp=mtp, mtp_records_dropped=mtp_dropped,
                                   recompute=recompute, repeats_dropped=repeats_dropped)
    return builder.finish(shape, ep, provenance, layer_order=keys, source="megatron-jsonl", layer_name=_layer_name)
