"""The re-plan interval k of the policies that re-home experts, chosen per card by their own throughput.

A re-homing policy (eplb, eplb+, eplb+lp, lplb+) re-plans at steps that are multiples of `replan_interval` k
and keeps its placement in between (relibra.policies.eplb.replan_step): k = 1 pays migration every step, a
larger k once per k steps for a placement that ages. Which is faster depends on the card (migration rates,
state bytes, step time, routing drift), so k is chosen here, above the policies, by simulating every
candidate on the same whole re-plan cycles. `relibra replan` records each shipped card's choice in
data/replan/<card>.json (replan_record); a simulated case asks replan_form for its k.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import math
import os
from pathlib import Path

import pandas as pd

from relibra.cluster import Topology
from relibra.errors import ConfigError
from relibra.setups import CARD_DIR, SetupCard, load_card
from relibra.sim import simulate
from relibra.trace import RoutingTrace

REPLAN_INTERVALS = (1, 2, 4, 8)
# The policies whose placement is rebuilt from the loads (they take replan_interval); relibra weighs
# migration in its own placement search, megatron and llep keep the static homes.
REHOMING_POLICIES = ("eplb", "eplb+", "eplb+lp", "lplb+")


def replan_window(candidates=REPLAN_INTERVALS) -> int:
    """Steps every candidate is measured on: their least common multiple, so each sees whole cycles."""
    bad = [k for k in candidates if isinstance(k, bool) or not isinstance(k, int) or k < 1]
    if not candidates or bad:
        raise ConfigError(f"replan intervals must be positive integers, got {list(candidates)!r}")
    return math.lcm(*candidates)


def replan_steps(trace: RoutingTrace, candidates=REPLAN_INTERVALS) -> list[int]:
    """The last replan_window(candidates) steps of the trace that start at a multiple of the window (each
    candidate's re-plans on its cycle starts); ConfigError when the trace is shorter than two windows."""
    window = replan_window(candidates)
    first = (trace.num_steps - window) // window * window
    if first < window:
        raise ConfigError(f"choosing the re-plan interval over {list(candidates)} needs {2 * window} steps "
                          f"(one window of warm-up, one measured), the trace holds {trace.num_steps}")
    return list(range(first, first + window))


def choose_replan_interval(trace: RoutingTrace, topology: Topology, policy: str, card: SetupCard,
                           candidates=REPLAN_INTERVALS) -> tuple[int, pd.DataFrame]:
    """(best k, one row per k: replan_interval, tokens_per_s, and per step step_s, migration_s, experts_moved)
    of `policy` on replan_steps after one window of warm-up planned from Megatron's placement, with the card's
    cost knobs. Ties go to the smaller k."""
    if policy not in REHOMING_POLICIES:
        raise ConfigError(f"{policy!r} does not re-home experts; the re-plan interval is a parameter of "
                          f"{', '.join(REHOMING_POLICIES)}")
    steps = replan_steps(trace, candidates)
    rows = []
    for k in candidates:
        params = {**card.policy_params([policy]).get(policy, {}), "replan_interval": k}
        res = simulate(trace, topology, [policy], steps=steps, params=card.cost_params(trace.ep),
                       policy_params={policy: params}, progress=False, references=False,
                       warmup=replan_window(candidates))
        per_step = res.per_step[res.per_step["policy"] == policy]
        rows.append({"replan_interval": k, "tokens_per_s": per_step["tokens"].sum() / per_step["step_s"].sum(),
                     "step_s": per_step["step_s"].mean(), "migration_s": per_step["migration_s"].mean(),
                     "experts_moved": per_step["experts_moved"].mean()})
    table = pd.DataFrame(rows)
    best = int(table.loc[table["tokens_per_s"].idxmax(), "replan_interval"])  # first maximum: smaller k
    return best, table


def rehoming_at_best_interval(trace: RoutingTrace, topology: Topology, card: SetupCard,
                              candidates=REPLAN_INTERVALS) -> pd.DataFrame:
    """choose_replan_interval's rows of every re-homing policy and Megatron's on the same steps (replan_interval
    0): one row per (policy, replan_interval) with best (the policy's chosen k; True for Megatron) and
    speedup_vs_megatron."""
    steps = replan_steps(trace, candidates)
    res = simulate(trace, topology, ["megatron"], steps=steps, params=card.cost_params(trace.ep),
                   policy_params=card.policy_params(["megatron"]), progress=False, references=False,
                   warmup=replan_window(candidates))
    g = res.per_step.groupby("policy", sort=False)
    tables = [pd.DataFrame({"replan_interval": 0, "tokens_per_s": g["tokens"].sum() / g["step_s"].sum(),
                            "step_s": g["step_s"].mean(), "migration_s": g["migration_s"].mean(),
                            "experts_moved": g["experts_moved"].mean(), "best": True}).reset_index()]
    for policy in REHOMING_POLICIES:
        best, table = choose_replan_interval(trace, topology, policy, card, candidates)
        tables.append(table.assign(policy=policy, best=table["replan_interval"] == best))
    out = pd.concat(tables, ignore_index=True)
    out["speedup_vs_megatron"] = out["tokens_per_s"] / tables[0]["tokens_per_s"].iloc[0]
    return out[["policy", "replan_interval", "best", "tokens_per_s", "speedup_vs_megatron", "step_s",
                "migration_s", "experts_moved"]]


# ---- the record: each named card's chosen k, made once at the card's scale and read by the headline and map --
RECORD_DIR = Path(__file__).resolve().parents[2] / "data" / "replan"
# The trace k is chosen on: the cards' sequence lengths are their recipes' math domain (DAPO-Math-17k), and one
# seed; the record says both.
RECORD_WORKLOAD = "math"
RECORD_SEED = 0
RECORD_FIELDS = ("card", "card_sha256", "card_values", "command", "date_utc", "kit_commit", "trace", "candidates",
                 "cases")


def card_values(card: SetupCard) -> dict:
    """{entry key: value} of every entry of the card (its base's included): the inputs a record was made from."""
    return {key: entry.value for key, entry in sorted(card.entries.items())}


def card_sha256(values: dict) -> str:
    """sha256 of card_values as canonical JSON: equal exactly when every entry's value is."""
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def record_path(card_name: str, folder: str | os.PathLike = RECORD_DIR) -> Path:
    return Path(folder) / f"{card_name}.json"


def shipped(card: SetupCard) -> bool:
    """Whether the card is one under data/setups/: only those have records."""
    return Path(card.path).resolve().parent == CARD_DIR.resolve()


def record_case(model: str, card: str, workload: str = RECORD_WORKLOAD, seed: int = RECORD_SEED,
                candidates: tuple[int, ...] = REPLAN_INTERVALS, layers: int | None = None) -> dict:
    """The chooser on one (model, card name or path) at the card's EP, batch and cluster, on a trace of
    2 x replan_window steps (layers None: every MoE layer): {"model", "ep", "layers", "micro_batches",
    "chosen": {policy: k}, "rows": rehoming_at_best_interval's rows with Megatron as the only reference}."""
    from relibra.display import json_safe
    from relibra.studies.case import scaled_model
    from relibra.workloads import generate_trace

    card = load_card(card)
    ep = card.value("batch.expert_parallel")
    trace = generate_trace(scaled_model(model, layers), workload, ep, steps=2 * replan_window(candidates), seed=seed,
                           micro_batches=card.micro_batches, config=card.workload_config(), progress=False)
    table = rehoming_at_best_interval(trace, card.topology(), card, candidates)
    chosen = table[table["best"] & table["policy"].isin(REHOMING_POLICIES)]
    return {"model": model, "ep": int(ep), "layers": int(trace.num_layers),
            "micro_batches": int(trace.num_microbatches),
            "chosen": {p: int(k) for p, k in zip(chosen["policy"], chosen["replan_interval"])},
            "rows": json_safe(table.to_dict("records"), strict=False)}


def replan_record(card: "str | SetupCard", models=None, workload: str = RECORD_WORKLOAD, seed: int = RECORD_SEED,
                  candidates=REPLAN_INTERVALS, layers: int | None = None, workers: int | None = None,
                  progress: bool = True, command: str = "", commit: str | None = None,
                  reuse_from: str | os.PathLike | None = None) -> dict:
    """The record of `card`: record_case on each of `models` (None: SetupCard.memory_models) in worker
    processes, with what it was made from: the card's values and their sha256, the command, the UTC date, the
    kit's commit (`commit`, else read now: a command over several cards reads it once, before anything can
    change under it) and the trace. Where a record under `reuse_from` (a folder) of another card was made from
    the very same inputs, its cases are taken (the same simulation) and `cases_from` names it."""
    from relibra.bench.records import kit_commit
    from relibra.pool import map_in_order

    card = load_card(card)
    window = replan_window(candidates)
    models = card.memory_models(models)
    values = card_values(card)
    trace = {"generator": "relibra.workloads.generate_trace", "workload": workload, "seed": int(seed),
             "steps": 2 * window, "warmup_steps": window, "measured_steps": window,
             "scale": "every MoE layer" if layers is None else f"first {layers} MoE layers"}
    record = {"card": card.name, "card_sha256": card_sha256(values), "card_values": values, "command": command,
              "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "kit_commit": commit or kit_commit(), "trace": trace, "candidates": [int(k) for k in candidates]}
    same = _same_inputs(record, models, reuse_from)
    if same is not None:  # another card with every value equal (e.g. two names for one set-up): its cases
        return {**record, "cases": [c for m in models for c in same["cases"] if c["model"] == m],
                "cases_from": {k: same[k] for k in ("card", "command", "date_utc", "kit_commit")}}
    one = functools.partial(record_case, card=card.path, workload=workload, seed=int(seed),
                            candidates=tuple(candidates), layers=layers)
    return {**record, "cases": map_in_order(one, models, workers, progress, desc=f"replan {card.name}")}


def _same_inputs(record: dict, models, folder) -> dict | None:
    """The first record under `folder` (None: look nowhere) of another card made from the same card values,
    trace and candidates as `record` and holding every one of `models`, or None."""
    if folder is None or not Path(folder).is_dir():
        return None
    for path in sorted(Path(folder).glob("*.json")):
        other = load_replan_record(path.stem, folder)
        if (other is not None and other["card"] != record["card"] and "cases_from" not in other
                and all(other[k] == record[k] for k in ("card_sha256", "trace", "candidates"))
                and set(models) <= {c["model"] for c in other["cases"]}):
            return other
    return None


def write_replan_record(record: dict, folder: str | os.PathLike = RECORD_DIR) -> Path:
    """Write `record` to record_path(its card, folder), atomically."""
    from relibra.paths import write_text

    path = record_path(record["card"], folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record, indent=1, allow_nan=False) + "\n")
    return path


def load_replan_record(card_name: str, folder: str | os.PathLike = RECORD_DIR) -> dict | None:
    """The record of the card called `card_name` (None where there is none); ConfigError naming the file and the
    command that rewrites it when it is not a record."""
    path = record_path(card_name, folder)
    if not path.is_file():
        return None
    again = f"run `relibra replan --setup {card_name}` again"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a JSON record ({exc}); {again}") from None
    missing = [k for k in RECORD_FIELDS if not isinstance(record, dict) or k not in record]
    if missing:
        raise ConfigError(f"{path}: no {', '.join(map(repr, missing))}; {again}")
    for case in record["cases"]:
        bad = {p: k for p, k in case.get("chosen", {}).items()
               if p not in REHOMING_POLICIES or isinstance(k, bool) or not isinstance(k, int) or k < 1}
        if bad or "model" not in case or "ep" not in case:
            raise ConfigError(f"{path}: a case with a bad model, ep or chosen interval ({bad or case}); {again}")
    return record


def stale_entries(record: dict, values: dict) -> list[str]:
    """The entry keys whose value differs between the record's card and `values` (card_values); empty when
    the record was made from them."""
    if record["card_sha256"] == card_sha256(values):
        return []
    old = record["card_values"]
    return sorted(k for k in set(old) | set(values) if old.get(k) != values.get(k)) or ["(the hash)"]


@dataclasses.dataclass(frozen=True)
class ReplanForm:
    """Each re-homing policy's re-plan interval in one simulated case: `intervals` (policy, k) pairs; `source`
    the record's path, or why there is none and k = 1 (re-planned every step on the step's own loads).

    A policy at k > 1 is simulated once per phase of its cycle (simulate_in_form), so its figure is its
    cycle's mean on the same steps as every other policy's; the trace needs k steps before the first
    simulated one (trace_steps)."""

    intervals: tuple[tuple[str, int], ...] = ()
    source: str = "no re-homing policy"

    @classmethod
    def at_one(cls, policies, why: str) -> "ReplanForm":
        """Every re-homing policy of `policies` at k = 1, `why` there is no chosen k."""
        rehoming = tuple((p, 1) for p in dict.fromkeys(policies) if p in REHOMING_POLICIES)
        return cls(rehoming, f"k = 1: {why}") if rehoming else cls()

    def interval(self, policy: str) -> int:
        """The policy's k; 0 for a policy that does not re-home experts."""
        return dict(self.intervals).get(policy, 0)

    def policy_params(self, params: dict) -> dict:
        """`params` ({policy: {param: value}}) with each re-homing policy's replan_interval."""
        out = {p: dict(v) for p, v in params.items()}
        for policy, k in self.intervals:
            out.setdefault(policy, {})["replan_interval"] = k
        return out

    @property
    def longest(self) -> int:
        """The largest k (0 without a re-homing policy): steps a trace needs before the first simulated one."""
        return max((k for _, k in self.intervals), default=0)

    def trace_steps(self, steps: int) -> int:
        """Steps to generate for a case of `steps` steps whose last is simulated: at least longest + 1."""
        return max(steps, self.longest + 1)


def simulate_in_form(trace: RoutingTrace, topology: Topology, policies, form: ReplanForm, steps=1,
                     policy_params: dict | None = None, **kwargs):
    """relibra.sim.simulate (kwargs: its own) of `policies` on `steps`, each re-homing policy at its form's k as
    the mean over the k phases of its cycle: phase o re-plans at the steps equal to o modulo k (replan_phase),
    so each simulated step is once the re-plan and once each of the k - 1 steps its placement ages. The others,
    the references and phase 0 run in one call (balanced-compute sees phase 0's plans), each further phase in
    its own. Returns a SimResult with k per_step rows per step of a policy at k, summarized over them."""
    from relibra.sim import SimResult, summarize

    params = form.policy_params(policy_params or {})
    base = simulate(trace, topology, list(policies), steps=steps, policy_params=params, **kwargs)
    extra = [simulate(trace, topology, [p], steps=steps, **{**kwargs, "references": False, "progress": False},
                      policy_params={p: {**params[p], "replan_phase": phase}})
             for p, k in form.intervals if p in policies for phase in range(1, k)]
    if not extra:
        return base
    per_step = pd.concat([base.per_step, *(r.per_step for r in extra)], ignore_index=True)
    frame = pd.concat([base.frame, *(r.frame for r in extra)], ignore_index=True)
    costs = {name: [c for r in (base, *extra) for c in r.costs.get(name, [])] for name in base.costs}
    return SimResult(frame=frame, summary=summarize(per_step, order=list(base.summary["policy"])), per_step=per_step,
                     config={**base.config, "replan_intervals": dict(form.intervals)}, costs=costs)


def replan_form(card: SetupCard, model: str, ep: int, policies, folder: str | os.PathLike = RECORD_DIR) -> ReplanForm:
    """The ReplanForm of `policies` on `card` for `model` at EP `ep`: the record's k where it holds that (model,
    EP) for the card as written; else k = 1 with why (a card outside data/setups/, values changed in code, no
    such case). ConfigError where a shipped card has no record or a stale one (naming the entries)."""
    rehoming = [p for p in dict.fromkeys(policies) if p in REHOMING_POLICIES]
    if not rehoming:
        return ReplanForm()
    if not shipped(card):
        return ReplanForm.at_one(rehoming, f"card {card.path} is not under data/setups/, so no record holds its k")
    values = card_values(card)
    if values != card_values(load_card(card.path)):
        return ReplanForm.at_one(rehoming, f"card {card.name} with values changed in code, other inputs than its "
                                           "record's")
    record = load_replan_record(card.name, folder)
    where = record_path(card.name, folder)
    if record is None:
        raise ConfigError(f"{where}: missing; every card under data/setups/ has its re-plan intervals chosen: "
                          f"run `relibra replan --setup {card.name}`")
    case = next((c for c in record["cases"] if c["model"] == model and c["ep"] == ep), None)
    if case is None:
        return ReplanForm.at_one(rehoming, f"{where.name} holds no case of {model} at EP {ep}")
    stale = stale_entries(record, values)
    if stale:
        raise ConfigError(f"{where} was made from other values of card {card.name} (entries {', '.join(stale)}); "
                          f"run `relibra replan --setup {card.name}` again")
    return ReplanForm(tuple((p, int(case["chosen"].get(p, 1))) for p in rehoming), shown_path(where))


def record_table(record: dict) -> pd.DataFrame:
    """One row per (model, re-homing policy) of a record: the chosen k, tokens/s at every candidate, Megatron's
    tokens/s, and at k the speed-up over Megatron, migration seconds and experts moved per step."""
    rows = []
    for case in record["cases"]:
        frame = pd.DataFrame(case["rows"])
        megatron = float(frame.loc[frame["policy"] == "megatron", "tokens_per_s"].iloc[0])
        for policy, k in case["chosen"].items():
            mine = frame[frame["policy"] == policy].set_index("replan_interval")
            best = mine.loc[k]
            rows.append({"card": record["card"], "model": case["model"], "ep": case["ep"], "policy": policy, "k": k,
                         **{f"tokens_per_s_k{c}": float(mine.loc[c, "tokens_per_s"]) for c in mine.index},
                         "megatron_tokens_per_s": megatron,
                         "speedup_vs_megatron": float(best["tokens_per_s"]) / megatron,
                         "migration_s": float(best["migration_s"]), "experts_moved": float(best["experts_moved"])})
    return pd.DataFrame(rows)


def record_lines(card: SetupCard, folder: str | os.PathLike = RECORD_DIR) -> list[str]:
    """`relibra setup show`'s lines on the card's re-plan intervals: the record and what it was made from, then
    record_table's rows; or why there is no current record."""
    if not shipped(card):
        return ["re-plan interval: no record for a card outside data/setups/: re-homing policies run at k = 1"]
    record, where = load_replan_record(card.name, folder), shown_path(record_path(card.name, folder))
    if record is None:
        return [f"re-plan interval: no record {where}; run `relibra replan --setup {card.name}`"]
    stale = stale_entries(record, card_values(card))
    if stale:
        return [f"re-plan interval: {where} was made from other values (entries {', '.join(stale)}); run "
                f"`relibra replan --setup {card.name}`"]
    t, ks = record["trace"], ", ".join(map(str, record["candidates"]))
    lines = [f"re-plan interval k of the re-homing policies, used by the headline and the map ({where}: "
             f"`{record['command']}`, {record['date_utc']}, kit {record['kit_commit']}; {t['workload']}, seed "
             f"{t['seed']}, {t['measured_steps']} steps after {t['warmup_steps']} of warm-up, {t['scale']}):"]
    for _, r in record_table(record).iterrows():
        at = ", ".join(f"{r[f'tokens_per_s_k{c}']:,.0f}" for c in record["candidates"])
        lines.append(f"  {r['model']} EP {r['ep']} {r['policy']}: k = {r['k']} (tokens/s at k = {ks}: {at}; Megatron "
                     f"{r['megatron_tokens_per_s']:,.0f}); at k: {r['speedup_vs_megatron']:.3f}x Megatron, migration "
                     f"{r['migration_s']:.3f} s and {r['experts_moved']:,.0f} experts moved per step")
    return lines


def shown_path(path: Path) -> str:
    """`path` relative to the kit's folder where it is inside it (data/replan/<card>.json), else as it is."""
    root = RECORD_DIR.parents[1]
    return str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)
