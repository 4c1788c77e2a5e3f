"""Memory ceilings: copy and read bandwidth, and the peak dense matmul rate by dtype.

- copy: `dst.copy_(src)` over buffers far larger than any cache; bytes = read + written (2 x size),
  the way vendors and the STREAM/nvbandwidth tools count a copy.
- read: `src.sum()` over the same buffer; bytes = size.
- peak: an N x N x N matmul on random data (never zeros): bf16 `torch.mm`, fp8 `torch._scaled_mm` (sm89+),
  nvfp4 `torch._scaled_mm` (sm100/sm120); fp32 and bf16 `torch.mm` on a CPU host.
"""

from __future__ import annotations

from typing import Any

import torch

from ..provenance import measured, unavailable
from ..kernels import nvfp4 as nv
from ..errors import REASON_CHARS, describe
from .common import BenchEnv, skip, summary
from .timing import gbps, tflops, time_cpu, time_events


def _time(env: BenchEnv, fn, iters: int | None = None):
    if env.is_gpu:
        return time_events(fn, max(env.warmup, 2), iters or env.iters, env.device)
    return time_cpu(fn, max(1, min(env.warmup, 2)), iters or min(env.iters, 10), budget_s=max(env.cpu_budget_s * 4, 1.0))


def measure_memory(env: BenchEnv, gpu_bytes: int = 2 * 2**30, cpu_bytes: int = 256 * 2**20,
                   gpu_mm: int = 8192, cpu_mm: int = 1024) -> dict[str, Any]:
    dev = env.device
    nbytes = gpu_bytes if env.is_gpu else cpu_bytes
    skipped: list[dict[str, str]] = []
    figures: dict[str, Any] = {}
    stats: dict[str, Any] = {}

    n = nbytes // 4
    src = torch.rand(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    st = _time(env, lambda: dst.copy_(src))
    copy = gbps(2 * nbytes, st.median_us)
    stats["copy"] = {**st.as_dict(), "bytes_moved": 2 * nbytes, "buffer_bytes": nbytes}
    figures["copy_gbps"] = measured(copy, "GB/s", f"dst.copy_(src), {nbytes / 2**30:.2f} GiB each, read+write bytes")

    st = _time(env, lambda: src.sum())
    read = gbps(nbytes, st.median_us)
    stats["read"] = {**st.as_dict(), "bytes_moved": nbytes}
    figures["read_gbps"] = measured(read, "GB/s", f"src.sum() over {nbytes / 2**30:.2f} GiB fp32")
    src = dst = None  # free the buffers before the matmuls

    peak: dict[str, float] = {}
    size = gpu_mm if env.is_gpu else cpu_mm
    flops = 2.0 * size**3
    dtypes = ["bf16", "fp8", "nvfp4"] if env.is_gpu else ["fp32", "bf16"]
    for dt in dtypes:
        try:
            fn, label = _peak_case(env, dt, size)
        except _Unavailable as exc:
            skipped.append(skip(f"peak_tflops.{dt}", str(exc)))
            figures[f"peak_tflops.{dt}"] = unavailable(str(exc), "TFLOP/s")
            continue
        except Exception as exc:  # a backend that exists but refuses this device: skipped, with the error
            skipped.append(skip(f"peak_tflops.{dt}", describe(exc, REASON_CHARS)))
            figures[f"peak_tflops.{dt}"] = unavailable(describe(exc, REASON_CHARS), "TFLOP/s")
            continue
        st = _time(env, fn, iters=max(5, env.iters // 2))
        peak[dt] = tflops(flops, st.median_us)
        stats[f"peak_{dt}"] = {**st.as_dict(), "n": size}
        figures[f"peak_tflops.{dt}"] = measured(peak[dt], "TFLOP/s", f"{label}, {size}x{size}x{size}, random data")
        if env.is_gpu:
            torch.cuda.empty_cache()

    ran = 2 + len(peak)
    return summary(
        "microbench.memory",
        env,
        backend=env.backend,
        skipped=skipped,
        ran=ran,
        copy_gbps=copy,
        read_gbps=read,
        peak_tflops=peak,
        figures=figures,
        stats=stats,
        method="CUDA events, median" if env.is_gpu else "perf_counter, median",
    )


class _Unavailable(Exception):
    pass


def _peak_case(env: BenchEnv, dt: str, size: int):
    dev = env.device
    if dt in ("bf16", "fp32"):
        dtype = torch.bfloat16 if dt == "bf16" else torch.float32
        a = torch.randn(size, size, device=dev, dtype=dtype)
        b = torch.randn(size, size, device=dev, dtype=dtype)
        out = torch.empty(size, size, device=dev, dtype=dtype)
        return (lambda: torch.mm(a, b, out=out)), f"torch.mm {dt}"
    if dt == "fp8":
        cap = env.capability
        if cap is None or cap < (8, 9):
            raise _Unavailable(f"fp8 tensor cores need sm89 or newer; this device is {env.sm}")
        a = torch.randn(size, size, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(size, size, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        return (lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)), "torch._scaled_mm fp8 e4m3"
    if dt == "nvfp4":
        if not nv.has_fp4_tensor_cores(dev):
            raise _Unavailable(f"fp4 tensor cores need sm100/sm120; this device is {env.sm}")
        w = nv.quantize_nvfp4(torch.randn(size, size, device=dev))
        x = torch.randn(size, size, device=dev)
        mm = nv.ScaledMmNvfp4(w, x)
        mm()  # raise here, not inside the timing, if the backend refuses
        return mm, "torch._scaled_mm nvfp4 (float4_e2m1fn_x2, e4m3 1x16 scales)"
    raise _Unavailable(f"unknown dtype {dt}")
