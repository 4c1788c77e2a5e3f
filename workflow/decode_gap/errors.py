"""One-line errors for users (decode_gap.smk.run_script turns them into a clean exit of a rule)."""

from __future__ import annotations


class DecodeGapError(Exception):
    """An error whose message is one line a user can act on (names the file, field or endpoint)."""


class ConfigError(DecodeGapError):
    pass

