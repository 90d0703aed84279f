"""One module per notebook, NN_name.py beside notebooks/NN_name.py (relibra.experiments.registry)."""
