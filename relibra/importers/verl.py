"""verl: the agent-loop batch a step trains on, saved with torch.save as a dict of tensors.

Fields (verl's agent loop with router replay, read with torch.load(weights_only=True), or the same
arrays in an .npz): `routed_experts` int16 (uint8 in older releases) [batch, total_len, layers,
topk], `attention_mask` [batch, total_len], and, when present, `prompts` [batch, prompt_len],
`responses` [batch, response_len], `response_mask` [batch, response_len]; total_len = prompt_len +
response_len, the prompt left-padded, the response right-padded. Tokens are the positions whose
attention_mask is 1.

The inference engines return prompt + completion - 1 route rows, so the final response position
(the last position under mask 1) holds an all-zero placeholder row: it is recognized, dropped and
counted in provenance["placeholders_dropped"]. A sample whose last row is a real route (a
truncated multi-turn sample, where the training forward routed every token) is kept whole and
counted in provenance["samples_without_placeholder"]. An all-zero row anywhere else under mask 1
is an error naming the sample and position (at top-k >= 2 it repeats expert 0; at top-1 it would
put phantom tokens on expert 0).
"""

from __future__ import annotations

import numpy as np

from relibra.cluster import ModelShape
from relibra.errors import TraceError
from relibra.importers.common import (TraceBuilder, check_ep, check_ids, deal_sequences, expand_paths, fmt_index,
                                      load_container, resolve_model, source_provenance)
from relibra.trace import RoutingTrace


def _get_field(obj, path: str, key: str) -> np.ndarray:
    if not isinstance(obj, dict):
        raise TraceError(f"{path}: expected a dict of tensors with field {key!r}, got {type(obj).__name__}")
    if key not in obj:
        raise TraceError(f"{path}: field {key!r} is missing (fields: {', '.join(map(str, obj))})")
    if not isinstance(obj[key], np.ndarray):  # a ragged list, a number, a string, ...
        raise TraceError(f"{path}: field {key!r} must be a tensor, got {type(obj[key]).__name__}")
    return obj[key]


def routed_positions(ids: np.ndarray, mask: np.ndarray, prompt_len: int | None, path: str,
                     ids_key: str = "routed_experts") -> tuple[np.ndarray, np.ndarray]:
    """(routed bool [batch, total_len], placeholder bool [batch]) of one verl batch.

    ids: [batch, total_len, layers, topk]; mask: bool [batch, total_len]. The last masked position of
    a sample is a placeholder when its row is all zeros (and, if prompt_len is known, it lies in the
    response). Any other all-zero row under the mask raises TraceError.
    """
    b, t = mask.shape
    zero = (ids.reshape(b, t, -1) == 0).all(-1) & mask  # [batch, total_len]
    has = mask.any(1)
    last = np.where(has, t - 1 - np.argmax(mask[:, ::-1], axis=1), -1)
    placeholder = has & zero[np.arange(b), np.maximum(last, 0)]
    if prompt_len is not None:
        placeholder &= last >= prompt_len
    routed = mask.copy()
    routed[np.nonzero(placeholder)[0], last[placeholder]] = False
    stray = zero & routed
    if ids.shape[2] * ids.shape[3] >= 2 and stray.any():
        s, p = np.argwhere(stray)[0]
        raise TraceError(f"{path}: field {ids_key!r} at {fmt_index(('sample', 'position'), (s, p))} is an all-zero "
                         f"row under attention_mask 1 that is not the final response position: no route was "
                         f"recorded for this token")
    return routed, placeholder


def import_verl(paths, model: str | ModelShape, ep: int, micro_batches: int = 1, order: str = "rank-major",
                ids_key: str = "routed_experts", mask_key: str = "attention_mask",
                keep_tokens: bool = True) -> RoutingTrace:
    """Import verl agent-loop batches, one file (.pt dict of tensors, or .npz) per step, one at a time.

    Sequences are dealt to (rank, micro-batch) slots by `deal_sequences(order)`.
    """
    shape = resolve_model(model)
    check_ep(shape, ep)
    files = expand_paths(paths, (".pt", ".npz"))
    builder = TraceBuilder(shape.num_experts, shape.top_k, keep_tokens)
    dropped = without = 0
    for s, path in enumerate(files):
        obj = load_container(path)
        ids = _get_field(obj, path, ids_key)
        mask = _get_field(obj, path, mask_key)
        if ids.ndim != 4:
            raise TraceError(f"{path}: field {ids_key!r} must be [batch, total_len, num_layers, topk], got shape {ids.shape}")
        if ids.shape[2] != shape.num_layers:
            raise TraceError(f"{path}: field {ids_key!r} has {ids.shape[2]} layers (shape {ids.shape}), but model "
                             f"{shape.name!r} has {shape.num_layers} MoE layers")
        if ids.shape[3] != shape.top_k:
            raise TraceError(f"{path}: field {ids_key!r} has top-k width {ids.shape[3]} (shape {ids.shape}), but model "
                             f"{shape.name!r} has top_k={shape.top_k}")
        if mask.shape != ids.shape[:2]:
            raise TraceError(f"{path}: field {mask_key!r} has shape {mask.shape}, expected {ids.shape[:2]} "
                             f"(batch, total_len of {ids_key!r})")
        if mask.dtype.kind not in "biuf" or not np.isin(mask, (0, 1)).all():
            bad = np.argwhere(~np.isin(mask, (0, 1)))[0] if mask.dtype.kind in "biuf" else (0, 0)
            raise TraceError(f"{path}: field {mask_key!r} at {fmt_index(('sequence', 'position'), bad)} holds "
                             f"{np.asarray(mask)[tuple(bad)].item()!r}; a mask holds 0 or 1")
        prompt_len = None
        if "prompts" in obj and "responses" in obj:
            prompts, responses = _get_field(obj, path, "prompts"), _get_field(obj, path, "responses")
            if prompts.ndim != 2 or responses.ndim != 2:
                raise TraceError(f"{path}: fields 'prompts' and 'responses' must be [batch, positions], got shapes "
                                 f"{prompts.shape} and {responses.shape}")
            prompt_len, response_len = prompts.shape[-1], responses.shape[-1]
            if prompt_len + response_len != ids.shape[1]:
                raise TraceError(f"{path}: 'prompts' ({prompt_len}) + 'responses' ({response_len}) positions do not "
                                 f"add up to the {ids.shape[1]} positions of {ids_key!r}")
        routed, placeholder = routed_positions(ids, mask.astype(bool), prompt_len, path, ids_key)
        dropped += int(placeholder.sum())
        without += int((~placeholder & mask.astype(bool).any(1)).sum())
        ids = check_ids(ids, shape, path, ids_key, ("sequence", "position", "layer", "k"), valid=routed)
        rank, mb = deal_sequences(ids.shape[0], ep, micro_batches, order, path)
        for r in range(ep):
            for m in range(micro_batches):
                seqs = np.nonzero((rank == r) & (mb == m))[0]
                builder.add_slot((s, m, r), ids[seqs][routed[seqs]], path)  # sequence by sequence
        del obj, ids
    provenance = source_provenance("verl", files, order=order, micro_batches=micro_batches,
                                   placeholders_dropped=dropped, samples_without_placeholder=without)
    return builder.finish(shape, ep, provenance, source=provenance["source"])
