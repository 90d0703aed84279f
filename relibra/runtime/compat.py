"""Every patch megatron-core needs on a CPU-only torch, in one place.

megatron-core 0.16.1 assumes CUDA in a few spots that the kit's CPU runtime reaches:
1. `torch.cuda.current_device()` places router weights, buffers and all-to-all outputs; on CPU it
   must answer "cpu".
2. The alltoall dispatcher copies split sizes on a side `torch.cuda.Stream`, waits on it and
   records an `Event`; on CPU those become no-ops (everything is already on the host).
3. The dispatcher then hands the split sizes to `torch.distributed.all_to_all_single` as CPU
   tensors (on GPU they are numpy arrays); gloo rejects tensors there, so they become lists of ints.
4. `moe_utils.te_general_gemm` must be None when Transformer Engine is absent; 0.16.1 leaves the name
   unbound when its import fails, so the router's GEMM raises NameError. This one is applied on every
   device, CUDA included.
5. Distributed checkpointing (`dist_checkpointing.save`, strategies/filesystem_async.py) calls
   `torch.cuda.synchronize()` before it writes; on the host there is nothing to wait for.
6. megatron's optimizers, grad buffers and grad-norm helpers make scalars with `device='cuda'`
   (optimizer.py, distrib_optimizer.py, clip_grads.py, param_and_grad_buffer.py, utils.py): in
   those modules `torch` becomes a view of torch whose tensor / zeros / empty put 'cuda' on the host.
7. Float16OptimizerWithFloat16Params and DistributedOptimizer sort parameters by `param.type()`
   ('torch.cuda.FloatTensor', 'torch.cuda.BFloat16Tensor') and the gradient clip asserts
   `grad.type()`: a host tensor's `type()` (no arguments) answers with the CUDA name; `type(dtype)`
   casts as before.
The CUDA RNG tracker is not patched: the kit initializes expert weights itself and uses no dropout
or random router logits, so megatron's RNG tracker is never forked.

`apply()` is idempotent. On every device it first checks megatron-core's version
(`check_megatron_version`) and refuses one the kit was not tested with: the kit subclasses
TopKRouter (its `routing` signature gained `padding_mask` in 0.16), reads RouterReplay (new in 0.16;
0.15 has none) and SequentialMLP's checkpoint layout, and the CPU patches name private call sites
that move between releases. With CUDA available only patch 4 is applied (the rest then runs on
NCCL); on the host the patches below are applied.

Tested releases: 0.16.0 and 0.16.1, whose files that the kit reaches are identical
(transformer/moe/router.py, router_replay.py, moe_utils.py, experts.py, moe_layer.py,
token_dispatcher.py, tensor_parallel/mappings.py, models/gpt/gpt_layer_specs.py,
process_groups_config.py, dist_checkpointing/strategies/filesystem_async.py).
"""

from __future__ import annotations

import contextlib

import torch
from megatron.core import package_info

from relibra.errors import ConfigError

# The megatron-core releases the kit's tests ran against (pyproject.toml declares the same range).
TESTED_MEGATRON_CORE = ("0.16.0", "0.16.1")

_applied = False


class _HostStream:
    """Stands in for torch.cuda.Stream / Event on the host: every wait and sync is already done."""

    def wait_stream(self, other) -> None:
        return None

    def record_event(self, event=None) -> "_HostStream":
        return self

    def synchronize(self) -> None:
        return None

    def wait_event(self, event) -> None:
        return None

    def wait(self, stream=None) -> None:  # Event.wait (HybridDeviceOptimizer's copy-back)
        return None

    def query(self) -> bool:
        return True


_HOST_STREAM = _HostStream()


def _split_sizes_as_list(sizes):
    """gloo's all_to_all_single takes split sizes as a list of ints (or None)."""
    if sizes is None:
        return None
    if torch.is_tensor(sizes):
        return [int(x) for x in sizes.tolist()]
    return [int(x) for x in sizes]


def _host_device(device):
    if device == "cuda" or (isinstance(device, torch.device) and device.type == "cuda"):
        return "cpu"
    return device


class _HostTorch:
    """torch, with tensor factories that put device 'cuda' on the host (patch 5)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def tensor(*args, device=None, **kwargs):
        return torch.tensor(*args, device=_host_device(device), **kwargs)

    @staticmethod
    def zeros(*args, device=None, **kwargs):
        return torch.zeros(*args, device=_host_device(device), **kwargs)

    @staticmethod
    def empty(*args, device=None, **kwargs):
        return torch.empty(*args, device=_host_device(device), **kwargs)


_tensor_type = torch.Tensor.type


def _cuda_type_name(self, dtype=None, non_blocking=False, **kwargs):
    """Patch 6: a host tensor's type name as megatron's optimizers expect it on a GPU."""
    if dtype is None and not kwargs and self.device.type == "cpu":
        return _tensor_type(self).replace("torch.", "torch.cuda.", 1)
    return _tensor_type(self, dtype, non_blocking, **kwargs)


def megatron_version() -> str:
    return package_info.__version__


def cuda_absent() -> bool:
    return not torch.cuda.is_available()


def check_megatron_version() -> str:
    """megatron-core's version, or ConfigError when it is not one the kit was tested with."""
    version = megatron_version()
    if version not in TESTED_MEGATRON_CORE:
        raise ConfigError(f"ReLibra's runtime is tested with megatron-core {' and '.join(TESTED_MEGATRON_CORE)}; "
                          f"found {version}: the router subclass, routing replay and the CPU patches name call "
                          "sites that differ between releases (relibra/runtime/compat.py lists them)")
    return version


def apply() -> bool:
    """Check megatron-core's version (every device), then patch torch.cuda and megatron-core for a
    CPU-only run. Returns True when the CPU patches are active, False on a CUDA machine."""
    global _applied
    if _applied:
        return True
    check_megatron_version()
    _router_gemm_without_te()
    if not cuda_absent():
        return False

    # (1) and (2): CUDA device and stream calls become host no-ops.
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.Stream = lambda *args, **kwargs: _HostStream()
    torch.cuda.Event = lambda *args, **kwargs: _HostStream()
    torch.cuda.current_stream = lambda *args, **kwargs: _HOST_STREAM
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()
    # (5): device syncs (distributed checkpointing) have nothing to wait for.
    torch.cuda.synchronize = lambda *args, **kwargs: None

    # (3): the dispatcher's all-to-all gets split sizes as lists. megatron-core's private modules are
    # imported here, after the version check, so another release fails with its one clear error.
    from megatron.core.tensor_parallel import mappings
    from megatron.core.transformer.moe import token_dispatcher

    original_all_to_all = mappings.all_to_all

    def all_to_all_with_list_splits(group, input_, output_split_sizes_=None, input_split_sizes=None):
        return original_all_to_all(group, input_, _split_sizes_as_list(output_split_sizes_),
                                   _split_sizes_as_list(input_split_sizes))

    token_dispatcher.all_to_all = all_to_all_with_list_splits

    # (6) and (7): megatron's DDP and optimizers on the host.
    from megatron.core import utils as megatron_utils
    from megatron.core.distributed import param_and_grad_buffer
    from megatron.core.optimizer import clip_grads, distrib_optimizer, optimizer

    for module in (optimizer, distrib_optimizer, clip_grads, param_and_grad_buffer, megatron_utils):
        module.torch = _HostTorch()
    torch.Tensor.type = _cuda_type_name
    _applied = True
    return True


def _router_gemm_without_te() -> None:
    """(4) on every device: without Transformer Engine, megatron-core 0.16's router GEMM reads a
    name `te_general_gemm` that its failed import never bound (seen on an H200: NameError in
    moe_utils.router_gating_linear); None selects its torch path."""
    from megatron.core.transformer.moe import moe_utils

    if not getattr(moe_utils, "HAVE_TE", False) or not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
