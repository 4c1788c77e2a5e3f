"""The DSA indexer's selection (GLM-5, DeepSeek-V3.2): the indices of the k largest scores of each row, in no order
(the sparse attention that reads them sums over its rows), as a Triton radix select or pairwise rank.

Why hand-written: torch.topk sorts what it selects, and even unsorted it runs a general multi-kernel select. On the
H200 (2026-12-02), 2048 of 4096 fp32 scores took 37.6 us sorted and 21.3 us unsorted, 59.6 / 42.2 us of 32k, where the
indexer's scores themselves took 2.3 / 4.2 us; engines ship their own top-k for DSA for this reason (SGLang's in
sgl-kernel, vLLM's in its DeepSeek-V3.2 path). Unsorted is already most of the gain (the selection's order is unused).

Radix select: each score maps to an unsigned 32-bit key that orders as the float does. Digit by digit from the top,
count, for the keys whose higher digits match the prefix found so far, how many have each value of the next digit
(tl.histogram), and keep the digit that holds the k-th largest; after the last digit the prefix is the k-th largest
key itself. Then write every index whose key is above it and as many of those equal to it as k still needs: exactly
k indices, the same set as torch.topk's up to ties.
- One program a row (rows up to MAX_ROW): the row in registers from one load, up to eight passes of 4-bit digits,
  ties in index order. Rows a little longer (up to MAX_ROW + MAX_TAIL) keep their last scores in a second block,
  the tail, counted and written after the first. The passes stop early where the bin kept holds exactly the keys
  still needed, as the one-launch form's do. H100 (2026-12-07, topk_probe.py, normal scores, against all eight
  passes on the same machine): 1 row of 3000 / 4096 / 4097 / 6144 scores 11.1-11.3 / 8.4-8.5 / 10.7-11.1 / 15.0 us
  against 12.6 / 10.8 / 14.6 / 16.3. On the scores of the kernel level's GLM-5 indexer (sums over heads of
  weight x relu(q . k), close together: no bin is exact before the last digits) it gains nothing: the step's
  `_topk_kernel` took 15.6-15.8 us a layer at 4097 scores, against 15.9 with eight passes.
- Pairwise rank (rows up to RANK_MAX, `topk_indices_rank`; offered by `forms` for the kernel level to time): each
  score's rank is the number of scores above it in the row, found by comparing it with every other (two instructions
  a pair: an fp32 set.gt and an add), and its index is written at that place where it is below k. No pass, no count
  shared between programs: a row of 4097 scores is 513 one-warp programs where the one-program radix select is one
  program on one SM, so at one row it wins while the square stays small. H100 (2026-12-06), 4097 scores 4.6 us
  against 10.9 for the tail block; in the kernel level's GLM-5-NVFP4 TP8 attention, a layer at 1 row: 4096-token
  context, its top-k 15.6 -> 5.2 us and the layer 54.4-57.2 -> 42.8 us; 8192 tokens 19.0 -> 9.7 and 59.8 -> 47.7.
  At 8 rows the picker keeps the radix select (16.4 against 22.8 us in the step).
- Multi-pass (longer rows, `topk_indices_multipass`): chunks of the row in parallel programs, four launches of 8-bit
  digits whose counts meet in global memory (atomics), then one that writes the indices at places taken from two
  atomic counters; which of several equal scores at the threshold are kept is then up to the chunks' order. The
  launches after the first are programmatic dependents (sm90+): each loads its scores before it waits for the counts.
- The multi-pass form in one launch (`topk_indices_synced`, the default past MAX_ROW + MAX_TAIL where the grid's
  chunks are all resident at once): the chunk's keys stay in registers, and the row's chunks meet at a barrier in L2
  after each pass (cooperative groups' grid sync, a row's chunks only), then stop early where the bin kept holds
  exactly the keys still needed. Its last chunk out leaves the counts at zero, so a caller that keeps them
  (`SyncedSelect`, what `forms` offers) launches no memset before it, and launches it as a programmatic dependent of
  the scores' kernel. H100 (2026-12-06, topk_probe.py, chunks of 2048, against the five launches with PDL): 1 row
  of 8192 / 32768 / 131072 scores 13.2 / 13.9 / 15.0 us with the counts kept (14.5 / 15.1 / 16.2 after a memset)
  against 18.1 / 18.0 / 20.9, 8 rows 14.7 / 16.2 / 29.2 (16.2 / 17.7 / 30.7) against 19.2 / 21.3 / 36.0; without
  the early stop, 15.6-17.3 and 16.7-30.3 us after a memset. The kernel level's GLM-5-NVFP4 TP8 attention at a
  32768-token context, a layer: 60.5 us in 10 launches against 61.4 in 15 with the five launches (1 row), 85.0
  against 87.0 with the memset (8 rows).

H200 (2026-12-02, CUDA-graph replay over rotating copies), 2048 of T fp32 scores, median us, ours against torch.topk
unsorted: one program T = 4096 10.8 vs 17.8 (the multi-pass form 17.8); multi-pass 8192 17.6 vs 38.2 (one program
20.4), 32k 17.4 vs 42.5, 128k 19.8 vs 51.7, 8 rows of 32k 21.1 vs 50.4, of 128k 35.4 vs 68.8. About 3 us a launch is
most of the multi-pass time at any length up to 128k. What did not pay: a loop over blocks of the row from memory in
one program (a memory round trip a block: 40 us at 4096, 285 at 32k on an H100), counts as a one-hot sum instead of
tl.histogram (2-4x slower), wider digits (tl.histogram's cost grows with its bins: one program 8-bit 14.8 us at 4096,
multi-pass 11-bit in three launches 42-64 us), and 32k-score rows in registers (171 us). The kernel level times ours
against torch.topk at build (`kernel_choices`).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import DecodeGapError
from .lowprec import _pdl_launch, available, interpreted, pdl_supported, resident_programs, sm_count
from .nvfp4 import HAVE_TRITON, tl, triton

BITS = 4  # a digit: 8 passes cover a 32-bit key
PER_THREAD = 16  # scores a thread holds: 8 and 32 were slower on the H200
# the longest row the one-program form takes: at 8192 it took 20.4 us on the H200, the multi-pass form 17.8 (at 32k,
# 32 scores a thread, 171 us)
MAX_ROW = 4096
# rows a little past MAX_ROW (a 4096-token context's 4097 scores) in one program too, the default there: the scores
# past MAX_ROW in a second block in registers, of MIN_TAIL to MAX_TAIL scores (sm_90: 128 registers, no spill). H100
# (2026-12-06, benchmarks/device/topk_probe.py, top 2048, graph replay) against the multi-pass form with PDL, 1 and 8
# rows: 4097 scores 14.5 / 18.5 us, 5120 14.1-14.2 / 18.1-18.9, 6144 16.2-16.3 / 18.0-19.0. The multi-pass form
# stays a candidate there (`forms`): the kernel level times both at build and keeps the faster.
MAX_TAIL = 2048
MIN_TAIL = 256
LABEL = "triton radix select"
TAIL_LABEL = f"{LABEL} (one program + tail)"
# longer rows: the multi-pass form, chunks of a row in parallel programs whose digit counts meet in global memory
DIGIT = 8  # 4 passes of 8-bit digits (a launch each, so fewer and wider digits than the one-program form's)
CHUNK = 2048  # scores a program holds in the multi-pass form


# rows up to RANK_MAX scores are offered the pairwise rank too (`topk_indices_rank`), whose work grows as the square
# of the row: H100 (2026-12-06, topk_probe.py), 1 row of 4097 / 8193 / 12288 scores 4.6 / 9.3 / 16.9 us against
# 10.9 / 15.4 / 13.6 for the radix select's best form; 8 rows of 4097 20.3 against 12.2 (the picker keeps the radix
# select there, and past about 11000 scores at 1 row)
RANK_MAX = 12288
RANK_LABEL = "triton pairwise rank"
# scores a one-warp program ranks, and scores of the row it compares them with an iteration (sm_90: 2.6 instructions
# a pair, 136 registers). H100, 1 row of 4097 / 8193 / 12288 scores, us: 8x256 4.6 / 9.3 / 16.9, 4x256 4.4 / 10.8 /
# 23.3, 8x128 5.9 / 10.5 / 18.8, 8x512 6.5 / 14.2 / 19.4, 16x256 7.8 / 11.1 / 21.1 (more programs, or more of the row
# in flight a load, where an iteration waits for L2; past that fewer programs an SM)
RANK_BLOCK_I = 8
RANK_BLOCK_J = 256

MULTI_LABEL = f"{LABEL} (multi-pass)"
SYNCED_LABEL = f"{LABEL} (multi-pass, one launch)"
# rows past this many scores are offered the one-launch form too (`forms`, which says why not from MAX_ROW)
SYNCED_FROM = MAX_ROW + MAX_TAIL


def label(t: int, m: int = 1, device=None) -> str:
    """What `topk_indices` runs for m rows of t scores on `device` (where Triton runs; without a device, the form
    it runs where the multi-pass form's chunks do not all fit at once)."""
    if t <= MAX_ROW + MAX_TAIL:
        return LABEL if t <= MAX_ROW else TAIL_LABEL
    return SYNCED_LABEL if device is not None and synced_fits(m, t, device) else MULTI_LABEL


def forms(t: int, m: int = 1, device=None) -> dict[str, Callable[[torch.Tensor, int], torch.Tensor]]:
    """The radix-select forms for m rows of t scores, by label, for a caller to time and keep the fastest:
    `topk_indices`, past MAX_ROW the multi-pass form, and past the tail block's reach the multi-pass form in one
    launch where its chunks are all resident on `device` (`synced_fits`). Not offered in the tail block's range
    (SYNCED_FROM): alone it times first there, but it loses in the step's attention. H100, 1 row of 4097 scores:
    after an L2 flush 14.7 against 19.6 us, and the layer 57.3 against 55.1 us with it (2026-12-06). With the scores
    left in L2 and normal (before the picker took the indexer's own scores, with the tail block's eight passes):
    14.8-14.9 against 16.5-16.7 us alone, every time; in the step's attention, four builds on one machine
    (2026-12-07) took the layer 54.2, 56.0, 56.2 and 56.8 us with it (its kernel 15.4-17.9 us) against 54.4-54.6
    with the tail block (15.8 us), and launched without PDL 56.0 and 56.4. So it is neither the L2 nor PDL: its
    time in the step moves from one build to the next (the placement of its barrier's counters, a guess not
    checked) and is not better. At 8 rows the picker keeps the tail block anyway (16.5 against 17.8 us).
    Rows up to RANK_MAX are offered the pairwise rank too."""
    out = {label(t, m, device): topk_indices}
    if t > MAX_ROW:
        out.setdefault(MULTI_LABEL, topk_indices_multipass)
    if t > SYNCED_FROM and device is not None and synced_fits(m, t, device):
        out[SYNCED_LABEL] = SyncedSelect(m, device)
    if t <= RANK_MAX:
        out[RANK_LABEL] = topk_indices_rank
    return out


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
    def _digit_counts(key, inb, prefix, p: tl.constexpr, BITS: tl.constexpr):
        """Counts of digit p among the keys in the row whose digits above it match the prefix (all in pass 0)."""
        NB: tl.constexpr = 1 << BITS
        live = inb & ((key >> (32 - BITS * p - 1) >> 1) == prefix)
        digit = ((key >> (32 - BITS * (p + 1))) & (NB - 1)).to(tl.int32)
        return tl.histogram(digit, NB, mask=live)

    @triton.jit
    def _topk_kernel(scores, out, T, K, stride_sm, stride_om, BITS: tl.constexpr, BLOCK_T: tl.constexpr,
                     TAIL: tl.constexpr = 0):
        """One row a program, held in registers from one load (BLOCK_T >= T, or BLOCK_T + TAIL >= T with the
        scores past BLOCK_T in a second, smaller block): the passes are arithmetic, not memory round trips (a loop
        over 2048-score blocks took ~2 us a block on an H100, latency-bound)."""
        m = tl.program_id(0).to(tl.int64)
        ts = tl.arange(0, BLOCK_T)
        inb = ts < T
        key = _sortable_key(tl.load(scores + m * stride_sm + ts, mask=inb, other=0.0))
        if TAIL > 0:
            tts = BLOCK_T + tl.arange(0, TAIL)
            tinb = tts < T
            tkey = _sortable_key(tl.load(scores + m * stride_sm + tts, mask=tinb, other=0.0))
        NB: tl.constexpr = 1 << BITS
        bins = tl.arange(0, NB)
        prefix = tl.zeros((), tl.uint64)
        need = K
        rest = tl.zeros((), tl.uint32)  # the key's bits below the prefix
        done = K < 0
        for p in tl.static_range(32 // BITS):
            if not done:  # stop where the bin kept holds exactly the keys still needed: all with that prefix
                hist = _digit_counts(key, inb, prefix, p, BITS)
                if TAIL > 0:
                    hist += _digit_counts(tkey, tinb, prefix, p, BITS)
                prefix, need, in_bin = _next_digit(hist, bins, prefix, need, BITS)
                done = in_bin == need
                rest = tl.where(done, 32 - BITS * (p + 1), 0).to(tl.uint32)
        # prefix is now the k-th largest key's top bits: K - need keys lie above it; ties fill the rest in index
        # order (every one of them where the passes stopped early)
        key = key >> rest
        gt = (inb & (key > prefix)).to(tl.int32)
        eq = (inb & (key == prefix)).to(tl.int32)
        at_eq = tl.cumsum(eq, axis=0) - 1
        dst = out + m * stride_om
        tl.store(dst + tl.cumsum(gt, axis=0) - 1, ts, mask=gt != 0)
        tl.store(dst + (K - need) + at_eq, ts, mask=(eq != 0) & (at_eq < need))
        if TAIL > 0:  # the tail's places follow the main block's
            tkey = tkey >> rest
            tgt = (tinb & (tkey > prefix)).to(tl.int32)
            teq = (tinb & (tkey == prefix)).to(tl.int32)
            t_eq = tl.sum(eq, axis=0) + tl.cumsum(teq, axis=0) - 1
            tl.store(dst + tl.sum(gt, axis=0) + tl.cumsum(tgt, axis=0) - 1, tts, mask=tgt != 0)
            tl.store(dst + (K - need) + t_eq, tts, mask=(teq != 0) & (t_eq < need))


    @triton.jit
    def _above(s, th, USE_ASM: tl.constexpr):
        """1.0 where s > th, else 0.0 (ordered: 0.0 where either is NaN). On the GPU one instruction (set.gt into
        an fp32: FSET.BF), where a compare and a select into an integer took three with the add (sm_90 SASS)."""
        if USE_ASM:
            return tl.inline_asm_elementwise("set.gt.f32.f32 $0, $1, $2;", "=r,r,r", [s, th], dtype=tl.float32,
                                             is_pure=True, pack=1)
        return tl.where(s > th, 1.0, 0.0)

    @triton.jit
    def _finite_floor(s):
        """NaN and -inf as -FLT_MAX (max.f32 returns the operand that is not NaN), so that every score has a float
        just below it (`_just_below`) and the order is total."""
        return tl.maximum(s, -3.4028234663852886e38)

    @triton.jit
    def _just_below(s):
        """The float just below s (s >= -FLT_MAX, not NaN): s' > _just_below(s) exactly where s' >= s."""
        b = s.to(tl.int32, bitcast=True)
        return tl.where(s > 0, b - 1, tl.where(s < 0, b + 1, -2147483647)).to(tl.float32, bitcast=True)

    @triton.jit
    def _rank_exact(row, cnt, c, ii, si, below, T, BLOCK_J: tl.constexpr, USE_ASM: tl.constexpr):
        """`cnt` plus chunk c's scores that rank above each of ii (the chunk that holds them, or the row's last,
        partial one): ties by index, the places past T counting none (NaN)."""
        jj = c * BLOCK_J + tl.max_contiguous(tl.arange(0, BLOCK_J), 1)
        sj = tl.load(row + jj, mask=jj < T, other=0.0)
        sj = tl.where(jj < T, _finite_floor(sj), float("nan"))
        th = tl.where(jj[None, :] < ii[:, None], below[:, None], si[:, None])
        return cnt + _above(sj[None, :], th, USE_ASM)

    @triton.jit
    def _rank_whole(row, cnt, lo, hi, th, BLOCK_J: tl.constexpr, USE_ASM: tl.constexpr):
        """`cnt` plus, for whole chunks lo..hi-1 of the row, the scores above th (a program's [BLOCK_I]), two chunks
        an iteration, each loaded an iteration ahead into registers (a load from L2 takes several hundred cycles,
        about what a warp issues an iteration); NaN and -inf raised to -FLT_MAX as loaded. A lane's
        scores of a chunk are lane + 32 t (max_contiguous 1: Triton would otherwise load four consecutive ones a
        lane and move them into that layout through shared memory, a barrier an iteration)."""
        js = tl.max_contiguous(tl.arange(0, BLOCK_J), 1)
        every = tl.full((BLOCK_J,), True, tl.int1)
        n0 = tl.load(row + lo * BLOCK_J + js, mask=every & (lo < hi), other=0.0)
        n1 = tl.load(row + (lo + 1) * BLOCK_J + js, mask=every & (lo + 1 < hi), other=0.0)
        for c in range(lo, hi, 2):
            a = _finite_floor(n0)
            b = _finite_floor(n1)
            n0 = tl.load(row + (c + 2) * BLOCK_J + js, mask=every & (c + 2 < hi), other=0.0)
            n1 = tl.load(row + (c + 3) * BLOCK_J + js, mask=every & (c + 3 < hi), other=0.0)
            cnt += _above(a[None, :], th[:, None], USE_ASM)
            # the second chunk past hi (an odd count) above nothing: no score is above +inf
            cnt += _above(b[None, :], tl.where(c + 1 < hi, th, float("inf"))[:, None], USE_ASM)
        return cnt

    @triton.jit
    def _topk_rank_kernel(scores, out, T, K, stride_sm, stride_om, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr,
                          USE_ASM: tl.constexpr, PDL: tl.constexpr = False):
        """BLOCK_I scores of a row a program (one warp): each one's rank, the scores above it in the whole row (an
        equal score above it where its index is lower), and the index written at that place where it is below K.
        The ranks of a row are then its places in descending order, each once, so the first K places are written
        exactly once. The row in chunks of BLOCK_J from L2; a chunk wholly before the block counts s' >= s as s' >
        the float just below s, a chunk after it s' > s: two instructions a pair, with no per-pair index test but in
        the block's own chunk and the row's last, partial one. PDL: launched as a programmatic dependent of the
        kernel that wrote the scores, it waits for it before its first load."""
        if PDL:
            tl.extra.cuda.gdc_wait()
        m = tl.program_id(0).to(tl.int64)
        i0 = tl.program_id(1) * BLOCK_I
        row = scores + m * stride_sm
        ii = i0 + tl.arange(0, BLOCK_I)
        si = _finite_floor(tl.load(row + ii, mask=ii < T, other=0.0))
        below = _just_below(si)
        cnt = tl.zeros((BLOCK_I, BLOCK_J), tl.float32)
        own = i0 // BLOCK_J  # the chunk that holds this block (BLOCK_J a multiple of BLOCK_I)
        whole = T // BLOCK_J
        cnt = _rank_whole(row, cnt, 0, own, below, BLOCK_J, USE_ASM)
        cnt = _rank_exact(row, cnt, own, ii, si, below, T, BLOCK_J, USE_ASM)
        cnt = _rank_whole(row, cnt, own + 1, whole, si, BLOCK_J, USE_ASM)
        if (whole > own) & (whole * BLOCK_J < T):  # the last, partial chunk, past this block
            cnt = _rank_exact(row, cnt, whole, ii, si, below, T, BLOCK_J, USE_ASM)
        rank = tl.sum(cnt, axis=1).to(tl.int32)  # exact: at most RANK_MAX, below 2^24
        tl.store(out + m * stride_om + rank, ii, mask=(ii < T) & (rank < K))

    @triton.jit
    def _prefix_of(hist, P: tl.constexpr, K, DIGIT: tl.constexpr):
        """The first P digits of the K-th largest key, from the digit counts of passes 0..P-1 (hist: [P, 2^DIGIT]),
        and how many of the keys with that prefix are still needed."""
        NB: tl.constexpr = 1 << DIGIT
        bins = tl.arange(0, NB)
        prefix = tl.zeros((), tl.uint64)
        need = K
        for q in tl.static_range(P):
            prefix, need, _ = _next_digit(tl.load(hist + q * NB + bins), bins, prefix, need, DIGIT)
        return prefix, need

    @triton.jit
    def _next_digit(h, bins, prefix, need, DIGIT: tl.constexpr):
        """The prefix one digit longer, from the counts h of the next digit among the keys that match it: the bin
        that holds the need-th largest, how many of the keys in that bin are still needed, and how many it holds."""
        above = tl.sum(h, axis=0) - tl.cumsum(h, axis=0)  # keys in higher bins
        b = tl.max(tl.where(above + h >= need, bins, -1), axis=0)
        need = need - tl.sum(tl.where(bins == b, above, 0), axis=0)
        return (prefix << DIGIT) | b.to(tl.uint64), need, tl.sum(tl.where(bins == b, h, 0), axis=0)

    @triton.jit
    def _chunk_keys(scores, m, T, stride_sm, CHUNK: tl.constexpr, KEYBITS: tl.constexpr):
        """This program's chunk of row m: its indices, which are in the row, and their keys widened to KEYBITS (a
        whole number of digits: 33 for three 11-bit ones) as uint64."""
        ts = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
        inb = ts < T
        key = _sortable_key(tl.load(scores + m * stride_sm + ts, mask=inb, other=0.0))
        return ts, inb, key.to(tl.uint64) << (KEYBITS - 32)

    @triton.jit
    def _topk_count_kernel(scores, hist, T, K, stride_sm, stride_hm, P: tl.constexpr, DIGIT: tl.constexpr,
                           KEYBITS: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = False):
        """Pass P of the multi-pass form: this chunk's counts of digit P among the keys whose first P digits match
        the K-th largest key's (read from passes 0..P-1), added into the row's counts. PDL: launched as a
        programmatic dependent of the pass before, it lets the next one launch, loads its scores (written before
        the first pass began) and only then waits for the pass before's counts."""
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
        m = tl.program_id(0).to(tl.int64)
        ts, inb, key = _chunk_keys(scores, m, T, stride_sm, CHUNK, KEYBITS)
        if PDL:
            tl.extra.cuda.gdc_wait()
        h_row = hist + m * stride_hm
        prefix, need = _prefix_of(h_row, P, K, DIGIT)
        _add_counts(key, inb, prefix, h_row, P, DIGIT, KEYBITS)

    @triton.jit
    def _add_counts(key, inb, prefix, h_row, P: tl.constexpr, DIGIT: tl.constexpr, KEYBITS: tl.constexpr):
        """This chunk's counts of digit P among its keys whose first P digits are the prefix, added into the row's
        counts of pass P."""
        NB: tl.constexpr = 1 << DIGIT
        live = inb & ((key >> (KEYBITS - DIGIT * P)) == prefix)
        digit = ((key >> (KEYBITS - DIGIT * (P + 1))) & (NB - 1)).to(tl.int32)
        h = tl.histogram(digit, NB, mask=live)
        tl.atomic_add(h_row + P * NB + tl.arange(0, NB), h, mask=h > 0, sem="relaxed")

    @triton.jit
    def _topk_emit_kernel(scores, hist, out, T, K, stride_sm, stride_hm, stride_om, PASSES: tl.constexpr,
                          DIGIT: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = False):
        """After the passes: `_emit` for this chunk. PDL: as the passes' (the kernel after it waits for it in full
        either way)."""
        m = tl.program_id(0).to(tl.int64)
        ts, inb, key = _chunk_keys(scores, m, T, stride_sm, CHUNK, DIGIT * PASSES)
        if PDL:
            tl.extra.cuda.gdc_wait()
        h_row = hist + m * stride_hm
        prefix, need = _prefix_of(h_row, PASSES, K, DIGIT)
        _emit(ts, inb, key, prefix, need, h_row, out + m * stride_om, K, PASSES, DIGIT)

    @triton.jit
    def _emit(ts, inb, key, prefix, need, h_row, dst, K, PASSES: tl.constexpr, DIGIT: tl.constexpr):
        """This chunk's indices whose keys lie above the K-th largest (prefix, the whole key), and as many equal to
        it as K still needs, at places taken from the row's two counters (after its digit counts)."""
        gt = (inb & (key > prefix)).to(tl.int32)
        eq = (inb & (key == prefix)).to(tl.int32)
        # the row's two counters as one int64 (keys above in the high half, ties in the low), so that one atomic
        # round trip gives this chunk both places
        counters = (h_row + PASSES * (1 << DIGIT)).to(tl.pointer_type(tl.int64))
        took = tl.sum(gt, axis=0).to(tl.int64) << 32 | tl.sum(eq, axis=0).to(tl.int64)
        before = tl.atomic_add(counters, took, sem="relaxed")
        base_gt = (before >> 32).to(tl.int32)
        base_eq = (before & 0xFFFFFFFF).to(tl.int32)
        tl.store(dst + base_gt + tl.cumsum(gt, axis=0) - 1, ts, mask=gt != 0)
        at_eq = base_eq + tl.cumsum(eq, axis=0) - 1
        tl.store(dst + (K - need) + at_eq, ts, mask=(eq != 0) & (at_eq < need))

    @triton.jit
    def _row_sync(bar, target):
        """Wait until this row's chunks have all arrived here: `target` arrivals at the row's counter (zero at the
        launch, so pass p waits for chunks * (p + 1)). CUDA cooperative groups' grid sync, for a row's chunks:
        the program's threads meet, one thread adds its arrival (release: every thread's counts before it) and spins
        on the counter (acquire), and the threads meet again."""
        tl.debug_barrier()
        tl.atomic_add(bar, 1, sem="release")
        seen = tl.atomic_add(bar, 0, sem="acquire")
        while seen < target:
            seen = tl.atomic_add(bar, 0, sem="acquire")
        tl.debug_barrier()

    @triton.jit
    def _topk_synced_kernel(scores, hist, out, T, K, CHUNKS, stride_sm, stride_hm, stride_om, PASSES: tl.constexpr,
                            DIGIT: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = False,
                            ZERO: tl.constexpr = True):
        """The multi-pass form in one launch: the chunk's keys stay in registers from one load, and after each pass
        the row's chunks wait for one another (`_row_sync`) where the multi-pass form ends a launch, so the passes
        cost a round trip through L2 each, not a launch and a reload of the scores. The passes stop early where
        the bin kept holds exactly the keys still needed (random scores: after three 8-bit digits of rows up to
        131072): every key with that prefix is kept. Every chunk of the grid must be resident at once
        (`topk_indices_synced` checks). The row's last chunk to finish leaves its counts at zero, so a caller that
        keeps them (`SyncedSelect`) needs no memset before the next call. PDL: launched as a programmatic dependent
        of the kernel that wrote the scores, it waits for it before its first load."""
        if PDL:
            tl.extra.cuda.gdc_wait()
        m = tl.program_id(0).to(tl.int64)
        KEYBITS: tl.constexpr = DIGIT * PASSES
        ts, inb, key = _chunk_keys(scores, m, T, stride_sm, CHUNK, KEYBITS)
        NB: tl.constexpr = 1 << DIGIT
        bins = tl.arange(0, NB)
        h_row = hist + m * stride_hm
        prefix = tl.zeros((), tl.uint64)
        need = K
        rest = tl.zeros((), tl.uint64)  # the key's bits below the prefix
        done = K < 0
        for p in tl.static_range(PASSES):
            if not done:  # the same on every chunk of the row: they all read the same counts
                _add_counts(key, inb, prefix, h_row, p, DIGIT, KEYBITS)
                _row_sync(h_row + PASSES * NB + 2, CHUNKS * (p + 1))
                # the pass's counts from L2 (.cg): complete now, and never read into this SM's L1 before
                counts = tl.load(h_row + p * NB + bins, cache_modifier=".cg")
                prefix, need, in_bin = _next_digit(counts, bins, prefix, need, DIGIT)
                done = in_bin == need
                rest = tl.where(done, KEYBITS - DIGIT * (p + 1), 0).to(tl.uint64)
        _emit(ts, inb, key >> rest, prefix, need, h_row, out + m * stride_om, K, PASSES, DIGIT)
        if ZERO:  # (off only to read the counts afterwards, as tests do)
            # the last chunk out zeroes the row's counts (its every chunk has released its reads and atomics by
            # then: the finish of a stream-K GEMM)
            tl.debug_barrier()
            left = tl.atomic_add(h_row + PASSES * NB + 3, 1, sem="acq_rel")
            if left == CHUNKS - 1:
                for p in tl.static_range(PASSES):
                    tl.store(h_row + p * NB + bins, tl.zeros((NB,), tl.int32))
                tl.store(h_row + PASSES * NB + tl.arange(0, 4), tl.zeros((4,), tl.int32))


def topk_indices_multipass(scores: torch.Tensor, k: int, chunk: int = CHUNK, pdl: bool | None = None,
                           digit: int = DIGIT) -> torch.Tensor:
    """`topk_indices` for rows of any length, as PASSES + 1 launches over chunks of the row in parallel: pass p
    counts digit p of the keys that match the K-th largest's first p digits (atomics into the row's counts), then a
    last launch writes the indices above it and the ties it needs. The same set as torch.topk's up to ties, but
    which of several equal scores at the threshold are kept, and the order of the indices, depend on which chunk
    reaches the counters first. fp32 [M, T] contiguous rows, k < T; int32 [M, k]. pdl (default: where the GPU has
    it): the passes after the first launch as programmatic dependents, so a launch overlaps the pass before."""
    m, t = scores.shape
    passes = _passes(digit)
    counts = _counts(m, digit, scores.device)
    out = torch.empty((m, k), dtype=torch.int32, device=scores.device)
    grid = (m, triton.cdiv(t, chunk))
    warps = _warps(chunk)
    pdl = pdl_supported(scores.device) if pdl is None else pdl
    for p in range(passes):
        _topk_count_kernel[grid](scores, counts, t, k, scores.stride(0), counts.stride(0), P=p, DIGIT=digit,
                                 KEYBITS=passes * digit, CHUNK=chunk, PDL=pdl, num_warps=warps,
                                 **_pdl_launch(pdl and p > 0))
    _topk_emit_kernel[grid](scores, counts, out, t, k, scores.stride(0), counts.stride(0), out.stride(0),
                            PASSES=passes, DIGIT=digit, CHUNK=chunk, PDL=pdl, num_warps=warps, **_pdl_launch(pdl))
    return out


def _passes(digit: int) -> int:
    """Passes of `digit`-bit digits that cover a 32-bit key."""
    return -(-32 // digit)


def _counts(m: int, digit: int, device, make=torch.zeros) -> torch.Tensor:
    """A row's digit counts, then two int32 counters read as one int64 (passes * 2^digit is even: 8-byte aligned),
    then the synced form's arrivals and the chunks it has seen finish; zeros (`make`: how the buffer is made)."""
    return make((m, _passes(digit) * (1 << digit) + 4), dtype=torch.int32, device=device)


def _warps(chunk: int) -> int:
    return max(1, chunk // (32 * PER_THREAD))


_RESIDENT: dict = {}


def synced_fits(m: int, t: int, device, chunk: int = CHUNK, digit: int = DIGIT) -> bool:
    """Whether the synced form's grid (a program a chunk, m rows) is resident all at once on this GPU, so that no
    chunk waits for one that cannot start: programs an SM from the compiled kernel's registers (the CUDA occupancy
    rules), times the SMs. Never under the CPU interpreter past one chunk a row: it runs programs one at a time."""
    chunks = triton.cdiv(t, chunk)
    dev = torch.device(device)
    if not HAVE_TRITON or not available(dev):
        return False
    if dev.type != "cuda":
        return chunks == 1
    key = (dev.index if dev.index is not None else torch.cuda.current_device(), chunk, digit)
    if key not in _RESIDENT:
        _RESIDENT[key] = _resident_programs(dev, chunk, digit)
    return m * chunks <= _RESIDENT[key] * sm_count(dev)


def _resident_programs(dev: torch.device, chunk: int, digit: int) -> int:
    """Programs of the synced kernel an SM holds (compiled, not launched: a launch too large would never end);
    one where the compiled kernel's registers cannot be read."""
    s = torch.empty((1, chunk), device=dev)  # never read: nothing is launched
    counts = _counts(1, digit, dev, torch.empty)
    out = torch.empty((1, 16), dtype=torch.int32, device=dev)
    try:  # sizes not 1, which Triton would compile as constants
        compiled = _topk_synced_kernel.warmup(s, counts, out, chunk, 16, 2, s.stride(0), counts.stride(0),
                                              out.stride(0), PASSES=_passes(digit), DIGIT=digit, CHUNK=chunk,
                                              num_warps=_warps(chunk), grid=(1, 1))
        compiled._init_handles()  # loads it (registers known) without launching it
    except Exception:  # noqa: BLE001 - Triton's private loader: an unknown count is taken as one a program an SM
        return 1
    return resident_programs(compiled, _warps(chunk), dev) or 1


def topk_indices_synced(scores: torch.Tensor, k: int, chunk: int = CHUNK, digit: int = DIGIT,
                        counts: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """`topk_indices_multipass` in one launch (`_topk_synced_kernel`): the same passes and the same set of indices,
    the row's chunks meeting at a barrier in L2 after each pass. Needs every chunk resident at once
    (`synced_fits`); fp32 [M, T] contiguous rows, k < T; int32 [M, k]. counts: the row's counts, zeros, as the
    call leaves them (fresh zeros where None); pdl: launched as a programmatic dependent (sm90+)."""
    m, t = scores.shape
    if not synced_fits(m, t, scores.device, chunk, digit):
        why = " (the interpreter runs one at a time)" if interpreted() else ""
        raise DecodeGapError(f"top-k: the synced form's {m} x {triton.cdiv(t, chunk)} chunks are not all resident "
                             f"at once on {scores.device}{why}")
    counts = _counts(m, digit, scores.device) if counts is None else counts
    out = torch.empty((m, k), dtype=torch.int32, device=scores.device)
    _topk_synced_kernel[(m, triton.cdiv(t, chunk))](
        scores, counts, out, t, k, triton.cdiv(t, chunk), scores.stride(0), counts.stride(0), out.stride(0),
        PASSES=_passes(digit), DIGIT=digit, CHUNK=chunk, PDL=pdl, num_warps=_warps(chunk), **_pdl_launch(pdl))
    return out


class SyncedSelect:
    """`topk_indices_synced` for m rows with the counts kept between calls (the kernel leaves them at zero), so a
    call is one launch with no memset before it, launched as a programmatic dependent of the kernel before it
    where the GPU has that (sm90+); a caller's own, as calls share the counts (one stream)."""

    def __init__(self, m: int, device, digit: int = DIGIT, chunk: int = CHUNK):
        self.m, self.digit, self.chunk = m, digit, chunk
        self.counts = _counts(m, digit, device)
        self.pdl = pdl_supported(device)

    def __call__(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        if scores.shape[0] != self.m:
            raise DecodeGapError(f"top-k: {scores.shape[0]} rows where this selection was built for {self.m}")
        return topk_indices_synced(scores, k, self.chunk, self.digit, self.counts, self.pdl)


def topk_indices_rank(scores: torch.Tensor, k: int, pdl: bool | None = None, block_i: int = RANK_BLOCK_I,
                      block_j: int = RANK_BLOCK_J) -> torch.Tensor:
    """`topk_indices` as a pairwise rank (`_topk_rank_kernel`): every score compared with every other of its row, in
    one launch of one-warp programs of RANK_BLOCK_I scores each, with no pass and no count that programs share, so
    a row of 4097 scores spreads over 513 programs where the radix select runs one. The k largest in descending
    order, ties by index (NaN and -inf ranked as -FLT_MAX); the work grows as the square of the row, so for rows up
    to RANK_MAX. fp32 [M, T] contiguous rows; int32 [M, k] (every index, the reference's int64, where k >= T). pdl
    (default: where the GPU has it): launched as a programmatic dependent of the kernel before. block_i, block_j:
    scores a program ranks and scores it compares them with an iteration (block_j a multiple of block_i)."""
    if scores.dim() != 2 or scores.dtype != torch.float32 or scores.stride(-1) != 1:
        raise DecodeGapError(f"top-k: the pairwise rank needs fp32 scores [M, T] with contiguous rows, got "
                             f"{scores.dtype} {tuple(scores.shape)}")
    m, t = scores.shape
    if t > RANK_MAX:
        raise DecodeGapError(f"top-k: the pairwise rank takes rows of up to {RANK_MAX} scores, not {t}")
    if k >= t:  # no selection: every index (its places past T would be left unwritten)
        return topk_indices_reference(scores, k)
    out = torch.empty((m, k), dtype=torch.int32, device=scores.device)
    pdl = pdl_supported(scores.device) if pdl is None else pdl
    _topk_rank_kernel[(m, triton.cdiv(t, block_i))](
        scores, out, t, k, scores.stride(0), out.stride(0), BLOCK_I=block_i, BLOCK_J=block_j,
        USE_ASM=not interpreted(), PDL=pdl, num_warps=1, **_pdl_launch(pdl))
    return out


def topk_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the k largest of each row of fp32 scores [M, T], unsorted: int32 from the radix select where
    Triton runs (one program a row up to MAX_ROW scores, with a tail block up to MAX_ROW + MAX_TAIL; the multi-pass
    form past it, in one launch where its chunks all fit at once), else torch.topk's (int64). Every index when
    k >= T (the reference's, int64)."""
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise DecodeGapError(f"top-k: needs fp32 scores [M, T], got {scores.dtype} {tuple(scores.shape)}")
    m, t = scores.shape
    if k >= t or not available(scores.device) or scores.stride(1) != 1:
        return topk_indices_reference(scores, k)
    if t > MAX_ROW + MAX_TAIL:
        return (topk_indices_synced if synced_fits(m, t, scores.device) else topk_indices_multipass)(scores, k)
    out = torch.empty((m, k), dtype=torch.int32, device=scores.device)
    block = max(2048, triton.next_power_of_2(min(t, MAX_ROW)))  # 4 warps at least
    tail_block = max(MIN_TAIL, triton.next_power_of_2(t - MAX_ROW)) if t > MAX_ROW else 0
    _topk_kernel[(m,)](scores, out, t, k, scores.stride(0), out.stride(0), BITS=BITS, BLOCK_T=block, TAIL=tail_block,
                       num_warps=block // (32 * PER_THREAD))
    return out
