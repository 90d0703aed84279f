"""The public MoE training recipes the docs name, as the settings ReLibra's checks read, and what the kit
says to each.

Sources (read for these fields; /work/shared/reference/stacks.md and rl-recipes.md list them):
  slime THUDM/slime@624b824: scripts/run-qwen3-30B-A3B.sh, scripts/run-qwen3-235B-A22B.sh (lines 76-82:
      TP 4 + SP, PP 4, CP 2, EP 16, ETP 1; CPU offload and the precision-aware optimizer), every MoE
      script with --moe-grouped-gemm and full / uniform / 1-layer recompute, the alltoall dispatcher for
      Qwen3, gradient-accumulation fusion on (Megatron-LM's default).
  verl volcengine/verl@b178a3c: examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh (TP 1, EP 8,
      flex + DeepEP), examples/grpo_trainer/run_qwen3-235b_megatron_96gb.sh (TP 4, PP 8, EP 4, CP 1,
      moe_token_dispatcher_type="flex", use_precision_aware_optimizer=True, optimizer_cpu_offload=True,
      gradient_accumulation_fusion=True, moe_grouped_gemm=True); verl/trainer/config/engine/megatron.yaml
      (sequence_parallel: True, recompute_granularity: null by default).

`refusals(recipe)` runs the kit's own checks on config objects carrying the recipe's settings: the
hook's parallelism check (relibra.runtime.hook.check_parallelism), the MoE layer's build check
(relibra.runtime.router.check_config) and the optimizer check (relibra.runtime.optstate
.check_optimizer_config). It returns each check's error message; an empty list means the recipe's
settings all pass them.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from relibra.errors import ConfigError


@dataclass(frozen=True)
class Recipe:
    """One recipe's settings that the kit's checks read: parallel sizes, sequence parallelism, the token
    dispatcher, activation recompute ("" off, else megatron's recompute_granularity) and the optimizer's
    precision-aware flag. (Grouped GEMM, gradient-accumulation fusion and CPU offload, on in these
    recipes, pass every check: docs/integration.md.)"""

    stack: str
    model: str
    file: str
    tp: int
    sequence_parallel: bool
    pp: int
    cp: int
    ep: int
    etp: int
    dispatcher: str
    recompute: str
    precision_aware_optimizer: bool

    @property
    def name(self) -> str:
        return f"{self.stack} {self.model}"


RECIPES = (
    Recipe("slime", "Qwen3-30B-A3B", "scripts/run-qwen3-30B-A3B.sh", tp=4, sequence_parallel=True, pp=1, cp=1,
           ep=8, etp=1, dispatcher="alltoall", recompute="full", precision_aware_optimizer=False),
    Recipe("slime", "Qwen3-235B-A22B", "scripts/run-qwen3-235B-A22B.sh", tp=4, sequence_parallel=True, pp=4, cp=2,
           ep=16, etp=1, dispatcher="alltoall", recompute="full", precision_aware_optimizer=True),
    Recipe("verl", "Qwen3-30B-A3B", "examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh", tp=1,
           sequence_parallel=False, pp=1, cp=1, ep=8, etp=1, dispatcher="flex", recompute="",
           precision_aware_optimizer=False),
    Recipe("verl", "Qwen3-235B-A22B", "examples/grpo_trainer/run_qwen3-235b_megatron_96gb.sh", tp=4,
           sequence_parallel=True, pp=8, cp=1, ep=4, etp=1, dispatcher="flex", recompute="",
           precision_aware_optimizer=True),
)


def recipe_moe_layer(recipe: Recipe) -> SimpleNamespace:
    """What check_parallelism reads of a MoE layer built with the recipe's settings: its config and the
    sizes of its TP and expert-TP groups."""
    def group(n):
        return SimpleNamespace(size=lambda: n)

    config = SimpleNamespace(tensor_model_parallel_size=recipe.tp, expert_tensor_parallel_size=recipe.etp,
                             pipeline_model_parallel_size=recipe.pp, context_parallel_size=recipe.cp,
                             sequence_parallel=recipe.sequence_parallel,
                             recompute_granularity=recipe.recompute or None,
                             moe_token_dispatcher_type=recipe.dispatcher, moe_expert_capacity_factor=None,
                             moe_pad_expert_input_to_capacity=False)
    return SimpleNamespace(config=config, tp_group=group(recipe.tp), experts=SimpleNamespace(tp_group=group(recipe.etp)))


def refusals(recipe: Recipe) -> list[str]:
    """The error message of every kit check the recipe's settings fail (empty: none fails)."""
    from relibra.runtime.hook import check_parallelism
    from relibra.runtime.optstate import check_optimizer_config
    from relibra.runtime.router import check_config

    moe = recipe_moe_layer(recipe)
    checks = (lambda: check_parallelism(moe), lambda: check_config(moe.config),
              lambda: check_optimizer_config(SimpleNamespace(
                  use_precision_aware_optimizer=recipe.precision_aware_optimizer)))
    out = []
    for check in checks:
        try:
            check()
        except ConfigError as exc:
            out.append(str(exc))
    return out
