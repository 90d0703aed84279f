"""Core contracts: trace round-trip and validation, plan validation, presets."""

import dataclasses

import numpy as np
import pytest

from relibra.cluster import get_model, get_topology
from relibra.errors import ConfigError, PlanError, TraceError
from relibra.plan import PlanInfo, RuntimePlanner, StepPlan, empty_replicas
from relibra.trace import RoutingTrace, loads_from_tokens, static_placement


def _token_trace(seed=0, steps=2, mbs=3, ep=4, tokens_per_rank=10):
    model = get_model("tiny")
    rng = np.random.default_rng(seed)
    n = mbs * ep * tokens_per_rank
    ids = np.argsort(rng.random((steps, mbs, n, model.num_layers, model.num_experts)), axis=-1)[..., : model.top_k]
    src = np.broadcast_to(np.repeat(np.arange(ep), tokens_per_rank)[None, None, :mbs * 0 + ep * tokens_per_rank],
                          (steps, mbs, ep * tokens_per_rank))
    ids = ids[:, :, : ep * tokens_per_rank]
    loads = loads_from_tokens(ids, src, ep, model.num_experts)
    return RoutingTrace(loads, model, ep, ep * tokens_per_rank, {"test": True}, ids.astype(np.int16),
                        np.ascontiguousarray(src).astype(np.int16))


def test_round_trip_exact(tmp_path):
    t = _token_trace()
    t.save(tmp_path / "t.npz")
    u = RoutingTrace.load(tmp_path / "t.npz")
    assert np.array_equal(u.loads, t.loads) and u.loads.dtype == t.loads.dtype
    assert np.array_equal(u.token_experts, t.token_experts)
    assert u.model == t.model and u.ep == t.ep and u.provenance == t.provenance


def test_bad_files_name_the_problem(tmp_path):
    t = _token_trace()
    p = tmp_path / "t.npz"
    t.save(p)
    data = p.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="trunc.npz"):
        RoutingTrace.load(tmp_path / "trunc.npz")
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(TraceError, match="empty"):
        RoutingTrace.load(tmp_path / "empty.npz")
    np.savez(tmp_path / "obj.npz", format_version=np.array(1), loads=np.array([{"a": 1}], dtype=object),
             meta_json=np.array("{}"))
    with pytest.raises(TraceError, match="pickle"):
        RoutingTrace.load(tmp_path / "obj.npz")
    np.savez(tmp_path / "v9.npz", format_version=np.array(9), loads=t.loads, meta_json=np.array("{}"))
    with pytest.raises(TraceError, match="format_version"):
        RoutingTrace.load(tmp_path / "v9.npz")


def test_trace_validation_errors():
    t = _token_trace()
    bad = t.loads.copy()
    bad[0, 1, 2, 3, 4] = -1
    with pytest.raises(TraceError, match=r"negative count at index \(0, 1, 2, 3, 4\)"):
        RoutingTrace(bad, t.model, t.ep, t.tokens_per_microbatch)
    ids = t.token_experts.copy()
    ids[1, 0, 5, 2, 0] = 99
    with pytest.raises(TraceError, match="token_experts.*99"):
        RoutingTrace(t.loads, t.model, t.ep, t.tokens_per_microbatch, {}, ids, t.token_src_rank)
    ids = t.token_experts.copy()
    ids[0, 0, 3, 1, 1] = ids[0, 0, 3, 1, 0]
    with pytest.raises(TraceError, match="repeats an expert"):
        RoutingTrace(t.loads, t.model, t.ep, t.tokens_per_microbatch, {}, ids, t.token_src_rank)
    with pytest.raises(TraceError, match="layers"):
        RoutingTrace(t.loads[:, :, :2], t.model, t.ep, t.tokens_per_microbatch)
    floaty = t.loads.astype(np.float64)
    floaty[0, 0, 0, 0, 0] += 0.5
    with pytest.raises(TraceError, match="non-integer"):
        RoutingTrace(floaty, t.model, t.ep, t.tokens_per_microbatch)


def test_rank_load_and_skewness():
    t = _token_trace()
    per_rank = t.rank_load()
    assert per_rank.shape == (2, 3, 4, 4)
    assert (per_rank.sum(-1) == t.loads[:, :, :, :, :].sum(axis=(3, 4))).all()
    assert t.static_skewness() >= 1.0
    place = static_placement(4, 16, 4)
    assert (np.bincount(place[0]) == 4).all()


def _plan(t, **kw):
    loads = t.loads[0]
    re, rs, rt = empty_replicas(loads.shape[0], loads.shape[1], t.ep, 1)
    args = dict(policy="test", loads=loads, home=static_placement(4, 16, 4), replica_expert=re, replica_start=rs,
                replica_tokens=rt, gpus_per_node=2, slots_per_gpu=5, replica_scope="node")
    args.update(kw)
    return StepPlan(**args)


def test_plan_validator():
    t = _token_trace()
    p = _plan(t)
    p.validate(t.loads[0])
    assert (p.gpu_tokens() == t.rank_load()[0]).all()
    # a replica inside the node takes all of one source's tokens of expert 0: conservation holds
    src = int(np.argmax(t.loads[0, 0, 0, :, 0]))
    p.replica_expert[0, 0, 1, 0] = 0
    p.replica_start[0, 0, 1, 0] = t.loads[0, 0, 0, :src, 0].sum()
    p.replica_tokens[0, 0, 1, 0] = t.loads[0, 0, 0, src, 0]
    p.validate(t.loads[0])
    assert p.gpu_tokens().sum() == t.rank_load()[0].sum()
    flow = p.dense_replica_flow()
    assert flow.sum() == flow[0, 0, src, 1, 0] == t.loads[0, 0, 0, src, 0]
    # more tokens than the expert was routed
    p.replica_start[0, 0, 1, 0] = t.loads[0, 0, 0, :, 0].sum() - t.loads[0, 0, 0, src, 0] + 1
    with pytest.raises(PlanError, match="not conserved"):
        p.validate()
    # two replicas taking the same tokens
    q = _plan(t, replica_scope="any")
    q.replica_expert[0, 0, 1:3, 0] = 0
    q.replica_start[0, 0, 1:3, 0] = [0, 1]
    q.replica_tokens[0, 0, 1:3, 0] = 2
    with pytest.raises(PlanError, match="take the same tokens"):
        q.validate()
    # a replica outside the home's node
    q = _plan(t)
    q.replica_expert[0, 0, 3, 0] = 0
    with pytest.raises(PlanError, match="outside its home's node"):
        q.validate()
    # tokens to an empty slot
    q = _plan(t)
    q.replica_tokens[0, 1, 2, 0] = 1
    with pytest.raises(PlanError, match="empty replica slot"):
        q.validate()
    # unequal homes
    home = static_placement(4, 16, 4)
    home[0, 0] = 1
    with pytest.raises(PlanError, match="homes"):
        _plan(t, home=home).validate()
    # slot limit
    q = _plan(t, slots_per_gpu=4)
    q.replica_expert[0, 0, 1, 0] = 0
    with pytest.raises(PlanError, match="limit"):
        q.validate()


def test_plan_records_are_typed_and_checked():
    """info is a frozen PlanInfo; the run-time planner's record needs planner_on_critical_path; the
    placement a plan was made from has the plan's shape and GPUs."""
    t = _token_trace()
    p = _plan(t, info=PlanInfo(plan_seconds=0.5, plan_cpu_seconds=0.25))
    p.validate(t.loads[0])
    assert p.info.balancing_seconds == (0.5, 0.25)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.info.plan_seconds = 1.0
    part = RuntimePlanner(seconds=0.1, cpu_seconds=0.1, cells=2, collective="all_gather", collective_bytes=64)
    _plan(t, planner_on_critical_path=True, runtime_planner=part).validate()
    with pytest.raises(PlanError, match="planner_on_critical_path is False"):
        _plan(t, runtime_planner=part).validate()
    with pytest.raises(PlanError, match="cells is 0"):
        _plan(t, planner_on_critical_path=True, runtime_planner=dataclasses.replace(part, cells=0)).validate()
    with pytest.raises(PlanError, match="info must be a relibra.plan.PlanInfo"):
        _plan(t, info={"plan_seconds": 0.5}).validate()
    _plan(t, prev_home=static_placement(4, 16, 4)).validate()
    for bad in (static_placement(4, 16, 4)[:, :8], static_placement(4, 16, 4) + 4, static_placement(4, 16, 4) * 1.0):
        with pytest.raises(PlanError, match="prev_home must be integer GPUs"):
            _plan(t, prev_home=bad).validate()


def test_presets_and_topology_errors():
    assert get_model("qwen3-235b-a22b").num_layers == 94
    with pytest.raises(ConfigError, match="unknown model preset 'nope'"):
        get_model("nope")
    with pytest.raises(ConfigError, match="unknown cluster preset"):
        get_topology("nope")
    paper = get_topology("paper")
    assert paper.ep_layout(32) == (4, 8) and paper.ep_layout(8) == (1, 8)
    assert paper.ep_layout(12) == (2, 6)  # EP need not fill a node (docs/scale.md)
    with pytest.raises(ConfigError, match="nvlink_GBps must be positive"):
        paper.with_changes(nvlink_GBps=0)
