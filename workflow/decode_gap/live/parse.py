"""Raw SSE events -> content chunks, for `/v1/completions` and `/v1/chat/completions` streams.

A *content chunk* is an event whose choice carries non-empty text (`choices[0].text`, or for chat
`choices[0].delta.content`, also `reasoning_content`/`reasoning`). Role-only chat deltas, empty keep-alive
events and the final usage-only event (`choices: []`) are not content. Usage seen on any event is kept:
cumulative `completion_tokens` at each content chunk (vLLM/SGLang `continuous_usage_stats`) and the last
usage of the stream (`include_usage`). A data line whose JSON carries `error` (a string, or an object with
message/type/code) fails the request with the server's own message as the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .client import StreamResult, error_message, one_line, quote


@dataclass
class Chunk:
    t_ns: int  # arrival time relative to the request start
    text: str
    cum_tokens: int | None  # completion_tokens reported with this event, if any (cumulative)
    overhead_ns: int


@dataclass
class ParsedStream:
    chunks: list[Chunk] = field(default_factory=list)
    usage: dict[str, Any] | None = None  # the last usage object in the stream
    finish_reason: str | None = None
    reason: str | None = None  # failure reason (stable, grouped)
    detail: str = ""
    empty_events_with_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)


def _choice_text(choice: dict[str, Any], api: str) -> str:
    if api == "chat":
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            return ""
        parts = [delta.get(k) for k in ("reasoning_content", "reasoning", "content")]
        return "".join(p for p in parts if isinstance(p, str))
    text = choice.get("text")
    if text is None and isinstance(choice.get("delta"), dict):  # some servers answer completions in chat form
        text = choice["delta"].get("content")
    return text if isinstance(text, str) else ""


def _completion_tokens(usage: Any) -> int | None:
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), (int, float)):
        return int(usage["completion_tokens"])
    return None


def parse_stream(result: StreamResult, api: str) -> ParsedStream:
    """Turn one request's raw events into content chunks; a malformed event fails the request."""
    out = ParsedStream()
    if not result.ok:
        out.reason, out.detail = result.reason, result.detail
        return out
    for (t_ns, event, data), ovh in zip(result.events, result.overhead_ns):
        if event == "error":
            try:
                msg = error_message(json.loads(data))
            except ValueError:
                msg = None
            out.reason = f"error event in stream from {result.url}: {msg or quote(data) or '(empty error event)'}"
            out.detail = f"event: error, {len(out.chunks)} content chunks before it"
            return out
        if not data.strip():
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            out.reason = f"malformed data line from {result.url}"
            out.detail = one_line(f"data: {data}", 120)
            return out
        if not isinstance(obj, dict):
            out.reason = f"malformed data line from {result.url}"
            out.detail = one_line(f"data: {data}", 120)
            return out
        if obj.get("error") not in (None, False, "", [], {}):
            # the server's own words are the reason (grouped in the summary's `errors`)
            out.reason = f"error event in stream from {result.url}: {error_message(obj) or '(empty error)'}"
            out.detail = f"{len(out.chunks)} content chunks before it"
            return out
        usage = obj.get("usage")
        cum = _completion_tokens(usage)
        if isinstance(usage, dict):
            out.usage = usage
        choices = obj.get("choices") or []
        if not isinstance(choices, list):
            out.reason = f"malformed data line from {result.url}"
            out.detail = one_line(f"data: {data}", 120)
            return out
        text = ""
        for choice in choices[:1]:
            if not isinstance(choice, dict):
                continue
            text = _choice_text(choice, api)
            if choice.get("finish_reason"):
                out.finish_reason = str(choice["finish_reason"])
        if text:
            out.chunks.append(Chunk(t_ns=t_ns - result.t_start_ns, text=text, cum_tokens=cum, overhead_ns=ovh))
        elif cum is not None and choices:
            out.empty_events_with_tokens += 1
    if not out.chunks:
        out.reason = f"stream from {result.url} had no content chunks"
        out.detail = f"{len(result.events)} events, none with text"
    return out
