"""FP8 with 128x128 block scales above batch 1 (kernels/fp8block.py): the activation's 1x128 quantisation and the
scale layouts cuBLAS's blockwise GEMM reads. The GEMM itself needs sm90 (benchmarks/lowprec_device.py kernelchecks
runs it and the Triton quantisation on the H200); here the CPU answers that it cannot, and says why not, and the
quantisation kernel runs in Triton's CPU interpreter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decode_gap.errors import DecodeGapError
from decode_gap.kernels import fp8block as fb
from decode_gap.kernels import lowprec as lp
from decode_gap.kernels.nvfp4 import E4M3_SCALE_FLOOR


def test_act_quant_reference_is_amax_over_448_per_group_of_128():
    torch.manual_seed(0)
    x = torch.randn(3, 384) * torch.logspace(-3, 2, 384)
    x[1, 128:256] = 0.0  # an all-zero group: the floor scale, zeros out
    q, s = fb.quantize_act_reference(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 3)
    groups = x.reshape(3, 3, 128)
    assert torch.allclose(s[0], groups[0].abs().amax(-1) / 448.0)
    assert s[1, 1] == E4M3_SCALE_FLOOR and (q[1, 128:256].float() == 0).all()
    assert q.float().abs().max() <= 448.0
    back = q.float() * s.repeat_interleave(128, -1)
    assert ((back - x).norm() / x.norm()).item() < 0.05  # e4m3 keeps 3 mantissa bits


def test_act_quant_writes_into_the_outer_dim_major_scales_cublas_wants():
    x = torch.randn(2, 256)
    q = torch.zeros((4, 256), dtype=torch.float8_e4m3fn)
    s = torch.ones((2, 4)).t()  # [4 rows, 2 groups], stride (1, 4): rows 2 and 3 are padding
    fb.quantize_act(x, q, s)
    rq, rs = fb.quantize_act_reference(x)
    assert torch.equal(s[:2], rs) and (s[2:] == 1).all()
    assert torch.equal(q[:2].float(), rq.float()) and (q[2:].float() == 0).all()


def test_act_quant_kernel_gives_the_references_codes_bit_for_bit_in_the_interpreter():
    """The kernel's own FP8 cast (lowprec._to_fp8_rounded, which rounds to E4M3's grid first where the interpreter
    would truncate), normal and subnormal codes, an all-zero group and both signs of zero, fp32 and bf16 input."""
    code = r"""
import torch
from decode_gap.kernels import fp8block as fb
torch.manual_seed(0)
for dt in (torch.float32, torch.bfloat16):
    for lo, hi in ((-6, 0), (-2, 3)):
        x = (torch.randn(7, 1024) * torch.logspace(lo, hi, 1024)).to(dt)
        x[1, 128:256] = 0.0
        x[2, :4] = -0.0
        (q, s), (rq, rs) = fb.quantize_act(x), fb.quantize_act_reference(x)
        assert torch.equal(s, rs) and torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), (dt, lo)
print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_k_off_the_128_grid_is_one_clear_error():
    with pytest.raises(DecodeGapError, match="K=200 is not a multiple of 128"):
        fb.quantize_act_reference(torch.randn(1, 200))
    w = lp.quantize_fp8(torch.randn(128, 200), block=True)
    with pytest.raises(DecodeGapError, match="K=200"):
        fb.BlockScaledMm(w, 4, "cpu")
    with pytest.raises(DecodeGapError, match="128x128 block scales"):
        fb.BlockScaledMm(lp.quantize_fp8(torch.randn(128, 256)), 4, "cpu")


def test_weight_scales_are_transposed_with_k_blocks_padded_to_four_in_memory():
    w = lp.quantize_fp8(torch.randn(300, 640), block=True)  # 3 x 5 blocks
    sb = fb._weight_scales(w)
    assert sb.shape == (5, 3) and sb.stride() == (1, 8)  # the logical shape, a 16-byte leading dimension
    assert torch.equal(sb, w.scales.t())


def test_rows_are_padded_to_what_cublas_takes():
    w = lp.quantize_fp8(torch.randn(256, 512), block=True)
    for m, rows in ((1, 4), (2, 4), (4, 4), (5, 8), (16, 16)):
        mm = fb.BlockScaledMm(w, m, "cpu")
        assert mm.rows == rows and mm.sx.shape == (rows, 4) and mm.sx.stride() == (1, rows)


def test_the_cpu_has_no_blockwise_gemm():
    assert not fb.supported("cpu") and "CUDA GPU" in fb.why_not("cpu")


def test_kernel_level_says_what_fp8_block_runs_without_a_gpu():
    from decode_gap.simulate.formats import probe_formats

    info = probe_formats("fp8-block", "cpu", 8)
    assert not info["format_match"] and "no torch CPU kernel" in info["stand_in"]


def test_shapes_cublas_refused_are_clear_errors_and_per_tensor_linears():
    from decode_gap.simulate.layers import Linear

    with pytest.raises(DecodeGapError, match="K=640 is not a multiple of 512"):
        fb.BlockScaledMm(lp.quantize_fp8(torch.randn(128, 640), block=True), 4, "cpu")
    with pytest.raises(DecodeGapError, match="N=200 is not a multiple of 16"):
        fb.BlockScaledMm(lp.quantize_fp8(torch.randn(200, 512), block=True), 4, "cpu")
    for n, k in ((64, 200), (64, 640), (200, 512)):
        lin = Linear(n, k, "fp8-block-mm", "fp32", "cpu", m=8)
        assert lin.kind == "fp8" and lin.w.shape == (n, k)
