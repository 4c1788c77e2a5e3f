"""The `live` stage: warm-up, a concurrency sweep of streamed requests, and the stage outputs.

This module is the entry (`run_live`); `settings` holds LiveSettings, LiveOutputs and the scrubbing,
`sweep` sends the requests, `summary` builds the result from them. Their names used by callers are
re-exported here.

Flow: identity probe (GET only) -> model name -> tokenizer probe -> one 2-token probe request that settles
which optional request fields the server accepts -> warm-up requests -> for each concurrency level, N
requests with at most `concurrency` in flight (as `vllm bench serve --max-concurrency`) -> parse and count
tokens -> statistics -> loopback calibration of the client's own overhead (after the server is stopped).

Failure policy: every failed request is counted with a one-line reason. The stage fails only when no
measured request succeeded; it then writes `live/last_error.json` (a log of the rule, not an output, so it
survives the failed job) and raises `DecodeGapError` naming the endpoint. A failed run writes no output; earlier
good runs are kept in the report archive. The API key is read from the environment variable
named by `api_key_env`, sent only as `Authorization: Bearer`, and scrubbed from everything written.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any, Callable

from ..errors import ConfigError, DecodeGapError, REASON_CHARS, describe
from ..io import write_json, write_table
from ..provenance import skipped_stage
from . import tokens as tok
from .client import display_url
from .loopback import calibrate
from .server import EmbeddedServer, read_eval_log, read_log_errors
from .settings import (CHUNK_COLUMNS, REQUEST_COLUMNS, LiveOutputs, LiveSettings, Redactor, empty_chunks,
                       empty_requests, read_api_key)
from .sweep import _sweep
from .summary import _build, _match_server_eval

__all__ = ["CHUNK_COLUMNS", "REQUEST_COLUMNS", "LiveOutputs", "LiveSettings", "Redactor", "_match_server_eval",
           "run_live", "write_skipped"]


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
            summary["client_overhead_us"]["loopback"] = {"status": "unavailable", "why": describe(exc, REASON_CHARS)}
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
    # A declared log: Snakemake would leave an empty file behind, so a good run says there was no error.
    write_json(outputs.last_error, {"stage": "live", "status": "ok", "reason": None,
                                    "note": "the last run succeeded; a failed run writes its error summary here"})
    for lv in summary["levels"]:
        log(f"live: c={lv['concurrency']}: completed {lv['completed']}, failed {lv['failed']}, "
            f"median TTFT {_fmt(lv['median_ttft_ms'])} ms, median TPOT {_fmt(lv['median_tpot_ms'])} ms, "
            f"median ITL/token {_fmt(lv['median_itl_per_token_ms'])} ms, "
            f"output {_fmt(lv['output_throughput'])} tok/s")
    return summary


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"
