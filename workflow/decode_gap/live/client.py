"""One streamed request to an OpenAI-compatible server, timed the way `vllm bench serve` times it.

The arrival time of each server-sent event is the `time.perf_counter_ns()` taken as soon as the network
read that completed it returns, before SSE decoding and before JSON parsing: the byte stream under
httpx-sse is wrapped so that every read is stamped. JSON is parsed only after the stream ends (`parse`),
so the loop that receives chunks does as little as possible while the clock matters.

A request never raises: every failure becomes a `StreamResult` with a stable one-line `reason` naming the
URL (counted and grouped in the summary) and a per-request `detail`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from httpx_sse import SSEError, aconnect_sse
from ..secrets import scrub_credentials


def display_url(url: str) -> str:
    """The URL without any user:password part (a secret must never reach a result or a log)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def one_line(text: str, limit: int = 200) -> str:
    """Server-supplied text squeezed to one short line (it is escaped again where the report renders it)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


MESSAGE_LIMIT = 300  # a server's own error message is quoted up to this many characters
def scrub(text: str) -> str:
    """Credential-looking parts of server text replaced by the core marker (the configured key: by the runner)."""
    return scrub_credentials(text)


def quote(text: Any) -> str:
    """A server's message as we repeat it: one line, secrets scrubbed, cut at MESSAGE_LIMIT characters."""
    return one_line(scrub(" ".join(str(text).split())), MESSAGE_LIMIT)


def error_message(obj: Any) -> str | None:
    """The server's own message from an error payload, or None when `obj` is not one.

    Shapes seen in the field: `{"error": "text"}` (transformers serve), `{"error": {"message", "type",
    "code"}}` (OpenAI, vLLM, llama.cpp), `{"detail": "text" | [{"msg": ...}]}` (FastAPI, 422 validation),
    `{"message": "text"}`, `{"object": "error", "message": ...}`.
    """
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, dict):
        msg = err.get("message") or err.get("msg") or err.get("detail")
        extra = [f"{k} {err[k]}" for k in ("type", "code") if err.get(k) not in (None, "")]
        text = str(msg) if msg else json.dumps(err)[:MESSAGE_LIMIT]
        return quote(text + (f" ({', '.join(extra)})" if extra else ""))
    if isinstance(err, str) and err.strip():
        return quote(err)
    if err not in (None, False, "", [], {}):
        return quote(json.dumps(err))
    if "choices" in obj:  # a normal chunk: never read `message`/`detail` keys of a chunk as an error
        return None
    detail = obj.get("detail")
    if isinstance(detail, list) and detail:
        parts = [f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" if isinstance(d, dict) else str(d)
                 for d in detail[:3]]
        return quote("; ".join(parts))
    for key in ("detail", "message"):
        if isinstance(obj.get(key), str) and obj[key].strip():
            return quote(obj[key])
    return None


def body_message(body: str) -> str:
    """The message of a non-2xx response body: its JSON error message, else the text itself (quoted)."""
    try:
        msg = error_message(json.loads(body))
    except ValueError:
        msg = None
    if msg:
        return msg
    text = re.sub(r"<[^>]+>", " ", body)  # an HTML error page: keep its words
    return quote(text) if text.strip() else ""


def stream_error(events: list[tuple[int, str, str]]) -> tuple[str, str] | None:
    """(message, index note) of the first error event (`event: error`, or a data line whose JSON has `error`)."""
    for i, (_, event, data) in enumerate(events):
        if event == "error":
            try:
                msg = error_message(json.loads(data))
            except ValueError:
                msg = None
            return (msg or quote(data) or "(empty error event)"), f"event {i + 1} of {len(events)}"
        if '"error"' not in data:
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("error") not in (None, False, "", [], {}):
            return (error_message(obj) or "(empty error)"), f"event {i + 1} of {len(events)}"
    return None


@dataclass
class StreamResult:
    """What came back for one request: raw events with arrival times, or why it failed."""

    url: str
    t_start_ns: int = 0
    t_end_ns: int = 0
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    events: list[tuple[int, str, str]] = field(default_factory=list)  # (arrival ns, SSE event name, data)
    overhead_ns: list[int] = field(default_factory=list)  # per event: bytes arrived -> record stored
    done: bool = False
    done_marker: bool = True  # False: completion taken from a finish_reason (no [DONE] sent)
    reason: str | None = None  # stable, grouped in the summary; None when the transport part succeeded
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.reason is None

    def fail(self, reason: str, detail: str = "") -> "StreamResult":
        if self.reason is None:  # the first failure wins
            self.reason = reason
            self.detail = one_line(detail)
        return self


def _finished(events: list[tuple[int, str, str]]) -> bool:
    """Whether one of the last events carries a finish_reason (the usage-only chunk may come after it)."""
    for _, _, data in events[-3:]:
        try:
            obj = json.loads(data)
        except ValueError:
            continue
        for choice in obj.get("choices") or [] if isinstance(obj, dict) else []:
            if isinstance(choice, dict) and choice.get("finish_reason"):
                return True
    return False


def _fail_with_stream_error(res: StreamResult, shown: str) -> None:
    """A stream cut short after an error event failed for the server's stated reason."""
    err = stream_error(res.events)
    if err:
        res.fail(f"error event in stream from {shown}: {err[0]}", f"{err[1]}; the stream was then cut")


class _StampedStream(httpx.AsyncByteStream):
    """Wraps a response's byte stream; `t_ns` is the arrival time of the latest network read."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.t_ns = 0
        self.reads = 0

    async def __aiter__(self):
        async for chunk in self._inner:
            self.t_ns = time.perf_counter_ns()
            self.reads += 1
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


async def stream_request(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    headers: dict[str, str] | None,
    timeout_s: float,
    require_done: bool = True,
) -> StreamResult:
    """POST `payload` with `stream: true` and record every SSE event's arrival time until `[DONE]`.

    With `require_done=False` (live.require_done) a stream that ends cleanly after a chunk carrying a
    `finish_reason` also counts as complete: `transformers serve` never sends `[DONE]`. A stream that ends with
    neither is a failure either way.
    """
    shown = display_url(url)
    res = StreamResult(url=shown)
    res.t_start_ns = time.perf_counter_ns()
    started = False
    try:
        async with asyncio.timeout(timeout_s):
            async with aconnect_sse(client, "POST", url, json=payload, headers=dict(headers or {})) as source:
                resp = source.response
                started = True
                res.status = resp.status_code
                res.headers = {k.lower(): v for k, v in resp.headers.items()}
                if resp.status_code >= 300:
                    body = (await resp.aread())[:8000].decode("utf-8", "replace")
                    msg = body_message(body)
                    return res.fail(f"HTTP {resp.status_code} from {shown}" + (f": {msg}" if msg else ""),
                                    scrub(body))
                ctype = resp.headers.get("content-type", "")
                if "text/event-stream" not in ctype:
                    body = (await resp.aread())[:4000].decode("utf-8", "replace")
                    try:
                        msg = error_message(json.loads(body))
                    except ValueError:
                        msg = None
                    return res.fail(
                        f"non-SSE response from {shown} (content-type {ctype.split(';')[0].strip() or 'missing'!r})"
                        + (f": {msg}" if msg else ""),
                        scrub(body),
                    )
                stamped = _StampedStream(resp.stream)
                resp.stream = stamped
                events = res.events
                overhead = res.overhead_ns
                async for sse in source.aiter_sse():
                    t = stamped.t_ns
                    if sse.data == "[DONE]":
                        res.done = True
                        break
                    events.append((t, sse.event, sse.data))
                    overhead.append(time.perf_counter_ns() - t)
        if not res.done and not require_done and _finished(res.events):
            res.done = True
            res.done_marker = False
        if not res.done:
            err = stream_error(res.events)
            if err:  # the server said why it stopped: that, not the missing [DONE], is the reason
                res.fail(f"error event in stream from {shown}: {err[0]}", f"{err[1]}; stream ended without [DONE]")
            else:
                res.fail(f"stream from {shown} ended without [DONE]", f"{len(res.events)} events received")
    except TimeoutError:
        _fail_with_stream_error(res, shown)
        res.fail(
            f"timeout after {timeout_s:g} s (live.timeout_s) waiting for {shown}",
            f"{len(res.events)} events received",
        )
    except httpx.TimeoutException as exc:
        res.fail(f"timeout ({type(exc).__name__}) waiting for {shown}", str(exc))
    except httpx.ConnectError as exc:
        res.fail(f"cannot connect to {shown}", str(exc))
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        if started:
            _fail_with_stream_error(res, shown)
            res.fail(f"connection dropped mid-stream by {shown}", f"{len(res.events)} events received; {exc}")
        else:
            res.fail(f"connection closed by {shown} before a response", str(exc))
    except SSEError as exc:
        res.fail(f"non-SSE response from {shown}", str(exc))
    except httpx.HTTPError as exc:
        res.fail(f"HTTP transport error ({type(exc).__name__}) with {shown}", str(exc))
    finally:
        res.t_end_ns = time.perf_counter_ns()
    return res
