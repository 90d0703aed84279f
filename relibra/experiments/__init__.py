"""What the notebooks call: one module per notebook (relibra/experiments/notebooks/NN_name.py) holding
its parameters, its sizes per profile, its typed result, its compute function, its narrative and its
"Try this" lessons; the registry finds them. Each notebook starts with

    run = ex.start("02_throughput", globals())
    result = run.compute()

which checks the parameters papermill injected against the module's Params (each value parsed and
checked by its field's Kind), takes the module's sizes for the chosen profile, makes its output
folder (out_dir; without one, `results/interactive/<notebook>/`, so that a run in JupyterLab never
replaces the reproduction's `results/<notebook>/`, which `relibra reproduce` names) and returns a Run;
`run.compute()` runs the module's compute(params, sizes) and saves its typed result there, the
notebook draws figures from it (relibra.plots, PNG + SVG), and
`run.finish()` writes manifest.json. relibra.report and relibra.glance read the typed results back
through the registry to write results/REPORT.md and the README's table.

Profiles (profiles.PROFILES): tiny (seconds per notebook; the tests), laptop (the default: every
notebook on 2 CPU cores), paper (the paper's scale), gpu (the paper's scale for simulations; measured
results of GPU runs read from `measured_dir`). Same seed, same numbers: every trace comes from the
seed; wall-clock figures (planner seconds, the runtime's measured times) are measurements.

Shared pieces: base (Result, TryThis; the parameter spec is relibra.studies.params), registry, run
(Run, start), profiles, traces (TraceParams, SimParams, make_trace), text (show, ranked, README cells),
and the libraries of single notebooks: tutorial (00), dynamics (01, 09). The simulations the notebooks
and the command line share are relibra.studies'; notebook 08's runtime engine is relibra.runtime.measure.
"""

from __future__ import annotations

from relibra.experiments.profiles import PROFILES, SCALES, get_profile
from relibra.experiments.registry import NOTEBOOKS, get_notebook, load_results
from relibra.experiments.run import Run, declared_parameters, injected_names, start
from relibra.experiments.text import show
from relibra.machine import environment, this_machine
from relibra.paths import project_root

__all__ = ["NOTEBOOKS", "PROFILES", "SCALES", "Run", "declared_parameters", "environment", "get_notebook",
           "get_profile", "injected_names", "load_results", "project_root", "show", "start", "this_machine"]
