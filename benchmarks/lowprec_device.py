"""Low-precision decode kernels on the GPU (issue 14): every fraction of the measured bandwidth, printed.

Run on a GPU host from the repository root:
    PYTHONPATH=workflow python3 benchmarks/lowprec_device.py --out $OUT [--budget-s 240]
1. copy and read bandwidth (microbench.memory) and the latency floor (graph replay of an empty kernel and of a
   one-row GEMV);
2. correctness of every kernel (NVFP4 tensor-core and CUDA-core forms, FP8 per-tensor/128x128, bf16, grouped experts) against
   dequantise-then-matmul at awkward shapes;
3. per shape (Llama-3.1-8B, DeepSeek-V3, GLM-5) at M=1 and M=16: bf16, FP8 (`_scaled_mm` against our GEMVs) and
   NVFP4 (the earlier kernel against the new one), every Triton config timed and the fastest kept (the sweep),
   beside a plain read of the same bytes (microbench.launch.plain_read: what they cost alone at that size);
4. MoE at M=1, 8 of 256 experts: routing as its own rows (torch ops, and fused: kernels.routing), then the
   experts as a per-expert loop,
   `_grouped_mm`, `_scaled_grouped_mm` and our grouped GEMV in bf16 / fp8 / nvfp4.
GPU time is CUDA-graph replay over rotating weight copies larger than twice the L2 (decode_gap.microbench.timing).
Fractions: of read bandwidth (src.sum()) and of copy bandwidth (dst.copy_(src)); NVFP4 bytes are the packed
values plus the E4M3 and fp32 scales. Speed targets are printed as ratios, never asserted.
On a CPU host, run with TRITON_INTERPRET=1 at tiny settings: a smoke test of the script.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from decode_gap.microbench import gemv as gemv_kernel  # noqa: E402
from decode_gap.microbench import launch, memory, moe, shapes  # noqa: E402
from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402
from decode_gap.kernels import attention as attn  # noqa: E402
from decode_gap.kernels import fp8block, fp8mma, fusedmoe  # noqa: E402
from decode_gap.kernels import norm as norm_kernels  # noqa: E402
from decode_gap.kernels import routing as rt  # noqa: E402
from decode_gap.kernels import topk as topk_kernels  # noqa: E402
from decode_gap.microbench.common import BenchEnv, pick_device  # noqa: E402
from decode_gap.microbench.timing import rotating_copies, time_graph  # noqa: E402
from decode_gap.timing import ClockWatch, rotated  # noqa: E402
from decode_gap.errors import REASON_CHARS, describe  # noqa: E402
from decode_gap.model import load_model_card  # noqa: E402
from decode_gap.metrics import floor_bound_fraction  # noqa: E402

T0 = time.time()
RESULTS: dict = {"checks": [], "gemm": [], "moe": [], "errors": {}}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def gpu_us(fns, env: BenchEnv) -> float:
    if env.is_gpu:
        return time_graph(fns, env.warmup, env.iters, env.device).median_us
    t = time.perf_counter()
    fns[0]()
    return (time.perf_counter() - t) * 1e6


def frac(nbytes: float, us: float | None, gbps: float | None) -> float | None:
    if not us or not gbps:
        return None
    return nbytes / us / 1e3 / gbps


# --------------------------------------------------------------------------- checks


def _twice_if_one_kernel(g, x):
    """A one-kernel form's second call must see the zeroed sums and counters its first call left."""
    if getattr(g, "one_kernel", False):  # the tensor-core one-kernel and bf16 (bx) forms
        g(x)
    return g(x)


def checks(env: BenchEnv) -> None:
    dev = env.device
    gen = torch.Generator(device=dev).manual_seed(0)
    cases = [(1, 576, 7168), (1, 100, 528), (1, 4096, 2048), (3, 256, 6144), (16, 129, 1024), (16, 4096, 4096),
             (8, 4096, 14336), (12, 1000, 2048)]
    if not env.is_gpu:
        cases = [(1, 40, 256), (3, 40, 128)]
    for m, n, k in cases:
        w = torch.randn((n, k), generator=gen, device=dev)
        x = torch.randn((m, k), generator=gen, device=dev).to(torch.bfloat16)
        q = nv.quantize_nvfp4(w)
        ref4 = nv.reference_mm(x, q)
        for cfg in ((lp.FP4_M1_CONFIGS if m == 1 else lp.FP4_MMA_CONFIGS) + lp.FP4_MMA_CHAINED + lp.FP4_MMA_XJIT
                    + lp.FP4_MMA_XSHARE + lp.FP4_MMA_XRING + lp.FP4_MMA_PAIR):
            if not cfg.fits(k) or (not env.is_gpu and cfg.asm):
                continue
            _check(f"nvfp4 {cfg.name}", m, n, k, lambda: _twice_if_one_kernel(lp.Nvfp4Gemv(q, m, dev, cfg,
                                                                                        out_dtype=torch.float32), x),
                   ref4, 2e-3 if cfg.mma or cfg.asm else 1e-4)
        for block in (False, True):
            fw = lp.quantize_fp8(w, block)
            ref8 = x.float() @ lp.dequantize_fp8(fw).t()
            for cfg in ((lp.DENSE_BLOCK_CONFIGS[:2] + lp.DENSE_BLOCK_XSCALE if block else lp.DENSE_CONFIGS[:2])
                        if m == 1 else ()):
                _check(f"fp8 {'block' if block else 'tensor'} {cfg.name}", m, n, k,
                       lambda: lp.DenseGemv(fw, m, dev, cfg, out_dtype=torch.float32)(x), ref8, 1e-4)
            if fp8mma.available(dev, k):  # the tensor-core GEMV at every M (x rounded to fp16: 2e-3); two calls
                g8 = fp8mma.Fp8MmaGemv(fw, m, dev, out_dtype=torch.float32)
                _check(f"fp8 {'block' if block else 'tensor'} tensor-core", m, n, k, lambda: [g8(x), g8(x)][1],
                       ref8, 2e-3)
        wb = w.to(torch.bfloat16)
        if m == 1:
            _check("bf16", m, n, k, lambda: lp.DenseGemv(wb, m, dev, out_dtype=torch.float32)(x),
                   x.float() @ wb.float().t(), 1e-4)
    grouped_checks(env)
    routing_checks(env)
    attention_checks(env)


def attention_checks(env: BenchEnv) -> None:
    """The kernel level's fused pieces against torch ops: MLA decode (DeepSeek-V3's 512 + 64 latent at TP8 and TP1
    head counts, a short and a long cache, the default split and one split), GQA decode (Llama-3.1-8B and other
    groups, head widths and a sliding window's view), the fused qkv rope + cache append, the rotary embedding of a
    strided slice, GLM-5's DSA indexer scores, and the norms (alone and with the residual add), in bf16."""
    dev = env.device
    gen = torch.Generator(device=dev).manual_seed(0)
    cases = [(1, 16, 513, None), (1, 128, 4097, None), (4, 16, 2048, None), (1, 16, 513, 1), (8, 64, 4097, None)]
    if not env.is_gpu:
        cases = [(1, 20, 50, None), (2, 4, 33, 1)]
    lora, rope = (512, 64) if env.is_gpu else (32, 16)
    for m, h, t, splits in cases:
        qq = torch.randn((m, h, lora + rope), generator=gen, device=dev).to(torch.bfloat16)
        kv = torch.randn((m, t, lora + rope), generator=gen, device=dev).to(torch.bfloat16)
        scale = 1.0 / math.sqrt(192)
        ref = attn.reference_mla(qq.float(), kv.float(), lora, scale)
        k = attn.MlaDecode(m, h, lora, rope, t, dev, splits=splits)
        _check(f"mla decode splits={k.splits} heads/program={k.block_h}", m, h, t, lambda: k(qq, kv, scale).float(),
               ref, 1e-2)
    x = torch.randn((1, 16, 192), generator=gen, device=dev).to(torch.bfloat16)[..., 128:]
    cos, sin = (torch.randn(32, generator=gen, device=dev).to(torch.bfloat16) for _ in range(2))
    _check("rope", 1, 16, 64, lambda: attn.rope(x, cos, sin).float(),
           attn.rope_reference(x.float(), cos.float(), sin.float()), 1e-2)
    ih, idim, t = (32, 128, 4097) if env.is_gpu else (12, 32, 70)  # GLM-5's DSA indexer: 32 heads of 128
    qi = torch.randn((1, ih, idim), generator=gen, device=dev).to(torch.bfloat16)
    keys = torch.randn((1, t, idim), generator=gen, device=dev).to(torch.bfloat16)
    wts = torch.rand((1, ih), generator=gen, device=dev)
    _check("dsa indexer scores", 1, ih, t, lambda: attn.index_scores(qi, keys, wts),
           attn.index_scores_reference(qi.float(), keys.float(), wts), 1e-2)
    fkeys, kscale = keys.to(attn.INDEX_KEY_DTYPE), torch.rand((1, t), generator=gen, device=dev)
    _check("dsa indexer scores, fp8 keys", 1, ih, t, lambda: attn.index_scores(qi, fkeys, wts, 0.5, kscale),
           attn.index_scores_reference(qi.float(), fkeys, wts, 0.5, kscale), 1e-2)
    fq, qscale = qi.to(attn.INDEX_KEY_DTYPE), torch.rand((1, ih), generator=gen, device=dev)
    _check("dsa indexer scores, fp8 dot", 1, ih, t, lambda: attn.index_scores(fq, fkeys, wts, 0.5, kscale, qscale),
           attn.index_scores_reference(fq, fkeys, wts, 0.5, kscale, qscale), 1e-2)
    # DSA's selection (GLM-5 keeps 2048) and the MLA over the selected rows read in place: the scores each radix
    # select form keeps (topk.forms: past topk.MAX_ROW the multi-pass form, in one launch too, and just past it the
    # tail block's), sorted, are torch.topk's exactly
    sel_cases = [(1, 4096, 2047), (8, 4096, 2048), (1, 4097, 2048), (8, 8192, 2048), (1, 131072, 2048), (8, 32768, 2048), (3, 5000, 77)] \
        if env.is_gpu else [(1, 300, 40), (2, 5000, 2048)]
    for m, t, kk in sel_cases:
        sc = torch.randn((m, t), generator=gen, device=dev)
        ref = torch.topk(sc, kk, dim=-1).values.sort(dim=-1).values
        for name, select in topk_kernels.forms(t, m, dev).items():
            _check(f"dsa top-k: {name}", m, t, kk,
                   lambda: sc.gather(1, select(sc, kk).long()).sort(dim=-1).values, ref, 0.0)
    m, h, t, kk = (2, 64, 4097, 2048) if env.is_gpu else (1, 4, 60, 20)
    qq = torch.randn((m, h, lora + rope), generator=gen, device=dev).to(torch.bfloat16)
    kv = torch.randn((m, t, lora + rope), generator=gen, device=dev).to(torch.bfloat16)
    picked = torch.rand((m, t), generator=gen, device=dev).argsort(dim=-1)[:, :kk].to(torch.int32)
    ref = attn.reference_mla(qq.float(), kv.float().gather(1, picked.long()[..., None].expand(-1, -1, lora + rope)),
                             lora, 1.0 / math.sqrt(192))
    k = attn.MlaDecode(m, h, lora, rope, kk, dev)
    _check("mla decode over selected rows", m, h, kk, lambda: k(qq, kv, 1.0 / math.sqrt(192), rows=picked).float(),
           ref, 1e-2)
    # GQA decode: Llama-3.1-8B (32 / 8 heads of 128) at 1 and 4 tokens, a group of 16 (64 / 4), MHA of 64-wide heads,
    # and Gemma 3's 256-wide heads over a sliding window's strided view of a longer cache
    gqa_cases = [(1, 32, 8, 128, 4097, 0), (4, 32, 8, 128, 2048, 0), (1, 64, 4, 128, 8193, 0),
                 (1, 16, 16, 64, 1025, 0), (1, 8, 4, 256, 1024, 3072)]
    if not env.is_gpu:
        gqa_cases = [(1, 8, 2, 32, 50, 0), (2, 6, 6, 16, 33, 7)]
    for m, h, kvh, d, t, skip in gqa_cases:
        q = torch.randn((m, h, d), generator=gen, device=dev).to(torch.bfloat16)
        kc, vc = (torch.randn((m, kvh, skip + t, d), generator=gen, device=dev).to(torch.bfloat16) for _ in range(2))
        k, v = kc[:, :, skip:], vc[:, :, skip:]
        ref = attn.reference_gqa(q.float(), k.float(), v.float(), 1.0 / math.sqrt(d))
        g = attn.GqaDecode(m, h, kvh, d, t, dev)
        _check(f"gqa decode splits={g.splits}", m, h, t, lambda: g(q, k, v, 1.0 / math.sqrt(d)).float(), ref, 1e-2)
    h, kvh, d, t = (32, 8, 128, 64) if env.is_gpu else (4, 2, 16, 9)
    for norm in (False, True):  # the fused qk-norm + rope + cache append of one token's qkv row
        qkv = torch.randn((2, (h + 2 * kvh) * d), generator=gen, device=dev).to(torch.bfloat16)
        caches = [torch.randn((2, kvh, t, d), generator=gen, device=dev).to(torch.bfloat16) for _ in range(2)]
        ref_caches = [c.float() for c in caches]
        pos = torch.tensor([t - 3], device=dev)
        cs = [torch.randn(d // 2, generator=gen, device=dev).to(torch.bfloat16) for _ in range(2)]
        nw = [torch.rand(d, generator=gen, device=dev).to(torch.bfloat16) for _ in range(2)] if norm else [None, None]
        ref_q = attn.qkv_rope_append_reference(qkv.float(), h, *ref_caches, pos, *(c.float() for c in cs),
                                               *(w.float() if w is not None else None for w in nw))
        name = "qkv qk-norm + rope + append" if norm else "qkv rope + append"
        _check(name, 2, h, d, lambda: torch.cat([attn.qkv_rope_append(qkv, h, *caches, pos, *cs, *nw).flatten(),
                                                 caches[0].flatten(), caches[1].flatten()]).float(),
               torch.cat([ref_q.flatten(), ref_caches[0].flatten(), ref_caches[1].flatten()]), 1e-2)
    # MLA's fused decode input (GLM-5 / DeepSeek-V3 at TP8: 8 or 16 heads of 512 + 64; q_pe a slice of q, the latent
    # row a slice of the fused a-projection's output, q_lat the absorbed bmm's transposed output), 1 and 8 tokens
    for m, h in ((1, 8), (8, 16)) if env.is_gpu else ((2, 3),):
        t = 40
        q = torch.randn((m, h, 192), generator=gen, device=dev).to(torch.bfloat16)
        q_lat = torch.randn((h, m, lora), generator=gen, device=dev).to(torch.bfloat16).transpose(0, 1)
        kv = torch.randn((m, 64 + lora + rope), generator=gen, device=dev).to(torch.bfloat16)[:, 64:]
        cache = torch.randn((m, t, lora + rope), generator=gen, device=dev).to(torch.bfloat16)
        ref_cache = cache.float()
        pos = torch.tensor([t - 5], device=dev)
        cs = [torch.randn(rope // 2, generator=gen, device=dev).to(torch.bfloat16) for _ in range(2)]
        w = torch.rand(lora, generator=gen, device=dev).to(torch.bfloat16)
        ref_q = attn.mla_prepare_reference(q_lat.float(), q[..., 192 - rope:].float(), kv.float(), ref_cache, pos,
                                           *(c.float() for c in cs), w.float(), 1e-6)
        _check("mla norm + rope + append", m, h, lora + rope,
               lambda: torch.cat([attn.mla_prepare(q_lat, q[..., 192 - rope:], kv, cache, pos, *cs, w, 1e-6).flatten(),
                                  cache.flatten()]).float(),
               torch.cat([ref_q.flatten(), ref_cache.flatten()]), 1e-2)
    # the DSA indexer's fused decode input (GLM-5: 32 heads of 128, rope 64 first), 1 and 8 tokens
    ih, idim = (32, 128) if env.is_gpu else (3, 32)
    for m in (1, 8) if env.is_gpu else (2,):
        t = 40
        qi = torch.randn((m, ih, idim), generator=gen, device=dev).to(torch.bfloat16)
        ki = torch.randn((m, idim), generator=gen, device=dev).to(torch.bfloat16)
        icache = torch.randn((m, t, idim), generator=gen, device=dev).to(torch.bfloat16)
        ref_icache = icache.float()
        pos = torch.tensor([t - 5], device=dev)
        cs = [torch.randn(rope // 2, generator=gen, device=dev).to(torch.bfloat16) for _ in range(2)]
        w, b = torch.rand(idim, generator=gen, device=dev).to(torch.bfloat16), torch.zeros(idim, device=dev)
        ref_q, _ = attn.index_prepare_reference(qi.float(), ki.float(), ref_icache, pos, *(c.float() for c in cs),
                                                w.float(), b, 1e-6)
        _check("indexer norm + rope + append", m, ih, idim,
               lambda: torch.cat([attn.index_prepare(qi, ki, icache, pos, *cs, w, b.to(torch.bfloat16),
                                                     1e-6)[0].flatten(), icache.flatten()]).float(),
               torch.cat([ref_q.flatten(), ref_icache.flatten()]), 1e-2)
        # FP8 keys and queries (DeepSeek-V3.2's): turned by the Hadamard matrix, a scale a row; codes compared as
        # values (scale times code), 3e-2 where the bf16 input takes a code one step from the fp32 reference's
        fcache = icache.to(attn.INDEX_KEY_DTYPE)
        fscale, ref_fcache = torch.rand((m, t), generator=gen, device=dev), fcache.clone()
        ref_fscale = fscale.clone()
        ref_q, ref_qs = attn.index_prepare_reference(qi.float(), ki.float(), ref_fcache, pos,
                                                     *(c.float() for c in cs), w.float(), b, 1e-6, ref_fscale)

        def fp8_prepare():
            q8, qs = attn.index_prepare(qi, ki, fcache, pos, *cs, w, b.to(torch.bfloat16), 1e-6, fscale)
            return torch.cat([(q8.float() * qs[..., None]).flatten(), (fcache.float() * fscale[..., None]).flatten()])

        _check("indexer norm + rope + hadamard + fp8 append", m, ih, idim, fp8_prepare,
               torch.cat([(ref_q.float() * ref_qs[..., None]).flatten(),
                          (ref_fcache.float() * ref_fscale[..., None]).flatten()]), 3e-2)
    for n in (7168, 6144, 4096, 1536, 100):  # the norms: hidden sizes, a q_a width and an odd one, bf16
        x, o = (torch.randn((2, n), generator=gen, device=dev).to(torch.bfloat16) for _ in range(2))
        w = torch.rand(n, generator=gen, device=dev).to(torch.bfloat16)
        ref = torch.nn.functional.rms_norm((x + o).float(), (n,), w.float(), 1e-6)
        _check("rms norm", 2, n, 1, lambda: norm_kernels.rms_norm(x + o, w, 1e-6).float(), ref, 1e-2)
        _check("add + rms norm", 2, n, 1, lambda: norm_kernels.add_rms_norm(x, o, w, 1e-6)[1].float(), ref, 1e-2)


def routing_checks(env: BenchEnv) -> None:
    """The fused MoE routing against route_reference: DeepSeek-V3 (8 groups, 4 kept, bias, scale 2.5), GLM-5 style
    (sigmoid + bias, no groups) and softmax (Qwen3-MoE: 128 experts, top 8), 1 / 16 / 64 tokens. Compared as the
    dense [M, E] matrix of weights at the chosen ids, so a wrong id fails the check as a wrong weight does. The
    logits are fp32: bf16 ones tie (either tied expert is a right answer, and the two break ties differently)."""
    dev = env.device
    gen = torch.Generator(device=dev).manual_seed(0)
    cases = [("deepseek-v3", rt.Routing(256, 8, True, 8, 4, True, 2.5), True),
             ("glm-5", rt.Routing(256, 8, True), True), ("softmax", rt.Routing(128, 8, False), False)]

    def dense(weights, ids, e):
        return torch.zeros(ids.shape[0], e, device=dev).scatter_(1, ids.long(), weights.float())

    for name, r, with_bias in cases:
        for m in (1, 16, 64):
            logits = torch.randn((m, r.experts), generator=gen, device=dev)
            bias = 0.1 * torch.randn(r.experts, generator=gen, device=dev) if with_bias else None
            ref = dense(*rt.route_reference(logits, r, bias), r.experts)
            _check(f"routing {name}", m, r.experts, r.top_k,
                   lambda: dense(*rt.FusedRoute(r, m, dev)(logits, bias), r.experts), ref, 1e-5)


def fp8block_case(env: BenchEnv, timed: bool) -> None:
    """fp8 with 128x128 block scales above batch 1 (kernels/fp8block.py) on DeepSeek-V3 shapes at M = 1-16: the Triton
    activation quantisation against the torch reference (scales to 1e-6; codes: at most one e4m3 step apart), the
    whole call against dequantise-then-matmul, and (timed) the call, the quantisation alone and per-tensor
    `_scaled_mm` on the same fp8 bytes."""
    dev = env.device
    if not fp8block.supported(dev):
        RESULTS["errors"]["fp8block"] = f"unavailable: {fp8block.why_not(dev)}"
        log(f"fp8block unavailable: {fp8block.why_not(dev)}")
        return
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = RESULTS.setdefault("fp8block", [])
    for n, k in ((2112, 7168), (7168, 2048), (36864, 7168), (7168, 18432), (1008, 512)):
        w = lp.quantize_fp8(torch.randn((n, k), generator=gen, device=dev) * 0.02, block=True)
        for m in (1, 3, 4, 8, 16):
            x = torch.randn((m, k), generator=gen, device=dev).to(torch.bfloat16) * torch.logspace(
                -2, 1, k, device=dev).to(torch.bfloat16)
            q, s = fp8block.quantize_act(x)
            rq, rs = fp8block.quantize_act_reference(x)
            step = (rq.float().abs() / 8).clamp(min=2.0 ** -9)  # one e4m3 step at each value, about
            codes_ok = bool(((q.float() - rq.float()).abs() <= step + 1e-6).all())
            _check("fp8 block act quant scales", m, k // 128, k, lambda: s, rs, 1e-6)
            RESULTS["checks"].append({"kernel": "fp8 block act quant codes", "M": m, "N": 0, "K": k, "ok": codes_ok,
                                      "mismatches": int((q.float() != rq.float()).sum())})
            mm = fp8block.BlockScaledMm(w, m, dev)
            _check("fp8 block scaled_mm", m, n, k, lambda: mm(x), mm.reference(x), 1e-2)
            if not timed:
                continue
            one = torch.ones((), device=dev)
            xq = rq if m >= 4 else torch.nn.functional.pad(rq.float(), (0, 0, 0, 4 - m)).to(torch.float8_e4m3fn)
            row = {"N": n, "K": k, "M": m, "block_us": time_graph([lambda: mm(x)], 3, 20, dev).median_us,
                   "quant_us": time_graph([lambda: fp8block.quantize_act(x, mm.xq, mm.sx)], 3, 20, dev).median_us,
                   "per_tensor_us": time_graph([lambda: torch._scaled_mm(xq, w.data.t(), scale_a=one, scale_b=one,
                                                                         out_dtype=torch.bfloat16)], 3, 20,
                                               dev).median_us}
            if m == 1:  # our block-scaled GEMV, the kernel level's choice at batch 1
                g = lp.DenseGemv(w, 1, dev)
                row["our_gemv_us"] = time_graph([lambda: g(x)], 3, 20, dev).median_us
            rows.append(row)
            log(f"fp8block {row}")


# forms of the fp8 fused MoE timed beside the default (the first: BLOCK_M 16, BLOCK_N 128, 4 warps, 3 stages, gate_up
# split over K where fusedmoe.gate_up_split says); H200 (2026-12-03): BLOCK_N 64 and 32, BLOCK_M 64 and 4 stages lost
# or drew level on all 12 cases (fusedmoe.py's docstring)
FUSEDMOE_FORMS = ({}, {"split": 1}, {"block_n": 64}, {"stages": 4})


def _fp8_experts(e: int, n: int, k: int, gen, dev, block: bool) -> lp.Fp8Weight:
    """[e, n, k] random experts in fp8 (fusedmoe.quantize_experts: an expert at a time, from bf16)."""
    return fusedmoe.quantize_experts(torch.randn((e, n, k), generator=gen, device=dev, dtype=torch.bfloat16) * 0.02,
                                     block)


def rotating_choices(e: int, k: int, m: int, dev, gen=None, n: int = 4) -> list[torch.Tensor]:
    """n choices (int32 [m, k]) of k distinct experts of e for each of m tokens: rotated through a graph's calls, a
    call reads experts the one before did not."""
    return [torch.stack([torch.randperm(e, generator=gen, device=dev)[:k] for _ in range(m)]).int() for _ in range(n)]


def fusedmoe_case(env: BenchEnv, timed: bool) -> None:
    """The routed experts above batch 1 in fp8 (kernels/fusedmoe.py), 8 of 256 experts a token, on DeepSeek-V3 at TP8
    (I = 256 a rank) and TP1 (I = 2048) and GLM-5 at TP1, with 128x128 block scales (every form) and with one scale
    an expert (the default form): each against dequantise-then-matmul on the chosen experts, and (timed) against what
    ran before, `_scaled_grouped_mm` after torch-op sorting with per-tensor scales on the same bytes (simulate.layers.
    Experts). Four choices of experts rotate through the captured calls, so a call reads experts the one before did
    not (the L2 holds none of them); the fraction is of the experts hit, read once."""
    from decode_gap.microbench.moe import silu_mul
    from decode_gap.simulate.layers import Experts

    dev = env.device
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = RESULTS.setdefault("fusedmoe", [])
    read = env.extra.get("read_gbps")
    for name, e, h, i in (("dsv3 tp8", 256, 7168, 256), ("dsv3 tp1", 256, 7168, 2048), ("glm5 tp1", 256, 6144, 2048)):
        weights = {"block": (_fp8_experts(e, 2 * i, h, gen, dev, True), _fp8_experts(e, h, i, gen, dev, True)),
                   "per-expert": (_fp8_experts(e, 2 * i, h, gen, dev, False), _fp8_experts(e, h, i, gen, dev, False))}
        per_tensor = Experts(e, i, h, "fp8", "bf16", str(dev), "scaled_grouped_mm", 8) if timed else None
        for m in (2, 4, 8, 16):
            x = torch.randn((m, h), generator=gen, device=dev).to(torch.bfloat16)
            choices = rotating_choices(e, 8, m, dev, gen)
            wts = torch.rand((m, 8), generator=gen, device=dev)
            hit = sum(len(set(c.reshape(-1).tolist())) for c in choices) / len(choices)
            w13, w2 = weights["block"]
            nbytes = hit * (w13.nbytes + w2.nbytes) / e
            row = {"case": name, "M": m, "experts_hit": hit, "bytes": nbytes}
            for scales, forms in (("block", FUSEDMOE_FORMS), ("per-expert", FUSEDMOE_FORMS[:1])):
                w13, w2 = weights[scales]
                for kw in forms:
                    form = f"{scales} " + (",".join(f"{k}={v}" for k, v in kw.items()) or "default")
                    try:
                        moe = fusedmoe.FusedMoe(w13, w2, m, 8, dev, **kw)
                        form += f" (split {moe.split})"
                        _check(f"fused moe {name} {form}", m, h, i, lambda: moe(x, choices[0], wts),
                               moe.reference(x, choices[0], wts), 2e-2)
                        if timed:
                            row[form] = time_graph([lambda c=c: moe(x, c, wts) for c in choices], 3, 20,
                                                   dev).median_us
                    except Exception as exc:  # one form failing (resources) must not stop the others
                        row[form] = f"{type(exc).__name__}: {exc}"[:160]
                    if not timed:
                        break  # the default form's check only
            if timed:
                ids64 = [c.long() for c in choices]
                row["scaled_grouped_mm_us"] = time_graph([lambda c=c: per_tensor(x, c, wts, silu_mul) for c in ids64],
                                                         3, 20, dev).median_us
                best = min((row[f] for f in row if f.startswith("block ") and isinstance(row[f], float)),
                           default=None)
                row["frac_of_read_best_block"] = frac(nbytes, best, read)
            rows.append(row)
            log(f"fusedmoe {row}")
        weights = per_tensor = None
        torch.cuda.empty_cache()


# H200 (2026-12-03, before PDL): blocks of 16 pairs lost at every case (9-34%), half the gate_up splits lost up to
# 16%, twice the down splits lost up to 12% (won 4% at GLM-5 TP1, batch 1); twice the gate_up splits drew level or won
# 2-5% at TP8 from 8 tokens. The epilogues: the SiLU-and-mul and the cast each in its GEMM's epilogue or a kernel of
# its own (both False: the five kernels of before; kernels/fp4moe.py has the H200's figures). The form timed first
# in a case read high (GLM-5 TP1 at batch 1, 62.4 us for the default where the same five kernels timed next read
# 57.9), so a discarded round comes first. align True: the align kernel at batch 1 too, where the default reads the
# token's ids as the blocks' experts (at M > 1 the default aligns: the same form again)
# token "none": one token in the block kernels (4 kernels); "gate_up" / "down" / "both": those GEMMs as the one-token
# kernel (kernels/fp4moe.py), with gate_up's K slices swept. pair: those block GEMMs two tiles a warp (untimed so far).
# The first CHECKED forms are checked where nothing is timed (the CPU interpreter, kernelchecks)
FP4MOE_FORMS = ({}, {"silu_epilogue": False, "cast_epilogue": False}, {"align": True}, {"cast_epilogue": True},
                {"silu_epilogue": True, "cast_epilogue": True}, {"token": "none"}, {"pair": "both"}, {"pdl": False},
                {"split13": "double"}, {"token": "gate_up"}, {"token": "down"}, {"token": "both"},
                {"token": "gate_up", "slices13": 4}, {"token": "gate_up", "slices13": 8},
                {"token": "gate_up", "slices13": 16}, {"token": "gate_up", "slices13": 2}, {"pair": "down"},
                {"pair": "gate_up"})
CHECKED = 7
ONE_TOKEN_ONLY = ("token", "slices13", "slices2")


def fp4moe_case(env: BenchEnv, timed: bool) -> None:
    """The routed experts at batch 1-16 with NVFP4 weights (kernels/fp4moe.py: pairs sorted by expert, each expert hit
    read once a call), 8 of 256 experts a token, DeepSeek-V3 and GLM-5 at TP8 (I = 256 a rank) and TP1 (I = 2048):
    each form against dequantise-then-matmul on the chosen experts and (timed) against what the kernel level ran
    before, the grouped GEMV once a token (simulate.layers.Experts, whose repacked weights the fused MoE shares).
    Four choices rotate through the captured calls (no call finds its experts in the L2); the fraction is of the
    experts hit, read once."""
    from decode_gap.kernels import fp4moe
    from decode_gap.microbench.moe import silu_mul
    from decode_gap.simulate.layers import Experts

    dev = env.device
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = RESULTS.setdefault("fp4moe", [])
    read = env.extra.get("read_gbps")
    cases = (("dsv3 tp8", 256, 7168, 256), ("glm5 tp8", 256, 6144, 256), ("dsv3 tp1", 256, 7168, 2048),
             ("glm5 tp1", 256, 6144, 2048)) if env.is_gpu else (("tiny", 8, 128, 64),)
    for name, e, h, i in cases:
        torch.manual_seed(0)
        ex = Experts(e, i, h, "nvfp4", "bf16", str(dev), "grouped_gemv", 8)
        g = ex.grouped
        per_expert = ex.per_expert_bytes
        expert = lambda j, g=g: (fp4moe.stack_expert(g.w13, j), fp4moe.stack_expert(g.w2, j))  # noqa: E731
        gate_up = fp4moe.gate_up_stack(g.mma13)  # interleaved once for every form
        for m in (1, 2, 4, 8, 16) if env.is_gpu else (1, 2):
            x = torch.randn((m, h), generator=gen, device=dev).to(torch.bfloat16)
            choices = rotating_choices(e, min(8, e), m, dev, gen)
            wts = torch.rand((m, min(8, e)), generator=gen, device=dev)
            hit = sum(len(set(c.reshape(-1).tolist())) for c in choices) / len(choices)
            nbytes = hit * per_expert
            row = {"case": name, "M": m, "experts_hit": hit, "bytes": nbytes}
            ref = fp4moe.reference(x, choices[0], wts, expert)
            base = fp4moe.Nvfp4FusedMoe(gate_up, g.mma2, m, choices[0].shape[1], dev)
            if timed:  # a discarded round first: the form timed first in a case read up to 8% high
                time_graph([lambda c=c: base(x, c, wts) for c in choices], 3, 20, dev)
            for kw in FP4MOE_FORMS if timed else FP4MOE_FORMS[:CHECKED]:
                if m > 1 and any(k in kw for k in ONE_TOKEN_ONLY):
                    continue
                kw = {k: 2 * base.plan13[1] if v == "double" else v for k, v in kw.items()}
                if m == 1 and kw and not any(k in kw for k in ONE_TOKEN_ONLY):  # forms of the block kernels
                    kw["token"] = "none"
                form = ",".join(f"{k}={v}" for k, v in kw.items()) or "default"
                try:
                    moe = fp4moe.Nvfp4FusedMoe(gate_up, g.mma2, m, choices[0].shape[1], dev, **kw)
                    form += f" (bm {moe.block_m}, splits {moe.plan13[1]}/{moe.plan2[1]}, {moe.kernels} kernels)"
                    _check(f"fp4 moe {name} {form}", m, h, i, lambda: (moe(x, choices[0], wts), moe(x, choices[0],
                                                                                                    wts))[1], ref, 1e-2)
                    if timed:
                        row[form] = time_graph([lambda c=c: moe(x, c, wts) for c in choices], 3, 20, dev).median_us
                except Exception as exc:  # one form failing (resources) must not stop the others
                    row[form] = f"{type(exc).__name__}: {exc}"[:160]
            if env.is_gpu:  # what the kernel level ran before: the grouped GEMV once a token
                _check(f"fp4 grouped loop {name}", m, h, i, lambda: ex(x, choices[0], wts, silu_mul), ref, 1e-2)
                if timed:
                    row["grouped_per_token_us"] = time_graph([lambda c=c: ex(x, c, wts, silu_mul) for c in choices],
                                                             3, 20, dev).median_us
                    best = min((v for f, v in row.items() if "(bm" in f and isinstance(v, float)), default=None)
                    row["frac_of_read_best"] = frac(nbytes, best, read)
            rows.append(row)
            log(f"fp4moe {row}")
        ex = g = gate_up = None
        torch.cuda.empty_cache() if env.is_gpu else None


def grouped_checks(env: BenchEnv) -> None:
    """The grouped experts (every format and NVFP4 form) against the dequantised reference, awkward sizes."""
    dev = env.device
    gen = torch.Generator(device=dev).manual_seed(0)
    e, h, i, s = (16, 7168, 256, 8) if env.is_gpu else (4, 128, 64, 2)
    w13 = torch.randn((e, 2 * i, h), generator=gen, device=dev).to(torch.bfloat16) * 0.05
    w2 = torch.randn((e, h, i), generator=gen, device=dev).to(torch.bfloat16) * 0.05
    ids = torch.randperm(e, generator=torch.Generator().manual_seed(1))[:s].to(dev)
    rw = torch.rand(s, generator=gen, device=dev)
    x = torch.randn((1, h), generator=gen, device=dev).to(torch.bfloat16)
    G = lp.GemvConfig
    forms = {"bf16": (None, None), "fp8": (None, None), "fp8-block": (None, None), "nvfp4": (None, None),
             "fp8-block-rows": (lp.DENSE_BLOCK_CONFIGS[0], lp.DENSE_BLOCK_CONFIGS[0]),  # the default puts scales on x
             "nvfp4-mma": (G(64, 128, 4, mma=True), G(64, 128, 4, mma=True)),
             "nvfp4-mma-split": (G(32, 256, 2, split=3, mma=True), G(128, 64, 8, split=2, mma=True)),
             "nvfp4-mma-bx": (lp.FP4_GROUPED_BX_13, lp.FP4_GROUPED_BX_2),
             "nvfp4-mma-bx-paired": (G(64, 128, 4, mma=True, bx=True), G(128, 64, 8, split=2, mma=True, bx=True)),
             "nvfp4-mma-bx-sliced": (GROUPED_SLICED[0][0], GROUPED_SLICED[2][1])}
    if not env.is_gpu:  # H = 128, I = 64 here: two steps and one
        forms["nvfp4-mma"] = (G(32, 64, 2, mma=True), G(16, 64, 1, mma=True))
        forms["nvfp4-mma-split"] = (G(16, 64, 1, split=2, mma=True), G(64, 64, 4, mma=True))
        forms["nvfp4-mma-bx"] = (G(16, 64, 1, split=2, mma=True, bx=True), G(64, 64, 4, mma=True, bx=True))
        forms["nvfp4-mma-bx-paired"] = (G(32, 64, 2, mma=True, bx=True), G(16, 64, 1, mma=True, bx=True))
        forms["nvfp4-mma-bx-sliced"] = (G(16, 64, 2, mma=True, bx=True, slices=2), G(16, 64, 1, mma=True, bx=True))
    if env.is_gpu:
        forms["nvfp4-asm"] = (G(16, 512, 4, asm=True), G(16, 512, 4, asm=True))
    for fmt, (c13, c2) in forms.items():
        base = fmt.split("-")[0] if fmt.startswith("nvfp4") else fmt.removesuffix("-rows")
        g = lp.grouped_from_bf16(base, w13, w2, ids, rw, dev, c13, c2)
        d13, d2 = lp.dequantized_experts(g)
        call = (lambda: (g(x), g(x))[1]) if g.bx else (lambda: g(x))  # bx: the second call sees the zeros left
        _check(f"grouped {fmt}", 1, e, h, call, lp.reference_experts(x, d13, d2, ids, rw), 1e-2)
    if fp8mma.grouped_available(dev, h, i):  # the tensor-core form (GPU sizes: I = 256)
        for block in (False, True):
            q13, q2 = lp.quantize_fp8(w13, block), lp.quantize_fp8(w2, block)
            tc = fp8mma.GroupedFp8Mma(q13, q2, ids, rw, dev)
            ref = lp.reference_experts(x, lp.dequantize_fp8(q13), lp.dequantize_fp8(q2), ids, rw)
            _check(f"grouped fp8{'-block' if block else ''} tensor-core", 1, e, h, lambda: (tc(x), tc(x))[1], ref,
                   1e-2)  # the second call on the zeros the first left


def kernel_stats(env: BenchEnv, out: Path) -> None:
    """Registers, spills and the PTX of the NVFP4 M=1 kernels, for reading offline."""
    if not env.is_gpu:
        return
    q = nv.quantize_nvfp4(torch.randn((28672, 4096), device=env.device))
    x = torch.randn((1, 4096), device=env.device).to(torch.bfloat16)
    stats = {}
    for cfg in lp.FP4_M1_CONFIGS:
        g = lp.Nvfp4Gemv(q, 1, env.device, cfg)
        g(x)
        ck = getattr(g, "compiled", None)
        if ck is None:
            continue
        stats[cfg.name] = {"n_regs": getattr(ck, "n_regs", None), "n_spills": getattr(ck, "n_spills", None)}
    RESULTS["kernel_stats"] = stats
    log(f"kernel stats {stats}")


def _check(name, m, n, k, fn, ref, tol) -> None:
    row = {"kernel": name, "M": m, "N": n, "K": k}
    try:
        err = nv.relative_error(fn(), ref)
        row.update(rel_err=err, tol=tol, ok=bool(math.isfinite(err) and err <= tol))
    except Exception as exc:
        row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}", ok=False)
    RESULTS["checks"].append(row)
    if not row["ok"]:
        FAILED.add(name.replace("nvfp4 ", "").replace("fp8 tensor", "tensor").replace("fp8 block", "block"))
        log(f"CHECK FAILED {row}")


# --------------------------------------------------------------------------- dense shapes


FAILED: set = set()  # kernel names whose correctness check failed: never chosen


def first_times(env, builders: dict, keep: dict | None = None) -> dict:
    """Each form built and timed once: its time, "check failed" for a form whose check failed, None (the reason in
    RESULTS["errors"]) for one that failed to build or run; with `keep`, the built calls of those that ran go in it
    (else they are dropped as soon as timed, so only one form's copies are held at a time)."""
    times = {}
    for name, build in builders.items():
        if name in FAILED:
            times[name] = "check failed"
            continue
        try:
            fns = build()
            times[name] = gpu_us(fns, env)
            if keep is not None:
                keep[name] = fns
        except Exception as exc:
            times[name] = None
            RESULTS["errors"][name] = describe(exc, REASON_CHARS)
        fns = None
    return times


def best_of(env, builders: dict, nbytes: int) -> tuple[str | None, float | None, dict]:
    times = first_times(env, builders)
    ok = {k: v for k, v in times.items() if isinstance(v, float)}
    if not ok:
        return None, None, times
    best = min(ok, key=ok.get)
    return best, ok[best], times


def nvfp4_call_bytes(n: int, k: int, m: int) -> int:
    """Bytes an NVFP4 GEMV call moves: the packed weight and its scales, x and y in bf16."""
    return nv.nvfp4_bytes(n, k) + 2 * m * k + 2 * m * n


def nvfp4_copies(q: nv.NVFP4Tensor, dev) -> list[nv.NVFP4Tensor]:
    """q and enough copies of it that the rotation is larger than twice the L2 (no call finds its weight there)."""
    return [q] + [nv.NVFP4Tensor(q.packed.clone(), q.block_scales.clone(), q.tensor_scale.clone(), q.shape)
                  for _ in range(rotating_copies(nv.nvfp4_bytes(*q.shape), dev) - 1)]


def plain_read_us(env: BenchEnv, nbytes: int) -> float | None:
    """A plain read of `nbytes` as the gemm stage times it (launch.PlainReads); None where it cannot be timed, with
    the reason in RESULTS["errors"], so the shape's other figures are kept."""
    reads = launch.PlainReads(env)
    us = reads.us(nbytes)
    RESULTS["errors"].update({s["case"]: s["reason"] for s in reads.skipped})
    return us


def rotated_times(env: BenchEnv, builders: dict, rounds: int) -> dict:
    """Every form built (and captured) once, then timed in `rounds` rounds that rotate their order (decode_gap.timing.
    rotated: a form timed first in a fixed order can read a few per cent fast); each form's median of its rounds'
    medians, with the rounds' spread logged. A form that fails to build or to run is left out with its reason."""
    calls = {}
    times = first_times(env, builders, calls)  # compiled and warm before the first round (that time is not kept)
    samples = rotated(lambda fns: [gpu_us(fns, env)], calls, rounds)
    for name, us in samples.items():
        times[name] = float(np.median(us))
        log(f"  rounds {name}: median {times[name]:.2f} us, min {min(us):.2f}, max {max(us):.2f} ({len(us)} rounds)")
    return times


def fp4_builders(qs: list[nv.NVFP4Tensor], x: torch.Tensor, dev, cfgs) -> dict:
    """For each NVFP4 GEMV form that applies to x's M and the weight's K: a builder of its calls, one a copy."""
    m, k = x.shape
    return {c.name: (lambda c=c: [(lambda g=g: g(x)) for g in [lp.Nvfp4Gemv(qq, m, dev, c) for qq in qs]])
            for c in cfgs if c.fits(k) and (m == 1 or c.mma)}


def dense_case(env: BenchEnv, model: str, n: int, k: int, m: int, old: bool, fp8_all: bool) -> None:
    """One shape's row: every format's fastest form, and what the GPU's clocks did meanwhile (NVML: the share of
    the time held down by a power or thermal cap, and the SM clock at the end), since the same kernel on another
    H200 or under a power cap takes a few per cent longer (the Llama-3.1-8B lm_head 74-82 us across machines)."""
    with ClockWatch(env.device) as watch:
        row = _dense_row(env, model, n, k, m, old, fp8_all)
    row.update(watch.columns())
    RESULTS["gemm"].append(row)
    if env.is_gpu:
        torch.cuda.empty_cache()
    pr = lambda key: (f"{row.get(key + '_us') or float('nan'):8.1f}us {100 * (row.get(key + '_of_read') or 0):4.0f}%r"
                      if row.get(key + "_us") else "       n/a      ")
    capped = row["clock_capped_frac"]
    log(f"{model:12s} {n:>6}x{k:<6} M={m:<2} bf16 {pr('bf16')} | fp8 mm {pr('fp8_scaled_mm')} gemv {pr('fp8_gemv')} "
        f"blk {pr('fp8_block_gemv')} | nvfp4 v1 {pr('nvfp4_old')} prev {pr('nvfp4_prev')} new {pr('nvfp4_new')} "
        f"[{row.get('nvfp4_new_kernel')}] | plain read {pr('nvfp4_plain_read')} | SM {row['sm_clock_mhz']} MHz, "
        f"capped {'n/a' if capped is None else f'{100 * capped:.0f}%'} {row['clock_capped_by']}")


def _dense_row(env: BenchEnv, model: str, n: int, k: int, m: int, old: bool, fp8_all: bool) -> dict:
    dev = env.device
    w = torch.randn((n, k), device=dev, dtype=torch.bfloat16)
    x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
    row = {"model": model, "N": n, "K": k, "M": m}
    read, copy = env.extra.get("read_gbps"), env.copy_gbps

    def put(key, name, us, nbytes, times=None):
        row[f"{key}_us"] = us
        row[f"{key}_kernel"] = name
        row[f"{key}_of_read"] = frac(nbytes, us, read)
        row[f"{key}_of_copy"] = frac(nbytes, us, copy)
        if times:
            row[f"{key}_tried"] = times

    # bf16
    nb16 = 2 * (n * k + m * k + m * n)
    c16 = rotating_copies(2 * n * k, dev)
    ws = [w] + [w.clone() for _ in range(c16 - 1)]
    b = {"torch.mm": lambda: [(lambda a=a: torch.mm(x, a.t())) for a in ws]}
    if m == 1 and env.is_gpu:
        for cfg in gemv_kernel.CONFIGS[:2]:
            b[gemv_kernel.label(cfg)] = lambda cfg=cfg: gemv_kernel.make_calls(ws, x, cfg)
    put("bf16", *best_of(env, b, nb16)[:2], nb16)
    ws = b = None
    # fp8
    if env.is_gpu and n % 16 == 0 and k % 16 == 0:
        nb8 = n * k + 8 + m * k + 2 * m * n
        sw = (w.float().abs().amax() / 448).clamp(min=1e-12)
        w8 = (w.float() / sw).to(torch.float8_e4m3fn)
        sx = (x.float().abs().amax() / 448).clamp(min=1e-12)
        x8 = (x.float() / sx).to(torch.float8_e4m3fn)
        c8 = rotating_copies(n * k, dev)
        w8s = [w8] + [w8.clone() for _ in range(c8 - 1)]
        name, us, _ = best_of(env, {"_scaled_mm": lambda: [(lambda a=a: torch._scaled_mm(x8, a.t(), sx, sw, out_dtype=torch.bfloat16))
                                                            for a in w8s]}, nb8)
        put("fp8_scaled_mm", name, us, nb8)
        if fp8mma.available(dev, k):  # our tensor-core GEMV (kernels/fp8mma) at every M, the per-tensor scale
            fw = lp.quantize_fp8(w, False)
            fws = [fw] + [lp.Fp8Weight(fw.data.clone(), fw.scales.clone(), False) for _ in range(c8 - 1)]
            name, us, _ = best_of(env, {"fp8mma": lambda: [(lambda g=g: g(x)) for g in
                                                           [fp8mma.Fp8MmaGemv(f, m, dev) for f in fws]]}, nb8)
            put("fp8_mma", name, us, nb8)
            fws = fw = None
        # our FP8 GEMVs at M=1 only, as the gemm stage times them: CUDA-core FMAs, M of them per weight byte (at
        # M=4 the 3-D accumulator tile took 538 us on 6144x4096, against 9.5 us for _scaled_mm)
        for block in ((False, True) if m == 1 else ()):
            fw = lp.quantize_fp8(w, block)
            fws = [fw] + [lp.Fp8Weight(fw.data.clone(), fw.scales.clone(), block) for _ in range(c8 - 1)]
            cfgs = lp.DENSE_BLOCK_CONFIGS if block else lp.DENSE_CONFIGS
            cfgs = (cfgs if fp8_all else cfgs[:2]) + (lp.DENSE_BLOCK_XSCALE if block else ())
            bld = {f"{'block' if block else 'tensor'} {c.name}": (lambda c=c: [(lambda g=g: g(x)) for g in
                                                                             [lp.DenseGemv(f, m, dev, c) for f in fws]])
                   for c in cfgs}
            name, us, times = best_of(env, bld, nb8)
            put("fp8_block_gemv" if block else "fp8_gemv", name, us, nb8, times)
            fws = fw = None
        w8s = w8 = None
    # nvfp4
    q = nv.quantize_nvfp4(w)
    w = None
    nb4 = nvfp4_call_bytes(n, k, m)
    row["nvfp4_bytes"] = nb4
    qs = nvfp4_copies(q, dev)
    if old and env.is_gpu:
        name, us, _ = best_of(env, {"nvfp4-weight-only v1 (earlier)": lambda: [
            (lambda g=g: g(x)) for g in [nv.WeightOnlyGemm(qq, m, dev, variant="v1") for qq in qs]]}, nb4)
        put("nvfp4_old", name, us, nb4)
    tried = {}
    if m == 1:  # the previous session's M=1 CUDA-core forms on their own, for the closing table
        cores = lp.FP4_CUDA_CORE_CONFIGS if old else lp.FP4_CUDA_CORE_CONFIGS[:3]
        name, us, tried = best_of(env, fp4_builders(qs, x, dev, cores), nb4)
        put("nvfp4_prev", name, us, nb4, tried)
    stage = lp.FP4_STAGE_CONFIGS if m == 1 else lp.FP4_STAGE_CONFIGS_M  # and every form the gemm stage times
    _, _, times = best_of(env, fp4_builders(qs, x, dev, lp.FP4_MMA_CONFIGS + tuple(c for c in stage if c.mma)), nb4)
    tried = {**tried, **times}
    ok = {k2: v for k2, v in tried.items() if isinstance(v, float)}
    best = min(ok, key=ok.get) if ok else None
    put("nvfp4_new", best, ok.get(best), nb4, tried)
    qs = q = None
    put("nvfp4_plain_read", "plain read", plain_read_us(env, nb4), nb4)
    return row


# many K slices a tile for the small shapes (one program a tile or two, the slices summed in the program, no or few
# K splits): what the sweep's --forms slices times beside the default plan's forms
_SL = lp.GemvConfig(16, 64, 8, mma=True, evict=True, bx=True, slices=8, split=1)  # a tile of 8 slices, no K split
SLICED_MANY = tuple(replace(_SL, **kw) for kw in (
    dict(block_k=128, warps=16, slices=16), dict(warps=16, slices=16), dict(warps=32, slices=32),
    dict(block_n=32, block_k=128, warps=16), {},
    dict(block_k=128, warps=16, slices=16, split=None, warps_per_sm=48),
    dict(block_n=32, warps=16, split=None, warps_per_sm=40), dict(split=None, warps_per_sm=40)))
# x shared a program at M = 9-16 (lp.FP4_MMA_XS) with other program sizes, iterations and split targets: what
# --forms m16 times beside the default plan's forms
_XS = lp.FP4_MMA_XS
XSHARE_SIZES = (replace(_XS, block_n=128, warps=8), replace(_XS, block_n=32, warps=2), replace(_XS, block_k=64),
                replace(_XS, warps_per_sm=20), replace(_XS, warps_per_sm=36),
                replace(lp.FP4_MMA_XS_AHEAD, block_n=128, warps=8), replace(_XS, block_n=128, warps=8, block_k=64))
# tile pairs with and without the cast kernel behind them, the ring's split form (the plan above M = 12 and on
# long splits) with it, and stream-K with the ring: both sides of lp.FP4_PAIR_MAX_M's and lp.FP4_SLICED_MAX_STEPS'
# choices at M = 9-16, whichever the plan is
PAIRS = lp.FP4_MMA_PAIR + tuple(lp.with_cast(c) for c in lp.FP4_MMA_PAIR) + (
    lp.with_cast(lp.FP4_MMA_XS_RING), lp.with_cast(lp.FP4_MMA_SK_RING))
EXTRA_FORMS = {"slices": SLICED_MANY, "m16": XSHARE_SIZES, "plan": (), "xring": lp.FP4_MMA_XRING, "pair": PAIRS}


def fp4_sweep(env: BenchEnv, n: int, k: int, m: int, forms: str = "all") -> None:
    """Every NVFP4 tensor-core form on one shape (the chained ones too), fastest first, each with its fraction of
    read bandwidth; with `forms` (EXTRA_FORMS' key) those forms beside the default plan's and its neighbours."""
    dev = env.device
    q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
    x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
    nb4 = nvfp4_call_bytes(n, k, m)
    cfgs = lp.FP4_MMA_CONFIGS + lp.FP4_MMA_CHAINED + lp.FP4_MMA_XJIT + lp.FP4_MMA_XSHARE + lp.FP4_MMA_PAIR
    if forms != "all":
        extra = EXTRA_FORMS[forms]
        plan = lp.fp4_config_for(m, k, dev, n)
        # the plan without x through the ring, and with the ring the other depth
        unringed = replace(plan, xring=0) if plan is not None else None
        other_depth = replace(plan, xring={2: 3, 3: 2}[plan.xring]) if plan is not None and plan.xring else None
        cfgs = extra + tuple({plan, unringed, other_depth, lp.FP4_MMA_BX_40, lp.FP4_MMA_DEFAULT, lp.FP4_MMA_KS2,
                              lp.FP4_MMA_KS2_WIDE, lp.FP4_MMA_BX_WIDE, lp.FP4_MMA_XS, lp.FP4_MMA_XS_AHEAD,
                              lp.FP4_MMA_BX_SK_XS} - {None})
        ref = nv.reference_mm(x, q)
        # these and the plan checked on this shape before they are timed (a failed form is not timed)
        for cfg in extra + tuple({plan, other_depth} - {None}):
            if cfg.fits(k):
                _check(f"nvfp4 {cfg.name}", m, n, k, lambda: _twice_if_one_kernel(
                    lp.Nvfp4Gemv(q, m, dev, cfg, out_dtype=torch.float32), x), ref, 2e-3)
    builders = fp4_builders(nvfp4_copies(q, dev), x, dev, cfgs)
    rounds = env.extra.get("rounds", 1)
    times = best_of(env, builders, nb4)[2] if rounds <= 1 else rotated_times(env, builders, rounds)
    read_us = plain_read_us(env, nb4)
    RESULTS["gemm"].append({"model": "sweep", "N": n, "K": k, "M": m, "nvfp4_bytes": nb4, "nvfp4_new_tried": times,
                            "nvfp4_plain_read_us": read_us})
    read = env.extra.get("read_gbps")
    ok = sorted((v, name) for name, v in times.items() if isinstance(v, float))
    if read_us:
        log(f"sweep {n:>6}x{k:<6} M={m:<2} {read_us:8.2f} us "
            f"{100 * (frac(nb4, read_us, read) or 0):5.1f}%r  a plain read of the same bytes")
    for us, name in ok:
        log(f"sweep {n:>6}x{k:<6} M={m:<2} {us:8.2f} us {100 * (frac(nb4, us, read) or 0):5.1f}%r  {name}")


# --------------------------------------------------------------------------- MoE


def moe_case(env: BenchEnv, model: str, moe_fmts=("bf16", "fp8", "fp8-block", "nvfp4-prev", "nvfp4", "nvfp4-bx"),
             baselines: bool = True) -> None:
    spec = load_model_card(REPO / "config" / "models" / f"{model}.json")
    shp = shapes.moe_shape(spec)
    if not env.is_gpu:
        shp = shapes.MoeShape(hidden=64, experts_total=16, experts_local=16, top_k=2, inter=64, scoring=shp.scoring)
    es = moe.ExpertSet(env, shp, 1)
    read, copy = env.extra.get("read_gbps"), env.copy_gbps
    rows = []
    w_router = torch.randn((shp.experts_total, shp.hidden), device=env.device, dtype=torch.bfloat16) * 0.02
    weights, ids = moe.route(es.x, w_router, shp)
    rows_all, token, roww, _ = moe.permute(es.x, ids, weights, shp.experts_total)

    def routing():
        wts, i2 = moe.route(es.x, w_router, shp)
        r, t, rw, _ = moe.permute(es.x, i2, wts, shp.experts_total)
        return moe.unpermute(r, t, rw, 1)

    rows.append({"model": model, "what": "routing (router gemm, top-k, permute, unpermute)", "us": gpu_us([routing], env)})
    rows.append({"model": model, "what": "route in torch ops (router gemm, scores, top-k)",
                 "us": gpu_us([lambda: moe.route(es.x, w_router, shp)], env)})
    if rt.fused_fits(moe.routing_of(shp)) is None and (env.is_gpu or lp.interpreted()):
        fused = rt.FusedRoute(moe.routing_of(shp), 1, env.device)
        rows.append({"model": model, "what": "route fused (router gemm, then one Triton kernel)",
                     "us": gpu_us([lambda: fused(es.x @ w_router.t())], env)})
    sel16 = es.weight_elements * 2
    impls = {"per-expert loop bf16": (moe.loop_fn(es), sel16), "torch._grouped_mm bf16": (moe.grouped_fn(es), sel16)}
    if env.is_gpu and hasattr(torch, "_scaled_grouped_mm"):
        impls["torch._scaled_grouped_mm fp8 row-wise"] = (moe.scaled_grouped_fn(es), es.weight_elements)
    if not baselines:
        impls = {}
    for name, (fn, nb) in impls.items():
        try:
            fn()
            us = gpu_us([fn], env)
        except Exception as exc:
            us = None
            RESULTS["errors"][f"{model} {name}"] = describe(exc, REASON_CHARS)
        rows.append({"model": model, "what": name, "us": us, "bytes": nb, "of_read": frac(nb, us, read),
                     "of_copy": frac(nb, us, copy)})
    G = lp.GemvConfig
    cfgs = [(G(16, 512, 4, asm=True), G(16, 512, 4, asm=True)), (G(32, 256, 4, asm=True), G(8, 1024, 4, asm=True)),
            (G(8, 1024, 4, asm=True), G(32, 256, 4, asm=True)), (G(64, 256, 4, grouped=True), G(64, 256, 4, grouped=True)),
            (G(8, 1024, 4), G(8, 1024, 4))]
    if not env.is_gpu or any(c["kernel"] == "grouped nvfp4-asm" and not c["ok"] for c in RESULTS["checks"]):
        cfgs = [c for c in cfgs if not c[0].asm]
    # the tensor-core form: its two halves swept apart (sweep_mma), then the best pair timed whole
    mcfgs = [(lp.FP4_GROUPED_MMA_13, lp.FP4_GROUPED_MMA_2)] if env.is_gpu else [
        (G(32, 64, 2, mma=True), G(32, 64, 2, mma=True))]
    if any(c["kernel"].startswith("grouped nvfp4-mma") and not c["ok"] for c in RESULTS["checks"]):
        mcfgs = []
    dcfgs = [(lp.DENSE_CONFIGS[0], lp.DENSE_CONFIGS[0]), (lp.DENSE_CONFIGS[1], lp.DENSE_CONFIGS[2]),
             (lp.DENSE_CONFIGS[2], lp.DENSE_CONFIGS[1])]
    bcfgs = [(lp.block_xscale_for(shp.hidden), lp.block_xscale_for(shp.inter))] + [(c, c) for c in lp.DENSE_BLOCK_XSCALE] + [
        (lp.DENSE_BLOCK_CONFIGS[0], lp.DENSE_BLOCK_CONFIGS[0]), (lp.DENSE_BLOCK_CONFIGS[1], lp.DENSE_BLOCK_CONFIGS[1]),
        (lp.DENSE_BLOCK_CONFIGS[3], lp.DENSE_BLOCK_CONFIGS[2])]
    sel_ids = torch.arange(es.experts_hit, dtype=torch.int32, device=env.device)
    forms = {"bf16": ("bf16", dcfgs), "fp8": ("fp8", dcfgs), "fp8-block": ("fp8-block", bcfgs),
             "nvfp4-prev": ("nvfp4", cfgs), "nvfp4": ("nvfp4", mcfgs),
             "nvfp4-bx": ("nvfp4", [(lp.FP4_GROUPED_BX_13, lp.FP4_GROUPED_BX_2), *GROUPED_SLICED, *GROUPED_BX_DOWN]
                          if env.is_gpu else
                          [(G(32, 64, 2, mma=True, bx=True), G(32, 64, 2, mma=True, bx=True))])}
    if any(c["kernel"].startswith("grouped nvfp4-mma-bx") and not c["ok"] for c in RESULTS["checks"]):
        forms["nvfp4-bx"] = ("nvfp4", [])
    whats = {"nvfp4-prev": "grouped gemv nvfp4 previous (CUDA cores)", "nvfp4": "grouped gemv nvfp4 (tensor cores)",
             "nvfp4-bx": "grouped gemv nvfp4 (tensor cores, bf16 on x as it is)"}
    nvbase = None
    for key in moe_fmts:
        fmt, pairs = forms[key]
        if not pairs:
            continue
        best = None
        tried = {}
        if fmt == "nvfp4" and nvbase is not None and key != "nvfp4-bx":  # the same quantised experts for both
            base = nvbase
        else:
            base = lp.grouped_from_bf16(fmt, es.w13, es.w2, sel_ids, es.row_weights, env.device, *pairs[0])
        if fmt == "nvfp4" and nvbase is not base:
            nvbase = base
            d13, d2 = lp.dequantized_experts(base)
            ref = lp.reference_experts(es.x, d13, d2, sel_ids, es.row_weights)
            d13 = d2 = None
        if key == "nvfp4" and env.is_gpu:
            pairs = sweep_mma(env, model, base, es.x, ref, read, tried)
        for c13, c2 in (pairs if env.is_gpu else pairs[:1]):
            base.cfg13, base.cfg2 = c13, c2
            try:
                got = base(es.x)
                err = nv.relative_error(got.float(), ref) if fmt == "nvfp4" else None
                if err is not None and not err <= 1e-2:  # never time a wrong kernel
                    raise RuntimeError(f"wrong result: relative error {err:.3g}")
                us = gpu_us([lambda: base(es.x)], env)
            except Exception as exc:
                RESULTS["errors"][f"{model} grouped {fmt} {c13.name}/{c2.name}"] = describe(exc, REASON_CHARS)
                continue
            tried[base.label] = {"us": us, "rel_err": err}
            if best is None or us < best[1]:
                best = (base.label, us)
        nb = base.weight_bytes()
        rows.append({"model": model, "what": whats.get(key, f"grouped gemv {fmt}"), "kernel": best[0] if best else None,
                     "us": best[1] if best else None, "bytes": nb, "of_read": frac(nb, best[1] if best else None, read),
                     "of_copy": frac(nb, best[1] if best else None, copy), "tried": tried})
        base = None
    nvbase = ref = None
    for r in rows:
        log(f"moe {model:12s} {r['what']:42s} {r['us'] or float('nan'):8.1f} us  "
            + (f"{100 * (r.get('of_read') or 0):4.0f}% of read BW on the selected experts' bytes" if r.get("bytes") else ""))
    RESULTS["moe"] += rows
    es = None
    if env.is_gpu:
        torch.cuda.empty_cache()


# the grouped bf16 form with K slices (timed whole beside the default pair): gate_up paired with the SiLU fused in
# one kernel, a tile's K range over 4 or 2 warps; down as the default or over 2 slices. H200 (2026-12-01, read 4470
# GB/s): slower than the default pair (split gate_up, SiLU kernel, down): DeepSeek-V3 64.2 / 74.6 / 66.3 us against
# 59.8, GLM-5 57.4 / 65.8 / 59.1 against 53.3, so the default stays
_S = dict(mma=True, evict=True, bx=True)
GROUPED_SLICED = [(lp.GemvConfig(16, 128, 4, slices=4, **_S), lp.FP4_GROUPED_BX_2),
                  (lp.GemvConfig(32, 128, 4, slices=2, **_S), lp.FP4_GROUPED_BX_2),
                  (lp.GemvConfig(16, 128, 4, slices=4, **_S), lp.GemvConfig(32, 128, 4, slices=2, **_S))]

# the default gate_up with down at 4 steps an iteration (the fp16 form's sweep put GLM-5's down at 17.1 us with it
# against 18.9 for 2 steps, DeepSeek-V3's at 23.3 against 21.0: 2026-12-02, read 4384 GB/s), timed whole in bf16: the
# MoE stage's alternative (lowprec.grouped_alternatives)
GROUPED_BX_DOWN = [(lp.FP4_GROUPED_BX_13, lp.FP4_GROUPED_BX_2_WIDE)]

# gate_up (K = H): paired with the SiLU fused (no split), or split over K (fp32 partials, then the SiLU kernel);
# down (K = I = 2048): split or not; evict-first weight loads except where marked
_G = lp.GemvConfig
MMA13 = [_G(64, 128, 4, mma=True, evict=True), _G(128, 128, 8, mma=True, evict=True)] + [
    _G(64, 128, 4, split=sp, mma=True, evict=True) for sp in (2, 3, 4, 6, 8)] + [
    _G(64, 256, 4, split=4, mma=True, evict=True), _G(128, 128, 8, split=4, mma=True, evict=True),
    _G(64, 128, 4, split=4, mma=True)]
MMA2 = [_G(64, 128, 4, split=sp, mma=True, evict=True) for sp in (None, 2, 3, 4)] + [
    _G(128, 128, 8, mma=True, evict=True), _G(64, 256, 4, mma=True, evict=True), _G(64, 128, 4, split=2, mma=True)]


def sweep_mma(env: BenchEnv, model: str, base, x, ref, read, tried: dict) -> list:
    """The grouped tensor-core form's halves timed apart (gate_up with x packing, down), every candidate checked
    whole against the reference first; returns the best pair (and the default) to time whole."""
    d13, d2 = lp.FP4_GROUPED_MMA_13, lp.FP4_GROUPED_MMA_2
    h, i, sl = base.h, base.i, base.slots
    b13, b2 = sl * nv.nvfp4_bytes(2 * i, h), sl * nv.nvfp4_bytes(h, i)
    best = {}
    for half, cands, nb in (("gate_up", MMA13, b13), ("down", MMA2, b2)):
        for c in cands:
            base.cfg13, base.cfg2 = (c, d2) if half == "gate_up" else (d13, c)
            try:
                err = nv.relative_error(base(x).float(), ref)
                if not err <= 1e-2:
                    raise RuntimeError(f"wrong result: relative error {err:.3g}")
                fn = (lambda: base.mma_gate_up(x)) if half == "gate_up" else base.mma_down
                us = gpu_us([fn], env)
            except Exception as exc:
                RESULTS["errors"][f"{model} grouped mma {half} {c.name}"] = describe(exc, REASON_CHARS)
                continue
            tried[f"{half} {c.name}"] = {"us": us, "rel_err": err, "of_read": frac(nb, us, read)}
            log(f"moe {model:12s} mma {half:7s} {c.name:28s} {us:7.1f} us {100 * (frac(nb, us, read) or 0):4.0f}% "
                f"err {err:.2g}")
            if half not in best or us < best[half][1]:
                best[half] = (c, us)
    base.cfg13, base.cfg2 = d13, d2
    pairs = [(d13, d2)]
    if "gate_up" in best and "down" in best:
        pairs.insert(0, (best["gate_up"][0], best["down"][0]))
    return pairs


# --------------------------------------------------------------------------- main


def closing_table(res: dict) -> str:
    """The NVFP4 rows as a markdown table: time and fraction of read bandwidth of v1 (the earlier kernel), the
    previous session's M=1 CUDA-core forms and the fastest GEMV now, beside FP8 _scaled_mm and bf16."""
    def cell(row, key):
        us, fr = row.get(f"{key}_us"), row.get(f"{key}_of_read")
        return f"{us:.1f} us, {fr:.2f}" if us and fr else "n/a"

    def bound(row):  # the most of read bandwidth an NVFP4 call can show with the one-row GEMV floor (modelled)
        b = floor_bound_fraction(row.get("nvfp4_bytes"), (res.get("memory") or {}).get("read_gbps"),
                                 (res.get("latency_floor") or {}).get("one_row_gemv_us"))
        return f"{b:.2f}" if b is not None else "n/a"

    def over_read(row):  # the GEMV's time over a plain read of the same bytes (measured)
        us, read_us = row.get("nvfp4_new_us"), row.get("nvfp4_plain_read_us")
        return f"{us / read_us:.2f}x" if us and read_us else "n/a"

    def clocks(row):  # NVML while the row was timed: SM clock at the end, share of the time under a cap
        mhz, capped = row.get("sm_clock_mhz"), row.get("clock_capped_frac")
        return "n/a" if mhz is None else f"{mhz}" + ("" if capped is None else f" ({100 * capped:.0f}% capped)")

    lines = ["| model | N x K | M | nvfp4 v1 | nvfp4 previous | nvfp4 now (kernel) | bound at floor | plain read of its bytes "
             "| now / read | fp8 _scaled_mm | fp8 gemv | fp8 128x128 gemv | fp8 tensor-core gemv | bf16 | SM MHz |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["gemm"]:
        lines.append(f"| {r['model']} | {r['N']}x{r['K']} | {r['M']} | {cell(r, 'nvfp4_old')} | {cell(r, 'nvfp4_prev')} | "
                     f"{cell(r, 'nvfp4_new')} ({r.get('nvfp4_new_kernel')}) | {bound(r)} | "
                     f"{cell(r, 'nvfp4_plain_read')} | {over_read(r)} | {cell(r, 'fp8_scaled_mm')} | "
                     f"{cell(r, 'fp8_gemv')} | {cell(r, 'fp8_block_gemv')} | {cell(r, 'fp8_mma')} | "
                     f"{cell(r, 'bf16')} | {clocks(r)} |")
    for r in res["moe"]:
        if r.get("of_read") is not None:
            lines.append(f"| {r['model']} MoE | {r['what']} | 1 | | | {r['us']:.1f} us, {r['of_read']:.2f} "
                         "| | | | | | | | | |")
    return "\n".join(lines)



def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out-lowprec")
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--shapes", default="28672x4096,4096x14336,36864x7168,128256x4096",
                    help="the sweep section's N x K shapes (comma-separated), each at every --ms")
    ap.add_argument("--ms", default="1", help="the sweep section's M values (comma-separated)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="the sweep section's rounds: above 1, its forms are built once and timed in rounds that "
                         "rotate their order, each form's median of rounds kept")
    ap.add_argument("--forms", default="all", choices=("all", *EXTRA_FORMS),
                    help="the sweep section's forms: all, or the default plan's and its neighbours (plan), with "
                         "many K slices a tile (slices), x shared in other program sizes (m16), x through the ring "
                         "(xring) or tile pairs (pair)")
    ap.add_argument("--sections", default="memory,checks,llama,moe,dsv3,glm5,stage",
                    help="also: bw (bandwidths only), stats, fp8block (block-scaled fp8 above batch 1: checks and "
                         "times), fusedmoe (the fp8 fused MoE above batch 1: checks and times), fp4moe (the NVFP4 "
                         "fused MoE at batch 1-16: checks and times), moechecks (grouped checks only), kernelchecks "
                         "(routing, attention, fp8block, fused MoE and NVFP4 fused MoE checks), moe4 (the NVFP4 "
                         "grouped forms only)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = pick_device()
    env = BenchEnv(device=device, warmup=2, iters=args.iters, cpu_budget_s=0.05, extra={"rounds": args.rounds})
    log(f"device {env.device_name} {env.sm} torch {torch.__version__} triton {lp.HAVE_TRITON}")
    sections = args.sections.split(",")

    def run(name, fn):
        if time.time() - T0 > args.budget_s:
            RESULTS["errors"][name] = "not run: over the time budget"
            log(f"skip {name}: over budget")
            return
        t = time.time()
        try:
            fn()
        except Exception as exc:
            RESULTS["errors"][name] = f"{type(exc).__name__}: {exc}"[:400]
            traceback.print_exc()
        log(f"section {name}: {time.time() - t:.1f} s")
        (out / "lowprec.json").write_text(json.dumps(RESULTS, indent=1, default=str))

    def do_memory():
        m = memory.measure_memory(env) if env.is_gpu else memory.measure_memory(env, cpu_bytes=8 * 2**20, cpu_mm=64)
        env.copy_gbps, env.extra["read_gbps"] = m["copy_gbps"], m["read_gbps"]
        RESULTS["memory"] = {"copy_gbps": m["copy_gbps"], "read_gbps": m["read_gbps"]}
        RESULTS["latency_floor"] = {k: v.get("value") for k, v in launch.latency_floor(env).items()}
        log(f"copy {m['copy_gbps']:.0f} GB/s, read {m['read_gbps']:.0f} GB/s, floor {RESULTS['latency_floor']}")

    def do_bw():  # read and copy bandwidth only, timed as microbench.memory times them (no peak matmuls)
        from decode_gap.microbench.timing import gbps, time_events

        nbytes = 2 * 2**30 if env.is_gpu else 8 * 2**20
        src = torch.rand(nbytes // 4, device=env.device)
        dst = torch.empty_like(src)
        t = (lambda fn: time_events(fn, 2, env.iters, env.device).median_us) if env.is_gpu else (lambda fn: gpu_us([fn], env))
        env.copy_gbps = gbps(2 * nbytes, t(lambda: dst.copy_(src)))
        env.extra["read_gbps"] = gbps(nbytes, t(lambda: src.sum()))
        RESULTS["memory"] = {"copy_gbps": env.copy_gbps, "read_gbps": env.extra["read_gbps"]}
        log(f"copy {env.copy_gbps:.0f} GB/s, read {env.extra['read_gbps']:.0f} GB/s")

    llama = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
    if "memory" in sections:
        run("memory", do_memory)
    elif "bw" in sections:
        run("bw", do_bw)
    if "stats" in sections:
        run("stats", lambda: kernel_stats(env, out))
    if "checks" in sections:
        run("checks", lambda: checks(env))
        bad = [c for c in RESULTS["checks"] if not c["ok"]]
        log(f"checks: {len(RESULTS['checks']) - len(bad)} passed, {len(bad)} failed")
    if not env.is_gpu:
        llama = [(64, 256)]
    if "llama" in sections:
        for n, k in llama:
            run(f"llama {n}x{k} M=1", lambda n=n, k=k: dense_case(env, "llama-3.1-8b", n, k, 1, old=True, fp8_all=True))
        for (n, k), m in ((llama[0], 4), (llama[0], 16), (llama[2], 4), (llama[2], 8), (llama[2], 16),
                          (llama[4], 16)) if env.is_gpu else ():
            run(f"llama {n}x{k} M={m}", lambda n=n, k=k, m=m: dense_case(env, "llama-3.1-8b", n, k, m, old=m == 4,
                                                                         fp8_all=False))
    if "moe" in sections or "moe4" in sections:  # moe4: the two NVFP4 grouped forms only (no baselines)
        fmts = ("nvfp4-prev", "nvfp4", "nvfp4-bx") if "moe4" in sections else \
            ("bf16", "fp8", "fp8-block", "nvfp4-prev", "nvfp4", "nvfp4-bx")
        for model in ("deepseek-v3", "glm-5") if env.is_gpu else ("deepseek-v3",):
            run(f"moe {model}", lambda model=model: moe_case(env, model, fmts, baselines="moe" in sections))
    if "kernelchecks" in sections:  # the fused routing and attention checks only
        run("kernelchecks", lambda: (routing_checks(env), attention_checks(env)))
        bad = [c for c in RESULTS["checks"] if not c["ok"]]
        log(f"checks: {len(RESULTS['checks']) - len(bad)} passed, {len(bad)} failed: {bad}")
    if ("fp8block" in sections or "kernelchecks" in sections) and env.is_gpu:  # block-scaled fp8 above batch 1
        run("fp8block", lambda: fp8block_case(env, timed="fp8block" in sections))
        bad = [c for c in RESULTS["checks"] if not c["ok"]]
        log(f"checks: {len(RESULTS['checks']) - len(bad)} passed, {len(bad)} failed: {bad}")
    if ("fusedmoe" in sections or "kernelchecks" in sections) and env.is_gpu:  # fp8 fused MoE, batch > 1
        run("fusedmoe", lambda: fusedmoe_case(env, timed="fusedmoe" in sections))
        bad = [c for c in RESULTS["checks"] if not c["ok"]]
        log(f"checks: {len(RESULTS['checks']) - len(bad)} passed, {len(bad)} failed: {bad}")
    if "fp4moe" in sections or "kernelchecks" in sections:  # NVFP4 fused MoE, batch 1-16
        run("fp4moe", lambda: fp4moe_case(env, timed="fp4moe" in sections and env.is_gpu))
        bad = [c for c in RESULTS["checks"] if not c["ok"]]
        log(f"checks: {len(RESULTS['checks']) - len(bad)} passed, {len(bad)} failed: {bad}")
    if "moechecks" in sections:  # the grouped experts' checks only (awkward sizes)
        run("moechecks", lambda: grouped_checks(env))
        bad = [c for c in RESULTS["checks"] if not c["ok"]]
        log(f"checks: {len(RESULTS['checks']) - len(bad)} passed, {len(bad)} failed")
    for key, model in (("dsv3", "deepseek-v3"), ("glm5", "glm-5")):
        if key not in sections or not env.is_gpu:
            continue
        spec = load_model_card(REPO / "config" / "models" / f"{model}.json")
        for (n, k) in sorted(shapes.unique_shapes(shapes.gemm_shapes(spec)), key=lambda nk: -nk[0] * nk[1]):
            run(f"{model} {n}x{k}", lambda n=n, k=k, model=model: dense_case(env, model, n, k, 1, old=False, fp8_all=False))
    if "sweep" in sections:  # the NVFP4 tensor-core forms alone on --shapes at --ms: a kernel change, quickly
        for nk in args.shapes.split(","):
            n, k = (int(v) for v in nk.lower().split("x"))
            for m in (int(v) for v in args.ms.split(",")):
                run(f"sweep {n}x{k} M={m}", lambda n=n, k=k, m=m: fp4_sweep(env, n, k, m, args.forms))
    if "stage" in sections:
        def do_stage():  # the pipeline's own code paths (gemm and moe stages) on this GPU, small
            from decode_gap.microbench import gemm

            df, js = gemm.run_gemm_bench(env, [shapes.GemmShape("attn.o_proj", "attention", 4096, 4096),
                                               shapes.GemmShape("mlp.gate_up_proj", "mlp", 28672, 4096)], [1],
                                         log=lambda s: None)
            RESULTS["stage_gemm"] = {"rows": df[["name", "dtype", "backend", "gpu_us", "frac_of_copy_bw",
                                                 "latency_floor_us"]].to_dict("records"),
                                     "checks": js["checks"], "skipped": js["skipped"]}
            spec = load_model_card(REPO / "config" / "models" / "deepseek-v3.json")
            mdf, mjs = moe.run_moe_bench(env, shapes.moe_shape(spec), [1, 8] if env.is_gpu else [1],
                                         log=lambda s: None)
            RESULTS["stage_moe"] = {"rows": mdf[["name", "impl", "dtype", "backend", "gpu_us", "frac_of_copy_bw"]]
                                    .to_dict("records"), "by_m": mjs["by_m"], "skipped": mjs["skipped"]}
            for r in RESULTS["stage_gemm"]["rows"] + RESULTS["stage_moe"]["rows"]:
                log(f"stage {r}")

        run("stage", do_stage)
    (out / "lowprec.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    print(closing_table(RESULTS), flush=True)
    bad = [c for c in RESULTS["checks"] if not c["ok"]]
    log(f"done: {len(RESULTS['gemm'])} shapes, {len(RESULTS['moe'])} moe rows, {len(bad)} failed checks, "
        f"errors {list(RESULTS['errors'])[:10]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
