"""FP8 weight-only GEMV on tensor cores for M = 1-16: e4m3 weights with per-tensor or 128x128 block scales, x in
bf16 as the model gives it (no activation quantisation), fp32 sums.

Why: above batch 1 the fp8 candidates were cuBLAS's (per-tensor `_scaled_mm` on a quantised x; for block scales
kernels/fp8block.py, x quantised 1x128 by a kernel of its own, then cuBLAS's blockwise form) and our CUDA-core GEMV
(lowprec.DenseGemv, M FMAs per weight value: a batch-1 kernel). At M = 2-16 decode still reads every weight byte once,
so the kernel that streams them fastest sets the ceiling.

The form (lowprec's NVFP4 tensor-core GEMV, with a one-instruction decode):
- each warp owns a 16-row tile and up to 8 x rows (at M = 9-16 two warps a tile, x rows 0-7 and 8-15: XWARP);
  the weight is repacked once (`repack`, the same bytes) so that per step of 32 K values
  lane 4g+q loads 16 contiguous bytes, its A fragments of two mma.sync.m16n8k16: rows g and g+8 at K values 8q..8q+7
  in pairs. The K values of the MMA's slots are permuted (the sum does not care) so that the same lane's B operand is
  x row g at K values 8q..8q+7: one 16-byte load of x as it is, no packing kernel;
- decode: cvt.rn.f16x2.e4m3x2, one instruction a pair (exact: every e4m3 value is an fp16); x's bf16 pairs to fp16
  pairs in three instructions, exact for |x| in fp16's normal range, 6.1e-5 to 65504 (bf16's 8 significant bits fit
  in fp16's 11): smaller values lose bits as fp16 subnormals, and a larger one would not fit;
- four steps (128 K values) an iteration, the next iteration's weights loaded before this one's math (a register
  double buffer), x of the iteration's four steps loaded before its first MMA (every warp reads x: L1 / L2);
- block scales: a tile's 16 rows lie in one 128-row block and an iteration is one 128-value block, so each
  iteration's sums are multiplied by its scale into fp32 accumulators; per-tensor: once at the end;
- K split over the grid's second axis until about WARPS_PER_SM warps an SM; fp32 partial sums added with relaxed
  atomics, then lowprec.cast_zero's kernel (a programmatic dependent on sm90) casts them and leaves zeros; unsplit,
  the program stores bf16 itself.
Under TRITON_INTERPRET (no inline asm) the same repacked bytes and x positions go through plain Triton: e4m3 by bitcast,
x rounded to fp16 as on the GPU, each lane's products summed over the lanes of a quad.

Measured on an H200 (2026-12-04, benchmarks/device/fp8mma_probe.py, read 4456 GB/s, CUDA-graph replay over rotating
weight copies), us and the fraction of read bandwidth on the fp8 bytes. DeepSeek-V3 shapes with 128x128 block
scales, this GEMV / cuBLAS's blockwise call with x's 1x128 quantisation (fp8block.py):
(the M=16 column: the first version, one warp a tile and both x sets; the second, two warps a tile, below)
  36864x7168  M=4 61.7 (0.96) / 87.1, M=8 62.5 (0.95) / 87.0, M=16 85.7 (0.69) / 87.4
  7168x18432  M=4 32.3 (0.92) / 43.1, M=8 33.4 (0.89) / 43.4, M=16 45.9 (0.65) / 43.6
  24576x1536  M=4 13.1 / 16.9, M=8 13.5 / 17.2, M=16 18.6 / 17.5
  4608x7168   M=4 11.1 / 18.1, M=8 12.5 / 18.2, M=16 16.8 / 18.3
  2112x7168   M=4 7.1 / 17.1, M=8 8.2 / 17.3, M=16 9.4 / 17.3
  7168x2048   M=4 7.3 / 10.8, M=8 7.5 / 10.8, M=16 9.2 / 10.9
and at M=1 against our CUDA-core block GEMV (lowprec.DenseGemv): 36864x7168 63.4 / 64.0, 7168x18432 32.9 / 33.6,
24576x1536 12.7 / 15.2, 4608x7168 11.2 / 12.7, 2112x7168 6.8 / 8.5, 7168x2048 7.0 / 6.6. Llama-3.1-8B with the
per-tensor scale, this GEMV / `_scaled_mm` on a pre-quantised x / DenseGemv: 4096x14336 M=1 16.7 (0.79) / 19.7 /
20.8, M=4 17.0 / 19.5, M=8 18.5 / 19.4, M=16 21.6 / 19.9; 4096x4096 M=1 7.3 / 7.4 / 8.9, M = 4-16 7.7-10.1 / 7.2-7.3;
28672x4096 M=1 30.7 / 29.5 / 28.8, M = 4-16 33.4-43.3 / 29.3-30.0. So no kernel wins every shape: the gemm stage
times this one beside the others (microbench/gemm.py) and the kernel level picks per shape (simulate/layers.py).
There (benchmarks/simulate_gpu.py, CUDA graph, 512 tokens, before / after) DeepSeek-V3 fp8-block TP8 took 14.12 /
12.43 ms a step at batch 8 and 20.26 / 19.06 at batch 16 (attention projections 2.87 -> 2.06 ms, shared expert
1.59 -> 0.88), 7.25 / 7.18 at batch 1; Llama-3.1-8B fp8 3.11 / 3.00 at batch 1 and 3.62 / 3.56 at batch 8.
At M = 9-16 one warp held both x sets (twice the x loads, conversions, MMAs and accumulators: 72 registers, 7
programs an SM, the K split doubled to fill the SMs); two warps a tile, each with one set (XWARP: 48 registers, the
tile's weight read twice, the second read from L1 or L2), were faster on every block-scaled shape (H200, 2026-12-04,
M=16, us, before / after): 36864x7168 84.6 / 69.5-71.0 (0.84 of read bandwidth; cuBLAS's blockwise call 83.3-89.4),
7168x18432 46.5 / 41.3, 24576x1536 19.2 / 13.9, 4608x7168 16.8 / 14.0, 2112x7168 9.4 / 8.5, 7168x2048 9.2 / 8.4;
DeepSeek-V3 fp8-block TP8 at batch 16 took 18.50 and 19.02 ms a step in two runs (19.06 before; its routed
experts, which this GEMV does not run, 11.59 and 12.54 of them). With x's rows past M read as row M-1 where that
is faster (x_clamped): per-tensor 28672x4096 M=16 43.1 / 33.3 (`_scaled_mm` 30.0-32.6), 4096x14336 21.1 / 20.1-20.5.
Grouped (GroupedFp8Mma: one token's routed experts at M=1, the kernel's third grid axis a slot, its expert through
ids): H200 (2026-12-04, benchmarks/device/grouped_fp8_probe.py, 8 experts, the default warps, read 4.3-4.4 TB/s), us
against lowprec.GroupedExperts on CUDA cores and a plain read of the selected experts' bytes: block scales
DeepSeek-V3 TP1 84.7 / 96.1 (80.5), TP8 12.8 / 34.3 (12.4), GLM-5 TP1 73.9 / 78.3 (69.0), TP8 11.8 / 26.2 (11.0);
per-expert scales DeepSeek-V3 TP1 89.8 / 92.5, TP8 13.4 / 36.7. The CUDA-core form's one program a row block and
slot left TP8's 256-row experts a few warps an SM; here the K split counts every slot's tiles. In the MoE stage,
after its other rows, the TP8 figures read 16.2-16.8 (the CUDA-core form's 34-37 there too). At the kernel level
(benchmarks/simulate_gpu.py, CUDA graph, before / after) DeepSeek-V3 TP8 at batch 1 took 7.15 / 6.13 ms a step
with block scales (routed experts 2.30 / 1.29 ms) and 7.30 / 6.16 ms per-tensor (2.47 / 1.33).
Tried and kept out:
- Triton's own tl.dot with the operands swapped (acc[BLOCK_N, 16] += W @ x^T, the e4m3 tile converted in registers,
  wgmma, tl.range software pipelining): 0.34-0.38 of read bandwidth on 2112x7168 and 7168x2048, 0.57-0.64 on
  36864x7168 and 7168x18432, 0.75 on Llama-3.1-8B 28672x4096 (35.4 us, against 30.0 for per-tensor `_scaled_mm`);
- x packed to fp16 once a call by a kernel before the GEMV (its programmatic dependent, first weights loaded before
  the wait), so no warp converts: slower on 22 of 24 cases (36864x7168 M = 4 / 8 62.2 / 63.7 -> 68.7 / 71.1 us;
  2112x7168 M=16 9.6 -> 11.7); a step's x loaded before its own MMA (the first version): slower on 17 of 18;
- W8A8: x quantised 1x128 to e4m3 by fp8block.quantize_act (1.5-1.9 us a call), the raw e4m3 bytes straight into
  mma.m16n8k32 (no decode, no x conversion, half the MMAs): faster than the first version on none of 32 cases (8
  shapes, M = 1-16; 36864x7168 M = 1 / 8 / 16 64.8 / 92.6 / 85.9 against 63.4 / 63.6 / 85.7), so the instructions
  were not what held M=16 back;
- at M = 9-16 (XWARP): 8 warps a program (slower on 16 of 16 cases), twice or four times the K split (slower on 27
  of 32), weights loaded without the evict-first hint (up to twice as slow), an L1-allocating load with L2's
  evict-first policy in inline asm (level, 36864x7168 M=16 81.6 against 71.0), a barrier an iteration to keep the two
  warps of a tile in step (level or slower but at 36864x7168 M = 9 / 16).
"""

from __future__ import annotations

import math

import torch

from ..errors import DecodeGapError
from . import lowprec as lp

FP8_BLOCK = lp.FP8_BLOCK
STEP_K = 32  # K values a lane's 16-byte load covers (two MMAs)
ITER_K = 128  # K values an iteration (four steps: one 128-value scale block)
WARPS = 4  # H200: 8 warps a program lost on 5 of 6 shapes at M = 4-16, 2 on all
# x of an iteration's four steps loaded before its first MMA, not each step's before its own: H200 (2026-12-04,
# fp8mma_probe.py), faster on 17 of 18 cases, e.g. DeepSeek-V3 36864x7168 at M = 4 / 8 / 16 67.0 / 69.9 / 113.6 ->
# 62.3 / 63.7 / 97.3 us (0.97 / 0.95 / 0.62 of read bandwidth), 7168x18432 34.5 / 37.2 / 58.6 -> 32.4 / 34.4 / 51.3
X_AHEAD = True
# the K split's target: H200 (2026-12-04), 24 left 36864x7168 unsplit, 79.0 us at M=4 against 66.6 split in two
WARPS_PER_SM = 32
FP8_MMA_GROUPED = "triton grouped fp8 tensor-core gemv"


def x_clamped(block: bool, m: int) -> bool:
    """Whether x's rows past M are read as row M-1 (XCLAMP) rather than masked: with the per-tensor scale at every M,
    with block scales at M=1 and M = 9-11. H200 (2026-12-04, benchmarks/device/fp8mma_probe.py, us, clamped /
    masked; the same in the two runs that timed both): per-tensor 28672x4096 M = 1 / 4 / 8 / 16 29.0 / 30.3 / 31.3 /
    33.3 against 30.7 / 33.9 / 35.8 / 40.6, 4096x14336 16.0 / 16.8 / 17.6 / 20.1 against 16.7 / 17.2 / 18.1 /
    21.8; block 36864x7168 M=1 61.2 against 63.9, M = 4 / 8 67.3 / 71.4 against 62.3 / 63.9, M=9 72.8-73.7 against
    79.0-97.0 (masked, this one shape swings from run to run), M = 13-16 74.4-78.2 against 69.6-76.1; 7168x18432
    M = 13-16 41.7-42.9 against 40.5-41.4. Unmeasured M (2, 3, 12) take their neighbours' choice."""
    return not block or m == 1 or 9 <= m <= 11


def k_split(warps: int, iters: int, sms: int, split: int | None = None) -> tuple[int, int]:
    """(splits, iterations a split) of K's `iters` iterations: `split`, else enough for about WARPS_PER_SM warps an
    SM when `warps` warps run each split; every split a whole number of iterations."""
    want = split or max(1, min(iters, round(WARPS_PER_SM * sms / warps)))
    per = math.ceil(iters / want)
    return math.ceil(iters / per), per


def grouped_available(device, h: int, i: int) -> bool:
    """Whether GroupedFp8Mma runs experts of hidden size h and intermediate size i here: available() for both GEMVs'
    K (H for gate_up, I for down)."""
    return available(device, h) and available(device, i)


def available(device, k: int) -> bool:
    """Whether this GEMV runs for a K on this device: Triton, K whole 128-value iterations, and on a GPU sm89+."""
    return lp.HAVE_TRITON and k % ITER_K == 0 and lp.mma_supported(device)


def repack(data: torch.Tensor) -> torch.Tensor:
    """e4m3 [N, K] (K a multiple of 128) -> int32 [ceil(N/16), K/32, 32 lanes, 4]: lane 4g+q's 16 bytes of a step,
    pairs (row g, row g+8) at K values 8q + 2j, 8q + 2j + 1 for j = 0..3. Rows past N are zeros."""
    n, k = data.shape
    nt = math.ceil(n / 16)
    b = torch.zeros((nt * 16, k), dtype=torch.uint8, device=data.device)
    b[:n] = data.view(torch.uint8)
    # [tile, h, g, step, q, j, byte] -> [tile, step, g, q, j, h, byte]
    b = b.view(nt, 2, 8, k // STEP_K, 4, 4, 2).permute(0, 3, 2, 4, 5, 1, 6)
    return b.reshape(nt, k // STEP_K, 32, 16).contiguous().view(torch.int32)


def repack_experts(data: torch.Tensor) -> torch.Tensor:
    """e4m3 [E, N, K] -> int32 [E, ceil(N/16), K/32, 32, 4], repacked an expert at a time into one buffer (a whole
    model's experts: no second full-size copy while it is made)."""
    e, n, k = data.shape
    out = torch.empty((e, math.ceil(n / 16), k // STEP_K, 32, 4), dtype=torch.int32, device=data.device)
    for x in range(e):
        out[x] = repack(data[x])
    return out


def unpack(words: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of repack (for tests): e4m3 [n, K]."""
    nt, ks = words.shape[:2]
    b = words.contiguous().view(torch.uint8).reshape(nt, ks, 8, 4, 4, 2, 2).permute(0, 5, 2, 1, 3, 4, 6)
    return b.reshape(nt * 16, ks * STEP_K)[:n].contiguous().view(torch.float8_e4m3fn)


if lp.HAVE_TRITON:
    import triton
    import triton.language as tl

    from .lowprec import _store_sums

    def _mma_asm() -> str:
        """One step of a lane: $0-$7 the accumulators (the first MMA's four, the second's four), then the 4 weight
        words, then 4 x words (bf16 pairs, K values 8q..8q+7 of the warp's x row g)."""
        lines = ["{", ".reg .b32 a<8>, b<4>, lo, hi;", ".reg .b16 p, r;"]
        for i in range(4):  # word i: (row g, row g+8) at K slots of pair i -> A registers 2i (row g), 2i+1 (g+8)
            lines += [f"mov.b32 {{p, r}}, ${8 + i};", f"cvt.rn.f16x2.e4m3x2 a{2 * i}, p;",
                      f"cvt.rn.f16x2.e4m3x2 a{2 * i + 1}, r;"]
        for i in range(4):  # x word i: bf16 (lo, hi) -> fp16x2
            lines += [f"shl.b32 lo, ${12 + i}, 16;", f"and.b32 hi, ${12 + i}, 0xFFFF0000;",
                      f"cvt.rn.f16x2.f32 b{i}, hi, lo;"]
        for mm in range(2):  # MMA mm: A = pairs 2mm (slots 2q, 2q+1) and 2mm+1 (slots 2q+8, 2q+9)
            acc = ",".join(f"${4 * mm + e}" for e in range(4))
            a = ",".join(f"a{4 * mm + e}" for e in range(4))
            lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{acc}}}, {{{a}}}, "
                         f"{{b{2 * mm},b{2 * mm + 1}}}, {{{acc}}};")
        lines.append("}")
        return "\n".join(lines)

    _ASM = tl.constexpr(_mma_asm())
    _CONS = tl.constexpr(",".join(["=f"] * 8 + ["r"] * 8 + [str(i) for i in range(8)]))

    @triton.jit
    def _step(w, x, a0, a1):
        return tl.inline_asm_elementwise(_ASM, _CONS, [w, x, a0, a1], dtype=(tl.float32, tl.float32), is_pure=True,
                                         pack=4)

    @triton.jit
    def _wloads(wp, it):
        """Iteration it's weights: four steps of a lane's 16 bytes (an iteration: 4 steps of 32 lanes x 4 words),
        streamed once (evict-first keeps x and the scales in L2)."""
        wo = it * 512
        return (tl.load(wp + wo, eviction_policy="evict_first"), tl.load(wp + wo + 128, eviction_policy="evict_first"),
                tl.load(wp + wo + 256, eviction_policy="evict_first"),
                tl.load(wp + wo + 384, eviction_policy="evict_first"))

    @triton.jit
    def _iteration(wa, wb, wc, wd, xp, xmask, it, a0, a1, XAHEAD: tl.constexpr):
        """One iteration's four steps; x (16 words a step) loaded here: a step's before its math, or (XAHEAD) all
        four steps' before the first step's math."""
        xo = it * 64
        x = tl.load(xp + xo, mask=xmask, other=0)
        if XAHEAD:
            xb = tl.load(xp + xo + 16, mask=xmask, other=0)
            xc = tl.load(xp + xo + 32, mask=xmask, other=0)
            xd = tl.load(xp + xo + 48, mask=xmask, other=0)
            a0, a1 = _step(wa, x, a0, a1)
            a0, a1 = _step(wb, xb, a0, a1)
            a0, a1 = _step(wc, xc, a0, a1)
            a0, a1 = _step(wd, xd, a0, a1)
        else:
            a0, a1 = _step(wa, x, a0, a1)
            a0, a1 = _step(wb, tl.load(xp + xo + 16, mask=xmask, other=0), a0, a1)
            a0, a1 = _step(wc, tl.load(xp + xo + 32, mask=xmask, other=0), a0, a1)
            a0, a1 = _step(wd, tl.load(xp + xo + 48, mask=xmask, other=0), a0, a1)
        return a0, a1

    @triton.jit
    def _fp8_mma_kernel(w_ptr, s_ptr, x_ptr, xw_ptr, out_ptr, M, N, NT, ITERS, iters_per_split, stride_wt,
                        stride_sn, stride_x, stride_xw, stride_om, WARPS: tl.constexpr, XWARP: tl.constexpr,
                        BLOCK_SCALES: tl.constexpr, ATOMIC: tl.constexpr, DEPS: tl.constexpr,
                        USE_ASM: tl.constexpr, XAHEAD: tl.constexpr = False, XCLAMP: tl.constexpr = False,
                        ids_ptr=None, rw_ptr=None, stride_we=0, stride_se=0, stride_xg=0, stride_xwg=0, stride_og=0,
                        GROUPED: tl.constexpr = False, ROW_WEIGHT: tl.constexpr = False):
        """GROUPED (GroupedFp8Mma): the grid's third axis is a slot, its expert ids_ptr[slot]; the weight and scales
        move by that expert's strides, x and the output by the slot's; ROW_WEIGHT: the sums times rw_ptr[slot]."""
        T: tl.constexpr = 32 * WARPS
        pid_n = tl.program_id(0)
        if GROUPED:
            slot = tl.program_id(2)
            ex = tl.load(ids_ptr + slot).to(tl.int64)
            w_ptr += ex * stride_we
            s_ptr += ex * stride_se
            x_ptr += slot * stride_xg
            xw_ptr += slot * stride_xwg
            out_ptr += slot * stride_og
        it0 = tl.program_id(1) * iters_per_split
        it1 = tl.minimum(it0 + iters_per_split, ITERS)
        t = tl.arange(0, T)
        lane = t % 32
        g = lane // 4
        q = lane % 4
        if XWARP:  # M = 9-16: two warps a tile, x rows 0-7 and 8-15 (the tile's second read of the weight: L1 or L2)
            tile = pid_n * (WARPS // 2) + t // 64
            xs = (t // 32) % 2 * 8
        else:
            tile = pid_n * WARPS + t // 32
            xs = 0
        tile_c = tl.minimum(tile, NT - 1)
        c4 = tl.arange(0, 4)
        sp = s_ptr + (tile_c * 16 // 128) * stride_sn  # the tile's 128-row block
        if USE_ASM:
            wp = w_ptr + tile_c.to(tl.int64)[:, None] * stride_wt + (lane * 4)[:, None] + c4[None, :]
            if XCLAMP:  # lanes of x rows past M read row M-1 (their sums are not stored): no masked loads
                xp = xw_ptr + (tl.minimum(g + xs, M - 1) * stride_xw + q * 4)[:, None] + c4[None, :]
                xmask = (g >= 0)[:, None]  # all true
            else:
                xp = xw_ptr + ((g + xs) * stride_xw + q * 4)[:, None] + c4[None, :]
                xmask = (g + xs < M)[:, None]
            acc0 = tl.zeros((T, 4), dtype=tl.float32)
            acc1 = tl.zeros((T, 4), dtype=tl.float32)
            wa, wb, wc, wd = _wloads(wp, it0)
            for it in range(it0, it1):
                na, nb, nc, nd = _wloads(wp, tl.minimum(it + 1, it1 - 1))  # the last loads its own again (unused)
                if BLOCK_SCALES:
                    z = tl.zeros((T, 4), dtype=tl.float32)
                    b0, b1 = _iteration(wa, wb, wc, wd, xp, xmask, it, z, z, XAHEAD)
                    acc0 += (b0 + b1) * tl.load(sp + it)[:, None]
                else:
                    acc0, acc1 = _iteration(wa, wb, wc, wd, xp, xmask, it, acc0, acc1, XAHEAD)
                wa = na
                wb = nb
                wc = nc
                wd = nd
            if DEPS:  # the cast kernel behind this one may launch (it waits for the grid before reading)
                tl.extra.cuda.gdc_launch_dependents()
            y = acc0 + acc1
            if not BLOCK_SCALES:
                y = y * tl.load(s_ptr)
            if ROW_WEIGHT:
                y = y * tl.load(rw_ptr + tl.program_id(2))
            # D fragment: element e of lane 4g+q is row g + 8 (e // 2) of the tile, x row 2q + e % 2 of the warp's set
            e = c4[None, :]
            rows = (tile * 16 + g)[:, None] + 8 * (e // 2)
            ms = (2 * q + xs)[:, None] + e % 2
            _store_sums(out_ptr + ms * stride_om + rows, y, (rows < N) & (ms < M), ATOMIC)
        else:
            # the interpreter: lane 4g+q's bytes decoded, times its warp's x rows at the same K values (rounded to
            # fp16 as the GPU path does), per (row half h, x row); then the four lanes of a quad summed
            if XWARP:  # [T or 1, 8]: the lane's x rows
                mr = xs[:, None] + tl.arange(0, 8)[None, :]
            else:
                mr = tl.arange(0, 8)[None, :]
            xm = mr < M
            y = tl.zeros((T, 2, 8), dtype=tl.float32)
            for it in range(it0, it1):
                blk = tl.zeros((T, 2, 8), dtype=tl.float32)
                for st in tl.static_range(4):
                    step = it * 4 + st
                    for j in tl.static_range(4):
                        word = tl.load(w_ptr + tile_c.to(tl.int64) * stride_wt + step * 128 + lane * 4 + j)
                        for h in tl.static_range(2):
                            for b in tl.static_range(2):
                                code = ((word >> (16 * h + 8 * b)) & 0xFF).to(tl.uint8)
                                wv = code.to(tl.float8e4nv, bitcast=True).to(tl.float32)
                                kk = step * 32 + q * 8 + 2 * j + b
                                xv = tl.load(x_ptr + mr * stride_x + kk[:, None], mask=xm, other=0.0)
                                xv = xv.to(tl.float16).to(tl.float32)
                                hv = (tl.arange(0, 2) == h)[None, :, None]
                                blk += tl.where(hv, (wv[:, None] * xv)[:, None, :], 0.0)
                if BLOCK_SCALES:
                    blk = blk * tl.load(sp + it)[:, None, None]
                y += blk
            if not BLOCK_SCALES:
                y = y * tl.load(s_ptr)
            if ROW_WEIGHT:
                y = y * tl.load(rw_ptr + tl.program_id(2))
            yq = tl.sum(tl.reshape(y, (WARPS, 8, 4, 2, 8)), axis=2)  # [warp, g, h, x row of its set]
            wv4 = tl.arange(0, WARPS)[:, None, None, None]
            gv = tl.arange(0, 8)[None, :, None, None]
            hv4 = tl.arange(0, 2)[None, None, :, None]
            mv = tl.arange(0, 8)[None, None, None, :]
            if XWARP:
                rows4 = (pid_n * (WARPS // 2) + wv4 // 2) * 16 + gv + 8 * hv4
                mv = mv + wv4 % 2 * 8
            else:
                rows4 = (pid_n * WARPS + wv4) * 16 + gv + 8 * hv4
            om4 = (rows4 < N) & (mv < M)
            _store_sums(out_ptr + mv * stride_om + rows4, yq, om4, ATOMIC)


class Fp8MmaGemv:
    """y[M, N] = x[M, K] @ W^T for e4m3 W (lp.Fp8Weight: per-tensor or 128x128 block scales), M = 1-16, K a multiple
    of 128, on tensor cores (sm89+; the CPU interpreter runs the same layout in plain Triton). The weight is repacked
    once; buffers are made once; a call is the GEMV (and the cast kernel where K is split), CUDA-graph capturable."""

    label_prefix = "triton fp8 tensor-core gemv"

    def __init__(self, w: lp.Fp8Weight, m: int, device, out_dtype=torch.bfloat16, split: int | None = None,
                 x_ahead: bool | None = None, warps: int | None = None, xclamp: bool | None = None):
        if not lp.HAVE_TRITON:
            raise DecodeGapError("the fp8 tensor-core GEMV needs Triton, which is not installed")
        if not lp.mma_supported(device):
            raise DecodeGapError("the fp8 tensor-core GEMV needs sm89+ (cvt.rn.f16x2.e4m3x2)")
        n, k = w.data.shape
        if not 1 <= m <= 16:
            raise DecodeGapError(f"fp8 tensor-core gemv: 1 <= M <= 16 (M={m})")
        if k % ITER_K:
            raise DecodeGapError(f"fp8 tensor-core gemv: K={k} is not a multiple of {ITER_K}")
        self.m, self.n, self.k, self.block = m, n, k, w.block
        self.words = repack(w.data)  # the only copy kept: reference() unpacks it
        nt = self.words.shape[0]
        self.x_ahead = X_AHEAD if x_ahead is None else x_ahead
        self.xclamp = x_clamped(w.block, m) if xclamp is None else xclamp
        self.warps = warps or WARPS
        iters = k // ITER_K
        self.xwarp = m > 8  # two warps a tile (XWARP)
        if self.xwarp and self.warps % 2:
            raise DecodeGapError(f"fp8 tensor-core gemv: above 8 rows two warps share a tile, so a program's warps "
                                 f"must be even (warps={self.warps})")
        groups = math.ceil(nt / (self.warps // 2 if self.xwarp else self.warps))
        sms = lp.sm_count(device)
        self.split, self.iters_per_split = k_split(groups * self.warps, iters, sms, split)
        self.iters = iters
        self.grid = (groups, self.split)
        self.out = torch.empty((m, n), dtype=out_dtype, device=device)
        self.acc = torch.zeros((m, n), dtype=torch.float32, device=device) if self.split > 1 else None
        self.pdl = self.acc is not None and lp.pdl_supported(device)
        self.scales = w.scales if w.block else w.scales.reshape(1).float().contiguous()

    @property
    def label(self) -> str:
        scales = "128x128 block scales" if self.block else "per-tensor scale"
        return f"{self.label_prefix} (mma.sync, {scales}, split={self.split}; bf16 x, weight-only)"

    @property
    def kernels(self) -> int:
        return 2 if self.acc is not None else 1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != (self.m, self.k) or x.dtype != torch.bfloat16 or x.stride(1) != 1:
            raise DecodeGapError(f"fp8 tensor-core gemv: x must be a row-major bf16 [{self.m}, {self.k}] (got "
                                 f"{x.dtype} {tuple(x.shape)})")
        target = self.acc if self.acc is not None else self.out
        xw = x.view(torch.int32)  # the bf16 pairs the MMA's B operand is made of (converted to fp16 in the asm)
        compiled = _fp8_mma_kernel[self.grid](
            self.words, self.scales, x, xw, target, self.m, self.n, self.words.shape[0], self.iters,
            self.iters_per_split, self.words.stride(0), self.scales.stride(0) if self.block else 0,
            x.stride(0), xw.stride(0), target.stride(0), WARPS=self.warps, XWARP=self.xwarp, BLOCK_SCALES=self.block,
            ATOMIC=self.acc is not None, DEPS=self.pdl, USE_ASM=not lp.interpreted(), XAHEAD=self.x_ahead,
            XCLAMP=self.xclamp, num_warps=self.warps)
        self.compiled = compiled
        if self.acc is not None:
            lp.cast_zero(self.acc, self.out, self.pdl)
        return self.out

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantise-then-matmul in fp32, on the weight unpacked from the repacked copy."""
        scales = self.scales if self.block else self.scales.reshape(())
        return x.float() @ lp.dequantize_fp8(lp.Fp8Weight(unpack(self.words, self.n), scales, self.block)).t()


def grouped_warps(block: bool) -> int:
    """Warps a program of the grouped form: 8 with 128x128 block scales, 4 with per-expert scales. H200 (2026-12-04,
    benchmarks/device/grouped_fp8_probe.py, 8 experts at M=1, us, 4 / 8 warps; a plain read of the bytes beside):
    block scales DeepSeek-V3 TP1 88.9 / 84.7 (80.5), TP8 13.4 / 12.8 (12.4), GLM-5 TP1 77.6 / 73.9 (69.0), TP8 12.7 /
    11.8 (11.0); per-expert DeepSeek-V3 TP1 89.8 / 88.8, TP8 13.4 / 14.1, GLM-5 TP1 78.5 / 78.0, TP8 12.7 / 12.6. The
    CUDA-core grouped GEMV (lowprec.GroupedExperts) took 96.1, 34.3, 78.3 and 26.2 with block scales, 92.5, 36.7,
    80.0 and 30.4 per expert. The MoE stage times both warp counts (microbench/moe.py)."""
    return 8 if block else 4


class GroupedFp8Mma:
    """One token's routed experts at M=1 on tensor cores (the GEMV above, grouped): silu(x W_gate^T) * (x W_up^T),
    then (.) W_down^T, weighted and summed, reading only the selected experts' weights. The same call interface as
    lowprec.GroupedExperts (its fp8 path runs the CUDA-core GEMV): `ids` [S] and `weights` [S] are buffers a caller
    may copy each token's choice into (graph-safe); a call returns `out` [1, H].

    `w13` is an Fp8Weight [E, 2I, H] (gate rows, then up rows) and `w2` [E, H, I], per-expert or 128x128 block
    scales, H and I multiples of 128. Four kernels a call: gate_up (fp32 sums added into `gu`, its K split or not), a
    SiLU kernel (gu -> the bf16 activation, gu left at zero), down (each slot's sums times its routing weight added
    into `acc`) and lowprec.cast_zero (acc -> out, acc left at zero); the two small ones are programmatic dependents
    (sm90) of the GEMV before them. The weights are repacked once, an expert at a time (the caller's copy is not
    kept)."""

    def __init__(self, w13: lp.Fp8Weight, w2: lp.Fp8Weight, ids: torch.Tensor, weights: torch.Tensor, device,
                 out_dtype=torch.bfloat16, warps: int | None = None):
        if not lp.HAVE_TRITON:
            raise DecodeGapError("the grouped fp8 tensor-core GEMV needs Triton, which is not installed")
        if not lp.mma_supported(device):
            raise DecodeGapError("the grouped fp8 tensor-core GEMV needs sm89+ (cvt.rn.f16x2.e4m3x2)")
        e, two_i, h = w13.data.shape
        e2, hh, i = w2.data.shape
        if two_i != 2 * i or hh != h or e2 != e or w13.block != w2.block:
            raise DecodeGapError(f"grouped fp8 gemv: w13 {tuple(w13.data.shape)} and w2 {tuple(w2.data.shape)} do not "
                                 "fit together (or mix scale kinds)")
        if h % ITER_K or i % ITER_K:
            raise DecodeGapError(f"grouped fp8 gemv: H and I must be multiples of {ITER_K} (H={h}, I={i})")
        self.h, self.i, self.block = h, i, w13.block
        self.words13, self.words2 = repack_experts(w13.data), repack_experts(w2.data)
        self.s13 = w13.scales.float().contiguous()
        self.s2 = w2.scales.float().contiguous()
        self.ids = ids.to(torch.int32).contiguous()
        self.rw = weights.float().contiguous()
        self.slots = int(self.ids.numel())
        self.pdl = lp.pdl_supported(device)
        self.gu = torch.zeros((self.slots, 2 * i), dtype=torch.float32, device=device)
        self.act = torch.empty((self.slots, i), dtype=torch.bfloat16, device=device)
        self.acc = torch.zeros((h,), dtype=torch.float32, device=device)
        self.out = torch.empty((1, h), dtype=out_dtype, device=device)
        self.sms = lp.sm_count(device)
        self.set_warps(warps or grouped_warps(self.block))

    def set_warps(self, warps: int) -> None:
        """Warps a program (4 or 8: 16-row tiles a program), and the K splits that follow from it."""
        self.warps = warps
        self.plan13 = self._plan(2 * self.i, self.h, self.sms)
        self.plan2 = self._plan(self.h, self.i, self.sms)

    def _plan(self, n: int, k: int, sms: int) -> tuple[tuple[int, int, int], int]:
        """(grid, iterations a split) for an [n, k] GEMV of every slot: K split until about WARPS_PER_SM warps an SM,
        counting every slot's programs (the dense GEMV's rule)."""
        groups = math.ceil(math.ceil(n / 16) / self.warps)
        splits, per = k_split(groups * self.slots * self.warps, k // ITER_K, sms)
        return (groups, splits, self.slots), per

    @property
    def label(self) -> str:
        scales = "128x128 block scales" if self.block else "per-expert scales"
        return (f"{FP8_MMA_GROUPED} ({scales}; w={self.warps}, gate_up split={self.plan13[0][1]}, down split="
                f"{self.plan2[0][1]}; bf16 x, weight-only)")

    @property
    def kernels(self) -> int:
        return 4

    def _gemv(self, words, scales, x, out, n, k, plan, xg: int, og: int, row_weight: bool, deps: bool) -> None:
        grid, per = plan
        xw = x.view(torch.int32)
        _fp8_mma_kernel[grid](
            words, scales, x, xw, out, 1, n, words.shape[1], k // ITER_K, per, words.stride(1),
            scales.stride(1) if self.block else 0, 0, 0, 0, WARPS=self.warps, XWARP=False, BLOCK_SCALES=self.block,
            ATOMIC=True, DEPS=deps, USE_ASM=not lp.interpreted(), XAHEAD=X_AHEAD, XCLAMP=True,
            ids_ptr=self.ids, rw_ptr=self.rw, stride_we=words.stride(0),
            stride_se=scales.stride(0) if self.block else 1,
            stride_xg=xg, stride_xwg=xg // 2, stride_og=og, GROUPED=True, ROW_WEIGHT=row_weight,
            num_warps=self.warps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != (1, self.h):
            raise DecodeGapError(f"grouped fp8 gemv: x has shape {tuple(x.shape)}, expected (1, {self.h})")
        if x.dtype != torch.bfloat16 or x.stride(1) != 1:  # the MMA reads x's bf16 pairs (a CPU step runs fp32)
            x = x.to(torch.bfloat16).contiguous()
        h, i = self.h, self.i
        self._gemv(self.words13, self.s13, x, self.gu, 2 * i, h, self.plan13, 0, self.gu.stride(0), False, self.pdl)
        lp._silu_pack_kernel[(triton.cdiv(i, 1024), self.slots)](
            self.gu, self.act, i, self.gu.stride(0), self.act.stride(0), BLOCK=1024, PDL=self.pdl, BX=True,
            **lp._pdl_launch(self.pdl))
        self._gemv(self.words2, self.s2, self.act, self.acc, h, i, self.plan2, self.act.stride(0), 0, True, self.pdl)
        lp.cast_zero(self.acc, self.out, self.pdl)
        return self.out

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every expert's gate_up [E, 2I, H] and down [E, H, I] in fp32, unpacked from the repacked copy (checks)."""
        def experts(words: torch.Tensor, scales: torch.Tensor, n: int) -> torch.Tensor:
            return torch.stack([lp.dequantize_fp8(lp.Fp8Weight(unpack(words[e], n), scales[e], self.block))
                                for e in range(words.shape[0])])

        return experts(self.words13, self.s13, 2 * self.i), experts(self.words2, self.s2, self.h)

    def weight_bytes(self) -> int:
        """Bytes of the selected experts' weights (and scales): what a call must read."""
        per = lp.fp8_bytes(2 * self.i, self.h, self.block) + lp.fp8_bytes(self.h, self.i, self.block)
        return per * self.slots
