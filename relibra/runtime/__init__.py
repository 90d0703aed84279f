"""The real distributed runtime: ReLibra's plans driving expert-parallel MoE training on
megatron-core and torch.distributed (gloo on CPU, NCCL on GPUs). See docs/runtime.md.

Modules: compat (CPU patches for megatron-core), config, groups, placement (logical -> physical
slots), router, replicas, migration, model, engine, data, plans (hand-built plans), timing, train
(entry point), launch (local launcher), verify (numerical checks), options, calibrate, gpu_check.
"""
