"""Run settings: typed sections of the validated config, parsed once, with the schema's defaults only.

The live section is read by the live stage (the sweep) and by the simulation (the engine level decodes the same
prompt length and token count), so it is parsed here, in the core, and not twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import schema_defaults, with_defaults

_LIVE = schema_defaults("live")


@dataclass
class LiveSettings:
    """The `live` section (plus the endpoint keys), parsed once for every stage that reads it. Every default is
    the schema's (`workflow/schemas/config.schema.json`)."""

    endpoint: str = ""
    api_key_env: str = ""
    api: str = _LIVE["api"]
    model: str = _LIVE["model"]
    concurrency: list[int] = field(default_factory=lambda: list(_LIVE["concurrency"]))
    num_requests: int = _LIVE["num_requests"]
    warmup_requests: int = _LIVE["warmup_requests"]
    max_tokens: int = _LIVE["max_tokens"]
    input_len: int = _LIVE["input_len"]
    prompt: str = _LIVE["prompt"]
    ignore_eos: bool = _LIVE["ignore_eos"]
    timeout_s: float = float(_LIVE["timeout_s"])
    require_done: bool = _LIVE["require_done"]
    engine: str = _LIVE["engine"]
    threads: int = _LIVE["embedded"]["threads"]
    ready_timeout_s: float = float(_LIVE["embedded"]["ready_timeout_s"])
    gguf_path: str = ""
    enabled: bool = True
    tokenizer: str = _LIVE["tokenizer"]  # live.tokenizer: a local tokenizer.json or its directory
    server_metrics: bool = _LIVE["server_metrics"]  # live.server_metrics: /metrics deltas around each level
    server_profile: dict[str, Any] = field(default_factory=lambda: dict(_LIVE["server_profile"]))  # vLLM, SGLang

    @classmethod
    def from_params(cls, run: dict[str, Any]) -> "LiveSettings":
        live = with_defaults("live", run.get("live"))
        emb = live["embedded"]
        return cls(
            endpoint=str(run.get("endpoint") or "").strip(),
            api_key_env=str(run.get("api_key_env") or "").strip(),
            api=live["api"],
            model=live["model"] or "",
            concurrency=[int(c) for c in live["concurrency"]],
            num_requests=int(live["num_requests"]),
            warmup_requests=int(live["warmup_requests"]),
            max_tokens=int(live["max_tokens"]),
            input_len=int(live["input_len"]),
            prompt=live["prompt"] or "",
            ignore_eos=bool(live["ignore_eos"]),
            timeout_s=float(live["timeout_s"]),
            require_done=bool(live["require_done"]),
            engine=live["engine"] or "auto",
            threads=int(emb["threads"] or 0),
            ready_timeout_s=float(emb["ready_timeout_s"]),
            gguf_path=str(run.get("gguf_path") or ""),
            enabled=bool(run.get("enabled", True)),
            tokenizer=str(live["tokenizer"] or "").strip(),
            server_metrics=bool(live["server_metrics"]),
            server_profile=dict(live["server_profile"] or {}),
        )

    def public(self) -> dict[str, Any]:
        return {
            "api": self.api, "model": self.model, "concurrency": self.concurrency,
            "num_requests": self.num_requests, "warmup_requests": self.warmup_requests,
            "max_tokens": self.max_tokens, "input_len": self.input_len,
            "prompt": "fixed" if self.prompt else "random", "ignore_eos": self.ignore_eos,
            "timeout_s": self.timeout_s, "require_done": self.require_done, "temperature": 0.0, "api_key_env": self.api_key_env or None,
            "tokenizer": self.tokenizer or None, "server_metrics": self.server_metrics,
            "server_profile": bool(self.server_profile.get("enabled")),
        }
