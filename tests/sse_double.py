"""TEST DOUBLE: a scripted OpenAI-compatible SSE server on 127.0.0.1 (real HTTP, real sockets).

It stands in for an inference server so that the live client's timing arithmetic can be checked against
chunks emitted at known times, and so that each misbehaviour in issue 3 item 6 can be produced on demand.
It is not an inference engine: it emits fixed text on a fixed schedule.

The scenario is the first path segment of the base URL: `http://127.0.0.1:<port>/<scenario>/v1`. Each
streamed request is logged with the server-side `time.perf_counter_ns()` taken just before every event
write (CLOCK_MONOTONIC, shared with the client process), readable at `GET /_log`; `POST /_reset` clears it.

Scenarios (times in ms after the request body is read):
- `ok`: completions; chunks "Hello"@100 (1 token), " world"@150 (1), " foo bar"@250 (2 tokens in one chunk),
  "!"@300 (1); cumulative `usage` on every chunk (continuous usage stats), then a usage-only chunk, `[DONE]`.
- `chat`: chat; a role-only first chunk @20, the same content chunks without per-chunk usage, a final
  usage-only chunk, `[DONE]`; `/tokenize` counts regex tokens (`\\w+|[^\\w\\s]`), matching the script.
- `notok`: completions, no usage at all and no tokenize endpoint (one token per chunk fallback).
- `strict`: like `chat` but answers 422 when `stream_options.continuous_usage_stats` is sent.
- `auth`: like `ok` but requires `Authorization: Bearer $SSE_DOUBLE_KEY`; a wrong key gets a 401 whose body
  echoes the header, and every answer carries an `x-echo` header and a model id containing the key (to prove
  the client scrubs a secret that a server echoes).
- `spec`: multi-token chunks with usage only at the end, no tokenize endpoint (a speculative-decoding or
  stream-interval server with vLLM's default `include_usage`): SPEC_CHUNKS content chunks every
  SPEC_INTERVAL_MS, every SPEC_EVERY-th chunk carrying SPEC_K tokens (words `w<n>`, one token each), then a
  usage-only chunk and `[DONE]`. Its log entry holds `token_times_ns`: the server's own emission time of every
  token (the write of the chunk that carries it), the truth a per-token ITL is checked against.
- `http500` (a vLLM/OpenAI-shaped JSON error body whose message echoes a credential), `json` (200
  application/json), `malformed` (`data: {not json` after one chunk), `drop` (socket closed mid-body after two
  chunks), `nodone` (body ends cleanly without `[DONE]`), `hang` (one chunk, then silence), `error_event`
  (OpenAI/vLLM shape `data: {"error": {"message", "type", "code"}}` after one chunk, then `[DONE]`),
  `error_string` (the `transformers serve` shape: a chat role chunk, `data: {"error": "<text>"}`, then the
  body ends without `[DONE]`), `flaky` (`ok`, but every 3rd streamed request answers 500).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNKS = [(100, "Hello", 1), (150, " world", 1), (250, " foo bar", 2), (300, "!", 1)]
TOKEN_RE = re.compile(r"\w+|[^\w\s]")
SCENARIOS = {"ok", "chat", "notok", "strict", "auth", "http500", "json", "malformed", "drop", "nodone", "hang",
             "error_event", "error_string", "flaky", "spec"}
SPEC_CHUNKS, SPEC_INTERVAL_MS, SPEC_EVERY, SPEC_K, SPEC_FIRST_MS = 30, 20.0, 5, 3, 60.0
ERROR_STRING = ("cannot reshape tensor of 0 elements into shape [1, 0, -1, 128] because the unspecified "
                "dimension size -1 can be any value and is ambiguous")
ERROR_OBJECT = {"message": "scripted failure: CUDA out of memory", "type": "InternalServerError", "code": 500}
HTTP500_MESSAGE = "scripted internal error while handling request (api_key=dbl-leaked-secret-42)"


def spec_chunks() -> list[tuple[float, str, int]]:
    """(ms after the request, text, tokens) of the `spec` scenario; every token is one word `w<n>`."""
    out, n = [], 0
    for i in range(1, SPEC_CHUNKS + 1):
        k = SPEC_K if i % SPEC_EVERY == 0 else 1
        words = [f"w{(n + j) % 50}" for j in range(k)]
        n += k
        out.append((SPEC_FIRST_MS + (i - 1) * SPEC_INTERVAL_MS, ("" if i == 1 else " ") + " ".join(words), k))
    return out
TOKENIZER_SCENARIOS = {"chat", "strict"}

LOG: list[dict] = []
LOCK = threading.Lock()
# GET /metrics, in vLLM's names (the "spec" scenario only): each streamed token's interval, as the engine would
# observe it, through prometheus_client's own registry and exposition format.
try:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    METRICS = CollectorRegistry()
    VLLM_ITL = Histogram("vllm:inter_token_latency_seconds", "ITL", ["model_name"], registry=METRICS,
                         buckets=[0.005, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.05, 0.1, 0.5, 1.0])
except ImportError:  # pragma: no cover - prometheus_client is a dependency
    METRICS = None
COUNTER = {"stream": 0}


def count_tokens(text: str) -> int:
    return len(TOKEN_RE.findall(text))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    # -- helpers ---------------------------------------------------------------------------------
    def _key(self) -> str:
        return os.environ.get("SSE_DOUBLE_KEY", "")

    def _json(self, code: int, obj, extra: dict | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def _chunk(self, data: bytes) -> int:
        """Write one HTTP chunk; returns the time taken just before the write (a chunk cannot arrive earlier)."""
        t = time.perf_counter_ns()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
        return t

    def _event(self, obj) -> int:
        payload = obj if isinstance(obj, str) else json.dumps(obj)
        return self._chunk(f"data: {payload}\n\n".encode())

    def _split(self):
        parts = self.path.split("?")[0].strip("/").split("/")
        scenario = parts[0] if parts and parts[0] in SCENARIOS else ""
        rest = "/" + "/".join(parts[1:] if scenario else parts)
        return scenario, rest

    def _extra_headers(self, scenario: str) -> dict:
        return {"x-echo": f"key={self._key()}"} if scenario == "auth" else {}

    # -- routes ----------------------------------------------------------------------------------
    def do_GET(self):  # noqa: N802
        if self.path == "/_log":
            with LOCK:
                return self._json(200, LOG)
        scenario, rest = self._split()
        if rest == "/v1/models":
            model = f"double-model-{self._key()}" if scenario == "auth" else "double-model"
            return self._json(200, {"object": "list", "data": [{"id": model, "owned_by": "sse-double"}]},
                              self._extra_headers(scenario))
        if rest == "/version":
            return self._json(200, {"version": "0.0-double", "name": "sse-double"})
        if rest == "/metrics" and scenario == "spec" and METRICS is not None:
            body = generate_latest(METRICS)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None
        return self._json(404, {"error": "not found"})

    def do_POST(self):  # noqa: N802
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        t_recv = time.perf_counter_ns()
        if self.path == "/_reset":
            with LOCK:
                LOG.clear()
                COUNTER["stream"] = 0
            return self._json(200, {})
        scenario, rest = self._split()
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._json(400, {"error": "bad json"})
        if rest == "/tokenize":
            if scenario not in TOKENIZER_SCENARIOS:
                return self._json(404, {"error": "not found"})
            text = body.get("prompt", body.get("content", ""))
            n = count_tokens(text)
            return self._json(200, {"count": n, "tokens": list(range(n))})
        if rest in ("/start_profile", "/stop_profile") and scenario == "spec":
            # vLLM's profiler endpoints (POST, no body, 200); logged so a test sees when the window ran
            with LOCK:
                LOG.append({"scenario": scenario, "path": rest, "t_recv_ns": t_recv})
            return self._json(200, {})
        if rest not in ("/v1/completions", "/v1/chat/completions"):
            return self._json(404, {"error": f"no route {rest}"})
        auth = self.headers.get("authorization", "")
        entry = {"scenario": scenario, "path": rest, "t_recv_ns": t_recv, "sends": [], "body": body,
                 "auth_ok": auth == f"Bearer {self._key()}" if self._key() else None}
        with LOCK:
            LOG.append(entry)
            COUNTER["stream"] += 1
            nth = COUNTER["stream"]
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if scenario == "auth" and not entry["auth_ok"]:
            return self._json(401, {"error": f"invalid credentials: {auth}"})
        if scenario == "http500":
            return self._json(500, {"error": {"message": HTTP500_MESSAGE, "type": "InternalServerError",
                                              "code": 500}})
        if scenario == "flaky" and nth % 3 == 0:
            return self._json(500, {"error": "internal server error (scripted)"})
        if scenario == "json":
            return self._json(200, {"choices": [{"text": "not a stream"}]})
        if scenario == "strict" and (body.get("stream_options") or {}).get("continuous_usage_stats"):
            return self._json(422, {"error": "unknown field stream_options.continuous_usage_stats"})
        chat = rest.endswith("/chat/completions")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        for k, v in self._extra_headers(scenario).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.flush()

        def at(ms: float) -> None:
            target = t_recv + int(ms * 1e6)
            while True:
                left = (target - time.perf_counter_ns()) / 1e9
                if left <= 0:
                    return
                time.sleep(left if left > 0.002 else 0.0002)

        def chunk_obj(text: str | None, cum: int | None, role: bool = False, finish: str | None = None) -> dict:
            if chat:
                delta = {"role": "assistant"} if role else {"content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            obj = {"id": "cmpl-double", "object": "chat.completion.chunk" if chat else "text_completion",
                   "model": "double-model", "choices": [choice]}
            if cum is not None:
                obj["usage"] = {"prompt_tokens": 7, "completion_tokens": cum, "total_tokens": 7 + cum}
            return obj

        per_chunk_usage = scenario in ("ok", "auth", "flaky")
        final_usage = scenario in ("ok", "auth", "flaky", "chat", "strict", "spec")
        script = spec_chunks() if scenario == "spec" else CHUNKS
        try:
            if scenario == "error_string":
                if chat:
                    at(20)
                    entry["sends"].append(self._event(chunk_obj(None, None, role=True)))
                self._event({"error": ERROR_STRING})
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
            if chat and scenario in ("chat", "strict"):
                at(20)
                entry["sends"].append(self._event(chunk_obj(None, 0 if per_chunk_usage else None, role=True)))
            cum = 0
            for i, (ms, text, k) in enumerate(script):
                at(ms)
                cum += k
                finish = "length" if i == len(script) - 1 else None
                sent = self._event(chunk_obj(text, cum if per_chunk_usage else None, finish=finish))
                entry["sends"].append(sent)
                times = entry.setdefault("token_times_ns", [])
                if scenario == "spec" and METRICS is not None and times and k:
                    for _ in range(k):  # the chunk's interval spread over its tokens, as per-token ITL
                        VLLM_ITL.labels("double-model").observe((sent - times[-1]) / k / 1e9)
                times.extend([sent] * k)
                if scenario == "malformed" and i == 0:
                    self._chunk(b"data: {not json\n\n")
                    break
                if scenario == "error_event" and i == 0:
                    self._event({"error": ERROR_OBJECT})
                    break
                if scenario == "hang" and i == 0:
                    time.sleep(30)
                    return
                if scenario == "drop" and i == 1:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
            if final_usage:
                usage = {"prompt_tokens": 7, "completion_tokens": cum, "total_tokens": 7 + cum}
                self._event({"id": "cmpl-double", "choices": [], "usage": usage})
            if scenario != "nodone":
                self._event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def serve(port: int = 0) -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


class DoubleProcess:
    """Runs the double in a subprocess (its timing is not disturbed by the test's own GIL)."""

    def __init__(self, key: str = ""):
        env = dict(os.environ, SSE_DOUBLE_KEY=key)
        self.proc = subprocess.Popen([sys.executable, __file__], stdout=subprocess.PIPE, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.port = int(self.proc.stdout.readline().strip())

    def url(self, scenario: str) -> str:
        return f"http://127.0.0.1:{self.port}/{scenario}/v1"

    def log(self) -> list[dict]:
        import httpx  # noqa: PLC0415

        return httpx.get(f"http://127.0.0.1:{self.port}/_log", timeout=5).json()

    def reset(self) -> None:
        import httpx  # noqa: PLC0415

        httpx.post(f"http://127.0.0.1:{self.port}/_reset", timeout=5)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
