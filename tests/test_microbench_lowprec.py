"""Low-precision Triton GEMVs (lowprec.py) against dequantise-then-matmul, in Triton's CPU interpreter
(TRITON_INTERPRET=1); benchmarks/lowprec_device.py checks them again on the GPU."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from decode_gap.kernels import lowprec as lp
from decode_gap.kernels import nvfp4 as nv

REPO = Path(__file__).resolve().parents[1]


def _assert_refused(n: int, k: int, m: int, bad_forms) -> None:
    """Each form is refused at construction, in one line that names it (no kernel runs, so no interpreter)."""
    q = nv.quantize_nvfp4(torch.randn(n, k))
    for bad in bad_forms:
        with pytest.raises(lp.DecodeGapError) as exc:
            lp.Nvfp4Gemv(q, m, "cpu", cfg=bad)
        assert "\n" not in str(exc.value) and bad.name in str(exc.value), bad


def _interpret(code: str, *args: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_shared_x_chunk_gives_every_warp_its_b_fragments(tmp_path):
    """x shared a program (xshare): _x_frags turns a step's [16, 32]-word chunk into what _fp4_mma_xload gives each
    lane 4g+q of every warp: words 8q..8q+3 (xa) and 8q+4..8q+7 (xc) of row g, the same of row g + 8 (xa2, xc2).
    The interpreter runs this layout arithmetic; the MMA that consumes it needs a GPU (lowprec_device.py checks)."""
    script = tmp_path / "xfrags.py"
    script.write_text('''
import torch, triton, triton.language as tl
from decode_gap.kernels import lowprec as lp

@triton.jit
def frags(x_ptr, out_ptr, WARPS: tl.constexpr):
    chunk = tl.load(x_ptr + tl.arange(0, 16)[:, None] * 32 + tl.arange(0, 32)[None, :])
    xa, xc, xa2, xc2 = lp._x_frags(chunk, WARPS)
    o = out_ptr + tl.arange(0, 32 * WARPS)[:, None] * 16 + tl.arange(0, 4)[None, :]
    tl.store(o, xa)
    tl.store(o + 4, xc)
    tl.store(o + 8, xa2)
    tl.store(o + 12, xc2)

x = torch.arange(16 * 32, dtype=torch.int32).reshape(16, 32)
out = torch.empty((128, 16), dtype=torch.int32)
frags[(1,)](x, out, WARPS=4)
for t in range(128):
    g, q = t % 32 // 4, t % 4
    want = torch.cat([x[g, 8 * q:8 * q + 8], x[8 + g, 8 * q:8 * q + 8]])
    assert torch.equal(out[t], want), (t, out[t], want)
print("ok")
''')
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_x_ring_is_a_form_of_shared_x_in_four_warp_programs():
    """x through a ring of cp.async copies (xring) replaces xshare's layout conversion: refused without shared x, in
    programs other than 4 warps (one 16-byte copy a thread covers a step's 16 rows) or at other depths than 2 or 3."""
    _assert_refused(64, 512, 16, (replace(lp.FP4_MMA_XJ, xring=2), replace(lp.FP4_MMA_XS, xring=4),
                                  replace(lp.FP4_MMA_XS, xring=2, warps=8, block_n=128)))
    ringed = lp.FP4_MMA_XRING + tuple(c for c in lp.FP4_STAGE_CONFIGS_M if c.xring)
    assert all(c.xring in (2, 3) and c.xshare and c.warps == 4 for c in ringed)
    assert {c.stream for c in lp.FP4_STAGE_CONFIGS_M if c.xring} == {False, True}  # the stage times split and stream-K
    assert lp.FP4_MMA_XRING[0].name.endswith(",xs,xr=2")
    if lp.HAVE_TRITON:  # the constexprs the launcher passes: none without a ring, the asm with one
        assert lp.xring_constexprs(0, 2) == {"XR": 0}
        assert lp.xring_constexprs(3, 2)["XR"] == 3 and "wait_group 1" in str(lp.xring_constexprs(3, 2)["XR_WAIT"])


def test_tensor_core_layout_gives_each_lane_its_fragments():
    """repack_mma: lane 4g+q of tile T at step i holds group 4i+q of rows 16T+g then 16T+8+g; scales likewise."""
    q = nv.quantize_nvfp4(torch.randn(40, 256))
    words, scales = lp.repack_mma(q)
    assert words.shape == (3, 4, 32, 4) and scales.shape == (3, 4, 32)
    packed = torch.cat([q.packed, q.packed.new_zeros(8, 128)])  # rows padded to whole 16-row tiles
    sc = torch.cat([q.block_scales.view(torch.uint8), torch.zeros(8, 16, dtype=torch.uint8)])
    for t, i, g, qq in ((0, 0, 0, 0), (1, 2, 5, 3), (2, 3, 7, 1)):
        grp = 4 * i + qq
        lane = lp.mma_nibbles(words[t, i, 4 * g + qq]).view(torch.uint8)
        assert torch.equal(lane[:8], packed[16 * t + g, 8 * grp:8 * grp + 8])
        assert torch.equal(lane[8:], packed[16 * t + 8 + g, 8 * grp:8 * grp + 8])
        s2 = scales[t, i, 4 * g + qq].view(1).view(torch.uint8)
        assert s2.tolist() == [sc[16 * t + g, grp].item(), sc[16 * t + 8 + g, grp].item()]


def test_tensor_core_bit_layout_decodes_each_plane_with_its_shifts():
    """mma_bit_layout moves bits within each 16-bit half only (mma_nibbles undoes it), and plane j decoded as the asm
    does (shift by 9 - MMA_MAG_BITS[j] and 15 - MMA_SIGN_BITS[j], mask) equals the nibble-order decode."""
    w = torch.randint(-2**31, 2**31 - 1, (4096,), dtype=torch.int64).to(torch.int32)
    moved = lp.mma_bit_layout(w)
    assert torch.equal(lp.mma_nibbles(moved), w)
    v0, v1 = (t.to(torch.int64) & 0xFFFFFFFF for t in (w, moved))
    for j in range(4):
        t = (v0 << (4 * j)) & 0xFFFFFFFF
        want = ((t >> 3) & 0x0E000E00) | (t & 0x80008000)
        mag = ((v1 << (9 - lp.MMA_MAG_BITS[j])) & 0xFFFFFFFF) & 0x0E000E00
        sign = ((v1 << (15 - lp.MMA_SIGN_BITS[j])) & 0xFFFFFFFF) & 0x80008000
        assert torch.equal(mag | sign, want), j


_PTX_OPS = {"and.b32": int.__and__, "or.b32": int.__or__, "shl.b32": int.__lshift__, "shr.b32": int.__rshift__,
            "mul.lo.u32": int.__mul__}


def _run_decode_ptx(lines: list[str], word: int) -> int:
    """The decode's PTX (the five b32 / u32 operations decode_plane_ptx emits) on one word; returns register h."""
    regs = {"$w": word}
    for line in lines:
        op, rest = line.rstrip(";").split(" ", 1)
        dst, a, b = (v.strip() for v in rest.split(","))
        a, b = (int(v, 0) if v[0].isdigit() else regs[v] for v in (a, b))
        regs[dst] = _PTX_OPS[op](a, b) & 0xFFFFFFFF
    return regs["h"]


@pytest.mark.parametrize("bx", [False, True])
@pytest.mark.parametrize("imad", [False, True])
def test_decode_ptx_of_every_plane_gives_its_two_values_sign_and_e1_e0_m_in_place(bx, imad):
    """The asm's decode of plane j (decode_plane_ptx, with the multiply or with two shifts) leaves, in each half of h,
    exactly the plane's sign at bit 15 and its e1 e0 m where fp16 (11-9) or bf16 (8-6) wants them, on random words and
    on every code in every plane; the multiply form is used for the planes it is carry-free for."""
    top = 6 if bx else 9
    mags = lp.BX_MAG_BITS if bx else lp.MMA_MAG_BITS
    # random words, and code c in every nibble (c = 0..15) put through the bit layout
    every_code = torch.tensor([sum(c << (4 * p) for p in range(8)) for c in range(16)]).to(torch.int32)
    words = torch.randint(0, 2**32, (2000,), dtype=torch.int64).tolist()
    words += [w & 0xFFFFFFFF for w in lp.mma_bit_layout(every_code, bx=bx).tolist()]
    for j in range(4):
        lines = lp.decode_plane_ptx(j, "$w", bx, imad=imad)
        assert any("mul.lo" in line for line in lines) == (imad and (j == 2 if bx else j >= 2))
        for w in words:
            want = 0
            for half in (0, 16):
                mag = (w >> (half + mags[j])) & 7
                sign = (w >> (half + lp.MMA_SIGN_BITS[j])) & 1
                want |= (mag << (half + top)) | (sign << (half + 15))
            assert _run_decode_ptx(lines, w) == want, (j, hex(w))


def test_tensor_core_split_aims_at_warps_per_sm():
    assert lp.mma_split(n_tiles=8016, k_blocks=32, warps_per_sm=18, sms=132) == 1  # lm_head: no split
    assert lp.mma_split(n_tiles=1792, k_blocks=32, warps_per_sm=27, sms=132) == 2  # gate_up
    assert lp.mma_split(n_tiles=448, k_blocks=144, warps_per_sm=27, sms=132) == 8  # 7168 x 18432
    assert lp.mma_split(n_tiles=1, k_blocks=3, warps_per_sm=27, sms=132) == 3  # never more than the K blocks


def test_grouped_gate_up_split_counts_every_slots_tiles_as_the_h200_plans_it():
    """The grouped NVFP4 form's gate_up K split (FP4_GROUPED_MMA_13, about 27 warps an SM on 132 SMs, 8 experts):
    2 at TP1 (I = 2048), as the fixed split it replaced, 12-14 at TP8 (I = 256, where 2 left 4 warps an SM); down keeps
    its unsplit plan. The plan needs only the slot count and the SM count, so no weights are built."""
    g = object.__new__(lp.GroupedExperts)
    g.slots, g.sms = 8, 132
    c13, c2 = lp.FP4_GROUPED_BX_13, lp.FP4_GROUPED_BX_2
    assert g._mma_plan(c13, 7168, 2 * 2048)[2] == 2  # DeepSeek-V3 TP1
    assert g._mma_plan(c13, 7168, 2 * 256)[2] == 14  # DeepSeek-V3 TP8
    assert g._mma_plan(c13, 6144, 2 * 256)[2] == 12  # GLM-5 TP8: 14 asked, 12 whole-block splits of 48 blocks
    assert g._mma_plan(c2, 256, 7168)[2] == 1 and g._mma_plan(c2, 2048, 6144)[2] == 1
    assert g._mma_plan(replace(c13, split=3), 7168, 512)[2] == 3  # a config's own split still rules


def test_split_plan_fills_the_gpu_only_when_n_is_narrow():
    assert lp.split_for(n_tiles=2000, slots=1, k_blocks=8, sms=132) == 1
    s = lp.split_for(n_tiles=36, slots=1, k_blocks=14, sms=132)
    assert 1 < s <= 14
    per, split, even = lp._k_plan(896, 128, 3)
    assert per % 128 == 0 and per * split >= 896 and (split - 1) * per < 896 and even
    assert lp._k_plan(100, 64, 1) == (128, 1, False)


def test_fp8_quantisation_round_trips_within_e4m3_precision():
    w = torch.randn(300, 260)
    for block in (False, True):
        f = lp.quantize_fp8(w, block)
        assert f.scales.shape == ((3, 3) if block else ())
        assert nv.relative_error(lp.dequantize_fp8(f), w) < 0.04
    assert lp.fp8_bytes(256, 512, True) == 256 * 512 + 4 * 2 * 4


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_nvfp4_gemvs_match_the_reference_in_the_interpreter():
    """The word decode (fp16 bit placement), the planes, the per-word scales, split-K atomics, ragged N and K; the
    tensor-core form's repacked layout, its x rows in passes of 8 (its mma.sync asm needs a GPU: lowprec_device.py)."""
    out = _interpret(r'''
import torch
from decode_gap.kernels import nvfp4 as nv, lowprec as lp
torch.manual_seed(0)
G = lp.GemvConfig
cases = [(1, 48, 256, G(16, 128), None), (1, 40, 96, G(16, 64), 1), (1, 64, 512, G(16, 128), 4),
         (1, 48, 256, G(16, 64, grouped=True), None), (1, 40, 96, G(16, 64, grouped=True), 1),
         (1, 64, 512, G(32, 128, grouped=True), 3),
         # the f16x2 asm form (its decode emulated in plain Triton here)
         (1, 48, 256, G(16, 64, asm=True), None), (1, 40, 96, G(16, 64, asm=True), 1),
         (1, 64, 512, G(16, 128, asm=True), 1), (1, 40, 512, G(16, 64, asm=True), 3),
         # the tensor-core form: ragged N (tiles of 16 rows), split-K, M in passes of 8 rows
         (1, 48, 256, G(64, 128, 4, mma=True), None), (3, 40, 128, G(32, 64, 2, mma=True), None),
         (12, 33, 256, G(64, 128, 4, mma=True), 2), (1, 100, 512, G(32, 128, 2, mma=True), 3),
         (1, 80, 512, lp.FP4_MMA_WIDE, None)]
for m, n, k, cfg, split in cases:
    q = nv.quantize_nvfp4(torch.randn(n, k) * 3)
    x = torch.randn(m, k).to(torch.bfloat16)
    g = lp.Nvfp4Gemv(q, m, "cpu", cfg=cfg, out_dtype=torch.float32, split=split)
    g.out.fill_(float("nan"))  # every element must be written
    err = nv.relative_error(g(x), nv.reference_mm(x, q))
    assert err < (2e-3 if cfg.asm or cfg.mma else 1e-5), (m, n, k, cfg, split, err)  # asm, mma: x rounded to fp16
# every E2M1 code and both nibbles: W = one row per code pair, x = ones
codes = torch.arange(256, dtype=torch.int32)
q = nv.NVFP4Tensor(torch.stack([codes.to(torch.uint8)] * 8, 1).reshape(256, 8), torch.ones(256, 1).to(torch.float8_e4m3fn),
                   torch.tensor(1.0), (256, 16))
x = torch.ones(1, 16).to(torch.bfloat16)
for cfg in (lp.GemvConfig(16, 16), lp.GemvConfig(16, 16, grouped=True), lp.GemvConfig(16, 16, asm=True)):
    got = lp.Nvfp4Gemv(q, 1, "cpu", cfg=cfg, out_dtype=torch.float32)(x)
    assert torch.equal(got, nv.reference_mm(x, q)), (got, nv.reference_mm(x, q))
q64 = nv.NVFP4Tensor(q.packed.repeat(1, 4), torch.ones(256, 4).to(torch.float8_e4m3fn), torch.tensor(1.0), (256, 64))
x64 = torch.ones(2, 64).to(torch.bfloat16)
got = lp.Nvfp4Gemv(q64, 2, "cpu", cfg=lp.GemvConfig(64, 64, 4, mma=True), out_dtype=torch.float32)(x64)
assert torch.equal(got, nv.reference_mm(x64, q64))
# the weight-only class routes M <= 16 to the GEMVs: tensor cores when K % 64 == 0, the CUDA-core form at M=1 else
for m, k in ((1, 128), (4, 128), (1, 80)):
    w = nv.WeightOnlyGemm(nv.quantize_nvfp4(torch.randn(32, k)), m, "cpu", out_dtype=torch.float32)
    xx = torch.randn(m, k).to(torch.bfloat16)
    assert nv.relative_error(w(xx), nv.reference_mm(xx, w.q)) < 2e-3 and w.variant == "gemv" and w._gemv.mma == (k == 128)
assert lp.fp4_config_for(1, 4096, "cpu").mma and lp.fp4_config_for(1, 64, "cpu").block_k == 64
assert not lp.fp4_config_for(1, 48, "cpu").mma and lp.fp4_config_for(4, 48, "cpu") is None
# an lm_head at M=1 (N >= FP4_WIDE_ROWS, K whole 256-value steps) gets the 4-step bf16 form that won the lm_heads
assert lp.fp4_config_for(1, 4096, "cpu", n=128256) is lp.FP4_MMA_BX_WIDE
assert lp.FP4_MMA_BX_WIDE.bx and lp.FP4_MMA_BX_WIDE.block_k == 256 and lp.FP4_MMA_BX_WIDE.warps_per_sm == 18
assert lp.fp4_config_for(1, 4096, "cpu", n=512) is lp.FP4_MMA_DEFAULT
assert lp.fp4_config_for(4, 4096, "cpu", n=128256) == lp.with_cast(lp.FP4_MMA_DEFAULT)
assert lp.fp4_config_for(1, 4224, "cpu", n=128256) is lp.FP4_MMA_DEFAULT  # K not whole 256-value steps
# the bf16 form on x as it is (one kernel a call), which won every shape on the H200
assert lp.FP4_MMA_DEFAULT.bx and not lp.FP4_MMA_WIDE.bx
assert lp.fp4_config_for(1, 7168, "cpu", n=576) is lp.FP4_MMA_DEFAULT
assert lp.fp4_config_for(4, 4096, "cpu", n=128256) == lp.with_cast(lp.FP4_MMA_DEFAULT)
assert lp.fp4_config_for(1, 192, "cpu", n=576).bx  # K whole 64-value steps only
# M = 9-16 (two MMA sets a decoded tile, more registers, fewer programs an SM), x loaded once a program and shared
# (xshare): the K split with x loaded in place (xjit) where its grid fits one wave, its split cut to fit where that
# still splits, else stream-K (one wave of equal work); with no split, x loaded an iteration ahead
assert lp.FP4_MMA_BX_SK_XS.stream and lp.FP4_MMA_XS.xjit and not lp.FP4_MMA_XS.stream
assert all(c.xshare for c in lp.FP4_MMA_XSHARE) and not lp.FP4_MMA_XS_AHEAD.xjit
# 4 SMs ("cpu"): split 11, 22 programs <= 7 x 4; x through a ring of 2 on a split
assert lp.fp4_config_for(12, 4096, "cpu", n=128) == lp.with_cast(lp.replace(lp.FP4_MMA_XS, xring=2))
# split 2, 32 programs > 7 x 4, cut to none: stream-K, x through a ring of 2 (_m16_plan)
assert lp.fp4_config_for(12, 4096, "cpu", n=1024) == lp.with_cast(lp.replace(lp.FP4_MMA_BX_SK_XS, xring=2))
assert lp.fp4_config_for(12, 4096, "cpu", n=640).split == 2  # 10 programs: split 3 (30 > 28) cut to 2
assert lp.fp4_config_for(12, 4096, "cpu", n=2048) == lp.with_cast(lp.FP4_MMA_XS_AHEAD)  # no split
# no split, an lm_head: two tiles a warp
assert lp.fp4_config_for(16, 4096, "cpu", n=128256) == lp.with_cast(lp.FP4_MMA_TP)
assert lp.FP4_MMA_XS.name.endswith(",xj,xs") and "xs" in lp.FP4_MMA_BX_SK_XS.name
# x shared a program needs every warp of it on the same K range
from dataclasses import replace
try:
    lp.Nvfp4Gemv(nv.quantize_nvfp4(torch.randn(64, 512)), 16, "cpu", replace(lp.FP4_MMA_KS2, xshare=True))
    raise AssertionError("x shared with K slices was accepted")
except lp.DecodeGapError as exc:
    assert "K slices" in str(exc)
# from FP4_KS2_VALUES weights, or FP4_KS2_WARPS_PER_SM sliced warps an SM, up to M = 8 (not the lm_heads): two K
# slices a tile, 2 steps an iteration where that leaves no K split, else 4 (the H200's 132 SMs: what won there)
assert lp.fp4_config_for(8, 4096, "cpu", n=28672) == lp.with_cast(lp.FP4_MMA_KS2) and lp.FP4_MMA_KS2.slices == 2
assert lp.fp4_config_for(1, 4224, "cpu", n=36864) is lp.FP4_MMA_DEFAULT  # K not whole 512-value slices
from unittest import mock
with mock.patch.object(lp, "sm_count", lambda device: 132):
    for (n, k), want in {(28672, 4096): lp.FP4_MMA_KS2, (36864, 7168): lp.FP4_MMA_KS2, (32768, 512): lp.FP4_MMA_KS2,
                         (6144, 16384): lp.FP4_MMA_KS2_WIDE, (24576, 6144): lp.FP4_MMA_KS2_WIDE,
                         (24576, 1536): lp.FP4_MMA_KS2_WIDE, (4096, 14336): lp.FP4_MMA_KS2_WIDE,
                         (6144, 4096): lp.FP4_MMA_DEFAULT, (16384, 2048): lp.FP4_MMA_DEFAULT,
                         (576, 7168): lp.FP4_MMA_DEFAULT, (128256, 4096): lp.FP4_MMA_BX_WIDE,
                         (3584, 512): lp.FP4_MMA_KS2_WIDE, (6144, 256): lp.FP4_MMA_KS2,
                         (32768, 256): lp.FP4_MMA_KS2}.items():
        assert lp.fp4_config_for(1, k, "cpu", n=n) is want, (n, k, lp.fp4_config_for(1, k, "cpu", n=n).name)
    # a short K is one iteration of two slices, no K split, at M <= 8 (the TP8 kv_b and shared-expert down)
    assert lp.fp4_config_for(8, 512, "cpu", n=3584) == lp.with_cast(lp.FP4_MMA_KS2_WIDE)
    assert lp.fp4_config_for(8, 256, "cpu", n=6144) == lp.with_cast(lp.FP4_MMA_KS2)
    assert lp.fp4_config_for(12, 256, "cpu", n=6144) != lp.with_cast(lp.FP4_MMA_KS2)  # M = 9-16: FP4_M16_SHORT_K
    for n, k in ((3584, 512), (6144, 256)):
        g = lp.Nvfp4Gemv(nv.quantize_nvfp4(torch.randn(n, k)), 1, "cpu")
        assert g.split == 1, (n, k, g.label)
    # M = 16, what won on the H200 at each shape (FP4_MMA_XS's and _m16_plan's comments have the times): x shared,
    # the K split with x loaded in place where its grid fits one wave, cut to one wave where that still splits, else
    # stream-K; an iteration ahead with no split. x through the ring, 2 deep, on every split and on stream-K (what won
    # on the H100 with the cast kernel behind the split, short splits too: 6144x4096 4 iterations, 4096x14336 8)
    ring, sk_ring = lp.FP4_MMA_XS_RING, lp.FP4_MMA_SK_RING
    assert ring == replace(lp.FP4_MMA_XS, xring=lp.FP4_RING)
    assert sk_ring == replace(lp.FP4_MMA_BX_SK_XS, xring=lp.FP4_RING)
    for (n, k), want in {(28672, 4096): ring, (7168, 18432): ring, (6144, 4096): ring, (4096, 14336): ring,
                         (128256, 4096): lp.FP4_MMA_TP, (36864, 7168): sk_ring,
                         (24576, 6144): replace(ring, split=2), (6144, 16384): replace(ring, split=9)}.items():
        assert lp.fp4_config_for(16, k, "cpu", n=n) == lp.with_cast(want), (n, k)
    # at M = 9-12 a short split (2-6 iterations) over 3072 rows or more takes tile pairs (the H100's rounds)
    for (n, k), m in (((6144, 4096), 9), ((3072, 6144), 12), ((7168, 2304), 10), ((6144, 1536), 12)):
        assert lp.fp4_config_for(m, k, "cpu", n=n) == lp.with_cast(lp.FP4_MMA_TP), (n, k, m)
    for (n, k), m in (((6144, 4096), 13), ((2048, 2048), 9), ((4096, 14336), 9), ((28672, 4096), 12),
                      ((4096, 1792), 9)):  # the last a one-iteration split
        assert lp.fp4_config_for(m, k, "cpu", n=n) != lp.with_cast(lp.FP4_MMA_TP), (n, k, m)
    # a K of 256 or 512 values at M = 9-16 in one iteration with no split, as at M <= 8, up to 20 sliced warps an SM
    for (n, k), m, want in (((3584, 512), 9, lp.FP4_MMA_KS2_WIDE), ((7168, 512), 16, lp.FP4_MMA_KS2_WIDE),
                            ((6144, 256), 12, lp.FP4_MMA_BX_WIDE), ((16384, 256), 16, lp.FP4_MMA_BX_WIDE)):
        assert lp.fp4_config_for(m, k, "cpu", n=n) == lp.with_cast(want), (n, k, m)
    assert lp.fp4_config_for(12, 512, "cpu", n=28672).pair  # 3584 sliced warps: the plan (2 iterations a split)
    # a short K whose split would overflow a wave takes the K-sliced form (unsplit there), a longer one stream-K
    for n, k in ((32768, 512), (36864, 512), (32768, 1024)):
        for m in (9, 12, 16):
            assert lp.fp4_config_for(m, k, "cpu", n=n) == lp.with_cast(lp.FP4_MMA_KS2), (n, k, m)
        assert lp.Nvfp4Gemv(nv.quantize_nvfp4(torch.randn(n, k)), 12, "cpu").split == 1, (n, k)
    assert lp.fp4_config_for(16, 2048, "cpu", n=32768) == lp.with_cast(lp.FP4_MMA_SK_RING)
    assert lp.FP4_RING == 2 and lp.fp4_config_for(12, 4096, "cpu", n=28672).xring
    assert replace(lp.FP4_MMA_XS, xring=2) in lp.FP4_MMA_XRING and lp.fp4_config_for(8, 4096, "cpu", n=28672).xring == 0
    assert lp.with_cast(replace(lp.FP4_MMA_XS, xring=2)) in lp.FP4_STAGE_CONFIGS_M  # the stage times the plan's form
# above M=1 the K split's sums are cast by a kernel behind the GEMV (GemvConfig.cast); at M=1 the last split casts
assert lp.fp4_config_for(8, 4096, "cpu", n=6144).cast and not lp.fp4_config_for(1, 4096, "cpu", n=6144).cast
assert not lp.with_cast(lp.FP4_MMA_FP16).cast and not lp.with_cast(lp.FP4_MMA_CHAINED[0]).cast  # bf16, unchained
for m, cfg in ((1, replace(lp.FP4_MMA_DEFAULT, split=4, cast=True)), (8, replace(lp.FP4_MMA_BX_SK, cast=True)),
               (16, replace(lp.FP4_MMA_XS, split=4, cast=True))):
    qc = nv.quantize_nvfp4(torch.randn(64, 512))
    g = lp.Nvfp4Gemv(qc, m, "cpu", cfg)
    assert g.cast and not g.finish and g.kernels == 2 and ",ck" in g.label, g.label
    for _ in range(2):  # the second call sees the sums the cast kernel left at zero
        xc = torch.randn(m, 512).to(torch.bfloat16)
        err = nv.relative_error(g(xc).float(), nv.reference_mm(xc.float(), qc))
        assert err < 1e-2, (m, cfg.name, err)
    assert not g.acc.any()
# the x packing for the f16x2 asm form (the asm itself needs a GPU): plane j holds (x[8w+3-j], x[8w+7-j]) as fp16
x = torch.randn(1, 64).to(torch.bfloat16)
xp = torch.empty((4, 8), dtype=torch.int32)
lp._fp4_xpack_kernel[(1, 1)](x, xp, 8, 0, 0, BLOCK=512)
halves = xp.view(torch.int16).view(torch.float16).reshape(4, 8, 2).float()
for j in range(4):
    assert torch.equal(halves[j, :, 0], x[0, 3 - j::8].half().float()) and torch.equal(halves[j, :, 1], x[0, 7 - j::8].half().float())
# the tensor-core form's x packing: word-major, the four planes of a word together (the MMA's B pairs)
xp4 = torch.empty((1, 8, 4), dtype=torch.int32)
lp._fp4_xpack4_kernel[(1, 1)](x, xp4, 8, 0, 0, xp4, 0, BLOCK=512, ZERO=False)
assert torch.equal(xp4[0].t(), xp)
print("ok")
''')
    assert out.startswith("ok")


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_dense_and_grouped_gemvs_match_the_reference_in_the_interpreter():
    out = _interpret(r'''
import torch
from decode_gap.kernels import nvfp4 as nv, lowprec as lp
torch.manual_seed(0)
for m, n, k, kind, cfg in [(1, 40, 256, "bf16", lp.GemvConfig(16, 64)), (3, 40, 200, "fp8", lp.GemvConfig(16, 64)), (1, 40, 200, "fp8", lp.GemvConfig(8, 64, split=2)),
                           (1, 300, 384, "fp8b", lp.GemvConfig(16, 256)), (1, 130, 260, "fp8b", lp.GemvConfig(8, 128, split=2)), (5, 130, 260, "fp8b", lp.GemvConfig(32, 128, split=2)),
                           # block scales applied to x (xscale): one 128-row block a program, ragged K and N, split or not
                           (1, 300, 384, "fp8b", lp.GemvConfig(16, 256, xscale=True)), (1, 130, 260, "fp8b", lp.GemvConfig(8, 128, split=2, xscale=True)),
                           (1, 256, 1024, "fp8b", lp.DENSE_BLOCK_XSCALE[0]), (1, 136, 4096, "fp8b", lp.DENSE_BLOCK_XSCALE[0]),
                           (1, 256, 4096, "fp8b", None), (2, 136, 384, "fp8b", None)]:  # None: the default form at that M
    w = torch.randn(n, k)
    x = torch.randn(m, k).to(torch.bfloat16)
    if kind == "bf16":
        wq = w.to(torch.bfloat16); ref = x.float() @ wq.float().t()
    else:
        wq = lp.quantize_fp8(w, block=(kind == "fp8b")); ref = x.float() @ lp.dequantize_fp8(wq).t()
    g = lp.DenseGemv(wq, m, "cpu", cfg=cfg, out_dtype=torch.float32)
    if cfg is None:  # block scales: applied to x at M=1, per row and column block above
        assert g.cfg.xscale == (m == 1), (m, g.cfg)
    g.out.fill_(float("nan"))
    err = nv.relative_error(g(x), ref)
    assert err < 1e-5, (kind, m, n, k, err)
try:  # a program's rows must lie in one 128-row block for x to take its scales
    lp.DenseGemv(lp.quantize_fp8(torch.randn(256, 256), block=True), 1, "cpu", cfg=lp.GemvConfig(256, 128, xscale=True))
    raise AssertionError("BLOCK_N 256 with xscale was accepted")
except lp.DecodeGapError as exc:
    assert "one 128-row block" in str(exc)
E, H, I = 5, 128, 64
ids = torch.tensor([3, 0, 4]); rw = torch.rand(3)
x = torch.randn(1, H).to(torch.bfloat16)
w13 = (torch.randn(E, 2 * I, H) * 0.1).to(torch.bfloat16); w2 = (torch.randn(E, H, I) * 0.1).to(torch.bfloat16)
for fmt, c13, c2 in (("bf16", lp.GemvConfig(16, 64), lp.GemvConfig(16, 64)), ("fp8", lp.GemvConfig(16, 64), lp.GemvConfig(16, 64)),
                     ("fp8-block", lp.GemvConfig(16, 128), lp.GemvConfig(16, 128)),
                     ("nvfp4", lp.GemvConfig(16, 64), lp.GemvConfig(16, 64)),
                     ("nvfp4", lp.GemvConfig(16, 64, grouped=True), lp.GemvConfig(32, 32, grouped=True)),
                     ("nvfp4", lp.GemvConfig(16, 64, asm=True), lp.GemvConfig(16, 32, asm=True))):
    g = lp.grouped_from_bf16(fmt, w13, w2, ids, rw, "cpu", c13, c2)
    d13, d2 = lp.dequantized_experts(g)
    err = nv.relative_error(g(x).float(), lp.reference_experts(x, d13, d2, ids, rw))
    assert err < 1e-2, (fmt, err)  # bf16 activation and output
    sel = {"bf16": 2 * 3 * H * I, "nvfp4": nv.nvfp4_bytes(2 * I, H) + nv.nvfp4_bytes(H, I)}
    if fmt in sel:
        assert g.weight_bytes() == 3 * sel[fmt]  # only the three selected experts are read
# 128x128 block scales on x, the default where I is whole 128-row blocks (gate's paired up rows in one block too)
w13b = (torch.randn(E, 2 * 128, H) * 0.1).to(torch.bfloat16); w2b = (torch.randn(E, H, 128) * 0.1).to(torch.bfloat16)
g = lp.grouped_from_bf16("fp8-block", w13b, w2b, ids, rw, "cpu")
assert g.cfg13.xscale and g.cfg2.xscale and len(lp.grouped_alternatives(g)) == 2
for forms in lp.grouped_alternatives(g):
    g.cfg13, g.cfg2 = forms
    d13, d2 = lp.dequantized_experts(g)
    err = nv.relative_error(g(x).float(), lp.reference_experts(x, d13, d2, ids, rw))
    assert err < 1e-2, (forms, err)
assert not lp.grouped_from_bf16("fp8-block", w13, w2, ids, rw, "cpu").cfg13.xscale  # I = 64
try:
    lp.grouped_from_bf16("fp8-block", w13, w2, ids, rw, "cpu", lp.DENSE_BLOCK_XSCALE[0], lp.DENSE_BLOCK_XSCALE[0])
    raise AssertionError("xscale with I = 64 was accepted")
except lp.DecodeGapError as exc:
    assert "I a multiple of 128" in str(exc)
print("ok")
''')
    assert out.startswith("ok")


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_grouped_nvfp4_tensor_core_form_matches_the_reference_in_the_interpreter():
    """The grouped tensor-core form in fp16 (its mma.sync asm needs a GPU; the interpreter runs the same repacked
    layout and decode; the default is the bf16 form, tested below): expert ids pick the repacked weight, gate and up paired with the SiLU fused and the activation written
    straight into the down GEMV's packed x, or gate_up split over K with the SiLU kernel after; down weighted and
    summed with fp32 atomics; tiles masked where the warps outnumber them."""
    out = _interpret(r'''
import torch
from decode_gap.kernels import nvfp4 as nv, lowprec as lp
torch.manual_seed(0)
G = lp.GemvConfig
E, H, I = 5, 128, 64
ids = torch.tensor([3, 0, 4, 3]); rw = torch.rand(4)
x = torch.randn(1, H).to(torch.bfloat16)
w13 = (torch.randn(E, 2 * I, H) * 0.1).to(torch.bfloat16); w2 = (torch.randn(E, H, I) * 0.1).to(torch.bfloat16)
# the default where it fits: the bf16 form, gate_up split 2 ways (here H = 128 is one K block: not split, no SiLU
# kernel); down one step an iteration as I = 64
g = lp.grouped_from_bf16("nvfp4", w13, w2, ids, rw, "cpu")
assert g.bx and g.cfg13 == lp.FP4_GROUPED_BX_13 and g.cfg2.mma and g.cfg2.block_k == 64 and g.kernels == 3
# the fp16 forms (x and the activation packed to fp16 pairs), repacked in their own layout
from dataclasses import replace
g = lp.grouped_from_bf16("nvfp4", w13, w2, ids, rw, "cpu", lp.FP4_GROUPED_MMA_13,
                         replace(lp.FP4_GROUPED_MMA_2, block_k=64))
assert not g.bx and g.kernels == 4
dflt = (g.cfg13, g.cfg2)
assert g.mma13[0].shape == (E, 2 * I // 16, H // 64, 32, 4) and g.mma2[1].shape == (E, H // 16, I // 64, 32)
d13, d2 = lp.dequantized_experts(g)
ref = lp.reference_experts(x, d13, d2, ids, rw)
for c13, c2, launches in ((G(32, 64, 2, mma=True), G(64, 64, 4, mma=True), 4),  # paired, no split
                          (G(128, 128, 8, mma=True), G(16, 64, 1, split=1, mma=True), 4),  # 4 gate tiles in 8 warps
                          (G(16, 64, 1, split=2, mma=True), G(32, 64, 2, mma=True), 5),  # split: partials, SiLU kernel
                          dflt + (4,),
                          (G(64, 64, 4, mma=True), G(32, 64, 2, split=3, mma=True), 4)):  # down K=64: split capped
    g.cfg13, g.cfg2 = c13, c2
    g.out.fill_(float("nan"))
    assert g.kernels == launches, (c13, c2, g.kernels)
    err = nv.relative_error(g(x).float(), ref)
    assert err < 1e-2, (c13, c2, err)  # fp16 x and activation, bf16 output
g.cfg13, g.cfg2 = G(16, 64, 4, asm=True), G(16, 64, 4, asm=True)  # the previous (CUDA-core) form still runs
assert nv.relative_error(g(x).float(), ref) < 1e-2
# the activation the gate_up kernel packs is silu(gate) * up at the down GEMV's packed-x positions
g.cfg13, g.cfg2 = G(32, 64, 2, mma=True), G(32, 64, 2, mma=True)
g(x)
h = x.float() @ d13[3].t()
act = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
xp = torch.empty((1, I // 8, 4), dtype=torch.int32)
lp._fp4_xpack4_kernel[(1, 1)](act, xp, I // 8, 0, 0, xp, 0, BLOCK=512, ZERO=False)
got = g.xq2[0].view(torch.int16).view(torch.float16).float()
assert torch.allclose(got, xp[0].view(torch.int16).view(torch.float16).float(), rtol=1e-2, atol=1e-3)
try:
    g.cfg13, g.cfg2 = G(32, 64, 2, mma=True), G(16, 64, 4, asm=True)
    g(x)
    raise AssertionError("mixed forms must be refused")
except lp.DecodeGapError:
    pass
print("ok")
''')
    assert out.startswith("ok")


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_block_scaled_gemv_reads_no_scale_past_k_in_the_interpreter():
    """K = 64 under BLOCK_K = 1024: the tile spans 8 scale columns and the tensor has 1. The columns past K must not
    be read (0 x a stray NaN there was NaN: the grouped fp8-block smoke run's NaN at a tiny shape)."""
    out = _interpret(r'''
import torch
from decode_gap.kernels import lowprec as lp
torch.manual_seed(0)
fw = lp.quantize_fp8(torch.randn(40, 64), True)
padded = torch.full((fw.scales.shape[0], 8), float("nan"))
padded[:, :1] = fw.scales
fw.scales = padded[:, :1]  # the memory past the one scale column holds NaN
x = torch.randn(1, 64).to(torch.bfloat16)
got = lp.DenseGemv(fw, 1, "cpu", cfg=lp.GemvConfig(8, 1024, 4), out_dtype=torch.float32)(x)
ref = x.float() @ lp.dequantize_fp8(lp.Fp8Weight(fw.data, fw.scales.contiguous(), True)).t()
assert not got.isnan().any() and torch.allclose(got, ref, atol=1e-4), (got, ref)
print("ok")
''')
    assert out.startswith("ok")


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
@pytest.mark.parametrize("form", ["one_kernel", "bx"])
def test_one_kernel_nvfp4_forms_leave_zeroed_sums_for_the_next_call(form):
    """One kernel a call: the fp16 one-kernel candidate (each program packs its own x words) and the bf16 form (x's
    own bf16 pairs, no packing at all, `xp` None). The last K split casts the sums and leaves them (and the counters)
    at zero, so a second call is right too; M = 1, 3 and 12, split and not. The bf16 form does not round x to fp16:
    a 1e5 activation is kept."""
    out = _interpret(r'''
from dataclasses import replace
import sys
import torch
from decode_gap.kernels import nvfp4 as nv, lowprec as lp
torch.manual_seed(0)
form = sys.argv[1]
G = lambda *a, **k: lp.GemvConfig(*a, mma=True, **{form: True}, **k)
for m, n, k, cfg, split in [(1, 48, 256, G(64, 128, 4), None), (1, 100, 512, G(64, 128, 4), 4),
                            (3, 40, 256, G(32, 64, 2), 3), (12, 33, 256, G(64, 128, 4), 2),
                            (1, 80, 512, replace(lp.FP4_MMA_WIDE, **{form: True}), None)]:
    q = nv.quantize_nvfp4(torch.randn(n, k) * 3)
    g = lp.Nvfp4Gemv(q, m, "cpu", cfg=cfg, out_dtype=torch.float32, split=split)
    assert g.kernels == 1 and (g.xp is None) == (form == "bx")
    for call in range(2):  # the second call sees the zeros (and counters) the first left
        x = torch.randn(m, k).to(torch.bfloat16)
        if call and form == "bx":
            x[0, 5] = 1e5  # past fp16's range: the fp16 forms would make it inf
        g.out.fill_(float("nan"))
        err = nv.relative_error(g(x), nv.reference_mm(x, q))
        assert err < 2e-3, (m, n, k, cfg, split, call, err)
    if g.acc is not None:
        assert not g.acc.any() and not g.cnt.any()
    print("ok", m, n, k, cfg.name, g.split, err)
''', form)
    assert out.count("ok") == 5, out


def test_bf16_form_reorders_each_word_so_plane_j_pairs_values_2j_and_2j_plus_1():
    """repack_mma(bx=True): within each word the 8 values move so that plane j of the bf16 bit layout holds values 2j
    (low half) and 2j+1 (high half), the pair x holds in its own int32 word j; zero-scale blocks keep only zeros."""
    q = nv.quantize_nvfp4(torch.randn(16, 64))
    q.block_scales.view(torch.uint8)[3, 1] = 0  # a block whose scale is 0: its values are 0 whatever the codes
    words, _ = lp.repack_mma(q, bx=True)
    codes = torch.stack([q.packed & 0xF, q.packed >> 4], dim=-1).reshape(16, 64)
    codes[3, 16:32] = 0
    lane = lp.mma_nibbles(words[0, 0, 4 * 2 + 1], bx=True)  # row g=2, group q=1: values 8..15 of row 2, then of row 10
    for r, row in enumerate((2, 10)):
        for w in range(2):
            v = (lane[2 * r + w].item() & 0xFFFFFFFF)
            nib = [(v >> (4 * p)) & 0xF for p in range(8)]  # packed position p
            want = codes[row, 16 + 8 * w: 24 + 8 * w].tolist()  # group 4i+q = 1 (values 16..31) of the row
            assert [nib[3 - j] for j in range(4)] == want[0::2] and [nib[7 - j] for j in range(4)] == want[1::2]
    # the bit layout round-trips with the bf16 places
    w32 = torch.randint(-2**31, 2**31 - 1, (64,), dtype=torch.int64).to(torch.int32)
    assert torch.equal(lp.mma_nibbles(lp.mma_bit_layout(w32, bx=True), bx=True), w32)


# the grouped bf16 form on 5 experts (H and I from argv), each (gate_up, down, launches) of CASES called twice
# against dequantise-then-matmul: the sums and the split partials are left at zero, and slot 1 (expert 0) has its
# activation written as bf16 at its own index
_GROUPED_BX_SETUP = r'''
import sys
import torch
from decode_gap.kernels import nvfp4 as nv, lowprec as lp
torch.manual_seed(0)
G = lp.GemvConfig
E, H, I = 5, int(sys.argv[1]), int(sys.argv[2])
ids = torch.tensor([3, 0, 4, 3]); rw = torch.rand(4)
w13 = (torch.randn(E, 2 * I, H) * 0.1).to(torch.bfloat16); w2 = (torch.randn(E, H, I) * 0.1).to(torch.bfloat16)
'''
_GROUPED_BX_RUN = r'''
for c13, c2, launches in CASES:
    g = lp.grouped_from_bf16("nvfp4", w13, w2, ids, rw, "cpu", c13, c2)
    assert g.bx and g.kernels == launches, (c13.name, g.kernels, launches)
    d13, d2 = lp.dequantized_experts(g)
    for call in range(2):
        x = torch.randn(1, H).to(torch.bfloat16)
        g.out.fill_(float("nan"))
        err = nv.relative_error(g(x).float(), lp.reference_experts(x, d13, d2, ids, rw))
        assert err < 1e-2, (c13, c2, call, err)
        assert not g.zbuf.any()  # the sums and the split partials are left at zero
    h = x.float() @ d13[0].t()  # slot 1 is expert 0: its activation, as bf16 at its own index
    act = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
    assert torch.allclose(g.act[1].float(), act[0], rtol=2e-2, atol=1e-3)
    print("ok", c13.name, c2.name, err)
'''


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_grouped_bf16_form_reads_x_and_the_activation_as_they_are():
    """The grouped bf16 form (bx): no packing kernel, the activation written as bf16 at its own index, the SiLU kernel
    and the final cast leave the fp32 sums at zero, so a second call is right too; paired and split gate_up."""
    out = _interpret(_GROUPED_BX_SETUP + r'''
CASES = ((G(32, 64, 2, mma=True, bx=True), G(64, 64, 4, mma=True, bx=True), 3),  # paired
         (G(16, 64, 1, split=2, mma=True, bx=True), G(32, 64, 2, mma=True, bx=True), 4))  # split
''' + _GROUPED_BX_RUN + r'''
try:
    lp.grouped_from_bf16("nvfp4", w13, w2, ids, rw, "cpu", G(32, 64, 2, mma=True, bx=True), G(32, 64, 2, mma=True))
    raise AssertionError("a bf16 gate_up with an fp16 down must be refused")
except lp.DecodeGapError:
    pass
''', "128", "64")
    assert out.count("ok") == 2, out


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_grouped_k_slices_pair_gate_and_up_with_the_silu_in_one_kernel():
    """The grouped bf16 form with K slices: gate_up paired with the SiLU fused (one kernel, no fp32 partials, so 3
    launches a call), a tile's K range over 2 warps summed in the program; down sliced too; and slices under a K
    split, where the partials and the SiLU kernel stay (4 launches). Two calls each: the sums are left at zero."""
    out = _interpret(_GROUPED_BX_SETUP + r'''
CASES = ((G(16, 128, 2, mma=True, bx=True, slices=2), G(16, 64, 2, mma=True, bx=True, slices=2), 3),
         (G(16, 64, 2, split=2, mma=True, bx=True, slices=2), G(32, 64, 2, mma=True, bx=True), 4))
''' + _GROUPED_BX_RUN + r'''
try:
    lp.grouped_from_bf16("nvfp4", w13, w2, ids, rw, "cpu", G(16, 128, 3, mma=True, bx=True, slices=2), c2)(x)
    raise AssertionError("3 warps cannot hold 2 slices")
except lp.DecodeGapError as exc:
    assert "slices" in str(exc)
''', "256", "128")
    assert out.count("ok") == 2, out


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_stream_k_parts_cross_groups_and_sum_to_the_reference_in_the_interpreter():
    """Stream-K (cfg.stream): every program takes the same number of iterations of all groups' K ranges laid end to
    end, give or take one, at most a group's worth, so a range may end mid-group and go on in the next (two parts);
    the part that completes a group's iterations casts its sums and leaves zeros. Any grid gives the same sums: 1, 2
    and 3 programs a (CPU-interpreter) SM, ranges of 1 to 8 iterations over groups of 4 or 8, some crossing a group
    boundary; bf16 and fp16 forms, M = 1 and 12, two calls each."""
    out = _interpret(r'''
from dataclasses import replace
import torch
from decode_gap.kernels import nvfp4 as nv, lowprec as lp
torch.manual_seed(0)
for m, n, k, cfg in [(1, 300, 512, replace(lp.FP4_MMA_DEFAULT, stream=True)),
                     (12, 130, 1024, replace(lp.FP4_MMA_DEFAULT, stream=True)),
                     (1, 200, 512, replace(lp.FP4_MMA_FP16, stream=True))]:
    q = nv.quantize_nvfp4(torch.randn(n, k) * 3)
    g = lp.Nvfp4Gemv(q, m, "cpu", cfg=cfg, out_dtype=torch.float32)
    assert g.stream and g.finish and g.kernels == (1 if cfg.bx else 2) and "stream-K" in g.label
    iters = k // cfg.block_k
    for per_sm in (1, 2, 3):
        g._plan_stream(per_sm)
        total, progs = g.groups * iters, g.grid[0]
        ranges = [(p * total // progs, (p + 1) * total // progs) for p in range(progs)]
        sizes = {b - a for a, b in ranges}
        assert max(sizes) - min(sizes) <= 1 and 1 <= min(sizes) and max(sizes) == g.per <= iters
        crossing = any(a // iters != (b - 1) // iters for a, b in ranges)
        for call in range(2):
            x = torch.randn(m, k).to(torch.bfloat16)
            g.out.fill_(float("nan"))
            err = nv.relative_error(g(x), nv.reference_mm(x, q))
            assert err < 2e-3, (m, n, k, cfg.name, per_sm, call, err)
        assert not g.acc.any() and not g.cnt.any()
        print("ok", m, n, cfg.name, g.grid[0], g.per, crossing, err)
''')
    assert out.count("ok") == 9 and " True " in out, out


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_k_slices_sum_within_the_program_in_the_interpreter():
    """K slices (cfg.slices): warp w of a program takes tile w // slices and slice w % slices of the program's K
    range, and the slices' sums are added in the program before they are stored; with a K split too, the split's
    finishing path still casts and leaves zeros. 2 and 4 slices, bf16 and fp16 forms, M = 1, 5 and 12, ragged N;
    and the forms that cannot be sliced are refused in one line."""
    out = _interpret(r'''
import torch
from decode_gap.kernels import nvfp4 as nv, lowprec as lp
torch.manual_seed(0)
G = lp.GemvConfig
for m, n, k, cfg, split in [(1, 300, 512, lp.FP4_MMA_KS2, 1), (1, 200, 1024, G(16, 128, 4, mma=True, bx=True, slices=4), 2),
                            (12, 130, 512, lp.FP4_MMA_KS2, 1), (5, 130, 1024, G(32, 128, 4, mma=True, slices=2), 2),
                            (1, 90, 1024, lp.FP4_MMA_KS2_WIDE, None), (1, 70, 512, lp.FP4_MMA_CHAINED[0], None)]:
    q = nv.quantize_nvfp4(torch.randn(n, k) * 3)
    g = lp.Nvfp4Gemv(q, m, "cpu", cfg=cfg, out_dtype=torch.float32, split=split)
    assert f"{cfg.slices} K slices" in g.label and g.grid[0] == -(-n // (16 * cfg.warps // cfg.slices))
    for call in range(2):
        x = torch.randn(m, k).to(torch.bfloat16)
        g.out.fill_(float("nan"))
        err = nv.relative_error(g(x), nv.reference_mm(x, q))
        assert err < 2e-3, (m, n, k, cfg.name, call, err)
    assert not g.finish or not g.acc.any()  # the finishing split leaves zeros
    print("ok", m, n, cfg.name, g.split, err)
''')
    assert out.count("ok") == 6, out
    G = lp.GemvConfig
    _assert_refused(64, 384, 1, (G(32, 128, 4, mma=True, bx=True, slices=2),
                                 G(32, 128, 4, mma=True, bx=True, slices=2, stream=True),
                                 G(16, 128, 3, mma=True, bx=True, slices=2)))


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_tile_pairs_cover_both_tiles_of_each_warp_in_the_interpreter():
    """Tile pairs (cfg.pair): a group is 8 tiles, warp w taking tiles w and w + 4 against the same x; both tiles'
    sums are stored (or added, with a K split, and finished together by the last split, which leaves zeros). M = 1,
    5, 12 and 16, ragged N (a group's second tiles partly or wholly past N), with and without a split; the GPU's
    loop (_fp4_mma_loop_pair) runs on the H200 (benchmarks/lowprec_device.py checks). Forms that cannot pair are
    refused in one line."""
    out = _interpret(r'''
import torch
from decode_gap.kernels import nvfp4 as nv, lowprec as lp
torch.manual_seed(0)
for m, n, k, cfg, split in [(1, 256, 512, lp.FP4_MMA_TP, None), (5, 200, 256, lp.FP4_MMA_TP, 2),
                            (16, 160, 512, lp.FP4_MMA_TP, 2), (16, 256, 256, lp.FP4_MMA_TP, 1),
                            (12, 96, 384, lp.FP4_MMA_PAIR[1], None)]:
    q = nv.quantize_nvfp4(torch.randn(n, k) * 3)
    g = lp.Nvfp4Gemv(q, m, "cpu", cfg=cfg, out_dtype=torch.float32, split=split)
    assert g.grid[0] == -(-n // 128) and ",tp" in g.label
    for call in range(2):
        x = torch.randn(m, k).to(torch.bfloat16)
        g.out.fill_(float("nan"))
        err = nv.relative_error(g(x), nv.reference_mm(x, q))
        assert err < 2e-3, (m, n, k, cfg.name, call, err)
    assert g.acc is None or not g.acc.any() and not g.cnt.any()
    print("ok", m, n, cfg.name, g.split, err)
''')
    assert out.count("ok") == 5, out
    tp = lp.FP4_MMA_TP
    _assert_refused(64, 512, 16, (replace(tp, xjit=False), replace(tp, stream=True), replace(tp, block_n=64),
                                  replace(tp, bx=False)))


def test_chained_forms_are_bf16_and_leave_pdl_to_gpus():
    """The chained forms (PDL on the kernel before each call) are bf16 forms named ',pc'; on a host without
    programmatic dependent launch (the CPU interpreter) a chained form launches plainly, and an fp16 form asking to
    chain is refused in one line."""
    assert lp.FP4_MMA_CHAINED and all(c.chain and c.bx and c.name.endswith(",pc") for c in lp.FP4_MMA_CHAINED)
    assert not any(c.chain for c in lp.FP4_MMA_CONFIGS + lp.FP4_STAGE_CONFIGS + lp.FP4_STAGE_CONFIGS_M)
    if not lp.HAVE_TRITON:
        return
    q = nv.quantize_nvfp4(torch.randn(64, 256))
    assert not lp.Nvfp4Gemv(q, 1, "cpu", cfg=lp.FP4_MMA_CHAINED[2]).pdl
    with pytest.raises(lp.DecodeGapError, match="only the bf16 form chains"):
        lp.Nvfp4Gemv(q, 1, "cpu", cfg=lp.GemvConfig(64, 128, 4, mma=True, chain=True))
    with pytest.raises(lp.DecodeGapError, match="not chained"):  # the cast kernel finishes unchained forms only
        lp.Nvfp4Gemv(q, 1, "cpu", cfg=replace(lp.FP4_MMA_CHAINED[2], cast=True))


def _lowprec_benchmark(out, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """benchmarks/lowprec_device.py with `args` under the CPU interpreter, writing to `out`: the process (asserted to
    have passed) and its lowprec.json."""
    import json

    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "lowprec_device.py"), *args, "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((out / "lowprec.json").read_text())


def test_lowprec_benchmark_sweep_runs_in_the_interpreter(tmp_path):
    """The README's after-a-kernel-change command, at a toy shape under the CPU interpreter: the sweep section times
    every NVFP4 tensor-core form and writes them to lowprec.json (a smoke test of the script, not a timing)."""
    _, res = _lowprec_benchmark(tmp_path, "--sections", "bw,sweep", "--shapes", "64x256", "--ms", "1")
    tried = res["gemm"][0]["nvfp4_new_tried"]
    forms = lp.FP4_MMA_CONFIGS + lp.FP4_MMA_CHAINED
    assert not res["errors"] and {c.name for c in forms if 256 % c.k_multiple == 0} <= set(tried)
    assert all(isinstance(v, float) for v in tried.values())
    assert res["gemm"][0]["nvfp4_plain_read_us"] > 0  # the same bytes read plainly, beside the forms


def test_lowprec_benchmark_sweep_rounds_time_every_ring_form(tmp_path):
    """The sweep's rotated rounds (--rounds, how a candidate is judged against the plan's form), at a toy shape under
    the CPU interpreter: every x-ring form is checked, then timed in the rounds, each with one median."""
    proc, res = _lowprec_benchmark(tmp_path, "--sections", "sweep", "--shapes", "64x256", "--ms", "16", "--forms",
                                   "xring", "--rounds", "2")
    tried = res["gemm"][0]["nvfp4_new_tried"]
    assert not res["errors"] and res["checks"] and all(c["ok"] for c in res["checks"])
    assert {c.name for c in lp.FP4_MMA_XRING} <= {name for name, us in tried.items() if isinstance(us, float)}
    assert proc.stdout.count("(2 rounds)") == len(tried)


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed")
def test_default_tensor_core_forms_compile_for_sm90_without_spills():
    """benchmarks/kernel_resources.py on the defaults (Triton's own ptxas, no GPU): the M=1 and M=16 forms the
    decode step runs keep every value in registers (a spill would cost more than any tuning gains)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import kernel_resources as kr
    finally:
        sys.path.pop(0)
    forms = kr.forms()
    for name in (f"{lp.FP4_MMA_DEFAULT.name} M=1", f"{lp.FP4_MMA_BX_SK.name} M=9-16", f"{lp.FP4_MMA_WIDE.name} M=1",
                 f"{lp.FP4_MMA_KS2.name} M=1", f"{lp.FP4_MMA_KS2_WIDE.name} M=1", f"{lp.FP4_MMA_XJ.name} M=9-16",
                 f"{lp.FP4_MMA_TP.name} M=9-16"):
        try:
            r = kr.compile_form(forms[name], 90)
        except FileNotFoundError as exc:  # a Triton wheel without its CUDA tools
            pytest.skip(f"no ptxas/cuobjdump: {exc}")
        assert r["stack"] == 0 and r["registers"] <= 255, (name, r)


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed")
def test_dense_gemv_forms_compile_for_sm90_without_spills(tmp_path):
    """kernel_resources.py --dense: the bf16 / FP8 CUDA-core GEMVs (per-tensor, 128x128 blocks summed per column
    block or applied to x, grouped with gate and up paired) compile for sm_90 without spills, and --sass-dir writes
    each form's SASS without addresses, so two checkouts' folders diff line by line."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import kernel_resources as kr
    finally:
        sys.path.pop(0)
    forms = kr.dense_forms()
    assert sum(1 for f in forms.values() if f.get("XSCALE")) == 3 and any(f["SCALE"] == 0 for f in forms.values())
    for name in ("fp8 per-tensor BN=8,BK=2048 split", "fp8 blocks on x BN=8,BK=2048 split"):
        try:
            r = kr.compile_form(forms[name], 90, tmp_path / "form.sass")
        except FileNotFoundError as exc:  # a Triton wheel without its CUDA tools
            pytest.skip(f"no ptxas/cuobjdump: {exc}")
        assert r["stack"] == 0 and r["registers"] <= 255, (name, r)
        sass = (tmp_path / "form.sass").read_text().splitlines()
        assert len(sass) == r["sass_instructions"] and not any("/*" in line for line in sass)


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_grouped_alternatives_add_the_wide_down_to_the_default_bf16_pair():
    """The MoE stage times each of grouped_alternatives on the same repacked experts and keeps the fastest: the
    default bf16 pair first, then its down at 4 steps an iteration where I is whole 256-value blocks (that form
    gives the same sums); a form that is not the default pair, or an I it does not divide, has no alternative."""
    out = _interpret(_GROUPED_BX_SETUP + r'''
g = lp.grouped_from_bf16("nvfp4", w13, w2, ids, rw, "cpu")
forms = lp.grouped_alternatives(g)
assert forms == [(lp.FP4_GROUPED_BX_13, lp.FP4_GROUPED_BX_2), (lp.FP4_GROUPED_BX_13, lp.FP4_GROUPED_BX_2_WIDE)], forms
CASES = (forms[1] + (3,),)
''' + _GROUPED_BX_RUN + r'''
g.cfg13, g.cfg2 = lp.FP4_GROUPED_MMA_13, lp.FP4_GROUPED_MMA_2
assert len(lp.grouped_alternatives(g)) == 1
small = lp.grouped_from_bf16("nvfp4", w13[:, :128], w2[:, :, :64], ids, rw, "cpu")  # I = 64: one step a down
assert len(lp.grouped_alternatives(small)) == 1
print("ok alternatives")
''', "128", "256")
    assert out.count("ok") == 2, out


def test_block_scales_on_x_take_whole_iterations_of_k():
    """The 2048-value form where K is whole iterations of it (6144, 18432), else the 1024-value one (7168, where the
    2048 form masked every load): the dense default at M=1 and each grouped GEMV's own."""
    assert lp.block_xscale_for(6144) == lp.DENSE_BLOCK_XSCALE[0] and lp.block_xscale_for(18432).block_k == 2048
    assert lp.block_xscale_for(7168) == lp.DENSE_BLOCK_XSCALE[1] and lp.block_xscale_for(1024).block_k == 1024
    assert all(c.xscale and 128 % c.block_n == 0 for c in lp.DENSE_BLOCK_XSCALE)


@pytest.mark.skipif(not lp.HAVE_TRITON, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_kernel_level_fp8_block_layers_run_the_block_scaled_gemvs_in_the_interpreter():
    """The simulated step's fp8-block layers at batch 1 (probe_formats on a GPU picks them): a linear is our
    block-scaled GEMV with the scales applied to x, the routed experts the grouped GEMV with the same scales (on
    tensor cores where I is whole 128-value blocks, else on CUDA cores), each against dequantise-then-matmul; the
    bytes they count are the fp8 values plus one fp32 scale a 128x128 block."""
    out = _interpret(r'''
import torch
from decode_gap.kernels import fp8mma, lowprec as lp
from decode_gap.simulate.layers import Experts, Linear
torch.manual_seed(0)
lin = Linear(200, 384, "fp8-block", "fp32", "cpu", m=1)
assert lin.gemm.cfg.xscale and lin.nbytes == 200 * 384 + 4 * 2 * 3
x = torch.randn(1, 384)
ref = x @ lp.dequantize_fp8(lp.Fp8Weight(lin.gemm.data, lin.gemm.scales, True)).t()
assert torch.allclose(lin(x).float(), ref, rtol=2e-2, atol=1e-4), (lin(x), ref)
E, H = 4, 256
for I in (128, 64):  # I whole 128-value blocks: the tensor-core form (fp8mma); else the CUDA-core one
    ex = Experts(E, I, H, "fp8-block", "fp32", "cpu", "grouped_gemv", top_k=2)
    g = ex.grouped
    assert ex.per_expert_bytes == lp.fp8_bytes(2 * I, H, True) + lp.fp8_bytes(H, I, True)
    if I == 128:
        assert isinstance(g, fp8mma.GroupedFp8Mma) and g.block and g.warps == 8
        d13, d2 = g.dequantized()
    else:
        assert isinstance(g, lp.GroupedExperts) and not g.cfg13.xscale  # block scales on x need I % 128 == 0
        d13, d2 = lp.dequantized_experts(g)
    ids, w = torch.tensor([[3, 1]]), torch.tensor([[0.7, 0.3]])
    ref = lp.reference_experts(x[:, :H].to(torch.bfloat16), d13, d2, ids[0], w[0])
    y = ex(x[:, :H], ids, w, None)
    assert torch.allclose(y.float(), ref.float(), rtol=3e-2, atol=1e-3), (I, y, ref)
print("ok")
''')
    assert out.startswith("ok")
