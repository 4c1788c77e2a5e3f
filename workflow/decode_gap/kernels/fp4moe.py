"""Routed experts above batch 1 with NVFP4 weights, weight-only: a fused MoE over the token-expert pairs sorted by
expert, so each expert hit streams its weights once a call whatever the number of tokens that chose it (the grouped
GEMV, `lowprec.GroupedExperts`, runs one token at a time: M calls of five kernels, an expert read once a token that
chose it).

The pairs are sorted by `fusedmoe`'s one-program align into blocks of BLOCK_M (8 or 16) pairs of one expert. Each
program of `_fp4_moe_kernel` is (16-row tile group, K split, block): the tensor-core bf16 form of the grouped GEMV
(`lowprec._fp4_mma_loop`: the weight decoded in registers into mma.sync's A operand, the block scales multiplied
exactly in bf16), with MMA column c being the block's pair c, whose x row each lane gathers (the token's row for
gate_up, the pair's activation row for down). At BLOCK_M 16 columns 8-15 take a second MMA against the same decoded
tile (lowprec's M = 9-16 path). Gate and up rows are interleaved 8 at a time (`gate_up_stack`), so each lane's
accumulator holds a value's gate beside its up. Three to five kernels a call, every buffer allocated once
(graph-capturable):
1. above batch 1, the align (`fusedmoe.align_pairs`); for one token, whose top_k experts are distinct, block b is
   pair b at every call, so the sorted pairs are filled once and the GEMMs read the token's ids as the blocks'
   experts (an id off the table, another EP rank's, skipped as the align drops it). H200 (2026-12-03, 160 of 160
   checks), us at batch 1 without the align against with it: DeepSeek-V3 TP8 13.0 / 16.8, GLM-5 TP8 13.4 / 16.5,
   DeepSeek-V3 TP1 60.6 / 64.4, GLM-5 TP1 54.7 / 57.9 (the grouped GEMV a token: 29.1, 26.5, 65.5, 58.9); the
   kernel level's GLM-5-NVFP4 TP8 step at batch 1 9.43 ms, routed experts 1.29 ms (1.49 with the align);
2. gate_up: where it is not split over K, silu(gate) * up straight from the registers as the bf16 activation a pair
   (its epilogue); else fp32 sums a pair with atomics;
3. (split gate_up only) silu(gate) * up as the bf16 activation a pair, the sums left at zero
   (`lowprec._silu_pack_kernel`);
4. down, each pair's row times its routing weight added into its token's fp32 row (atomics);
5. the cast of the sums to the output dtype, which leaves them at zero (`lowprec.cast_zero`).
On sm90+ each kernel after the align (every kernel, for one token) launches as a programmatic dependent of the one
before (as the grouped GEMV's do). Two more epilogues are kept as forms, off by default: the SiLU of a split gate_up by
the split that completes a (block, tile group) (a counter, as lowprec's split-K finish), and the cast by the down
program that completes a tile group (`silu_epilogue=True`, `cast_epilogue=True`: three kernels). H200 (2026-12-03, read
4378 GB/s, 160 of 160 checks passed), us at M = 1 / 16:
- TP8, gate_up split 2-14 ways: each lost to its kernel behind a programmatic launch: GLM-5 16.2 / 119.4 for the
  default, 17.1 / 131.0 with the cast in down, 17.4 / 134.9 with both (DeepSeek-V3 16.6 / 133.7, 17.1 / 140.4,
  17.6 / 142.1): the counter's release, its atomic and the re-read from L2 come one after another at the end of
  the grid, where the next kernel's launch was already overlapped;
- TP1, gate_up unsplit from M = 2: the SiLU from the registers against its kernel at M = 2 / 4 / 8 / 16: GLM-5
  102.4 / 183.6 / 328.3 / 633.1 against 105.1 / 192.5 / 350.2 / 639.2, DeepSeek-V3 114.1 / 213.7 / 410.2 / 733.4
  against 116.8 / 216.9 / 399.1 / 736.5 (the one loss, M=8, within what the same form reads from run to run);
  the cast in down drew level (DeepSeek-V3 M=8 392.2, GLM-5 M=16 642.1).

One token can also run either GEMM as `_fp4_moe_token_kernel`: a tile's K range over the warps of a program (and for
down the token's top_k experts too, a warp each), the sums added in the program and stored from the registers, so no
fp32 sums, atomics or counters: gate_up writes the activation (3 kernels a call), down the output (no cast kernel),
both 2 kernels. By default gate_up runs so where 2 K slices a tile give the SMs warps enough (TP1: 4% faster, GLM-5
52.7 against 54.7 us); at TP8 it needs 8-16 slices, and the sum over that many warps cost more than the atomics and
the two small kernels behind programmatic launches (TOKEN_GEMMS has the H200's figures).

Either block GEMM can also run two 16-row tiles a warp against the same x loads (`pair`, lowprec's tile pairs: the
lm_heads' form at M = 9-16), for the GEMMs whose programs are short: at TP8 down's K is 256 values, two iterations a
program. Down runs so by default, never split over K; gate_up's pair lost (PAIR_GEMMS has the H200's figures).

Under the CPU interpreter the MMA loop runs as lowprec's plain-Triton emulation of the same layout and decode.

The five-kernel form, H200 (2026-12-03, read 4379 GB/s; benchmarks/lowprec_device.py --sections fp4moe: CUDA-graph
replay, four choices of 8 of 256 experts a token rotating so no call finds its experts in the L2), us a call at M =
1 / 2 / 4 / 8 / 16 against the grouped GEMV once a token (what the kernel level ran before), and the fraction of
read bandwidth on the experts hit:
- DeepSeek-V3 TP8 (7168 x 256 a rank): 15.7 / 25.1 / 40.7 / 71.7 / 148.0 against 29.5 / 62.7 / 132.0 / 273.4 /
  545.5 (0.36-0.60: 3.1 MB experts, five kernels);
- GLM-5 TP8 (6144 x 256): 16.4 / 23.6 / 37.6 / 62.7 / 126.5 against 27.2 / 57.3 / 118.4 / 249.2 / 502.0 (0.29-0.56);
- DeepSeek-V3 TP1 (7168 x 2048): 63.9 / 116.2 / 209.9 / 381.2 / 701.9 against 65.4 / 135.5 / 271.2 / 541.2 / 1076.9
  (0.71-0.85);
- GLM-5 TP1 (6144 x 2048): 62.7 / 104.7 / 184.5 / 324.2 / 602.8 against 59.0 / 122.3 / 244.9 / 488.0 / 973.6
  (0.67-0.84).
80 checks passed (dequantise-then-matmul, 1e-2). Blocks of 16 pairs lost everywhere at these batches (9-34%), so a
block is 8 pairs unless experts average more than 8; PDL took DeepSeek-V3 TP8 at batch 1 from 17.3 to 15.7 us and
drew level elsewhere. The kernel level's GLM-5-NVFP4 TP8 step (benchmarks/simulate_gpu.py, 46 of 78 layers scaled,
CUDA graph): routed experts 2.39 -> 1.52 ms at batch 1 (step 10.47 -> 9.76 ms) and 19.03 -> 4.93 ms at batch 8
(step 28.35 -> 14.44 ms).

Above 8 tokens (H200, 2026-12-04, benchmarks/device/moe_e_probe.py: GLM-5 TP8, the 256-expert table, CUDA-graph
replay after an L2 flush). The align had spilled: 324 us of a 491 us call at 32 tokens, where the MoE stage, whose
table holds only the experts hit, saw 49 us; its histogram-and-sort form takes 3.6 (fusedmoe._align_kernel). Then
gate_up is split for three waves where unsplit it overflows one (RESIDENT_WARPS): 32 tokens 167.9 -> 155.6 us
(gate_up 93.7 -> 78.9, down 55.8: 0.66 and 0.57 of a plain read of their bytes). Each GEMM and the align let the
next kernel launch once past their loop (LAUNCH_EARLY): 155.6 / 155.5 us against 165.0 / 163.5 without, two runs.
The kernel level's GLM-5-NVFP4 TP8 step at 32 rows (benchmarks/simulate_gpu.py, 512 tokens): routed experts 36.21
-> 11.40 ms, the step 47.84 -> 23.04 ms, with the new align alone. At 320 tokens (2560 pairs) the sort in that align
took 58 us of a 376.6 us call; its atomic form (fusedmoe.ALIGN_RANK) 12.7, the call 329.8 (2026-12-05, rotated
rounds; gate_up's kernel read 213.8 -> 171.3 us in the profiler: launched early, its programs had waited on the sort).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..errors import DecodeGapError
from . import lowprec as lp
from . import nvfp4 as nv
from .fusedmoe import MAX_PAIRS, _pow2, max_blocks
from .nvfp4 import HAVE_TRITON, tl, triton

# about this many warps an SM in all (lowprec.mma_split: 27 swept on the H200 for 2 steps an iteration)
WARPS_PER_SM = 27
# the cast in down's epilogue (a counter a tile group) or as a kernel of its own: the kernel (H200, the module's
# docstring: the epilogue lost 3-10% at TP8 and drew level at TP1)
CAST_EPILOGUE = False
# warps a program of the one-token kernels at most (a tile's K slices; down's, times top_k)
TOKEN_WARPS = 16
# the GEMMs one token runs as the one-token kernel by default, and at most how many K slices a tile it may take
# there (H200, 2026-12-03, us at batch 1, the four block kernels / gate_up as the one-token kernel / down as it / both:
# DeepSeek-V3 TP1 60.5 / 58.4 / 62.7 / 60.5 and GLM-5 TP1 54.7 / 52.7 / 54.4 / 52.4, gate_up in 2 slices; at TP8,
# where gate_up needs 8-16 slices for warps enough, DeepSeek-V3 13.7 / 14.5 / 16.8 / 17.6 and GLM-5 13.4 / 14.0 /
# 14.1 / 16.1: the sum over 8-16 warps in the program cost more than the fp32 atomics and the SiLU and cast kernels
# behind programmatic launches, and down's 8 warps a program, one an expert, lost or drew level everywhere)
TOKEN_GEMMS = "gate_up"
TOKEN_AUTO_SLICES = 2
# tried on the H200 and taken out (2026-12-03): the SiLU-and-mul made by down as it loads gate_up's fp32 sums (each
# lane its 16 values' gates and ups a step, in the iteration that uses them), the cast kernel zeroing the sums, so
# no SiLU kernel: 1.9-3.1x slower at every case (batch 1: DeepSeek-V3 TP8 26.3 against 13.7 us, GLM-5 TP8 24.1 / 13.4,
# DeepSeek-V3 TP1 169.7 / 60.5): every warp of down computes the same activation, an exp a value, in its hot loop
# warps an SM holds at once, by pairs a block: the block kernel takes 56 registers a thread at 8 pairs (9 programs of 4
# warps) and 80 at 16 (its second MMA's sums: 6 programs), the same on sm_90, sm_100 and sm_120
# (benchmarks/kernel_resources.py --moe; tests/test_kernels_compile.py holds the compiler to it); past one wave of them,
# gate_up is split for WAVES waves at least (timed at 8 pairs a block only). H200 (2026-12-04,
# benchmarks/device/moe_e_probe.py, GLM-5 TP8, us for gate_up / the call): 32 tokens (158 experts hit, 1.08 waves
# unsplit) 93.7 / 167.9 unsplit, 78.8 / 158.1 in 3 splits; DeepSeek-V3 TP8 at 32 tokens 112.7 / 196.2 unsplit, 97.1 /
# 190.9 in 3, 94.9 / 185.4 in 4; GLM-5 at 64 tokens 114.5 / 208.4 unsplit, 109.6 / 203.5 in 3; at 16 tokens 2 splits
# 52.5 / 106.2, 4 48.2 / 105.3, 6 48.8 / 105.5. At 4 and 8 tokens (under one wave, left to WARPS_PER_SM) more splits
# lost: 8 tokens 31.1 / 63.4 in 2, 29.0-30.2 / 66.7-67.9 in 4-12
RESIDENT_WARPS = {8: 36, 16: 24}
RESIDENT_WARPS_PAIR = {8: 28, 16: 16}  # two tiles a warp (PAIR): 72 and 128 registers, the same three architectures
WAVES = 3
LAUNCH_EARLY = True  # gdc_launch_dependents in the align and the GEMMs (the docstring's figures)
CONFIG = lp.FP4_GROUPED_BX_2  # 4 warps (64 rows) a program, 2 steps (128 values) an iteration, evict-first weights
# which block GEMMs run two tiles a warp (PAIR, "gate_up", "down", "both" or "none"). Compiled, it holds 28 warps an
# SM at 8 pairs a block (RESIDENT_WARPS_PAIR: 56 tiles in flight against 36) and 16 at 16 pairs (32 against 24).
# H200 (2026-12-05, benchmarks/device/moe_e_probe.py, the 256-expert table, every form checked: 1.6-1.7e-3), the
# profiler's us for down, one tile a warp / two: GLM-5 TP8 (I = 256) at 8 tokens 18.9 / 17.6 unsplit (21.3 where the
# waves rule gave the pair 2 K splits), 12: 26.1 / 23.9, 16: 33.3 / 29.7, 32: 55.6 / 48.7, 64: 73.4 / 65.7;
# DeepSeek-V3 TP8 at 32: 67.8 / 58.9 (7-14% faster). gate_up as the pair lost (32 tokens: 97 against 79 + 3 for the
# SiLU kernel), and at TP1 (I = 2048, 8 tokens) neither won. Timed in a fixed order a call moved less than the order
# alone moves it, so the forms were timed again in rotated rounds (timing.rotated), down's pair unsplit (2026-12-05,
# graph us, default / down's pair): GLM-5 TP8 at 1 / 8 / 16 / 32 / 64 tokens 19.6 / 19.8, 63.0 / 62.8, 104.5 /
# 101.4, 155.3 / 147.1, 201.8 / 193.1 (both pairs at 32: 156.8); TP4 (I = 512) at 32 255.6 / 247.5; TP1 at 8 304.0 /
# 304.1; DeepSeek-V3 TP8 at 32 180.1 / 171.3. The kernel level's GLM-5-NVFP4 TP8 step (benchmarks/simulate_gpu.py):
# routed experts 10.51 -> 9.90 ms at 32 rows (the step 22.19 -> 21.74 ms), 4.31 -> 4.21 at 8 (the step level). At
# 320 tokens (blocks of 16 pairs) 329.8 -> 305.5 (down's kernel 137.7 -> 114.2); blocks of 8 there: 357.3 / 338.8.
# TP1 (I = 2048) at 320 tokens, rotated, one tile a warp / the pair: an H100 (2026-12-05) 2155.0 / 2111.1 us (down
# 719.7 / 759.9), the H200 (2026-12-05, again) 1943.5 / 1906.6 (down 611.0 / 602.0): neither card's call moved
PAIR_GEMMS = "down"
# down stores each pair's row (times its routing weight, in the output dtype) and a top_k sum a token follows (torch),
# where False adds them into the token's fp32 row with atomics and the cast kernel follows; needs down unsplit. The
# atomics were not what held down back: H200 (2026-12-05, moe_e_probe.py rotated, GLM-5 TP8, checks 2.3-2.4e-3), us
# a call, the atomics / by pair: 32 tokens 146.8 / 148.4, 128: 219.4 / 221.9, 320: 306.8 / 311.2 (down's kernel
# 114.4 -> 110.4 there, the top_k sum 14.5 against the cast's 4.9)
DOWN_BY_PAIR = False
# tile groups a program of down's pair takes, by pairs a block: one loop over their iterations with its loads a group
# ahead and the block's set-up (its expert, pairs, x rows) made once (WALK). Down's programs are short at TP8 (K = 256:
# two iterations), so that set-up's chain of dependent loads, not its bytes, held it: with every expert expert 0's
# bytes (weights from the L2) its kernel took 127.0 -> 99.4 us at 320 tokens. H100 (2026-12-05, moe_e_probe.py
# rotated, checks 1.7e-3), down's kernel us, walk 1 / 2 / 4 / 8: GLM-5 TP8 at 320 tokens (blocks of 16: 128 registers
# at any walk) 127.0 / 108.5 / 102.6 / 98.9 (the call 350.3 -> 323.8); at 32 tokens (blocks of 8: 96 registers
# walking, 72 not) 58.9 / 54.0 / 56.5, 64: 81.0 / 73.3 / 73.3; DeepSeek-V3 TP8 at 32: 71.6 / 64.8 / 66.4. The H200
# (2026-12-05, issue14_pending.sh walk_check and defaults), walk 1 / the default / another: 128 tokens (blocks of 8)
# 77.1 / 71.6 / 69.9 (walk 4; the call 220.7 / 215.4 / 214.2), 320 (blocks of 16) - / 93.9 (0.59 of a read; it was
# 114.2 unwalked), 512: 154.3 / 129.4 / 130.3 (walk 4; the call 405.0 / 383.2 / 384.3). The kernel level's GLM-5-NVFP4
# TP8 step (46 layers a CUDA graph, median over 20 replays), unwalked / walking: 32 rows 12.298 / 12.206 ms (p99
# 12.358 / 12.241; routed experts scaled to 78 layers 10.68 -> 9.84), 8 rows 7.252 / 7.284 (within a run's spread)
DOWN_WALK = {8: 2, 16: 8}
# ... where down's K is at most this many 64-value steps (GLM-5's and DeepSeek-V3's I = 256 at TP8): longer programs
# make their set-up once for more iterations already. The H200 (2026-12-05), down's kernel us, walk 1 / more: TP4
# (I = 512) at 32 tokens 80.2 / 83.4 (walk 4), TP1 (I = 2048) at 8 tokens 102.5 / 126.1 (walk 4), at 320 601.9 / 587.2
# (walk 2, its call 1908.3 / 1934.6: no gain)
DOWN_WALK_MAX_K_STEPS = 4
# ... and where down's unwalked grid is more than this many times the programs the SMs hold at once
# (RESIDENT_WARPS_PAIR): a grid the SMs hold in one go starts no program late, so walking only puts the groups one
# after another in fewer programs (GLM-5 TP8 at 1 token: 48 groups x 8 blocks = 384 programs, 7 an SM: 924 held).
# H100 (2026-12-05, moe_e_probe.py --walk 1 2, rotated, checks 1.6-1.7e-3), down's kernel us, walk 1 / 2, GLM-5 TP8:
# 1 token 5.4 / 6.8 (the call 23.7 / 25.2), 2 tokens (768 programs) 7.8 / 8.2; 4 tokens (1488) 12.8 / 12.4, 8 tokens
# 20.5 / 21.1; DeepSeek-V3 TP8 at 1 token 5.8 / 6.9 (the call 25.6 / 26.8). Again (an H100, 2026-12-05,
# issue14_pending.sh walk_small): 1 token 5.4 / 6.7 (the call 23.9 / 25.6), DeepSeek-V3 5.7 / 6.8; the kernel level's
# GLM-5-NVFP4 TP8 step at batch 1 (25 layers a CUDA graph, 20 replays) 2.723 ms (min 2.715, p99 2.737) unwalked
# against 2.749 (2.738, 2.756) walking everywhere (another H100: 2.731 (2.728, 2.735) against 2.748 (2.736,
# 2.759)). A higher limit (4: 8 tokens, 3.7 waves of planned blocks, unwalked) was level: 8 tokens 20.4 / 20.9-21.2,
# 12: 27.9 / 28.1, 16: 36.2 / 35.0, the step at 8 rows 4.403 and 4.427 ms at 1 against 4.411 and 4.414 at 4, so the
# limit stays at one wave
DOWN_WALK_MIN_WAVES = 1
# the element types of both kernels' pointers, to compile them without a GPU (decode_gap.kernels.compiled)
POINTER_TYPES = {"x_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*i16", "ts_ptr": "*fp32", "pairs_ptr": "*i32",
                 "bexp_ptr": "*i32", "rw_ptr": "*fp32", "out_ptr": "*fp32", "fin_ptr": "*bf16", "cnt_ptr": "*i32",
                 "ids_ptr": "*i32"}


def block_m_for(pairs: int, experts: int) -> int:
    """Pairs a block: 8 (one MMA's columns) unless the pairs average more than 8 an expert, then 16 (a second MMA on
    the same decoded tile), so an expert chosen by 9-16 tokens is still read once."""
    return 16 if pairs > 8 * experts else 8


if HAVE_TRITON:
    from .fusedmoe import align_cursor, align_pairs
    from .lowprec import (_emul_plane, _emul_x, _finish_sums, _fp4_mma_emul_m1, _fp4_mma_loop,
                          _fp4_mma_loop_pair, _fp4_mma_steps, _fp4_mma_with_x, _fp4_mma_wloads, _lanes,
                          _pair_zeros, _silu_pack_kernel, _slice_sum, _with_x_of)

    @triton.jit
    def _moe_store(out_ptr, y, rows, cols, row_ok, b, pairs_ptr, rw_ptr, P, stride_o, O_DIV: tl.constexpr,
                   BM: tl.constexpr, ATOMIC: tl.constexpr, ROW_WEIGHT: tl.constexpr):
        """y[row, col] of block b to out row (pair // O_DIV), times the pair's routing weight where ROW_WEIGHT;
        padding columns (pair P) dropped."""
        pn = tl.load(pairs_ptr + b * BM + cols)
        ok = row_ok & (pn < P)
        if ROW_WEIGHT:
            y = y * tl.load(rw_ptr + pn, mask=ok, other=0.0)
        op = out_ptr + (pn // O_DIV).to(tl.int64) * stride_o + rows
        if ATOMIC:
            tl.atomic_add(op, y, mask=ok, sem="relaxed")
        else:
            tl.store(op, y.to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _act_store(gate, up, vi, cols, ok, b, pairs_ptr, act_ptr, P, stride_a, BM: tl.constexpr):
        """silu(gate) * up of value vi for the block's column(s) `cols`, as the bf16 activation row of their pairs."""
        pn = tl.load(pairs_ptr + b * BM + cols)
        tl.store(act_ptr + pn.to(tl.int64) * stride_a + vi, _silu_mul(gate, up), mask=ok & (pn < P))

    @triton.jit
    def _silu_mul(gate, up):
        """The activation silu(gate) * up as the bf16 down reads."""
        return (gate / (1.0 + tl.exp(-gate)) * up).to(tl.bfloat16)

    @triton.jit
    def _gate_up_finish(gu_ptr, act_ptr, cnt_ptr, b, pid_n, splits, pairs_ptr, P, I, stride_g, stride_a,
                        TILES: tl.constexpr, BM: tl.constexpr):
        """After a K split's sums went into gu (atomics): the split that completes (block b, tile group pid_n of TILES
        tiles) writes the activation of its 8 TILES values for the block's pairs and leaves zeros (and the counter)
        for the next call; the counter's acq_rel after a barrier is lowprec._split_finish's pattern. gu's rows are
        interleaved (gate_up_stack): value v's gate at row 16 (v // 8) + v % 8, its up 8 rows on."""
        tl.debug_barrier()
        cnt = cnt_ptr + b * tl.num_programs(0) + pid_n
        if tl.atomic_add(cnt, 1, sem="acq_rel") == splits - 1:
            vi = pid_n * TILES * 8 + tl.arange(0, TILES * 8)[:, None]
            cols = tl.arange(0, BM)[None, :]
            pn = tl.load(pairs_ptr + b * BM + cols)
            ok = (vi < I) & (pn < P)
            gp = gu_ptr + pn.to(tl.int64) * stride_g + 16 * (vi // 8) + vi % 8
            gate = tl.load(gp, mask=ok, other=0.0, cache_modifier=".cg")
            up = tl.load(gp + 8, mask=ok, other=0.0, cache_modifier=".cg")
            _act_store(gate, up, vi, cols, ok, b, pairs_ptr, act_ptr, P, stride_a, BM)
            lp._zero_loaded(gp, gate, ok)  # once every thread has loaded them
            tl.store(gp + 8, tl.zeros_like(up), mask=ok)
            tl.store(cnt, 0)

    @triton.jit
    def _down_finish(acc_ptr, fin_ptr, cnt_ptr, pid_n, total, M_TOK, N, stride_o, stride_f, ROWS: tl.constexpr,
                     MB: tl.constexpr):
        """After a program's sums went into acc (atomics), or a program past the last block: the one that completes
        the `total` programs of tile group pid_n casts its ROWS rows of every token into fin and leaves zeros (and
        the counter) for the next call (the pattern of _gate_up_finish)."""
        tl.debug_barrier()
        if tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel") == total - 1:
            r = (pid_n * ROWS + tl.arange(0, ROWS))[None, :]
            for t0 in range(0, M_TOK, MB):
                tk = (t0 + tl.arange(0, MB))[:, None]
                _finish_sums(acc_ptr + tk.to(tl.int64) * stride_o + r, fin_ptr + tk.to(tl.int64) * stride_f + r,
                             (tk < M_TOK) & (r < N))
            tl.store(cnt_ptr + pid_n, 0)

    @triton.jit
    def _tile_ptrs(w_base, s_base, tile, lane, c4, NT, stride_wt, stride_st):
        """A lane's weight words and scales of 16-row tile `tile` of an expert, a tile past the last read as the last
        (its rows are dropped at the store). (_fp4_moe_kernel writes the same pointers out in place: through this
        helper its measured forms compile to other SASS.)"""
        tc = tl.minimum(tile, NT - 1).to(tl.int64)
        return w_base + tc[:, None] * stride_wt + (lane * 4)[:, None] + c4[None, :], s_base + tc * stride_st + lane

    @triton.jit
    def _walk_ptrs(w_base, s_base, tile, lane, c4, gi, NT, stride_wt, stride_st, WARPS: tl.constexpr):
        """_tile_ptrs of a warp's two tiles (PAIR) in the program's tile group gi (gi x 2 WARPS tiles on from its
        first)."""
        wb, sb = _tile_ptrs(w_base, s_base, tile + gi * 2 * WARPS, lane, c4, NT, stride_wt, stride_st)
        wb2, sb2 = _tile_ptrs(w_base, s_base, tile + gi * 2 * WARPS + WARPS, lane, c4, NT, stride_wt, stride_st)
        return wb, sb, wb2, sb2

    @triton.jit
    def _group_store(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, ts, tile, g, qq, c4, N, NT, out_ptr, b, pairs_ptr,
                     rw_ptr, P, stride_o, WARPS: tl.constexpr, O_DIV: tl.constexpr, BM: tl.constexpr,
                     ATOMIC: tl.constexpr, ROW_WEIGHT: tl.constexpr, PAIR: tl.constexpr):
        """A tile group's sums (warp tile `tile`: acc0-acc3; PAIR, its second tile WARPS on: acc4-acc7) to out.
        Accumulator element c of lane 4g + q: row g + 8 (c // 2), column 2q + c % 2."""
        rows = (tile * 16 + g)[:, None] + 8 * (c4[None, :] // 2)
        cols = (2 * qq)[:, None] + c4[None, :] % 2
        row_ok = (rows < N) & (tile < NT)[:, None]
        _moe_store(out_ptr, (acc0 + acc1) * ts, rows, cols, row_ok, b, pairs_ptr, rw_ptr, P, stride_o, O_DIV, BM,
                   ATOMIC, ROW_WEIGHT)
        if BM == 16:
            _moe_store(out_ptr, (acc2 + acc3) * ts, rows, cols + 8, row_ok, b, pairs_ptr, rw_ptr, P, stride_o, O_DIV,
                       BM, ATOMIC, ROW_WEIGHT)
        if PAIR:  # the second tile's rows, 16 WARPS on
            rows = rows + 16 * WARPS
            row_ok = (rows < N) & (tile + WARPS < NT)[:, None]
            _moe_store(out_ptr, (acc4 + acc5) * ts, rows, cols, row_ok, b, pairs_ptr, rw_ptr, P, stride_o, O_DIV, BM,
                       ATOMIC, ROW_WEIGHT)
            if BM == 16:
                _moe_store(out_ptr, (acc6 + acc7) * ts, rows, cols + 8, row_ok, b, pairs_ptr, rw_ptr, P, stride_o,
                           O_DIV, BM, ATOMIC, ROW_WEIGHT)

    @triton.jit
    def _fp4_moe_walk_pair(w_base, s_base, tile, lane, g, qq, c4, NT, N, stride_wt, stride_st, xb, xb2, i0, i1,
                           groups, ts, out_ptr, b, pairs_ptr, rw_ptr, P, stride_o, T: tl.constexpr,
                           WARPS: tl.constexpr, U: tl.constexpr, EV: tl.constexpr, O_DIV: tl.constexpr,
                           BM: tl.constexpr, ATOMIC: tl.constexpr, ROW_WEIGHT: tl.constexpr, BX: tl.constexpr):
        """`groups` tile groups of one block, two tiles a warp (PAIR), as one loop over their iterations laid end to
        end: the next iteration's weights are loaded before this one's math, across a group's end too, so the
        block's set-up (its expert, pairs and x rows) is made once and a group's first loads wait on nothing; each
        group's sums are stored after its last iteration. x is the same for every group (the block's pairs)."""
        TWO: tl.constexpr = BM == 16
        ki = (i1 - i0) // U  # iterations a group
        total = groups * ki
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _pair_zeros(T)
        wb, sb, wb2, sb2 = _walk_ptrs(w_base, s_base, tile, lane, c4, 0, NT, stride_wt, stride_st, WARPS)
        w = _fp4_mma_wloads(wb + i0 * 128, sb + i0 * 32, U, EV)
        v = _fp4_mma_wloads(wb2 + i0 * 128, sb2 + i0 * 32, U, EV)
        # this iteration's group and step, counted on: a division by the runtime ki an iteration takes more
        gi = 0
        k = 0
        for it in range(0, total):
            # the next iteration's group and step (the last iteration loads its own again: in bounds, unused)
            wrap = k + 1 == ki
            kn = tl.where(wrap, 0, k + 1)
            gn = gi + wrap.to(tl.int32)
            if it == total - 1:
                kn = k
                gn = gi
            sj = i0 + kn * U
            wb, sb, wb2, sb2 = _walk_ptrs(w_base, s_base, tile, lane, c4, gn, NT, stride_wt, stride_st, WARPS)
            wn = _fp4_mma_wloads(wb + sj * 128, sb + sj * 32, U, EV)
            vn = _fp4_mma_wloads(wb2 + sj * 128, sb2 + sj * 32, U, EV)
            step = i0 + k * U
            a = _fp4_mma_with_x(w, xb + step * 32, xb2 + step * 32, U, TWO)
            # at M = 9-16 the decode's two shifts (SHIFTS): the multiply's took 130 registers, 3 programs an SM for 4
            acc0, acc1, acc2, acc3 = _fp4_mma_steps(a, U, T, TWO, acc0, acc1, acc2, acc3, BX, TWO)
            acc4, acc5, acc6, acc7 = _fp4_mma_steps(_with_x_of(v, a, U), U, T, TWO, acc4, acc5, acc6, acc7, BX, TWO)
            if wrap:
                _group_store(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, ts, tile + gi * 2 * WARPS, g, qq, c4, N,
                             NT, out_ptr, b, pairs_ptr, rw_ptr, P, stride_o, WARPS, O_DIV, BM, ATOMIC, ROW_WEIGHT,
                             True)
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _pair_zeros(T)
            w = wn
            v = vn
            k = kn
            gi = gi + wrap.to(tl.int32)

    @triton.jit
    def _fp4_moe_kernel(x_ptr, w_ptr, s_ptr, ts_ptr, pairs_ptr, bexp_ptr, rw_ptr, out_ptr, P, E, N, NT,
                        steps_per_split, NSTEPS, stride_x, stride_we, stride_wt, stride_se, stride_st, stride_o,
                        fin_ptr, cnt_ptr, M_TOK, stride_f,
                        X_DIV: tl.constexpr, O_DIV: tl.constexpr, WARPS: tl.constexpr, UNROLL: tl.constexpr,
                        BM: tl.constexpr, ATOMIC: tl.constexpr, ROW_WEIGHT: tl.constexpr, USE_ASM: tl.constexpr,
                        EV: tl.constexpr = "", PDL: tl.constexpr = False, EPI: tl.constexpr = 0,
                        MB: tl.constexpr = 16, DEPS: tl.constexpr = False, PAIR: tl.constexpr = False,
                        WALK: tl.constexpr = 1):
        """out[pair // O_DIV, n] (+)= x[pair // X_DIV] . W_e[n] for the pairs of block pid 2 (expert e), rows n of
        WARPS 16-row tiles, K steps [pid 1 x steps_per_split, ...). x: int32 view of bf16 pairs; W: the bf16 form's
        repacked expert stack (lowprec._stack_mma(bx=True)); bexp: each block's expert (the align's, or for one
        token its ids, a pair a block), those off [0, E) skipped. PDL: launched as a programmatic dependent of the
        kernel before it, whose results (the sorted blocks, the ids, or the activation) it waits for before reading
        anything.
        EPI, the epilogue in the kernel: 0 none (the sums at out); 1 gate_up (rows interleaved, gate_up_stack): the
        bf16 activation silu(gate) * up at fin[pair, v], from the registers without a K split, else by the split
        that completes the sums at out (_gate_up_finish); 2 down: the program that completes a tile group's sums
        casts them into fin[token] (_down_finish).
        PAIR: a tile group is 2 WARPS tiles, warp w taking tiles w and w + WARPS against the same x loads
        (lowprec._fp4_mma_loop_pair): twice the weight bytes in flight a warp, and half the programs, each with its
        set-up (the block's pairs, expert and x rows) and its stores.
        WALK (with PAIR, EPI 0): a program takes WALK tile groups of its block, pid 0 x WALK on, as one loop
        (_fp4_moe_walk_pair): WALK times fewer programs, each with one set-up and its loads a group ahead."""
        T: tl.constexpr = 32 * WARPS
        GT: tl.constexpr = WARPS * (2 if PAIR else 1)  # a tile group's tiles
        if PDL:
            tl.extra.cuda.gdc_wait()
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        b = tl.program_id(2)
        e = tl.load(bexp_ptr + b)
        # past the last block the pairs fill, or (a token's ids as the blocks' experts) an id off the table: another
        # EP rank's expert (down still counts towards its tile group's cast)
        if (e < 0) | (e >= E):
            if EPI == 2:
                _down_finish(out_ptr, fin_ptr, cnt_ptr, pid_n, tl.num_programs(1) * tl.num_programs(2), M_TOK, N,
                             stride_o, stride_f, 16 * GT, MB)
            return
        e = e.to(tl.int64)
        t, tile, lane, g, qq = _lanes(pid_n * WALK * GT, T, 1)
        tile_c = tl.minimum(tile, NT - 1).to(tl.int64)
        i0 = pid_k * steps_per_split
        i1 = tl.minimum(i0 + steps_per_split, NSTEPS)
        w_base = w_ptr + e * stride_we
        s_base = s_ptr + e * stride_se
        ts = tl.load(ts_ptr + e) * 16384.0
        c4 = tl.arange(0, 4)
        DIRECT: tl.constexpr = EPI == 1 and not ATOMIC  # the activation straight from the registers
        if USE_ASM:
            # lane 4g + q's B fragment is column g: pair g of the block (a padding column reads the last pair's row;
            # its sums are dropped)
            xr = (tl.minimum(tl.load(pairs_ptr + b * BM + g), P - 1) // X_DIV).to(tl.int64)
            xb = x_ptr + xr[:, None] * stride_x + (qq * 8)[:, None] + c4[None, :]
            xb2 = xb
            if BM == 16:
                xr2 = (tl.minimum(tl.load(pairs_ptr + b * BM + 8 + g), P - 1) // X_DIV).to(tl.int64)
                xb2 = x_ptr + xr2[:, None] * stride_x + (qq * 8)[:, None] + c4[None, :]
            wb = w_base + tile_c[:, None] * stride_wt + (lane * 4)[:, None] + c4[None, :]
            sb = s_base + tile_c * stride_st + lane
            tile_b = tile + WARPS  # PAIR: the warp's second tile
            if WALK > 1:
                tl.static_assert(PAIR and EPI == 0, "a walking program is down's pair without the cast epilogue")
                _fp4_moe_walk_pair(w_base, s_base, tile, lane, g, qq, c4, NT, N, stride_wt, stride_st, xb, xb2, i0,
                                   i1, tl.minimum(WALK, tl.cdiv(NT, GT) - pid_n * WALK), ts, out_ptr, b, pairs_ptr,
                                   rw_ptr, P, stride_o, T, WARPS, UNROLL, EV, O_DIV, BM, ATOMIC, ROW_WEIGHT, True)
                if DEPS:
                    tl.extra.cuda.gdc_launch_dependents()
            else:
                if PAIR:
                    hop = tl.minimum(tile_b, NT - 1).to(tl.int64) - tile_c
                    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _fp4_mma_loop_pair(
                        wb, sb, wb + hop[:, None] * stride_wt, sb + hop * stride_st, xb, xb2, i0, i1, T, UNROLL, EV,
                        BM == 16, False, True)
                else:
                    acc0 = tl.zeros((T, 4), dtype=tl.float32)
                    acc1 = tl.zeros((T, 4), dtype=tl.float32)
                    acc0, acc1, acc2, acc3 = _fp4_mma_loop(wb, sb, xb, xb2, i0, i1, T, UNROLL, EV, BM == 16, acc0, acc1,
                                                           acc0, acc1, False, True)
                if DEPS:  # the next kernel's programs may take the SMs this grid frees (they wait for all of it)
                    tl.extra.cuda.gdc_launch_dependents()
                if DIRECT:
                    # accumulator elements 0, 1 of lane 4g + q: the gate of value 8 tile + g at columns 2q, 2q + 1; 2,
                    # 3: its up (rows g + 8)
                    vi = (tile * 8 + g)[:, None]
                    cols = (2 * qq)[:, None] + tl.arange(0, 2)[None, :]
                    ok = (tile < NT)[:, None]
                    gate, up = tl.split(tl.permute(tl.reshape((acc0 + acc1) * ts, (T, 2, 2)), (0, 2, 1)))
                    _act_store(gate, up, vi, cols, ok, b, pairs_ptr, fin_ptr, P, stride_f, BM)
                    if BM == 16:
                        gate, up = tl.split(tl.permute(tl.reshape((acc2 + acc3) * ts, (T, 2, 2)), (0, 2, 1)))
                        _act_store(gate, up, vi, cols + 8, ok, b, pairs_ptr, fin_ptr, P, stride_f, BM)
                    if PAIR:  # the second tile's values, 8 WARPS on
                        ok = (tile_b < NT)[:, None]
                        gate, up = tl.split(tl.permute(tl.reshape((acc4 + acc5) * ts, (T, 2, 2)), (0, 2, 1)))
                        _act_store(gate, up, vi + 8 * WARPS, cols, ok, b, pairs_ptr, fin_ptr, P, stride_f, BM)
                        if BM == 16:
                            gate, up = tl.split(tl.permute(tl.reshape((acc6 + acc7) * ts, (T, 2, 2)), (0, 2, 1)))
                            _act_store(gate, up, vi + 8 * WARPS, cols + 8, ok, b, pairs_ptr, fin_ptr, P, stride_f, BM)
                elif PAIR:
                    _group_store(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, ts, tile, g, qq, c4, N, NT, out_ptr,
                                 b, pairs_ptr, rw_ptr, P, stride_o, WARPS, O_DIV, BM, ATOMIC, ROW_WEIGHT, True)
                else:
                    _group_store(acc0, acc1, acc2, acc3, acc0, acc1, acc2, acc3, ts, tile, g, qq, c4, N, NT, out_ptr,
                                 b, pairs_ptr, rw_ptr, P, stride_o, WARPS, O_DIV, BM, ATOMIC, ROW_WEIGHT, False)
        else:
            # the interpreter: each lane's partial per (row half, column), then a quad's four lanes summed; a lane
            # a tile's lane (PAIR: both tiles of a warp as lanes)
            TE: tl.constexpr = 32 * GT
            for gw in tl.static_range(WALK):  # WALK tile groups of the block, one after another
                grp = pid_n * WALK + gw
                t, tile, lane, g, qq = _lanes(grp * GT, TE, 1)
                tile_c = tl.minimum(tile, NT - 1).to(tl.int64)
                cm = tl.arange(0, BM)
                xr = (tl.minimum(tl.load(pairs_ptr + b * BM + cm), P - 1) // X_DIV).to(tl.int64)
                part = tl.zeros((TE, 2, BM), dtype=tl.float32)
                for i in range(i0, i1):
                    sv = tl.load(s_base + tile_c * stride_st + lane + i * 32).to(tl.int32)
                    for r in tl.static_range(2):
                        sr = ((sv >> (8 * r)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
                        acc_r = tl.zeros((TE, BM), dtype=tl.float32)
                        for wr in tl.static_range(2):
                            word = tl.load(w_base + tile_c * stride_wt + lane * 4 + i * 128 + 2 * r + wr)
                            xw = x_ptr + xr[None, :] * stride_x + (((4 * i + qq) * 2 + wr) * 4)[:, None]
                            for j in tl.static_range(4):
                                xv = tl.load(xw + j)
                                lo, hi = _emul_plane(word, j, sr, True)
                                acc_r += lo[:, None] * _emul_x(xv, False, True) + hi[:, None] * _emul_x(xv, True, True)
                        part += tl.where((tl.arange(0, 2) == r)[None, :, None], acc_r[:, None, :], 0.0)
                y = tl.sum(tl.reshape(part, (GT, 8, 4, 2, BM)), axis=2) * ts  # [tile, g, half, column]
                wv = tl.arange(0, GT)[:, None, None, None]
                if DIRECT:  # half 0 the gate of value 8 tile + g, half 1 its up
                    half = tl.arange(0, 2)[None, None, :, None]
                    vi = (grp * GT + wv) * 8 + tl.arange(0, 8)[None, :, None, None]
                    ok = grp * GT + wv < NT
                    _act_store(tl.sum(tl.where(half == 0, y, 0.0), axis=2, keep_dims=True),
                               tl.sum(tl.where(half == 1, y, 0.0), axis=2, keep_dims=True), vi, cm[None, None, None, :],
                               ok, b, pairs_ptr, fin_ptr, P, stride_f, BM)
                else:
                    rows = (grp * GT + wv) * 16 + tl.arange(0, 8)[None, :, None, None] + \
                        8 * tl.arange(0, 2)[None, None, :, None]
                    cols = cm[None, None, None, :] + rows * 0
                    row_ok = (rows < N) & (grp * GT + wv < NT)
                    _moe_store(out_ptr, y, rows, cols, row_ok, b, pairs_ptr, rw_ptr, P, stride_o, O_DIV, BM, ATOMIC,
                               ROW_WEIGHT)
        if EPI == 1 and ATOMIC:
            _gate_up_finish(out_ptr, fin_ptr, cnt_ptr, b, pid_n, tl.num_programs(1), pairs_ptr, P, N // 2, stride_o,
                            stride_f, GT, BM)
        if EPI == 2:
            _down_finish(out_ptr, fin_ptr, cnt_ptr, pid_n, tl.num_programs(1) * tl.num_programs(2), M_TOK, N,
                         stride_o, stride_f, 16 * GT, MB)

    @triton.jit
    def _fp4_moe_token_kernel(x_ptr, w_ptr, s_ptr, ts_ptr, ids_ptr, rw_ptr, out_ptr, E, N, NT, NSTEPS, stride_x,
                              stride_we, stride_wt, stride_se, stride_st, stride_o, TILES: tl.constexpr,
                              SLICES: tl.constexpr, KS: tl.constexpr, GATE_UP: tl.constexpr, UNROLL: tl.constexpr,
                              USE_ASM: tl.constexpr, EV: tl.constexpr = "", PDL: tl.constexpr = False):
        """One token's gate_up or down with no fp32 sums, atomics or counters: a program is TILES 16-row tiles of
        SLICES warps each, warp w on tile w // SLICES and slice s = w % SLICES, the slices' sums added in the
        program (lowprec._slice_sum) and stored from its registers.
        GATE_UP (program (tile group, slot z), expert ids[z]): slice s is K slice s of H (KS = SLICES); out is the
        bf16 activation row z, silu(gate) * up (the rows interleaved, gate_up_stack). An id off [0, E) (another EP
        rank's expert) returns, leaving its row as it was (zeros at first, never NaN), which down adds times zero or
        skips.
        Down (program (tile group)): slice s is slot s // KS, K slice s % KS of I, so the sum over the token's top_k
        experts, each times its routing weight, is the in-program sum, and out is the token's row in out's dtype. A
        slot off the table adds zero; its warp reads the smallest valid id's weights (another warp of the program
        reads those bytes at the same steps, so from L1 or L2), not those of an expert the call does not use.
        PDL: a programmatic dependent of the kernel before it, waited for before any load."""
        T: tl.constexpr = 32 * TILES * SLICES
        if PDL:
            tl.extra.cuda.gdc_wait()
        pid_n = tl.program_id(0)
        t, tile, lane, g, qq = _lanes(pid_n * TILES, T, SLICES)
        tile_c = tl.minimum(tile, NT - 1).to(tl.int64)
        s = (t // 32) % SLICES
        per = NSTEPS // KS
        kof = s % KS * per  # K slice s % KS (gate_up: KS = SLICES, so slice s)
        if GATE_UP:
            z = tl.program_id(1)
            e = tl.load(ids_ptr + z)
            if (e < 0) | (e >= E):
                return
            ec = (e + t * 0).to(tl.int64)
            f = tl.load(ts_ptr + ec) * 16384.0
            xrow = x_ptr + t * 0
        else:
            SLOTS: tl.constexpr = SLICES // KS
            slot = s // KS
            all_ids = tl.load(ids_ptr + tl.arange(0, SLOTS))
            fallback = tl.min(tl.where((all_ids >= 0) & (all_ids < E), all_ids, E))
            e = tl.load(ids_ptr + slot)
            ok = (e >= 0) & (e < E)
            ec = tl.where(ok, e, tl.where(fallback < E, fallback, 0)).to(tl.int64)
            f = tl.where(ok, tl.load(rw_ptr + slot) * tl.load(ts_ptr + ec) * 16384.0, 0.0)
            xrow = x_ptr + slot.to(tl.int64) * stride_x
        w_base = w_ptr + ec * stride_we
        s_base = s_ptr + ec * stride_se
        c4 = tl.arange(0, 4)
        if USE_ASM:
            wb = (w_base + tile_c * stride_wt + lane * 4 + kof * 128)[:, None] + c4[None, :]
            sb = s_base + tile_c * stride_st + lane + kof * 32
            xb = (xrow + qq * 8 + kof * 32)[:, None] + c4[None, :]  # every column computes the same x row
            acc0 = tl.zeros((T, 4), dtype=tl.float32)
            acc1 = tl.zeros((T, 4), dtype=tl.float32)
            acc0, acc1, _, _ = _fp4_mma_loop(wb, sb, xb, xb, 0, per, T, UNROLL, EV, False, acc0, acc1, acc0, acc1,
                                             False, True)
            y = _slice_sum((acc0 + acc1) * f[:, None], TILES, SLICES)
            t, tile, lane, g, qq = _lanes(pid_n * TILES, 32 * TILES, 1)
            # accumulator element c of lane 4g + q: row g + 8 (c // 2); column 0 kept (lanes q = 0)
            keep = (tile < NT) & (qq == 0)
            if GATE_UP:  # row g is value 8 tile + g's gate, row g + 8 its up
                gate = tl.sum(tl.where(c4[None, :] == 0, y, 0.0), axis=1)
                up = tl.sum(tl.where(c4[None, :] == 2, y, 0.0), axis=1)
                tl.store(out_ptr + z.to(tl.int64) * stride_o + tile * 8 + g, _silu_mul(gate, up), mask=keep)
            else:
                rows = (tile * 16 + g)[:, None] + 8 * (c4[None, :] // 2)
                om = (rows < N) & keep[:, None] & (c4 % 2 == 0)[None, :]
                tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=om)
        else:
            # the interpreter: each warp's [8 (g), 2 (row half)] sums, times its factor, then the slices summed
            W: tl.constexpr = TILES * SLICES
            part = _fp4_mma_emul_m1(xrow, w_base, s_base, tile_c, lane, qq, 0, per, stride_wt, stride_st, T, W, True,
                                    kof, 1)
            fw = tl.max(tl.reshape(f + t * 0.0, (W, 32)), axis=1)  # a warp's 32 lanes hold the same factor
            y = tl.sum(tl.reshape(part * fw[:, None, None], (TILES, SLICES, 8, 2)), axis=1)  # [tile, g, half]
            tv = pid_n * TILES + tl.arange(0, TILES)[:, None]
            gv = tl.arange(0, 8)[None, :]
            if GATE_UP:
                gate = tl.sum(tl.where((tl.arange(0, 2) == 0)[None, None, :], y, 0.0), axis=2)
                up = tl.sum(tl.where((tl.arange(0, 2) == 1)[None, None, :], y, 0.0), axis=2)
                tl.store(out_ptr + z.to(tl.int64) * stride_o + tv * 8 + gv, _silu_mul(gate, up), mask=tv < NT)
            else:
                rows = tv[:, :, None] * 16 + gv[:, :, None] + 8 * tl.arange(0, 2)[None, None, :]
                tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=(rows < N) & (tv < NT)[:, :, None])


def block_constexprs(gate_up: bool, split: int, *, top_k: int, m: int, block_m: int = 8, unroll: int = 2,
                     epilogue: bool = True, pdl: bool = True, deps: bool = LAUNCH_EARLY, asm: bool = True,
                     ev: str | None = None, pair: bool = False, by_pair: bool = False, walk: int = 1) -> dict:
    """The block kernel's constexprs as a call launches it (its warps: CONFIG's): gate_up (x a token's row; with
    `epilogue` the activation from its registers or by the completing split, else fp32 sums) or down (x a pair's
    activation, added times its routing weight into the token's sums, always with atomics; with `epilogue` the cast
    by the program completing a tile group); `pair`: two tiles a warp; `by_pair` (down unsplit): each pair's weighted
    row stored as it is, no atomics; `walk` (down's pair): tile groups a program. `benchmarks/kernel_resources.py
    --moe` compiles the same."""
    return dict(X_DIV=top_k if gate_up else 1, O_DIV=1 if gate_up or by_pair else top_k, WARPS=CONFIG.warps,
                UNROLL=unroll, BM=block_m, ATOMIC=split > 1 or not (gate_up or by_pair), ROW_WEIGHT=not gate_up,
                USE_ASM=asm,
                EV=lp._evict(CONFIG) if ev is None else ev, PDL=pdl,
                EPI=(1 if gate_up else 2) if epilogue else 0, MB=min(16, _pow2(m)), DEPS=deps, PAIR=pair, WALK=walk)


def expected_hit(pairs: int, experts: int) -> float:
    """Experts that `pairs` uniform choices hit, in expectation: E (1 - (1 - 1/E)^pairs)."""
    return experts * (1 - (1 - 1 / experts) ** pairs)


def moe_split(blocks: int, tiles: int, steps: int, unroll: int, sms: int, warps_per_sm: int = WARPS_PER_SM,
              block_m: int = 8, pair: bool = False) -> int:
    """K splits of a GEMM over `blocks` expert blocks of `tiles` 16-row tiles (a warp each, or with `pair` two) and
    `steps` 64-value steps: about warps_per_sm warps an SM in all (lowprec.mma_split; with `pair` the dense pair
    form's), every split whole iterations;
    and where that leaves more warps than the SMs hold at once (RESIDENT_WARPS, or RESIDENT_WARPS_PAIR, at `block_m`
    pairs a block), at least WAVES times what they hold, so the last wave's few programs are short (a second wave of a
    few long programs ran at a fraction of the bandwidth)."""
    warps = blocks * math.ceil(tiles / (2 if pair else 1))
    if pair:  # twice a warp's bytes in flight: half the warps (the dense pair form's target, swept on the H200)
        warps_per_sm = lp.FP4_MMA_TP.warps_per_sm
    split = lp.mma_split(warps, steps // unroll, warps_per_sm, sms)
    resident = (RESIDENT_WARPS_PAIR if pair else RESIDENT_WARPS)[block_m] * sms
    if split * warps > resident:
        split = max(split, min(steps // unroll, math.ceil(WAVES * resident / warps)))
    return split


def down_walk(block_m: int, groups: int, blocks: int, warps: int, sms: int, steps: int,
              min_waves: float | None = None) -> int:
    """Tile groups a program of down's pair (adding into the sums) over `blocks` expert blocks of `block_m` pairs,
    `groups` tile groups of `warps` warps each and `steps` 64-value K steps: DOWN_WALK at block_m, at most the groups
    there are, where K is at most DOWN_WALK_MAX_K_STEPS steps and the unwalked grid is more than `min_waves`
    (None: DOWN_WALK_MIN_WAVES) times the programs the SMs hold at once; else 1."""
    held = RESIDENT_WARPS_PAIR[block_m] // warps * sms
    waves = DOWN_WALK_MIN_WAVES if min_waves is None else min_waves
    if steps > DOWN_WALK_MAX_K_STEPS or groups * blocks <= waves * held:
        return 1
    return min(DOWN_WALK[block_m], groups)


def token_slices(tiles: int, slots: int, steps: int, unroll: int, sms: int, most: int,
                 warps_per_sm: int = WARPS_PER_SM) -> int:
    """K slices a tile for the one-token kernels (_fp4_moe_token_kernel) over `tiles` 16-row tiles of `slots` experts
    and `steps` 64-value steps: the power of 2 nearest (in ratio) to about warps_per_sm warps an SM in all, at most
    `most`, and halved until each slice is whole iterations of `unroll` steps."""
    want = warps_per_sm * sms / max(1, tiles * slots)
    ks = 1 << max(0, min(most.bit_length() - 1, round(math.log2(want)) if want > 1 else 0))
    while ks > 1 and steps % (ks * unroll):
        ks //= 2
    return ks


class GateUpStack(NamedTuple):
    """A gate_up stack (lowprec._stack_mma(bx=True)) with gate and up rows interleaved 8 at a time (gate_up_stack)."""
    words: torch.Tensor
    scales: torch.Tensor
    ts: torch.Tensor


def gate_up_stack(stack) -> GateUpStack:
    """The fused MoE's gate_up layout from a bf16-form stack of [2I, H] experts (gate rows, then up rows): 16-row tile
    t holds gate rows 8t..8t+7 then up rows 8t..8t+7, so an MMA lane's accumulator holds a value's gate and its up
    side by side (elements 0, 1 and 2, 3) and the SiLU-and-mul runs in gate_up's registers. A copy: the same bytes,
    moved (a lane's words 0-1 are its row g, 2-3 its row g + 8; a scale's low byte row g, high byte row g + 8)."""
    if isinstance(stack, GateUpStack):
        return stack
    words, scales, ts = stack
    e, nt, st = words.shape[:3]
    if nt % 2:
        raise DecodeGapError(f"NVFP4 fused MoE: gate_up has {nt * 16} rows, not 2I with I a multiple of 8")
    # [E, gate/up, old tile, step, lane, row half, word] -> [E, old tile, row half, step, lane, gate/up, word]
    w = words.reshape(e, 2, nt // 2, st, 32, 2, 2).permute(0, 2, 5, 3, 4, 1, 6).reshape(words.shape)
    sc = scales.contiguous().view(torch.uint8).reshape(e, 2, nt // 2, st, 32, 2)
    sc = sc.permute(0, 2, 5, 3, 4, 1).contiguous().view(torch.int16).reshape(scales.shape)
    return GateUpStack(w.contiguous(), sc, ts)


class Nvfp4FusedMoe:
    """y[M, H] = sum over each token's top_k experts of weight * down(silu(gate) * up), the experts' weights NVFP4
    (weight-only: x and the activation stay bf16), for `m` tokens (buffers allocated once, graph-capturable).

    `w13` / `w2`: lists of E per-expert NVFP4Tensors ([2I, H] gate rows then up rows, and [H, I]), or the bf16
    form's stacks as `lowprec._stack_mma(..., bx=True)` returns them (w2 shared, not copied; w13 interleaved into a
    copy unless it is a GateUpStack already, which is what a caller building several should keep).
    `silu_epilogue`: the SiLU-and-mul in gate_up's epilogue (True), as a kernel of its own (False), or (None) in the
    epilogue where gate_up is not split over K, so from the registers. `cast_epilogue`: the cast in down's epilogue,
    else a kernel of its own. `align`: sort the pairs by expert each call (a kernel); None: not for one token, whose
    top_k experts are distinct, so block b is pair b, always (the sorted pairs filled once, the token's ids read as
    the blocks' experts). `token`: which GEMMs of one token without the align run as the one-token kernel
    (_fp4_moe_token_kernel: a tile's K range, and for down the experts too, over a program's warps, summed in the
    program; no fp32 sums, and gate_up's SiLU or down's cast in its epilogue): "both", "gate_up", "down" or "none";
    None: TOKEN_GEMMS where they apply (down: top_k a power of 2, top_k x slices2 at most TOKEN_WARPS warps).
    `slices13` / `slices2`: their K slices a tile (None: token_slices). `experts_hit`: the experts the K splits are
    planned for (None: what uniform choices over the table hit; a table of only the experts hit, ids compacted, as
    the MoE stage builds, says how many). `pair`: which block GEMMs run two 16-row tiles a warp against the same x
    loads ("both", "gate_up", "down" or "none"; None: PAIR_GEMMS); their splits are planned for the warps that run.
    `align_rank`: the align's form, "sort" or "atomic" (None: fusedmoe.ALIGN_RANK). `down_by_pair`: down stores
    each pair's weighted row, unsplit, and a top_k sum a token makes the output (None: DOWN_BY_PAIR). `walk2`: tile
    groups a program of down's pair (None: down_walk where down's pair adds into the sums, else 1).
    The forms are timed against each other by benchmarks/lowprec_device.py."""

    def __init__(self, w13, w2, m: int, top_k: int, device, out_dtype=torch.bfloat16, block_m: int | None = None,
                 split13: int | None = None, split2: int | None = None, pdl: bool | None = None,
                 silu_epilogue: bool | None = None, cast_epilogue: bool = CAST_EPILOGUE,
                 align: bool | None = None, token: str | None = None, slices13: int | None = None,
                 slices2: int | None = None, experts_hit: float | None = None, deps: bool | None = None,
                 pair: str | None = None, align_rank: str | None = None, down_by_pair: bool | None = None,
                 walk2: int | None = None) -> None:
        if not HAVE_TRITON:
            raise DecodeGapError("the NVFP4 fused MoE needs Triton, which is not installed")
        self.mma13 = lp._stack_mma(w13, bx=True) if isinstance(w13, list) else w13
        self.mma2 = lp._stack_mma(w2, bx=True) if isinstance(w2, list) else w2
        e, nt13, steps13 = self.mma13[0].shape[:3]
        e2, nt2, steps2 = self.mma2[0].shape[:3]
        h, i = steps13 * 64, steps2 * 64
        if e2 != e or nt13 * 16 != 2 * i or nt2 * 16 != h:
            raise DecodeGapError(f"NVFP4 fused MoE: w13 ({e} experts of {nt13 * 16}x{h}) and w2 ({e2} of "
                                 f"{nt2 * 16}x{i}) do not fit together (w13 [E, 2I, H], w2 [E, H, I], H and I "
                                 f"multiples of 64)")
        pairs = m * top_k
        if pairs > MAX_PAIRS or top_k > e:
            raise DecodeGapError(f"NVFP4 fused MoE: {m} tokens x top_k {top_k} = {pairs} pairs; at most {MAX_PAIRS} "
                                 f"(the one-program align) and top_k <= {e} experts")
        if not (lp.available(device) and lp.mma_supported(device)):
            raise DecodeGapError("the NVFP4 fused MoE needs Triton and an sm89+ GPU (or TRITON_INTERPRET=1 on the CPU)")
        self.m, self.top_k, self.e, self.h, self.i, self.pairs = m, top_k, e, h, i, pairs
        self.mma13 = gate_up_stack(self.mma13)
        # each kernel after the align a programmatic dependent of the one before (sm90+): its launch overlaps that one
        self.pdl = lp.pdl_supported(device) if pdl is None else pdl and lp.pdl_supported(device)
        # each kernel lets the next one's programs launch once all of its own are past their loop (align: at once)
        self.deps = self.pdl and (LAUNCH_EARLY if deps is None else deps)
        self.block_m = block_m or block_m_for(pairs, e)
        if self.block_m not in (8, 16):
            raise DecodeGapError(f"NVFP4 fused MoE: block_m must be 8 or 16, not {self.block_m}")
        self.align = m > 1 if align is None else align
        self.nb = max_blocks(pairs, e, self.block_m) if self.align else top_k
        cfg = CONFIG
        self.warps, self.ev = cfg.warps, lp._evict(cfg)
        # 2 steps an iteration where both K are whole 2-step iterations, else 1 (the loop's unroll is one constant)
        u = cfg.block_k // 64
        self.unroll = u if (h // 64) % u == 0 and (i // 64) % u == 0 else 1
        # plan the splits for the blocks that will run (the experts uniform choices hit, about), never the grid's
        # upper bound (H200, DeepSeek-V3 / GLM-5 TP8 at 16 tokens: 2 gate_up splits for ~102 experts hit took 148.0 /
        # 126.5 us to 140.9 / 120.8, where min(pairs, experts) = 128 planned 1)
        pairs_of = PAIR_GEMMS if pair is None else pair
        if pairs_of not in ("both", "gate_up", "down", "none"):
            raise DecodeGapError(f"NVFP4 fused MoE: pair is 'both', 'gate_up', 'down' or 'none', not {pairs_of!r}")
        self.pair13, self.pair2 = pairs_of in ("both", "gate_up"), pairs_of in ("both", "down")
        blocks, sms = max(1, round(experts_hit or expected_hit(pairs, e))), lp.sm_count(device)
        self.plan13 = self._plan(h // 64, split13 or moe_split(blocks, nt13, h // 64, self.unroll, sms,
                                                                block_m=self.block_m, pair=self.pair13))
        self.down_by_pair = DOWN_BY_PAIR if down_by_pair is None else down_by_pair
        if self.down_by_pair and split2 not in (None, 1):
            raise DecodeGapError(f"NVFP4 fused MoE: down by pair stores its rows unsplit, not in {split2} K splits")
        # down's pair takes no K split (H200, GLM-5 TP8 at 8 tokens: its kernel 17.6 us unsplit, 21.3 in the 2 splits
        # moe_split gave it, 18.9 one tile a warp)
        self.plan2 = self._plan(i // 64, split2 or (1 if self.pair2 or self.down_by_pair else moe_split(
            blocks, nt2, i // 64, self.unroll, sms, block_m=self.block_m)))
        self.silu_epilogue = self.plan13[1] == 1 if silu_epilogue is None else silu_epilogue
        self.cast_epilogue = cast_epilogue
        # one token: K slices a tile, summed in the program (gate_up over H, down over the top_k experts and I)
        self.ks13 = slices13 or token_slices(nt13, top_k, h // 64, self.unroll, sms, TOKEN_WARPS)
        self.ks2 = slices2 or token_slices(nt2, top_k, i // 64, self.unroll, sms, TOKEN_WARPS // top_k or 1)
        one = m == 1 and not self.align
        fits13 = one and self.ks13 <= TOKEN_WARPS and (h // 64) % (self.ks13 * self.unroll) == 0
        fits2 = (one and top_k & (top_k - 1) == 0 and top_k * self.ks2 <= TOKEN_WARPS
                 and (i // 64) % (self.ks2 * self.unroll) == 0)
        if token not in (None, "both", "gate_up", "down", "none"):
            raise DecodeGapError(f"NVFP4 fused MoE: token is 'both', 'gate_up', 'down' or 'none', not {token!r}")
        gemms = TOKEN_GEMMS if token is None else token
        want13, want2 = gemms in ("both", "gate_up"), gemms in ("both", "down")
        if token is not None and (want13 and not fits13 or want2 and not fits2):
            raise DecodeGapError(f"NVFP4 fused MoE: the one-token kernels need 1 token without the align, top_k a "
                                 f"power of 2 and whole iterations a K slice (m {m}, top_k {top_k}, slices "
                                 f"{self.ks13}/{self.ks2})")
        self.token13 = want13 and fits13 and (token is not None or self.ks13 <= TOKEN_AUTO_SLICES)
        self.token2 = want2 and fits2
        if self.token13:
            self.silu_epilogue = True
        if self.token2:
            self.cast_epilogue = True
        self.down_by_pair = self.down_by_pair and not self.token2
        walks = self.pair2 and not (self.token2 or self.down_by_pair or self.cast_epilogue)
        self.walk2 = (down_walk(self.block_m, self._groups(nt2, True), blocks, self.warps, sms, steps2) if walks
                      else 1) if walk2 is None else walk2
        if self.walk2 < 1 or self.walk2 > 1 and not walks:
            raise DecodeGapError(f"NVFP4 fused MoE: down walks {self.walk2} tile groups a program only as two tiles a "
                                 f"warp (pair 'down' or 'both'), adding into the sums (no down by pair, no cast "
                                 f"epilogue, not the one-token kernel)")
        if self.down_by_pair:
            self.cast_epilogue = False  # (no cast either: the top_k sum, a kernel too, writes the output)
        dev = torch.device(device)
        self.sorted_pairs = torch.full((self.nb, self.block_m), pairs, dtype=torch.int32, device=dev)
        if not self.align:  # block b: pair b, then padding
            self.sorted_pairs[:, 0] = torch.arange(pairs, dtype=torch.int32, device=dev)
        self.sorted_pairs = self.sorted_pairs.reshape(-1)
        self.block_expert = torch.empty(self.nb, dtype=torch.int32, device=dev)
        self.align_rank, self.cursor = align_rank, align_cursor(e, dev) if self.align else None
        # the block kernels' fp32 sums, at zero between calls (the epilogues, or the SiLU kernel and the cast, leave
        # them so), and their epilogues' counters, at zero between calls too: gate_up's a (block, tile group), down's
        # a tile group. A GEMM run as the one-token kernel has neither (it sums in the program)
        block13, block2 = not self.token13, not self.token2
        self.gu = torch.zeros((pairs, 2 * i), dtype=torch.float32, device=dev) if block13 else None
        self.act = torch.zeros((pairs, i), dtype=torch.bfloat16, device=dev)  # rows of off-table ids stay zero
        self.acc = torch.zeros((m, h), dtype=torch.float32, device=dev) if block2 and not self.down_by_pair else None
        # down by pair: a row a pair (zeros: an off-table id's row adds nothing to its token's sum)
        self.rows2 = torch.zeros((pairs, h), dtype=out_dtype, device=dev) if self.down_by_pair else None
        self.out = torch.empty((m, h), dtype=out_dtype, device=dev)
        self.cnt13 = (torch.zeros(self.nb * self._groups(nt13, self.pair13), dtype=torch.int32, device=dev)
                      if block13 else None)
        self.cnt2 = (torch.zeros(self._groups(nt2, self.pair2), dtype=torch.int32, device=dev)
                     if block2 and not self.down_by_pair else None)

    def _groups(self, tiles: int, pair: bool) -> int:
        """A block kernel's tile groups (its grid's first dimension): a warp's tile or two, CONFIG's warps."""
        return triton.cdiv(tiles, self.warps * (2 if pair else 1))

    def _plan(self, steps: int, split: int) -> tuple[int, int]:
        """(steps a split, splits): whole iterations of `unroll` steps."""
        per, split, _ = lp._k_plan(steps, self.unroll, split)
        return per, split

    @property
    def label(self) -> str:
        gemms = " and ".join(n for n, on in (("gate_up", self.token13), ("down", self.token2)) if on)
        form = (f"one token: {gemms} as K slices summed in the program" if gemms
                else f"pairs sorted by expert in blocks of {self.block_m}")
        paired = " and ".join(n for n, on in (("gate_up", self.pair13 and not self.token13),
                                                ("down", self.pair2 and not self.token2)) if on)
        form += f", {paired} two tiles a warp" if paired else ""
        form += f" ({self.walk2} tile groups a program of down)" if self.walk2 > 1 else ""
        return (f"triton fused MoE (nvfp4 weight-only, bf16 tensor-core MMA, {form}"
                + (", SiLU-and-mul in gate_up's epilogue" if self.silu_epilogue else "")
                + (", down's rows a pair summed a token" if self.down_by_pair else "") + ")")

    @property
    def kernels(self) -> int:
        """Kernels a call: gate_up and down, the align, the SiLU-and-mul and the cast (or down's top_k sum) where they
        run apart."""
        return 2 + self.align + (not self.silu_epilogue) + (not self.cast_epilogue)

    def weight_bytes(self, experts_hit: int) -> int:
        """Bytes of weights and scales a call reads: each expert hit once."""
        return experts_hit * (nv.nvfp4_bytes(2 * self.i, self.h) + nv.nvfp4_bytes(self.h, self.i))

    def _gemm(self, x, stack, out, n: int, plan: tuple[int, int], by_token: bool, route_w, fin, cnt,
              block_expert, pair: bool, by_pair: bool = False, walk: int = 1) -> None:
        """gate_up (by_token: x a token's row, fp32 sums, or with its epilogue the activation at fin) or down (x a
        pair's activation row, weighted sums into the token's row, with its epilogue cast into fin)."""
        words, scales, ts = stack
        nt = words.shape[1]
        per, split = plan
        steps = words.shape[2]
        grid = (triton.cdiv(self._groups(nt, pair), walk), split, self.nb)
        consts = block_constexprs(by_token, split, top_k=self.top_k, m=self.m, block_m=self.block_m,
                                  unroll=self.unroll, epilogue=self.silu_epilogue if by_token else self.cast_epilogue,
                                  pdl=self.pdl, deps=self.deps, asm=not lp.interpreted(), ev=self.ev, pair=pair,
                                  by_pair=by_pair, walk=walk)
        _fp4_moe_kernel[grid](
            x, words, scales, ts, self.sorted_pairs, block_expert, route_w, out, self.pairs, self.e, n, nt, per, steps,
            x.stride(0), words.stride(0), words.stride(1), scales.stride(0), scales.stride(1), out.stride(0),
            fin, cnt, self.m, fin.stride(0), **consts, num_warps=self.warps, **lp._pdl_launch(self.pdl))

    def _token_gemm(self, gate_up: bool, src, dst, flat_ids, flat_w) -> None:
        """One token's gate_up (the SiLU into the activation rows) or down (the experts summed into out)."""
        words, scales, ts = self.mma13 if gate_up else self.mma2
        nt, steps = words.shape[1:3]
        ks = self.ks13 if gate_up else self.ks2
        slices = ks if gate_up else ks * self.top_k
        tiles = max(1, 4 // slices)  # programs of 4 warps at least
        grid = (triton.cdiv(nt, tiles), self.top_k) if gate_up else (triton.cdiv(nt, tiles),)
        _fp4_moe_token_kernel[grid](
            src, words, scales, ts, flat_ids, flat_w, dst, self.e, nt * 16, nt, steps, src.stride(0), words.stride(0),
            words.stride(1), scales.stride(0), scales.stride(1), dst.stride(0), TILES=tiles, SLICES=slices, KS=ks,
            GATE_UP=gate_up, UNROLL=self.unroll, USE_ASM=not lp.interpreted(), EV=self.ev, PDL=self.pdl,
            num_warps=tiles * slices, **lp._pdl_launch(self.pdl))

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if x.shape != (self.m, self.h) or ids.shape != (self.m, self.top_k) or weights.shape != ids.shape:
            raise DecodeGapError(f"NVFP4 fused MoE: x {tuple(x.shape)}, ids {tuple(ids.shape)}, weights "
                                 f"{tuple(weights.shape)}; expected {(self.m, self.h)} and {(self.m, self.top_k)}")
        flat_ids = ids.reshape(-1)
        if self.align:
            align_pairs(flat_ids, self.sorted_pairs, self.block_expert, self.e, self.block_m, deps=self.deps,
                        rank=self.align_rank, cursor=self.cursor)
        bexp = self.block_expert if self.align else flat_ids
        flat_w = weights.reshape(-1).float()
        if self.token13:
            self._token_gemm(True, lp.bf16_pairs(x), self.act, flat_ids, flat_w)
        else:
            self._gemm(lp.bf16_pairs(x), self.mma13, self.gu, 2 * self.i, self.plan13, True, flat_w, self.act,
                       self.cnt13, bexp, self.pair13)
        if not self.silu_epilogue:
            _silu_pack_kernel[(triton.cdiv(self.i, 1024), self.pairs)](self.gu, self.act, self.i, self.gu.stride(0),
                                                                      self.act.stride(0), BLOCK=1024, BX=True,
                                                                      INTERLEAVED=True, PDL=self.pdl,
                                                                      **lp._pdl_launch(self.pdl))
        if self.token2:
            self._token_gemm(False, self.act.view(torch.int32), self.out, flat_ids, flat_w)
        elif self.down_by_pair:
            self._gemm(self.act.view(torch.int32), self.mma2, self.rows2, self.h, self.plan2, False, flat_w, self.out,
                       self.cnt2, bexp, self.pair2, by_pair=True)
            torch.sum(self.rows2.view(self.m, self.top_k, self.h), dim=1, out=self.out)
        else:
            self._gemm(self.act.view(torch.int32), self.mma2, self.acc, self.h, self.plan2, False, flat_w, self.out,
                       self.cnt2, bexp, self.pair2, walk=self.walk2)
        if not self.cast_epilogue and not self.down_by_pair:
            lp.cast_zero(self.acc, self.out, self.pdl)
        return self.out


def reference(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, expert) -> torch.Tensor:
    """Dequantise-then-matmul in fp32, the activation rounded to bf16 as the kernel stores it: [M, H]. `expert(e)`
    gives expert e's fp32 (w13 [2I, H], w2 [H, I]); only the experts chosen are asked for (all of a layer's need not
    fit in fp32)."""
    chosen = {int(e): expert(int(e)) for e in ids.reshape(-1).tolist()}
    out = torch.zeros((x.shape[0], chosen[int(ids[0, 0])][1].shape[0]), dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            w13, w2 = chosen[int(ids[t, j])]
            h = x[t:t + 1].to(torch.bfloat16).float() @ w13.t()  # x as the kernel reads it
            i = w2.shape[1]
            a = (torch.nn.functional.silu(h[:, :i]) * h[:, i:]).to(torch.bfloat16).float()
            out[t] += float(weights[t, j]) * (a @ w2.t())[0]
    return out


def stack_expert(stack, e: int) -> torch.Tensor:
    """Expert e of a plain NVFP4 stack (lowprec._stack_fp4: words [E, N, K/8] int32, block scales, tensor scales),
    dequantised to fp32."""
    words, scales, ts = stack
    n, kw = words.shape[1:]
    return nv.dequantize_nvfp4(nv.NVFP4Tensor(words[e].view(torch.uint8), scales[e], ts[e], (n, kw * 8))).float()


def dequantized(qs: list[nv.NVFP4Tensor]) -> torch.Tensor:
    """fp32 [E, N, K] of per-expert NVFP4Tensors, for the reference."""
    return torch.stack([nv.dequantize_nvfp4(q).float() for q in qs])
