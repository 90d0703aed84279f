"""Importers, each fed files shaped exactly like its source system writes them, plus every bad input."""

import json
import pickle

import numpy as np
import pytest
import torch

from relibra.cluster import get_model
from relibra.errors import ConfigError, TraceError
from relibra.importers import (deal_sequences, import_megatron_jsonl, import_megatron_replay, import_sglang,
                               import_trace, import_verl, resolve_model)
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
    with pytest.raises(TraceError, match=r"frac\.pt: field 'layer 0' at \[token=0, k=0\] holds 0\.5"):
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
    with pytest.raises(TraceError, match=r"obj\.npz: holds object arrays that need pickle"):
        import_sglang(tmp_path / "obj.npz", "tiny", ep=1)
    with pytest.raises(TraceError, match="no such file"):
        import_sglang(tmp_path / "missing.pt", "tiny", ep=1)
    with pytest.raises(TraceError, match="unknown file type"):
        (tmp_path / "x.bin").write_bytes(b"abc")
        import_sglang(tmp_path / "x.bin", "tiny", ep=1)


# ---- megatron-core routing-trace JSONL -----------------------------------------------------------
def jsonl_records(rng, steps=2, mbs=3, ep=2):
    """One record per (step, layer, rank) and micro-batch, in the order a training loop writes them."""
    truth, by_rank = {}, {r: [] for r in range(ep)}
    for s in range(steps):
        for m in range(mbs):
            for r in range(ep):
                n = int(rng.integers(0, 9))
                ids = topk_ids(rng, n, L)
                truth[(s, m, r)] = ids
                for layer in range(L):
                    by_rank[r].append({"step": 100 + s, "layer": layer, "rank": r, "num_tokens": n, "topk": K,
                                       "top_indices": ids[:, layer].tolist()})
    return truth, by_rank


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_megatron_jsonl_axes(tmp_path):
    rng = np.random.default_rng(4)
    truth, by_rank = jsonl_records(rng)
    files = [write_jsonl(tmp_path / f"routing_rank{r}.jsonl", recs) for r, recs in by_rank.items()]
    t = import_megatron_jsonl(files, "tiny", ep=2)
    assert t.loads.shape == (2, 3, L, 2, E) and t.provenance["steps"] == [100, 101]
    for (s, m, r), ids in truth.items():
        assert np.array_equal(t.loads[s, m, :, r], counts(ids))
    t2 = import_trace("megatron-jsonl", tmp_path, model="tiny", ep=2)  # a directory works too
    assert np.array_equal(t.loads, t2.loads)


def test_megatron_jsonl_bad_inputs(tmp_path):
    rng = np.random.default_rng(5)
    _, by_rank = jsonl_records(rng, steps=1, mbs=1, ep=1)
    recs = by_rank[0]

    def run(name, mutate):
        rows = json.loads(json.dumps(recs))
        mutate(rows)
        return import_megatron_jsonl(write_jsonl(tmp_path / name, rows), "tiny", ep=1)

    def set_first(field, value):
        def f(rows):
            rows[1][field] = value
        return f

    def poke(i, j, value):
        def f(rows):
            rows[2]["top_indices"][i][j] = value
        return f

    with pytest.raises(TraceError, match=r"a\.jsonl: line 3: field 'top_indices' at \[token=0, k=1\] holds an expert id 99"):
        run("a.jsonl", poke(0, 1, 99))
    with pytest.raises(TraceError, match=r"b\.jsonl: line 3: .*holds a negative expert id -2"):
        run("b.jsonl", poke(0, 0, -2))
    with pytest.raises(TraceError, match=r"c\.jsonl: line 3: field 'top_indices' at \[token=0\] repeats expert"):
        run("c.jsonl", lambda rows: rows[2]["top_indices"].__setitem__(0, [3, 3]))
    with pytest.raises(TraceError, match=r"d\.jsonl: line 2: field 'topk' is 3"):
        run("d.jsonl", set_first("topk", 3))
    with pytest.raises(TraceError, match=r"e\.jsonl: line 1: field 'top_indices' at \[token=0\] has top-k width 3"):
        run("e.jsonl", lambda rows: rows[0]["top_indices"].__setitem__(0, [1, 2, 3]))
    with pytest.raises(TraceError, match=r"f\.jsonl: line 2: field 'num_tokens' is -1, a negative count"):
        run("f.jsonl", set_first("num_tokens", -1))
    with pytest.raises(TraceError, match=r"g\.jsonl: line 2: field 'num_tokens' is 2\.5, not an integer"):
        run("g.jsonl", set_first("num_tokens", 2.5))
    with pytest.raises(TraceError, match=r"h\.jsonl: line 2: field 'layer' is 7.*4 MoE layers"):
        run("h.jsonl", set_first("layer", 7))
    with pytest.raises(TraceError, match=r"layer 3 is missing"):
        run("i.jsonl", lambda rows: rows.pop())
    with pytest.raises(TraceError, match=r"j\.jsonl: line 3: field 'top_indices' at \[token=0, k=0\] holds 1\.5"):
        run("j.jsonl", poke(0, 0, 1.5))
    with pytest.raises(TraceError, match=r"k\.jsonl: line 2: field 'num_tokens' is \d+ but 'top_indices' has"):
        run("k.jsonl", lambda rows: rows[1].__setitem__("num_tokens", rows[1]["num_tokens"] + 1))
    with pytest.raises(TraceError, match=r"l\.jsonl: line 1: field 'rank' is missing"):
        run("l.jsonl", lambda rows: rows[0].pop("rank"))
    text = write_jsonl(tmp_path / "ok.jsonl", recs).read_text()
    (tmp_path / "trunc.jsonl").write_text(text[: len(text) - 25])
    with pytest.raises(TraceError, match=r"trunc\.jsonl: line 4: not valid JSON"):
        import_megatron_jsonl(tmp_path / "trunc.jsonl", "tiny", ep=1)
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(TraceError, match=r"blank\.jsonl: the file holds no records"):
        import_megatron_jsonl(tmp_path / "blank.jsonl", "tiny", ep=1)
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match=r"bin\.jsonl: not UTF-8"):
        import_megatron_jsonl(tmp_path / "bin.jsonl", "tiny", ep=1)


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
