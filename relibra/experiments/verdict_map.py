"""The verdict as a map: ReLibra / Megatron, ReLibra / EPLB+ and the gap to Balanced over the two inputs no
source fixes, tokens per EP rank per micro-batch and the micro-batch shift of the routing.

A grid (GridSpec) is every (tokens per EP rank, shift value) node x model x workload x seed at full scale
(every MoE layer, every micro-batch of the set-up card's batch), on the card's token-budget layout with its
budget replaced by the node's tokens; the shift is one WorkloadConfig field (ShiftAxis) moved over its
values, everything else the card's. Each named card is also a point: simulated as the card says, its
position the tokens per EP rank and the micro-batch-vs-step load correlation its trace measures. Every
case is one trace of `steps` steps with its last step simulated (relibra.sim.simulate, as the headline
does), so a card's point at the card's own inputs is the headline's case. `run_map` simulates a grid,
`node_fields` / `card_points` summarise it, `claim_contours` / `claim_regions` / `conclusion` say where the
paper's claims hold, `map_json` is all of it for `relibra map`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from relibra.analysis import microbatch_calibration, shift_stats
from relibra.cluster import get_model
from relibra.display import json_safe
from relibra.errors import ConfigError
from relibra.pool import map_in_order
from relibra.rl.capture import DEFAULT_RL_TRACE
from relibra.setups import DEFAULT_CARD, card_names, load_card
from relibra.sim import simulate
from relibra.trace import RoutingTrace
from relibra.workloads import MICROBATCH_SHIFT_RANGE, WorkloadConfig, generate_trace

MAP_MODELS = ("qwen3-30b-a3b", "glm-4.5-air", "qwen3-235b-a22b")
MAP_POLICIES = ("megatron", "eplb+", "relibra", "balanced")
# The paper's claims (abstract) as levels of the map's fields.
CLAIMS = (
    {"claim": "up to 1.6x over Megatron-LM", "field": "relibra_over_megatron", "level": 1.6, "holds": "at least"},
    {"claim": "up to 1.2x over EPLB+ (oracle loads)", "field": "relibra_over_eplb_plus", "level": 1.2,
     "holds": "at least"},
    {"claim": "within 6-10% of Balanced", "field": "gap_to_balanced", "level": 0.10, "holds": "at most",
     "lower": 0.06},
)
RATIO_FIELDS = ("relibra_over_megatron", "relibra_over_eplb_plus", "gap_to_balanced")


@dataclass(frozen=True)
class ShiftAxis:
    """The micro-batch shift axis: one WorkloadConfig field and the values the map moves it over.

    field: a WorkloadConfig field name; values: its values, the kit's current value first.
    """

    field: str
    values: tuple

    def __post_init__(self):
        names = {f.name for f in dataclasses.fields(WorkloadConfig)}
        if self.field not in names:
            raise ConfigError(f"shift axis: {self.field!r} is not a WorkloadConfig field")
        if not self.values:
            raise ConfigError("shift axis: no values")


# The micro-batch shift is the generator's explicit input WorkloadConfig.microbatch_shift, from the kit's value
# (0: no shift beyond the sequences a micro-batch holds) to the sharpest the routing data support
# (MICROBATCH_SHIFT_RANGE: 0.3, where qwen3-30b-a3b on the default card at EP 32 reaches the micro-batch
# correlations of the kit's real RL trace; docs/traces.md).
_SHIFT_LOW, _SHIFT_HIGH = MICROBATCH_SHIFT_RANGE
DEFAULT_SHIFT = ShiftAxis("microbatch_shift", (_SHIFT_LOW, _SHIFT_HIGH))
PAPER_SHIFT = ShiftAxis("microbatch_shift", tuple(float(x) for x in np.round(np.linspace(_SHIFT_LOW, _SHIFT_HIGH, 4), 6)))


@dataclass(frozen=True)
class GridSpec:
    """What the map simulates.

    name: "default" (coarse) or "paper" (whole); setup: the card the grid nodes start from (token-budget);
    tokens: tokens per EP rank per micro-batch of the nodes; shift: the ShiftAxis; models, workloads, seeds:
    every node's cases; cards: the named cards simulated as points (at their own inputs), over card_models
    (a card that publishes its model: that model only, card_scope), card_workloads and card_seeds; ep: the
    nodes' EP size (a card's point: the card's batch.expert_parallel); steps per trace (the last
    simulated); card_changes: (card key, value)
    pairs applied to every card (cut-down test grids); policies simulated (megatron, eplb+, relibra and
    balanced at least).
    """

    name: str
    tokens: tuple[int, ...]
    shift: ShiftAxis
    models: tuple[str, ...] = MAP_MODELS
    workloads: tuple[str, ...] = ("mixed", "math")
    seeds: tuple[int, ...] = (0, 1, 2)
    setup: str = DEFAULT_CARD
    cards: tuple[str, ...] | None = None  # None: every card shipped under data/setups/
    card_models: tuple[str, ...] | None = None  # None: models
    card_workloads: tuple[str, ...] | None = None  # None: workloads
    card_seeds: tuple[int, ...] | None = None  # None: seeds
    ep: int = 32
    steps: int = 3
    card_changes: tuple[tuple[str, object], ...] = ()
    policies: tuple[str, ...] = MAP_POLICIES

    def __post_init__(self):
        missing = set(MAP_POLICIES) - set(self.policies)
        if missing:
            raise ConfigError(f"grid {self.name!r}: policies must include {', '.join(sorted(missing))}")
        if not self.tokens or any(not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t <= 0
                                  for t in self.tokens):
            raise ConfigError(f"grid {self.name!r}: tokens must be positive integers, got {self.tokens!r}")
        for key in ("models", "workloads", "seeds"):
            if not getattr(self, key):
                raise ConfigError(f"grid {self.name!r}: no {key}")

    @property
    def card_list(self) -> tuple[str, ...]:
        return tuple(card_names()) if self.cards is None else self.cards

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["cards"] = list(self.card_list)
        return d


def default_grid(**changes) -> GridSpec:
    """The coarse grid of the default profile: 3 budgets x 2 shift values (the range's ends) x 3 models x
    (`mixed`, `math`: the paper grid's two workloads) x 3 seeds; every card's point (both workloads, seed 0)."""
    spec = GridSpec("default", tokens=(2048, 8192, 32768), shift=DEFAULT_SHIFT, workloads=("mixed", "math"),
                    card_seeds=(0,))
    return dataclasses.replace(spec, **changes)


def paper_grid(**changes) -> GridSpec:
    """The whole grid: 6 budgets (1k-32k tokens per EP rank) x 4 shift values x 3 models x (`mixed`, `math`)
    x 3 seeds; every card's point on the same models, workloads and seeds."""
    spec = GridSpec("paper", tokens=(1024, 2048, 4096, 8192, 16384, 32768), shift=PAPER_SHIFT)
    return dataclasses.replace(spec, **changes)


GRIDS = {"default": default_grid, "paper": paper_grid}


@dataclass(frozen=True)
class MapCase:
    """One simulated case: a grid node (kind "grid": the spec's card at `tokens` and `shift_value`) or a
    card's point (kind "card": `setup` as it is, tokens and shift_value None)."""

    kind: str
    setup: str
    model: str
    workload: str
    seed: int
    tokens: int | None
    shift_field: str
    shift_value: object
    ep: int = 32
    steps: int = 3
    card_changes: tuple[tuple[str, object], ...] = ()
    policies: tuple[str, ...] = MAP_POLICIES


def map_cases(spec: GridSpec) -> list[MapCase]:
    """Every case of `spec`: the grid nodes, then the card points; slowest first within each (most
    layers, then fewest tokens per rank: the most micro-batches), so the workers finish together."""
    load_card(spec.setup)  # an unknown card fails here, before any work
    common = dict(shift_field=spec.shift.field, ep=spec.ep, steps=spec.steps, card_changes=spec.card_changes,
                  policies=spec.policies)
    grid = [MapCase("grid", spec.setup, m, w, int(s), int(t), shift_value=v, **common)
            for m in spec.models for w in spec.workloads for s in spec.seeds for t in spec.tokens
            for v in spec.shift.values]
    cards = []
    for c in spec.card_list:
        models, ep = card_scope(c, spec.card_models or spec.models, spec.ep, spec.card_changes)
        cards += [MapCase("card", c, m, w, int(s), None, shift_value=None, **{**common, "ep": ep})
                  for m in models for w in (spec.card_workloads or spec.workloads) for s in (spec.card_seeds or spec.seeds)]

    def cost(c: MapCase):
        return (-get_model(c.model).num_layers, c.tokens or 0)

    return sorted(grid, key=cost) + sorted(cards, key=cost)


def _card_at_tokens(card, tokens: int):
    """The card with its tokens per EP rank per micro-batch at `tokens` (token-budget layout only)."""
    if card.value("batch.layout") != "token-budget":
        raise ConfigError(f"verdict map: the grid's card {card.name!r} has layout {card.value('batch.layout')!r}; "
                          f"its nodes move the token budget, so it must be token-budget")
    return card.with_values("verdict map: tokens per EP rank per micro-batch",
                            batch__tokens_per_ep_rank_per_microbatch=int(tokens))


def _card(name: str, changes: tuple[tuple[str, object], ...] = ()):
    card = load_card(name)
    if changes:
        card = card.with_values("verdict map: card changes", **{k.replace(".", "__"): v for k, v in changes})
    return card


def card_scope(name: str, models: tuple[str, ...], ep: int, changes: tuple[tuple[str, object], ...] = ()
               ) -> tuple[tuple[str, ...], int]:
    """The models and EP size a card's point is simulated at: the card's model when the card publishes one
    (a recipe for that model), else `models`; the card's batch.expert_parallel when it has one, else `ep`.
    changes: (card key, value) pairs applied to the card first."""
    card = _card(name, changes)
    entry = card.entries.get("model.name")
    own_models = (entry.value,) if entry is not None and entry.kind != "assumed" else models
    return own_models, int(card.entries["batch.expert_parallel"].value) if "batch.expert_parallel" in card.entries \
        else ep


def simulate_map_case(case: MapCase) -> dict:
    """One case simulated: a dict of the case's keys, tokens_per_s of each policy, the three ratios, each
    policy's skewness, and the case's measured position (micro_batches, mean_tokens_per_slot,
    mb_vs_step_corr and mb_corr of its trace's expert loads, relibra.analysis.shift_stats)."""
    card = _card(case.setup, case.card_changes)
    if case.tokens is not None:
        card = _card_at_tokens(card, case.tokens)
    cfg = card.workload_config()
    if case.shift_value is not None:
        cfg = dataclasses.replace(cfg, **{case.shift_field: case.shift_value})
    model = get_model(case.model)
    trace = generate_trace(model, case.workload, case.ep, steps=case.steps, seed=case.seed,
                           micro_batches=card.micro_batches, config=cfg)
    result = simulate(trace, card.topology(), list(case.policies), steps=1, params=card.cost_params(case.ep),
                      policy_params=card.policy_params(case.policies), progress=False, workload=case.workload)
    s = result.summary.set_index("policy")
    tps = s["tokens_per_s"]
    stats = shift_stats(trace.loads.sum(axis=3, dtype=np.int64))
    slot_tokens = trace.seq_lens[-1].sum(axis=-1)
    row = {"kind": case.kind, "setup": card.name if case.kind == "card" else case.setup, "model": case.model,
           "workload": case.workload, "seed": case.seed, "ep": case.ep, "tokens": case.tokens,
           "shift_field": case.shift_field,
           "shift_value": getattr(cfg, case.shift_field), "layout": cfg.batch_layout,
           "layers": trace.num_layers, "micro_batches": trace.num_microbatches,
           "tokens_per_ep_rank": float(slot_tokens.mean()), "mb_vs_step_corr": float(stats["mb_vs_step_corr"]),
           "mb_corr": float(stats["mb_corr"]),
           "relibra_over_megatron": float(tps["relibra"] / tps["megatron"]),
           "relibra_over_eplb_plus": float(tps["relibra"] / tps["eplb+"]),
           "gap_to_balanced": float(1.0 - tps["relibra"] / tps["balanced"])}
    for p in case.policies:
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


def run_map(spec: GridSpec, workers: int | None = None, progress: bool = True, cases: list[MapCase] | None = None
            ) -> MapResult:
    """simulate_map_case over map_cases(spec) (or `cases`) in `workers` processes (default: one per core, at
    most one per case); the rows come back in the cases' order whatever the workers' timing."""
    cases = map_cases(spec) if cases is None else cases
    rows = map_in_order(simulate_map_case, cases, workers, progress, desc=f"map ({spec.name})")
    return MapResult(spec, pd.DataFrame(rows))


# ---- the map's fields and contours -------------------------------------------------------------------
def node_fields(result: MapResult) -> pd.DataFrame:
    """One row per grid node (tokens, shift_value): for each ratio its best over the node's cases (max for
    the two speed-ups, min for the gap: the paper's "up to" and "within"), mean and worst; the node's mean
    measured position (tokens_per_ep_rank, mb_vs_step_corr, micro_batches); the case count."""
    g = result.grid
    if g.empty:
        raise ConfigError("verdict map: the result holds no grid nodes")
    return _case_stats(g.groupby(["tokens", "shift_value"], sort=True), ("best", "mean", "worst"))


def _case_stats(by, stats: tuple[str, ...]) -> pd.DataFrame:
    """Per group of cases: the mean measured position, each ratio's `stats` (best: max of a speed-up, min of
    the gap; worst the other way; mean) and the case count."""
    out = by[["tokens_per_ep_rank", "mb_vs_step_corr", "micro_batches"]].mean()
    for f in RATIO_FIELDS:
        best, worst = ("min", "max") if f == "gap_to_balanced" else ("max", "min")
        for stat in stats:
            out[f"{f}_{stat}"] = by[f].agg({"best": best, "mean": "mean", "worst": worst}[stat])
    out["cases"] = by.size()
    return out.reset_index()


def field_matrix(fields: pd.DataFrame, column: str, spec: GridSpec) -> np.ndarray:
    """A node field as float64 [len(spec.tokens), len(spec.shift.values)] (NaN where a node is missing)."""
    m = np.full((len(spec.tokens), len(spec.shift.values)), np.nan)
    ti = {t: i for i, t in enumerate(spec.tokens)}
    si = {v: j for j, v in enumerate(spec.shift.values)}
    for _, r in fields.iterrows():
        if r["tokens"] in ti and r["shift_value"] in si:
            m[ti[r["tokens"]], si[r["shift_value"]]] = r[column]
    return m


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

    def edge(a, b, pa, pb):
        if np.isnan(a) or np.isnan(b) or (a - level) * (b - level) > 0 or a == b:
            if a == level:
                pts.add(pa)
            return
        t = (level - a) / (b - a)
        pts.add((pa[0] + t * (pb[0] - pa[0]), pa[1] + t * (pb[1] - pa[1])))

    for i in range(len(lx)):
        for j in range(len(y)):
            here = (float(lx[i]), float(y[j]))
            if i + 1 < len(lx):
                edge(v[i, j], v[i + 1, j], here, (float(lx[i + 1]), float(y[j])))
            if j + 1 < len(y):
                edge(v[i, j], v[i, j + 1], here, (float(lx[i]), float(y[j + 1])))
            if len(lx) == 1 and len(y) == 1 and v[i, j] == level:
                pts.add(here)
    return sorted((float(2.0 ** px), float(py)) for px, py in pts)


def claim_contours(result: MapResult, fields: pd.DataFrame | None = None) -> list[dict]:
    """The paper's claims as contours of the best-over-cases fields: per claim and level, the crossing points
    (tokens per EP rank, shift value) and, beside each, the measured correlation interpolated the same way."""
    fields = node_fields(result) if fields is None else fields
    spec = result.spec
    corr = field_matrix(fields, "mb_vs_step_corr", spec)
    out = []
    for c in CLAIMS:
        levels = [c["level"]] + ([c["lower"]] if "lower" in c else [])
        for level in levels:
            best = field_matrix(fields, f"{c['field']}_best", spec)
            pts = contour_points(best, spec.tokens, spec.shift.values, level)
            out.append({"claim": c["claim"], "field": f"{c['field']}_best", "level": level,
                        "points": [{"tokens_per_ep_rank": x, "shift_value": y,
                                    "mb_vs_step_corr": _interp_corr(corr, spec, x, y)} for x, y in pts]})
    return out


def _interp_corr(corr: np.ndarray, spec: GridSpec, x: float, y: float) -> float:
    """The node-mean correlation at a point on a grid edge, bilinear in (log2 tokens, shift value)."""
    lx = np.log2(np.asarray(spec.tokens, dtype=np.float64))
    ys = np.asarray(spec.shift.values, dtype=np.float64)
    order = np.argsort(ys)
    ys_sorted, corr_sorted = ys[order], corr[:, order]
    col = np.array([np.interp(y, ys_sorted, corr_sorted[i]) for i in range(len(lx))])
    return float(np.interp(math.log2(x), lx, col))


# ---- where the claims hold, in one sentence ------------------------------------------------------------
def claim_regions(result: MapResult, fields: pd.DataFrame | None = None) -> list[dict]:
    """Per claim: the grid nodes where its best-over-cases field meets it (at least / at most its level),
    the smallest tokens per EP rank and the largest measured correlation among them, and the best value
    anywhere on the grid with its node."""
    fields = node_fields(result) if fields is None else fields
    out = []
    for c in CLAIMS:
        col = f"{c['field']}_best"
        ok = fields[col] >= c["level"] if c["holds"] == "at least" else fields[col] <= c["level"]
        best_idx = fields[col].idxmax() if c["holds"] == "at least" else fields[col].idxmin()
        held = fields[ok]
        region = {"claim": c["claim"], "field": col, "level": c["level"], "holds": c["holds"],
                  "nodes": int(ok.sum()), "of_nodes": int(len(fields)),
                  "best": float(fields.loc[best_idx, col]), "best_tokens": int(fields.loc[best_idx, "tokens"]),
                  "best_corr": float(fields.loc[best_idx, "mb_vs_step_corr"]),
                  "min_tokens": int(held["tokens"].min()) if len(held) else None,
                  "max_corr": float(held["mb_vs_step_corr"].max()) if len(held) else None,
                  "grid_max_corr": float(fields["mb_vs_step_corr"].max()),
                  "grid_min_tokens": int(fields["tokens"].min())}
        if "lower" in c:  # the paper's own range: the nodes whose gap lies inside 6-10%, and the worst gap
            inside = (fields[col] >= c["lower"]) & (fields[col] <= c["level"])
            region["inside_range_nodes"] = int(inside.sum())
            region["worst"] = float(fields[f"{c['field']}_worst"].max())
        out.append(region)
    return out


def _claim_sentence(r: dict) -> str:
    fmt = (lambda v: f"{100 * v:.1f}%") if r["field"].startswith("gap") else (lambda v: f"{v:.2f}x")
    if not r["nodes"]:
        return (f"{r['claim']} is reached nowhere on the grid (best {fmt(r['best'])}, at {r['best_tokens']} tokens per "
                f"EP rank and micro-batch correlation {r['best_corr']:.2f})")
    if r["nodes"] == r["of_nodes"]:
        where = "holds at every node of the grid"
    else:
        tokens = ("any tokens per EP rank on the grid" if r["min_tokens"] == r["grid_min_tokens"]
                  else f"at least {r['min_tokens']} tokens per EP rank")
        corr = ("any micro-batch correlation on the grid" if r["max_corr"] >= r["grid_max_corr"]
                else f"micro-batch correlation at most {r['max_corr']:.2f}")
        where = f"needs {tokens} and {corr} ({r['nodes']} of {r['of_nodes']} nodes)"
    if "inside_range_nodes" in r:  # a gap: its range over the grid's cases, and where it is the paper's
        return (f"{r['claim']} {where} (the gap spans {fmt(r['best'])}-{fmt(r['worst'])} over the grid's cases; inside "
                f"the paper's 6-10% at {r['inside_range_nodes']} of {r['of_nodes']} nodes)")
    return f"{r['claim']} {where} (best {fmt(r['best'])})"


def conclusion(result: MapResult, fields: pd.DataFrame | None = None) -> str:
    """The one-sentence answer computed from the grid: for each paper claim, where on the map it holds
    (best case over models, workloads and seeds at each node), e.g. "up to 1.6x over Megatron-LM needs at
    least N tokens per EP rank and micro-batch correlation at most C"."""
    regions = claim_regions(result, fields)
    spec = result.spec
    scope = (f"On the {spec.name} grid ({len(spec.models)} models x {len(spec.workloads)} workloads x "
             f"{len(spec.seeds)} seeds at full scale, {min(spec.tokens)}-{max(spec.tokens)} tokens per EP rank, "
             f"{spec.shift.field} {', '.join(map(str, spec.shift.values))}), ")
    text = scope + "; ".join(_claim_sentence(r) for r in regions)
    met = cards_meeting_claims(result)
    if met:
        text += "; of the named cards' points " + "; ".join(
            f"{', '.join(f'{name} ({value})' for name, value in cards)} {'reaches' if len(cards) == 1 else 'reach'} "
            f"{claim}" for claim, cards in met.items())
    return text + "."


def cards_meeting_claims(result: MapResult) -> dict[str, list[tuple[str, str]]]:
    """{claim: [(card, its best figure)]} for the named cards whose best case reaches one of the speed-up
    claims ("up to"); claims no card reaches are left out."""
    points = card_points(result)
    out: dict[str, list[tuple[str, str]]] = {}
    if points.empty:
        return out
    for c in (c for c in CLAIMS if c["holds"] == "at least"):
        col = f"{c['field']}_best"
        hits = [(r["setup"], f"{r[col]:.2f}x") for _, r in points[points[col] >= c["level"]].iterrows()]
        if hits:
            out[c["claim"]] = hits
    return out


def card_points(result: MapResult) -> pd.DataFrame:
    """One row per named card (over its cases): mean position (tokens_per_ep_rank, mb_vs_step_corr), and the
    mean, best and worst of each ratio."""
    c = result.cards
    return pd.DataFrame() if c.empty else _case_stats(c.groupby("setup", sort=False), ("mean", "best", "worst"))


def map_json(result: MapResult) -> dict:
    """The whole map as plain JSON: spec, every case's row, the node fields, the claims' contours and regions,
    the card points and the conclusion. Marked simulated."""
    fields = node_fields(result)
    return json_safe({"source": "simulated", "grid": result.spec.to_dict(), "cases": result.frame.to_dict("records"),
                      "nodes": fields.to_dict("records"), "contours": claim_contours(result, fields),
                      "regions": claim_regions(result, fields), "card_points": card_points(result).to_dict("records"),
                      "conclusion": conclusion(result, fields)})


def contour_table(contours: list[dict]) -> pd.DataFrame:
    """claim_contours as one row per (claim, crossing point); a claim that crosses nowhere keeps one row of
    NaN positions, so every claim is in the table."""
    empty = {"tokens_per_ep_rank": np.nan, "shift_value": np.nan, "mb_vs_step_corr": np.nan}
    return pd.DataFrame([{"claim": c["claim"], "field": c["field"], "level": c["level"], **pt} for c in contours
                         for pt in c["points"]] or [{"claim": c["claim"], "field": c["field"], "level": c["level"],
                                                     **empty} for c in contours])


def rl_calibration(path=DEFAULT_RL_TRACE) -> dict:
    """The kit's real RL trace's micro-batch statistics (relibra.analysis.microbatch_calibration), the
    calibration the micro-batch shift's range comes from; {} when the trace is not shipped."""
    return ({"label": "the kit's real RL trace (relibra rl, data/rl_tiny_seed0.npz)",
             **microbatch_calibration(RoutingTrace.load(path))} if path.exists() else {})


# ---- one named card's point, read back ------------------------------------------------------------------
@dataclass(frozen=True)
class CardPoint:
    """One named card's point (a card_points row): ReLibra / Megatron and / EPLB+ as (mean, best) and the
    gap to Balanced as (mean, best, worst) over its cases; its measured position; EPLB+'s and Megatron's
    mean tokens/s there."""

    setup: str
    over_megatron: tuple[float, float]
    over_eplb_plus: tuple[float, float]
    gap: tuple[float, float, float]
    tokens_per_ep_rank: float
    mb_vs_step_corr: float
    micro_batches: float
    cases: int
    tokens_per_s: tuple[float, float]  # EPLB+'s, Megatron's


def _plural(n: float, word: str) -> str:
    return f"{n:.0f} {word}" + ("" if round(n) == 1 else "es" if word.endswith("h") else "s")


def why_card_differs(x: CardPoint, regions, best_over_megatron: tuple[float, int],
                     best_over_eplb_plus: tuple[float, float, float]) -> str:
    """Why one card's figure is not the paper's (CLAIMS' levels), from its point and the grid's: regions
    (claim_regions), the grid's best ReLibra / Megatron with its tokens per EP rank, and its best ReLibra /
    EPLB+ with its shift and correlation."""
    meg, eplb, gap = CLAIMS
    need = next((reg["min_tokens"] for reg in regions if reg["field"] == "relibra_over_megatron_best"), None)
    mbs, (eplb_tps, meg_tps), (best, shift, corr) = _plural(x.micro_batches, "micro-batch"), x.tokens_per_s, \
        best_over_eplb_plus
    parts = [f"it packs {x.tokens_per_ep_rank:.0f} tokens per EP rank per micro-batch ({mbs} a step)"]
    if x.over_megatron[1] < meg["level"]:
        parts.append(f"{meg['level']:g}x over Megatron needs at least {need} tokens per EP rank on the grid" if need
                     else f"the grid reaches {meg['level']:g}x over Megatron nowhere (best "
                     f"{best_over_megatron[0]:.2f}x at {best_over_megatron[1]} tokens per EP rank)")
    if eplb_tps < meg_tps:  # then ReLibra / EPLB+ is large for a reason other than the micro-batch shift
        parts.append(f"EPLB+ is slower than Megatron here ({eplb_tps:.0f} vs {meg_tps:.0f} tokens/s): over {mbs} a "
                     "step its own costs exceed what its balance saves, which, not micro-batch shift, lifts ReLibra / "
                     f"EPLB+ to {x.over_eplb_plus[0]:.2f}x")
    else:
        parts.append(f"its micro-batches correlate with their step at {x.mb_vs_step_corr:.2f}, so a once-per-step "
                     "EPLB+ already balances most of each micro-batch's load" if x.mb_vs_step_corr >= 0.85 else
                     f"its micro-batches correlate with their step at only {x.mb_vs_step_corr:.2f}, where "
                     "per-micro-batch balancing has the most to gain over EPLB+")
    if x.over_eplb_plus[1] < eplb["level"]:
        where = "nowhere" if best < eplb["level"] else "only elsewhere"
        parts.append(f"{eplb['level']:g}x over EPLB+ is reached {where} on the grid (best {best:.2f}x at shift "
                     f"{shift:g}, correlation {corr:.2f}, the sharpest shift the routing data support being "
                     f"{MICROBATCH_SHIFT_RANGE[1]:g})")
    if not gap["lower"] <= x.gap[0] <= gap["level"]:
        side = "below" if x.gap[0] < gap["lower"] else "above"
        parts.append(f"its gap to Balanced ({100 * x.gap[0]:.1f}%) is {side} the paper's "
                     f"{100 * gap['lower']:g}-{100 * gap['level']:g}%")
    return "; ".join(parts)
