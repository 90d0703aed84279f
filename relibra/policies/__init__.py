"""Every balancing policy behind one interface, registered by name.

    from relibra.policies import get_policy, POLICY_NAMES
    plan = get_policy("relibra").plan(trace, step=0, topology=get_topology("paper"))

One module per family: megatron, eplb (eplb, eplb+), eplb_lp (eplb+lp), lplb (lplb+), llep, relibra
(relibra and its ablations; its two mechanisms in reorder and replicate), balanced. Shared: base (interface,
registry), split (token runs between copies). Bounds live in relibra.bounds; the planner benchmark
in relibra.bench.planner.
"""

from __future__ import annotations

from relibra.policies.balanced import BalancedPolicy
from relibra.policies.base import Policy, get_policy, register, registered_names
from relibra.policies.eplb import EplbOraclePolicy, EplbPolicy, rebalance_experts
from relibra.policies.eplb_lp import EplbLpOraclePolicy
from relibra.policies.llep import LlepPolicy
from relibra.policies.lplb import LplbOraclePolicy
from relibra.policies.megatron import MegatronPolicy
from relibra.policies.relibra import VARIANTS, ReLibraPolicy, _variant

register("megatron", MegatronPolicy)
register("eplb", EplbPolicy)
register("eplb+", EplbOraclePolicy)
register("lplb+", LplbOraclePolicy)
register("eplb+lp", EplbLpOraclePolicy)
register("llep", LlepPolicy)
for _name, _fixed in VARIANTS.items():
    register(_name, _variant(_name, **_fixed))
register("balanced", BalancedPolicy)
from relibra.policies.relibra_h import relibra_h_factory as _rh; register("relibra-h", _rh)  # noqa: E402,E702

POLICY_NAMES: list[str] = registered_names()

__all__ = ["POLICY_NAMES", "Policy", "get_policy", "rebalance_experts", "MegatronPolicy",
           "EplbPolicy", "EplbOraclePolicy", "EplbLpOraclePolicy", "LplbOraclePolicy", "LlepPolicy", "ReLibraPolicy", "BalancedPolicy"]
