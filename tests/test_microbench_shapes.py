"""Shape derivation for the micro-benchmarks from every model card in config/models/."""

from pathlib import Path

import pytest

from decode_gap.model import load_model_card
from decode_gap.microbench import shapes

CARDS = sorted((Path(__file__).resolve().parents[1] / "config" / "models").glob("*.json"))


@pytest.mark.parametrize("card", CARDS, ids=lambda p: p.stem)
@pytest.mark.parametrize("tp", [1, 8])
def test_every_card_gives_shapes(card, tp):
    spec = load_model_card(card)
    gs = shapes.gemm_shapes(spec, tp=tp)
    assert gs and all(s.n > 0 and s.k > 0 and s.layers > 0 for s in gs)
    assert gs[-1].name == "lm_head" and gs[-1].n == -(-spec.vocab // tp)
    assert sum(len(v) for v in shapes.unique_shapes(gs).values()) == len(gs)
    att = shapes.attention_shape(spec, tp=tp)
    assert att.heads == -(-spec.heads // tp) and att.head_dim > 0
    assert att.kind == ("mla" if spec.mla else "gqa")
    moe = shapes.moe_shape(spec, tp=tp)
    assert (moe is not None) == spec.is_moe
    if moe:
        assert moe.experts_local == spec.experts and moe.top_k == spec.top_k
        assert moe.inter == -(-spec.moe_intermediate // tp)
        assert moe.experts_total % moe.n_group == 0
    assert shapes.allreduce_model_bytes(spec, batch=4) == spec.hidden * 4 * 2


def test_deepseek_v3_shapes_at_tp1_and_ep():
    spec = load_model_card(next(c for c in CARDS if c.stem == "deepseek-v3"))
    by = {s.name: s for s in shapes.gemm_shapes(spec)}
    assert (by["mlp.gate_up_proj"].n, by["mlp.gate_up_proj"].k) == (2 * 18432, 7168)
    assert (by["moe.router"].n, by["moe.router"].k, by["moe.router"].quantizable) == (256, 7168, False)
    # q_a and kv_a as the one replicated GEMM SGLang and vLLM run (fused_qkv_a_proj_with_mqa)
    fused = by["attn.fused_qkv_a_proj"]
    assert (fused.n, fused.k, fused.layers) == (1536 + 512 + 64, 7168, 61)
    assert "attn.kv_a_proj" not in by and "attn.q_a_proj" not in by
    moe = shapes.moe_shape(spec, tp=1, ep=8)
    assert (moe.experts_local, moe.inter, moe.n_group, moe.topk_group) == (32, 2048, 8, 4)
    att = shapes.attention_shape(spec)
    assert (att.kv_lora_rank, att.qk_rope_head_dim, att.head_dim) == (512, 64, 576)


def test_world_size_from_config():
    assert shapes.world_size({"tp": 4}) == 4
    assert shapes.world_size({"tp": 4, "microbench": {"allreduce": {"world_size": 2}}}) == 2
    assert shapes.world_size({}) == 1
