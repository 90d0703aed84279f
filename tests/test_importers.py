"""Importers, each fed files shaped exactly like its source system writes them, plus every bad input."""

import base64
import json
import pickle

import numpy as np
import pytest
import torch

from relibra.cluster import get_model
from relibra.errors import ConfigError, TraceError
from relibra.importers import (deal_sequences, import_megatron_jsonl, import_megatron_replay, import_sglang,
                               import_slime, import_trace, import_verl, import_vllm, resolve_model)
from relibra.trace import RoutingTrace

TINY = get_model("tiny")  # 4 MoE layers, 16 experts, top-2
L, E, K = TINY.num_layers, TINY.num_experts, TINY.top_k


def topk_ids(rng, *lead):
    """Random distinct top-k ids: int64 [*lead, K]."""
    return np.argsort(rng.random((*lead, E)), axis=-1)[..., :K]


def counts(ids):
    """Per (layer, expert) counts of ids [tokens, L, K] -> [L, E]."""
    out = np.zeros((L, E), dtype=np.int64)
    for layer in range(L):
        out[layer] = np.bincount(ids[:, layer].ravel(), minlength=E)
    return out


# ---- megatron-core RouterReplay recordings -------------------------------------------------------
def write_replay(tmp_path, rng, steps=(7, 9), mbs=2, ep=2, fmt="pt"):
    """get_recorded_data() output, one file per (step, micro-batch, rank): per-layer [tokens, topk] int64."""
    truth = {}
    for s in steps:
        for m in range(mbs):
            for r in range(ep):
                n = int(rng.integers(1, 12))
                ids = topk_ids(rng, n, L)  # [tokens, L, K]
                layers = [torch.from_numpy(np.ascontiguousarray(ids[:, i])) for i in range(L)]
                name = tmp_path / f"router_replay_step{s}_mb{m}_rank{r}.{fmt}"
                if fmt == "pt":
                    torch.save(layers, name)
                else:
                    np.savez(name, **{f"layer_{i}": x.numpy() for i, x in enumerate(layers)})
                truth[(s, m, r)] = ids
    return truth


@pytest.mark.parametrize("fmt", ["pt", "npz"])
def test_megatron_replay_axes(tmp_path, fmt):
    rng = np.random.default_rng(0)
    truth = write_replay(tmp_path, rng, fmt=fmt)
    t = import_megatron_replay(tmp_path, "tiny", ep=2)
    assert t.loads.shape == (2, 2, L, 2, E)
    assert t.provenance["steps"] == [7, 9]  # renumbered densely, originals kept
    for (s, m, r), ids in truth.items():
        assert np.array_equal(t.loads[[7, 9].index(s), m, :, r], counts(ids))
    assert t.token_experts is not None and (t.token_src_rank[0, 0][: len(truth[(7, 0, 0)])] == 0).all()


def test_megatron_replay_metadata_in_file_beats_name(tmp_path):
    rng = np.random.default_rng(1)
    for r in range(2):
        ids = topk_ids(rng, 5, L)
        torch.save({"topk_indices": [torch.from_numpy(ids[:, i]) for i in range(L)], "step": 3,
                    "micro_batch": 0, "rank": 1 - r}, tmp_path / f"rec_rank{r}.pt")
    t = import_megatron_replay(sorted(tmp_path.iterdir()), "tiny", ep=2, keep_tokens=False)
    assert t.loads.shape == (1, 1, L, 2, E) and t.token_experts is None


def test_megatron_replay_bad_inputs(tmp_path):
    rng = np.random.default_rng(2)
    good = [topk_ids(rng, 6) for _ in range(L)]

    def save(name, layers):
        torch.save([torch.as_tensor(x) for x in layers], tmp_path / name)
        return tmp_path / name

    bad = [x.copy() for x in good]
    bad[2][4, 1] = E
    with pytest.raises(TraceError, match=r"bad_range\.pt: field 'layer 2' at \[token=4, k=1\] holds an expert id 16"):
        import_megatron_replay(save("bad_range.pt", bad), "tiny", ep=2)
    bad = [x.copy() for x in good]
    bad[1][3, 0] = -1
    with pytest.raises(TraceError, match=r"neg\.pt: field 'layer 1' at \[token=3, k=0\] holds a negative expert id -1"):
        import_megatron_replay(save("neg.pt", bad), "tiny", ep=2)
    bad = [x.copy() for x in good]
    bad[0][5] = [7, 7]
    with pytest.raises(TraceError, match=r"dup\.pt: field 'layer 0' at \[token=5\] repeats expert 7"):
        import_megatron_replay(save("dup.pt", bad), "tiny", ep=2)
    with pytest.raises(TraceError, match=r"wide\.pt: field 'layer 0' has top-k width 3"):
        import_megatron_replay(save("wide.pt", [topk_ids(rng, 6)[:, :1].repeat(3, 1) for _ in range(L)]), "tiny", ep=2)
    with pytest.raises(TraceError, match=r"short\.pt: .*3 layer tensors.*4 MoE layers"):
        import_megatron_replay(save("short.pt", good[:3]), "tiny", ep=2)
    with pytest.raises(TraceError, match=r"ragged\.pt: field 'layer 3' has 5 tokens but layer 0 has 6"):
        import_megatron_replay(save("ragged.pt", good[:3] + [good[3][:5]]), "tiny", ep=2)
    with pytest.raises(TraceError, match=r"frac\.pt: field 'layer 0' (at \[token=0, k=0\] holds 0\.5|holds float64 values)"):
        import_megatron_replay(save("frac.pt", [np.full((6, 2), 0.5)] + good[1:]), "tiny", ep=2)
    np.savez(tmp_path / "negstep.npz", step=np.array(-3), **{f"layer_{i}": x for i, x in enumerate(good)})
    with pytest.raises(TraceError, match=r"negstep\.npz: field 'step' is -3, a negative count"):
        import_megatron_replay(tmp_path / "negstep.npz", "tiny", ep=2)
    np.savez(tmp_path / "fstep.npz", step=np.array(1.5), **{f"layer_{i}": x for i, x in enumerate(good)})
    with pytest.raises(TraceError, match=r"fstep\.npz: field 'step' is 1\.5, not an integer"):
        import_megatron_replay(tmp_path / "fstep.npz", "tiny", ep=2)
    with pytest.raises(TraceError, match=r"rank0\.pt.*also in"):
        save("a_rank0.pt", good)
        save("b_rank0.pt", good)
        import_megatron_replay([tmp_path / "a_rank0.pt", tmp_path / "b_rank0.pt"], "tiny", ep=2)
    with pytest.raises(TraceError, match="no routing for step 0, micro-batch 0, rank 1"):
        import_megatron_replay(tmp_path / "a_rank0.pt", "tiny", ep=2)
    with pytest.raises(TraceError, match=r"field 'rank' is 5"):
        import_megatron_replay(save("x_rank5.pt", good), "tiny", ep=2)


def test_unreadable_files(tmp_path):
    rng = np.random.default_rng(3)
    layers = [torch.from_numpy(topk_ids(rng, 6)) for _ in range(L)]
    torch.save(layers, tmp_path / "ok.pt")
    data = (tmp_path / "ok.pt").read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=r"trunc\.pt: truncated or corrupted"):
        import_megatron_replay(tmp_path / "trunc.pt", "tiny", ep=1)
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(TraceError, match=r"empty\.pt: the file is empty"):
        import_megatron_replay(tmp_path / "empty.pt", "tiny", ep=1)
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not really a zip archive at all" * 4)
    with pytest.raises(TraceError, match=r"junk\.npz: truncated or corrupted"):
        import_verl(tmp_path / "junk.npz", "tiny", ep=1)
    np.savez(tmp_path / "ok.npz", **{f"layer_{i}": x.numpy() for i, x in enumerate(layers)})
    data = (tmp_path / "ok.npz").read_bytes()
    (tmp_path / "trunc.npz").write_bytes(data[: len(data) - 40])
    with pytest.raises(TraceError, match=r"trunc\.npz: truncated or corrupted"):
        import_megatron_replay(tmp_path / "trunc.npz", "tiny", ep=1)
    with open(tmp_path / "pickled.pt", "wb") as fh:  # a file torch.load can only read with full pickle
        torch.save({"routed_experts": [layers[0]], "extra": pickle.PickleError("x")}, fh)
    with pytest.raises(TraceError, match=r"pickled\.pt: holds objects that need full pickle"):
        import_sglang(tmp_path / "pickled.pt", "tiny", ep=1)
    np.savez(tmp_path / "obj.npz", routed_experts=np.array([layers[0].numpy(), "x"], dtype=object))
    with pytest.raises(TraceError, match=r"obj\.npz: field 'routed_experts' holds object arrays that need pickle"):
        import_sglang(tmp_path / "obj.npz", "tiny", ep=1)
    with pytest.raises(TraceError, match="no such file"):
        import_sglang(tmp_path / "missing.pt", "tiny", ep=1)
    with pytest.raises(TraceError, match="unknown file type"):
        (tmp_path / "x.bin").write_bytes(b"abc")
        import_sglang(tmp_path / "x.bin", "tiny", ep=1)


# ---- megatron-core router-trace JSONL (0.19) ----------------------------------------------------
# Records laid out as megatron/core/transformer/moe/router_trace.py (RouterTracer, training mode)
# writes them: one line per router call, json.dumps of {"step", "stage", "block", "layer", "rank",
# "num_tokens", "topk", "top_indices"} (+ "mtp_idx" on MTP records), one file per rank. A
# first-dense model (GLM-4.5-Air style): decoder.layers.0 is dense, its MoE routers are layers 1, 2;
# one MTP head with one MoE layer. 4 experts, top-2.
def rec(step, layer, rows, rank=0, block="decoder", **extra):
    out = {"step": step, "stage": "pre_dispatch", "block": block, "layer": layer, "rank": rank,
           "num_tokens": len(rows), "topk": 2, "top_indices": rows}
    if block == "mtp":
        out["mtp_idx"] = 0
    out.update(extra)
    return out


MB0 = {1: [[0, 1], [2, 3], [0, 2]], 2: [[1, 2], [1, 3], [0, 1]], "mtp": [[3, 2], [3, 1], [3, 0]]}
MB1 = {1: [[3, 0]], 2: [[2, 1]], "mtp": [[0, 1]]}


def glm_like_records(recompute=True, step=0, rank=0):
    """mb0 forward, then (full recompute, uniform) layers re-fired in reverse during backward, then mb1."""
    out = [rec(step, 1, MB0[1], rank), rec(step, 2, MB0[2], rank), rec(step, 0, MB0["mtp"], rank, "mtp")]
    if recompute:
        out += [rec(step, 2, MB0[2], rank), rec(step, 1, MB0[1], rank)]
    out += [rec(step, 1, MB1[1], rank), rec(step, 2, MB1[2], rank), rec(step, 0, MB1["mtp"], rank, "mtp")]
    return out


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def save_router_state(directory, rank=0, experts=4):
    """What RouterTracer.flush() dumps with --moe-routing-trace-dump-weights."""
    state = {layer: {"weight": torch.zeros(experts, 8), "expert_bias": None, "score_function": "sigmoid", "topk": 2}
             for layer in (1, 2)}
    torch.save(state, directory / f"router_state_rank{rank}.pt")


def test_megatron_jsonl_first_dense_mtp_and_recompute(tmp_path):
    path = write_jsonl(tmp_path / "router_trace_rank0.jsonl", glm_like_records())
    save_router_state(tmp_path)
    t = import_megatron_jsonl(path, recompute="drop")  # layers, top-k, experts and ep all from the files
    assert (t.num_layers, t.num_experts, t.model.top_k, t.ep, t.num_microbatches) == (2, 4, 2, 1, 2)
    # counted by hand: mb0 decoder.layers.1 ids 0,1,2,3,0,2 ; decoder.layers.2 ids 1,2,1,3,0,1
    assert t.loads[0, 0, :, 0].tolist() == [[2, 1, 2, 1], [1, 3, 1, 1]]
    assert t.loads[0, 1, :, 0].tolist() == [[1, 0, 0, 1], [0, 1, 1, 0]]
    p = t.provenance
    assert p["layers"] == ["decoder.layers.1", "decoder.layers.2"] and p["mtp_records_dropped"] == 2
    assert p["repeats_dropped"] == 2 and p["experts_from"] == "router_state_rank0.pt"
    t = import_megatron_jsonl(path, recompute="drop", mtp="layers")
    assert t.num_layers == 3 and t.loads[0, 0, 2, 0].tolist() == [1, 1, 1, 3]  # MTP ids 3,2,3,1,3,0
    with pytest.raises(TraceError, match=r"line 4: repeats .*line 2 \(step 0, decoder\.layers\.2, rank 0, identical"):
        import_megatron_jsonl(path)
    with pytest.raises(TraceError, match=r"router_state_rank0\.pt: router weights have 4 experts, but model preset says 16"):
        import_megatron_jsonl(path, model="tiny", ep=1, recompute="drop")
    (tmp_path / "elsewhere").mkdir()
    other = write_jsonl(tmp_path / "elsewhere" / "router_trace_rank0.jsonl", glm_like_records())
    with pytest.raises(TraceError, match=r"holds 2 MoE routers \(decoder\.layers\.1, decoder\.layers\.2\), but model 'tiny'"):
        import_megatron_jsonl(other, model="tiny", ep=1, recompute="drop")


def test_megatron_jsonl_ranks_steps_and_expert_count(tmp_path):
    for r in range(2):
        write_jsonl(tmp_path / f"router_trace_rank{r}.jsonl",
                    glm_like_records(False, 0, r) + glm_like_records(False, 1, r))
    with pytest.raises(ConfigError, match="expert count is not in router-trace JSONL"):
        import_megatron_jsonl(tmp_path)
    t = import_megatron_jsonl(tmp_path, experts=8, keep_tokens=False)
    assert t.loads.shape == (2, 2, 2, 2, 8) and t.token_experts is None
    assert t.loads[1, 0, 0, 1].tolist() == [2, 1, 2, 1, 0, 0, 0, 0]
    with pytest.raises(TraceError, match=r"field 'rank' is 1, outside the EP group \[0, 1\)"):
        import_megatron_jsonl(tmp_path, experts=8, ep=1)
    save_router_state(tmp_path, experts=16)
    with pytest.raises(TraceError, match="router weights have 16 experts, but --experts says 8"):
        import_megatron_jsonl(tmp_path, experts=8)


def test_megatron_jsonl_bad_inputs(tmp_path):
    base = glm_like_records(False)

    def run(name, mutate, **kw):
        rows = json.loads(json.dumps(base))
        mutate(rows)
        return import_megatron_jsonl(write_jsonl(tmp_path / name, rows), experts=4, **kw)

    def poke(line, value):
        return lambda rows: rows[line]["top_indices"][0].__setitem__(1, value)

    with pytest.raises(TraceError, match=r"a\.jsonl: line 2: field 'top_indices' at \[token=0, k=1\] holds an expert id 9"):
        run("a.jsonl", poke(1, 9))
    with pytest.raises(TraceError, match=r"b\.jsonl: line 2: .*holds a negative expert id -2"):
        run("b.jsonl", poke(1, -2))
    with pytest.raises(TraceError, match=r"c\.jsonl: line 1: field 'top_indices' at \[token=0\] repeats expert 3"):
        run("c.jsonl", lambda rows: rows[0]["top_indices"].__setitem__(0, [3, 3]))
    with pytest.raises(TraceError, match=r"d\.jsonl: line 2: field 'topk' is 3, but earlier records have 2"):
        run("d.jsonl", lambda rows: rows[1].__setitem__("topk", 3))
    with pytest.raises(TraceError, match=r"e\.jsonl: line 1: field 'top_indices' at \[token=1\] has top-k width 3"):
        run("e.jsonl", lambda rows: rows[0]["top_indices"].__setitem__(1, [1, 2, 3]))
    with pytest.raises(TraceError, match=r"f\.jsonl: line 2: field 'num_tokens' is -1, a negative count"):
        run("f.jsonl", lambda rows: rows[1].__setitem__("num_tokens", -1))
    with pytest.raises(TraceError, match=r"g\.jsonl: line 2: field 'num_tokens' is 4 but 'top_indices' has 3 rows"):
        run("g.jsonl", lambda rows: rows[1].__setitem__("num_tokens", 4))
    with pytest.raises(TraceError, match=r"h\.jsonl: line 1: field 'rank' is missing"):
        run("h.jsonl", lambda rows: rows[0].pop("rank"))
    with pytest.raises(TraceError, match=r"i\.jsonl: line 1: field 'block' is 'encoder'"):
        run("i.jsonl", lambda rows: rows[0].__setitem__("block", "encoder"))
    with pytest.raises(TraceError, match=r"j\.jsonl: line 2: field 'stage' is 'post_dispatch'"):
        run("j.jsonl", lambda rows: rows[1].__setitem__("stage", "post_dispatch"))
    # a record lost: micro-batch 1 of decoder.layers.2 has no record
    with pytest.raises(TraceError, match=r"micro-batch 1, rank 0 has routing for 1 of 2 MoE layers; layer decoder\.layers\.2"):
        run("k.jsonl", lambda rows: rows.pop(4))
    # a record written twice with different content (not a recompute repeat) shows as unequal layers
    with pytest.raises(TraceError, match=r"micro-batch 1, rank 0: layer decoder\.layers\.2 routes 1 tokens but layer decoder\.layers\.1 routes 3"):
        run("l.jsonl", lambda rows: rows.insert(1, rec(0, 1, [[1, 0], [2, 0], [3, 0]])))
    text = write_jsonl(tmp_path / "ok.jsonl", base).read_text()
    (tmp_path / "trunc.jsonl").write_text(text[: len(text) - 25])
    with pytest.raises(TraceError, match=r"trunc\.jsonl: line 6: not valid JSON"):
        import_megatron_jsonl(tmp_path / "trunc.jsonl", experts=4)
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(TraceError, match=r"blank\.jsonl: the file holds no records"):
        import_megatron_jsonl(tmp_path / "blank.jsonl", experts=4)
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match=r"bin\.jsonl: line 1: not UTF-8"):
        import_megatron_jsonl(tmp_path / "bin.jsonl", experts=4)


# ---- verl ----------------------------------------------------------------------------------------
def verl_batch(rng, batch=8, max_seq_len=12):
    """routed_experts [batch, max_seq_len, num_layers, topk] int64 + attention_mask [batch, max_seq_len]:
    left-padded prompt, right-padded response; padding positions hold zeros."""
    ids = topk_ids(rng, batch, max_seq_len, L)
    left = rng.integers(0, 3, batch)
    right = rng.integers(left + 2, max_seq_len + 1)
    pos = np.arange(max_seq_len)
    mask = ((pos[None] >= left[:, None]) & (pos[None] < right[:, None])).astype(np.int64)
    ids[mask == 0] = 0  # padding as verl leaves it: not a valid top-k (repeats expert 0)
    return ids, mask


@pytest.mark.parametrize("fmt", ["pt", "npz"])
def test_verl_axes(tmp_path, fmt):
    rng = np.random.default_rng(6)
    batches = [verl_batch(rng) for _ in range(2)]
    files = []
    for s, (ids, mask) in enumerate(batches):
        path = tmp_path / f"step{s}.{fmt}"
        if fmt == "pt":
            torch.save({"routed_experts": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}, path)
        else:
            np.savez(path, routed_experts=ids, attention_mask=mask.astype(bool))
        files.append(path)
    t = import_verl(files, "tiny", ep=2, micro_batches=2)
    assert t.loads.shape == (2, 2, L, 2, E)
    # rank-major: 8 sequences -> rank 0 takes 0..3 (micro-batches {0,1}, {2,3}), rank 1 takes 4..7.
    for s, (ids, mask) in enumerate(batches):
        for r in range(2):
            for m in range(2):
                seqs = [4 * r + 2 * m, 4 * r + 2 * m + 1]
                tokens = np.concatenate([ids[b][mask[b] == 1] for b in seqs])
                assert np.array_equal(t.loads[s, m, :, r], counts(tokens))
    t2 = import_verl(files, "tiny", ep=2, micro_batches=2, order="microbatch-major")
    assert t2.loads.sum() == t.loads.sum() and not np.array_equal(t2.loads, t.loads)


def test_verl_bad_inputs(tmp_path):
    rng = np.random.default_rng(7)
    ids, mask = verl_batch(rng)

    def run(name, ids=ids, mask=mask, **kw):
        np.savez(tmp_path / name, routed_experts=ids, attention_mask=mask, **kw)
        return import_verl(tmp_path / name, "tiny", ep=2)

    b, p = np.argwhere(mask == 1)[3]
    bad = ids.copy()
    bad[b, p, 2, 1] = 40
    with pytest.raises(TraceError, match=rf"v1\.npz: field 'routed_experts' at \[sequence={b}, position={p}, layer=2, k=1\]"):
        run("v1.npz", ids=bad)
    bad = ids.copy()
    bad[b, p, 1] = [4, 4]
    with pytest.raises(TraceError, match=rf"v2\.npz: .*\[sequence={b}, position={p}, layer=1\] repeats expert 4"):
        run("v2.npz", ids=bad)
    with pytest.raises(TraceError, match=r"v3\.npz: field 'routed_experts' has 3 layers"):
        run("v3.npz", ids=ids[:, :, :3])
    with pytest.raises(TraceError, match=r"v4\.npz: field 'routed_experts' has top-k width 1"):
        run("v4.npz", ids=ids[..., :1])
    bad_mask = mask.copy()
    bad_mask[2, 5] = 2
    with pytest.raises(TraceError, match=r"v5\.npz: field 'attention_mask' at \[sequence=2, position=5\] holds 2"):
        run("v5.npz", mask=bad_mask)
    with pytest.raises(TraceError, match=r"v6\.npz: field 'attention_mask' has shape"):
        run("v6.npz", mask=mask[:, :5])
    np.savez(tmp_path / "v7.npz", routed_experts=ids)
    with pytest.raises(TraceError, match=r"v7\.npz: field 'attention_mask' is missing"):
        import_verl(tmp_path / "v7.npz", "tiny", ep=2)
    with pytest.raises(TraceError, match=r"8 sequences cannot fill ep=4 x micro_batches=4"):
        np.savez(tmp_path / "v8.npz", routed_experts=ids, attention_mask=mask)
        import_verl(tmp_path / "v8.npz", "tiny", ep=4, micro_batches=4)


# ---- SGLang --------------------------------------------------------------------------------------
def sglang_samples(rng, n=6):
    """Per-sample routed_experts [seq_len - 1, num_layers, topk] int32."""
    return [topk_ids(rng, int(rng.integers(1, 9)), L).astype(np.int32) for _ in range(n)]


@pytest.mark.parametrize("fmt", ["pt", "npz"])
def test_sglang_axes(tmp_path, fmt):
    rng = np.random.default_rng(8)
    samples = sglang_samples(rng, 12)
    path = tmp_path / f"rollout.{fmt}"
    if fmt == "pt":
        torch.save([torch.from_numpy(x) for x in samples], path)
    else:  # names sort by their number, not as strings (sample_10 after sample_9)
        np.savez(path, **{f"sample_{i}": x for i, x in enumerate(samples)})
    t = import_sglang(path, "tiny", ep=4)
    assert t.loads.shape == (1, 1, L, 4, E) and t.token_experts.dtype == np.int16
    for r in range(4):
        assert np.array_equal(t.loads[0, 0, :, r], counts(np.concatenate(samples[3 * r: 3 * r + 3])))


def test_sglang_bad_inputs(tmp_path):
    rng = np.random.default_rng(9)
    samples = sglang_samples(rng, 4)

    def run(name, xs):
        torch.save([torch.from_numpy(x) for x in xs], tmp_path / name)
        return import_sglang(tmp_path / name, "tiny", ep=2)

    bad = [x.copy() for x in samples]
    bad[3][0, 2, 1] = 16
    with pytest.raises(TraceError, match=r"s1\.pt: field 'routed_experts' at \[sample=3, token=0, layer=2, k=1\]"):
        run("s1.pt", bad)
    with pytest.raises(TraceError, match=r"s2\.pt: field 'routed_experts' of sample 1 has 2 layers"):
        run("s2.pt", [samples[0], samples[1][:, :2]])
    with pytest.raises(TraceError, match=r"s3\.pt: field 'routed_experts' has top-k width 3"):
        run("s3.pt", [np.concatenate([x, x[..., :1]], axis=-1) for x in samples])
    with pytest.raises(TraceError, match=r"s4\.pt: holds no samples"):
        run("s4.pt", [])


# ---- shared helpers ------------------------------------------------------------------------------
def test_deal_sequences_contiguous_runs():
    rank, mb = deal_sequences(10, ep=2, micro_batches=2)
    assert rank.tolist() == [0] * 5 + [1] * 5 and mb.tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    rank, mb = deal_sequences(8, ep=2, micro_batches=2, order="microbatch-major")
    assert mb.tolist() == [0] * 4 + [1] * 4 and rank.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]


def test_model_shape_options_and_round_trip(tmp_path):
    rng = np.random.default_rng(10)
    shape = resolve_model(layers=L, experts=E, top_k=K)
    assert shape.num_layers == L and shape.name.startswith("custom")
    with pytest.raises(ConfigError):
        resolve_model("tiny", layers=4)
    with pytest.raises(ConfigError):
        resolve_model(layers=4)
    with pytest.raises(ConfigError, match="unknown trace format"):
        import_trace("parquet", [], model="tiny", ep=1)
    with pytest.raises(ConfigError, match="does not divide"):
        import_sglang([], "tiny", ep=3)
    torch.save([torch.from_numpy(x) for x in sglang_samples(rng, 4)], tmp_path / "r.pt")
    t = import_sglang(tmp_path / "r.pt", shape, ep=2)
    t.save(tmp_path / "t.npz")
    u = RoutingTrace.load(tmp_path / "t.npz")
    assert np.array_equal(u.token_experts, t.token_experts) and u.model == shape


# ---- real layouts of the RL systems, counted by hand (2 MoE layers, 4 experts, top-2) -----------
SMALL = resolve_model(layers=2, experts=4, top_k=2)
A = [[[0, 1], [2, 3]], [[1, 2], [0, 3]], [[3, 0], [1, 2]]]  # 3 rows [layer, k]
B = [[[2, 3], [0, 1]], [[2, 1], [3, 0]]]  # 2 rows
AB_LAYER0, AB_LAYER1 = [2, 3, 3, 2], [3, 2, 2, 3]  # A+B ids: layer 0 = 0,1,1,2,3,0,2,3,2,1 ; layer 1 = 2,3,0,3,1,2,0,1,3,0


def generate_response(routes, prompt, completion, dtype=None):
    """A /generate response as SGLang's HTTP server returns it (tokenizer_manager meta_info, base64 routes)."""
    meta = {"id": "x", "prompt_tokens": prompt, "completion_tokens": completion, "finish_reason": {"type": "stop"},
            "routed_experts": base64.b64encode(np.asarray(routes, dtype=dtype or np.int32).tobytes()).decode()}
    if dtype is not None:
        meta["routed_experts_dtype"] = np.dtype(dtype).name
    return {"text": "...", "meta_info": meta}


@pytest.mark.parametrize("form", ["jsonl", "json"])
def test_sglang_generate_responses(tmp_path, form):
    responses = [generate_response(A, 2, 2), generate_response(B, 1, 2, np.uint8)]  # rows = P + C - 1
    path = tmp_path / f"step0.{form}"
    if form == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in responses))
    else:
        path.write_text(json.dumps(responses))  # a batched /generate returns a list
    t = import_sglang(path, SMALL, ep=1)
    assert t.loads[0, 0, :, 0].tolist() == [AB_LAYER0, AB_LAYER1]
    assert np.array_equal(t.token_experts[0, 0, :3], np.asarray(A))


def test_sglang_start_len_and_misalignment(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(generate_response(B, 2, 2)) + "\n")  # 2 rows for 4 tokens: start_len 1
    with pytest.raises(TraceError, match=r"s\.jsonl: line 1: .*has 2 rows; prompt_tokens \+ completion_tokens - 1 - "
                                         r"start_len = 3 expected \(start_len 0\): routes and tokens are misaligned"):
        import_sglang(path, SMALL, ep=1)
    t = import_sglang(path, SMALL, ep=1, start_len=1)
    assert t.loads[0, 0, 0, 0].tolist() == [0, 1, 2, 1]  # ids 2,3,2,1
    bad = generate_response(B, 1, 2)
    bad["meta_info"]["routed_experts_dtype"] = "float16"
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match=r"routed_experts_dtype' is 'float16'"):
        import_sglang(path, SMALL, ep=1)
    bad["meta_info"]["routed_experts_dtype"] = "int32"
    bad["meta_info"]["routed_experts"] = "not base64!"
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match=r"line 1: field 'meta_info\.routed_experts' is not valid base64"):
        import_sglang(path, SMALL, ep=1)


def verl_agent_loop_batch(dtype=torch.int16):
    """verl agent-loop output (DataProto.batch) saved with torch.save: prompt_len 2, response_len 3.

    Sample 0: one prompt token (left-padded), two response tokens; the engine's last (placeholder)
    row sits at its final response position 3. Sample 1: truncated multi-turn, every position real.
    """
    re = torch.zeros(2, 5, 2, 2, dtype=dtype)
    re[0, 1], re[0, 2] = torch.tensor([[0, 1], [2, 3]]), torch.tensor([[1, 2], [0, 1]])  # re[0, 3] placeholder
    re[1] = torch.tensor([[[3, 2], [1, 0]], [[0, 3], [2, 1]], [[1, 0], [3, 2]], [[2, 1], [0, 3]], [[3, 1], [1, 2]]])
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    return {"prompts": torch.tensor([[0, 11], [12, 13]]), "responses": torch.tensor([[21, 22, 0], [23, 24, 25]]),
            "response_mask": mask[:, 2:].clone(), "attention_mask": mask, "routed_experts": re}


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8])
def test_verl_agent_loop_placeholder(tmp_path, dtype):
    torch.save(verl_agent_loop_batch(dtype), tmp_path / "step0.pt")
    t = import_verl(tmp_path / "step0.pt", SMALL, ep=2)
    assert t.loads[0, 0, :, 0].tolist() == [[1, 2, 1, 0], [1, 1, 1, 1]]  # sample 0: ids 0,1,1,2 | 2,3,0,1
    assert t.loads[0, 0, :, 1].tolist() == [[2, 3, 2, 3], [2, 3, 3, 2]]  # sample 1, all 5 positions
    assert t.provenance["placeholders_dropped"] == 1 and t.provenance["samples_without_placeholder"] == 1
    batch = verl_agent_loop_batch(dtype)
    batch["routed_experts"][1, 2] = 0
    torch.save(batch, tmp_path / "bad.pt")
    with pytest.raises(TraceError, match=r"bad\.pt: field 'routed_experts' at \[sample=1, position=2\] is an all-zero row"):
        import_verl(tmp_path / "bad.pt", SMALL, ep=2)


def test_vllm_and_slime_exports(tmp_path):
    a, b = np.asarray(A, np.int32), np.asarray(B, np.int32)
    np.savez(tmp_path / "vllm.npz", routed_experts_0=a, routed_experts_1=b, num_tokens_0=np.array(4),
             num_tokens_1=np.array(3))
    t = import_vllm(tmp_path / "vllm.npz", SMALL, ep=1)
    assert t.loads[0, 0, :, 0].tolist() == [AB_LAYER0, AB_LAYER1]
    np.savez(tmp_path / "slime.npz", rollout_routed_experts_0=a, rollout_routed_experts_1=b,
             tokens_0=np.arange(4), tokens_1=np.arange(3))
    t = import_trace("slime", tmp_path / "slime.npz", model=SMALL, ep=1)
    assert t.loads[0, 0, :, 0].tolist() == [AB_LAYER0, AB_LAYER1]
    np.savez(tmp_path / "off.npz", rollout_routed_experts_0=a, rollout_routed_experts_1=b,
             tokens_0=np.arange(4), tokens_1=np.arange(5))
    with pytest.raises(TraceError, match=r"off\.npz: sample 1 has 2 route rows for 5 tokens"):
        import_slime(tmp_path / "off.npz", SMALL, ep=1)
    np.savez(tmp_path / "nolen.npz", routed_experts_0=a)
    with pytest.raises(TraceError, match=r"nolen\.npz: array num_tokens_0 is missing"):
        import_vllm(tmp_path / "nolen.npz", SMALL, ep=1)


def test_loads_only_holds_one_file_of_ids(tmp_path, monkeypatch):
    import weakref

    import relibra.importers.verl as verl_mod

    for s in range(3):
        torch.save(verl_agent_loop_batch(), tmp_path / f"step{s}.pt")
    live, real = [], verl_mod.load_container

    def tracked(path):
        assert all(ref() is None for ref in live), "the previous file's ids are still held"
        obj = real(path)
        live.append(weakref.ref(obj["routed_experts"]))
        return obj

    monkeypatch.setattr(verl_mod, "load_container", tracked)
    t = import_verl(tmp_path, SMALL, ep=2, keep_tokens=False)
    assert t.num_steps == 3 and len(live) == 3 and t.loads[2, 0, 0, 0].tolist() == [1, 2, 1, 0]


def test_cli_imports_router_trace_jsonl(tmp_path, capsys):
    from relibra.cli import main

    write_jsonl(tmp_path / "router_trace_rank0.jsonl", glm_like_records())
    out = tmp_path / "t.npz"
    assert main(["trace", "import", "--format", "megatron-jsonl", str(tmp_path), "--out", str(out),
                 "--experts", "4", "--recompute", "drop"]) == 0
    assert RoutingTrace.load(out).loads[0, 0, :, 0].tolist() == [[2, 1, 2, 1], [1, 3, 1, 1]]
    assert main(["trace", "import", "--format", "megatron-jsonl", str(tmp_path), "--out", str(out),
                 "--experts", "4"]) == 2
    assert "activation recompute" in capsys.readouterr().err
