"""Synthetic RL routing workloads: paper-scale routing traces from a small generative model.

What the model reproduces (the facts ReLibra builds on):
- Each task domain has its own hot experts in every layer: expert logits are a shared per-layer
  part plus a per-(domain, layer) part.
- A sequence (prompt + response) concentrates its tokens on few experts: it is a mixture of one or
  two *topics* of its domain (Dirichlet weights with a small concentration), and a topic's expert
  distribution is the domain's plus a strong topic-specific part (log-normal weights, so a handful
  of experts take most of a topic's tokens).
- Micro-batches hold different sequences, and RL responses are long-tailed (log-normal lengths),
  so each (micro-batch, EP rank) slot holds only a few sequences: its hot experts move from one
  micro-batch to the next while the step total, over hundreds of sequences, is steadier.
- The policy drifts slowly: every logit follows a stationary AR(1) walk across steps.
- How far a micro-batch's hot experts move away from its step's beyond the sequences it holds is an explicit
  input, `microbatch_shift` (0 by default): a share of experts per (micro-batch, layer) trade their shares.

Sampling. A step is one RL global batch: `global_batch_sequences` sequences (1024, the paper's),
drawn as GRPO-style prompt groups (`responses_per_prompt` responses each, adjacent in batch order), or,
when `tokens_per_rank` is given, as many as fill about that many tokens per (micro-batch, EP rank)
slot. A named batch layout (BATCH_LAYOUTS, `layout_slots`; docs/traces.md) deals the sequences to
(micro-batch, rank) slots as an RL framework's trainer does: whole sequences, so a slot holds what its
sequences hold (the `megatron` layout instead packs the stream into equal samples, cutting sequences).
The trace records each slot's sequence lengths (`seq_lens`). A slot's per-layer expert distribution p
is the token-weighted mixture of its sequences' topic distributions. Top-k picks k distinct experts per
token, so an expert's inclusion probability is at most 1: `water_fill` turns p into inclusion
probabilities min(1, c*p) summing to k; experts at 1 take every token of the slot, the others share
the remaining tokens * (k - saturated) slots by one multinomial draw (numpy Generator.multinomial,
vectorized over rows). A rare draw above `tokens` for one expert (it can hold at most one slot per
token) has its excess redrawn over the experts with room, so each layer of a slot sums to exactly
tokens * top_k.

Per-model routing: the generator's random stream is seeded by (seed, a hash of the model's name and
shape), so two models never share one routing, while the same (model, seed) always gives the same trace.

With `token_level=True` (small configs) every token instead draws its own top-k from its
sequence's mixture by successive sampling without replacement (Gumbel top-k), and the trace keeps
the token-level ids.

Files: config (the knobs), domains (sequences and topics), layouts (sequences to slots), routing
(expert logits and top-k sampling), generate (generate_trace). The generator's benchmark and calibration
table are in relibra.bench.workload.

The routing knobs were calibrated (docs/traces.md) so static contiguous placement has mean rank
skewness above 2 at EP16 and EP32, growing with EP, for the three paper models.
"""

from relibra.workloads.config import (BATCH_LAYOUTS, DEFAULT_BATCH_LAYOUT, DOMAIN_PROFILES, DOMAINS,
                                      FIXED_COUNT_MICRO_BATCHES, MICROBATCH_SHIFT_RANGE, WORKLOADS, DomainProfile,
                                      WorkloadConfig, allowed_ep, model_seed)
from relibra.workloads.domains import domain_mix, draw_sequences, mean_sequence_tokens, topic_weights
from relibra.workloads.generate import generate_trace
from relibra.workloads.layouts import (StepBatch, first_fit_bins, karmarkar_karp, layout_slots, pack_sequences,
                                       slot_seq_lens, split_largest_bins, token_budget_slots)
from relibra.workloads.routing import (RoutingState, sample_token_ids, sample_topk_counts, shift_permutations,
                                       water_fill)

__all__ = ["BATCH_LAYOUTS", "DEFAULT_BATCH_LAYOUT", "DOMAIN_PROFILES", "DOMAINS", "FIXED_COUNT_MICRO_BATCHES",
           "MICROBATCH_SHIFT_RANGE",
           "WORKLOADS", "DomainProfile", "WorkloadConfig", "allowed_ep", "model_seed", "domain_mix", "draw_sequences",
           "mean_sequence_tokens", "topic_weights", "generate_trace", "StepBatch", "first_fit_bins", "karmarkar_karp",
           "layout_slots", "pack_sequences", "slot_seq_lens", "split_largest_bins", "token_budget_slots",
           "RoutingState", "sample_token_ids", "sample_topk_counts", "shift_permutations", "water_fill"]
