"""Metric names that more than one reader of the stage files interprets (core: the gap and the report).

The live stage writes vLLM `bench serve`'s statistics per concurrency level; which of them stands for "the live
inter-token latency" is decided here, once, so the gap's waterfall and the report's headline cannot disagree.
"""

from __future__ import annotations

from typing import Any, Callable

# Per-token ITL first (a chunk may carry several tokens), then the chunk ITL, then TPOT.
LIVE_ITL_FIELDS = ("median_itl_per_token_ms", "mean_itl_per_token_ms", "median_itl_ms", "median_tpot_ms")


def live_itl(level: dict[str, Any], number: Callable[[Any], float | None]) -> tuple[float | None, str]:
    """The live ITL of one level of live/summary.json and the field it came from ('' when none has a value)."""
    for key in LIVE_ITL_FIELDS:
        value = number(level.get(key))
        if value is not None:
            return value, key
    return None, ""


def floor_bound_fraction(nbytes: float | None, gbps: float | None, floor_us: float | None) -> float | None:
    """The most of `gbps` that one call moving `nbytes` can show when it also pays the measured per-kernel latency
    floor once (latency plus bytes over bandwidth, the alpha-beta model): a modelled bound that tells a small
    kernel's latency from a slow kernel (issue 14); None when a figure is missing."""
    if not nbytes or not gbps or floor_us is None or floor_us < 0:
        return None
    transfer_us = nbytes / gbps / 1e3
    return transfer_us / (transfer_us + floor_us)
