"""Notebook 02, the headline: the paper's claims against the kit's figures at full scale over seeds, on
a set-up card (relibra.studies.throughput: the cases, the verdict, the budget sweep, the alternatives),
or on a routing trace file (`trace`) and on another cluster than the card's (`cluster`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from relibra.experiments.base import (PATH, Fact, Params, Result, TryThis, facts_frame, integer, mean_of, objects,
                                      param, table, value)
from relibra.cluster import PAPER_MODELS, Topology
from relibra.errors import ConfigError
from relibra.studies.overheads import overheads_table
from relibra.studies.throughput import (alternative_cases, alternative_ratios, budget_cases, budget_ratios,
                                        case_ratios, headline_cases, run_cases, trace_cases, verdict_with_alternatives)
from relibra.experiments.profiles import per_profile
from relibra.experiments.text import fact_rows, facts_table
from relibra.experiments.traces import CLUSTER, PROFILE, TRACE, trace_text, trace_workload
from relibra.labels import CLAIMS
from relibra.setups import DEFAULT_CARD, SetupCard, load_card
from relibra.trace import RoutingTrace

QUESTION = "Does ReLibra deliver what the paper claims, at full scale and over seeds?"


@dataclass(frozen=True)
class Sizes:
    """The headline's grid: every case of models x workloads x seeds at EP `ep` on the set-up card, at
    full scale unless layers / micro_batches cut it (None: every MoE layer; the card's micro-batches).
    sweep_*: the tokens-per-micro-batch sweep (one model and workload, seed 0); alternative: the card
    of the one-sequence family."""

    models: tuple[str, ...] = PAPER_MODELS
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


# Full scale in every profile but `tiny`, so no cut-down figure ever stands beside a paper claim.
SIZES = {**per_profile(lambda name: Sizes()),
         "tiny": Sizes(models=("tiny",), workloads=("math", "mixed"), seeds=(0, 1), ep=4, micro_batches=2, steps=2,
                       sweep_model="tiny", sweep_tokens=(1024, 4096))}


def sizes_of(values) -> Sizes:
    """The profile's grid, or with a `trace` its one case: the trace's model, EP, steps and micro-batches."""
    g, t = SIZES[values.profile], values.trace
    if t is None:
        return g
    seed = t.provenance.get("seed")  # the generator's; an imported trace has none
    return dataclasses.replace(g, models=(t.model.name,), workloads=(trace_workload(t),),
                               seeds=(seed if isinstance(seed, int) else 0,), ep=t.ep, layers=None,
                               micro_batches=t.num_microbatches, steps=t.num_steps, sweep_tokens=())


@dataclass(frozen=True)
class Params(Params):
    profile: str = param("laptop", "sizes of every experiment", PROFILE, affects=False)
    setup: SetupCard = param(DEFAULT_CARD, "set-up card: a name (relibra setup list) or a .toml path",
                             objects(load_card, "set-up card", single=True))
    tokens_per_microbatch: int | None = param(None, "token budget per GPU per micro-batch (None: the card's)",
                                              integer(1))
    trace: RoutingTrace | None = param(None, "a routing trace file (.npz) simulated instead of the synthetic grid "
                                       "(None: the grid)", TRACE)
    cluster: Topology | None = param(None, "the cluster every case runs on (None: the set-up card's)", CLUSTER)
    out_dir: str | None = param(None, "where results go (None: results/interactive/02_throughput)", PATH,
                                affects=False)

    def check(self, notebook: str, g: Sizes) -> None:
        """A trace fixes its own batch; the EP size fits the cluster (the card's or `cluster`)."""
        if self.trace is not None and self.tokens_per_microbatch is not None:
            raise ConfigError(f"{notebook}: tokens_per_microbatch must be None with a trace ({trace_text(self.trace)} "
                              f"fixes its own micro-batches); got {self.tokens_per_microbatch}")
        what = "the trace's" if self.trace is not None else f"the {self.profile} profile's"
        try:
            if self.cluster is None:
                self.setup.check_ep(g.ep)
            else:
                self.cluster.ep_layout(g.ep)
        except ConfigError as exc:
            got = "None, the set-up card's" if self.cluster is None else repr(self.cluster.name)
            raise ConfigError(f"{notebook}: cluster must be {CLUSTER.accepts} with room for EP {g.ep} ({what}); got "
                              f"{got} ({exc})") from None

    def scale_note(self, g: Sizes) -> str:
        if self.trace is not None:
            return (f"the trace's scale: {self.trace.num_layers} MoE layers, {g.micro_batches} micro-batches, the last "
                    f"of {g.steps} steps simulated")
        return ("full scale: every MoE layer, every micro-batch of the batch" if g.full_scale else
                f"CUT-DOWN ({self.profile} profile): "
                + ("every MoE layer" if g.layers is None else f"first {g.layers} MoE layers") + ", "
                + ("every micro-batch" if g.micro_batches is None else f"{g.micro_batches} micro-batches"))

    def simulated_on(self) -> str:
        return (self.cluster or self.setup.topology()).name

    def on_cluster(self) -> str:
        """' on the <cluster> cluster (nodes x GPUs)' for captions, empty on the card's own."""
        c = self.cluster
        return "" if c is None else f" on the {c.name} cluster ({c.num_nodes} x {c.gpus_per_node} GPUs)"


@dataclass(kw_only=True)
class Result(Result):
    throughput: pd.DataFrame = table("simulated tokens/s and shares per model, workload, seed and policy")
    case_ratios: pd.DataFrame = table("ReLibra / Megatron, ReLibra / EPLB+ and the gaps per model, workload and seed")
    verdict: pd.DataFrame = table("per paper claim: the kit's mean and range over cases and seeds, the best case and "
                                  "seed, the range over the alternatives (layouts, link rates), why they differ")
    ratio_vs_budget: pd.DataFrame = table("ReLibra / Megatron and / EPLB+ per family and tokens per micro-batch")
    alternatives: pd.DataFrame = table("the headline ratios under each other batch layout and link-rate pair")
    overheads: pd.DataFrame = table("ReLibra's overheads: the paper's figure and the kit's, with how the kit "
                                    "obtains it")
    setup: str = value(DEFAULT_CARD)
    caption: str = value("")
    sweep_caption: str = value("")


def compute(p: Params, g: Sizes, progress: bool = True, workers: int | None = None) -> Result:
    """The grid on the card, the budget sweep of both families and the alternatives, all cases in one
    pool of workers; with a trace, its one case and the link-rate alternatives on it (no sweep, no
    other layouts: they reshape the generator's batch, which the trace fixes)."""
    card, setup, budget = p.setup, p.setup.name, p.tokens_per_microbatch
    if p.trace is None:
        shared = dict(ep=g.ep, steps=g.steps, layers=g.layers, micro_batches=g.micro_batches, topology=p.cluster)
        grid_cases = headline_cases(card, g.models, g.workloads, g.seeds, tokens_per_microbatch=budget, **shared)
        sweep_cases = budget_cases(card, g.alternative, g.sweep_model, g.sweep_workload, 0, g.sweep_tokens, **shared)
        alt_cases = alternative_cases(card, g.sweep_model, g.sweep_workload, 0, **shared)
    else:
        (grid_cases, alt_cases), sweep_cases = trace_cases(card, p.trace, p.cluster, g.workloads[0], g.seeds[0]), []
    frame = run_cases(grid_cases + sweep_cases + alt_cases, workers, progress, desc="headline")
    part = np.digitize(frame["case_index"], [len(grid_cases), len(grid_cases) + len(sweep_cases)])
    grid, sweep_rows, alt_rows = (frame[part == i].drop(columns="case_index").reset_index(drop=True) for i in range(3))
    sweep = budget_ratios(sweep_rows)
    sweep["family"] = np.where(sweep["layout"] == "token-budget", "token-budget", "one sequence per micro-batch")
    alternatives = alternative_ratios(alt_rows)
    card_text = f"`{setup}` set-up card" + ("" if budget is None else f" with {budget} tokens per micro-batch")
    if p.trace is None:
        caption = (f"simulated on the {card_text}{p.on_cluster()}, EP {g.ep}; {len(g.models)} models x "
                   f"{len(g.workloads)} workloads x {len(g.seeds)} seeds ({', '.join(map(str, g.seeds))}); "
                   f"{p.scale_note(g)}")
        # the sweep is one case at each budget: its caption names that case, not the grid
        sweep_caption = (f"simulated on the `{setup}` and `{g.alternative}` set-up cards{p.on_cluster()}, EP {g.ep}; "
                         f"{g.sweep_model}, {g.sweep_workload}, seed 0, {len(g.sweep_tokens)} budgets; "
                         f"{p.scale_note(g)}")
    else:
        caption = (f"simulated on the {card_text}{p.on_cluster()}, EP {g.ep}; model {g.models[0]}, "
                   f"{trace_text(p.trace)}; {p.scale_note(g)}")
        sweep_caption = (f"no budget sweep and no other batch layouts: both reshape the synthetic batch, and "
                         f"{trace_text(p.trace)} fixes its own micro-batches and sequences")
    scale = "the trace's" if p.trace is not None else "full scale" if g.full_scale else "CUT-DOWN"
    verdict = verdict_with_alternatives(grid, alternatives, scale)
    return Result(throughput=grid, case_ratios=case_ratios(grid), verdict=verdict, ratio_vs_budget=sweep,
                  alternatives=alternatives, overheads=overheads_table(grid, "headline"), setup=setup, caption=caption,
                  sweep_caption=sweep_caption)


@dataclass(frozen=True)
class Summary:
    verdicts: tuple  # the verdict table's rows (named tuples of its columns: id, claim, paper, mean, ..., why)
    setup: str
    caption: str


def summarize(r: Result) -> Summary:
    return Summary(tuple(r.verdict.itertuples(index=False, name="Verdict")), r.setup, r.caption)


def _claim_facts(s: Summary, on: str) -> list[Fact]:
    """Per claim of the verdict: the kit's mean and range over cases and seeds, its best case, the range over
    the alternatives."""
    return [Fact(v.id, value, CLAIMS[v.id].unit, stat, of, on=on, readme=v.claim) for v in s.verdicts
            for stat, value, of in (("mean", v.mean, ""), ("low", v.low, ""), ("high", v.high, ""),
                                    ("best", v.best, v.best_case),
                                    ("other layouts and link rates low", v.alternatives_low, ""),
                                    ("other layouts and link rates high", v.alternatives_high, ""))]


def story(s: Summary) -> str:
    """Each paper claim: the kit's figures (as its README row shows them), and why they differ from the paper's."""
    rows = fact_rows(facts_frame(_claim_facts(s, "")))
    return "\n".join(f"- **{row['what']}**: {row['figure']}. Why: {v.why}." for row, v in zip(rows, s.verdicts))


def facts(r: Result, scale: str) -> list[Fact]:
    """_claim_facts on the grid's caption and card, naming the cases that do not fit in memory."""
    cases = r.case_ratios
    fit = ("" if "feasible" not in cases or cases["feasible"].all() else
           f"; {int(cases['feasible'].sum())} of {len(cases)} cases fit in memory and only they enter the figures "
           f"({', '.join(sorted(set(cases.loc[~cases['feasible'].astype(bool), 'model'])))} does not fit on some)")
    return _claim_facts(summarize(r), f"{r.caption.removeprefix('simulated on ')}{fit} (relibra setup show {r.setup})")


def section(x, table_md) -> str:
    """REPORT.md's verdict: each paper claim beside the kit's figure at the card's default (mean and range
    over cases and seeds), its best case and seed, the range over the alternatives; then why they differ."""
    return (f"## The default card's headline in detail\n\nOne card's point of the verdict map (notebook 12, the "
            "table above where it ran): its figures alone do not answer the paper's claims. "
            f"From notebook 02, simulated on **{x.facts['on'].iloc[0]}**, every policy; the set-up card's every input "
            "with its source: docs/setup.md. The alternatives are the other batch layouts and link-rate measurements "
            "on one case (notebook 02's `alternatives.csv`).\n\n"
            f"{table_md(facts_table(x.facts, 'fact', 'stat', 'claim'))}\n\nWhy they differ:\n\n"
            + "".join(f"- **{v.claim}**: {v.why}.\n" for v in x.summary.verdicts))


TRIES = (
    # a recorded trace fixes its own micro-batches: the lesson is on the synthetic grid
    TryThis(lambda p, s: {**({} if p.trace is None else {"trace": None}), "tokens_per_microbatch": 4096},
            "ReLibra / Megatron (mean over cases and seeds)",
            lambda r: mean_of(r.case_ratios, "relibra_over_megatron"), -1,
            "smaller packed micro-batches hold fewer sequences, so a long one weighs more on its rank's attention "
            "and all-to-all, which no expert placement changes"),
)
