"""The simulation levels' timing in milliseconds, over the core clocks of `decode_gap.timing`.

On a GPU: CUDA events. Eager runs start from an idle GPU (synchronise first), so the elapsed time includes the
gaps in which the GPU waits for the CPU to launch the next kernel, which is what a server without CUDA graphs
pays. Graph runs replay one captured graph (`decode_gap.timing.capture_graph`). The L2 cache is flushed before
every timed iteration (`decode_gap.timing.L2Flusher`). On a CPU: wall time with time.perf_counter_ns (there is
no graph and no cache flush). The simulate result files give times in ms (`median_ms`, ...).
"""

from __future__ import annotations

from typing import Callable

from .. import timing as _core
from ..timing import L2Flusher  # noqa: F401 - re-exported for the simulation levels

US_TO_MS = 1e-3


def spread(samples_ms: list[float]) -> dict[str, float | int | None]:
    """n / min / median / mean / p99 / max of per-iteration samples in ms (numpy percentiles)."""
    return _core.spread(samples_ms, "ms")


def time_cpu(fn: Callable[[], object], warmup: int, iters: int,
             before: Callable[[], None] | None = None) -> list[float]:
    return [t * US_TO_MS for t in _core.time_cpu_us(fn, warmup, iters, before)]


def time_cuda(fn: Callable[[], object], warmup: int, iters: int, flush: Callable[[], None] | None,
              before: Callable[[], None] | None = None) -> list[float]:
    """GPU-timed iterations of fn (an eager step or a graph replay), each from an idle, L2-flushed GPU, in ms."""
    return [t * US_TO_MS for t in _core.time_from_idle_us(fn, warmup, iters, flush, before)]
