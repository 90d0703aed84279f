"""The tiny-profile reference: every CSV and figure a tiny run writes, so that a change of the kit's structure
can be shown to change no number (tests/test_notebooks.py compares against it).

    relibra reproduce --profile tiny --out /tmp/tiny
    python -m relibra.experiments.golden --write tests/data/tiny_reference --from /tmp/tiny
    python -m relibra.experiments.golden --check tests/data/tiny_reference --from /tmp/tiny

It holds the CSVs and figures.json (sha256 of every PNG and SVG). A comparison takes numbers to 1e-12, text
exactly and figures byte for byte, leaving out what is measured: wall-clock seconds and the figures, rows and
facts (scope measured) that show them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from relibra.paths import write_text

# Measured, not computed: left out of every comparison ("*": in every CSV).
MEASURED_COLUMNS = {
    "*": ("plan_s", "plan_cpu_s", "replication_cpu_us_per_cell", "planner_vs_forward", "planner_hardware"),
    "08_runtime/measured.csv": ("seconds",), "08_runtime/rank_times.csv": ("cpu_s", "wall_s", "wait_s"),
    "08_runtime/step_results.csv": ("step_s_median", "step_s_min", "step_s_max", "plan_seconds", "speedup_vs_megatron",
                                    "speedup_ci_low", "speedup_ci_high", "cpu_speedup_vs_megatron",
                                    "cpu_speedup_ci_low", "cpu_speedup_ci_high", "hardware", "oversubscribed"),
    "09_rl_workload/rewards.csv": ("seconds",),
}
MEASURED_ROWS = {"02_throughput/overheads.csv": ("overhead", "planner time"),
                 "08_runtime/step_segments.csv": ("source", "measured")}
FACTS_MEASURED = ("scope", "measured")  # every notebook's facts.csv: its measured facts are left out
# ... and the runtime's texts that name the machine's load and cores (its simulated facts' `on` and titles)
MEASURED_COLUMNS["08_runtime/facts.csv"] = ("on", "readme")
MEASURED_FIGURES = ("07_overheads/planner_time", "08_runtime/runtime_per_rank", "08_runtime/runtime_speedup",
                    "08_runtime/runtime_step_segments", "09_rl_workload/reward", "09_rl_workload/expert_load_heatmaps",
                    "09_rl_workload/shift", "11_scale/planner_time")  # the last three: titles with the load average
FIGURES = "figures.json"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def figure_digests(results: Path) -> dict[str, str]:
    """{"<notebook>/<file>": sha256} of every computed PNG and SVG under `results`."""
    return {f"{p.parent.name}/{p.name}": _digest(p) for p in sorted(results.glob("*/*.png")) + sorted(
        results.glob("*/*.svg")) if f"{p.parent.name}/{p.stem}" not in MEASURED_FIGURES}


def write_reference(results: Path, reference: Path) -> int:
    """Copy every CSV of the tiny run `results` to `reference`, write its figures.json; returns the files kept."""
    csvs = sorted(results.glob("*/*.csv"))
    for csv in csvs:
        (reference / csv.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(csv, reference / csv.parent.name / csv.name)
    figures = figure_digests(results)
    write_text(reference / FIGURES, json.dumps(figures, indent=1, sort_keys=True) + "\n")
    return len(csvs) + len(figures)


def csv_differences(reference: Path, produced: Path, key: str) -> list[str]:
    """The columns of `produced` that differ from `reference` (numbers beyond 1e-12, text at all), leaving out
    the measured columns and rows of `key` ("<notebook>/<file>")."""
    a, b = pd.read_csv(reference), pd.read_csv(produced)
    if key in MEASURED_ROWS or key.endswith("/facts.csv"):
        column, value = MEASURED_ROWS.get(key, FACTS_MEASURED)
        a, b = a[a[column] != value].reset_index(drop=True), b[b[column] != value].reset_index(drop=True)
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return [f"columns {list(a.columns)} x {len(a)} rows, now {list(b.columns)} x {len(b)} rows"]
    skip = MEASURED_COLUMNS["*"] + MEASURED_COLUMNS.get(key, ())
    bad = []
    for c in (c for c in a.columns if c not in skip):
        x, y = a[c], b[c]
        if pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y):
            same = np.allclose(x.to_numpy(float), y.to_numpy(float), rtol=1e-12, atol=1e-12, equal_nan=True)
        else:
            same = (x.isna() == y.isna()).all() and (x[x.notna()].astype(str) == y[y.notna()].astype(str)).all()
        if not same:
            bad.append(c)
    return bad


def compare(reference: Path, results: Path) -> list[str]:
    """Every way the tiny run `results` differs from `reference` ([]: the same); a notebook the reference does
    not hold is not compared."""
    covered = {p.name for p in reference.iterdir() if p.is_dir()}
    kept = {f"{p.parent.name}/{p.name}" for p in reference.glob("*/*.csv")}
    written = {f"{p.parent.name}/{p.name}" for p in results.glob("*/*.csv") if p.parent.name in covered}
    problems = [f"{k}: not written" for k in sorted(kept - written)]
    problems += [f"{k}: not in the reference" for k in sorted(written - kept)]
    for key in sorted(kept & written):
        problems += [f"{key}: {c} differs" for c in csv_differences(reference / key, results / key, key)]
    for key, digest in json.loads((reference / FIGURES).read_text()).items():
        if not (results / key).exists() or _digest(results / key) != digest:
            problems.append(f"{key}: not the reference's bytes")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m relibra.experiments.golden", allow_abbrev=False,
                                description="Write or check the tiny-profile reference from a tiny run's folder.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", metavar="DIR", help="write the reference to DIR")
    what.add_argument("--check", metavar="DIR", help="compare the run against the reference in DIR")
    p.add_argument("--from", dest="results", required=True, metavar="RESULTS",
                   help="the folder of `relibra reproduce --profile tiny --out RESULTS`")
    args = p.parse_args(argv)
    results = Path(args.results)
    if args.write:
        print(f"wrote {write_reference(results, Path(args.write))} files to {args.write}")
        return 0
    problems = compare(Path(args.check), results)
    for line in problems:
        print(f"differs: {line}", file=sys.stderr)
    print(f"{results} {'is' if not problems else 'is NOT'} the reference {args.check}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
