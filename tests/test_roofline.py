"""Roofline arithmetic: hand-computed cases and the seeds' GLM-5 figures."""

from pathlib import Path

import pytest

from decode_gap.errors import ConfigError
from decode_gap.hardware import resolve_hardware
from decode_gap.model import load_model_card, spec_from_dict
from decode_gap.roofline import compute_roofline

REPO = Path(__file__).resolve().parents[1]
HW = REPO / "config" / "hardware"


def card(name):
    return load_model_card(REPO / "config" / "models" / f"{name}.json")


def test_seeds_glm5_nvfp4_tp8_rtx_pro_6000():
    """Seeds: 2.86 GB of weights per GPU; at 1.8 TB/s about 1.59 ms."""
    r = compute_roofline(card("glm-5"), resolve_hardware("rtx-pro-6000-blackwell", HW), "nvfp4", tp=8, context_len=1)
    gb = r["weight_bytes_per_token_per_gpu"] / 1e9
    assert gb == pytest.approx(2.86, rel=0.03)
    assert r["weight_bytes_per_token_per_gpu"] / 1.8e12 * 1e3 == pytest.approx(1.59, rel=0.03)
    assert r["t_memory_ms"] == pytest.approx(r["bytes_per_token_per_gpu"] / 1792e9 * 1e3)
    # the seeds counted 156 all-reduces per token
    assert r["allreduces_per_token"] == 156
    # SGLang-style sharding replicates MLA's A projections and the indexer: more bytes per GPU
    assert r["weight_bytes_engine_layout_per_gpu"] > 1.3 * r["weight_bytes_even_layout_per_gpu"]


def test_hand_computed_dense_bf16():
    """A tiny dense model, every byte counted by hand."""
    spec = spec_from_dict({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
        "tie_word_embeddings": False,
    })
    hw = resolve_hardware("h100-sxm", HW)
    r = compute_roofline(spec, hw, "bf16", tp=1, batch=1, context_len=10)
    head = 16
    qkv = (4 + 2 * 2) * head * 64
    o = 64 * 64
    mlp = 2 * 128 * 64 + 64 * 128
    lm = 100 * 64
    norms = 2 * (2 * 64) + 64
    weights = 2 * ((qkv + o + mlp) * 2 + lm + norms + 64)
    assert r["weight_bytes_per_token_per_gpu"] == weights
    kv = 2 * (2 * 2 * head * 10) * 2  # layers x (K+V x kv_heads x head_dim x ctx) x 2 bytes
    assert r["kv_bytes_per_token_per_gpu"] == kv
    assert r["t_memory_ms"] == pytest.approx((weights + kv) / 3350e9 * 1e3)
    flops = 2 * (2 * (qkv + o + mlp) + lm) + 2 * 4 * 4 * head * 10
    assert r["flops_per_token_per_gpu"] == flops
    assert r["t_compute_ms"] == pytest.approx(flops / 989e12 * 1e3)
    assert r["t_comm_floor_ms"] == 0
    assert r["t_floor_ms"] == pytest.approx(max(r["t_memory_ms"], r["t_compute_ms"]))
    assert r["tokens_per_s_ceiling"] == pytest.approx(1e3 / r["t_floor_ms"])


def test_nvfp4_scale_bytes_counted():
    spec = card("llama-3.1-8b")
    hw = resolve_hardware("b200", HW)
    bf16 = compute_roofline(spec, hw, "bf16", context_len=1)
    fp4 = compute_roofline(spec, hw, "nvfp4", context_len=1)
    scales = sum(c.get("scale_bytes", 0) for c in fp4["components"])
    linear = sum(c["params"] for c in fp4["components"] if c["group"] not in ("norms", "embedding", "kv_cache"))
    assert scales == pytest.approx(linear / 16, rel=0.01)
    assert fp4["weight_bytes_per_token_per_gpu"] < 0.3 * bf16["weight_bytes_per_token_per_gpu"]
    assert fp4["compute_dtype"] == "fp4"


def test_mla_reads_latent_cache_on_every_rank():
    spec = card("deepseek-v3")
    hw = resolve_hardware("h200", HW)
    r1 = compute_roofline(spec, hw, "fp8-block", tp=1, context_len=4096)
    r8 = compute_roofline(spec, hw, "fp8-block", tp=8, context_len=4096)
    assert r1["kv_bytes_per_token_per_gpu"] == r8["kv_bytes_per_token_per_gpu"] == 61 * 4096 * 576 * 2


def test_batch_hits_more_experts():
    spec = card("qwen3-30b-a3b")
    hw = resolve_hardware("h100-sxm", HW)
    b1 = compute_roofline(spec, hw, "bf16", batch=1, context_len=1)
    b64 = compute_roofline(spec, hw, "bf16", batch=64, context_len=1)
    assert b64["weight_bytes_per_token_per_gpu"] > 5 * b1["weight_bytes_per_token_per_gpu"]


def test_cpu_hardware_has_no_datasheet_time():
    r = compute_roofline(card("gemma-3-270m"), resolve_hardware("cpu", HW), "bf16")
    assert r["t_memory_ms"] is None
    assert r["provenance"]["t_memory_ms"].startswith("unavailable:")


def test_gguf_exact_bytes(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float16))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((128, 64), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    spec = spec_from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 100,
                           "tie_word_embeddings": True})
    r = compute_roofline(spec, resolve_hardware("cpu", HW), "gguf-q4_k_m", gguf_path=str(path), context_len=1)
    # tied output head reads the whole table, plus one embedding row, plus the two matrices
    assert r["weight_bytes_per_token_per_gpu"] == 100 * 64 * 2 + 64 * 2 + 64 * 64 * 2 + 128 * 64 * 2


def test_unknown_hardware_names_available():
    with pytest.raises(ConfigError, match=r"config field 'hardware': no spec named 'tpu-v9'.*h200"):
        resolve_hardware("tpu-v9", HW)


def test_unknown_format():
    with pytest.raises(ConfigError, match="weight_format"):
        compute_roofline(card("gemma-3-270m"), resolve_hardware("h200", HW), "int3")


def test_comm_floor_has_latency_at_tp():
    """Llama-3.1-70B TP8 on H200: 160 all-reduces, each latency (hardware spec, cited) + ring bytes / link."""
    hw = resolve_hardware("h200", HW)
    r = compute_roofline(card("llama-3.1-70b"), hw, "bf16", tp=8, context_len=1)
    assert r["allreduces_per_token"] == 160 and r["allreduce_message_bytes"] == 8192 * 2
    lat, source = hw.allreduce_latency()
    assert lat == r["allreduce_latency_us"] == 6 and "github.com/NVIDIA/nccl/issues/1259" in source
    each = 6 + 8192 * 2 * 2 * 7 / 8 / 900e9 * 1e6
    assert r["allreduce_us_each"] == pytest.approx(each)
    assert r["t_comm_floor_ms"] == pytest.approx(160 * each / 1e3)
    assert r["t_comm_floor_ms"] > 0.9  # the bandwidth-only floor was 0.005 ms
    assert r["provenance"]["t_comm_floor_ms"].startswith("modelled:") and "latency" in r["provenance"]["t_comm_floor_ms"]


def test_comm_floor_takes_a_measured_latency():
    hw = resolve_hardware("rtx-pro-6000-blackwell", HW)
    r = compute_roofline(card("glm-5"), hw, "nvfp4", tp=8, context_len=1, allreduce_latency_us=42.0,
                         allreduce_latency_source="measured: microbench/allreduce.json")
    assert r["allreduce_latency_us"] == 42.0
    assert r["provenance"]["t_comm_floor_ms"].startswith("measured:")
    assert r["t_comm_floor_ms"] == pytest.approx(156 * r["allreduce_us_each"] / 1e3)
    assert 6.5 < r["t_comm_floor_ms"] < 6.7  # the seeds: about 6.6 ms per token


@pytest.mark.parametrize("hw_name", ["a100-sxm", "b200", "h100-sxm", "h200", "l40s", "rtx-pro-6000-blackwell"])
def test_every_gpu_spec_cites_a_latency(hw_name):
    lat, source = resolve_hardware(hw_name, HW).allreduce_latency()
    assert lat and lat > 0 and len(source) > 40
    r = compute_roofline(card("llama-3.1-8b"), resolve_hardware(hw_name, HW), "bf16", tp=2, context_len=1)
    assert r["t_comm_floor_ms"] > 0


def test_comm_floor_never_zero_at_tp_without_latency():
    r = compute_roofline(card("gemma-3-270m"), resolve_hardware("cpu", HW), "bf16", tp=2, context_len=1)
    assert r["t_comm_floor_ms"] is None
    assert r["provenance"]["t_comm_floor_ms"].startswith("unavailable:")


def test_latency_without_source_is_one_line(tmp_path):
    (tmp_path / "x.yaml").write_text("name: X\nkind: gpu\nmemory_bandwidth_gbps: 100\n"
                                     "interconnect: {type: pcie, bandwidth_gbps: 10, allreduce_latency_us: 5}\n")
    with pytest.raises(ConfigError, match=r"x.yaml: field 'interconnect.allreduce_latency_source' is missing"):
        resolve_hardware("x", tmp_path)


def test_params_conventions_in_the_output():
    r = compute_roofline(card("gpt-oss-120b"), resolve_hardware("h200", HW), "bf16", context_len=1)
    assert r["params_active_non_embedding"] == pytest.approx(5.13e9, rel=0.01)
    assert r["params_active"] - r["params_active_non_embedding"] == r["params_embedding"]
    assert "OpenAI" in r["params_conventions"]["params_active_non_embedding"]
    # biases and the attention sinks are read too
    groups = {c["component"] for c in r["components"]}
    assert {"biases", "other parameters"} <= groups


def test_measured_latency_recomputes_from_the_fields():
    """The gap stage can swap in a measured latency from roofline.json's fields alone."""
    r = compute_roofline(card("llama-3.1-70b"), resolve_hardware("h200", HW), "bf16", tp=8, context_len=1)
    assert r["allreduce_us_each"] == pytest.approx(r["allreduce_latency_us"] + r["allreduce_bandwidth_us_each"])
    measured = 42.0
    t = r["allreduces_per_token"] * (measured + r["allreduce_bandwidth_us_each"]) / 1e3
    r2 = compute_roofline(card("llama-3.1-70b"), resolve_hardware("h200", HW), "bf16", tp=8, context_len=1,
                          allreduce_latency_us=measured)
    assert r2["t_comm_floor_ms"] == pytest.approx(t)
