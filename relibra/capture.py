"""Live capture: record a megatron-core model's routing while it trains, and write a RoutingTrace.

megatron-core 0.16.1 (megatron/core/transformer/moe/router_replay.py) gives every TopKRouter built
with `moe_enable_routing_replay=True` a `RouterReplay`; under RouterReplayAction.RECORD the router
computes its top-k as usual and keeps the last call's indices [num_tokens, topk]. `RouterCapture`
turns RECORD on for each router of a model (giving a router built without routing replay its own
RouterReplay for the duration, and taking it away again), reads every router's indices after each
micro-batch's forward (`micro_batch()`), and builds a trace from them (`trace()`), or writes them in
the kit's megatron-replay .npz layout (`save()`) for several ranks to be imported together.

Token order within a micro-batch is megatron's: hidden states are [seq, batch, hidden], so token
i of the [num_tokens] routing is (position i // batch, sample i % batch). Under activation
recompute the router runs again in backward; RECORD then overwrites the indices with the same ids,
so read them after the forward (or after the backward) of each micro-batch, once.

    with RouterCapture(model) as cap:
        for step in range(steps):
            for batch in micro_batches:
                loss = model(...); loss.backward()
                cap.micro_batch()
            cap.next_step()
    cap.trace().save("captured.npz")
"""

from __future__ import annotations

import os

import numpy as np

from relibra.cluster import ModelShape
from relibra.errors import ConfigError, TraceError
from relibra.importers.common import TraceBuilder, check_ids
from relibra.paths import atomic_open


def find_routers(model) -> list[tuple[str, object]]:
    """(qualified name, TopKRouter) of every MoE router of a model (or list of model chunks), in module order."""
    from megatron.core.transformer.moe.router import TopKRouter  # optional dependency: only capture needs megatron-core

    chunks = model if isinstance(model, (list, tuple)) else [model]
    out = []
    for c, chunk in enumerate(chunks):
        for name, module in chunk.named_modules():
            if isinstance(module, TopKRouter):
                out.append((name if len(chunks) == 1 else f"chunk{c}.{name}", module))
    if not out:
        raise ConfigError("the model holds no megatron-core TopKRouter: nothing to capture")
    return out


class RouterCapture:
    """Context manager: RouterReplay RECORD on every router; collects per-micro-batch top-k ids.

    rank: this process's EP rank (src rank of its tokens); ep: EP size for `trace()` (1 unless the
    caller merges ranks through `save` + the megatron-replay importer).
    """

    def __init__(self, model, rank: int = 0, ep: int = 1):
        self.routers = find_routers(model)
        self.rank, self.ep = rank, ep
        first = self.routers[0][1]
        self.num_experts = int(first.config.num_moe_experts)
        self.top_k = int(first.topk)
        self.hidden = int(first.config.hidden_size)
        self.moe_ffn = int(first.config.moe_ffn_hidden_size or first.config.ffn_hidden_size)
        self.steps: list[list[np.ndarray]] = [[]]  # steps[s][m] = ids [tokens, layers, top_k]
        self._added = []

    def __enter__(self) -> "RouterCapture":
        from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction  # optional dependency

        self._previous = []
        for _, router in self.routers:
            if router.router_replay is None:  # built without moe_enable_routing_replay
                router.router_replay = RouterReplay()
                self._added.append(router)
            self._previous.append(router.router_replay.router_replay_action)
            router.router_replay.clear_indices()
            router.router_replay.set_router_replay_action(RouterReplayAction.RECORD)
        return self

    def __exit__(self, *exc) -> None:
        from megatron.core.transformer.moe.router_replay import RouterReplay  # optional dependency

        for (_, router), action in zip(self.routers, self._previous):
            router.router_replay.router_replay_action = action
            router.router_replay.clear_indices()
        for router in self._added:
            instances = RouterReplay.global_router_replay_instances
            if router.router_replay in instances:
                instances.remove(router.router_replay)
            router.router_replay = None
        self._added = []

    def micro_batch(self) -> np.ndarray:
        """Read every router's recorded ids for the micro-batch just run: int [tokens, layers, top_k]."""
        layers = []
        for name, router in self.routers:
            ids = router.router_replay.get_recorded_indices()
            if ids is None:
                raise TraceError(f"router {name}: recorded nothing since the last micro_batch(); run a forward first")
            layers.append(ids.detach().to("cpu").numpy())
            router.router_replay.clear_indices()
        n = {x.shape[0] for x in layers}
        if len(n) != 1:
            raise TraceError(f"routers recorded different token counts {sorted(n)}; every layer sees the same tokens")
        ids = np.stack(layers, axis=1)
        self.steps[-1].append(ids)
        return ids

    def next_step(self) -> None:
        """Close the current step (call after its last micro-batch)."""
        if not self.steps[-1]:
            raise TraceError("next_step() with no micro-batch captured in this step")
        self.steps.append([])

    def model_shape(self) -> ModelShape:
        return ModelShape(f"captured-{len(self.routers)}x{self.num_experts}-top{self.top_k}", len(self.routers),
                          self.num_experts, self.top_k, self.hidden, self.moe_ffn)

    def _closed_steps(self) -> list[list[np.ndarray]]:
        steps = [s for s in self.steps if s]
        if not steps:
            raise TraceError("nothing captured: call micro_batch() after each forward")
        return steps

    def trace(self):
        """The captured routing as a RoutingTrace (this process's tokens at src rank `rank`; needs ep == 1)."""
        if self.ep != 1:
            raise ConfigError("trace() holds one process's tokens; with ep > 1 call save() on every rank and import "
                              "the files with relibra.importers.import_megatron_replay")
        shape = self.model_shape()
        builder = TraceBuilder(shape.num_experts, shape.top_k)
        for s, mbs in enumerate(self._closed_steps()):
            for m, ids in enumerate(mbs):
                builder.add_slot((s, m, 0), check_ids(ids, shape, "capture", "top_indices", ("token", "layer", "k")),
                                 f"capture step {s} micro-batch {m}")
        provenance = {"importer": "capture", "source": "megatron-core RouterReplay RECORD",
                      "routers": [name for name, _ in self.routers]}
        return builder.finish(shape, 1, provenance, source="capture")

    def save(self, directory: str) -> list[str]:
        """Write step{s}_mb{m}_rank{rank}.npz files (arrays layer_0.., step, micro_batch, rank)."""
        os.makedirs(directory, exist_ok=True)
        out = []
        for s, mbs in enumerate(self._closed_steps()):
            for m, ids in enumerate(mbs):
                path = os.path.join(directory, f"step{s}_mb{m}_rank{self.rank}.npz")
                with atomic_open(path, "wb") as f:
                    np.savez(f, step=np.array(s), micro_batch=np.array(m), rank=np.array(self.rank),
                             **{f"layer_{i}": ids[:, i] for i in range(ids.shape[1])})
                out.append(path)
        return out
