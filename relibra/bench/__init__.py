"""Benchmarks and calibrations that print or store their figures (`relibra bench ...`,
`python -m relibra.bench.planner_table`): speed and memory targets are measured here, never in timed
unit tests.

planner: each policy's whole-step plan (seconds, peak memory, plan size, validate seconds);
sim: the cost model on one planned step;
gemm: time a SwiGLU expert and fit the cost model's GEMM curve (the fitted presets use it);
workload: the trace generator's speed and the calibration table of generated traces;
planner_table: the run-time planners' seconds per (micro-batch, layer) the cost model charges.
"""
