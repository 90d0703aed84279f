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
                             A leaf's gradient is its `.grad` plus its `main_grad`: under megatron
                             DDP each leaf carries a zero main_grad (the home's gradient dtype),
                             where gradient-accumulation fusion (megatron's fused weight-gradient
                             GEMM, TE's fuse_wgrad_accumulation) accumulates instead of `.grad`.
                             The home gradient is where the wrapped model keeps it: `main_grad`
                             under megatron's DistributedDataParallel (its backward hooks move
                             `.grad` into the grad buffer and clear it), `.grad` otherwise. Under
                             megatron DDP the pull must come before finish_grad_sync, so that the
                             data-parallel reduction carries the replica share.
Several micro-batches in flight (a pipeline schedule's 1F1B runs later micro-batches' forwards before
an earlier one's backward): leaves, replica layout and the buffer's contents are keyed by micro-batch.
A layer's backward hook carries the micro-batch of the forward that registered it, so the push before
its backward loads that micro-batch's replicas, and pull_gradients(m) pulls and drops m's leaves only.
Every transfer runs on the EP group; ranks are EP-local and converted with dist.get_global_rank.
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


def gradient_dtype(p: torch.nn.Parameter) -> torch.dtype:
    """dtype of the tensor p's gradient is read from: main_grad's (fp32 for a bf16 model under megatron
    DDP with grad_reduce_in_fp32) or p's own."""
    main = getattr(p, "main_grad", None)
    return main.dtype if main is not None else p.dtype


def replica_gradient(p: torch.nn.Parameter) -> torch.Tensor:
    """A replica leaf's whole gradient: its `main_grad` (where megatron's fused weight-gradient path,
    gradient_accumulation_fusion, or TE's fuse_wgrad_accumulation put it) plus `.grad` (where autograd
    put it otherwise); zeros when it took no tokens."""
    main = getattr(p, "main_grad", None)
    if main is None:
        return p.grad if p.grad is not None else torch.zeros_like(p)
    return main if p.grad is None else main + p.grad.to(main.dtype)


def home_gradient(p: torch.nn.Parameter) -> torch.Tensor:
    """Where the optimizer reads p's gradient: megatron DDP's `main_grad` when p has one, else `.grad`
    (made as zeros when absent)."""
    main = getattr(p, "main_grad", None)
    if main is not None:
        return main
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


class ReplicaBuffer:
    """Moves weights and gradients between home slots and the shared replica slots of one model.

    slots: the model's ExpertSlots (its replica_mlps are the shared slot modules); group: the EP process
    group; same_node(a, b): the node rule on EP-local ranks; timer: a relibra.runtime.timing.Timer. Installs a forward pre-hook and a forward hook on
    every MoE layer. Per step: reset(home [L, E]); per micro-batch m: set_microbatch(replica_expert
    [L, ep, R], home, m) before its forward, then pull_gradients(m) once its backward has run (other
    micro-batches' forwards and backwards may run in between).
    """

    def __init__(self, slots, group, same_node, timer):
        self.slots = slots
        self.group = group
        self.rank = slots.rank
        self.same_node = same_node
        self.timer = timer
        # One weight buffer per replica slot, shared by all layers.
        self.buffers = [[p.detach().clone() for p in slots.mlp_params(mlp)] for mlp in slots.replica_mlps]
        self.replica_expert: dict = {}  # micro-batch -> int [L, ep, R] replica layout
        self.home = None
        self.current = None  # the micro-batch whose forward runs now
        self.loaded = None  # (micro-batch, layer) whose replica weights the buffers hold
        self.leaves: dict[tuple, list[list[torch.nn.Parameter]]] = {}  # (micro-batch, layer) -> [slot][fc1, fc2]
        self.backward_started: set = set()  # micro-batches whose backward reached a MoE layer
        self.bytes_pushed = 0
        self.bytes_pulled = 0
        for layer, moe in enumerate(slots.moes):
            moe.register_forward_pre_hook(lambda module, args, layer=layer: self.before_forward(
                layer, args[0].requires_grad))
            moe.register_forward_hook(lambda module, args, out, layer=layer: self._hook_backward(layer, out))

    def _hook_backward(self, layer: int, out) -> None:
        first = out[0] if isinstance(out, tuple) else out
        if first.requires_grad:
            micro_batch = self.current
            first.register_hook(lambda grad: self.before_backward_hook(micro_batch, layer, grad))

    def reset(self, home: np.ndarray) -> None:
        """Start a step (or leave one) under placement `home`: no micro-batch in flight."""
        self.home = np.asarray(home)
        self.replica_expert = {}
        self.current = None
        self.loaded = None
        self.leaves = {}
        self.backward_started = set()

    def set_microbatch(self, replica_expert: np.ndarray, home: np.ndarray, micro_batch=None) -> None:
        """The next forward is micro-batch `micro_batch`'s (None: a forward outside a planned step),
        with replica layout int [L, ep, R]; earlier micro-batches in flight keep theirs."""
        self.home = np.asarray(home)
        self.replica_expert[micro_batch] = np.asarray(replica_expert)
        self.current = micro_batch

    def in_flight(self) -> list[int]:
        """Planned micro-batches whose leaves are still held (forward run, gradients not pulled), in order."""
        return sorted({m for m, _ in self.leaves if m is not None})

    def transfers(self, layer: int, micro_batch=None) -> list[tuple[int, int, int, int]]:
        """(expert, home rank, replica rank, slot) of every occupied replica slot of `layer` in `micro_batch`."""
        rexp = self.replica_expert[micro_batch][layer]  # [ep, R]
        out = []
        for g, r in zip(*np.nonzero(rexp >= 0)):
            e = int(rexp[g, r])
            h = int(self.home[layer, e])
            if h == g or not self.same_node(h, int(g)):
                raise PlanError(f"replica of expert {e} (layer {layer}) on rank {int(g)} breaks the node rule "
                                f"(home rank {h})")
            out.append((e, h, int(g), int(r)))
        return out

    def _global(self, ep_rank: int) -> int:
        return dist.get_global_rank(self.group, ep_rank)

    def _home_mlp(self, layer: int, expert: int):
        local = self.slots.local_experts(layer)
        return self.slots.home_mlps(layer)[int(np.flatnonzero(local == expert)[0])]

    def push(self, layer: int, phase: str, micro_batch=None) -> None:
        """Copy `layer`'s home weights into the replica buffers of the ranks that replicate them in
        `micro_batch`: each weight tensor straight from the home parameter into the buffer, one
        message per tensor."""
        self.timer.wait(phase, "replica_push")
        t0 = time.perf_counter()
        works = []
        for i, (e, h, g, r) in enumerate(self.transfers(layer, micro_batch)):
            if self.rank == h:
                for j, p in enumerate(self.slots.mlp_params(self._home_mlp(layer, e))):
                    works.append(dist.isend(p.data, self._global(g), group=self.group, tag=2 * i + j))
                    self.bytes_pushed += p.numel() * p.element_size()
            elif self.rank == g:
                for j, buf in enumerate(self.buffers[r]):
                    works.append(dist.irecv(buf, self._global(h), group=self.group, tag=2 * i + j))
        for work in works:
            work.wait()
        self.loaded = (micro_batch, layer)
        self.timer.add(phase, "replica_push", time.perf_counter() - t0)

    def _first_home(self) -> torch.nn.Parameter:
        """A home expert weight of this rank (every slot is built alike: its dtype and main_grad speak for all)."""
        return self.slots.mlp_params(self.slots.home_mlps(0)[0])[0]

    def grad_dtype(self) -> torch.dtype:
        """dtype in which replica gradients travel: where the home experts' gradients are read from
        (the same on every rank: every rank's slots are built alike)."""
        return gradient_dtype(self._first_home())

    def before_forward(self, layer: int, requires_grad: bool) -> None:
        """Load `layer`'s replicas and give the slot modules fresh leaves aliasing the buffers. Under
        megatron DDP (home weights carry `main_grad`) each leaf gets a zero `main_grad` of the home's
        gradient dtype, which megatron's gradient-accumulation fusion and TE's grouped linear write
        into; the leaf has no `grad_added_to_main_grad`, so no dummy gradient lands in `.grad`."""
        m = self.current
        if self.loaded != (m, layer):
            self.push(layer, "forward", m)
        home = self._first_home()
        fused = getattr(home, "main_grad", None) is not None
        leaves = []
        for r, buffers in enumerate(self.buffers):
            pair = [torch.nn.Parameter(b.data, requires_grad=requires_grad) for b in buffers]
            if fused and requires_grad:
                for leaf in pair:
                    leaf.main_grad = torch.zeros(leaf.shape, dtype=home.main_grad.dtype, device=leaf.device)
            self.slots.set_replica_params(layer, r, *pair)
            leaves.append(pair)
        self.leaves[(m, layer)] = leaves

    def before_backward_hook(self, micro_batch, layer: int, grad: torch.Tensor):
        """Before `layer`'s backward in `micro_batch`: its replica weights back in the buffers, and its
        leaves back in the slots, where a recompute of the layer inside the backward (selective
        recompute re-runs the MoE layer's inner forward, not its hooks) reads them; other layers or
        micro-batches may have replaced both since its forward."""
        self.backward_started.add(micro_batch)
        if self.loaded != (micro_batch, layer):
            self.push(layer, "backward", micro_batch)
        for r, pair in enumerate(self.leaves.get((micro_batch, layer), [])):
            self.slots.set_replica_params(layer, r, *pair)
        return None

    def pull_gradients(self, micro_batch=None) -> None:
        """Add every layer's replica gradients of `micro_batch` into the home experts' gradients (one
        message per tensor, received into a scratch tensor per home tensor); drop its leaves."""
        self.timer.wait("backward", "replica_grad")
        t0 = time.perf_counter()
        sends, recvs = [], []
        tag = 0
        layers = sorted(layer for m, layer in self.leaves if m == micro_batch)
        dtype = self.grad_dtype() if layers else None
        for layer in layers:
            for e, h, g, r in self.transfers(layer, micro_batch):
                if self.rank == g:
                    for p in self.leaves[(micro_batch, layer)][r]:
                        grad = replica_gradient(p).to(dtype).contiguous()
                        sends.append((dist.isend(grad, self._global(h), group=self.group, tag=tag), grad))
                        self.bytes_pulled += grad.numel() * grad.element_size()
                        tag += 1
                elif self.rank == h:
                    for p in self.slots.mlp_params(self._home_mlp(layer, e)):
                        buf = torch.empty(p.shape, dtype=dtype, device=p.device)
                        recvs.append((dist.irecv(buf, self._global(g), group=self.group, tag=tag), buf,
                                      home_gradient(p)))
                        tag += 1
                else:
                    tag += 2
        for work, buf, target in recvs:
            work.wait()
            target.add_(buf.to(target.dtype))
        for work, _ in sends:
            work.wait()
        for layer in layers:
            del self.leaves[(micro_batch, layer)]
        self.backward_started.discard(micro_batch)
        self.timer.add("backward", "replica_grad", time.perf_counter() - t0)
