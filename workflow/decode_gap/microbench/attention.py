"""Decode attention (one new query token per sequence) at the configured context lengths, per-GPU heads.

- GQA/MHA models: `F.scaled_dot_product_attention` with each SDPA backend that accepts the case
  (flash, efficient, cudnn, math on a GPU; the default on CPU), K/V [B, kv_heads, L, D] bf16 (fp32 on CPU).
  Sliding-window layers (Gemma 3) read min(L, window) keys: timed as `sdpa-sliding`.
- MLA models (DeepSeek-V3, GLM-5): the absorbed form a decode kernel runs. q_nope is absorbed into the
  latent space (bmm with W_UK), scores against the compressed cache c_kv [B, L, kv_lora_rank] plus the
  RoPE keys [B, L, rope_dim], softmax, value read from c_kv, then up-projected with W_UV (bmm).
- DSA (GLM-5's indexer): index scores over the whole context and the indices of the index_topk largest, then MLA
  over the selected tokens, read through those indices from the whole cache (`mla-absorbed-sparse` at
  L = index_topk).

Beside torch's, each case is timed with the kernel level's own Triton decode kernels on a GPU (`triton:split-kv`:
split-KV flash decoding plus a combine, `kernels.attention`), as engines run decode attention (FlashInfer, FlashMLA,
vLLM's and SGLang's Triton decode kernels): SDPA's kernels give one program per (sequence, head) or per query block, so
one token at batch 1 leaves most SMs idle, and a ceiling measured with them would blame the GPU for our kernel choice.
The best backend per case is the one the summary keeps.

Bytes are the KV cache read (plus q, out and the absorbed weights for MLA); no FLOP-bound claims are made.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pandas as pd
import torch
import torch.nn.functional as F

from ..kernels import attention as attn_kernels
from ..kernels import topk as topk_kernels
from ..kernels.lowprec import available
from ..errors import REASON_CHARS, describe
from .common import BenchEnv, skip, summary
from .shapes import AttentionShape
from .timing import CpuCacheFlusher, L2Flusher, fraction, gbps, measure

COLUMNS = [
    "name", "backend", "batch", "context_len", "heads", "kv_heads", "head_dim", "gpu_us", "eager_us", "gbps",
    "frac_of_copy_bw", "gpu_min_us", "gpu_p99_us", "eager_min_us", "eager_p99_us", "eager_loop_us", "timing",
    "iters", "bytes", "layers", "note",
]


def _sdpa_backends(env: BenchEnv):
    if not env.is_gpu:
        return [("default", None)]
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:  # older torch
        return [("default", None)]
    out = []
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        if hasattr(SDPBackend, name):
            out.append((name.lower(), getattr(SDPBackend, name)))
    return out


def sdpa_case(env: BenchEnv, b: int, heads: int, kv_heads: int, d: int, length: int, backend) -> tuple[Callable[[], Any], int]:
    """One decode token's attention over K/V [B, KV, L, D]: through SDPA with `backend` (None: torch's choice), or
    through the split-KV Triton kernel where `backend` is "triton"."""
    dev = env.device
    dtype = torch.bfloat16 if env.is_gpu else torch.float32
    q = torch.randn((b, heads, 1, d), device=dev, dtype=dtype)
    k = torch.randn((b, kv_heads, length, d), device=dev, dtype=dtype)
    v = torch.randn((b, kv_heads, length, d), device=dev, dtype=dtype)
    gqa = heads != kv_heads
    es = dtype.itemsize if hasattr(dtype, "itemsize") else torch.tensor([], dtype=dtype).element_size()
    nbytes = es * (2 * b * kv_heads * length * d + 2 * b * heads * d)

    if backend == "triton":
        kernel = attn_kernels.GqaDecode(b, heads, kv_heads, d, length, dev, dtype)
        q3, scale = q.squeeze(2), 1.0 / math.sqrt(d)

        def fn():
            return kernel(q3, k, v, scale)
    elif backend is None:
        def fn():
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    else:
        from torch.nn.attention import sdpa_kernel

        def fn():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    fn()  # raise here if this backend refuses the case
    return fn, nbytes


def mla_case(env: BenchEnv, shape: AttentionShape, b: int, length: int, triton: bool = False,
             context: int = 0) -> tuple[Callable[[], Any], int]:
    """Absorbed MLA decode for one token: in torch ops over c_kv [B, L, r] and the RoPE keys [B, L, p], or with
    `triton` the split-KV MLA kernel over the latent cache as one [B, L, r + p] tensor (as FlashMLA stores it);
    the two absorptions around it are the same bmm's either way. With `context` (DSA) the cache holds that many
    rows and the attention reads `length` of them, scattered, through an index list: torch gathers them first,
    the Triton kernel reads them in place."""
    dev = env.device
    dtype = torch.bfloat16 if env.is_gpu else torch.float32
    h, r, p, dn, dv = shape.heads, shape.kv_lora_rank, shape.qk_rope_head_dim, shape.qk_nope_head_dim, shape.v_head_dim
    q_nope = torch.randn((b, h, dn), device=dev, dtype=dtype)
    q_pe = torch.randn((b, h, p), device=dev, dtype=dtype)
    w_uk = torch.randn((h, dn, r), device=dev, dtype=dtype) * 0.05
    w_uv = torch.randn((h, r, dv), device=dev, dtype=dtype) * 0.05
    scale = 1.0 / math.sqrt(dn + p)

    rows = max(length, context)
    picked = torch.rand((b, rows), device=dev).argsort(dim=-1)[:, :length].to(torch.int32) if context else None
    if triton:
        cache = torch.randn((b, rows, r + p), device=dev, dtype=dtype)
        kernel = attn_kernels.MlaDecode(b, h, r, p, length, dev, dtype)

        def attend(q_lat):
            return kernel(torch.cat((q_lat, q_pe), dim=-1), cache, scale, rows=picked)
    else:
        c_kv_all = torch.randn((b, rows, r), device=dev, dtype=dtype)
        k_pe_all = torch.randn((b, rows, p), device=dev, dtype=dtype)

        def attend(q_lat):
            c_kv, k_pe = c_kv_all, k_pe_all
            if picked is not None:
                at = picked.long().unsqueeze(-1)
                c_kv, k_pe = c_kv_all.gather(1, at.expand(-1, -1, r)), k_pe_all.gather(1, at.expand(-1, -1, p))
            scores = torch.matmul(q_lat, c_kv.transpose(1, 2)) + torch.matmul(q_pe, k_pe.transpose(1, 2))  # [B, H, L]
            probs = torch.softmax(scores.float() * scale, dim=-1).to(dtype)
            return torch.matmul(probs, c_kv)  # [B, H, r]

    def fn():
        q_lat = torch.einsum("bhd,hdr->bhr", q_nope, w_uk)  # absorb W_UK
        return torch.einsum("bhr,hrv->bhv", attend(q_lat), w_uv)  # absorb W_UV

    es = torch.tensor([], dtype=dtype).element_size()
    nbytes = es * (b * length * (r + p) + w_uk.numel() + w_uv.numel() + b * h * (dn + p + dv))
    fn()
    return fn, nbytes


def indexer_case(env: BenchEnv, shape: AttentionShape, b: int, length: int,
                 triton: bool = False, form: str = "") -> tuple[Callable[[], Any], int]:
    """The DSA indexer for one token over FP8 keys and FP8 queries with a scale a key and a head (DeepSeek-V3.2's
    cache and scores, GLM-5's): scores over the context, then the indices of the index_topk largest, unsorted (the
    attention sums over them): torch ops (both cast up, a matmul, the key scales past the relu, the query scales in
    the weights) and torch.topk, or with `triton` the scores kernel (an FP8 dot) and the selection `kernels.topk`
    offers by the label `form` (default: what topk_indices runs, a radix select)."""
    dev = env.device
    dtype = torch.bfloat16 if env.is_gpu else torch.float32
    hi, di, topk = shape.index_heads, shape.index_head_dim, shape.index_topk
    fp8 = attn_kernels.INDEX_KEY_DTYPE
    q = torch.randn((b, hi, di), device=dev, dtype=dtype).to(fp8)
    k = torch.randn((b, length, di), device=dev, dtype=dtype).to(fp8)
    q_scale = torch.rand((b, hi), device=dev, dtype=torch.float32)
    k_scale = torch.rand((b, length), device=dev, dtype=torch.float32)
    w = torch.randn((b, hi), device=dev, dtype=torch.float32)
    kk = min(topk, length)

    def scores():
        if triton:
            return attn_kernels.index_scores(q, k, w, key_scale=k_scale, query_scale=q_scale)
        s = torch.relu(torch.matmul(q.to(dtype), k.to(dtype).transpose(1, 2)).float()) * k_scale[:, None]
        return (s * (w * q_scale)[..., None]).sum(1)  # [B, L]

    # ours: the form its label names, as the kernel level runs it (the one-launch form with its counts kept)
    select = (topk_kernels.forms(length, b, dev)[form or topk_kernels.label(length, b, dev)] if triton
              else topk_kernels.topk_indices_reference)

    def fn():
        return select(scores(), kk)

    fn()
    return fn, b * length * (di * k.element_size() + k_scale.element_size()) + b * hi * (di + q_scale.element_size())


def run_attention_bench(env: BenchEnv, shape: AttentionShape, context_lens: list[int], batches: list[int],
                        log=print) -> tuple[pd.DataFrame, dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    flush = L2Flusher(env.device) if env.is_gpu else CpuCacheFlusher()

    def add(name, backend, b, length, fn_bytes_maker, heads, kv_heads, head_dim, layers, note=""):
        case = f"{name} {backend} B={b} L={length}"
        try:
            fn, nbytes = fn_bytes_maker()
            t = measure([fn], env.device, env.warmup, env.iters, flush=flush, cpu_budget_s=env.cpu_budget_s,
                        graphs=env.graphs)
        except Exception as exc:
            skipped.append(skip(case, describe(exc, REASON_CHARS)))
            if env.is_gpu:
                torch.cuda.synchronize()
            return
        bw = gbps(nbytes, t.device_us)
        rows.append({"name": name, "backend": backend, "batch": b, "context_len": length, "heads": heads,
                     "kv_heads": kv_heads, "head_dim": head_dim, **t.columns(), "gbps": bw,
                     "frac_of_copy_bw": fraction(bw, env.copy_gbps), "bytes": nbytes, "layers": layers,
                     "note": "; ".join(x for x in (note, t.note) if x)})
        log(f"attention {case}: {t.device_us:.1f} us ({t.method}), eager {t.eager.median_us:.1f} us")

    # the Triton decode kernels run where Triton has a GPU (the CPU interpreter would time the interpreter)
    triton_ok = env.is_gpu and available(env.device)
    mla_width = shape.kv_lora_rank + shape.qk_rope_head_dim  # 0 for GQA
    torch_mla, torch_index = "torch (einsum/matmul/softmax)", "torch (matmul/relu/topk)"
    for b in batches:
        for length in context_lens:
            if shape.kind == "gqa":
                cases = [("sdpa", length, shape.layers - shape.sliding_layers, "")]
                if shape.sliding_layers and shape.sliding_window:
                    cases.append(("sdpa-sliding", min(length, shape.sliding_window), shape.sliding_layers,
                                  f"sliding window {shape.sliding_window} at context {length}"))
                backends = _sdpa_backends(env) + ([("triton", "triton")] if triton_ok else [])
                for bname, be in backends:
                    label = "triton:split-kv" if be == "triton" else f"sdpa:{bname}"
                    for name, n, layers, note in cases:
                        add(name, label, b, n,
                            lambda be=be, n=n: sdpa_case(env, b, shape.heads, shape.kv_heads, shape.head_dim, n, be),
                            shape.heads, shape.kv_heads, shape.head_dim, layers, note=note)
                continue
            mla = [(torch_mla, False)] + ([("triton:split-kv", True)] if triton_ok else [])
            for label, tri in mla:
                add("mla-absorbed", label, b, length, lambda tri=tri: mla_case(env, shape, b, length, tri),
                    shape.heads, 1, mla_width, shape.layers, note="dense over the whole context")
            if not (shape.index_heads and shape.index_topk):
                continue
            k_top = shape.index_topk
            # the selection: our radix select (one program a row up to MAX_ROW scores, with a tail block a little
            # past it, multi-pass past that, in one launch where it fits), and the pairwise rank beside it up to
            # RANK_MAX scores (the kernel level keeps the faster); none where L <= top-k
            selects = ([""] if length <= k_top else [topk_kernels.label(length, b, env.device)]
                       + ([topk_kernels.RANK_LABEL] if length <= topk_kernels.RANK_MAX else []))
            index = [(torch_index, False, "")] + [
                (f"triton scores (FP8 dot){' + ' + form.removeprefix('triton ') if form else ''}", True, form)
                for form in (selects if triton_ok else [])]
            for label, tri, form in index:
                add("dsa-indexer", label, b, length,
                    lambda tri=tri, form=form: indexer_case(env, shape, b, length, tri, form),
                    shape.index_heads, 1, shape.index_head_dim, shape.layers, note=f"index scores over L, top-{k_top}"
                    + ("" if length > k_top else " (L <= top-k: every index, no selection run)"))
            if length > k_top:
                for label, tri in mla:
                    add("mla-absorbed-sparse", label, b, k_top,
                        lambda tri=tri: mla_case(env, shape, b, k_top, tri, context=length),
                        shape.heads, 1, mla_width, shape.layers,
                        note=f"DSA: attends to the top {k_top} of {length} tokens, read through their indices"
                             + ("" if tri else " (gathered first)"))
        if env.is_gpu:
            torch.cuda.empty_cache()
    df = pd.DataFrame(rows, columns=COLUMNS)
    by_case: dict[str, Any] = {}
    col = "gpu_us" if env.is_gpu else "eager_us"
    for (name, b, length), g in df.groupby(["name", "batch", "context_len"]):
        best = g.loc[g[col].idxmin()]
        by_case[f"{name} B={b} L={length}"] = {"best_backend": best["backend"], "us": best[col],
                                               "eager_us": best["eager_us"], "gbps": best["gbps"]}
    return df, summary(
        "microbench.attention", env, env.backend, skipped, int(len(df)),
        shape={k: v for k, v in shape.__dict__.items() if k != "extra"}, best=by_case,
        triton_kernels="timed beside torch's" if triton_ok else "not run: needs Triton on a GPU",
    )
