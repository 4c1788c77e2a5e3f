"""RMSNorm for the kernel level as engines run it: one kernel a norm, and the residual add fused into the norm after
it (vLLM's and SGLang's fused_add_rms_norm).

Why hand-written: at decode a norm over one row is a few microseconds of launches, not of bytes, so the kernel count
is what it costs; the residual add and the norm that follows it read and write the same row, so one kernel does both.
Where Triton does not run (a CPU), torch's rms_norm and an add do the same arithmetic.
"""

from __future__ import annotations

import torch

from .lowprec import available
from .nvfp4 import HAVE_TRITON, tl, triton  # Triton is optional (one import guard for the kernels)


def rms_norm_reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float):
    total = x + residual
    return total, rms_norm_reference(total, w, eps)


if HAVE_TRITON:

    @triton.jit
    def _rms_kernel(x, res, w, out, sum_out, n, stride_x, stride_r, stride_o, stride_s, eps,
                    ADD: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        v = tl.load(x + row * stride_x + offs, mask=mask, other=0.0)
        if ADD:  # the residual sum is rounded to the row's dtype and stored, then normalised, as torch would
            v = (v.to(tl.float32) + tl.load(res + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32))
            v = v.to(sum_out.dtype.element_ty)
            tl.store(sum_out + row * stride_s + offs, v, mask=mask)
        v = v.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / n + eps)
        g = tl.load(w + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + row * stride_o + offs, (v * inv * g).to(out.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    rows = t.reshape(-1, t.shape[-1])  # a view for the decode step's rows; else a copy
    return rows if rows.stride(1) == 1 else rows.contiguous()


def _launch(x: torch.Tensor, res: torch.Tensor | None, w: torch.Tensor, eps: float):
    n = x.shape[-1]
    rows = _rows(x)
    rres = _rows(res) if res is not None else rows
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device) if res is not None else out
    block = 1 << max(0, (n - 1).bit_length())
    _rms_kernel[(rows.shape[0],)](rows, rres, w, out, total, n, rows.stride(0), rres.stride(0), n, n, float(eps),
                                  ADD=res is not None, BLOCK=block, num_warps=4 if n <= 4096 else 8)
    return out, total


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, weighted by w: one Triton kernel where it runs, else torch's."""
    if not available(x.device):
        return rms_norm_reference(x, w, eps)
    return _launch(x, None, w, eps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float):
    """(x + residual, RMSNorm(x + residual)): one Triton kernel where it runs, else an add and torch's norm."""
    if not available(x.device):
        return add_rms_norm_reference(x, residual, w, eps)
    out, total = _launch(x, residual, w, eps)
    return total, out
