"""What a live server answers when a request goes wrong, as the live stage reports it (issue 17).

Against a running OpenAI-compatible server (e.g. `transformers serve` on the H200), sends a few streamed chat
requests that a server may refuse or fail on, and prints for each the failure reason the live stage would
record: the server's own message (SSE error event in either shape, or a non-2xx body), or "ok" when the
server streamed an answer. Then one small live run with `live.tokenizer` (when given) prints how tokens per
chunk were counted and the per-token ITL next to TPOT.

    python3 benchmarks/device/live_error_probe.py http://127.0.0.1:8000/v1 --model /tmp/llama-1b-random \
        [--tokenizer /tmp/llama-1b-random]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

from decode_gap.errors import DecodeGapError  # noqa: E402
from decode_gap.live.client import stream_request  # noqa: E402
from decode_gap.live.parse import parse_stream  # noqa: E402
from decode_gap.live.runner import LiveOutputs, LiveSettings, run_live  # noqa: E402

CASES = {
    "normal request": {},
    "empty user message": {"messages": [{"role": "user", "content": ""}]},
    "no messages": {"messages": []},
    "unknown model": {"model": "/nonexistent/model-for-error-probe"},
    "max_tokens 0": {"max_tokens": 0},
    "prompt beyond the context": {"messages": [{"role": "user", "content": "w7 " * 200_000}]},
}


async def probe(endpoint: str, model: str, timeout_s: float) -> None:
    url = endpoint.rstrip("/") + "/chat/completions"
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        for name, override in CASES.items():
            body = {"model": model, "stream": True, "max_tokens": 8, "temperature": 0.0,
                    "messages": [{"role": "user", "content": "w7 w8 w9"}], **override}
            res = await stream_request(client, url, body, None, timeout_s, require_done=False)
            parsed = parse_stream(res, "chat")
            shown = "ok" if parsed.ok else parsed.reason
            print(f"{name:28s} HTTP {res.status}, {len(res.events)} events -> {shown}")
            if not parsed.ok and parsed.detail:
                print(f"{'':28s} detail: {parsed.detail}")


def small_run(endpoint: str, model: str, tokenizer: str) -> None:
    out_dir = Path(tempfile.mkdtemp(prefix="live-probe-"))
    out = LiveOutputs(out_dir / "summary.json", out_dir / "requests.parquet", out_dir / "chunks.parquet")
    settings = LiveSettings(endpoint=endpoint, api="chat", model=model, concurrency=[1], num_requests=4,
                            warmup_requests=1, max_tokens=32, input_len=16, require_done=False,
                            engine="transformers", tokenizer=tokenizer)
    try:
        s = run_live(settings, out, progress=False, calibrate_client=False, log=lambda line: None)
    except DecodeGapError as exc:
        print(f"live run failed: {exc}")
        return
    lv = s["levels"][0]
    print(json.dumps({k: s.get(k) for k in ("token_count_method", "token_count_detail", "output_tokens_source",
                                            "itl_per_token_basis", "itl_per_token_note")}, indent=1))
    print(f"c=1: mean ITL/token {lv['mean_itl_per_token_ms']:.3f} ms, mean TPOT {lv['mean_tpot_ms']:.3f} ms, "
          f"mean ITL/chunk {lv['mean_itl_ms']:.3f} ms, tokens/chunk {lv['mean_tokens_per_chunk']:.3f}, "
          f"output tokens {lv['total_output_tokens']}, errors {s['errors']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    asyncio.run(probe(args.endpoint, args.model, args.timeout))
    small_run(args.endpoint, args.model, "")
    if args.tokenizer:
        small_run(args.endpoint, args.model, args.tokenizer)


if __name__ == "__main__":
    main()
