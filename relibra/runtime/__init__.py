"""The real distributed runtime: StepPlans driving expert-parallel MoE training of megatron-core's
GPTModel on torch.distributed (gloo on CPU, NCCL on GPUs). It only consumes plans; planning,
prediction and reports are relibra.runtime.measure's. See docs/runtime.md and docs/integration.md.

Modules: spec (ReLibra's MoE submodule spec), hook (the step hook: begin_step, before_microbatch,
after_backward), slots (physical expert slots), router, placement (every read of a plan), replicas,
migration, model (the GPTModel), engine (one rank's step), train (interleaved policies), measure (plan, run,
predict and summarise: `relibra run`'s engine and notebook 08's), results,
timing, config, groups, collect, data, plans (hand-built plans), launch (local launcher), verify
(numerical checks), compat (the CPU patches), quiet. The runtime's calibration and GPU checks live in
relibra.bench (calibrate, cpu_preset, gloo, runtime_modules, device).
"""
