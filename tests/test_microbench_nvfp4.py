"""NVFP4 packing, rounding and dequantisation against independent references (CPU)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decode_gap.errors import DecodeGapError
from decode_gap.kernels import nvfp4 as nv

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
REPO = Path(__file__).resolve().parents[1]


def brute_code(v: float) -> int:
    """Nearest E2M1 code by exhaustive search; ties go to the even code (mantissa bit 0); saturates at 6."""
    a = min(abs(v), 6.0)
    dist = [abs(a - g) for g in GRID]
    best = min(dist)
    cands = [i for i, d in enumerate(dist) if d == best]
    idx = next((i for i in cands if i % 2 == 0), cands[0])
    return idx | (8 if v < 0 and idx > 0 else 0)


def test_one_e4m3_scale_for_tensors_rows_and_groups_and_the_kernels_take_the_same_numbers():
    assert torch.equal(nv.e4m3_scale(torch.tensor([0.0, 448.0, 896.0])), torch.tensor([nv.E4M3_SCALE_FLOOR, 1.0, 2.0]))
    codes, scale = nv.quantize_e4m3_groups(torch.tensor([[0.0, 0.0], [-896.0, 448.0]]))
    assert torch.equal(scale, torch.tensor([nv.E4M3_SCALE_FLOOR, 2.0]))
    assert codes.float().tolist() == [[0, 0], [-448, 224]]
    # without a clamp, every row's largest code is 448 from 1e-30 to 1e30 (the scale's fp32 roundings stay inside)
    rows = torch.randn(4096, 128, generator=torch.Generator().manual_seed(0)) * torch.logspace(-30, 30, 4096)[:, None]
    top = nv.quantize_e4m3_groups(rows)[0].float().abs().amax(-1)
    above_floor = rows.abs().amax(-1) > nv.E4M3_MAX * nv.E4M3_SCALE_FLOOR
    assert above_floor.sum() > 2000 and bool((top[above_floor] == nv.E4M3_MAX).all())
    if nv.HAVE_TRITON:  # its literals (Triton takes no global float in a kernel) are the constants'
        assert f"amax / {nv.E4M3_MAX!r}, {nv.E4M3_SCALE_FLOOR!r}" in nv.e4m3_scale_tl.src


def test_round_to_e2m1_matches_brute_force_and_ties_to_even():
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    vals = ties + [-t for t in ties] + [0.0, 6.0, 7.0, 100.0, -6.5, 0.1, 0.3, -2.6, 4.9, 5.1, 1e-9]
    vals += torch.empty(2000).uniform_(-7, 7, generator=torch.Generator().manual_seed(0)).tolist()
    got = nv.round_to_e2m1(torch.tensor(vals)).tolist()
    want = [brute_code(v) for v in vals]
    assert got == want
    # explicit expectations for every midpoint: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4
    assert nv.e2m1_to_float(nv.round_to_e2m1(torch.tensor(ties))).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert nv.e2m1_to_float(nv.round_to_e2m1(torch.tensor([7.0, -9.0]))).tolist() == [6.0, -6.0]


def test_codes_decode_to_the_e2m1_grid():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = nv.e2m1_to_float(codes).tolist()
    assert vals[:8] == GRID
    assert vals[8:] == [-g for g in GRID]


def test_pack_puts_even_elements_in_the_low_nibble_and_round_trips():
    codes = torch.tensor([[1, 2, 15, 8, 7, 0]], dtype=torch.uint8)
    packed = nv.pack_e2m1(codes)
    assert packed.tolist() == [[0x21, 0x8F, 0x07]]
    assert torch.equal(nv.unpack_e2m1(packed), codes)
    rnd = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    assert torch.equal(nv.unpack_e2m1(nv.pack_e2m1(rnd)), rnd)
    with pytest.raises(DecodeGapError):
        nv.pack_e2m1(torch.zeros(3, dtype=torch.uint8))


def reference_quant_dequant(w: torch.Tensor) -> torch.Tensor:
    """Independent per-block loop: NVIDIA's two-level recipe written out element by element."""
    n, k = w.shape
    amax = w.abs().max().item()
    ts = amax / (448.0 * 6.0) if amax > 0 else 1.0
    out = torch.zeros(n, k, dtype=torch.float64)
    for r in range(n):
        for b in range(k // 16):
            blk = w[r, b * 16:(b + 1) * 16].double()
            bs = torch.tensor(min(blk.abs().max().item() / 6.0 / ts, 448.0)).float().to(torch.float8_e4m3fn).double().item()
            eff = bs * torch.tensor(ts, dtype=torch.float32).double().item()
            for j in range(16):
                v = blk[j].item() / eff if eff > 0 else 0.0
                c = brute_code(v)
                out[r, b * 16 + j] = GRID[c & 7] * (-1 if c & 8 else 1) * eff
    return out


def test_quantize_dequantize_matches_reference_and_bounds_error():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 64, generator=g) * 3
    w[2, 16:32] = 0.0  # an all-zero block: scale 0, values 0
    q = nv.quantize_nvfp4(w)
    assert q.packed.shape == (6, 32) and q.packed.dtype == torch.uint8
    assert q.block_scales.shape == (6, 4) and q.block_scales.dtype == torch.float8_e4m3fn
    deq = nv.dequantize_nvfp4(q)
    ref = reference_quant_dequant(w)
    assert torch.allclose(deq.double(), ref, rtol=1e-6, atol=1e-7)
    assert torch.all(deq[2, 16:32] == 0)
    assert q.tensor_scale.item() == pytest.approx(w.abs().max().item() / (448 * 6), rel=1e-6)
    # the per-block error is at most half a grid step at the top of the grid (1.0) times the block scale
    eff = (q.block_scales.float() * q.tensor_scale).repeat_interleave(16, dim=1)
    assert torch.all((deq - w).abs() <= eff * 1.0 + 1e-6)
    assert nv.nvfp4_bytes(6, 64) == 6 * 32 + 6 * 4 + 4 == q.nbytes


def test_quantize_rejects_k_not_multiple_of_16():
    with pytest.raises(DecodeGapError, match="multiple of the 16"):
        nv.quantize_nvfp4(torch.randn(4, 24))


def test_reference_mm_and_blocked_scale_layout():
    w = torch.randn(32, 48)
    q = nv.quantize_nvfp4(w)
    x = torch.randn(3, 48)
    assert torch.allclose(nv.reference_mm(x, q), x @ nv.dequantize_nvfp4(q).t())
    s = torch.arange(130 * 5, dtype=torch.float32).reshape(130, 5)
    blocked = nv.to_blocked(s)
    assert blocked.numel() == 256 * 8  # padded to 128-row, 4-column tiles
    # the first 32x16 tile holds rows 0,32,64,96 interleaved: element (r, c) lands at r%32*16 + (r//32)*4 + c
    assert blocked[0].item() == s[0, 0].item() and blocked[1].item() == s[0, 1].item()
    assert blocked[4].item() == s[32, 0].item() and blocked[16].item() == s[1, 0].item()


def test_plan_launch_fills_the_gpu_and_covers_k():
    p = nv.plan_launch(1, 256, 6144, sm_count=132)
    assert (p.block_m, p.use_dot) == (1, False)
    assert p.split_k > 1 and p.k_per_split % p.block_k == 0 and p.k_per_split * p.split_k >= 6144
    assert p.grid(1, 256)[0] * p.split_k >= 8
    big = nv.plan_launch(1, 18432, 7168, sm_count=132)
    assert big.split_k == 1
    p64 = nv.plan_launch(64, 4096, 7168, sm_count=132)
    assert p64.use_dot and p64.block_m == 64
    with pytest.raises(DecodeGapError):
        nv.plan_launch(1, 16, 40, 132)


@pytest.mark.skipif(not nv.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_triton_weight_only_kernel_in_the_interpreter():
    """Runs the real Triton kernel (both variants, FMA and dot paths, split-K, ragged N and K) under
    TRITON_INTERPRET=1, against the dequantise-then-matmul reference. The bf16 dot runs with fp32 operands
    there (the interpreter mishandles bf16 dots); the GPU run checks the bf16 path."""
    code = r'''
import torch
from decode_gap.kernels import nvfp4 as nv
torch.manual_seed(0)
worst = 0.0
for variant in ("v1", "v2"):
    for (m, n, k) in [(1, 48, 96), (3, 40, 64), (20, 72, 160), (1, 64, 640)]:
        q = nv.quantize_nvfp4(torch.randn(n, k))
        x = torch.randn(m, k).to(torch.bfloat16)
        g = nv.WeightOnlyGemm(q, m, "cpu", plan=nv.plan_launch(m, n, k, 4), out_dtype=torch.float32, variant=variant)
        g.out.fill_(float("nan"))
        err = nv.relative_error(g(x), nv.reference_mm(x, q))
        assert err < 1e-5, (variant, m, n, k, err)
        worst = max(worst, err)
print("ok", worst)
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ok")
