"""One-line errors for users (decode_gap.smk.run_script turns them into a clean exit of a rule)."""

from __future__ import annotations

from .secrets import scrub_credentials


class DecodeGapError(Exception):
    """An error whose message is one line a user can act on (names the file, field or endpoint)."""


class ConfigError(DecodeGapError):
    pass



def describe(exc: BaseException, limit: int = 160, *, with_type: bool = True) -> str:
    """`ExcType: first line of its message` (the type alone where the message is empty; without the type where
    `with_type` is false), the line cut to `limit` characters and its credential-looking parts redacted (an exception
    can quote a URL or a header): how a caught exception lands in a result or an error line."""
    lines = str(exc).strip().splitlines()
    first = scrub_credentials(lines[0])[:limit] if lines else ""
    if not first:
        return type(exc).__name__
    return f"{type(exc).__name__}: {first}" if with_type else first
