"""Decode attention pieces for the kernel level as engines run them: rotary embedding as one kernel, GQA's qk-norm,
rotary embedding and cache writes of one token's qkv row as one kernel, decode attention over a GQA cache and over
MLA's latent cache (DeepSeek-V3, GLM-5) as split-KV flash-decoding kernels plus a combine, MLA's decode input (the
latent row's norm, both rotations and the cache write) as one kernel, and the DSA indexer's scores (GLM-5) as one
kernel.

Why hand-written: in torch ops the rotary embedding of one tensor is seven kernels (chunk, four multiplies, a sum,
a difference, a concatenation) and MLA's attention over the latent cache five (scores, cast, scale, softmax, cast,
values), each a launch and a round trip through memory at decode sizes, where engines run one fused kernel (FlashMLA,
FlashInfer, SGLang's and vLLM's Triton decode attention). torch's SDPA kernels are fused but not made for one query
token: a program per (sequence, head) or per query block leaves most SMs idle at batch 1 on short caches.

Split-KV decode (`MlaDecode`, `GqaDecode`): programs split the cache (T) so that the GPU is full at one token; each
keeps a running max and sum (online softmax) over its blocks of BLOCK_T rows for a tile of 16+ query heads (MLA: 16
heads; GQA: one KV head's whole group, so each key and value row is read once for it) with tensor-core dots, and
writes its partial output and log-sum-exp; a combine kernel weighs the splits. MLA: q = [q_lat (L) | q_rope (R)]
against the latent rows [c (L) | k_rope (R)], score = q_lat . c + q_rope . k_rope, and the value is c itself.
`reference_mla` / `reference_gqa` are the same in torch ops (the CPU path and the tests' reference).

H200 (2026-12-02, benchmarks/simulate_gpu.py, fp8, batch 1, 512-token context): the kernel level's attention
component for DeepSeek-V3's TP8 shapes went from 3.5 to 1.3 ms a step with rope and MLA fused, GLM-5's (TP1, with the
indexer) from 7.9 to 3.9 ms; with the GQA kernels Llama-3.1-8B's from 0.54 to 0.27 ms, Llama-3.1-70B TP8's from 1.07
to 0.59, Qwen3-30B-A3B's from 0.93 to 0.40. benchmarks/attention_device.py against the fastest SDPA backend (cuDNN's
or flash): 1.3-1.6x faster at 512 tokens, up to 1.7x on 32k-token caches with one KV head a GPU, even on Llama-3.1-8B
at 32k, and up to 20% slower at 8 sequences of 4k-32k tokens, where the kernel level keeps SDPA (it times both).
DSA's sparse MLA over the 2048 rows GLM-5's indexer keeps, read in place through their indices
(`MlaDecode(..., rows=)`): 22.4 us at one token against 41.0 for torch's gather + matmuls, 56.8 against 91.1 at eight.
Tried and left out: every kernel here launched as a programmatic dependent of the one before (griddepcontrol.wait
first): the GLM-5-NVFP4 TP8 attention at a 4096-token context, 1 row, 41.8-41.9 against 42.1-42.3 us a layer in
CUDA graphs (H100, 2026-12-06), its ten kernels' 33.5 us unchanged: the gaps between them are not launch latency.
At TP8's 8 heads a token, the sparse MLA split 64 or 128 ways took 8.9 / 8.5 us against 9.8 for the default 32 at
one token (split and combine, H100, mla_probe.py --heads 8), and was slower at eight (18.2 / 26.5 against 14.0).
"""

from __future__ import annotations

import math

import torch

from ..errors import DecodeGapError
from .lowprec import _pow2, _to_fp8_rounded, available
from .norm import rms_norm_reference
# Triton is optional (one import guard for the kernels)
from .nvfp4 import HAVE_TRITON, interpreted, quantize_e4m3_groups, tl, triton

if HAVE_TRITON:
    from .nvfp4 import e4m3_scale_tl


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
    def _rotate(a, b, c, s):
        """Rotate-half rotary embedding of the halves a, b (fp32) by cos c and sin s."""
        return a * c - b * s, b * c + a * s

    @triton.jit
    def _rope_kernel(x, cos, sin, out, stride_x, HALF: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < HALF
        a = tl.load(x + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(x + row * stride_x + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(cos + offs, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(sin + offs, mask=mask, other=0.0).to(tl.float32)
        ra, rb = _rotate(a, b, c, s)
        tl.store(out + row * 2 * HALF + offs, ra.to(out.dtype.element_ty), mask=mask)
        tl.store(out + row * 2 * HALF + HALF + offs, rb.to(out.dtype.element_ty), mask=mask)

    @triton.jit
    def _online_softmax(s, v, m_i, l_i, acc):
        """One block of the split-KV decode loop: scores s [heads, rows] (masked rows -inf) against values v
        [rows, width] folded into the running max m_i, sum l_i and output acc (flash attention's online softmax)."""
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def _store_split(part_s, lse_s, heads, hmask, cols, stride_ph, stride_lh, m_i, l_i, acc):
        """A split's normalised partial output and log-sum-exp per head (part_s, lse_s: this token's split)."""
        has = l_i > 0  # a split past the end of the cache leaves its heads empty (weight 0 in the combine)
        out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        tl.store(part_s + heads[:, None] * stride_ph + cols[None, :], out, mask=hmask[:, None])
        tl.store(lse_s + heads * stride_lh, tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf")),
                 mask=hmask)

    @triton.jit
    def _mla_split_kernel(q, kv, part, lse, rows, T, t_per_split, H, scale,
                          stride_qm, stride_qh, stride_km, stride_kt, stride_pm, stride_ph, stride_ps,
                          stride_lm, stride_lh, stride_rm,
                          LORA: tl.constexpr, ROPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
                          HAS_ROWS: tl.constexpr, F32_DOTS: tl.constexpr):
        pid_h, pid_s, m = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)  # caches past 2^31
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
            if HAS_ROWS:  # DSA: the i-th row attended is the cache row the indexer selected i-th
                tr = tl.load(rows + m * stride_rm + ts, mask=tmask, other=0).to(tl.int64)
            else:
                tr = ts.to(tl.int64)
            kb = kv + m * stride_km + tr[:, None] * stride_kt
            c = tl.load(kb + dl[None, :], mask=tmask[:, None], other=0.0)
            k_pe = tl.load(kb + LORA + dr[None, :], mask=tmask[:, None], other=0.0)
            if F32_DOTS:
                c, k_pe = c.to(tl.float32), k_pe.to(tl.float32)
            s = tl.dot(q_lat, tl.trans(c)) + tl.dot(q_pe, tl.trans(k_pe))
            s = tl.where(tmask[None, :], s * scale, float("-inf"))
            m_i, l_i, acc = _online_softmax(s, c, m_i, l_i, acc)
        _store_split(part + m * stride_pm + pid_s * stride_ps, lse + m * stride_lm + pid_s, heads, hmask, dl,
                     stride_ph, stride_lh, m_i, l_i, acc)

    @triton.jit
    def _combine_kernel(part, lse, out, S, stride_pm, stride_ph, stride_ps, stride_lm, stride_lh,
                        stride_om, stride_oh, BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr):
        """Weighs one head's split partials by their log-sum-exp, BLOCK_W output columns a program. The splits are
        read BLOCK_S at a time: a whole [splits, width] tile in registers spilled (H200: 50-260 us where the
        splits ran to hundreds)."""
        h, m, pw = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
        lb = lse + m * stride_lm + h * stride_lh
        mx = tl.full((BLOCK_S,), float("-inf"), tl.float32)
        for s0 in range(0, S, BLOCK_S):
            ss = s0 + tl.arange(0, BLOCK_S)
            mx = tl.maximum(mx, tl.load(lb + ss, mask=ss < S, other=float("-inf")))
        top = tl.max(mx, axis=0)
        dw = pw * BLOCK_W + tl.arange(0, BLOCK_W)
        acc = tl.zeros((BLOCK_W,), tl.float32)
        total = tl.zeros((BLOCK_S,), tl.float32)
        for s0 in range(0, S, BLOCK_S):
            ss = s0 + tl.arange(0, BLOCK_S)
            smask = ss < S
            w = tl.exp(tl.load(lb + ss, mask=smask, other=float("-inf")) - top)  # empty splits weigh 0
            p = tl.load(part + m * stride_pm + h * stride_ph + ss[:, None] * stride_ps + dw[None, :],
                        mask=smask[:, None], other=0.0)
            acc += tl.sum(p * w[:, None], axis=0)
            total += w
        tl.store(out + m * stride_om + h * stride_oh + dw, (acc / tl.sum(total, axis=0)).to(out.dtype.element_ty))

    @triton.jit
    def _gqa_split_kernel(q, k, v, part, lse, T, t_per_split, G, scale,
                          stride_qm, stride_qh, stride_km, stride_kh, stride_kt, stride_vm, stride_vh, stride_vt,
                          stride_pm, stride_ph, stride_ps, stride_lm, stride_lh,
                          D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, F32_DOTS: tl.constexpr):
        """One KV head's G query heads (a tensor-core tile of BLOCK_H rows) over one split of its cache rows."""
        kvh, pid_s, m = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        g = tl.arange(0, BLOCK_H)
        gmask = g < G
        heads = kvh * G + g
        d = tl.arange(0, D)
        qh = tl.load(q + m * stride_qm + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
        if F32_DOTS:  # Triton's CPU interpreter mishandles bf16 dots: fp32 operands there, same indexing
            qh = qh.to(tl.float32)
        kb = k + m * stride_km + kvh * stride_kh
        vb = v + m * stride_vm + kvh * stride_vh
        m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_H,), tl.float32)
        acc = tl.zeros((BLOCK_H, D), tl.float32)
        t0 = pid_s * t_per_split
        t1 = tl.minimum(t0 + t_per_split, T)
        for t in range(t0, t1, BLOCK_T):
            ts = t + tl.arange(0, BLOCK_T)
            tmask = ts < t1
            kt = tl.load(kb + ts[:, None] * stride_kt + d[None, :], mask=tmask[:, None], other=0.0)
            vt = tl.load(vb + ts[:, None] * stride_vt + d[None, :], mask=tmask[:, None], other=0.0)
            if F32_DOTS:
                kt, vt = kt.to(tl.float32), vt.to(tl.float32)
            s = tl.where(tmask[None, :], tl.dot(qh, tl.trans(kt)) * scale, float("-inf"))
            m_i, l_i, acc = _online_softmax(s, vt, m_i, l_i, acc)
        _store_split(part + m * stride_pm + pid_s * stride_ps, lse + m * stride_lm + pid_s, heads, gmask, d,
                     stride_ph, stride_lh, m_i, l_i, acc)

    @triton.jit
    def _qkv_rope_append_kernel(qkv, q_out, kc, vc, pos, cos, sin, qn, kn, eps, H, KV,
                                stride_xm, stride_om, stride_oh, stride_km, stride_kh, stride_kt,
                                stride_vm, stride_vh, stride_vt, HALF: tl.constexpr, NORM: tl.constexpr):
        """Head r of one token's fused qkv row (q heads, then k, then v): q and k (RMS-normed per head first where
        NORM) get the rotary embedding, q into q_out, k into the key cache at row pos; v is copied into the value
        cache at row pos."""
        r, m = tl.program_id(0), tl.program_id(1).to(tl.int64)
        offs = tl.arange(0, HALF)
        src = qkv + m * stride_xm + r * 2 * HALF
        a = tl.load(src + offs)
        b = tl.load(src + HALF + offs)
        t = tl.load(pos).to(tl.int64)
        if r < H + KV:
            fa, fb = a.to(tl.float32), b.to(tl.float32)
            if NORM:  # per-head RMSNorm (qk-norm), rounded to the row's dtype as the unfused ops would
                if r < H:
                    wa, wb = tl.load(qn + offs).to(tl.float32), tl.load(qn + HALF + offs).to(tl.float32)
                else:
                    wa, wb = tl.load(kn + offs).to(tl.float32), tl.load(kn + HALF + offs).to(tl.float32)
                inv = 1.0 / tl.sqrt((tl.sum(fa * fa, axis=0) + tl.sum(fb * fb, axis=0)) / (2 * HALF) + eps)
                fa = (fa * inv * wa).to(qkv.dtype.element_ty).to(tl.float32)
                fb = (fb * inv * wb).to(qkv.dtype.element_ty).to(tl.float32)
            c = tl.load(cos + offs).to(tl.float32)
            sn = tl.load(sin + offs).to(tl.float32)
            ra, rb = _rotate(fa, fb, c, sn)
            ra, rb = ra.to(q_out.dtype.element_ty), rb.to(q_out.dtype.element_ty)
            if r < H:
                qdst = q_out + m * stride_om + r * stride_oh
                tl.store(qdst + offs, ra)
                tl.store(qdst + HALF + offs, rb)
            else:
                kdst = kc + m * stride_km + (r - H) * stride_kh + t * stride_kt
                tl.store(kdst + offs, ra.to(kc.dtype.element_ty))
                tl.store(kdst + HALF + offs, rb.to(kc.dtype.element_ty))
        else:
            vdst = vc + m * stride_vm + (r - H - KV) * stride_vh + t * stride_vt
            tl.store(vdst + offs, a.to(vc.dtype.element_ty))
            tl.store(vdst + HALF + offs, b.to(vc.dtype.element_ty))

    @triton.jit
    def _mla_prepare_kernel(q_lat, q_pe, kv, cache, qq, pos, cos, sin, kvn, eps, H,
                            stride_lm, stride_lh, stride_pm, stride_ph, stride_kvm, stride_cm, stride_ct,
                            stride_qm, stride_qh, LORA: tl.constexpr, HALF: tl.constexpr):
        """Program r < H: head r of qq = [q_lat | rope(q_pe)]; program H: the token's latent row [RMSNorm(c) |
        rope(k_pe)] into the cache at row pos (both rounded to the row's dtype as the unfused ops would)."""
        r, m = tl.program_id(0), tl.program_id(1).to(tl.int64)
        lat = tl.arange(0, LORA)
        offs = tl.arange(0, HALF)
        c = tl.load(cos + offs).to(tl.float32)
        sn = tl.load(sin + offs).to(tl.float32)
        if r < H:
            src = q_pe + m * stride_pm + r * stride_ph
            dst = qq + m * stride_qm + r * stride_qh
            tl.store(dst + lat, tl.load(q_lat + m * stride_lm + r * stride_lh + lat).to(qq.dtype.element_ty))
        else:
            row = kv + m * stride_kvm
            x = tl.load(row + lat).to(tl.float32)
            inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / LORA + eps)
            dst = cache + m * stride_cm + tl.load(pos).to(tl.int64) * stride_ct
            tl.store(dst + lat, (x * inv * tl.load(kvn + lat).to(tl.float32)).to(cache.dtype.element_ty))
            src = row + LORA
        a = tl.load(src + offs).to(tl.float32)
        b = tl.load(src + HALF + offs).to(tl.float32)
        ra, rb = _rotate(a, b, c, sn)
        tl.store(dst + LORA + offs, ra.to(dst.dtype.element_ty))
        tl.store(dst + LORA + HALF + offs, rb.to(dst.dtype.element_ty))

    @triton.jit
    def _layer_norm_piece(src, w, bias, o, mean, inv, mask):
        """LayerNorm of the values at src + o, given the row's mean and 1/std, rounded to the row's dtype."""
        x = tl.load(src + o, mask=mask, other=0.0).to(tl.float32)
        y = ((x - mean) * inv * tl.load(w + o, mask=mask, other=0.0).to(tl.float32)
             + tl.load(bias + o, mask=mask, other=0.0).to(tl.float32))
        return y.to(src.dtype.element_ty).to(tl.float32)

    @triton.jit
    def _hadamard(x, D: tl.constexpr, LOG: tl.constexpr):
        """x [D] (fp32) times the D x D Hadamard matrix in Sylvester's order, unnormalised: LOG butterfly stages."""
        for s in tl.static_range(LOG):
            pairs = tl.permute(tl.reshape(x, (D // (2 << s), 2, 1 << s)), (0, 2, 1))
            a, b = tl.split(pairs)
            x = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), (D,))
        return x

    @triton.jit
    def _index_prepare_kernel(q, k, cache, kscale, q_out, qscale, pos, cos, sin, kw, kb, eps, IH, stride_qm,
                              stride_qh, stride_km, stride_cm, stride_ct, stride_sm, stride_om, stride_oh, stride_qsm,
                              ID: tl.constexpr, HALF: tl.constexpr, FP8: tl.constexpr, LOG_ID: tl.constexpr,
                              ROUND: tl.constexpr):
        """Program r < IH: indexer head r of q, its first 2 HALF values rotated, into q_out; program IH: the token's
        indexer key LayerNormed, its first 2 HALF values rotated, into the key cache at row pos. With FP8, both then
        times the normalised Hadamard matrix, rounded to q's dtype, and stored as FP8 codes with their scale (amax /
        448): the head's into qscale [M, IH], the key's into kscale [M, T] at row pos."""
        r, m = tl.program_id(0), tl.program_id(1).to(tl.int64)
        d = tl.arange(0, ID)
        turned = d < 2 * HALF
        partner = tl.where(d < HALF, d + HALF, tl.where(turned, d - HALF, d))  # rope's other half; itself past it
        if r < IH:
            src = q + m * stride_qm + r * stride_qh
            x = tl.load(src + d).to(tl.float32)
            xp = tl.load(src + partner).to(tl.float32)
        else:
            src = k + m * stride_km
            raw = tl.load(src + d).to(tl.float32)
            mean = tl.sum(raw, axis=0) / ID
            inv = 1.0 / tl.sqrt(tl.sum((raw - mean) * (raw - mean), axis=0) / ID + eps)
            x = _layer_norm_piece(src, kw, kb, d, mean, inv, d < ID)
            xp = _layer_norm_piece(src, kw, kb, partner, mean, inv, d < ID)
        c = tl.load(cos + d % HALF, mask=turned, other=1.0).to(tl.float32)
        sn = tl.load(sin + d % HALF, mask=turned, other=0.0).to(tl.float32)
        v = x * c + tl.where(d < HALF, -xp, xp) * sn  # as _rotate: a c - b s, b c + a s
        if FP8:  # rounded as the reference rounds the rotated row, then turned (1/sqrt(ID) keeps its norm)
            v = _hadamard(v.to(q.dtype.element_ty).to(tl.float32), ID, LOG_ID) * (ID ** -0.5)
            v = v.to(q.dtype.element_ty).to(tl.float32)
            scale = e4m3_scale_tl(tl.max(tl.abs(v), axis=0))  # as quantize_e4m3_groups
            v = _to_fp8_rounded(v / scale, ROUND)
            if r < IH:
                tl.store(q_out + m * stride_om + r * stride_oh + d, v)
                tl.store(qscale + m * stride_qsm + r, scale)
            else:
                row = tl.load(pos).to(tl.int64)
                tl.store(cache + m * stride_cm + row * stride_ct + d, v)
                tl.store(kscale + m * stride_sm + row, scale)
        elif r < IH:
            tl.store(q_out + m * stride_om + r * stride_oh + d, v.to(q_out.dtype.element_ty))
        else:
            row = tl.load(pos).to(tl.int64)
            tl.store(cache + m * stride_cm + row * stride_ct + d, v.to(cache.dtype.element_ty))

    @triton.jit
    def _index_score_kernel(q, keys, kscale, qscale, wts, out, T, IH, w_scale, stride_qm, stride_qh, stride_km,
                            stride_kt, stride_sm, stride_qsm, stride_wm, stride_om, ID: tl.constexpr,
                            BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, F32_DOTS: tl.constexpr,
                            SCALED: tl.constexpr, Q_SCALED: tl.constexpr):
        pid_t, m = tl.program_id(0), tl.program_id(1)
        hs = tl.arange(0, BLOCK_H)
        hmask = hs < IH
        d = tl.arange(0, ID)
        qh = tl.load(q + m * stride_qm + hs[:, None] * stride_qh + d[None, :], mask=hmask[:, None], other=0.0)
        w = tl.load(wts + m * stride_wm + hs, mask=hmask, other=0.0).to(tl.float32) * w_scale
        if Q_SCALED:  # a head's scale is positive: folded into its weight, as the reference folds it
            w = w * tl.load(qscale + m * stride_qsm + hs, mask=hmask, other=0.0)
        ts = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = ts < T
        k = tl.load(keys + m * stride_km + ts[:, None] * stride_kt + d[None, :], mask=tmask[:, None], other=0.0)
        if F32_DOTS:  # Triton's CPU interpreter mishandles bf16 dots: fp32 operands there, same indexing
            qh, k = qh.to(tl.float32), k.to(tl.float32)
        # [rows, heads]: the cache's 64 rows as the MMA's M, so that sm_90 gets the warpgroup MMA in FP8 (heads as
        # M, 32 for GLM-5, got the warp MMA on FP8 cast to fp16: the PTX); FP8 by FP8 where q is FP8
        s = tl.maximum(tl.dot(k.to(qh.dtype), tl.trans(qh)), 0.0)
        if SCALED:  # a key's scale is positive: it goes past the relu
            s = s * tl.load(kscale + m * stride_sm + ts, mask=tmask, other=0.0)[:, None]
        tl.store(out + m * stride_om + ts, tl.sum(s * w[None, :], axis=1), mask=tmask)


INDEX_KEY_DTYPE = torch.float8_e4m3fn  # the DSA indexer's key cache (DeepSeek-V3.2's, GLM-5's): FP8, a scale a key


REFERENCE_CHUNK = 1 << 24  # fp32 values (64 MB) the indexer's reference casts or sums at once


def index_scores_reference(q: torch.Tensor, keys: torch.Tensor, wts: torch.Tensor, w_scale: float = 1.0,
                           key_scale: torch.Tensor | None = None,
                           query_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The DSA indexer's scores: q [M, IH, ID], keys [M, T, ID], wts [M, IH] (any dtype) -> [M, T] fp32, the sum
    over the indexer heads of each head's weight (times w_scale) times relu(q . key); FP8 keys times key_scale
    [M, T] and FP8 queries times query_scale [M, IH] (fp32, one a key or a head). Long caches a chunk of keys at
    a time, so that their fp32 copy stays under REFERENCE_CHUNK values (the kernel level's picker scores 8 rows of
    131072 FP8 keys: half a GB at once before)."""
    m, t, d = keys.shape
    step = max(1, REFERENCE_CHUNK // max(1, m * max(d, q.shape[1])))
    if t > step:
        return torch.cat([index_scores_reference(q, keys[:, i:i + step], wts, w_scale,
                                                 None if key_scale is None else key_scale[:, i:i + step], query_scale)
                          for i in range(0, t, step)], dim=1)
    w = wts.float() * w_scale
    if key_scale is None and query_scale is None:
        s = torch.relu(torch.bmm(q, keys.transpose(1, 2))).float()
    else:
        s = torch.relu(torch.bmm(q.float(), keys.float().transpose(1, 2)))
        if key_scale is not None:
            s = s * key_scale.float().unsqueeze(1)
        if query_scale is not None:
            w = w * query_scale.float()
    return (s * w.unsqueeze(-1)).sum(1)


def _fp8_dots(device: torch.device) -> bool:
    """Whether the GPU's tensor cores multiply FP8 by FP8 (sm_89 on); the interpreter dots in fp32 anyway."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 9)


def index_scores(q: torch.Tensor, keys: torch.Tensor, wts: torch.Tensor, w_scale: float = 1.0,
                 key_scale: torch.Tensor | None = None, query_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`index_scores_reference` as one Triton kernel (rows of the cache in blocks, every indexer head a block in
    one tensor-core dot: FP8 by FP8 where the queries are FP8, as the reference's, else FP8 keys cast to q's dtype
    as they load; the key scales applied past the relu, the query scales folded into the weights, which are cast
    and scaled as they load) where Triton runs and the widths tile; else torch ops. H200 (2026-12-06,
    benchmarks/device/index_score_probe.py, GLM-5's 32 heads of 128, graph replay, keys from DRAM), bf16 queries ->
    FP8 ones, 64 rows a program: 1 row over 32768 keys 4.68 -> 3.69 us; 8 rows 16.5 -> 13.3 us (2.6 TB/s, 0.60 of
    a read; 128 rows a program 12.2 us, 0.65, but no faster at 1 row). In the step's profile at 32768 tokens
    (step_profile.py) 2.92 us, against 5.07 with bf16 keys and 3.52 with the heads as the MMA's M."""
    m, ih, idim = q.shape
    t = keys.shape[1]
    scales = [s for s in (key_scale, query_scale) if s is not None]
    if (not available(q.device) or idim < 16 or idim != _pow2(idim) or ih > 128 or q.stride(2) != 1
            or keys.stride(2) != 1 or wts.stride(-1) != 1 or any(s.stride(-1) != 1 for s in scales)
            or (q.dtype == INDEX_KEY_DTYPE and (keys.dtype != q.dtype or not _fp8_dots(q.device)))):
        return index_scores_reference(q, keys, wts, w_scale, key_scale, query_scale)
    out = torch.empty((m, t), dtype=torch.float32, device=q.device)
    block_t = 64
    _index_score_kernel[(math.ceil(t / block_t), m)](
        q, keys, out if key_scale is None else key_scale, out if query_scale is None else query_scale, wts, out, t,
        ih, float(w_scale), q.stride(0), q.stride(1), keys.stride(0), keys.stride(1),
        0 if key_scale is None else key_scale.stride(0), 0 if query_scale is None else query_scale.stride(0),
        wts.stride(0), out.stride(0), ID=idim, BLOCK_H=max(16, _pow2(ih)), BLOCK_T=block_t, F32_DOTS=interpreted(),
        SCALED=key_scale is not None, Q_SCALED=query_scale is not None, num_warps=4)
    return out


def _rope_front(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., D] with its first 2 len(cos) values rotated (the DSA indexer's rope part comes first)."""
    r = 2 * cos.shape[-1]
    return torch.cat((rope_reference(x[..., :r], cos, sin), x[..., r:]), dim=-1)


def hadamard_reference(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (D a power of two) times the D x D Hadamard matrix in Sylvester's order over sqrt(D), computed in
    fp32 and returned in x's dtype (DeepSeek-V3.2's `rotate_activation`, which GLM-5 shares). The matrix is built
    here: scipy's `hadamard` builds the same one, but scipy is not a dependency of the package."""
    h = torch.ones((1, 1), device=x.device)
    while h.shape[0] < x.shape[-1]:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (x.float() @ h * x.shape[-1] ** -0.5).to(x.dtype)


def index_prepare_reference(q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor,
                            cos: torch.Tensor, sin: torch.Tensor, k_norm_w: torch.Tensor, k_norm_b: torch.Tensor,
                            eps: float, key_scale: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The DSA indexer's decode input in torch ops (DeepSeek-V3.2's, which GLM-5 shares): the token's key row k
    [M, ID] LayerNormed and rotated (its first 2 len(cos) values) into the key cache [M, T, ID] at row pos; returns
    the queries q [M, IH, ID] rotated the same way, and None. An FP8 cache (INDEX_KEY_DTYPE) takes the reference's
    form: key and queries then times the Hadamard matrix, each row as FP8 codes with its scale (amax / 448); the
    key's into the cache and key_scale [M, T], and the queries returned as codes and scales [M, IH] (fp32), which
    the scores fold into the heads' weights, for an FP8 by FP8 dot."""
    key = _rope_front(torch.nn.functional.layer_norm(k, (k.shape[-1],), k_norm_w, k_norm_b, eps), cos, sin)
    q = _rope_front(q, cos, sin)
    if cache.dtype != INDEX_KEY_DTYPE:
        cache.index_copy_(1, pos, key.unsqueeze(1))
        return q, None
    if key_scale is None:
        raise DecodeGapError("index_prepare: an FP8 key cache needs its key_scale [M, T]")
    key, scale = quantize_e4m3_groups(hadamard_reference(key))
    key_scale.index_copy_(1, pos, scale.unsqueeze(1).to(key_scale.dtype))
    # as bytes: torch has no index_copy_ for FP8 on the CPU
    cache.view(torch.uint8).index_copy_(1, pos, key.unsqueeze(1).view(torch.uint8))
    return quantize_e4m3_groups(hadamard_reference(q))


def index_prepare(q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, k_norm_w: torch.Tensor, k_norm_b: torch.Tensor, eps: float,
                  key_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`index_prepare_reference` as one Triton kernel (a program an indexer head, one for the key), where the
    unfused ops launch a kernel each (the key's LayerNorm, the two rotations' multiplies and sums, two
    concatenations, the Hadamard products, the FP8 scales and casts, the cache writes); torch ops where Triton does
    not run or the rows do not fit it. H200 (2026-12-05, benchmarks/simulate_gpu.py, GLM-5-NVFP4 TP8, 46 of 78
    layers, scaled; bf16 keys and queries), with the weights' scale folded into `index_scores`, against the
    LayerNorm, cache write and cast alone (no rope): the step 7.31 -> 6.96 ms at 1 row (attention 2.82 -> 2.49),
    11.71 -> 11.33 at 8 (3.42 -> 2.97). FP8 keys and queries against bf16 (H200, 2026-12-06, the same step): 6.90
    -> 6.83 ms at 1 row (attention 2.54 -> 2.46), 11.24 -> 11.10 at 8 (3.02 -> 2.93); the kernel 1.84 -> 1.90 us
    (step_profile.py, 32768 tokens)."""
    m, ih, idim = q.shape
    half = cos.shape[-1]
    fp8 = cache.dtype == INDEX_KEY_DTYPE
    if (not available(q.device) or idim != _pow2(idim) or half < 1 or half != _pow2(half) or 2 * half > idim
            or k.shape[-1] != idim or cache.shape[-1] != idim or cache.dtype not in (q.dtype, INDEX_KEY_DTYPE)
            or min(q.stride(2), k.stride(-1), cache.stride(2)) != 1 or (fp8 and key_scale is None)):
        return index_prepare_reference(q, k, cache, pos, cos, sin, k_norm_w, k_norm_b, eps, key_scale)
    out = torch.empty((m, ih, idim), dtype=cache.dtype if fp8 else q.dtype, device=q.device)
    q_scale = torch.empty((m, ih), dtype=torch.float32, device=q.device) if fp8 else None
    _index_prepare_kernel[(ih + 1, m)](
        q, k, cache, key_scale if fp8 else out, out, q_scale if fp8 else out, pos, cos, sin, k_norm_w, k_norm_b,
        float(eps), ih, q.stride(0), q.stride(1), k.stride(0), cache.stride(0), cache.stride(1),
        key_scale.stride(0) if fp8 else 0, out.stride(0), out.stride(1), q_scale.stride(0) if fp8 else 0, ID=idim,
        HALF=half, FP8=fp8, LOG_ID=idim.bit_length() - 1, ROUND=interpreted(), num_warps=1)
    return out, q_scale


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


MAX_SPLITS = 128  # the combine reads a head's splits in one load


def _split_count(device, programs: int, t_max: int, rows: int) -> int:
    """About two programs an SM (decode attention is latency, not work), each at least `rows` of the cache, so that
    its partial output and the combine stay small beside the rows it reads; at most MAX_SPLITS."""
    dev = torch.device(device)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    return max(1, min(math.ceil(2 * sms / programs), math.ceil(t_max / rows), MAX_SPLITS))


class MlaDecode:
    """MLA's absorbed decode attention for M tokens of H heads over a latent cache of up to `t_max` rows, as a
    split-KV Triton kernel and a combine, into buffers it owns (graph-safe): call(qq [M, H, L+R], kv [M, T, L+R],
    scale, rows=None) -> [M, H, L]. With `rows` [M, n] (DSA's selected indices, int32 or int64) it attends to those n
    rows of the cache, read in place: a gather first would write and read them once more (H200: 32 us for 8 tokens'
    2048 rows)."""

    BLOCK_T = 32

    def __init__(self, m: int, heads: int, lora: int, rope_dim: int, t_max: int, device, dtype=torch.bfloat16,
                 splits: int | None = None, block_h: int | None = None, warps: int = 4) -> None:
        for name, v in (("kv_lora_rank", lora), ("qk_rope_head_dim", rope_dim)):
            if v < 16 or v != _pow2(v):
                raise DecodeGapError(f"MLA decode kernel: {name} {v} is not a power of two of 16 or more")
        if not available(device):
            raise DecodeGapError("MLA decode kernel: needs Triton on a GPU (or TRITON_INTERPRET)")
        self.m, self.h, self.lora, self.rope, self.warps = m, heads, lora, rope_dim, warps
        # heads a program: each head tile reads the whole cache, so wider tiles read it fewer times, but leave fewer
        # programs to split it over. H200 (GLM-5's 64 heads, 8 tokens): 4096 rows 58.0 us with 16, 44.8 with 32,
        # 2048 selected rows 38.0 / 36.6; one token (64 or 128 heads): 16 as fast or faster (11.4 vs 13.3 us).
        # H200 sweep of 2048 selected rows (benchmarks/device/mla_probe.py, 2026-12-03: splits 4-64 x 16/32/64 heads
        # x 4/8 warps): at one token the default (32 splits of 16 heads, 4 warps) was the fastest, 11.4 us (64
        # splits 12.6, 8 splits 21.5); at eight, 64 heads of 8 warps in 16 splits 32.0 against 33.7 for 32 heads
        # in 16: too little to plan for
        self.block_h = block_h or (32 if m * heads >= 256 else 16)
        head_tiles = math.ceil(heads / self.block_h)
        # a split's partial is [16 heads, L] fp32 (32 KB at L = 512), as many bytes as one block of 32 cache rows:
        # two blocks a split at least (H200, DeepSeek-V3 TP8 at 513 rows: 11.5 us with one, 13.8 with four)
        self.splits = splits or _split_count(device, m * head_tiles, t_max, 2 * self.BLOCK_T)
        self.part = torch.empty((m, heads, self.splits, lora), dtype=torch.float32, device=device)
        self.lse = torch.empty((m, heads, self.splits), dtype=torch.float32, device=device)
        self.out = torch.empty((m, heads, lora), dtype=dtype, device=device)

    label = "triton MLA decode (split-KV flash decoding + combine)"

    def __call__(self, qq: torch.Tensor, kv: torch.Tensor, scale: float,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
        m, h, d = qq.shape
        if (m, h, d) != (self.m, self.h, self.lora + self.rope) or kv.shape[0] != m or kv.shape[2] != d:
            raise DecodeGapError(f"MLA decode kernel: q {tuple(qq.shape)}, kv {tuple(kv.shape)} do not fit "
                                 f"{self.m} x {self.h} heads of {self.lora}+{self.rope}")
        if qq.stride(2) != 1 or kv.stride(2) != 1:
            raise DecodeGapError("MLA decode kernel: q and kv need contiguous rows")
        if rows is not None and (rows.dim() != 2 or rows.shape[0] != m or rows.stride(1) != 1):
            raise DecodeGapError(f"MLA decode kernel: rows {tuple(rows.shape)} are not [{m}, n] with contiguous rows")
        t = kv.shape[1] if rows is None else rows.shape[1]
        per = math.ceil(math.ceil(t / self.splits) / self.BLOCK_T) * self.BLOCK_T
        _mla_split_kernel[(math.ceil(h / self.block_h), self.splits, m)](
            qq, kv, self.part, self.lse, kv if rows is None else rows, t, per, h, float(scale),
            qq.stride(0), qq.stride(1), kv.stride(0), kv.stride(1), self.part.stride(0), self.part.stride(1),
            self.part.stride(2), self.lse.stride(0), self.lse.stride(1), 0 if rows is None else rows.stride(0),
            LORA=self.lora, ROPE=self.rope, BLOCK_H=self.block_h, BLOCK_T=self.BLOCK_T, HAS_ROWS=rows is not None,
            F32_DOTS=interpreted(), num_warps=self.warps)  # 8 was slower but with 64-head tiles (mla_probe.py)
        return _combine(self.part, self.lse, self.out)


def mla_split_forms(m: int, heads: int, lora: int, rope_dim: int, t_max: int, device,
                    dtype=torch.bfloat16) -> dict[str, MlaDecode]:
    """The MLA decode kernel with its default split count and with twice and four times as many (at most
    MAX_SPLITS, each split still a block of rows, where the default keeps two), by label, for a caller that times
    them and keeps the fastest (the kernel level's picker). H100 (2026-12-06, benchmarks/device/mla_probe.py --heads
    8, GLM-5 at TP8, 2048 selected rows): 1 token 9.8 / 8.9 us with 32 / 64 splits; 8 tokens 14.0 / 18.2 us."""
    base = MlaDecode(m, heads, lora, rope_dim, t_max, device, dtype)
    forms = {f"{base.label}, {base.splits} splits": base}
    most = min(MAX_SPLITS, max(1, math.ceil(t_max / MlaDecode.BLOCK_T)))
    for more in (2 * base.splits, 4 * base.splits):
        if more <= most:
            forms[f"{base.label}, {more} splits"] = MlaDecode(m, heads, lora, rope_dim, t_max, device, dtype,
                                                              splits=more)
    return forms


def _combine(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [M, H, W] from the split partials part [M, H, S, W] and their log-sum-exp lse [M, H, S]."""
    m, h, splits, width = part.shape
    # narrow column slices and every split in one or two loads a program: the combine's serial loop over the splits
    # was its cost (H200, 8 heads of 256 splits: ~15 us with 16 splits a load and whole rows a program)
    block_w = 32 if width <= 128 else 64  # widths are powers of two of 16 or more (the split kernels' check)
    block_w = min(block_w, width)
    _combine_kernel[(h, m, width // block_w)](
        part, lse, out, splits, part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1), BLOCK_S=min(MAX_SPLITS, _pow2(splits)), BLOCK_W=block_w, num_warps=4)
    return out


def reference_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [M, H, D], k and v [M, KV, T, D] -> [M, H, D]: each group of H / KV query heads attends to its KV head."""
    out = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=scale,
                                                           enable_gqa=k.shape[1] != q.shape[1])
    return out.squeeze(2)


class GqaDecode:
    """Decode attention for M tokens of H query heads over KV heads (GQA; MHA where KV = H) of a cache up to `t_max`
    rows, as a split-KV Triton kernel and a combine into buffers it owns (graph-safe): call(q [M, H, D],
    k and v [M, KV, T, D], scale) -> [M, H, D]. One program takes a KV head's whole group of query heads, so each
    key and value row is read once for the group, and the cache is split until the GPU is full at one token."""

    label = "triton GQA decode (split-KV flash decoding + combine)"
    MAX_GROUP = 64  # query heads a KV head: the group's fp32 output tile [group, D] stays in registers

    def __init__(self, m: int, heads: int, kv_heads: int, head_dim: int, t_max: int, device,
                 dtype=torch.bfloat16, splits: int | None = None) -> None:
        if head_dim < 16 or head_dim != _pow2(head_dim):
            raise DecodeGapError(f"GQA decode kernel: head_dim {head_dim} is not a power of two of 16 or more")
        if kv_heads < 1 or heads % kv_heads:
            raise DecodeGapError(f"GQA decode kernel: {heads} query heads do not divide into {kv_heads} KV heads")
        group = heads // kv_heads
        if group > self.MAX_GROUP:
            raise DecodeGapError(f"GQA decode kernel: {group} query heads a KV head (at most {self.MAX_GROUP})")
        if not available(device):
            raise DecodeGapError("GQA decode kernel: needs Triton on a GPU (or TRITON_INTERPRET)")
        self.m, self.h, self.kv, self.d, self.group = m, heads, kv_heads, head_dim, group
        self.block_h = max(16, _pow2(group))  # the smallest tensor-core tile is 16 rows
        self.block_t = 64 if head_dim <= 128 else 32
        self.splits = splits or _split_count(device, m * kv_heads, t_max, 2 * self.block_t)
        self.part = torch.empty((m, heads, self.splits, head_dim), dtype=torch.float32, device=device)
        self.lse = torch.empty((m, heads, self.splits), dtype=torch.float32, device=device)
        self.out = torch.empty((m, heads, head_dim), dtype=dtype, device=device)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        m, h, d = q.shape
        want = (self.m, self.kv, k.shape[2], self.d)
        if (m, h, d) != (self.m, self.h, self.d) or tuple(k.shape) != want or tuple(v.shape) != want:
            raise DecodeGapError(f"GQA decode kernel: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                                 f"do not fit {self.m} x {self.h} heads over {self.kv} KV heads of {self.d}")
        if q.stride(2) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
            raise DecodeGapError("GQA decode kernel: q, k and v need contiguous rows")
        t = k.shape[2]
        per = math.ceil(math.ceil(t / self.splits) / self.block_t) * self.block_t
        _gqa_split_kernel[(self.kv, self.splits, m)](
            q, k, v, self.part, self.lse, t, per, self.group, float(scale),
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            self.part.stride(0), self.part.stride(1), self.part.stride(2), self.lse.stride(0), self.lse.stride(1),
            D=self.d, BLOCK_H=self.block_h, BLOCK_T=self.block_t, F32_DOTS=interpreted(), num_warps=4)
        return _combine(self.part, self.lse, self.out)


def qkv_rope_append_reference(qkv: torch.Tensor, heads: int, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor,
                              cos: torch.Tensor, sin: torch.Tensor, qn: torch.Tensor | None = None,
                              kn: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """One token's fused qkv row [M, (H + 2 KV) D] in torch ops: q and k RMS-normed per head where qn/kn are given,
    rotated; k and v written into the caches [M, KV, T, D] at row pos; returns q [M, H, D]."""
    m, kvh, _, d = kc.shape
    q, k, v = qkv.split([heads * d, kvh * d, kvh * d], dim=-1)
    q, k, v = q.view(m, heads, 1, d), k.view(m, kvh, 1, d), v.view(m, kvh, 1, d)
    if qn is not None:
        q, k = rms_norm_reference(q, qn, eps), rms_norm_reference(k, kn, eps)
    q, k = rope_reference(q, cos, sin), rope_reference(k, cos, sin)
    kc.index_copy_(2, pos, k)
    vc.index_copy_(2, pos, v)
    return q.view(m, heads, d)


def qkv_rope_append(qkv: torch.Tensor, heads: int, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor, qn: torch.Tensor | None = None,
                    kn: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """`qkv_rope_append_reference` as one Triton kernel (a program a head: the qk-norm, the rotary embedding and
    both cache writes of a decode step's attention input, as engines fuse them); torch ops where Triton does not run
    or the rows do not fit it."""
    m, kvh, _, d = kc.shape
    if (not available(qkv.device) or d < 2 or d != _pow2(d) or qkv.stride(-1) != 1 or kc.stride(3) != 1
            or vc.stride(3) != 1 or qkv.shape[-1] != (heads + 2 * kvh) * d):
        return qkv_rope_append_reference(qkv, heads, kc, vc, pos, cos, sin, qn, kn, eps)
    q = torch.empty((m, heads, d), dtype=qkv.dtype, device=qkv.device)
    norm = qn is not None
    _qkv_rope_append_kernel[(heads + 2 * kvh, m)](
        qkv, q, kc, vc, pos, cos, sin, qn if norm else cos, kn if norm else cos, float(eps), heads, kvh,
        qkv.stride(0), q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2),
        vc.stride(0), vc.stride(1), vc.stride(2), HALF=d // 2, NORM=norm, num_warps=1)
    return q


def mla_prepare_reference(q_lat: torch.Tensor, q_pe: torch.Tensor, kv: torch.Tensor, cache: torch.Tensor,
                          pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_norm: torch.Tensor,
                          eps: float) -> torch.Tensor:
    """MLA's decode input in torch ops: the token's latent row kv [M, L+R] RMS-normed (its first L) and rotated (its
    last R) into the cache [M, T, L+R] at row pos; returns qq [M, H, L+R] = [q_lat (L) | rope(q_pe) (R)]."""
    lora = q_lat.shape[-1]
    c, k_pe = kv.split([lora, kv.shape[-1] - lora], dim=-1)
    row = torch.cat((rms_norm_reference(c, kv_norm, eps), rope_reference(k_pe, cos, sin)), dim=-1)
    cache.index_copy_(1, pos, row.unsqueeze(1))
    return torch.cat((q_lat, rope_reference(q_pe, cos, sin)), dim=-1)


def mla_prepare(q_lat: torch.Tensor, q_pe: torch.Tensor, kv: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor, kv_norm: torch.Tensor, eps: float) -> torch.Tensor:
    """`mla_prepare_reference` as one Triton kernel (a program a head and one for the cache row), where the unfused
    ops are six kernels (the latent's norm, two rotations, two concatenations, the cache write); engines fuse them
    (SGLang's and vLLM's MLA). Torch ops where Triton does not run or the rows do not fit it. H200 (2026-12-05,
    benchmarks/simulate_gpu.py, GLM-5-NVFP4 TP8, 46 of 78 layers in a CUDA graph, scaled): the step 7.80 -> 7.20 ms
    at batch 1 (attention 3.37 -> 2.77), 12.34 -> 11.69 at 8 (4.04 -> 3.34)."""
    m, h, lora = q_lat.shape
    rope_dim = q_pe.shape[-1]
    if (not available(q_lat.device) or lora != _pow2(lora) or rope_dim < 2 or rope_dim != _pow2(rope_dim)
            or kv.shape[-1] != lora + rope_dim or cache.shape[-1] != lora + rope_dim
            or min(q_lat.stride(2), q_pe.stride(2), kv.stride(-1), cache.stride(2)) != 1):
        return mla_prepare_reference(q_lat, q_pe, kv, cache, pos, cos, sin, kv_norm, eps)
    qq = torch.empty((m, h, lora + rope_dim), dtype=q_lat.dtype, device=q_lat.device)
    _mla_prepare_kernel[(h + 1, m)](
        q_lat, q_pe, kv, cache, qq, pos, cos, sin, kv_norm, float(eps), h, q_lat.stride(0), q_lat.stride(1),
        q_pe.stride(0), q_pe.stride(1), kv.stride(0), cache.stride(0), cache.stride(1), qq.stride(0), qq.stride(1),
        LORA=lora, HALF=rope_dim // 2, num_warps=4)
    return qq
