"""Where a Megatron-based RL stack's routing replay meets ReLibra.

megatron: megatron-core's own RouterReplay (RECORD during a rollout forward, or set_replay_data +
    REPLAY_FORWARD as verl and NeMo-RL drive it): the replayed ids of every MoE layer and micro-batch
    become the loads the planner reads (`replay_loads`, `replay_trace`).
slime: slime's per-router RoutingReplay objects (filled from the rollout's routed experts) read the
    same way, and a before-train-step hook in slime's signature that plans and calls begin_step.
Both only read replay data; routing itself follows the stack's replay object untouched
(relibra.runtime.router).
"""
