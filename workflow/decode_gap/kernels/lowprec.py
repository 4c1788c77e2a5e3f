"""Low-precision decode GEMVs in Triton: NVFP4 weight-only, FP8 (per-tensor and 128x128 block scales) and bf16,
dense or grouped over the top-k experts a token selected.

Why hand-written: at M=1 a GEMV only has to stream the weight once, but the NVFP4 one has to decode every value,
so the instruction count per value, the L1 traffic and the bytes in flight, not the memory, decide whether it
reaches the bandwidth. Read from vLLM's Marlin FP4 and CUTLASS' mixed-input GEMM, written anew here.

NVFP4 tensor-core form (any M <= 16, the default where K % 64 == 0; `cfg.mma`):
- the weight is repacked once (`repack_mma`, as servers repack at load time; the same bytes) so that one warp load is
  512 contiguous bytes and one lane's 16 bytes are exactly its mma.sync fragments: group 4i+q of rows g and g+8 for
  lane 4g+q; the scales likewise (2 bytes a lane); within each 16-bit half the bits then move (`mma_bit_layout`) so
  that plane 0 sits where fp16 wants it and the others need one or two shifts: 11 integer operations decode a word's
  8 values (nibbles in place took 15);
- E2M1 decodes two values per 32-bit operation into an f16x2 (sign at bit 15, e1 e0 m at bits 11..9), exactly the E2M1
  value times 2^-14 (2^14 folds into the tensor scale); one f16x2 multiply by the E4M3 block scale (exact: a 2-bit
  times a 4-bit significand);
- the decoded pairs go straight into mma.sync.m16n8k16 (inline asm: Triton's own tl.dot put the decoded tile through
  shared memory and reached 8-12% of read bandwidth), x packed once per call into fp16 pairs as the B operand, fp32
  accumulators; M > 8 puts x rows 8-15 into a second MMA against the same decoded tile (one pass: on the H200 M=16
  on 28672x4096 went from 48.9 us, two passes reading the weight twice, to 34.6 us);
- a register double buffer keeps the next 2 or 4 steps' loads in flight during this step's math; weight loads are
  evict-first; K is split until there are about 27 warps an SM (18 with 4 steps an iteration); the GEMV launches as a
  programmatic dependent of the x packing (sm90+), so its launch overlaps it;
- stream-K (`cfg.stream`, the default at M = 9-16 where the K split with x loaded in place, `cfg.xjit`, would
  overflow one wave): one wave of as many programs as the SMs hold at once (from the compiled kernel's registers),
  the same number on every SM, each taking the same number of K iterations (give or take one) of all tiles' ranges
  laid end to end, so no partial second wave and no SM with a program more than another; the part that completes a
  tile group casts its sums (`_split_finish` counting iterations);
- x shared a program (`cfg.xshare`, the default at M = 9-16): a step's x rows 0-15 loaded once a program, one
  16-byte load a thread, and every warp's B fragments taken out of it through shared memory (`_x_frags`, Triton's
  layout conversion), where each warp loaded its own 2 KB a step before: four times the weight's bytes, and ncu put
  the lost cycles in long-scoreboard stalls on those loads (benchmarks/device/xtraffic_probe.py). H200, M = 16:
  2-8% faster on the eight shapes tried (28672x4096 27.8 -> 25.9 us, DeepSeek-V3 36864x7168 58.5 -> 53.8);
- tile pairs (`cfg.pair`, the default at M = 9-16 on the lm_heads): each warp two 16-row tiles against the same x
  fragments, so x is loaded once for twice the weight bytes, with no barrier; in 100-128 registers (4 programs an SM)
  it can win only where the grid has many waves anyway (H200, the lm_heads at M = 12-16: 128256x4096 89.7-94.2 us
  against 96.2-104.7 for the x-shared forms, the other two heads 7-10% faster at M = 12-14 and at M=16 faster or
  slower by machine) and loses with a K split (28672x4096 25.8 -> 29.8 at best);
- the bf16 form (`cfg.bx`, the default): x as it is, its own bf16 pairs, is the B operand, so no
  packing kernel runs. The weight's values are reordered within each word at repack time (`bx_order`) so that plane j
  pairs values 2j and 2j+1, as x's word j does. The planes decode into bf16 (e1 e0 m at bits 8..6: E2M1 x 2^-126,
  e = 0 being bf16's subnormal), the block scale goes to bf16 x 2^112 (from the fp16 conversion: shift, mask, add),
  and one fma.rn.bf16x2 multiplies them exactly. The MMA runs in bf16, and the last K split casts the sums and leaves
  zeros (`_split_finish`): one kernel a call. x is not rounded to fp16 either. Above M=1 (`cfg.cast`, what
  fp4_config_for plans there) the split's sums are cast instead by a kernel launched as the GEMV's programmatic
  dependent once its programs are past their loops, in place of the counter's serial round trips at the grid's end
  (H200: 0.1-0.6 us a call faster at M=8 and 0.6-1.3 at M=16 on the split shapes; at M=1 it lost in the kernel
  level's step).
NVFP4 CUDA-core forms (M=1): int32 words decoded in f16x2 inline asm (`asm`) or plain Triton, the 8 nibbles of a word
as 8 "planes" against strided x; kept where K is not whole 64-value steps (and timed by the gemm stage, which keeps the
fastest form per shape). Under the CPU interpreter every form runs its decode in plain Triton (the asm needs a GPU).

Measured on an H200 (benchmarks/lowprec_device.py, CUDA-graph replay, rotating weights; read bandwidth 4449 GB/s,
NVFP4 bytes = packed values + scales), fraction of read bandwidth at M=1, bf16 form: Llama-3.1-8B lm_head 88%
(75.2 us), gate_up 72% (20.8 us), down 59% (12.6 us, stream-K), qkv 42%, o_proj 33%; DeepSeek-V3 129280x7168 92%,
36864x7168 82%, 7168x18432 73%; GLM-5 154880x6144 89%, 24576x6144 75%. At M = 4 / 8 / 16 on 28672x4096: 70% / 65%
/ 49% (stream-K at 16). Converting both rows' block scales at once (5 operations a step where 10) took 3-5% off the
bf16 form's mid-sized shapes (DeepSeek-V3 36864x7168 44.4 -> 42.3 us, GLM-5 24576x6144 27.0 -> 25.8).
Where the rest goes: the bf16 form's loop issues about 85 instructions per 512-byte warp step (sm_90 SASS from
benchmarks/kernel_resources.py; 92 before the scales were converted together and the load addresses folded), two
thirds of them the decode and its scale multiply, on the integer and FMA pipes; at the 0.62-0.66 issued warps a
scheduler ncu showed (an earlier build), that is about 4.0 TB/s at the most. The last 4% fewer instructions bought
about 1%, so issue is not the whole limit. L2 prefetch ahead of the register double buffer (prefetch.global.L2 lane
by lane, or sm90 cp.async.bulk.prefetch of a tile's steps) was 5-30% slower on every shape tried. So was a ring of
cp.async stages in shared memory in place of that buffer (each thread reading back its own 16 bytes, no barrier;
commit 465ec3b, reverted): 3 or 7 steps in flight a warp in 60-70 registers, but 15 more instructions a step, and
1.5-2.1x slower at M=1 and 16 on every shape (H100, 2026-12-07; 28672x4096 at M=16: 43.6 and 50.8 us against 28.0
for the same form with the buffer in registers). x at M = 9-16 through a ring of cp.async copies with one barrier
an iteration in place of xshare's two a step (FP4_MMA_XRING) gained 2-3% on the H100's large shapes once its copies
went through L1, and lost on the small one (2026-12-06, rotated rounds): a candidate the gemm stage times. With
every tile reading tile 0's weights and scales (no DRAM traffic; benchmarks/device/ablate_probe.py) the loop alone takes
0.87-0.97 of a plain read's time on the wide shapes and 1.04-1.25 on the narrow and small ones (their K split's
finish included), and the 16 scale multiplies a step with their conversion (22 of 79 instructions, sm_90 SASS of
the K-sliced form) cost 2-12% (noscale_probe.py): the instruction stream, not the access pattern, is the limit.
What is left on the mid-sized shapes (measured before the bf16 form, which removed the packing kernel and the cast):
the x packing and the split-K cast were two more kernels (2.0 and 1.1 us a call beside a 19.9 us GEMV on
28672x4096), and the GEMV itself issues
about 87 instructions per 512-byte warp step (72% of them the decode and its scale multiply): ncu shows 0.62 issued
warps per scheduler at 64% DRAM throughput there (0.66 and 78% on the lm_head). A register cap for more resident warps
(spills) and one step an iteration (more instructions a step) were both slower; so was casting the split sums in the
GEMV's last split (counter and fences) once the launch overlapped the packing (the FP8 and bf16 GEMV, with no packing
kernel to overlap, does: `_split_finish`). The fp16 one-kernel form (`one_kernel`: each program packs its own x
words, the last split casts) beat the fp16 form only on narrow shapes (H200, 32-576 rows: 3.3-4.7 us against 4.4-5.6
us) and the bf16 form beats both there; from 1536 rows up it is 1.5-2.2x slower, hundreds of programs storing the
same x words. FP8 per-tensor GEMVs reach 87-103% on the large shapes (against 77-100% for
`_scaled_mm`), 80% on Llama-3.1-8B down (4096 rows: more K splits were slower); with 128x128 block scales applied
to x (DENSE_BLOCK_XSCALE) 86-102% from 6144x16384 (100M weights) up (28672x4096 91%, where summing each 128-column
block apart took 84%; H200, 2026-12-02); bf16 91-103%.

Grouped form (MoE at M=1, `GroupedExperts`): a third grid axis is the expert slot, whose id picks the expert's
repacked weight (repacked once at construction). NVFP4 tensor-core form (`_fp4_mma_grouped_kernel`, the default where
H and I are whole 64-value steps on sm89+): gate_up split over K into fp32 partials, then a tiny kernel writes
silu(gate) * up as fp16 straight into the down GEMV's packed x; down weighs and sums into fp32 with atomics; x packing
also zeroes the sums (5 launches with the bf16 cast, each after the packing a programmatic dependent of the one
before). Gate and up paired in one warp with the SiLU fused (no split, kept as a form) left too few warps in flight
(8 experts x 128 tiles) and was 2.5x slower. Measured on an H200 (8 of 256 experts, fraction of read bandwidth on the
selected experts' bytes): DeepSeek-V3 (2048x7168 experts) 61 us, 73% (the CUDA-core form: 130 us, 34%), GLM-5
(2048x6144) 54 us, 71% (131 us, 29%); the halves apart: gate_up 40 / 35 us (74-75%), down 21 / 19 us (67-72%).
bf16 / fp8 / fp8-block grouped: 97-98% / 86-87% / 83-85% (81-82% before the block scales went onto x). The grouped
bf16 form (`FP4_GROUPED_BX_*`, the default: no packing kernel, the SiLU kernel and a cast-and-zero kernel leave the sums at zero): 59.8 / 53.4 us, 76% / 72%
(H200, read bandwidth 4387 GB/s). For several tokens this form runs once a token, an expert read once a token that
chose it; `kernels/fp4moe.py` runs the same MMA loop over the token-expert pairs sorted by expert (a pair a column),
each expert hit read once a call, and is what the kernel level runs for NVFP4 experts.

One module on purpose: the dense, grouped, FP8 and NVFP4 kernels share the same decode helpers, tile
configurations and launch wrappers, and a kernel and its wrapper are read (and tuned) together.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..errors import DecodeGapError
from . import nvfp4 as nv
from .compiled import SmLimits, programs_per_sm

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the host
    triton = None
    tl = None
    HAVE_TRITON = False

FP4_UNSCALE = 16384.0  # 2^14: the decoded fp16 is the E2M1 value times 2^-14
# the tensor-core layout's bits in each 16-bit half of a word: plane j's magnitude (e1 e0 m) at MMA_MAG_BITS[j] and
# its sign at MMA_SIGN_BITS[j]; plane 0 sits where fp16 wants it (sign 15, e1 e0 m at 11-9), plane 1 three bits lower,
# planes 2 and 3 fill the rest (no four 7-bit-wide "s...eem" shapes fit in 16 bits, so those two take two shifts)
MMA_MAG_BITS = (9, 6, 3, 0)
MMA_SIGN_BITS = (15, 12, 13, 14)
# the bf16 form (GemvConfig.bx: x read as it is, its own bf16 pairs as the MMA's B operand, so no packing kernel):
# plane 0's magnitude where bf16 wants it (e1 e0 m at 8-6), plane 1 three bits lower, plane 2 at 2-0, plane 3 at
# 11-9 (the same operation count as the fp16 form); the signs as there. Within each word the values are reordered
# (BX_ORDER) so that plane j holds values 2j (low half) and 2j+1 (high half), the pair x holds in its word j.
BX_MAG_BITS = (6, 3, 0, 9)
BX_ORDER = (6, 4, 2, 0, 7, 5, 3, 1)  # packed position p holds value BX_ORDER[p] of the word's 8
# decoded bf16 = E2M1 x 2^-126 (bits in place: e = 0 is bf16's subnormal), block scale = E4M3 x 2^112, so their
# product is the value x 2^-14, as in the fp16 form (FP4_UNSCALE), and exact (at most 6 significant bits)
BX_SCALE_EXP = 112
FP8_BLOCK = 128
# A plane whose magnitude and sign move by different left shifts a and b (the fp16 form's planes 2 and 3, the bf16
# form's plane 2) is decoded as ((word & its 8 bits) * (2^a + 2^b)) & target: the multiply makes both shifted
# copies in one IMAD (the FMA pipe), 3 operations where two shifts, two masks and an OR took 4 after ptxas's LOP3
# fusion. The copies' stray bits add up only outside the target bits (carry_free checks every one of the 256 cases
# when the asm is built). sm_90 SASS, main loop (benchmarks/kernel_resources.py): the bf16 forms 4-5% shorter (the
# M = 9-16 ring: 200 -> 192 instructions a 2-step iteration), the fp16 forms 9-10% (167 -> 150). H100 80GB HBM3
# (2026-12-08, read 3159 GB/s, issue14_pending.sh imad and a second round in the other order; kernel checks 302
# passed), us, median of 3, with / without, the plan's forms: with no DRAM traffic (ablate_probe's L2 way) M=16
# 28672x4096 22.44 / 22.99, 7168x18432 23.66 / 24.60, 4096x14336 12.45 / 12.73; M=1 16.08 / 16.36, 20.26 /
# 20.84, 10.26 / 10.38; as they run, M=16 26.36 / 26.63, 26.88 / 27.32, 14.79 / 14.89, M=1 level (22.93 / 22.84,
# 26.23 / 26.25, 13.80 / 13.81: memory-bound on this card). ncu, 28672x4096 M=16 with no DRAM traffic: 12.10M
# warp instructions for 12.56M, 22.18 us for 22.85. Not yet timed on an H200, where M=16 runs past the read.
FP4_DECODE_IMAD = True


def _plane_bits(j: int, bx: bool) -> tuple[int, int, int, int]:
    """Plane j's (magnitude shift, sign shift, source bits in both halves, target bits: sign and e1 e0 m)."""
    mag_bit, top = (BX_MAG_BITS[j], 6) if bx else (MMA_MAG_BITS[j], 9)
    half = (7 << mag_bit) | (1 << MMA_SIGN_BITS[j])
    target = (7 << top) | (1 << 15)
    return top - mag_bit, 15 - MMA_SIGN_BITS[j], half | half << 16, target | target << 16


@functools.cache  # each asm string asks it again for every word and MMA of a step: the same few planes
def carry_free(source: int, multiplier: int, target: int) -> bool:
    """(w & source) * multiplier has, at the target bits, exactly the OR of its shifted copies for every w."""
    bits = [b for b in range(32) if source >> b & 1]
    shifts = [b for b in range(32) if multiplier >> b & 1]
    for subset in range(1 << len(bits)):
        t = sum(1 << b for i, b in enumerate(bits) if subset >> i & 1)
        ored = 0
        for s in shifts:
            ored |= t << s
        if (t * multiplier ^ ored) & target & 0xFFFFFFFF:
            return False
    return True


def decode_plane_ptx(j: int, word: str, bx: bool, imad: bool | None = None) -> list[str]:
    """PTX leaving plane j of the tensor-core-layout word in h (bf16 / fp16 pair, value x 2^-126 / 2^-14) and using
    t and u as scratch: plane 0 is in place (one AND), plane 1's sign and magnitude move together (a shift, an AND),
    the others move apart (the multiply of FP4_DECODE_IMAD, or two shifts, two ANDs and an OR)."""
    imad = FP4_DECODE_IMAD if imad is None else imad
    shift, sign_shift, source, target = _plane_bits(j, bx)
    both = f"0x{target:08X}"
    if shift == 0 and sign_shift == 0:
        return [f"and.b32 h, {word}, {both};"]
    move = f"shl.b32 t, {word}, {shift};" if shift >= 0 else f"shr.b32 t, {word}, {-shift};"
    if shift == sign_shift:
        return [move, f"and.b32 h, t, {both};"]
    multiplier = (1 << shift) + (1 << sign_shift) if shift >= 0 else 0
    if imad and multiplier and carry_free(source, multiplier, target):
        return [f"and.b32 t, {word}, 0x{source:08X};", f"mul.lo.u32 t, t, {multiplier};", f"and.b32 h, t, {both};"]
    mag = f"0x{target & 0x7FFF7FFF:08X}"
    return [move, f"and.b32 h, t, {mag};", f"shl.b32 u, {word}, {sign_shift};", "and.b32 u, u, 0x80008000;",
            "or.b32 h, h, u;"]


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def sm_count(device) -> int:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return 4


def available(device) -> bool:
    return HAVE_TRITON and (torch.device(device).type == "cuda" or interpreted())


# --------------------------------------------------------------------------- kernels

if HAVE_TRITON:

    @triton.jit
    def _to_fp8_rounded(v, ROUND: tl.constexpr):
        """v (fp32, |v| <= 448) as FP8 E4M3; with ROUND (pass `interpreted()`), first rounded to E4M3's grid (ties
        to even), where Triton 3.9's CPU interpreter truncates instead and drops a rounding carry into the exponent
        (-125.4 became -64, not -128; 7.8 became 4): so the interpreter checks a kernel's own FP8 path. Normal values
        keep 3 mantissa bits (in fp32's bits); subnormals (|v| < 2^-6) a multiple of 2^-9, by adding and taking off
        1.5 * 2^14, whose fp32 spacing is 2^-9, with v's sign put back (-0.0 stays -0.0)."""
        if ROUND:
            bits = v.to(tl.int32, bitcast=True)
            normal = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
            sub = ((tl.abs(v) + 24576.0) - 24576.0).to(tl.int32, bitcast=True) | (bits & -0x80000000)
            v = tl.where(tl.abs(v) >= 0.015625, normal, sub).to(tl.float32, bitcast=True)
        return v.to(tl.float8e4nv)

    @triton.jit
    def _fp4_pair(q, J: tl.constexpr):
        # nibbles 3-J (low half) and 7-J (high half) of every int32 word, as fp16 = E2M1 * 2^-14
        qj = q << (4 * J)
        h = (qj & -2147450880) | ((qj >> 3) & 0x0E000E00)  # 0x80008000 (signs), 0x0E000E00 (e1 e0 m)
        lo = h.to(tl.int16).to(tl.float16, bitcast=True)
        hi = (h >> 16).to(tl.int16).to(tl.float16, bitcast=True)
        return lo, hi

    @triton.jit
    def _fp4_pair_mma(q, J: tl.constexpr):
        # plane J of a tensor-core-layout word (MMA_MAG_BITS / MMA_SIGN_BITS), as fp16 = E2M1 * 2^-14: the same
        # shifts and masks as the asm in _fp4_mma_asm
        if J == 0:
            h = q & -1912566272  # 0x8E008E00
        elif J == 1:
            h = (q << 3) & -1912566272
        elif J == 2:
            h = ((q << 6) & 0x0E000E00) | ((q << 2) & -2147450880)  # 0x80008000
        else:
            h = ((q << 9) & 0x0E000E00) | ((q << 1) & -2147450880)
        lo = h.to(tl.int16).to(tl.float16, bitcast=True)
        hi = (h >> 16).to(tl.int16).to(tl.float16, bitcast=True)
        return lo, hi

    @triton.jit
    def _fp4_pair_bx(q, J: tl.constexpr):
        # plane J of a bf16-form word (BX_MAG_BITS / MMA_SIGN_BITS) as fp32 = E2M1 * 2^-126 (the bf16 bits the asm
        # makes, widened: a bf16 is the top half of an fp32), with the same shifts and masks as the asm
        if J == 0:
            h = q & -2118090304  # 0x81C081C0
        elif J == 1:
            h = (q << 3) & -2118090304
        elif J == 2:
            h = ((q << 6) & 0x01C001C0) | ((q << 2) & -2147450880)  # 0x80008000
        else:
            h = ((q >> 3) & 0x01C001C0) | ((q << 1) & -2147450880)
        return (h << 16).to(tl.float32, bitcast=True), (h & -65536).to(tl.float32, bitcast=True)

    @triton.jit
    def _bf16_half(v, HI: tl.constexpr):
        """The low (HI False) or high bf16 of an int32 word of x, as fp32."""
        return (v & -65536).to(tl.float32, bitcast=True) if HI else (v << 16).to(tl.float32, bitcast=True)

    @triton.jit
    def _emul_plane(word, J: tl.constexpr, sr, BX: tl.constexpr):
        """The interpreter's stand-in for the asm's decode and scale of plane J (sr: the fp16 block scale): fp32 pair
        (low, high), the value x 2^-14 in both forms; bf16 (BX) in fp32, exact as in bf16, fp16 rounded as there."""
        if BX:
            lo, hi = _fp4_pair_bx(word, J)
            s = sr.to(tl.float32) * 5.192296858534828e33  # the scale x 2^112, as the asm makes it
            return lo * s, hi * s
        else:
            lo, hi = _fp4_pair_mma(word, J)
            return (lo * sr).to(tl.float32), (hi * sr).to(tl.float32)

    @triton.jit
    def _emul_x(v, HI: tl.constexpr, BX: tl.constexpr):
        """The low (HI False) or high half of an int32 word of x as the MMA reads it: bf16 (BX) or packed fp16."""
        if BX:
            return _bf16_half(v, HI)
        else:
            return _f16_half(v, HI)

    @triton.jit
    def _fp4_rows(x_base, w_base, s_base, rows, nmask, w_start, w_end, stride_wn, stride_sn,
                  BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
        """sum_k W[rows, k] * x[k] (without the 2^14 and tensor scale) over words [w_start, w_end)."""
        acc = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
        for w0 in range(w_start, w_end, BLOCK_W):
            offs = w0 + tl.arange(0, BLOCK_W)
            wp = w_base + rows[:, None] * stride_wn + offs[None, :]
            sp = s_base + rows[:, None] * stride_sn + (offs // 2)[None, :]
            if EVEN_K:
                if EVEN_N:
                    q = tl.load(wp)
                    s = tl.load(sp)
                else:
                    q = tl.load(wp, mask=nmask[:, None], other=0)
                    s = tl.load(sp, mask=nmask[:, None], other=0.0)
            else:
                m2 = nmask[:, None] & (offs < w_end)[None, :]
                q = tl.load(wp, mask=m2, other=0)
                s = tl.load(sp, mask=m2, other=0.0)
            xb = x_base + offs * 8
            kmask = offs < w_end
            part = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
            for j in tl.static_range(4):
                lo, hi = _fp4_pair(q, j)
                if EVEN_K:
                    xl = tl.load(xb + (3 - j)).to(tl.float32)
                    xh = tl.load(xb + (7 - j)).to(tl.float32)
                else:
                    xl = tl.load(xb + (3 - j), mask=kmask, other=0.0).to(tl.float32)
                    xh = tl.load(xb + (7 - j), mask=kmask, other=0.0).to(tl.float32)
                part += lo.to(tl.float32) * xl[None, :]
                part += hi.to(tl.float32) * xh[None, :]
            acc += part * s.to(tl.float32)
        return tl.sum(acc, axis=1)

    @triton.jit
    def _fp4_word_dot(q, xb, kmask, EVEN_K: tl.constexpr):
        """[BLOCK_N, BLOCK_G] partial dot of one int32 word per (row, group) with x[xb + t], t = 0..7."""
        part = tl.zeros(q.shape, dtype=tl.float32)
        for j in tl.static_range(4):
            lo, hi = _fp4_pair(q, j)
            if EVEN_K:
                xl = tl.load(xb + (3 - j)).to(tl.float32)
                xh = tl.load(xb + (7 - j)).to(tl.float32)
            else:
                xl = tl.load(xb + (3 - j), mask=kmask, other=0.0).to(tl.float32)
                xh = tl.load(xb + (7 - j), mask=kmask, other=0.0).to(tl.float32)
            part += lo.to(tl.float32) * xl[None, :]
            part += hi.to(tl.float32) * xh[None, :]
        return part

    @triton.jit
    def _fp4_rows_g(x_base, w_base, s_base, rows, nmask, g_start, g_end, stride_wn, stride_sn,
                    BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
        """Like _fp4_rows, but over int64 groups (16 values, exactly one E4M3 scale): the scales load contiguously
        and multiply once per 16 values. `w_base` points at int64 words, strides in int64 / scale units."""
        acc = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.float32)
        for g0 in range(g_start, g_end, BLOCK_G):
            offs = g0 + tl.arange(0, BLOCK_G)
            wp = w_base + rows[:, None] * stride_wn + offs[None, :]
            sp = s_base + rows[:, None] * stride_sn + offs[None, :]
            kmask = offs < g_end
            if EVEN_K:
                if EVEN_N:
                    q = tl.load(wp)
                    s = tl.load(sp)
                else:
                    q = tl.load(wp, mask=nmask[:, None], other=0)
                    s = tl.load(sp, mask=nmask[:, None], other=0.0)
            else:
                m2 = nmask[:, None] & kmask[None, :]
                q = tl.load(wp, mask=m2, other=0)
                s = tl.load(sp, mask=m2, other=0.0)
            xb = x_base + offs * 16
            part = _fp4_word_dot(q.to(tl.int32), xb, kmask, EVEN_K)
            part += _fp4_word_dot((q >> 32).to(tl.int32), xb + 8, kmask, EVEN_K)
            acc += part * s.to(tl.float32)
        return tl.sum(acc, axis=1)

    # One int32 word (8 E2M1 values) against four packed fp16 pairs of x, in f16x2 arithmetic: the decode puts two
    # values in one register (Marlin's trick: shift the word by 4 per step, mask sign and magnitude), one HMUL2 by
    # 2^14 makes them exact E2M1 values, one HFMA2 multiplies-adds two at a time; the 8-term sum leaves in fp32.
    # Why asm: Triton has no packed f16x2 type; in fp32 the same work costs ~2x the instructions per value.
    _FP4_WORD_ASM = tl.constexpr("""
    {
    .reg .b32 q, t, h, a, c;
    .reg .b16 l, u;
    .reg .f32 fl, fu;
    mov.b32 c, 0x74007400;
    mov.b32 a, 0;
    and.b32 t, $1, 0x70007000;
    shr.b32 t, t, 3;
    and.b32 h, $1, 0x80008000;
    or.b32 h, h, t;
    mul.rn.f16x2 h, h, c;
    fma.rn.f16x2 a, h, $2, a;
    shl.b32 q, $1, 4;
    and.b32 t, q, 0x70007000;
    shr.b32 t, t, 3;
    and.b32 h, q, 0x80008000;
    or.b32 h, h, t;
    mul.rn.f16x2 h, h, c;
    fma.rn.f16x2 a, h, $3, a;
    shl.b32 q, $1, 8;
    and.b32 t, q, 0x70007000;
    shr.b32 t, t, 3;
    and.b32 h, q, 0x80008000;
    or.b32 h, h, t;
    mul.rn.f16x2 h, h, c;
    fma.rn.f16x2 a, h, $4, a;
    shl.b32 q, $1, 12;
    and.b32 t, q, 0x70007000;
    shr.b32 t, t, 3;
    and.b32 h, q, 0x80008000;
    or.b32 h, h, t;
    mul.rn.f16x2 h, h, c;
    fma.rn.f16x2 a, h, $5, a;
    mov.b32 {l, u}, a;
    cvt.f32.f16 fl, l;
    cvt.f32.f16 fu, u;
    add.f32 $0, fl, fu;
    }
    """)

    @triton.jit
    def _fp4_xpack_kernel(x_ptr, xp_ptr, KW, stride_xs, stride_ps, BLOCK: tl.constexpr):
        """x [.., K] -> xp [.., 4, K/8] int32: plane j holds fp16 pairs (x[8w + 3 - j], x[8w + 7 - j]) for the asm."""
        pid = tl.program_id(0)
        slot = tl.program_id(1).to(tl.int64)
        w = pid * BLOCK + tl.arange(0, BLOCK)
        m = w < KW
        xb = x_ptr + slot * stride_xs + w * 8
        for j in tl.static_range(4):
            lo = tl.load(xb + (3 - j), mask=m, other=0.0).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
            hi = tl.load(xb + (7 - j), mask=m, other=0.0).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
            tl.store(xp_ptr + slot * stride_ps + j * KW + w, (lo & 0xFFFF) | (hi << 16), mask=m)

    @triton.jit
    def _fp4_pair_emul(q, xb, J: tl.constexpr):
        lo, hi = _fp4_pair(q, J)
        xl = xb.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        xh = (xb >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        return lo.to(tl.float32) * 16384.0 * xl + hi.to(tl.float32) * 16384.0 * xh

    @triton.jit
    def _fp4_word_part(q, x0, x1, x2, x3, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, USE_ASM: tl.constexpr):
        """Exact-E2M1 partial dot of each int32 word with its packed fp16 x pairs: the f16x2 asm on a GPU; the same
        decode in plain Triton (fp32 sums) under the CPU interpreter, which cannot run asm."""
        b0 = tl.broadcast_to(x0[None, :], (BLOCK_N, BLOCK_W))
        b1 = tl.broadcast_to(x1[None, :], (BLOCK_N, BLOCK_W))
        b2 = tl.broadcast_to(x2[None, :], (BLOCK_N, BLOCK_W))
        b3 = tl.broadcast_to(x3[None, :], (BLOCK_N, BLOCK_W))
        if USE_ASM:
            part = tl.inline_asm_elementwise(_FP4_WORD_ASM, "=r,r,r,r,r,r", [q, b0, b1, b2, b3],
                                             dtype=tl.float32, is_pure=True, pack=1)
        else:
            part = _fp4_pair_emul(q, b0, 0) + _fp4_pair_emul(q, b1, 1) + _fp4_pair_emul(q, b2, 2) + _fp4_pair_emul(q, b3, 3)
        return part

    @triton.jit
    def _fp4_tile(xp_base, w_base, s_base, rows, nmask, offs, w_end, KW, stride_wn, stride_sn,
                  EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
        wp = w_base + rows[:, None] * stride_wn + offs[None, :]
        sp = s_base + rows[:, None] * stride_sn + (offs // 2)[None, :]
        kmask = offs < w_end
        if EVEN_K:
            if EVEN_N:
                q = tl.load(wp)
                s = tl.load(sp)
            else:
                q = tl.load(wp, mask=nmask[:, None], other=0)
                s = tl.load(sp, mask=nmask[:, None], other=0.0)
            x0 = tl.load(xp_base + offs)
            x1 = tl.load(xp_base + KW + offs)
            x2 = tl.load(xp_base + 2 * KW + offs)
            x3 = tl.load(xp_base + 3 * KW + offs)
        else:
            m2 = nmask[:, None] & kmask[None, :]
            q = tl.load(wp, mask=m2, other=0)
            s = tl.load(sp, mask=m2, other=0.0)
            x0 = tl.load(xp_base + offs, mask=kmask, other=0)
            x1 = tl.load(xp_base + KW + offs, mask=kmask, other=0)
            x2 = tl.load(xp_base + 2 * KW + offs, mask=kmask, other=0)
            x3 = tl.load(xp_base + 3 * KW + offs, mask=kmask, other=0)
        return q, s, x0, x1, x2, x3

    @triton.jit
    def _fp4_rows_asm(xp_base, w_base, s_base, rows, nmask, w_start, w_end, KW, stride_wn, stride_sn,
                      BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                      USE_ASM: tl.constexpr):
        acc = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
        for w0 in range(w_start, w_end, BLOCK_W):
            q, s, x0, x1, x2, x3 = _fp4_tile(xp_base, w_base, s_base, rows, nmask, w0 + tl.arange(0, BLOCK_W),
                                             w_end, KW, stride_wn, stride_sn, EVEN_K, EVEN_N)
            acc += _fp4_word_part(q, x0, x1, x2, x3, BLOCK_N, BLOCK_W, USE_ASM) * s.to(tl.float32)
        return tl.sum(acc, axis=1)

    @triton.jit
    def _fp4_gemv_kernel(
        x_ptr, w_ptr, s_ptr, ts_ptr, ids_ptr, rw_ptr, out_ptr,
        N, KW, w_per_split, pair_off,
        stride_xs, stride_we, stride_wn, stride_se, stride_sn, stride_os,
        BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
        HAS_IDS: tl.constexpr, PAIRED: tl.constexpr, ATOMIC: tl.constexpr, ROW_WEIGHT: tl.constexpr,
        GROUPED: tl.constexpr = False, ASM: tl.constexpr = False, USE_ASM: tl.constexpr = True,
    ):
        """M=1 NVFP4 GEMV (GROUPED: w_ptr is int64, KW / w_per_split / BLOCK_W count 16-value groups). Program (n tile, k split, slot); slot picks an expert through ids when HAS_IDS."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        slot = tl.program_id(2)
        if HAS_IDS:
            e = tl.load(ids_ptr + slot).to(tl.int64)
        else:
            e = slot.to(tl.int64) * 0
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = rows < N
        w_start = pid_k * w_per_split
        w_end = tl.minimum(w_start + w_per_split, KW)
        x_base = x_ptr + slot.to(tl.int64) * stride_xs
        w_base = w_ptr + e * stride_we
        s_base = s_ptr + e * stride_se
        if ASM:  # x_ptr is the packed x (_fp4_xpack_kernel), and the asm returns exact E2M1 sums
            scale = tl.load(ts_ptr + e)
        else:
            scale = tl.load(ts_ptr + e) * 16384.0
        if ASM:
            y = _fp4_rows_asm(x_base, w_base, s_base, rows, nmask, w_start, w_end, KW, stride_wn, stride_sn,
                              BLOCK_N, BLOCK_W, EVEN_K, EVEN_N, USE_ASM) * scale
        elif GROUPED:
            y = _fp4_rows_g(x_base, w_base, s_base, rows, nmask, w_start, w_end, stride_wn, stride_sn,
                            BLOCK_N, BLOCK_W, EVEN_K, EVEN_N) * scale
        else:
            y = _fp4_rows(x_base, w_base, s_base, rows, nmask, w_start, w_end, stride_wn, stride_sn,
                          BLOCK_N, BLOCK_W, EVEN_K, EVEN_N) * scale
        if PAIRED:  # gate rows r and up rows r + pair_off of the same expert: write silu(gate) * up
            if ASM:
                u = _fp4_rows_asm(x_base, w_base, s_base, rows + pair_off, nmask, w_start, w_end, KW, stride_wn,
                                  stride_sn, BLOCK_N, BLOCK_W, EVEN_K, EVEN_N, USE_ASM) * scale
            elif GROUPED:
                u = _fp4_rows_g(x_base, w_base, s_base, rows + pair_off, nmask, w_start, w_end, stride_wn,
                                stride_sn, BLOCK_N, BLOCK_W, EVEN_K, EVEN_N) * scale
            else:
                u = _fp4_rows(x_base, w_base, s_base, rows + pair_off, nmask, w_start, w_end, stride_wn, stride_sn,
                              BLOCK_N, BLOCK_W, EVEN_K, EVEN_N) * scale
            y = y / (1.0 + tl.exp(-y)) * u
        if ROW_WEIGHT:
            y = y * tl.load(rw_ptr + slot)
        op = out_ptr + slot.to(tl.int64) * stride_os + rows
        if ATOMIC:
            tl.atomic_add(op, y, mask=nmask)
        else:
            tl.store(op, y.to(out_ptr.dtype.element_ty), mask=nmask)

    # The tensor-core form (any M <= 8 per pass): each warp owns a 16-row tile of the repacked weight (repack_mma);
    # per K step (64 values) lane 4g+q holds 16 bytes = group 4i+q of rows g and g+8, decodes them in f16x2 (exact,
    # scaled by the E4M3 block scale in fp16: exact too) straight into the A fragments of four mma.sync.m16n8k16
    # and keeps fp32 accumulators in place. x (packed once per call by _fp4_xpack4_kernel) is the B operand: lane
    # 4g+q reads x row g (row 0 when M=1) at its own group, so the decoded tile never goes through shared memory.
    # Why asm: Triton cannot place a decoded tile in the mma operand layout without a shared-memory round trip
    # (measured: 8-12% of read bandwidth), and has no f16x2 type.
    def _fp4_mma_asm(nb: int = 1, bx: bool = False, imad: bool | None = None) -> str:
        # with nb x sets (nb = 2: x rows 0-7 and 8-15, M up to 16 in one pass, the decoded tile used twice):
        # $0..8nb-1 accumulators, set 2b + (mma parity) for x set b (in place, tied); then 4 words (row g: 2G,
        # 2G+1; row g+8: 2G, 2G+1); 2 scale registers (int16 x4 packed; low half of the first = s[row g] |
        # s[row g+8] << 8); then per x set 8 registers: planes 0-3 of word 2G, then of word 2G+1 (plane j = fp16
        # pair x[8w+3-j], x[8w+7-j]).
        # Plane j of a word (repack_mma's bit layout, decode_plane_ptx): one AND for plane 0, a shift and an AND for
        # plane 1, two shifts, two ANDs and an OR for planes 2 and 3: 11 operations a word once ptxas fuses the ANDs
        # and the OR, where nibbles in place took 15. FP4_DECODE_IMAD's multiply (an AND, an IMAD, an AND) takes the
        # planes whose magnitude and sign move apart by left shifts: 10 a word in the bf16 form, 9 in the fp16 form.
        # A search over every bf16 layout whose planes take a shift each for their four bit groups (with a byte
        # permute, or a multiply, low or high word, for two shifts at once) found none under 10 (2026-12-07): its
        # plane 3 needs a right shift for its magnitude and a left one for its sign, which no one multiply gives.
        # One shift and one AND for every plane (7) would need four shifts of the value pattern {0, 1, 2, 9}
        # (magnitude bits 6-8 and sign 15 of a bf16 / fp16 half) to tile the 16 bits of a half: none do (searched
        # exhaustively), so the sign of two planes comes by a second shift. ncu on the H200: the loop issues about
        # 0.6 instructions a cycle a scheduler at 62% of peak DRAM throughput, so these operations, not the loads,
        # bound the steady state
        # bx (the bf16 form): the planes of BX_MAG_BITS, the scales moved from fp16 to bf16 times 2^BX_SCALE_EXP
        # (every E4M3 is an fp16 normal: shift, mask, add the exponent difference), fma.rn.bf16x2 (sm80+) with -0,
        # and a bf16 MMA on x's own bf16 pairs
        w0 = 8 * nb
        s0, x0 = w0 + 4, w0 + 6
        # both rows' scales converted at once (the low half: row g, the high: row g + 8; the bf16 form's shift, mask
        # and add once), then each half spread over a register: 5 operations a step in the bf16 form where
        # converting each row apart took 10
        lines = ["{", f".reg .b32 t, u, h, sc, sg, sh, {'nz, ' if bx else ''}a0, a1, a2, a3;", ".reg .b16 l, z;",
                 f"mov.b32 {{l, z}}, ${s0};", "cvt.rn.f16x2.e4m3x2 sc, l;"]
        if bx:
            exp = f"0x{((127 - 15 + BX_SCALE_EXP) << 7) * 0x10001:08X}"
            lines += ["shr.b32 sc, sc, 3;", "and.b32 sc, sc, 0x0FFF0FFF;", f"add.u32 sc, sc, {exp};",
                      "mov.b32 nz, 0x80008000;"]
        lines += ["prmt.b32 sg, sc, 0, 0x1010;", "prmt.b32 sh, sc, 0, 0x3232;"]
        for mm in range(4):
            wr, j0 = mm // 2, 2 * (mm % 2)
            n = 0
            for j in (j0, j0 + 1):
                for r in (0, 1):
                    word = f"${w0 + 2 * r + wr}"
                    lines += decode_plane_ptx(j, word, bx, imad)
                    sc = "sg" if r == 0 else "sh"
                    lines.append(f"fma.rn.bf16x2 a{n}, h, {sc}, nz;" if bx else f"mul.rn.f16x2 a{n}, h, {sc};")
                    n += 1
            kind = "bf16.bf16" if bx else "f16.f16"
            for xs in range(nb):
                acc = 4 * (2 * xs + mm % 2)
                c = ",".join(f"${acc + e}" for e in range(4))
                xr = x0 + 8 * xs + 4 * wr + j0
                lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.f32 {{{c}}}, {{a0,a1,a2,a3}}, "
                             f"{{${xr},${xr + 1}}}, {{{c}}};")
        lines.append("}")
        return "\n".join(lines)

    def _fp4_mma_cons(nb: int) -> str:
        n = 8 * nb
        return ",".join(["=f"] * n + ["r"] * (6 + 8 * nb) + [str(i) for i in range(n)])

    _FP4_MMA_ASM = tl.constexpr(_fp4_mma_asm())
    _FP4_MMA_CONS = tl.constexpr(_fp4_mma_cons(1))
    _FP4_MMA_ASM2 = tl.constexpr(_fp4_mma_asm(2))
    _FP4_MMA_CONS2 = tl.constexpr(_fp4_mma_cons(2))
    _BX_MMA_ASM = tl.constexpr(_fp4_mma_asm(1, bx=True))
    _BX_MMA_ASM2 = tl.constexpr(_fp4_mma_asm(2, bx=True))
    # the decode with two shifts for plane 2 (SHIFTS, two x sets): fp4moe's walking down at M = 9-16 keeps 128
    # registers with it (sm_90: 130 with the multiply, 3 programs an SM for 4)
    _BX_MMA_ASM2_SHIFTS = tl.constexpr(_fp4_mma_asm(2, bx=True, imad=False))

    @triton.jit
    def _fp4_xpack4_kernel(x_ptr, xp_ptr, KW, stride_xs, stride_ps, z_ptr, NZ, BLOCK: tl.constexpr,
                           ZERO: tl.constexpr, DEPS: tl.constexpr = False):
        """x [.., K] -> xp [.., K/8, 4] int32 (word w, plane j: fp16 pair x[8w+3-j], x[8w+7-j]); with ZERO it also
        zeroes the NZ floats at z_ptr (the split-K accumulator: one launch fewer). DEPS: the GEMV launched after it
        as a programmatic dependent may start now (it loads its first weights, then waits for this grid)."""
        if DEPS:
            tl.extra.cuda.gdc_launch_dependents()
        pid = tl.program_id(0)
        slot = tl.program_id(1).to(tl.int64)
        if ZERO:
            if slot == 0:
                zo = pid * 4 * BLOCK + tl.arange(0, 4 * BLOCK)
                tl.store(z_ptr + zo, tl.zeros((4 * BLOCK,), dtype=z_ptr.dtype.element_ty), mask=zo < NZ)
        w = pid * BLOCK + tl.arange(0, BLOCK)
        m = w < KW
        xb = x_ptr + slot * stride_xs + w * 8
        for j in tl.static_range(4):
            lo = tl.load(xb + (3 - j), mask=m, other=0.0).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
            hi = tl.load(xb + (7 - j), mask=m, other=0.0).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
            tl.store(xp_ptr + slot * stride_ps + w * 4 + j, (lo & 0xFFFF) | (hi << 16), mask=m)

    @triton.jit
    def _fp4_xpack_range(x_ptr, xp_ptr, stride_x, stride_p, M, w0, w1, t, T: tl.constexpr):
        """Words [w0, w1) of x rows 0..M-1 packed as _fp4_xpack4_kernel packs them, one word a thread a pass, then a
        barrier: the program's own loads of xp come after its threads' stores."""
        for r in range(0, M):
            for wb in range(w0, w1, T):
                w = wb + t
                m = w < w1
                xb = x_ptr + r * stride_x + w * 8
                for j in tl.static_range(4):
                    lo = tl.load(xb + (3 - j), mask=m, other=0.0).to(tl.float16).to(tl.int16, bitcast=True)
                    hi = tl.load(xb + (7 - j), mask=m, other=0.0).to(tl.float16).to(tl.int16, bitcast=True)
                    tl.store(xp_ptr + r * stride_p + w * 4 + j, (lo.to(tl.int32) & 0xFFFF) | (hi.to(tl.int32) << 16),
                             mask=m)
        tl.debug_barrier()

    @triton.jit
    def _f16_half(v, HI: tl.constexpr):
        v = (v >> 16) if HI else v
        return v.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _fp4_mma_wload(wb, sb, i, EV: tl.constexpr):
        """Step i's weight operands: the lane's 16 bytes (streamed once: EV "evict_first" keeps them from pushing x
        and the scales out of L2) and its two block scales."""
        return tl.load(wb + i * 128, eviction_policy=EV), tl.load(sb + i * 32)

    @triton.jit
    def _fp4_mma_xload(xb, xb2, i, TWO: tl.constexpr):
        """Step i's packed x: the lane's 32 bytes of x rows 0-7 (and of rows 8-15 at xb2 when TWO)."""
        xa = tl.load(xb + i * 32)
        xc = tl.load(xb + i * 32 + 4)
        xa2 = xa
        xc2 = xc
        if TWO:
            xa2 = tl.load(xb2 + i * 32)
            xc2 = tl.load(xb2 + i * 32 + 4)
        return xa, xc, xa2, xc2

    @triton.jit
    def _fp4_mma_load(wb, sb, xb, xb2, i, EV: tl.constexpr, TWO: tl.constexpr):
        """Step i's operands: the weight's (_fp4_mma_wload) and x's (_fp4_mma_xload)."""
        q, s = _fp4_mma_wload(wb, sb, i, EV)
        x = _fp4_mma_xload(xb, xb2, i, TWO)
        return q, s, x[0], x[1], x[2], x[3]

    @triton.jit
    def _fp4_mma_loads(wb, sb, xb, xb2, U: tl.constexpr, EV: tl.constexpr, TWO: tl.constexpr):
        """The operands of U steps (1, 2 or 4) from pointers already at the first (the others unused when U < 4)."""
        a = _fp4_mma_load(wb, sb, xb, xb2, 0, EV, TWO)
        b = a
        c = a
        d = a
        if U >= 2:
            b = _fp4_mma_load(wb, sb, xb, xb2, 1, EV, TWO)
        if U >= 4:
            c = _fp4_mma_load(wb, sb, xb, xb2, 2, EV, TWO)
            d = _fp4_mma_load(wb, sb, xb, xb2, 3, EV, TWO)
        return a, b, c, d

    # (_fp4_mma_loads written as _fp4_mma_with_x of _fp4_mma_wloads computes the same, but compiles to other SASS
    # for 17 of the 50 forms, none of which ran like that on a GPU: so the two loops keep their own loaders)
    @triton.jit
    def _fp4_mma_wloads(wb, sb, U: tl.constexpr, EV: tl.constexpr):
        """The weight operands of U steps (_fp4_mma_wload; the others unused when U < 4)."""
        a = _fp4_mma_wload(wb, sb, 0, EV)
        b = a
        c = a
        d = a
        if U >= 2:
            b = _fp4_mma_wload(wb, sb, 1, EV)
        if U >= 4:
            c = _fp4_mma_wload(wb, sb, 2, EV)
            d = _fp4_mma_wload(wb, sb, 3, EV)
        return a, b, c, d

    @triton.jit
    def _fp4_mma_with_x(w, xb, xb2, U: tl.constexpr, TWO: tl.constexpr):
        """U steps' operands: their weights w (_fp4_mma_wloads) with x loaded now (_fp4_mma_xload)."""
        x = _fp4_mma_xload(xb, xb2, 0, TWO)
        a = (w[0][0], w[0][1], x[0], x[1], x[2], x[3])
        b = a
        c = a
        d = a
        if U >= 2:
            x = _fp4_mma_xload(xb, xb2, 1, TWO)
            b = (w[1][0], w[1][1], x[0], x[1], x[2], x[3])
        if U >= 4:
            x = _fp4_mma_xload(xb, xb2, 2, TWO)
            c = (w[2][0], w[2][1], x[0], x[1], x[2], x[3])
            x = _fp4_mma_xload(xb, xb2, 3, TWO)
            d = (w[3][0], w[3][1], x[0], x[1], x[2], x[3])
        return a, b, c, d

    @triton.jit
    def _every_warp(frag, WARPS: tl.constexpr):
        """[8, 4, 4] (g, q, word) -> [32 WARPS, 4]: the same fragment for lane 4g + q of every warp."""
        return tl.reshape(tl.broadcast_to(tl.reshape(frag, (1, 32, 4)), (WARPS, 32, 4)), (32 * WARPS, 4))

    @triton.jit
    def _x_frags(chunk, WARPS: tl.constexpr):
        """A step's x rows 0-15 (a [16, 32] int32 chunk, loaded once a program) as every warp's B fragments (xa, xc,
        xa2, xc2 of _fp4_mma_xload): lane 4g + q takes words 8q..8q+7 of rows g and g + 8."""
        v = tl.permute(tl.reshape(chunk, (2, 8, 4, 2, 4)), (1, 2, 4, 0, 3))  # g, q, c, row set, half
        lo, hi = tl.split(v)
        a0, a1 = tl.split(lo)
        c0, c1 = tl.split(hi)
        return (_every_warp(a0, WARPS), _every_warp(c0, WARPS), _every_warp(a1, WARPS), _every_warp(c1, WARPS))

    @triton.jit
    def _x_chunks(xcp, U: tl.constexpr):
        """U steps' x chunks (_x_frags) from a pointer already at the first."""
        a = tl.load(xcp)
        b = a
        c = a
        d = a
        if U >= 2:
            b = tl.load(xcp + 32)
        if U >= 4:
            c = tl.load(xcp + 64)
            d = tl.load(xcp + 96)
        return a, b, c, d

    @triton.jit
    def _fp4_mma_with_chunks(w, xc, U: tl.constexpr, WARPS: tl.constexpr):
        """U steps' operands: their weights w (_fp4_mma_wloads) with the fragments of the x chunks xc."""
        x = _x_frags(xc[0], WARPS)
        a = (w[0][0], w[0][1], x[0], x[1], x[2], x[3])
        b = a
        c = a
        d = a
        if U >= 2:
            x = _x_frags(xc[1], WARPS)
            b = (w[1][0], w[1][1], x[0], x[1], x[2], x[3])
        if U >= 4:
            x = _x_frags(xc[2], WARPS)
            c = (w[2][0], w[2][1], x[0], x[1], x[2], x[3])
            x = _x_frags(xc[3], WARPS)
            d = (w[3][0], w[3][1], x[0], x[1], x[2], x[3])
        return a, b, c, d

    # x through a ring of cp.async copies (cfg.xring, with xshare): each thread copies 16 bytes of a step's x rows
    # 0-15 (a [16, 32]-word chunk, rows padded to XR_ROW bytes so that a quarter warp's fragment reads hit distinct
    # banks) from global memory (through L1) into shared memory, an iteration or two ahead, holding no register; a
    # program waits and meets at one barrier an iteration, then each lane reads its B fragments with four 16-byte
    # loads a step. xshare's Triton layout conversion loaded x in the iteration that used it (or an iteration ahead
    # in registers) and met at two barriers a step (ncu, H200, M=16: 2.0 cycles of barrier stall an issued
    # instruction). 2-3% ahead on an H100's large shapes, behind on the small (FP4_MMA_XRING's comment): the plan takes
    # it where a split is long (_m16_plan).
    _XR_ROW = 144  # 128 bytes of a row's step, 16 of padding
    _XR_SLOT = 16 * _XR_ROW  # one step's chunk
    XR_ROW = tl.constexpr(_XR_ROW)
    XR_SLOT = tl.constexpr(_XR_SLOT)

    def _xr_ring_asm(sets: int, steps: int) -> str:
        """The program's ring (sets x steps chunks; the variable is the block's, its storage the kernel's): its
        shared address in each of the 4 outputs."""
        return (f"{{ .shared .align 16 .b8 xring[{sets * steps * _XR_SLOT}]; mov.u32 $0, xring; mov.u32 $1, xring; "
                "mov.u32 $2, xring; mov.u32 $3, xring; }")

    def _xr_copy_asm(steps: int) -> str:
        """A thread's 16 bytes of `steps` consecutive steps (the shared address $4, the global $8), one commit group."""
        lines = ["{"] + [f"cp.async.ca.shared.global [$4+{u * _XR_SLOT}], [$8+{u * 128}], 16;" for u in range(steps)]
        return " ".join(lines + ["cp.async.commit_group;", "mov.u32 $0, 0; mov.u32 $1, 0; mov.u32 $2, 0;",
                                 "mov.u32 $3, 0; }"])

    def _xr_wait_asm(pending: int) -> str:
        """Until at most `pending` of the thread's groups are in flight, then the program's barrier (every thread's
        copies of this iteration landed; every thread's reads of the set about to be refilled done)."""
        return (f"{{ cp.async.wait_group {pending}; bar.sync 0; mov.u32 $0, 0; mov.u32 $1, 0; mov.u32 $2, 0; "
                "mov.u32 $3, 0; }")

    # a step's B fragments at lane 4g + q's read address $16 (row g, byte 32q): words 8q..8q+3 and 8q+4..8q+7 of
    # rows g and g + 8, as _x_frags returns them (xa, xc, xa2, xc2)
    _XR_READ_ASM = tl.constexpr(
        "{ ld.shared.v4.u32 {$0, $1, $2, $3}, [$16]; ld.shared.v4.u32 {$4, $5, $6, $7}, [$16+16]; "
        f"ld.shared.v4.u32 {{$8, $9, $10, $11}}, [$16+{8 * _XR_ROW}]; "
        f"ld.shared.v4.u32 {{$12, $13, $14, $15}}, [$16+{8 * _XR_ROW + 16}]; }}")
    _XR_READ_CONS = tl.constexpr(",".join(["=r"] * 16 + ["r"] * 4))
    _XR_RING_CONS = tl.constexpr("=r,=r,=r,=r,r,r,r,r")
    _XR_COPY_CONS = tl.constexpr("=r,=r,=r,=r,r,r,r,r,l,l,l,l")
    _XR_DRAIN = tl.constexpr("{ cp.async.wait_all; mov.u32 $0, 0; mov.u32 $1, 0; mov.u32 $2, 0; mov.u32 $3, 0; }")
    _XR_ASM = {(sets, steps): (tl.constexpr(_xr_ring_asm(sets, steps)), tl.constexpr(_xr_copy_asm(steps)),
                               tl.constexpr(_xr_wait_asm(sets - 2))) for sets in (2, 3) for steps in (1, 2, 4)}

    def xring_constexprs(sets: int, steps: int) -> dict[str, Any]:
        """The tensor-core kernel's constexprs for x through a ring of `sets` iterations of `steps` steps (0: none)."""
        if not sets:
            return {"XR": 0}
        ring, copy, wait = _XR_ASM[(sets, steps)]
        return {"XR": sets, "XR_RING": ring, "XR_COPY": copy, "XR_WAIT": wait}

    @triton.jit
    def _xr_setup(wb, i0, xp_ptr, stride_xm, M, t, g, qq, RING: tl.constexpr):
        """The ring's write address (thread t: row t // 8, bytes 16 (t % 8)), read address (lane 4g + q: row g, byte
        32 q) and copy source (x row t // 8, words 4 (t % 8) of step 0), in the lanes' layout: anchored by a load that
        reads nothing (the asm blocks' operands must be each lane's 4 contiguous words, as the MMA asm's are)."""
        zero = tl.load(wb + i0 * 128, mask=(t < 0)[:, None], other=0)
        ring = tl.inline_asm_elementwise(RING, _XR_RING_CONS, [zero], dtype=tl.int32, is_pure=False, pack=4)
        wr = ring + ((t // 8) * XR_ROW + (t % 8) * 16)[:, None]
        rd = ring + (g * XR_ROW + qq * 32)[:, None]
        src = xp_ptr + (tl.minimum(t // 8, M - 1) * stride_xm + (t % 8) * 4)[:, None] + zero
        return wr, rd, src

    @triton.jit
    def _xr_copy(wr, src, COPY: tl.constexpr):
        tl.inline_asm_elementwise(COPY, _XR_COPY_CONS, [wr, src], dtype=tl.int32, is_pure=False, pack=4)

    @triton.jit
    def _xr_wait(rd, WAIT: tl.constexpr):
        tl.inline_asm_elementwise(WAIT, _XR_RING_CONS, [rd], dtype=tl.int32, is_pure=False, pack=4)

    @triton.jit
    def _xr_frags(rd):
        return tl.inline_asm_elementwise(_XR_READ_ASM, _XR_READ_CONS, [rd],
                                         dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=False, pack=4)

    @triton.jit
    def _fp4_mma_with_ring(w, rd, U: tl.constexpr):
        """U steps' operands: their weights w (_fp4_mma_wloads) with x's fragments read from the ring at rd."""
        x = _xr_frags(rd)
        a = (w[0][0], w[0][1], x[0], x[1], x[2], x[3])
        b = a
        c = a
        d = a
        if U >= 2:
            x = _xr_frags(rd + XR_SLOT)
            b = (w[1][0], w[1][1], x[0], x[1], x[2], x[3])
        if U >= 4:
            x = _xr_frags(rd + 2 * XR_SLOT)
            c = (w[2][0], w[2][1], x[0], x[1], x[2], x[3])
            x = _xr_frags(rd + 3 * XR_SLOT)
            d = (w[3][0], w[3][1], x[0], x[1], x[2], x[3])
        return a, b, c, d

    @triton.jit
    def _fp4_mma_steps(ops, U: tl.constexpr, T: tl.constexpr, TWO: tl.constexpr, acc0, acc1, acc2, acc3,
                       BX: tl.constexpr, SHIFTS: tl.constexpr = False):
        """The math of the U steps whose operands _fp4_mma_loads returned (SHIFTS: with TWO and BX,
        _BX_MMA_ASM2_SHIFTS' decode)."""
        acc0, acc1, acc2, acc3 = _fp4_mma_math(ops[0], T, TWO, acc0, acc1, acc2, acc3, BX, SHIFTS)
        if U >= 2:
            acc0, acc1, acc2, acc3 = _fp4_mma_math(ops[1], T, TWO, acc0, acc1, acc2, acc3, BX, SHIFTS)
        if U >= 4:
            acc0, acc1, acc2, acc3 = _fp4_mma_math(ops[2], T, TWO, acc0, acc1, acc2, acc3, BX, SHIFTS)
            acc0, acc1, acc2, acc3 = _fp4_mma_math(ops[3], T, TWO, acc0, acc1, acc2, acc3, BX, SHIFTS)
        return acc0, acc1, acc2, acc3

    @triton.jit
    def _fp4_mma_math(op, T: tl.constexpr, TWO: tl.constexpr, acc0, acc1, acc2, acc3, BX: tl.constexpr = False,
                      SHIFTS: tl.constexpr = False):
        s = tl.broadcast_to(op[1][:, None], (T, 4))
        # one call per asm string: Triton takes it as a constexpr, not as a value a conditional expression picks
        if TWO:  # the decoded tile into two MMAs: x rows 0-7 (acc0, acc1) and 8-15 (acc2, acc3)
            if BX and SHIFTS:
                acc0, acc1, acc2, acc3 = tl.inline_asm_elementwise(
                    _BX_MMA_ASM2_SHIFTS, _FP4_MMA_CONS2,
                    [op[0], s, op[2], op[3], op[4], op[5], acc0, acc1, acc2, acc3],
                    dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=4)
            elif BX:
                acc0, acc1, acc2, acc3 = tl.inline_asm_elementwise(
                    _BX_MMA_ASM2, _FP4_MMA_CONS2, [op[0], s, op[2], op[3], op[4], op[5], acc0, acc1, acc2, acc3],
                    dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=4)
            else:
                acc0, acc1, acc2, acc3 = tl.inline_asm_elementwise(
                    _FP4_MMA_ASM2, _FP4_MMA_CONS2, [op[0], s, op[2], op[3], op[4], op[5], acc0, acc1, acc2, acc3],
                    dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=4)
        elif BX:
            acc0, acc1 = tl.inline_asm_elementwise(_BX_MMA_ASM, _FP4_MMA_CONS, [op[0], s, op[2], op[3], acc0, acc1],
                                                   dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
        else:
            acc0, acc1 = tl.inline_asm_elementwise(_FP4_MMA_ASM, _FP4_MMA_CONS, [op[0], s, op[2], op[3], acc0, acc1],
                                                   dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
        return acc0, acc1, acc2, acc3

    @triton.jit
    def _fp4_mma_step(wb, sb, xb, i, T: tl.constexpr, acc0, acc1, BX: tl.constexpr = False):
        a0, a1, _, _ = _fp4_mma_math(_fp4_mma_load(wb, sb, xb, xb, i, "", False), T, False, acc0, acc1, acc0, acc1,
                                     BX)
        return a0, a1

    @triton.jit
    def _fp4_mma_loop(wb, sb, xb, xb2, i0, i1, T: tl.constexpr, U: tl.constexpr, EV: tl.constexpr,
                      TWO: tl.constexpr, acc0, acc1, acc2, acc3, PDL: tl.constexpr = False,
                      BX: tl.constexpr = False, XJIT: tl.constexpr = False, XS: tl.constexpr = False, xcp=None,
                      XR: tl.constexpr = 0, XR_COPY: tl.constexpr = None, XR_WAIT: tl.constexpr = None, xr=None):
        """Steps [i0, i1) (a multiple of U) with a register double buffer: the next U steps' loads are issued
        before this U steps' math, so 2U steps' bytes are in flight a warp (on the H200 this, with the decode's
        fewer operations, took Llama-3.1-8B lm_head from 64% to 86% of read bandwidth; unrolling alone: 72%).
        TWO: x rows 0-7 and 8-15 against the same decoded tile (acc2, acc3 the second set).
        PDL: launched as a programmatic dependent of the kernel before it, so the launch overlaps that kernel;
        wait for it (gdc_wait) before the first load. (Loading the first weights before the wait, which do not depend
        on it, put 16 more instructions in the loop and was 4-8% slower on the H200. The bf16 form as a programmatic
        dependent of the call before it, its first weights loaded before the wait: 5-6% faster on the stream-K
        shapes, 1-3% on the widest, 8-17% slower on 28672x4096 and the small shapes, where the waiting programs
        take places and bandwidth from the running ones; left out.) BX: the bf16 form's asm.
        XJIT: only the weights double-buffered; x (read by every warp, so in L1 or L2) loaded in the iteration that
        uses it, which halves the registers x holds (two sets of 8 a step at M = 9-16)."""
        if PDL:
            tl.extra.cuda.gdc_wait()
        # each iteration's pointers once, its U steps at constant offsets from them (folded into the loads: from an
        # int32 step index each step took an address computation of its own, 3 instructions; H200: 0.5-2% faster
        # at M = 1 and 4). Two buffers taking turns instead of one rolled over (no register moves, 4 fewer
        # instructions a step) took 72 registers for 56 and lost up to a third where programs no longer fit one wave
        if XS and XR > 0:  # x's chunks through the ring (_xr_setup): XR sets of U steps, XR - 1 iterations ahead
            wr, rd, src = xr
            SET: tl.constexpr = U * XR_SLOT
            w = _fp4_mma_wloads(wb + i0 * 128, sb + i0 * 32, U, EV)
            for d in tl.static_range(XR - 1):  # the first XR - 1 iterations in flight (past the end: the last again)
                _xr_copy(wr + d * SET, src + tl.minimum(i0 + d * U, i1 - U) * 32, XR_COPY)
            cur = 0  # the byte offsets of the set read now and of the set read an iteration ago
            last = (XR - 1) * SET
            for i in range(i0, i1, U):
                j = tl.minimum(i + U, i1 - U)
                wn = _fp4_mma_wloads(wb + j * 128, sb + j * 32, U, EV)
                _xr_wait(rd, XR_WAIT)
                # every thread is past the set read an iteration ago: it takes the iteration XR - 1 ahead
                _xr_copy(wr + last, src + tl.minimum(i + (XR - 1) * U, i1 - U) * 32, XR_COPY)
                a = _fp4_mma_with_ring(w, rd + cur, U)
                acc0, acc1, acc2, acc3 = _fp4_mma_steps(a, U, T, TWO, acc0, acc1, acc2, acc3, BX)
                w = wn
                last = cur
                cur = tl.where(cur == (XR - 1) * SET, 0, cur + SET)
            _xr_wait(rd, _XR_DRAIN)
        elif XS:  # x's chunks, one a step a program (_x_frags): loaded an iteration ahead, or in place with XJIT
            w = _fp4_mma_wloads(wb + i0 * 128, sb + i0 * 32, U, EV)
            if not XJIT:
                xc = _x_chunks(xcp + i0 * 32, U)
            for i in range(i0, i1, U):
                j = tl.minimum(i + U, i1 - U)
                wn = _fp4_mma_wloads(wb + j * 128, sb + j * 32, U, EV)
                if XJIT:
                    xc = _x_chunks(xcp + i * 32, U)
                else:
                    xn = _x_chunks(xcp + j * 32, U)
                a = _fp4_mma_with_chunks(w, xc, U, T // 32)
                acc0, acc1, acc2, acc3 = _fp4_mma_steps(a, U, T, TWO, acc0, acc1, acc2, acc3, BX)
                w = wn
                if not XJIT:
                    xc = xn
        elif XJIT:
            w = _fp4_mma_wloads(wb + i0 * 128, sb + i0 * 32, U, EV)
            for i in range(i0, i1, U):
                j = tl.minimum(i + U, i1 - U)
                wn = _fp4_mma_wloads(wb + j * 128, sb + j * 32, U, EV)
                a = _fp4_mma_with_x(w, xb + i * 32, xb2 + i * 32, U, TWO)
                acc0, acc1, acc2, acc3 = _fp4_mma_steps(a, U, T, TWO, acc0, acc1, acc2, acc3, BX)
                w = wn
        else:
            a = _fp4_mma_loads(wb + i0 * 128, sb + i0 * 32, xb + i0 * 32, xb2 + i0 * 32, U, EV, TWO)
            for i in range(i0, i1, U):
                j = tl.minimum(i + U, i1 - U)  # the last iteration loads its own steps again (in bounds, unused)
                an = _fp4_mma_loads(wb + j * 128, sb + j * 32, xb + j * 32, xb2 + j * 32, U, EV, TWO)
                acc0, acc1, acc2, acc3 = _fp4_mma_steps(a, U, T, TWO, acc0, acc1, acc2, acc3, BX)
                a = an
        return acc0, acc1, acc2, acc3

    @triton.jit
    def _with_x_of(v, a, U: tl.constexpr):
        """U steps of a warp's second tile: its weights v (_fp4_mma_wloads) with the x operands of the first tile's
        steps a (_fp4_mma_with_x): the same x fragments, loaded once."""
        b0 = (v[0][0], v[0][1], a[0][2], a[0][3], a[0][4], a[0][5])
        b1 = b0
        b2 = b0
        b3 = b0
        if U >= 2:
            b1 = (v[1][0], v[1][1], a[1][2], a[1][3], a[1][4], a[1][5])
        if U >= 4:
            b2 = (v[2][0], v[2][1], a[2][2], a[2][3], a[2][4], a[2][5])
            b3 = (v[3][0], v[3][1], a[3][2], a[3][3], a[3][4], a[3][5])
        return b0, b1, b2, b3

    @triton.jit
    def _pair_zeros(T: tl.constexpr):
        """The eight fp32 accumulators of two tiles a warp at zero (each [T, 4]: a tile's two MMA column sets)."""
        z = tl.zeros((T, 4), dtype=tl.float32)
        return z, z, z, z, z, z, z, z

    @triton.jit
    def _fp4_mma_loop_pair(wb, sb, wb2, sb2, xb, xb2, i0, i1, T: tl.constexpr, U: tl.constexpr, EV: tl.constexpr,
                           TWO: tl.constexpr, PDL: tl.constexpr, BX: tl.constexpr):
        """Steps [i0, i1) of two tiles a warp (cfg.pair): both tiles' weights double-buffered (wb/sb and wb2/sb2),
        x loaded in the iteration that uses it (as XJIT) and fed to both tiles' MMAs, so a warp loads x once for
        twice the weight bytes. Returns the first tile's four accumulators, then the second's."""
        if PDL:
            tl.extra.cuda.gdc_wait()
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _pair_zeros(T)
        w = _fp4_mma_wloads(wb + i0 * 128, sb + i0 * 32, U, EV)
        v = _fp4_mma_wloads(wb2 + i0 * 128, sb2 + i0 * 32, U, EV)
        for i in range(i0, i1, U):
            j = tl.minimum(i + U, i1 - U)
            wn = _fp4_mma_wloads(wb + j * 128, sb + j * 32, U, EV)
            vn = _fp4_mma_wloads(wb2 + j * 128, sb2 + j * 32, U, EV)
            a = _fp4_mma_with_x(w, xb + i * 32, xb2 + i * 32, U, TWO)
            acc0, acc1, acc2, acc3 = _fp4_mma_steps(a, U, T, TWO, acc0, acc1, acc2, acc3, BX)
            acc4, acc5, acc6, acc7 = _fp4_mma_steps(_with_x_of(v, a, U), U, T, TWO, acc4, acc5, acc6, acc7, BX)
            w = wn
            v = vn
        return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7

    @triton.jit
    def _fp4_mma_kernel(xp_ptr, w_ptr, s_ptr, ts_ptr, out_ptr, M, N, NT, steps_per_split, NSTEPS,
                        stride_xm, stride_wt, stride_st, stride_om, x_ptr, stride_x, fin_ptr, stride_fm, cnt_ptr,
                        WARPS: tl.constexpr, BLOCK_M: tl.constexpr, UNROLL: tl.constexpr, ATOMIC: tl.constexpr,
                        USE_ASM: tl.constexpr, EV: tl.constexpr = "", PDL: tl.constexpr = False,
                        SELF_PACK: tl.constexpr = False, FINISH: tl.constexpr = False, BX: tl.constexpr = False,
                        STREAM: tl.constexpr = False, SLICES: tl.constexpr = 1, DEPS: tl.constexpr = False,
                        XJIT: tl.constexpr = False, XS: tl.constexpr = False, PAIR: tl.constexpr = False,
                        XR: tl.constexpr = 0, XR_RING: tl.constexpr = "", XR_COPY: tl.constexpr = "",
                        XR_WAIT: tl.constexpr = ""):
        """y[M<=16, N] = x W^T on tensor cores (see _fp4_mma_asm); program (group of WARPS 16-row tiles, K split).
        ATOMIC: fp32 partial sums added into out_ptr (K split; the last split casting the sums in-kernel, with a
        counter and fences, was no faster on the H200 than the separate cast once the GEMV launches as a programmatic
        dependent). One call, one kernel in fp16 (a candidate the benchmark times): SELF_PACK, each program packs the
        x words of its own K range from x_ptr into xp_ptr (every program of that range writes the same values) and
        reads them back after a barrier, instead of a packing kernel before it; FINISH (with ATOMIC), the last K
        split casts the sums into fin_ptr and leaves zeros (_split_finish), instead of a cast after it.
        BX (the bf16 form, repack_mma(bx=True)): xp_ptr is x itself, an int32 view of its bf16 pairs, so no
        program packs anything; with FINISH a call is this one kernel.
        STREAM (stream-K, with ATOMIC and FINISH): the grid is one wave of resident programs, and program p of P
        takes iterations [p T / P, (p + 1) T / P) (UNROLL steps each, at most a group's worth) of all T iterations
        of the groups laid end to end, a group's K range after another's; where its range crosses into the next
        group it adds its sums and goes on there (two parts written out: a loop over parts held 96 registers where
        two parts hold 72). Every program does the same work and none waits for a second wave (a K split that
        leaves, say, 896 programs for 792 resident places runs the last 104 nearly alone).
        SLICES (K split, not STREAM): the program's warps are WARPS / SLICES tiles times SLICES slices of its K range,
        summed through shared memory at the end: the warps in flight of a K split without its atomics, counters and
        finishing reads (see _fp4_mma_part).
        DEPS (with PDL, the chained bf16 form): once every program is past its loop, the kernel after this one may
        launch; its programs take the places this one leaves and wait (gdc_wait) before their first load, so its
        launch and set-up overlap this kernel's last stores. (Triggered at the start instead, kernels launched two
        and three ahead took the places of the one that could run: 10-18% slower on 28672x4096 and 4096x14336.)
        PAIR (K split, XJIT, not STREAM or SLICES): a group is 2 x WARPS tiles, warp w taking tiles w and w + WARPS
        against the same x loads (_fp4_mma_loop_pair)."""
        pid_n = tl.program_id(0)
        ts = tl.load(ts_ptr) * 16384.0
        if STREAM:  # at most two parts: the plan keeps a program's range within one group boundary
            ki = NSTEPS // UNROLL  # iterations a group
            total = tl.cdiv(NT, WARPS) * ki
            # program p: iterations [p T / P, (p + 1) T / P), so the ranges differ by one iteration at most and a
            # grid of whole waves (P a multiple of the SMs) gives every SM the same work (steps_per_split unread)
            u = (pid_n * total) // tl.num_programs(0)
            u1 = ((pid_n + 1) * total) // tl.num_programs(0)
            grp = u // ki
            k0 = u - grp * ki
            n_a = tl.minimum(ki - k0, u1 - u)
            _fp4_mma_part(xp_ptr, w_ptr, s_ptr, ts, out_ptr, M, N, NT, grp, k0 * UNROLL, (k0 + n_a) * UNROLL,
                          n_a, ki, stride_xm, stride_wt, stride_st, stride_om, fin_ptr, stride_fm, cnt_ptr,
                          WARPS, BLOCK_M, UNROLL, ATOMIC, USE_ASM, EV, PDL, FINISH, BX, XJIT=XJIT, XS=XS,
                          XR=XR, XR_RING=XR_RING, XR_COPY=XR_COPY, XR_WAIT=XR_WAIT)
            n_b = u1 - u - n_a
            if n_b > 0:
                _fp4_mma_part(xp_ptr, w_ptr, s_ptr, ts, out_ptr, M, N, NT, grp + 1, 0, n_b * UNROLL, n_b, ki,
                              stride_xm, stride_wt, stride_st, stride_om, fin_ptr, stride_fm, cnt_ptr,
                              WARPS, BLOCK_M, UNROLL, ATOMIC, USE_ASM, EV, False, FINISH, BX, XJIT=XJIT, XS=XS,
                              XR=XR, XR_RING=XR_RING, XR_COPY=XR_COPY, XR_WAIT=XR_WAIT)
            if DEPS:
                tl.extra.cuda.gdc_launch_dependents()
        else:
            pid_k = tl.program_id(1)
            i0 = pid_k * steps_per_split
            i1 = tl.minimum(i0 + steps_per_split, NSTEPS)
            if SELF_PACK:
                _fp4_xpack_range(x_ptr, xp_ptr, stride_x, stride_xm, M, i0 * 8, i1 * 8, tl.arange(0, 32 * WARPS),
                                 32 * WARPS)
            _fp4_mma_part(xp_ptr, w_ptr, s_ptr, ts, out_ptr, M, N, NT, pid_n, i0, i1, 1, tl.num_programs(1),
                          stride_xm, stride_wt, stride_st, stride_om, fin_ptr, stride_fm, cnt_ptr,
                          WARPS, BLOCK_M, UNROLL, ATOMIC, USE_ASM, EV, PDL, FINISH, BX, SLICES, DEPS, XJIT, XS, PAIR,
                          XR, XR_RING, XR_COPY, XR_WAIT)

    @triton.jit
    def _lanes(first_tile, T: tl.constexpr, SLICES: tl.constexpr):
        """A program's T lanes: (t, tile, lane, g, q) with warp w on tile first_tile + w // SLICES (lane = 4g + q)."""
        t = tl.arange(0, T)
        lane = t % 32
        return t, first_tile + t // (32 * SLICES), lane, lane // 4, lane % 4

    @triton.jit
    def _k_slice(t, i0, i1, SLICES: tl.constexpr):
        """Warp w's slice w % SLICES of steps [i0, i1): its first step's offset from i0, and the end of a slice."""
        per = (i1 - i0) // SLICES
        return (t // 32) % SLICES * per, i0 + per

    @triton.jit
    def _slice_sum(v, TILES: tl.constexpr, SLICES: tl.constexpr):
        """[32 WARPS, 4] lane sums -> [32 TILES, 4]: warp w's added into tile w // SLICES's."""
        if SLICES > 1:
            v = tl.reshape(tl.sum(tl.reshape(v, (TILES, SLICES, 32, 4)), axis=1), (32 * TILES, 4))
        return v

    @triton.jit
    def _fp4_mma_part(xp_ptr, w_ptr, s_ptr, ts, out_ptr, M, N, NT, grp, i0, i1, units, total,
                      stride_xm, stride_wt, stride_st, stride_om, fin_ptr, stride_fm, cnt_ptr,
                      WARPS: tl.constexpr, BLOCK_M: tl.constexpr, UNROLL: tl.constexpr, ATOMIC: tl.constexpr,
                      USE_ASM: tl.constexpr, EV: tl.constexpr, PDL: tl.constexpr, FINISH: tl.constexpr,
                      BX: tl.constexpr, SLICES: tl.constexpr = 1, DEPS: tl.constexpr = False,
                      XJIT: tl.constexpr = False, XS: tl.constexpr = False, PAIR: tl.constexpr = False,
                      XR: tl.constexpr = 0, XR_RING: tl.constexpr = None, XR_COPY: tl.constexpr = None,
                      XR_WAIT: tl.constexpr = None):
        """Steps [i0, i1) of group grp's WARPS / SLICES 16-row tiles, added (ATOMIC) or stored; with FINISH these
        steps count as `units` of the group's `total` (the one that completes it casts). Accumulator element e of
        lane 4g+q holds row g + 8 (e // 2), x row 2q + e % 2 (+ 8 in the second set of BLOCK_M = 16: x rows 8-15
        against the same decoded tile, so the weight is read once).
        SLICES: warp w takes tile w // SLICES and slice w % SLICES of the steps (i1 - i0 a multiple of SLICES x
        UNROLL); the slices' sums are added in the program (Triton's cross-warp reduction) before anything is
        stored. DEPS: the kernel after this one may launch once the loop is done (_fp4_mma_kernel). PAIR: the group
        is 2 TILES tiles, warp w taking tiles w and w + TILES (their sums stored apart, finished together)."""
        T: tl.constexpr = 32 * WARPS
        TILES: tl.constexpr = WARPS // SLICES
        GT: tl.constexpr = TILES * (2 if PAIR else 1)  # the group's tiles
        t, tile, lane, g, qq = _lanes(grp * GT, T, SLICES)
        tile_c = tl.minimum(tile, NT - 1)
        kof, i1 = _k_slice(t, i0, i1, SLICES)
        c4 = tl.arange(0, 4)
        wb = w_ptr + tile_c.to(tl.int64)[:, None] * stride_wt + (lane * 4 + kof * 128)[:, None] + c4[None, :]
        sb = s_ptr + tile_c.to(tl.int64) * stride_st + lane + kof * 32
        if USE_ASM:
            if BLOCK_M == 1:
                xrow = g * 0  # every column computes x row 0; only column 0 is kept
            else:
                xrow = tl.minimum(g, M - 1)  # columns g >= M are computed and dropped
            xb = xp_ptr + xrow[:, None] * stride_xm + (qq * 8 + kof * 32)[:, None] + c4[None, :]
            xb2 = xp_ptr + tl.minimum(g + 8, M - 1)[:, None] * stride_xm + (qq * 8 + kof * 32)[:, None] + c4[None, :]
            acc0 = tl.zeros((T, 4), dtype=tl.float32)
            acc1 = tl.zeros((T, 4), dtype=tl.float32)
            xcp = xb
            if XS:  # x rows 0-15 of a step, one [16, 32] chunk a program (SLICES 1: every warp the same K range)
                r16 = tl.arange(0, 16)
                xcp = xp_ptr + tl.minimum(r16, M - 1)[:, None] * stride_xm + tl.arange(0, 32)[None, :]
            xr = None
            if XS and XR > 0:
                xr = _xr_setup(wb, i0, xp_ptr, stride_xm, M, t, g, qq, XR_RING)  # (no K slices: kof is 0)
            if PAIR:  # the warp's second tile: TILES tiles on
                tile_b = tile + TILES
                hop = (tl.minimum(tile_b, NT - 1) - tile_c).to(tl.int64)
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _fp4_mma_loop_pair(
                    wb, sb, wb + hop[:, None] * stride_wt, sb + hop * stride_st, xb, xb2, i0, i1, T, UNROLL, EV,
                    BLOCK_M == 16, PDL, BX)
            else:
                acc0, acc1, acc2, acc3 = _fp4_mma_loop(wb, sb, xb, xb2, i0, i1, T, UNROLL, EV, BLOCK_M == 16, acc0,
                                                       acc1, acc0, acc1, PDL, BX, XJIT, XS, xcp, XR, XR_COPY,
                                                       XR_WAIT, xr)
            if DEPS:
                tl.extra.cuda.gdc_launch_dependents()
            y = _slice_sum(acc0 + acc1, TILES, SLICES) * ts
            if SLICES > 1:  # the indices of the summed layout: TILES warps' lanes
                t, tile, lane, g, qq = _lanes(grp * TILES, 32 * TILES, 1)
            e = c4[None, :]
            rows = (tile * 16 + g)[:, None] + 8 * (e // 2)
            ms = (2 * qq)[:, None] + e % 2
            om = (rows < N) & (ms < M) & (tile < NT)[:, None]
            op = out_ptr + ms * stride_om + rows
            om2 = om
            if BLOCK_M == 16:  # x rows 8-15
                y2 = _slice_sum(acc2 + acc3, TILES, SLICES) * ts
                om2 = (rows < N) & (ms + 8 < M) & (tile < NT)[:, None]
                if ATOMIC:
                    tl.atomic_add(op + 8 * stride_om, y2, mask=om2, sem="relaxed")
                else:
                    tl.store(op + 8 * stride_om, y2.to(out_ptr.dtype.element_ty), mask=om2)
            fp = fin_ptr + ms * stride_fm + rows
            omb = om
            omb2 = om2
            if PAIR:  # the second tile's sums, 16 TILES rows on
                omb = (rows + 16 * TILES < N) & (ms < M) & (tile_b < NT)[:, None]
                omb2 = (rows + 16 * TILES < N) & (ms + 8 < M) & (tile_b < NT)[:, None]
                _store_sums(op + 16 * TILES, (acc4 + acc5) * ts, omb, ATOMIC)
                if BLOCK_M == 16:
                    _store_sums(op + 16 * TILES + 8 * stride_om, (acc6 + acc7) * ts, omb2, ATOMIC)
        else:
            # the CPU interpreter (no asm): the same repacked layout, decode and fp16 scaling; each lane's partial
            # per (row half, x row), then the four lanes of a quad (four groups) summed
            XR: tl.constexpr = 16 if BLOCK_M == 16 else 8
            TE: tl.constexpr = 32 * GT * SLICES  # every tile of the group (PAIR: both of each warp's) as lanes
            if PAIR:
                t, tile, lane, g, qq = _lanes(grp * GT, TE, SLICES)
                tile_c = tl.minimum(tile, NT - 1)
                kof, i1 = _k_slice(t, i0, i1, SLICES)
            m8 = tl.arange(0, XR)
            part = _fp4_mma_emul_rows(xp_ptr, w_ptr, s_ptr, tile_c, lane, qq, i0, i1, stride_wt, stride_st,
                                      stride_xm, 0, M, TE, XR, BX, kof)
            # [tile, g, half, x row]: the four lanes of a quad, then the slices, summed
            y = tl.sum(tl.sum(tl.reshape(part, (GT, SLICES, 8, 4, 2, XR)), axis=3), axis=1) * ts
            wv = tl.arange(0, GT)[:, None, None, None]
            gv = tl.arange(0, 8)[None, :, None, None]
            hv = tl.arange(0, 2)[None, None, :, None]
            mv = m8[None, None, None, :]
            rows = (grp * GT + wv) * 16 + gv + 8 * hv
            om = (rows < N) & (mv < M)
            om2 = om
            omb = om
            omb2 = om
            op = out_ptr + mv * stride_om + rows
            fp = fin_ptr + mv * stride_fm + rows
        if ATOMIC:
            tl.atomic_add(op, y, mask=om, sem="relaxed")
            if FINISH:
                _split_finish(op, fp, om, cnt_ptr + grp, units, total, USE_ASM and BLOCK_M == 16,
                              8 * stride_om, om2, PAIR and USE_ASM, 16 * TILES, omb, omb2)
        else:
            tl.store(op, y.to(out_ptr.dtype.element_ty), mask=om)

    @triton.jit
    def _fp4_mma_emul_rows(xp_ptr, w_ptr, s_ptr, tile_c, lane, qq, i0, i1, stride_wt, stride_st, stride_xm, m0, M,
                           TE: tl.constexpr, XR: tl.constexpr, BX: tl.constexpr, kof=0):
        """The CPU interpreter's stand-in for the mma loop (no asm) over x rows m0..m0+XR-1 (those < M): the same
        repacked layout, decode and scaling as the asm, each lane's partial sums [TE, row half, x row] over steps
        [i0, i1) (kof: the lane's K slice's first step)."""
        mr = m0 + tl.arange(0, XR)
        xm = (mr < M)[None, :]
        part = tl.zeros((TE, 2, XR), dtype=tl.float32)
        for i in range(i0, i1):
            sv = tl.load(s_ptr + tile_c.to(tl.int64) * stride_st + lane + (i + kof) * 32).to(tl.int32)
            for r in tl.static_range(2):
                sr = ((sv >> (8 * r)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
                acc_r = tl.zeros((TE, XR), dtype=tl.float32)
                for wr in tl.static_range(2):
                    word = tl.load(w_ptr + tile_c.to(tl.int64) * stride_wt + lane * 4 + (i + kof) * 128 + 2 * r + wr)
                    xw = xp_ptr + mr[None, :] * stride_xm + (((4 * (i + kof) + qq) * 2 + wr) * 4)[:, None]
                    for j in tl.static_range(4):
                        xv = tl.load(xw + j, mask=xm, other=0)
                        lo, hi = _emul_plane(word, j, sr, BX)
                        acc_r += lo[:, None] * _emul_x(xv, False, BX) + hi[:, None] * _emul_x(xv, True, BX)
                part += tl.where((tl.arange(0, 2) == r)[None, :, None], acc_r[:, None, :], 0.0)
        return part

    @triton.jit
    def _fp4_mma_emul_m1(xb, w_base, s_base, tile_c, lane, qq, i0, i1, stride_wt, stride_st, T: tl.constexpr,
                         WARPS: tl.constexpr, BX: tl.constexpr = False, kof=0, SLICES: tl.constexpr = 1):
        """The CPU interpreter's M=1 stand-in for the mma loop (no asm): the same repacked layout, decode and fp16
        scaling against x row 0 (BX: the bf16 form's, as in _fp4_mma_kernel); [WARPS / SLICES, 8 (g), 2 (row
        half)] = rows 16 tile + g + 8 half."""
        part = tl.zeros((T, 2), dtype=tl.float32)
        for i in range(i0, i1):
            sv = tl.load(s_base + tile_c * stride_st + lane + (i + kof) * 32).to(tl.int32)
            for r in tl.static_range(2):
                sr = ((sv >> (8 * r)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
                acc_r = tl.zeros((T,), dtype=tl.float32)
                for wr in tl.static_range(2):
                    word = tl.load(w_base + tile_c * stride_wt + lane * 4 + (i + kof) * 128 + 2 * r + wr)
                    xw = xb + ((4 * (i + kof) + qq) * 2 + wr) * 4
                    for j in tl.static_range(4):
                        xv = tl.load(xw + j)
                        lo, hi = _emul_plane(word, j, sr, BX)
                        acc_r += lo * _emul_x(xv, False, BX) + hi * _emul_x(xv, True, BX)
                part += tl.where((tl.arange(0, 2) == r)[None, :], acc_r[:, None], 0.0)
        # the four lanes of a quad, then a tile's K slices (warps w // SLICES: kof their first steps)
        return tl.sum(tl.sum(tl.reshape(part, (WARPS // SLICES, SLICES, 8, 4, 2)), axis=3), axis=1)

    @triton.jit
    def _fp4_mma_grouped_kernel(xp_ptr, w_ptr, s_ptr, ts_ptr, ids_ptr, rw_ptr, out_ptr, N, NT, steps_per_split,
                                NSTEPS, up_off, stride_xs, stride_we, stride_wt, stride_se, stride_st, stride_os,
                                WARPS: tl.constexpr, UNROLL: tl.constexpr, PAIRED: tl.constexpr,
                                ROW_WEIGHT: tl.constexpr, USE_ASM: tl.constexpr, EV: tl.constexpr = "",
                                PDL: tl.constexpr = False, BX: tl.constexpr = False, SLICES: tl.constexpr = 1):
        """Grouped M=1 form of _fp4_mma_kernel: program (group of WARPS 16-row tiles, K split, slot) on the
        repacked weight of expert ids[slot], x = packed row `slot` (stride_xs 0: one shared x).
        PAIRED (no K split): tiles t (gate) and t + up_off (up) of the same expert in the same warp, and
        silu(gate) * up stored as fp16 straight into the next call's packed x (out_ptr: int16 view of an xp
        [slots, N/8, 4] int32), so the down GEMV needs no packing kernel. Else y (times weights[slot] when
        ROW_WEIGHT) is added to out[slot * stride_os + row] with fp32 atomics (the sum over slots, or K splits).
        BX (the bf16 form): xp_ptr is x (or the activation) itself as int32 pairs of bf16, and PAIRED stores
        silu(gate) * up as bf16 at its own index (out_ptr: the bf16 activation [slots, N]).
        SLICES: WARPS / SLICES tiles a program, each over SLICES warps taking slices of its K range, summed in the
        program (as _fp4_mma_part): PAIRED with the SiLU fused and warps enough in flight, one kernel."""
        T: tl.constexpr = 32 * WARPS
        TILES: tl.constexpr = WARPS // SLICES
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        slot = tl.program_id(2)
        e = tl.load(ids_ptr + slot).to(tl.int64)
        t, tile, lane, g, qq = _lanes(pid_n * TILES, T, SLICES)
        tile_c = tl.minimum(tile, NT - 1).to(tl.int64)
        i0 = pid_k * steps_per_split
        # unsliced, the offsets fold to zero: the same SASS as before slices (validated on the H200)
        kof, i1 = _k_slice(t, i0, tl.minimum(i0 + steps_per_split, NSTEPS), SLICES)
        w_base = w_ptr + e * stride_we
        s_base = s_ptr + e * stride_se
        x_base = xp_ptr + slot.to(tl.int64) * stride_xs
        ts = tl.load(ts_ptr + e) * 16384.0
        c4 = tl.arange(0, 4)
        if USE_ASM:
            wb = w_base + tile_c[:, None] * stride_wt + (lane * 4 + kof * 128)[:, None] + c4[None, :]
            sb = s_base + tile_c * stride_st + lane + kof * 32
            xb = x_base + (qq * 8 + kof * 32)[:, None] + c4[None, :]  # every column computes x row 0; 0 is kept
            acc0 = tl.zeros((T, 4), dtype=tl.float32)
            acc1 = tl.zeros((T, 4), dtype=tl.float32)
            if PAIRED:
                wu = wb + up_off * stride_wt
                su = sb + up_off * stride_st
                up0 = tl.zeros((T, 4), dtype=tl.float32)
                up1 = tl.zeros((T, 4), dtype=tl.float32)
                if PDL:
                    tl.extra.cuda.gdc_wait()
                for i in range(i0, i1, UNROLL):  # gate and up steps' loads in flight together
                    acc0, acc1 = _fp4_mma_step(wb, sb, xb, i, T, acc0, acc1, BX)
                    up0, up1 = _fp4_mma_step(wu, su, xb, i, T, up0, up1, BX)
                    if UNROLL >= 2:
                        acc0, acc1 = _fp4_mma_step(wb, sb, xb, i + 1, T, acc0, acc1, BX)
                        up0, up1 = _fp4_mma_step(wu, su, xb, i + 1, T, up0, up1, BX)
                    if UNROLL >= 4:
                        acc0, acc1 = _fp4_mma_step(wb, sb, xb, i + 2, T, acc0, acc1, BX)
                        up0, up1 = _fp4_mma_step(wu, su, xb, i + 2, T, up0, up1, BX)
                        acc0, acc1 = _fp4_mma_step(wb, sb, xb, i + 3, T, acc0, acc1, BX)
                        up0, up1 = _fp4_mma_step(wu, su, xb, i + 3, T, up0, up1, BX)
                u = _slice_sum(up0 + up1, TILES, SLICES) * ts
            else:
                acc0, acc1, _, _ = _fp4_mma_loop(wb, sb, xb, xb, i0, i1, T, UNROLL, EV, False, acc0, acc1, acc0, acc1,
                                                 PDL, BX)
            y = _slice_sum(acc0 + acc1, TILES, SLICES) * ts
            if SLICES > 1:  # the indices of the summed layout: TILES warps' lanes
                t, tile, lane, g, qq = _lanes(pid_n * TILES, 32 * TILES, 1)
            # accumulator element c of lane 4g+q: row g + 8 (c // 2), x column 2q + c % 2; keep column 0
            rows = (tile * 16 + g)[:, None] + 8 * (c4[None, :] // 2)
            om = (rows < N) & (tile < NT)[:, None] & (qq == 0)[:, None] & (c4 % 2 == 0)[None, :]
        else:
            y = _fp4_mma_emul_m1(x_base, w_base, s_base, tile_c, lane, qq, i0, i1, stride_wt, stride_st, T,
                                 WARPS, BX, kof, SLICES) * ts
            if PAIRED:
                u = _fp4_mma_emul_m1(x_base, w_base, s_base, tile_c + up_off, lane, qq, i0, i1, stride_wt,
                                     stride_st, T, WARPS, BX, kof, SLICES) * ts
            wv = tl.arange(0, TILES)[:, None, None]
            rows = (pid_n * TILES + wv) * 16 + tl.arange(0, 8)[None, :, None] + 8 * tl.arange(0, 2)[None, None, :]
            om = (rows < N) & (pid_n * TILES + wv < NT)
        if PAIRED:
            y = y / (1.0 + tl.exp(-y)) * u
            if BX:  # the activation as it is: the down GEMV reads its bf16 pairs
                tl.store(out_ptr + slot.to(tl.int64) * stride_os + rows, y.to(tl.bfloat16), mask=om)
            else:
                # value k of the packed x sits at int16 8 (k // 8) + 2 (3 - k % 8) (low half) or
                # 8 (k // 8) + 2 (7 - k % 8) + 1 (high half): plane j = (x[8w + 3 - j], x[8w + 7 - j])
                kk = rows % 8
                idx = (rows // 8) * 8 + tl.where(kk < 4, 2 * (3 - kk), 2 * (7 - kk) + 1)
                op = out_ptr + slot.to(tl.int64) * stride_os + idx
                tl.store(op, y.to(tl.float16).to(tl.int16, bitcast=True), mask=om)
        else:
            if ROW_WEIGHT:
                y = y * tl.load(rw_ptr + slot)
            tl.atomic_add(out_ptr + slot.to(tl.int64) * stride_os + rows, y, mask=om)

    @triton.jit
    def _silu_pack_kernel(gu_ptr, xp_ptr, I, stride_gs, stride_ps, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
                          BX: tl.constexpr = False, INTERLEAVED: tl.constexpr = False):
        """Split-K gate_up epilogue: gu [slots, 2I] fp32 (gate then up) -> silu(gate) * up as the packed fp16 x
        (int16 view of [slots, I/8, 4] int32) of the down GEMV. PDL: launched as a programmatic dependent.
        BX (the bf16 form): the activation as bf16 [slots, I] at xp_ptr, and gu left at zero for the next call
        (no packing kernel zeroes it there). INTERLEAVED: gate and up rows 8 at a time (fp4moe.gate_up_stack)."""
        if PDL:
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        slot = tl.program_id(1).to(tl.int64)
        k = pid * BLOCK + tl.arange(0, BLOCK)
        m = k < I
        gk = 16 * (k // 8) + k % 8 if INTERLEAVED else k
        uk = gk + 8 if INTERLEAVED else I + k
        gt = tl.load(gu_ptr + slot * stride_gs + gk, mask=m, other=0.0)
        up = tl.load(gu_ptr + slot * stride_gs + uk, mask=m, other=0.0)
        y = gt / (1.0 + tl.exp(-gt)) * up
        if BX:
            tl.store(xp_ptr + slot * stride_ps + k, y.to(tl.bfloat16), mask=m)
            _zero_loaded(gu_ptr + slot * stride_gs + gk, gt, m)
            tl.store(gu_ptr + slot * stride_gs + uk, tl.zeros_like(up), mask=m)
        else:
            kk = k % 8
            idx = (k // 8) * 8 + tl.where(kk < 4, 2 * (3 - kk), 2 * (7 - kk) + 1)
            tl.store(xp_ptr + slot * stride_ps + idx, y.to(tl.float16).to(tl.int16, bitcast=True), mask=m)

    @triton.jit
    def _zero_loaded(p, v, mask):
        """Zeros stored at p, where v was just loaded from, once every thread of the program has loaded: without the
        barrier some loads read the zeros (H200, 2026-12-04, benchmarks/device/cast_race_probe.py: the cast kernel
        returned zeros in 2 of 200 calls alone and behind fp4wide's split GEMM in 19-55 of 100 on some shapes; a copy
        of it read zeros in 999-1000 of 1000 calls without the barrier and in 0 of 2000 with it). Call it from code
        every thread of the program runs (a branch on a program's scalar)."""
        tl.debug_barrier()
        tl.store(p, tl.zeros_like(v), mask=mask)

    @triton.jit
    def _cast_zero_kernel(acc_ptr, out_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
        """out = acc cast to out's dtype, and acc left at zero for the next call's atomics (the grouped bf16 form's
        last kernel: no packing kernel zeroes the sums there)."""
        if PDL:
            tl.extra.cuda.gdc_wait()
        k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = k < N
        v = tl.load(acc_ptr + k, mask=m, other=0.0)
        tl.store(out_ptr + k, v.to(out_ptr.dtype.element_ty), mask=m)
        _zero_loaded(acc_ptr + k, v, m)

    @triton.jit
    def _block_tile(x_base, w_base, rows, nmask, k0, k_end, stride_wn, NB: tl.constexpr, EVEN_K: tl.constexpr,
                    EVEN_N: tl.constexpr):
        """The weight's [BLOCK_N, NB, 128] and x's [NB, 128] from k0 (128-aligned), as 128-column blocks."""
        kk = k0 + tl.arange(0, NB)[:, None] * 128 + tl.arange(0, 128)[None, :]  # [NB, 128]
        wp = w_base + rows[:, None, None] * stride_wn + kk[None, :, :]
        if EVEN_K:
            if EVEN_N:
                w = tl.load(wp)
            else:
                w = tl.load(wp, mask=nmask[:, None, None], other=0.0)
            x = tl.load(x_base + kk)
        else:
            w = tl.load(wp, mask=nmask[:, None, None] & (kk < k_end)[None, :, :], other=0.0)
            x = tl.load(x_base + kk, mask=kk < k_end, other=0.0)
        return w, x

    @triton.jit
    def _dense_rows_m1(x_base, w_base, s_base, rows, nmask, k_start, k_end, stride_wn, stride_sn,
                       SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                       EVEN_N: tl.constexpr, XSCALE: tl.constexpr = False):
        """M=1: a 2-D tile, reduced every iteration (what gemv.py does for bf16); block scales per 128 columns
        through a [BLOCK_N, BLOCK_K / 128, 128] view of the same tile. XSCALE (block scales, BLOCK_N dividing 128:
        the program's rows in one 128-row block): each x value times its column block's scale (gathered, one load a
        value from L1), once for all the rows, then the per-tensor form's 2-D tile and one sum a row. (The same
        through a [NB, 128] view of x and a 3-D tile, as the block form, was no faster than the block form:
        DENSE_BLOCK_XSCALE's comment.)"""
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        NB: tl.constexpr = BLOCK_K // 128 if SCALE == 2 else 1
        rb = 0
        if XSCALE:
            rb = tl.min(rows, axis=0) // 128  # the rows' one block
        for k0 in range(k_start, k_end, BLOCK_K):
            if SCALE == 2 and not XSCALE:  # BLOCK_K is a multiple of 128 and k0 is 128-aligned
                w, x = _block_tile(x_base, w_base, rows, nmask, k0, k_end, stride_wn, NB, EVEN_K, EVEN_N)
                p = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :, :], axis=2)  # [BN, NB]
                kb = k0 // 128 + tl.arange(0, NB)
                # scale columns past K are not read: 0 x (a stray NaN past the scales) would be NaN
                sb = tl.load(s_base + (rows // 128)[:, None] * stride_sn + kb[None, :],
                             mask=nmask[:, None] & (kb * 128 < k_end)[None, :], other=0.0)
                acc += tl.sum(p * sb, axis=1)
            else:  # a 2-D tile; XSCALE: each x value times its column block's scale (gathered), for all the rows
                offs = k0 + tl.arange(0, BLOCK_K)
                wp = w_base + rows[:, None] * stride_wn + offs[None, :]
                sp = s_base + rb * stride_sn + offs // 128
                if EVEN_K:
                    if EVEN_N:
                        w = tl.load(wp)
                    else:
                        w = tl.load(wp, mask=nmask[:, None], other=0.0)
                    x = tl.load(x_base + offs)
                    if XSCALE:
                        x = x.to(tl.float32) * tl.load(sp)
                else:
                    w = tl.load(wp, mask=nmask[:, None] & (offs < k_end)[None, :], other=0.0)
                    x = tl.load(x_base + offs, mask=offs < k_end, other=0.0)
                    if XSCALE:
                        x = x.to(tl.float32) * tl.load(sp, mask=offs < k_end, other=0.0)
                acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        return acc

    @triton.jit
    def _dense_rows(x_base, w_base, s_base, rows, nmask, ms, mmask, k_start, k_end, stride_xm, stride_wn, stride_sn,
                    SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, XSCALE: tl.constexpr = False):
        """[BLOCK_M, BLOCK_N] partial of x @ W^T over [k_start, k_end); SCALE 2 applies 128x128 block scales
        (XSCALE: to x, at M=1; _dense_rows_m1)."""
        if BLOCK_M == 1:
            return _dense_rows_m1(x_base, w_base, s_base, rows, nmask, k_start, k_end, stride_wn, stride_sn,
                                  SCALE, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, XSCALE)[None, :]
        acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs = k0 + tl.arange(0, BLOCK_K)
            wp = w_base + rows[:, None] * stride_wn + offs[None, :]
            xp = x_base + ms[:, None] * stride_xm + offs[None, :]
            if EVEN_K:
                if EVEN_N:
                    w = tl.load(wp)
                else:
                    w = tl.load(wp, mask=nmask[:, None], other=0.0)
                x = tl.load(xp, mask=mmask[:, None], other=0.0)
            else:
                kmask = offs < k_end
                w = tl.load(wp, mask=nmask[:, None] & kmask[None, :], other=0.0)
                x = tl.load(xp, mask=mmask[:, None] & kmask[None, :], other=0.0)
            prod = w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]
            if SCALE == 2:  # BLOCK_K == 128: one scale per (128-row block, 128-column block)
                sb = tl.load(s_base + (rows // 128) * stride_sn + k0 // 128, mask=nmask, other=0.0)
                acc += tl.sum(prod, axis=2) * sb[None, :]
            else:
                acc3 += prod
        if SCALE != 2:
            acc = tl.sum(acc3, axis=2)
        return acc

    @triton.jit
    def _store_sums(p, y, mask, ATOMIC: tl.constexpr):
        """Sums y at p: added in fp32 (a K split's partial sums) or stored in p's type."""
        if ATOMIC:
            tl.atomic_add(p, y, mask=mask, sem="relaxed")
        else:
            tl.store(p, y.to(p.dtype.element_ty), mask=mask)

    @triton.jit
    def _finish_sums(op, fp, om):
        """The completed fp32 sums at op (read from L2) cast to fp; zeros left at op for the next call."""
        tot = tl.load(op, mask=om, other=0.0, cache_modifier=".cg")
        tl.store(fp, tot.to(fp.dtype.element_ty), mask=om)
        _zero_loaded(op, tot, om)

    @triton.jit
    def _split_finish(op, fp, om, cnt, units, total, TWO: tl.constexpr = False, off2=0, om2=None,
                      PAIR: tl.constexpr = False, offb=0, omb=None, omb2=None):
        """Split-K epilogue without kernels of its own (no zeroing before, no cast after): once the program's
        threads have added their fp32 partial sums at op, they meet at a barrier and one thread adds the program's
        `units` of the sums' `total` at cnt (acq_rel: a K split is 1 of the splits, a stream-K part its iterations;
        its release covers every thread's sums through the barrier, the pattern of CUTLASS's split-K semaphore), and
        the program that completes the total reads the sums from L2, writes them cast at fp and leaves zeros (and
        the counter) for the next call. (A fence in every thread before the barrier, as before, cost 0.2-0.45 us a
        call on the H200: benchmarks/device/finish_probe.py; 300 calls a shape since then found no missed sums.
        The sums added in bf16 straight into a zeroed output instead, as SGLang's Marlin does with use_atomic_add:
        1.1-9x slower on the H200, bf16 atomics contending on each value's 2 bytes, and 2-4x the error: the same
        probe.)
        TWO: a second set of sums at op + off2 (cast to fp + off2) under om2. PAIR: the same again at op + offb (a
        warp's second tile) under omb (and omb2)."""
        tl.debug_barrier()
        if tl.atomic_add(cnt, units, sem="acq_rel") == total - units:
            tot = tl.load(op, mask=om, other=0.0, cache_modifier=".cg")
            tl.store(fp, tot.to(fp.dtype.element_ty), mask=om)
            _zero_loaded(op, tot, om)
            if TWO:
                tot2 = tl.load(op + off2, mask=om2, other=0.0, cache_modifier=".cg")
                tl.store(fp + off2, tot2.to(fp.dtype.element_ty), mask=om2)
                _zero_loaded(op + off2, tot2, om2)
            if PAIR:  # (the two sets above written through _finish_sums compile to other SASS for two stream-K forms)
                _finish_sums(op + offb, fp + offb, omb)
                if TWO:
                    _finish_sums(op + offb + off2, fp + offb + off2, omb2)
            tl.store(cnt, 0)

    @triton.jit
    def _dense_gemv_kernel(
        x_ptr, w_ptr, s_ptr, ids_ptr, rw_ptr, out_ptr,
        M, N, K, k_per_split, pair_off,
        stride_xs, stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_os, stride_om,
        fin_ptr, stride_fm, cnt_ptr,
        SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, HAS_IDS: tl.constexpr, PAIRED: tl.constexpr,
        ATOMIC: tl.constexpr, ROW_WEIGHT: tl.constexpr, FINISH: tl.constexpr = False, USE_ASM: tl.constexpr = False,
        XSCALE: tl.constexpr = False,
    ):
        """bf16 or fp8 weight (SCALE 0: none, 1: one fp32 per tensor/expert, 2: 128x128 blocks), bf16 x, M <= 16.
        FINISH (dense, ATOMIC): the last K split casts the sums into fin_ptr (_split_finish)."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        slot = tl.program_id(2)
        if HAS_IDS:
            e = tl.load(ids_ptr + slot).to(tl.int64)
        else:
            e = slot.to(tl.int64) * 0
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ms = tl.arange(0, BLOCK_M)
        nmask = rows < N
        mmask = ms < M
        k_start = pid_k * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        x_base = x_ptr + slot.to(tl.int64) * stride_xs
        w_base = w_ptr + e * stride_we
        s_base = s_ptr + e * stride_se
        y = _dense_rows(x_base, w_base, s_base, rows, nmask, ms, mmask, k_start, k_end, stride_xm, stride_wn,
                        stride_sn, SCALE, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, XSCALE)
        if SCALE == 1:
            y = y * tl.load(s_base)
        if PAIRED:
            u = _dense_rows(x_base, w_base, s_base, rows + pair_off, nmask, ms, mmask, k_start, k_end, stride_xm,
                            stride_wn, stride_sn, SCALE, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, XSCALE)
            if SCALE == 1:
                u = u * tl.load(s_base)
            y = y / (1.0 + tl.exp(-y)) * u
        if ROW_WEIGHT:
            y = y * tl.load(rw_ptr + slot)
        op = out_ptr + slot.to(tl.int64) * stride_os + ms[:, None] * stride_om + rows[None, :]
        om = mmask[:, None] & nmask[None, :]
        if ATOMIC:
            tl.atomic_add(op, y, mask=om, sem="relaxed")
            if FINISH:
                fp = fin_ptr + ms[:, None] * stride_fm + rows[None, :]
                _split_finish(op, fp, om, cnt_ptr + pid_n, 1, tl.num_programs(1))
        else:
            tl.store(op, y.to(out_ptr.dtype.element_ty), mask=om)


# --------------------------------------------------------------------------- formats


def repack_mma(q: nv.NVFP4Tensor, bx: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensor-core form's weight layout (done once, as servers repack at load time; the same bytes): words
    [N/16, K/64, 32, 4] int32, where lane 4g+q of 16-row tile T at K step i holds the 8 bytes of group 4i+q of row
    16T+g then those of row 16T+8+g, and scales [N/16, K/64, 32] int16 (low byte row g, high byte row g+8), so one
    warp load is 512 contiguous bytes and one lane's 16 bytes are exactly its MMA fragments; the bits of each 16-bit
    half then move to mma_bit_layout's places (fewer decode operations). N is padded to 16.
    bx (the bf16 form): the values of each word reordered first (bx_order), and the bf16 bit places."""
    n, k = q.shape
    if k % 64:
        raise DecodeGapError(f"nvfp4: the tensor-core layout needs K % 64 == 0 (K={k})")
    packed, scales = q.packed, q.block_scales.view(torch.uint8)
    if bx:
        packed = bx_order(packed, scales)
    kg, nt = k // 16, math.ceil(n / 16)
    if nt * 16 != n:
        packed = torch.cat([packed, packed.new_zeros((nt * 16 - n, k // 2))])
        scales = torch.cat([scales, scales.new_zeros((nt * 16 - n, kg))])
    w = packed.reshape(nt, 2, 8, kg // 4, 4, 8).permute(0, 3, 2, 4, 1, 5).contiguous().view(torch.int32)
    sc = scales.reshape(nt, 2, 8, kg // 4, 4).permute(0, 3, 2, 4, 1).contiguous().view(torch.int16)
    return mma_bit_layout(w, bx).view(nt, kg // 4, 32, 4), sc.view(nt, kg // 4, 32)


def bf16_pairs(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as the bf16 form's B operand: an int32 view of its bf16 pairs (no copy when x is bf16 already with
    whole pairs a row; else a bf16 copy)."""
    if not (x.dtype == torch.bfloat16 and x.stride(-1) == 1 and x.stride(0) % 2 == 0):
        x = x.to(torch.bfloat16).contiguous()
    return x.view(torch.int32)


def bx_order(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[N, K/2] packed nibbles -> the same values with each word's 8 in BX_ORDER (so plane j of the bit layout
    holds values 2j and 2j+1, x's own bf16 pair j) and the codes of blocks whose E4M3 scale is 0 set to 0 (their
    values are 0 either way; the bf16 form's scale conversion does not keep a zero scale zero)."""
    n = packed.shape[0]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(n, -1, 16)
    codes = torch.where((scales == 0)[..., None], torch.zeros_like(codes), codes)
    codes = codes.reshape(n, -1, 8)[..., list(BX_ORDER)].reshape(n, -1, 2)
    return (codes[..., 0] | (codes[..., 1] << 4)).to(torch.uint8)


def mma_bit_layout(words: torch.Tensor, bx: bool = False) -> torch.Tensor:
    """int32 words of 8 nibbles (plane j of half h at bits 16h + 12 - 4j, sign on top, as packed) -> the tensor-core
    form's bit layout (MMA_MAG_BITS, or BX_MAG_BITS for the bf16 form; MMA_SIGN_BITS): the same 32 bits, moved
    within each half."""
    mag_bits = BX_MAG_BITS if bx else MMA_MAG_BITS
    v = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros_like(v)
    for h in (0, 1):
        for j in range(4):
            nib = (v >> (16 * h + 12 - 4 * j)) & 0xF
            out |= ((nib & 7) << (16 * h + mag_bits[j])) | ((nib >> 3) << (16 * h + MMA_SIGN_BITS[j]))
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def mma_nibbles(words: torch.Tensor, bx: bool = False) -> torch.Tensor:
    """The inverse of mma_bit_layout: back to packed nibble order (for tests and dequantisation)."""
    mag_bits = BX_MAG_BITS if bx else MMA_MAG_BITS
    v = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros_like(v)
    for h in (0, 1):
        for j in range(4):
            nib = ((v >> (16 * h + mag_bits[j])) & 7) | (((v >> (16 * h + MMA_SIGN_BITS[j])) & 1) << 3)
            out |= nib << (16 * h + 12 - 4 * j)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)



@dataclass
class Fp8Weight:
    """e4m3 weight [..., N, K] with one fp32 scale per tensor (scales [...]) or per 128x128 block
    (scales [..., ceil(N/128), ceil(K/128)])."""

    data: torch.Tensor
    scales: torch.Tensor
    block: bool

    @property
    def nbytes(self) -> int:
        return self.data.numel() + 4 * self.scales.numel()


def quantize_fp8(w: torch.Tensor, block: bool = False) -> Fp8Weight:
    """Per-tensor (or per-expert when w is [E, N, K]) or 128x128-block e4m3 quantisation (amax / 448)."""
    wf = w.float()
    if not block:
        red = tuple(range(wf.dim() - 2, wf.dim()))
        s = nv.e4m3_scale(wf.abs().amax(dim=red))
        return Fp8Weight((wf / s[..., None, None]).to(torch.float8_e4m3fn), s.contiguous(), False)
    *lead, n, k = wf.shape
    nb, kb = math.ceil(n / FP8_BLOCK), math.ceil(k / FP8_BLOCK)
    pad = torch.zeros((*lead, nb * FP8_BLOCK, kb * FP8_BLOCK), dtype=torch.float32, device=w.device)
    pad[..., :n, :k] = wf
    blocks = pad.reshape(*lead, nb, FP8_BLOCK, kb, FP8_BLOCK)
    s = nv.e4m3_scale(blocks.abs().amax(dim=(-3, -1)))  # [..., nb, kb]
    q = (blocks / s[..., :, None, :, None]).reshape(*lead, nb * FP8_BLOCK, kb * FP8_BLOCK)[..., :n, :k]
    return Fp8Weight(q.to(torch.float8_e4m3fn).contiguous(), s.contiguous(), True)


def dequantize_fp8(f: Fp8Weight) -> torch.Tensor:
    d = f.data.float()
    if not f.block:
        return d * f.scales[..., None, None]
    n, k = d.shape[-2:]
    s = f.scales.repeat_interleave(FP8_BLOCK, dim=-2).repeat_interleave(FP8_BLOCK, dim=-1)[..., :n, :k]
    return d * s


def fp8_bytes(n: int, k: int, block: bool) -> int:
    return n * k + 4 * (math.ceil(n / FP8_BLOCK) * math.ceil(k / FP8_BLOCK) if block else 1)


# --------------------------------------------------------------------------- launch plans


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int  # values along K per iteration (NVFP4: 8 per int32 word)
    warps: int = 4
    split: int | None = None  # K splits; None: enough to give every SM work (split_for)
    grouped: bool = False  # NVFP4 only: int64 words (16 values, one scale) instead of int32 words
    asm: bool = False  # NVFP4 only: f16x2 inline-asm decode and dot (emulated in plain Triton by the interpreter)
    mma: bool = False  # NVFP4 tensor-core form (M <= 16): block_n = 16 x warps, block_k = 64 x steps per iteration
    evict: bool = False  # tensor-core form: weight loads marked evict-first (streamed once)
    warps_per_sm: int = 0  # tensor-core form, split None: split K until there are about this many warps per SM
    one_kernel: bool = False  # tensor-core form: each program packs its own x slice, the last K split casts the sums
    bx: bool = False  # tensor-core form in bf16 on x as it is (no packing kernel); the last K split casts the sums
    stream: bool = False  # tensor-core form: stream-K, one wave of resident programs with equal work (no `split`)
    slices: int = 1  # tensor-core form: warps a tile, each a slice of the program's K range, summed in the program
    chain: bool = False  # bf16 tensor-core form: each call a programmatic dependent of the kernel before it (PDL)
    xjit: bool = False  # tensor-core form: x loaded in the iteration that uses it, only the weights double-buffered
    xshare: bool = False  # tensor-core form, no K slices: x loaded once a program, shared through shared memory
    pair: bool = False  # tensor-core form, x loaded in place: each warp two 16-row tiles against one x load a step
    xring: int = 0  # with xshare and 4 warps: x through a ring of this many iterations of cp.async copies (2 or 3)
    xscale: bool = False  # fp8 128x128 blocks at M=1, BLOCK_N dividing 128: the block scales applied to x
    cast: bool = False  # bf16 tensor-core form, K split: the sums cast by a kernel behind it (PDL), not its last split

    @property
    def name(self) -> str:
        return (f"{'m,' if self.mma else ''}{'a,' if self.asm else ''}"
                f"{'g,' if self.grouped else ''}BN={self.block_n},BK={self.block_k},w={self.warps}"
                + (f",s={self.split}" if self.split else "") + (",ef" if self.evict else "")
                + (f",t={self.warps_per_sm}" if self.warps_per_sm and not self.split else "")
                + (",1k" if self.one_kernel else "") + (",bx" if self.bx else "") + (",sk" if self.stream else "")
                + (f",ks={self.slices}" if self.slices > 1 else "") + (",pc" if self.chain else "")
                + (",xj" if self.xjit else "") + (",xs" if self.xshare else "")
                + (f",xr={self.xring}" if self.xring else "")
                + (",tp" if self.pair else "")
                + (",xb" if self.xscale else "") + (",ck" if self.cast else ""))

    @property
    def tiles_per_warp(self) -> int:
        return 2 if self.pair else 1

    @property
    def k_multiple(self) -> int:
        """What K must be a multiple of for the tensor-core form: its iteration's values times its K slices."""
        return self.block_k * self.slices

    def fits(self, k: int) -> bool:
        """Whether a weight of K columns runs in this form: a tensor-core form needs K a multiple of k_multiple."""
        return not (self.mma and k % self.k_multiple)

    @property
    def unit(self) -> int:
        """Values per loaded weight element of the NVFP4 kernels."""
        return 16 if self.grouped else 8


def with_cast(cfg: GemvConfig) -> GemvConfig:
    """The bf16 tensor-core form with its K split's sums cast by a kernel behind it (GemvConfig.cast); other forms
    as they are."""
    return replace(cfg, cast=True) if cfg.mma and cfg.bx and not cfg.chain else cfg


# the tensor-core forms (M <= 16). H200 sweep (benchmarks/lowprec_device.py, M = 1, 4, 8, 16): the bf16 form (bx: x
# read as it is, one kernel a call) won every shape but the lm_heads, by 0.3-1.4 us a call (Llama-3.1-8B qkv 9.1 ->
# 7.9 us, o_proj 7.8 -> 6.6, down 14.1 -> 13.1, DeepSeek-V3 576x7168 5.7 -> 4.3); on the lm_heads (128256-154880 rows)
# the fp16 form with 4 steps an iteration, about 18 warps an SM and no split was then as fast or 2% faster, but since
# the bf16 form converts both rows' scales at once its wide form wins them too (FP4_MMA_BX_WIDE)
FP4_MMA_FP16 = GemvConfig(64, 128, 4, mma=True, evict=True, warps_per_sm=27)  # x packed to fp16 by a kernel first
FP4_MMA_DEFAULT = replace(FP4_MMA_FP16, bx=True)  # 2 steps an iteration, evict-first, about 27 warps an SM
FP4_MMA_WIDE = GemvConfig(64, 256, 4, mma=True, warps_per_sm=18)  # M=1, N >= FP4_WIDE_ROWS (lm_heads)
FP4_WIDE_ROWS = 65536  # H200 sweep: the lm_heads (128256-154880 rows) won with 4 steps, 36864 rows and fewer with 2
# the M=1 default on the lm_heads: the wide form in bf16. H200 (2026-12-01, read 4455 GB/s, M=1, us; xtraffic_probe.py
# m1): Llama-3.1-8B 128256x4096 74.3 against 83.8 for the fp16 wide form, DeepSeek-V3 129280x7168 126.5 against 144.0,
# GLM-5 154880x6144 134.1 against 152.8 (the 4-step K-sliced form: 76.1, 127.4, 130.7; the gemm stage times both)
FP4_MMA_BX_WIDE = replace(FP4_MMA_WIDE, bx=True)
FP4_MMA_BX_40 = GemvConfig(64, 128, 4, mma=True, evict=True, warps_per_sm=40, bx=True)  # more K splits: narrow N
FP4_MMA_BX_SK = replace(FP4_MMA_DEFAULT, stream=True)
# K slices (bf16): a program's 4 warps are 2 tiles x 2 halves of its K range, the halves' sums added in the program
# (Triton's cross-warp reduction, through shared memory), so twice the warps in flight of the unsliced form without
# a K split's atomics, counters and finishing reads. H200, M=1: 8-14% faster than the K split where it leaves no
# split (Llama-3.1-8B gate_up 19.0 against 21.1 us, DeepSeek-V3 36864x7168 38.5 against 42.4; with 4 steps an
# iteration, GLM-5 24576x6144 22.2 against 25.7), 2-8% faster on 4096x14336 to 7168x18432 (4 steps an iteration,
# with a split), 3-4% slower on the small shapes (6144x4096 and below). Tried and left out: 4 slices (1 tile a
# 4-warp program: 2-30% slower), 8 and 16 slices (1 tile, 8 or 16 warps: up to twice as slow, 6144x4096 16.8
# against 8.1 us), 2 slices of 8-warp programs, slices for about 36 or 40 warps an SM, and any sliced form with the
# split forced off where 2 slices leave one (benchmarks/device/slices_probe.py: 7168x18432 24.4 us at best against
# 22.8, too few warps in flight). On the small shapes too (the TP8 projections, where the K split's atomics and
# finishing reads might have been the cost), 8-32 slices a tile with no or few splits lost every case: H200
# (2026-12-03, read 4383 GB/s, lowprec_device.py --sections sweep --forms slices, 12 shapes at M = 1 and 8), best
# sliced form / best form / a plain read, us: 2048x6144 M=1 6.77 / 5.34 / 3.63, 576x6144 5.97 / 3.75 / 2.26,
# 6144x2048 7.62 / 5.28 / 3.65, 3584x512 4.59 / 2.55 / 2.03 (one step a warp either way: the slices' sum in the
# program, not the loads, cost the 2 us)
FP4_MMA_KS2 = GemvConfig(32, 128, 4, mma=True, evict=True, warps_per_sm=27, bx=True, slices=2)
FP4_MMA_KS2_WIDE = GemvConfig(32, 256, 4, mma=True, evict=True, warps_per_sm=18, bx=True, slices=2)
# where the sliced forms won at M <= 8 (H200, M=1, 35 shapes): from 48M weights (4096x14336 yes, 4096x7168 no), or
# with a small K from about 20 sliced warps an SM (32768x512 5.5 against 6.5 us, 24576x1536 8.0 against 9.5; 16384 x
# 2048, 15.5 an SM, no: 9.3 against 8.8)
FP4_KS2_VALUES = 48 * 2**20
FP4_KS2_WARPS_PER_SM = 20
FP4_MMA_CONFIGS = (FP4_MMA_DEFAULT, FP4_MMA_WIDE, FP4_MMA_BX_40, FP4_MMA_BX_WIDE, FP4_MMA_FP16,
                   GemvConfig(64, 256, 4, mma=True, evict=True, warps_per_sm=18),
                   GemvConfig(128, 128, 8, mma=True, evict=True, warps_per_sm=27),
                   GemvConfig(64, 128, 4, mma=True, evict=True, warps_per_sm=40),
                   # fp16 in one kernel a call (each program packs its own x, the last K split casts): on the H200
                   # it won the narrow shapes (32-576 rows) over the fp16 form but not over bx, and lost 1.5-2.2x
                   # from 1536 rows up, where hundreds of programs store the same x words into L2
                   replace(FP4_MMA_FP16, one_kernel=True), replace(FP4_MMA_WIDE, one_kernel=True),
                   # stream-K (bf16): one wave of resident programs, the same number on every SM, with equal work
                   # (give or take an iteration), at most two parts a program. With x shared (FP4_MMA_BX_SK_XS), the
                   # default at M = 9-16 where FP4_MMA_XS's K split overflows one wave (below). The second MMA set
                   # takes 80 registers (6 programs an SM) and a K split leaves a partial second wave (28672x4096:
                   # 896 programs for 792 places). H200, M=16, faster than any K split (before xjit) on all six
                   # mid-sized shapes tried, by 1-12% (DeepSeek-V3 36864x7168 58.9 against 67.2 us, Llama-3.1-8B
                   # gate_up 30.3 against 33.7). At M=1 it won three of six (gate_up 21.1 against 21.8 us, GLM-5
                   # 6144x16384 17.9 against 19.1) and lost three by 1-5%: the gemm stage times it beside the K
                   # split. Ranges of whole groups of iterations (programs not a multiple of the SMs) were 2-5%
                   # slower at M=16; with 4 steps an iteration, or capped at 64 registers for more resident
                   # programs, no faster
                   FP4_MMA_BX_SK, replace(FP4_MMA_BX_WIDE, stream=True),
                   FP4_MMA_KS2, FP4_MMA_KS2_WIDE)
# the bf16 forms chained on the kernel before them (PDL: the next call launches once every program is past its loop
# and waits before its first load). H200, M=1, a chain of calls of one GEMV: 1-4% faster on 36864x7168, 24576x6144,
# the lm_heads and 6144x4096 (GLM-5 24576x6144 21.8 against 22.2 us), 2-6% slower on 28672x4096, 4096x14336 and
# 7168x18432. Only the benchmark's sweep times them (not the gemm stage or its table): what they gain depends on the
# kernel before them, which in a server is an attention, norm or all-reduce kernel, not the same GEMV
FP4_MMA_CHAINED = (replace(FP4_MMA_KS2, chain=True), replace(FP4_MMA_KS2_WIDE, chain=True),
                   replace(FP4_MMA_DEFAULT, chain=True), replace(FP4_MMA_BX_WIDE, chain=True))
# x loaded in the iteration that uses it (xjit): sm_90, 4 steps an iteration at M = 9-16 in 74 registers for 128,
# the stream-K form in 86 for 96, the K split in 72 for 80, M=1 in 48 for 56. H200 sweep (2026-12-01, read 4383-4387
# GB/s), M = 16, us: the K split with x so loaded against stream-K, where its grid is one wave or no split:
# 28672x4096 27.9 / 29.3, 7168x18432 28.8 / 30.7, 6144x4096 10.0 / 11.4, 4096x14336 15.6 / 17.3, 128256x4096 101.9
# / 128.6; where its grid overflows one wave by a quarter or less it loses (36864x7168 78.8 / 58.1, 24576x6144 46.8 /
# 35.6, 6144x16384 31.1 / 24.8): fp4_config_for planned between the two until x was shared (below). At M <= 8 it won
# some shapes and lost others (28672x4096 M=1 18.4 / 19.3 with 4 steps and K slices, 24576x6144 22.8 / 22.2)
FP4_MMA_XJ = replace(FP4_MMA_DEFAULT, xjit=True)
# FP4_MMA_XS (FP4_MMA_XJ) at M = 9-16: 70 (72) registers (kernel_resources.py), 7 programs of 4 warps an SM
FP4_XJ_PROGRAMS_PER_SM = 7
FP4_MMA_XJIT = (replace(FP4_MMA_BX_SK, xjit=True), replace(FP4_MMA_BX_SK, block_k=256, warps_per_sm=18, xjit=True),
                FP4_MMA_XJ, replace(FP4_MMA_DEFAULT, block_k=256, warps_per_sm=18, xjit=True),
                replace(FP4_MMA_KS2, xjit=True), replace(FP4_MMA_KS2_WIDE, xjit=True),
                replace(FP4_MMA_BX_WIDE, xjit=True))
# x loaded once a program (xshare): a step's x rows 0-15, a [16, 32]-word chunk, one 16-byte load a thread, then
# every warp's B fragments out of it through shared memory (Triton's layout conversion, _x_frags), where each warp
# loaded its own 2 KB a step before (at M = 16 four times the weight's bytes; ncu: long-scoreboard stalls on those
# loads, made in the iteration that uses them, doubled the cycles an instruction against M=8). In place (with xjit)
# in 70 registers, an iteration ahead in 79 (stream-K: 117). H200 (2026-12-01, read 4382 GB/s), M = 16, us, the
# default plan before against the best of these: 28672x4096 27.8 / 25.9 (in place), 7168x18432 28.6 / 28.0 (in
# place), 6144x4096 10.2 / 9.4 (ahead), 4096x14336 15.6 / 15.2 (in place), 36864x7168 58.8 / 53.6 (stream-K, ahead),
# 24576x6144 35.5 / 32.0 (in place, split cut to 2), 6144x16384 23.8 / 22.8 (in place, split cut to 9), 128256x4096
# 105.8 / 97.0 (ahead, no split): fp4_config_for plans between them (_m16_plan)
# Other sizes tried with x shared (H200, 2026-12-03, lowprec_device.py --forms m16, six shapes at M = 12 and 16):
# programs of 8 warps (x shared by 8: 1.1-23.6 us slower, 28672x4096 M=16 40.6 against 26.0), of 2 warps (0.9-16.9
# us slower), one step an iteration (0.5-3.8 us slower), about 20 or 36 warps an SM (within 0.3 us or slower) won
# nothing. Two warps a tile, one x set each (the bf16 form, K split, cast behind it: what took kernels/fp8mma's M=16
# from 84.6 to 71.0 us on 36864x7168), checked on the GPU and then slower than these on all 15 cases (H200,
# 2026-12-04, five shapes at M = 9, 12, 16, best of six sizes against the best form, us): 28672x4096 M=16 33.9 /
# 26.0, 36864x7168 70.5 / 52.1, 7168x18432 39.3 / 28.1, 4096x14336 20.1 / 14.6, 6144x4096 10.9 / 9.3 (the best
# forms here share x a program, which fp8mma does not)
FP4_MMA_XS = replace(FP4_MMA_XJ, xshare=True)  # x chunks loaded in the iteration that uses them
FP4_MMA_XS_AHEAD = replace(FP4_MMA_DEFAULT, xshare=True)  # an iteration ahead, as the weights
FP4_MMA_BX_SK_XS = replace(FP4_MMA_BX_SK, xshare=True)
FP4_MMA_XSHARE = (FP4_MMA_XS, FP4_MMA_XS_AHEAD, FP4_MMA_BX_SK_XS, replace(FP4_MMA_BX_SK_XS, xjit=True),
                  replace(FP4_MMA_XS_AHEAD, block_k=256, warps_per_sm=18))
# x through a ring of cp.async copies (xring), 2 or 3 iterations deep, on the K split and stream-K forms of xshare:
# what the benchmark checks and times (lowprec_device.py --sections sweep --forms xring), in the plan on every split and
# stream-K (_m16_plan; FP4_RING has the 2026-12-07 rounds, with the cast kernel behind the split). H100
# (2026-12-06, M=16, L2-only copies, cp.async.cg), us, the plan's xshare form / ring 2 / ring 3: 28672x4096 (split)
# 27.6 / 31.4 / 31.6, 7168x18432 (split) 29.7 / 34.2 / 31.6, 6144x4096 10.7 / 11.9 / 11.9, 36864x7168 (stream-K)
# 62.9 / 62.3 / 63.3. ncu (28672x4096): one barrier an iteration for four, yet 3.5 cycles of barrier stall an issued
# instruction for 2.5, long-scoreboard 7.3 for 6.2, and x now read from L2 (L1 hit rate 4% for 33%; x's bytes
# through L2 as many as the weight's): the warps of a program still meet, now at the slowest one's copies. With the
# copies through L1 (cp.async.ca, as xshare's loads did), the same H100 later that day, us, M=16 (M=12), the plan's
# form (xshare, its K split's sums cast behind it) / ring 3: 28672x4096 27.25 / 26.66 (26.76 / 26.03), 7168x18432
# 29.11 / 28.44, 36864x7168 (stream-K, no cast) 63.04 / 61.72, 6144x4096 9.90 / 10.27 (ring 2 within 0.1-2.8 us of
# ring 3): ring 3 2-3% ahead on the large shapes, without the cast kernel (which the plan adds) and one sweep
# each. In 5 rounds that rotate the forms' order (lowprec_device.py --rounds 5; the same H100 model, 2026-12-06,
# read 3106 GB/s), M=16, medians (rounds' spread 0.1-0.5 us), the plan's form / the best ring: 28672x4096 27.61 /
# 26.68 (ring 3; plain read of the bytes 24.83), 7168x18432 29.24 / 28.36 (ring 2; read 28.01), 36864x7168 63.08 /
# 61.59 (stream-K ring 2; read 53.92), 6144x4096 10.05 / 10.19 (ring 3; read 6.85). So the gemm stage times the
# ring's split and stream-K forms (FP4_STAGE_CONFIGS_M) and keeps them where they win, and the plan (what the
# simulated step runs) takes them on every split and stream-K, since the same H100 model timed the ring's split forms
# with the cast kernel behind them (the last two here, as the plan runs them) ahead on every shape (FP4_RING's
# comment); the H200's rotated rounds of them (2026-12-07) are in FP4_RING's comment
FP4_MMA_XRING = (replace(FP4_MMA_XS, xring=2), replace(FP4_MMA_XS, xring=3), replace(FP4_MMA_BX_SK_XS, xring=2),
                 replace(FP4_MMA_BX_SK_XS, xring=3), with_cast(replace(FP4_MMA_XS, xring=2)),
                 with_cast(replace(FP4_MMA_XS, xring=3)))
# Where M = 9-16 loses to M = 8 (28672x4096 on an H100 80GB HBM3, 2026-12-07: the K-sliced form 22.5 us at M = 8, the
# plan 25.0-26.6 at M = 9-16). ncu (benchmarks/device/ncu_xtraffic.sh): the ring's form stalls 2.9 cycles an issued
# instruction on its barrier at M = 9 and 16 with DRAM at 68-70% of peak, the sliced form at M = 8 0.46 with DRAM at
# 74%; the tensor pipe is 22% busy at M = 16 (12% at M = 8), so the second MMA a tile is not the limit. Three forms
# built on that, each checked on the GPU against dequantise-then-matmul and timed beside the plan in 3 rotated rounds
# on six or seven of the large shapes at M = 9, 12 and 16 (the register caps at M = 8, 9 and 16), lost or drew level,
# and were left out (us, form against the plan):
# - the ring in the K-sliced form (two warps a tile on the halves of its K range, no K split, each slice copying its
#   own x; 4- and 8-warp programs, 2 or 3 sets): level on 28672x4096 (26.39 / 26.58 at M=16, 26.18 / 25.57 at M=9),
#   behind by 5-25% elsewhere (M=16: 4096x14336 17.67 / 15.22, 7168x18432 31.41 / 27.79, 6144x16384 27.50 / 22.11);
# - the ring's sets handed on by mbarriers (a full and an empty barrier a set, 3 or 4 sets, copies 1 or 2
#   iterations ahead, no program barrier in the loop, 70-71 registers): 2-5% behind on every shape (28672x4096
#   27.47 / 26.69 at M=16, 26.66 / 25.37 at M=9; 7168x18432 28.64 / 27.44 at M=9): the waits moved, not the stall;
# - the sliced form with x in place under a register cap (maxnreg 64 or 56: 8 programs an SM for 7): level or
#   behind at M = 9-16 (28672x4096 27.96 / 26.33 at M=16), and at M = 8 within -4% to +15% of the plan's form
#   (28672x4096 22.29 / 23.13, 24576x6144 32.71 / 28.52).
# A fourth form took the barrier out of the loop: x's K range staged whole in shared memory once a program (ranges of
# 16 steps, 37 KB), then stream-K over the range's tile groups with no barrier (benchmarks/device/stage_probe.py; the
# same H100 model, 2026-12-07, 3 rounds): behind by 0.6-5.2% at M = 16 (28672x4096 27.75 / 26.76, 24576x6144 35.26 /
# 33.52) and level to 3% ahead at M = 9 (28672x4096 24.96 / 25.75), where it zero-fills the rows past M; left out.
# Nor did the ring's own copies gain from that zero-fill (cp.async's src-size 0 for the rows past M, where they copy
# row M - 1 again; 5 rounds, six shapes at M = 9, 12 and 15): within -5% to +2% of copying the row, the spread of
# the two builds at M = 16 (-3% to +3%), where they copy the same bytes (28672x4096 26.76 / 26.17, 7168x18432 27.31 /
# 28.27), and at M = 9 level or behind on all six (28672x4096 25.05 / 24.91, 24576x6144 31.82 / 31.38): the bytes
# x's copies move are not what M = 9-16 waits on.
# Why an H100 cannot show what M = 9-16 loses on the H200: its loop, timed with no DRAM traffic (every tile reading
# tile 0's weights and scales from L2: benchmarks/device/ablate_probe.py --m 1 8 16), us, M = 1 / 8 / 16 (the plan's
# forms), and a plain read of the bytes. H100 80GB HBM3 (2026-12-07, read 3161 GB/s): 28672x4096 16.18 / 16.95 /
# 23.00 (read 24.4), 7168x18432 20.83 / 21.53 / 24.43 (27.3), 36864x7168 33.27 / 35.09 / 47.04 (52.3), 4096x14336
# 10.41 / 10.78 / 12.70 (13.1). H200 (the same day, read 4468 GB/s): 16.52 / 17.28 / 22.96 (19.4), 21.01 / 21.96 /
# 24.56 (21.4), 34.16 / 35.64 / 46.63 (40.7), 10.47 / 10.99 / 13.00 (10.6): the same loop times on both (the same SMs
# and clocks). At M = 16 it takes 1.12-1.36x M = 8's, under the H100's read, which hides it, and over the H200's, so
# there the plan's M = 16 (25.3 us on 28672x4096 as it runs, 1.30x the read) can come no closer than 1.18x a plain read
# (0.64 of the read bandwidth) until its loop gets cheaper. ncu on the H200 (benchmarks/device/ncu_ablate.sh,
# 28672x4096 with no DRAM traffic), M = 16 / M = 8: 12.56M / 11.07M warp instructions (about 100 a step against 84.5
# in the sm_90 SASS: the second MMA set, x's fragments from shared memory, the ring), issue active 67% / 71% of cycles,
# 2.0 / 2.1 cycles an issued instruction not selected (a ready warp waiting for the scheduler), barrier 0.64 / 0.11:
# issue-bound, so the loop's instructions, not its latency, are what M = 9-16 must shed. The other forms' loops at
# M = 16 on the H100, no DRAM traffic, 28672x4096 / 7168x18432 / 4096x14336 (the plan 23.00 / 24.43 / 12.70): ring 3
# 23.46 / 24.92 / 13.06, 4 steps an iteration 22.27 / 26.10 / 13.03 (5 programs an SM: 31.06 us as it runs on
# 28672x4096), 1 step 24.94 / 27.86 / 14.17, x an iteration ahead in registers 24.00 / 25.60 / 13.50, tile pairs 24.14
# / 23.88 / 13.75, the sliced form (x in place) 31.00 / 34.47 / 18.63; on the H200, x staged whole
# (stage_probe.py --l2) 24.30-24.93 against 22.90. And on Hopper's wgmma (benchmarks/device/wgmma_rs_probe.py: the
# decoded tile as the A operand from registers, x's B tile read from the ring by the tensor cores, 4 wgmma a step for
# 8 mma.sync and no x fragment loads, 55 registers; checked on the H200 against dequantise-then-matmul, 1.7e-3):
# 1.7-2.1x slower, with or without DRAM traffic (28672x4096 M=16 42.8 us against 25.4; 7168x18432 56.9 against
# 26.9; the same with both steps' eight wgmma under one wait). Each step waits for its wgmma before its A registers
# are reused, which may be the cost (not profiled).
# tile pairs (pair): each warp two 16-row tiles, tiles w and w + 4 of an 8-tile group, both against the same x
# fragments, loaded in the iteration that uses them: a warp loads x once for twice the weight bytes (at M = 16 x's
# 2 KB a step against 1 KB of weight and 128 bytes of scales), with no shared memory or barrier (xshare's
# conversion), and both tiles' weights double-buffered. sm_90: 100 registers at M = 9-16 with a K split, 128
# without (4 programs an SM), 72 at M <= 8 (benchmarks/kernel_resources.py). H200 (2026-12-01, six runs of
# benchmarks/device/pair_probe.py on four machines), us. On the lm_heads (no split, several waves) at M=16, tile pairs
# / x shared in place / x shared ahead: Llama-3.1-8B 128256x4096 89.7-94.2 / 103.2-104.7 / 96.2-102.7, tile pairs
# fastest in all six runs. DeepSeek-V3 129280x7168 and GLM-5 154880x6144 depend on the machine: on the two that
# read 4383-4386 GB/s tile pairs were fastest (170.6 / 186.0 / 188.1 and 178.9 / 189.1 / 196.0 in the last run),
# on the two that read 4458-4462 GB/s they were slowest at M=16 (e.g. 190.1 / 181.3 / 166.2 and 202.2 / 183.3 /
# 189.4) but fastest at M=12 (161.0 / 177.0 / 178.6, 167.2 / 174.2 / 181.4). At M = 12 and 14 they won all three
# heads in every run that timed them; at M=9 none won everywhere (Llama-3.1-8B: tile pairs, 91.6 against 95.7;
# DeepSeek-V3: the unshared bf16 form, 168.8 against 173.9; GLM-5: x in place, 182.7 against 184.8). The gemm stage times all of them and keeps the fastest on the machine at hand (the GLM-5 pipeline
# at M=16, on a 4460 GB/s machine: x in place, 181.5 against 186.6 and 188.2); the plan takes tile pairs on the
# lm_heads (_m16_plan). With a K split tile pairs lost on all seven mid-sized shapes, their four programs an SM too
# few (28672x4096 25.8 / 29.8 at best, 36864x7168 53.7 / 61.9, 7168x18432 28.0 / 28.8), and at M = 8 on all but
# one (7168x18432 23.9 / 23.5); 2 steps an iteration in 84 registers (5 programs an SM) lost more, but on the M = 8
# lm_heads (128256x4096 84.4 / 87.1)
FP4_MMA_TP = GemvConfig(128, 128, 4, mma=True, evict=True, warps_per_sm=14, bx=True, xjit=True, pair=True)
FP4_MMA_PAIR = (FP4_MMA_TP, replace(FP4_MMA_TP, block_k=64))
# tried on the H200 and left out (within 0.2 us of the bf16 default below the lm_heads, or slower): bf16 with about
# 20 warps an SM, 4 steps an iteration split for 27 or 18 warps an SM, 8-warp programs; operands swapped onto Hopper's
# wgmma (the decoded weight as A from registers, Triton-pipelined loads: benchmarks/device/swapab_probe.py), 0.44-0.59
# of read bandwidth at every M, issue-bound (24576x6144 M=16 39.5 us against 31.5, 128256x4096 112.9 against 88.9);
# the weights (and x) through Triton's software pipeline (tl.range num_stages 3-6: cp.async into shared memory, then
# ld.shared) instead of the register double buffer, 54-63 registers for 70-115: slower on all 18 cases of 6 shapes
# at M = 1, 8 and 16 (H200, 2026-12-03, read 4385 GB/s; the best pipelined form against the best form, us:
# 28672x4096 M=16 30.9 / 25.8, M=1 41.2 / 19.0; 36864x7168 M=16 61.4 / 53.5; 4096x14336 M=1 16.9 / 11.8), and
# without x shared (x's per-lane loads pipelined too) 5-20x slower; two steps' x chunks joined into one tensor before
# _x_frags, for one layout conversion (one barrier pair) an iteration: Triton still converted them a step at a time
# (the same 4 barriers an iteration in the sm_90 SASS) in 88 registers for 70, so not timed
# the M=1 CUDA-core forms that still win small shapes (latency-bound: one kernel, no x packing, no split-K)
FP4_DEFAULT_ASM = GemvConfig(8, 512, 4, asm=True)
FP4_DEFAULT = GemvConfig(8, 2048, 4, split=1)
FP4_GROUPED_ASM = GemvConfig(16, 512, 4, asm=True)
FP4_CUDA_CORE_CONFIGS = (FP4_DEFAULT, GemvConfig(4, 1024, 2, split=1), FP4_DEFAULT_ASM,
                         GemvConfig(16, 512, 4, split=1, asm=True), GemvConfig(8, 1024, 4, asm=True))
# every candidate the benchmark times at M=1; the gemm stage times these per shape and keeps the fastest
FP4_M1_CONFIGS = FP4_MMA_CONFIGS + FP4_CUDA_CORE_CONFIGS
# (the K-sliced 4-step form with x loaded in place fits one wave where without it it does not: Llama-3.1-8B gate_up,
# M=1, 18.4 us against the default's 19.3 on the H200; elsewhere it lost, so the stage times it, no rule picks it)
FP4_STAGE_CONFIGS = (FP4_MMA_CONFIGS[:5] + (FP4_MMA_BX_SK, FP4_MMA_KS2, FP4_MMA_KS2_WIDE,
                                            replace(FP4_MMA_KS2_WIDE, xjit=True)) + FP4_CUDA_CORE_CONFIGS[:2]
                     # the same split forms with the cast kernel behind them (GemvConfig.cast; fp4_config_for)
                     + tuple(with_cast(c) for c in (FP4_MMA_DEFAULT, FP4_MMA_BX_40, FP4_MMA_BX_SK, FP4_MMA_KS2_WIDE)))
# M = 2..16 (with the K-sliced form with x loaded in place: 28672x4096 at M=16 26.5 us on the H200, the fastest)
# (each with the cast kernel behind it, as fp4_config_for plans above M=1); and x through the ring, split and
# stream-K, the forms that won on the H100 (FP4_MMA_XRING's comment), so the stage keeps them where they win
FP4_STAGE_CONFIGS_M = tuple(with_cast(c) for c in (
    FP4_MMA_DEFAULT, FP4_MMA_BX_SK, FP4_MMA_BX_40, FP4_MMA_FP16, FP4_MMA_KS2, FP4_MMA_KS2_WIDE, FP4_MMA_XJ,
    replace(FP4_MMA_KS2, xjit=True), FP4_MMA_XS, FP4_MMA_XS_AHEAD, FP4_MMA_BX_SK_XS, FP4_MMA_TP,
    replace(FP4_MMA_XS, xring=2), replace(FP4_MMA_XS, xring=3), replace(FP4_MMA_BX_SK_XS, xring=2)))


# the grouped (MoE) tensor-core form, the default where it fits (H200, 8 of 256 experts, DeepSeek-V3 / GLM-5: 61 / 54 us,
# 73% / 71% of read bandwidth, against 130 / 131 us for the CUDA-core form): gate_up split 2 ways over K (fp32 partials,
# then the SiLU kernel: 40 / 35 us, where gate+up paired in one warp with the SiLU fused took 102 / 88 us, too few
# warps in flight with 8 x 128 tiles), down unsplit (21 / 19 us); evict-first weights, each kernel a programmatic
# dependent of the one before. The split is no longer fixed at 2 but planned as the dense form's (about 27 warps an
# SM, every slot's tiles counted: GroupedExperts._mma_plan), which gives 2 there and 12-14 at TP8 (I = 256 a GPU: 8
# programs a slot for gate_up), where the fixed 2 left 4 warps an SM: H200 (2026-12-04), 8 experts, DeepSeek-V3
# TP8 25.9 us against 7.7 for a plain read of their bytes, GLM-5 TP8 22.0 against 7.0
FP4_GROUPED_MMA_13 = GemvConfig(64, 128, 4, mma=True, evict=True, warps_per_sm=27)
FP4_GROUPED_MMA_2 = GemvConfig(64, 128, 4, mma=True, evict=True)  # down: unsplit, as measured
# the bf16 form of both (x and the activation read as they are: no packing kernel; the SiLU kernel and a final
# cast leave the fp32 sums at zero), the default: one kernel fewer a call; on the H200 it lost by 2% (62.4 / 55.3
# against 60.6 / 54.1 us) until both rows' block scales were converted at once, and wins by 1-3% since (DeepSeek-V3 /
# GLM-5: 59.8 / 53.4 against 61.8 / 54.0 us, one run)
FP4_GROUPED_BX_13 = replace(FP4_GROUPED_MMA_13, bx=True)
FP4_GROUPED_BX_2 = replace(FP4_GROUPED_MMA_2, bx=True)
# K slices in the grouped form too (GemvConfig.slices): gate_up paired with the SiLU fused, a tile's K range over 2
# or 4 warps, so one kernel without fp32 partials or the SiLU kernel. Checked in the CPU interpreter and compiled for
# sm_90; not yet timed on a GPU (device time ran out): benchmarks/lowprec_device.py times it (GROUPED_SLICED) beside
# the default pair, which stays until it has been measured


def fp4_default(grouped: bool = False) -> GemvConfig:
    return FP4_GROUPED_ASM if grouped else FP4_DEFAULT_ASM


def _pdl_launch(pdl: bool) -> dict:
    return {"launch_pdl": True} if pdl else {}


def cast_zero(acc: torch.Tensor, out: torch.Tensor, pdl: bool) -> None:
    """Cast the fp32 split sums in acc to out's dtype and leave acc at zero for the next call (one kernel). pdl:
    launched as a programmatic dependent of the kernel before it, which lets it start once past its loop."""
    n = out.numel()
    _cast_zero_kernel[(triton.cdiv(n, 1024),)](acc, out, n, BLOCK=1024, PDL=pdl, **_pdl_launch(pdl))


def pdl_supported(device) -> bool:
    """Programmatic dependent launch (griddepcontrol) needs sm90+ and a GPU (the interpreter has none)."""
    dev = torch.device(device)
    return (dev.type == "cuda" and not interpreted() and hasattr(getattr(tl.extra, "cuda", None), "gdc_wait")
            and torch.cuda.get_device_capability(dev) >= (9, 0))


def mma_supported(device) -> bool:
    """The tensor-core form's asm needs sm89+ (cvt.rn.f16x2.e4m3x2); the CPU interpreter emulates it."""
    dev = torch.device(device)
    return dev.type != "cuda" or torch.cuda.get_device_capability(dev) >= (8, 9)


def fp4_config_for(m: int, k: int, device="cuda", n: int = 0) -> GemvConfig | None:
    """What _fp4_plan picks, with the K split's sums cast by a kernel behind the GEMV above M=1 (with_cast). H200
    (2026-12-04, benchmarks/device/cast_probe.py): the cast kernel was 0.03-0.6 us a call faster in isolation at
    M=1 and 8 on every split shape tried, and 0.6-1.3 us at M=16 (28672x4096, split 2: level); in the kernel
    level's GLM-5-NVFP4 TP8 step it took batch 8 from 13.95 to 13.84 ms but batch 1 from 7.91 to 8.02 ms (the
    attention projections 1.74 -> 1.81), so at M=1 the last split casts. The gemm stage times both at every M."""
    cfg = _fp4_plan(m, k, device, n)
    return with_cast(cfg) if cfg is not None and m > 1 else cfg


def _fp4_plan(m: int, k: int, device="cuda", n: int = 0) -> GemvConfig | None:
    """The default NVFP4 GEMV form for an [M, K] x [K, N]: tensor cores in bf16 on x as it is (bx) where K is whole
    64-value steps (sm89+; on the H200 the tensor-core forms won every M=1 shape from 32x6144 to 154880x6144): at M=1
    on N >= FP4_WIDE_ROWS (an lm_head) with 4 steps an iteration and no split (FP4_MMA_BX_WIDE); up to M = 8 in two
    K slices a tile from FP4_KS2_VALUES weights or FP4_KS2_WARPS_PER_SM sliced warps an SM (FP4_MMA_KS2), or where K
    is one iteration of them (256 or 512 values; so too above M = 8, FP4_M16_SHORT_K), split over K below that;
    above M = 8 with x loaded once a program and shared (_m16_plan: FP4_MMA_XS split over K, its split cut to fit
    one wave where needed, else stream-K, x through a ring on a split; no split: FP4_MMA_XS_AHEAD, or on an lm_head
    two tiles a warp, FP4_MMA_TP, as on a short split at M = 9-12); else the CUDA-core asm form at M=1 and None
    above. Callers that time the forms (the gemm stage, the benchmark) keep the fastest; this is what the simulated
    step runs."""
    if mma_supported(device) and m == 1 and n >= FP4_WIDE_ROWS and k % FP4_MMA_BX_WIDE.block_k == 0:
        return FP4_MMA_BX_WIDE
    sliced = 2 * math.ceil(n / 16)  # the sliced forms' warps
    if mma_supported(device) and m <= 8 and n < FP4_WIDE_ROWS:
        if (FP4_MMA_KS2_WIDE.fits(k)
                and (FP4_KS2_VALUES <= n * k or sliced >= FP4_KS2_WARPS_PER_SM * sm_count(device))):
            # K slices: 2 steps an iteration where that leaves no K split, else 4
            whole = mma_split(sliced, k // FP4_MMA_KS2.block_k, FP4_MMA_KS2.warps_per_sm, sm_count(device)) == 1
            return FP4_MMA_KS2 if whole else FP4_MMA_KS2_WIDE
        # a short K (the TP8 kv_b and shared-expert down projections) in one iteration of two slices: no K split.
        # H200 (2026-12-03, lowprec_device.py --forms plan), us, M=1 / 8, against the default: 3584x512 2.54 /
        # 2.71 against 3.27 / 3.85, 4096x512 2.60 / 2.73 against 3.26 / 3.85, 6144x256 2.49 / 2.63 against 3.21 /
        # 3.72, 7168x256 2.52 / 2.66 against 3.23 / 3.92; the fastest form timed or within 0.01 us
        for short in (FP4_MMA_KS2, FP4_MMA_KS2_WIDE):
            if k == short.k_multiple:
                return short
    if mma_supported(device) and m > 8 and n < FP4_WIDE_ROWS and sliced < FP4_KS2_WARPS_PER_SM * sm_count(device):
        # a short K in one iteration with no K split (and no cast kernel), as at M <= 8: FP4_M16_SHORT_K's comment
        for short in FP4_M16_SHORT_K:
            if k == short.k_multiple:
                return short
    if mma_supported(device) and k % FP4_MMA_DEFAULT.block_k == 0:
        return _m16_plan(n, k, sm_count(device), m) if m > 8 else FP4_MMA_DEFAULT
    if mma_supported(device) and k % 64 == 0:
        return GemvConfig(64, 64, 4, mma=True, evict=True, warps_per_sm=27, bx=True)
    return FP4_DEFAULT_ASM if m == 1 else None


# first three: the ones that won on the H200 sweep (what the gemm stage times); the rest only in the benchmark
DENSE_CONFIGS = (GemvConfig(8, 2048, 4), GemvConfig(16, 1024, 4), GemvConfig(4, 2048, 4), GemvConfig(8, 1024, 4),
                 GemvConfig(8, 1024, 4, split=1))
DENSE_BLOCK_CONFIGS = (GemvConfig(8, 1024, 4), GemvConfig(16, 512, 4), GemvConfig(4, 1024, 4), GemvConfig(8, 512, 4),
                       GemvConfig(8, 512, 4, split=1))
# the block scales of a program's one 128-row block applied to x (xscale, M=1 dense only), then one sum a row as with
# a per-tensor scale, instead of a sum a row and 128-column block. Through a [NB, 128] view of x and a 3-D tile (as
# the block form) it won only the narrow shapes, by 3-6%; with each x value's scale gathered onto the per-tensor
# form's 2-D tile it wins every shape tried and draws level with the per-tensor form (the scales cost a load a value
# from L1 and a multiply, once for all the program's rows). H200 (2026-12-02, read 4386 GB/s, benchmarks/device/
# fp8_block_probe.py), us, the block form BN=8,BK=1024 / the 3-D xscale at best / gathered at best / per-tensor at
# best: 28672x4096 31.8 / 31.9 / 29.4 (0.91 of read) / 29.2; 36864x7168 65.3 / 67.7 / 64.9 (8x1024) / 66.3;
# 24576x6144 39.9 / 40.1 / 37.9 (8x1024) / 36.9; 7168x18432 36.8 / 35.5 / 34.1 / 33.3; 6144x16384 29.9 / 28.1 /
# 26.7 / 26.2; 4096x14336 18.8 / 18.0 / 17.6 (8x1024) / 16.7; 6144x4096 9.8 / 9.3 / 8.8 / 8.6; 128256x4096 132.1 /
# 130.0 / 118.5 (1.01) / 118.4. The default at M=1 (DenseGemv without a config); the gemm stage and the benchmark
# time both beside DENSE_BLOCK_CONFIGS and keep the fastest. (torch._scaled_mm with 128x128 block scales on w and
# 1x128 on x: not at M=1 on the H200 with torch 2.11, cuBLAS says not supported; at M=16 0.39-0.77 of read
# bandwidth, e.g. 28672x4096 35.1 us, 7168x18432 43.9)
DENSE_BLOCK_XSCALE = (GemvConfig(8, 2048, 4, xscale=True), GemvConfig(8, 1024, 4, xscale=True))


def block_xscale_for(k: int) -> GemvConfig:
    """The block-scaled form on x for K: 2048 values an iteration where K is whole iterations of it, else 1024 (a
    K of 7168 masks every load of the 2048 form: H200, 36864x7168 80.2 us against 64.9 for the 1024 form). The
    grouped form takes it per GEMV: H200 (2026-12-02, read 4386 GB/s), 8 of 256 experts, us, so chosen / both 2048
    / both 1024 / the block form 8x1024: DeepSeek-V3 (H 7168, I 2048) 95.7 (0.83 of read) / 99.9 / 97.7 / 97.7,
    GLM-5 (H 6144) 79.7 (0.85) / 79.7 / 85.3 / 85.3."""
    return DENSE_BLOCK_XSCALE[0] if k % DENSE_BLOCK_XSCALE[0].block_k == 0 else DENSE_BLOCK_XSCALE[1]


# block scales at M > 1: one 128-column block an iteration, on CUDA cores. A correct form, not a fast one: on the H200
# 1214 / 5071 us for 4 / 16 rows of 36864x7168 against 80.5 / 87.5 for cuBLAS's blockwise scaling, which the kernel
# level runs there instead (kernels/fp8block.py)
DENSE_BLOCK_M = GemvConfig(16, 128, 4)


# x through the ring (FP4_MMA_XRING) in the plan at M = 9-16: 2 iterations deep on every K split and on stream-K. H100
# 80GB HBM3 (2026-12-07, 5 rotated rounds, the K split's sums cast behind it), M = 16, 12, 9, us, x shared in place /
# ring 2 / ring 3, and a plain read of the bytes. Read 3107 GB/s: 28672x4096 (16 iterations a split) 28.06 / 26.54 /
# 26.89, 27.28 / 25.96 / 26.15, 26.81 / 25.53 / 25.85 (read 24.98); 7168x18432 (18) 29.79 / 27.89 / 28.31, 29.51 / 27.65
# / 27.81, 29.17 / 27.47 / 27.70 (read 28.00); stream-K 36864x7168 63.39 / 61.08, 61.26 / 59.19, 60.71 / 58.20 (read
# 53.83). With this plan, read 3100 GB/s: 24576x6144 (cut to 2 splits) 35.10 / 33.82 / 33.54, 33.90 / 33.01 / 32.90,
# 33.92 / 32.61 / 32.22 (read 31.6); 6144x16384 (cut to 9) 23.57 / 22.18 / 23.03, 23.36 / 22.11 / 22.61, 23.29 / 21.98 /
# 22.48 (read 22.1); 6144x4096 (4) 10.04 / 9.46 / 9.34, 9.55 / 9.07 / 9.20, 9.27 / 8.93 / 8.97 (read 6.8); 4096x14336
# (8) 15.87 / 15.19 / 15.27, 15.47 / 14.83 / 14.74, 15.33 / 15.18 / 14.59 (read 13.3). The ring ahead on every split and
# M, short splits too (the 2026-12-06 loss at 4 iterations was without the cast kernel); ring 3 within -4% and +4% of
# ring 2. H200 (2026-12-07, read 4469 GB/s, issue14_pending.sh xring: medians of 5 rotated rounds), us, M = 16 /
# 9, the plan / the best form timed / a plain read: 28672x4096 25.57 / the plan / 19.54, 24.75 / the plan / 19.41;
# 7168x18432 26.84 / the plan / 21.39, 26.74 / the plan / 21.37; 4096x14336 14.28 / the plan / 10.64, 14.22 / the
# plan / 10.57; 6144x16384 (cut to 9) 21.63 / the plan / 16.95, 21.48 / the plan / 16.86; stream-K 36864x7168 51.84 /
# the plan / 41.28, 50.25 / the plan / 40.58; 24576x6144 (cut to 2) 31.51 / 31.13 (the split of 2, no ring) / 23.97,
# 30.96 / 30.26 (the uncut split, ring) / 24.05; 6144x4096 8.99 / 8.90 (ring 3) / 5.75 at M=16. The plan the fastest
# on 16 of the 21 cases (M = 9, 12, 16) and within 0.2-2.3% on the rest; x in place with no ring 0.4-3.9% behind
# it but on 24576x6144.
FP4_RING = 2
# the ring's K-split and stream-K forms as the plan runs them (_m16_plan; the benchmark and the tests name them too)
FP4_MMA_XS_RING = replace(FP4_MMA_XS, xring=FP4_RING)
FP4_MMA_SK_RING = replace(FP4_MMA_BX_SK_XS, xring=FP4_RING)
# tile pairs (FP4_MMA_TP, its own K split) at M = 9-12 where the plan's K split is short (FP4_PAIR_MAX_ITERATIONS
# iterations or fewer) over at least FP4_PAIR_MIN_ROWS rows: the TP4/TP8 attention, shared-expert and Llama
# projections. H100 80GB HBM3 (2026-12-07, read 3162 GB/s, lowprec_device.py --forms pair --rounds 5, the cast kernel
# behind both), M=9 / M=12, us, the ring's plan against tile pairs: 6144x4096 8.77 / 8.44, 8.96 / 8.78; 4096x4096
# 7.33 / 7.04, 7.38 / 7.20; 3072x6144 7.65 / 7.36, 8.11 / 7.70; 4608x7168 10.33 / 9.74, 10.44 / 10.24; 7168x2304
# 7.56 / 7.29, 7.84 / 7.65; 4096x7168 9.72 / 9.44, 9.85 / 9.67; 6144x1536 6.21 / 5.95, 6.39 / 6.22; 7168x4608
# 10.38 / 9.78, 10.70 / 10.37; 3584x4096 6.93 / 6.81, 7.14 / 7.23 (the one loss). Left to the plan: fewer rows
# (2048x2048 4.57 / 4.63, 2112x7168 7.06 / 7.09 at M=9), longer splits (4096x14336, 8 iterations: 14.63 / 14.64,
# 14.56 / 14.86) and M = 13-16, where tile pairs lost 6 of 12 shapes at M=14 and 7 at M=16 (M=16: 3584x4096 7.32 /
# 7.70, 7168x2304 8.00 / 8.40, 2112x7168 7.58 / 8.08) for 3-4% won on others (3072x6144 8.40 / 8.11). With this plan
# (issue14_pending.sh pairs, the same H100 model, read 3162 GB/s), plan / ring at M=9: 0.93-0.99 on eight of the nine
# shapes, 1.007 on 4096x4096; at M=12: 0.96-0.99 on six, 1.00 on 4096x7168, 1.008 on 4096x4096, 1.022 on 3584x4096.
# H200 (2026-12-07, read 4469 GB/s, issue14_pending.sh pairs, 5 rotated rounds): at M = 9 and 12 tile pairs, the plan,
# the fastest form timed on all nine shapes but one (4096x7168 M=9: 9.21 against the ring's 9.20). At M=16, where the
# plan takes the ring, tile pairs were faster on seven of the nine (6144x4096 8.46 / 9.01, 4096x4096 7.09 / 7.39,
# 3072x6144 7.42 / 7.81, 4608x7168 9.84 / 10.26, 7168x2304 7.54 / 7.87, 6144x1536 6.26 / 6.37, 7168x4608 10.20 / 10.60)
# and ring 3 on the other two (3584x4096 6.92 / the plan 7.16, tile pairs 7.28; 4096x7168 9.33 / 9.65): the H100's
# rounds above had tile pairs behind on 7 of 12 at M=16, so the two machines disagree there and the plan stays (the gemm
# stage times both on the machine at hand).
FP4_PAIR_MAX_M, FP4_PAIR_MAX_ITERATIONS, FP4_PAIR_MIN_ROWS = 12, 6, 3072
# and not on a one-iteration split: over 1024-1792 values tile pairs were level or lost at M = 9 / 12 (the same H100,
# ring / pairs, us: 4096x1792 5.59 / 5.84, 5.82 / 6.31; 3072x1536 4.96 / 4.95, 5.08 / 5.10; 4096x1024 4.83 / 4.74,
# 5.05 / 4.96); a K of 256 or 512 values takes FP4_M16_SHORT_K before any split
FP4_PAIR_MIN_ITERATIONS = 2
# a K of one short iteration (256 or 512 values) at M = 9-16 over fewer than FP4_KS2_WARPS_PER_SM sliced warps an SM
# (what the M <= 8 plan asks of its short forms): the whole K in one iteration, no split and no cast kernel (256:
# FP4_MMA_BX_WIDE, 512: FP4_MMA_KS2_WIDE), where _m16_plan split it 2-4 ways. H100 80GB HBM3 (2026-12-07, read 3160
# GB/s, lowprec_device.py --forms pair --rounds 5), us, M = 9 / 12 / 16, the split plan against this: 3584x512 (the
# GLM-5 TP8 kv_b) 4.04 / 4.29 / 4.31 against 3.14 / 3.22 / 3.28; 4096x512 4.26 / 4.26 / 4.54 against 3.20 / 3.26 /
# 3.33; 7168x512 5.00 / 5.13 / 5.41 against 4.02 / 4.10 / 4.21; 6144x256 (the GLM-5 TP8 shared expert's down) 4.13 /
# 4.47 / 4.64 against 3.04 / 3.12 / 3.23; 7168x256 4.44 / 4.58 / 4.75 against 3.09 / 3.18 / 3.27; 16384x256 5.47 /
# 5.64 / 5.93 against 4.14 / 4.29 / 4.48 (each the fastest form timed). Over more rows the plan stays: 28672x512
# (tile pairs at M = 9-12) 8.21 / 8.67 / 9.42 against 9.54 / 10.01 / 10.57; on 32768x512 its stream-K (10.10 / 10.51 /
# 11.40) lost to this (9.69 / 10.10 / 10.76), to tile pairs (8.77 / 9.25 at M = 9 / 12) and to FP4_MMA_KS2, unsplit
# (9.72 at M=16); the plan now takes the last there (FP4_SLICED_MAX_STEPS). H200 (2026-12-07, read 4469 GB/s,
# issue14_pending.sh shortk, 5 rotated rounds), us, M = 9 / 12 / 16, the plan (FP4_MMA_KS2) against tile pairs:
# 32768x512 9.23 / 9.35 / 9.75 against 7.95 / 8.32 / 9.01, 32768x1024 12.56 / 12.93 / 13.59 against 10.19 / 10.93 /
# 11.84, 36864x512 9.91 / 10.03 / 10.67 against 8.96 / 9.45 / 10.26 (tile pairs of one step an iteration): tile pairs
# the fastest on all nine, by 4-19%, where the H100 had them behind on 36864x512 and at M=16 on 32768x512. Not yet in
# the plan: the H100's and the H200's rounds order them differently (the gemm stage times all three).
FP4_M16_SHORT_K = (FP4_MMA_BX_WIDE, FP4_MMA_KS2_WIDE)
# where the split's grid overflows a wave even cut to two (stream-K), a K of at most FP4_SLICED_MAX_STEPS 64-value
# steps takes the K-sliced form (FP4_MMA_KS2: x in place, no split on these shapes) as at M <= 8, not stream-K over
# its 4-8 iterations a group. H100 80GB HBM3 (2026-12-07, read 3160 GB/s, lowprec_device.py --forms pair --rounds 5),
# us, M = 9 / 12 / 16, stream-K with the ring against this: 32768x512 (DeepSeek-V3's kv_b at TP1) 10.10 / 10.49 /
# 11.39 against 9.39 / 9.49 / 9.76; 36864x512 10.26 / 10.84 / 12.00 against 10.03 / 10.18 / 10.85; 32768x1024 12.77
# / 13.32 / 14.09 against 12.81 / 13.15 / 13.68. Tile pairs were faster still on the two 32768-row shapes (8.75 /
# 9.25 / 10.19 and 11.26 / 12.33 / 13.36) but slower on 36864x512 (10.96 / 11.61 / 12.58); the gemm stage times all
# three. Longer K keeps stream-K (not timed against this)
FP4_SLICED_MAX_STEPS = 16


def _m16_plan(n: int, k: int, sms: int, m: int = 16) -> GemvConfig:
    """M = 9-16, x loaded once a program (xshare): with no K split (many short programs, several waves), x an
    iteration ahead (FP4_MMA_XS_AHEAD), but on the lm_heads (N >= FP4_WIDE_ROWS) two tiles a warp (FP4_MMA_TP: on
    the H200 the fastest on all three heads at M = 12-14 and on Llama-3.1-8B's at M=16 in every run, on the other two
    at M=16 fastest or slowest by machine: FP4_MMA_TP's comment); where the K split's grid (as Nvfp4Gemv plans it) fits one wave of
    FP4_XJ_PROGRAMS_PER_SM programs an SM, x in place (FP4_MMA_XS: fewer registers); else the same with the split cut
    to what fits one wave, while that is still a split; else stream-K (FP4_MMA_BX_SK_XS), or the K-sliced form
    where K is short (FP4_SLICED_MAX_STEPS); on a split and stream-K x
    through the ring of cp.async copies, FP4_RING deep (what won on the H100; the constant's comment); at M = 9-12 a
    short split over many rows takes tile pairs instead (FP4_PAIR_MAX_M's comment). H200, M=16,
    before the ring (the forms'
    comment has the times): each the fastest of the eleven forms tried on the eight shapes tried, or within 3.5%
    (6144x4096: 9.7 us in place, 9.4 ahead). Before x was shared, with x loaded in place (benchmarks/device/
    xj_probe.py): 6144x16384 cut from 10 splits to 9, 23.7 us against 24.9 for stream-K; 24576x6144 from 3 to 2,
    34.7 against 35.5; 36864x7168 would be cut to no split, 65.1 against 59.6."""
    cfg = FP4_MMA_XS
    tiles = math.ceil(n / 16)
    programs, places = math.ceil(tiles / cfg.warps), FP4_XJ_PROGRAMS_PER_SM * sms
    steps, split = mma_k_plan(cfg, tiles, k // 64, sms)
    if split == 1:
        return FP4_MMA_TP if n >= FP4_WIDE_ROWS else FP4_MMA_XS_AHEAD
    short = FP4_PAIR_MIN_ITERATIONS <= steps * 64 // cfg.block_k <= FP4_PAIR_MAX_ITERATIONS
    if m <= FP4_PAIR_MAX_M and short and n >= FP4_PAIR_MIN_ROWS and programs * split <= places:
        return FP4_MMA_TP
    if programs * split > places:
        cut = places // programs
        if cut <= 1:
            return FP4_MMA_KS2 if k // 64 <= FP4_SLICED_MAX_STEPS else FP4_MMA_SK_RING
        return replace(FP4_MMA_XS_RING, split=cut)
    return FP4_MMA_XS_RING


def split_for(n_tiles: int, slots: int, k_blocks: int, sms: int) -> int:
    """Split K only when the N tiles (times expert slots) cannot keep every SM busy a few times over."""
    progs = n_tiles * slots
    if progs >= 4 * sms or k_blocks <= 1:
        return 1
    return max(1, min(k_blocks, math.ceil(4 * sms / progs)))


def mma_split(n_tiles: int, k_blocks: int, warps_per_sm: int, sms: int) -> int:
    """K splits of the tensor-core form: one warp per 16-row tile (per tile slice: n_tiles counts each) and split,
    about `warps_per_sm` warps an SM in all (swept on the H200: 27 with 2 steps an iteration, 18 with 4)."""
    return max(1, min(k_blocks, math.ceil(warps_per_sm * sms / n_tiles)))


def mma_k_plan(cfg: GemvConfig, n_tiles: int, n_steps: int, sms: int, split: int | None = None) -> tuple[int, int]:
    """(steps a split, splits) of the tensor-core form's K split (not stream-K) over n_tiles 16-row tiles and n_steps
    64-value steps: `split`, else the config's, else about cfg.warps_per_sm warps an SM (mma_split), else split_for;
    every split a whole number of the program's steps (an iteration's, times its K slices). With tile pairs a warp
    takes two of the tiles."""
    block = cfg.block_k // 64 * cfg.slices
    split = split or cfg.split
    warps = math.ceil(n_tiles / cfg.tiles_per_warp) * cfg.slices
    if split is None and cfg.warps_per_sm:
        split = mma_split(warps, n_steps // block, cfg.warps_per_sm, sms)
    if split is None:
        split = split_for(math.ceil(warps / cfg.warps), 1, n_steps // block, sms)
    per, split, _ = _k_plan(n_steps, block, split)
    return per, split


def resident_programs(compiled: Any, warps: int, device) -> int | None:
    """Programs of `warps` warps an SM holds at once for a compiled Triton kernel (its registers, shared memory and
    threads against the SM's: CUDA's occupancy rules, registers allocated 256 a warp); None where unknown (the CPU
    interpreter, a kernel not loaded yet)."""
    regs = getattr(compiled, "n_regs", None)
    dev = torch.device(device)
    if not regs or dev.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(dev)
    limits = SmLimits(registers=getattr(props, "regs_per_multiprocessor", 65536),
                      threads=props.max_threads_per_multi_processor, shared=props.shared_memory_per_multiprocessor)
    shared = getattr(getattr(compiled, "metadata", None), "shared", 0) or 0
    return programs_per_sm(regs, warps, shared, limits)


def _k_plan(k_units: int, block: int, split: int) -> tuple[int, int, bool]:
    """(units per split, split, even) with every split a whole number of blocks."""
    blocks = math.ceil(k_units / block)
    per = math.ceil(blocks / max(split, 1)) * block
    split = math.ceil(k_units / per)
    return per, split, k_units % block == 0


def _ring_aligned(xp: torch.Tensor) -> bool:
    """Whether x's rows start at 16-byte boundaries (cp.async copies 16 aligned bytes; the ring's form needs them)."""
    return xp.data_ptr() % 16 == 0 and xp.stride(0) % 4 == 0


def _evict(cfg: GemvConfig) -> str:
    return "evict_first" if cfg.evict else ""


def _pow2(m: int) -> int:
    return 1 << max(0, (m - 1).bit_length())


# --------------------------------------------------------------------------- dense GEMVs


class Nvfp4Gemv:
    """y[M, N] = x[M, K] @ W^T with W in NVFP4 (M <= 16), Triton. Buffers are allocated once: graph-capturable.
    The form follows the config: tensor cores (cfg.mma, any M <= 16 in one pass: two MMAs a decoded tile above 8) or
    the M=1 CUDA-core forms (asm f16x2, int32 / int64 words)."""

    def __init__(self, q: nv.NVFP4Tensor, m: int, device, cfg: GemvConfig | None = None, out_dtype=torch.bfloat16,
                 split: int | None = None, pdl: bool | None = None):
        if not HAVE_TRITON:
            raise DecodeGapError("the NVFP4 GEMV needs Triton, which is not installed")
        n, k = q.shape
        if k % 16 or m < 1 or m > 16:
            raise DecodeGapError(f"nvfp4 gemv: needs K % 16 == 0 and 1 <= M <= 16 (M={m}, K={k})")
        self.q, self.m, self.n, self.k = q, m, n, k
        self.cfg = cfg or fp4_config_for(m, k, device, n)
        if self.cfg is None:
            raise DecodeGapError(f"nvfp4 gemv: M={m} > 1 needs K % 64 == 0 and sm89+ (K={k}); use the weight-only GEMM")
        self.mma = self.cfg.mma
        if self.mma and not mma_supported(device):
            raise DecodeGapError("nvfp4 gemv: the tensor-core form needs sm89+ (cvt.rn.f16x2.e4m3x2)")
        if m > 1 and not self.mma:
            raise DecodeGapError("nvfp4 gemv: the CUDA-core forms handle M=1 only")
        self.out = torch.empty((m, n), dtype=out_dtype, device=device)
        if self.mma:
            self._init_mma(device, split, pdl)
            return
        grouped = self.cfg.grouped
        self.asm = self.cfg.asm and not grouped
        unit = 16 if grouped else 8
        self.grouped = grouped
        kw = k // unit
        # [N, K/8] int32 (8 values a word) or [N, K/16] int64 (16 values, one scale)
        self.words = q.packed.view(torch.int64 if grouped else torch.int32)
        bw = max(1, self.cfg.block_k // unit)
        self.bw = bw
        n_tiles = math.ceil(n / self.cfg.block_n)
        split = split or self.cfg.split
        if split is None:
            split = split_for(n_tiles, 1, math.ceil(kw / bw), sm_count(device))
        self.w_per_split, self.split, self.even_k = _k_plan(kw, bw, split)
        self.grid = (n_tiles, self.split, 1)
        self.acc = torch.zeros((m, n), dtype=torch.float32, device=device) if self.split > 1 else None
        self.dummy = torch.zeros(1, dtype=torch.int32, device=device)
        self.rw = torch.ones(1, dtype=torch.float32, device=device)
        self.xp = torch.empty((4, kw), dtype=torch.int32, device=device) if self.asm else None

    def _init_mma(self, device, split: int | None, pdl: bool | None) -> None:
        cfg, k = self.cfg, self.k
        self.steps = cfg.block_k // 64
        if cfg.block_k % 64 or cfg.block_n * cfg.slices != 16 * cfg.warps * cfg.tiles_per_warp or k % cfg.block_k:
            raise DecodeGapError(f"nvfp4 gemv: the tensor-core form needs BLOCK_N = 16 x warps / slices (x 2 with "
                                 f"tile pairs) and K a multiple of BLOCK_K = 64 x steps ({cfg.name}, K={k})")
        if cfg.pair and not (cfg.bx and cfg.xjit) or cfg.pair and (cfg.stream or cfg.xshare or cfg.slices != 1):
            raise DecodeGapError(f"nvfp4 gemv: tile pairs are a bf16 K split with x loaded in place (bx, xj): no "
                                 f"stream-K, shared x or K slices ({cfg.name})")
        if cfg.chain and not cfg.bx:
            raise DecodeGapError(f"nvfp4 gemv: only the bf16 form chains on the kernel before it ({cfg.name})")
        if cfg.bx and cfg.one_kernel:
            raise DecodeGapError(f"nvfp4 gemv: the bf16 form packs no x, so it has no one-kernel variant ({cfg.name})")
        if cfg.slices != 1 and (cfg.slices < 1 or cfg.stream or cfg.one_kernel or cfg.warps % cfg.slices
                                or k % cfg.k_multiple):
            raise DecodeGapError(f"nvfp4 gemv: K slices need warps a multiple of them, no stream-K or one-kernel "
                                 f"form, and K a multiple of BLOCK_K x slices ({cfg.name}, K={k})")
        if cfg.xring and (not cfg.xshare or cfg.warps != 4 or cfg.xring not in (2, 3)):
            raise DecodeGapError(f"nvfp4 gemv: x through a ring is a form of shared x in 4-warp programs, 2 or 3 "
                                 f"iterations deep ({cfg.name})")
        if cfg.xshare and (cfg.slices != 1 or cfg.one_kernel):
            raise DecodeGapError(f"nvfp4 gemv: x shared a program needs every warp on the same K range: no K slices "
                                 f"or one-kernel form ({cfg.name})")
        self.sms = sm_count(device)
        self.words, self.scales = repack_mma(self.q, bx=cfg.bx)
        nt, nsteps = self.words.shape[0], self.words.shape[1]
        slices = cfg.slices
        ctas = math.ceil(nt / (cfg.warps // slices * cfg.tiles_per_warp))
        self.stream = cfg.stream
        self.groups = ctas
        if self.stream:  # one wave: 24 warps an SM until the compiled kernel's registers say (_replan_stream)
            self.split = 0
            self._plan_stream(24 // cfg.warps)
        else:
            self.per, self.split = mma_k_plan(cfg, nt, nsteps, self.sms, split)
            self.grid = (ctas, self.split)
        self.block_m = 1 if self.m == 1 else 8 if self.m <= 8 else 16  # one pass: M <= 16 rows of x
        self.kw = k // 8
        self.bx = cfg.bx
        self.xp = None if self.bx else torch.empty((self.m, self.kw, 4), dtype=torch.int32, device=device)
        split_sums = self.split > 1 or self.stream
        self.acc = torch.zeros((self.m, self.n), dtype=torch.float32, device=device) if split_sums else None
        # the GEMV as a programmatic dependent of the x packing (sm90+): its launch overlaps the packing
        self.pdl = pdl_supported(device) if pdl is None else pdl and pdl_supported(device)
        self.one_kernel = cfg.one_kernel or cfg.bx  # one kernel a call
        if self.one_kernel:  # no packing kernel to depend on; chained: on the kernel before the call
            self.pdl = cfg.chain and cfg.bx and pdl_supported(device)
        # the last split (stream-K: the part completing a group) casts the sums; the counters start (and are left)
        # at zero
        # cast: the bf16 form's split sums cast (and left at zero) by _cast_zero_kernel, launched as a programmatic
        # dependent that the GEMV lets start once its programs are past their loops
        if cfg.cast and (not cfg.bx or cfg.chain):
            raise DecodeGapError(f"nvfp4 gemv: the cast kernel finishes only the bf16 form, not chained ({cfg.name})")
        self.cast = cfg.cast and split_sums
        self.cast_pdl = self.cast and pdl_supported(device)  # queried once: not on every call
        self.finish = (self.one_kernel or self.stream) and split_sums and not self.cast
        self.cnt = torch.zeros((ctas,), dtype=torch.int32, device=device) if self.finish else None
        self.planned = not self.stream

    def _plan_stream(self, programs_per_sm: int) -> None:
        """Stream-K grid: as many programs as fit on the GPU at once (the same number on every SM), each with the
        same number of iterations give or take one, and at most a group's worth (so a program's range crosses at
        most one group boundary: two parts). A K split instead leaves SMs with unequal work: 896 programs on 132 SMs
        are 7 on some and 6 on others."""
        ki = self.words.shape[1] // self.steps
        total = self.groups * ki
        programs = max(1, programs_per_sm * self.sms, math.ceil(total / ki))
        self.grid = (min(programs, total), 1)
        self.per = math.ceil(total / self.grid[0])  # the longest range

    def _replan_stream(self) -> None:
        """After the first launch: the programs an SM holds at once, from the compiled kernel's registers, shared
        memory and warps (the CUDA occupancy rules), and the stream-K grid again if that differs from the guess.
        Any grid gives the same sums (the counters count iterations, not programs)."""
        self.planned = True
        fits = resident_programs(self.compiled, self.cfg.warps, self.words.device)
        if fits:
            self._plan_stream(fits)

    @property
    def label(self) -> str:
        kind = "mma" if self.mma else "asm f16x2" if self.asm else "fma"
        if self.mma and self.stream:
            return (f"triton nvfp4 gemv ({kind}, {self.cfg.name}, stream-K {self.grid[0]} programs, {self.per} "
                    "iterations at most)")
        cfg = self.cfg
        sliced = f", {cfg.slices} K slices x {cfg.warps // cfg.slices} tiles" if self.mma and cfg.slices > 1 else ""
        return f"triton nvfp4 gemv ({kind}, {cfg.name}{sliced}, split={self.split})"

    def mma_args(self, x: torch.Tensor) -> dict[str, Any]:
        """The tensor-core GEMV kernel's arguments for a call on x, by name (x packed already where the form packs
        it): what _call_mma launches, and what the probes in benchmarks/device launch with some of them changed."""
        target = self.acc if self.acc is not None else self.out
        xp = bf16_pairs(x) if self.bx else self.xp  # the bf16 form: x's own bf16 pairs are the B operand
        cfg = self.cfg
        return dict(
            xp_ptr=xp, w_ptr=self.words, s_ptr=self.scales, ts_ptr=self.q.tensor_scale, out_ptr=target, M=self.m,
            N=self.n, NT=self.words.shape[0], steps_per_split=self.per, NSTEPS=self.words.shape[1],
            stride_xm=xp.stride(0), stride_wt=self.words.stride(0), stride_st=self.scales.stride(0),
            stride_om=target.stride(0), x_ptr=x, stride_x=x.stride(0), fin_ptr=self.out, stride_fm=self.out.stride(0),
            cnt_ptr=self.cnt if self.finish else target, WARPS=cfg.warps, BLOCK_M=self.block_m, UNROLL=self.steps,
            ATOMIC=self.acc is not None, USE_ASM=not interpreted(), EV=_evict(cfg), PDL=self.pdl,
            SELF_PACK=self.one_kernel and not self.bx, FINISH=self.finish, BX=self.bx, STREAM=self.stream,
            SLICES=cfg.slices, DEPS=self.pdl and cfg.chain or self.cast_pdl, XJIT=cfg.xjit,
            XS=cfg.xshare, PAIR=cfg.pair,
            **xring_constexprs(cfg.xring if cfg.xring and _ring_aligned(xp) else 0, self.steps),
            num_warps=cfg.warps, **_pdl_launch(self.pdl))

    def _call_mma(self, x: torch.Tensor) -> torch.Tensor:
        target = self.acc if self.acc is not None else self.out
        split_sums = self.acc is not None
        if not self.bx and not self.one_kernel:
            nz = self.m * self.n
            grid0 = max(triton.cdiv(self.kw, 512), triton.cdiv(nz, 2048) if split_sums else 1)
            _fp4_xpack4_kernel[(grid0, self.m)](x, self.xp, self.kw, x.stride(0), self.xp.stride(0), target, nz,
                                                BLOCK=512, ZERO=split_sums and not self.finish, DEPS=self.pdl)
        finish = self.finish
        self.compiled = _fp4_mma_kernel[self.grid](**self.mma_args(x))
        if self.cast:
            cast_zero(self.acc, self.out, self.cast_pdl)
        elif split_sums and not finish:
            self.out.copy_(self.acc)
        if not self.planned:
            self._replan_stream()
        return self.out

    @property
    def kernels(self) -> int:
        """Kernel launches a call makes: [zeroing,] [x packing,] the GEMV[, cast]."""
        if not self.mma:
            return 1 + (2 if self.acc is not None else 0) + (1 if self.asm else 0)
        if self.one_kernel:
            return 2 if self.cast else 1
        return 2 + (1 if self.acc is not None and not self.finish else 0)  # the x packing zeroes the split-K sums

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != (self.m, self.k):
            raise DecodeGapError(f"nvfp4 gemv: x has shape {tuple(x.shape)}, expected {(self.m, self.k)}")
        if self.mma:
            return self._call_mma(x)
        target = self.acc if self.acc is not None else self.out
        if self.acc is not None:
            self.acc.zero_()
        q = self.q
        kw = self.k // (16 if self.grouped else 8)
        if self.asm:
            _fp4_xpack_kernel[(triton.cdiv(kw, 512), 1)](x, self.xp, kw, 0, 0, BLOCK=512)
        self.compiled = _fp4_gemv_kernel[self.grid](
            self.xp if self.asm else x, self.words, q.block_scales, q.tensor_scale, self.dummy, self.rw, target,
            self.n, kw, self.w_per_split, 0,
            0, 0, self.words.stride(0), 0, q.block_scales.stride(0), 0,
            BLOCK_N=self.cfg.block_n, BLOCK_W=self.bw, EVEN_K=self.even_k,
            EVEN_N=self.n % self.cfg.block_n == 0, HAS_IDS=False, PAIRED=False,
            ATOMIC=self.acc is not None, ROW_WEIGHT=False, GROUPED=self.grouped, ASM=self.asm,
            USE_ASM=not interpreted(), num_warps=self.cfg.warps)
        if self.acc is not None:
            self.out.copy_(self.acc)
        return self.out


class DenseGemv:
    """y[M, N] = x[M, K] @ W^T for bf16 W, or fp8 W with per-tensor / 128x128 block scales (M <= 16, Triton).

    A batch-1 kernel: above M=1 (but for block scales, DENSE_BLOCK_M) the default tile [M, BLOCK_N, BLOCK_K] of fp32
    products spills (H200, bf16 at M=8: 114-230 us where cuBLAS takes 8-10), so the gemm stage and the kernel level
    run it at M=1 only."""

    def __init__(self, w: torch.Tensor | Fp8Weight, m: int, device, cfg: GemvConfig | None = None,
                 out_dtype=torch.bfloat16, split: int | None = None, finish: bool = True):
        if not HAVE_TRITON:
            raise DecodeGapError("the Triton GEMV needs Triton, which is not installed")
        if isinstance(w, Fp8Weight):
            self.data, self.scales, self.scale_kind = w.data, w.scales, 2 if w.block else 1
        else:
            self.data, self.scales, self.scale_kind = w, torch.ones(1, device=device), 0
        n, k = self.data.shape
        if m < 1 or m > 16:
            raise DecodeGapError(f"dense gemv: 1 <= M <= 16 (M={m})")
        self.m, self.n, self.k = m, n, k
        configs = ((block_xscale_for(k),) if m == 1 else (DENSE_BLOCK_M,)) if self.scale_kind == 2 else DENSE_CONFIGS
        self.cfg = cfg or configs[0]
        bk = self.cfg.block_k
        if self.scale_kind == 2 and (bk % FP8_BLOCK if m == 1 else FP8_BLOCK % bk):
            raise DecodeGapError(f"dense gemv: 128x128 block scales need BLOCK_K a multiple of 128 at M=1 and a "
                                 f"divisor of 128 above (BLOCK_K={bk}, M={m})")
        if self.cfg.xscale and FP8_BLOCK % self.cfg.block_n:
            raise DecodeGapError(f"dense gemv: block scales applied to x need a program's rows in one 128-row block "
                                 f"(BLOCK_N dividing 128: {self.cfg.name})")
        n_tiles = math.ceil(n / self.cfg.block_n)
        split = split or self.cfg.split
        if split is None:
            split = split_for(n_tiles, 1, math.ceil(k / self.cfg.block_k), sm_count(device))
        self.k_per_split, self.split, self.even_k = _k_plan(k, self.cfg.block_k, split)
        self.grid = (n_tiles, self.split, 1)
        self.out = torch.empty((m, n), dtype=out_dtype, device=device)
        self.acc = torch.zeros((m, n), dtype=torch.float32, device=device) if self.split > 1 else None
        # split K: the last split casts the sums and leaves zeros (one kernel a call instead of three)
        self.finish = finish and self.acc is not None
        self.cnt = torch.zeros((n_tiles,), dtype=torch.int32, device=device)
        self.dummy = torch.zeros(1, dtype=torch.int32, device=device)
        self.rw = torch.ones(1, dtype=torch.float32, device=device)

    @property
    def kernels(self) -> int:
        """Kernel launches a call makes: [zeroing,] the GEMV[, cast]."""
        return 3 if self.acc is not None and not self.finish else 1

    @property
    def label(self) -> str:
        kind = {0: "bf16", 1: "fp8 per-tensor", 2: "fp8 128x128 blocks"}[self.scale_kind]
        return f"triton {kind} gemv ({self.cfg.name}, split={self.split})"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != (self.m, self.k):
            raise DecodeGapError(f"dense gemv: x has shape {tuple(x.shape)}, expected {(self.m, self.k)}")
        target = self.acc if self.acc is not None else self.out
        if self.acc is not None and not self.finish:
            self.acc.zero_()
        s_sn = self.scales.stride(0) if self.scale_kind == 2 else 0
        _dense_gemv_kernel[self.grid](
            x, self.data, self.scales, self.dummy, self.rw, target,
            self.m, self.n, self.k, self.k_per_split, 0,
            0, x.stride(0), 0, self.data.stride(0), 0, s_sn, 0, target.stride(0), self.out, self.out.stride(0),
            self.cnt, SCALE=self.scale_kind, BLOCK_M=_pow2(self.m), BLOCK_N=self.cfg.block_n,
            BLOCK_K=self.cfg.block_k, EVEN_K=self.even_k, EVEN_N=self.n % self.cfg.block_n == 0, HAS_IDS=False,
            PAIRED=False, ATOMIC=self.acc is not None, ROW_WEIGHT=False, FINISH=self.finish,
            USE_ASM=not interpreted(), XSCALE=self.cfg.xscale and self.scale_kind == 2 and self.m == 1,
            num_warps=self.cfg.warps)
        if self.acc is not None and not self.finish:
            self.out.copy_(self.acc)
        return self.out


# --------------------------------------------------------------------------- MoE: grouped GEMV over the selected experts


class GroupedExperts:
    """One token's routed experts at M=1: silu(x W_gate^T) * (x W_up^T), then (.) W_down^T, weighted and summed,
    reading only the selected experts' weights. NVFP4 on sm89+ (H, I multiples of 64): the tensor-core form by
    default (x packing + zero-fill, gate_up split over K, a SiLU kernel writing the packed activation, down with the
    routing weight and the sum fused through fp32 atomics, a cast); else two kernels (gate+up paired with the SiLU
    fused, then down, weighted and summed through fp32 atomics), a zero-fill and a cast.

    `w13` is [E, 2I, H] (gate rows then up rows) and `w2` [E, H, I], in bf16, as `Fp8Weight`s, or as lists of
    per-expert `NVFP4Tensor`s stacked here; `ids` [S] selects experts and `weights` [S] weighs them. fp8 here runs on
    CUDA cores; fp8mma.GroupedFp8Mma is the tensor-core form of the same call (faster on the H200 where it fits)."""

    def __init__(self, fmt: str, w13: Any, w2: Any, ids: torch.Tensor, weights: torch.Tensor, device,
                 cfg13: GemvConfig | None = None, cfg2: GemvConfig | None = None, pdl: bool | None = None):
        if not HAVE_TRITON:
            raise DecodeGapError("the grouped GEMV needs Triton, which is not installed")
        # tensor-core form: each kernel after the x packing launched as a programmatic dependent of the one before
        self.pdl = pdl_supported(device) if pdl is None else pdl and pdl_supported(device)
        self.sms = sm_count(device)
        self.fmt = fmt
        self.ids = ids.to(torch.int32).contiguous()
        self.rw = weights.float().contiguous()
        self.slots = int(self.ids.numel())
        self.block = isinstance(w13, Fp8Weight) and w13.block  # fp8 with 128x128 block scales
        if fmt == "nvfp4":
            self.w13 = _stack_fp4(w13)
            self.w2 = _stack_fp4(w2)
            two_i, h = w13[0].shape
            hh, i = w2[0].shape
            configs = (fp4_default(grouped=True),)
        else:
            self.w13, self.w2 = w13, w2
            data13 = w13.data if isinstance(w13, Fp8Weight) else w13
            data2 = w2.data if isinstance(w2, Fp8Weight) else w2
            _, two_i, h = data13.shape
            _, hh, i = data2.shape
            configs = DENSE_BLOCK_CONFIGS if self.block else DENSE_CONFIGS
        if two_i != 2 * i or hh != h:
            raise DecodeGapError(f"grouped experts: w13 {two_i}x{h} and w2 {hh}x{i} do not fit together")
        self.h, self.i = h, i
        self.mma13 = self.mma2 = None
        defaults = (configs[0], configs[0])
        if self.block and i % FP8_BLOCK == 0:  # on x (grouped_alternatives times the block form too)
            defaults = (block_xscale_for(h), block_xscale_for(i))
        fits = fmt == "nvfp4" and grouped_mma_fits(h, i, device)
        if fits and cfg13 is None and cfg2 is None:  # one step an iteration where K is not whole 2-step blocks
            defaults = tuple(c if k % c.block_k == 0 else replace(c, block_k=64)
                             for c, k in ((FP4_GROUPED_BX_13, h), (FP4_GROUPED_BX_2, i)))
        self.cfg13, self.cfg2 = cfg13 or defaults[0], cfg2 or defaults[1]
        for c in (self.cfg13, self.cfg2):  # block scales on x: a program's rows (and gate's paired up rows) in one
            if c.xscale and (FP8_BLOCK % c.block_n or i % FP8_BLOCK):  # 128-row block
                raise DecodeGapError(f"grouped experts: block scales applied to x need BLOCK_N dividing 128 and I a "
                                     f"multiple of 128 ({c.name}, I={i})")
        self.bx = bool(self.cfg13.mma and self.cfg13.bx)
        if self.cfg13.mma and self.cfg2.mma and self.cfg13.bx != self.cfg2.bx:
            raise DecodeGapError("grouped experts: gate_up and down must both use the bf16 tensor-core form or neither")
        if fits:  # repacked once, in the tensor-core layout of the form chosen (both layouts kept: either form runs)
            self.mma13, self.mma2 = _stack_mma(w13, self.bx), _stack_mma(w2, self.bx)
        self.act = torch.empty((self.slots, i), dtype=torch.bfloat16, device=device)
        self.xp13 = torch.empty((1, 4, h // 8), dtype=torch.int32, device=device)  # packed x for the asm form
        self.xp2 = torch.empty((self.slots, 4, i // 8), dtype=torch.int32, device=device)
        # tensor-core form: x packed word-major; the activation written packed by the gate_up kernel; one fp32
        # buffer for the output sum and the split-K gate_up partials, zeroed by the x packing kernel
        self.xq13 = torch.empty((1, h // 8, 4), dtype=torch.int32, device=device)
        self.xq2 = torch.empty((self.slots, i // 8, 4), dtype=torch.int32, device=device)
        self.zbuf = torch.zeros((h + self.slots * 2 * i,), dtype=torch.float32, device=device)
        self.acc = self.zbuf[:h]
        self.gu = self.zbuf[h:].view(self.slots, 2 * i)
        self.out = torch.empty((1, h), dtype=torch.bfloat16, device=device)

    @property
    def label(self) -> str:
        return f"triton grouped gemv {self.fmt} (gate_up {self.cfg13.name}, down {self.cfg2.name})"

    @property
    def kernels(self) -> int:
        """Kernel launches a call makes."""
        if self.fmt == "nvfp4" and self.cfg13.mma:  # [x packing (+ zeroing),] gate_up, [SiLU], down, cast
            return (3 if self.bx else 4) + (1 if self._mma_plan(self.cfg13, self.h, 2 * self.i)[2] > 1 else 0)
        if self.fmt == "nvfp4" and self.cfg13.asm and not self.cfg13.grouped:
            return 6  # zero, x packing, gate_up, activation packing, down, cast
        return 4  # zero, gate_up, down, cast

    def _launch(self, x, w, cfg, n, k, out, paired: bool, final: bool, stride_xs: int):
        grid = (math.ceil(n / cfg.block_n), 1, self.slots)
        if self.fmt == "nvfp4":
            words, scales, ts = w
            asm = cfg.asm and not cfg.grouped
            if asm:
                xp = self.xp13 if paired else self.xp2
                _fp4_xpack_kernel[(triton.cdiv(k // 8, 512), xp.shape[0])](x, xp, k // 8, stride_xs, xp.stride(0),
                                                                            BLOCK=512)
                x, stride_xs = xp, xp.stride(0) if xp.shape[0] > 1 else 0
            if cfg.grouped:
                words = words.view(torch.int64)
            bw = max(1, cfg.block_k // cfg.unit)
            kw = k // cfg.unit
            _fp4_gemv_kernel[grid](
                x, words, scales, ts, self.ids, self.rw, out,
                n, kw, kw, n if paired else 0,
                stride_xs, words.stride(0), words.stride(1), scales.stride(0), scales.stride(1),
                0 if final else out.stride(0),
                BLOCK_N=cfg.block_n, BLOCK_W=bw, EVEN_K=kw % bw == 0, EVEN_N=n % cfg.block_n == 0,
                HAS_IDS=True, PAIRED=paired, ATOMIC=final, ROW_WEIGHT=final, GROUPED=cfg.grouped, ASM=asm,
                USE_ASM=not interpreted(), num_warps=cfg.warps)
            return
        if isinstance(w, Fp8Weight):
            data, scales, kind = w.data, w.scales, 2 if w.block else 1
        else:
            data, scales, kind = w, self.rw, 0
        s_se = scales.stride(0) if kind else 0
        s_sn = scales.stride(1) if kind == 2 else 0
        _dense_gemv_kernel[grid](
            x, data, scales, self.ids, self.rw, out,
            1, n, k, k, n if paired else 0,
            stride_xs, 0, data.stride(0), data.stride(1), s_se, s_sn, 0 if final else out.stride(0), 0,
            out, 0, self.ids, SCALE=kind, BLOCK_M=1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=k % cfg.block_k == 0,
            EVEN_N=n % cfg.block_n == 0, HAS_IDS=True, PAIRED=paired, ATOMIC=final, ROW_WEIGHT=final,
            XSCALE=cfg.xscale and kind == 2, num_warps=cfg.warps)

    def _mma_plan(self, cfg: GemvConfig, k: int, n: int = 0) -> tuple[int, int, int]:
        """(steps a loop iteration, steps per K split, splits) of the tensor-core form for K = k and N = n rows a
        slot: the config's split, else (warps_per_sm) enough to put about that many warps on every SM."""
        unroll = cfg.block_k // 64
        if (cfg.block_k % 64 or cfg.slices < 1 or cfg.warps % cfg.slices or cfg.block_n * cfg.slices != 16 * cfg.warps
                or k % cfg.k_multiple):
            raise DecodeGapError(f"grouped experts: the tensor-core form needs BLOCK_N = 16 x warps / slices and K a "
                                 f"multiple of BLOCK_K = 64 x steps x slices ({cfg.name}, K={k})")
        split = cfg.split
        if split is None and cfg.warps_per_sm and n:  # every slot's tiles (slices) a warp, about warps_per_sm an SM
            split = mma_split(math.ceil(n / 16) * cfg.slices * self.slots, k // 64 // (unroll * cfg.slices),
                              cfg.warps_per_sm, self.sms)
        per, split, _ = _k_plan(k // 64, unroll * cfg.slices, split or 1)
        return unroll, per, split

    def _call_mma(self, x: torch.Tensor) -> torch.Tensor:
        if self.mma13 is None:
            raise DecodeGapError(f"grouped experts: the tensor-core form needs H and I multiples of 64 and sm89+ "
                                 f"(H={self.h}, I={self.i})")
        self.mma_gate_up(x)
        self.mma_down()
        if self.bx:  # the cast leaves the sums at zero for the next call
            cast_zero(self.acc, self.out, self.pdl)
        else:
            self.out.copy_(self.acc[None, :])
        return self.out

    def mma_gate_up(self, x: torch.Tensor) -> None:
        """Tensor-core form, first half: pack x (zeroing the fp32 sums), gate_up (+ the SiLU kernel when split).
        The bf16 form packs nothing: x and the activation are read as they are, and the sums start at zero (left so
        by the SiLU kernel and the final cast)."""
        h, i, c13 = self.h, self.i, self.cfg13
        u13, per13, split13 = self._mma_plan(c13, h, 2 * i)
        use_asm = not interpreted()
        if self.bx:
            xin, pdl13 = bf16_pairs(x), False  # the call's first kernel: nothing to depend on
            xq2 = self.act
        else:
            nz = h + (self.slots * 2 * i if split13 > 1 else 0)
            grid0 = max(triton.cdiv(h // 8, 512), triton.cdiv(nz, 2048))
            _fp4_xpack4_kernel[(grid0, 1)](x, self.xq13, h // 8, 0, 0, self.zbuf, nz, BLOCK=512, ZERO=True,
                                           DEPS=self.pdl)
            xin, pdl13 = self.xq13, self.pdl
            xq2 = self.xq2.view(torch.int16).view(self.slots, i)
        words, scales, ts = self.mma13
        ntg = i // 16  # gate tiles; the up tiles follow
        tiles = c13.warps // c13.slices  # 16-row tiles a program
        if split13 == 1:  # gate and up in one program, silu(gate) * up written packed
            grid = (triton.cdiv(ntg, tiles), 1, self.slots)
            out, n, nt, stride_os = xq2, i, ntg, xq2.stride(0)
        else:  # K split: gate and up partials summed in fp32, then a tiny SiLU kernel
            grid = (triton.cdiv(2 * ntg, tiles), split13, self.slots)
            out, n, nt, stride_os = self.gu, 2 * i, 2 * ntg, self.gu.stride(0)
        _fp4_mma_grouped_kernel[grid](
            xin, words, scales, ts, self.ids, self.rw, out, n, nt, per13, h // 64, ntg,
            0, words.stride(0), words.stride(1), scales.stride(0), scales.stride(1), stride_os,
            WARPS=c13.warps, UNROLL=u13, PAIRED=split13 == 1, ROW_WEIGHT=False, USE_ASM=use_asm, EV=_evict(c13),
            PDL=pdl13, BX=self.bx, SLICES=c13.slices, num_warps=c13.warps, **_pdl_launch(pdl13))
        if split13 > 1:
            _silu_pack_kernel[(triton.cdiv(i, 1024), self.slots)](self.gu, xq2, i, self.gu.stride(0), xq2.stride(0),
                                                                 BLOCK=1024, PDL=self.pdl, BX=self.bx,
                                                                 **_pdl_launch(self.pdl))

    def mma_down(self) -> None:
        """Tensor-core form, second half: down on the packed activation, weighted and summed into self.acc."""
        h, i, c2 = self.h, self.i, self.cfg2
        u2, per2, split2 = self._mma_plan(c2, i, h)
        words, scales, ts = self.mma2
        nt2 = words.shape[1]
        xin = self.act.view(torch.int32) if self.bx else self.xq2  # the bf16 activation's own pairs, or packed
        _fp4_mma_grouped_kernel[(triton.cdiv(nt2, c2.warps // c2.slices), split2, self.slots)](
            xin, words, scales, ts, self.ids, self.rw, self.acc, h, nt2, per2, i // 64, 0,
            xin.stride(0), words.stride(0), words.stride(1), scales.stride(0), scales.stride(1), 0,
            WARPS=c2.warps, UNROLL=u2, PAIRED=False, ROW_WEIGHT=True, USE_ASM=not interpreted(), EV=_evict(c2),
            PDL=self.pdl, BX=self.bx, SLICES=c2.slices, num_warps=c2.warps, **_pdl_launch(self.pdl))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != (1, self.h):
            raise DecodeGapError(f"grouped experts: x has shape {tuple(x.shape)}, expected (1, {self.h})")
        if self.fmt == "nvfp4" and (self.cfg13.mma or self.cfg2.mma):
            if not (self.cfg13.mma and self.cfg2.mma):
                raise DecodeGapError("grouped experts: gate_up and down must both use the tensor-core form or neither")
            return self._call_mma(x)
        self.acc.zero_()
        self._launch(x, self.w13, self.cfg13, self.i, self.h, self.act, paired=True, final=False, stride_xs=0)
        self._launch(self.act, self.w2, self.cfg2, self.h, self.i, self.acc, paired=False, final=True,
                     stride_xs=self.act.stride(0))
        self.out.copy_(self.acc[None, :])
        return self.out

    def weight_bytes(self) -> int:
        """Bytes of the selected experts' weights (and scales): what the call must read."""
        per = self._expert_bytes()
        return per * self.slots

    def _expert_bytes(self) -> int:
        h, i = self.h, self.i
        if self.fmt == "nvfp4":
            return nv.nvfp4_bytes(2 * i, h) + nv.nvfp4_bytes(h, i)
        if self.fmt == "bf16":
            return 2 * 3 * h * i
        return fp8_bytes(2 * i, h, self.block) + fp8_bytes(h, i, self.block)


# the grouped bf16 form's down at 4 steps an iteration: which wins depends on the model (H200, 2026-12-02, read 4446
# GB/s, whole calls: GLM-5 51.6 against 53.2 us, DeepSeek-V3 62.9 against 59.7), so the MoE stage times both
FP4_GROUPED_BX_2_WIDE = replace(FP4_GROUPED_BX_2, block_k=256)


def grouped_alternatives(g: "GroupedExperts") -> list[tuple[GemvConfig, GemvConfig]]:
    """The (gate_up, down) forms worth timing for g's weights as they are repacked: where g runs the default bf16
    pair or its wide-down variant and I is whole 4-step blocks, both, the default first; with 128x128 block scales
    applied to x, that form and the block form; else g's own."""
    pair = [(FP4_GROUPED_BX_13, FP4_GROUPED_BX_2), (FP4_GROUPED_BX_13, FP4_GROUPED_BX_2_WIDE)]
    if (g.cfg13, g.cfg2) in pair and g.i % FP4_GROUPED_BX_2_WIDE.block_k == 0:
        return pair
    if g.block and (g.cfg13, g.cfg2) == (block_xscale_for(g.h), block_xscale_for(g.i)):
        return [(g.cfg13, g.cfg2), (DENSE_BLOCK_CONFIGS[0], DENSE_BLOCK_CONFIGS[0])]
    return [(g.cfg13, g.cfg2)]


def grouped_from_bf16(fmt: str, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                      device, cfg13: GemvConfig | None = None, cfg2: GemvConfig | None = None) -> GroupedExperts:
    """Quantise bf16 expert weights [E, 2I, H] / [E, H, I] to `fmt` (bf16 | fp8 | fp8-block | nvfp4) and wrap them."""
    if fmt == "bf16":
        return GroupedExperts("bf16", w13, w2, ids, weights, device, cfg13, cfg2)
    if fmt in ("fp8", "fp8-block"):
        block = fmt == "fp8-block"
        return GroupedExperts("fp8", quantize_fp8(w13, block), quantize_fp8(w2, block), ids, weights, device, cfg13, cfg2)
    if fmt == "nvfp4":
        return GroupedExperts("nvfp4", [nv.quantize_nvfp4(w) for w in w13], [nv.quantize_nvfp4(w) for w in w2], ids,
                              weights, device, cfg13, cfg2)
    raise DecodeGapError(f"grouped experts: unknown format {fmt!r}")


def dequantized_experts(g: GroupedExperts) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 copies of the (quantised) expert weights a GroupedExperts holds, for the reference."""
    if g.fmt == "nvfp4":
        def deq(stack):
            words, scales, ts = stack
            e, n, kw = words.shape
            return torch.stack([nv.dequantize_nvfp4(nv.NVFP4Tensor(words[i].view(torch.uint8), scales[i], ts[i],
                                                                   (n, kw * 8))) for i in range(e)])
        return deq(g.w13), deq(g.w2)
    if isinstance(g.w13, Fp8Weight):
        return dequantize_fp8(g.w13), dequantize_fp8(g.w2)
    return g.w13.float(), g.w2.float()


def grouped_mma_fits(h: int, i: int, device) -> bool:
    """The grouped tensor-core form needs whole 64-value K steps in both GEMVs (and sm89+)."""
    return h % 64 == 0 and i % 64 == 0 and mma_supported(device)


def _stack_mma(qs: list[nv.NVFP4Tensor], bx: bool = False):
    """Per-expert repack_mma layouts stacked: words [E, N/16, K/64, 32, 4], scales [E, N/16, K/64, 32], ts [E]."""
    packs = [repack_mma(q, bx=bx) for q in qs]
    words = torch.stack([w for w, _ in packs]).contiguous()
    scales = torch.stack([sc for _, sc in packs]).contiguous()
    ts = torch.stack([q.tensor_scale.reshape(()) for q in qs]).float().contiguous()
    return words, scales, ts


def _stack_fp4(qs: list[nv.NVFP4Tensor]):
    words = torch.stack([q.packed for q in qs]).view(torch.int32).contiguous()  # [E, N, K/8]
    scales = torch.stack([q.block_scales for q in qs]).contiguous()  # [E, N, K/16]
    ts = torch.stack([q.tensor_scale.reshape(()) for q in qs]).float().contiguous()  # [E]
    return words, scales, ts


def reference_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
                      weights: torch.Tensor) -> torch.Tensor:
    """Dequantised fp32 reference: sum_s weights[s] * (silu(x W13g^T) * (x W13u^T)) W2^T for expert ids[s]."""
    out = torch.zeros((1, w2.shape[1]), dtype=torch.float32, device=x.device)
    i = w2.shape[2]
    for s, e in enumerate(ids.tolist()):
        h = x.float() @ w13[e].float().t()
        a = torch.nn.functional.silu(h[:, :i]) * h[:, i:]
        a = a.to(torch.bfloat16).float()  # the kernel stores the activation in bf16, as servers do
        out += weights[s].float() * (a @ w2[e].float().t())
    return out
