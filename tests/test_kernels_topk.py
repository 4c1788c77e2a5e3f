"""The DSA indexer's radix-select top-k (`kernels.topk`) in Triton's CPU interpreter: the scores it keeps are
torch.topk's exactly, every index once, ties at the threshold filled in index order."""

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
from decode_gap.kernels.topk import MAX_ROW, topk_indices, topk_indices_reference
torch.manual_seed(0)
cases = [(1, 100, 7), (2, 5000, 2048), (3, 2049, 2048), (1, MAX_ROW, 33), (1, 64, 63)]
for m, t, k in cases:
    s = torch.randn(m, t) * 3
    s[0, :10] = 0.5   # equal scores
    s[0, 10:20] = -0.0  # and signed zeros beside positive ones
    s[0, 20] = float("-inf")
    got = topk_indices(s, k)
    assert got.dtype == torch.int32 and got.shape == (m, k), (got.dtype, got.shape)
    ref = topk_indices_reference(s, k)
    for i in range(m):
        assert len(set(got[i].tolist())) == k, (m, t, k, i)
        assert torch.equal(s[i, got[i].long()].sort().values, s[i, ref[i]].sort().values), (m, t, k, i)
s = torch.zeros(2, 300)
s[:, 5] = 1
assert sorted(topk_indices(s, 10)[1].tolist()) == list(range(10))  # 5, then the first 9 zeros in index order
assert topk_indices(torch.randn(2, 5), 8).tolist() == [list(range(5))] * 2  # k >= T: every index
assert topk_indices(torch.randn(1, MAX_ROW + 1), 4).dtype == torch.int64  # past MAX_ROW: torch.topk
print("ok")
''')


def test_radix_select_refuses_what_it_cannot_take():
    import torch

    from decode_gap.errors import DecodeGapError
    from decode_gap.kernels.topk import topk_indices

    with pytest.raises(DecodeGapError, match="fp32 scores"):
        topk_indices(torch.randn(4, dtype=torch.float32), 2)
    with pytest.raises(DecodeGapError, match="fp32 scores"):
        topk_indices(torch.randn(1, 8, dtype=torch.bfloat16), 2)
