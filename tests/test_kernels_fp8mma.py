"""The fp8 weight-only tensor-core GEMV (kernels/fp8mma.py): the repacked layout round-trips, and in Triton's CPU
interpreter (a subprocess: the interpreter is chosen when Triton is imported) the call matches dequantise-then-matmul
with per-tensor and 128x128 block scales, one warp a tile (M <= 8) and two (M = 9-16), K split and not, a row count that
is not whole tiles, and leaves the split sums at zero for the next call. The H200 runs the same checks compiled
(benchmarks/device/fp8mma_probe.py)."""

import sys
from pathlib import Path

import pytest
import torch

from decode_gap.errors import DecodeGapError
from decode_gap.kernels import fp8mma
from decode_gap.kernels import lowprec as lp

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).parent))
from interpreted import run_interpreted  # noqa: E402


def test_repack_puts_a_lanes_pairs_of_rows_g_and_g8_together_and_unpacks_exactly():
    data = (torch.randn(40, 256) * 50).to(torch.float8_e4m3fn)
    words = fp8mma.repack(data)
    assert words.shape == (3, 8, 32, 4) and words.dtype == torch.int32  # 40 rows -> 3 tiles of 16, K/32 steps
    assert torch.equal(fp8mma.unpack(words, 40).view(torch.uint8), data.view(torch.uint8))
    b = words.view(torch.uint8).view(3, 8, 32, 16)
    raw = data.view(torch.uint8)
    # lane 4g+q of step s, tile 0: word j holds (row g: K 8q+2j, +1), then (row g+8: the same K values)
    g, q, s, j = 3, 2, 1, 2
    k = 32 * s + 8 * q + 2 * j
    assert b[0, s, 4 * g + q, 4 * j:4 * j + 4].tolist() == [raw[g, k], raw[g, k + 1], raw[g + 8, k],
                                                            raw[g + 8, k + 1]]
    assert fp8mma.unpack(words, 48)[40:].float().abs().sum() == 0  # rows past N are zeros
    experts = torch.stack([data, data.flip(0)])
    stacked = fp8mma.repack_experts(experts)
    assert stacked.shape == (2, 3, 8, 32, 4) and torch.equal(stacked[0], words)
    assert torch.equal(fp8mma.unpack(stacked[1], 40).view(torch.uint8), data.flip(0).view(torch.uint8))


def test_bad_shapes_and_inputs_are_refused_in_one_line():
    w = lp.quantize_fp8(torch.randn(64, 256), block=True)
    with pytest.raises(DecodeGapError, match="1 <= M <= 16"):
        fp8mma.Fp8MmaGemv(w, 17, "cpu")
    with pytest.raises(DecodeGapError, match="multiple of 128"):
        fp8mma.Fp8MmaGemv(lp.quantize_fp8(torch.randn(64, 192)), 1, "cpu")
    g = fp8mma.Fp8MmaGemv(w, 2, "cpu")
    with pytest.raises(DecodeGapError, match="row-major bf16"):
        g(torch.randn(2, 256))
    assert not fp8mma.available("cpu", 192) and fp8mma.available("cpu", 256) == lp.HAVE_TRITON


def test_above_8_rows_two_warps_share_a_tile_and_x_is_clamped_where_the_h200_measured_it_faster():
    w = lp.quantize_fp8(torch.randn(200, 256), block=True)  # 13 tiles of 16 rows
    wide, narrow = fp8mma.Fp8MmaGemv(w, 16, "cpu"), fp8mma.Fp8MmaGemv(w, 8, "cpu")
    assert wide.xwarp and wide.grid[0] == 7 and not narrow.xwarp and narrow.grid[0] == 4  # 4 warps a program
    assert [fp8mma.x_clamped(True, m) for m in (1, 2, 4, 8, 9, 11, 12, 16)] == [True, False, False, False, True,
                                                                                True, False, False]
    assert all(fp8mma.x_clamped(False, m) for m in range(1, 17))
    assert fp8mma.Fp8MmaGemv(w, 9, "cpu").xclamp and not fp8mma.Fp8MmaGemv(w, 9, "cpu", xclamp=False).xclamp
    with pytest.raises(DecodeGapError, match="warps must be even"):
        fp8mma.Fp8MmaGemv(w, 9, "cpu", warps=3)


def test_gemv_matches_dequantise_then_matmul_in_the_interpreter():
    run_interpreted(r'''
import torch
from decode_gap.kernels import fp8mma, lowprec as lp
g = torch.Generator().manual_seed(0)
for block in (False, True):
    for n, k, m, split in ((200, 512, 3, None), (200, 512, 3, 1), (128, 256, 16, None), (48, 384, 9, 1),
                           (64, 384, 1, None)):
        w = lp.quantize_fp8(torch.randn(n, k, generator=g) * 0.02, block=block)
        mm = fp8mma.Fp8MmaGemv(w, m, "cpu", split=split)
        assert (mm.split > 1) == (split is None), (n, k, mm.split)  # the plan splits K on the CPU's 4 "SMs"
        assert mm.kernels == (2 if mm.split > 1 else 1)
        for _ in range(2):  # a second call on the sums the first left
            x = torch.randn(m, k, generator=g).to(torch.bfloat16)
            y, ref = mm(x).float(), x.float() @ lp.dequantize_fp8(w).t()
            err = ((y - ref).abs().max() / ref.abs().max()).item()
            assert err < 1e-2, (block, n, k, m, split, err)
            assert torch.allclose(mm.reference(x), ref)
            if mm.acc is not None:
                assert mm.acc.abs().max().item() == 0.0
        assert "weight-only" in mm.label and ("block" in mm.label) == block
print("ok")
''')


def test_grouped_experts_match_the_dequantised_reference_in_the_interpreter():
    run_interpreted(r'''
import torch
from decode_gap.errors import DecodeGapError
from decode_gap.kernels import fp8mma, lowprec as lp, nvfp4 as nv
g = torch.Generator().manual_seed(1)
e, h, i = 4, 256, 128
for block in (False, True):
    w13 = lp.quantize_fp8(torch.randn(e, 2 * i, h, generator=g) * 0.02, block=block)
    w2 = lp.quantize_fp8(torch.randn(e, h, i, generator=g) * 0.02, block=block)
    ids, rw = torch.tensor([2, 0, 3], dtype=torch.int32), torch.tensor([0.5, 0.3, 0.2])
    mm = fp8mma.GroupedFp8Mma(w13, w2, ids, rw, "cpu")
    assert mm.kernels == 4 and mm.slots == 3 and ("block" in mm.label) == block
    assert mm.weight_bytes() == 3 * (lp.fp8_bytes(2 * i, h, block) + lp.fp8_bytes(h, i, block))
    for step in range(2):  # a second call (another choice copied in) on the buffers the first left at zero
        if step:
            mm.ids.copy_(torch.tensor([1, 1, 2], dtype=torch.int32))
            mm.rw.copy_(torch.tensor([0.6, 0.1, 0.3]))
        x = torch.randn(1, h, generator=g).to(torch.bfloat16)
        y = mm(x).float()
        ref = lp.reference_experts(x, lp.dequantize_fp8(w13), lp.dequantize_fp8(w2), mm.ids, mm.rw)
        err = nv.relative_error(y, ref)
        assert err < 1e-2, (block, step, err)  # bf16 activation and output, as GroupedExperts' check
        assert mm.acc.abs().max().item() == 0.0 and mm.gu.abs().max().item() == 0.0
try:
    fp8mma.GroupedFp8Mma(w13, lp.quantize_fp8(torch.randn(e, h, 2 * i), block=True), ids, rw, "cpu")
    raise SystemExit("a w2 that does not fit w13 was accepted")
except DecodeGapError as exc:
    assert "do not fit" in str(exc), exc
print("ok")
''')
