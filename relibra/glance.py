"""The README's "Results at a glance" table, built from what a reproduction run wrote, never typed.

`write_glance(out)` reads the tables the notebooks left under `out` (default results/):

    02_throughput/throughput.csv   the three headline ratios (relibra.experiments.headline_ratios)
    06_skewness/skewness.csv       rank skewness per policy over EP sizes
    07_overheads/overheads.csv     planner seconds (measured) and migration / replica memory (simulated)
    08_runtime/step_results.csv    the megatron-core runtime's step time on the CPU, next to the simulator
    10_sensitivity/tornado.csv     which knob moves ReLibra / Megatron most

and writes `out/glance.md`: one markdown table, columns what | figure | how it was obtained
(simulated or measured, on what, at which profile, from which file). A row whose table is missing
is left out; a table that lacks a column the row needs is an error naming the file.

`relibra reproduce` writes it after REPORT.md; `relibra reproduce --update-readme` also copies it to
docs/glance.md and puts it between the README's `<!-- glance:begin -->` and `<!-- glance:end -->`
markers (`update_readme`), so the README's numbers are those of the last full run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from relibra.errors import ConfigError

BEGIN = "<!-- glance:begin -->"
END = "<!-- glance:end -->"
HEADER = ("<!-- written by `relibra reproduce` (relibra/glance.py) from the tables under {out}/; "
          "do not edit: run `./reproduce.sh --update-readme` -->")
SOURCES = {"02_throughput": "throughput.csv", "06_skewness": "skewness.csv", "07_overheads": "overheads.csv",
           "08_runtime": "step_results.csv", "10_sensitivity": "tornado.csv"}


# ---- reading one notebook's output -----------------------------------------------------------------
def _table(out_dir: Path, notebook: str, columns: tuple[str, ...], name: str | None = None) -> pd.DataFrame | None:
    """<out_dir>/<notebook>/<name> (default: the notebook's csv in SOURCES; None when absent); a
    ConfigError names missing columns."""
    path = out_dir / notebook / (name or SOURCES[notebook])
    if not path.exists():
        return None
    table = pd.read_csv(path)
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}; rerun notebook {notebook}")
    if table.empty:
        raise ConfigError(f"{path}: holds no rows; rerun notebook {notebook}")
    return table


def _manifest(out_dir: Path, notebook: str) -> dict:
    path = out_dir / notebook / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _profile(man: dict) -> str:
    """'laptop profile: first 4 MoE layers, ...' from the manifest, or say that it is unknown."""
    return man.get("scale_note") or "profile unknown (no manifest.json)"


def _source(notebook: str) -> str:
    return f"`{notebook}/{SOURCES[notebook]}`"


def _cluster(name) -> str:
    """'`paper` cluster preset (20 x 8 GPUs)', or the bare name for a spec the kit cannot parse."""
    from relibra.cluster import resolve_topology
    from relibra.errors import RelibraError

    try:
        topo = resolve_topology(str(name))
    except RelibraError:
        return f"`{name}` cluster"
    return f"`{name}` cluster preset ({topo.num_nodes} x {topo.gpus_per_node} GPUs)"


def _label(policy: str) -> str:
    from relibra.experiments.narrative import label

    return label(policy)


def _span(values: pd.Series, fmt: str = "{:.2f}") -> str:
    lo, hi = float(values.min()), float(values.max())
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def _unique(table: pd.DataFrame, column: str) -> str:
    return ", ".join(str(v) for v in dict.fromkeys(table[column]))


# ---- one function per notebook: its rows ----------------------------------------------------------
def headline_rows(out_dir: Path) -> list[dict]:
    """ReLibra / Megatron, ReLibra / EPLB+ and the gap to Balanced (notebook 02)."""
    from relibra.experiments import headline_ratios

    t = _table(out_dir, "02_throughput", ("model", "workload", "policy", "tokens_per_s"))
    if t is None:
        return []
    man = _manifest(out_dir, "02_throughput")
    cfg = man.get("config", {})
    cluster = cfg.get("cluster", _unique(t, "cluster") if "cluster" in t else "?")
    ep = cfg.get("ep", _unique(t, "ep") if "ep" in t else "?")
    how = (f"**simulated** on the {_cluster(cluster)}, EP {ep}, synthetic RL traces of "
           f"{t['model'].nunique()} model(s) x {t['workload'].nunique()} workload(s); {_profile(man)} "
           f"({_source('02_throughput')})")
    rows = []
    for r in headline_ratios(t).itertuples(index=False):
        rows.append({"what": r.claim, "figure": f"{r.kit} ({r.where_best}); {r.range} over {r.cases} cases; "
                     f"paper: {r.paper}", "how it was obtained": how})
    return rows


def skewness_rows(out_dir: Path) -> list[dict]:
    """Mean rank skewness of each policy's plans over the EP sweep (notebook 06)."""
    t = _table(out_dir, "06_skewness", ("sweep", "model", "workload", "ep", "policy", "skewness"))
    if t is None:
        return []
    sweep = t[t["sweep"] == "ep"] if (t["sweep"] == "ep").any() else t
    eps = sorted(int(e) for e in sweep["ep"].unique())
    per = "; ".join(f"{_label(p)} {_span(d['skewness'])}" for p, d in sweep.groupby("policy", sort=False))
    where = f"EP {eps[0]}" if len(eps) == 1 else f"EP {eps[0]}-{eps[-1]}"
    man = _manifest(out_dir, "06_skewness")
    cluster = man.get("config", {}).get("cluster")
    on = f"nodes of the {_cluster(cluster)}" if cluster else "the notebook's cluster preset"
    how = (f"**simulated**: policies' plans on synthetic RL traces of {_unique(sweep, 'model')}, "
           f"{_unique(sweep, 'workload')}, {on}, no cost model; {_profile(man)} ({_source('06_skewness')})")
    return [{"what": f"rank skewness (max / mean tokens per GPU), mean over plans, {where}", "figure": per,
             "how it was obtained": how}]


def overhead_rows(out_dir: Path) -> list[dict]:
    """Planner seconds per step (measured) and ReLibra's migration and replica memory (notebook 07)."""
    t = _table(out_dir, "07_overheads", ("model", "ep", "cluster", "policy", "plan_s", "planner_vs_forward",
                                         "migration_share", "replica_memory_share_full_model",
                                         "transfer_overlap", "planner_hardware"))
    if t is None:
        return []
    man = _manifest(out_dir, "07_overheads")
    case = f"{_unique(t, 'model')}, EP {_unique(t, 'ep')}"
    planners = "; ".join(f"{_label(r.policy)} {r.plan_s:.3g} s ({r.planner_vs_forward:.2g}x the forward pass)"
                         for r in t.itertuples(index=False))
    rows = [{"what": f"planner wall time per step, {case}", "figure": planners,
             "how it was obtained": f"**measured** on {_unique(t, 'planner_hardware')}; forward pass "
             f"simulated on the {_cluster(t['cluster'].iloc[0])}; {_profile(man)} ({_source('07_overheads')})"}]
    relibra = t[t["policy"] == "relibra"]
    if len(relibra):
        r = relibra.iloc[0]
        overlap = ("no replica transfers" if pd.isna(r["transfer_overlap"])
                   else f"{100 * r['transfer_overlap']:.0f}% of replica transfers hidden behind attention")
        rows.append({"what": f"ReLibra migration and replica memory, {case}",
                     "figure": f"migration {100 * r['migration_share']:.2f}% of step time; replica buffer "
                     f"{100 * r['replica_memory_share_full_model']:.2f}% of parameter memory per GPU (whole model); "
                     f"{overlap}",
                     "how it was obtained": f"**simulated** on the {_cluster(r['cluster'])}; {_profile(man)} "
                     f"({_source('07_overheads')})"})
    return rows


def runtime_rows(out_dir: Path) -> list[dict]:
    """The megatron-core runtime's measured step seconds next to the simulator's (notebook 08)."""
    t = _table(out_dir, "08_runtime", ("policy", "step_s_median", "sim_step_s", "model", "hardware", "ranks",
                                       "nodes"))
    if t is None:
        return []
    g = t.groupby("policy", sort=False).agg(measured=("step_s_median", "median"), sim=("sim_step_s", "median"))
    figure = "; ".join(f"{_label(p)} {r.measured:.3g} s measured, {r.sim:.3g} s simulated" for p, r in g.iterrows())
    if "megatron" in g.index:
        ref = g.loc["megatron"]
        figure += "".join(f"; {_label(p)} / Megatron {ref.measured / r.measured:.2f}x measured, "
                          f"{ref.sim / r.sim:.2f}x simulated" for p, r in g.iterrows() if p != "megatron")
    over = bool(t["oversubscribed"].any()) if "oversubscribed" in t else False
    man = _manifest(out_dir, "08_runtime")
    # the manifest's label carries the machine's load during the run (wall-clock times depend on it)
    measured_on = next((s["hardware"] for s in man.get("sources", []) if s.get("source") == "measured"),
                       _unique(t, "hardware"))
    profile = man.get("config", {}).get("profile")
    sizes = (f"{_unique(t, 'steps')} timed step(s) after {_unique(t, 'warmup_steps')} warm-up, "
             if {"steps", "warmup_steps"} <= set(t.columns) else "")
    sizes += f"{t['repeat'].nunique()} launch(es)" if "repeat" in t else "one launch"
    how = (f"**measured**: megatron-core on gloo, {_unique(t, 'ranks')} ranks as {_unique(t, 'nodes')} node(s), "
           f"model `{_unique(t, 'model')}`, on {measured_on}"
           + (" (OVERSUBSCRIBED: ranks > cores, the times say nothing about speed)" if over else "")
           + "; simulated on the fitted CPU preset; "
           + (f"{profile} profile: " if profile else "profile unknown (no manifest.json): ")
           + f"{sizes} ({_source('08_runtime')})")
    return [{"what": "runtime step time on the CPU (median over repeats)", "figure": figure,
             "how it was obtained": how}]


def recorded_runtime_rows(out_dir: Path) -> list[dict]:
    """The shipped idle-machine runtime measurement as notebook 08 copies it (recorded_step_results.csv):
    per node layout, the median over launches of each policy's median step, measured and simulated."""
    t = _table(out_dir, "08_runtime", ("nodes_x_ranks", "policy", "step_s_median", "sim_step_s", "load_before",
                                       "load_after", "date", "cpus"), name="recorded_step_results.csv")
    if t is None:
        return []
    rows = []
    for layout, d in t.groupby("nodes_x_ranks", sort=False):
        g = d.groupby("policy", sort=False).agg(measured=("step_s_median", "median"), sim=("sim_step_s", "median"))
        if "megatron" not in g.index:
            continue
        ref = g.loc["megatron"]
        figure = "; ".join(f"{_label(p)} / Megatron {ref.measured / r.measured:.2f}x measured, "
                           f"{ref.sim / r.sim:.2f}x simulated" for p, r in g.iterrows() if p != "megatron")
        figure += "; simulated / measured step " + ", ".join(
            f"{_label(p)} {r.sim / r.measured:.2f}" for p, r in g.iterrows())
        rows.append({"what": f"runtime speed-up on an idle CPU, {layout} (nodes x ranks per node), `moe-cpu`",
                     "figure": figure,
                     "how it was obtained": f"**measured**: megatron-core on gloo, one rank per core of a "
                     f"{_unique(t, 'cpus')}-core machine, {_unique(t, 'date')}, 1-min load "
                     f"{d['load_before'].min():.1f}-{d['load_after'].max():.1f}; medians of "
                     f"{d['launch'].nunique()} launch(es) x {_unique(d, 'steps')} timed steps; simulated on the CPU preset fitted "
                     f"just before (`scripts/measure_runtime.py --calibrate`, data/runtime_measured.json, "
                     f"`08_runtime/recorded_step_results.csv`)"})
    return rows


def sensitivity_rows(out_dir: Path) -> list[dict]:
    """The knob that moves ReLibra / Megatron most, and the next one (notebook 10)."""
    t = _table(out_dir, "10_sensitivity", ("ratio", "knob", "default", "low", "high", "low_value", "high_value",
                                           "swing"))
    if t is None:
        return []
    t = t[t["ratio"] == "relibra_over_megatron"].sort_values("swing", ascending=False, kind="stable")
    if t.empty:
        raise ConfigError(f"{out_dir / '10_sensitivity' / 'tornado.csv'}: no relibra_over_megatron rows; "
                          "rerun notebook 10_sensitivity")
    knobs = "; then ".join(f"{k.knob}: {k.low:.2f}x ({k.low_value}) to {k.high:.2f}x ({k.high_value})"
                           for k in t.head(2).itertuples(index=False))
    man = _manifest(out_dir, "10_sensitivity")
    cfg = man.get("config", {})
    setup = (f"{cfg['model']}, {cfg['workload']}, EP {cfg['ep']} on the {_cluster(cfg['cluster'])}"
             if all(k in cfg for k in ("model", "workload", "ep", "cluster")) else "the notebook's default set-up")
    return [{"what": "what moves ReLibra / Megatron most (one knob at a time)",
             "figure": f"default {float(t['default'].iloc[0]):.2f}x; most with {knobs}",
             "how it was obtained": f"**simulated**, {setup}; {_profile(man)} ({_source('10_sensitivity')})"}]


def scale_rows(out_dir: Path) -> list[dict]:
    """relibra-h against the best other policy at the largest EP of each (model, cluster) (notebook 11)."""
    t = _table(out_dir, "11_scale", ("model", "cluster", "ep", "speedup", "frac_of_balanced_compute", "best_other",
                                     "over_best_other"), name="relibra_h_vs_best.csv")
    if t is None:
        return []
    top = t.loc[t.groupby(["model", "cluster"], sort=False)["ep"].idxmax()]
    figure = "; ".join(f"{r.model} EP{r.ep} on {r.cluster}: {r.speedup:.2f}x Megatron, "
                       f"{r.frac_of_balanced_compute:.3f} of balanced-compute, {r.over_best_other:.3f}x "
                       f"{_label(r.best_other)}" for r in top.itertuples(index=False))
    behind = int((t["over_best_other"] < 1 - 1e-9).sum())
    figure += f"; behind the best other policy in {behind} of {len(t)} cases"
    man = _manifest(out_dir, "11_scale")
    return [{"what": "relibra-h (cross-node replicas) at the largest EP, against the best other policy",
             "figure": figure,
             "how it was obtained": f"**simulated** on each named cluster; {_profile(man)} "
                                    f"(`11_scale/relibra_h_vs_best.csv`)"}]


ROWS = (headline_rows, skewness_rows, overhead_rows, runtime_rows, recorded_runtime_rows, sensitivity_rows,
        scale_rows)


# ---- the table, the file, the README ----------------------------------------------------------------
def glance_rows(out_dir: str | Path) -> pd.DataFrame:
    """Every row whose input table is present under out_dir: columns what, figure, how it was obtained."""
    out_dir = Path(out_dir)
    rows = [row for make in ROWS for row in make(out_dir)]
    hows = [row["how it was obtained"] for row in rows]
    for i in range(1, len(rows)):  # a "how" repeated from the row above reads "same as above"
        if hows[i] == hows[i - 1]:
            rows[i]["how it was obtained"] = "same as above"
    return pd.DataFrame(rows, columns=["what", "figure", "how it was obtained"])


def glance_markdown(out_dir: str | Path) -> str:
    """The glance file's text: a header comment and the table (or a line saying nothing has run)."""
    from relibra.report import _md_table

    rows = glance_rows(out_dir)
    if rows.empty:
        body = (f"No reproduction results under {out_dir} yet (none of "
                + ", ".join(f"{n}/{f}" for n, f in SOURCES.items()) + "): run ./reproduce.sh.")
    else:
        body = _md_table(rows)
    return f"{HEADER.format(out=Path(out_dir).as_posix().rstrip('/'))}\n{body}\n"


def write_glance(out_dir: str | Path) -> Path:
    """Write <out_dir>/glance.md (see the module docstring); returns its path."""
    path = Path(out_dir) / "glance.md"
    path.write_text(glance_markdown(out_dir))
    return path


def readme_block(text: str, where: str = "README.md") -> str:
    """The text between the glance markers of `text` (from after BEGIN's line to END)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < 0 or end < start or text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ConfigError(f"{where}: needs exactly one '{BEGIN}' line followed by one '{END}' line around the "
                          "results table")
    return text[start + len(BEGIN):end].removeprefix("\n")


def replace_block(text: str, block: str, where: str = "README.md") -> str:
    """`text` with the glance block replaced by `block` (which ends with a newline)."""
    readme_block(text, where)  # checks the markers
    start, end = text.find(BEGIN) + len(BEGIN), text.find(END)
    return text[:start] + "\n" + block + text[end:]


def update_readme(glance: str | Path, readme: str | Path, docs_copy: str | Path) -> None:
    """Copy the glance file to docs_copy (committed) and put its text between the README's markers."""
    glance, readme, docs_copy = Path(glance), Path(readme), Path(docs_copy)
    block = glance.read_text()
    if not block.endswith("\n"):
        block += "\n"
    text = replace_block(readme.read_text(), block, str(readme))
    docs_copy.parent.mkdir(parents=True, exist_ok=True)
    docs_copy.write_text(block)
    readme.write_text(text)
