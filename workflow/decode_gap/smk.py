"""The one adapter every Snakemake script uses: log redirection and a one-line failure."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Any, Callable

from .errors import DecodeGapError
from .timing import exclusive_measurement


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
        line = f"decode-gap: error in rule {snakemake.rule}: {exc}"
    except Exception as exc:  # a bug: keep the traceback in the log
        traceback.print_exc()
        line = f"decode-gap: error in rule {snakemake.rule}: {type(exc).__name__}: {exc}".splitlines()[0]
    else:
        return
    print(line, file=sys.stderr, flush=True)
    print(line, file=console, flush=True)
    raise SystemExit(1)
