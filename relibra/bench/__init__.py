"""Benchmarks and calibrations that print or store their figures (`relibra bench ...`,
`python -m relibra.bench.planner_table`): speed and memory targets are measured here, never in timed
unit tests.

planner: each policy's whole-step plan (seconds, peak memory, plan size, validate seconds);
sim: the cost model on one planned step;
gemm: time a SwiGLU expert and fit the cost model's GEMM curve (the fitted presets use it);
workload: the trace generator's speed and the calibration table of generated traces;
planner_table: the run-time planners' seconds per (micro-batch, layer) the cost model charges;
records: named lists of those commands whose figures, dates and machine `relibra bench record` keeps
in data/bench/NAME.json; docs_tables: the docs' measured tables, rendered from those records.

gloo: gloo's all-to-all and point-to-point on local ranks, and the latency + bandwidth fit;
runtime_modules: the runtime's expert and attention modules timed, and the attention-efficiency fit;
cpu_preset: the `cpu-gloo` and `cpu-gloo-fit` presets fitted from those measurements;
calibrate: the `relibra calibrate` command over cpu_preset;
device: the GPU checks of scripts/device_check.sh (expert GEMMs in bf16, a preset fitted from them).

runtime_modules and cpu_preset (and calibrate, through it) use the runtime (its model, its launcher),
so they sit above relibra.runtime; the others sit below it (records and docs_tables read and write JSON
only; `relibra bench record` runs the commands from relibra.cli). Nothing in the runtime imports relibra.bench.
"""
