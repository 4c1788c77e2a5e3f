"""Live stage arithmetic without a server: vLLM-named statistics, per-token ITL, token attribution, parsing,
engine detection and secret handling."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1] / "workflow")]

from decode_gap.live.client import StreamResult, display_url  # noqa: E402
from decode_gap.live.identity import clip, detect_engine, safe_headers, server_root  # noqa: E402
from decode_gap.live.metrics import describe, level_summary, request_timing  # noqa: E402
from decode_gap.live.parse import parse_stream  # noqa: E402
from decode_gap.live.runner import Redactor  # noqa: E402
from decode_gap.live.tokens import chunk_tokens_from_cumulative, output_tokens  # noqa: E402

MS = 1_000_000


def test_request_timing_matches_vllm_definitions():
    # chunks at 100, 150, 250, 300 ms; the third chunk holds 2 tokens
    t = request_timing([100 * MS, 150 * MS, 250 * MS, 300 * MS], [1, 1, 2, 1], output_tokens=5)
    assert t["ttft_ms"] == 100.0
    assert t["e2el_ms"] == 300.0
    assert t["tpot_ms"] == pytest.approx((300 - 100) / (5 - 1))
    assert t["itl_ms"] == [50.0, 100.0, 50.0]
    assert t["itl_per_token_ms"] == [50.0, 50.0, 50.0, 50.0]  # the 100 ms gap spread over its 2 tokens
    assert t["chunk_itl_per_token_ms"] == [None, 50.0, 50.0, 50.0]
    # per-token ITLs sum to E2EL - TTFT when the first chunk holds one token
    assert sum(t["itl_per_token_ms"]) == pytest.approx(t["e2el_ms"] - t["ttft_ms"])


def test_first_chunk_extra_tokens_have_no_gap_and_single_token_has_no_tpot():
    t = request_timing([10 * MS, 30 * MS], [3, 1], output_tokens=4)
    assert t["itl_per_token_ms"] == [20.0]
    assert t["tpot_ms"] == pytest.approx(20 / 3)
    one = request_timing([10 * MS], [1], output_tokens=1)
    assert one["tpot_ms"] is None and one["itl_ms"] == [] and one["itl_per_token_ms"] == []


def test_level_summary_uses_numpy_statistics_and_vllm_names():
    a = request_timing([100 * MS, 150 * MS, 250 * MS, 300 * MS], [1, 1, 2, 1], 5)
    b = request_timing([120 * MS, 160 * MS, 200 * MS], [1, 1, 1], 3)
    lv = level_summary(2, [a, b], failed=1, duration_s=0.5, input_tokens=[7, 7])
    assert lv["concurrency"] == 2 and lv["completed"] == 2 and lv["failed"] == 1 and lv["num_requests"] == 3
    assert lv["total_output_tokens"] == 8 and lv["total_input_tokens"] == 14
    assert lv["request_throughput"] == pytest.approx(2 / 0.5)
    assert lv["output_throughput"] == pytest.approx(8 / 0.5)
    itls = [50.0, 100.0, 50.0, 40.0, 40.0]
    assert lv["mean_itl_ms"] == pytest.approx(np.mean(itls))
    assert lv["median_itl_ms"] == pytest.approx(np.median(itls))
    assert lv["std_itl_ms"] == pytest.approx(np.std(itls))
    assert lv["p90_itl_ms"] == pytest.approx(np.percentile(itls, 90))
    assert lv["p99_itl_ms"] == pytest.approx(np.percentile(itls, 99))
    assert lv["min_itl_ms"] == 40.0 and lv["max_itl_ms"] == 100.0
    assert lv["median_ttft_ms"] == pytest.approx(110.0)
    assert lv["mean_tpot_ms"] == pytest.approx(np.mean([50.0, 40.0]))
    assert lv["mean_e2el_ms"] == pytest.approx(250.0)
    assert lv["mean_itl_per_token_ms"] == pytest.approx(np.mean([50, 50, 50, 50, 40, 40]))
    assert lv["mean_tokens_per_chunk"] == pytest.approx(8 / 7)
    for metric in ("ttft", "tpot", "itl", "e2el", "itl_per_token"):
        for stat in ("mean", "median", "std", "p90", "p99", "min", "max"):
            assert f"{stat}_{metric}_ms" in lv


def test_empty_level_gives_nulls_not_zeros():
    lv = level_summary(4, [], failed=3, duration_s=1.0)
    assert lv["completed"] == 0 and lv["failed"] == 3
    assert lv["mean_ttft_ms"] is None and lv["p99_itl_per_token_ms"] is None
    assert describe([], "x") == {f"{s}_x_ms": None for s in ("mean", "median", "std", "p90", "p99", "min", "max")}


def test_cumulative_counts_to_chunk_tokens():
    assert chunk_tokens_from_cumulative([1, 2, 4, 5]) == [1, 1, 2, 1]
    # a count that does not grow (or dips) still gives each content chunk one token
    assert chunk_tokens_from_cumulative([2, 2, 1, 4]) == [2, 1, 1, 2]


def _result(events, t0=0):
    r = StreamResult(url="http://127.0.0.1:1/v1/chat/completions", t_start_ns=t0)
    r.events = [(t, "", d) for t, d in events]
    r.overhead_ns = [1000] * len(events)
    r.done = True
    return r


def test_parse_chat_skips_role_only_and_usage_only_chunks():
    events = [
        (20 * MS, '{"choices":[{"delta":{"role":"assistant"},"finish_reason":null}]}'),
        (100 * MS, '{"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}'),
        (110 * MS, '{"choices":[{"delta":{"content":""},"finish_reason":null}]}'),
        (150 * MS, '{"choices":[{"delta":{"content":" there"},"finish_reason":"length"}]}'),
        (151 * MS, '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}'),
    ]
    p = parse_stream(_result(events), "chat")
    assert p.ok
    assert [c.t_ns for c in p.chunks] == [100 * MS, 150 * MS]
    assert p.text == "Hi there" and p.finish_reason == "length"
    assert output_tokens(p, [1, 1]) == (2, "usage")


def test_parse_reports_malformed_and_error_events():
    bad = parse_stream(_result([(1, '{"choices":[{"text":"a"}]}'), (2, "{not json")]), "completions")
    assert not bad.ok and bad.reason.startswith("malformed data line from http://127.0.0.1:1/")
    err = parse_stream(_result([(1, '{"error":{"message":"boom"}}')]), "completions")
    assert not err.ok and "error event" in err.reason and err.detail == "boom"
    empty = parse_stream(_result([(1, '{"choices":[{"text":""}]}')]), "completions")
    assert not empty.ok and "no content chunks" in empty.reason


@pytest.mark.parametrize("identity, engine", [
    ({"owned_by": ["vllm"], "endpoints": {"/version": {"version": "0.9.1"}}}, "vllm"),
    ({"owned_by": ["sglang"]}, "sglang"),
    ({"owned_by": ["llamacpp"]}, "llama.cpp"),
    ({"owned_by": ["me"]}, "llama.cpp"),
    ({"headers": {"server": "llama.cpp"}}, "llama.cpp"),
    ({"endpoints": {"/info": {"model_id": "x", "version": "3.0", "docker_label": "sha"}}}, "tgi"),
    ({"endpoints": {"/get_server_info": {"version": "0.4"}}}, "sglang"),
    ({"owned_by": ["local"], "endpoints": {"/health": {"status": "ok"}}}, "unknown"),
])
def test_detect_engine(identity, engine):
    assert detect_engine(identity)[0] == engine


def test_detect_engine_config_and_embedded_win():
    assert detect_engine({"owned_by": ["vllm"]}, configured="transformers")[0] == "transformers"
    assert detect_engine({}, embedded=True)[0] == "llama.cpp"


def test_identity_values_are_clipped_and_credentials_dropped():
    info = clip({"version": "1", "api_key": "sk-secret", "nested": {"hf_token": "x", "tp_size": 8}, "long": "a" * 500})
    assert "api_key" not in info and "hf_token" not in info["nested"] and info["nested"]["tp_size"] == 8
    assert len(info["long"]) <= 200
    hdrs = safe_headers({"Server": "uvicorn", "Set-Cookie": "s=1", "X-Api-Key": "k", "Date": "now"})
    assert hdrs == {"server": "uvicorn"}
    assert server_root("http://h:8000/v1/") == "http://h:8000"
    assert display_url("http://user:pw@h:8000/v1") == "http://h:8000/v1"


def test_redactor_scrubs_nested_values():
    r = Redactor(["sk-123"])
    out = r.obj({"a": "Bearer sk-123", "b": ["x sk-123"], "sk-123": 1})
    assert "sk-123" not in repr(out)
