"""Routed experts above batch 1 in fp8, the way engines run them: a fused-MoE GEMM over token-expert pairs sorted by
expert (SGLang's and vLLM's Triton `fused_moe_kernel`, with `block_shape=[128, 128]` for DeepSeek-V3's checkpoint
format), written here from that description, not copied. The weights carry 128x128 block scales or one scale an
expert (per-tensor); the activations are quantised per token in 1x128 groups either way (the same bytes and dots as
a per-token scale, a finer grid).

A call, six kernels (graph-capturable: every buffer is allocated once):
1. the align, one program: the M x top_k pairs sorted by expert, each expert's run padded to BLOCK_M rows, and
   the expert of every BLOCK_M-row block (-1 past the last: those programs return at once). The grid holds
   ceil(P / BLOCK_M) + min(P, E) blocks, the most P pairs can fill, so no host sync sizes it. By default a histogram
   and an atomic add a pair on its expert's cursor (`_align_atomic_kernel`, an expert's pairs in the order their
   atomics land), else a stable sort (`_align_kernel`; ALIGN_RANK has the H200's figures).
2. the activation's 1x128 quantisation (`fp8block.quantize_act`);
3. `_moe_gemm_kernel` gate_up: each program one block of pairs (one expert) by BLOCK_N columns, fp8 tensor-core dots
   over 128-value K groups, each group's partial product scaled by the token's 1x128 scale and the expert's weight
   scale (its 128x128 block's, or its one) before it is summed; split over K where too few programs would run;
4. `_silu_mul_quant_kernel`: silu(gate) * up, quantised again in 1x128 groups;
5. `_moe_gemm_kernel` down, each pair's row weighted by its routing weight;
6. the top-k rows of each token summed (torch).

Only the selected experts' weights are read (each once a call, whatever the number of tokens that chose it).

H200 (2026-12-03, read 4386 GB/s; benchmarks/lowprec_device.py --sections fusedmoe: CUDA-graph replay, four choices
of 8 random experts a token rotating so no call finds the one before's experts in the L2), us a call, this (128x128
block scales; one scale an expert within 1%) against `torch._scaled_grouped_mm` after torch-op sorting (the kernel
level's path before, per-tensor scales), and the fraction of read bandwidth on the experts hit:
- DeepSeek-V3 TP8 (256 experts of 7168 x 256 a rank), M = 2 / 4 / 8 / 16: 41.5 / 64.8 / 108.7 / 206.6 against
  145.0 / 187.7 / 281.5 / 453.8 (0.48 / 0.60 / 0.66 / 0.63: 5.5 MB experts);
- DeepSeek-V3 TP1 (7168 x 2048): 191.1 / 357.3 / 637.7 / 1176.1 against 349.1 / 579.9 / 996.7 / 1771.4 (0.83-0.90);
- GLM-5 TP1 (6144 x 2048): 170.9 / 309.4 / 571.2 / 1008.0 against 311.2 / 525.8 / 890.4 / 1517.4 (0.79-0.89).
Every check passed (60, dequantise-then-matmul on the chosen experts, 2e-2). BLOCK_N 64 or 32, BLOCK_M 64 (wgmma)
and 4 stages lost or drew level everywhere; the gate_up K split (gate_up_split) took TP8 at 2 tokens from 59.0 to
41.5 us and at 4 from 77.2 to 64.8. The down GEMM (K = 256 at TP8: two groups a program) with BLOCK_N 64 or 256, 2
stages or 8 warps was no faster than gate_up's form at 2, 8 or 16 tokens (best 41.7 / 103.1 / 201.7 us against 42.3
/ 103.1 / 203.3: fusedmoe_probe.py sweep), so both keep it. The kernel level's DeepSeek-V3 TP8 step at 8 rows: routed
experts 6.38 ms a step on this against 17.81 on `_scaled_grouped_mm` (benchmarks/device/fusedmoe_probe.py). The MoE
stage (microbench.moe, the router's own choice of experts, 15 / 58 / 98 hit at 2 / 8 / 16 tokens): 37.1 / 100.0 /
163.9 us (fp8) against 106.4 / 244.2 / 395.1 for `_scaled_grouped_mm` and 96.4 / 278.2 / 428.0 for bf16 grouped.

On the CPU, Triton's interpreter runs kernels 1, 3 and 5 (the dots in fp32: it mishandles fp8 dots) and torch the
quantisations (the interpreter rounds to e4m3 without carrying into the exponent: `fp8block.quantize_act`).
"""

from __future__ import annotations

import math

import torch

from ..errors import DecodeGapError
from .fp8block import dequantize_act, quantize_act, quantize_act_reference
from .lowprec import FP8_BLOCK, Fp8Weight, available, dequantize_fp8, interpreted, quantize_fp8, sm_count
from .nvfp4 import HAVE_TRITON, tl, triton

BLOCK_M = 16  # rows (pairs) a program: engines' tuned choice for decode batches
BLOCK_N = 128  # H200: the fastest, or within 2%, of the forms tried on every case (the docstring)
# the one-program sort holds its pairs' keys in registers: 8192 pairs (1024 tokens at top-8) in 16 warps take 108
# registers a thread and no spill on sm_90 (compiled without a GPU; align_warps); the atomic form (the default) is
# held to the same bound
MAX_PAIRS = 8192
# the align's form (align_pairs): "atomic" (a histogram, then an atomic add a pair on its expert's cursor, in chunks
# of ALIGN_CHUNK pairs in ALIGN_ATOMIC_WARPS warps) or "sort" (a stable sort). H200 (2026-12-05,
# benchmarks/device/align_probe.py, 256 experts, top-8), the profiler's us, the sort against the atomic form at 2048
# pairs a chunk in 4 warps, at 1 / 8 / 32 / 64 / 128 / 256 / 320 / 512 / 1024 tokens: 2.1 / 2.3 / 3.3 / 4.7 / 10.2
# / 19.5 / 48.4 / 48.7 / 185.2 against 1.9 / 2.0 / 2.5 / 3.2 / 4.4 / 7.1 / 11.0 / 13.4 / 26.0 (chunks of 512 or
# 1024 and 8 or 16 warps were slower or level); a GLM-5 TP8 NVFP4 MoE call at 320 tokens 376.6 -> 329.8 us
ALIGN_RANK = "atomic"
ALIGN_CHUNK = 2048
ALIGN_ATOMIC_WARPS = 4


def max_blocks(pairs: int, experts: int, block_m: int = BLOCK_M) -> int:
    """BLOCK_M-row blocks that `pairs` pairs sorted by expert fill at most: each expert hit adds at most one partly
    filled block, and at most min(pairs, experts) experts are hit."""
    return math.ceil(pairs / block_m) + min(pairs, experts)


if HAVE_TRITON:
    from .fp8block import _group_quant  # the 1x128 quantisation's arithmetic, shared with fp8block's kernel

    @triton.jit
    def _align_fill(sorted_pairs, block_expert, P, NB, NB2: tl.constexpr, BM: tl.constexpr):
        """Every block's rows as padding (P) and its expert as none (-1), before the pairs land on them."""
        b = tl.arange(0, NB2)
        rows = b[:, None] * BM + tl.arange(0, BM)[None, :]
        tl.store(sorted_pairs + rows, tl.zeros((NB2, BM), dtype=tl.int32) + P, mask=b[:, None] < NB)
        tl.store(block_expert + b, tl.zeros((NB2,), dtype=tl.int32) - 1, mask=b < NB)

    @triton.jit
    def _align_atomic_kernel(ids, sorted_pairs, block_expert, cursor, P, E, NB,
                             CH: tl.constexpr, E2: tl.constexpr, NB2: tl.constexpr, BM: tl.constexpr,
                             DEPS: tl.constexpr = False):
        """The align with no sort: a histogram over chunks of CH pairs, each expert's first row stored as its cursor
        (`cursor`, E2 int32 of scratch), then each pair's row taken by an atomic add on its expert's cursor. Within
        an expert's run the pairs land in the order the atomics do, not by pair (which no GEMM needs: a pair's row
        is its own, and down sums into the token's row with atomics anyway). Its work grows with the pairs, where the
        sort's grows with pairs x log^2 pairs across warps (the sort: 5.0 us at 512 pairs and 58 us at 2560 on the
        H200, 2026-12-05)."""
        if DEPS:
            tl.extra.cuda.gdc_launch_dependents()
        bins = tl.arange(0, E2)
        counts = tl.zeros((E2,), dtype=tl.int32)
        for c in range(0, P, CH):
            j = c + tl.arange(0, CH)
            e = tl.load(ids + j, mask=j < P, other=-1).to(tl.int32)
            counts += tl.histogram(tl.where((e >= 0) & (e < E), e, E2 - 1), E2)
        counts = tl.where(bins < E, counts, 0)
        padded = (counts + BM - 1) // BM * BM
        tl.store(cursor + bins, tl.cumsum(padded, axis=0) - padded)
        _align_fill(sorted_pairs, block_expert, P, NB, NB2, BM)
        tl.debug_barrier()  # the cursors, the padding and the -1s written before any pair's atomic and stores
        for c in range(0, P, CH):
            j = c + tl.arange(0, CH)
            e = tl.load(ids + j, mask=j < P, other=-1).to(tl.int32)
            ok = (j < P) & (e >= 0) & (e < E)
            pos = tl.atomic_add(cursor + e, 1, mask=ok, sem="relaxed")
            tl.store(sorted_pairs + pos, j, mask=ok)
            tl.store(block_expert + pos // BM, e, mask=ok)

    @triton.jit
    def _align_kernel(ids, sorted_pairs, block_expert, P, E, NB,
                      P2: tl.constexpr, E2: tl.constexpr, NB2: tl.constexpr, BM: tl.constexpr,
                      DEPS: tl.constexpr = False):
        """ids [P] (any int) -> sorted_pairs [NB * BM] (pair index, or P where padding) and block_expert [NB].

        Vectors of P2, E2 and NB2 only: a histogram, a bitonic sort of (expert, pair) keys and gathers. The first
        form compared [P2, E2], [P2, P2] and [NB2, E2] tiles, which spilled: 324 us at 256 pairs of 256 experts on the
        H200, against 2 x 75 us for the GEMMs behind it (benchmarks/device/moe_e_probe.py)."""
        if DEPS:  # the GEMM launched behind it as a programmatic dependent may take the idle SMs now
            tl.extra.cuda.gdc_launch_dependents()
        j = tl.arange(0, P2)
        e = tl.load(ids + j, mask=j < P, other=0).to(tl.int32)
        valid = (j < P) & (e >= 0) & (e < E)  # an id off the table is dropped, never written past the buffers
        e = tl.where(valid, e, E2 - 1)  # E2 > E: the last bin is no expert's
        bins = tl.arange(0, E2)
        counts = tl.where(bins < E, tl.histogram(e, E2), 0)
        padded = (counts + BM - 1) // BM * BM
        starts = tl.cumsum(padded, axis=0) - padded  # each expert's first row, its run padded to whole blocks
        first = tl.cumsum(counts, axis=0) - counts  # its first pair in the sort
        # a stable sort: the keys (expert, pair) are distinct, so a pair's place in the sorted keys minus its expert's
        # first place is its rank among the earlier pairs of its expert
        key = tl.sort(e * P2 + j)
        se, sj = key // P2, key % P2
        pos = tl.gather(starts, se, 0) + j - tl.gather(first, se, 0)
        ok = se < E
        _align_fill(sorted_pairs, block_expert, P, NB, NB2, BM)
        tl.debug_barrier()  # the padding and the -1s written before the pairs and their experts land on them
        tl.store(sorted_pairs + pos, sj, mask=ok)
        tl.store(block_expert + pos // BM, se, mask=ok)  # each block of an expert's run holds one of its pairs


def align_pairs(ids: torch.Tensor, sorted_pairs: torch.Tensor, block_expert: torch.Tensor, experts: int,
                block_m: int, deps: bool = False, rank: str | None = None, cursor: torch.Tensor | None = None) -> None:
    """Sort the pairs of `ids` (any shape, flattened) by expert into `sorted_pairs` / `block_expert` (one program).
    deps: the kernel behind it is a programmatic dependent (sm90+) and may launch at once. rank: "sort" (a stable
    sort, `_align_kernel`) or "atomic" (`_align_atomic_kernel`, which needs `cursor`: align_cursor's scratch; else
    one is allocated); None: ALIGN_RANK."""
    flat = ids.reshape(-1)
    nb = block_expert.numel()
    p2 = _pow2(flat.numel())
    rank = rank or ALIGN_RANK
    if rank == "sort":
        _align_kernel[(1,)](flat, sorted_pairs, block_expert, flat.numel(), experts, nb, P2=p2,
                            E2=_pow2(experts + 1), NB2=_pow2(nb), BM=block_m, DEPS=deps, num_warps=align_warps(p2))
        return
    if rank != "atomic":
        raise DecodeGapError(f"align: rank is 'sort' or 'atomic', not {rank!r}")
    chunk = min(p2, ALIGN_CHUNK)
    _align_atomic_kernel[(1,)](flat, sorted_pairs, block_expert, align_cursor(experts, flat.device, cursor),
                               flat.numel(), experts, nb, CH=chunk, E2=_pow2(experts + 1), NB2=_pow2(nb),
                               BM=block_m, DEPS=deps, num_warps=ALIGN_ATOMIC_WARPS)


def align_cursor(experts: int, device, cursor: torch.Tensor | None = None) -> torch.Tensor:
    """The atomic align's scratch (its experts' cursors): `cursor` where it is large enough, else a new one."""
    need = _pow2(experts + 1)
    if cursor is not None and cursor.numel() >= need:
        return cursor
    return torch.empty(need, dtype=torch.int32, device=device)


def align_warps(p2: int) -> int:
    """Warps of the align's one program for p2 keys (a power of 2): 4 up to 1024 keys (56-77 registers a thread on
    sm_90), then a warp for every 256 keys up to 16 (2048 in 8: 72; 8192 in 16: 108; in 8 they take 174)."""
    return max(4, min(16, p2 // 256))


if HAVE_TRITON:
    @triton.jit
    def _moe_gemm_kernel(a, a_s, w, w_s, c, sorted_pairs, block_expert, route_w, P, N, K, groups_per_split,
                         stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_wsg, stride_cm,
                         TOP_K: tl.constexpr, A_BY_TOKEN: tl.constexpr, MUL_W: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr = 3,
                         ATOMIC: tl.constexpr = False):
        """c[pair, n] = sum over 128-value groups g of (a_q[row, g] . w_q[e, n, g]) * a_s[row, g] * w_s[e, n/128, g]
        (row = the pair's token for gate_up, the pair itself for down; per-tensor weights: w_s's strides 0 but the
        expert's), times the routing weight where MUL_W. Program (block, n tile, s) sums groups [s, s + 1) x
        groups_per_split; with ATOMIC it adds them into c (fp32, zeroed by the reader), else stores them."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        g0 = tl.program_id(2) * groups_per_split
        g1 = tl.minimum(g0 + groups_per_split, K // 128)
        e = tl.load(block_expert + pid_m)
        if e < 0:
            return
        e = e.to(tl.int64)
        pairs = tl.load(sorted_pairs + pid_m * BM + tl.arange(0, BM))
        valid = pairs < P
        row = (pairs // TOP_K if A_BY_TOKEN else pairs).to(tl.int64)
        offs_n = pid_n * BN + tl.arange(0, BN)
        n_mask = offs_n < N
        offs_k = tl.arange(0, 128)
        a_ptr = a + row[:, None] * stride_am + g0 * 128 + offs_k[None, :]
        w_ptr = w + e * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + g0 * 128 + offs_k[:, None]
        as_ptr = a_s + row * stride_asm
        ws_ptr = w_s + e * stride_wse + (offs_n // 128) * stride_wsn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for g in tl.range(g0, g1, num_stages=STAGES):
            x = tl.load(a_ptr, mask=valid[:, None], other=0.0)
            wt = tl.load(w_ptr, mask=n_mask[None, :], other=0.0)  # [128, BN]: W^T's group
            if DOT_F32:
                part = tl.dot(x.to(tl.float32), wt.to(tl.float32), input_precision="ieee")
            else:
                part = tl.dot(x, wt)
            xs = tl.load(as_ptr + g, mask=valid, other=0.0)
            ws = tl.load(ws_ptr + g * stride_wsg, mask=n_mask, other=0.0)
            acc += part * xs[:, None] * ws[None, :]
            a_ptr += 128
            w_ptr += 128
        if MUL_W:
            acc *= tl.load(route_w + pairs, mask=valid, other=0.0).to(tl.float32)[:, None]
        out = c + pairs[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
        if ATOMIC:
            tl.atomic_add(out, acc, mask=valid[:, None] & n_mask[None, :], sem="relaxed")
        else:
            tl.store(out, acc.to(c.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])

    @triton.jit
    def _silu_mul_quant_kernel(h, q, s, I, stride_hm, stride_qm, stride_sm, GROUPS: tl.constexpr,
                               ZERO: tl.constexpr = False):
        """h [P, 2I] (gate, then up) -> silu(gate) * up in 1x128 groups: each group's amax / 448 into s, the values
        over it into q (e4m3). ZERO: h holds split-K sums, left at zero for the next call's."""
        m = tl.program_id(0).to(tl.int64)
        gs = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
        gmask = gs < I // 128
        offs = gs[:, None] * 128 + tl.arange(0, 128)[None, :]
        gate = tl.load(h + m * stride_hm + offs, mask=gmask[:, None], other=0.0).to(tl.float32)
        up = tl.load(h + m * stride_hm + I + offs, mask=gmask[:, None], other=0.0).to(tl.float32)
        if ZERO:  # zeros once every thread has loaded the sums (lowprec._zero_loaded says why)
            tl.debug_barrier()
            tl.store(h + m * stride_hm + offs, tl.zeros_like(gate), mask=gmask[:, None])
            tl.store(h + m * stride_hm + I + offs, tl.zeros_like(up), mask=gmask[:, None])
        qv, scale = _group_quant(gate / (1.0 + tl.exp(-gate)) * up)
        tl.store(q + m * stride_qm + offs, qv.to(q.dtype.element_ty), mask=gmask[:, None])
        tl.store(s + m * stride_sm + gs, scale, mask=gmask)


def quantize_experts(w: torch.Tensor, block: bool) -> Fp8Weight:
    """[E, N, K] -> e4m3 with 128x128 block scales (or one scale an expert), an expert at a time: in one go the fp32
    copies of a layer's experts take several times their bf16 bytes (DeepSeek-V3's gate_up at TP1: 30 GB)."""
    e, n, k = w.shape
    data = torch.empty((e, n, k), dtype=torch.float8_e4m3fn, device=w.device)
    scales = torch.empty((e, -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)) if block else (e,), device=w.device)
    for j in range(e):
        q = quantize_fp8(w[j], block=block)
        data[j], scales[j] = q.data, q.scales
    return Fp8Weight(data, scales, block)


def gate_up_split(pairs: int, experts: int, n: int, k: int, sms: int, block_n: int = BLOCK_N) -> int:
    """K splits of the gate_up GEMM where the experts hit (min(pairs, experts), a block each at decode sizes) times
    the N tiles leave SMs without a program: then about two programs an SM, at least 4 groups of 128 a split.
    DeepSeek-V3 at TP8 has 512 gate_up rows an expert, 4 tiles of 128: two tokens' 16 experts made 64 programs of 56
    serial groups. H200 (8 of 256 experts a token, us): 2 tokens 58.9 -> 41.3 split 5 ways, 4 tokens 73.3 -> 61.4
    split 3 ways; at 8 tokens (256 programs) a split of 2 lost, 118.2 against 105.6."""
    programs = min(pairs, experts) * -(-n // block_n)
    if programs >= sms:
        return 1
    return max(1, min(k // FP8_BLOCK // 4, -(-2 * sms // programs)))


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def silu_mul_reference(h: torch.Tensor) -> torch.Tensor:
    i = h.shape[-1] // 2
    hf = h.float()
    return torch.nn.functional.silu(hf[:, :i]) * hf[:, i:]


class FusedMoe:
    """y[M, H] = sum over each token's top_k experts of weight * down(silu(gate) * up), the experts' weights fp8 with
    128x128 block scales or one scale an expert (w13 [E, 2I, H], w2 [E, H, I]), the activations quantised per token
    in 1x128 groups before each GEMM. Buffers for `m` tokens are allocated once (graph-capturable)."""

    def __init__(self, w13: Fp8Weight, w2: Fp8Weight, m: int, top_k: int, device, out_dtype=torch.bfloat16,
                 block_m: int = BLOCK_M, block_n: int = BLOCK_N, warps: int = 4, stages: int = 3,
                 split: int | None = None, down: tuple[int, int, int] | None = None) -> None:
        if w13.block != w2.block or w13.data.dim() != 3 or w2.data.dim() != 3:
            raise DecodeGapError("fp8 fused MoE: needs [E, N, K] expert weights, both with 128x128 block scales or "
                                 "both with one scale an expert")
        if not w13.block and (w13.scales.shape != w13.data.shape[:1] or w2.scales.shape != w2.data.shape[:1]):
            raise DecodeGapError(f"fp8 fused MoE: per-tensor scales must be one an expert, [E]; got "
                                 f"{tuple(w13.scales.shape)} and {tuple(w2.scales.shape)}")
        e, i2, h = w13.data.shape
        if w2.data.shape != (e, h, i2 // 2):
            raise DecodeGapError(f"fp8 fused MoE: w2 {tuple(w2.data.shape)} does not match w13 "
                                 f"{tuple(w13.data.shape)} (expected {(e, h, i2 // 2)})")
        if h % FP8_BLOCK or (i2 // 2) % FP8_BLOCK:
            raise DecodeGapError(f"fp8 fused MoE: hidden {h} and intermediate {i2 // 2} must be multiples "
                                 f"of {FP8_BLOCK} (whole 1x128 groups)")
        pairs = m * top_k
        if pairs > MAX_PAIRS or top_k > e:
            raise DecodeGapError(f"fp8 fused MoE: {m} tokens x top_k {top_k} = {pairs} pairs; at most "
                                 f"{MAX_PAIRS} (the one-program align) and top_k <= {e} experts")
        if not available(device):
            raise DecodeGapError("the fp8 fused MoE needs Triton and a CUDA GPU (or TRITON_INTERPRET=1 on "
                                 "the CPU)")
        self.w13, self.w2, self.m, self.top_k, self.e, self.h, self.i = w13, w2, m, top_k, e, h, i2 // 2
        self.pairs, self.nb = pairs, max_blocks(pairs, e, block_m)
        self.block_m, self.block_n, self.warps, self.stages = block_m, block_n, warps, stages
        self.down = down or (block_n, warps, stages)  # the down GEMM's BLOCK_N, warps and stages
        self.split = gate_up_split(pairs, e, i2, h, sm_count(device), block_n) if split is None else split
        dev = torch.device(device)
        self.sorted_pairs = torch.empty(self.nb * block_m, dtype=torch.int32, device=dev)
        self.block_expert = torch.empty(self.nb, dtype=torch.int32, device=dev)
        self.cursor = align_cursor(e, dev)
        self.xq = torch.empty((m, h), dtype=torch.float8_e4m3fn, device=dev)
        self.xs = torch.empty((m, h // FP8_BLOCK), dtype=torch.float32, device=dev)
        # split-K sums land in fp32 with atomics (zero now, left at zero by the SiLU kernel after each call)
        self.gu = (torch.zeros((pairs, i2), dtype=torch.float32, device=dev) if self.split > 1 else
                   torch.empty((pairs, i2), dtype=out_dtype, device=dev))
        self.aq = torch.empty((pairs, self.i), dtype=torch.float8_e4m3fn, device=dev)
        self.as_ = torch.empty((pairs, self.i // FP8_BLOCK), dtype=torch.float32, device=dev)
        # zeros: a pair dropped by the sort (an id off the table: another EP rank's expert) adds nothing to the sum
        self.y = torch.zeros((pairs, h), dtype=out_dtype, device=dev)
        self.out = torch.empty((m, h), dtype=out_dtype, device=dev)

    def align(self, ids: torch.Tensor) -> None:
        """Sort the pairs by expert into sorted_pairs / block_expert (kernel 1)."""
        align_pairs(ids, self.sorted_pairs, self.block_expert, self.e, self.block_m, cursor=self.cursor)

    @property
    def kernels(self) -> int:
        """Kernels a call: the align, x's quantisation, gate_up, SiLU-and-mul with the requantisation, down, the sum."""
        return 6

    def weight_bytes(self, experts_hit: int) -> int:
        """Bytes of weights and scales a call reads: each expert hit once."""
        return experts_hit * sum(w.data[0].numel() + 4 * w.scales[0].numel() for w in (self.w13, self.w2))

    @property
    def label(self) -> str:
        scales = "128x128 block" if self.w13.block else "per-expert"
        return f"triton fused MoE (e4m3, 1x128 activation and {scales} weight scales, pairs sorted by expert)"

    def _gemm(self, a, a_s, w: Fp8Weight, c, route_w, by_token: bool, split: int = 1) -> None:
        n, k = w.data.shape[1:]
        block_n, warps, stages = (self.block_n, self.warps, self.stages) if by_token else self.down
        per = -(-(k // FP8_BLOCK) // split)
        grid = (self.nb, triton.cdiv(n, block_n), -(-(k // FP8_BLOCK) // per))
        sn, sg = (w.scales.stride(1), w.scales.stride(2)) if w.block else (0, 0)
        _moe_gemm_kernel[grid](a, a_s, w.data, w.scales, c, self.sorted_pairs, self.block_expert, route_w,
                               self.pairs, n, k, per, a.stride(0), a_s.stride(0), w.data.stride(0), w.data.stride(1),
                               w.scales.stride(0), sn, sg, c.stride(0), TOP_K=self.top_k,
                               A_BY_TOKEN=by_token, MUL_W=not by_token, BM=self.block_m, BN=block_n,
                               DOT_F32=interpreted(), STAGES=stages, ATOMIC=split > 1, num_warps=warps)

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if x.shape != (self.m, self.h) or ids.shape != (self.m, self.top_k) or weights.shape != ids.shape:
            raise DecodeGapError(f"fp8 fused MoE: x {tuple(x.shape)}, ids {tuple(ids.shape)}, weights "
                                 f"{tuple(weights.shape)}; expected {(self.m, self.h)} and {(self.m, self.top_k)}")
        self.align(ids)
        quantize_act(x, self.xq, self.xs)
        flat_w = weights.reshape(-1)
        self._gemm(self.xq, self.xs, self.w13, self.gu, flat_w, by_token=True, split=self.split)
        if not available(x.device) or interpreted():  # see quantize_act: the interpreter's e4m3 rounding
            q, s = quantize_act_reference(silu_mul_reference(self.gu))
            self.aq.copy_(q)
            self.as_.copy_(s)
            if self.split > 1:
                self.gu.zero_()
        else:
            groups = self.i // FP8_BLOCK
            per = 4
            _silu_mul_quant_kernel[(self.pairs, triton.cdiv(groups, per))](
                self.gu, self.aq, self.as_, self.i, self.gu.stride(0), self.aq.stride(0), self.as_.stride(0),
                GROUPS=per, ZERO=self.split > 1, num_warps=4)
        self._gemm(self.aq, self.as_, self.w2, self.y, flat_w, by_token=False)
        torch.sum(self.y.view(self.m, self.top_k, self.h), dim=1, out=self.out)
        return self.out

    def reference(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Dequantise-then-matmul in fp32, with the activations quantised as the kernels quantise them (the gate_up
        output rounded to the output dtype first, as the kernel stores it)."""
        xd = dequantize_act(*quantize_act_reference(x))
        expert = {int(e): (dequantize_fp8(Fp8Weight(self.w13.data[e], self.w13.scales[e], self.w13.block)),
                           dequantize_fp8(Fp8Weight(self.w2.data[e], self.w2.scales[e], self.w2.block)))
                  for e in ids.reshape(-1).tolist()}  # only the experts chosen (all of them need not fit in fp32)
        out = torch.zeros((self.m, self.h), dtype=torch.float32, device=x.device)
        for t in range(self.m):
            for j in range(self.top_k):
                w13, w2 = expert[int(ids[t, j])]
                gu = (xd[t:t + 1] @ w13.t()).to(self.gu.dtype)
                a = dequantize_act(*quantize_act_reference(silu_mul_reference(gu)))
                out[t] += float(weights[t, j]) * (a @ w2.t())[0].to(self.y.dtype).float()
        return out
