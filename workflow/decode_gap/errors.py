"""One-line errors for users, and the guard that turns them into a clean exit."""

from __future__ import annotations

import functools
import sys
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class DecodeGapError(Exception):
    """An error whose message is one line a user can act on (names the file, field or endpoint)."""


class ConfigError(DecodeGapError):
    pass


def fail_cleanly(func: F) -> F:
    """Run a stage entry point; a DecodeGapError becomes one stderr line and exit code 1.

    The line is printed last so that a rule's log ends with the one-line reason.
    """

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except DecodeGapError as exc:
            print(f"decode-gap: error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None

    return wrapper  # type: ignore[return-value]
