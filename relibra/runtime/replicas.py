"""Replica weights in and replica gradients out, inside a node, with a layer-shared replica buffer.

The buffer: R weight buffers per rank (fc1, fc2 of one expert each), shared by every MoE layer. The
R replica MLP modules sit at the same positions of every layer's SequentialMLP. For each layer's
forward the modules get fresh leaf parameters that alias the buffer's storage (`Parameter(buf.data)`),
so each layer's use of a slot has its own autograd leaf and its own gradient, while the weights
occupy one buffer. Per micro-batch, on every rank in lock step:
  forward, before layer l:   push home weights -> replica slots of l (point-to-point, inside the node)
  backward, before layer l:  push again when the buffer meanwhile held another layer (always, except
                             for the last layer): autograd reads the aliased storage when it
                             computes l's input gradient, so l's weights must be back in place.
                             Writes go through `.data`, which autograd does not version-count.
  after the backward:        pull every layer's replica gradients into the home experts' gradients
                             (point-to-point), then drop the replica leaves and their gradients.
Why pull after the whole backward and not per layer: autograd accumulates a leaf's gradient in an
AccumulateGrad node whose run time is not ordered against later layers' backward, so there is no
point inside megatron-core's backward at which "layer l's replica gradients are complete" is known;
hence gradients are per layer (transient, dropped after each micro-batch) while weights are shared.
Replica parameters are never given to the optimizer: they hold no optimizer state.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from relibra.errors import PlanError


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflat_into(flat: torch.Tensor, targets: list[torch.Tensor], add: bool = False) -> None:
    offset = 0
    for t in targets:
        n = t.numel()
        chunk = flat[offset: offset + n].view_as(t)
        t.add_(chunk) if add else t.copy_(chunk)
        offset += n


class ReplicaBuffer:
    """Moves weights and gradients between home slots and the shared replica slots of one model.

    slots: the model's ExpertSlots (its replica_mlps are the shared slot modules); same_node(a, b): the
    node rule; timer: a relibra.runtime.timing.Timer. Installs a forward pre-hook and a forward hook on
    every MoE layer. Per micro-batch: set_microbatch(replica_expert [L, ep, R], home [L, E]), run
    forward and backward, then pull_gradients().
    """

    def __init__(self, slots, same_node, timer):
        self.slots = slots
        self.rank = slots.rank
        self.same_node = same_node
        self.timer = timer
        # One weight buffer per replica slot, shared by all layers.
        self.buffers = [[p.detach().clone() for p in slots.mlp_params(mlp)] for mlp in slots.replica_mlps]
        self.replica_expert = None
        self.home = None
        self.loaded_layer = None
        self.leaves: dict[int, list[list[torch.nn.Parameter]]] = {}  # layer -> [slot][fc1, fc2]
        self.bytes_pushed = 0
        self.bytes_pulled = 0
        for layer, moe in enumerate(slots.moes):
            moe.register_forward_pre_hook(lambda module, args, layer=layer: self.before_forward(
                layer, args[0].requires_grad))
            moe.register_forward_hook(lambda module, args, out, layer=layer: self._hook_backward(layer, out))

    def _hook_backward(self, layer: int, out) -> None:
        first = out[0] if isinstance(out, tuple) else out
        if first.requires_grad:
            first.register_hook(lambda grad: self.before_backward_hook(layer, grad))

    def set_microbatch(self, replica_expert: np.ndarray, home: np.ndarray) -> None:
        self.replica_expert = np.asarray(replica_expert)
        self.home = np.asarray(home)
        self.loaded_layer = None
        self.leaves = {}

    def transfers(self, layer: int) -> list[tuple[int, int, int, int]]:
        """(expert, home rank, replica rank, slot) of every occupied replica slot of `layer`."""
        rexp = self.replica_expert[layer]  # [ep, R]
        out = []
        for g, r in zip(*np.nonzero(rexp >= 0)):
            e = int(rexp[g, r])
            h = int(self.home[layer, e])
            if h == g or not self.same_node(h, int(g)):
                raise PlanError(f"replica of expert {e} (layer {layer}) on rank {int(g)} breaks the node rule "
                                f"(home rank {h})")
            out.append((e, h, int(g), int(r)))
        return out

    def _home_mlp(self, layer: int, expert: int):
        local = self.slots.local_experts(layer)
        return self.slots.home_mlps(layer)[int(np.flatnonzero(local == expert)[0])]

    def push(self, layer: int, phase: str) -> None:
        """Copy `layer`'s home weights into the replica buffers of the ranks that replicate them."""
        self.timer.wait(phase, "replica_push")
        t0 = time.perf_counter()
        sends, recvs = [], []
        for tag, (e, h, g, r) in enumerate(self.transfers(layer)):
            if self.rank == h:
                buf = _flat([p.data for p in self.slots.mlp_params(self._home_mlp(layer, e))])
                sends.append((dist.isend(buf, g, tag=tag), buf))
                self.bytes_pushed += buf.numel() * buf.element_size()
            elif self.rank == g:
                targets = self.buffers[r]
                buf = torch.empty(sum(t.numel() for t in targets), dtype=targets[0].dtype, device=targets[0].device)
                recvs.append((dist.irecv(buf, h, tag=tag), buf, targets))
        for work, buf, targets in recvs:
            work.wait()
            _unflat_into(buf, [t.data for t in targets])
        for work, _ in sends:
            work.wait()
        self.loaded_layer = layer
        self.timer.add(phase, "replica_push", time.perf_counter() - t0)

    def before_forward(self, layer: int, requires_grad: bool) -> None:
        """Load `layer`'s replicas and give the slot modules fresh leaves aliasing the buffers."""
        if self.loaded_layer != layer:
            self.push(layer, "forward")
        leaves = []
        for mlp, buffers in zip(self.slots.replica_mlps, self.buffers):
            pair = [torch.nn.Parameter(b.data, requires_grad=requires_grad) for b in buffers]
            mlp.linear_fc1.weight, mlp.linear_fc2.weight = pair
            leaves.append(pair)
        self.leaves[layer] = leaves

    def before_backward_hook(self, layer: int, grad: torch.Tensor):
        if self.loaded_layer != layer:
            self.push(layer, "backward")
        return None

    def pull_gradients(self) -> None:
        """Add every layer's replica gradients into the home experts' gradients; drop the leaves."""
        self.timer.wait("backward", "replica_grad")
        t0 = time.perf_counter()
        sends, recvs = [], []
        tag = 0
        for layer in sorted(self.leaves):
            for e, h, g, r in self.transfers(layer):
                if self.rank == g:
                    leaves = self.leaves[layer][r]
                    buf = _flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in leaves])
                    sends.append((dist.isend(buf, h, tag=tag), buf))
                    self.bytes_pulled += buf.numel() * buf.element_size()
                elif self.rank == h:
                    params = self.slots.mlp_params(self._home_mlp(layer, e))
                    for p in params:
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                    buf = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
                    recvs.append((dist.irecv(buf, g, tag=tag), buf, params))
                tag += 1
        for work, buf, params in recvs:
            work.wait()
            _unflat_into(buf, [p.grad for p in params], add=True)
        for work, _ in sends:
            work.wait()
        self.leaves = {}
        self.timer.add("backward", "replica_grad", time.perf_counter() - t0)
