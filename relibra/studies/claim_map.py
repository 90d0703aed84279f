"""The verdict as a map: ReLibra / Megatron, ReLibra / EPLB+ and the gap to Balanced over the two inputs no
source fixes, tokens per EP rank per micro-batch and the micro-batch shift of the routing, faceted by the step's
size (sequences per token-holding rank per step).

A grid (GridSpec) is every (tokens per EP rank, shift value) node x model x workload x seed at full scale
(every MoE layer, every micro-batch of the set-up card's batch), on the card's token-budget layout with its
budget replaced by the node's tokens; the shift is one WorkloadConfig field (ShiftAxis) moved over its
values, everything else the card's; each step size of `step_sequences` is a facet of its own. Each named card
is also a point: simulated as the card says, its position the mean tokens per EP rank per micro-batch of its
simulated trace and the micro-batch-vs-step load correlation of that generated trace, in the facet nearest its
own step size. Every case carries its memory verdict (SetupCard.memory_budget at the case's model, EP and
tokens): `feasible` is False where the busiest GPU needs more than the card's HBM, and such cases enter no
best, mean or worst of the map (node_fields, card_points, claim_regions, conclusion). Every
case is one trace of `steps` steps with its last step simulated (relibra.sim.simulate, as the headline
does), so a card's point at the card's own inputs is the headline's case. `run_map` simulates a grid,
`node_fields` / `card_points` summarise it, `claim_contours` / `claim_regions` / `conclusion` say where the
paper's claims hold, `map_json` is all of it for `relibra map`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from relibra.analysis import microbatch_calibration, shift_stats
from relibra.cluster import PAPER_MODELS, get_model
from relibra.display import json_safe
from relibra.errors import ConfigError
from relibra.labels import PAPER_CLAIMS, verdict_line
from relibra.rl.capture import DEFAULT_RL_TRACE
from relibra.setup_schema import BOUNDS
from relibra.setups import DEFAULT_CARD, card_names
from relibra.studies.case import Case, changed_card, run_cases
from relibra.studies.params import Kind, Params, floats, integers, names, objects, param
from relibra.studies.replan import ReplanForm, replan_form, simulate_in_form
from relibra.trace import RoutingTrace
from relibra.workloads import MICROBATCH_SHIFT_RANGE, WORKLOADS, WorkloadConfig

MAP_MODELS = PAPER_MODELS
# The micro-batch shift is an assumption: no public source gives micro-batch-level routing statistics of a large
# MoE. 0-0.3 (MICROBATCH_SHIFT_RANGE) is where the kit's tiny CPU RL trace sits; the map shows the sensitivity to
# SHIFT_SENSITIVITY_END beyond it, labelled as such.
SHIFT_SENSITIVITY_END = 0.7
MAP_POLICIES = ("megatron", "eplb+", "relibra", "balanced")
# The map's fields: the paper's claims (relibra.labels.PAPER_CLAIMS), each a column of every case.
RATIO_FIELDS = tuple(c.id for c in PAPER_CLAIMS)


@dataclass(frozen=True)
class ShiftAxis:
    """The micro-batch shift axis: one WorkloadConfig field and the values the map moves it over.

    field: a WorkloadConfig field name; values: its values, the kit's current value first.
    """

    field: str
    values: tuple

    def __post_init__(self):
        if self.field not in {f.name for f in dataclasses.fields(WorkloadConfig)}:
            raise ConfigError(f"shift axis: {self.field!r} is not a WorkloadConfig field")
        if not self.values:
            raise ConfigError("shift axis: no values")


@dataclass(frozen=True)
class GridSpec:
    """What the map simulates.

    name: "default" (coarse) or "paper" (whole); setup: the card the grid nodes start from (token-budget);
    tokens: tokens per EP rank per micro-batch of the nodes; shift: the ShiftAxis; models, workloads, seeds:
    every node's cases; cards: the named cards simulated as points (at their own inputs), over the same models
    (a card that publishes its model: that model only, card_scope), workloads and card_seeds; ep: the nodes'
    EP size (a card's point: the card's batch.expert_parallel); steps per trace (the last simulated);
    card_changes: (card key, value) pairs applied to every card (cut-down test grids); step_sequences: the
    step sizes (global batch, sequences) of the nodes, one facet each (empty: the setup card's own).
    """

    name: str
    tokens: tuple[int, ...]
    shift: ShiftAxis
    models: tuple[str, ...] = MAP_MODELS
    workloads: tuple[str, ...] = ("mixed", "math")
    seeds: tuple[int, ...] = (0, 1, 2)
    setup: str = DEFAULT_CARD
    cards: tuple[str, ...] | None = None  # None: every card shipped under data/setups/
    card_seeds: tuple[int, ...] | None = None  # None: seeds
    ep: int = 32
    steps: int = 3
    card_changes: tuple[tuple[str, object], ...] = ()
    step_sequences: tuple[int, ...] = ()

    def __post_init__(self):
        if not self.tokens or any(not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t <= 0
                                  for t in self.tokens):
            raise ConfigError(f"grid {self.name!r}: tokens must be positive integers, got {self.tokens!r}")
        if any(not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t <= 0 for t in self.step_sequences):
            raise ConfigError(f"grid {self.name!r}: step_sequences must be positive integers, got "
                              f"{self.step_sequences!r}")
        for key in ("models", "workloads", "seeds"):
            if not getattr(self, key):
                raise ConfigError(f"grid {self.name!r}: no {key}")

    @property
    def card_list(self) -> tuple[str, ...]:
        return tuple(card_names()) if self.cards is None else self.cards

    @property
    def shift_values(self) -> tuple:
        return self.shift.values

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "cards": list(self.card_list)}


# The micro-batch shift is the generator's explicit input WorkloadConfig.microbatch_shift, an assumption: from the
# kit's value (0: no shift beyond the sequences a micro-batch holds) to MICROBATCH_SHIFT_RANGE's 0.3, where
# qwen3-30b-a3b on the default card at EP 32 reaches the micro-batch correlations of the kit's tiny CPU RL trace
# (docs/traces.md), then SHIFT_SENSITIVITY_END (0.7) as the sensitivity beyond that range.
def default_grid(**changes) -> GridSpec:
    """The coarse grid of the default profile: 3 budgets x 3 shift values (the range's ends and the sensitivity
    end 0.7) x 3 models x (`mixed`, `math`: the paper grid's two workloads) x 3 seeds, at two step sizes: the
    default card's 1024 sequences (32 per rank) and 128 (4 per rank, as slime's Qwen3-235B recipe: 64
    sequences over 16 ranks); every card's point (both workloads, seed 0)."""
    return GridSpec(**{"name": "default", "tokens": (2048, 8192, 32768), "card_seeds": (0,),
                       "shift": ShiftAxis("microbatch_shift", (*MICROBATCH_SHIFT_RANGE, SHIFT_SENSITIVITY_END)),
                       "step_sequences": (128, 1024), **changes})


def paper_grid(**changes) -> GridSpec:
    """The whole grid: 6 budgets (1k-32k tokens per EP rank) x 4 shift values x 3 models x (`mixed`, `math`)
    x 3 seeds; every card's point on the same models, workloads and seeds."""
    shift = tuple(float(x) for x in np.round(np.linspace(*MICROBATCH_SHIFT_RANGE, 4), 6)) + (0.5, SHIFT_SENSITIVITY_END)
    return GridSpec(**{"name": "paper", "tokens": (1024, 2048, 4096, 8192, 16384, 32768),
                       "shift": ShiftAxis("microbatch_shift", shift), "step_sequences": (128, 1024), **changes})


GRIDS = {"default": default_grid, "paper": paper_grid}


# ---- the grid's axes: the parameters notebook 12 and `relibra map` share ----------------------------------
SHARES = floats(0.0, 1.0, sort=True, note=f" (an assumption: {MICROBATCH_SHIFT_RANGE[0]:g}-"
                                          f"{MICROBATCH_SHIFT_RANGE[1]:g} where the kit's tiny CPU RL trace sits, the "
                                          "default grid adds 0.7 as its sensitivity)")
# a node's tokens per EP rank per micro-batch: within the set-up card's bound on that entry (setup_schema)
TOKENS = next(b for b in BOUNDS if b.key == "batch.tokens_per_ep_rank_per_microbatch")


MODEL_NAMES = Kind("comma-separated model presets", lambda raw: tuple(
    dict.fromkeys(m.name for m in objects(get_model, "model presets").parse(raw))))


@dataclass(frozen=True)
class MapAxes(Params):
    """The grid's axes, declared once: notebook 12's parameters and `relibra map`'s flags (None: the grid's own)."""

    tokens: tuple[int, ...] | None = param(None, "tokens per EP rank per micro-batch of the grid's nodes (None: the "
                                           "profile's)", integers(int(TOKENS.low), int(TOKENS.high), sort=True),
                                           sizes="tokens")
    shift: tuple[float, ...] | None = param(None, "micro-batch shift values of the nodes (None: the profile's)",
                                            SHARES, sizes="shift_values")
    models: tuple[str, ...] | None = param(None, "model presets (None: the profile's)", MODEL_NAMES, sizes="models")
    workloads: tuple[str, ...] | None = param(None, "workloads (None: the profile's)", names(WORKLOADS, "workload"),
                                              sizes="workloads")
    seeds: tuple[int, ...] | None = param(None, "seeds (None: the profile's)", integers(0), sizes="seeds")
    step_sequences: tuple[int, ...] | None = param(
        None, "step sizes of the grid's nodes in sequences per step, one facet each (None: the profile's)",
        integers(1, 1 << 20, sort=True), sizes="step_sequences")

    def spec(self, g: GridSpec) -> GridSpec:
        """The grid `g` (a profile's, or --grid's) with these axes."""
        return dataclasses.replace(g, tokens=self.tokens, models=self.models, workloads=self.workloads,
                                   seeds=self.seeds, step_sequences=tuple(self.step_sequences),
                                   shift=dataclasses.replace(g.shift, values=tuple(self.shift)))


# The card entries a grid node moves: its tokens per EP rank per micro-batch and its step's size (sequences).
NODE_TOKENS, NODE_STEP = "batch.tokens_per_ep_rank_per_microbatch", "batch.global_batch_sequences"


def map_cases(spec: GridSpec) -> list[Case]:
    """Every case of `spec`: the grid nodes (label "grid": spec.setup with the node's tokens per EP rank, step
    size and shift value), then the card points (label "card": each card as it is); slowest first within each
    (most layers, then fewest tokens per rank: the most micro-batches), so the workers finish together."""
    layout = changed_card(spec.setup, spec.card_changes).value("batch.layout")  # an unknown card fails here
    if layout != "token-budget":
        raise ConfigError(f"verdict map: the grid's card {spec.setup!r} has layout {layout!r}; its nodes move the "
                          "token budget, so it must be token-budget")
    steps = spec.step_sequences or (None,)
    common = {"policies": MAP_POLICIES, "steps": spec.steps}
    step = {None: ()} | {g: ((NODE_STEP, int(g)),) for g in spec.step_sequences}
    grid = [Case(spec.setup, m, w, int(s), spec.ep, **common, label="grid", workload_changes=((spec.shift.field, v),),
                 card_changes=(*spec.card_changes, (NODE_TOKENS, int(t)), *step[g]))
            for g in steps for m in spec.models for w in spec.workloads for s in spec.seeds for t in spec.tokens
            for v in spec.shift.values]
    cards = []
    for c in spec.card_list:
        models, ep = card_scope(c, spec)
        cards += [Case(c, m, w, int(s), ep, **common, label="card", card_changes=spec.card_changes)
                  for m in models for w in spec.workloads for s in (spec.card_seeds or spec.seeds)]

    def cost(c: Case):
        node = dict(c.card_changes)
        return (-get_model(c.model).num_layers, -(node.get(NODE_STEP) or 0), node.get(NODE_TOKENS) or 0)

    return sorted(grid, key=cost) + sorted(cards, key=cost)


def card_scope(name: str, spec: GridSpec) -> tuple[tuple[str, ...], int]:
    """The models and EP size a card's point is simulated at (spec.card_changes applied to the card first):
    the card's model when the card publishes one (a recipe for that model), else spec.models; the card's
    batch.expert_parallel when it has one, else spec.ep."""
    card = changed_card(name, spec.card_changes)
    model, ep = card.entries.get("model.name"), card.entries.get("batch.expert_parallel")
    return ((model.value,) if model is not None and model.kind != "assumed" else spec.models,
            spec.ep if ep is None else int(ep.value))


def simulate_map_case(case: Case, shift_field: str = "microbatch_shift") -> dict:
    """One case of map_cases simulated: a dict of the case's keys, tokens_per_s of each policy, the three ratios,
    each policy's skewness, and the case's simulated position (micro_batches, mean_tokens_per_slot,
    mb_vs_step_corr and mb_corr of its trace's expert loads, relibra.analysis.shift_stats). shift_field: the
    map's shift axis (a grid node's own shift names it)."""
    field = case.workload_changes[0][0] if case.workload_changes else shift_field
    card = case.card()
    cfg = case.workload_config(card)
    # EPLB+'s re-plan interval: a card point's from the card's record (relibra replan), averaged over its cycle
    form = (replan_form(card, case.model, case.ep, MAP_POLICIES) if case.label == "card" else
            ReplanForm.at_one(MAP_POLICIES, "a grid node, not a named card"))
    trace = case.make_trace(card, cfg, steps=form.trace_steps(case.steps))
    result = simulate_in_form(trace, card.topology(), MAP_POLICIES, form, params=card.cost_params(case.ep),
                              policy_params=card.policy_params(MAP_POLICIES), progress=False, workload=case.workload)
    s = result.summary.set_index("policy")
    tps = s["tokens_per_s"]
    stats = shift_stats(trace.loads[-case.steps:].sum(axis=3, dtype=np.int64))  # the position: the case's steps
    budget = card.memory_budget(case.model, case.ep, result.per_step["busiest_expert_rows"].max())
    tokens = dict(case.card_changes)[NODE_TOKENS] if case.label == "grid" else None
    row = {"kind": case.label, "setup": card.name if case.label == "card" else case.setup, "model": case.model,
           "workload": case.workload, "seed": case.seed, "ep": case.ep, "tokens": tokens, "shift_field": field,
           "shift_value": getattr(cfg, field), "layout": cfg.batch_layout, "layers": trace.num_layers,
           "micro_batches": trace.num_microbatches, "tokens_per_ep_rank": float(trace.seq_lens[-1].sum(axis=-1).mean()),
           "step_sequences": card.value("batch.global_batch_sequences"),
           "sequences_per_rank": card.value("batch.global_batch_sequences") / card.token_ranks,
           "memory_GB": budget.total_bytes / 1e9, "hbm_GB": budget.hbm_bytes / 1e9, "feasible": bool(budget.fits),
           "mb_vs_step_corr": float(stats["mb_vs_step_corr"]), "mb_corr": float(stats["mb_corr"]),
           "relibra_over_megatron": float(tps["relibra"] / tps["megatron"]),
           "relibra_over_eplb_plus": float(tps["relibra"] / tps["eplb+"]),
           "gap_to_balanced": float(1.0 - tps["relibra"] / tps["balanced"]),
           "eplb_plus_replan_interval": form.interval("eplb+")}
    for p in MAP_POLICIES:
        row[f"tokens_per_s_{p}"] = float(tps[p])
        row[f"skewness_{p}"] = float(s.loc[p, "skewness"])
    return row


@dataclass(frozen=True)
class MapResult:
    """A simulated grid: its spec and one row per case (simulate_map_case's dicts, in map_cases' order)."""

    spec: GridSpec
    frame: pd.DataFrame

    @property
    def grid(self) -> pd.DataFrame:
        return self.frame[self.frame["kind"] == "grid"].reset_index(drop=True)

    @property
    def cards(self) -> pd.DataFrame:
        return self.frame[self.frame["kind"] == "card"].reset_index(drop=True)


def run_map(spec: GridSpec, workers: int | None = None, progress: bool = True) -> MapResult:
    """simulate_map_case over map_cases(spec) in `workers` processes (default: one per core, at most one per
    case); the rows come back in the cases' order whatever the workers' timing."""
    simulate_one = functools.partial(simulate_map_case, shift_field=spec.shift.field)
    return MapResult(spec, run_cases(simulate_one, map_cases(spec), workers, progress, desc=f"map ({spec.name})"))


# ---- the map's fields and contours -------------------------------------------------------------------
NODE_KEYS = ["step_sequences", "tokens", "shift_value"]


def node_fields(result: MapResult) -> pd.DataFrame:
    """One row per grid node (step_sequences, tokens, shift_value): for each ratio its best over the node's
    feasible cases (max for the two speed-ups, min for the gap: the paper's "up to" and "within"), mean and
    worst (NaN where no case fits in memory); the node's mean simulated position over all its cases
    (tokens_per_ep_rank, mb_vs_step_corr, micro_batches, sequences_per_rank); the case counts (cases,
    feasible_cases) and `feasible` (at least one case fits)."""
    return _case_stats(result.grid, NODE_KEYS, ("best", "mean", "worst"))


def _case_stats(frame: pd.DataFrame, keys, stats: tuple[str, ...]) -> pd.DataFrame:
    """Per group of cases (grouped by `keys`, in sorted order): the mean simulated position over every case,
    each ratio's `stats` over the feasible cases only (Claim.best: max of a speed-up, min of the gap; worst the
    other way; mean), the case counts and whether any case is feasible."""
    by = frame.groupby(keys, sort=True)
    out = by[["tokens_per_ep_rank", "mb_vs_step_corr", "micro_batches", "sequences_per_rank"]].mean()
    ok = frame[frame["feasible"].astype(bool)].groupby(keys, sort=True)
    for c in PAPER_CLAIMS:
        for stat in stats:
            out[f"{c.id}_{stat}"] = ok[c.id].agg({"best": c.best, "mean": "mean", "worst": c.worst}[stat])
    out["cases"] = by.size()
    out["feasible_cases"] = by["feasible"].sum().astype(int)
    out["feasible"] = out["feasible_cases"] > 0
    return out.reset_index()


def facets(fields: pd.DataFrame) -> list:
    """The step sizes (sequences per step) of the nodes, in order: one facet of the map each."""
    return sorted(fields["step_sequences"].unique())


def field_matrix(fields: pd.DataFrame, column: str, spec: GridSpec) -> np.ndarray:
    """A node field of one facet (fields of one step size) as float64 [len(spec.tokens), len(spec.shift.values)]
    (NaN where a node is missing or infeasible)."""
    if fields["step_sequences"].nunique() > 1:
        raise ConfigError("field_matrix: the nodes of one facet (one step_sequences) at a time")
    return fields.pivot(index="tokens", columns="shift_value", values=column).reindex(
        index=list(spec.tokens), columns=list(spec.shift.values)).to_numpy(np.float64)


def contour_points(values: np.ndarray, xs, ys, level: float) -> list[tuple[float, float]]:
    """Where a field on a rectilinear grid crosses `level`: one (x, y) point per grid edge the level
    crosses, linearly interpolated along that edge (x in log2, as the map draws tokens).

    values: float [len(xs), len(ys)]; xs: positive, increasing (tokens per EP rank); ys: increasing or not
    (the shift values, in the order the axis lists them). Nodes at exactly `level` count as crossed
    once. NaN nodes cross nothing. Returns points sorted by (x, y).
    """
    v = np.asarray(values, dtype=np.float64)
    lx = np.log2(np.asarray(xs, dtype=np.float64))
    y = np.asarray(ys, dtype=np.float64)
    if v.shape != (len(lx), len(y)):
        raise ConfigError(f"contour_points: values of shape {v.shape} do not match {len(lx)} x {len(y)} nodes")
    pts = set()
    if v.shape == (1, 1) and v[0, 0] == level:  # a single node has no edge
        pts.add((float(lx[0]), float(y[0])))
    for i, j in np.ndindex(v.shape):
        for i2, j2 in ((i + 1, j), (i, j + 1)):  # the edges to the next node along x and along y
            if i2 == len(lx) or j2 == len(y):
                continue
            a, b = v[i, j], v[i2, j2]
            pa, pb = (float(lx[i]), float(y[j])), (float(lx[i2]), float(y[j2]))
            if np.isnan(a) or np.isnan(b) or (a - level) * (b - level) > 0 or a == b:
                if a == level:
                    pts.add(pa)
                continue
            t = (level - a) / (b - a)
            pts.add((pa[0] + t * (pb[0] - pa[0]), pa[1] + t * (pb[1] - pa[1])))
    return sorted((float(2.0 ** px), float(py)) for px, py in pts)


def claim_contours(result: MapResult, fields: pd.DataFrame | None = None) -> list[dict]:
    """The paper's claims as contours of the best-over-feasible-cases fields, per facet (step size): per claim
    and level, the crossing points on the grid's axes (tokens: the node budget, shift value) and, beside each,
    the node-mean simulated tokens per EP rank and generated-trace correlation there, bilinear in (log2 tokens,
    shift value)."""
    fields = node_fields(result) if fields is None else fields
    spec = result.spec
    lx = np.log2(np.asarray(spec.tokens, dtype=np.float64))
    ys = np.asarray(spec.shift.values, dtype=np.float64)
    order = np.argsort(ys)
    out = []
    for step in facets(fields):
        facet = fields[fields["step_sequences"] == step]
        corr = field_matrix(facet, "mb_vs_step_corr", spec)[:, order]
        simulated = np.log2(field_matrix(facet, "tokens_per_ep_rank", spec)[:, order])

        def at(x: float, y: float, m: np.ndarray) -> float:
            return float(np.interp(math.log2(x), lx, np.array([np.interp(y, ys[order], row) for row in m])))

        for c in PAPER_CLAIMS:
            best = field_matrix(facet, f"{c.id}_best", spec)
            for level in [c.level] + ([c.lower] if c.lower is not None else []):
                pts = contour_points(best, spec.tokens, spec.shift.values, level)
                out.append({"claim": c.statement, "field": f"{c.id}_best", "level": level,
                            "step_sequences": int(step),
                            "points": [{"tokens": x, "shift_value": y, "tokens_per_ep_rank": 2.0 ** at(x, y, simulated),
                                        "mb_vs_step_corr": at(x, y, corr)} for x, y in pts]})
    return out


# ---- where the claims hold: facts per claim, then one line each -----------------------------------------
def claim_regions(result: MapResult, fields: pd.DataFrame | None = None) -> list[dict]:
    """Per paper claim (PAPER_CLAIMS' order): the feasible grid nodes where its best-over-cases field meets it
    (Claim.holds), its verdict ("holds": at every such node, "holds only where": at some, "does not hold": at
    none), the smallest tokens per EP rank (budget and simulated) and the largest generated-trace correlation
    among the nodes that meet it, and the best value anywhere with its node; a gap also its worst value and the
    nodes inside and below the paper's range. A node that does not fit in memory enters no statement."""
    fields = node_fields(result) if fields is None else fields
    infeasible = 0
    if "feasible" in fields:
        infeasible = int((~fields["feasible"].astype(bool)).sum())
        fields = fields[fields["feasible"].astype(bool)]
    out = []
    for c in PAPER_CLAIMS:
        col = f"{c.id}_best"
        region = {"id": c.id, "claim": c.statement, "field": col, "level": c.level, "nodes": 0,
                  "of_nodes": int(len(fields)), "infeasible_nodes": infeasible, "verdict": "does not hold",
                  "best": None, "best_tokens": None, "best_corr": None, "min_tokens": None, "max_corr": None}
        if fields.empty:
            out.append(region)
            continue
        ok = fields[col].map(c.holds)
        best = fields.loc[fields[col].idxmin() if c.is_gap else fields[col].idxmax()]
        held = fields[ok]
        region.update({"nodes": int(ok.sum()), "best": float(best[col]), "best_tokens": int(best["tokens"]),
                       "best_corr": float(best["mb_vs_step_corr"]),
                       "verdict": "holds" if ok.all() else "holds only where" if ok.any() else "does not hold",
                       "min_tokens": int(held["tokens"].min()) if len(held) else None,
                       "max_corr": float(held["mb_vs_step_corr"].max()) if len(held) else None,
                       "grid_max_corr": float(fields["mb_vs_step_corr"].max()),
                       "grid_min_tokens": int(fields["tokens"].min()),
                       "best_tokens_per_ep_rank": float(best["tokens_per_ep_rank"]),
                       "best_step_sequences": int(best["step_sequences"]) if "step_sequences" in best else None,
                       "min_tokens_per_ep_rank": float(held["tokens_per_ep_rank"].min()) if len(held) else None,
                       "grid_min_tokens_per_ep_rank": float(fields["tokens_per_ep_rank"].min())})
        if c.lower is not None:  # the paper's own range: nodes inside it, below it, and the worst gap
            region["inside_range_nodes"] = int(fields[col].map(c.inside_range).sum())
            region["below_range_nodes"] = int((fields[col] < c.lower).sum())
            region["worst"] = float(fields[f"{c.id}_worst"].max())
        out.append(region)
    return out


def card_hits(result: MapResult) -> list[dict]:
    """Per speed-up claim, the named cards whose best case reaches its level (feasible cards only, where
    the points carry a `feasible` column): {"id", "cards": [(setup, best)]}."""
    points = card_points(result)
    if points.empty:
        return []
    if "feasible" in points:
        points = points[points["feasible"].astype(bool)]
    return [{"id": c.id, "cards": [(r["setup"], float(r[f"{c.id}_best"])) for _, r in points.iterrows()
                                   if c.holds(r[f"{c.id}_best"])]} for c in PAPER_CLAIMS if not c.is_gap]


def conclusion_lines(result: MapResult, fields: pd.DataFrame | None = None) -> list[str]:
    """The map's answer, one line per paper claim (relibra.labels.verdict_line), each with the named cards that
    reach it."""
    hits = {h["id"]: h["cards"] for h in card_hits(result)}
    return [verdict_line(r, hits.get(r["id"], ())) for r in claim_regions(result, fields)]


def conclusion(result: MapResult, fields: pd.DataFrame | None = None, lines: list[str] | None = None) -> str:
    """The map's answer as one text: its scope, then `lines` (default: conclusion_lines) joined, then the cards
    that do not fit in memory."""
    spec = result.spec
    scope = (f"On the {spec.name} grid ({len(spec.models)} models x {len(spec.workloads)} workloads x "
             f"{len(spec.seeds)} seeds at full scale, {min(spec.tokens)}-{max(spec.tokens)} tokens per EP rank, "
             f"{spec.shift.field} {', '.join(map(str, spec.shift.values))}): ")
    text = scope + "; ".join(conclusion_lines(result, fields) if lines is None else lines)
    points = card_points(result)
    if not points.empty:
        out = ~points["feasible"].astype(bool)
        if out.any():
            text += "; cards that do not fit in memory (left out): " + ", ".join(points.loc[out, "setup"])
    return text + "."


def card_points(result: MapResult) -> pd.DataFrame:
    """One row per named card (over its cases, in the cards' order): mean simulated position
    (tokens_per_ep_rank, mb_vs_step_corr, sequences_per_rank), the mean, best and worst of each ratio over its
    feasible cases (NaN where none fits), the case counts and `feasible`."""
    c = result.cards
    if c.empty:
        return pd.DataFrame()
    order = list(dict.fromkeys(c["setup"]))
    out = _case_stats(c, ["setup"], ("mean", "best", "worst"))
    if "memory_GB" in c:  # the busiest GPU over the card's cases (rows of simulate_map_case carry it)
        memory = c.groupby("setup")[["memory_GB", "hbm_GB"]].max()
        out = out.join(memory, on="setup")
    if "eplb_plus_replan_interval" in c:  # EPLB+'s k over the card's cases (relibra replan's record)
        out = out.join(c.groupby("setup")["eplb_plus_replan_interval"].max(), on="setup")
    return out.set_index("setup").loc[order].reset_index()


def merge_coincident(cards: pd.DataFrame) -> pd.DataFrame:
    """card_points with the cards whose points coincide (same position and mean ratios to 3 digits, e.g. two
    cards that set the same batch) as one row, named together ("a = b")."""
    if cards.empty:
        return cards
    cols = ["tokens_per_ep_rank", "mb_vs_step_corr"] + [f"{f}_mean" for f in RATIO_FIELDS]
    key = cards[cols].round(3).astype(str).agg("|".join, axis=1)
    if "feasible" in cards:
        key = key + "|" + cards["feasible"].astype(str)
    out = cards.groupby(key, sort=False).first()
    out["setup"] = cards.groupby(key, sort=False)["setup"].agg(" = ".join)
    return out.reset_index(drop=True)


def map_json(result: MapResult) -> dict:
    """The whole map as plain JSON: spec, every case's row, the node fields, the claims' contours and regions,
    the card points and the conclusion. Marked simulated."""
    fields = node_fields(result)
    lines = conclusion_lines(result, fields)
    return json_safe({"source": "simulated", "grid": result.spec.to_dict(), "cases": result.frame.to_dict("records"),
                      "nodes": fields.to_dict("records"), "contours": claim_contours(result, fields),
                      "regions": claim_regions(result, fields), "card_points": card_points(result).to_dict("records"),
                      "conclusion": conclusion(result, fields, lines), "verdict": lines})


def contour_table(contours: list[dict]) -> pd.DataFrame:
    """claim_contours as one row per (claim, facet, crossing point; tokens: the node budget axis, interpolated);
    a claim that crosses nowhere in a facet keeps one row of NaN positions, so every claim is in the table."""
    empty = {"tokens": np.nan, "shift_value": np.nan, "tokens_per_ep_rank": np.nan, "mb_vs_step_corr": np.nan}
    return pd.DataFrame([{"claim": c["claim"], "field": c["field"], "level": c["level"],
                          "step_sequences": c["step_sequences"], **pt} for c in contours
                         for pt in (c["points"] or [empty])])


def rl_calibration(path=DEFAULT_RL_TRACE) -> dict:
    """The kit's real RL trace's micro-batch statistics (relibra.analysis.microbatch_calibration), the
    calibration the micro-batch shift's range comes from; {} when the trace is not shipped."""
    return ({"label": "the kit's real RL trace (relibra rl, data/rl_tiny_seed0.npz)",
             **microbatch_calibration(RoutingTrace.load(path))} if path.exists() else {})
