"""kernels/fp4wide: the NVFP4 weight-only GEMM above 16 rows (32 rows of x a pass on tensor cores). The interpreter
test runs the real Triton kernel (its plain-Triton stand-in for the asm, on the same repacked layout) against
dequantise-then-matmul; the sm_90 compile is in test_kernels_compile.py, the GPU's own check and times in
benchmarks/device/wide_probe.py and the gemm stage's checks."""

import pytest
import torch

from decode_gap.errors import DecodeGapError
from decode_gap.kernels import fp4wide
from decode_gap.kernels import lowprec as lp
from decode_gap.kernels import nvfp4 as nv
from decode_gap.microbench import gemm

from interpreted import run_interpreted

needs_triton = pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (its CPU interpreter runs it)")


@needs_triton
def test_wide_gemm_matches_the_reference_in_the_interpreter():
    """One chunk with padded rows (M=17), two chunks (M=40, the second partial), N not whole 16-row tiles, a K split
    (fp32 sums, then the cast that leaves them at zero: a second call gives the same), and the weight-only GEMM's
    automatic choice above 16 rows."""
    run_interpreted(r'''
import torch
from decode_gap.kernels import fp4wide, nvfp4 as nv
torch.manual_seed(0)
worst = 0.0
for m, n, k, split in [(17, 40, 128, None), (40, 32, 256, None), (20, 16, 512, 2)]:
    q = nv.quantize_nvfp4(torch.randn(n, k))
    x = torch.randn(m, k).to(torch.bfloat16)
    g = fp4wide.Nvfp4WideGemm(q, m, "cpu", out_dtype=torch.float32, split=split)
    assert g.chunks == -(-m // 32) and g.grid[0] == -(-n // 64) * g.chunks, (g.chunks, g.grid)
    assert (g.split > 1) == (g.acc is not None)
    ref = nv.reference_mm(x, q)
    for _ in range(2):
        g.out.fill_(float("nan"))
        err = nv.relative_error(g(x), ref)
        assert err < 1e-5, (m, n, k, split, err)
        worst = max(worst, err)
    if g.acc is not None:
        assert float(g.acc.abs().max()) == 0.0
auto = nv.WeightOnlyGemm(nv.quantize_nvfp4(torch.randn(24, 128)), 20, "cpu", out_dtype=torch.float32)
x = torch.randn(20, 128).to(torch.bfloat16)
assert nv.relative_error(auto(x), nv.reference_mm(x, auto.q)) < 1e-5 and auto.variant == "wide", auto.variant
# the gemm stage's check of a winning wide form (the worst of its calls)
from decode_gap.microbench import gemm
from decode_gap.microbench.common import BenchEnv
row = gemm.check_variant(BenchEnv(device=torch.device("cpu")), gemm.Backend(gemm.NVFP4, nv.WeightOnlyGemm.label),
                         f"{gemm.FP4_WIDE} {fp4wide.WIDE_DEFAULT.name}", 20, 32, 256)
assert row["pass"] and row["rel_err"] < 1e-2, row  # bf16 output against fp32
print("ok", worst)
''')


def test_where_the_wide_form_runs():
    assert not fp4wide.fits(16, 128, "cpu")  # lowprec's GEMV up to 16 rows
    assert not fp4wide.fits(32, 96, "cpu")  # K not whole 64-value steps
    assert not fp4wide.fits(32, 576, "cpu")  # nor whole iterations of 2 steps (the weight-only GEMM's v1 runs it)
    assert fp4wide.fits(32, 128, "cpu") == (lp.HAVE_TRITON and lp.interpreted())


@needs_triton
def test_wide_plan_counts_every_chunk_and_refuses_bad_shapes():
    q = nv.quantize_nvfp4(torch.randn(64, 1024))
    one, two = fp4wide.Nvfp4WideGemm(q, 32, "cpu"), fp4wide.Nvfp4WideGemm(q, 64, "cpu")
    # 4 tiles, 16 steps, 4 SMs (the CPU's stand-in) at about 27 warps an SM: a second chunk is more warps, so fewer
    # K splits for it
    assert (one.chunks, two.chunks) == (1, 2) and one.split >= two.split > 1
    assert one.label.startswith("triton nvfp4 wide gemm (mma, 32 rows a pass") and one.kernels == 2
    with pytest.raises(DecodeGapError, match="K a multiple"):
        fp4wide.Nvfp4WideGemm(nv.quantize_nvfp4(torch.randn(16, 96)), 32, "cpu")
    with pytest.raises(DecodeGapError, match="expected"):
        one(torch.zeros(31, 1024, dtype=torch.bfloat16))


@needs_triton
def test_the_gemm_stage_names_and_builds_the_wide_forms():
    for cfg in fp4wide.WIDE_CONFIGS:
        name = f"{gemm.FP4_WIDE} {cfg.name}"
        assert gemm.variant_config(name) == cfg
        q = nv.quantize_nvfp4(torch.randn(32, 256))
        assert isinstance(gemm.fp4_gemv(name, q, 48, "cpu"), fp4wide.Nvfp4WideGemm)
    # a GEMV name still builds the GEMV
    gemv = f"{gemm.FP4_GEMV} {lp.FP4_MMA_DEFAULT.name}"
    assert isinstance(gemm.fp4_gemv(gemv, nv.quantize_nvfp4(torch.randn(32, 256)), 8, "cpu"), lp.Nvfp4Gemv)


@needs_triton
def test_a_short_k_takes_no_split_and_so_no_cast_kernel():
    """Where K is one or two iterations the K split's cast kernel costs more than the split gains (H200: 6144x256 at
    M=32 3.1 us unsplit against 4.8): config_for takes no split up to SHORT_K, the default above."""
    assert fp4wide.config_for(256) == fp4wide.config_for(fp4wide.SHORT_K) == fp4wide.WIDE_NO_SPLIT
    assert fp4wide.config_for(fp4wide.SHORT_K + 64) == fp4wide.WIDE_DEFAULT
    short = fp4wide.Nvfp4WideGemm(nv.quantize_nvfp4(torch.randn(64, 512)), 32, "cpu")
    assert (short.split, short.acc, short.kernels) == (1, None, 1)
    assert fp4wide.WIDE_NO_SPLIT in fp4wide.WIDE_CONFIGS  # the gemm stage times it beside the split forms
