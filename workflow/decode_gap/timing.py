"""Timing shared by every stage that times work: one L2 flusher, one CUDA-graph capture, one spread.

Unit convention: the clocks here return samples in **microseconds** (float). A decode kernel takes a few µs
to a few ms and a launch about 5 µs, so µs keeps every figure readable without tiny fractions, and it is
the unit of nccl-tests and of the micro-benchmark contract. A result file names its unit in every field's
suffix (`time_us`, `median_ms`, ...); a stage that writes milliseconds converts once, where it builds the
result (`spread(samples_us, unit="ms")`), so the field names and units of the result files do not change.

Clocks:
- `time_cpu_us`: wall time (time.perf_counter_ns) of each call, with an optional `before` hook outside the
  timed region; on a GPU the caller synchronises inside `fn` or uses `time_from_idle_us`.
- `time_from_idle_us`: CUDA events around one call that starts from an idle GPU (synchronise first), after
  an optional L2 flush, so the time includes the gaps in which the GPU waits for the CPU to launch kernels
  (what a server without CUDA graphs pays).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from filelock import FileLock, Timeout

# At least 256 MiB, as triton.testing.do_bench flushes; 4x L2 so that a GPU with a larger L2 is flushed too.
FLUSH_MIN_BYTES = 256 * 2**20
FLUSH_L2_FACTOR = 4

SPREAD_KEYS = ("min", "median", "mean", "p99", "max")


def percentiles(samples: Sequence[float]) -> dict[str, float | int | None]:
    """n, min, median, mean, p99 and max of samples (numpy percentiles); None values for no samples."""
    a = np.asarray(list(samples), dtype=np.float64)
    if a.size == 0:
        return {"n": 0, **{k: None for k in SPREAD_KEYS}}
    return {
        "n": int(a.size),
        "min": float(a.min()),
        "median": float(np.percentile(a, 50)),
        "mean": float(a.mean()),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


def spread(samples: Sequence[float], unit: str, scale: float = 1.0) -> dict[str, float | int | None]:
    """`percentiles` of samples * scale with the unit in every key: {"n", "min_<unit>", "median_<unit>", ...}."""
    p = percentiles([s * scale for s in samples] if scale != 1.0 else samples)
    return {"n": p["n"], **{f"{k}_{unit}": p[k] for k in SPREAD_KEYS}}


# --------------------------------------------------------------------------- devices


def _torch():
    import torch  # lazy: the arithmetic above must import without torch

    return torch


def is_cuda(device: Any) -> bool:
    try:
        torch = _torch()
    except ImportError:  # pragma: no cover
        return False
    return torch.device(device).type == "cuda"


def l2_bytes(device: Any) -> int:
    """The GPU's L2 cache size (50 MiB when the driver does not say); 0 for a CPU device."""
    if not is_cuda(device):
        return 0
    props = _torch().cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)


class L2Flusher:
    """Writes a buffer larger than the L2 cache, so that weights do not stay cached between timed calls.
    On a CPU device it does nothing (the simulation's levels time whole layers; the micro-benchmarks flush a CPU's
    caches with CpuCacheFlusher)."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.buf = None
        if is_cuda(device):
            size = max(FLUSH_MIN_BYTES, FLUSH_L2_FACTOR * l2_bytes(device))
            self.buf = _torch().empty(size, dtype=_torch().uint8, device=device)

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf.zero_()


def llc_bytes() -> int | None:
    """The CPU's last-level cache, from sysfs (the highest cache level cpu0 lists); None where it does not say.
    Read by hand: psutil and the standard library do not report cache sizes (os.sysconf's SC_LEVEL3_CACHE_SIZE is
    missing from many builds)."""
    best: tuple[int, int] | None = None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        digits = size.rstrip("KMG")
        if digits.isdigit() and (best is None or level > best[0]):
            best = (level, int(digits) * scale)
    return best[1] if best else None


class CpuCacheFlusher:
    """The CPU's L2Flusher: writes a buffer 4x the last-level cache (64 MiB at least; FLUSH_MIN_BYTES where the
    cache size is unknown) between timed calls, so a CPU host's small weights are read from memory, as a decode
    step's are (its layers together outgrow the cache), not from the cache a repeated call leaves them in."""

    def __init__(self) -> None:
        llc = llc_bytes()
        self.nbytes = max(64 * 2**20, FLUSH_L2_FACTOR * llc) if llc else FLUSH_MIN_BYTES
        self.buf = _torch().empty(self.nbytes, dtype=_torch().uint8)

    def __call__(self) -> None:
        self.buf.fill_(1)


# --------------------------------------------------------------------------- CUDA graphs


def warm_on_side_stream(fns: Sequence[Callable[[], Any]], device: Any = None, warmup: int = 2) -> None:
    """Run `fns` (in order) `warmup` times on a side stream, as CUDA-graph capture needs first (allocator,
    lazy initialisation, cuBLAS workspaces), then wait for them on the current stream."""
    torch = _torch()
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for f in fns:
                f()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)


def capture_graph(fns: Sequence[Callable[[], Any]], device: Any = None, warmup: int = 2):
    """One CUDA graph holding the calls `fns` in order, after `warmup` side-stream rounds (0: the caller
    warmed up already). Raises what capture raises; callers fall back and say why."""
    torch = _torch()
    if warmup > 0:
        warm_on_side_stream(fns, device, warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    torch.cuda.synchronize(device)
    return graph


# --------------------------------------------------------------------------- clocks


def time_cpu_us(fn: Callable[[], object], warmup: int, iters: int,
                before: Callable[[], None] | None = None) -> list[float]:
    """Wall time of each of `iters` calls after `warmup` calls; `before` runs outside the timed region."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        if before is not None:
            before()
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def back_to_back_us(fn: Callable[[], object], n: int, device: Any = None,
                    before_each: Callable[[], None] | None = None) -> list[float]:
    """GPU time of each of `n` calls of fn issued back to back (a CUDA event pair around each call, one
    synchronisation at the end), in µs. `before_each` (e.g. an L2 flush) runs outside the timed span.
    The caller warms up and synchronises first."""
    torch = _torch()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if before_each is not None:
            before_each()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize(device)
    return [float(s.elapsed_time(e)) * 1e3 for s, e in zip(starts, ends)]


def graph_spans_us(graph: Any, n: int, sleep_cycles: int, before: Callable[[], None] | None = None) -> list[float]:
    """GPU span of each of `n` replays of a captured CUDA graph, in µs. A sleep kernel queued ahead of each
    replay keeps the GPU busy while the host launches the graph, so the event pair times the graph's own span
    and not cudaGraphLaunch (which a profiler slows by far more than the graph runs). `before` (e.g. an L2
    flush) is queued ahead of the sleep."""
    torch = _torch()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in events:
        torch.cuda.synchronize()
        if before is not None:
            before()
        torch.cuda._sleep(sleep_cycles)
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [float(s.elapsed_time(e)) * 1e3 for s, e in events]


def time_from_idle_us(fn: Callable[[], object], warmup: int, iters: int, flush: Callable[[], None] | None,
                      before: Callable[[], None] | None = None) -> list[float]:
    """GPU time (CUDA events) of each call of fn (an eager step or a graph replay), each from an idle GPU,
    after `flush` (the L2) and `before` (e.g. a barrier between ranks)."""
    torch = _torch()
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
        out.append(float(start.elapsed_time(end)) * 1e3)
    return out


def rotated(timer: Callable[[Callable[[], object]], list[float]], fns: Mapping[str, Callable[[], object]],
            rounds: int) -> dict[str, list[float]]:
    """Forms timed against each other: `rounds` rounds, each timing every form once with `timer` (e.g. a partial of
    time_from_idle_us), round r starting at form r, so over len(fns) rounds each form takes each place in the order
    once (the order stays cyclic: a form always follows the same one). Their samples, by name. Timed in a fixed
    order the same NVFP4 MoE call read 2-9% faster first than timed again after three others (H200, 2026-12-05),
    more than some forms differ by."""
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name] += timer(fns[name])
    return samples


MEASURE_LOCK_ENV = "DECODE_GAP_MEASURE_LOCK"


def measure_lock_path() -> Path:
    """The host's measurement lock: $DECODE_GAP_MEASURE_LOCK, else decode-gap-measure.lock in the temp folder (one
    per host, so two runs of different configs on one host take turns too)."""
    return Path(os.environ.get(MEASURE_LOCK_ENV) or Path(tempfile.gettempdir()) / "decode-gap-measure.lock")


@contextlib.contextmanager
def exclusive_measurement(what: str, log: Callable[[str], None] = print) -> Iterator[float]:
    """Hold the host's measurement lock while `what` times anything, so that `snakemake --cores all` never times two
    benchmarks against each other on one GPU (or on the CPU's cores); yields the seconds waited for it. An OS file
    lock (filelock: flock), so a killed rule never leaves it held."""
    path = measure_lock_path()
    lock = FileLock(str(path), mode=0o666)  # every user of the host shares one GPU, so one lock
    t0 = time.monotonic()
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log(f"decode-gap: {what} waits for the host's measurement lock ({lock.lock_file}): another rule is timing")
        lock.acquire()
    except PermissionError:  # another user's lock file we may not open: take turns among our own rules at least
        lock = FileLock(str(path.with_name(f"{path.stem}-{os.getuid()}{path.suffix}")))
        log(f"decode-gap: {what} cannot open {path} (another user's); taking turns on {lock.lock_file} instead")
        lock.acquire()
    waited = time.monotonic() - t0
    if waited >= 0.1:
        log(f"decode-gap: {what} waited {waited:.1f} s for the measurement lock")
    try:
        yield waited
    finally:
        lock.release()


# NVML's clock-limit counters (nvmlDeviceGetViolationStatus): cumulative ns the GPU's clocks were held down by
_CAPS = (("power", "NVML_PERF_POLICY_POWER"), ("thermal", "NVML_PERF_POLICY_THERMAL"))


def _nvml_handle(device: Any) -> Any:
    """The NVML handle of a torch CUDA device, matched by PCI bus id (CUDA and NVML may order GPUs differently);
    None on a CPU host or without the driver's NVML."""
    if not is_cuda(device):
        return None
    try:
        torch = _torch()
        index = torch.device(device).index
        return _nvml_handle_of(torch.cuda.current_device() if index is None else index)
    except Exception:  # no usable CUDA device after all: the clock columns stay empty
        return None


@functools.lru_cache(maxsize=None)
def _nvml_handle_of(index: int) -> Any:
    """_nvml_handle's lookup, once per CUDA device a process (a stage watches hundreds of cases)."""
    try:
        import pynvml  # nvidia-ml-py

        torch = _torch()
        pynvml.nvmlInit()
        p = torch.cuda.get_device_properties(index)
        if all(hasattr(p, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
            return pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # no NVML (a container without the driver library): the clock columns stay empty
        return None


class ClockWatch:
    """What the GPU's clocks did while a case was timed, from NVML: the share of the wall time its clocks were held
    down by the power or thermal cap (the driver's violation counters) and the SM clock when it ended. A kernel
    that reads memory at full bandwidth and decodes (NVFP4) can hit an H200's power cap where a plain copy does not:
    its figure then includes the lower clock, as a server's would under the same load. Every figure is None where
    NVML cannot say (a CPU host, no driver library, a GPU that does not count)."""

    def __init__(self, device: Any, clock: Callable[[], int] = time.monotonic_ns):
        self._h = _nvml_handle(device)
        self._clock = clock
        self._start: tuple[int, dict[str, int | None]] | None = None
        self.capped_frac: float | None = None
        self.capped_by = ""
        self.sm_clock_mhz: int | None = None

    def _violations(self) -> dict[str, int | None]:
        import pynvml

        out: dict[str, int | None] = {}
        for name, policy in _CAPS:
            try:
                out[name] = int(pynvml.nvmlDeviceGetViolationStatus(self._h, getattr(pynvml, policy)).violationTime)
            except Exception:
                out[name] = None
        return out

    def __enter__(self) -> "ClockWatch":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> "ClockWatch":
        if self._h is not None:
            self._start = (self._clock(), self._violations())
        return self

    def stop(self) -> None:
        if self._h is None or self._start is None:
            return
        import pynvml

        t0, v0 = self._start
        wall = self._clock() - t0
        v1 = self._violations()
        shares = {k: (v1[k] - v0[k]) / wall for k in v0 if v0[k] is not None and v1[k] is not None and wall > 0}
        if shares:
            self.capped_frac = min(1.0, max(shares.values()))
            self.capped_by = "+".join(k for k, f in shares.items() if f >= 0.01)
        try:
            self.sm_clock_mhz = int(pynvml.nvmlDeviceGetClockInfo(self._h, pynvml.NVML_CLOCK_SM))
        except Exception:
            self.sm_clock_mhz = None

    def columns(self) -> dict[str, Any]:
        return {"clock_capped_frac": self.capped_frac, "clock_capped_by": self.capped_by,
                "sm_clock_mhz": self.sm_clock_mhz}
