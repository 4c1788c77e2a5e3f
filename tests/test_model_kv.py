"""KV cache per token per layer for every attention kind, each against a hand computation."""

from pathlib import Path

import pytest

from decode_gap.hardware import resolve_hardware
from decode_gap.model import spec_from_dict
from decode_gap.roofline import compute_roofline, kv_bytes_per_sequence

from model_walk import FAMILIES

REPO = Path(__file__).resolve().parents[1]
HW = resolve_hardware("h200", REPO / "config" / "hardware")


def kv(spec, ctx, tp=1, dtype="bf16"):
    return kv_bytes_per_sequence(spec, ctx, tp, dtype)[0]


def test_gqa():
    spec = spec_from_dict(FAMILIES["mixtral"])  # 4 layers, 2 KV heads x 16, no window
    assert {a.kind for a in spec.attention} == {"full"}
    assert kv(spec, 100) == 4 * 100 * (2 * 2 * 16) * 2
    assert kv(spec, 100, tp=2) == 4 * 100 * (2 * 1 * 16) * 2  # one KV head per GPU
    assert kv(spec, 100, dtype="fp8") == 4 * 100 * (2 * 2 * 16) * 1


def test_mqa_replicated_under_tp():
    spec = spec_from_dict({**FAMILIES["olmoe"], "num_key_value_heads": 1})
    assert kv(spec, 50) == kv(spec, 50, tp=4) == 4 * 50 * (2 * 1 * 16) * 2


def test_mla_latent_whole_on_every_rank():
    spec = spec_from_dict(FAMILIES["deepseek_v2"])  # kv_lora_rank 32 + rope 8
    assert {a.kind for a in spec.attention} == {"mla"} and spec.attention[0].kv_per_token == 40
    assert kv(spec, 64) == kv(spec, 64, tp=4) == 4 * 64 * 40 * 2


def test_sliding_window_capped_gemma2():
    spec = spec_from_dict(FAMILIES["gemma2"])  # layer_types alternate sliding (window 8) / full
    assert [a.kind for a in spec.attention] == ["sliding", "full", "sliding", "full"]
    per = 2 * 2 * 16 * 2
    assert kv(spec, 32) == 2 * 8 * per + 2 * 32 * per
    assert kv(spec, 4) == 4 * 4 * per  # under the window: no cap


def test_sliding_everywhere_without_layer_types_phi3():
    spec = spec_from_dict(FAMILIES["phi3"])  # sliding_window 16 on every layer, 4 KV heads
    assert {a.kind for a in spec.attention} == {"sliding"}
    assert kv(spec, 100) == 4 * 16 * (2 * 4 * 16) * 2


def test_gpt_oss_sliding_and_full():
    spec = spec_from_dict(FAMILIES["gpt_oss"])
    assert kv(spec, 40) == 2 * 8 * (2 * 2 * 16) * 2 + 2 * 40 * (2 * 2 * 16) * 2


def test_chunked_attention_capped_at_chunk_llama4():
    spec = spec_from_dict(FAMILIES["llama4"])  # chunk 8; every 4th layer full (NoPE)
    assert [a.kind for a in spec.attention] == ["chunked", "chunked", "chunked", "full"]
    per = 2 * 2 * 16 * 2
    assert kv(spec, 30) == 3 * 8 * per + 30 * per


def test_linear_attention_state_qwen3_next():
    spec = spec_from_dict(FAMILIES["qwen3_next"])
    kinds = [a.kind for a in spec.attention]
    assert kinds == ["linear", "linear", "linear", "full"]
    # Gated DeltaNet: S is [v_heads=4, k_dim=8, v_dim=8]; conv state (kernel-1=3) x conv_dim (2*2*8 + 4*8 = 64)
    state = 4 * 8 * 8 + 3 * 64
    assert spec.attention[0].state == state
    full = 2 * 2 * 16 * 2
    assert kv(spec, 10) == 3 * state * 2 + 10 * full
    assert kv(spec, 1000) == 3 * state * 2 + 1000 * full  # the state does not grow with the context
    assert kv(spec, 10, tp=2) == 3 * (state / 2) * 2 + 10 * (full / 2)


def test_unknown_kind_still_gets_a_roofline():
    """A layer whose attention the code does not know: roofline computed, KV unavailable (why)."""
    from model_walk import small_config

    spec = spec_from_dict(small_config("recurrent_gemma"), "<recurrent_gemma>")
    assert any(a.kind == "unknown" for a in spec.attention)
    r = compute_roofline(spec, HW, "bf16", context_len=128)
    assert r["status"] == "ok" and r["t_memory_ms"] > 0
    assert r["kv_unavailable_layers"] > 0
    assert r["provenance"]["kv_bytes_per_token_per_gpu"].startswith("unavailable for")


def test_roofline_kv_rows_name_each_kind():
    spec = spec_from_dict(FAMILIES["qwen3_next"])
    r = compute_roofline(spec, HW, "bf16", context_len=10)
    kinds = {row["kind"]: row for row in r["kv_layers"]}
    assert kinds["linear"]["layers"] == 3 and kinds["full"]["layers"] == 1
    assert r["kv_bytes_per_token_per_gpu"] == pytest.approx(kv(spec, 10))
