"""Model cards: config.json through AutoConfig, every weight from the meta-device graph, counts, errors."""

import json
import sys
from pathlib import Path

import pytest

from decode_gap.errors import ConfigError
from decode_gap.model import (
    LinearLayer,
    expected_distinct_experts,
    fuse_mla_a_projections,
    linear_layers,
    load_model_card,
    parameter_counts,
    role_counts,
    spec_from_dict,
)

REPO = Path(__file__).resolve().parents[1]
CARDS = sorted((REPO / "config" / "models").glob("*.json"))
REFERENCE = json.loads((REPO / "tests" / "fixtures" / "transformers_param_counts.json").read_text())


def card(name):
    return load_model_card(REPO / "config" / "models" / f"{name}.json")


def test_every_card_ships():
    names = {p.stem for p in CARDS}
    assert {"glm-5", "deepseek-v3", "llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b", "gemma-3-270m",
            "gpt-oss-120b", "mixtral-8x7b", "deepseek-v2-lite", "llama-4-scout"} <= names
    assert set(REFERENCE) == names


@pytest.mark.parametrize("path", CARDS, ids=lambda p: p.stem)
def test_counts_equal_transformers(path):
    """params_total is transformers' own count (to 0.01%); the active counts match an independent tally
    (tests/fixtures/make_param_counts.py) in both conventions."""
    spec = load_model_card(path)
    ref = REFERENCE[path.stem]
    ours = parameter_counts(spec)
    assert ours["params_total"] == pytest.approx(spec.transformers_count, rel=1e-4)
    assert ours["params_total"] == pytest.approx(ref["params_total"], rel=1e-4)
    assert ours["params_active"] == pytest.approx(ref["params_active"], rel=1e-4)
    assert ours["params_active_non_embedding"] == pytest.approx(ref["params_active_non_embedding"], rel=1e-4)
    assert sum(role_counts(spec).values()) == ours["params_total"]


def test_live_transformers_count_qwen3_moe():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = transformers.AutoConfig.from_pretrained(str(REPO / "config/models/qwen3-30b-a3b.json"))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert parameter_counts(card("qwen3-30b-a3b"))["params_total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,field,published,rel", [
    ("mixtral-8x7b", "params_active", 12.9e9, 0.01),  # Mistral: "12.9B active"
    ("deepseek-v3", "params_active", 37.5e9, 0.01),  # DeepSeek: "37B activated" (about 37.5B with the embedding)
    ("qwen3-30b-a3b", "params_active", 3.3e9, 0.02),  # Qwen: "A3B" = 3.3B activated
    ("gpt-oss-120b", "params_active_non_embedding", 5.1e9, 0.01),  # OpenAI: "5.1B active"
    ("gpt-oss-120b", "params_total", 116.8e9, 0.001),  # OpenAI: 116.8B total
    ("llama-4-scout", "params_active", 17e9, 0.02),  # Meta: "17B active"
    ("deepseek-v2-lite", "params_total", 15.7e9, 0.01),  # DeepSeek: "15.7B total"
])
def test_publishers_figures(name, field, published, rel):
    assert parameter_counts(card(name))[field] == pytest.approx(published, rel=rel)


def test_qwen25_qkv_biases_counted():
    """Qwen2.5-7B: 7,615,616,512 parameters, the QKV biases (129,024) included."""
    spec = spec_from_dict({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
        "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "vocab_size": 152064, "tie_word_embeddings": False, "max_position_embeddings": 131072,
    })
    c = parameter_counts(spec)
    assert c["params_total"] == 7_615_616_512
    assert role_counts(spec)["bias"] == 28 * (3584 + 2 * 512) == 129_024
    assert c["params_active"] == c["params_total"]  # dense: everything is read


def test_config_saved_by_current_transformers_reads_the_same(tmp_path):
    """A config written by this transformers (num_local_experts, rope_parameters) gives the same counts."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.from_pretrained(str(REPO / "config/models/qwen3-30b-a3b.json"))
    cfg.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "rope_theta" not in saved or "rope_parameters" in saved
    spec = load_model_card(tmp_path / "config.json")
    assert parameter_counts(spec) == parameter_counts(card("qwen3-30b-a3b"))


def test_roles_of_fused_and_per_expert_tensors():
    spec = card("gpt-oss-120b")
    roles = role_counts(spec)
    assert roles["routed_expert"] == 36 * 128 * (2880 * 5760 + 2880 * 2880)
    assert roles["bias"] > 0 and roles["router"] == 36 * 128 * 2880
    lin = {l.name: l for l in linear_layers(spec)}
    # GPT-OSS stores fused experts as [E, in, out]: still n = 2 x intermediate, k = hidden
    assert (lin["moe.expert.gate_up_proj"].n, lin["moe.expert.gate_up_proj"].k) == (5760, 2880)
    assert (lin["moe.expert.down_proj"].n, lin["moe.expert.down_proj"].k) == (2880, 2880)
    mix = {l.name: l for l in linear_layers(card("mixtral-8x7b"))}
    assert (mix["moe.expert.gate_up_proj"].n, mix["moe.expert.gate_up_proj"].k, mix["moe.expert.gate_up_proj"].per_layer) == (2 * 14336, 4096, 8)


def test_per_expert_modules_recognised():
    """Experts as a ModuleList of Linear modules (the older layout) are routed experts too."""
    torch = pytest.importorskip("torch")
    from decode_gap.model.graph import _classify

    class Cfg:
        hidden_size, num_hidden_layers, num_local_experts, num_experts_per_tok = 8, 2, 4, 2

    class Expert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w3, self.w2 = torch.nn.Linear(8, 16, False), torch.nn.Linear(8, 16, False), torch.nn.Linear(16, 8, False)

    class Moe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = torch.nn.Linear(8, 4, False)
            self.experts = torch.nn.ModuleList(Expert() for _ in range(4))

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = torch.nn.Module()
            self.self_attn.q_proj, self.self_attn.o_proj = torch.nn.Linear(8, 8, False), torch.nn.Linear(8, 8, False)
            self.block_sparse_moe = Moe()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(32, 8)
            self.layers = torch.nn.ModuleList(Layer() for _ in range(2))
            self.lm_head = torch.nn.Linear(8, 32, False)

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return self.lm_head

        def num_parameters(self):
            return sum(p.numel() for p in self.parameters())

    with torch.device("meta"):
        g = _classify(Model(), Cfg(), 0.0, "test")
    roles = {}
    for w in g.weights:
        roles[w.role] = roles.get(w.role, 0) + w.numel
    assert roles["routed_expert"] == 2 * 4 * 3 * 128 and roles["router"] == 2 * 32
    from decode_gap.model.spec import _templates

    t = {x.name: x for x in _templates(g.weights)}
    assert (t["moe.expert.gate_up_proj"].n, t["moe.expert.gate_up_proj"].per_layer) == (32, 4)
    assert (t["moe.expert.down_proj"].n, t["moe.expert.down_proj"].k) == (8, 16)


def test_mtp_layers_counted_and_flagged():
    spec = card("glm-5")
    c = parameter_counts(spec)
    assert spec.mtp_layers == 1
    assert c["params_mtp"] > 0 and c["params_total_with_mtp"] == c["params_total"] + c["params_mtp"]
    assert "not build" in c["params_mtp_note"]
    v3 = parameter_counts(card("deepseek-v3"))
    # DeepSeek: 671B main model + 14B MTP module (which also stores copies of the 0.9B embedding and head)
    assert 682e9 < v3["params_total_with_mtp"] < 686e9


def test_glm5_card_matches_the_issue():
    s = card("glm-5")
    assert (s.layers, s.dense_layers, s.moe_layers, s.hidden) == (78, 3, 75, 6144)
    assert (s.experts, s.top_k, s.shared_experts, s.moe_intermediate, s.intermediate) == (256, 8, 1, 2048, 12288)
    assert s.mla and s.vocab == 154880 and s.index_heads == 32 and s.index_topk == 2048


@pytest.mark.parametrize("path", CARDS, ids=lambda p: p.stem)
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_shapes_shard_by_tp(path, tp):
    spec = load_model_card(path)
    full = {lin.name: lin for lin in linear_layers(spec, tp=1)}
    for lin in linear_layers(spec, tp=tp):
        assert lin.n > 0 and lin.k > 0
        ref = full[lin.name]
        # a sharded layer splits exactly one dimension; replicated ones keep both
        assert lin.n * lin.k >= ref.n * ref.k // tp - ref.k * tp


def test_llama8b_tp2_shapes():
    spec = card("llama-3.1-8b")
    shapes = {lin.name: (lin.n, lin.k) for lin in linear_layers(spec, tp=2)}
    assert shapes["attn.qkv_proj"] == ((16 + 2 * 4) * 128, 4096)
    assert shapes["attn.o_proj"] == (4096, 16 * 128)
    assert shapes["mlp.gate_up_proj"] == (2 * 7168, 4096)
    assert shapes["mlp.down_proj"] == (4096, 7168)
    assert shapes["lm_head"] == (128256 // 2, 4096)


@pytest.mark.parametrize("tp", [1, 8])
def test_mla_a_projections_are_one_replicated_gemm_as_engines_load_them(tp):
    lins = {lin.name: lin for lin in linear_layers(card("glm-5"), tp=tp)}
    fused = lins["attn.fused_qkv_a_proj"]
    assert (fused.n, fused.k, fused.layers, fused.replicated) == (2048 + 512 + 64, 6144, 78, tp > 1)
    assert not {"attn.q_a_proj", "attn.kv_a_proj"} & set(lins)
    assert list(lins).index("attn.fused_qkv_a_proj") < list(lins).index("attn.q_b_proj")


def test_mla_a_projections_that_differ_stay_apart():
    def lin(name, k=7168, layers=61):
        return LinearLayer(name, "attention", 512, k, layers, replicated=True)

    apart = fuse_mla_a_projections([lin("attn.q_a_proj"), lin("attn.kv_a_proj", k=4096)])
    assert [l.name for l in apart] == ["attn.q_a_proj", "attn.kv_a_proj"]
    # a second width ("#2", layers of another shape) pairs with its own kv_a
    both = fuse_mla_a_projections([lin("attn.q_a_proj"), lin("attn.q_a_proj#2", layers=3),
                                   lin("attn.kv_a_proj"), lin("attn.kv_a_proj#2", layers=3)])
    assert [(l.name, l.n, l.layers) for l in both] == [("attn.fused_qkv_a_proj", 1024, 61),
                                                       ("attn.fused_qkv_a_proj#2", 1024, 3)]
    assert [l.name for l in fuse_mla_a_projections([lin("attn.kv_a_proj")])] == ["attn.kv_a_proj"]


def test_expected_distinct_experts():
    assert expected_distinct_experts(256, 8, 1) == pytest.approx(8)
    assert expected_distinct_experts(256, 8, 1000) == pytest.approx(256, rel=1e-3)
    assert 8 < expected_distinct_experts(256, 8, 4) < 32


# ---- bad input: one line naming the file and the reason

def _one_line(exc):
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found") as exc:
        load_model_card(tmp_path / "nope.json")
    _one_line(exc)


def test_malformed_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{ nope")
    with pytest.raises(ConfigError, match=r"config.json: not valid JSON") as exc:
        load_model_card(p)
    _one_line(exc)


def test_missing_field_names_file_and_field(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 10, "num_attention_heads": 4}))
    with pytest.raises(ConfigError, match=r"config.json: field 'num_hidden_layers' is missing") as exc:
        load_model_card(p)
    _one_line(exc)


def test_config_transformers_cannot_build(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                             "vocab_size": 100, "hidden_act": "no_such_activation"}))
    with pytest.raises(ConfigError, match=r"config.json: transformers [\d.]+ cannot build LlamaForCausalLM") as exc:
        load_model_card(p)
    assert "no_such_activation" in _one_line(exc)


def test_architecture_newer_than_transformers(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"architectures": ["Llama9ForCausalLM"], "model_type": "llama9",
                             "transformers_version": "9.1.0", "hidden_size": 64}))
    written = r"the file was written by transformers 9\.1\.0: pip install 'transformers>=9\.1\.0'"
    with pytest.raises(ConfigError, match=r"model_type 'llama9'.*unknown to transformers.*check its spelling; "
                                          + written) as exc:
        load_model_card(p)
    _one_line(exc)
    p.write_text(json.dumps({"architectures": ["Llama9ForCausalLM"], "model_type": "llama9", "hidden_size": 64}))
    with pytest.raises(ConfigError, match=r"check its spelling; a model newer than this transformers needs pip install "
                                          r"-U transformers"):
        load_model_card(p)


def test_unknown_architecture_without_model_type(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"architectures": ["FooBarForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
                             "vocab_size": 10, "num_attention_heads": 4}))
    with pytest.raises(ConfigError, match=r"config.json: neither 'model_type' nor a known 'architectures'") as exc:
        load_model_card(p)
    _one_line(exc)


def test_transformers_too_old(monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setattr(transformers, "__version__", "4.30.0")
    with pytest.raises(ConfigError, match=r"transformers 4\.30\.0 is too old: decode-gap needs transformers>=") as exc:
        spec_from_dict({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                        "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4})
    _one_line(exc)


def test_a_broken_transformers_is_not_reported_as_missing(monkeypatch):
    """transformers installed but failing its own import (a dependency of the wrong version, as a stale wheel on a
    GPU host did) is said as such, with its reason, not as "not installed"."""
    import builtins

    from decode_gap.errors import ConfigError
    from decode_gap.model import graph

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "transformers":
            raise ImportError("tokenizers>=0.22.0,<=0.23.0 is required for a normal functioning of this module")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "transformers", raising=False)
    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(ConfigError, match="transformers cannot be imported: tokenizers>=0.22.0"):
        graph.transformers_module()
