"""The live section: the concurrency sweep, ITL histogram and timeline from live/*.json and parquet files."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ...provenance import MEASURED
from .. import charts as ch
from ..data import Bundle, Fig, fig_field, find_col, first_key, fmt_bytes, fmt_num, live_levels, num
from ...secrets import redact_url
from .common import Builder, _short


LIVE_STATS = ("mean", "median", "std", "p90", "p99", "min", "max")
LIVE_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL (per chunk)"), ("itl_per_token", "ITL per token"),
                ("e2el", "E2E latency"))


def chunk_itls(chunks: pd.DataFrame, concurrency: float | None) -> tuple[pd.DataFrame | None, str]:
    """Per-chunk gaps (with their token counts) from the chunk records of one concurrency level."""
    rid = find_col(chunks, "request_id", "request", "req_id", "rid", "request_index", "id")
    if rid is None:
        return None, "chunks.parquet has no request id column"
    tcol, scale = None, 1.0
    for names, sc in ((("t_ms", "arrival_ms", "time_ms", "t_rel_ms", "since_start_ms", "ms"), 1.0),
                      (("t_ns", "arrival_ns", "time_ns", "perf_counter_ns", "timestamp_ns", "ns"), 1e-6),
                      (("t_us", "arrival_us", "time_us"), 1e-3),
                      (("t_s", "arrival_s", "time_s", "t", "timestamp"), 1e3)):
        tcol = find_col(chunks, *names)
        if tcol:
            scale = sc
            break
    tok = find_col(chunks, "tokens", "n_tokens", "token_count", "num_tokens", "output_tokens")
    df = chunks
    warm = find_col(df, "warmup", "is_warmup")
    if warm:
        df = df[~df[warm].astype(bool)]
    conc = find_col(df, "concurrency", "level")
    if conc and concurrency is not None:
        df = df[pd.to_numeric(df[conc], errors="coerce") == concurrency]
    if len(df) == 0:
        return None, f"no chunk records at concurrency {fmt_num(concurrency)}"
    if tcol is None:
        gapc = find_col(df, "itl_ms", "gap_ms", "delta_ms")
        if gapc is None:
            return None, "chunks.parquet has no arrival time column"
        out = pd.DataFrame({"request": df[rid], "gap_ms": pd.to_numeric(df[gapc], errors="coerce"),
                            "tokens": pd.to_numeric(df[tok], errors="coerce") if tok else 1.0,
                            "t_ms": np.nan})
        return out.dropna(subset=["gap_ms"]), ""
    df = df.assign(_t=pd.to_numeric(df[tcol], errors="coerce") * scale,
                   _n=pd.to_numeric(df[tok], errors="coerce").fillna(1) if tok else 1.0)
    idx = find_col(df, "chunk_index", "index", "seq", "chunk")
    df = df.sort_values([rid, idx] if idx else [rid, "_t"])
    df["gap_ms"] = df.groupby(rid)["_t"].diff()
    return pd.DataFrame({"request": df[rid], "gap_ms": df["gap_ms"], "tokens": df["_n"], "t_ms": df["_t"]}), ""


def itl_hist_frame(gaps: pd.DataFrame, bins: int = 40) -> pd.DataFrame:
    g = gaps.dropna(subset=["gap_ms"])
    g = g[g["tokens"] > 0]
    per_chunk = g["gap_ms"].to_numpy(dtype=float)
    per_token = np.repeat((g["gap_ms"] / g["tokens"]).to_numpy(dtype=float), g["tokens"].astype(int).clip(lower=1))
    if per_chunk.size == 0:
        return pd.DataFrame()
    hi = float(np.percentile(np.concatenate([per_chunk, per_token]), 99.5))
    lo = float(min(per_chunk.min(), per_token.min()))
    if hi <= lo:
        hi = lo + 1.0
    edges = np.linspace(lo, hi, bins + 1)
    rows = []
    for view, arr in (("per chunk", per_chunk), ("per token", per_token)):
        counts, _ = np.histogram(np.clip(arr, lo, hi), bins=edges)
        rows += [{"view": view, "bin_start": float(a), "bin_end": float(c), "count": int(n)}
                 for a, c, n in zip(edges[:-1], edges[1:], counts)]
    return pd.DataFrame(rows)


def _request_ttft(requests: pd.DataFrame | None, request: Any) -> float | None:
    if requests is None or len(requests) == 0:
        return None
    rid = find_col(requests, "request_id", "request", "req_id", "rid", "request_index", "id")
    col = find_col(requests, "ttft_ms")
    if rid is None or col is None:
        return None
    hit = requests[requests[rid].astype(str) == str(request)]
    return num(hit[col].iloc[0]) if len(hit) else None


def timeline_frame(chunks: pd.DataFrame, requests: pd.DataFrame | None, concurrency: float | None
                   ) -> tuple[pd.DataFrame | None, str, str]:
    gaps, why = chunk_itls(chunks, concurrency)
    if gaps is None:
        return None, why, ""
    if gaps["t_ms"].isna().all():
        return None, "chunks.parquet has no arrival times", ""
    # the request with the median end-to-end time
    last = gaps.groupby("request")["t_ms"].max().dropna()
    if last.empty:
        return None, "no complete request", ""
    chosen = last.sort_values().index[len(last) // 2]
    one = gaps[gaps["request"] == chosen].sort_values("t_ms")
    rows, token = [], 0
    first_t = one["t_ms"].iloc[0]
    ttft = _request_ttft(requests, chosen)
    if ttft is None:
        # chunk times relative to the request start give the TTFT directly; absolute clocks do not
        ttft = float(first_t) if 0 <= first_t < 600_000 else 0.0
    for i, (_, r) in enumerate(one.iterrows()):
        n = int(max(1, r["tokens"] if not pd.isna(r["tokens"]) else 1))
        if i == 0:
            rows.append({"token": 1, "ms": ttft, "chunk": 0, "chunk_tokens": n, "t_ms": r["t_ms"],
                         "kind": "first token (TTFT)"})
            token = 1
            for extra in range(1, n):
                token += 1
                rows.append({"token": token, "ms": 0.0, "chunk": 0, "chunk_tokens": n, "t_ms": r["t_ms"],
                             "kind": "first token (TTFT)"})
            continue
        per = r["gap_ms"] / n
        for _ in range(n):
            token += 1
            rows.append({"token": token, "ms": per, "chunk": i, "chunk_tokens": n, "t_ms": r["t_ms"],
                         "kind": "multi-token chunk" if n > 1 else "1-token chunk"})
    return pd.DataFrame(rows), "", str(chosen)


def _server_value(key: str, v: Any) -> str:
    """A server identity field as a reader wants it: sizes in bytes, seconds rounded, lists and headers as text."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)) and key.endswith("_bytes"):
        return fmt_bytes(v)
    if isinstance(v, (int, float)) and key.endswith("_s"):
        return f"{fmt_num(v)} s"
    if isinstance(v, float):
        return fmt_num(v)
    if isinstance(v, list) and all(isinstance(x, (str, int, float)) for x in v):
        return _short(", ".join(str(x) for x in v), 200)
    if isinstance(v, dict) and all(isinstance(x, (str, int, float)) for x in v.values()):
        return _short("; ".join(f"{k}: {x}" for k, x in v.items()), 200)
    return _short(v, 200)


def live_section(b: Builder, bundle: Bundle) -> dict[str, Any]:
    doc = bundle.doc("live")
    s: dict[str, Any] = {"id": "live", "title": "Live streaming measurement", "ok": doc.usable, "why": doc.why,
                         "device": doc.device, "rel": doc.rel}
    if doc.state == "skipped" and doc.data:
        s["errors"] = _errors(doc.data)
    if not doc.usable:
        return s
    d = doc.data or {}
    server = d.get("server")
    if isinstance(server, dict):
        s["server"] = [(str(k).replace("_", " "), _server_value(str(k), v)) for k, v in server.items()
                       if v not in (None, "", {}, [])]
    elif server:
        s["server"] = [("identity", _short(server, 200))]
    else:
        s["server"] = []
    setup = []
    for key in ("endpoint", "api", "model", "engine", "engine_version", "token_count_method", "backend"):
        v = d.get(key)
        if v:
            setup.append((key, redact_url(str(v)) if key == "endpoint" else _short(v, 160)))
    s["setup"] = setup
    co = d.get("client_overhead_us")
    if isinstance(co, dict) and "status" not in co and num(first_key(co, "median", "mean")) is not None:
        f = Fig(num(first_key(co, "median", "mean")), "µs", MEASURED,
                f"{doc.rel}: client_overhead_us.median" + (f" (p99 {fmt_num(num(co.get('p99')))} µs)"
                                                          if num(co.get("p99")) is not None else ""))
    else:
        f = fig_field(doc, "client_overhead_us", "µs", MEASURED)
    s["client_overhead"] = b.fig("Client overhead per chunk", f)
    levels = live_levels(doc)
    if not levels:
        s["ok"], s["why"] = False, f"{doc.rel} has no concurrency levels"
        s["errors"] = _errors(d)
        return s
    rows = []
    for lv in levels:
        def g(k: str) -> str:
            return fmt_num(num(lv.get(k)))
        rows.append({"c": fmt_num(num(lv.get("concurrency"))), "completed": g("completed"), "failed": g("failed"),
                     "ttft_med": g("median_ttft_ms"), "ttft_p99": g("p99_ttft_ms"), "tpot_med": g("median_tpot_ms"),
                     "itl_med": g("median_itl_ms"), "itl_p99": g("p99_itl_ms"),
                     "itlt_med": g("median_itl_per_token_ms"), "itlt_p99": g("p99_itl_per_token_ms"),
                     "e2el_med": g("median_e2el_ms"), "otput": g("output_throughput"), "rtput": g("request_throughput"),
                     "failed_n": num(lv.get("failed")) or 0})
    s["rows"] = rows
    # TTFT and E2E latency have one sample a request: with few requests their p99 is their max, not a tail
    fewest = min((int(num(lv.get("completed")) or 0) for lv in levels), default=0)
    s["thin_tail"] = (f"TTFT and E2E latency have one sample a request: at {fewest} requests a level their p99 is "
                      "about their max, not a tail (raise live.num_requests for one; ITL and TPOT have a sample a "
                      "token)" if 0 < fewest < THIN_TAIL else "")
    # per-token figures not counted per chunk (issue 17): the basis beside every per-token figure
    basis = d.get("itl_per_token_basis")
    s["itl_note"] = (f"{basis}: {d.get('itl_per_token_note')}" if basis and basis != "exact" and
                     d.get("itl_per_token_note") else "")
    side = (levels[0].get("server_side") or {}).get("metrics") if isinstance(levels[0].get("server_side"), dict) else None
    vs = (side or {}).get("vs_client") or {}
    if num(vs.get("server_ms")) is not None:
        s["server_side"] = (f"{fmt_num(num(vs['server_ms']))} ms ({vs.get('server_metric')}) against the client's "
                            f"{fmt_num(num(vs.get('client_ms')))} ms: streaming path "
                            f"{fmt_num(num(vs.get('streaming_path_ms')))} ms (concurrency {fmt_num(num(levels[0].get('concurrency')))})")
    elif isinstance(side, dict) and side.get("why"):
        s["server_side"] = f"unavailable: {_short(side['why'], 160)}"
    if num(levels[0].get("median_server_eval_ms_per_token")) is not None:
        s["server_eval"] = (f"{fmt_num(num(levels[0]['median_server_eval_ms_per_token']))} ms median, from the embedded "
                            "server's own log (llama_perf_context)")
    details = []
    for lv in levels:
        table = []
        for key, label in LIVE_METRICS:
            vals = [fmt_num(num(lv.get(f"{st}_{key}_ms"))) for st in LIVE_STATS]
            if any(v != "—" for v in vals):
                table.append({"metric": label, "vals": vals})
        details.append({"c": fmt_num(num(lv.get("concurrency"))), "table": table,
                        "completed": fmt_num(num(lv.get("completed"))), "failed": fmt_num(num(lv.get("failed")))})
    s["details"] = details
    s["stats"] = LIVE_STATS
    tdf = pd.DataFrame([{"concurrency": num(lv.get("concurrency")), "output_throughput": num(lv.get("output_throughput")),
                         "itl": num(first_key(lv, "median_itl_per_token_ms", "median_tpot_ms", "median_itl_ms"))}
                        for lv in levels]).dropna(subset=["concurrency", "output_throughput"])
    if len(tdf) >= 1:
        s["throughput_chart"] = b.chart("Output throughput against concurrency", ch.throughput, tdf,
                                        caption=f"measured · {doc.rel}: levels[].output_throughput, "
                                                "median_itl_per_token_ms")
    else:
        s["throughput_why"] = "no level reports output_throughput"
    s["concurrency_reading"] = concurrency_reading(levels)
    lowest = num(levels[0].get("concurrency"))
    s["lowest"] = fmt_num(lowest)
    chunks = bundle.table("live_chunks")
    if chunks.usable:
        gaps, why = chunk_itls(chunks.df, lowest)
        if gaps is not None and len(gaps.dropna(subset=["gap_ms"])):
            s["hist_chart"] = b.chart(f"Inter-token latency at concurrency {fmt_num(lowest)}: per chunk and per token",
                                      ch.itl_histogram, itl_hist_frame(gaps),
                                      caption=f"measured · {chunks.rel}; per token spreads a multi-token chunk's gap "
                                              "over its tokens; values above p99.5 are drawn in the last bin")
        else:
            s["hist_why"] = why or "no inter-chunk gaps"
        tl, why, chosen = timeline_frame(chunks.df, bundle.table("live_requests").df, lowest)
        if tl is not None and len(tl):
            s["timeline_chart"] = b.chart(f"One request, token by token (request {chosen}, median E2E at "
                                          f"concurrency {fmt_num(lowest)})", ch.request_timeline, tl,
                                          caption=f"measured · {chunks.rel} · token 1 is the TTFT; a multi-token chunk's gap is spread over its tokens")
        else:
            s["timeline_why"] = why
    else:
        s["hist_why"] = s["timeline_why"] = chunks.why
    s["errors"] = _errors(d)
    return s


THIN_TAIL = 100  # requests a level below which a per-request p99 is read as the max

# below this share of linear scaling, with the TTFT grown QUEUED_TTFT-fold and the ITL flat, the server is read as
# decoding concurrent requests one after another (a queue), not together (a batch)
BATCHED_SHARE = 0.35
QUEUED_TTFT = 2.0
FLAT_ITL = 1.5


def concurrency_reading(levels: list[dict[str, Any]]) -> str:
    """What the sweep says about the server's batching, from the lowest and the highest concurrency's measured
    output throughput, median TTFT and median ITL per token: requests queued and decoded one at a time (throughput
    flat, TTFT grown, ITL flat), or batched (the throughput's share of linear scaling and what the ITL paid)."""
    rows = [lv for lv in levels if num(lv.get("concurrency")) and num(lv.get("output_throughput"))]
    if len(rows) < 2:
        return ""
    lo, hi = rows[0], rows[-1]
    c0, c1 = num(lo["concurrency"]), num(hi["concurrency"])
    if c1 <= c0:
        return ""
    scale, ideal = num(hi["output_throughput"]) / num(lo["output_throughput"]), c1 / c0
    share = (scale - 1) / (ideal - 1)
    itl0, itl1 = (num(first_key(lv, "median_itl_per_token_ms", "median_tpot_ms")) for lv in (lo, hi))
    ttft0, ttft1 = num(lo.get("median_ttft_ms")), num(hi.get("median_ttft_ms"))
    head = (f"Concurrency {fmt_num(c0)} \u2192 {fmt_num(c1)} (derived from the measured levels): output throughput "
            f"\u00d7{scale:.2f} (\u00d7{ideal:g} if every request decoded at the single-stream pace)")
    itl = f"median ITL per token {fmt_num(itl0)} \u2192 {fmt_num(itl1)} ms" if itl0 and itl1 else ""
    if share < BATCHED_SHARE and ttft0 and ttft1 and ttft1 >= QUEUED_TTFT * ttft0 and itl0 and itl1 \
            and itl1 <= FLAT_ITL * itl0:
        return (f"{head}, median TTFT {fmt_num(ttft0)} \u2192 {fmt_num(ttft1)} ms, {itl}. The server decodes "
                "concurrent requests one after another, not together: they wait in its queue (the TTFT grows) and "
                "then decode at the single-stream pace (the ITL stays). A server that batches them (continuous "
                "batching: vLLM, SGLang, TGI; llama.cpp's llama-server with --parallel) turns concurrency into "
                "throughput instead.")
    return f"{head}: {share:.0%} of linear scaling" + (f"; {itl}, the price of the batch." if itl else ".")


def _errors(d: dict[str, Any]) -> list[dict[str, str]]:
    errs = d.get("errors") or []
    out = []
    if isinstance(errs, dict):
        errs = [{"reason": k, "count": v} for k, v in errs.items()]
    for e in errs if isinstance(errs, list) else []:
        if isinstance(e, dict):
            out.append({"reason": _short(first_key(e, "reason", "error", "message") or e, 300),
                        "count": fmt_num(num(e.get("count")) or 1)})
        else:
            out.append({"reason": _short(e, 300), "count": "1"})
    return out
