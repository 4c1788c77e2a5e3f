"""NVFP4: E2M1 values, packed two per byte, with an FP8 (E4M3) scale per 16 values and one fp32 scale per tensor.

Layout (the one `torch.float4_e2m1fn_x2` and cuBLAS use):
- codes: 4 bits, sign in bit 3, then 2 exponent bits and 1 mantissa bit; magnitudes by code 0..7 are
  0, 0.5, 1, 1.5, 2, 3, 4, 6.
- packing: element 2i in the low nibble of byte i, element 2i+1 in the high nibble.
- a weight W[N, K] is `packed[N, K/2]` (uint8), `block_scales[N, K/16]` (float8_e4m3fn) and
  `tensor_scale` (fp32): W[n, k] ~= e2m1(n, k) * float(block_scales[n, k // 16]) * tensor_scale.

Quantisation follows NVIDIA's recipe: tensor_scale = amax / (448 * 6), each block's scale is
amax_block / 6 / tensor_scale rounded to E4M3, and values round to nearest on the E2M1 grid, ties to
even (the code whose mantissa bit is 0), saturating at +-6.

Kernels:
- `nvfp4-weight-only` (any CUDA GPU with Triton, the path for sm90 which has no FP4 tensor cores): a Triton
  GEMM that loads the packed weight and its scales, dequantises in registers to bf16 (exact: a product of
  an E2M1 value and an E4M3 scale fits bf16's mantissa) and accumulates in fp32. `WeightOnlyGemm` runs it only
  where the tensor-core forms cannot: lowprec's GEMV up to 16 rows, fp4wide's GEMM above (32 rows a pass).
- `torch._scaled_mm` with `float4_e2m1fn_x2` and swizzled E4M3 block scales (W4A4), on sm100 / sm120.
- the reference: dequantise to fp32, then matmul (the CPU path and the check for both kernels).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from ..errors import DecodeGapError

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_SCALE_FLOOR = 1e-12  # an all-zero group's scale (amax / 448 floored), so its codes are 0 and not NaN
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# midpoints between neighbours on the grid; a value exactly on one is a tie
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)

try:  # Triton is optional: present with CUDA builds of torch (and installable for its CPU interpreter)
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the host
    triton = None
    tl = None
    HAVE_TRITON = False


# --------------------------------------------------------------------------- E2M1 codes


def e4m3_scale(amax: torch.Tensor) -> torch.Tensor:
    """The E4M3 scale of a group, tensor or row from its amax: amax / 448, floored at E4M3_SCALE_FLOOR (the Triton
    kernels take e4m3_scale_tl, the same two numbers)."""
    return (amax.float() / E4M3_MAX).clamp(min=E4M3_SCALE_FLOOR)


def quantize_e4m3_groups(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Groups g [..., G] as E4M3 codes [..., G] and an fp32 scale a group [...] (e4m3_scale), the codes g / scale
    (within e4m3's range by construction). The FP8 activations' 1x128 groups (fp8block), the DSA indexer's key and
    query rows (attention) and the row-scaled MoE benchmark all take it; the kernels take e4m3_scale_tl (the same
    floor)."""
    g = g.float()
    scale = e4m3_scale(g.abs().amax(-1))
    # no clamp: |g| / (amax / 448) is 448 within two fp32 roundings, which e4m3 rounds to 448 (a kernel saved where
    # the MoE benchmark times this)
    return (g / scale.unsqueeze(-1)).to(torch.float8_e4m3fn), scale


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Codes (uint8, 0..15) of the E2M1 values nearest to `x` (ties to even, saturating at +-6)."""
    xf = x.float()
    a = xf.abs().clamp(max=E2M1_MAX)
    a = torch.where(torch.isnan(xf), torch.zeros_like(a), a)
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=x.device)
    idx = torch.searchsorted(mids, a.contiguous(), right=False)  # number of midpoints strictly below a
    on_mid = mids[idx.clamp(max=len(_MIDPOINTS) - 1)] == a
    tie_up = (idx < len(_MIDPOINTS)) & on_mid & (idx % 2 == 1)  # round the tie to the even code
    idx = idx + tie_up.long()
    sign = (xf < 0) & (idx > 0)
    return (idx | (sign.long() << 3)).to(torch.uint8)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=codes.device)
    c = codes.long()
    mag = grid[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes, element 2i in the low nibble."""
    if codes.shape[-1] % 2:
        raise DecodeGapError(f"nvfp4: the last dimension must be even to pack two values a byte, got {codes.shape[-1]}")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    p = packed.to(torch.uint8)
    lo, hi = p & 0xF, p >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)


# --------------------------------------------------------------------------- tensors


@dataclass
class NVFP4Tensor:
    packed: torch.Tensor  # [N, K/2] uint8
    block_scales: torch.Tensor  # [N, K/16] float8_e4m3fn
    tensor_scale: torch.Tensor  # [] float32
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.block_scales.numel() + 4

    def to(self, device) -> "NVFP4Tensor":
        return NVFP4Tensor(self.packed.to(device), self.block_scales.to(device), self.tensor_scale.to(device), self.shape)


def nvfp4_bytes(n: int, k: int) -> int:
    """Bytes of an [n, k] NVFP4 weight: half a byte a value, one byte per 16 values, 4 bytes per tensor."""
    return n * k // 2 + n * k // BLOCK + 4


def quantize_nvfp4(w: torch.Tensor) -> NVFP4Tensor:
    if w.dim() != 2:
        raise DecodeGapError(f"nvfp4: expected a 2-D weight, got shape {tuple(w.shape)}")
    n, k = w.shape
    if k % BLOCK:
        raise DecodeGapError(f"nvfp4: K={k} is not a multiple of the 16-value block")
    wf = w.float().reshape(n, k // BLOCK, BLOCK)
    amax = wf.abs().amax()
    tensor_scale = torch.where(amax > 0, amax / (E4M3_MAX * E2M1_MAX), torch.ones_like(amax)).float()
    block_amax = wf.abs().amax(dim=-1)
    block_scales = (block_amax / E2M1_MAX / tensor_scale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    eff = block_scales.float() * tensor_scale
    scaled = torch.where(eff[..., None] > 0, wf / eff[..., None].clamp(min=torch.finfo(torch.float32).tiny), 0.0)
    codes = round_to_e2m1(scaled).reshape(n, k)
    return NVFP4Tensor(pack_e2m1(codes), block_scales, tensor_scale, (n, k))


def _byte_table(device) -> torch.Tensor:
    """[256, 2] float32: the two E2M1 values (low nibble first) of every byte."""
    codes = torch.arange(256, dtype=torch.int32, device=device)
    return torch.stack((e2m1_to_float(codes & 0xF), e2m1_to_float(codes >> 4)), dim=-1)


def dequantize_nvfp4(q: NVFP4Tensor) -> torch.Tensor:
    """fp32 [N, K] from the packed codes, the E4M3 block scales and the tensor scale."""
    n, k = q.shape
    vals = _byte_table(q.packed.device)[q.packed.long()].reshape(n, k // BLOCK, BLOCK)
    vals.mul_((q.block_scales.float() * q.tensor_scale)[..., None])
    return vals.reshape(n, k)


def reference_mm(x: torch.Tensor, q: NVFP4Tensor) -> torch.Tensor:
    """Dequantise-then-matmul in fp32: the reference both kernels are checked against."""
    return x.float() @ dequantize_nvfp4(q).t()


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN never passes: it propagates)."""
    o, r = out.double().cpu(), ref.double().cpu()
    denom = r.norm().item()
    return (o - r).norm().item() / denom if denom > 0 else (o - r).norm().item()


# --------------------------------------------------------------------------- Triton weight-only kernel


@dataclass(frozen=True)
class LaunchPlan:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    k_per_split: int
    use_dot: bool
    num_warps: int

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return (math.ceil(n / self.block_n), self.split_k, math.ceil(m / self.block_m))


def plan_launch(m: int, n: int, k: int, sm_count: int) -> LaunchPlan:
    """Block sizes and split-K for a decode-shaped weight-only GEMM: enough programs to fill the GPU twice."""
    if m < 1 or n < 1 or k < 1:
        raise DecodeGapError(f"nvfp4: bad GEMM shape M={m} N={n} K={k}")
    if k % BLOCK:
        raise DecodeGapError(f"nvfp4: K={k} is not a multiple of the 16-value block")
    if m == 1:
        bm, bn, bk, dot, warps = 1, 32, 256, False, 4
    else:
        bm = 16 if m <= 16 else 32 if m <= 32 else 64
        bn, bk, dot, warps = 64, 128, True, 4
    tiles = math.ceil(n / bn) * math.ceil(m / bm)
    k_blocks = math.ceil(k / bk)
    target = 2 * max(sm_count, 1)
    split = 1 if tiles >= target else min(k_blocks, math.ceil(target / tiles))
    k_per_split = math.ceil(k_blocks / split) * bk
    split = math.ceil(k / k_per_split)
    return LaunchPlan(bm, bn, bk, split, k_per_split, dot, warps)


if HAVE_TRITON:

    @triton.jit
    def e4m3_scale_tl(amax):
        """e4m3_scale in a kernel: Triton takes no global float here, so the two numbers are written out (a test
        holds them to E4M3_MAX and E4M3_SCALE_FLOOR)."""
        return tl.maximum(amax / 448.0, 1e-12)

    @triton.jit
    def _e2m1_to_bf16(c):
        # code s|e1 e0|m -> bf16 bits: e > 0: exponent e - 1 + 127, mantissa top bit m; e == 0: 0 or 0.5
        c = c.to(tl.int16)
        s = (c >> 3) & 1
        e = (c >> 1) & 3
        m = c & 1
        bits = tl.where(e == 0, m * (126 << 7), ((e + 126) << 7) | (m << 6))
        bits = bits | (s << 15)
        return bits.to(tl.bfloat16, bitcast=True)

    @triton.jit
    def _nvfp4_weight_only_kernel(
        x_ptr, wq_ptr, ws_ptr, ts_ptr, out_ptr,
        M, N, K, k_per_split,
        stride_xm, stride_wq, stride_ws, stride_os, stride_om,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
        DOT_BF16: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_m = tl.program_id(2)
        HALF: tl.constexpr = BLOCK_K // 2
        GROUPS: tl.constexpr = BLOCK_K // 16
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_mask = offs_m < M
        n_mask = offs_n < N
        k_start = pid_s * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_b = k0 // 2 + tl.arange(0, HALF)
            wb = tl.load(
                wq_ptr + offs_n[:, None] * stride_wq + offs_b[None, :],
                mask=n_mask[:, None] & (offs_b[None, :] < k_end // 2),
                other=0,
            )
            lo = _e2m1_to_bf16(wb & 0xF)
            hi = _e2m1_to_bf16(wb >> 4)
            w = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))  # element 2i from the low nibble
            offs_g = k0 // 16 + tl.arange(0, GROUPS)
            s = tl.load(
                ws_ptr + offs_n[:, None] * stride_ws + offs_g[None, :],
                mask=n_mask[:, None] & (offs_g[None, :] < k_end // 16),
                other=0.0,
            ).to(tl.float32)
            w = tl.reshape(tl.reshape(w.to(tl.float32), (BLOCK_N, GROUPS, 16)) * s[:, :, None], (BLOCK_N, BLOCK_K))
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(
                x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                mask=m_mask[:, None] & (offs_k[None, :] < k_end),
                other=0.0,
            )
            if USE_DOT:
                if DOT_BF16:
                    acc += tl.dot(x.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
                else:  # Triton's CPU interpreter mishandles bf16 dots: fp32 operands there, same indexing
                    acc += tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
            else:
                acc += tl.sum(x.to(tl.float32)[:, None, :] * w[None, :, :], axis=2)
        acc = acc * tl.load(ts_ptr)
        out = out_ptr + pid_s * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


if HAVE_TRITON:

    @triton.jit
    def _nvfp4_weight_only_kernel_v2(
        x_ptr, wq_ptr, ws_ptr, ts_ptr, out_ptr,
        M, N, K, k_per_split,
        stride_xm, stride_wq, stride_ws, stride_os, stride_om,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
        DOT_BF16: tl.constexpr,
    ):
        # Same contract as v1 (slower on an H200, kept as the fallback), without re-interleaving: the low nibbles (even k) and the high nibbles (odd k)
        # are multiplied by the even and odd elements of x separately; each byte's scale is gathered directly
        # (8 bytes = 16 values share one), so no join/reshape layout shuffles are needed.
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_m = tl.program_id(2)
        HALF: tl.constexpr = BLOCK_K // 2
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_mask = offs_m < M
        n_mask = offs_n < N
        k_start = pid_s * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_b = k0 // 2 + tl.arange(0, HALF)
            wmask = n_mask[:, None] & (offs_b[None, :] < k_end // 2)
            wb = tl.load(wq_ptr + offs_n[:, None] * stride_wq + offs_b[None, :], mask=wmask, other=0)
            s = tl.load(ws_ptr + offs_n[:, None] * stride_ws + (offs_b // 8)[None, :], mask=wmask, other=0.0)
            s = s.to(tl.float32)
            lo = _e2m1_to_bf16(wb & 0xF).to(tl.float32) * s
            hi = _e2m1_to_bf16(wb >> 4).to(tl.float32) * s
            offs_e = k0 + 2 * tl.arange(0, HALF)
            xmask = m_mask[:, None] & (offs_e[None, :] < k_end)
            xp = x_ptr + offs_m[:, None] * stride_xm + offs_e[None, :]
            xe = tl.load(xp, mask=xmask, other=0.0)
            xo = tl.load(xp + 1, mask=xmask, other=0.0)
            if USE_DOT:
                if DOT_BF16:
                    acc += tl.dot(xe.to(tl.bfloat16), tl.trans(lo.to(tl.bfloat16)))
                    acc += tl.dot(xo.to(tl.bfloat16), tl.trans(hi.to(tl.bfloat16)))
                else:  # Triton's CPU interpreter mishandles bf16 dots: fp32 operands there, same indexing
                    acc += tl.dot(xe.to(tl.float32), tl.trans(lo), input_precision="ieee")
                    acc += tl.dot(xo.to(tl.float32), tl.trans(hi), input_precision="ieee")
            else:
                acc += tl.sum(xe.to(tl.float32)[:, None, :] * lo[None, :, :], axis=2)
                acc += tl.sum(xo.to(tl.float32)[:, None, :] * hi[None, :, :], axis=2)
        acc = acc * tl.load(ts_ptr)
        out = out_ptr + pid_s * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def interpreted() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1), which CI uses to run the kernel."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def sm_count(device) -> int:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


class WeightOnlyGemm:
    """y = x @ W^T with W in NVFP4, dequantised in registers (Triton). Buffers are allocated once, so a
    call is graph-capturable."""

    label = "nvfp4-weight-only"

    # "gemv" (lowprec.Nvfp4Gemv, M <= 16) first: 5-7x faster than v1 on the large M=1 shapes of an H200; "wide"
    # (fp4wide.Nvfp4WideGemm) above 16 rows, where K is whole iterations of its form on sm89+; then v1: measured on an
    # H200, v1 ran 1.7-1.9x faster than v2 (18432x7168, M=1: 240 us vs 435 us)
    VARIANTS = ("gemv", "wide", "v1", "v2")
    _broken: set[str] = set()  # variants that failed to compile on this host (the next one runs instead)

    def __init__(self, q: NVFP4Tensor, m: int, device, out_dtype=torch.bfloat16, plan: LaunchPlan | None = None,
                 variant: str = "auto"):
        self.variant = variant
        if not HAVE_TRITON:
            raise DecodeGapError("nvfp4-weight-only needs Triton, which is not installed")
        self.q = q
        n, k = q.shape
        self.m, self.n, self.k = m, n, k
        self.plan = plan or plan_launch(m, n, k, sm_count(device))
        self.out = torch.empty((m, n), dtype=out_dtype, device=device)
        self.partial = (
            torch.empty((self.plan.split_k, m, n), dtype=torch.float32, device=device) if self.plan.split_k > 1 else None
        )
        self.scales = q.block_scales
        self.grid = self.plan.grid(m, n)
        self.device = device
        self._gemv = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != (self.m, self.k):
            raise DecodeGapError(f"nvfp4-weight-only: x has shape {tuple(x.shape)}, expected {(self.m, self.k)}")
        if self.variant == "auto":
            for v in self.VARIANTS:
                # the GEMVs (lowprec.py) for M <= 16: tensor cores when K % 64 == 0, the CUDA-core asm form at M=1
                if v in self._broken or (v == "gemv" and (self.m > 16 or (self.m > 1 and self.k % 64))):
                    continue
                if v == "wide" and not _wide_fits(self.m, self.k, self.device):
                    continue
                try:
                    self._launch(v, x)
                except Exception:
                    if v == self.VARIANTS[-1]:
                        raise
                    WeightOnlyGemm._broken.add(v)
                    continue
                self.variant = v
                break
        else:
            self._launch(self.variant, x)
        if self.variant in ("gemv", "wide"):
            return self._gemv.out
        if self.partial is not None:
            self.out.copy_(self.partial.sum(dim=0))
        return self.out

    def _launch(self, variant: str, x: torch.Tensor) -> None:
        if variant in ("gemv", "wide"):  # the tensor-core forms (lazy imports: both modules import this one)
            if self._gemv is None:
                if variant == "gemv":
                    from .lowprec import Nvfp4Gemv as form  # the word-decode GEMV, M <= 16
                else:
                    from .fp4wide import Nvfp4WideGemm as form  # above 16 rows
                self._gemv = form(self.q, self.m, self.device, out_dtype=self.out.dtype)
            self._gemv(x)
            return
        p = self.plan
        kernel = _nvfp4_weight_only_kernel_v2 if variant == "v2" else _nvfp4_weight_only_kernel
        target = self.partial if self.partial is not None else self.out
        stride_os = target.stride(0) if self.partial is not None else 0
        stride_om = target.stride(1) if self.partial is not None else target.stride(0)
        kernel[self.grid](
            x, self.q.packed, self.scales, self.q.tensor_scale, target,
            self.m, self.n, self.k, p.k_per_split,
            x.stride(0), self.q.packed.stride(0), self.scales.stride(0), stride_os, stride_om,
            BLOCK_M=p.block_m, BLOCK_N=p.block_n, BLOCK_K=p.block_k, USE_DOT=p.use_dot,
            DOT_BF16=not interpreted(), num_warps=p.num_warps,
        )


def _wide_fits(m: int, k: int, device) -> bool:
    from .fp4wide import fits  # lazy: it imports this module

    return fits(m, k, device)


# --------------------------------------------------------------------------- sm100 / sm120: FP4 tensor cores


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """cuBLAS' swizzled layout for block scales (128 x 4 tiles as 32 x 16), padded; flattened."""
    rows, cols = scales.shape
    rb, cb = math.ceil(rows / 128), math.ceil(cols / 4)
    padded = scales
    if (rows, cols) != (rb * 128, cb * 4):
        padded = torch.zeros((rb * 128, cb * 4), dtype=scales.dtype, device=scales.device)
        padded[:rows, :cols] = scales
    blocks = padded.view(rb, 128, cb, 4).permute(0, 2, 1, 3)
    return blocks.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16).flatten()


def has_fp4_tensor_cores(device) -> bool:
    if torch.device(device).type != "cuda" or not hasattr(torch, "float4_e2m1fn_x2"):
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major in (10, 12)


class ScaledMmNvfp4:
    """W4A4 NVFP4 GEMM on FP4 tensor cores via `torch._scaled_mm` (sm100 / sm120). The activation is
    quantised once outside the timed call; both per-tensor scales are applied to the output outside it too
    (a fused epilogue does that in servers)."""

    label = "torch._scaled_mm(nvfp4)"

    def __init__(self, q: NVFP4Tensor, x: torch.Tensor):
        self.xq = quantize_nvfp4(x)
        self.a = self.xq.packed.view(torch.float4_e2m1fn_x2)
        self.b = q.packed.view(torch.float4_e2m1fn_x2).t()
        self.sa = to_blocked(self.xq.block_scales)
        self.sb = to_blocked(q.block_scales)
        self.alpha = self.xq.tensor_scale * q.tensor_scale

    def __call__(self) -> torch.Tensor:
        return torch._scaled_mm(self.a, self.b, self.sa, self.sb, out_dtype=torch.bfloat16)

    def result(self) -> torch.Tensor:
        return self().float() * self.alpha
