"""The DSA indexer's radix-select top-k (`kernels.topk`) in Triton's CPU interpreter: the scores it keeps are
torch.topk's exactly, every index once; the one-program form (with a tail block past MAX_ROW) fills ties at the
threshold in index order, the multi-pass form (rows past MAX_ROW + MAX_TAIL, and any row when called directly) exactly
as many of them as k needs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
REPO = Path(__file__).resolve().parents[1]


def _interpret(code: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_radix_select_keeps_torch_topks_scores():
    _interpret(r'''
import torch
from decode_gap.kernels.topk import (LABEL, MAX_ROW, MAX_TAIL, RANK_LABEL, RANK_MAX, TAIL_LABEL, forms, topk_indices,
                                    topk_indices_multipass, topk_indices_reference)
torch.manual_seed(0)
# one program: within MAX_ROW, and past it with a second block (the tail) of 1, 904 and MAX_TAIL scores
one = [(1, 100, 7), (2, 5000, 2048), (3, 2049, 2048), (1, MAX_ROW, 33), (1, 64, 63), (2, MAX_ROW + 1, 2048),
       (1, MAX_ROW + MAX_TAIL, 3000)]
multi = [(1, 100, 7, 32), (2, 5000, 2048, 1024), (3, 3000, 77, 512), (1, 64, 63, 64), (1, 9000, 2048, 2048)]
for m, t, k, chunk in [c + (None,) for c in one] + multi:
    assert set(forms(t)) - {RANK_LABEL} == ({LABEL} if t <= MAX_ROW else {LABEL + " (multi-pass)", TAIL_LABEL}
                                            if t <= MAX_ROW + MAX_TAIL else {LABEL + " (multi-pass)"})
    assert (RANK_LABEL in forms(t)) == (t <= RANK_MAX)
    s = torch.randn(m, t) * 3
    s[0, :10] = 0.5   # equal scores
    s[0, 10:20] = -0.0  # and signed zeros beside positive ones
    s[0, 20] = float("-inf")
    got = topk_indices(s, k) if chunk is None else topk_indices_multipass(s, k, chunk=chunk)
    assert got.dtype == torch.int32 and got.shape == (m, k), (got.dtype, got.shape)
    ref = topk_indices_reference(s, k)
    for i in range(m):
        assert len(set(got[i].tolist())) == k, (m, t, k, i)
        assert torch.equal(s[i, got[i].long()].sort().values, s[i, ref[i]].sort().values), (m, t, k, i)
s = torch.zeros(2, 300)
s[:, 5] = 1
assert sorted(topk_indices(s, 10)[1].tolist()) == list(range(10))  # 5, then the first 9 zeros in index order
s = torch.zeros(2, 3000)
s[:, 2999] = 1
got = topk_indices_multipass(s, 10, chunk=256)  # 1, then 9 of the zeros, each index once
assert all(2999 in r and len(set(r)) == 10 for r in got.tolist())
assert topk_indices(torch.randn(2, 5), 8).tolist() == [list(range(5))] * 2  # k >= T: every index
s = torch.zeros(1, MAX_ROW + 300)  # the tail: ties across both blocks still fill in index order
s[0, MAX_ROW + 10] = 1
s[0, 3] = 2
assert sorted(topk_indices(s, 6)[0].tolist()) == [0, 1, 2, 3, 4, MAX_ROW + 10]
s = torch.zeros(1, MAX_ROW + 300)
s[0, 5:MAX_ROW] = -1
got = sorted(topk_indices(s, 10)[0].tolist())  # the zeros: 5 in the main block, then the tail's first 5
assert got == [0, 1, 2, 3, 4] + [MAX_ROW + i for i in range(5)], got
assert forms(RANK_MAX + 1) == {LABEL + " (multi-pass)": topk_indices}
got = topk_indices(torch.randn(1, MAX_ROW + MAX_TAIL + 1), 4)  # past the tail: the multi-pass form
assert got.dtype == torch.int32 and got.shape == (1, 4)
print("ok")
''')


def test_the_one_program_form_stops_once_the_bin_is_exactly_what_is_needed():
    """Its passes (counted through its digit counts, in the interpreter) end where the bin kept holds exactly the
    keys still needed, and the scores it keeps are still torch.topk's; with ties through every digit, all eight."""
    _interpret(r'''
import torch
from decode_gap.kernels import topk
passes = []
count = topk._digit_counts
def counting(key, inb, prefix, p, BITS):
    passes.append(int(p))
    return count.fn(key, inb, prefix, p, BITS)
topk._digit_counts = counting
torch.manual_seed(0)
for t in (4096, topk.MAX_ROW + 1):  # the one program, then with its tail (two counts a pass)
    s = torch.randn(1, t)
    passes.clear()
    got = topk.topk_indices(s, 2048)
    ref = topk.topk_indices_reference(s, 2048)
    assert torch.equal(s[0, got[0].long()].sort().values, s[0, ref[0]].sort().values), t
    assert len(set(got[0].tolist())) == 2048 and 0 < max(passes) < 7, (t, passes)
s = torch.zeros(1, 4096)
s[0, :100] = 1
passes.clear()
assert sorted(topk.topk_indices(s, 2048)[0].tolist()) == list(range(2048))  # the 1s, then zeros in index order
assert passes == list(range(8)), passes
print("ok")
''')


def test_the_pairwise_rank_writes_the_k_largest_in_order_each_index_once():
    """Ranks, ties by index, so the k places hold the k largest in descending order; NaN, -inf and signed zeros
    leave every place written once (a rank each); rows shorter than, equal to and past a block of the row, and the
    block's own chunk the last, partial one."""
    _interpret(r'''
import torch
from decode_gap.kernels.topk import RANK_BLOCK_I, RANK_BLOCK_J, topk_indices_rank
torch.manual_seed(0)
for m, t, k in [(2, 300, 100), (1, 50, 10), (1, RANK_BLOCK_J, 100), (2, RANK_BLOCK_J + RANK_BLOCK_I + 1, 129),
                (1, 3 * RANK_BLOCK_J + 5, 700), (1, 700, 699)]:
    for s in (torch.randn(m, t), torch.randint(0, 7, (m, t)).float()):  # distinct scores, then ties everywhere
        got = topk_indices_rank(s, k)
        assert got.dtype == torch.int32 and got.shape == (m, k), (got.dtype, got.shape)
        for i in range(m):
            order = sorted(range(t), key=lambda j: (-s[i, j].item(), j))[:k]
            assert got[i].tolist() == order, (m, t, k, i)
s = torch.randn(1, 300)
s[0, ::7] = float("nan")
s[0, 3::11] = float("-inf")
s[0, 5], s[0, 9], s[0, 10] = float("inf"), -0.0, 0.0
for k in (5, 200, 299):
    got = topk_indices_rank(s, k)[0].tolist()
    assert len(set(got)) == k and got[0] == 5, (k, got[:3])  # +inf first, every place written once
print("ok")
''')


def test_the_pairwise_rank_refuses_what_it_cannot_take_and_keeps_every_index_past_k():
    import torch

    from decode_gap.errors import DecodeGapError
    from decode_gap.kernels.topk import RANK_MAX, topk_indices_rank

    with pytest.raises(DecodeGapError, match=f"rows of up to {RANK_MAX} scores"):
        topk_indices_rank(torch.randn(1, RANK_MAX + 1), 8)
    with pytest.raises(DecodeGapError, match="fp32 scores .M, T. with contiguous rows"):
        topk_indices_rank(torch.randn(1, 8, dtype=torch.bfloat16), 2)
    with pytest.raises(DecodeGapError, match="fp32 scores .M, T. with contiguous rows"):
        topk_indices_rank(torch.randn(8, 2).t(), 2)
    assert topk_indices_rank(torch.randn(2, 5), 8).tolist() == [list(range(5))] * 2  # k >= T: every index


def test_radix_select_refuses_what_it_cannot_take():
    import torch

    from decode_gap.errors import DecodeGapError
    from decode_gap.kernels.topk import topk_indices

    with pytest.raises(DecodeGapError, match="fp32 scores"):
        topk_indices(torch.randn(4, dtype=torch.float32), 2)
    with pytest.raises(DecodeGapError, match="fp32 scores"):
        topk_indices(torch.randn(1, 8, dtype=torch.bfloat16), 2)


def test_the_tail_block_is_the_default_just_past_max_row_and_multi_pass_the_other_form_there():
    from decode_gap.kernels.topk import (LABEL, MAX_ROW, MAX_TAIL, MULTI_LABEL, RANK_LABEL, TAIL_LABEL, forms, label,
                                        topk_indices, topk_indices_multipass, topk_indices_rank)

    assert [label(t) for t in (MAX_ROW, MAX_ROW + 1, MAX_ROW + MAX_TAIL, MAX_ROW + MAX_TAIL + 1)] == [
        LABEL, TAIL_LABEL, TAIL_LABEL, MULTI_LABEL]
    assert forms(MAX_ROW + 1) == {TAIL_LABEL: topk_indices, MULTI_LABEL: topk_indices_multipass,
                                  RANK_LABEL: topk_indices_rank}


def test_the_one_launch_form_keeps_torch_topks_scores_and_stops_once_the_bin_is_exactly_what_is_needed():
    # the interpreter runs a grid's programs one after another, so chunks that wait for each other never meet: one
    # chunk a row here (the barrier then passes at once); the GPU's probe and kernel checks take many
    _interpret(r'''
import torch
from decode_gap.kernels import topk
torch.manual_seed(0)
def arrivals(s, k, chunk):
    m, t = s.shape
    counts, out = topk._counts(m, topk.DIGIT, s.device), torch.empty((m, k), dtype=torch.int32)
    topk._topk_synced_kernel[(m, 1)](s, counts, out, t, k, 1, s.stride(0), counts.stride(0), out.stride(0),
                                     PASSES=4, DIGIT=topk.DIGIT, CHUNK=chunk, ZERO=False)
    return counts[:, 4 * 256 + 2].tolist(), out
for m, t, k, chunk, digit in [(1, 100, 7, 128, 8), (2, 9000, 2048, 16384, 8), (3, 3000, 77, 4096, 11),
                              (1, 64, 63, 64, 8)]:
    s = torch.randn(m, t) * 3
    s[0, :10] = 0.5
    s[0, 10:20] = -0.0
    s[0, 20] = float("-inf")
    got = topk.topk_indices_synced(s, k, chunk=chunk, digit=digit)
    assert got.dtype == torch.int32 and got.shape == (m, k)
    ref = topk.topk_indices_reference(s, k)
    for i in range(m):
        assert len(set(got[i].tolist())) == k, (m, t, k, i)
        assert torch.equal(s[i, got[i].long()].sort().values, s[i, ref[i]].sort().values), (m, t, k, i)
# random scores: after three 8-bit digits the bin kept holds exactly the one key still needed, so the fourth pass
# never runs; equal scores at the threshold run every pass and fill the ties
s = torch.randn(2, 9000)
passes, got = arrivals(s, 2048, 16384)
assert passes == [3, 3], passes
assert torch.equal(s.gather(1, got.long()).sort().values, s.topk(2048).values.sort().values)
s = torch.zeros(1, 3000)
s[0, 2999] = 1
passes, got = arrivals(s, 10, 4096)
assert passes == [4] and 2999 in got[0].tolist() and len(set(got[0].tolist())) == 10, (passes, got)
# kept counts: each call leaves them at zero (its last chunk out), so the next needs no memset
sel = topk.SyncedSelect(3, "cpu", chunk=8192)
assert not sel.pdl
for _ in range(2):
    s = torch.randn(3, 5000)
    got = sel(s, 700)
    assert torch.equal(s.gather(1, got.long()).sort().values, s.topk(700).values.sort().values)
    assert not sel.counts.any(), sel.counts.nonzero()
print("ok")
''')


def test_the_one_launch_form_is_offered_only_where_its_chunks_are_all_resident():
    from decode_gap.kernels import topk

    assert not topk.synced_fits(1, 100, "cpu")  # outside the interpreter nothing runs on the CPU
    assert set(topk.forms(9000, 1, "cpu")) == {topk.MULTI_LABEL, topk.RANK_LABEL}
    _interpret(r'''
import pytest, torch
from decode_gap.errors import DecodeGapError
from decode_gap.kernels import topk
# one program at a time: one chunk a row fits, two never do, so the kernel level never offers it on the CPU
assert topk.synced_fits(2, topk.CHUNK, "cpu") and not topk.synced_fits(1, topk.CHUNK + 1, "cpu")
assert set(topk.forms(9000, 1, "cpu")) == {topk.MULTI_LABEL, topk.RANK_LABEL}
with pytest.raises(DecodeGapError, match="not all resident at once on cpu .the interpreter runs one at a time"):
    topk.topk_indices_synced(torch.randn(1, 5000), 10)
print("ok")
''')
