"""Profiles: the machines the notebooks are sized for (tiny, laptop, paper, gpu) and the sizes most share."""

from __future__ import annotations

from dataclasses import dataclass

from relibra.cluster import PAPER_MODELS
from relibra.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Scale:
    """The sizes of the trace notebooks in one profile. models / workloads: the grid; model / workload: the
    single case; layers: each model's first MoE layers kept (None: all); micro_batches (None: the set-up card's)
    and steps: per trace; ep_sizes: notebook 06's EP sweep; tokens_per_rank: per (micro-batch, rank) of a trace
    (None: the generator's); planner_repeats: best-of repeats of notebook 07's planner timing."""

    models: tuple[str, ...]
    workloads: tuple[str, ...]
    model: str
    workload: str
    ep: int
    ep_sizes: tuple[int, ...]
    cluster: str
    steps: int
    micro_batches: int | None
    layers: int | None
    tokens_per_rank: int | None = None
    planner_repeats: int = 1


# {profile: what it runs}; a notebook module keeps its own sizes per profile (SIZES).
PROFILES: dict[str, str] = {
    "tiny": "seconds per notebook, for the tests: the `tiny` model (4 layers, 16 experts, top-2) on the cpu-gloo "
            "cluster preset",
    "laptop": "minutes on 2 CPU cores: the headline (02) at full scale over 3 seeds; the other notebooks cut to 4 MoE "
              "layers, 8 micro-batches per step and 4 steps",
    "paper": "the paper's scale: every MoE layer, every micro-batch of the set-up card's batch, EP 32 on the paper's "
             "cluster (20 nodes x 8 Hopper GPUs); hours on a CPU",
    "gpu": "the paper's scale for the simulations; measured results of real runs on GPU nodes are read from "
           "`measured_dir` (default results/gpu_runs)",
}

_PAPER_GRID = dict(models=PAPER_MODELS,
                   workloads=("math", "science", "instruct", "code", "mixed"), model="qwen3-235b-a22b",
                   workload="mixed", ep=32, ep_sizes=(8, 16, 32, 64), cluster="paper")
SCALES: dict[str, Scale] = {
    "tiny": Scale(models=("tiny",), workloads=("math",), model="tiny", workload="mixed", ep=4, ep_sizes=(2, 4),
                  cluster="cpu-gloo", steps=3, micro_batches=4, layers=None, tokens_per_rank=64),
    "laptop": Scale(**_PAPER_GRID, steps=4, micro_batches=8, layers=4),
    "paper": Scale(**_PAPER_GRID, steps=6, micro_batches=None, layers=None, planner_repeats=3),
    "gpu": Scale(**_PAPER_GRID, steps=6, micro_batches=None, layers=None, planner_repeats=3),
}


def per_profile(make) -> dict:
    """{profile: make(profile name)}: a notebook's SIZES."""
    return {name: make(name) for name in PROFILES}


def get_profile(name: str) -> str:
    """What profile `name` runs; a ConfigError lists the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
