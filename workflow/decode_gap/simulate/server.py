"""Server level, calibration: what streaming one token costs the HTTP stack, measured without any model.

A real loopback server (127.0.0.1) built from the same stack as the configured server streams OpenAI completion
chunks as fast as it can: Starlette + uvicorn, with sse-starlette's EventSourceResponse fed through
`iterate_in_threadpool` as llama-cpp-python's server does, or a plain StreamingResponse as `transformers serve`
does. A client in this process reads the stream the way the live stage does (timestamp on byte arrival, then
parse). Measured per chunk: wall time, the server process's CPU time (psutil) and the client's CPU time.

These figures are independent of the live ITL they help predict: no model runs, no live request is used.
gap.py turns them into the server-overhead model (see its docstring).

`CoRun` runs the same server paced at one chunk per engine step, plus a streaming client process, beside an
in-process engine measurement (engine.py), so the engine's slowdown from sharing the host with its HTTP stack is
measured without the live server.

Run as a module, this file is the calibration server (`python -m decode_gap.simulate.server PORT STACK CHUNKS
[PACE_MS]`) or the co-run client (`python -m decode_gap.simulate.server client URL`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from ..host import free_port
from .timing import spread

CHUNK_TEXT = " word"


def _chunk(i: int) -> dict[str, Any]:
    # the shape llama-cpp-python streams for /v1/completions
    return {"id": "cmpl-calibration", "object": "text_completion", "created": 1700000000, "model": "calibration",
            "choices": [{"text": CHUNK_TEXT, "index": 0, "logprobs": None, "finish_reason": None}]}


def _app(stack: str, chunks: int, pace_ms: float = 0.0):
    from starlette.applications import Starlette
    from starlette.concurrency import iterate_in_threadpool
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def produce():
        for i in range(chunks):
            if pace_ms > 0:  # one chunk per engine step: the thread sleeps as a worker waiting on the engine would
                time.sleep(pace_ms / 1000.0)
            yield _chunk(i)

    async def completions(request):
        await request.body()
        if stack == "sse-starlette":
            from sse_starlette.sse import EventSourceResponse

            async def events():
                async for chunk in iterate_in_threadpool(produce()):
                    yield dict(data=json.dumps(chunk))
                yield dict(data="[DONE]")

            return EventSourceResponse(events())

        async def body():
            async for chunk in iterate_in_threadpool(produce()):
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    async def health(request):
        return JSONResponse({"ok": True})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/health", health)])


def _serve(port: int, stack: str, chunks: int, pace_ms: float = 0.0) -> None:
    import uvicorn

    uvicorn.run(_app(stack, chunks, pace_ms), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _client_loop(url: str) -> None:
    """A streaming client that reads completion streams back to back (the co-run load)."""
    import httpx

    with httpx.Client(timeout=600.0) as client:
        while True:
            _read_stream(client, url)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _wait_health(proc, base: str, timeout_s: float) -> str | None:
    import httpx

    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while True:
            if proc.poll() is not None:
                err = (proc.stderr.read() or b"").decode(errors="replace").strip().splitlines() if proc.stderr else []
                return f"calibration server exited: {err[-1] if err else proc.returncode}"
            try:
                if client.get(base + "/health").status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                return f"calibration server not ready within {timeout_s:.0f} s"
            time.sleep(0.1)


def _stop(proc) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class CoRun:
    """A paced loopback SSE stream and a client reading it, running beside an in-process engine measurement.

    It reproduces what the engine shares its cores with while it serves: the server's HTTP/SSE work (one chunk per
    engine step) and a streaming client, without a model and without the live server. `with CoRun(...) as c:`
    starts the server; `c.start_client()` / `c.stop_client()` switch the load on and off, so that measurements
    with and without it can alternate; c.error says why it could not run.
    """

    def __init__(self, pace_ms: float, preferred: str = "sse-starlette", ready_timeout_s: float = 30.0) -> None:
        self.pace_ms, self.preferred, self.ready_timeout_s = pace_ms, preferred, ready_timeout_s
        self.server = self.client = None
        self.error: str | None = None
        self.stack: str | None = None
        self.stack_description = ""

    def __enter__(self) -> "CoRun":
        stack, desc = available_stack(self.preferred)
        if stack is None:
            self.error = desc
            return self
        self.stack, self.stack_description = stack, desc
        port = free_port()
        env = _env()
        self.server = subprocess.Popen(
            [sys.executable, "-m", "decode_gap.simulate.server", str(port), stack, "100000000", str(self.pace_ms)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.base = f"http://127.0.0.1:{port}"
        self.error = _wait_health(self.server, self.base, self.ready_timeout_s)
        if self.error:
            _stop(self.server)
        return self

    def start_client(self) -> bool:
        """Start the streaming client (the load); False, with self.error, when it does not stay up."""
        if self.error:
            return False
        self.client = subprocess.Popen([sys.executable, "-m", "decode_gap.simulate.server", "client",
                                        self.base + "/v1/completions"], env=_env(), stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        if self.client.poll() is not None:
            self.error = f"co-run client exited ({self.client.returncode})"
            return False
        return True

    def stop_client(self) -> None:
        _stop(self.client)
        self.client = None

    def __exit__(self, *exc) -> None:
        _stop(self.client)
        _stop(self.server)


def available_stack(preferred: str) -> tuple[str | None, str]:
    """The stack to calibrate ('sse-starlette' or 'starlette'), or None and why not."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return None, f"starlette/uvicorn not importable ({exc}); the server's HTTP stack cannot be calibrated"
    if preferred == "sse-starlette":
        try:
            import sse_starlette  # noqa: F401

            return "sse-starlette", "starlette + sse-starlette EventSourceResponse + uvicorn (llama-cpp-python's server)"
        except ImportError:
            return "starlette", "starlette StreamingResponse + uvicorn (sse-starlette not importable)"
    return "starlette", "starlette StreamingResponse + uvicorn (as FastAPI servers such as transformers serve)"


def _read_stream(client, url: str) -> tuple[list[int], int]:
    """Arrival time of every data event (taken on byte arrival, before parsing) and the event count."""
    stamps: list[int] = []
    events = 0
    buf = b""
    with client.stream("POST", url, json={"prompt": "x", "stream": True, "max_tokens": 1}) as r:
        r.raise_for_status()
        for piece in r.iter_raw():
            t = time.perf_counter_ns()
            buf += piece
            while b"\n\n" in buf or b"\r\n\r\n" in buf:
                sep = b"\r\n\r\n" if b"\r\n\r\n" in buf and (b"\n\n" not in buf or buf.index(b"\r\n\r\n") < buf.index(b"\n\n")) else b"\n\n"
                event, buf = buf.split(sep, 1)
                for line in event.splitlines():
                    if line.startswith(b"data:"):
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            continue
                        json.loads(data)
                        events += 1
                        stamps.append(t)
    return stamps, events


def calibrate_transport(preferred: str = "sse-starlette", chunks: int = 1000, repeats: int = 3,
                        ready_timeout_s: float = 30.0) -> dict[str, Any]:
    import httpx
    import psutil

    stack, stack_desc = available_stack(preferred)
    if stack is None:
        return {"status": "skipped", "reason": stack_desc}
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "decode_gap.simulate.server", str(port), stack, str(chunks)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        err = _wait_health(proc, base, ready_timeout_s)
        if err:
            return {"status": "skipped", "reason": err}
        with httpx.Client(timeout=30.0) as client:
            ps = psutil.Process(proc.pid)
            runs = []
            for rep in range(repeats + 1):
                c0 = ps.cpu_times()
                p0 = time.process_time()
                t0 = time.perf_counter_ns()
                stamps, events = _read_stream(client, base + "/v1/completions")
                t1 = time.perf_counter_ns()
                p1 = time.process_time()
                c1 = ps.cpu_times()
                if rep == 0:
                    continue  # warm-up
                n = max(1, events)
                runs.append({
                    "events": events,
                    "wall_per_chunk_ms": (t1 - t0) / 1e6 / n,
                    "server_cpu_per_chunk_ms": ((c1.user + c1.system) - (c0.user + c0.system)) * 1000.0 / n,
                    "client_cpu_per_chunk_ms": (p1 - p0) * 1000.0 / n,
                    "gaps": [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:])],
                })
    finally:
        _stop(proc)

    def med(key: str) -> float:
        vals = sorted(r[key] for r in runs)
        return vals[len(vals) // 2]

    return {
        "status": "ok",
        "stack": stack,
        "stack_description": stack_desc,
        "chunks": chunks,
        "repeats": repeats,
        "wall_per_chunk_ms": med("wall_per_chunk_ms"),
        "server_cpu_per_chunk_ms": med("server_cpu_per_chunk_ms"),
        "client_cpu_per_chunk_ms": med("client_cpu_per_chunk_ms"),
        "arrival_gaps": spread([g for r in runs for g in r["gaps"]]),
        "source": "loopback SSE calibration server (no model), psutil CPU times of the server process, "
                  "time.process_time of the client",
    }


if __name__ == "__main__":  # the calibration server process, or the co-run client
    if sys.argv[1] == "client":
        _client_loop(sys.argv[2])
    else:
        _serve(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
