"""Warnings a CPU runtime run would print that no user can act on, filtered by message, each with
its reason. Called first thing in every rank (spawned ranks start a fresh interpreter, so the
filters must be set there, before megatron-core is imported). Every other warning still shows."""

from __future__ import annotations

import warnings

KNOWN_WARNINGS = (
    # megatron-core 0.16.1 warns at import when Transformer Engine and Apex are missing. Both need
    # CUDA; on a CPU-only machine they cannot be installed, and the kit uses neither (torch's AdamW,
    # the kit's own expert modules), so the fallback they announce is never taken.
    (UserWarning, r"Transformer Engine and Apex are not installed"),
    # megatron-core 0.16.1's TransformerConfig defaults cuda_graph_scope to "full" and then warns that
    # "full" is deprecated; the kit captures no CUDA graphs and sets no scope.
    (UserWarning, r"full scope is deprecated"),
    # megatron-core 0.16.1's local layer spec announces its torch norm fallback when Apex is absent; Apex
    # needs CUDA, and the torch RMSNorm it falls back to is the one the runtime's model is meant to use.
    (UserWarning, r"Apex is not installed. Falling back to Torch Norm"),
    # megatron-core 0.16.1's alltoall dispatcher gathers split sizes with torch's
    # all_gather_into_tensor, which torch 2.13 marks deprecated; the call sits inside the pinned
    # megatron-core, not in the kit.
    (FutureWarning, r"`torch.distributed.all_gather_into_tensor` is deprecated"),
)


def quiet_known_warnings() -> None:
    """Install the filters of KNOWN_WARNINGS (idempotent)."""
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
