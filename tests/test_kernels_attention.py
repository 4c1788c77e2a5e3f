"""The kernel level's fused attention pieces (kernels.attention) against torch ops under TRITON_INTERPRET on the
CPU: MLA's and GQA's split-KV decode (heads not a multiple of the 16-head tile, one and several splits, a split past
the end of the cache, a sliding window's strided view, fp32 and bf16), the one-kernel rotary embedding of a strided
slice, the fused qk-norm + rope + cache append of a qkv row, MLA's fused latent norm + rope + cache append, and the
DSA indexer's fused key norm + rope + cache append.
benchmarks/lowprec_device.py
checks them again on a GPU at DeepSeek-V3's sizes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decode_gap.errors import DecodeGapError
from decode_gap.kernels.attention import GqaDecode, MlaDecode, qkv_rope_append_reference, rope_reference

REPO = Path(__file__).resolve().parents[1]


def test_rope_reference_rotates_pairs_across_the_halves():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    cos, sin = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0])
    assert rope_reference(x, cos, sin).tolist() == [[-3.0, 2.0, 1.0, 4.0]]  # pair 0 turned 90 degrees, pair 1 kept


def test_mla_decode_refuses_widths_it_cannot_tile():
    with pytest.raises(DecodeGapError, match="kv_lora_rank 500"):
        MlaDecode(1, 16, 500, 64, 128, "cpu")


def test_fused_attention_matches_torch_ops_in_the_interpreter():
    code = r'''
import torch
from decode_gap.kernels.attention import MlaDecode, reference_mla, rope, rope_reference
torch.manual_seed(0)
M, H, L, R = 2, 20, 32, 16
for T, splits, dt, tol in ((50, 1, torch.float32, 1e-5), (50, 3, torch.float32, 1e-5), (33, 4, torch.float32, 1e-5),
                           (50, None, torch.bfloat16, 1e-2)):
    qq, kv = torch.randn(M, H, L + R).to(dt), torch.randn(M, T, L + R).to(dt)
    k = MlaDecode(M, H, L, R, T, "cpu", dtype=dt, splits=splits)
    got, ref = k(qq, kv, 0.2).float(), reference_mla(qq.float(), kv.float(), L, 0.2)
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < tol, (T, splits, dt, err)
# DSA: 12 of 50 rows read in place through their indices; a 32-head tile (the default at 256+ head rows) over 20 heads
qq, kv = torch.randn(M, H, L + R), torch.randn(M, 50, L + R)
rows = torch.stack([torch.randperm(50)[:12] for _ in range(M)]).to(torch.int32)
ref = reference_mla(qq, kv.gather(1, rows.long()[..., None].expand(-1, -1, L + R)), L, 0.2)
for block_h in (16, 32):
    got = MlaDecode(M, H, L, R, 12, "cpu", dtype=torch.float32, block_h=block_h)(qq, kv, 0.2, rows=rows)
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5, block_h
assert MlaDecode(8, 64, L, R, 12, "cpu").block_h == 32 and MlaDecode(1, 64, L, R, 12, "cpu").block_h == 16
# the split counts the kernel level's picker times (default, twice, four times; each split at least a block of rows):
# each form the same attention
from decode_gap.kernels.attention import mla_split_forms
forms = mla_split_forms(M, H, L, R, 200, "cpu", dtype=torch.float32)
assert [f.splits for f in forms.values()] == [2, 4]
assert all(lab.endswith(f"{f.splits} splits") for lab, f in forms.items())
kv = torch.randn(M, 300, L + R)
rows = torch.stack([torch.randperm(300)[:200] for _ in range(M)]).to(torch.int32)
ref = reference_mla(qq, kv.gather(1, rows.long()[..., None].expand(-1, -1, L + R)), L, 0.2)
for lab, f in forms.items():
    assert ((f(qq, kv, 0.2, rows=rows) - ref).norm() / ref.norm()).item() < 1e-5, lab
x = torch.randn(2, 3, 1, 24)[..., 8:]
cos, sin = torch.randn(8), torch.randn(8)
assert torch.allclose(rope(x, cos, sin), rope_reference(x, cos, sin), atol=1e-6)
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_indexer_scores_match_torch_ops_in_the_interpreter():
    """The DSA indexer's scores (GLM-5: 32 heads of 128 at full size) as one kernel: heads not a power of two and a
    cache length that is not whole blocks, against bmm + relu + the weighted sum over heads."""
    code = r'''
import torch
from decode_gap.kernels.attention import index_scores, index_scores_reference
torch.manual_seed(0)
for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
    q, keys, w = torch.randn(2, 12, 32).to(dt), torch.randn(2, 70, 32).to(dt), torch.rand(2, 12)
    got, ref = index_scores(q, keys, w), index_scores_reference(q.float(), keys.float(), w)
    assert got.shape == (2, 70) and ((got - ref).norm() / ref.norm()).item() < tol, dt
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_gqa_decode_refuses_what_it_cannot_tile():
    with pytest.raises(DecodeGapError, match="head_dim 80"):
        GqaDecode(1, 32, 8, 80, 128, "cpu")
    with pytest.raises(DecodeGapError, match="do not divide"):
        GqaDecode(1, 30, 8, 128, 128, "cpu")
    with pytest.raises(DecodeGapError, match="128 query heads a KV head"):
        GqaDecode(1, 128, 1, 128, 128, "cpu")


def test_qkv_rope_append_reference_writes_the_cache_row_and_returns_rotated_q():
    torch.manual_seed(0)
    m, h, kv, d, t = 1, 4, 2, 8, 5
    qkv = torch.randn(m, (h + 2 * kv) * d)
    kc, vc = torch.zeros(m, kv, t, d), torch.zeros(m, kv, t, d)
    cos, sin = torch.ones(d // 2), torch.zeros(d // 2)  # the identity rotation
    q = qkv_rope_append_reference(qkv, h, kc, vc, torch.tensor([3]), cos, sin)
    assert torch.equal(q, qkv[:, : h * d].view(m, h, d))
    assert torch.equal(kc[:, :, 3], qkv[:, h * d:(h + kv) * d].view(m, kv, d))
    assert torch.equal(vc[:, :, 3], qkv[:, (h + kv) * d:].view(m, kv, d))
    assert kc[:, :, [0, 1, 2, 4]].abs().sum() == 0 and vc[:, :, [0, 1, 2, 4]].abs().sum() == 0


def test_gqa_decode_and_qkv_append_match_torch_ops_in_the_interpreter():
    """GQA groups of 4 and 5 (padded to the 16-row tile), MHA, a split past the end of the cache, a sliding
    window's view of the cache (a strided slice), bf16; the fused append with and without the qk-norm."""
    code = r'''
import torch
from decode_gap.kernels.attention import GqaDecode, reference_gqa, qkv_rope_append, qkv_rope_append_reference
torch.manual_seed(0)
for M, H, KV, D, T, splits, dt, tol in ((2, 8, 2, 32, 50, None, torch.float32, 1e-5),
                                        (1, 6, 6, 16, 33, 3, torch.float32, 1e-5),
                                        (2, 20, 4, 32, 70, 4, torch.float32, 1e-5),
                                        (1, 8, 2, 32, 50, 2, torch.bfloat16, 2e-2)):
    q = torch.randn(M, H, D).to(dt)
    kc, vc = torch.randn(M, KV, T + 5, D).to(dt), torch.randn(M, KV, T + 5, D).to(dt)
    k, v = kc[:, :, 5:], vc[:, :, 5:]
    got = GqaDecode(M, H, KV, D, T, "cpu", dtype=dt, splits=splits)(q, k, v, 0.3).float()
    ref = reference_gqa(q.float(), k.float(), v.float(), 0.3)
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < tol, (M, H, KV, D, T, splits, dt, err)
for norm in (False, True):
    for dt, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        M, H, KV, D, T = 2, 4, 2, 16, 9
        qkv = torch.randn(M, (H + 2 * KV) * D).to(dt)
        kc1, vc1 = torch.randn(M, KV, T, D).to(dt), torch.randn(M, KV, T, D).to(dt)
        kc2, vc2 = kc1.clone(), vc1.clone()
        pos, cos, sin = torch.tensor([6]), torch.randn(D // 2).to(dt), torch.randn(D // 2).to(dt)
        qn, kn = (torch.rand(D).to(dt), torch.rand(D).to(dt)) if norm else (None, None)
        a = qkv_rope_append(qkv, H, kc1, vc1, pos, cos, sin, qn, kn, 1e-6)
        b = qkv_rope_append_reference(qkv, H, kc2, vc2, pos, cos, sin, qn, kn, 1e-6)
        for x, y in ((a, b), (kc1, kc2), (vc1, vc2)):
            err = ((x.float() - y.float()).norm() / y.float().norm()).item()
            assert err < tol, (norm, dt, err)
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_mla_prepare_matches_torch_ops_in_the_interpreter():
    """MLA's fused decode input (the latent row normed and rotated into the cache, qq = [q_lat | rope(q_pe)]) against
    the seven torch ops, on the strided views the kernel level passes: q_pe a slice of q's heads, the latent row a
    slice of the fused a-projection's output, q_lat the transposed output of the absorbed bmm; fp32 and bf16."""
    code = r'''
import torch
from decode_gap.kernels.attention import mla_prepare, mla_prepare_reference
torch.manual_seed(0)
M, H, NOPE, L, R, QL, T = 2, 5, 24, 32, 16, 40, 9
for dt, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
    q = torch.randn(M, H, NOPE + R).to(dt)
    q_pe = q[..., NOPE:]
    q_lat = torch.randn(H, M, L).to(dt).transpose(0, 1)
    kv = torch.randn(M, QL + L + R).to(dt)[:, QL:]
    c1 = torch.randn(M, T, L + R).to(dt)
    c2 = c1.clone()
    pos, cos, sin, w = torch.tensor([4]), torch.randn(R // 2).to(dt), torch.randn(R // 2).to(dt), torch.rand(L).to(dt)
    a = mla_prepare(q_lat, q_pe, kv, c1, pos, cos, sin, w, 1e-6)
    b = mla_prepare_reference(q_lat, q_pe, kv, c2, pos, cos, sin, w, 1e-6)
    assert a.shape == (M, H, L + R) and a.dtype == dt
    for x, y in ((a, b), (c1, c2)):
        err = ((x.float() - y.float()).norm() / y.float().norm()).item()
        assert err < tol, (dt, err)
    assert torch.equal(c1[:, [0, 1, 2, 3, 5, 6, 7, 8]], c2[:, [0, 1, 2, 3, 5, 6, 7, 8]])  # only row pos written
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_index_prepare_matches_torch_ops_in_the_interpreter():
    """The DSA indexer's fused decode input (the key LayerNormed and rotated into its cache, the queries rotated;
    the rope part first, as in DeepSeek-V3.2) against the torch ops: a key row that is a slice of a wider row, fp32
    and bf16; then the scores with the weights' scale folded in, against the unscaled scores times the scale."""
    code = r'''
import torch
from decode_gap.kernels.attention import index_prepare, index_prepare_reference, index_scores
torch.manual_seed(0)
M, IH, ID, R, T = 2, 5, 32, 16, 9
for dt, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
    q = torch.randn(M, IH, ID).to(dt)
    k = torch.randn(M, 8 + ID).to(dt)[:, 8:]
    c1 = torch.randn(M, T, ID).to(dt)
    c2 = c1.clone()
    pos, cos, sin = torch.tensor([4]), torch.randn(R // 2).to(dt), torch.randn(R // 2).to(dt)
    w, b = torch.rand(ID).to(dt), torch.randn(ID).to(dt)
    a, none = index_prepare(q, k, c1, pos, cos, sin, w, b, 1e-6)
    ref, _ = index_prepare_reference(q, k, c2, pos, cos, sin, w, b, 1e-6)
    assert a.shape == (M, IH, ID) and a.dtype == dt and none is None
    assert torch.equal(a[..., R:], q[..., R:])  # only the rope part turns
    for x, y in ((a, ref), (c1, c2)):
        err = ((x.float() - y.float()).norm() / y.float().norm()).item()
        assert err < tol, (dt, err)
    assert torch.equal(c1[:, [0, 1, 2, 3, 5, 6, 7, 8]], c2[:, [0, 1, 2, 3, 5, 6, 7, 8]])  # only row pos written
wts = torch.rand(M, IH).to(torch.bfloat16)
qf, cf = torch.randn(M, IH, ID), torch.randn(M, T, ID)
assert torch.allclose(index_scores(qf, cf, wts, 0.25), index_scores(qf, cf, wts.float()) * 0.25, rtol=1e-5, atol=1e-5)
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_index_prepare_fp8_keys_match_torch_ops_in_the_interpreter():
    """DeepSeek-V3.2's FP8 indexer (GLM-5's): the fused kernel's Hadamard-turned queries and key as FP8 codes and
    scales against the torch ops, with only row pos written; the turn keeps q . k (the scores from FP8 keys and
    queries against the unquantised, unturned ones); then the scores kernel on FP8 keys, with bf16 and with FP8
    queries, against torch; an all-zero key's scale floored as fp8block's (quantize_e4m3_groups)."""
    code = r'''
import torch
from decode_gap.kernels.attention import (INDEX_KEY_DTYPE, index_prepare, index_prepare_reference, index_scores,
                                          index_scores_reference)
from decode_gap.kernels.nvfp4 import E4M3_SCALE_FLOOR
torch.manual_seed(0)
M, IH, ID, R, T, P = 2, 5, 64, 16, 9, 4
others = [t for t in range(T) if t != P]
for dt, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
    q, k = torch.randn(M, IH, ID).to(dt), torch.randn(M, ID).to(dt)
    pos, cos, sin = torch.tensor([P]), torch.randn(R // 2).to(dt), torch.randn(R // 2).to(dt)
    w, b = torch.rand(ID).to(dt), torch.randn(ID).to(dt)
    c1, s1 = torch.randn(M, T, ID).to(INDEX_KEY_DTYPE), torch.rand(M, T)
    c2, s2 = c1.clone(), s1.clone()
    a, qs = index_prepare(q, k, c1, pos, cos, sin, w, b, 1e-6, s1)
    ref, ref_qs = index_prepare_reference(q, k, c2, pos, cos, sin, w, b, 1e-6, s2)
    assert a.dtype == INDEX_KEY_DTYPE and qs.shape == (M, IH) and qs.dtype == torch.float32
    # in bf16 a value rounded the other way before the cast can take the next FP8 code (1/16 apart at most)
    for x, y in ((a.float() * qs[..., None], ref.float() * ref_qs[..., None]),
                 (c1.float() * s1[..., None], c2.float() * s2[..., None])):
        err = ((x.float() - y.float()).norm() / y.float().norm()).item()
        assert err < 3 * tol, (dt, err)
    assert torch.equal(c1[:, others].float(), c2[:, others].float()) and torch.equal(s1[:, others], s2[:, others])
    plain_c = torch.zeros(M, T, ID).to(dt)
    plain_q, _ = index_prepare_reference(q, k, plain_c, pos, cos, sin, w, b, 1e-6)
    exact = torch.einsum("mhd,md->mh", plain_q.float(), plain_c[:, P].float())
    turned = torch.einsum("mhd,md->mh", a.float() * qs[..., None], c1[:, P].float() * s1[:, P, None])
    assert ((turned - exact).norm() / exact.norm()).item() < 0.05, dt  # FP8's 3 mantissa bits
    wts, bf = torch.rand(M, IH), (a.float() * qs[..., None]).to(dt)
    for got, want in ((index_scores(bf, c1, wts, 0.3, s1), index_scores_reference(bf.float(), c1, wts, 0.3, s1)),
                      (index_scores(a, c1, wts, 0.3, s1, qs), index_scores_reference(a, c1, wts, 0.3, s1, qs))):
        assert got.shape == (M, T) and ((got - want).norm() / want.norm()).item() < tol, dt
# an all-zero key (its LayerNorm's weight and bias zero): zero codes and the floored scale, kernel and torch alike
zero = torch.zeros(ID)
for prepare in (index_prepare, index_prepare_reference):
    c, s = torch.randn(M, T, ID).to(INDEX_KEY_DTYPE), torch.rand(M, T)
    prepare(q.float(), k.float(), c, pos, cos, sin, zero, zero, 1e-6, s)
    assert not c[:, P].float().any() and torch.all(s[:, P] == E4M3_SCALE_FLOOR), (prepare.__name__, s[:, P])
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_hadamard_reference_is_orthonormal():
    from decode_gap.kernels.attention import hadamard_reference

    x = torch.eye(8)
    h = hadamard_reference(x)
    assert torch.allclose(h @ h.T, torch.eye(8), atol=1e-6) and torch.allclose(h, h.T)
    assert torch.allclose(h[1], torch.tensor([1.0, -1, 1, -1, 1, -1, 1, -1]) / 8**0.5)  # Sylvester's order
