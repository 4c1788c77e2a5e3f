"""The fp8 fused MoE above batch 1 (kernels/fusedmoe.py) in Triton's CPU interpreter (a subprocess: the interpreter is
chosen when Triton is imported): the pairs sorted by expert as engines' align step sorts them, and the whole call
against dequantise-then-matmul, with 128x128 block and per-expert weight scales. The H200 runs the same checks
compiled (benchmarks/lowprec_device.py --sections fusedmoe, or kernelchecks).
"""

import sys
from pathlib import Path

import pytest
import torch

from decode_gap.errors import DecodeGapError
from decode_gap.kernels import fusedmoe as bm
from decode_gap.kernels import lowprec as lp

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).parent))
from interpreted import run_interpreted  # noqa: E402

EXPERTS = r'''
import torch
from decode_gap.kernels import fusedmoe as bm
from decode_gap.kernels import lowprec as lp
g = torch.Generator().manual_seed(0)
w13 = lp.quantize_fp8(torch.randn(6, 256, 256, generator=g) * 0.05, block=True)
w2 = lp.quantize_fp8(torch.randn(6, 256, 128, generator=g) * 0.05, block=True)
'''


def _interpret(code: str) -> None:
    run_interpreted(EXPERTS + code)


def test_grid_bound_is_the_most_blocks_pairs_can_fill():
    assert bm.max_blocks(64, 256) == 4 + 64  # 8 tokens x top 8 of DeepSeek-V3's 256 experts
    assert bm.max_blocks(3, 2) == 1 + 2


def test_gate_up_splits_k_only_where_the_experts_hit_leave_sms_idle():
    # DeepSeek-V3 TP8 (I = 256 a rank: 512 gate_up rows, 4 tiles), 132 SMs: 2 tokens hit 16 experts, 64 programs
    assert bm.gate_up_split(16, 256, 512, 7168, 132) == 5
    assert bm.gate_up_split(32, 256, 512, 7168, 132) == 3  # 4 tokens: 128 programs
    assert bm.gate_up_split(64, 256, 512, 7168, 132) == 1  # 8 tokens: 256 programs, enough
    assert bm.gate_up_split(16, 256, 4096, 7168, 132) == 1  # TP1 (I = 2048): 32 tiles an expert
    assert bm.gate_up_split(2, 4, 512, 256, 132) == 1  # K of 2 groups: not split below 4 a split


def test_align_sorts_pairs_by_expert_in_blocks_of_block_m():
    _interpret(r'''
moe = bm.FusedMoe(w13, w2, 3, 2, "cpu")
for ids in ([[0, 3], [3, 5], [0, 0]], [[5, 4], [4, 5], [1, 2]], [[2, 2], [2, 2], [2, 2]]):
    t = torch.tensor(ids, dtype=torch.int32)
    moe.align(t)
    flat = t.reshape(-1).tolist()
    blocks = moe.sorted_pairs.view(moe.nb, moe.block_m).tolist()
    experts = moe.block_expert.tolist()
    seen = []
    for b, e in enumerate(experts):
        real = [p for p in blocks[b] if p < len(flat)]
        if e < 0:
            assert not real, (ids, b)
            continue
        assert real and all(flat[p] == e for p in real), (ids, b)  # one expert a block
        assert blocks[b] == real + [len(flat)] * (moe.block_m - len(real)), (ids, b)  # padding after the pairs
        seen += real
    used = [e for e in experts if e >= 0]
    assert used == sorted(used) and len(used) == len(set(flat)), ids  # a block an expert hit, in expert order
    assert seen == sorted(range(len(flat)), key=lambda p: (flat[p], p)), ids  # every pair once, a stable sort
print("ok")
''')


@pytest.mark.parametrize("rank", ["sort", "atomic"])
def test_align_blocks_every_pair_by_expert_at_256_pairs_of_256_experts_with_ids_off_the_table(rank):
    # the kernel level's batch 32 x top 8 over DeepSeek-V3's / GLM-5's 256 experts, blocks of 8 (the NVFP4 fused MoE),
    # with ids another EP rank owns (off the table) dropped; then 2048 pairs (batch 256) in blocks of 16, 8 warps.
    # The sort is stable; the atomic form places an expert's pairs in the order its atomics land (here, the
    # interpreter's: in order), so each expert's run is compared as a set, its padding after its pairs
    _interpret(r'''
g = torch.Generator().manual_seed(3)
E = 256
for trial, (P, BM) in enumerate([(256, 8)] * 3 + [(2048, 16), (2504, 8)]):
    ids = torch.stack([torch.randperm(E + 20, generator=g)[:8] - 10 for _ in range(P // 8)]).to(torch.int32)
    if trial == 2:
        ids[:] = 7  # every pair on one expert
    nb = bm.max_blocks(P, E, BM)
    sp, be = torch.empty(nb * BM, dtype=torch.int32), torch.empty(nb, dtype=torch.int32)
    bm.align_pairs(ids, sp, be, E, BM, rank=RANK, cursor=torch.empty(3, dtype=torch.int32))  # too small: a new one
    flat = ids.reshape(-1).tolist()
    keep = sorted((p for p in range(P) if 0 <= flat[p] < E), key=lambda p: (flat[p], p))
    got = sp.tolist()
    want_rows, want_exp, runs = [], [], []
    for e in sorted({flat[p] for p in keep}):
        run = [p for p in keep if flat[p] == e]
        run += [P] * (-len(run) % BM)
        have = got[len(want_rows):len(want_rows) + len(run)]
        runs += have if RANK == "sort" else sorted(have)
        want_rows += run
        want_exp += [e] * (len(run) // BM)
    assert runs == want_rows and set(got[len(want_rows):]) <= {P}, trial
    assert be.tolist() == want_exp + [-1] * (nb - len(want_exp)), trial
print("ok")
'''.replace("RANK", repr(rank)))


def test_fused_moe_matches_dequantise_then_matmul():
    _interpret(r'''
torch.manual_seed(1)
x = torch.randn(3, 256)
w = torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.9, 0.1]])
per_expert = (lp.quantize_fp8(torch.randn(6, 256, 256, generator=g) * 0.05),
              lp.quantize_fp8(torch.randn(6, 256, 128, generator=g) * 0.05))
# split 2: gate_up's K in two programs, summed with atomics into fp32, zeroed again after the SiLU
for (a, b), split in (((w13, w2), 1), ((w13, w2), 2), (per_expert, 1), (per_expert, 2)):
    moe = bm.FusedMoe(a, b, 3, 2, "cpu", out_dtype=torch.float32, split=split)
    for ids in ([[0, 3], [3, 5], [1, 0]], [[5, 4], [2, 1], [0, 5]]):  # the second reuses the buffers: a new sort
        ids = torch.tensor(ids, dtype=torch.int32)
        out, ref = moe(x, ids, w), moe.reference(x, ids, w)
        err = ((out - ref).norm() / ref.norm()).item()
        assert err < 1e-3, (split, err)
    assert moe.split == split and (split == 1 or moe.gu.abs().max() == 0)
    assert ("per-expert" in moe.label) != a.block
print("ok")
''')


def test_shapes_off_the_block_grid_are_one_clear_error():
    g = torch.Generator().manual_seed(0)
    w13 = lp.quantize_fp8(torch.randn(6, 256, 256, generator=g), block=True)
    w2 = lp.quantize_fp8(torch.randn(6, 256, 128, generator=g), block=True)
    with pytest.raises(DecodeGapError, match="does not match"):  # w2 [E, H, I] against w13 [E, 2I, H]
        bm.FusedMoe(w13, lp.quantize_fp8(torch.randn(6, 256, 256), block=True), 2, 2, "cpu")
    with pytest.raises(DecodeGapError, match="both with 128x128 block scales or both with one scale an expert"):
        bm.FusedMoe(lp.quantize_fp8(torch.randn(6, 256, 256)), w2, 2, 2, "cpu")
    with pytest.raises(DecodeGapError, match=r"one an expert, \[E\]"):
        bm.FusedMoe(lp.quantize_fp8(torch.randn(6, 256, 256)), lp.Fp8Weight(w2.data, torch.ones(()), False), 2, 2,
                    "cpu")
    with pytest.raises(DecodeGapError, match="at most 8192"):
        bm.FusedMoe(w13, w2, 4097, 2, "cpu")
    if not lp.interpreted():
        with pytest.raises(DecodeGapError, match="Triton and a CUDA GPU"):
            bm.FusedMoe(w13, w2, 2, 2, "cpu")


def test_moe_stage_row_matches_the_per_expert_loop_and_drops_other_ranks_experts():
    """The MoE stage's fused rows (microbench.moe.fused_moe) on an EP rank's share: the pairs routed to another
    rank's experts are dropped by the sort and add nothing, so the sum matches the per-expert loop over this rank's
    experts (bf16 there, fp8 here: a few percent apart; a pair added or lost would be tens); NVFP4's against the
    dequantise-then-matmul of its own weights, this rank's pairs only."""
    _interpret(r'''
from decode_gap.microbench.common import BenchEnv
from decode_gap.microbench.moe import ExpertSet, FUSED_FORMATS, fused_moe, loop_fn, unpermute
from decode_gap.microbench.shapes import MoeShape
env = BenchEnv(device=torch.device("cpu"), warmup=1, iters=1, cpu_budget_s=0.01)
shape = MoeShape(hidden=128, experts_total=8, experts_local=4, top_k=2, inter=128, scoring="softmax")
es = ExpertSet(env, shape, 3, dtype=torch.float32)
assert (es.cids == es.experts_hit).any() and (es.cids < es.experts_hit).any(), es.cids  # both kinds of pair
ref = unpermute(loop_fn(es)(), es.token, es.row_weights, 3).float()
for fmt in FUSED_FORMATS:
    moe = fused_moe(es, fmt)
    y = moe(es.x, es.cids, es.weights).float()
    if fmt == "nvfp4":  # 4-bit weights are ~17% off bf16 here: against their own dequantised weights instead
        from decode_gap.kernels import fp4moe, nvfp4 as nv
        d13 = [nv.dequantize_nvfp4(nv.quantize_nvfp4(w)).float() for w in es.w13]
        d2 = [nv.dequantize_nvfp4(nv.quantize_nvfp4(w)).float() for w in es.w2]
        mine = es.cids < es.experts_hit  # this rank's pairs; the others weigh nothing
        ref4 = fp4moe.reference(es.x, torch.where(mine, es.cids, 0), torch.where(mine, es.weights, 0.0),
                                lambda e: (d13[e], d2[e]))
        err = ((y - ref4).norm() / ref4.norm()).item()
        assert err < 1e-2, (fmt, err)
        continue
    err = ((y - ref).norm() / ref.norm()).item()
    assert err < 0.08, (fmt, err)
print("ok")
''')
