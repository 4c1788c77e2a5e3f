"""FP8 with DeepSeek-V3's block scales above batch 1: the activation quantised per token in groups of 128 values (one
Triton kernel, as engines run their per-token-group quantisation before a block-scaled GEMM), then `torch._scaled_mm`
with those 1x128 scales and the weight's 128x128 ones (cuBLASLt's blockwise scaling: sm90, CUDA 12.9 or newer).

Why not our GEMV (lowprec.DenseGemv with block scales) there: it runs on CUDA cores, M FMAs per weight value, and took
5071 us on the H200 for 16 rows of 36864 x 7168 against 87.5 us for cuBLAS. At batch 1 ours stays the kernel level's
choice (level with per-tensor `_scaled_mm`, and cuBLAS takes no fewer than MIN_M rows).

H200 (2026-12-03, torch 2.11 + CUDA 13.0, CUDA-graph replay, median us; benchmarks/lowprec_device.py --sections
fp8block), a whole call (our quantisation, then cuBLAS) against per-tensor `_scaled_mm` on the same fp8 bytes, DeepSeek-V3
shapes at M = 3-16: 36864x7168 82.2-88.7 against 67.0-68.2, 7168x18432 43.6-46.5 against 36.4-37.3, 2112x7168
15.7-16.1 against 7.5-7.6, 7168x2048 9.6-9.8 against 4.5-5.0. The quantisation kernel alone 1.2-1.8 us (in torch ops,
five kernels, 11-13 us). Every check passed: scales exact, codes within one e4m3 step, the call within 1e-2 of
dequantise-then-matmul on the same quantised x. At M=1 our block-scaled GEMV (lowprec.DenseGemv) took 6.0 / 4.8 / 63.9 /
33.5 us on 2112x7168 / 7168x2048 / 36864x7168 / 7168x18432 against 15.1 / 9.5 / 87.2 / 43.8 for this form padded to
4 rows: batch 1 keeps ours. cuBLAS refused M = 1 and 2 (CUBLAS_STATUS_NOT_SUPPORTED: hence MIN_M) and K = 640, five
128-value blocks, with the scales passed as here ("Invalid scaling configuration": hence K a multiple of 512; the
kernel level runs per-tensor scales on such a shape); N must be a multiple of 16, as for
every `_scaled_mm`.
"""

from __future__ import annotations

import math

import torch

from ..errors import DecodeGapError, describe
from .lowprec import FP8_BLOCK, Fp8Weight, _to_fp8_rounded, available, dequantize_fp8, interpreted, quantize_fp8
from .nvfp4 import HAVE_TRITON, quantize_e4m3_groups, tl, triton

if HAVE_TRITON:
    from .nvfp4 import e4m3_scale_tl

MIN_M = 4  # rows cuBLAS's blockwise scaling takes at the least (fewer are padded with zero rows)
LABEL = "torch._scaled_mm(e4m3, 1x128 x 128x128 block scales)"
_SUPPORTED: dict[str, str] = {}  # device -> "" where cuBLAS runs the blockwise form there, else why not (probed once)


def _groups(k: int) -> int:
    """The 1x128 groups of a row of K values, or one clear error where K is not whole groups."""
    if k % FP8_BLOCK:
        raise DecodeGapError(f"fp8 block scales: K={k} is not a multiple of {FP8_BLOCK}")
    return k // FP8_BLOCK


def quantize_act_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of 128) -> (e4m3 [M, K], fp32 scales [M, K/128]) with x ~= q * scale per group: scale =
    amax / 448 (a tiny floor for all-zero groups), q = x / scale rounded to e4m3."""
    m, k = x.shape
    q, s = quantize_e4m3_groups(x.reshape(m, _groups(k), FP8_BLOCK))
    return q.reshape(m, k), s


def dequantize_act(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """fp32 [M, K] from e4m3 codes [M, K] and their 1x128 group scales [M, K/128]."""
    return q.float() * s.repeat_interleave(FP8_BLOCK, -1)


if HAVE_TRITON:

    @triton.jit
    def _group_quant(v):
        """[G, 128] fp32 groups -> (the values over their group's scale, held to e4m3's range; the scales, amax /
        448 with a tiny floor for all-zero groups), as quantize_act_reference."""
        scale = e4m3_scale_tl(tl.max(tl.abs(v), axis=1))
        return tl.minimum(tl.maximum(v / scale[:, None], -448.0), 448.0), scale

    @triton.jit
    def _act_quant_kernel(x, q, s, G, stride_xm, stride_qm, stride_sm, stride_sg, GROUPS: tl.constexpr,
                          ROUND: tl.constexpr):
        """GROUPS groups of 128 values of row m: each group's amax / 448 into s, the values over it into q (e4m3)."""
        m = tl.program_id(0).to(tl.int64)
        gs = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
        gmask = gs < G
        offs = gs[:, None] * 128 + tl.arange(0, 128)[None, :]
        v = tl.load(x + m * stride_xm + offs, mask=gmask[:, None], other=0.0).to(tl.float32)
        qv, scale = _group_quant(v)
        tl.store(q + m * stride_qm + offs, _to_fp8_rounded(qv, ROUND), mask=gmask[:, None])
        tl.store(s + m * stride_sm + gs * stride_sg, scale, mask=gmask)


def quantize_act(x: torch.Tensor, q: torch.Tensor | None = None,
                 s: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_act_reference` as one Triton kernel where Triton runs (into q and s where given: any strides, so s
    can be the outer-dim-major layout cuBLAS wants); else the reference (copied into q and s where given)."""
    m, k = x.shape
    groups = _groups(k)
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device) if q is None else q
    s = torch.empty((m, groups), dtype=torch.float32, device=x.device) if s is None else s
    if not available(x.device):
        rq, rs = quantize_act_reference(x)
        q[:m].copy_(rq)
        s[:m].copy_(rs)
        return q, s
    x = x if x.stride(1) == 1 else x.contiguous()
    per = 4  # groups a program: 512 values, one 16-byte load a thread
    _act_quant_kernel[(m, math.ceil(groups / per))](x, q, s, groups, x.stride(0), q.stride(0), s.stride(0),
                                                    s.stride(1), GROUPS=per, ROUND=interpreted(), num_warps=4)
    return q, s


def refusal(n: int, k: int) -> str:
    """Why cuBLAS's blockwise form will not take an [n, k] weight ("" where it will): K in whole groups of four
    128-value blocks (it refused 640 on the H200) and N a multiple of 16 (every `_scaled_mm`)."""
    if k % (4 * FP8_BLOCK):
        return f"K={k} is not a multiple of {4 * FP8_BLOCK} (whole groups of four 128-value blocks)"
    return f"N={n} is not a multiple of 16 (torch._scaled_mm's rule)" if n % 16 else ""


def _weight_scales(w: Fp8Weight) -> torch.Tensor:
    """The weight's [N/128, K/128] scales as cuBLAS reads them for B = W^T: transposed to [K/128, N/128] with
    stride (1, L4), L4 being K's blocks rounded up to 4 (cuBLAS wants a 16-byte leading dimension); the shape stays
    the logical one, from which torch._scaled_mm tells 128x128 blocks from other scalings."""
    nb, kb = w.scales.shape
    padded = torch.zeros((nb, -(-kb // 4) * 4), dtype=torch.float32, device=w.scales.device)
    padded[:, :kb] = w.scales
    return padded.t()[:kb]


class BlockScaledMm:
    """y[M, N] = x[M, K] @ W^T for an fp8 weight with 128x128 block scales: x quantised per token in 1x128 groups,
    then cuBLAS's blockwise-scaled fp8 GEMM. Buffers are allocated once (graph-capturable); fewer than MIN_M rows are
    padded with zero rows (the quantisation writes only the real ones)."""

    label = LABEL

    def __init__(self, w: Fp8Weight, m: int, device, out_dtype=torch.bfloat16) -> None:
        if not w.block or w.data.dim() != 2:
            raise DecodeGapError("fp8 block-scaled GEMM: needs a 2-D weight with 128x128 block scales")
        n, k = w.data.shape
        if why := refusal(n, k):
            raise DecodeGapError(f"fp8 block-scaled GEMM: {why}")
        self.m, self.n, self.k, self.w = m, n, k, w
        self.rows = max(MIN_M, -(-m // 4) * 4)  # cuBLAS's M; rows past m stay zero
        self.wt = w.data.t()
        self.sb = _weight_scales(w)
        self.xq = torch.zeros((self.rows, k), dtype=torch.float8_e4m3fn, device=device)
        # outer-dim-major [rows, K/128] (stride (1, rows)), the layout cuBLAS wants for 1x128 scales
        self.sx = torch.ones((k // FP8_BLOCK, self.rows), dtype=torch.float32, device=device).t()
        self.out_dtype = out_dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != (self.m, self.k):
            raise DecodeGapError(f"fp8 block-scaled GEMM: x has shape {tuple(x.shape)}, expected {(self.m, self.k)}")
        quantize_act(x, self.xq, self.sx)
        y = torch._scaled_mm(self.xq, self.wt, scale_a=self.sx, scale_b=self.sb, out_dtype=self.out_dtype)
        return y if self.rows == self.m else y[:self.m]

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantise-then-matmul in fp32 on the same quantised activation (the check for the GEMM alone)."""
        q, s = quantize_act_reference(x)
        return dequantize_act(q, s) @ dequantize_fp8(self.w).t()


def supported(device) -> bool:
    """Whether cuBLAS runs the blockwise-scaled form on this device (tried once at MIN_M rows: sm90 with CUDA 12.9+;
    other GPUs and older builds raise)."""
    return not why_not(device)


def why_not(device) -> str:
    """"" where `supported`, else why not (the probe's error, one line)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return "cuBLAS's blockwise fp8 scaling needs a CUDA GPU"
    key = str(dev)
    if key not in _SUPPORTED:
        try:
            w = quantize_fp8(torch.randn(208, 512, device=dev), block=True)
            x = torch.randn(MIN_M, 512, device=dev, dtype=torch.bfloat16)
            mm = BlockScaledMm(w, MIN_M, dev)
            ref = mm.reference(x)
            err = ((mm(x).float() - ref).norm() / ref.norm()).item()
            _SUPPORTED[key] = "" if err < 0.05 else f"blockwise fp8 GEMM check failed (rel. error {err:.2e})"
        except Exception as exc:  # no blockwise scaling in this cuBLAS / on this GPU, or no fp8 at all
            _SUPPORTED[key] = describe(exc)
    return _SUPPORTED[key]
