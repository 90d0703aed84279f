"""Every balancing policy behind one interface, registered by name.

    from relibra.policies import get_policy, POLICY_NAMES
    plan = get_policy("relibra").plan(trace, step=0, topology=get_topology("paper"))

One module per family: megatron, eplb (eplb, eplb+), lplb (lplb+), eplb_lp (eplb+lp), llep, relibra
(relibra and its ablations; its two mechanisms in reorder and replicate, its score in objective),
balanced, relibra_h (relibra-h). Each fast kernel's plain reference sits beside it in
<module>_reference (eplb, llep, reorder, replicate, relibra_h, split), imported only by the tests.
Shared: base (interface, the @register class decorator), split (token runs between copies). A
policy is a dataclass decorated with @register; a new policy is one new file imported here. Bounds
live in relibra.bounds; the planner benchmark in relibra.bench.planner.
"""

from __future__ import annotations

# The import order is the order of POLICY_NAMES (classes register as their module is imported).
from relibra.policies.megatron import MegatronPolicy
from relibra.policies.eplb import EplbOraclePolicy, EplbPolicy, rebalance_experts
from relibra.policies.lplb import LplbOraclePolicy
from relibra.policies.eplb_lp import EplbLpOraclePolicy
from relibra.policies.llep import LlepPolicy
from relibra.policies.relibra import ReLibraPolicy
from relibra.policies.balanced import BalancedPolicy
from relibra.policies.relibra_h import ReLibraHierPolicy
from relibra.policies.base import Policy, get_policy, parameter_names, register, registered_names

POLICY_NAMES: list[str] = registered_names()

__all__ = ["POLICY_NAMES", "Policy", "get_policy", "parameter_names", "register", "rebalance_experts",
           "MegatronPolicy", "EplbPolicy", "EplbOraclePolicy", "EplbLpOraclePolicy", "LplbOraclePolicy", "LlepPolicy",
           "ReLibraPolicy", "BalancedPolicy", "ReLibraHierPolicy"]
