"""One simulated case and the runner over cases, which every study shares: a `Case` (card, model, workload,
seed, policies, cluster) gives the simulator's inputs (`card`, `workload_config`, `make_trace`); `run_cases`
simulates cases in worker processes with a progress bar, the rows in the cases' order.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import pandas as pd

from relibra.cluster import ModelShape, Topology, get_model
from relibra.errors import ConfigError
from relibra.pool import map_in_order
from relibra.setups import SetupCard, load_card
from relibra.trace import RoutingTrace
from relibra.workloads import WorkloadConfig, generate_trace, mean_sequence_tokens


def scaled_model(model: str | ModelShape, layers: int | None) -> ModelShape:
    """Model preset `model` (or the shape) with only its first `layers` MoE layers (all when None or larger).
    The per-layer balance problem is the preset's; only the layers summed per step shrink, which leaves
    throughput *ratios* between policies comparable."""
    shape = model if isinstance(model, ModelShape) else get_model(model)
    if layers is None or layers >= shape.num_layers:
        return shape
    if layers <= 0:
        raise ConfigError(f"layers must be positive, got {layers}")
    return dataclasses.replace(shape, num_layers=int(layers))


def changed_card(setup: "str | SetupCard", changes: tuple[tuple[str, object], ...] = (), why: str = "") -> SetupCard:
    """Set-up card `setup` (name, path or SetupCard) with (card key, value) `changes`, sourced to the case (`why`:
    what it varies)."""
    card = load_card(setup)
    return card.with_values(f"case: {why or 'card changes'}", **dict(changes)) if changes else card


@dataclasses.dataclass(frozen=True)
class Case:
    """One simulated case: set-up card `setup` (name, path or SetupCard), model, workload, seed, EP size, the
    policies simulated and the cluster (topology; None: the card's).

    card_changes: (card key, value) pairs applied to the card first; layout: another batch layout (None: the
    card's); tokens_per_microbatch: a token-budget card's budget, or, for whole sequences in fixed slots, the
    sequences scaled to hold about that many tokens; workload_changes: (WorkloadConfig field, value) pairs;
    steps per trace (the last simulated, the ones before history); layers: the model's first MoE layers (None:
    all); micro_batches (None: the card's); label: what the case varies, for tables; trace: a recorded trace in
    the generator's place (its model, EP, steps and micro-batches; the card's layout and budget do not apply).
    """

    setup: "str | SetupCard"
    model: str
    workload: str
    seed: int
    ep: int = 32
    policies: tuple[str, ...] = ()
    steps: int = 3
    layers: int | None = None
    micro_batches: int | None = None
    layout: str | None = None
    tokens_per_microbatch: int | None = None
    card_changes: tuple[tuple[str, object], ...] = ()
    workload_changes: tuple[tuple[str, object], ...] = ()
    label: str = ""
    trace: RoutingTrace | None = dataclasses.field(default=None, compare=False, repr=False)
    topology: Topology | None = None

    def card(self) -> SetupCard:
        """The set-up card with the case's changes, layout and token budget."""
        layout = () if self.layout is None else (("batch.layout", self.layout),)
        card = changed_card(self.setup, (*self.card_changes, *layout), self.label)
        if self.tokens_per_microbatch is not None and card.workload_config().batch_layout == "token-budget":
            card = card.with_values("case: tokens per micro-batch",
                                    batch__tokens_per_gpu_per_microbatch=self.tokens_per_microbatch)
        return card

    def workload_config(self, card: SetupCard) -> WorkloadConfig:
        """The card's workload config with the case's changes and sequence scale."""
        cfg = card.workload_config()
        if self.tokens_per_microbatch is not None and cfg.batch_layout != "token-budget":
            scale = self.tokens_per_microbatch / mean_sequence_tokens(cfg, self.workload)
            cfg = dataclasses.replace(cfg, length_scale=scale)
        return dataclasses.replace(cfg, **dict(self.workload_changes)) if self.workload_changes else cfg

    def make_trace(self, card: SetupCard, cfg: WorkloadConfig, steps: int | None = None) -> RoutingTrace:
        """The case's trace: the recorded one, or the generator's (`steps` steps, default the case's)."""
        if self.trace is not None:
            return self.trace
        return generate_trace(scaled_model(self.model, self.layers), self.workload, self.ep, steps=steps or self.steps,
                              seed=self.seed, micro_batches=self.micro_batches or card.micro_batches, config=cfg)


def run_cases(simulate_one: Callable[[Case], "pd.DataFrame | dict"], cases: list[Case], workers: int | None = None,
              progress: bool = True, desc: str = "cases", index: str | None = None) -> pd.DataFrame:
    """simulate_one over `cases` in `workers` processes (relibra.pool.map_in_order; 1: in this process) with a
    progress bar: each case's rows (a frame, or one dict) concatenated in the cases' order, whatever the workers'
    timing. index: a column to number each row's case by (None: none)."""
    parts = map_in_order(simulate_one, cases, workers, progress, desc=desc)
    if not parts or isinstance(parts[0], dict):
        return pd.DataFrame(parts)
    if index is not None:
        for i, part in enumerate(parts):
            part[index] = i
    return pd.concat(parts, ignore_index=True)
