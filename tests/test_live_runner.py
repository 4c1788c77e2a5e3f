"""The live stage end to end against the scripted SSE test double (tests/sse_double.py): the summary
contract, every failure mode of issue 3 item 6, partial runs, the kept last good result, option negotiation,
the skipped stage, and an API key that must never reach an output or a log."""

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1] / "workflow")]

from sse_double import ERROR_OBJECT, ERROR_STRING, HTTP500_MESSAGE, SPEC_CHUNKS, DoubleProcess, spec_chunks  # noqa: E402

from decode_gap.errors import ConfigError, DecodeGapError  # noqa: E402
from decode_gap.live.runner import CHUNK_COLUMNS, REQUEST_COLUMNS, LiveOutputs, LiveSettings, run_live  # noqa: E402
from decode_gap.host import free_port  # noqa: E402

DOUBLE_KEY = "dbl-right-key-0001"


@pytest.fixture(scope="module")
def double():
    d = DoubleProcess(key=DOUBLE_KEY)
    yield d
    d.close()


def _outputs(tmp_path) -> LiveOutputs:
    d = tmp_path / "live"
    return LiveOutputs(d / "summary.json", d / "requests.parquet", d / "chunks.parquet")


def _settings(endpoint, **kw) -> LiveSettings:
    base = dict(endpoint=endpoint, concurrency=[1, 2], num_requests=2, warmup_requests=0, max_tokens=5,
                input_len=4, timeout_s=10.0)
    base.update(kw)
    return LiveSettings(**base)


def _run(settings, out, lines=None, **kw):
    sink = lines if lines is not None else []
    return run_live(settings, out, progress=False, calibrate_client=kw.pop("calibrate_client", False),
                    log=sink.append, **kw)


def test_summary_contract_and_tables(double, tmp_path):
    out = _outputs(tmp_path)
    summary = _run(_settings(double.url("ok")), out, calibrate_client=True)
    on_disk = json.loads(out.summary.read_text())
    assert on_disk["stage"] == "live" and on_disk["status"] == "ok"
    assert on_disk["engine"] == "unknown"  # the double does not look like any engine
    assert on_disk["token_count_method"] == "usage_per_chunk"
    assert on_disk["model"] == "double-model"
    assert on_disk["server"]["models"] == ["double-model"]
    assert on_disk["server"]["endpoints"]["/version"]["name"] == "sse-double"
    assert [lv["concurrency"] for lv in on_disk["levels"]] == [1, 2]
    for lv in on_disk["levels"]:
        assert lv["completed"] == 2 and lv["failed"] == 0
        for key in ("mean_ttft_ms", "median_tpot_ms", "std_itl_ms", "p90_e2el_ms", "p99_itl_ms", "min_ttft_ms",
                    "max_e2el_ms", "output_throughput", "request_throughput", "duration_s",
                    "mean_itl_per_token_ms", "median_itl_per_token_ms", "p99_itl_per_token_ms"):
            assert lv[key] is not None, key
        assert lv["total_output_tokens"] == 10
        assert lv["mean_tokens_per_chunk"] == pytest.approx(5 / 4)
    assert on_disk["errors"] == [] and on_disk["completed"] == 4 and on_disk["failed"] == 0
    ovh = on_disk["client_overhead_us"]
    assert ovh["chunks"] == 16 and ovh["median"] > 0
    assert ovh["loopback"]["status"] == "measured" and ovh["loopback"]["median_delivery_us"] > 0
    req = pd.read_parquet(out.requests)
    chunks = pd.read_parquet(out.chunks)
    assert list(req.columns) == list(REQUEST_COLUMNS) and len(req) == 4 and req["ok"].all()
    assert list(chunks.columns) == list(CHUNK_COLUMNS) and len(chunks) == 16
    first = chunks[chunks.chunk_index == 0]
    assert first["itl_ms"].isna().all() and first["itl_per_token_ms"].isna().all()
    two = chunks[chunks.tokens == 2]
    assert (two["itl_per_token_ms"] == two["itl_ms"] / 2).all()
    # the level statistics are the statistics of the tables
    c1 = req[req.concurrency == 1]
    assert on_disk["levels"][0]["mean_ttft_ms"] == pytest.approx(c1["ttft_ms"].mean())
    # no side copy: every good run is kept in the report archive
    assert not (out.dir / "last_good").exists()
    assert summary["status"] == "ok"


def test_chat_with_rejected_option_is_negotiated(double, tmp_path):
    out = _outputs(tmp_path)
    summary = _run(_settings(double.url("strict"), api="chat", concurrency=[1]), out)
    assert summary["status"] == "ok" and summary["completed"] == 2
    opts = summary["request_options"]
    assert opts["dropped_after_rejection"] == ["continuous_usage_stats"]
    assert "stream_options.include_usage" in opts["sent"]
    assert "stream_options.continuous_usage_stats" not in opts["sent"]
    assert opts["rejections"][0]["status"] == 422
    assert summary["token_count_method"] == "tokenizer" and summary["output_tokens_source"] == "usage"
    assert summary["warmup"]["probe"] == "ok"


FAILURES = {
    "unreachable": "cannot connect to http://127.0.0.1:{port}/v1/completions",
    "http500": "HTTP 500 from {url}/completions: scripted internal error while handling request (api_key=[redacted]) "
               "(type InternalServerError, code 500)",
    "json": "non-SSE response from {url}/completions (content-type 'application/json')",
    "malformed": "malformed data line from {url}/completions",
    "drop": "connection dropped mid-stream by {url}/completions",
    "nodone": "stream from {url}/completions ended without [DONE]",
    "hang": "timeout after 0.6 s (live.timeout_s) waiting for {url}/completions",
    "error_event": "error event in stream from {url}/completions: scripted failure: CUDA out of memory "
                   "(type InternalServerError, code 500)",
    "error_string": f"error event in stream from {{url}}/completions: {ERROR_STRING}",
}


@pytest.mark.parametrize("scenario", sorted(FAILURES))
def test_every_failure_mode_is_counted_and_fails_the_stage_with_an_error_summary(double, tmp_path, scenario):
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1" if scenario == "unreachable" else double.url(scenario)
    reason = FAILURES[scenario].format(url=url, port=port)
    out = _outputs(tmp_path)
    # an earlier good result exists
    _run(_settings(double.url("ok"), concurrency=[1], num_requests=1), out)
    good_before = out.summary.read_text()
    lines: list[str] = []
    with pytest.raises(DecodeGapError) as err:
        _run(_settings(url, concurrency=[1], num_requests=2, timeout_s=0.6), out, lines)
    msg = str(err.value)
    assert url in msg and "no request" in msg and "\n" not in msg
    assert reason in msg  # the one-line stage error quotes the server's own words
    error_summary = json.loads(out.last_error.read_text())
    assert error_summary["status"] == "failed" and error_summary["completed"] == 0
    measure = [e for e in error_summary["errors"] if e["phase"] == "measure"]
    assert measure == [{"reason": reason, "count": 2, "phase": "measure", "concurrency": [1],
                        "example": measure[0]["example"]}]
    assert error_summary["levels"][0]["failed"] == 2
    assert any(reason in line for line in lines)  # a clear error line in the log
    assert "dbl-leaked-secret-42" not in out.last_error.read_text() and not any("dbl-leaked" in x for x in lines)
    # the earlier good result is untouched
    assert out.summary.read_text() == good_before


def test_some_failures_give_a_partial_result(double, tmp_path):
    double.reset()
    out = _outputs(tmp_path)
    summary = _run(_settings(double.url("flaky"), concurrency=[1, 2], num_requests=4), out)
    # streamed requests 3, 6, 9 (probe is #1) answer 500
    assert summary["status"] == "partial" and summary["failed"] == 3 and summary["completed"] == 5
    assert summary["errors"][0]["reason"] == f"HTTP 500 from {double.url('flaky')}/completions: internal server error (scripted)"
    assert summary["errors"][0]["count"] == 3
    assert "3 of 8" in summary["reason"]
    req = pd.read_parquet(out.requests)
    assert (~req["ok"]).sum() == 3 and req.loc[~req["ok"], "http_status"].eq(500).all()


def test_api_key_is_sent_but_never_written(double, tmp_path, monkeypatch):
    monkeypatch.setenv("LIVE_TEST_KEY", DOUBLE_KEY)
    out = _outputs(tmp_path)
    lines: list[str] = []
    summary = _run(_settings(double.url("auth"), api_key_env="LIVE_TEST_KEY"), out, lines)
    assert summary["status"] == "ok"
    assert all(e["auth_ok"] for e in double.log() if e["scenario"] == "auth")
    # the double echoes the key in the model id and a header: both must come out scrubbed
    assert summary["model"] == "double-model-[redacted]"
    for path in [*out.dir.rglob("*")]:
        if path.is_file():
            assert DOUBLE_KEY.encode() not in path.read_bytes(), path
    assert not any(DOUBLE_KEY in line for line in lines)


def test_wrong_api_key_echoed_by_the_server_stays_secret(double, tmp_path, monkeypatch):
    wrong = "wrong-key-9876"
    monkeypatch.setenv("LIVE_TEST_KEY", wrong)
    out = _outputs(tmp_path)
    lines: list[str] = []
    with pytest.raises(DecodeGapError) as err:
        _run(_settings(double.url("auth"), api_key_env="LIVE_TEST_KEY", concurrency=[1]), out, lines)
    assert wrong not in str(err.value)
    text = out.last_error.read_text()
    assert "HTTP 401" in text and wrong not in text and "[redacted]" in text
    assert not any(wrong in line for line in lines)


def test_missing_api_key_variable_is_a_config_error(double, tmp_path, monkeypatch):
    monkeypatch.delenv("LIVE_TEST_MISSING", raising=False)
    with pytest.raises(ConfigError, match="api_key_env.*LIVE_TEST_MISSING"):
        _run(_settings(double.url("ok"), api_key_env="LIVE_TEST_MISSING"), _outputs(tmp_path))


def test_disabled_stage_writes_skipped_summary_and_typed_empty_tables(tmp_path):
    out = _outputs(tmp_path)
    summary = _run(LiveSettings(enabled=False), out)
    on_disk = json.loads(out.summary.read_text())
    assert on_disk["stage"] == "live" and on_disk["status"] == "skipped" and "stages.live" in on_disk["reason"]
    assert summary["levels"] == []
    req, chunks = pd.read_parquet(out.requests), pd.read_parquet(out.chunks)
    assert list(req.columns) == list(REQUEST_COLUMNS) and req.empty
    assert list(chunks.columns) == list(CHUNK_COLUMNS) and chunks.empty


def test_settings_from_snakemake_params():
    s = LiveSettings.from_params({
        "endpoint": " http://h:1/v1 ", "api_key_env": "K", "gguf_path": "m.gguf", "enabled": True,
        "live": {"api": "chat", "concurrency": [1, 8], "timeout_s": 5, "embedded": {"threads": 3}},
    })
    assert s.endpoint == "http://h:1/v1" and s.api == "chat" and s.concurrency == [1, 8]
    assert s.threads == 3 and s.timeout_s == 5.0 and s.num_requests == 8 and s.gguf_path == "m.gguf"


def test_server_error_message_in_chat_streams_without_done(double, tmp_path):
    """transformers serve: role chunk, `data: {"error": "..."}`, end of body; lenient about [DONE] or not."""
    url = double.url("error_string")
    for require_done in (True, False):
        out = _outputs(tmp_path / str(require_done))
        with pytest.raises(DecodeGapError, match="cannot reshape tensor of 0 elements"):
            _run(_settings(url, api="chat", concurrency=[1], require_done=require_done), out)
        errors = json.loads(out.last_error.read_text())["errors"]
        reason = f"error event in stream from {url}/chat/completions: {ERROR_STRING}"
        assert [(e["reason"], e["count"]) for e in errors if e["phase"] == "measure"] == [(reason, 2)]
        assert "ended without [DONE]" not in json.dumps([e["reason"] for e in errors])
    assert ERROR_OBJECT["message"] in FAILURES["error_event"]
    assert HTTP500_MESSAGE.split(" (api_key")[0] in FAILURES["http500"]


def _tiny_tokenizer(path: Path) -> Path:
    """A word-level tokenizer.json that knows the double's `w<n>` words (built here, nothing downloaded)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(50)}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    return path


@pytest.mark.parametrize("with_tokenizer", [False, True], ids=["final_usage_only", "live_tokenizer"])
def test_per_token_itl_matches_the_servers_own_token_times(double, tmp_path, with_tokenizer):
    """Multi-token chunks, usage only in the last chunk, no tokenize endpoint (issue 17): the mean per-token
    ITL matches the double's own per-token emission times within 0.3 ms, with and without live.tokenizer."""
    pytest.importorskip("tokenizers")
    tokenizer = str(_tiny_tokenizer(tmp_path / "tok")) if with_tokenizer else ""
    double.reset()
    out = _outputs(tmp_path)
    summary = _run(_settings(double.url("spec"), concurrency=[1], num_requests=3, max_tokens=64,
                             tokenizer=tokenizer), out)
    entries = [e for e in double.log() if e["scenario"] == "spec"][1:]  # the first is the 2-token probe
    assert len(entries) == 3
    truth = [np.diff(np.asarray(e["token_times_ns"], dtype=float)) / 1e6 for e in entries]
    n_tokens = sum(k for _, _, k in spec_chunks())
    lv = summary["levels"][0]
    assert lv["completed"] == 3
    print(f"spec double, tokenizer={with_tokenizer}: mean ITL/token {lv['mean_itl_per_token_ms']:.3f} ms, truth "
          f"{np.mean(np.concatenate(truth)):.3f} ms, chunk ITL {lv['mean_itl_ms']:.3f} ms, TPOT {lv['mean_tpot_ms']:.3f} ms,"
          f" median ITL/token {lv['median_itl_per_token_ms']:.3f} ms")
    assert lv["mean_itl_per_token_ms"] == pytest.approx(float(np.mean(np.concatenate(truth))), abs=0.3)
    # the summary agrees with itself: tokens per chunk and totals from the same output token count
    assert lv["total_output_tokens"] == 3 * n_tokens
    assert lv["mean_tokens_per_chunk"] == pytest.approx(n_tokens / SPEC_CHUNKS)
    assert lv["mean_itl_per_token_ms"] == pytest.approx(lv["mean_tpot_ms"], abs=1e-6)
    assert lv["mean_itl_ms"] > lv["mean_itl_per_token_ms"] + 3  # the chunk interval is not the token interval
    req = pd.read_parquet(out.requests)
    for (_, row), t in zip(req.sort_values("request_id").iterrows(), truth):
        assert row["mean_itl_per_token_ms"] == pytest.approx(float(np.mean(t)), abs=0.3)
        assert row["output_tokens"] == n_tokens
    chunks = pd.read_parquet(out.chunks)
    assert (chunks.groupby("request_id")["tokens"].sum() == n_tokens).all()
    if with_tokenizer:
        assert summary["token_count_method"] == "tokenizer"
        assert summary["tokenizer"].startswith("live.tokenizer (") and summary["settings"]["tokenizer"] == tokenizer
        assert summary["itl_per_token_basis"] == "exact" and summary["itl_per_token_note"] is None
        # exact counts: the 3-token chunks are where the script put them
        assert chunks[chunks.request_id == 0]["tokens"].tolist() == [k for _, _, k in spec_chunks()]
    else:
        assert summary["token_count_method"] == "usage_total_spread"
        assert summary["itl_per_token_basis"] == "spread" and lv["itl_per_token_basis"] == "spread"
        assert "approximate" in summary["itl_per_token_note"]


def test_one_token_per_chunk_is_said_next_to_the_per_token_figures(double, tmp_path):
    summary = _run(_settings(double.url("notok"), concurrency=[1]), _outputs(tmp_path))
    assert summary["token_count_method"] == "one_per_chunk" and summary["itl_per_token_basis"] == "per_chunk"
    assert "one token per chunk" in summary["itl_per_token_note"]


def test_bad_tokenizer_path_is_one_config_line(double, tmp_path):
    with pytest.raises(ConfigError, match=r"^config field 'live.tokenizer': .*nowhere.* does not exist"):
        _run(_settings(double.url("ok"), tokenizer=str(tmp_path / "nowhere")), _outputs(tmp_path))


def test_server_side_metrics_beside_the_client(double, tmp_path):
    """/metrics scraped before and after a level (the double exposes vLLM's ITL histogram): the server's own
    per-token time sits beside the client's, and their difference is the streaming path."""
    double.reset()
    out = _outputs(tmp_path)
    summary = _run(_settings(double.url("spec"), concurrency=[1], num_requests=3, max_tokens=64), out)
    lv = summary["levels"][0]
    side = lv["server_side"]["metrics"]
    assert side["status"] == "measured", side
    vs = side["vs_client"]
    assert "inter_token_latency" in vs["server_metric"]
    # the histogram's exact mean (sum/count) of the double's own token intervals against the client's median
    assert vs["server_ms"] == pytest.approx(lv["mean_itl_per_token_ms"], abs=0.5)
    assert vs["streaming_path_ms"] == pytest.approx(vs["client_ms"] - vs["server_ms"])
    assert lv["server_side"]["profile"]["status"] == "unavailable"  # not asked for
    # a server without /metrics: unavailable with the reason, never a number
    summary = _run(_settings(double.url("ok"), concurrency=[1], num_requests=1), _outputs(tmp_path / "b"))
    other = summary["levels"][0]["server_side"]["metrics"]
    assert other["status"] == "unavailable" and other["why"]


def test_server_profile_window_runs_after_the_timed_levels(double, tmp_path):
    """A profiled server decodes slower (CUPTI, CPU-op recording): the vLLM profile window gets untimed requests
    of its own after the sweep, never the timed ones (the double speaks vLLM's /start_profile, /stop_profile)."""
    double.reset()
    out = _outputs(tmp_path)
    settings = _settings(double.url("spec"), concurrency=[1, 2], num_requests=2, max_tokens=8, engine="vllm",
                         server_profile={"enabled": True, "output_dir": "", "num_steps": 10})
    summary = _run(settings, out)
    paths = [e["path"] for e in double.log()]
    start, stop = paths.index("/start_profile"), paths.index("/stop_profile")
    completions = [i for i, p in enumerate(paths) if p.endswith("completions")]
    timed = completions[: 1 + settings.warmup_requests + 4]  # probe, warm-up, 2 levels x 2 requests
    assert max(timed) < start < stop
    profiled = [i for i in completions if start < i < stop]
    assert len(profiled) == 3  # ceil(10 steps / 7 decode steps per request) + 1, one at a time
    profile = summary["levels"][0]["server_side"]["profile"]
    assert profile["status"] == "recorded" and "after the timed levels" in profile["window"]
    assert summary["levels"][0]["completed"] == 2 and summary["levels"][1]["completed"] == 2
