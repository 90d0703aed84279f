"""Routing traces: RoutingTrace and the load arithmetic (core), the file format and its bounded reader
(io), the checks the importers share (checks). `from relibra.trace import ...` reaches all of them."""

from relibra.trace.checks import check_expert_ids, check_id_dtype, expert_ids_from_json
from relibra.trace.core import RoutingTrace, loads_from_tokens, rank_load, skewness, static_placement
from relibra.trace.io import (DEFAULT_MAX_TRACE_BYTES, FORMAT_VERSION, JSON_BYTES_PER_CHAR, MAX_TRACE_BYTES_ENV,
                              TRACE_FIELDS, check_decoded_bytes, max_trace_bytes, parse_json, read_npz)

__all__ = ["RoutingTrace", "static_placement", "rank_load", "skewness", "loads_from_tokens", "check_id_dtype",
           "check_expert_ids", "expert_ids_from_json", "read_npz", "parse_json", "check_decoded_bytes",
           "max_trace_bytes", "JSON_BYTES_PER_CHAR", "DEFAULT_MAX_TRACE_BYTES", "MAX_TRACE_BYTES_ENV", "FORMAT_VERSION",
           "TRACE_FIELDS"]
