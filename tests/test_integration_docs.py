"""Every snippet of docs/integration.md runs: the setup, then each stack's snippet (megatron-core, verl,
slime), on 2 gloo ranks (EP 2), one launch. Each stack's run starts from a fresh setup.

For slime, slime's RoutingReplay (tests/stack_doubles.py, with slime's megatron patch) is installed on
every router and filled by one recording forward first, as slime's fill_routing_replay fills it from the
rollout's routed experts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
# megatron-core's own RouterReplay (0.16); on 0.15 verl's and slime's replay are tested by test_stack_replay.py
pytest.importorskip("megatron.core.transformer.moe.router_replay")

DOC = Path(__file__).resolve().parents[1] / "docs" / "integration.md"
STACKS = ("megatron-core", "verl", "slime")


def snippets() -> dict[str, str]:
    text = DOC.read_text()
    found = re.findall(r"<!-- snippet: ([a-z\-]+) -->\n```python\n(.*?)```", text, flags=re.S)
    return dict(found)


def test_the_page_has_every_snippet_and_compat_comes_first():
    found = snippets()
    assert set(found) == {"setup", *STACKS}
    code = [ln for ln in found["setup"].splitlines() if ln.strip() and not ln.startswith("#")]
    assert code[:2] == ["from relibra.runtime import compat", "compat.apply()  # first: checks megatron-core's "
                        "version; on a CPU-only torch it patches megatron's CUDA calls"]


def docs_worker(rank: int, world: int) -> dict:
    import os

    import torch

    found = snippets()
    out = {}
    for stack in STACKS:
        ns = {"__name__": f"integration_docs_{stack}"}
        exec(compile(found["setup"], f"docs/integration.md:setup", "exec"), ns)
        if stack == "slime":
            from test_integration_replay import install_slime_stand_in

            from relibra.integrations.megatron import current_placement_plan, placement_routers

            hook, model = ns["hook"], ns["model"]
            for router in placement_routers(model):
                install_slime_stand_in(router)
            hook.begin_step(current_placement_plan(hook, len(ns["batches"])))
            os.environ["ROUTING_REPLAY_STAGE"] = "record"
            with torch.no_grad():
                for m, batch in enumerate(ns["batches"]):
                    hook.before_microbatch(m)
                    ns["loss_of"](batch)
        before = {k: v.detach().clone() for k, v in ns["logical_state_dict"](ns["model"], gather=True).items()
                  if torch.is_tensor(v)}
        exec(compile(found[stack], f"docs/integration.md:{stack}", "exec"), ns)
        plan, weights, hook = ns["plan"], ns["weights"], ns["hook"]
        experts = sorted(k for k in weights if ".experts.local_experts." in k and k.endswith(".weight"))
        changed = [k for k in experts if not torch.equal(weights[k], before[k])]
        out[stack] = {
            "plan_policy": plan.policy,
            "plan_tokens": int(plan.loads.sum()),  # every rank's replayed (token, expert) pairs
            "replica_tokens": int(plan.replica_tokens.sum()),
            "exported_expert_weights": len(experts),
            "updated_expert_weights": len(changed),
            "home_matches_plan": bool((hook.home == plan.home).all()),
        }
        os.environ.pop("ROUTING_REPLAY_STAGE", None)
        os.environ.pop("ENABLE_ROUTING_REPLAY", None)
        from megatron.core import parallel_state
        from megatron.core.transformer.moe.router_replay import RouterReplay

        RouterReplay.clear_global_router_replay_instances()
        parallel_state.destroy_model_parallel()
    return out


def test_every_snippet_runs_on_two_ranks():
    from relibra.runtime.launch import launch

    out = launch(docs_worker, 2, timeout_s=180)
    print(out)
    for stack in STACKS:
        got = out[stack]
        assert got["plan_policy"] == "relibra"
        assert got["plan_tokens"] == 2 * 2 * 2 * 16 * 2  # micro-batches x layers x ranks x tokens x top-k
        assert got["exported_expert_weights"] == 2 * 4 * 2  # layers x logical experts x (fc1, fc2)
        assert got["updated_expert_weights"] > 0  # the step trained routed experts, named logically
        assert got["home_matches_plan"]
