"""What the notebooks call: one module per notebook (relibra/experiments/notebooks/NN_name.py) with its
parameters, sizes per profile, typed result, compute function, narrative and "Try this" lessons (registry).
A notebook starts with

    run = ex.start("02_throughput", globals())
    result = run.compute()

which checks the parameters papermill injected against the module's Params, takes the module's sizes for the
profile and makes its output folder (out_dir; without one results/interactive/<notebook>/, never the
reproduction's results/<notebook>/); the notebook draws its figures from the result (relibra.plots) and
`run.finish()` writes manifest.json. relibra.report and relibra.glance read the results back.

Profiles (profiles.PROFILES): tiny (the tests), laptop (the default), paper, gpu. Same seed, same numbers;
wall-clock figures are measurements. Shared pieces: base, registry, run, profiles, traces, text; the
simulations the notebooks and the command line share are relibra.studies'.
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
