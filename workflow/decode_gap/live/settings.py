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
from ..settings import LiveSettings  # noqa: F401  (the core parses the live section; re-exported for the stage)


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
