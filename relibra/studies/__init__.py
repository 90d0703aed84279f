"""The simulations the notebooks and the command line share, below both: each module one study, named after
what it computes. throughput (the paper's claims at full scale over seeds, notebook 02), claim_map (where the
claims hold over tokens per EP rank x micro-batch shift, notebook 12 and `relibra map`), overheads (what each
cost of balancing adds to the step, notebook 07 and `relibra map --overheads`), sensitivity (one set-up input at
a time, notebook 10 and `relibra sensitivity`), scale (EP16-EP256, notebook 11), simulation (the simulator over a
trace's last steps, notebooks 03-09), replan (the re-plan interval a re-homing policy chooses per card); case
(a model cut to its first layers) and params (the parameter spec every study, notebook and command declares its
inputs with).

Imports only the layers below (cluster, costs, policies, setups, sim, trace, workloads), never relibra.experiments,
relibra.plots or relibra.cli.
"""
