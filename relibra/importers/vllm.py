"""vLLM: each sample's `CompletionOutput.routed_experts`, int32 [seq_len - 1, layers, topk].

vLLM hands these arrays back in Python; the kit reads them from an .npz written without pickle,
one file per step:

    np.savez(path, **{f"routed_experts_{i}": o.outputs[0].routed_experts for i, o in enumerate(outs)},
             **{f"num_tokens_{i}": np.array(len(o.prompt_token_ids) + len(o.outputs[0].token_ids))
                for i, o in enumerate(outs)})

`routed_experts_{i}` [rows, layers, topk] and `num_tokens_{i}` (0-d, prompt + completion tokens;
a 1-d array of the token ids is read as its length) for samples i = 0..n-1. Rows must be
num_tokens - 1 (or num_tokens); anything else is an alignment error naming the sample.
"""

from __future__ import annotations

from relibra.cluster import ModelShape
from relibra.errors import TraceError
from relibra.importers.common import (check_ep, check_sequence, expand_paths, import_sequences, load_container,
                                      numbered_arrays, resolve_model, sequence_length, source_provenance)
from relibra.trace import RoutingTrace


def read_per_sample_npz(path: str, model: ModelShape, ids_prefix: str, len_prefixes: tuple[str, ...]) -> list:
    """Checked routes of samples 0..n-1 from arrays `{ids_prefix}{i}` with lengths `{len_prefix}{i}`."""
    if not path.endswith(".npz"):
        raise TraceError(f"{path}: expected an .npz of per-sample arrays {ids_prefix}0, {ids_prefix}1, ...")
    obj = load_container(path)
    ids = numbered_arrays(obj, path, ids_prefix)
    if not ids:
        raise TraceError(f"{path}: holds no arrays named {ids_prefix}0, {ids_prefix}1, ...")
    if sorted(ids) != list(range(len(ids))):
        missing = min(set(range(len(ids))) - set(ids))
        raise TraceError(f"{path}: array {ids_prefix}{missing} is missing; samples are numbered 0..n-1")
    lengths = {}
    for prefix in len_prefixes:
        for i, value in numbered_arrays(obj, path, prefix).items():
            lengths.setdefault(i, sequence_length(value, path, f"{prefix}{i}"))
    out = []
    for i in range(len(ids)):
        if i not in lengths:
            raise TraceError(f"{path}: array {len_prefixes[0]}{i} is missing; the sample's token count is needed to "
                             f"check that its routes align with its tokens")
        out.append(check_sequence(ids[i], model, path, f"{ids_prefix}{i}", i, lengths[i]))
    return out


def import_vllm(paths, model: str | ModelShape, ep: int, micro_batches: int = 1, order: str = "rank-major",
                keep_tokens: bool = True) -> RoutingTrace:
    """Import vLLM routed experts, one .npz per step (layout in the module docstring)."""
    shape = resolve_model(model)
    check_ep(shape, ep)
    files = expand_paths(paths, (".npz",))
    provenance = source_provenance("vllm", files, order=order, micro_batches=micro_batches)
    return import_sequences(files, lambda p: read_per_sample_npz(p, shape, "routed_experts_", ("num_tokens_",)),
                            shape, ep, micro_batches, order, keep_tokens, provenance)
