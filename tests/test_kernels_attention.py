"""The kernel level's fused attention pieces (kernels.attention) against torch ops under TRITON_INTERPRET on the
CPU: MLA's split-KV decode (heads not a multiple of the 16-head tile, one and several splits, a split past the end
of the cache, fp32 and bf16) and the one-kernel rotary embedding of a strided slice. benchmarks/lowprec_device.py
checks them again on a GPU at DeepSeek-V3's sizes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decode_gap.errors import DecodeGapError
from decode_gap.kernels.attention import MlaDecode, reference_mla, rope_reference

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
