"""The public MoE recipes the docs name (relibra.integrations.recipes) against the kit's own checks:
which settings pass and which are refused, each refusal one ConfigError naming the setting."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("megatron.core")

from relibra.integrations.recipes import RECIPES, refusals  # noqa: E402


def _recipe(stack: str, model: str):
    return next(r for r in RECIPES if r.stack == stack and r.model == model)


def test_each_public_recipe_passes_or_is_refused_naming_its_settings():
    verdicts = {r.name: refusals(r) for r in RECIPES}
    assert verdicts["slime Qwen3-30B-A3B"] == []  # TP 4 + SP x EP 8, grouped, recompute, fusion
    slime_235b = verdicts["slime Qwen3-235B-A22B"]
    assert len(slime_235b) == 2
    assert "context_parallel_size=2" in slime_235b[0] and "pipeline" not in slime_235b[0]  # PP 4 + recompute pass
    assert "use_precision_aware_optimizer=True" in slime_235b[1]
    assert len(verdicts["verl Qwen3-30B-A3B"]) == 1 and "moe_token_dispatcher_type='flex'" in verdicts[
        "verl Qwen3-30B-A3B"][0]
    verl_235b = verdicts["verl Qwen3-235B-A22B"]
    assert len(verl_235b) == 2 and "'flex'" in verl_235b[0] and "use_precision_aware_optimizer" in verl_235b[1]
    # PP 8 with TP 4 + SP and no recompute (verl's engine default) passes the parallelism check
    assert not any("pipeline_model_parallel_size" in m for m in verl_235b)


@pytest.mark.parametrize("change, named", [
    (dict(cp=2), "context_parallel_size=2"),
    (dict(etp=2), "expert_tensor_parallel_size=2"),
    (dict(dispatcher="flex"), "moe_token_dispatcher_type='flex'"),
    (dict(precision_aware_optimizer=True), "use_precision_aware_optimizer=True"),
    (dict(sequence_parallel=False), "tensor_model_parallel_size=4"),
])
def test_each_unsupported_setting_alone_is_one_error_naming_it(change, named):
    """On the recipe that passes (slime Qwen3-30B), one setting changed: exactly one error, naming it."""
    errors = refusals(dataclasses.replace(_recipe("slime", "Qwen3-30B-A3B"), **change))
    assert len(errors) == 1 and named in errors[0], errors


def test_pipeline_parallelism_with_and_without_recompute_passes():
    for recompute in ("", "full", "selective"):
        assert refusals(dataclasses.replace(_recipe("slime", "Qwen3-30B-A3B"), pp=4, recompute=recompute)) == []
