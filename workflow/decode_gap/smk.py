"""The one adapter every Snakemake script uses: log redirection and a one-line failure."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Any, Callable

from .errors import DecodeGapError, describe
from .timing import exclusive_measurement

ERROR_PREFIX = "decode-gap: error in rule "  # a failed script's last line, on the console and in its log


def run_script(snakemake: Any, body: Callable[[], Any], measures: bool = False) -> None:
    """Run `body` with stdout/stderr sent to the rule's log; on error the log (and the console) end with one line.
    measures: the rule times something, so `body` runs holding the host's measurement lock (timing.py); the
    rules that only read or merge files run at once.

    A DecodeGapError is a user-facing error: one line, no traceback. Anything else is a bug: the traceback
    goes to the log, then the same one-line summary.
    """
    console = os.fdopen(os.dup(2), "w")
    log_path = snakemake.log[0] if len(snakemake.log) else None
    if log_path:
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        log = open(log_path, "w", buffering=1)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)
        sys.stderr = os.fdopen(os.dup(2), "w", buffering=1)
    try:
        with exclusive_measurement(f"rule {snakemake.rule}") if measures else contextlib.nullcontext():
            body()
    except DecodeGapError as exc:
        line = f"{ERROR_PREFIX}{snakemake.rule}: {exc}"
    except Exception as exc:  # a bug: keep the traceback in the log
        traceback.print_exc()
        line = f"{ERROR_PREFIX}{snakemake.rule}: {describe(exc, 300)}"
    else:
        return
    print(line, file=sys.stderr, flush=True)
    print(line, file=console, flush=True)
    raise SystemExit(1)


def failed_job_lines(log_dirs: list[str | os.PathLike], since: float) -> list[str]:
    """The one-line errors that scripts of this run ended their logs with (run_script), one a failed job: for the
    Snakefile's `onerror`, so that the last lines a user reads name what failed after Snakemake's own traceback. Logs
    older than `since` (an earlier run's) are left out."""
    from pathlib import Path

    lines = []
    for folder in log_dirs:
        for log in sorted(Path(folder).glob("*.log")) if Path(folder).is_dir() else []:
            try:
                if log.stat().st_mtime < since:
                    continue
                text = log.read_text(encoding="utf-8", errors="replace").rstrip().splitlines()
            except OSError:
                continue
            if text and text[-1].startswith(ERROR_PREFIX):
                lines.append(text[-1])
    return lines
