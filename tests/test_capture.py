"""relibra.capture on a real megatron-core GPTModel built on the CPU (gloo, world size 1).

The model: 3 decoder layers, the first dense (moe_layer_freq [0, 1, 1]), 8 experts, top-2, built
by megatron-core's own get_gpt_decoder_block_spec (local, no Transformer Engine). The captured
counts must equal the routing map each router returns (a forward hook on the router).
"""

import numpy as np
import pytest
import torch
from conftest import megatron_single_rank

pytest.importorskip("megatron.core")  # the kit pins megatron-core; this only guards odd installs


@pytest.fixture(scope="module")
def gpt_model():
    with megatron_single_rank():
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.transformer.transformer_config import TransformerConfig

        torch.manual_seed(0)
        cfg = TransformerConfig(num_layers=3, hidden_size=16, num_attention_heads=2, num_moe_experts=8,
                                moe_router_topk=2, moe_ffn_hidden_size=8, ffn_hidden_size=32, moe_layer_freq=[0, 1, 1],
                                moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="none",
                                moe_aux_loss_coeff=0.0, use_cpu_initialization=True, add_bias_linear=False,
                                bias_activation_fusion=False, moe_router_dtype="fp32", hidden_dropout=0.0,
                                attention_dropout=0.0)
        model = GPTModel(cfg, get_gpt_decoder_block_spec(cfg, use_transformer_engine=False), vocab_size=64,
                         max_sequence_length=32, position_embedding_type="rope")
        yield model


def test_capture_counts_equal_the_routing_map(gpt_model, tmp_path):
    from relibra.capture import RouterCapture, find_routers
    from relibra.importers import import_megatron_replay

    routers = find_routers(gpt_model)
    assert [n for n, _ in routers] == ["decoder.layers.1.mlp.router", "decoder.layers.2.mlp.router"]
    maps = []  # the router's own output: routing_map bool [tokens, experts]
    hooks = [r.register_forward_hook(lambda mod, inp, out: maps.append(out[1].sum(0).numpy().copy()))
             for _, r in routers]
    gen = torch.Generator().manual_seed(1)
    expected = np.zeros((2, 2, 2, 8), dtype=np.int64)  # [step, micro-batch, layer, expert]
    try:
        with RouterCapture(gpt_model) as cap:
            for s in range(2):
                for m in range(2):
                    ids = torch.randint(0, 64, (2, 5 + m), generator=gen)  # [batch 2, seq 5 or 6]
                    seq = ids.shape[1]
                    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)[None, None]
                    maps.clear()
                    gpt_model(ids, torch.arange(seq).expand(2, seq), mask).sum().backward()
                    expected[s, m] = np.stack(maps)
                    got = cap.micro_batch()
                    assert got.shape == (2 * seq, 2, 2)
                cap.next_step()
        assert all(r.router_replay is None for _, r in routers)  # built without routing replay: restored
    finally:
        for h in hooks:
            h.remove()
    t = cap.trace()
    assert (t.num_steps, t.num_microbatches, t.num_layers, t.num_experts, t.model.top_k) == (2, 2, 2, 8, 2)
    assert np.array_equal(t.loads[:, :, :, 0], expected)
    assert expected[0, 0].sum() == 2 * 10 * 2  # 10 tokens x top-2 per layer, none lost
    files = cap.save(tmp_path)
    u = import_megatron_replay(files, t.model, ep=1)
    assert np.array_equal(u.loads, t.loads)
