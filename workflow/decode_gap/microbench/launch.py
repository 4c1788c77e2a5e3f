"""Launch overhead: what one kernel launch costs eagerly against one node of a replayed CUDA graph.

Kernels: an empty Triton kernel (when Triton is there), the smallest ATen kernel (`x.add_(1)` on one
element) and a small decode GEMM (bf16 [1, K] @ [K, N]^T). For each:
- `eager_launch_us`: wall time per launch of a back-to-back loop of N launches (the CPU cost a server
  without graphs pays per kernel, when the GPU keeps up);
- `eager_sync_us`: one launch followed by a synchronise (launch-to-completion latency);
- `graph_node_us`: GPU time per kernel of a graph of N such kernels, replayed (CUDA events).
Also the chain: N kernels eager (wall time to completion) against the same N graphed.
On a CPU host only the eager figures exist (per-op dispatch cost); graph figures are unavailable.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pandas as pd
import torch

from ..provenance import measured, unavailable
from ..timing import CpuCacheFlusher, back_to_back_us
from ..errors import REASON_CHARS, describe
from .common import BenchEnv, skip, summary
from .timing import Stats, capture_graph, rotating_copies, stats_us, time_cpu, time_eager_loop, time_graph

COLUMNS = ["kernel", "mode", "n_kernels", "per_kernel_us", "per_kernel_min_us", "per_kernel_p99_us", "total_us",
           "iters", "backend", "note"]

try:
    import triton

    import triton.language as tl

    @triton.jit
    def _empty_kernel(x_ptr):
        pass

    @triton.jit
    def _read_kernel(src, out, n_words, per_prog, BLOCK: tl.constexpr):
        """Stream one contiguous range of int32 words a program (16-byte loads, streamed once), xor-folded so the
        loads are kept, one store a program."""
        pid = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a MoE row's bytes can pass 8 GiB (2^31 words)
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for i in range(pid * per_prog, (pid + 1) * per_prog, BLOCK):
            acc ^= tl.load(src + i + offs, mask=i + offs < n_words, other=0, eviction_policy="evict_first")
        tl.store(out + pid, tl.xor_sum(acc, axis=0))

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the host
    HAVE_TRITON = False


def kernels(env: BenchEnv, gemm_nk: tuple[int, int]) -> list[tuple[str, str, Callable[[], Any]]]:
    dev = env.device
    one = torch.zeros(1, device=dev)
    out: list[tuple[str, str, Callable[[], Any]]] = [("aten add_ (1 element)", "torch", lambda: one.add_(1.0))]
    n, k = gemm_nk
    dtype = torch.bfloat16 if env.is_gpu else torch.float32
    w = torch.randn((n, k), device=dev, dtype=dtype)
    x = torch.randn((1, k), device=dev, dtype=dtype)
    y = torch.empty((1, n), device=dev, dtype=dtype)
    out.append((f"gemm 1x{n}x{k}", "torch.mm", lambda: torch.mm(x, w.t(), out=y)))
    if env.is_gpu and HAVE_TRITON:
        out.insert(0, ("triton empty", "triton", lambda: _empty_kernel[(1,)](one)))
    return out


def _graph_per_kernel(fn, n: int, env: BenchEnv):
    g = capture_graph([fn] * n, env.device)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize(env.device)
    totals = back_to_back_us(g.replay, max(env.iters, 5), env.device)
    return stats_us([t / n for t in totals]), stats_us(totals)


def run_launch_bench(env: BenchEnv, gemm_nk: tuple[int, int] = (256, 6144), n_kernels: int = 100,
                     log=print) -> tuple[pd.DataFrame, dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    per_kernel: dict[str, Any] = {}
    dev = env.device
    if env.is_gpu and not HAVE_TRITON:
        skipped.append(skip("triton empty", "Triton is not installed"))
    for name, backend, fn in kernels(env, gemm_nk):
        entry: dict[str, Any] = {}
        try:
            loop = time_eager_loop(fn, env.warmup, max(env.iters // 2, 5), n_kernels, dev)
            sync = time_cpu(fn, env.warmup, env.iters, budget_s=None if env.is_gpu else env.cpu_budget_s, device=dev)
        except Exception as exc:
            skipped.append(skip(f"{name} eager", describe(exc, REASON_CHARS)))
            continue
        rows.append(_row(name, "eager", n_kernels, loop, loop.median_us * n_kernels, backend))
        rows.append(_row(name, "eager-sync", 1, sync, sync.median_us, backend))
        entry["eager_launch_us"] = measured(loop.median_us, "us", f"{n_kernels} back-to-back launches, wall time / launch")
        entry["eager_sync_us"] = measured(sync.median_us, "us", "one launch + synchronize, wall time")
        if env.is_gpu:
            try:
                node, total = _graph_per_kernel(fn, n_kernels, env)
                rows.append(_row(name, "graph", n_kernels, node, total.median_us, backend))
                entry["graph_node_us"] = measured(node.median_us, "us", f"graph of {n_kernels} nodes, GPU time / node")
            except Exception as exc:
                skipped.append(skip(f"{name} graph", describe(exc, REASON_CHARS)))
                entry["graph_node_us"] = unavailable(describe(exc, REASON_CHARS), "us")
        else:
            entry["graph_node_us"] = unavailable("CUDA graphs need a GPU", "us")
        per_kernel[name] = entry
        log(f"launch {name}: eager {loop.median_us:.2f} us/launch, sync {sync.median_us:.2f} us, graph "
            f"{entry['graph_node_us']['value'] if entry['graph_node_us']['value'] is not None else 'n/a'}")
    if not env.is_gpu:
        skipped.append(skip("graph mode", "CUDA graphs need a GPU"))
    df = pd.DataFrame(rows, columns=COLUMNS)
    flat = {k: {f: (v["value"] if isinstance(v, dict) else v) for f, v in e.items()} for k, e in per_kernel.items()}
    return df, summary("microbench.launch", env, env.backend, skipped, int(len(df)), kernels=flat, figures=per_kernel,
                       n_kernels=n_kernels)


def latency_floor(env: BenchEnv, k: int = 4096, n_kernels: int = 100) -> dict[str, Any]:
    """The per-kernel latency floor a small GEMM cannot beat: GPU time per node of a replayed graph of an empty
    Triton kernel, and of a one-row GEMV (y[1] = w[1, K] . x, our Triton GEMV; torch.mm without Triton)."""
    if not env.is_gpu:
        why = "CUDA graphs need a GPU"
        return {"empty_kernel_us": unavailable(why, "us"), "one_row_gemv_us": unavailable(why, "us")}
    from ..kernels import lowprec

    out: dict[str, Any] = {}
    dev = env.device
    one = torch.zeros(1, device=dev)
    cases: list[tuple[str, str, Callable[[], Any] | None]] = [
        ("empty_kernel_us", "triton empty kernel", (lambda: _empty_kernel[(1,)](one)) if HAVE_TRITON else None)]
    w = torch.randn((1, k), device=dev, dtype=torch.bfloat16)
    x = torch.randn((1, k), device=dev, dtype=torch.bfloat16)
    if lowprec.HAVE_TRITON:
        g = lowprec.DenseGemv(w, 1, dev, lowprec.GemvConfig(1, 1024, 4), split=1)
        cases.append(("one_row_gemv_us", f"one-row GEMV 1x{k} ({g.label})", lambda: g(x)))
    else:
        y = torch.empty((1, 1), device=dev, dtype=torch.bfloat16)
        cases.append(("one_row_gemv_us", f"one-row GEMV 1x{k} (torch.mm)", lambda: torch.mm(x, w.t(), out=y)))
    for key, what, fn in cases:
        if fn is None:
            out[key] = unavailable("Triton is not installed", "us")
            continue
        try:
            node, _ = _graph_per_kernel(fn, n_kernels, env)
            out[key] = measured(node.median_us, "us", f"{what}: graph of {n_kernels} nodes, GPU time / node")
        except Exception as exc:
            out[key] = unavailable(describe(exc, REASON_CHARS), "us")
    return out


# the plain read's grids: (programs of 4 warps an SM, int32 words a program loads an iteration). H200 (2026-12-02,
# benchmarks/device/read_probe.py, 9-535 MB): these two were the fastest of twelve (2-16 an SM, 1024-4096 words) on
# every shape, within 2% of each other; torch's sum of the same bytes took 1.06-2.8x as long (9.4 MB: 9.7 against
# 4.0 us), so it would understate what a read of a mid-sized call's bytes can reach
PLAIN_READ_GRIDS = ((8, 2048), (16, 1024))
PLAIN_READ_METHOD = "a streaming Triton read of the row's bytes (rotating copies past the L2, CUDA-graph replay)"
PLAIN_READ_METHOD_CPU = "torch.sum over the same bytes (wall time, the CPU's caches flushed before each call)"


def plain_read(env: BenchEnv, nbytes: int, flush: Callable[[], Any] | None = None) -> Stats:
    """GPU time (graph replay) of a plain read of `nbytes`, on copies that rotate past the L2 as a kernel's weights
    do: what moving a call's bytes costs at its size, ramp-up and tail included, measured (the issue-14 yardstick
    beside the latency floor: a 30-75 MB call does not reach the 2 GiB read bandwidth even as a plain read). On a
    CPU host the wall time of torch.sum over the bytes, after `flush` (a CpuCacheFlusher, as the rows it is held
    against are timed). Raises where it cannot be timed (no Triton on a GPU, too little memory, a failed capture):
    PlainReads says why in the stage's skipped list."""
    words = max(nbytes // 4, 1)
    dev = env.device
    if not env.is_gpu:
        buf = torch.ones(words, dtype=torch.float32)
        return time_cpu(lambda: buf.sum(), max(1, min(env.warmup, 2)), env.iters, budget_s=env.cpu_budget_s,
                        before=flush)
    if not HAVE_TRITON:
        raise RuntimeError("Triton is not installed")
    bufs = [torch.empty(words, dtype=torch.int32, device=dev) for _ in range(rotating_copies(4 * words, dev))]
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    best = None
    for per_sm, block in PLAIN_READ_GRIDS:
        st = time_graph([read_call(b, per_sm * sms, block) for b in bufs], max(env.warmup, 1), env.iters, dev)
        best = st if best is None or st.median_us < best.median_us else best
    return best


def read_call(words: torch.Tensor, programs: int, block: int) -> Callable[[], Any]:
    """One launch of the plain read over the int32 tensor `words`: about `programs` programs of 4 warps, each a
    contiguous range of whole `block`-word iterations (plain_read's grids; benchmarks/device/read_probe.py sweeps
    them)."""
    n = words.numel()
    per = math.ceil(n / programs / block) * block  # whole iterations a program
    grid = (math.ceil(n / per),)
    out = torch.empty(grid[0], dtype=torch.int32, device=words.device)
    return lambda: _read_kernel[grid](words, out, n, per, BLOCK=block, num_warps=4)


class PlainReads:
    """Plain reads (`plain_read`) by byte count, each size measured once a stage: the gemm and MoE stages' rows get
    `plain_read_us` and `frac_of_plain_read` (the read's time over the row's, 1.0 = as fast as reading the bytes)."""

    def __init__(self, env: BenchEnv, flush: Callable[[], Any] | None = None):
        self.env = env
        self._us: dict[int, float | None] = {}
        # a CPU host's reads follow the stage's own cache flush (one buffer a stage), or one of their own
        self.flush = None if env.is_gpu else flush or CpuCacheFlusher()
        self.skipped: list[dict[str, str]] = []  # sizes that could not be timed, and why (the stage's skipped list)

    def us(self, nbytes: int) -> float | None:
        if nbytes not in self._us:
            try:
                self._us[nbytes] = plain_read(self.env, nbytes, self.flush).median_us
            except Exception as exc:  # out of memory, a failed capture: the row keeps its other figures
                if self.env.is_gpu:
                    torch.cuda.synchronize(self.env.device)
                self._us[nbytes] = None
                self.skipped.append(skip(f"plain read of {nbytes} bytes", describe(exc, REASON_CHARS)))
        return self._us[nbytes]

    def columns(self, nbytes: int, kernel_us: float | None) -> dict[str, float | None]:
        read = self.us(nbytes)
        return {"plain_read_us": read, "frac_of_plain_read": read / kernel_us if read and kernel_us else None}

    @property
    def method(self) -> str:
        return PLAIN_READ_METHOD if self.env.is_gpu else PLAIN_READ_METHOD_CPU


def _row(kernel, mode, n, st, total, backend, note=""):
    return {"kernel": kernel, "mode": mode, "n_kernels": n, "per_kernel_us": st.median_us, "per_kernel_min_us": st.min_us,
            "per_kernel_p99_us": st.p99_us, "total_us": total, "iters": st.n, "backend": backend, "note": note}
