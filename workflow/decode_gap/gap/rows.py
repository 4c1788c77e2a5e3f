"""Waterfall rows and the number reader every gap module shares (kept here so the step modules need no cycle)."""

from __future__ import annotations

from typing import Any

from ..provenance import figure_value

STEP, START, TOTAL, RESIDUAL = "step", "start", "total", "residual"


def _num(value: Any) -> float | None:
    """A number, or the value of a labelled figure that is not unavailable (decode_gap.provenance.figure_value)."""
    return figure_value(value)


def _row(name: str, ms: float | None, source: str, status: str, kind: str = STEP, **extra: Any) -> dict[str, Any]:
    row = {"name": name, "ms": ms, "source": source, "status": status, "kind": kind}
    row.update({k: v for k, v in extra.items() if v is not None})
    return row


def _unavail(name: str, why: str, source: str) -> dict[str, Any]:
    return _row(name, None, source, "unavailable", why=why)
