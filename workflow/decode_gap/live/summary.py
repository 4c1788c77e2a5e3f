"""The live summary from the sweep: per-level statistics, error counts, the embedded server's own eval time."""

from __future__ import annotations

import datetime as _dt
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from ..host import cpu_model
from ..provenance import measured, unavailable
from . import tokens as tok
from .client import display_url
from .identity import detect_engine
from .prometheus import compare_with_client
from .metrics import describe, level_summary, request_timing
from .settings import CHUNK_COLUMNS, LiveSettings, REQUEST_COLUMNS, empty_chunks, empty_requests


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
