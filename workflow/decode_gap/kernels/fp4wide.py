"""NVFP4 weight-only GEMM for batches above 16 rows (M = 17-64 and beyond) on tensor cores, in Triton.

Why: lowprec's tensor-core GEMV takes at most 16 rows of x a pass (two MMAs a decoded tile). Above that the
weight-only path fell back to nvfp4.py's first kernel (a Triton tl.dot on a tile dequantised through shared memory),
which read the weight at about 0.1 of the H200's bandwidth: a user at batch 32 saw "NVFP4 is slow on Hopper" when it
was our kernel. Decoding is what costs (about 85 instructions a 512-byte warp step, lowprec's docstring), so the fix
is to use each decoded tile for more rows of x.

The form (read from vLLM's Marlin, which decodes FP4 in registers straight into mma.sync operands; written anew):
- the weight in lowprec's bf16 tensor-core layout (`repack_mma(bx=True)`: one warp load is 512 contiguous bytes and a
  lane's 16 bytes are its A fragments of a 16-row tile), decoded by the same asm (`_fp4_mma_asm`) into bf16 and fed to
  four x sets of m16n8k16 MMAs (x rows 0-7, 8-15, 16-23, 24-31 of the chunk): 16 MMAs a decoded 64-value step;
- a program is WARPS 16-row tiles and one 32-row chunk of x; chunks that share a tile are neighbours in the grid, so
  the second pass over a tile runs beside the first (the weights stay evict-first: faster at M=64 too);
- x (bf16 as it is: its own pairs are the B operand) is loaded once a program and step as two [16, 32]-word chunks
  and handed to every warp through shared memory (lowprec's `_x_frags`); at 32 rows it is 4 KB a step against the
  program's 2 KB of weight, so loading it a warp would quadruple the L1 traffic;
- the weights and x's chunks are double-buffered in registers (the next iteration's loads before this one's math;
  126 registers on sm_90: 32 accumulators and 32 x fragments a lane among them);
- K is split until about `warps_per_sm` warps an SM (every chunk's tiles counted; no split where K <= SHORT_K); the
  split sums go into fp32 with atomics, and a cast kernel, launched as a programmatic dependent, writes them out and
  leaves zeros (lowprec.cast_zero).

The compute side: at 64 rows each weight byte takes 228 flops, past the H200's bf16 ridge (989 TFLOPS dense / 4.8
TB/s: about 206), so there even a kernel at the dense peak would be bound by the tensor cores, and mma.sync runs
below that peak: at M=64 a plain read of the weight is no longer a reachable yardstick (the gemm stage's table has
bf16 torch.mm on the same shapes beside it).
Under the CPU interpreter the decode and MMAs run as plain Triton on the same layout (the asm needs a GPU).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..errors import DecodeGapError
from . import lowprec as lp
from . import nvfp4 as nv

ROWS = 32  # x rows a program (four x sets of 8 against each decoded tile)

if lp.HAVE_TRITON:
    import triton
    import triton.language as tl

    _WIDE_ASM = tl.constexpr(lp._fp4_mma_asm(ROWS // 8, bx=True))
    _WIDE_CONS = tl.constexpr(lp._fp4_mma_cons(ROWS // 8))

    @triton.jit
    def _wide_math(w, s, xlo, xhi, T: tl.constexpr, a0, a1, a2, a3, a4, a5, a6, a7):
        """One decoded 64-value step into the four x sets' accumulators (set b: a(2b), a(2b+1), by MMA parity)."""
        sv = tl.broadcast_to(s[:, None], (T, 4))
        return tl.inline_asm_elementwise(
            _WIDE_ASM, _WIDE_CONS,
            [w, sv, xlo[0], xlo[1], xlo[2], xlo[3], xhi[0], xhi[1], xhi[2], xhi[3], a0, a1, a2, a3, a4, a5, a6, a7],
            dtype=(tl.float32,) * 8, is_pure=True, pack=4)

    @triton.jit
    def _wide_x(xcp_lo, xcp_hi, i, U: tl.constexpr):
        """x rows 0-15 and 16-31 of the chunk at U steps (2 or 4) from step i: one [16, 32]-word load each a program
        (4 registers a thread), the others unused when U = 2."""
        x0 = (tl.load(xcp_lo + i * 32), tl.load(xcp_hi + i * 32))
        x1 = (tl.load(xcp_lo + (i + 1) * 32), tl.load(xcp_hi + (i + 1) * 32))
        x2 = x1
        x3 = x1
        if U >= 4:
            x2 = (tl.load(xcp_lo + (i + 2) * 32), tl.load(xcp_hi + (i + 2) * 32))
            x3 = (tl.load(xcp_lo + (i + 3) * 32), tl.load(xcp_hi + (i + 3) * 32))
        return x0, x1, x2, x3

    @triton.jit
    def _wide_step(w, xc, T: tl.constexpr, WARPS: tl.constexpr, a0, a1, a2, a3, a4, a5, a6, a7):
        """One step: its weight operands w (lowprec._fp4_mma_wload) against its x chunks xc, handed to every warp's
        fragments through shared memory (lowprec._x_frags)."""
        xlo = lp._x_frags(xc[0], WARPS)
        xhi = lp._x_frags(xc[1], WARPS)
        return _wide_math(w[0], w[1], xlo, xhi, T, a0, a1, a2, a3, a4, a5, a6, a7)

    @triton.jit
    def _wide_steps(w, xc, U: tl.constexpr, T: tl.constexpr, WARPS: tl.constexpr, a0, a1, a2, a3, a4, a5, a6, a7):
        """U steps (2 or 4): their weights w (lowprec._fp4_mma_wloads) and x chunks xc (_wide_x)."""
        a0, a1, a2, a3, a4, a5, a6, a7 = _wide_step(w[0], xc[0], T, WARPS, a0, a1, a2, a3, a4, a5, a6, a7)
        a0, a1, a2, a3, a4, a5, a6, a7 = _wide_step(w[1], xc[1], T, WARPS, a0, a1, a2, a3, a4, a5, a6, a7)
        if U >= 4:
            a0, a1, a2, a3, a4, a5, a6, a7 = _wide_step(w[2], xc[2], T, WARPS, a0, a1, a2, a3, a4, a5, a6, a7)
            a0, a1, a2, a3, a4, a5, a6, a7 = _wide_step(w[3], xc[3], T, WARPS, a0, a1, a2, a3, a4, a5, a6, a7)
        return a0, a1, a2, a3, a4, a5, a6, a7

    @triton.jit
    def _wide_store(out_ptr, y, rows, ms, N, M, stride_om, ATOMIC: tl.constexpr):
        om = (rows < N) & (ms < M)
        lp._store_sums(out_ptr + ms * stride_om + rows, y, om, ATOMIC)

    @triton.jit
    def _fp4_wide_kernel(x_ptr, w_ptr, s_ptr, ts_ptr, out_ptr, M, N, NT, CHUNKS, steps_per_split, NSTEPS,
                         stride_xm, stride_wt, stride_st, stride_om, WARPS: tl.constexpr, UNROLL: tl.constexpr,
                         ATOMIC: tl.constexpr, USE_ASM: tl.constexpr, EV: tl.constexpr = "",
                         DEPS: tl.constexpr = False, XAHEAD: tl.constexpr = True):
        """y[M, N] = x W^T (module docstring): program (tile group, 32-row chunk of x), K split on axis 1. x_ptr is
        x's bf16 pairs (int32). ATOMIC: fp32 partial sums added at out_ptr. DEPS: the cast kernel behind it may
        launch once every program is past its loop. XAHEAD: x's chunks loaded an iteration ahead, as the weights
        (16 registers a thread at 2 steps an iteration), else in the iteration that uses them."""
        T: tl.constexpr = 32 * WARPS
        pid = tl.program_id(0)
        chunk = pid % CHUNKS
        grp = pid // CHUNKS
        i0 = tl.program_id(1) * steps_per_split
        i1 = tl.minimum(i0 + steps_per_split, NSTEPS)
        m0 = chunk * 32
        ts = tl.load(ts_ptr) * 16384.0
        t, tile, lane, g, qq = lp._lanes(grp * WARPS, T, 1)
        tile_c = tl.minimum(tile, NT - 1)
        if USE_ASM:
            c4 = tl.arange(0, 4)
            wb = w_ptr + tile_c.to(tl.int64)[:, None] * stride_wt + (lane * 4)[:, None] + c4[None, :]
            sb = s_ptr + tile_c.to(tl.int64) * stride_st + lane
            r16 = tl.arange(0, 16)
            xcp_lo = x_ptr + tl.minimum(m0 + r16, M - 1)[:, None] * stride_xm + tl.arange(0, 32)[None, :]
            xcp_hi = x_ptr + tl.minimum(m0 + 16 + r16, M - 1)[:, None] * stride_xm + tl.arange(0, 32)[None, :]
            a0 = tl.zeros((T, 4), dtype=tl.float32)
            a1 = a0
            a2 = a0
            a3 = a0
            a4 = a0
            a5 = a0
            a6 = a0
            a7 = a0
            w = lp._fp4_mma_wloads(wb + i0 * 128, sb + i0 * 32, UNROLL, EV)
            xc = _wide_x(xcp_lo, xcp_hi, i0, UNROLL)
            for i in range(i0, i1, UNROLL):
                j = tl.minimum(i + UNROLL, i1 - UNROLL)  # the last iteration loads its own steps again (unused)
                wn = lp._fp4_mma_wloads(wb + j * 128, sb + j * 32, UNROLL, EV)
                xn = xc
                if XAHEAD:
                    xn = _wide_x(xcp_lo, xcp_hi, j, UNROLL)
                else:
                    xc = _wide_x(xcp_lo, xcp_hi, i, UNROLL)
                a0, a1, a2, a3, a4, a5, a6, a7 = _wide_steps(w, xc, UNROLL, T, WARPS, a0, a1, a2, a3, a4, a5, a6, a7)
                w = wn
                if XAHEAD:
                    xc = xn
            if DEPS:
                tl.extra.cuda.gdc_launch_dependents()
            # accumulator element e of lane 4g+q: weight row g + 8 (e // 2), x row 2q + e % 2 of the set
            e = c4[None, :]
            rows = (tile * 16 + g)[:, None] + 8 * (e // 2)
            ms = m0 + (2 * qq)[:, None] + e % 2
            rows = tl.where((tile < NT)[:, None], rows, N)
            _wide_store(out_ptr, (a0 + a1) * ts, rows, ms, N, M, stride_om, ATOMIC)
            _wide_store(out_ptr, (a2 + a3) * ts, rows, ms + 8, N, M, stride_om, ATOMIC)
            _wide_store(out_ptr, (a4 + a5) * ts, rows, ms + 16, N, M, stride_om, ATOMIC)
            _wide_store(out_ptr, (a6 + a7) * ts, rows, ms + 24, N, M, stride_om, ATOMIC)
        else:
            # the CPU interpreter: lowprec's plain-Triton decode of the same layout against the chunk's 32 rows,
            # [tile, g, row half, x row]
            part = lp._fp4_mma_emul_rows(x_ptr, w_ptr, s_ptr, tile_c, lane, qq, i0, i1, stride_wt, stride_st,
                                         stride_xm, m0, M, T, 32, True)
            y = tl.sum(tl.reshape(part, (WARPS, 8, 4, 2, 32)), axis=2) * ts
            wv = tl.arange(0, WARPS)[:, None, None, None]
            gv = tl.arange(0, 8)[None, :, None, None]
            hv = tl.arange(0, 2)[None, None, :, None]
            mv = m0 + tl.arange(0, 32)[None, None, None, :]
            rows = (grp * WARPS + wv) * 16 + gv + 8 * hv
            _wide_store(out_ptr, y, rows, mv, N, M, stride_om, ATOMIC)


# the forms the gemm stage times: 4 warps a program, 2 steps an iteration, x an iteration ahead, evict-first weights,
# K split for about 27 (the default) or 16 warps an SM. H200 (2026-12-04, benchmarks/device/wide_probe.py, CUDA-graph
# replay, us; each form checked first: 1.7e-3 against dequantise-then-matmul), this default / the first weight-only
# kernel (v1, what M > 16 ran before) / bf16 torch.mm on the same shape / a plain read of the NVFP4 bytes:
#   28672x4096  M=17 39.4 / 181.7 / 62.9 / 19.5; M=32 41.0 / 178.8 / 62.2; M=64 70.9 / 190.5 / 64.9
#   7168x18432  M=17 43.1 / 208.6 / 74.6 / 21.5; M=32 45.0 / 208.2 / 71.9; M=64 82.5 / 213.5 / 75.4
#   36864x7168  M=17 83.3 / 381.9 / 138.2 / 40.2; M=32 86.5 / 376.2 / 139.1; M=64 168.0 / 384.9 / 137.3
#   4096x14336  M=17 22.9 / 98.0 / 33.3 / 10.7; M=32 24.0 / 97.4 / 34.3; M=64 40.9 / 101.8 / 36.1
# so about half a plain read's speed up to 32 rows (1.4-1.7x faster than bf16, 4.1-4.8x than v1) and a quarter at 64
# (two passes; bf16 cuBLAS 1.1-1.2x faster there, which the gemm stage's table shows beside it). Tried and slower: x
# loaded in the iteration that uses it (121 registers: 44.3 against 40.1 on 28672x4096 M=32), 4 steps an iteration
# (167 registers: 44.5), 8-warp programs sharing x (125 registers: 1-18% slower on the four shapes), weights not
# evict-first (41.1 / 53.8 against 40.1 / 52.7 at 16 warps an SM), one step an iteration (104 registers: 44.9 / 48.5
# against 41.0 / 44.1 on 28672x4096 / 7168x18432 at M=32). At 126 registers 4 programs fit an SM. Where the rest
# goes (an ablation on the H200, wrong sums): with x's fragments made once before the loop, so no x load or layout
# conversion in it (96 registers), M=32 took 33.3 / 34.3 us, so x's path costs about a fifth and the decode with 16
# MMAs a step the rest (lowprec's 16-row form, 8 MMAs a step, 25.9 us on 28672x4096). Reaching the read would take
# the weights decoded into shared memory for wgmma (as CUTLASS's mixed-input Hopper GEMMs do), not mma.sync; Triton's
# tl.dot does lower such a form to wgmma, but with the decode in plain Triton its loop issues 18.6 instructions a
# weight byte a thread against this form's 7.5 (benchmarks/wgmma_decode_cost.py, compiled for sm_90, not timed)
WIDE_DEFAULT = lp.GemvConfig(64, 128, 4, mma=True, bx=True, evict=True, warps_per_sm=27)
# the seeds' TP8 shapes (H200, 2026-12-04, wide_probe.py; M = 17 / 32 / 64, us): about 16 warps an SM was fastest on
# the mid-sized ones (2624x6144 8.6 / 9.2 against 10.2 / 10.7 for the default; 6144x2048 8.1 / 8.8 against 9.3 /
# 10.1), about 8 on a narrow N with a long K (512x6144 4.7 / 4.9 / 5.8 against 5.0 / 5.7 / 8.0), and no K split, so
# no cast kernel, where K is one or two iterations (6144x256 2.9 / 3.1 / 4.1 against 4.6 / 4.8 / 6.0; 3584x512 4.0 /
# 4.2 / 4.6 against 3.7 / 4.7 / 5.9): the gemm stage times all four, and the kernel level takes no split at K <= 512
WIDE_NO_SPLIT = replace(WIDE_DEFAULT, split=1)
WIDE_CONFIGS = (WIDE_DEFAULT, replace(WIDE_DEFAULT, warps_per_sm=16), replace(WIDE_DEFAULT, warps_per_sm=8),
                WIDE_NO_SPLIT)
SHORT_K = 512  # at most this K, no K split (WIDE_NO_SPLIT)


def config_for(k: int) -> lp.GemvConfig:
    """The form Nvfp4WideGemm runs without one given: no K split where K is short (SHORT_K), else WIDE_DEFAULT."""
    return WIDE_NO_SPLIT if k <= SHORT_K else WIDE_DEFAULT


def fits(m: int, k: int, device) -> bool:
    """Whether this form runs [M, K] x [K, N] here: M above lowprec's 16 rows, K whole iterations of the form
    config_for(k) picks, sm89+ (its asm) or the CPU interpreter."""
    return (lp.HAVE_TRITON and m > 16 and k % config_for(k).block_k == 0 and lp.mma_supported(device)
            and lp.available(device))


class Nvfp4WideGemm:
    """y[M, N] = x[M, K] @ W^T with W in NVFP4 and M > 16, on tensor cores (module docstring). Buffers are allocated
    once: graph-capturable."""

    def __init__(self, q: nv.NVFP4Tensor, m: int, device, cfg: lp.GemvConfig | None = None,
                 out_dtype=torch.bfloat16, split: int | None = None):
        if not lp.HAVE_TRITON:
            raise DecodeGapError("nvfp4 wide gemm: needs Triton, which is not installed")
        n, k = q.shape
        cfg = cfg or config_for(k)
        if k % cfg.block_k or m < 1 or cfg.block_k not in (128, 256):
            raise DecodeGapError(f"nvfp4 wide gemm: needs 2 or 4 steps an iteration, K a multiple of them and M >= 1 "
                                 f"({cfg.name}, M={m}, K={k})")
        if not lp.mma_supported(device):
            raise DecodeGapError("nvfp4 wide gemm: the tensor-core form needs sm89+ (cvt.rn.f16x2.e4m3x2)")
        self.q, self.m, self.n, self.k, self.cfg = q, m, n, k, cfg
        self.words, self.scales = lp.repack_mma(q, bx=True)
        nt, nsteps = self.words.shape[0], self.words.shape[1]
        self.chunks = math.ceil(m / ROWS)
        groups = math.ceil(nt / cfg.warps)
        # every chunk's tiles count toward the warps an SM (a chunk is another pass over the same tiles)
        self.per, self.split = lp.mma_k_plan(cfg, nt * self.chunks, nsteps, lp.sm_count(device), split)
        self.grid = (groups * self.chunks, self.split)
        self.out = torch.empty((m, n), dtype=out_dtype, device=device)
        self.acc = torch.zeros((m, n), dtype=torch.float32, device=device) if self.split > 1 else None
        self.pdl = self.acc is not None and lp.pdl_supported(device)

    @property
    def label(self) -> str:
        return f"triton nvfp4 wide gemm (mma, {ROWS} rows a pass, {self.cfg.name}, split={self.split})"

    @property
    def kernels(self) -> int:
        """Kernel launches a call makes: the GEMM[, the cast of its split sums]."""
        return 1 if self.acc is None else 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != (self.m, self.k):
            raise DecodeGapError(f"nvfp4 wide gemm: x has shape {tuple(x.shape)}, expected {(self.m, self.k)}")
        xp = lp.bf16_pairs(x)
        target = self.acc if self.acc is not None else self.out
        _fp4_wide_kernel[self.grid](
            xp, self.words, self.scales, self.q.tensor_scale, target, self.m, self.n, self.words.shape[0],
            self.chunks, self.per, self.words.shape[1], xp.stride(0), self.words.stride(0), self.scales.stride(0),
            target.stride(0), WARPS=self.cfg.warps, UNROLL=self.cfg.block_k // 64, ATOMIC=self.acc is not None,
            USE_ASM=not lp.interpreted(), EV=lp._evict(self.cfg), DEPS=self.pdl, XAHEAD=not self.cfg.xjit,
            num_warps=self.cfg.warps)
        if self.acc is not None:
            lp.cast_zero(self.acc, self.out, self.pdl)
        return self.out
