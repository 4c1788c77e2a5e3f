"""Ask a vLLM or SGLang server to record a torch.profiler trace of a short decode-only window.

Protocols, from the engines' source:
- vLLM (`vllm/entrypoints/openai/api_server.py`): `POST /start_profile` and `POST /stop_profile`, no body, 200 on
  success. The routes exist only when the server was started with its torch profiler on (`VLLM_TORCH_PROFILER_DIR`
  in older releases, `--profiler-config` with a torch profiler dir in newer ones): otherwise 404. Each worker
  writes `<worker_name>.<time_ns>.pt.trace.json.gz` (torch's tensorboard_trace_handler, gzip) into that directory
  on the server's host, when `/stop_profile` returns.
- SGLang (`sglang/srt/entrypoints/http_server.py`, `managers/scheduler_profiler_mixin.py`): `POST /start_profile`
  with a JSON `ProfileReqInput` body (`output_dir`, `num_steps`, `activities` ["CPU", "GPU"], `with_stack`,
  `record_shapes`, `profile_by_stage`); answers "Start profiling." With `num_steps` the scheduler stops by itself
  after that many forward steps; `profile_by_stage` records prefill and decode separately. Each TP rank writes
  `<profile_id>-TP-<rank>[-DECODE|-EXTEND].trace.json.gz` into `output_dir` (default `SGLANG_TORCH_PROFILER_DIR`,
  else /tmp) on the server's host. `POST /stop_profile` stops an open-ended window.

The trace lands on the server's host: when that is not this host, the result says where it is, and the user
passes it to the trace stage with the `trace:` config key.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from ..errors import DecodeGapError, describe
from ..secrets import scrub_credentials
from .prometheus import local_client

ENGINES = ("vllm", "sglang")


def _root(endpoint: str) -> str:
    root = endpoint.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


def _post(client: httpx.Client, url: str, headers: dict[str, str] | None, json: Any = None) -> httpx.Response:
    try:
        return client.post(url, json=json, headers=headers or {})
    except httpx.HTTPError as exc:
        raise DecodeGapError(f"{url}: {describe(exc, 120)}") from None


class ServerProfiler:
    """start() before a decode-only window, stop() after it; `where` says where the trace files are."""

    def __init__(self, engine: str, endpoint: str, *, output_dir: str = "", num_steps: int | None = 20,
                 decode_only: bool = True, headers: dict[str, str] | None = None, timeout_s: float = 300.0,
                 client: httpx.Client | None = None) -> None:
        if engine not in ENGINES:
            raise DecodeGapError(f"server profile: engine {engine!r} has no profiling endpoint decode-gap "
                                 f"knows (vLLM and SGLang have /start_profile)")
        self.engine, self.root = engine, _root(endpoint)
        self.output_dir, self.num_steps, self.decode_only = output_dir, num_steps, decode_only
        self.headers = headers
        self.client = client or local_client(endpoint, timeout_s)
        self.started_at: float | None = None

    def start_body(self) -> dict[str, Any] | None:
        if self.engine == "vllm":
            return None
        body: dict[str, Any] = {"activities": ["CPU", "GPU"], "record_shapes": True, "with_stack": True}
        if self.output_dir:
            body["output_dir"] = self.output_dir
        if self.num_steps:
            body["num_steps"] = int(self.num_steps)
        if self.decode_only and self.num_steps:
            # a separate -DECODE trace of num_steps decode batches: prefill kept out (SGLang counts per stage)
            body["profile_by_stage"] = True
        return body

    def start(self) -> dict[str, Any]:
        url = f"{self.root}/start_profile"
        r = _post(self.client, url, self.headers, self.start_body())
        if r.status_code == 404 and self.engine == "vllm":
            raise DecodeGapError(f"{url}: 404: start vLLM with its torch profiler on (VLLM_TORCH_PROFILER_DIR=<dir>, "
                                 "or --profiler-config with a torch profiler dir)")
        if r.status_code != 200:
            first = (r.text.strip().splitlines() or [""])[0]
            raise DecodeGapError(f"{url}: HTTP {r.status_code}: {scrub_credentials(first)[:160]}")
        self.started_at = time.time()
        return {"url": url, "http_status": r.status_code, "message": scrub_credentials(r.text.strip())[:200]}

    def stop(self) -> dict[str, Any]:
        """Stop the window. SGLang with num_steps has stopped by itself; its /stop_profile then answers anyway."""
        url = f"{self.root}/stop_profile"
        r = _post(self.client, url, self.headers)
        ok = r.status_code == 200
        return {"url": url, "http_status": r.status_code, "message": r.text.strip()[:200], "ok": ok,
                "where": self.where()}

    def where(self) -> dict[str, Any]:
        """Where the trace files land, and whether they are on this host."""
        if self.engine == "vllm":
            pattern, d = "*.pt.trace.json.gz", self.output_dir or "the server's VLLM_TORCH_PROFILER_DIR"
        else:
            suffix = "-DECODE" if self.decode_only and self.num_steps else ""
            pattern = f"*-TP-*{suffix}.trace.json.gz"
            d = self.output_dir or "the server's SGLANG_TORCH_PROFILER_DIR (default /tmp)"
        local = bool(self.output_dir) and Path(self.output_dir).is_dir() and _is_local(self.root)
        files = sorted(str(p) for p in Path(self.output_dir).glob(pattern)
                       if self.started_at is None or p.stat().st_mtime >= self.started_at - 1) if local else []
        note = (f"trace files {pattern} in {d}" + ("" if local else
                " on the server's host: copy them here and set the config key trace: to that directory"))
        return {"dir": d, "pattern": pattern, "local": local, "files": files, "note": note}


def _is_local(root: str) -> bool:
    host = httpx.URL(root).host
    return host in ("127.0.0.1", "localhost", "::1")
