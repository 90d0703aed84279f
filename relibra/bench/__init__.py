"""Benchmarks that print their figures (`relibra bench ...`): speed and memory targets are measured
here, never in timed unit tests.

planner: each policy's whole-step plan (seconds, peak memory, plan size, validate seconds);
sim: the cost model on one planned step.
"""
