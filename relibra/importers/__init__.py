"""Importers: routing data written by training and RL systems -> RoutingTrace, one module per source.

- megatron: megatron-core RouterReplay recordings (`megatron-replay`) and router-trace JSONL
  (`megatron-jsonl`, `router_trace_rank{r}.jsonl`);
- verl: agent-loop batches (torch.save dict of tensors);
- sglang: `/generate` responses (JSON / JSONL, base64 routes) and per-sample tensors;
- vllm: per-sample `CompletionOutput.routed_experts` (.npz);
- slime: per-sample `Sample.rollout_routed_experts` (.npz);
- common: model shape, pickle-free reading, id and alignment checks, the streaming TraceBuilder.

Every importer checks the ids (range, duplicates within a token's top-k, top-k width, layer count)
and raises TraceError naming the file, the field and the first offending index; nothing is clipped
or repaired. docs/traces.md has a table per source.
"""

from __future__ import annotations

from relibra.errors import ConfigError
from relibra.importers.common import (ORDERS, TraceBuilder, assemble, check_ids, check_route_rows, deal_sequences,
                                      load_container, resolve_model)
from relibra.importers.megatron import import_megatron_jsonl, import_megatron_replay
from relibra.importers.sglang import import_sglang
from relibra.importers.slime import import_slime
from relibra.importers.verl import import_verl
from relibra.importers.vllm import import_vllm
from relibra.trace import RoutingTrace

IMPORTERS = {
    "megatron-replay": import_megatron_replay,
    "megatron-jsonl": import_megatron_jsonl,
    "verl": import_verl,
    "sglang": import_sglang,
    "vllm": import_vllm,
    "slime": import_slime,
}
FORMATS = tuple(IMPORTERS)

__all__ = ["FORMATS", "IMPORTERS", "ORDERS", "TraceBuilder", "assemble", "check_ids", "check_route_rows",
           "deal_sequences", "import_megatron_jsonl", "import_megatron_replay", "import_sglang", "import_slime",
           "import_trace", "import_verl", "import_vllm", "load_container", "resolve_model"]


def import_trace(fmt: str, paths, **opts) -> RoutingTrace:
    """Dispatch to the importer of `fmt` (one of FORMATS); opts go to it (model, ep, ...)."""
    if fmt not in IMPORTERS:
        raise ConfigError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    return IMPORTERS[fmt](paths, **opts)
