"""The live sweep: option probe, warm-up, then per concurrency level N streamed requests, at most c in flight."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from ..errors import REASON_CHARS, describe
from . import tokens as tok
from .client import StreamResult, stream_request
from .identity import detect_engine, probe_identity, safe_headers, server_root
from .server_side import ServerSideWindow
from .parse import parse_stream
from .prompts import build_prompt
from .server import EmbeddedServer, llama_cpp_available
from .settings import LiveSettings, OPTIONAL_FIELDS, _is_loopback


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
                log(f"live: GGUF tokenizer unavailable ({describe(exc, REASON_CHARS)})")
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
                # The server's own view of this level: /metrics before and after, outside the timed span.
                window = None
                if s.server_metrics:
                    engine_now = detect_engine(identity, s.engine, server is not None)[0]
                    window = ServerSideWindow(endpoint, engine_now, headers)
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
            if s.server_profile.get("enabled"):
                profile = await _profile_window(s, client, url, endpoint, headers, model, dropped,
                                                detect_engine(identity, s.engine, server is not None)[0],
                                                [p for p, _ in prompts[1 + s.warmup_requests:]], log)
                server_side.setdefault(s.concurrency[0], {"metrics": {"status": "unavailable", "why":
                                                                      "live.server_metrics is off"}})["profile"] = profile
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


async def _profile_window(s: LiveSettings, client: Any, url: str, endpoint: str, headers: dict[str, str],
                          model: Any, dropped: set[str], engine: str, prompts: list[str],
                          log: Any) -> dict[str, Any]:
    """A vLLM/SGLang profile window of its own, after the timed levels: a profiled server decodes slower
    (CUPTI, CPU-op recording), so no timed request may run under it. One request at a time, enough of them to
    cover `num_steps` decode steps; their timings are not kept."""
    window = ServerSideWindow(endpoint, engine, headers, profile=s.server_profile, metrics=False)
    window.start()
    steps = int(s.server_profile.get("num_steps") or 20)
    n = max(1, min(len(prompts), -(-steps // max(1, s.max_tokens - 1)) + 1))
    for prompt in prompts[:n]:
        await stream_request(client, url, _payload(s, model, prompt, s.max_tokens, dropped), headers, s.timeout_s,
                             require_done=s.require_done)
    profile = window.stop()["profile"]
    profile["window"] = f"{n} untimed request(s) at concurrency 1, after the timed levels"
    log(f"live: server profile window ({n} untimed requests): {profile.get('status')}")
    return profile
