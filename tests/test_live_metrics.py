"""Live stage arithmetic without a server: vLLM-named statistics, per-token ITL, token attribution, parsing,
engine detection and secret handling."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1] / "workflow")]

import asyncio  # noqa: E402

from decode_gap.live import tokens as tok  # noqa: E402
from decode_gap.live.client import StreamResult, body_message, display_url, error_message, quote, scrub  # noqa: E402
from decode_gap.live.identity import clip, detect_engine, safe_headers, server_root  # noqa: E402
from decode_gap.live.metrics import describe, level_summary, request_timing  # noqa: E402
from decode_gap.errors import ConfigError  # noqa: E402
from decode_gap.live.parse import Chunk, ParsedStream, parse_stream  # noqa: E402
from decode_gap.live.runner import Redactor  # noqa: E402
from decode_gap.live.server import read_eval_log  # noqa: E402
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
    # a count that does not grow (or dips) adds no token, so the counts still add up to the last total
    assert chunk_tokens_from_cumulative([2, 2, 1, 4]) == [2, 0, 0, 2]
    assert chunk_tokens_from_cumulative([0, 1]) == [1, 0]  # the first content chunk holds at least one


def test_zero_token_chunk_carries_its_gap_to_the_next_token():
    t = request_timing([0, 10 * MS, 20 * MS, 30 * MS], [1, 0, 1, 1], output_tokens=3)
    assert t["itl_per_token_ms"] == [20.0, 10.0]
    assert t["chunk_itl_per_token_ms"] == [None, None, 20.0, 10.0]
    assert sum(t["itl_per_token_ms"]) == pytest.approx(t["e2el_ms"] - t["ttft_ms"])


def test_apportion_and_fit_to_total_add_up():
    assert tok.apportion([1, 1, 1], 5) == [1, 2, 2] and sum(tok.apportion([3, 1], 7)) == 7
    assert tok.fit_to_total([1, 1, 2, 1], 6) == [1, 1, 3, 1]
    assert tok.fit_to_total([2, 1], 2) == [1, 1]
    assert tok.spread_total(4, 10) == [1, 3, 3, 3] and tok.spread_total(1, 5) == [5]
    assert sum(tok.spread_total(30, 42)) == 42 and tok.spread_total(3, 2) == [1, 0, 1]


@pytest.mark.parametrize("gaps", [[20.0] * 29, [10.0, 30.0, 20.0, 5.0, 55.0, 20.0]])
def test_spread_mean_per_token_equals_tpot_exactly(gaps):
    t_ms = np.concatenate([[37.0], 37.0 + np.cumsum(gaps)])
    total = 2 * len(gaps) - 3
    ks = tok.spread_total(len(t_ms), total)
    t = request_timing([int(x * MS) for x in t_ms], ks, total, spread=True)
    assert len(t["itl_per_token_ms"]) == total - 1
    assert np.mean(t["itl_per_token_ms"]) == pytest.approx(t["tpot_ms"], rel=1e-9)
    assert sum(t["chunk_tokens"]) == total
    lv = level_summary(1, [t], failed=0, duration_s=1.0)
    assert lv["mean_itl_per_token_ms"] == pytest.approx(lv["mean_tpot_ms"], rel=1e-9)
    assert lv["mean_tokens_per_chunk"] * len(t_ms) == pytest.approx(lv["total_output_tokens"])


def _parsed(texts, cum=None, total=None):
    p = ParsedStream()
    for i, text in enumerate(texts):
        p.chunks.append(Chunk(t_ns=(i + 1) * 10 * MS, text=text, cum_tokens=None if cum is None else cum[i],
                              overhead_ns=0))
    if total is not None:
        p.usage = {"prompt_tokens": 3, "completion_tokens": total}
    return p


class _WordCounterTestDouble:
    """TEST DOUBLE for a tokenizer: one token per whitespace-separated word."""

    name = "words (test double)"

    async def count(self, text):
        return len(text.split())


def test_token_count_methods_in_order_and_counts_agree_with_the_total():
    run = asyncio.run
    # 1. usage per chunk wins over a tokenizer
    counts, method, _ = run(tok.count_chunk_tokens(_parsed(["a", " b c"], cum=[1, 3], total=3), _WordCounterTestDouble()))
    assert (counts, method) == ([1, 2], "usage_per_chunk")
    # 2. a tokenizer; its counts are scaled to the final usage total when they disagree
    counts, method, detail = run(tok.count_chunk_tokens(_parsed(["a", " b c", " d"], total=4), _WordCounterTestDouble()))
    assert (counts, method, detail) == ([1, 2, 1], "tokenizer", "words (test double)")
    counts, method, detail = run(tok.count_chunk_tokens(_parsed(["a", " b c", " d"], total=6), _WordCounterTestDouble()))
    assert method == "tokenizer" and sum(counts) == 6 and counts[0] == 1 and "scaled to the final usage total 6" in detail
    # 3. only the final usage total: spread
    p = _parsed(["a", " b c", " d", " e"], total=7)
    counts, method, _ = run(tok.count_chunk_tokens(p, None))
    assert method == "usage_total_spread" and counts == [1, 2, 2, 2]
    assert tok.output_tokens(p, counts) == (7, "usage")
    # 4. nothing known
    p = _parsed(["a", " b c"])
    counts, method, _ = run(tok.count_chunk_tokens(p, None))
    assert (counts, method) == ([1, 1], "one_per_chunk") and tok.output_tokens(p, counts) == (2, "per_chunk_sum")


def test_hf_tokenizer_from_the_tokenizers_library(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    t = tokenizers.Tokenizer(WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    t.pre_tokenizer = Whitespace()
    t.save(str(tmp_path / "tokenizer.json"))
    for where in (tmp_path, tmp_path / "tokenizer.json"):
        counter = tok.HFTokenizer(where)
        assert asyncio.run(counter.count("hello world again")) == 3 and "live.tokenizer" in counter.name
    with pytest.raises(ConfigError, match=r"^config field 'live.tokenizer': .*missing.* does not exist"):
        tok.HFTokenizer(tmp_path / "missing")
    (tmp_path / "bad" ).mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"^config field 'live.tokenizer': cannot read .*bad"):
        tok.HFTokenizer(tmp_path / "bad")


@pytest.mark.parametrize("obj, message", [
    ({"error": "cannot reshape tensor of 0 elements"}, "cannot reshape tensor of 0 elements"),
    ({"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}},
     "CUDA out of memory (type InternalServerError, code 500)"),
    ({"object": "error", "message": "max_tokens too large", "type": "BadRequestError", "code": 400},
     "max_tokens too large"),
    ({"detail": "Not Found"}, "Not Found"),
    ({"detail": [{"loc": ["body", "max_tokens"], "msg": "value too large"}]}, "body.max_tokens: value too large"),
    ({"choices": [{"text": "x"}], "error": None}, None),
    ({"choices": [], "message": "not an error"}, None),
])
def test_server_error_message_shapes(obj, message):
    assert error_message(obj) == message


def test_server_messages_are_scrubbed_and_cut():
    assert scrub("bad key: api_key=sk-abcdef123456 and Authorization: Bearer abc.def-123") == (
        "bad key: api_key=[redacted] and Authorization: Bearer [redacted]")
    assert "hf_" not in scrub("token hf_AbCdEfGhIjKlMnOp was refused")
    assert "s3cr3t" not in scrub('{"password": "s3cr3t"}')
    long = quote("x" * 1000)
    assert len(long) == 300 and long.endswith("…")
    assert body_message('{"error": {"message": "boom"}}') == "boom"
    assert body_message("<html><body><h1>502 Bad Gateway</h1></body></html>") == "502 Bad Gateway"
    assert body_message("") == ""


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
    assert not err.ok and err.reason == "error event in stream from http://127.0.0.1:1/v1/chat/completions: boom"
    text = parse_stream(_result([(1, '{"choices":[{"text":"a"}]}'), (2, '{"error":"reshape failed"}')]), "completions")
    assert text.reason.endswith(": reshape failed") and text.detail == "1 content chunks before it"
    named = StreamResult(url="u", events=[(1, "error", '{"message":"overloaded"}')], overhead_ns=[0], done=True)
    assert parse_stream(named, "chat").reason == "error event in stream from u: overloaded"
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


def test_server_eval_blocks_are_read_from_the_embedded_server_log(tmp_path):
    """The lines llama-cpp-python 0.3.36's server prints after each generation (as seen in its log)."""
    log = tmp_path / "embedded_server.log"
    log.write_text(
        'INFO:     127.0.0.1:35316 - "POST /v1/completions HTTP/1.1" 200 OK\n'
        "Llama.generate: 1 prefix-match hit, remaining 16 prompt tokens to eval\n"
        "llama_perf_context_print:        load time =       0.19 ms\n"
        "llama_perf_context_print: prompt eval time =      81.87 ms /    16 tokens (    5.12 ms per token,   195.43 tokens per second)\n"
        "llama_perf_context_print:        eval time =     190.63 ms /    15 runs   (   12.71 ms per token,    78.68 tokens per second)\n"
        "llama_perf_context_print:       total time =     341.69 ms /    31 tokens\n"
        "llama_perf_context_print:    graphs reused =         14\n"
        "llama_perf_context_print:        load time =       0.19 ms\n"
        "llama_perf_context_print: prompt eval time =       0.04 ms /    17 tokens (    0.00 ms per token, 472222.22 tokens per second)\n"
        "llama_perf_context_print:        eval time =      12.92 ms /     1 runs   (   12.92 ms per token,    77.41 tokens per second)\n"
        "llama_perf_context_print:       total time =     198.45 ms /    18 tokens\n"
    )
    blocks = read_eval_log(log)
    assert [(b["eval_ms"], b["runs"], b["prompt_tokens"]) for b in blocks] == [(190.63, 15, 16), (12.92, 1, 17)]
    assert blocks[0]["ms_per_token"] == pytest.approx(190.63 / 15) and blocks[0]["total_ms"] == 341.69
    assert read_eval_log(tmp_path / "missing.log") == []


def test_server_eval_blocks_pair_with_requests_in_the_order_their_generations_started():
    from types import SimpleNamespace

    from decode_gap.live.runner import _match_server_eval

    def item(first_event_ns):
        events = [(first_event_ns, "", "{}")] if first_event_ns is not None else []
        return (SimpleNamespace(result=StreamResult(url="u", events=events)), None, [], None, None)

    parsed = [item(50), item(10), item(None), item(30)]  # the third never streamed (e.g. HTTP 500)
    blocks = [{"eval_ms": 10.0, "runs": 1, "ms_per_token": 10.0}, {"eval_ms": 30.0, "runs": 1, "ms_per_token": 30.0},
              {"eval_ms": 50.0, "runs": 1, "ms_per_token": 50.0}]
    out = _match_server_eval(parsed, blocks, embedded=True)
    assert out["status"] == "measured" and {i: b["eval_ms"] for i, b in out["_by_item"].items()} == {1: 10, 3: 30, 0: 50}
    short = _match_server_eval(parsed, blocks[:2], embedded=True)
    assert short["status"] == "unavailable" and "2 eval blocks" in short["why"] and "_by_item" not in short
    assert _match_server_eval(parsed, blocks, embedded=False)["status"] == "unavailable"


def test_embedded_server_log_exceptions_are_quoted(tmp_path):
    from decode_gap.live.server import read_log_errors

    log = tmp_path / "embedded_server.log"
    log.write_text(
        "ERROR:    Exception in ASGI application\n"
        "  | ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)\n"
        "    |     raise ValueError(\n"
        "    | ValueError: Requested tokens (400010) exceed context window of 2048\n"
        "ValueError: Requested tokens (400010) exceed context window of 2048\n"
        "RuntimeError: bad auth token=abcdef123456 " + "x" * 400 + "\n"
    )
    errs = read_log_errors(log)
    assert errs[0] == "ValueError: Requested tokens (400010) exceed context window of 2048"
    assert len(errs) == 2 and "abcdef123456" not in errs[1] and len(errs[1]) == 300
