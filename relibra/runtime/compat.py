"""Every patch megatron-core needs on a CPU-only torch, in one place.

megatron-core 0.16.1 assumes CUDA in a few spots that the kit's CPU runtime reaches:
1. `torch.cuda.current_device()` places router weights, buffers and all-to-all outputs; on CPU it
   must answer "cpu".
2. The alltoall dispatcher copies split sizes on a side `torch.cuda.Stream`, waits on it and
   records an `Event`; on CPU those become no-ops (everything is already on the host).
3. The dispatcher then hands the split sizes to `torch.distributed.all_to_all_single` as CPU
   tensors (on GPU they are numpy arrays); gloo rejects tensors there, so they become lists of ints.
4. `moe_utils.te_general_gemm` must be None when Transformer Engine is absent (it is, in 0.16.1,
   because the import sits in a try block; we check rather than assume).
5. megatron's optimizers, grad buffers and grad-norm helpers make scalars with `device='cuda'`
   (optimizer.py, distrib_optimizer.py, clip_grads.py, param_and_grad_buffer.py, utils.py): in
   those modules `torch` becomes a view of torch whose tensor / zeros / empty put 'cuda' on the host.
6. Float16OptimizerWithFloat16Params and DistributedOptimizer sort parameters by `param.type()`
   ('torch.cuda.FloatTensor', 'torch.cuda.BFloat16Tensor') and the gradient clip asserts
   `grad.type()`: a host tensor's `type()` (no arguments) answers with the CUDA name; `type(dtype)`
   casts as before.
The CUDA RNG tracker is not patched: the kit initializes expert weights itself and uses no dropout
or random router logits, so megatron's RNG tracker is never forked.

`apply()` is idempotent, does nothing when CUDA is available (the same code then runs on NCCL
unpatched), and refuses a megatron-core version other than the pinned one, because the patches
name private call sites that move between releases.
"""

from __future__ import annotations

import contextlib

import torch
from megatron.core import package_info

from relibra.errors import ConfigError

PINNED_MEGATRON_CORE = "0.16.1"

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


def apply() -> bool:
    """Patch torch.cuda and megatron-core for a CPU-only run. Returns True when patches are active."""
    global _applied
    if _applied:
        return True
    if not cuda_absent():
        return False
    version = megatron_version()
    if version != PINNED_MEGATRON_CORE:
        raise ConfigError(f"relibra.runtime.compat patches megatron-core {PINNED_MEGATRON_CORE} for CPU; "
                          f"found {version}; re-check the call sites listed in the module docstring")

    # (1) and (2): CUDA device and stream calls become host no-ops.
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.Stream = lambda *args, **kwargs: _HostStream()
    torch.cuda.Event = lambda *args, **kwargs: _HostStream()
    torch.cuda.current_stream = lambda *args, **kwargs: _HOST_STREAM
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()

    # (3): the dispatcher's all-to-all gets split sizes as lists. megatron-core's private modules are
    # imported here, after the version check, so another release fails with its one clear error.
    from megatron.core.tensor_parallel import mappings
    from megatron.core.transformer.moe import token_dispatcher

    original_all_to_all = mappings.all_to_all

    def all_to_all_with_list_splits(group, input_, output_split_sizes_=None, input_split_sizes=None):
        return original_all_to_all(group, input_, _split_sizes_as_list(output_split_sizes_),
                                   _split_sizes_as_list(input_split_sizes))

    token_dispatcher.all_to_all = all_to_all_with_list_splits

    # (4): no Transformer Engine GEMM for the router.
    from megatron.core.transformer.moe import moe_utils

    if getattr(moe_utils, "te_general_gemm", None) is not None and not moe_utils.HAVE_TE:
        moe_utils.te_general_gemm = None
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

    # (5) and (6): megatron's DDP and optimizers on the host.
    from megatron.core import utils as megatron_utils
    from megatron.core.distributed import param_and_grad_buffer
    from megatron.core.optimizer import clip_grads, distrib_optimizer, optimizer

    for module in (optimizer, distrib_optimizer, clip_grads, param_and_grad_buffer, megatron_utils):
        module.torch = _HostTorch()
    torch.Tensor.type = _cuda_type_name
    _applied = True
    return True
