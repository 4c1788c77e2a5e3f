"""The Triton GEMV candidate: numerics against torch.mm under TRITON_INTERPRET=1 (the GPU run checks it again)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from decode_gap.microbench import gemv

REPO = Path(__file__).resolve().parents[1]


def test_not_offered_on_cpu():
    import torch

    assert not gemv.available(torch.device("cpu"))


@pytest.mark.skipif(gemv.triton is None, reason="Triton is not installed (pip install triton runs its CPU interpreter)")
def test_triton_gemv_matches_torch_mm_in_the_interpreter():
    code = r'''
import torch
from decode_gap.microbench import gemv
torch.manual_seed(0)
for cfg in gemv.CONFIGS:
    for n, k in [(40, 96), (33, 1030), (8, 2048)]:
        w = torch.randn(n, k)
        x = torch.randn(1, k)
        out = torch.full((n,), float("nan"))
        gemv.make_calls([w], x, cfg)[0]()
        gemv.gemv(w, x.reshape(-1), out, cfg)
        ref = (x @ w.t()).reshape(-1)
        err = ((out - ref).abs().max() / ref.abs().max()).item()
        assert err < 1e-5, (cfg, n, k, err)
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ok")
