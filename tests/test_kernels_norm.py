"""The kernel level's norms (kernels.norm): one Triton kernel a norm, and the residual add fused into the norm,
against torch under TRITON_INTERPRET on the CPU; without Triton in play (a plain CPU run) they are torch's own."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from decode_gap.kernels.norm import add_rms_norm, rms_norm

REPO = Path(__file__).resolve().parents[1]


def test_without_the_interpreter_the_cpu_runs_torchs_norm():
    x, o, w = torch.randn(2, 64), torch.randn(2, 64), torch.rand(64)
    assert torch.equal(rms_norm(x, w, 1e-6), torch.nn.functional.rms_norm(x, (64,), w, 1e-6))
    total, h = add_rms_norm(x, o, w, 1e-6)
    assert torch.equal(total, x + o) and torch.equal(h, torch.nn.functional.rms_norm(x + o, (64,), w, 1e-6))


def test_triton_norms_match_torch_in_the_interpreter():
    """A width that is not a power of two, a strided slice (the MLA latent's rows), fp32 and bf16."""
    code = r'''
import torch
from decode_gap.kernels.norm import add_rms_norm, rms_norm
F = torch.nn.functional
torch.manual_seed(0)
for dt, tol in ((torch.float32, 1e-6), (torch.bfloat16, 4e-2)):
    x, o, w = torch.randn(3, 100).to(dt), torch.randn(3, 100).to(dt), torch.rand(100).to(dt)
    assert (rms_norm(x, w, 1e-6).float() - F.rms_norm(x, (100,), w, 1e-6).float()).abs().max() <= tol
    total, h = add_rms_norm(x, o, w, 1e-6)
    assert (total.float() - (x + o).float()).abs().max() <= tol
    assert (h.float() - F.rms_norm(x + o, (100,), w, 1e-6).float()).abs().max() <= tol
    xs = torch.randn(2, 120).to(dt)[:, :100]
    assert (rms_norm(xs, w, 1e-6).float() - F.rms_norm(xs, (100,), w, 1e-6).float()).abs().max() <= tol
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]
