"""The DSA indexer's selection (GLM-5, DeepSeek-V3.2): the indices of the k largest scores of each row, in no order
(the sparse attention that reads them sums over its rows), as one Triton radix select a row.

Why hand-written: torch.topk sorts what it selects, and even unsorted it runs a general multi-kernel select. On the
H200 (2026-12-02), 2048 of 4096 fp32 scores took 37.6 us sorted and 21.3 us unsorted, 59.6 / 42.2 us of 32k, where the
indexer's scores themselves took 2.3 / 4.2 us; engines ship their own top-k for DSA for this reason (SGLang's in
sgl-kernel, vLLM's in its DeepSeek-V3.2 path). Unsorted is already most of the gain (the selection's order is unused).

Radix select: each score maps to an unsigned 32-bit key that orders as the float does. A program holds its row in
registers from one load; eight passes each count, for the keys whose higher bits match the prefix found so far, how
many have each value of the next 4-bit digit (tl.histogram), and keep the digit that holds the k-th largest, so that
after them the prefix is the k-th largest key itself. A last step writes every index whose key is above it and, in
index order, as many of those equal to it as k still needs: exactly k indices, the same set as torch.topk's up to the
order of ties.

H200 (2026-12-02, CUDA-graph replay after an L2 flush), 2048 of T fp32 scores, against torch.topk unsorted: T = 2049
12.3 vs 15.1 us, 4096 10.9 vs 18.5, 8192 20.5 vs 36.4, 8 rows of 4096 11.0 vs 23.1. What did not pay: a loop over
blocks of the row from memory (one program a row waits a memory round trip a block: 40 us at 4096, 285 at 32k on an
H100), counts as a one-hot sum instead of tl.histogram (2-4x slower), 11-bit digits in three passes (tl.histogram's
cost grows with its bins), and 32k-score rows in registers (171 us). Longer rows go to torch.topk, and the kernel
level times both at build (`kernel_choices`).
"""

from __future__ import annotations

import torch

from ..errors import DecodeGapError
from .lowprec import available
from .nvfp4 import HAVE_TRITON, tl, triton

BITS = 4  # a digit: 8 passes cover a 32-bit key
PER_THREAD = 16  # scores a thread holds: 8 and 32 were slower on the H200
MAX_ROW = 8192  # longer rows go to torch.topk: at 32k, 32 scores a thread, 171 us against torch's 43 on the H200
LABEL = "triton radix select"


def topk_indices_reference(scores: torch.Tensor, k: int) -> torch.Tensor:
    """torch.topk's indices of the k largest scores of each row of [M, T], unsorted, as int64; every index, with no
    selection run, when k >= T (as engines skip it, and as `topk_indices` does)."""
    m, t = scores.shape
    if k >= t:
        return torch.arange(t, device=scores.device).expand(m, t)
    return torch.topk(scores, k, dim=-1, sorted=False).indices


if HAVE_TRITON:

    @triton.jit
    def _sortable_key(x):
        """fp32 -> uint32 whose unsigned order is the float order: negatives have every bit flipped, positives
        only the sign bit."""
        b = x.to(tl.uint32, bitcast=True)
        return tl.where((b >> 31) != 0, b ^ 0xFFFFFFFF, b | 0x80000000)

    @triton.jit
    def _topk_kernel(scores, out, T, K, stride_sm, stride_om, BITS: tl.constexpr, BLOCK_T: tl.constexpr):
        """One row a program, held in registers from one load (BLOCK_T >= T): the passes are arithmetic, not
        memory round trips (a loop over 2048-score blocks took ~2 us a block on an H100, latency-bound)."""
        m = tl.program_id(0).to(tl.int64)
        ts = tl.arange(0, BLOCK_T)
        inb = ts < T
        key = _sortable_key(tl.load(scores + m * stride_sm + ts, mask=inb, other=0.0))
        NB: tl.constexpr = 1 << BITS
        bins = tl.arange(0, NB)
        prefix = tl.zeros((), tl.uint32)
        need = K
        for p in tl.static_range(32 // BITS):
            # the keys whose digits above this one match the prefix (all of them in the first pass)
            live = inb & ((key >> (32 - BITS * p - 1) >> 1) == prefix)
            digit = ((key >> (32 - BITS * (p + 1))) & (NB - 1)).to(tl.int32)
            hist = tl.histogram(digit, NB, mask=live)
            above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0)  # live keys in higher bins
            b = tl.max(tl.where(above + hist >= need, bins, -1), axis=0)  # the bin of the need-th largest
            need = need - tl.sum(tl.where(bins == b, above, 0), axis=0)
            prefix = (prefix << BITS) | b.to(tl.uint32)
        # prefix is now the k-th largest key: K - need keys lie above it; ties fill the rest in index order
        gt = (inb & (key > prefix)).to(tl.int32)
        eq = (inb & (key == prefix)).to(tl.int32)
        at_eq = tl.cumsum(eq, axis=0) - 1
        dst = out + m * stride_om
        tl.store(dst + tl.cumsum(gt, axis=0) - 1, ts, mask=gt != 0)
        tl.store(dst + (K - need) + at_eq, ts, mask=(eq != 0) & (at_eq < need))


def topk_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the k largest of each row of fp32 scores [M, T], unsorted: int32 from the radix-select kernel
    where Triton runs and rows are at most MAX_ROW, else torch.topk's (int64). Every index when k >= T."""
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise DecodeGapError(f"top-k: needs fp32 scores [M, T], got {scores.dtype} {tuple(scores.shape)}")
    m, t = scores.shape
    if k >= t:
        return torch.arange(t, device=scores.device, dtype=torch.int32).expand(m, t)
    if not available(scores.device) or scores.stride(1) != 1 or t > MAX_ROW:
        return topk_indices_reference(scores, k)
    out = torch.empty((m, k), dtype=torch.int32, device=scores.device)
    block = max(2048, triton.next_power_of_2(t))  # 4 warps at least
    _topk_kernel[(m,)](scores, out, t, k, scores.stride(0), out.stride(0), BITS=BITS, BLOCK_T=block,
                       num_warps=block // (32 * PER_THREAD))
    return out
