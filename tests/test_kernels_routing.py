"""MoE routing (kernels.routing): the torch reference on known scores, and the fused Triton kernel against it under
TRITON_INTERPRET on the CPU (benchmarks/simulate_gpu.py and the MoE micro-benchmark run it on a GPU)."""

import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from decode_gap.kernels.routing import Routing, fused_fits, route_reference

REPO = Path(__file__).resolve().parents[1]


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_group_limited_selection_keeps_the_best_groups_by_their_top_two():
    """DeepSeek-V3's rule on 8 experts in 4 groups, 2 groups kept: group 0 holds the single best expert but a weak
    second, so groups 1 and 2 (better top-2 sums) win, and the top-2 experts come from them."""
    probs = [0.99, 0.01, 0.8, 0.75, 0.7, 0.9, 0.5, 0.5]  # group sums: 1.00, 1.55, 1.60, 1.00
    logits = torch.tensor([[_logit(p) for p in probs]])
    w, ids = route_reference(logits, Routing(8, 2, True, n_group=4, topk_group=2, norm=True, scale=2.0))
    assert sorted(ids[0].tolist()) == [2, 5]  # 0.9 (group 2) and 0.8 (group 1); expert 0 is in a dropped group
    assert torch.allclose(w.sum(), torch.tensor(2.0)) and math.isclose(w[0, 0].item(), 2 * 0.9 / 1.7, rel_tol=1e-5)


def test_selection_bias_picks_experts_but_does_not_weigh_them():
    logits = torch.tensor([[_logit(0.6), _logit(0.5), _logit(0.4)]])
    w, ids = route_reference(logits, Routing(3, 1, True, norm=False), bias=torch.tensor([0.0, 0.0, 0.5]))
    assert ids.tolist() == [[2]] and math.isclose(w.item(), 0.4, rel_tol=1e-5)


def test_softmax_routing_renormalises_the_top_k():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    w, ids = route_reference(logits, Routing(3, 2, False))
    assert ids.tolist() == [[0, 1]] and torch.allclose(w, torch.tensor([[0.625, 0.375]]))


def test_fused_kernel_says_why_it_does_not_fit():
    assert fused_fits(Routing(256, 8, True, 8, 4)) is None
    assert fused_fits(Routing(60, 4, False)) is None  # no groups: any expert count up to the limit
    assert "powers of two" in fused_fits(Routing(96, 8, True, 6, 3))
    assert "experts (the kernel holds" in fused_fits(Routing(4096, 8, False))


def test_fused_kernel_matches_the_reference_in_the_interpreter():
    """DeepSeek-V3 (256 experts, 8 groups, 4 kept, bias, scale 2.5), GLM-5 style (sigmoid + bias, no groups),
    softmax over a count that is not a power of two, and no renormalisation; three tokens each."""
    code = r'''
import torch
from decode_gap.kernels.routing import FusedRoute, Routing, route_reference, with_shared_slot
torch.manual_seed(0)
cases = [(Routing(256, 8, True, 8, 4, True, 2.5), True), (Routing(256, 8, True), True),
         (Routing(60, 4, False), False), (Routing(8, 2, False, norm=False), False)]
for r, with_bias in cases:
    logits = torch.randn(3, r.experts)
    bias = torch.randn(r.experts) * 0.1 if with_bias else None
    w, ids = FusedRoute(r, 3, "cpu")(logits, bias)
    rw, rids = route_reference(logits, r, bias)
    got, want = ids.long().sort(-1), rids.sort(-1)
    assert torch.equal(got.values, want.values), (r, ids, rids)
    assert torch.allclose(w.gather(1, got.indices), rw.gather(1, want.indices), atol=1e-6), (r, w, rw)
# the shared expert as one more column (slot E, weight 1), written by the same kernel
r = Routing(256, 8, True, 8, 4, True, 2.5)
logits, bias = torch.randn(3, r.experts), torch.randn(r.experts) * 0.1
w, ids = FusedRoute(r, 3, "cpu", shared_slot=r.experts)(logits, bias)
rw, rids = with_shared_slot(*route_reference(logits, r, bias), r.experts)
assert w.shape == ids.shape == (3, 9) and torch.equal(ids[:, 8].long(), rids[:, 8]) and bool((w[:, 8] == 1).all())
got, want = ids[:, :8].long().sort(-1), rids[:, :8].sort(-1)
assert torch.equal(got.values, want.values)
assert torch.allclose(w[:, :8].gather(1, got.indices), rw[:, :8].gather(1, want.indices), atol=1e-6)
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]
