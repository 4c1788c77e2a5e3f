"""Decode attention pieces for the kernel level as engines run them: rotary embedding as one kernel, MLA's
absorbed attention (DeepSeek-V3, GLM-5) as a split-KV flash-decoding kernel plus a combine, and the DSA indexer's
scores (GLM-5) as one kernel.

Why hand-written: in torch ops the rotary embedding of one tensor is seven kernels (chunk, four multiplies, a sum,
a difference, a concatenation) and MLA's attention over the latent cache five (scores, cast, scale, softmax, cast,
values), each a launch and a round trip through memory at decode sizes, where engines run one fused kernel (FlashMLA,
FlashInfer, SGLang's and vLLM's Triton decode attention). Softmax attention over a GQA cache keeps torch's
scaled_dot_product_attention, which is already one fused kernel.

MLA decode (`MlaDecode`): one token's H query heads in the latent space, q = [q_lat (L) | q_rope (R)], attend to the
latent cache rows [c (L) | k_rope (R)]: score = q_lat . c + q_rope . k_rope, and the value is c itself. Programs
split the cache (T) so that the GPU is full at one token; each keeps a running max and sum (online softmax) over
its blocks of BLOCK_T rows for BLOCK_H heads at a time (two tensor-core dots a block), and writes its partial output
and log-sum-exp; a combine kernel weighs the splits. `reference_mla` is the same in torch ops (the CPU path and the
tests' reference). H200 (2026-12-02, benchmarks/simulate_gpu.py, fp8, batch 1): the kernel level's attention
component for DeepSeek-V3's TP8 shapes went from 3.5 to 1.3 ms a step with rope and MLA fused, GLM-5's (TP1, with the
indexer) from 7.9 to 3.9 ms.
"""

from __future__ import annotations

import math

import torch

from ..errors import DecodeGapError
from .lowprec import _pow2, available
from .nvfp4 import HAVE_TRITON, interpreted, tl, triton  # Triton is optional (one import guard for the kernels)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding over the last dimension (cos, sin: its half)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def reference_mla(qq: torch.Tensor, kv: torch.Tensor, lora: int, scale: float) -> torch.Tensor:
    """qq [M, H, L+R], kv [M, T, L+R] -> [M, H, L] in qq's dtype (softmax in fp32)."""
    s = torch.bmm(qq, kv.transpose(1, 2)).float() * scale
    p = torch.softmax(s, dim=-1).to(qq.dtype)
    return torch.bmm(p, kv[..., :lora])


if HAVE_TRITON:

    @triton.jit
    def _rope_kernel(x, cos, sin, out, stride_x, HALF: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < HALF
        a = tl.load(x + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(x + row * stride_x + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(cos + offs, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(sin + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + row * 2 * HALF + offs, (a * c - b * s).to(out.dtype.element_ty), mask=mask)
        tl.store(out + row * 2 * HALF + HALF + offs, (b * c + a * s).to(out.dtype.element_ty), mask=mask)

    @triton.jit
    def _mla_split_kernel(q, kv, part, lse, T, t_per_split, H, scale,
                          stride_qm, stride_qh, stride_km, stride_kt, stride_pm, stride_ph, stride_ps,
                          stride_lm, stride_lh,
                          LORA: tl.constexpr, ROPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
                          F32_DOTS: tl.constexpr):
        pid_h, pid_s, m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        heads = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
        hmask = heads < H
        dl = tl.arange(0, LORA)
        dr = tl.arange(0, ROPE)
        qb = q + m * stride_qm + heads[:, None] * stride_qh
        q_lat = tl.load(qb + dl[None, :], mask=hmask[:, None], other=0.0)
        q_pe = tl.load(qb + LORA + dr[None, :], mask=hmask[:, None], other=0.0)
        if F32_DOTS:  # Triton's CPU interpreter mishandles bf16 dots: fp32 operands there, same indexing
            q_lat, q_pe = q_lat.to(tl.float32), q_pe.to(tl.float32)
        m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_H,), tl.float32)
        acc = tl.zeros((BLOCK_H, LORA), tl.float32)
        t0 = pid_s * t_per_split
        t1 = tl.minimum(t0 + t_per_split, T)
        for t in range(t0, t1, BLOCK_T):
            ts = t + tl.arange(0, BLOCK_T)
            tmask = ts < t1
            kb = kv + m * stride_km + ts[:, None] * stride_kt
            c = tl.load(kb + dl[None, :], mask=tmask[:, None], other=0.0)
            k_pe = tl.load(kb + LORA + dr[None, :], mask=tmask[:, None], other=0.0)
            if F32_DOTS:
                c, k_pe = c.to(tl.float32), k_pe.to(tl.float32)
            s = tl.dot(q_lat, tl.trans(c)) + tl.dot(q_pe, tl.trans(k_pe))
            s = tl.where(tmask[None, :], s * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
            m_i = m_new
        has = l_i > 0  # a split past the end of the cache leaves its heads empty (weight 0 in the combine)
        out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        tl.store(part + m * stride_pm + heads[:, None] * stride_ph + pid_s * stride_ps + dl[None, :], out,
                 mask=hmask[:, None])
        tl.store(lse + m * stride_lm + heads * stride_lh + pid_s,
                 tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf")), mask=hmask)

    @triton.jit
    def _mla_combine_kernel(part, lse, out, S, stride_pm, stride_ph, stride_ps, stride_lm, stride_lh,
                            stride_om, stride_oh, LORA: tl.constexpr, BLOCK_S: tl.constexpr):
        h, m = tl.program_id(0), tl.program_id(1)
        ss = tl.arange(0, BLOCK_S)
        smask = ss < S
        e = tl.load(lse + m * stride_lm + h * stride_lh + ss, mask=smask, other=float("-inf"))
        w = tl.exp(e - tl.max(e, axis=0))
        w = w / tl.sum(w, axis=0)
        dl = tl.arange(0, LORA)
        p = tl.load(part + m * stride_pm + h * stride_ph + ss[:, None] * stride_ps + dl[None, :],
                    mask=smask[:, None], other=0.0)
        o = tl.sum(p * w[:, None], axis=0)
        tl.store(out + m * stride_om + h * stride_oh + dl, o.to(out.dtype.element_ty))

    @triton.jit
    def _index_score_kernel(q, keys, wts, out, T, IH, stride_qm, stride_qh, stride_km, stride_kt, stride_wm,
                            stride_om, ID: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
                            F32_DOTS: tl.constexpr):
        pid_t, m = tl.program_id(0), tl.program_id(1)
        hs = tl.arange(0, BLOCK_H)
        hmask = hs < IH
        d = tl.arange(0, ID)
        qh = tl.load(q + m * stride_qm + hs[:, None] * stride_qh + d[None, :], mask=hmask[:, None], other=0.0)
        w = tl.load(wts + m * stride_wm + hs, mask=hmask, other=0.0).to(tl.float32)
        ts = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = ts < T
        k = tl.load(keys + m * stride_km + ts[:, None] * stride_kt + d[None, :], mask=tmask[:, None], other=0.0)
        if F32_DOTS:  # Triton's CPU interpreter mishandles bf16 dots: fp32 operands there, same indexing
            qh, k = qh.to(tl.float32), k.to(tl.float32)
        s = tl.maximum(tl.dot(qh, tl.trans(k)), 0.0)  # [heads, rows]
        tl.store(out + m * stride_om + ts, tl.sum(s * w[:, None], axis=0), mask=tmask)


def index_scores_reference(q: torch.Tensor, keys: torch.Tensor, wts: torch.Tensor) -> torch.Tensor:
    """The DSA indexer's scores: q [M, IH, ID], keys [M, T, ID], wts [M, IH] -> [M, T] fp32, the sum over the
    indexer heads of each head's weight times relu(q . key)."""
    s = torch.relu(torch.bmm(q, keys.transpose(1, 2))).float()
    return (s * wts.float().unsqueeze(-1)).sum(1)


def index_scores(q: torch.Tensor, keys: torch.Tensor, wts: torch.Tensor) -> torch.Tensor:
    """`index_scores_reference` as one Triton kernel (rows of the cache in blocks, every indexer head a block in
    one tensor-core dot) where Triton runs and the widths tile; else torch ops."""
    m, ih, idim = q.shape
    t = keys.shape[1]
    if (not available(q.device) or idim < 16 or idim != _pow2(idim) or ih > 128 or q.stride(2) != 1
            or keys.stride(2) != 1):
        return index_scores_reference(q, keys, wts)
    out = torch.empty((m, t), dtype=torch.float32, device=q.device)
    block_t = 64
    _index_score_kernel[(math.ceil(t / block_t), m)](
        q, keys, wts, out, t, ih, q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), wts.stride(0),
        out.stride(0), ID=idim, BLOCK_H=max(16, _pow2(ih)), BLOCK_T=block_t, F32_DOTS=interpreted(), num_warps=4)
    return out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding of x [..., R] as one Triton kernel (a new contiguous tensor); torch ops where
    Triton does not run."""
    if not available(x.device):
        return rope_reference(x, cos, sin)
    r = x.shape[-1]
    rows = x.reshape(-1, r)  # a view for the decode step's slices (one token's heads); else a copy
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rope_kernel[(rows.shape[0],)](rows, cos, sin, out, rows.stride(0), HALF=r // 2, BLOCK=_pow2(r // 2),
                                   num_warps=1)
    return out


class MlaDecode:
    """MLA's absorbed decode attention for M tokens of H heads over a latent cache of up to `t_max` rows, as a
    split-KV Triton kernel and a combine, into buffers it owns (graph-safe): call(qq [M, H, L+R], kv [M, T, L+R],
    scale) -> [M, H, L]."""

    BLOCK_T = 32

    def __init__(self, m: int, heads: int, lora: int, rope_dim: int, t_max: int, device, dtype=torch.bfloat16,
                 splits: int | None = None) -> None:
        for name, v in (("kv_lora_rank", lora), ("qk_rope_head_dim", rope_dim)):
            if v < 16 or v != _pow2(v):
                raise DecodeGapError(f"MLA decode kernel: {name} {v} is not a power of two of 16 or more")
        if not available(device):
            raise DecodeGapError("MLA decode kernel: needs Triton on a GPU (or TRITON_INTERPRET)")
        self.m, self.h, self.lora, self.rope = m, heads, lora, rope_dim
        self.block_h = 16  # the smallest tensor-core tile; its fp32 output [16, L] stays in registers
        head_tiles = math.ceil(heads / self.block_h)
        if splits is None:  # about two programs an SM, each at least one block of the cache (latency, not work)
            dev = torch.device(device)
            sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
            splits = max(1, min(math.ceil(2 * sms / (m * head_tiles)), math.ceil(t_max / self.BLOCK_T)))
        self.splits = splits
        self.part = torch.empty((m, heads, splits, lora), dtype=torch.float32, device=device)
        self.lse = torch.empty((m, heads, splits), dtype=torch.float32, device=device)
        self.out = torch.empty((m, heads, lora), dtype=dtype, device=device)

    label = "triton MLA decode (split-KV flash decoding + combine)"

    def __call__(self, qq: torch.Tensor, kv: torch.Tensor, scale: float) -> torch.Tensor:
        m, h, d = qq.shape
        if (m, h, d) != (self.m, self.h, self.lora + self.rope) or kv.shape[0] != m or kv.shape[2] != d:
            raise DecodeGapError(f"MLA decode kernel: q {tuple(qq.shape)}, kv {tuple(kv.shape)} do not fit "
                                 f"{self.m} x {self.h} heads of {self.lora}+{self.rope}")
        if qq.stride(2) != 1 or kv.stride(2) != 1:
            raise DecodeGapError("MLA decode kernel: q and kv need contiguous rows")
        t = kv.shape[1]
        per = math.ceil(math.ceil(t / self.splits) / self.BLOCK_T) * self.BLOCK_T
        _mla_split_kernel[(math.ceil(h / self.block_h), self.splits, m)](
            qq, kv, self.part, self.lse, t, per, h, float(scale),
            qq.stride(0), qq.stride(1), kv.stride(0), kv.stride(1), self.part.stride(0), self.part.stride(1),
            self.part.stride(2), self.lse.stride(0), self.lse.stride(1),
            LORA=self.lora, ROPE=self.rope, BLOCK_H=self.block_h, BLOCK_T=self.BLOCK_T, F32_DOTS=interpreted(),
            num_warps=4)
        _mla_combine_kernel[(h, m)](
            self.part, self.lse, self.out, self.splits, self.part.stride(0), self.part.stride(1),
            self.part.stride(2), self.lse.stride(0), self.lse.stride(1), self.out.stride(0), self.out.stride(1),
            LORA=self.lora, BLOCK_S=_pow2(self.splits), num_warps=4)
        return self.out
