"""The runtime's model: megatron-core's GPTModel built from its local layer spec with ReLibra's MoE spec.

Embedding, rotary positions, RMSNorms, causal self-attention, the output layer and the MoE layers
(alltoall dispatcher) are all megatron-core's; ReLibra enters through relibra.runtime.spec only.
Dense parts are replicated on every rank (each rank runs its own tokens through them; their
gradients are all-reduced). Each rank's tokens of a micro-batch form one sequence (batch 1).

Weights come from the seed and a parameter's name, or for a routed expert from the seed and its
logical (layer, expert) id, so any placement of the same seed computes the same function.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.tensor_parallel import random as megatron_random
from megatron.core.transformer.transformer_config import TransformerConfig

from relibra.runtime import compat
from relibra.runtime.config import ModelConfig
from relibra.runtime.router import rebuild_config
from relibra.runtime.spec import gpt_layer_spec, physical_config, wrap_moe_spec


def _generator(*key: int) -> torch.Generator:
    seed = 0
    for k in key:
        seed = (seed * 1_000_003 + int(k) + 7) % (2**62)
    return torch.Generator().manual_seed(seed)


def logical_expert_weights(cfg: ModelConfig, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fc1 [2 * ffn, hidden], fc2 [hidden, ffn]) float32 of one logical expert, from the seed only."""
    h, f = cfg.hidden, cfg.shape.moe_ffn
    g = _generator(cfg.seed, 1, layer, expert)
    fc1 = torch.randn(2 * f, h, generator=g) / h**0.5
    fc2 = torch.randn(h, f, generator=g) / f**0.5
    return fc1, fc2


def transformer_config(cfg: ModelConfig):
    """megatron-core TransformerConfig of the logical model (num_moe_experts = E), no dropout."""
    shape = cfg.shape
    return TransformerConfig(
        num_layers=cfg.num_layers, hidden_size=shape.hidden, num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_kv_heads, kv_channels=shape.head_dim,
        num_moe_experts=shape.num_experts, moe_router_topk=shape.top_k, moe_ffn_hidden_size=shape.moe_ffn,
        ffn_hidden_size=shape.moe_ffn, normalization="RMSNorm",
        moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
        **compat.routing_replay_option(), moe_router_dtype="fp64" if cfg.dtype == "float64" else "fp32",
        gated_linear_unit=True, activation_func=F.silu, bias_activation_fusion=False, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False, apply_rope_fusion=False,
        use_cpu_initialization=True, perform_initialization=False, params_dtype=cfg.torch_dtype,
    )


def build_model(cfg: ModelConfig, pg_collection, max_tokens: int, grouped_gemm: bool = False,
                gradient_accumulation_fusion: bool = False, recompute: str = ""):
    """GPTModel of `cfg` for this rank: megatron's local layer spec, ReLibra's MoE spec, every rank
    holding E / ep home slots and cfg.replica_slots replica slots per layer. Weights are initialized
    (init_weights) for the static contiguous placement; max_tokens: longest sequence (rotary table).

    grouped_gemm: the experts are megatron's TEGroupedMLP (one grouped linear layer per projection,
    a parameter per slot); without CUDA its grouped linear layers are the host stand-ins of
    relibra.runtime.standins. gradient_accumulation_fusion: megatron's fused weight-gradient path
    (weight gradients accumulate in main_grad: needs megatron DDP); without CUDA the host kernel.
    recompute: megatron's activation recompute, "full" (each transformer layer re-run in backward) or
    "selective" (the MoE layer, and with grouped experts their activation). Under pipeline
    parallelism (pg_collection.pp of several ranks) this rank's stage: its share of the layers, the
    embedding on the first stage, the output layer and loss on the last."""
    tp = pg_collection.tp.size() if getattr(pg_collection, "tp", None) is not None else 1
    pp_group = getattr(pg_collection, "pp", None)
    pp = pp_group.size() if pp_group is not None else 1
    compat.apply()
    # megatron-core's GPT model warns at import (no Apex); it loads here, once a rank has set its warning
    # filters (relibra.runtime.quiet): ranks import this module while unpickling their function.
    from megatron.core.models.gpt.gpt_model import GPTModel

    if parallel_state._GLOBAL_MEMORY_BUFFER is None:
        # megatron's local attention takes its scratch tensors from this buffer; initialize_model_parallel
        # would make it, and the runtime passes process groups explicitly instead of initializing that.
        parallel_state._set_global_memory_buffer()
    # The model has no dropout, so megatron's attention needs no seeded CUDA RNG streams: its own no-op
    # tracker serves the fork around its (zero) attention dropout, on the host and on GPUs alike.
    megatron_random.initialize_rng_tracker(inference_rng_tracker=True)
    compat.provide_global_tp_group(pg_collection)
    ep = pg_collection.ep.size()
    # expert_model_parallel_size marks the expert weights as expert-parallel (allreduce=False), so
    # megatron's DDP reduces them over the expert data-parallel group, never across experts.
    config = rebuild_config(physical_config(transformer_config(cfg), ep, cfg.replica_slots),
                            expert_model_parallel_size=ep, moe_grouped_gemm=grouped_gemm,
                            gradient_accumulation_fusion=gradient_accumulation_fusion,
                            **_recompute_options(recompute, grouped_gemm),
                            **(dict(pipeline_model_parallel_size=pp, pipeline_dtype=cfg.torch_dtype) if pp > 1 else {}),
                            **(dict(tensor_model_parallel_size=tp, sequence_parallel=True,
                                    expert_tensor_parallel_size=1) if tp > 1 else {}))
    spec = gpt_layer_spec(cfg.num_experts)
    if grouped_gemm or gradient_accumulation_fusion or recompute:
        from relibra.runtime import standins

        if recompute:
            standins.install_cpu_rng_checkpointing()

        if gradient_accumulation_fusion and compat.cuda_absent():
            standins.install_cpu_wgrad_fusion()
        if grouped_gemm:
            spec.submodules.mlp = grouped_moe_spec(cfg.num_experts)
    if tp > 1:
        from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

        from relibra.runtime.standins import SequenceParallelRMSNorm

        spec.submodules.input_layernorm = SequenceParallelRMSNorm
        spec.submodules.pre_mlp_layernorm = SequenceParallelRMSNorm
        spec = TransformerBlockSubmodules(layer_specs=[spec] * cfg.num_layers, layer_norm=SequenceParallelRMSNorm)
    stages = dict(pre_process=pp_group.rank() == 0, post_process=pp_group.rank() == pp - 1) if pp > 1 else {}
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(cfg.torch_dtype)  # megatron's torch norms take the default dtype
    try:
        model = GPTModel(config, spec, vocab_size=cfg.shape.vocab_size,
                         max_sequence_length=max(max_tokens, 1), position_embedding_type="rope",
                         pg_collection=pg_collection, **stages)
    finally:
        torch.set_default_dtype(previous_dtype)
    return model


def _recompute_options(recompute: str, grouped_gemm: bool) -> dict:
    """TransformerConfig fields of megatron's activation recompute ("" off, "full", "selective")."""
    if not recompute:
        return {}
    if recompute == "full":
        return dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    if recompute == "selective":
        return dict(recompute_granularity="selective",
                    recompute_modules=["moe", "moe_act"] if grouped_gemm else ["moe"])
    raise ValueError(f"recompute must be '', 'full' or 'selective', got {recompute!r}")


def grouped_moe_spec(num_experts: int):
    """The MoE spec with grouped-GEMM experts, wrapped: Transformer Engine's (TEGroupedMLP over
    TEColumnParallelGroupedLinear / TERowParallelGroupedLinear) where TE and CUDA are present, else
    TEGroupedMLP over the host stand-ins (relibra.runtime.standins)."""
    from relibra.runtime import standins

    spec = standins.te_grouped_moe_spec(num_experts)
    if not compat.cuda_absent():
        try:
            from megatron.core.extensions.transformer_engine import (TEColumnParallelGroupedLinear,
                                                                     TERowParallelGroupedLinear)
        except ImportError:
            TEColumnParallelGroupedLinear = None
        if TEColumnParallelGroupedLinear is not None:
            spec.submodules.experts.submodules.linear_fc1 = TEColumnParallelGroupedLinear
            spec.submodules.experts.submodules.linear_fc2 = TERowParallelGroupedLinear
    return wrap_moe_spec(spec, num_experts)


def init_dense_weights(model, seed: int, expert_params: set[int]) -> None:
    """Every parameter that is not a routed expert's: matrices from the seed and the parameter's name
    (normal / sqrt(fan-in)), so every rank and placement starts alike; vectors (norm scales) stay as
    megatron built them (ones). Routers: seeded by layer."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if id(p) in expert_params or p.dim() < 2:
                continue
            g = _generator(seed, 3, zlib.crc32(name.encode()))
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / p.shape[-1] ** 0.5)


def forward_loss(model, ids: np.ndarray, labels: np.ndarray, scale: float, device) -> torch.Tensor:
    """Summed next-token cross-entropy of one sequence (ids, labels int64 [T]) times `scale`."""
    t = len(ids)
    ids_t = torch.as_tensor(ids, device=device).view(1, t)
    positions = torch.arange(t, device=device).view(1, t)
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=device), 1).view(1, 1, t, t)
    logits = model(ids_t, positions, causal)  # [1, T, vocab]
    loss = F.cross_entropy(logits.view(t, -1), torch.as_tensor(labels, device=device), reduction="sum")
    return loss * scale, logits
