"""What a runtime launch measured, as typed records (JSON in and out: rank 0 hands them to the
launcher through a file, without pickle).

StepRecord: one rank's one timed step of one policy: wall and process CPU seconds, the seconds of
every (phase, component) with waiting as its own `<component>_wait` components, the tokens its
routed experts computed. RunResult: every record of a launch plus losses and the equivalence check.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

WAIT_SUFFIX = "_wait"


@dataclass
class StepRecord:
    """policy, step (timed steps from 0), rank; wall_s and cpu_s of the whole step on this rank;
    seconds {"phase/component": s}; expert_tokens: token-expert rows this rank's experts computed;
    experts_moved: experts this step's migration moved (all ranks)."""

    policy: str
    step: int
    rank: int
    wall_s: float
    cpu_s: float
    expert_tokens: int
    experts_moved: int
    seconds: dict[str, float]

    @property
    def wait_s(self) -> float:
        """Seconds this rank waited for others (the barriers before collectives and transfers)."""
        return sum(s for k, s in self.seconds.items() if k.endswith(WAIT_SUFFIX))


@dataclass
class Equivalence:
    """Largest absolute differences to the static placement trained on the same data."""

    max_abs_diff: float
    expert_params: float
    dense_params: float
    loss: float
    dtype: str

    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    @property
    def tolerance(self) -> float:
        return 1e-9 if self.dtype == "float64" else 1e-5


@dataclass
class RunResult:
    """One launch: records of every rank, per-policy losses (summed over ranks, every step including
    warm-up), replica slots per policy, the hardware in words, and the equivalence check (when asked)."""

    records: list[StepRecord]
    losses: dict[str, list[float]]
    replica_slots: dict[str, int]
    hardware: str
    world: int
    nodes: int
    threads_per_rank: int
    equivalence: dict[str, Equivalence] = field(default_factory=dict)

    @property
    def policies(self) -> list[str]:
        return list(self.losses)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunResult":
        return cls(records=[StepRecord(**r) for r in d["records"]], losses=d["losses"],
                   replica_slots=d["replica_slots"], hardware=d["hardware"], world=d["world"], nodes=d["nodes"],
                   threads_per_rank=d["threads_per_rank"],
                   equivalence={k: Equivalence(**v) for k, v in d.get("equivalence", {}).items()})

    def metric_rows(self, model: str, workload: str) -> list[dict]:
        """Rows in relibra.metrics' schema: one per (policy, step, rank, phase, component), plus
        ("step", "step_cpu") rows holding process CPU seconds."""
        rows = []
        for r in self.records:
            base = {"source": "measured", "hardware": self.hardware, "policy": r.policy, "model": model,
                    "workload": workload, "ep": self.world, "step": r.step, "micro_batch": -1, "layer": -1,
                    "rank": r.rank}
            for key, seconds in sorted(r.seconds.items()):
                phase, component = key.split("/", 1)
                tokens = r.expert_tokens if component in ("expert_compute", "step_total") else 0
                rows.append({**base, "phase": phase, "component": component, "seconds": seconds, "tokens": tokens})
            rows.append({**base, "phase": "step", "component": "step_cpu", "seconds": r.cpu_s, "tokens": 0})
        return rows
