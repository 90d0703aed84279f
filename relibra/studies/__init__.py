"""The simulations the notebooks and the command line share, one study per module named after what it computes:
throughput (notebook 02), claim_map (notebook 12, `relibra map`), overheads (notebook 07, `relibra map
--overheads`), sensitivity (notebook 10, `relibra sensitivity`), scale (notebook 11), simulation (a trace's last
steps, notebooks 03-09), replan; case (one case and the runner over cases) and params (the parameter spec).
Imports only the layers below, never relibra.experiments, relibra.plots or relibra.cli.
"""
