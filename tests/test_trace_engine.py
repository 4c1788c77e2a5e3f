"""The engine level's own trace: transformers decode steps under torch.profiler with `decode_step` annotations."""

from __future__ import annotations

import pytest

from decode_gap.errors import DecodeGapError
from decode_gap.simulate.engine_trace import record_engine_trace
from decode_gap.trace.analyze import analyze_path

TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)


def test_engine_level_trace_round_trip(tmp_path):
    out = tmp_path / "engine.json.gz"
    meta = record_engine_trace(TINY, out, steps=4, warmup=1, timed=3, prompt_len=8, device="cpu")
    assert out.read_bytes()[:2] == b"\x1f\x8b"  # gzipped by torch
    assert meta["annotation"] == "decode_step" and meta["unprofiled_step_ms_median"] > 0
    res, _ = analyze_path(out, source="engine-level")
    assert res["source"]["kind"] == "engine-level"
    assert res["method"] == "annotation 'decode_step'" and res["steps_found"] == 4
    assert res["categories"].get("GEMM fp32", 0) > 0


def test_graph_mode_needs_a_gpu(tmp_path):
    with pytest.raises(DecodeGapError, match="needs a CUDA GPU"):
        record_engine_trace(TINY, tmp_path / "g.json.gz", mode="graph", device="cpu")


def test_engine_trace_carries_its_unprofiled_reference(tmp_path):
    out = tmp_path / "engine.json.gz"
    meta = record_engine_trace(TINY, out, steps=4, warmup=1, timed=3, prompt_len=8, device="cpu")
    assert meta["activities"] == ["CPU"] and meta["profiler_calibration"] is None  # calibration: GPU graphs only
    res, _ = analyze_path(out, source="engine-level")
    po = res["profiler_overhead"]
    assert po["status"] == "ok" and po["unprofiled_step_ms"] > 0 and po["corrections"] == "none"
    assert po["ratio_raw"] == po["ratio_corrected"] > 0
