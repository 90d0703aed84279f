"""What the notebooks call: every experiment of the kit as a function that returns a tidy DataFrame.

A notebook holds parameters, narrative and calls; the computation lives here (tested) and every
figure in relibra.plots. Each notebook starts with

    run = start("02_throughput", globals())
    result = run.compute()

which checks the parameters papermill injected against the notebook's parameters cell and every
value's range (parameters.py), resolves them against a *profile* (sizes that fit a machine), makes
`results/<notebook>/`, and returns a `Run`; `run.compute()` runs the notebook's compute function
(registry.py) and saves its typed result there, the notebook draws figures from it (PNG + SVG), and
`run.finish()` writes a `manifest.json`. relibra.report and relibra.glance read the typed results
back through the registry to write results/REPORT.md and the README's table.

Profiles (PROFILES):
- tiny:   seconds per notebook; the tests run every notebook with it.
- laptop: the default; every notebook on 2 CPU cores (docs/notebooks.md has the minutes). Paper-shaped
          models (128 experts, top-8, paper EP sizes and cluster) cut to their first few MoE layers and a
          few micro-batches per step, so the per-layer balance problem is the paper's.
- paper:  the paper's scale: every layer, 32 micro-batches per step, EP 32.
- gpu:    the paper's scale for simulations; measured results (runtime metrics written by
          `relibra run` under torchrun/NCCL on GPU nodes) are read from `measured_dir`.

Same seed, same numbers: every trace comes from the seed; wall-clock figures (planner seconds, the
runtime's measured times) are measurements and vary run to run.

One module per concept; this package re-exports every public name, so callers use
`relibra.experiments.<name>`:
- profiles:    Scale, Profile, PROFILES, get_profile
- registry:    SPECS, one NotebookSpec per notebook (parameters dataclass, default policies, compute
               function and its typed result, narrative, README rows); NOTEBOOKS, resolve
- results:     Result, the typed result's base (tables saved as CSV, read back by REPORT.md and the README)
- config:      Config, resolve_config, scaled_model, project_root
- parameters:  start (checks a notebook's parameters against its spec)
- run:         Run (computes the spec's result; figures, tables, manifest of one notebook run)
- narrative:   the text each notebook prints after its results, computed from them (import the module)
- machine:     environment (versions, hardware), this_machine ('measured (...)' labels)
- headline:    PAPER_CLAIMS, headline_ratios
- traces:      make_trace (cached synthetic traces), workload_traces, plan_steps
- simulation:  simulate_trace, throughput_grid, plan_metrics, simulate_with_plans, simulate_workloads
- tutorial (00), dynamics (01), reordering (04), replication (05), skewness (06), overheads (07),
  runtime (08), rl (09), sensitivity (10), scale (11): what each notebook computes beyond the shared
  pieces above.
"""

from __future__ import annotations

from relibra.experiments.config import Config, jsonable, project_root, resolve_config, scaled_model
from relibra.experiments.dynamics import (
    SHIFT_COMPARISONS,
    distribution_distance,
    expert_load_table,
    prediction_error_table,
    shift_table,
    static_skewness_table,
)
from relibra.experiments.headline import PAPER_CLAIMS, headline_ratios
from relibra.experiments.machine import environment, this_machine
from relibra.experiments.overheads import full_model_memory_share, overhead_table, planner_seconds
from relibra.experiments.profiles import PROFILES, Profile, Scale, ScaleSweep, get_profile
from relibra.experiments.reordering import reorder_table
from relibra.experiments.replication import default_spare_slots, replication_table, spare_slot_sweep
from relibra.experiments.rl import RL_OVERRIDES, RL_TORCH_THREADS, rl_workload
from relibra.experiments.parameters import (
    check_names,
    check_values,
    declared_parameters,
    injected_names,
    notebook_source,
    start,
)
from relibra.experiments.registry import (
    NOTEBOOK_PARAMETERS,
    NOTEBOOK_POLICIES,
    NOTEBOOKS,
    SPECS,
    NotebookSpec,
    get_spec,
    resolve,
)
from relibra.experiments.results import Result
from relibra.experiments.run import Run
from relibra.experiments.runtime import (
    SEGMENTS,
    measured_runtime,
    paired_ratio_ci,
    recorded_runtime,
    runtime_comparison,
    runtime_request,
)
from relibra.experiments.simulation import (
    history_steps,
    make_policy,
    plan_metrics,
    simulate_trace,
    simulate_with_plans,
    simulate_workloads,
    throughput_grid,
)
from relibra.experiments.scale import SCALE_POLICIES, best_other, scale_cases, scale_sweep, scale_table, sweep_of
from relibra.experiments.sensitivity import KNOBS, config_sensitivity, sensitivity, tornado_table
from relibra.experiments.sensitivity import knob_values as sensitivity_knob_values
from relibra.experiments.skewness import plan_skewness, skewness_sweep
from relibra.experiments.traces import _TRACE_CACHE, make_trace, plan_steps, workload_traces  # noqa: F401  (tests clear the cache)
from relibra.experiments.tutorial import (
    TUTORIAL_EP_SIZES,
    TUTORIAL_MAX_SPARE_SLOTS,
    TUTORIAL_MODEL,
    TUTORIAL_PHASES,
    TUTORIAL_PLACEMENTS,
    replica_table,
    tutorial_args,
    tutorial_skew_sweep,
    tutorial_case,
    tutorial_grid,
    tutorial_policy,
    tutorial_topology,
    tutorial_trace,
)

__all__ = [
    # profiles and configuration
    "Scale", "Profile", "PROFILES", "get_profile", "NOTEBOOKS", "NOTEBOOK_POLICIES", "SPECS", "NotebookSpec",
    "get_spec", "Result", "Config", "resolve", "resolve_config", "scaled_model", "project_root", "jsonable",
    # one notebook run, the machine, the headline
    "Run", "start", "NOTEBOOK_PARAMETERS", "declared_parameters", "injected_names", "check_names", "check_values",
    "notebook_source", "environment", "this_machine", "PAPER_CLAIMS", "headline_ratios",
    # traces, plans, simulation
    "make_trace", "workload_traces", "plan_steps", "history_steps", "make_policy", "simulate_trace",
    "throughput_grid", "plan_metrics", "simulate_with_plans", "simulate_workloads",
    # 00 tutorial
    "TUTORIAL_MODEL", "TUTORIAL_PLACEMENTS", "TUTORIAL_EP_SIZES", "TUTORIAL_MAX_SPARE_SLOTS", "TUTORIAL_PHASES",
    "tutorial_topology", "tutorial_skew_sweep",
    "tutorial_trace", "tutorial_policy", "tutorial_case", "tutorial_args", "tutorial_grid", "replica_table",
    # 01 routing dynamics
    "expert_load_table", "SHIFT_COMPARISONS", "shift_table", "distribution_distance", "prediction_error_table",
    "static_skewness_table",
    # 04 reordering, 05 replication, 06 skewness, 07 overheads
    "reorder_table", "replication_table", "default_spare_slots", "spare_slot_sweep", "plan_skewness",
    "skewness_sweep", "planner_seconds", "full_model_memory_share", "overhead_table",
    # 08 runtime, 09 RL workload
    "SEGMENTS", "runtime_request", "measured_runtime", "runtime_comparison", "recorded_runtime", "paired_ratio_ci",
    "RL_OVERRIDES", "RL_TORCH_THREADS", "rl_workload",
    # 10 sensitivity
    "KNOBS", "sensitivity", "config_sensitivity", "tornado_table", "sensitivity_knob_values",
    # 11 scale
    "ScaleSweep", "SCALE_POLICIES", "scale_cases", "scale_sweep", "scale_table", "sweep_of", "best_other",
]
