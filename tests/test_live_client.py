"""Timing against the scripted SSE test double (tests/sse_double.py, a real HTTP server on 127.0.0.1).

The double logs the server-side perf_counter_ns of every event write (CLOCK_MONOTONIC, shared with this
process), so each measured arrival is checked against the moment the chunk really left the server, and the
arithmetic (TTFT, ITL, ITL per token, TPOT) against the script.
"""

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1] / "workflow")]

from sse_double import CHUNKS, DoubleProcess  # noqa: E402

from decode_gap.live import tokens as tok  # noqa: E402
from decode_gap.live.client import stream_request  # noqa: E402
from decode_gap.live.metrics import request_timing  # noqa: E402
from decode_gap.live.parse import parse_stream  # noqa: E402

# Arrival - send on loopback: sub-millisecond normally; the bound leaves room for a busy 2-core CI host.
ARRIVAL_TOL_MS = 8.0
SCRIPT_TOL_MS = 15.0


@pytest.fixture(scope="module")
def double():
    d = DoubleProcess(key="test-key-abc")
    yield d
    d.close()


async def _one(url, api, payload_extra=None, headers=None):
    body = {"stream": True, "max_tokens": 5, **(payload_extra or {})}
    body["messages" if api == "chat" else "prompt"] = [{"role": "user", "content": "x"}] if api == "chat" else "x"
    path = "/chat/completions" if api == "chat" else "/completions"
    async with httpx.AsyncClient() as client:
        # one throw-away request first, so connection set-up is not inside the measured request
        await stream_request(client, url + path, body, headers, 10)
        res = await stream_request(client, url + path, body, headers, 10)
        parsed = parse_stream(res, api)
        counter = await tok.find_server_tokenizer(client, url[: -len("/v1")], None, headers or {})
        counts = await tok.count_chunk_tokens(parsed, counter) if parsed.ok else None
    return res, parsed, counts


def _sends_ms(double, res):
    """The double's log entry for this request: (send times relative to the client's start, t_recv)."""
    entry = [e for e in double.log() if e["t_recv_ns"] >= res.t_start_ns][0]
    return [(s - res.t_start_ns) / 1e6 for s in entry["sends"]], (entry["t_recv_ns"] - res.t_start_ns) / 1e6, entry


def test_completions_multi_token_chunk_with_usage_per_chunk(double):
    res, parsed, (chunk_tokens, method, _) = asyncio.run(_one(double.url("ok"), "completions"))
    assert res.ok and parsed.ok
    assert method == "usage_per_chunk" and chunk_tokens == [1, 1, 2, 1]
    n_out, source = tok.output_tokens(parsed, chunk_tokens)
    assert (n_out, source) == (5, "usage")
    t = request_timing([c.t_ns for c in parsed.chunks], chunk_tokens, n_out)
    sends, recv_ms, _ = _sends_ms(double, res)
    arrivals = [c.t_ns / 1e6 for c in parsed.chunks]
    for arrived, sent in zip(arrivals, sends):
        assert 0 <= arrived - sent < ARRIVAL_TOL_MS
    # against the real send times
    assert t["ttft_ms"] == pytest.approx(sends[0], abs=ARRIVAL_TOL_MS)
    for gap, (s0, s1) in zip(t["itl_ms"], zip(sends, sends[1:])):
        assert gap == pytest.approx(s1 - s0, abs=ARRIVAL_TOL_MS)
    # against the script: 100, 150, 250 (2 tokens), 300 ms after the request was read
    assert t["ttft_ms"] - recv_ms == pytest.approx(CHUNKS[0][0], abs=SCRIPT_TOL_MS)
    assert t["itl_ms"] == pytest.approx([50.0, 100.0, 50.0], abs=SCRIPT_TOL_MS)
    itpt = t["itl_per_token_ms"]
    assert len(itpt) == 4
    assert itpt[1] == itpt[2] == pytest.approx(t["itl_ms"][1] / 2, rel=1e-12)  # the 2-token chunk's gap, halved
    assert itpt == pytest.approx([50.0, 50.0, 50.0, 50.0], abs=SCRIPT_TOL_MS)
    assert t["tpot_ms"] == pytest.approx((t["e2el_ms"] - t["ttft_ms"]) / 4, rel=1e-12)
    assert t["e2el_ms"] - recv_ms == pytest.approx(300.0, abs=SCRIPT_TOL_MS)


def test_chat_role_only_first_chunk_and_final_usage_chunk(double):
    res, parsed, (chunk_tokens, method, detail) = asyncio.run(_one(double.url("chat"), "chat"))
    assert parsed.ok
    sends, recv_ms, _ = _sends_ms(double, res)
    assert len(sends) == 5  # role-only chunk + 4 content chunks
    assert len(parsed.chunks) == 4
    # TTFT is the first *content* chunk (100 ms), not the role-only chunk (20 ms)
    assert parsed.chunks[0].t_ns / 1e6 == pytest.approx(sends[1], abs=ARRIVAL_TOL_MS)
    assert parsed.chunks[0].t_ns / 1e6 - recv_ms == pytest.approx(100.0, abs=SCRIPT_TOL_MS)
    # no per-chunk usage: the server's /tokenize counts the growing text; the final usage gives the total
    assert method == "tokenizer" and detail == "server /chat/tokenize"
    assert chunk_tokens == [1, 1, 2, 1]
    assert tok.output_tokens(parsed, chunk_tokens) == (5, "usage")


def test_no_usage_and_no_tokenizer_counts_one_token_per_chunk(double):
    res, parsed, (chunk_tokens, method, _) = asyncio.run(_one(double.url("notok"), "completions"))
    assert parsed.ok and method == "one_per_chunk" and chunk_tokens == [1, 1, 1, 1]
    assert tok.output_tokens(parsed, chunk_tokens) == (4, "per_chunk_sum")
    t = request_timing([c.t_ns for c in parsed.chunks], chunk_tokens, 4)
    assert t["itl_per_token_ms"] == t["itl_ms"]  # one token per chunk: both views agree


def test_bearer_key_is_sent(double):
    res, parsed, _ = asyncio.run(_one(double.url("auth"), "completions",
                                      headers={"Authorization": "Bearer test-key-abc"}))
    assert parsed.ok
    _, _, entry = _sends_ms(double, res)
    assert entry["auth_ok"] is True


def test_client_overhead_is_recorded_per_event(double):
    res, parsed, _ = asyncio.run(_one(double.url("ok"), "completions"))
    assert len(res.overhead_ns) == len(res.events)
    assert all(0 <= o < 50_000_000 for o in res.overhead_ns)
    assert all(c.overhead_ns >= 0 for c in parsed.chunks)


async def _nodone(url, require_done):
    body = {"stream": True, "max_tokens": 5, "prompt": "x"}
    async with httpx.AsyncClient() as client:
        return await stream_request(client, url + "/completions", body, None, 10, require_done=require_done)


def test_missing_done_fails_by_default_and_passes_after_finish_reason_when_allowed(double):
    """`transformers serve` ends streams after the finish_reason chunk without [DONE] (live.require_done: false)."""
    strict = asyncio.run(_nodone(double.url("nodone"), True))
    assert not strict.ok and "ended without [DONE]" in strict.reason
    lenient = asyncio.run(_nodone(double.url("nodone"), False))
    assert lenient.ok and lenient.done and not lenient.done_marker


def test_stream_dropped_without_finish_reason_still_fails_when_lenient(double):
    res = asyncio.run(_nodone(double.url("drop"), False))
    assert not res.ok


def test_stream_ending_after_an_error_event_fails_with_the_servers_message(double):
    """transformers serve sends a role chunk, `data: {"error": "..."}` and closes: the reason is its message."""
    async def go(require_done):
        body = {"stream": True, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        async with httpx.AsyncClient() as client:
            return await stream_request(client, double.url("error_string") + "/chat/completions", body, None, 10,
                                        require_done=require_done)

    for require_done in (True, False):
        res = asyncio.run(go(require_done))
        assert not res.ok and "ended without [DONE]" not in res.reason
        assert res.reason.startswith("error event in stream from ") and "cannot reshape tensor" in res.reason
        assert "ended without [DONE]" in res.detail  # the missing [DONE] is still said, as a detail
