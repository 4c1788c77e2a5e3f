"""Timing helpers shared by the simulation levels: per-iteration samples and their spread.

On a GPU: CUDA events. Eager runs start from an idle GPU (synchronise first), so the elapsed time includes the
gaps in which the GPU waits for the CPU to launch the next kernel, which is what a server without CUDA graphs
pays. Graph runs replay one captured graph. The L2 cache is flushed before every timed iteration.
On a CPU: wall time with time.perf_counter_ns (there is no graph and no cache flush).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np


def spread(samples_ms: list[float]) -> dict[str, float | int | None]:
    """min / median / mean / p99 / max of per-iteration samples (numpy percentiles)."""
    if not samples_ms:
        return {"n": 0, "min_ms": None, "median_ms": None, "mean_ms": None, "p99_ms": None, "max_ms": None}
    a = np.asarray(samples_ms, dtype=float)
    return {
        "n": int(a.size),
        "min_ms": float(a.min()),
        "median_ms": float(np.median(a)),
        "mean_ms": float(a.mean()),
        "p99_ms": float(np.percentile(a, 99)),
        "max_ms": float(a.max()),
    }


class L2Flusher:
    """Writes a buffer larger than the GPU's L2 so that weights do not stay cached between iterations."""

    def __init__(self, device) -> None:
        import torch

        size = 256 * 1024 * 1024
        try:
            props = torch.cuda.get_device_properties(device)
            size = max(size, 4 * int(getattr(props, "L2_cache_size", 0) or 0))
        except Exception:  # pragma: no cover - device without properties
            pass
        self.buf = torch.empty(size, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


def time_cpu(fn: Callable[[], object], warmup: int, iters: int,
             before: Callable[[], None] | None = None) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        if before is not None:
            before()
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def time_cuda(fn: Callable[[], object], warmup: int, iters: int, flush: Callable[[], None] | None,
              before: Callable[[], None] | None = None) -> list[float]:
    """GPU-timed iterations of fn (an eager step or a graph replay), each from an idle, L2-flushed GPU."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        if flush is not None:
            flush()
        if before is not None:
            before()
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(float(start.elapsed_time(end)))
    return out
