"""slime: each `Sample.rollout_routed_experts`, int32 [len(tokens) - 1, layers, topk] after stitching.

slime keeps samples as Python objects; the kit reads them from an .npz exported without pickle,
one file per step (one line at the end of a rollout):

    np.savez(path, **{f"rollout_routed_experts_{i}": s.rollout_routed_experts for i, s in enumerate(samples)},
             **{f"tokens_{i}": np.asarray(s.tokens) for i, s in enumerate(samples)})

`tokens_{i}` (the sample's token ids; a 0-d `num_tokens_{i}` also works) gives the length that the
routes must align with: len(tokens) - 1 rows (or len(tokens)).
"""

from __future__ import annotations

from relibra.cluster import ModelShape
from relibra.importers.common import check_ep, expand_paths, import_sequences, resolve_model, source_provenance
from relibra.importers.vllm import read_per_sample_npz
from relibra.trace import RoutingTrace


def import_slime(paths, model: str | ModelShape, ep: int, micro_batches: int = 1, order: str = "rank-major",
                 keep_tokens: bool = True) -> RoutingTrace:
    """Import slime rollout routes, one .npz per step (layout in the module docstring)."""
    shape = resolve_model(model)
    check_ep(shape, ep)
    files = expand_paths(paths, (".npz",))
    provenance = source_provenance("slime", files, order=order, micro_batches=micro_batches)
    return import_sequences(
        files, lambda p: read_per_sample_npz(p, shape, "rollout_routed_experts_", ("tokens_", "num_tokens_")),
        shape, ep, micro_batches, order, keep_tokens, provenance)
