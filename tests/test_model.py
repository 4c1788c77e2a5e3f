"""Model cards: parsing, errors, parameter counts against transformers, per-GPU shapes."""

import json
from pathlib import Path

import pytest

from decode_gap.errors import ConfigError
from decode_gap.model import (
    expected_distinct_experts,
    linear_layers,
    load_model_card,
    parameter_counts,
)

REPO = Path(__file__).resolve().parents[1]
CARDS = sorted((REPO / "config" / "models").glob("*.json"))
REFERENCE = json.loads((REPO / "tests" / "fixtures" / "transformers_param_counts.json").read_text())


def test_every_card_ships():
    names = {p.stem for p in CARDS}
    assert {"glm-5", "deepseek-v3", "llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b", "gemma-3-270m"} <= names


@pytest.mark.parametrize("card", CARDS, ids=lambda p: p.stem)
def test_param_counts_within_one_percent_of_transformers(card):
    """Reference counts were built by transformers on the meta device (tests/fixtures/make_param_counts.py)."""
    ref = REFERENCE[card.stem]
    ours = parameter_counts(load_model_card(card))
    assert ours["params_total"] == pytest.approx(ref["params_total"], rel=0.01)
    assert ours["params_active"] == pytest.approx(ref["params_active"], rel=0.01)


def test_param_counts_live_transformers():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = transformers.AutoConfig.from_pretrained(str(REPO / "config/models/qwen3-30b-a3b.json"))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in model.parameters())
    ours = parameter_counts(load_model_card(REPO / "config/models/qwen3-30b-a3b.json"))
    assert ours["params_total"] == pytest.approx(total, rel=0.01)


def test_glm5_card_matches_the_issue():
    s = load_model_card(REPO / "config/models/glm-5.json")
    assert (s.layers, s.dense_layers, s.moe_layers, s.hidden) == (78, 3, 75, 6144)
    assert (s.experts, s.top_k, s.shared_experts, s.moe_intermediate, s.intermediate) == (256, 8, 1, 2048, 12288)
    assert s.mla and s.vocab == 154880


@pytest.mark.parametrize("card", CARDS, ids=lambda p: p.stem)
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_shapes_shard_by_tp(card, tp):
    spec = load_model_card(card)
    full = {lin.name: lin for lin in linear_layers(spec, tp=1)}
    for lin in linear_layers(spec, tp=tp):
        assert lin.n > 0 and lin.k > 0
        ref = full[lin.name]
        # a sharded layer splits exactly one dimension; replicated ones keep both
        assert lin.n * lin.k >= ref.n * ref.k // tp - ref.k * tp


def test_llama8b_tp2_shapes():
    spec = load_model_card(REPO / "config/models/llama-3.1-8b.json")
    shapes = {lin.name: (lin.n, lin.k) for lin in linear_layers(spec, tp=2)}
    assert shapes["attn.qkv_proj"] == ((16 + 2 * 4) * 128, 4096)
    assert shapes["attn.o_proj"] == (4096, 16 * 128)
    assert shapes["mlp.gate_up_proj"] == (2 * 7168, 4096)
    assert shapes["mlp.down_proj"] == (4096, 7168)
    assert shapes["lm_head"] == (128256 // 2, 4096)


def test_expected_distinct_experts():
    assert expected_distinct_experts(256, 8, 1) == pytest.approx(8)
    assert expected_distinct_experts(256, 8, 1000) == pytest.approx(256, rel=1e-3)
    assert 8 < expected_distinct_experts(256, 8, 4) < 32


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_model_card(tmp_path / "nope.json")


def test_malformed_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{ nope")
    with pytest.raises(ConfigError, match=r"config.json: not valid JSON"):
        load_model_card(p)


def test_missing_field_names_file_and_field(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 10, "num_attention_heads": 4}))
    with pytest.raises(ConfigError, match=r"config.json: field 'num_hidden_layers' is missing"):
        load_model_card(p)


def test_unknown_architecture_lists_supported(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
    with pytest.raises(ConfigError, match=r"unknown architecture 'MambaForCausalLM'.*supported: .*LlamaForCausalLM"):
        load_model_card(p)
