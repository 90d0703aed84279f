"""`relibra reproduce [--profile laptop|paper|gpu|tiny] [--out results] [NOTEBOOK...]`: run the notebooks
through papermill, keep each executed notebook beside its results (results/<nb>/<nb>.ipynb), and
write results/REPORT.md. ./reproduce.sh calls it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from relibra.errors import ConfigError


def notebook_dir() -> Path:
    from relibra.experiments import project_root

    return project_root() / "notebooks"


def select_notebooks(names: list[str] | None) -> list[str]:
    """Full notebook names from names, numbers or suffixes ('02', '02_throughput', 'throughput')."""
    from relibra.experiments import NOTEBOOKS

    if not names:
        return list(NOTEBOOKS)
    chosen = []
    for raw in names:
        name = Path(raw).stem  # accept notebooks/02_throughput.ipynb too
        hits = [n for n in NOTEBOOKS if n == name or n.split("_", 1)[0] == name or n.split("_", 1)[1] == name]
        if len(hits) != 1:
            raise ConfigError(f"unknown notebook {raw!r}; known: {', '.join(NOTEBOOKS)} (or their numbers)")
        if hits[0] not in chosen:
            chosen.append(hits[0])
    return chosen


def run_notebooks(names: list[str], profile: str, out_dir: str | os.PathLike, seed: int = 0,
                  measured_dir: str | None = None, extra_parameters: dict | None = None,
                  progress: bool = True, kernel_name: str = "python3") -> dict[str, dict]:
    """Execute each notebook with papermill; returns {notebook: {status, wall_seconds, error}}.

    A failing notebook is recorded and the others still run. Executed copies are written to
    <out_dir>/<nb>/<nb>.ipynb (with the error cell, when one failed).
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError
    from tqdm.auto import tqdm

    from relibra.experiments import get_profile, project_root

    get_profile(profile)
    out_dir = Path(out_dir).resolve()
    src_dir = notebook_dir()
    # The kernel inherits these: deterministic hashing, no GUI backend.
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ["MPLBACKEND"] = "Agg"
    statuses: dict[str, dict] = {}
    bar = tqdm(names, desc=f"notebooks ({profile})", unit="nb", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        nb_out = out_dir / name
        nb_out.mkdir(parents=True, exist_ok=True)
        params = {"profile": profile, "out_dir": str(nb_out), "seed": int(seed)}
        if measured_dir:
            params["measured_dir"] = str(measured_dir)
        if name == "00_tutorial":
            params["interactive"] = False  # headless: no widgets, the static figures only
        params.update(extra_parameters or {})
        started = time.perf_counter()
        status = {"status": "ok", "profile": profile}
        try:
            pm.execute_notebook(str(src_dir / f"{name}.ipynb"), str(nb_out / f"{name}.ipynb"), parameters=params,
                                kernel_name=kernel_name, progress_bar=False, cwd=str(project_root()))
        except PapermillExecutionError as exc:
            status = {"status": "failed", "profile": profile, "error": f"{exc.ename}: {str(exc.evalue)[:300]}"}
        except Exception as exc:  # the kernel died, the notebook file is missing...
            status = {"status": "failed", "profile": profile, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        status["wall_seconds"] = round(time.perf_counter() - started, 1)
        statuses[name] = status
        msg = f"{name}: {status['status']} in {status['wall_seconds']:.1f} s"
        if status["status"] != "ok":
            msg += f"  ({status['error']})"
        if progress:
            bar.write(msg)
    return statuses


def _reproduce(args) -> int:
    from relibra.report import write_report

    names = select_notebooks(args.notebooks)
    started = time.perf_counter()
    statuses = run_notebooks(names, args.profile, args.out, seed=args.seed, measured_dir=args.measured_dir,
                             progress=not args.quiet)
    total = time.perf_counter() - started
    report = write_report(args.out, args.profile, statuses, total_seconds=total)
    failed = [n for n, s in statuses.items() if s["status"] != "ok"]
    print(f"{len(names) - len(failed)}/{len(names)} notebooks ok in {total / 60:.1f} min; report: {report}")
    if failed:
        print(f"error: failed notebooks: {', '.join(failed)} (their executed copies under {args.out} show the cell)")
        return 1
    return 0


def register(sub) -> None:
    from relibra.experiments import NOTEBOOKS, PROFILES

    p = sub.add_parser("reproduce", help="run the notebooks through papermill and write results/REPORT.md",
                       description="Run every notebook (or the named ones) through papermill with one profile; "
                       "executed notebooks, figures and CSVs go to OUT/<notebook>/, the report to OUT/REPORT.md. "
                       f"Notebooks: {', '.join(NOTEBOOKS)}.")
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                   help="notebook names or numbers (e.g. 02 or 02_throughput); default: all")
    p.add_argument("--profile", default="laptop", choices=list(PROFILES),
                   help="sizes of every experiment (default laptop: all notebooks within 20 minutes on 2 cores)")
    p.add_argument("--out", default="results", help="output folder (default results)")
    p.add_argument("--seed", type=int, default=0, help="seed of every trace (default 0)")
    p.add_argument("--measured-dir", default=None,
                   help="folder of measured results from GPU nodes (gpu profile; default results/gpu_runs)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_reproduce)
