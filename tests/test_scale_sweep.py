"""Notebook 11's sweep (relibra.studies.scale): impossible cases kept as rows, and the comparison."""

import numpy as np
import pandas as pd
import pytest

from relibra.cluster import get_model, resolve_topology
from relibra.studies.scale import ScaleSweep, best_other, scale_cases, scale_sweep


def test_impossible_cases_say_why():
    models, clusters = [get_model(m) for m in ("tiny", "kimi-k2")], [resolve_topology(c) for c in ("paper,nodes=32", "nvl72")]
    cases = {(m.name, c.name, ep): why for m, c, ep, why in scale_cases(models, clusters, (8, 256))}
    assert cases[("tiny", "nvl72", 8)] is None
    assert "does not divide the 16 experts" in cases[("tiny", "nvl72", 256)]
    assert "does not divide the 384 experts" in cases[("kimi-k2", "paper,nodes=32", 256)]
    assert cases[("kimi-k2", "nvl72", 8)] is None


def test_sweep_rows_and_references():
    sweep = ScaleSweep(("tiny",), ("cpu-gloo,nodes=4",), (4, 32), layers=2, micro_batches=2)
    table = scale_sweep([get_model("tiny")], [resolve_topology("cpu-gloo,nodes=4")], (4, 32), sweep,
                        policies=("megatron", "relibra", "relibra-h"), progress=False)
    ok = table[table["status"] == "ok"].set_index("policy")
    assert set(ok.index) == {"megatron", "relibra", "relibra-h", "balanced", "balanced-compute"}
    assert ok.loc["megatron", "speedup_vs_megatron"] == pytest.approx(1.0)
    # no simulated plan beats the balanced-compute reference, and references plan nothing
    assert (ok.drop(index=["balanced", "balanced-compute"])["frac_of_balanced_compute"] <= 1 + 1e-9).all()
    assert np.isnan(ok.loc["balanced-compute", "plan_cpu_s"]) and ok.loc["relibra", "plan_cpu_s"] > 0
    assert ok.loc["relibra", "replication_cpu_us_per_cell"] > 0
    bad = table[table["status"] != "ok"]
    assert list(bad["ep"]) == [32] and bad["status"].iloc[0].startswith("impossible: EP 32 does not divide")


def test_best_other_by_hand():
    rows = [("megatron", 100.0), ("eplb+", 120.0), ("llep", 130.0), ("relibra-h", 117.0), ("balanced-compute", 150.0)]
    table = pd.DataFrame([{"model": "m", "cluster": "c", "ep": 64, "policy": p, "status": "ok", "tokens_per_s": t,
                           "speedup_vs_megatron": t / 100, "frac_of_balanced_compute": t / 150} for p, t in rows])
    r = best_other(table).iloc[0]
    assert r["best_other"] == "llep"
    assert r["over_best_other"] == pytest.approx(117 / 130)
    assert r["speedup"] == pytest.approx(1.17) and r["frac_of_balanced_compute"] == pytest.approx(0.78)
