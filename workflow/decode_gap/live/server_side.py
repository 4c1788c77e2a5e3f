"""The live stage's server-side window around one concurrency level: /metrics deltas and, on request, a server
profile (vLLM/SGLang). One object so that runner.py needs three lines:

    window = ServerSideWindow(endpoint, engine, headers, profile=cfg.get("server_profile"))
    window.start()                      # before the level's requests (after warm-up)
    summary["server_side"] = window.stop(client_itl_ms=...)   # after them

It never raises: a server without /metrics or without a profiler is `unavailable` with the reason.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..errors import DecodeGapError
from .prometheus import MetricsWindow
from .server_profile import ENGINES, ServerProfiler


class ServerSideWindow:
    def __init__(self, endpoint: str, engine: str, headers: dict[str, str] | None = None, *,
                 profile: dict[str, Any] | None = None, client: httpx.Client | None = None,
                 metrics: bool = True) -> None:
        # metrics=False: a profile window alone (the live stage runs it apart from the timed levels)
        self.metrics = MetricsWindow(endpoint, headers=headers, client=client) if metrics else None
        self.profile_cfg = profile or {}
        self.profiler: ServerProfiler | None = None
        self.profile_result: dict[str, Any] = {"status": "unavailable", "why": "not requested (live.server_profile)"}
        if self.profile_cfg.get("enabled"):
            if engine not in ENGINES:
                self.profile_result = {"status": "unavailable",
                                       "why": f"{engine or 'this server'} has no profiling endpoint (vLLM, SGLang do)"}
            else:
                self.profiler = ServerProfiler(engine, endpoint, output_dir=str(self.profile_cfg.get("output_dir", "")),
                                               num_steps=self.profile_cfg.get("num_steps", 20), headers=headers,
                                               client=client)

    def start(self) -> None:
        if self.metrics is not None:
            self.metrics.start()
        if self.profiler is not None:
            try:
                self.profile_result = {"status": "started", **self.profiler.start()}
            except DecodeGapError as exc:
                self.profile_result = {"status": "unavailable", "why": str(exc)}
                self.profiler = None

    def stop(self, client_itl_ms: float | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.metrics is None else {"metrics": self.metrics.stop(client_itl_ms)}
        if self.profiler is not None:
            try:
                r = self.profiler.stop()
                self.profile_result = {"status": "recorded" if r["ok"] else "unavailable", **r}
                if not r["ok"]:
                    self.profile_result["why"] = f"{r['url']}: HTTP {r['http_status']}"
            except DecodeGapError as exc:
                self.profile_result = {"status": "unavailable", "why": str(exc)}
        out["profile"] = self.profile_result
        return out
