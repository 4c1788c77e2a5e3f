"""The NVFP4 fused MoE (kernels/fp4moe.py) in Triton's CPU interpreter (a subprocess: the interpreter is chosen when
Triton is imported): the whole call against dequantise-then-matmul at blocks of 8 and 16 pairs, with and without K
splits, padding columns, an expert chosen twice by a token's neighbours, an id off the table, the sums left at zero
for the next call, two tiles a warp, and one token's GEMMs as the one-token kernel (K slices summed in the program).
The H200 runs the same checks compiled (benchmarks/lowprec_device.py --sections fp4moe, or kernelchecks).
"""

import sys
from pathlib import Path

import pytest

from decode_gap.kernels import fp4moe

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).parent))
from interpreted import run_interpreted  # noqa: E402

EXPERTS = r'''
import torch
from decode_gap.kernels import fp4moe
from decode_gap.kernels import nvfp4 as nv
g = torch.Generator().manual_seed(0)
E, H, I = 6, 128, 64
w13 = [nv.quantize_nvfp4(torch.randn(2 * I, H, generator=g) * 0.05) for _ in range(E)]
w2 = [nv.quantize_nvfp4(torch.randn(H, I, generator=g) * 0.05) for _ in range(E)]
d13 = fp4moe.dequantized(w13)
d2 = fp4moe.dequantized(w2)
expert = lambda e: (d13[e], d2[e])
def err(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()
def twice(run, ref, *case):
    """Two calls in a row, each within 1e-2 of ref: the second sees the zeros the first left in the sums and
    counters."""
    for call in range(2):
        e = err(run(), ref)
        assert e < 1e-2, (*case, call, e)
'''


def _interpret(code: str) -> None:
    run_interpreted(EXPERTS + code)


def test_blocks_take_a_second_mma_only_where_experts_average_more_than_eight_pairs():
    assert fp4moe.block_m_for(16 * 8, 256) == 8  # DeepSeek-V3 at 16 tokens: about one pair an expert hit
    assert fp4moe.block_m_for(64 * 2, 8) == 16  # Mixtral at 64 tokens: 16 pairs an expert


def test_splits_are_planned_for_the_experts_uniform_choices_hit():
    assert round(fp4moe.expected_hit(8, 256), 1) == 7.9
    assert round(fp4moe.expected_hit(128, 256), 1) == 100.9  # 16 tokens x top 8: ~102 hit on the H200's draws
    assert fp4moe.expected_hit(64, 8) > 7.99


def test_splits_aim_at_the_warps_an_sm_holds():
    # DeepSeek-V3 TP8 gate_up (512 rows: 32 tiles, 112 steps), 132 SMs, 2 steps an iteration
    assert fp4moe.moe_split(8, 32, 112, 2, 132) == 14  # batch 1: 8 experts
    assert fp4moe.moe_split(128, 32, 112, 2, 132) == 1  # 16 tokens: 128 experts fill the SMs
    assert fp4moe.moe_split(8, 448, 4, 2, 132) == 1  # down (K = 256): two iterations, nothing to split


def test_past_one_wave_gate_up_is_split_for_three_waves():
    # GLM-5 TP8 gate_up (32 tiles, 96 steps), 132 SMs holding 36 warps each (4752 in all)
    assert fp4moe.moe_split(57, 32, 96, 2, 132) == 2  # 8 tokens: 0.77 waves at 2 splits, left to the warps rule
    assert fp4moe.moe_split(101, 32, 96, 2, 132) == 5  # 16 tokens: 2 splits would be 1.4 waves
    assert fp4moe.moe_split(162, 32, 96, 2, 132) == 3  # 32 tokens: 1.09 waves unsplit
    assert fp4moe.moe_split(30, 256, 96, 2, 132) == 2  # TP1 (256 tiles) at 4 tokens: 1.6 waves unsplit
    assert fp4moe.moe_split(162, 32, 4, 2, 132) == 2  # never more splits than iterations (2 here)
    # at 16 pairs a block the kernel's 80 registers leave 24 warps an SM: 120 blocks unsplit are 0.81 waves at 8
    # pairs a block, 1.21 at 16
    assert fp4moe.moe_split(120, 32, 96, 2, 132) == 1
    assert fp4moe.moe_split(120, 32, 96, 2, 132, block_m=16) == 3


def test_fused_moe_matches_dequantise_then_matmul():
    _interpret(r'''
torch.manual_seed(1)
for m, ids, bm, s13, s2, silu, cast in ((3, [[0, 5], [5, 2], [0, 5]], 8, None, None, None, True),
                                        (3, [[0, 5], [5, 2], [0, 5]], 16, 2, 1, True, True),
                                        (2, [[4, 4 + 0], [1, 3]], 8, 1, 1, None, False),
                                        (1, [[3, 0]], 8, 2, None, True, False),
                                        (1, [[5, 1]], 8, None, None, None, True),  # one token, aligned
                                        (3, [[1, 5], [5, 2], [0, 1]], 16, 1, 2, None, True),
                                        (3, [[0, 5], [5, 2], [0, 5]], 8, 2, 2, False, False),
                                        (2, [[4, 0], [1, 3]], 16, 1, 1, False, True)):
    moe = fp4moe.Nvfp4FusedMoe(w13, w2, m, 2, "cpu", block_m=bm, split13=s13, split2=s2, silu_epilogue=silu,
                               cast_epilogue=cast, align=True if cast and m == 1 else None)
    assert moe.silu_epilogue == (moe.plan13[1] == 1 if silu is None else silu)
    assert moe.align == (m > 1 or cast)
    assert moe.kernels == 2 + moe.align + (not moe.silu_epilogue) + (not cast)
    x = torch.randn(m, H).to(torch.bfloat16)
    t = torch.tensor(ids, dtype=torch.int32)
    w = torch.rand(m, 2)
    ref = fp4moe.reference(x, t, w, expert)
    twice(lambda: moe(x, t, w), ref, ids, bm, s13, s2, silu, cast)
print("ok")
''')


def test_two_tiles_a_warp_match_dequantise_then_matmul():
    """The pair form (two 16-row tiles a warp against the same x loads) of gate_up and down, at blocks of 8 and 16
    pairs, split and unsplit, through every epilogue; H = 192 leaves down's second tile group half past the rows."""
    _interpret(r'''
H2 = 192
w13 = [nv.quantize_nvfp4(torch.randn(2 * I, H2, generator=g) * 0.05) for _ in range(E)]
w2 = [nv.quantize_nvfp4(torch.randn(H2, I, generator=g) * 0.05) for _ in range(E)]
d13, d2 = fp4moe.dequantized(w13), fp4moe.dequantized(w2)
torch.manual_seed(2)
for pair, m, ids, bm, s13, silu, cast in (("both", 3, [[0, 5], [5, 2], [0, 5]], 8, None, None, True),
                                          ("down", 3, [[1, 5], [5, 2], [0, 1]], 16, 3, True, False),
                                          ("gate_up", 2, [[4, 0], [1, 3]], 16, 1, None, True),
                                          ("both", 2, [[4, 4], [1, 3]], 8, 3, False, False),
                                          ("both", 1, [[3, 0]], 8, None, None, True)):
    moe = fp4moe.Nvfp4FusedMoe(w13, w2, m, 2, "cpu", block_m=bm, split13=s13, silu_epilogue=silu,
                               cast_epilogue=cast, pair=pair, token="none" if m == 1 else None)
    assert (moe.pair13, moe.pair2) == (pair != "down", pair != "gate_up")
    assert moe.plan2[1] == 1 or not moe.pair2  # down's pair is never split over K
    assert "two tiles a warp" in moe.label
    x = torch.randn(m, H2).to(torch.bfloat16)
    t = torch.tensor(ids, dtype=torch.int32)
    w = torch.rand(m, 2)
    ref = fp4moe.reference(x, t, w, lambda e: (d13[e], d2[e]))
    twice(lambda: moe(x, t, w), ref, pair, ids, bm, s13, silu, cast)
try:
    fp4moe.Nvfp4FusedMoe(w13, w2, 1, 2, "cpu", pair="all")
    raise SystemExit("pair='all' was taken")
except fp4moe.DecodeGapError as exc:
    assert "pair is" in str(exc)
print("ok")
''')


def test_two_tiles_a_warp_plan_their_splits_for_the_warps_that_run():
    # GLM-5 TP8 gate_up at 32 tokens (162 blocks of 32 tiles): one tile a warp is 1.09 waves of 36 warps an SM, so 3
    # splits; two tiles a warp are 16 warps a block, 0.70 waves of 28, and 2592 warps already past the pair form's
    # 14 an SM: unsplit
    assert fp4moe.moe_split(162, 32, 96, 2, 132) == 3
    assert fp4moe.moe_split(162, 32, 96, 2, 132, pair=True) == 1
    # at 8 tokens (57 blocks) the pair form is split for its own 14 warps an SM, one tile a warp for 27
    assert fp4moe.moe_split(57, 32, 96, 2, 132) == 2
    assert fp4moe.moe_split(57, 32, 96, 2, 132, pair=True) == 3
    # 16 pairs a block, two tiles a warp: 16 warps an SM, so 162 blocks unsplit are 1.23 waves
    assert fp4moe.moe_split(120, 32, 96, 2, 132, block_m=16, pair=True) == 1
    assert fp4moe.moe_split(162, 32, 96, 2, 132, block_m=16, pair=True) == 3


def test_one_token_kernels_match_dequantise_then_matmul():
    _interpret(r'''
from decode_gap.errors import DecodeGapError
H2, I2 = 512, 256  # 8 and 4 steps: room for K slices
w13 = [nv.quantize_nvfp4(torch.randn(2 * I2, H2, generator=g) * 0.05) for _ in range(E)]
w2 = [nv.quantize_nvfp4(torch.randn(H2, I2, generator=g) * 0.05) for _ in range(E)]
d13, d2 = fp4moe.dequantized(w13), fp4moe.dequantized(w2)
x = torch.randn(1, H2).to(torch.bfloat16)
for token, ids, s13, s2, kernels in (("both", [[3, 0]], None, None, 2), ("gate_up", [[5, 1]], 2, None, 3),
                                     ("down", [[5, 1, 0, 2]], None, 1, 3), ("both", [[2, 3]], 4, 2, 2),
                                     ("gate_up", [[1, 4]], 1, None, 3)):
    moe = fp4moe.Nvfp4FusedMoe(w13, w2, 1, len(ids[0]), "cpu", token=token, slices13=s13, slices2=s2)
    assert (moe.token13, moe.token2, moe.kernels) == (token != "down", token != "gate_up", kernels), moe.label
    # a GEMM run as the one-token kernel sums in the program: no fp32 sums or counters of the block kernel
    assert (moe.gu is None, moe.cnt13 is None) == (moe.token13,) * 2
    assert (moe.acc is None, moe.cnt2 is None) == (moe.token2,) * 2
    t = torch.tensor(ids, dtype=torch.int32)
    w = torch.rand(1, t.shape[1])
    ref = fp4moe.reference(x, t, w, lambda e: (d13[e], d2[e]))
    twice(lambda: moe(x, t, w), ref, token, ids)
for bad in (dict(token="both", align=True), dict(token="down", slices2=4), dict(token="all")):
    try:
        fp4moe.Nvfp4FusedMoe(w13, w2, 1, 2, "cpu", **bad)
        raise SystemExit(f"no error: {bad}")
    except DecodeGapError as exc:
        assert "one-token" in str(exc) or "token is" in str(exc), exc
print("ok")
''')


def test_one_token_slices_aim_at_the_warps_an_sm_holds_in_whole_iterations():
    # DeepSeek-V3 TP8 gate_up: 32 tiles x 8 experts want ~14 slices; 112 steps take 8 of 2-step iterations, not 16
    assert fp4moe.token_slices(32, 8, 112, 2, 132, 16) == 8
    assert fp4moe.token_slices(32, 8, 96, 2, 132, 16) == 16  # GLM-5 TP8: 96 steps
    assert fp4moe.token_slices(256, 8, 112, 2, 132, 16) == 2  # TP1: 256 tiles
    assert fp4moe.token_slices(448, 8, 4, 2, 132, 2) == 1  # down: 448 tiles x 8 experts fill the SMs


def test_one_token_runs_gate_up_as_its_kernel_only_where_two_slices_are_enough():
    _interpret(r'''
def build(e, h, i, m=1):
    w13 = [nv.quantize_nvfp4(torch.randn(2 * i, h, generator=g)) for _ in range(e)]
    w2 = [nv.quantize_nvfp4(torch.randn(h, i, generator=g)) for _ in range(e)]
    return fp4moe.Nvfp4FusedMoe(w13, w2, m, 2, "cpu")
wide = build(2, 512, 1024)  # 128 tiles x 2 experts for the interpreter's 4 "SMs": no slices needed
assert wide.ks13 == 1 and wide.token13 and not wide.token2 and wide.kernels == 3
narrow = build(2, 2048, 64)  # 8 tiles x 2 experts: more slices than TOKEN_AUTO_SLICES
assert narrow.ks13 > fp4moe.TOKEN_AUTO_SLICES and not narrow.token13 and narrow.kernels == 4
assert not build(2, 512, 1024, m=2).token13  # two tokens: the align and the block kernels
print("ok")
''')


def test_gate_up_rows_interleave_eight_at_a_time_as_a_repack_of_the_interleaved_weight_would():
    import torch

    from decode_gap.kernels import lowprec as lp
    from decode_gap.kernels import nvfp4 as nv

    g = torch.Generator().manual_seed(2)
    i, h = 32, 128
    qs = [nv.quantize_nvfp4(torch.randn(2 * i, h, generator=g)) for _ in range(2)]
    order = torch.tensor([r + off for t in range(i // 8) for off in (8 * t, i + 8 * t) for r in range(8)])
    moved = [nv.NVFP4Tensor(q.packed[order], q.block_scales[order], q.tensor_scale, q.shape) for q in qs]
    got = fp4moe.gate_up_stack(lp._stack_mma(qs, bx=True))
    want = lp._stack_mma(moved, bx=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert fp4moe.gate_up_stack(got) is got  # interleaved once


def test_an_id_off_the_table_adds_nothing():
    _interpret(r'''
moe = fp4moe.Nvfp4FusedMoe(w13, w2, 2, 2, "cpu")
x = torch.randn(2, H).to(torch.bfloat16)
w = torch.rand(2, 2)
t = torch.tensor([[1, 9], [2, -1]], dtype=torch.int32)  # another EP rank's experts
ref = fp4moe.reference(x, torch.tensor([[1], [2]]), w[:, :1], expert)
assert err(moe(x, t, w), ref) < 1e-2
for token in ("none", "both"):  # one token: no align, its ids read as the blocks' experts, or the one-token kernels
    one = fp4moe.Nvfp4FusedMoe(w13, w2, 1, 2, "cpu", token=token)
    assert not one.align and one.nb == 2
    for ids, kept in (([[2, 9]], 0), ([[-1, 2]], 1)):  # expert 2 kept, at its place in the token's choice
        ref = fp4moe.reference(x[1:], torch.tensor([[2]]), w[1:, kept:kept + 1], expert)
        assert err(one(x[1:], torch.tensor(ids), w[1:]), ref) < 1e-2
print("ok")
''')


def test_down_by_pair_stores_each_pairs_row_and_sums_them_a_token():
    """down's form without atomics: each pair's row times its routing weight stored (unsplit), then a top_k sum a
    token; an off-table id's row stays zero, and a second call overwrites the rows the first left."""
    _interpret(r'''
x = torch.randn(3, H).to(torch.bfloat16)
w = torch.rand(3, 2)
for pair, m, ids, bm in (("down", 3, [[1, 5], [5, 2], [0, 9]], 8), ("none", 3, [[1, 5], [5, 2], [0, 1]], 16),
                         ("down", 1, [[3, 0]], 8)):
    moe = fp4moe.Nvfp4FusedMoe(w13, w2, m, 2, "cpu", block_m=bm, pair=pair, down_by_pair=True,
                               token="none" if m == 1 else None)
    assert moe.down_by_pair and moe.acc is None and moe.plan2[1] == 1 and "summed a token" in moe.label
    t = torch.tensor(ids, dtype=torch.int32)
    keep = (t >= 0) & (t < E)
    ref = fp4moe.reference(x[:m], t.clamp(0, E - 1), w[:m] * keep, expert)  # an off-table pair weighs nothing
    twice(lambda: moe(x[:m], t, w[:m]), ref, pair, m)
try:
    fp4moe.Nvfp4FusedMoe(w13, w2, 3, 2, "cpu", down_by_pair=True, split2=2)
    raise SystemExit("a split down by pair was taken")
except fp4moe.DecodeGapError as exc:
    assert "unsplit" in str(exc)
print("ok")
''')


def test_down_walking_tile_groups_matches_dequantise_then_matmul():
    """down's pair with a program walking 2 or 3 tile groups of its block: H = 320 is 20 tiles, so 3 groups of 8 tiles
    (4 warps, two tiles each), the last half past the rows, and 2 programs at a walk of 2, the second with one group
    (the interpreter runs the groups one after another; the compiled loop that loads a group ahead is checked on the
    GPU by benchmarks/device/moe_e_probe.py --walk). Refused where down is not the pair adding into the sums; by
    default only where it is and its K is short."""
    _interpret(r'''
H2 = 320
w13 = [nv.quantize_nvfp4(torch.randn(2 * I, H2, generator=g) * 0.05) for _ in range(E)]
w2 = [nv.quantize_nvfp4(torch.randn(H2, I, generator=g) * 0.05) for _ in range(E)]
d13, d2 = fp4moe.dequantized(w13), fp4moe.dequantized(w2)
torch.manual_seed(3)
for walk, m, ids, bm in ((2, 3, [[1, 5], [5, 2], [0, 9]], 8), (3, 3, [[1, 5], [5, 2], [0, 1]], 16),
                         (2, 1, [[3, 0]], 8)):
    moe = fp4moe.Nvfp4FusedMoe(w13, w2, m, 2, "cpu", block_m=bm, pair="down", walk2=walk,
                               token="none" if m == 1 else None)
    assert moe.walk2 == walk and f"{walk} tile groups a program of down" in moe.label
    x = torch.randn(m, H2).to(torch.bfloat16)
    t = torch.tensor(ids, dtype=torch.int32)
    w = torch.rand(m, 2)
    keep = (t >= 0) & (t < E)
    ref = fp4moe.reference(x, t.clamp(0, E - 1), w * keep, lambda e: (d13[e], d2[e]))
    twice(lambda: moe(x, t, w), ref, walk, m, bm)
for opt in ({"pair": "none"}, {"down_by_pair": True}, {"cast_epilogue": True}, {"walk2": 0}):
    try:
        fp4moe.Nvfp4FusedMoe(w13, w2, 3, 2, "cpu", **{"walk2": 2, "pair": "down", **opt})
        raise SystemExit(f"a walk with {opt} was taken")
    except fp4moe.DecodeGapError as exc:
        assert "tile groups a program" in str(exc), exc
# by default: DOWN_WALK at the block's pairs, at most the tile groups there are (3 here), where down's pair adds into
# the sums, its K is short (DOWN_WALK_MAX_K_STEPS) and its grid more than DOWN_WALK_MIN_WAVES of what the SMs hold
# (this grid, 3 groups x a few blocks, fits the interpreter's 4 SMs: unwalked at the module's limit, walking at 0);
# one group a program elsewhere
for bm in (8, 16):
    assert fp4moe.Nvfp4FusedMoe(w13, w2, 3, 2, "cpu", block_m=bm).walk2 == (1 if fp4moe.DOWN_WALK_MIN_WAVES else
                                                                            min(fp4moe.DOWN_WALK[bm], 3))
fp4moe.DOWN_WALK_MIN_WAVES = 0
for bm in (8, 16):
    assert fp4moe.Nvfp4FusedMoe(w13, w2, 3, 2, "cpu", block_m=bm).walk2 == min(fp4moe.DOWN_WALK[bm], 3)
for opt in ({"pair": "none"}, {"down_by_pair": True}, {"cast_epilogue": True}):
    assert fp4moe.Nvfp4FusedMoe(w13, w2, 3, 2, "cpu", **opt).walk2 == 1, opt
I_LONG = 64 * (fp4moe.DOWN_WALK_MAX_K_STEPS + 1)
w13 = [nv.quantize_nvfp4(torch.randn(2 * I_LONG, H2, generator=g) * 0.05) for _ in range(E)]
w2 = [nv.quantize_nvfp4(torch.randn(H2, I_LONG, generator=g) * 0.05) for _ in range(E)]
assert fp4moe.Nvfp4FusedMoe(w13, w2, 3, 2, "cpu", pair="down").walk2 == 1
print("ok")
''')


def test_down_walks_where_its_grid_is_more_than_the_sms_hold():
    """down_walk: DOWN_WALK (at most the groups there are) where K is short and the unwalked grid is more than
    `min_waves` times the programs the SMs hold at once (RESIDENT_WARPS_PAIR over the warps a program); GLM-5 TP8
    on an H200 (132 SMs): 48 tile groups of 4 warps, 7 programs an SM at 8 pairs a block."""
    held = fp4moe.RESIDENT_WARPS_PAIR[8] // 4 * 132
    assert held == 924
    walk = fp4moe.DOWN_WALK[8]
    assert fp4moe.down_walk(8, 48, 8, 4, 132, 4, min_waves=1) == 1  # 1 token: 384 programs
    assert fp4moe.down_walk(8, 48, 20, 4, 132, 4, min_waves=1) == walk  # 960 programs
    assert fp4moe.down_walk(8, 48, 8, 4, 132, 4, min_waves=0) == walk
    assert fp4moe.down_walk(8, 48, 300, 4, 132, fp4moe.DOWN_WALK_MAX_K_STEPS + 1, min_waves=0) == 1
    assert fp4moe.down_walk(16, 3, 300, 4, 132, 4, min_waves=0) == 3  # at most the groups there are
    assert fp4moe.down_walk(8, 48, 8, 4, 132, 4) == (1 if 384 <= fp4moe.DOWN_WALK_MIN_WAVES * held else walk)


def test_mismatched_weights_and_shapes_are_named():
    _interpret(r'''
from decode_gap.errors import DecodeGapError
try:
    fp4moe.Nvfp4FusedMoe(w13, w13, 2, 2, "cpu")
    raise SystemExit("no error")
except DecodeGapError as exc:
    assert "do not fit together" in str(exc)
moe = fp4moe.Nvfp4FusedMoe(w13, w2, 2, 2, "cpu")
try:
    moe(torch.zeros(3, H, dtype=torch.bfloat16), torch.zeros(3, 2, dtype=torch.int32), torch.ones(3, 2))
    raise SystemExit("no error")
except DecodeGapError as exc:
    assert "expected (2, 128)" in str(exc)
print("ok")
''')
