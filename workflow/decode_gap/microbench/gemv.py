"""A Triton GEMV for bf16 decode at M=1: one more candidate beside cuBLAS, kept only when it measures faster.

Decode at batch 1 is a matrix-vector product bound by reading W once. Each program reads BLOCK_N whole rows of W
(K contiguous, so loads coalesce) and accumulates in fp32. Several tile shapes are timed and the fastest wins,
recorded by name, so the report says which kernel reached the figure.
"""

from __future__ import annotations

from typing import Callable

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU hosts without triton: the candidate is simply not offered
    triton = None

# (BLOCK_N, BLOCK_K, num_warps)
CONFIGS = ((8, 1024, 4), (16, 512, 4), (32, 256, 8), (4, 2048, 4))


def available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


def label(cfg: tuple[int, int, int]) -> str:
    return f"triton gemv (BLOCK_N={cfg[0]}, BLOCK_K={cfg[1]}, warps={cfg[2]})"


if triton is not None:

    @triton.jit
    def _gemv_kernel(w_ptr, x_ptr, y_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            cmask = cols < K
            w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0)
            x = tl.load(x_ptr + cols, mask=cmask, other=0.0)
            acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=rmask)


def gemv(w: torch.Tensor, x: torch.Tensor, out: torch.Tensor, cfg: tuple[int, int, int] = CONFIGS[0]) -> torch.Tensor:
    """out[N] = W[N, K] @ x[K] (fp32 accumulate)."""
    n, k = w.shape
    block_n, block_k, warps = cfg
    _gemv_kernel[(triton.cdiv(n, block_n),)](w, x, out, n, k, w.stride(0), BLOCK_N=block_n, BLOCK_K=block_k,
                                             num_warps=warps)
    return out


def make_calls(weights: list[torch.Tensor], x: torch.Tensor, cfg: tuple[int, int, int]) -> list[Callable[[], torch.Tensor]]:
    xv = x.reshape(-1)
    outs = [torch.empty(w.shape[0], device=w.device, dtype=w.dtype) for w in weights]
    return [(lambda w=w, o=o: gemv(w, xv, o, cfg)) for w, o in zip(weights, outs)]
