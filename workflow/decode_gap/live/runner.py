"""The `live` stage: warm-up, a concurrency sweep of streamed requests, and the stage outputs.

Flow: identity probe (GET only) -> model name -> tokenizer probe -> one 2-token probe request that settles
which optional request fields the server accepts -> warm-up requests -> for each concurrency level, N
requests with at most `concurrency` in flight (as `vllm bench serve --max-concurrency`) -> parse and count
tokens -> statistics -> loopback calibration of the client's own overhead (after the server is stopped).

Failure policy: every failed request is counted with a one-line reason. The stage fails only when no
measured request succeeded; it then writes `live/last_error.json` (a log of the rule, not an output, so it
survives the failed job) and raises `DecodeGapError` naming the endpoint. A failed run never touches the
previous outputs; every good run is kept in the report archive. The API key is read from the environment variable
named by `api_key_env`, sent only as `Authorization: Bearer`, and scrubbed from everything written.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import ipaddress
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx
import numpy as np
import pandas as pd

from ..errors import ConfigError, DecodeGapError
from ..host import cpu_model
from ..io import write_json, write_table
from ..provenance import measured, skipped_stage, unavailable
from . import tokens as tok
from .client import StreamResult, display_url, stream_request
from .identity import detect_engine, probe_identity, safe_headers, server_root
from .prometheus import compare_with_client
from .server_side import ServerSideWindow
from .loopback import calibrate
from .metrics import describe, level_summary, request_timing
from .parse import parse_stream
from .prompts import build_prompt
from .server import EmbeddedServer, llama_cpp_available, read_eval_log, read_log_errors
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


# -- secrets ---------------------------------------------------------------------------------------
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


# -- the sweep -------------------------------------------------------------------------------------
@dataclass
class _Sent:
    request_id: int
    concurrency: int
    phase: str
    prompt_tokens: int | None
    result: StreamResult
    level_t0_ns: int = 0


def _payload(s: LiveSettings, model: str | None, prompt: str, max_tokens: int, dropped: set[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    if model:
        body["model"] = model
    if s.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if "stream_options" not in dropped:
        opts: dict[str, Any] = {"include_usage": True}
        if "continuous_usage_stats" not in dropped:
            opts["continuous_usage_stats"] = True
        body["stream_options"] = opts
    if s.ignore_eos and "ignore_eos" not in dropped:
        body["ignore_eos"] = True
    return body


def _sent_options(s: LiveSettings, dropped: set[str]) -> list[str]:
    sent = []
    if "stream_options" not in dropped:
        sent.append("stream_options.include_usage")
        if "continuous_usage_stats" not in dropped:
            sent.append("stream_options.continuous_usage_stats")
    if s.ignore_eos and "ignore_eos" not in dropped:
        sent.append("ignore_eos")
    return sent


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self._p = None
        if enabled:
            from rich.console import Console  # noqa: PLC0415
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

            self._p = Progress(TextColumn("live {task.description}"), BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), console=Console(stderr=True))
            self._p.start()
            self._task = self._p.add_task("warm-up", total=total)

    def describe(self, text: str) -> None:
        if self._p:
            self._p.update(self._task, description=text)

    def advance(self) -> None:
        if self._p:
            self._p.advance(self._task)

    def close(self) -> None:
        if self._p:
            self._p.stop()


async def _sweep(s: LiveSettings, endpoint: str, api_key: str, server: EmbeddedServer | None,
                 progress: bool, log: Callable[[str], None], configured: Any = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    path = "/chat/completions" if s.api == "chat" else "/completions"
    url = endpoint.rstrip("/") + path
    limits = httpx.Limits(max_connections=max(s.concurrency) + 4, max_keepalive_connections=max(s.concurrency) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(s.timeout_s), limits=limits,
                                 trust_env=not _is_loopback(endpoint)) as client:
        identity = await probe_identity(client, endpoint, headers)
        if server is not None:
            identity = {**server.identity(), **identity}
        else:
            identity = {"kind": "endpoint", **identity}
        model = s.model or (identity["models"][0] if identity.get("models") else None)

        # live.tokenizer is the user's explicit choice; else the server's own, else the GGUF's vocabulary
        counter: Any = configured or await tok.find_server_tokenizer(client, server_root(endpoint), model, headers)
        gguf = s.gguf_path if (server is not None or s.engine == "llama.cpp") else ""
        if counter is None and gguf and Path(gguf).is_file() and llama_cpp_available():
            try:
                counter = tok.GGUFTokenizer(gguf)
            except Exception as exc:  # a broken optional fallback must not stop the measurement
                log(f"live: GGUF tokenizer unavailable ({type(exc).__name__}: {exc})")
                counter = None

        n_measured = s.num_requests * len(s.concurrency)
        n_prompts = 1 + s.warmup_requests + n_measured
        prompts: list[tuple[str, int | None]] = []
        for i in range(n_prompts):
            if s.prompt:
                prompts.append((s.prompt, None))
            else:
                prompts.append(await build_prompt(s.input_len, seed=1000 + i, counter=counter))
        if s.prompt and counter is not None:
            base = await counter.count("")
            n = await counter.count(s.prompt) - base
            prompts = [(p, n) for p, _ in prompts]

        bar = _Progress(n_prompts, progress)
        sent: list[_Sent] = []
        try:
            # Probe: one short request; drop optional fields the server rejects with 400/422.
            dropped: set[str] = set()
            rejected: list[dict[str, Any]] = []
            probe: StreamResult | None = None
            for name in (None, *OPTIONAL_FIELDS):
                if name:
                    dropped.add(name)
                probe = await stream_request(client, url, _payload(s, model, prompts[0][0], 2, dropped), headers, s.timeout_s, require_done=s.require_done)
                if probe.status in (400, 422):
                    rejected.append({"without": sorted(dropped), "status": probe.status, "detail": probe.detail})
                    continue
                break
            if probe is not None and probe.status in (400, 422):
                dropped = set()  # nothing helped: send the full request and let it fail visibly
            bar.advance()
            sent.append(_Sent(-1, 1, "probe", prompts[0][1], probe))
            # Warm-up, one at a time.
            for i in range(s.warmup_requests):
                bar.describe(f"warm-up {i + 1}/{s.warmup_requests}")
                p, n = prompts[1 + i]
                r = await stream_request(client, url, _payload(s, model, p, s.max_tokens, dropped), headers, s.timeout_s, require_done=s.require_done)
                sent.append(_Sent(-1, 1, "warmup", n, r))
                bar.advance()
            # The sweep.
            rid = 0
            durations: dict[int, float] = {}
            server_side: dict[int, dict[str, Any]] = {}
            k = 1 + s.warmup_requests
            for c in s.concurrency:
                bar.describe(f"concurrency {c}")
                sem = asyncio.Semaphore(c)

                async def one(prompt: str) -> StreamResult:
                    async with sem:
                        r = await stream_request(client, url, _payload(s, model, prompt, s.max_tokens, dropped),
                                                 headers, s.timeout_s, require_done=s.require_done)
                    bar.advance()
                    return r

                batch = prompts[k: k + s.num_requests]
                k += s.num_requests
                # The server's own view of this level: /metrics before and after (and, for the first level, a
                # vLLM/SGLang profile window when live.server_profile asks). Outside the timed span.
                window = None
                if s.server_metrics:
                    engine_now = detect_engine(identity, s.engine, server is not None)[0]
                    window = ServerSideWindow(endpoint, engine_now, headers,
                                              profile=s.server_profile if c == s.concurrency[0] else None)
                    window.start()
                t0 = time.perf_counter_ns()
                results = await asyncio.gather(*(one(p) for p, _ in batch))
                durations[c] = (time.perf_counter_ns() - t0) / 1e9
                if window is not None:
                    server_side[c] = window.stop()
                for (p, n), r in zip(batch, results):
                    sent.append(_Sent(rid, c, "measure", n, r, level_t0_ns=t0))
                    rid += 1
                ok = sum(1 for r in results if r.ok)
                log(f"live: concurrency {c}: {ok}/{len(results)} requests streamed in {durations[c]:.2f} s")
        finally:
            bar.close()

        first_ok = next((x.result for x in sent if x.result is not None and x.result.status == 200), None)
        if first_ok is not None:
            identity["stream_headers"] = safe_headers(first_ok.headers)

        # Parse and count tokens (the server is still up: its tokenizer may be needed).
        parsed = []
        for item in sent:
            ps = parse_stream(item.result, s.api)
            chunk_tokens, method, detail = ([], None, None)
            if ps.ok and item.phase == "measure":
                chunk_tokens, method, detail = await tok.count_chunk_tokens(ps, counter)
            parsed.append((item, ps, chunk_tokens, method, detail))

    return {
        "identity": identity, "model": model, "url": url, "parsed": parsed, "durations": durations,
        "request_options": {"sent": _sent_options(s, dropped), "dropped_after_rejection": sorted(dropped),
                            "rejections": rejected},
        "tokenizer": counter.name if counter is not None else None,
        "server_side": server_side,
    }


def _build(s: LiveSettings, endpoint: str, m: dict[str, Any], embedded: bool) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    req_rows, chunk_rows = [], []
    errors: dict[tuple[str, str], dict[str, Any]] = {}
    methods, details, out_sources = [], [], []
    warm = {"probe": None, "requests": 0, "completed": 0, "failed": 0}
    per_level: dict[int, dict[str, Any]] = {c: {"timings": [], "failed": 0, "inputs": [], "methods": []}
                                            for c in s.concurrency}
    overhead_ns: list[int] = []
    early = 0
    server_eval = _match_server_eval(m["parsed"], m.get("server_eval_blocks"), embedded)
    matched: dict[int, dict[str, Any]] = server_eval.pop("_by_item", {})

    for i_item, (item, ps, chunk_tokens, method, detail) in enumerate(m["parsed"]):
        ok = ps.ok
        if not ok:
            key = (item.phase, ps.reason)
            e = errors.setdefault(key, {"reason": ps.reason, "count": 0, "phase": item.phase, "concurrency": [],
                                        "example": ps.detail})
            e["count"] += 1
            if item.phase == "measure" and item.concurrency not in e["concurrency"]:
                e["concurrency"].append(item.concurrency)
        if item.phase != "measure":
            if item.phase == "probe":
                warm["probe"] = "ok" if ok else ps.reason
            else:
                warm["requests"] += 1
                warm["completed" if ok else "failed"] += 1
            continue
        lvl = per_level[item.concurrency]
        row: dict[str, Any] = {c: None for c in REQUEST_COLUMNS}
        row.update(request_id=item.request_id, concurrency=item.concurrency, ok=ok, error=ps.reason,
                   detail=ps.detail or None, http_status=item.result.status,
                   t_start_ms=(item.result.t_start_ns - item.level_t0_ns) / 1e6, finish_reason=ps.finish_reason)
        if not ok:
            lvl["failed"] += 1
            req_rows.append(row)
            continue
        n_out, source = tok.output_tokens(ps, chunk_tokens)
        t_ns = [c.t_ns for c in ps.chunks]
        timing = request_timing(t_ns, chunk_tokens, n_out, spread=method == tok.USAGE_TOTAL_SPREAD)
        lvl["timings"].append(timing)
        lvl["methods"].append(method)
        usage_in = (ps.usage or {}).get("prompt_tokens")
        n_in = int(usage_in) if isinstance(usage_in, (int, float)) else item.prompt_tokens
        lvl["inputs"].append(n_in)
        methods.append(method)
        details.append(detail)
        out_sources.append(source)
        if ps.finish_reason not in (None, "length") and n_out < s.max_tokens:
            early += 1
        itl = timing["itl_ms"]
        row.update(ttft_ms=timing["ttft_ms"], tpot_ms=timing["tpot_ms"], e2el_ms=timing["e2el_ms"],
                   mean_itl_ms=sum(itl) / len(itl) if itl else None,
                   mean_itl_per_token_ms=(sum(timing["itl_per_token_ms"]) / len(timing["itl_per_token_ms"])
                                          if timing["itl_per_token_ms"] else None),
                   output_tokens=n_out, output_tokens_source=source, content_chunks=len(ps.chunks),
                   input_tokens=n_in, token_count_method=method)
        block = matched.get(i_item)
        if block is not None:
            row.update(server_eval_ms_per_token=block["ms_per_token"], server_eval_runs=block["runs"])
            lvl.setdefault("eval", []).append((block, n_out))
        req_rows.append(row)
        for j, (chunk, k) in enumerate(zip(ps.chunks, chunk_tokens)):
            overhead_ns.append(chunk.overhead_ns)
            chunk_rows.append({
                "request_id": item.request_id, "concurrency": item.concurrency, "chunk_index": j,
                "t_ns": chunk.t_ns, "tokens": k,
                "itl_ms": itl[j - 1] if j else None,
                "itl_per_token_ms": timing["chunk_itl_per_token_ms"][j],
                "client_overhead_us": chunk.overhead_ns / 1e3,
            })

    levels = [level_summary(c, per_level[c]["timings"], per_level[c]["failed"], m["durations"].get(c, 0.0),
                            per_level[c]["inputs"]) for c in s.concurrency]
    for lv in levels:
        lv["itl_per_token_basis"] = _basis(per_level[lv["concurrency"]]["methods"])
        side = (m.get("server_side") or {}).get(lv["concurrency"])
        if side is not None:
            side["metrics"]["vs_client"] = compare_with_client(side["metrics"], lv.get("median_itl_per_token_ms"))
            lv["server_side"] = side
        lv.update(_eval_stats(per_level[lv["concurrency"]].get("eval", [])))
    server_eval["levels"] = [{"concurrency": lv["concurrency"], "requests": lv["server_eval_requests"],
                              "mean_ms_per_token": lv["mean_server_eval_ms_per_token"],
                              "median_ms_per_token": lv["median_server_eval_ms_per_token"],
                              "min_ms_per_token": lv["min_server_eval_ms_per_token"],
                              "max_ms_per_token": lv["max_server_eval_ms_per_token"]} for lv in levels]
    server_eval["runs_mismatch"] = sum(1 for c in s.concurrency for b, n in per_level[c].get("eval", [])
                                       if b["runs"] != n - 1)
    completed = sum(lv["completed"] for lv in levels)
    failed = sum(lv["failed"] for lv in levels)

    def _one(values: list[str | None]) -> str | None:
        uniq = sorted({v for v in values if v})
        return uniq[0] if len(uniq) == 1 else ("mixed: " + ", ".join(uniq) if uniq else None)

    ovh = describe((v / 1e3 for v in overhead_ns), "x")
    client_overhead = {
        "mean": ovh["mean_x_ms"], "median": ovh["median_x_ms"], "p99": ovh["p99_x_ms"], "max": ovh["max_x_ms"],
        "chunks": len(overhead_ns),
        "method": "per content chunk during the sweep: perf_counter_ns at the network read that completed it "
                  "-> the event stored (SSE decoding and bookkeeping; JSON is parsed after the stream)",
    }
    identity = m["identity"]
    engine, evidence, version = detect_engine(identity, s.engine, embedded)
    if embedded:
        device = f"cpu: {cpu_model()}"
    else:
        device = f"server at {urlsplit(endpoint).hostname} (device not visible to the client)"
    status = "ok" if failed == 0 else "partial"
    summary: dict[str, Any] = {
        "stage": "live",
        "status": status,
        "device": device,
        "backend": "httpx + httpx-sse on asyncio; perf_counter_ns at each network read",
        "engine": engine,
        "engine_source": evidence,
        "engine_version": version,
        "endpoint": display_url(endpoint),
        "url": m["url"],
        "embedded": embedded,
        "api": s.api,
        "model": m["model"],
        "server": identity,
        "settings": s.public(),
        "request_options": m["request_options"],
        "tokenizer": m["tokenizer"],
        "token_count_method": _one(methods),
        "token_count_detail": _one(details),
        "output_tokens_source": _one(out_sources),
        "itl_per_token_basis": _basis(methods),
        "itl_per_token_note": _BASIS_NOTES.get(_basis(methods)),
        "client_overhead_us": client_overhead,
        "server_eval": server_eval,
        "server_eval_ms_per_token": _eval_figure(server_eval, levels),
        "completed": completed,
        "failed": failed,
        "early_stops": early,
        "warmup": warm,
        "levels": levels,
        "errors": sorted(errors.values(), key=lambda e: (-e["count"], e["reason"])),
        "provenance": {
            "levels": f"measured: streamed requests to {display_url(m['url'])}",
            "client_overhead_us": "measured: in-loop cost per chunk; loopback calibration beside it",
            "token_count_method": "how tokens per chunk were counted (see config/README.md#live)",
        },
        "skipped": [],
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if status == "partial":
        summary["reason"] = f"{failed} of {completed + failed} measured requests failed (see errors)"
    if early:
        summary["early_stops_note"] = (f"{early} requests stopped before max_tokens: the server did not honour "
                                       "ignore_eos (TPOT and ITL are per produced token and stay valid)")
    req_df = pd.DataFrame(req_rows, columns=list(REQUEST_COLUMNS)) if req_rows else empty_requests()
    chunk_df = pd.DataFrame(chunk_rows, columns=list(CHUNK_COLUMNS)) if chunk_rows else empty_chunks()
    req_df = req_df.astype(REQUEST_COLUMNS)
    chunk_df = chunk_df.astype(CHUNK_COLUMNS)
    return summary, req_df, chunk_df


EVAL_SOURCE = ("live/embedded_server.log: llama.cpp llama_perf_context_print 'eval time' per request "
               "(eval ms / runs; time in llama_decode per generated token, as the server ran it)")


def _match_server_eval(parsed: list, blocks: list[dict[str, Any]] | None, embedded: bool) -> dict[str, Any]:
    """Pair the embedded server's per-generation log blocks with our requests.

    The server runs one generation at a time (a lock; `--interrupt_requests false`), so its blocks come in the
    order the generations started, which is the order their first events reached us. Every request that
    received an event ran a generation; when the counts differ the pairing is not trusted and nothing is
    attached (the summary says why).
    """
    if not embedded:
        return {"status": "unavailable", "why": "the server is not the embedded one (its log is not ours)"}
    if not blocks:
        return {"status": "unavailable", "why": "no llama_perf_context_print eval lines in live/embedded_server.log",
                "source": EVAL_SOURCE}
    started = sorted(((i, item.result.events[0][0]) for i, (item, *_rest) in enumerate(parsed)
                      if item.result is not None and item.result.events), key=lambda x: x[1])
    out: dict[str, Any] = {"status": "measured", "source": EVAL_SOURCE, "blocks": len(blocks),
                           "streamed_requests": len(started)}
    if len(started) != len(blocks):
        out.update(status="unavailable", why=f"{len(blocks)} eval blocks in the server log for {len(started)} "
                                             "streamed requests: cannot pair them")
        return out
    out["_by_item"] = {i: b for (i, _), b in zip(started, blocks) if b.get("ms_per_token") is not None}
    return out


def _eval_stats(pairs: list[tuple[dict[str, Any], int]]) -> dict[str, Any]:
    """Per level: the server's own decode time per token (mean weighted by tokens, like the per-token ITL)."""
    per_req = [b["ms_per_token"] for b, _ in pairs]
    runs = sum(b["runs"] for b, _ in pairs)
    return {
        "server_eval_requests": len(pairs),
        "mean_server_eval_ms_per_token": sum(b["eval_ms"] for b, _ in pairs) / runs if runs else None,
        "median_server_eval_ms_per_token": float(np.median(per_req)) if per_req else None,
        "min_server_eval_ms_per_token": min(per_req) if per_req else None,
        "max_server_eval_ms_per_token": max(per_req) if per_req else None,
    }


def _eval_figure(server_eval: dict[str, Any], levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The lowest concurrency level's server eval time per token as a labelled figure."""
    if server_eval.get("status") != "measured":
        return unavailable(server_eval.get("why", "not measured"), "ms", server_eval.get("source", ""))
    for lv in sorted(levels, key=lambda lv: lv["concurrency"]):
        if lv.get("mean_server_eval_ms_per_token") is not None:
            return measured(lv["mean_server_eval_ms_per_token"], "ms",
                            f"{EVAL_SOURCE}; concurrency {lv['concurrency']}, {lv['server_eval_requests']} requests")
    return unavailable("no measured request was paired with a server eval block", "ms", EVAL_SOURCE)


_BASIS_NOTES = {
    "exact": None,
    "spread": "per-token ITL: only each request's final usage total is known, spread over the chunks after the "
              "first; the mean equals TPOT exactly, the percentiles are approximate",
    "per_chunk": "per-token ITL assumes one token per chunk (no usage from the server and no tokenizer): "
                 "per-token figures are per-chunk figures; set live.tokenizer to count tokens",
    "mixed": "per-token ITL: requests were counted by different methods (see token_count_method); percentiles "
             "may be approximate",
}


def _basis(methods: list[str | None]) -> str | None:
    """How far the per-token ITL can be trusted: exact, spread (mean exact), per_chunk, or mixed."""
    kinds = {tok.BASIS.get(m or "", "per_chunk") for m in methods}
    if not kinds:
        return None
    return kinds.pop() if len(kinds) == 1 else "mixed"


def write_skipped(outputs: LiveOutputs, why: str) -> dict[str, Any]:
    summary = skipped_stage("live", why, levels=[], errors=[], engine="unknown", skipped=[])
    write_json(outputs.summary, summary)
    write_table(outputs.requests, empty_requests())
    write_table(outputs.chunks, empty_chunks())
    return summary


def _write_error(outputs: LiveOutputs, summary: dict[str, Any], redactor: Redactor) -> None:
    write_json(outputs.last_error, redactor.obj(summary))


def run_live(settings: LiveSettings, outputs: LiveOutputs, *, progress: bool = True,
             calibrate_client: bool = True, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the stage and write its outputs; raises DecodeGapError when no measured request succeeded."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    if not settings.enabled:
        return write_skipped(outputs, "stages.live is false in the config")
    api_key = read_api_key(settings)
    redactor = Redactor([api_key])
    configured = tok.HFTokenizer(settings.tokenizer) if settings.tokenizer else None  # a bad path: ConfigError now
    embedded = not settings.endpoint
    endpoint = settings.endpoint
    try:
        with contextlib.ExitStack() as stack:
            server = None
            if embedded:
                gguf = settings.gguf_path
                if not gguf:
                    raise ConfigError("config field 'gguf_path': the embedded server needs a GGUF model file")
                server = stack.enter_context(EmbeddedServer(gguf, settings.threads, settings.ready_timeout_s,
                                                            log_path=outputs.server_log))
                endpoint = server.base_url
            log(f"live: measuring {display_url(endpoint)} ({settings.api}, concurrency {settings.concurrency}, "
                f"{settings.num_requests} requests each, max_tokens {settings.max_tokens})")
            swept = asyncio.run(_sweep(settings, endpoint, api_key, server, progress, log, configured))
    except DecodeGapError as exc:
        _write_error(outputs, {"stage": "live", "status": "failed", "reason": str(exc),
                               "endpoint": display_url(endpoint or "embedded"), "levels": [], "errors": []}, redactor)
        raise DecodeGapError(redactor.text(str(exc))) from None

    # the embedded server has stopped: its log is complete
    swept["server_eval_blocks"] = read_eval_log(outputs.server_log) if embedded else None
    summary, req_df, chunk_df = _build(settings, endpoint, swept, embedded)
    if embedded:  # the server's own words for what it failed (e.g. a prompt beyond its context)
        summary["server_log_errors"] = read_log_errors(outputs.server_log)
    if calibrate_client:
        try:
            summary["client_overhead_us"]["loopback"] = asyncio.run(calibrate())
        except Exception as exc:  # the calibration is a diagnostic; never fail the stage over it
            summary["client_overhead_us"]["loopback"] = {"status": "unavailable", "why": f"{type(exc).__name__}: {exc}"}
    summary = redactor.obj(summary)
    req_df = redactor.frame(req_df)
    for e in summary["errors"]:
        log(f"live: {e['count']} x {e['phase']} failure: {e['reason']}" + (f" ({e['example']})" if e["example"] else ""))

    if summary["completed"] == 0:
        summary["status"] = "failed"
        top = summary["errors"][0]["reason"] if summary["errors"] else "no content received"
        if summary.get("server_log_errors"):
            top += f"; embedded server log: {summary['server_log_errors'][-1]}"
        summary["reason"] = f"no measured request succeeded: {top}"
        _write_error(outputs, summary, redactor)
        raise DecodeGapError(redactor.text(
            f"live: no request to {display_url(endpoint)} succeeded ({summary['failed']} failed; first reason: "
            f"{top}); error summary in {outputs.last_error}; earlier good runs are in the report archive"
        ))

    write_json(outputs.summary, summary)
    write_table(outputs.requests, req_df)
    write_table(outputs.chunks, chunk_df)
    with contextlib.suppress(FileNotFoundError):
        outputs.last_error.unlink()
    for lv in summary["levels"]:
        log(f"live: c={lv['concurrency']}: completed {lv['completed']}, failed {lv['failed']}, "
            f"median TTFT {_fmt(lv['median_ttft_ms'])} ms, median TPOT {_fmt(lv['median_tpot_ms'])} ms, "
            f"median ITL/token {_fmt(lv['median_itl_per_token_ms'])} ms, "
            f"output {_fmt(lv['output_throughput'])} tok/s")
    return summary


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"
