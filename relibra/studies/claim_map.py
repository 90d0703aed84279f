"""The verdict as a map: ReLibra / Megatron, ReLibra / EPLB+ and the gap to Balanced over the two inputs no
source fixes, tokens per EP rank per micro-batch and the micro-batch shift, one facet per step size; each named
card a point at its simulated position. Every case is full scale, its last of `steps` steps simulated (as the
headline), and carries its memory verdict (SetupCard.memory_budget): a case that does not fit in HBM enters no
best, mean or worst of the map."""

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

# The micro-batch shift is an assumption: no public source gives micro-batch-level routing statistics of a large
# MoE. 0-0.3 (MICROBATCH_SHIFT_RANGE) is where qwen3-30b-a3b on the default card at EP 32 reaches the micro-batch
# correlations of the kit's tiny CPU RL trace (docs/traces.md); the map shows the sensitivity to
# SHIFT_SENSITIVITY_END beyond it, labelled as such.
SHIFT_SENSITIVITY_END = 0.7
MAP_POLICIES = ("megatron", "eplb+", "relibra", "balanced")


@dataclass(frozen=True)
class ShiftAxis:
    """The micro-batch shift axis: a WorkloadConfig field and its values, the kit's current value first."""

    field: str
    values: tuple

    def __post_init__(self):
        if self.field not in {f.name for f in dataclasses.fields(WorkloadConfig)}:
            raise ConfigError(f"shift axis: {self.field!r} is not a WorkloadConfig field")
        if not self.values:
            raise ConfigError("shift axis: no values")


@dataclass(frozen=True)
class GridSpec:
    """What the map simulates: every (step size, model, workload, seed, tokens, shift value) node on `setup` at
    EP `ep`, then each of `cards` (None: every shipped card) as a point at its own inputs (its model where it
    publishes one, its batch.expert_parallel if set) over card_seeds (None: seeds). card_changes: (card key,
    value) pairs applied to every card (cut-down grids); step_sequences: one facet each (empty: the setup's)."""

    name: str
    tokens: tuple[int, ...]
    shift: ShiftAxis
    models: tuple[str, ...] = PAPER_MODELS
    workloads: tuple[str, ...] = ("mixed", "math")
    seeds: tuple[int, ...] = (0, 1, 2)
    setup: str = DEFAULT_CARD
    cards: tuple[str, ...] | None = None
    card_seeds: tuple[int, ...] | None = None
    ep: int = 32
    steps: int = 3
    card_changes: tuple[tuple[str, object], ...] = ()
    step_sequences: tuple[int, ...] = ()

    def __post_init__(self):
        for key in ("tokens", "models", "workloads", "seeds"):
            if not getattr(self, key):
                raise ConfigError(f"grid {self.name!r}: no {key}")
        for key in ("tokens", "step_sequences"):
            if any(not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t <= 0 for t in getattr(self, key)):
                raise ConfigError(f"grid {self.name!r}: {key} must be positive integers, got {getattr(self, key)!r}")

    @property
    def card_list(self) -> tuple[str, ...]:
        return tuple(card_names()) if self.cards is None else self.cards

    @property
    def shift_values(self) -> tuple:
        return self.shift.values

    def describe(self) -> str:
        """The grid's size in words (notebook 12's scale note, the map's conclusion)."""
        steps = (f" x {len(self.step_sequences)} step sizes ({', '.join(map(str, self.step_sequences))} sequences)"
                 if self.step_sequences else "")
        return (f"{len(self.models)} models x {len(self.workloads)} workloads x {len(self.seeds)} seeds "
                f"({', '.join(map(str, self.seeds))}), {len(self.tokens)} budgets x {len(self.shift.values)} shift "
                f"values{steps}")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "cards": list(self.card_list)}


def default_grid(**changes) -> GridSpec:
    """The default profile's coarse grid: 3 budgets x the shift range's ends and its sensitivity end x 3 models x
    (mixed, math) x 3 seeds, at two step sizes: the default card's 1024 sequences (32 per rank) and 128 (4 per
    rank, as slime's Qwen3-235B recipe: 64 sequences over 16 ranks); card points at seed 0."""
    return GridSpec(**{"name": "default", "tokens": (2048, 8192, 32768), "card_seeds": (0,),
                       "shift": ShiftAxis("microbatch_shift", (*MICROBATCH_SHIFT_RANGE, SHIFT_SENSITIVITY_END)),
                       "step_sequences": (128, 1024), **changes})


def paper_grid(**changes) -> GridSpec:
    """The whole grid: 6 budgets (1k-32k) x 6 shift values x 3 models x (mixed, math) x 3 seeds x 2 step sizes."""
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
    """The grid nodes (label "grid"), then the card points (label "card"); slowest first within each (most
    layers, then the most micro-batches), so the workers finish together."""
    layout = changed_card(spec.setup, spec.card_changes).value("batch.layout")  # an unknown card fails here
    if layout != "token-budget":
        raise ConfigError(f"verdict map: the grid's card {spec.setup!r} has layout {layout!r}; its nodes move the "
                          "token budget, so it must be token-budget")
    common = {"policies": MAP_POLICIES, "steps": spec.steps}
    step = {None: ()} | {g: ((NODE_STEP, int(g)),) for g in spec.step_sequences}
    grid = [Case(spec.setup, m, w, int(s), spec.ep, **common, label="grid", workload_changes=((spec.shift.field, v),),
                 card_changes=(*spec.card_changes, (NODE_TOKENS, int(t)), *step[g]))
            for g in spec.step_sequences or (None,) for m in spec.models for w in spec.workloads for s in spec.seeds
            for t in spec.tokens for v in spec.shift.values]
    cards = []
    for name in spec.card_list:  # a card that publishes its model: that model only; its own EP where it sets one
        card = changed_card(name, spec.card_changes)
        model, ep = card.entries.get("model.name"), card.entries.get("batch.expert_parallel")
        models = (model.value,) if model is not None and model.kind != "assumed" else spec.models
        cards += [Case(name, m, w, int(s), spec.ep if ep is None else int(ep.value), **common, label="card",
                       card_changes=spec.card_changes)
                  for m in models for w in spec.workloads for s in (spec.card_seeds or spec.seeds)]

    def cost(c: Case):
        node = dict(c.card_changes)
        return (-get_model(c.model).num_layers, -(node.get(NODE_STEP) or 0), node.get(NODE_TOKENS) or 0)

    return sorted(grid, key=cost) + sorted(cards, key=cost)


def simulate_map_case(case: Case, shift_field: str = "microbatch_shift") -> dict:
    """One case simulated: its keys, each policy's tokens_per_s and skewness, the three ratios, its memory
    verdict and its simulated position (relibra.analysis.shift_stats of its trace's expert loads). shift_field:
    the map's shift axis (a grid node's own shift names it)."""
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
           **{c.id: float(c.of(tps)) for c in PAPER_CLAIMS},
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
    """simulate_map_case over map_cases(spec) in `workers` processes (default: one per core, at most one per case)."""
    simulate_one = functools.partial(simulate_map_case, shift_field=spec.shift.field)
    return MapResult(spec, run_cases(simulate_one, map_cases(spec), workers, progress, desc=f"map ({spec.name})"))


# ---- the map's fields and contours -------------------------------------------------------------------
def node_fields(result: MapResult) -> pd.DataFrame:
    """One row per grid node (step_sequences, tokens, shift_value): _case_stats' best, mean and worst."""
    return _case_stats(result.grid, ["step_sequences", "tokens", "shift_value"], ("best", "mean", "worst"))


def _case_stats(frame: pd.DataFrame, keys, stats: tuple[str, ...]) -> pd.DataFrame:
    """Per group of cases (by `keys`, sorted): the mean simulated position over every case; each ratio's `stats`
    over the feasible cases only (NaN where none fits; Claim.best: max of a speed-up, min of the gap, the paper's
    "up to" and "within"); the counts `cases`, `feasible_cases` and `feasible` (at least one case fits)."""
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


def contour_points(values: np.ndarray, xs, ys, level: float) -> list[tuple[float, float]]:
    """Where a field on a rectilinear grid crosses `level`: one (x, y) per grid edge it crosses, linear along
    the edge in (log2 x, y), sorted. values: [len(xs), len(ys)]; xs positive and increasing, ys in any order.
    A node at exactly `level` counts once; NaN nodes cross nothing."""
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
    """Per facet (step size), claim and level: where the best-over-feasible-cases field crosses it on the grid's
    axes (tokens, shift_value), each point with the node-mean simulated tokens per EP rank and generated-trace
    correlation there, bilinear in (log2 tokens, shift value)."""
    fields = node_fields(result) if fields is None else fields
    # the axes ascending whatever order the spec lists them in: a contour joins neighbouring nodes
    tokens, shifts = sorted(result.spec.tokens), sorted(result.spec.shift.values)
    lx, ys = np.log2(np.asarray(tokens, dtype=np.float64)), np.asarray(shifts, dtype=np.float64)
    out = []
    for step in sorted(fields["step_sequences"].unique()):
        facet = fields[fields["step_sequences"] == step]

        def matrix(column: str) -> np.ndarray:  # [tokens, shift values] ascending, NaN where missing
            return facet.pivot(index="tokens", columns="shift_value", values=column).reindex(
                index=tokens, columns=shifts).to_numpy(np.float64)

        corr = matrix("mb_vs_step_corr")
        simulated = np.log2(matrix("tokens_per_ep_rank"))

        def at(x: float, y: float, m: np.ndarray) -> float:
            return float(np.interp(math.log2(x), lx, np.array([np.interp(y, ys, row) for row in m])))

        for c in PAPER_CLAIMS:
            best = matrix(f"{c.id}_best")
            for level in [c.level] + ([c.lower] if c.lower is not None else []):
                pts = contour_points(best, tokens, shifts, level)
                out.append({"claim": c.statement, "field": f"{c.id}_best", "level": level,
                            "step_sequences": int(step),
                            "points": [{"tokens": x, "shift_value": y, "tokens_per_ep_rank": 2.0 ** at(x, y, simulated),
                                        "mb_vs_step_corr": at(x, y, corr)} for x, y in pts]})
    return out


# ---- where the claims hold: facts per claim, then one line each -----------------------------------------
def claim_regions(result: MapResult, fields: pd.DataFrame | None = None) -> list[dict]:
    """Per paper claim, facts over the feasible nodes (an infeasible one enters none): how many meet its
    best-over-cases field (Claim.holds) and the verdict (holds at all / only where / does not hold); the best
    value and its node; _extent of the nodes that meet it and (grid_...) of all; a gap also its worst value and
    the nodes inside / below the paper's range."""
    fields = node_fields(result) if fields is None else fields
    fits = fields["feasible"].astype(bool)
    infeasible, fields = int((~fits).sum()), fields[fits]
    out = []
    for c in PAPER_CLAIMS:
        col = f"{c.id}_best"
        region = {"id": c.id, "claim": c.statement, "field": col, "level": c.level, "nodes": 0,
                  "of_nodes": int(len(fields)), "infeasible_nodes": infeasible, "verdict": "does not hold",
                  **dict.fromkeys(("best", "best_tokens", "best_corr", "min_tokens", "max_corr"))}
        out.append(region)
        if fields.empty:
            continue
        ok = fields[col].map(c.holds)
        best = fields.loc[fields[col].idxmin() if c.is_gap else fields[col].idxmax()]
        region.update({"nodes": int(ok.sum()), "best": float(best[col]), "best_tokens": int(best["tokens"]),
                       "best_corr": float(best["mb_vs_step_corr"]),
                       "verdict": "holds" if ok.all() else "holds only where" if ok.any() else "does not hold",
                       "best_tokens_per_ep_rank": float(best["tokens_per_ep_rank"]),
                       "best_step_sequences": int(best["step_sequences"]),
                       **_extent(fields[ok]), **{f"grid_{k}": v for k, v in _extent(fields).items()}})
        if c.lower is not None:  # the paper's own range: nodes inside it, below it, and the worst gap
            region["inside_range_nodes"] = int(fields[col].map(c.inside_range).sum())
            region["below_range_nodes"] = int((fields[col] < c.lower).sum())
            region["worst"] = float(fields[f"{c.id}_worst"].max())
    return out


def _extent(nodes: pd.DataFrame) -> dict:
    """The smallest tokens per EP rank (budget, simulated) and the largest correlation of `nodes` (None: none)."""
    if nodes.empty:
        return dict.fromkeys(("min_tokens", "max_corr", "min_tokens_per_ep_rank"))
    return {"min_tokens": int(nodes["tokens"].min()), "max_corr": float(nodes["mb_vs_step_corr"].max()),
            "min_tokens_per_ep_rank": float(nodes["tokens_per_ep_rank"].min())}


def card_hits(result: MapResult) -> list[dict]:
    """Per speed-up claim, the feasible named cards whose best case reaches it: {"id", "cards": [(setup, best)]}."""
    points = card_points(result)
    if points.empty:
        return []
    points = points[points["feasible"].astype(bool)]
    return [{"id": c.id, "cards": [(r["setup"], float(r[f"{c.id}_best"])) for _, r in points.iterrows()
                                   if c.holds(r[f"{c.id}_best"])]} for c in PAPER_CLAIMS if not c.is_gap]


def conclusion_lines(result: MapResult, fields: pd.DataFrame | None = None) -> list[str]:
    """The map's answer: per paper claim its region rendered by relibra.labels.verdict_line, with the cards."""
    hits = {h["id"]: h["cards"] for h in card_hits(result)}
    return [verdict_line(r, hits.get(r["id"], ())) for r in claim_regions(result, fields)]


def card_points(result: MapResult) -> pd.DataFrame:
    """One row per named card, in the cards' order: _case_stats' mean, best and worst over its cases, its
    busiest GPU's memory_GB of hbm_GB and EPLB+'s re-plan interval (where the rows carry them)."""
    c = result.cards
    if c.empty:
        return pd.DataFrame()
    out = _case_stats(c, ["setup"], ("mean", "best", "worst"))
    out = out.join(c.groupby("setup")[[k for k in ("memory_GB", "hbm_GB", "eplb_plus_replan_interval") if k in c]]
                   .max(), on="setup")
    return out.set_index("setup").loc[list(dict.fromkeys(c["setup"]))].reset_index()


def merge_coincident(cards: pd.DataFrame) -> pd.DataFrame:
    """card_points with the cards whose points coincide (position, mean ratios to 3 digits and feasible; e.g. two
    cards that set the same batch) as one row, named together ("a = b")."""
    if cards.empty:
        return cards
    cols = ["tokens_per_ep_rank", "mb_vs_step_corr", *(f"{c.id}_mean" for c in PAPER_CLAIMS), "feasible"]
    key = cards[cols].round(3).astype(str).agg("|".join, axis=1)
    out = cards.groupby(key, sort=False).first()
    out["setup"] = cards.groupby(key, sort=False)["setup"].agg(" = ".join)
    return out.reset_index(drop=True)


def map_json(result: MapResult) -> dict:
    """The whole map as plain JSON, marked simulated: spec, cases, node fields, the claims' contours and regions,
    card points, the verdict lines and the conclusion (them joined, with the cards that do not fit in memory)."""
    fields, points, spec = node_fields(result), card_points(result), result.spec
    lines = conclusion_lines(result, fields)
    left_out = list(points.loc[~points["feasible"].astype(bool), "setup"]) if len(points) else []
    conclusion = (f"On the {spec.name} grid ({spec.describe()}): " + "; ".join(lines)
                  + ("; cards that do not fit in memory (left out): " + ", ".join(left_out) if left_out else "") + ".")
    return json_safe({"source": "simulated", "grid": spec.to_dict(), "cases": result.frame.to_dict("records"),
                      "nodes": fields.to_dict("records"), "contours": claim_contours(result, fields),
                      "regions": claim_regions(result, fields), "card_points": points.to_dict("records"),
                      "conclusion": conclusion, "verdict": lines})


def contour_table(contours: list[dict]) -> pd.DataFrame:
    """claim_contours as one row per (claim, facet, crossing point); a claim that crosses nowhere in a facet
    keeps one row of NaN positions, so every claim is in the table."""
    empty = {"tokens": np.nan, "shift_value": np.nan, "tokens_per_ep_rank": np.nan, "mb_vs_step_corr": np.nan}
    return pd.DataFrame([{"claim": c["claim"], "field": c["field"], "level": c["level"],
                          "step_sequences": c["step_sequences"], **pt} for c in contours
                         for pt in (c["points"] or [empty])])


def rl_calibration(path=DEFAULT_RL_TRACE) -> dict:
    """The kit's real RL trace's micro-batch statistics (relibra.analysis.microbatch_calibration), where the
    shift's range comes from; {} when the trace is not shipped."""
    return ({"label": "the kit's real RL trace (relibra rl, data/rl_tiny_seed0.npz)",
             **microbatch_calibration(RoutingTrace.load(path))} if path.exists() else {})
