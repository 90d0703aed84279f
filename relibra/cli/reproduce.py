"""`relibra reproduce [--profile laptop|paper|gpu|tiny] [--out results] [-p NAME VALUE]... [NOTEBOOK...]`:
run the notebooks (their Jupytext sources notebooks/NN_name.py) through papermill, keep each executed
notebook beside its results (results/<nb>/<nb>.ipynb) with an HTML export (<nb>.html), and rebuild
results/REPORT.md and results/glance.md (the README's results table, relibra.glance) from every result
present under the output folder; with --update-readme, also docs/glance.md and the README's table.
./reproduce.sh calls it."""

from __future__ import annotations

import sys
import time

from relibra.errors import ConfigError
from relibra.paths import check_output_path, project_root
from relibra.reproduce import (DEFAULT_OUT, OutputLock, check_output_folder, check_own_options, check_parameters,
                               known, output_folder, parse_parameters, run_notebooks, select_notebooks)


def _reproduce(args) -> int:
    from relibra.glance import glance_notebooks, glance_rows, readme_block, update_readme, write_glance
    from relibra.report import write_report

    names = select_notebooks(args.notebooks)
    parameters = parse_parameters(args.parameter)
    out = check_own_options(names, bool(args.notebooks), args.seed, args.measured_dir, parameters, args.out)
    flag = "--out" if out == args.out else "-p out_dir"  # -p out_dir: the same checks as --out
    if out is not None:
        check_output_path(out, flag=flag)
    args.out = output_folder(out, args.seed or 0, parameters)
    check_output_folder(args.out, flag)
    check_parameters(names, args.profile, args.seed or 0, args.measured_dir, parameters)
    readme = project_root() / "README.md"
    if args.update_readme:  # a README without its markers fails now, not after the notebooks ran
        readme_block(readme.read_text(), str(readme))
        if parameters or args.seed:
            raise ConfigError("--update-readme takes the default parameters only: the README shows the default run")
    with OutputLock(args.out):  # one writer from the first notebook to the report
        if args.out != DEFAULT_OUT:
            print(f"results go to {args.out}")
        started = time.perf_counter()
        statuses = run_notebooks(names, args.profile, args.out, seed=args.seed or 0,
                                 measured_dir=args.measured_dir, extra_parameters=parameters,
                                 progress=not args.quiet)
        total = time.perf_counter() - started
        report = write_report(args.out, args.profile, statuses, total_seconds=total)
        glance = write_glance(args.out)
    failed = [n for n, s in statuses.items() if s["status"] != "ok"]
    print(f"{len(names) - len(failed)}/{len(names)} notebooks ok in {total / 60:.1f} min; report: {report}; "
          f"results table: {glance}")
    if failed:
        print(f"error: failed notebooks: {', '.join(failed)} (their executed copies in {args.out}/<notebook>.failed "
              f"show the cell)", file=sys.stderr)
        if args.update_readme:
            print("error: README.md and docs/glance.md left as they were: a run with failed notebooks updates "
                  "neither", file=sys.stderr)
        return 1
    if args.update_readme:
        if glance_rows(args.out).empty:
            raise ConfigError(f"--update-readme: {args.out} holds none of the results the README's table is built "
                              f"from (notebooks {', '.join(glance_notebooks())})")
        update_readme(glance, readme, readme.parent / "docs" / "glance.md")
        print(f"README.md's results table and docs/glance.md now hold {glance}")
    return 0


def register(sub) -> None:
    from relibra.glance import glance_notebooks

    NOTEBOOKS, PROFILES = known()

    p = sub.add_parser("reproduce", help="run the notebooks through papermill and rebuild results/REPORT.md",
                       description="Run every notebook (or the named ones) through papermill with one profile; "
                       "executed notebooks (.ipynb and .html), figures and CSVs go to OUT/<notebook>/; OUT/REPORT.md is "
                       "rebuilt from every notebook's results found under OUT, not only those just run, and so is "
                       "OUT/glance.md, the README's results table (--update-readme puts it there). "
                       f"Notebooks: {', '.join(NOTEBOOKS)}.")
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                   help="notebook names or numbers (e.g. 02 or 02_throughput); default: all")
    p.add_argument("--profile", default="laptop", choices=list(PROFILES),
                   help="sizes of every experiment (default laptop: all notebooks within 20 minutes on 2 cores)")
    p.add_argument("--out", default=None, help="output folder (default: results, or results/runs/<parameters> when "
                   "-p or --seed sets other parameters than the notebooks' defaults); one run writes to it at a time "
                   "(OUT/.reproduce.lock holds its pid)")
    p.add_argument("--seed", type=int, default=None, help="seed of every trace (default 0); an error for a notebook "
                   "that takes no seed")
    p.add_argument("--measured-dir", default=None,
                   help="folder of measured results from GPU nodes (gpu profile; default results/gpu_runs)")
    p.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="set a notebook parameter, as papermill's -p (e.g. -p ep 16); each is checked against "
                   "every chosen notebook's parameters (name, type, range) before any notebook starts; -p out_dir is "
                   "--out (the same checks), and what reproduce sets itself (profile, seed, measured_dir) is an error: "
                   "give its option")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--update-readme", action="store_true",
                   help="after a run where every notebook passed, copy OUT/glance.md (the results table built "
                   f"from the results of notebooks {', '.join(glance_notebooks())}) to docs/glance.md and into "
                   "README.md between its glance markers")
    p.set_defaults(func=_reproduce)
