"""Every generated block of docs/*.md and README.md, rendered from what the kit holds (never typed): the
measured tables from the benchmark records under data/bench/, the set-up cards' bounds table from
relibra/setup_schema.py, and the README's results table from docs/glance.md (written by
`relibra reproduce --update-readme`).

A file holds each block between two marker lines (relibra.display.marked_blocks, the kit's one marker
mechanism):

    <!-- table:NAME begin -->
    ...what render_table(NAME) returns...
    <!-- table:NAME end -->

    python -m relibra.bench.docs_tables            # rewrite every marked block of docs/*.md and README.md
    python -m relibra.bench.docs_tables --check    # exit 1 naming each block that differs

Each table comes from one or two records (relibra.bench.records), or from a measurement file elsewhere
under data/ (DATA_FILES), and ends with a line saying which record or file, the command that writes
it, when and on what machine, and for measured figures at what load average; simulated and computed
records (deterministic) say "Simulated by" / "Computed by" instead of "Measured by".
tests/test_docs_tables.py checks that every marked table equals what this module renders from the
committed records.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

from relibra.bench.records import BENCH_DIR, RECORDS, load_record
from relibra.display import marked_blocks, md_table, with_blocks
from relibra.errors import ConfigError
from relibra.paths import write_text
from relibra.setup_schema import bounds_table

ROOT = Path(__file__).resolve().parents[2]
DOCS_DIR = ROOT / "docs"
SHORT = {"qwen3-30b-a3b": "30B", "glm-4.5-air": "GLM-Air", "qwen3-235b-a22b": "235B"}


def _rows(record: dict) -> list[tuple[dict, list[dict]]]:
    """(the command's JSON, its result rows) per run of a record."""
    return [(run["output"], run["output"]["results"]) for run in record["runs"]]


def _table(header: list[str], rows: list[list[str]]) -> str:
    return md_table(header, rows) + "\n"


def _machine(m: dict) -> str:
    return (f"{m['cpu']} ({m['logical_cpus']} logical CPUs, {m['os']}; Python {m['python']}, numpy {m['numpy']}, "
            f"torch {m['torch']})")


def provenance(record: dict) -> str:
    """One line: which record, its command, when, on what; for measured records also the 1-minute load
    average over its runs. Simulated and computed records (deterministic figures) say so instead."""
    kind = _kind(record["name"])
    if kind != "measured":
        return (f"{kind.capitalize()} by `{record['command']}` (data/bench/{record['name']}.json), "
                f"{record['started_utc']}, on {_machine(record['machine'])}; the same commands print the same "
                f"figures on any machine.\n")
    loads = [x[0] for x in [record["load_average_start"], record["load_average_end"]]
             + [r[k] for r in record["runs"] for k in ("load_average_start", "load_average_end")] if x]
    load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "unknown"
    return (f"Measured by `{record['command']}` (data/bench/{record['name']}.json), {record['started_utc']} to "
            f"{record.get('finished_utc', '?')}, on {_machine(record['machine'])}; 1-minute load average {load} "
            f"during the runs.\n")


def _kind(name: str) -> str:
    """The kind of record NAME (relibra.bench.records.RECORDS); "measured" for a name it does not list."""
    return next((spec.kind for spec in RECORDS if spec.name == name), "measured")


def _planner_grid(record: dict, column: str, fmt: Callable[[float], str]) -> str:
    """policy x (model, EP) of one bench planner column."""
    runs = _rows(record)
    header = ["policy"] + [f"{SHORT.get(rows[0]['model'], rows[0]['model'])} EP{rows[0]['ep']}" for _, rows in runs]
    policies = list(dict.fromkeys(r["policy"] for _, rows in runs for r in rows))
    cells = [{r["policy"]: r[column] for r in rows} for _, rows in runs]
    body = [[f"`{p}`"] + [fmt(c[p]) if p in c else "-" for c in cells] for p in policies]
    return _table(header, body)


def planner_skewness(records: dict) -> str:
    return _planner_grid(records["planner-models"], "mean_skewness", lambda v: f"{v:.3f}")


def planner_gap(records: dict) -> str:
    return _planner_grid(records["planner-models"], "mean_gap_to_bound", lambda v: f"{100 * v:.2f}%")


def planner_cpu(records: dict) -> str:
    return _planner_grid(records["planner-models"], "step_plan_cpu_s", lambda v: f"{v:.2f}")


def planner_speed(records: dict) -> str:
    body = []
    for _, rows in _rows(records["planner-speed"]):
        for r in rows:
            body.append([str(r["ep"]), f"`{r['policy']}`", f"{r['micro_batches']} x {r['layers']}",
                         f"{r['step_plan_s']:.2f} / {r['step_plan_cpu_s']:.2f}",
                         f"{r['replication_cpu_us_per_microbatch_layer']:.1f}",
                         f"{r['peak_MB']:.0f}", f"{r['plan_MB']:.1f}",
                         f"{r['validate_s']:.2f} / {r['validate_cpu_s']:.2f}", f"{r['mean_skewness']:.4f}"])
    return _table(["EP", "policy", "micro-batches x layers", "step wall / CPU s", "balancing CPU us per cell",
                   "peak MB", "plan MB", "validate wall / CPU s", "mean skewness"], body)


def _case(output: dict, row: dict) -> tuple:
    return (row["model"], int(row["ep"]), output.get("config", {}).get("cluster", row.get("cluster")))


def planner_scale(records: dict) -> str:
    """relibra and relibra-h side by side per (model, EP, cluster), from planner-scale and planner-speed."""
    by_case: dict[tuple, dict] = {}
    for name in ("planner-scale", "planner-speed"):
        for run, (_, rows) in zip(records[name]["runs"], _rows(records[name])):
            cluster = _arg(run["command"], "--cluster", "paper")
            for r in rows:
                by_case.setdefault((r["model"], int(r["ep"]), cluster), {})[r["policy"]] = r
    body = []
    for (model, ep, cluster), p in sorted(by_case.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        a, h = p.get("relibra"), p.get("relibra-h")
        if a is None or h is None:
            continue
        body.append([f"{model}, EP{ep}, `{cluster}`", f"{a['micro_batches']} x {a['layers']}",
                     f"{a['step_plan_s']:.2f} / {a['step_plan_cpu_s']:.2f}",
                     f"{a['replication_cpu_us_per_microbatch_layer']:.1f}",
                     f"{a['reorder_cpu_s']:.2f} / {a['flow_cpu_s']:.2f}",
                     f"{h['step_plan_s']:.2f} / {h['step_plan_cpu_s']:.2f}",
                     f"{h['replication_cpu_us_per_microbatch_layer']:.0f}",
                     f"{a['mean_skewness']:.3f} -> {h['mean_skewness']:.3f}"])
    return _table(["model, EP, cluster", "micro-batches x layers", "relibra step wall / CPU s",
                   "relibra replication CPU us per cell", "relibra reorder / flow CPU s",
                   "relibra-h step wall / CPU s", "relibra-h replication CPU us per cell",
                   "skewness relibra -> relibra-h"], body)


def _arg(command: str, flag: str, default: str) -> str:
    words = command.split()
    return words[words.index(flag) + 1] if flag in words else default


def scale_sim(records: dict) -> str:
    body = []
    for output, rows in _rows(records["scale-sim"]):
        cfg = output["config"]
        by = {r["policy"]: r for r in rows}
        h, a = by["relibra-h"], by["relibra"]
        body.append([f"{cfg['model']}, EP{cfg['ep']}, `{cfg['cluster']}`", f"{by['megatron']['skewness']:.2f}",
                     f"{by['llep']['speedup_vs_megatron']:.3f}", f"{a['speedup_vs_megatron']:.3f}",
                     f"{h['speedup_vs_megatron']:.3f}", f"{h['frac_of_balanced_compute']:.3f}",
                     f"{a['skewness']:.3f} -> {h['skewness']:.3f}"])
    return _table(["model, EP, cluster", "megatron skewness", "llep / megatron", "relibra / megatron",
                   "relibra-h / megatron", "relibra-h / balanced-compute", "skewness relibra -> relibra-h"], body)


def sim_speed(records: dict) -> str:
    body = []
    for _, rows in _rows(records["sim-speed"]):
        for r in rows:
            body.append([f"{r['model']}, EP{r['ep']}, `{r['policy']}`", f"{r['micro_batches']} x {r['layers']}",
                         f"{r['sim_s']:.2f} ({r['sim_s_min']:.2f})", f"{r['sim_cpu_s']:.2f}",
                         f"{r['frame_rows']:,}", f"{r['simulated_step_s']:.3f}"])
    return _table(["model, EP, policy", "micro-batches x layers", "sim wall s, median (min)", "sim CPU s, median",
                   "tidy rows", "simulated step s"], body)


def workload_scale(records: dict, name: str = "workload-scale") -> str:
    body = []
    for _, rows in _rows(records[name]):
        for r in rows:
            body.append([f"{r['model']}, EP{r['ep']}", f"{r['micro_batches']}", f"{r['tokens_per_rank']:,}",
                         f"{r['load_cells'] / 1e6:.0f} M", f"{r['seconds']:.1f}", f"{r['cpu_seconds']:.1f}",
                         f"{r['static_skewness']:.2f}"])
    return _table(["model, EP", "micro-batches", "tokens per rank and micro-batch", "load cells", "wall s", "CPU s",
                   "static skewness"], body)


def planner_seconds(files: dict) -> str:
    """The run-time planners' charged CPU ms per (micro-batch, layer) by EP size, and one cell at a time."""
    policies = files["planner-seconds"]["policies"]
    eps = list(dict.fromkeys(ep for p in policies.values() for ep in p["ep"]))
    body = []
    for name, p in policies.items():
        for key, what in (("seconds_per_cell", "step's cells together (charged)"),
                          ("seconds_per_cell_single", "one cell at a time")):
            by_ep = dict(zip(p["ep"], p[key]))
            body.append([f"`{name}`", what] + [f"{1e3 * by_ep[ep]:.2f}" if ep in by_ep else "-" for ep in eps])
    return _table(["policy", "planned"] + [f"EP{ep}" for ep in eps], body)


def _runtime_launches(data: dict) -> list[tuple[str, int, dict, list]]:
    """(layout "N node(s) x R", launch number within the layout, {policy: row}, its 1-minute load averages)
    per `relibra run` command."""
    out, count = [], {}
    for run in data["runs"]:
        rows = {r["policy"]: r for r in run.get("results", [])}
        if not rows:
            continue
        first = next(iter(rows.values()))
        layout = f"{first['nodes']} node{'s' if first['nodes'] > 1 else ''} x {first['ranks_per_node']}"
        count[layout] = count.get(layout, 0) + 1
        out.append((layout, count[layout], rows, run.get("load_average_1min", [])))
    return sorted(out, key=lambda x: (x[0], x[1]))


def runtime_measured(files: dict) -> str:
    body = []
    for layout, launch, rows, load in _runtime_launches(files["runtime-measured"]):
        m, r = rows["megatron"], rows["relibra"]
        body.append([layout, str(launch), f"{m['step_s_median']:.3f} / {r['step_s_median']:.3f}",
                     f"{r['speedup_vs_megatron']:.2f} [{r['speedup_ci_low']:.2f}, {r['speedup_ci_high']:.2f}] "
                     f"({r['speedup_ci_high'] - r['speedup_ci_low']:.2f})",
                     f"{r['cpu_speedup_vs_megatron']:.2f} [{r['cpu_speedup_ci_low']:.2f}, {r['cpu_speedup_ci_high']:.2f}]",
                     f"{r['sim_speedup_vs_megatron']:.2f}", "-".join(f"{x:.1f}" for x in load)])
    return _table(["layout (nodes x ranks per node)", "launch", "megatron / relibra median step (s)",
                   "wall speed-up [95% interval] (width)", "CPU-time speed-up [95% interval]", "simulated",
                   "1-min load"], body)


def runtime_ranks(files: dict) -> str:
    body = []
    for layout, launch, rows, _ in _runtime_launches(files["runtime-measured"]):
        for policy, r in rows.items():
            body.append([layout, str(launch), f"`{policy}`", " / ".join(f"{x:.2f}" for x in r["cpu_s_per_rank"]),
                         " / ".join(f"{x:.2f}" for x in r["wait_s_per_rank"])])
    return _table(["layout", "launch", "policy", "CPU s per step, rank 0 / rank 1 (median)",
                   "waiting s per step, rank 0 / rank 1"], body)


def rl_trace_sim(records: dict) -> str:
    """Every policy of `relibra simulate --trace` per cluster: speed-up over megatron, fraction of
    balanced, rank skewness."""
    body = []
    for output, rows in _rows(records["rl-trace-sim"]):
        for r in rows:
            body.append([f"`{output['config']['cluster']}`", f"`{r['policy']}`", f"{r['speedup_vs_megatron']:.3f}",
                         f"{r['frac_of_balanced']:.3f}", f"{r['skewness']:.2f}"])
    return _table(["cluster", "policy", "speed-up over megatron", "fraction of balanced", "rank skewness"], body)


def layouts(records: dict) -> str:
    """Per batch layout: micro-batches per step and ReLibra's ratios (tokens per second)."""
    body = []
    for run in records["layouts"]["runs"]:
        output = run["output"]
        by = {r["policy"]: r for r in output["results"]}
        a = by["relibra"]
        layout = _arg(run["command"], "--layout", "?")
        body.append([f"`{layout}`", f"{output['config']['micro_batches']}", f"{a['speedup_vs_megatron']:.2f}",
                     f"{a['tokens_per_s'] / by['eplb+']['tokens_per_s']:.2f}",
                     f"{100 * (1 - a['tokens_per_s'] / by['balanced']['tokens_per_s']):.1f}%",
                     f"{by['megatron']['skewness']:.2f}", f"{by['eplb+']['skewness']:.2f}", f"{a['skewness']:.2f}"])
    return _table(["layout", "micro-batches per step", "ReLibra / Megatron", "ReLibra / EPLB+", "gap to Balanced",
                   "skewness: Megatron", "EPLB+", "ReLibra"], body)


MEMORY_TERMS = (("weights", "weights"), ("gradients", "gradients"), ("optimizer", "optimizer"),
                ("activations", "activations"), ("expert_activations", "expert activations"),
                ("cuda_context_nccl", "context and NCCL"))


def card_memory(records: dict) -> str:
    """Per shipped card and model it is budgeted for (`relibra setup show --json`): the busiest GPU's HBM by
    term, the verdict against the card's HBM, and the ends of swept entries that turn the verdict."""
    body = []
    for run in records["card-memory"]["runs"]:
        card = run["output"]
        e = {r["key"]: r["value"] for r in card["entries"]}
        grid = ", ".join(f"{k} {e[f'batch.{v}']}" for k, v in (("EP", "expert_parallel"), ("TP", "tensor_parallel"),
                                                                  ("PP", "pipeline_parallel"),
                                                                  ("CP", "context_parallel")))
        for m in card["memory"]:
            terms = ", ".join(f"{m[f'{t}_GB']:.1f} {label}" for t, label in MEMORY_TERMS)
            rows = f"{m['expert_rows']:,.0f} routed rows a layer" + (
                f", {m['expert_rows'] / m['mean_rows']:.1f}x the mean" if m["mean_rows"] else "")
            spare = m["hbm_GB"] - m["total_GB"]
            verdict = (f"fits, {spare:.1f} GB to spare" if m["fits"] else f"does not fit, {-spare:.1f} GB over")
            turns = "; ".join(f"{s['key']} = {s['value']}: {s['total_GB']:.1f} GB" for s in m["sweep"]
                              if s["fits"] != m["fits"])
            body.append([f"`{card['name']}`", grid, m["model"], f"{m['total_GB']:.1f} (stage {m['stage']})",
                         f"{terms} ({rows})", f"{m['optimizer_host_GB']:.1f}", f"{verdict} of {m['hbm_GB']:.0f} GB",
                         turns or "none"])
    return _table(["card", "grid", "model", "busiest GPU, GB", "of it, GB", "optimizer in host memory, GB",
                   "verdict", "swept ends that turn the verdict (the busiest GPU there)"], body)


def _span(values: list[float], fmt: str) -> str:
    """mean (min-max) of values in fmt; the mean alone when they agree to fmt's precision."""
    mean, lo, hi = sum(values) / len(values), min(values), max(values)
    return fmt.format(mean) if fmt.format(lo) == fmt.format(hi) else \
        f"{fmt.format(mean)} ({fmt.format(lo)}-{fmt.format(hi)})"


def map_overheads(records: dict) -> str:
    """`relibra map --overheads`: each overhead, then the headline ratios with every overhead charged
    and with none, then ReLibra / EPLB+ by EPLB+'s spare slots."""
    out = records["map-overheads"]["runs"][0]["output"]
    text = _table(["overhead", "set-up card entry", "ReLibra's figure", "charged in the headline",
                   "headline ratios at the ends of its sweep"],
                  [[r["overhead"], f"`{r['card_entry']}`" if r["card_entry"].startswith(("overheads.", "training."))
                    else r["card_entry"], r["figure"], r["charged"], r["sweep"]] for r in out["overheads"]])
    slots = sorted({int(k.rsplit("_", 1)[1]) for r in out["ratios"] for k in r if k.startswith("relibra_over_eplb_plus_")})
    body = []
    for setting, what in (("card", "every overhead charged (the card)"), ("none", "none charged")):
        rows = [r for r in out["ratios"] if r["setting"] == setting]
        body.append([what, _span([r["relibra_over_megatron"] for r in rows], "{:.3f}")]
                    + [_span([r[f"relibra_over_eplb_plus_{n}"] for r in rows], "{:.3f}") for n in slots]
                    + [_span([100 * r["gap_to_balanced"] for r in rows], "{:.1f}%")])
    text += "\n" + _table(["charged", "ReLibra / Megatron"] + [f"ReLibra / EPLB+ ({n} spare slots)" for n in slots]
                          + ["gap to Balanced"], body)
    text += "\n" + _table(["EPLB+ spare slots", "ReLibra / EPLB+, EPLB+'s transfers free",
                           "ReLibra / EPLB+, charged like ReLibra's", "the paper's EPLB+"],
                          [[str(r["eplb+ spare slots"]), r["ReLibra / EPLB+, transfers free"],
                            r["ReLibra / EPLB+, charged like ReLibra"], "yes" if r["paper"] else "-"]
                           for r in out["eplb_plus_slots"]])
    return text


ROUTING_COLUMNS = (("max_over_mean", "max/mean"), ("gini", "Gini"), ("hottest_share", "hottest"),
                   ("skewness_ep16", "skew EP16"), ("skewness_ep32", "skew EP32"), ("mb_vs_step_corr", "mb vs step"),
                   ("mb_corr", "mb vs next"), ("step_corr", "step vs next"))


def _num(value, fmt: str) -> str:
    """value in fmt; "-" for an undefined statistic (null in the record's JSON)."""
    return "-" if value is None else fmt.format(value)


def routing_compare(records: dict) -> str:
    """`relibra routing compare` rows: source, level, experts, mean tokens of one unit, then ROUTING_COLUMNS."""
    rows = records["routing-compare"]["runs"][0]["output"]["rows"]
    body = [[r["source"], r["level"], str(r["experts"]), "~500 prompts" if r["tokens"] is None else f"{r['tokens']:.0f}"]
            + [_num(r[key], "{:.3f}" if key == "hottest_share" else "{:.2f}") for key, _ in ROUTING_COLUMNS]
            for r in rows]
    return _table(["source", "level", "experts", "tokens"] + [label for _, label in ROUTING_COLUMNS], body)


def routing_shift(records: dict) -> str:
    """Per micro-batch shift and workload: the micro-batch row's correlations and skew EP32, the step row's
    step-vs-next correlation and Gini (rows named "kit: CARD, MODEL, WORKLOAD, EP N, shift X")."""
    cells: dict[tuple[str, str], dict] = {}
    for r in records["routing-shift"]["runs"][0]["output"]["rows"]:
        if not r["source"].startswith("kit: "):
            continue
        parts = r["source"].split(", ")
        workload, shift = parts[2], parts[-1].removeprefix("shift ")
        cell = cells.setdefault((shift, workload), {})
        if r["level"] == "micro-batch":
            cell.update(mb_vs_step=r["mb_vs_step_corr"], mb_next=r["mb_corr"], skew=r["skewness_ep32"])
        else:
            cell.update(step_next=r["step_corr"], gini=r["gini"])
    shifts = list(dict.fromkeys(s for s, _ in cells))
    workloads = list(dict.fromkeys(w for _, w in cells))
    keys = ("mb_vs_step", "mb_next", "step_next", "skew", "gini")
    labels = ("mb vs step", "mb vs next", "step vs next", "mb skew EP32", "step Gini")
    header = ["shift"] + [f"`{w}` {label}" if i == 0 else label for w in workloads for i, label in enumerate(labels)]
    body = [[s] + [_num(cells[(s, w)].get(k), "{:.2f}") for w in workloads for k in keys] for s in shifts]
    return _table(header, body)


CALIBRATION_COLUMNS = (("static_skewness", "skew"), ("static_skewness_p95", "skew p95"),
                       ("mb_hot_overlap", "mb hot"), ("mb_corr", "mb corr"),
                       ("mb_vs_step_hot_overlap", "mb vs step hot"), ("step_hot_overlap", "step hot"),
                       ("step_corr", "step corr"), ("history_hot_overlap", "history hot"),
                       ("history_mb_hot_overlap", "history mb hot"))


def calibration(records: dict, name: str) -> str:
    """`relibra trace calibrate` rows: (model, workload, EP), then CALIBRATION_COLUMNS."""
    rows = records[name]["runs"][0]["output"]
    return _table(["model", "workload", "EP"] + [label for _, label in CALIBRATION_COLUMNS],
                  [[r["model"], r["workload"], str(r["ep"])] + [_num(r[k], "{:.2f}") for k, _ in CALIBRATION_COLUMNS]
                   for r in rows])


TRACE_STATS_COLUMNS = (("static_skewness", "static skewness", "{:.3f}"), ("static_skewness_p95", "p95", "{:.3f}"),
                       ("mb_hot_overlap", "hot overlap, consecutive micro-batches", "{:.3f}"),
                       ("mb_vs_step_hot_overlap", "micro-batch vs its step", "{:.3f}"),
                       ("step_hot_overlap", "consecutive steps", "{:.3f}"),
                       ("history_hot_overlap", "step vs history", "{:.3f}"),
                       ("history_mb_hot_overlap", "micro-batch vs history", "{:.3f}"))


def trace_stats(records: dict) -> str:
    """`relibra trace stats` per shipped file: shape, tokens routed, then TRACE_STATS_COLUMNS."""
    body = []
    for run in records["trace-stats"]["runs"]:
        r = run["output"]
        body.append([f"`{run['command'].split()[3]}`", r["model"], str(r["ep"]),
                     f"{r['steps']} x {r['micro_batches']} x {r['layers']}", f"{r['total_tokens']:,}"]
                    + [_num(r[k], fmt) for k, _, fmt in TRACE_STATS_COLUMNS])
    return _table(["file", "model", "EP", "steps x micro-batches x layers", "tokens routed"]
                  + [label for _, label, _ in TRACE_STATS_COLUMNS], body)


@dataclasses.dataclass(frozen=True)
class DataFile:
    """A measurement file outside data/bench/ that a table is rendered from: its path in the kit and the
    command that writes it (the file carries its own machine and date)."""

    path: str
    command: str


DATA_FILES = {
    "runtime-measured": DataFile("data/runtime_measured.json", ".venv/bin/python scripts/measure_runtime.py "
                                                                "--calibrate --repeats 3"),
    "planner-seconds": DataFile("data/planner_seconds.json", "python -m relibra.bench.planner_table"),
}


def load_data_file(name: str) -> dict:
    spec = DATA_FILES[name]
    path = ROOT / spec.path
    if not path.is_file():
        raise ConfigError(f"{path}: missing; run `{spec.command}`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc}); run `{spec.command}` again") from exc


def file_provenance(name: str, data: dict) -> str:
    """One line: the file, its command, its date and machine, and the 1-minute load averages it recorded."""
    spec, m = DATA_FILES[name], data["machine"]
    if isinstance(m, dict):
        machine = (f"{m.get('processor', '?')} ({m.get('cpus', '?')} logical CPUs, {m.get('platform', '?')}; "
                   f"Python {m.get('python', '?')}, torch {m.get('torch', '?')})")
    else:
        machine = f"{m}; Python {data.get('python', '?')}"
    date = data.get("date") or data.get("date_utc")
    loads = [x for run in data.get("runs", []) for x in run.get("load_average_1min", [])]
    load = f"; 1-minute load average {min(loads):.1f}-{max(loads):.1f} during the runs" if loads else ""
    return (f"Measured by `{spec.command}` ({spec.path}), {date + ', ' if date else ''}on {machine}{load}.\n")


def params_table(notebook: str) -> str:
    """A notebook's parameter table, made from its Params' declarations (relibra.experiments.base.param_table):
    the same declarations give the notebook's parameters and the command line's flags."""
    from relibra.studies.params import param_table
    from relibra.experiments.registry import get_notebook

    return param_table(get_notebook(notebook).Params)


@dataclasses.dataclass(frozen=True)
class DocTable:
    """A rendered table: the records it reads (the first one's provenance line closes it)."""

    records: tuple[str, ...]
    render: Callable[[dict], str]
    files: tuple[str, ...] = ()  # names in DATA_FILES, read instead of records


TABLES: dict[str, DocTable] = {
    "planner-speed": DocTable(("planner-speed",), planner_speed),
    "planner-skewness": DocTable(("planner-models",), planner_skewness),
    "planner-gap": DocTable(("planner-models",), planner_gap),
    "planner-cpu": DocTable(("planner-models",), planner_cpu),
    "planner-scale": DocTable(("planner-scale", "planner-speed"), planner_scale),
    "scale-sim": DocTable(("scale-sim",), scale_sim),
    "sim-speed": DocTable(("sim-speed",), sim_speed),
    "workload-scale": DocTable(("workload-scale",), workload_scale),
    "workload-speed": DocTable(("workload-speed",), lambda records: workload_scale(records, "workload-speed")),
    "planner-seconds": DocTable((), planner_seconds, files=("planner-seconds",)),
    "rl-trace-sim": DocTable(("rl-trace-sim",), rl_trace_sim),
    "layouts": DocTable(("layouts",), layouts),
    "map-overheads": DocTable(("map-overheads",), map_overheads),
    "routing-compare": DocTable(("routing-compare",), routing_compare),
    "routing-shift": DocTable(("routing-shift",), routing_shift),
    "calibrate-token-budget": DocTable(("calibrate-token-budget",),
                                       lambda records: calibration(records, "calibrate-token-budget")),
    "calibrate-one-sequence": DocTable(("calibrate-one-sequence",),
                                       lambda records: calibration(records, "calibrate-one-sequence")),
    "calibrate-workloads": DocTable(("calibrate-workloads",),
                                    lambda records: calibration(records, "calibrate-workloads")),
    "trace-stats": DocTable(("trace-stats",), trace_stats),
    "card-memory": DocTable(("card-memory",), card_memory),
    "runtime-measured": DocTable((), runtime_measured, files=("runtime-measured",)),
    "runtime-ranks": DocTable((), runtime_ranks, files=("runtime-measured",)),
    **{f"params-{nb.replace('_', '-')}": DocTable((), lambda records, nb=nb: params_table(nb))
       for nb in ("10_sensitivity", "12_verdict_map")},
}


def _glance(docs: Path) -> str:
    path = docs / "glance.md"
    if not path.exists():
        raise ConfigError(f"{path}: missing; `relibra reproduce --update-readme` writes it")
    text = path.read_text()
    return text if text.endswith("\n") else text + "\n"


# The blocks not rendered from benchmark records: name -> render(docs folder).
OTHER_BLOCKS: dict[str, Callable[[Path], str]] = {"setup-bounds": lambda docs: bounds_table(), "glance": _glance}


def render_table(name: str, folder: str | Path = BENCH_DIR, docs: str | Path = DOCS_DIR) -> str:
    """The text between block NAME's markers: a records table, then each record's provenance line, each after a
    blank line; or one of OTHER_BLOCKS."""
    if name in OTHER_BLOCKS:
        return OTHER_BLOCKS[name](Path(docs))
    if name not in TABLES:
        raise ConfigError(f"unknown docs table {name!r}; tables: {', '.join([*TABLES, *OTHER_BLOCKS])}")
    spec = TABLES[name]
    if spec.files:
        files = {f: load_data_file(f) for f in spec.files}
        return spec.render(files) + "\n" + "\n".join(file_provenance(f, files[f]) for f in spec.files)
    records = {r: load_record(r, folder) for r in spec.records}
    return spec.render(records) + "\n" + "\n".join(provenance(records[r]) for r in spec.records)


def marked_tables(text: str, where: str) -> list[tuple[str, int, int]]:
    """relibra.display.marked_blocks, with every name known (TABLES or OTHER_BLOCKS)."""
    found = marked_blocks(text, where)
    for name, _, _ in found:
        if name not in TABLES and name not in OTHER_BLOCKS:
            raise ConfigError(f"{where}: unknown docs table {name!r}; tables: {', '.join([*TABLES, *OTHER_BLOCKS])}")
    return found


def rendered_text(text: str, where: str, folder: str | Path = BENCH_DIR, docs: str | Path = DOCS_DIR) -> str:
    """`text` with every marked block replaced by its rendering."""
    marked_tables(text, where)  # every name known
    return with_blocks(text, lambda name, _: render_table(name, folder, docs), where)


def generated_files(docs: str | Path = DOCS_DIR) -> list[Path]:
    """The files whose blocks are generated: docs/*.md, and the README beside docs/ where there is one."""
    docs = Path(docs)
    readme = docs.parent / "README.md"
    return sorted(docs.glob("*.md")) + ([readme] if readme.exists() else [])


def update_docs(docs: str | Path = DOCS_DIR, folder: str | Path = BENCH_DIR, check: bool = False) -> list[str]:
    """Rewrite (or with check=True only compare) every marked block of generated_files(docs); the blocks that
    differed, as "file: name"."""
    stale = []
    for path in generated_files(docs):
        text = path.read_text()
        new = rendered_text(text, str(path), folder, docs)
        if new == text:
            continue
        old_blocks = {n: text[s:e] for n, s, e in marked_tables(text, str(path))}
        new_blocks = {n: new[s:e] for n, s, e in marked_tables(new, str(path))}
        stale += [f"{path}: {n}" for n in new_blocks if new_blocks[n] != old_blocks.get(n)]
        if not check:
            write_text(path, new)
    return stale


def main(argv=None) -> int:
    """`python -m relibra.bench.docs_tables [--check]`."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m relibra.bench.docs_tables",
                                description="Render every generated block of docs/*.md and README.md.")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
    p.add_argument("--docs", default=str(DOCS_DIR))
    p.add_argument("--records", default=str(BENCH_DIR))
    args = p.parse_args(argv)
    try:
        stale = update_docs(args.docs, args.records, check=args.check)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in stale:
        print(("differs: " if args.check else "rewrote: ") + line)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
