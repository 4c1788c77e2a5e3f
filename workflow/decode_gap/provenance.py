"""Every figure is measured, modelled, or unavailable (with the reason). Stage JSONs carry that label.

Schema of a labelled figure (used wherever a number reaches the report):
    {"value": float | None, "unit": str, "status": "measured" | "modelled" | "unavailable",
     "source": str (file, tool or formula), "why": str (only when unavailable)}
"""

from __future__ import annotations

import math
from typing import Any

MEASURED = "measured"
MODELLED = "modelled"
UNAVAILABLE = "unavailable"


def measured(value: float, unit: str, source: str) -> dict[str, Any]:
    return {"value": value, "unit": unit, "status": MEASURED, "source": source}


def modelled(value: float, unit: str, source: str) -> dict[str, Any]:
    return {"value": value, "unit": unit, "status": MODELLED, "source": source}


def unavailable(why: str, unit: str = "", source: str = "") -> dict[str, Any]:
    return {"value": None, "unit": unit, "status": UNAVAILABLE, "source": source, "why": why}


def skipped_stage(stage: str, why: str, **extra: Any) -> dict[str, Any]:
    """Summary written by a stage that cannot run on this host: it says so instead of faking a result."""
    return {"stage": stage, "status": "skipped", "reason": why, **extra}


def figure_value(fig: Any) -> float | None:
    """A finite number, or the value of a labelled figure {"value": ..} that is not unavailable; else None."""
    if isinstance(fig, dict):
        if fig.get("status") == UNAVAILABLE:
            return None
        fig = fig.get("value")
    if isinstance(fig, bool) or not isinstance(fig, (int, float)):
        return None
    return float(fig) if math.isfinite(fig) else None
