"""Shape derivation of the decode step for every shipped model card (and the layer plan / scaling)."""

import json
from pathlib import Path

import pytest

from decode_gap.model import load_model_card, linear_layers
from decode_gap.simulate.shapes import kv_row_bytes, layer_bytes, plan_layers, step_shapes

REPO = Path(__file__).resolve().parents[1]
CARDS = sorted((REPO / "config" / "models").glob("*.json"))


def test_every_card_is_covered():
    assert len(CARDS) >= 5


@pytest.mark.parametrize("card", CARDS, ids=lambda p: p.stem)
@pytest.mark.parametrize("tp", [1, 8])
def test_step_shapes_match_linear_layers(card, tp):
    spec = load_model_card(card)
    sh = step_shapes(spec, tp=tp, ep=1, batch=1, context_len=512)
    lin = {l.name: l for l in linear_layers(spec, tp=tp, ep=1, batch=1)}
    assert sh.linears == lin
    raw = json.loads(card.read_text())
    raw = raw.get("text_config") or raw
    heads = raw["num_attention_heads"]
    assert sh.heads == -(-heads // tp)
    if spec.mla:
        assert lin["attn.o_proj"].k == sh.heads * spec.v_head_dim
        assert sh.head_dim == spec.kv_lora_rank + spec.qk_rope_head_dim
        # the latent row in bf16; a DSA indexer's key in FP8 with a 4-byte scale
        assert kv_row_bytes(sh, 2) == 2 * (spec.kv_lora_rank + spec.qk_rope_head_dim) + (
            spec.index_head_dim + 4 if spec.index_heads else 0)
    else:
        kv = raw.get("num_key_value_heads", heads)
        assert sh.kv_heads == -(-kv // tp)
        assert lin["attn.qkv_proj"].n == (sh.heads + 2 * sh.kv_heads) * sh.head_dim
        assert kv_row_bytes(sh, 2) == 2 * 2 * sh.kv_heads * sh.head_dim
    assert sh.vocab == -(-raw["vocab_size"] // tp)
    assert len(sh.layer_kinds) == raw["num_hidden_layers"]
    assert sum(1 for k in sh.layer_kinds if k.startswith("moe/")) == spec.moe_layers
    assert sum(1 for k in sh.layer_kinds if k.endswith("/sliding")) == spec.sliding_layers
    assert sh.collectives_per_token == (2 * spec.layers + 2 if tp > 1 else 0)
    if spec.is_moe:
        assert sh.experts == spec.experts and sh.top_k == spec.top_k
        assert lin["moe.expert.gate_up_proj"].n == 2 * sh.moe_inter
    for kind in sh.kinds:
        assert layer_bytes(sh, kind, 1.0, 2.0, 513) > 0


@pytest.mark.parametrize("card", CARDS, ids=lambda p: p.stem)
def test_layer_pattern_matches_transformers(card):
    """The dense/MoE and sliding/full pattern agrees with the transformers implementation (meta device)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = load_model_card(card)
    sh = step_shapes(spec)
    cfg = transformers.AutoConfig.from_pretrained(str(card))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    layers = model.model.layers
    moe = [hasattr(getattr(l, "mlp", None) or getattr(l, "feed_forward"), "experts") for l in layers]
    assert moe == [k.startswith("moe/") for k in sh.layer_kinds]
    text = cfg.get_text_config()
    if getattr(text, "layer_types", None):
        windowed = ("sliding_attention", "chunked_attention")
        assert [t in windowed for t in text.layer_types] == [k.endswith("/sliding") for k in sh.layer_kinds]


def test_plan_keeps_each_kind_and_scales():
    spec = load_model_card(REPO / "config" / "models" / "deepseek-v3.json")
    sh = step_shapes(spec)
    plan = plan_layers(sh, 6, None)
    assert sum(plan.values()) == 6
    assert plan["dense/full"] >= 1 and plan["moe/full"] >= 1
    assert plan_layers(sh, "auto", None) == dict(sh.kinds)  # no memory limit: every layer
    assert plan_layers(sh, 1000, None) == dict(sh.kinds)
    assert plan_layers(sh, 1, None) == {"dense/full": 1, "moe/full": 1}  # at least one of each kind
    assert plan_layers(sh, "auto", 4) == {"dense/full": 1, "moe/full": 3}
    gemma = step_shapes(load_model_card(REPO / "config" / "models" / "gemma-3-270m.json"))
    plan = plan_layers(gemma, 6, None)
    assert plan == {"dense/sliding": 5, "dense/full": 1}


def test_plan_rejects_bad_layers():
    from decode_gap.errors import ConfigError

    sh = step_shapes(load_model_card(REPO / "config" / "models" / "llama-3.1-8b.json"))
    with pytest.raises(ConfigError, match="simulate.layers"):
        plan_layers(sh, 0, None)
