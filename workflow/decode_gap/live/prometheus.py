"""Server-side timing from the server's own Prometheus `/metrics`: scrape before and after a sweep, take deltas.

Metric names and label sets, from each engine's source:
- vLLM (v1 `vllm/v1/metrics/loggers.py`): histograms `vllm:inter_token_latency_seconds` (per token; successor of
  the deprecated `vllm:time_per_output_token_seconds`), `vllm:request_time_per_output_token_seconds` (per
  request), `vllm:request_decode_time_seconds`, `vllm:time_to_first_token_seconds`,
  `vllm:e2e_request_latency_seconds`, `vllm:request_queue_time_seconds`; counter `vllm:generation_tokens_total`;
  labels `model_name`, `engine`.
- SGLang (`sglang/srt/metrics/collector.py`): histograms `sglang:inter_token_latency_seconds`,
  `sglang:time_per_output_token_seconds`, `sglang:time_to_first_token_seconds`, `sglang:e2e_request_latency_seconds`;
  counter `sglang:generation_tokens_total`; labels `model_name` (+ `tp_rank`, ... by version).
- TGI (router, `metrics` crate): histograms `tgi_request_mean_time_per_token_duration` (per request mean),
  `tgi_request_duration`, `tgi_request_queue_duration`, `tgi_request_inference_duration`,
  `tgi_batch_forward_duration{method="decode"}`; histogram `tgi_request_generated_tokens`.
- llama.cpp `llama-server --metrics`: counters `llamacpp:tokens_predicted_total` and
  `llamacpp:tokens_predicted_seconds_total` (their delta ratio is the server's decode time per token),
  `llamacpp:n_decode_total`.

Parsing uses prometheus_client's text parser. A histogram delta gives an exact mean (sum/count) and bucket-
interpolated percentiles (labelled so). A server without /metrics is `unavailable` with the reason, never a fail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..errors import DecodeGapError, describe
from ..provenance import measured, unavailable

# figure -> engine -> candidate metric families, first present wins
HISTOGRAMS: dict[str, dict[str, list[str]]] = {
    "itl": {"vllm": ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"],
            "sglang": ["sglang:inter_token_latency_seconds"]},
    "tpot": {"vllm": ["vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds"],
             "sglang": ["sglang:time_per_output_token_seconds", "sglang:inter_token_latency_seconds"],
             "tgi": ["tgi_request_mean_time_per_token_duration"]},
    "decode_time": {"vllm": ["vllm:request_decode_time_seconds"], "tgi": ["tgi_request_inference_duration"]},
    "decode_step": {"tgi": ["tgi_batch_forward_duration|method=decode"]},
    "ttft": {"vllm": ["vllm:time_to_first_token_seconds"], "sglang": ["sglang:time_to_first_token_seconds"]},
    "e2e": {"vllm": ["vllm:e2e_request_latency_seconds"], "sglang": ["sglang:e2e_request_latency_seconds"],
            "tgi": ["tgi_request_duration"]},
    "queue": {"vllm": ["vllm:request_queue_time_seconds"], "sglang": ["sglang:queue_time_seconds"],
              "tgi": ["tgi_request_queue_duration"]},
}
LLAMACPP_TOKENS = "llamacpp:tokens_predicted_total"
LLAMACPP_SECONDS = "llamacpp:tokens_predicted_seconds_total"
PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "tgi_": "tgi", "llamacpp:": "llama.cpp"}


@dataclass
class Snapshot:
    """Every sample of one scrape: name -> list of (labels, value); family types by family name."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    def value(self, name: str, where: dict[str, str] | None = None) -> float | None:
        rows = [v for lab, v in self.samples.get(name, []) if _match(lab, where)]
        return float(sum(rows)) if rows else None


def _match(labels: dict[str, str], where: dict[str, str] | None) -> bool:
    return all(labels.get(k) == v for k, v in (where or {}).items())


def parse(text: str, source: str = "/metrics") -> Snapshot:
    """Parse Prometheus text exposition (also OpenMetrics-ish text) with prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    snap = Snapshot()
    try:
        for fam in text_string_to_metric_families(text):
            snap.types[fam.name] = fam.type
            for s in fam.samples:
                snap.samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise DecodeGapError(f"{source}: not Prometheus text ({describe(exc, 120, with_type=False)})") from None
    return snap


def engine_of(snap: Snapshot) -> str | None:
    counts: dict[str, int] = {}
    for name in snap.samples:
        for pre, eng in PREFIXES.items():
            if name.startswith(pre):
                counts[eng] = counts.get(eng, 0) + 1
    return max(counts, key=counts.get) if counts else None


def _split(spec: str) -> tuple[str, dict[str, str]]:
    name, _, sel = spec.partition("|")
    where = dict(kv.split("=", 1) for kv in sel.split(",") if "=" in kv)
    return name, where


def _buckets(snap: Snapshot, name: str, where: dict[str, str]) -> dict[float, float]:
    out: dict[float, float] = {}
    for lab, v in snap.samples.get(f"{name}_bucket", []):
        if not _match(lab, where) or "le" not in lab:
            continue
        le = float("inf") if lab["le"] in ("+Inf", "Inf", "inf") else float(lab["le"])
        out[le] = out.get(le, 0.0) + v  # summed over the other labels (model, engine, rank)
    return out


def _quantile(bounds: list[float], cum: list[float], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear inside the bucket that holds the q-th observation."""
    total = cum[-1] if cum else 0.0
    if total <= 0:
        return None
    rank = q * total
    prev_b, prev_c = 0.0, 0.0
    for b, c in zip(bounds, cum):
        if c >= rank:
            if math.isinf(b):
                return prev_b  # above the highest finite bucket: its bound is all that is known
            return prev_b + (b - prev_b) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 1.0)
        prev_b, prev_c = b, c
    return None


def histogram_delta(before: Snapshot, after: Snapshot, spec: str) -> dict[str, Any] | None:
    """count, sum, mean and p50/p90/p99 (seconds) of what was observed between the two scrapes; None if absent."""
    name, where = _split(spec)
    c1, s1 = after.value(f"{name}_count", where), after.value(f"{name}_sum", where)
    if c1 is None or s1 is None:
        return None
    c0 = before.value(f"{name}_count", where) or 0.0
    s0 = before.value(f"{name}_sum", where) or 0.0
    count, total = c1 - c0, s1 - s0
    out: dict[str, Any] = {"metric": spec, "count": count, "sum_s": total,
                           "mean_s": total / count if count > 0 else None}
    b1, b0 = _buckets(after, name, where), _buckets(before, name, where)
    if b1:
        bounds = sorted(b1)
        cum = [b1[b] - b0.get(b, 0.0) for b in bounds]
        for q in (0.5, 0.9, 0.99):
            out[f"p{int(q * 100)}_s"] = _quantile(bounds, cum, q)
    if count < 0:  # the server restarted between the scrapes
        return {"metric": spec, "count": None, "why": "counter went backwards (server restarted mid-sweep)"}
    return out


def counter_delta(before: Snapshot, after: Snapshot, name: str) -> float | None:
    a = after.value(name)
    if a is None:
        return None
    return a - (before.value(name) or 0.0)


def local_client(endpoint: str, timeout_s: float) -> httpx.Client:
    """A client that, like the live stage's, ignores proxy variables for a loopback server."""
    host = httpx.URL(endpoint).host
    return httpx.Client(timeout=timeout_s, trust_env=host not in ("127.0.0.1", "localhost", "::1"))


def scrape(endpoint: str, *, client: httpx.Client | None = None, headers: dict[str, str] | None = None,
           timeout_s: float = 10.0) -> Snapshot:
    """GET <server root>/metrics; a missing or non-Prometheus endpoint is one DecodeGapError line."""
    root = endpoint.rstrip("/")
    root = root[:-3] if root.endswith("/v1") else root
    url = f"{root}/metrics"
    own = client is None
    client = client or local_client(endpoint, timeout_s)
    try:
        r = client.get(url, headers=headers or {})
    except httpx.HTTPError as exc:
        raise DecodeGapError(f"{url}: {describe(exc, 120)}"
                             ) from None
    finally:
        if own:
            client.close()
    if r.status_code != 200:
        raise DecodeGapError(f"{url}: HTTP {r.status_code} (no Prometheus metrics; llama.cpp needs --metrics)")
    return parse(r.text, url)


def server_timing(before: Snapshot, after: Snapshot, engine: str | None = None) -> dict[str, Any]:
    """Per figure (itl, tpot, decode_time, ttft, e2e, queue) the delta, in ms, labelled; llama.cpp from counters."""
    engine = engine or engine_of(after)
    out: dict[str, Any] = {"engine": engine, "figures": {}}
    src = f"server /metrics delta ({engine})"
    if engine == "llama.cpp":
        dt, dn = counter_delta(before, after, LLAMACPP_SECONDS), counter_delta(before, after, LLAMACPP_TOKENS)
        if dt is not None and dn:
            out["figures"]["tpot"] = {**measured(1e3 * dt / dn, "ms", f"{src}: {LLAMACPP_SECONDS} / {LLAMACPP_TOKENS}"),
                                      "count": dn}
        else:
            out["figures"]["tpot"] = unavailable(f"{LLAMACPP_TOKENS} did not move between the scrapes", "ms", src)
        return out
    for fig, by_engine in HISTOGRAMS.items():
        for spec in by_engine.get(engine or "", []):
            d = histogram_delta(before, after, spec)
            if d is None:
                continue
            if not d.get("count"):
                out["figures"][fig] = unavailable(d.get("why") or f"{spec}: no observation between the scrapes",
                                                  "ms", src)
                break
            row = measured(1e3 * d["mean_s"], "ms", f"{src}: {spec} sum/count")
            row["count"] = d["count"]
            for q in ("p50", "p90", "p99"):
                v = d.get(f"{q}_s")
                row[f"{q}_ms"] = None if v is None else 1e3 * v  # bucket-interpolated (histogram_quantile)
            out["figures"][fig] = row
            break
    if not out["figures"]:
        out["why"] = f"no known decode-timing metric of {engine or 'an unknown engine'} in /metrics"
    return out


def compare_with_client(timing: dict[str, Any], client_itl_ms: float | None) -> dict[str, Any]:
    """Server TPOT/ITL beside the client's ITL; the difference is the streaming path (HTTP, SSE, detokenize)."""
    figs = timing.get("figures", {})
    server = next((figs[k] for k in ("itl", "tpot") if figs.get(k, {}).get("value") is not None), None)
    if server is None or client_itl_ms is None:
        why = "no server-side per-token figure" if server is None else "no client ITL"
        return {"server_ms": None, "client_ms": client_itl_ms, "streaming_path_ms": None, "why": why}
    return {"server_ms": server["value"], "server_metric": server["source"], "client_ms": client_itl_ms,
            "streaming_path_ms": client_itl_ms - server["value"]}


class MetricsWindow:
    """Scrape before a sweep (`start`) and after it (`stop` -> server_timing, or unavailable with the reason)."""

    def __init__(self, endpoint: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0,
                 client: httpx.Client | None = None) -> None:
        self.endpoint, self.headers, self.timeout_s, self.client = endpoint, headers, timeout_s, client
        self.before: Snapshot | None = None
        self.why = ""

    def _scrape(self) -> Snapshot:
        return scrape(self.endpoint, client=self.client, headers=self.headers, timeout_s=self.timeout_s)

    def start(self) -> None:
        try:
            self.before = self._scrape()
        except DecodeGapError as exc:
            self.why = str(exc)

    def stop(self, client_itl_ms: float | None = None) -> dict[str, Any]:
        if self.before is None:
            return {"status": "unavailable", "why": self.why or "no scrape before the sweep"}
        try:
            after = self._scrape()
        except DecodeGapError as exc:
            return {"status": "unavailable", "why": str(exc)}
        timing = server_timing(self.before, after)
        timing["status"] = "measured" if timing["figures"] else "unavailable"
        timing["vs_client"] = compare_with_client(timing, client_itl_ms)
        return timing
