"""MoE routing for a decode step: scoring, DeepSeek's group-limited selection and top-k in one Triton kernel.

Why hand-written: in torch ops the routing of one token is a dozen small kernels (sigmoid, bias, the groups' top-2
sums, the groups' top-k, a scatter, a mask, the experts' top-k, a gather, the normalisation), each a launch and a
trip through memory for 256 scores; at decode that is tens of microseconds a layer, where engines run one fused
kernel (SGLang's moe_fused_gate, vLLM's grouped_topk). One program (one warp) a token holds its E scores in registers
and selects with repeated max-with-index (k and the group count are small), so the result is one kernel whatever the
model; the chosen experts' weights are then computed again from their logits, read back from L1.
H200 (2026-12-02, the MoE micro-benchmark, router GEMM included): DeepSeek-V3 52.1 -> 11.1 us a token, GLM-5 25.8 ->
10.2 us; 11-12 us from 1 to 64 tokens.

`route_reference` is the same selection in torch ops: the CPU path, the fallback where the kernel does not fit
(groups of a size that is not a power of two) and the reference the tests hold the kernel to. Between tied scores
(bf16 logits tie often) the two may pick different experts; either is a right answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import DecodeGapError
from .lowprec import _pow2
from .nvfp4 import HAVE_TRITON, tl, triton  # Triton is optional (one import guard for the kernels)

MAX_EXPERTS = 1024  # one program holds a token's scores in registers
# warps a token's program: one keeps every reduction in shuffles, with no barrier between warps (sm_90: 0 barriers
# and 113 shuffles, where 4 warps took 35 and 153). With each pick one max-with-index instead of an argmax and a
# masked sum, GLM-5's routing (256 experts, 8 groups, 4 kept, top 8 and the shared slot) took 4.18 -> 2.62 us, the
# router component (its GEMV and this) 10.8-11.7 -> 9.4-9.8 us a layer in CUDA graphs (H100, 2026-12-06,
# benchmarks/device/step_profile.py)
ROUTE_WARPS = 1


@dataclass(frozen=True)
class Routing:
    """How a model's router turns logits into the top-k experts and their weights."""

    experts: int
    top_k: int
    sigmoid: bool  # DeepSeek-V3 / GLM: sigmoid scores (+ a selection bias); else softmax over all experts
    n_group: int = 1  # group-limited selection: keep the topk_group groups with the best top-2 sums
    topk_group: int = 1
    norm: bool = True  # renormalise the k weights to sum to one
    scale: float = 1.0  # routed_scaling_factor


def route_reference(logits: torch.Tensor, r: Routing, bias: torch.Tensor | None = None):
    """logits [M, E] -> (weights [M, k] fp32, ids [M, k] int64), in torch ops."""
    logits = logits.float()
    scores = logits.sigmoid() if r.sigmoid else logits.softmax(dim=-1)
    choice = scores + bias if bias is not None else scores
    if r.n_group > 1:
        m = logits.shape[0]
        grouped = choice.view(m, r.n_group, -1)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        keep = group_scores.topk(r.topk_group, dim=-1).indices
        mask = torch.zeros_like(group_scores).scatter_(1, keep, 1.0)
        choice = grouped.masked_fill(mask[..., None] == 0, float("-inf")).view(m, -1)
    ids = choice.topk(r.top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if r.norm:
        weights = weights / weights.sum(-1, keepdim=True).clamp(min=1e-20)
    return weights * r.scale, ids


def fused_fits(r: Routing) -> str | None:
    """None where the fused kernel takes this routing, else why not."""
    if not HAVE_TRITON:
        return "Triton is not installed"
    if r.experts > MAX_EXPERTS:
        return f"{r.experts} experts (the kernel holds up to {MAX_EXPERTS} a token)"
    if not 1 <= r.top_k <= r.experts:
        return f"top_k {r.top_k} of {r.experts} experts"
    if r.n_group > 1:
        if r.experts % r.n_group or r.experts != _pow2(r.experts) or r.n_group != _pow2(r.n_group):
            return f"{r.experts} experts in {r.n_group} groups (powers of two only)"
        if not 1 <= r.topk_group <= r.n_group or r.experts // r.n_group < 2:
            return f"topk_group {r.topk_group} of {r.n_group} groups of {r.experts // r.n_group}"
    return None


if HAVE_TRITON:

    @triton.jit
    def _route_kernel(logits, bias, out_w, out_ids, E, stride_l, scale, shared_id,
                      BLOCK_E: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, N_GROUP: tl.constexpr,
                      TOPK_GROUP: tl.constexpr, SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
                      SHARED: tl.constexpr = False):
        """One token's top-K experts and weights; SHARED: a (K+1)-th column, the shared expert as slot shared_id
        with weight 1 (its output is added unscaled), written by this kernel so the fused MoE runs it too."""
        m = tl.program_id(0)
        offs = tl.arange(0, BLOCK_E)
        valid = offs < E
        lg = tl.load(logits + m * stride_l + offs, mask=valid, other=float("-inf")).to(tl.float32)
        if SIGMOID:
            scores = tl.where(valid, 1.0 / (1.0 + tl.exp(-lg)), 0.0)
        else:
            top = tl.max(lg, axis=0)
            ex = tl.where(valid, tl.exp(lg - top), 0.0)
            total = tl.sum(ex, axis=0)
            scores = ex / total
        choice = scores
        if HAS_BIAS:
            choice = choice + tl.load(bias + offs, mask=valid, other=0.0).to(tl.float32)
        choice = tl.where(valid, choice, float("-inf"))
        if N_GROUP > 1:  # E == BLOCK_E here (fused_fits): the groups are rows of a [N_GROUP, G] view
            G: tl.constexpr = BLOCK_E // N_GROUP
            grouped = tl.reshape(choice, (N_GROUP, G))
            col = tl.arange(0, G)[None, :]
            first = tl.argmax(grouped, axis=1)
            top2 = tl.max(grouped, axis=1) + tl.max(tl.where(col == first[:, None], float("-inf"), grouped), axis=1)
            gidx = tl.arange(0, N_GROUP)
            keep = gidx < 0
            for _ in tl.static_range(TOPK_GROUP):
                best = tl.argmax(top2, axis=0)
                keep = keep | (gidx == best)
                top2 = tl.where(gidx == best, float("-inf"), top2)
            choice = tl.reshape(tl.where(keep[:, None], grouped, float("-inf")), (BLOCK_E,))
        kidx = tl.arange(0, BLOCK_K)
        ids = tl.zeros((BLOCK_K,), dtype=tl.int32)
        for j in tl.static_range(K):  # one reduction a pick; the picks' scores are read back after the loop
            _, best = tl.max(choice, axis=0, return_indices=True)
            ids = tl.where(kidx == j, best, ids)
            choice = tl.where(offs == best, float("-inf"), choice)
        # the chosen experts' scores from their logits (in L1: loaded above), not a masked sum a pick
        lk = tl.load(logits + m * stride_l + ids, mask=kidx < K, other=float("-inf")).to(tl.float32)
        if SIGMOID:
            w = tl.where(kidx < K, 1.0 / (1.0 + tl.exp(-lk)), 0.0)
        else:
            w = tl.where(kidx < K, tl.exp(lk - top) / total, 0.0)
        if NORM:
            w = w / tl.maximum(tl.sum(w, axis=0), 1e-20)
        w = w * scale
        KO: tl.constexpr = K + 1 if SHARED else K
        if SHARED:
            ids = tl.where(kidx == K, shared_id, ids)
            w = tl.where(kidx == K, 1.0, w)
        tl.store(out_w + m * KO + kidx, w, mask=kidx < KO)
        tl.store(out_ids + m * KO + kidx, ids, mask=kidx < KO)


def with_shared_slot(weights: torch.Tensor, ids: torch.Tensor, slot: int):
    """(weights, ids) [M, k] -> [M, k + 1]: the shared expert as expert `slot` with weight 1, as SGLang's
    shared-experts fusion appends it for the fused MoE (torch ops; FusedRoute writes the column in its kernel)."""
    ones = torch.ones_like(weights[:, :1])
    return torch.cat((weights, ones), dim=1), torch.cat((ids, torch.full_like(ids[:, :1], slot)), dim=1)


class FusedRoute:
    """The routing of M tokens as one Triton kernel into buffers it owns (graph-safe): call(logits [M, E][, bias])
    -> (weights [M, k] fp32, ids [M, k] int32); with `shared_slot`, [M, k + 1], the last column the shared expert
    (`with_shared_slot`)."""

    def __init__(self, r: Routing, m: int, device, shared_slot: int | None = None, warps: int = ROUTE_WARPS) -> None:
        why = fused_fits(r)
        if why:
            raise DecodeGapError(f"fused routing: {why}")
        self.r, self.m, self.shared_slot, self.warps = r, m, shared_slot, warps
        cols = r.top_k + (shared_slot is not None)
        self.weights = torch.empty((m, cols), dtype=torch.float32, device=device)
        self.ids = torch.empty((m, cols), dtype=torch.int32, device=device)

    label = "triton fused routing (scores, group-limited top-k, weights)"

    def __call__(self, logits: torch.Tensor, bias: torch.Tensor | None = None):
        r = self.r
        if logits.shape != (self.m, r.experts) or logits.stride(1) != 1:
            raise DecodeGapError(f"fused routing: logits {tuple(logits.shape)}, expected {(self.m, r.experts)} "
                                 "with contiguous rows")
        shared = self.shared_slot is not None
        _route_kernel[(self.m,)](
            logits, bias if bias is not None else logits, self.weights, self.ids, r.experts, logits.stride(0),
            float(r.scale), self.shared_slot or 0, BLOCK_E=_pow2(r.experts), K=r.top_k,
            BLOCK_K=_pow2(r.top_k + shared), N_GROUP=r.n_group, TOPK_GROUP=r.topk_group, SIGMOID=r.sigmoid,
            HAS_BIAS=bias is not None, NORM=r.norm, SHARED=shared, num_warps=self.warps)
        return self.weights, self.ids
