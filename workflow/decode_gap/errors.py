"""One-line errors for users (decode_gap.smk.run_script turns them into a clean exit of a rule)."""

from __future__ import annotations

import re

from .secrets import scrub_credentials

TRITON_POSITION = re.compile(r"at \d+:\d+:")
# a skip or failure reason kept in a result file: room for the exception's type and its cause, short enough for a
# table cell of the report
REASON_CHARS = 200


class DecodeGapError(Exception):
    """An error whose message is one line a user can act on (names the file, field or endpoint)."""


class ConfigError(DecodeGapError):
    pass


def describe(exc: BaseException, limit: int = 160, *, with_type: bool = True) -> str:
    """`ExcType: first line of its message` (the type alone where the message is empty; without the type where
    `with_type` is false), the line cut to `limit` characters and its credential-looking parts redacted (an exception
    can quote a URL or a header): how a caught exception lands in a result or an error line. Triton's compile
    errors open with the source position alone ("at 53:27:"), so the cause, their last line, follows it."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if TRITON_POSITION.fullmatch(first) and len(lines) > 1:
        first = f"{first} {lines[-1]}"
    first = scrub_credentials(first)[:limit]
    if not first:
        return type(exc).__name__
    return f"{type(exc).__name__}: {first}" if with_type else first
