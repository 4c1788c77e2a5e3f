"""Client overhead calibration: a loopback SSE emitter whose events carry their own send time.

Run as a script (stdlib only) it serves one endpoint on 127.0.0.1: every POST answers a chunked
`text/event-stream` of N events, each `data: <time.perf_counter_ns() at write>`, spaced by an interval, then
`[DONE]`. `perf_counter_ns` is CLOCK_MONOTONIC on Linux, shared by all processes, so the measuring client
(`calibrate`, through the very `stream_request` the live sweep uses) gets the delay from the server's write
to the client's arrival stamp: kernel loopback plus the client stack (httpx, asyncio) per chunk. Together
with the in-loop cost measured during the real sweep (bytes arrived -> record stored) this is the client's
own share of every ITL.
"""

from __future__ import annotations

import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    events = 200
    interval_s = 0.002

    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):  # noqa: N802 - http.server API
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        nxt = time.perf_counter() + self.interval_s
        for _ in range(self.events):
            while time.perf_counter() < nxt:
                time.sleep(max(0.0, nxt - time.perf_counter() - 0.0002))
            body = f"data: {time.perf_counter_ns()}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(body), body))
            self.wfile.flush()
            nxt += self.interval_s
        body = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        self.wfile.flush()


def serve(events: int, interval_ms: float) -> None:
    _Handler.events = events
    _Handler.interval_s = interval_ms / 1000.0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


async def calibrate(events: int = 200, interval_ms: float = 2.0, timeout_s: float = 30.0) -> dict:
    """Per-chunk delivery delay (server write -> client stamp) and in-loop cost, in microseconds."""
    import asyncio  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    import httpx  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from .client import stream_request  # noqa: PLC0415

    proc = subprocess.Popen([sys.executable, __file__, str(events), str(interval_ms)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        port_line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=30)
        port = int(port_line.strip())
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            res = await stream_request(client, f"http://127.0.0.1:{port}/calibrate", {"stream": True}, {}, timeout_s)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if not res.ok:
        return {"status": "unavailable", "why": f"{res.reason}: {res.detail}"}
    delays = np.asarray([(t - int(data)) / 1e3 for t, _, data in res.events[5:]], dtype=float)  # skip 5 warm-up
    loop = np.asarray(res.overhead_ns[5:], dtype=float) / 1e3
    return {
        "status": "measured",
        "events": int(delays.size),
        "median_delivery_us": float(np.median(delays)),
        "p99_delivery_us": float(np.percentile(delays, 99)),
        "mean_delivery_us": float(np.mean(delays)),
        "median_in_loop_us": float(np.median(loop)),
        "method": "loopback SSE emitter stamping perf_counter_ns at write; the client's arrival stamp minus it",
    }


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]))
