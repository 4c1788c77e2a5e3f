"""The timing harness every micro-benchmark shares.

Three clocks, each named in the results so a figure says what it is:

- ``graph-replay``: GPU time. The work is captured ``reps`` times in one CUDA graph (each copy on its own
  rotating buffers, so weights are not served from L2) and the graph is replayed; CUDA events around each
  replay, divided by ``reps``. No CPU launch gaps, no L2 reuse.
- ``events-l2flush``: GPU time when capture fails: L2 flushed (a write over a buffer larger than L2), then
  CUDA events around one call, as ``triton.testing.do_bench`` does. The flush also keeps the queue busy, so
  the start event does not time the CPU launch.
- ``eager`` (``perf_counter``): what a server without graphs pays. ``eager_us`` is one isolated call,
  launch to completion (``fn(); synchronize()``); ``eager_loop_us`` is the wall time per call of a
  back-to-back loop of calls (CPU launch-bound when kernels are short). On a CPU host ``eager`` is the only clock
  (``cpu-perf_counter-llcflush``: a write over 4x the last-level cache before each call, as the GPU's L2 flush).

Every clock warms up first and returns min / median / p99 (numpy percentiles) over its samples.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, asdict
from typing import Any, Callable, Sequence


try:  # torch is a hard dependency of the stage, but keep the arithmetic importable without it
    import torch
except ImportError:  # pragma: no cover
    torch = None  # type: ignore[assignment]

from .. import timing as _core
from ..errors import describe
from ..timing import (ClockWatch, CpuCacheFlusher, L2Flusher, is_cuda, l2_bytes,  # noqa: F401 - shared with the core
                      percentiles)

GRAPH = "graph-replay"
MIN_GRAPH_CALLS = 16
EVENTS = "events-l2flush"
CPU_WALL = "cpu-perf_counter-llcflush"  # wall time, the CPU's caches flushed before each call


@dataclass(frozen=True)
class Stats:
    """Spread of one timing in microseconds."""

    min_us: float
    median_us: float
    p99_us: float
    mean_us: float
    n: int

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


def stats_us(samples_us: Sequence[float]) -> Stats:
    p = percentiles(samples_us)
    if not p["n"]:
        raise ValueError("no timing samples")
    return Stats(min_us=p["min"], median_us=p["median"], p99_us=p["p99"], mean_us=p["mean"], n=p["n"])


# --------------------------------------------------------------------------- arithmetic


def gbps(nbytes: float, time_us: float | None) -> float | None:
    """Achieved bandwidth in GB/s (1e9 bytes per second), as nccl-tests and vendors count it."""
    if not time_us or time_us <= 0 or not math.isfinite(time_us):
        return None
    return nbytes / (time_us * 1e-6) / 1e9


def tflops(flops: float, time_us: float | None) -> float | None:
    if not time_us or time_us <= 0 or not math.isfinite(time_us):
        return None
    return flops / (time_us * 1e-6) / 1e12


def fraction(value: float | None, ceiling: float | None) -> float | None:
    if value is None or not ceiling or ceiling <= 0:
        return None
    return value / ceiling


# --------------------------------------------------------------------------- devices


def synchronize(device: Any) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def rotating_copies(working_set_bytes: int, device: Any, max_copies: int = 64, max_total_bytes: int = 8 * 2**30) -> int:
    """How many copies of a working set make a rotation larger than twice the L2 (at least 2 on a GPU, so a
    call never follows itself; 1 on a CPU host)."""
    l2 = l2_bytes(device)
    if l2 <= 0 or working_set_bytes <= 0:
        return 1
    want = max(2, math.ceil(2 * l2 / working_set_bytes))
    cap = max(1, max_total_bytes // max(working_set_bytes, 1))
    return int(max(1, min(want, max_copies, cap)))


# --------------------------------------------------------------------------- clocks


def time_cpu(fn: Callable[[], Any], warmup: int, iters: int, budget_s: float | None = None, device: Any = "cpu",
             before: Callable[[], Any] | None = None) -> Stats:
    """Wall time of one isolated call (perf_counter; synchronised on a GPU), `before` (a cache flush) run ahead of
    each timed call, outside its time. With `budget_s`, fewer iterations are run when one call is slow (at least 3),
    so a CPU host finishes in reasonable time."""
    t_warm = time.perf_counter()
    slow = False
    for i in range(max(warmup, 0)):
        fn()
        synchronize(device)
        if budget_s is not None and time.perf_counter() - t_warm > budget_s / 2:
            # one slow call is warm-up enough; a call longer than twice the budget is timed once
            slow = (time.perf_counter() - t_warm) / (i + 1) > 2 * budget_s
            break
    n = 1 if slow else max(iters, 1)
    samples: list[float] = []
    start_all = time.perf_counter()
    for i in range(n):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        samples.append((time.perf_counter() - t0) * 1e6)
        if budget_s is not None and i >= 2 and time.perf_counter() - start_all > budget_s:
            break
    return stats_us(samples)


def time_eager_loop(fn: Callable[[], Any], warmup: int, iters: int, inner: int, device: Any) -> Stats:
    """Wall time per call of `inner` back-to-back calls followed by one synchronise."""
    for _ in range(max(warmup, 1)):
        fn()
    synchronize(device)
    samples = []
    for _ in range(max(iters, 1)):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        synchronize(device)
        samples.append((time.perf_counter() - t0) * 1e6 / inner)
    return stats_us(samples)


def time_events(fn: Callable[[], Any], warmup: int, iters: int, device: Any, flush: L2Flusher | None = None) -> Stats:
    """GPU time of one call with CUDA events; the L2 is flushed before each call when `flush` is given."""
    for _ in range(max(warmup, 1)):
        fn()
    torch.cuda.synchronize(device)
    return stats_us(_core.back_to_back_us(fn, max(iters, 1), device, before_each=flush))


def capture_graph(fns: Sequence[Callable[[], Any]], device: Any, warmup: int = 2) -> "torch.cuda.CUDAGraph":
    """Capture the calls `fns` (in order) in one CUDA graph, after warming them up on a side stream."""
    return _core.capture_graph(fns, device, max(warmup, 1))


def time_graph(fns: Sequence[Callable[[], Any]], warmup: int, iters: int, device: Any,
               graph: "torch.cuda.CUDAGraph | None" = None, min_calls: int = MIN_GRAPH_CALLS) -> Stats:
    """GPU time per call: the calls `fns` captured in one graph (cycled to at least `MIN_GRAPH_CALLS`
    calls, so the replay's own launch cost is spread thin); events around each replay / calls."""
    fns = list(fns) * max(1, math.ceil(min_calls / len(fns)))
    g = graph or capture_graph(fns, device)
    for _ in range(max(warmup, 1)):
        g.replay()
    torch.cuda.synchronize(device)
    per = len(fns)
    return stats_us([t / per for t in _core.back_to_back_us(g.replay, max(iters, 1), device)])


@dataclass
class Timing:
    """GPU time (graph replay or events) and eager time of one case; `gpu` is None on a CPU host."""

    gpu: Stats | None
    gpu_method: str | None
    eager: Stats
    eager_loop: Stats | None
    note: str = ""

    @property
    def device_us(self) -> float:
        """The time that bandwidth and FLOP rates are computed from: GPU time, or wall time on a CPU host."""
        return self.gpu.median_us if self.gpu is not None else self.eager.median_us

    @property
    def method(self) -> str:
        return self.gpu_method or CPU_WALL

    def columns(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gpu_us": self.gpu.median_us if self.gpu else None,
            "gpu_min_us": self.gpu.min_us if self.gpu else None,
            "gpu_p99_us": self.gpu.p99_us if self.gpu else None,
            "eager_us": self.eager.median_us,
            "eager_min_us": self.eager.min_us,
            "eager_p99_us": self.eager.p99_us,
            "eager_loop_us": self.eager_loop.median_us if self.eager_loop else None,
            "timing": self.method,
            "iters": self.gpu.n if self.gpu else self.eager.n,
        }
        return out


def measure(
    fns: Sequence[Callable[[], Any]],
    device: Any,
    warmup: int,
    iters: int,
    flush: Callable[[], Any] | None = None,
    cpu_budget_s: float | None = None,
    graphs: bool = True,
    loop_inner: int | None = None,
    min_graph_calls: int = MIN_GRAPH_CALLS,
) -> Timing:
    """Time one case. `fns` are equivalent calls on rotating buffers (one is enough on a CPU host).

    GPU: graph replay over all of `fns` (events with an L2 flush if capture fails), the isolated eager call
    and a back-to-back eager loop over `fns`. CPU: the isolated call's wall time only, after `flush` (a
    CpuCacheFlusher) each time.
    """
    if not fns:
        raise ValueError("measure() needs at least one callable")
    if not is_cuda(device):
        return Timing(gpu=None, gpu_method=None, eager=time_cpu(fns[0], warmup, iters, cpu_budget_s, before=flush),
                      eager_loop=None)

    note = ""
    gpu = None
    method = None
    if graphs:
        try:
            gpu = time_graph(fns, warmup, iters, device, min_calls=min_graph_calls)
            method = GRAPH
        except Exception as exc:  # capture unsupported for this op: fall back to events, and say why
            note = f"graph capture failed ({describe(exc)}); events used"
            torch.cuda.synchronize(device)
    if gpu is None:
        gpu = time_events(fns[0], warmup, iters, device, flush)
        method = EVENTS

    # Eager, isolated: rotate over the buffers too, so an eager call is not served from L2 either.
    idx = [0]

    def rotate() -> None:
        fns[idx[0] % len(fns)]()
        idx[0] += 1

    eager = time_cpu(rotate, warmup, iters, device=device)
    inner = loop_inner or max(len(fns), 10)
    loop = time_eager_loop(rotate, warmup, max(3, iters // 5), inner, device)
    return Timing(gpu=gpu, gpu_method=method, eager=eager, eager_loop=loop, note=note)
