"""Server-side timing from /metrics and the server-profile window, against test doubles of each engine."""

from __future__ import annotations

import httpx
import pytest

from decode_gap.errors import DecodeGapError
from decode_gap.live import prometheus as prom
from decode_gap.live.server_profile import ServerProfiler
from engine_endpoints_double import EngineDouble

ENDPOINT = "http://127.0.0.1:30000/v1"
ITL = [0.012, 0.011, 0.013, 0.012, 0.014, 0.012, 0.011]


@pytest.mark.parametrize("engine,fig", [("vllm", "itl"), ("sglang", "itl"), ("tgi", "tpot"), ("llama.cpp", "tpot")])
def test_metrics_window_takes_the_sweep_delta(engine, fig):
    d = EngineDouble(engine)
    d.observe([0.5] * 4)  # before the sweep: must not count
    w = prom.MetricsWindow(ENDPOINT, client=d.client())
    w.start()
    for _ in range(3):
        d.observe(ITL)
    res = w.stop(client_itl_ms=14.0)
    assert res["status"] == "measured" and res["engine"] == engine
    f = res["figures"][fig]
    assert f["status"] == "measured"
    assert f["value"] == pytest.approx(1e3 * sum(ITL) / len(ITL), rel=1e-6)
    assert res["vs_client"]["streaming_path_ms"] == pytest.approx(14.0 - f["value"], rel=1e-6)
    if engine in ("vllm", "sglang"):
        assert f["count"] == 3 * len(ITL)
        hi = 15.0 if engine == "sglang" else 25.0  # interpolated inside the bucket holding the median
        assert 10.0 <= f["p50_ms"] <= hi


def test_vllm_prefers_the_per_token_itl_over_the_deprecated_tpot():
    d = EngineDouble("vllm")
    w = prom.MetricsWindow(ENDPOINT, client=d.client())
    w.start()
    d.observe(ITL)
    res = w.stop()
    assert res["figures"]["itl"]["source"].endswith("vllm:inter_token_latency_seconds sum/count")
    assert "tpot" in res["figures"] and "ttft" in res["figures"]


def test_no_metrics_endpoint_is_unavailable_with_the_url():
    d = EngineDouble("vllm", metrics=False)
    w = prom.MetricsWindow(ENDPOINT, client=d.client())
    w.start()
    res = w.stop()
    assert res["status"] == "unavailable"
    assert "http://127.0.0.1:30000/metrics: HTTP 404" in res["why"]


def test_no_observation_in_the_window():
    d = EngineDouble("sglang")
    w = prom.MetricsWindow(ENDPOINT, client=d.client())
    w.start()
    res = w.stop()
    assert res["figures"]["itl"]["status"] == "unavailable"


def test_garbage_metrics_text_is_one_line():
    with pytest.raises(DecodeGapError, match="not Prometheus text"):
        prom.parse("this is {not prometheus", "http://x/metrics")


def test_quantile_like_prometheus():
    # 10 observations: 5 in (0, 1], 5 in (1, 2]: median at the first bucket's top
    assert prom._quantile([1.0, 2.0, float("inf")], [5, 10, 10], 0.5) == pytest.approx(1.0)
    assert prom._quantile([1.0, 2.0, float("inf")], [5, 10, 10], 0.75) == pytest.approx(1.5)


def test_vllm_profile_window_protocol(tmp_path):
    d = EngineDouble("vllm")
    p = ServerProfiler("vllm", ENDPOINT, output_dir=str(tmp_path), client=d.client())
    p.start()
    (tmp_path / "w-rank-0.123.pt.trace.json.gz").write_bytes(b"x")
    out = p.stop()
    assert [(m, path, b) for m, path, b in d.requests] == [("POST", "/start_profile", None),
                                                           ("POST", "/stop_profile", None)]
    assert out["ok"] and out["where"]["local"] and out["where"]["files"]


def test_vllm_without_profiler_says_how_to_start_it():
    d = EngineDouble("vllm", profiler_on=False)
    with pytest.raises(DecodeGapError, match="VLLM_TORCH_PROFILER_DIR"):
        ServerProfiler("vllm", ENDPOINT, client=d.client()).start()


def test_a_profile_error_that_echoes_the_key_is_one_line_without_it():
    def handler(request):
        return httpx.Response(401, text="invalid api_key=sk-live-abcdefghijkl\nTraceback ...")

    client = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://127.0.0.1:30000")
    with pytest.raises(DecodeGapError) as exc:
        ServerProfiler("sglang", ENDPOINT, client=client).start()
    line = str(exc.value)
    assert "HTTP 401" in line and "\n" not in line and "sk-live-abcdefghijkl" not in line and "[redacted]" in line


def test_sglang_profile_window_protocol():
    d = EngineDouble("sglang")
    p = ServerProfiler("sglang", "http://10.0.0.7:30000/v1", output_dir="/data/traces", num_steps=10,
                       client=d.client())
    assert p.start()["message"] == "Start profiling."
    out = p.stop()
    method, path, body = d.requests[0]
    assert (method, path) == ("POST", "/start_profile")
    assert body == {"activities": ["CPU", "GPU"], "record_shapes": True, "with_stack": True,
                    "output_dir": "/data/traces", "num_steps": 10, "profile_by_stage": True}
    # a remote server: the files stay there and the note says how to bring them to the trace stage
    assert not out["where"]["local"] and "trace:" in out["where"]["note"]
    assert out["where"]["pattern"] == "*-TP-*-DECODE.trace.json.gz"


def test_other_engines_have_no_profile_endpoint():
    with pytest.raises(DecodeGapError, match="no profiling endpoint"):
        ServerProfiler("tgi", ENDPOINT)


def test_server_side_window_metrics_and_sglang_profile():
    from decode_gap.live.server_side import ServerSideWindow

    d = EngineDouble("sglang")
    w = ServerSideWindow(ENDPOINT, "sglang", profile={"enabled": True, "output_dir": "/srv/t", "num_steps": 8},
                         client=d.client())
    w.start()
    d.observe(ITL)
    out = w.stop(client_itl_ms=13.0)
    assert out["metrics"]["status"] == "measured"
    assert out["profile"]["status"] == "recorded" and out["profile"]["where"]["dir"] == "/srv/t"
    assert [p for _, p, _ in d.requests] == ["/metrics", "/start_profile", "/metrics", "/stop_profile"]


def test_server_side_window_never_raises():
    from decode_gap.live.server_side import ServerSideWindow

    d = EngineDouble("vllm", profiler_on=False, metrics=False)
    w = ServerSideWindow(ENDPOINT, "vllm", profile={"enabled": True}, client=d.client())
    w.start()
    out = w.stop()
    assert out["metrics"]["status"] == "unavailable"
    assert out["profile"]["status"] == "unavailable" and "VLLM_TORCH_PROFILER_DIR" in out["profile"]["why"]
    w2 = ServerSideWindow(ENDPOINT, "tgi", profile={"enabled": True}, client=EngineDouble("tgi").client())
    w2.start()
    assert "no profiling endpoint" in w2.stop()["profile"]["why"]


def test_scrape_over_real_http_from_prometheus_client_exporter():
    """A real exporter (prometheus_client's own HTTP server, as vLLM and SGLang use) with vLLM's metric names."""
    import socket

    from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

    from engine_endpoints_double import VLLM_ITL_BUCKETS

    reg = CollectorRegistry()
    itl = Histogram("vllm:inter_token_latency_seconds", "ITL", ["model_name", "engine"], buckets=VLLM_ITL_BUCKETS,
                    registry=reg)
    gen = Counter("vllm:generation_tokens", "tokens", ["model_name", "engine"], registry=reg)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        itl.labels("m", "0").observe(0.5)  # before the window
        w = prom.MetricsWindow(f"http://127.0.0.1:{port}/v1")
        w.start()
        for v in ITL:
            itl.labels("m", "0").observe(v)
        gen.labels("m", "0").inc(len(ITL))
        res = w.stop(client_itl_ms=15.0)
    finally:
        server.shutdown()
        thread.join(timeout=5)
    assert res["engine"] == "vllm"
    assert res["figures"]["itl"]["value"] == pytest.approx(1e3 * sum(ITL) / len(ITL), rel=1e-6)
    assert res["figures"]["itl"]["count"] == len(ITL)
