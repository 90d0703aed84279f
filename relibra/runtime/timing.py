"""Wall-clock accounting per (phase, component), forward and backward, own work apart from waiting.

Forward regions are timed directly. A backward region is bracketed by two identity autograd
functions: one on the region's output (its backward runs when the output's gradient arrives: start)
and one on its input (its backward runs when the input's gradient is ready: end). On CPU autograd
runs nodes one at a time, so the bracket measures the region's backward, give or take independent
nodes the engine interleaves.

Waiting: before each collective of the MoE layers (the token-count all-gather of the permute, the
all-to-alls of dispatch and combine) and each replica transfer every rank enters a barrier of the EP
group, timed as `<component>_wait`. What a rank spends there is the time it waits for the slowest
rank to arrive; the collective after it then measures its own transfer. Every rank reaches these
points in the same order (the same layers, micro-batches and plan), so the barriers match.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
import torch.distributed as dist


class Timer:
    """Seconds and token counts accumulated per (phase, component) since the last reset()."""

    def __init__(self, wait_group=None, synchronize=None):
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.tokens: dict[tuple[str, str], int] = defaultdict(int)
        self._open: dict[str, list[float]] = defaultdict(list)
        self.wait_group = wait_group  # a process group: waiting is timed before collectives; None: not split
        self.synchronize = synchronize  # on CUDA, torch.cuda.synchronize: a barrier then follows the device work

    def wait(self, phase: str, component: str) -> None:
        """Barrier of wait_group, its seconds added to (phase, component + "_wait")."""
        if self.wait_group is None:
            return
        if self.synchronize is not None:
            self.synchronize()
        t0 = time.perf_counter()
        dist.barrier(group=self.wait_group)
        self.add(phase, component + "_wait", time.perf_counter() - t0)

    def reset(self) -> None:
        self.seconds.clear()
        self.tokens.clear()
        self._open.clear()

    def add(self, phase: str, component: str, seconds: float, tokens: int = 0) -> None:
        self.seconds[(phase, component)] += seconds
        self.tokens[(phase, component)] += tokens

    def start_backward(self, component: str) -> None:
        self._open[component].append(time.perf_counter())

    def end_backward(self, component: str) -> None:
        if self._open[component]:
            self.add("backward", component, time.perf_counter() - self._open[component].pop())


class _Mark(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, callback):
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.callback()
        return grad, None


def timed_region(fn, timer: Timer, component: str, count_tokens: bool = False, tensor_arg: int = 0,
                 collective: tuple = ()):
    """Wrap fn(..., tensor, *rest) -> tensor or tuple; time its forward and (bracketed) backward.
    tensor_arg: position of the tensor input among the positional arguments. collective: the phases
    ("forward", "backward") in which the region runs a collective; its waiting is timed first there
    (Timer.wait)."""

    def start_backward():
        if "backward" in collective:
            timer.wait("backward", component)
        timer.start_backward(component)

    def wrapped(*args, **kwargs):
        lead, x, rest = args[:tensor_arg], args[tensor_arg], args[tensor_arg + 1:]
        if x.requires_grad:
            x = _Mark.apply(x, lambda: timer.end_backward(component))
        if "forward" in collective:
            timer.wait("forward", component)
        t0 = time.perf_counter()
        out = fn(*lead, x, *rest, **kwargs)
        tokens = int(x.shape[0]) if count_tokens else 0
        timer.add("forward", component, time.perf_counter() - t0, tokens)
        first = out[0] if isinstance(out, tuple) else out
        if first is not None and first.requires_grad:
            first = _Mark.apply(first, start_backward)
            out = (first, *out[1:]) if isinstance(out, tuple) else first
        return out

    return wrapped
