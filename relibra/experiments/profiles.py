"""Profiles: the sizes of every experiment for one kind of machine (tiny, laptop, paper, gpu)."""

from __future__ import annotations

from dataclasses import dataclass, field

from relibra.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Scale:
    """The sizes every experiment reads; a Profile holds their defaults, a Config the resolved values.

    models / workloads: the grid of notebooks 02, 03 and 05; model / workload: the single case of
    notebooks 01, 04 and 07. layers: keep only the first `layers` MoE layers of each model (None:
    all). micro_batches and steps: per trace (micro_batches None: the set-up card's, every micro-batch
    of its batch). ep_sizes: the EP sweep of notebook 06.
    tokens_per_rank: tokens per (micro-batch, rank) of each trace (None: the generator's default).
    """

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


@dataclass(frozen=True)
class ScaleSweep:
    """The grid of notebook 11.

    models: model presets (or shape specs); clusters: cluster presets or specs; ep_sizes: EP sizes;
    layers: keep each model's first `layers` MoE layers (None: all); micro_batches per step; steps:
    trace steps, the last one simulated (the ones before give history-based policies their history).
    """

    models: tuple[str, ...]
    clusters: tuple[str, ...]
    ep_sizes: tuple[int, ...]
    layers: int | None = 2
    micro_batches: int = 8
    steps: int = 2


@dataclass(frozen=True)
class HeadlineGrid:
    """The grid of notebook 02's headline (relibra.experiments.headline): every case of models x
    workloads x seeds at EP `ep` on the set-up card, at full scale unless layers / micro_batches cut it
    (None: every MoE layer; the card's micro-batches). sweep_*: the tokens-per-micro-batch sweep (one
    model and workload, seed 0); alternative: the card of the one-sequence family."""

    models: tuple[str, ...] = ("qwen3-30b-a3b", "glm-4.5-air", "qwen3-235b-a22b")
    workloads: tuple[str, ...] = ("math", "science", "instruct", "code", "mixed")
    seeds: tuple[int, ...] = (0, 1, 2)
    ep: int = 32
    layers: int | None = None
    micro_batches: int | None = None
    steps: int = 3
    sweep_model: str = "qwen3-235b-a22b"
    sweep_workload: str = "mixed"
    sweep_tokens: tuple[int, ...] = (4096, 8192, 16384, 32768)
    alternative: str = "one-sequence"

    @property
    def full_scale(self) -> bool:
        return self.layers is None and self.micro_batches is None


# Notebook 11's grid: three model sizes, 8-GPU nodes against NVL72 racks, EP 16 to 256.
SCALE_MODELS = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3")
SCALE_CLUSTERS = ("paper,nodes=32", "gb200-nvl72x4")
SCALE_EP_SIZES = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Profile(Scale):
    """Sizes of every experiment for one kind of machine: the Scale fields (keyword-only) and

    planner_repeats: best-of repeats of notebook 07's planner timing.
    runtime_*: the gloo run of notebook 08 (world size, simulated nodes, steps, model, tokens).
    rl_steps: GRPO steps of notebook 09. measured_dir: folder of measured results (gpu profile).
    sensitivity_knobs: the knobs notebook 10 moves (None: all of relibra.experiments.sensitivity.KNOBS);
    sensitivity_quick: two values per knob (the default and one other) instead of all.
    scale: notebook 11's grid (ScaleSweep).
    headline: notebook 02's grid (HeadlineGrid): at full scale in every profile but `tiny`, so no cut-down
        figure ever stands beside a paper claim.
    """

    name: str
    description: str
    planner_repeats: int = 1
    runtime_nproc: int = 2  # one rank per core of a 2-core machine: more would be oversubscribed
    runtime_nodes: int = 1
    runtime_steps: int = 5
    runtime_model: str = "moe-cpu"  # expert-dominated CPU preset (relibra.cluster, docs/runtime.md)
    runtime_workload: str = "math"
    runtime_tokens_per_rank: int = 1024
    runtime_micro_batches: int = 2
    runtime_repeats: int = 2
    rl_steps: int = 20
    measured_dir: str | None = None
    sensitivity_knobs: tuple[str, ...] | None = None
    sensitivity_quick: bool = False
    scale: ScaleSweep = field(default_factory=lambda: ScaleSweep(SCALE_MODELS, SCALE_CLUSTERS, SCALE_EP_SIZES))
    headline: HeadlineGrid = field(default_factory=HeadlineGrid)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in [
        Profile("tiny", "seconds per notebook, for the tests: the `tiny` model (4 layers, 16 experts, top-2) "
                "on the cpu-gloo cluster preset", models=("tiny",), workloads=("math",), model="tiny",
                workload="mixed", ep=4, ep_sizes=(2, 4), cluster="cpu-gloo", steps=3, micro_batches=4,
                layers=None, tokens_per_rank=64, runtime_nproc=2, runtime_nodes=1, runtime_steps=1,
                runtime_model="moe-cpu", runtime_tokens_per_rank=64, runtime_micro_batches=1,
                runtime_repeats=1, rl_steps=2, sensitivity_knobs=("batch layout", "RDMA rate"),
                sensitivity_quick=True, scale=ScaleSweep(("tiny",), ("cpu-gloo,nodes=4", "nvl72"), (4, 8, 32),
                                                         layers=2, micro_batches=2),
                headline=HeadlineGrid(models=("tiny",), workloads=("math", "mixed"), seeds=(0, 1), ep=4,
                                      micro_batches=2, steps=2, sweep_model="tiny", sweep_tokens=(1024, 4096))),
        Profile("laptop", "minutes on 2 CPU cores: the headline (02) at full scale over 3 seeds; the other "
                "notebooks cut to 4 MoE layers, 8 micro-batches per step and 4 steps", models=("qwen3-30b-a3b", "glm-4.5-air", "qwen3-235b-a22b"),
                workloads=("math", "science", "instruct", "code", "mixed"), model="qwen3-235b-a22b",
                workload="mixed", ep=32, ep_sizes=(8, 16, 32, 64), cluster="paper", steps=4, micro_batches=8,
                layers=4, runtime_steps=20, runtime_repeats=1, rl_steps=20),
        Profile("paper", "the paper's scale: every MoE layer, every micro-batch of the set-up card's batch, EP 32 on the paper's "
                "cluster (20 nodes x 8 Hopper GPUs); hours on a CPU", models=("qwen3-30b-a3b", "glm-4.5-air",
                "qwen3-235b-a22b"), workloads=("math", "science", "instruct", "code", "mixed"),
                model="qwen3-235b-a22b", workload="mixed", ep=32, ep_sizes=(8, 16, 32, 64), cluster="paper",
                steps=6, micro_batches=None, layers=None, planner_repeats=3, runtime_steps=30, runtime_repeats=3,
                rl_steps=60, scale=ScaleSweep(SCALE_MODELS, SCALE_CLUSTERS, SCALE_EP_SIZES, layers=None,
                                              micro_batches=32)),
        Profile("gpu", "the paper's scale for the simulations; measured results of real runs on GPU nodes are "
                "read from `measured_dir` (default results/gpu_runs)", models=("qwen3-30b-a3b", "glm-4.5-air",
                "qwen3-235b-a22b"), workloads=("math", "science", "instruct", "code", "mixed"),
                model="qwen3-235b-a22b", workload="mixed", ep=32, ep_sizes=(8, 16, 32, 64), cluster="paper",
                steps=6, micro_batches=None, layers=None, planner_repeats=3, rl_steps=60,
                measured_dir="results/gpu_runs"),
    ]
}


def get_profile(name: str) -> Profile:
    """The profile called `name`; a ConfigError lists the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
