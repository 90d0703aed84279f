"""A small real RL workload that produces real routing traces on a CPU (docs/rl.md).

- tasks: verifiable synthetic tasks (arithmetic, sorting, copying, format) and their rewards;
- model: a tiny decoder-only MoE policy in plain torch;
- replay: per-router RECORD / REPLAY_FORWARD, mirroring megatron-core's RouterReplay;
- rollout: sampling with a KV cache, recording every input token's experts;
- grpo: supervised warm-up, then GRPO whose training replays the recorded routing;
- capture: recorded routing -> RoutingTrace; the shipped trace (`load_default_rl_trace`).

Importing this package does not import torch; the torch modules load on first use.
"""

from relibra.rl.capture import DEFAULT_RL_TRACE, load_default_rl_trace

__all__ = ["DEFAULT_RL_TRACE", "load_default_rl_trace"]
