"""CPU stand-ins for two CUDA-only pieces the recipes run: megatron's fused weight-gradient kernel and
Transformer Engine's GroupedLinear. Tests and the CPU runtime use them; on a GPU the real ones run.

1. Gradient-accumulation fusion. With `config.gradient_accumulation_fusion`, megatron-core's
   `LinearWithGradAccumulationAndAsyncCommunication.backward` (tensor_parallel/layers.py, 0.16.1)
   does not return a weight gradient: it calls `fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32
   (total_input [T, in], grad_output [T, out], weight.main_grad [out, in])` (or `..._fp16` for a bf16
   / fp16 main_grad), which adds grad_output^T @ total_input into main_grad (fp32 accumulation), and
   ColumnParallelLinear refuses to build when that APEX extension is missing. `install_cpu_wgrad_fusion`
   puts a host module with the same two functions where layers.py looks for it.

2. Grouped-GEMM experts. megatron-core's TEGroupedMLP builds its fc1 and fc2 from
   TEColumnParallelGroupedLinear / TERowParallelGroupedLinear (extensions/transformer_engine.py),
   subclasses of Transformer Engine's GroupedLinear (transformer_engine/pytorch/module/grouped_linear.py):
   one parameter per local expert, `weight0 .. weight{n-1}` of shape [out, in] (and `bias{i}`),
   forward(x [T, in], m_splits list of n token counts) -> (out [T, out], bias or None), and with
   `fuse_wgrad_accumulation` (megatron passes config.gradient_accumulation_fusion) the weight gradients
   go into each weight's `main_grad` (overwritten on a first micro-batch, accumulated otherwise), the
   autograd weight gradient being a dummy when the weight has `grad_added_to_main_grad` (megatron DDP)
   and None otherwise. `ColumnGroupedLinear` and `RowGroupedLinear` mirror that layout, constructor and
   contract; they compute with torch's `torch.nn.functional.grouped_mm` (float32 / bfloat16 on the host
   in torch 2.13) and fall back to one GEMM per expert for float64, which grouped_mm does not take.
   What they do not mirror: FP8 / FP4, delayed weight-gradient compute, userbuffer communication, TE's
   `_extra_state`, tensor parallelism inside experts (the kit refuses it anyway).
`te_grouped_moe_spec` is megatron's TE MoE spec with these classes in TE's place.

3. Activation recompute. megatron-core's CheckpointFunction (tensor_parallel/random.py) saves and
   restores the CUDA generator's state around the recomputed forward (`_get_cuda_rng_state`,
   `_set_cuda_rng_state`); a CPU-only torch has no CUDA generator. `install_cpu_rng_checkpointing`
   makes both host no-ops (the host generator is saved and restored by megatron itself, and the
   kit's models draw no random numbers in forward: no dropout). Selective recompute of the grouped
   experts' activation ("moe_act") runs megatron's CheckpointWithoutOutput, which in 0.16.1 always
   takes its FP8 branch (`self.fp8 = fp8 is not None` with fp8=False) and so names TE's
   FP8GlobalStateManager, fp8_autocast and activation_recompute_forward; without TE they are given
   their FP8-off meaning (FP8 disabled, no recipe, null contexts).

4. Optimizer CPU offload. megatron-core's HybridDeviceOptimizer (optimizer/cpu_offloading/
   hybrid_optimizer.py, under the DistributedOptimizer with optimizer_cpu_offload) moves the first
   `offload_fraction` of the CUDA parameters' elements into host copies that a host Adam steps
   (state keyed by the copy; `state[p]["master_param"]` is the copy) and copies them back after each
   step; a parameter not on CUDA it leaves alone, so on a CPU-only torch it offloads nothing and then
   fails to find the copy. `install_cpu_optimizer_offload` splits the parameters as on a GPU, every
   parameter counted as device memory: the offloaded ones get their own host copy, as on a GPU.

5. Sequence parallelism. megatron's torch norm (WrappedTorchNorm) refuses `sequence_parallel`;
   TE's TENorm and APEX's FusedLayerNorm take it. `SequenceParallelRMSNorm` is an RMSNorm with
   megatron's norm constructor whose weight is marked `sequence_parallel`.
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F

__all__ = ["ColumnGroupedLinear", "RowGroupedLinear", "SequenceParallelRMSNorm", "grouped_linear",
           "install_cpu_optimizer_offload", "install_cpu_rng_checkpointing", "install_cpu_wgrad_fusion",
           "te_grouped_moe_spec"]


# ---- 1. gradient-accumulation fusion ------------------------------------------------------------
# calls of the host fused weight-gradient kernel in this process (tests check that the fused path ran)
FUSED_WGRAD_CALLS = [0]


def _wgrad_gemm_accum(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad [out, in] += grad_output [T, out]^T @ total_input [T, in], in fp32 or wider."""
    FUSED_WGRAD_CALLS[0] += 1
    wide = torch.promote_types(main_grad.dtype, torch.float32)
    main_grad.add_((grad_output.reshape(-1, grad_output.shape[-1]).to(wide).t()
                    @ total_input.reshape(-1, total_input.shape[-1]).to(wide)).to(main_grad.dtype))


def install_cpu_wgrad_fusion() -> bool:
    """Make megatron-core's gradient-accumulation fusion run on the host: layers.py's
    `fused_weight_gradient_mlp_cuda` becomes a module with the kernel's two functions. Returns False
    (changes nothing) when the real CUDA extension is installed."""
    from megatron.core.tensor_parallel import layers

    if getattr(layers, "_grad_accum_fusion_available", False) and not getattr(
            getattr(layers, "fused_weight_gradient_mlp_cuda", None), "relibra_host", False):
        return False
    kernel = types.ModuleType("fused_weight_gradient_mlp_cuda")
    kernel.wgrad_gemm_accum_fp32 = _wgrad_gemm_accum
    kernel.wgrad_gemm_accum_fp16 = _wgrad_gemm_accum
    kernel.relibra_host = True
    layers.fused_weight_gradient_mlp_cuda = kernel
    layers._grad_accum_fusion_available = True
    return True


# ---- 2. Transformer Engine's GroupedLinear, on the host ----------------------------------------
def _offsets(m_splits: list[int], device) -> torch.Tensor:
    return torch.cumsum(torch.as_tensor(m_splits, dtype=torch.int64), 0).to(device=device, dtype=torch.int32)


def grouped_linear(x: torch.Tensor, weights: list[torch.Tensor], m_splits: list[int]) -> torch.Tensor:
    """Rows of x [T, in] split by m_splits (n groups), group i times weights[i]^T ([out, in]) -> [T, out].
    torch.nn.functional.grouped_mm for float32 / bfloat16; one matmul per group otherwise."""
    if x.dtype in (torch.float32, torch.bfloat16):
        return F.grouped_mm(x, torch.stack(weights).transpose(1, 2), offs=_offsets(m_splits, x.device))
    parts = [xi @ w.t() for xi, w in zip(torch.split(x, m_splits), weights)]
    return torch.cat(parts) if parts else x.new_zeros(0, weights[0].shape[0])


def _grouped_wgrad(x: torch.Tensor, dy: torch.Tensor, m_splits: list[int]) -> torch.Tensor:
    """Per group dy_i^T @ x_i: [n, out, in] (zeros for an empty group)."""
    if x.dtype in (torch.float32, torch.bfloat16):
        return F.grouped_mm(dy.t(), x, offs=_offsets(m_splits, x.device))
    return torch.stack([dyi.t() @ xi for xi, dyi in zip(torch.split(x, m_splits), torch.split(dy, m_splits))])


# members whose weight gradient the host GroupedLinear accumulated into main_grad (fused path)
FUSED_GROUPED_WGRADS = [0]


class _GroupedLinearFn(torch.autograd.Function):
    """TE's _GroupedLinear contract: forward(x, m_splits, module, *weights); backward gives dgrad and,
    per weight, its gradient or (fused) an accumulation into weight.main_grad."""

    @staticmethod
    def forward(ctx, x, m_splits, fuse, first_microbatch, *weights):
        ctx.save_for_backward(x, *weights)
        ctx.m_splits, ctx.fuse, ctx.first_microbatch = m_splits, fuse, first_microbatch
        ctx.weight_refs = weights  # TE keeps the weights to read main_grad in backward
        return grouped_linear(x, list(weights), m_splits)

    @staticmethod
    def backward(ctx, dy):
        x, *weights = ctx.saved_tensors
        dy = dy.contiguous()
        dgrad = grouped_linear(dy, [w.t() for w in weights], ctx.m_splits)
        main_grads = [getattr(w, "main_grad", None) for w in ctx.weight_refs] if ctx.fuse else []
        if ctx.fuse and any(g is None for g in main_grads):
            raise RuntimeError("fuse_wgrad_accumulation: a GroupedLinear weight has no main_grad")
        # fused: the GEMM accumulates in main_grad's precision (fp32 for a bf16 model), as TE's does
        wide = main_grads[0].dtype if main_grads else x.dtype
        wgrads = _grouped_wgrad(x.to(wide), dy.to(wide), ctx.m_splits)
        out = []
        for i, (weight, wgrad) in enumerate(zip(ctx.weight_refs, wgrads)):
            if not ctx.fuse:
                out.append(wgrad.to(weight.dtype))
                continue
            main_grad = main_grads[i]
            FUSED_GROUPED_WGRADS[0] += 1
            if ctx.first_microbatch:
                main_grad.copy_(wgrad)
            else:
                main_grad.add_(wgrad.to(main_grad.dtype))
            if hasattr(weight, "grad_added_to_main_grad"):  # megatron DDP: its hook must not add it again
                weight.grad_added_to_main_grad = True
                out.append(torch.zeros_like(weight))
            else:
                out.append(None)
        return (dgrad, None, None, None, *out)


class _GroupedLinear(torch.nn.Module):
    """Transformer Engine's GroupedLinear as megatron-core 0.16's TEGroupedLinear wraps it, for experts
    under expert parallelism: `num_gemms` parameters weight{i} [output_size, input_size] (+ bias{i}).

    forward(x [T, input_size], m_splits list of num_gemms ints) -> (out [T, output_size], None)."""

    def __init__(self, num_gemms: int, input_size: int, output_size: int, *, config, init_method, bias: bool,
                 skip_bias_add: bool, is_expert: bool = False, tp_comm_buffer_name=None, pg_collection=None,
                 tp_group=None):
        super().__init__()
        if not is_expert:
            raise ValueError("TEGroupedLinear only supports expert parallelism")
        # the expert-TP group: 0.16's TEGroupedMLP passes pg_collection, 0.15's passes tp_group (expt_tp)
        expt_tp = tp_group if tp_group is not None else getattr(pg_collection, "expt_tp", None)
        if expt_tp is not None and expt_tp.size() > 1:
            raise ValueError("the host GroupedLinear stand-in has no tensor parallelism inside experts")
        self.config = config
        self.num_gemms = num_gemms
        self.in_features, self.out_features = input_size, output_size
        self.use_bias = bias
        self.te_return_bias = skip_bias_add and bias
        self.fuse_wgrad_accumulation = config.gradient_accumulation_fusion
        self.is_first_microbatch = True
        self.expert_parallel = config.expert_model_parallel_size > 1
        for i in range(num_gemms):
            w = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
            if config.perform_initialization:
                init_method(w)
            self.register_parameter(f"weight{i}", w)
            if bias:
                self.register_parameter(f"bias{i}", torch.nn.Parameter(torch.zeros(output_size,
                                                                                   dtype=config.params_dtype)))
        for p in self.parameters():
            p.allreduce = not (is_expert and self.expert_parallel)

    def forward(self, x: torch.Tensor, m_splits):
        m_splits = [int(m) for m in m_splits]
        if len(m_splits) != self.num_gemms or sum(m_splits) != x.shape[0]:
            raise ValueError(f"m_splits {m_splits} do not split {x.shape[0]} rows into {self.num_gemms} groups")
        first = None if self.config.disable_parameter_transpose_cache else self.is_first_microbatch
        weights = [getattr(self, f"weight{i}") for i in range(self.num_gemms)]
        out = _GroupedLinearFn.apply(x, m_splits, self.fuse_wgrad_accumulation, bool(first), *weights)
        self.is_first_microbatch = False
        bias = None
        if self.use_bias:
            biases = [getattr(self, f"bias{i}") for i in range(self.num_gemms)]
            if self.te_return_bias:
                bias = biases
            else:
                out = out + torch.repeat_interleave(torch.stack(biases), torch.as_tensor(m_splits), dim=0)
        return out, bias

    def backward_dw(self):
        return None


class ColumnGroupedLinear(_GroupedLinear):
    """Stands in for megatron's TEColumnParallelGroupedLinear (fc1 of TEGroupedMLP)."""


class RowGroupedLinear(_GroupedLinear):
    """Stands in for megatron's TERowParallelGroupedLinear (fc2 of TEGroupedMLP)."""


def te_grouped_moe_spec(num_experts: int, shared_experts: bool = False):
    """megatron-core's MoE spec as get_moe_module_spec(use_te=True, moe_grouped_gemm=True) builds it
    (TEGroupedMLP experts over grouped linear layers), with the host stand-ins for TE's layers; the
    shared expert (when asked) is megatron's local one."""
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import TEGroupedMLP
    from megatron.core.transformer.spec_utils import ModuleSpec

    spec = get_moe_module_spec(use_te=False, num_experts=num_experts)
    spec.submodules.experts = ModuleSpec(module=TEGroupedMLP, submodules=MLPSubmodules(
        linear_fc1=ColumnGroupedLinear, linear_fc2=RowGroupedLinear))
    if not shared_experts:
        spec.submodules.shared_experts = None
    return spec


# ---- 3. activation recompute without a CUDA generator -------------------------------------------
def install_cpu_rng_checkpointing() -> bool:
    """megatron's recompute on a CPU-only torch: its CUDA generator state save / restore become no-ops
    (an empty state). Returns False (changes nothing) when CUDA is available."""
    if torch.cuda.is_available():
        return False
    from megatron.core.tensor_parallel import random as megatron_random

    megatron_random._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    megatron_random._set_cuda_rng_state = lambda *args, **kwargs: None
    if not getattr(megatron_random, "HAVE_TE", False):
        megatron_random.FP8GlobalStateManager = types.SimpleNamespace(is_fp8_enabled=lambda: False,
                                                                      get_fp8_recipe=lambda: None)
        megatron_random.fp8_autocast = lambda *args, **kwargs: contextlib.nullcontext()
        megatron_random.activation_recompute_forward = lambda *args, **kwargs: contextlib.nullcontext()
    return True


# ---- 4. optimizer CPU offload without CUDA --------------------------------------------------------
def _host_offload_split(self, offload_fraction: float):
    """HybridDeviceOptimizer's split of its parameters into host-stepped copies and the rest, with every
    parameter counted as device memory. Returns megatron's five values: (cpu_param_groups,
    gpu_param_groups, {param: host copy}, {host copy: param}, {param: fp32 copy})."""
    params = [p for group in self.param_groups for p in group["params"]]
    threshold = sum(p.numel() for p in params) * offload_fraction
    offloaded = 0
    cpu_groups, gpu_groups, to_copy, from_copy, to_fp32 = [], [], {}, {}, {}
    for group in self.param_groups:
        cpu_group, gpu_group = dict(group, params=[]), dict(group, params=[])
        for orig in group["params"]:
            param, copied = orig, offloaded < threshold
            if copied:
                param = orig.detach().clone()
                offloaded += param.numel()
            if self.param_update_in_fp32 and param.dtype != torch.float32:
                param = param.detach().clone().float()
                to_fp32[orig] = param
            if copied:
                to_copy[orig], from_copy[param] = param, orig
            (cpu_group if copied else gpu_group)["params"].append(param)
        for kept, out in ((gpu_group, gpu_groups), (cpu_group, cpu_groups)):
            if kept["params"]:
                out.append(kept)
    return cpu_groups, gpu_groups, to_copy, from_copy, to_fp32


def install_cpu_optimizer_offload() -> bool:
    """megatron's optimizer CPU offload on a CPU-only torch (see the module doc). Returns False (changes
    nothing) when CUDA is available."""
    if torch.cuda.is_available():
        return False
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    HybridDeviceOptimizer._get_sub_optimizer_param_groups = _host_offload_split
    return True


# ---- 5. a norm that takes sequence parallelism -----------------------------------------------
class SequenceParallelRMSNorm(torch.nn.Module):
    """RMSNorm with megatron's norm constructor (config, hidden_size, eps) that, unlike megatron's
    WrappedTorchNorm (which asserts `not config.sequence_parallel`), runs under sequence parallelism as
    TE's TENorm does: it normalizes each token's hidden vector, so a sequence slice needs nothing from
    the rest, and it marks its weight `sequence_parallel` so that megatron's finalize_model_grads
    all-reduces the weight's gradient over the tensor-parallel group (each rank saw its slice only).
    forward(x [..., hidden]) -> [..., hidden]."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
