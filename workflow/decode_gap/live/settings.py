"""The live stage's settings (from the run config), its files (outputs and logs), table columns, secret scrubbing."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pandas as pd

from ..errors import ConfigError
from ..secrets import REDACTED


REQUEST_COLUMNS = {
    "request_id": "int64",
    "concurrency": "int64",
    "ok": "bool",
    "error": "string",
    "detail": "string",
    "http_status": "Int64",
    "t_start_ms": "float64",
    "ttft_ms": "float64",
    "tpot_ms": "float64",
    "e2el_ms": "float64",
    "mean_itl_ms": "float64",
    "mean_itl_per_token_ms": "float64",
    "output_tokens": "Int64",
    "output_tokens_source": "string",
    "content_chunks": "Int64",
    "input_tokens": "Int64",
    "finish_reason": "string",
    "token_count_method": "string",
    "server_eval_ms_per_token": "float64",
    "server_eval_runs": "Int64",
}
CHUNK_COLUMNS = {
    "request_id": "int64",
    "concurrency": "int64",
    "chunk_index": "int64",
    "t_ns": "int64",
    "tokens": "int64",
    "itl_ms": "float64",
    "itl_per_token_ms": "float64",
    "client_overhead_us": "float64",
}

OPTIONAL_FIELDS = ("continuous_usage_stats", "ignore_eos", "stream_options")


@dataclass
class LiveSettings:
    endpoint: str = ""
    api_key_env: str = ""
    api: str = "completions"
    model: str = ""
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4])
    num_requests: int = 8
    warmup_requests: int = 2
    max_tokens: int = 64
    input_len: int = 32
    prompt: str = ""
    ignore_eos: bool = True
    timeout_s: float = 120.0
    require_done: bool = True
    engine: str = "auto"
    threads: int = 0
    ready_timeout_s: float = 180.0
    gguf_path: str = ""
    enabled: bool = True
    tokenizer: str = ""  # live.tokenizer: a local tokenizer.json or its directory
    server_metrics: bool = True  # live.server_metrics: /metrics deltas around each level
    server_profile: dict[str, Any] = field(default_factory=dict)  # live.server_profile (vLLM, SGLang)

    @classmethod
    def from_params(cls, run: dict[str, Any]) -> "LiveSettings":
        live = dict(run.get("live") or {})
        emb = dict(live.get("embedded") or {})
        d = cls()
        return cls(
            endpoint=str(run.get("endpoint") or "").strip(),
            api_key_env=str(run.get("api_key_env") or "").strip(),
            api=live.get("api", d.api),
            model=live.get("model", d.model) or "",
            concurrency=[int(c) for c in live.get("concurrency", d.concurrency)],
            num_requests=int(live.get("num_requests", d.num_requests)),
            warmup_requests=int(live.get("warmup_requests", d.warmup_requests)),
            max_tokens=int(live.get("max_tokens", d.max_tokens)),
            input_len=int(live.get("input_len", d.input_len)),
            prompt=live.get("prompt", d.prompt) or "",
            ignore_eos=bool(live.get("ignore_eos", d.ignore_eos)),
            timeout_s=float(live.get("timeout_s", d.timeout_s)),
            require_done=bool(live.get("require_done", d.require_done)),
            engine=live.get("engine", d.engine) or "auto",
            threads=int(emb.get("threads", d.threads)),
            ready_timeout_s=float(emb.get("ready_timeout_s", d.ready_timeout_s)),
            gguf_path=str(run.get("gguf_path") or ""),
            enabled=bool(run.get("enabled", True)),
            tokenizer=str(live.get("tokenizer") or "").strip(),
            server_metrics=bool(live.get("server_metrics", d.server_metrics)),
            server_profile=dict(live.get("server_profile") or {}),
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


@dataclass
class LiveOutputs:
    """The stage's files: three outputs, and two logs the rule declares (they survive a failed job).

    `last_error` and `server_log` default to the summary's folder for callers outside Snakemake.
    """

    summary: Path
    requests: Path
    chunks: Path
    last_error: Path | None = None
    server_log: Path | None = None

    def __post_init__(self) -> None:
        self.summary, self.requests, self.chunks = Path(self.summary), Path(self.requests), Path(self.chunks)
        self.last_error = Path(self.last_error) if self.last_error else self.dir / "last_error.json"
        self.server_log = Path(self.server_log) if self.server_log else self.dir / "embedded_server.log"

    @property
    def dir(self) -> Path:
        return self.summary.parent


class Redactor:
    """Replaces every secret value in strings, nested JSON and table columns with the core marker, REDACTED."""

    def __init__(self, secrets: list[str]):
        self.secrets = [s for s in secrets if s]

    def text(self, value: str) -> str:
        for s in self.secrets:
            value = value.replace(s, REDACTED)
        return value

    def obj(self, value: Any) -> Any:
        if not self.secrets:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k)): self.obj(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.obj(v) for v in value]
        return value

    def frame(self, df: pd.DataFrame) -> pd.DataFrame:
        if not self.secrets:
            return df
        for col in df.columns:
            if df[col].dtype == object or str(df[col].dtype) == "string":
                df[col] = df[col].map(lambda v: self.text(v) if isinstance(v, str) else v).astype(df[col].dtype)
        return df


def read_api_key(settings: LiveSettings) -> str:
    if not settings.api_key_env or not settings.endpoint:
        return ""
    value = os.environ.get(settings.api_key_env, "")
    if not value:
        raise ConfigError(
            f"config field 'api_key_env': environment variable {settings.api_key_env} is not set or empty"
        )
    return value


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def empty_requests() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in REQUEST_COLUMNS.items()})


def empty_chunks() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in CHUNK_COLUMNS.items()})
