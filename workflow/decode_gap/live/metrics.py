"""Streaming latency statistics named and defined as in `vllm bench serve`, plus a per-token ITL.

Per request (times from the request start, content chunks only):
- TTFT = arrival of the first content chunk;
- E2EL = arrival of the last content chunk;
- TPOT = (E2EL - TTFT) / (output_tokens - 1), only when output_tokens > 1;
- ITL  = the gaps between consecutive content chunks (one value per gap, whatever the chunk holds);
- ITL per token: a gap that delivered a chunk of k tokens gives k values of gap / k. Tokens that share the
  first content chunk have no gap of their own (their time is inside TTFT) and add no value. When only the
  request's token total is known the values interpolate the arrival curve (`request_timing(spread=True)`).

Per concurrency level: `mean/median/std/p90/p99/min/max` of each (numpy, `np.std` with ddof=0 and linear
`np.percentile`, as vLLM), the ITL lists pooled over all requests; `request_throughput = completed /
duration_s`; `output_throughput = total_output_tokens / duration_s`.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

STATS = ("mean", "median", "std", "p90", "p99", "min", "max")
METRICS = ("ttft", "tpot", "itl", "e2el", "itl_per_token")


def describe(values: Iterable[float], metric: str) -> dict[str, float | None]:
    """`{mean_<metric>_ms, median_..., std_..., p90_..., p99_..., min_..., max_...}`; null when no values."""
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if arr.size == 0:
        return {f"{s}_{metric}_ms": None for s in STATS}
    return {
        f"mean_{metric}_ms": float(np.mean(arr)),
        f"median_{metric}_ms": float(np.median(arr)),
        f"std_{metric}_ms": float(np.std(arr)),
        f"p90_{metric}_ms": float(np.percentile(arr, 90)),
        f"p99_{metric}_ms": float(np.percentile(arr, 99)),
        f"min_{metric}_ms": float(np.min(arr)),
        f"max_{metric}_ms": float(np.max(arr)),
    }


def request_timing(t_ns: Sequence[int], chunk_tokens: Sequence[int], output_tokens: int,
                   spread: bool = False) -> dict[str, Any]:
    """Timing of one successful request from its content chunks' arrival times (ns after the request start).

    A chunk that holds no token (k = 0) gives no per-token value; its gap is carried to the next chunk that
    holds tokens. With `spread` (only the request's total is known, `usage_total_spread`) the tokens after the
    first chunk are placed evenly along the chunk index and their times interpolated on the arrival curve:
    the values sum to E2EL - TTFT over (tokens after the first chunk), so their mean is TPOT exactly, while
    their distribution is approximate.
    """
    if not t_ns:
        raise ValueError("a request needs at least one content chunk")
    if len(t_ns) != len(chunk_tokens):
        raise ValueError("one token count per chunk")
    ks = [max(0, int(k)) for k in chunk_tokens]
    ks[0] = max(1, ks[0])
    ttft = t_ns[0] / 1e6
    e2el = t_ns[-1] / 1e6
    itl = [(t_ns[i] - t_ns[i - 1]) / 1e6 for i in range(1, len(t_ns))]
    per_token: list[float] = []
    per_chunk_per_token: list[float | None] = [None]
    last = t_ns[0]
    for i in range(1, len(t_ns)):
        k = ks[i]
        if k == 0:
            per_chunk_per_token.append(None)
            continue
        gap = (t_ns[i] - last) / 1e6
        last = t_ns[i]
        per_token.extend([gap / k] * k)
        per_chunk_per_token.append(gap / k)
    after = sum(ks[1:])
    if spread and len(t_ns) > 1 and after > 0:
        pos = np.arange(after + 1) * (len(t_ns) - 1) / after
        times = np.interp(pos, np.arange(len(t_ns)), np.asarray(t_ns, dtype=float) / 1e6)
        per_token = [float(x) for x in np.diff(times)]
    tpot = (e2el - ttft) / (output_tokens - 1) if output_tokens > 1 else None
    return {
        "ttft_ms": ttft,
        "e2el_ms": e2el,
        "tpot_ms": tpot,
        "itl_ms": itl,
        "itl_per_token_ms": per_token,
        "chunk_itl_per_token_ms": per_chunk_per_token,
        "output_tokens": int(output_tokens),
        "chunk_tokens": ks,
    }


def level_summary(concurrency: int, timings: list[dict[str, Any]], failed: int, duration_s: float,
                  input_tokens: list[int | None] | None = None) -> dict[str, Any]:
    """One concurrency level's summary from its successful requests' timings."""
    completed = len(timings)
    total_out = int(sum(t["output_tokens"] for t in timings))
    known_in = [n for n in (input_tokens or []) if n is not None]
    total_in = int(sum(known_in)) if input_tokens is not None and len(known_in) == completed and completed else None
    chunks = sum(len(t["itl_ms"]) + 1 for t in timings)
    out: dict[str, Any] = {
        "concurrency": int(concurrency),
        "num_requests": completed + int(failed),
        "completed": completed,
        "failed": int(failed),
        "duration_s": float(duration_s),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed / duration_s if duration_s > 0 else None,
        "output_throughput": total_out / duration_s if duration_s > 0 else None,
        "total_token_throughput": (total_in + total_out) / duration_s if duration_s > 0 and total_in is not None else None,
        "mean_tokens_per_chunk": sum(sum(t["chunk_tokens"]) for t in timings) / chunks if chunks else None,
    }
    out.update(describe((t["ttft_ms"] for t in timings), "ttft"))
    out.update(describe((t["tpot_ms"] for t in timings), "tpot"))
    out.update(describe((x for t in timings for x in t["itl_ms"]), "itl"))
    out.update(describe((t["e2el_ms"] for t in timings), "e2el"))
    out.update(describe((x for t in timings for x in t["itl_per_token_ms"]), "itl_per_token"))
    return out
