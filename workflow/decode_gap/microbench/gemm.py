"""Decode GEMMs at the model's per-GPU shapes, by dtype, with the backend chosen by capability at run time.

y[M, N] = x[M, K] @ W[N, K]^T. Bytes are what the layer must move in its stored format: the weight (with
its scales), the activation and the output, once each; FLOPs are 2 M N K. `gbps` and `tflops` come from
GPU time on a GPU (graph replay over rotating weight copies larger than L2) and from wall time on a CPU host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from ..errors import DecodeGapError
from . import gemv as gemv_kernel
from ..kernels import fp4wide, fp8block, fp8mma
from ..kernels import lowprec as lp
from ..kernels import nvfp4 as nv
from ..errors import REASON_CHARS, describe
from .common import BenchEnv, skip, summary
from .shapes import GemmShape, unique_shapes
from .timing import ClockWatch, CpuCacheFlusher, L2Flusher, fraction, gbps, measure, rotating_copies, tflops

COLUMNS = [
    "name", "dtype", "backend", "M", "N", "K", "gpu_us", "eager_us", "gbps", "tflops", "frac_of_copy_bw",
    "gpu_min_us", "gpu_p99_us", "eager_min_us", "eager_p99_us", "eager_loop_us", "timing", "iters",
    "bytes", "flops", "group", "layers", "per_layer", "quantizable", "copies", "note", "latency_floor_us",
    "plain_read_us", "frac_of_plain_read", "clock_capped_frac", "clock_capped_by", "sm_clock_mhz",
]

BF16 = "bf16"
FP32 = "fp32"
FP8 = "fp8"
NVFP4 = "nvfp4"


@dataclass(frozen=True)
class Backend:
    dtype: str
    label: str


def bytes_moved(dtype: str, m: int, n: int, k: int, backend: str = "") -> int:
    """Weight (stored format, scales included) + activation + output bytes of one GEMM."""
    if dtype == FP32:
        return 4 * (n * k + m * k + m * n)
    if dtype == BF16:
        return 2 * (n * k + m * k + m * n)
    if dtype == FP8:
        return n * k + 4 + m * k + 4 + 2 * m * n  # e4m3 weight and activation, per-tensor scales, bf16 out
    if dtype == NVFP4:
        act = nv.nvfp4_bytes(m, k) if "scaled_mm" in backend else 2 * m * k  # W4A4 or bf16 activation
        out = 4 * m * n if "reference" in backend else 2 * m * n
        return nv.nvfp4_bytes(n, k) + act + out
    raise DecodeGapError(f"gemm: unknown dtype {dtype}")


def flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def choose_backends(env: BenchEnv) -> tuple[list[Backend], list[dict[str, str]]]:
    """Every dtype this device can run, and a reason for each it cannot."""
    skipped: list[dict[str, str]] = []
    if not env.is_gpu:
        return (
            [Backend(FP32, "torch.mm"), Backend(BF16, "torch.mm"), Backend(NVFP4, "nvfp4-reference (dequantise + torch.mm fp32)")],
            [skip("fp8", "no GPU: fp8 GEMMs need sm89+ tensor cores (torch._scaled_mm)")],
        )
    out = [Backend(BF16, "torch.mm")]
    cap = env.capability or (0, 0)
    if cap >= (8, 9):
        out.append(Backend(FP8, "torch._scaled_mm(e4m3, per-tensor scales)"))
    else:
        skipped.append(skip("fp8", f"fp8 tensor cores need sm89 or newer; this GPU is {env.sm}"))
    if nv.has_fp4_tensor_cores(env.device):
        out.append(Backend(NVFP4, nv.ScaledMmNvfp4.label))
    elif nv.HAVE_TRITON:
        out.append(Backend(NVFP4, nv.WeightOnlyGemm.label))
        skipped.append(skip("nvfp4 tensor cores", f"FP4 tensor cores need sm100/sm120; this GPU is {env.sm}: "
                            "the Triton weight-only kernel (nvfp4-weight-only) ran instead"))
    else:
        skipped.append(skip("nvfp4", f"no FP4 tensor cores on {env.sm} and Triton is not installed"))
    return out, skipped


# --------------------------------------------------------------------------- cases


def _copies_of(t: torch.Tensor, copies: int) -> list[torch.Tensor]:
    return [t] + [t.clone() for _ in range(copies - 1)]


GEMV_WX = "torch.mm(W, x^T)"  # M=1 only: y^T = W @ x^T is the same memory as y, and cuBLAS may pick another kernel
# our Triton GEMVs (lowprec.py), offered beside the library kernel for M <= 16 and kept only when faster (NVFP4
# above 16 rows: kernels/fp4wide's GEMM beside the first weight-only kernel)
FP8_GEMV = "triton fp8 gemv (per-tensor scale)"
FP8_BLOCK_GEMV = "triton fp8 gemv (128x128 block scales)"
FP8_MMA_PREFIX = "triton fp8 tensor-core gemv"  # kernels/fp8mma, M = 1-16
FP8_MMA_GEMV = f"{FP8_MMA_PREFIX} (128x128 block scales)"
FP8_MMA_GEMV_TENSOR = f"{FP8_MMA_PREFIX} (per-tensor scale)"
FP4_GEMV = "triton nvfp4 gemv"  # + the config name: "m,..." is the tensor-core form, the rest M=1 CUDA-core forms
FP4_WIDE = "triton nvfp4 wide gemm"  # + the config name: kernels/fp4wide, M > 16 (32 rows of x a pass)


def lowprec_variants(env: BenchEnv, be: Backend, m: int, k: int) -> list[str]:
    """Triton GEMV candidates for this backend, M and K (label + config), none where they do not apply (above 16
    rows only NVFP4 weight-only has any: fp4wide's forms): a tensor-core NVFP4 form whose iteration does not divide
    K is no candidate (it was listed among the cases the host could not run, which it is not: another form runs the
    shape)."""
    if not (env.is_gpu and lp.HAVE_TRITON):
        return []
    if m > 16:
        if be.dtype == NVFP4 and be.label == nv.WeightOnlyGemm.label and fp4wide.fits(m, k, env.device):
            return [f"{FP4_WIDE} {c.name}" for c in fp4wide.WIDE_CONFIGS if c.fits(k)]
        return []
    if be.dtype == FP8 and m == 1:  # CUDA-core FMA: M FMAs per weight byte, so only the GEMV
        return ([f"{FP8_GEMV} {c.name}" for c in lp.DENSE_CONFIGS[:3]]
                + [f"{FP8_BLOCK_GEMV} {c.name}" for c in lp.DENSE_BLOCK_CONFIGS[:3] + lp.DENSE_BLOCK_XSCALE])
    if be.dtype == NVFP4 and be.label == nv.WeightOnlyGemm.label:
        return [f"{FP4_GEMV} {c.name}" for c in (lp.FP4_STAGE_CONFIGS if m == 1 else lp.FP4_STAGE_CONFIGS_M)
                if c.fits(k)]
    return []


def block_mm_variants(env: BenchEnv, be: Backend, m: int, n: int, k: int) -> list[str]:
    """fp8 with 128x128 block scales above batch 1 (DeepSeek-V3's format): the activation's 1x128 quantisation and
    cuBLAS's blockwise-scaled GEMM, timed beside per-tensor `_scaled_mm`, where this GPU's cuBLAS has blockwise
    scaling and takes the shape."""
    if not env.is_gpu or be.dtype != FP8 or m == 1 or fp8block.refusal(n, k) or not fp8block.supported(env.device):
        return []
    return [fp8block.LABEL]


def fp8_mma_variants(env: BenchEnv, be: Backend, m: int, k: int) -> list[str]:
    """Our fp8 tensor-core GEMV (kernels/fp8mma, x in bf16 as it is: weight-only) at M = 1-16, with the per-tensor
    scale and with 128x128 block scales on the same e4m3 bytes, where K is whole 128-value iterations."""
    if not env.is_gpu or be.dtype != FP8 or m > 16 or not fp8mma.available(env.device, k):
        return []
    return [FP8_MMA_GEMV_TENSOR, FP8_MMA_GEMV]


# every NVFP4 GEMV form a candidate name (lowprec_variants) can name, M=1 and M > 1
FP4_VARIANT_CONFIGS = lp.FP4_M1_CONFIGS + lp.FP4_STAGE_CONFIGS + lp.FP4_STAGE_CONFIGS_M


def fp8_variant_block(variant: str) -> bool:
    """Whether an fp8 GEMV candidate name (lowprec_variants, fp8_mma_variants) runs 128x128 block scales."""
    return variant.startswith(FP8_BLOCK_GEMV) or variant == FP8_MMA_GEMV


def fp8_gemv(variant: str, fw: lp.Fp8Weight, m: int, dev) -> Any:
    """The fp8 GEMV a candidate name of ours names, on fw: the tensor-core one, or the CUDA-core form it names."""
    if variant.startswith(FP8_MMA_PREFIX):
        return fp8mma.Fp8MmaGemv(fw, m, dev)
    return lp.DenseGemv(fw, m, dev, variant_config(variant))


def fp4_gemv(variant: str, q: nv.NVFP4Tensor, m: int, dev) -> Any:
    """The NVFP4 kernel a candidate name of ours names: the GEMV (M <= 16) or the wide GEMM (M > 16)."""
    cfg = variant_config(variant)
    return fp4wide.Nvfp4WideGemm(q, m, dev, cfg) if variant.startswith(FP4_WIDE) else lp.Nvfp4Gemv(q, m, dev, cfg)


def variant_config(variant: str) -> lp.GemvConfig:
    """The GEMV form a candidate name of lowprec_variants names (one lookup for building and checking it)."""
    block_configs = lp.DENSE_BLOCK_CONFIGS + lp.DENSE_BLOCK_XSCALE
    prefix, configs = ((FP8_BLOCK_GEMV, block_configs) if variant.startswith(FP8_BLOCK_GEMV)
                       else (FP8_GEMV, lp.DENSE_CONFIGS) if variant.startswith(FP8_GEMV)
                       else (FP4_WIDE, fp4wide.WIDE_CONFIGS) if variant.startswith(FP4_WIDE)
                       else (FP4_GEMV, FP4_VARIANT_CONFIGS))
    cfg = next((c for c in configs if variant == f"{prefix} {c.name}"), None)
    if cfg is None:  # a candidate list and its lookup out of step: say which, not a bare StopIteration
        raise DecodeGapError(f"gemm: no GEMV form is named {variant!r}")
    return cfg


def build_case(env: BenchEnv, be: Backend, m: int, n: int, k: int, seed: int = 0,
               variant: str | None = None) -> tuple[list[Callable[[], Any]], int, str]:
    """Callables (one per rotating weight copy) computing the GEMM, their copy count, and a note."""
    dev = env.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    w = torch.randn((n, k), generator=gen, device=dev, dtype=torch.float32 if be.dtype == FP32 else torch.bfloat16)
    x = torch.randn((m, k), generator=gen, device=dev, dtype=w.dtype)
    wbytes = bytes_moved(be.dtype, 0, n, k, be.label)
    copies = rotating_copies(wbytes, dev) if env.is_gpu else 1
    note = ""
    if be.dtype in (FP32, BF16):
        ws = _copies_of(w, copies)
        if variant is not None and variant.startswith("triton gemv"):
            cfg = next(c for c in gemv_kernel.CONFIGS if gemv_kernel.label(c) == variant)
            return gemv_kernel.make_calls(ws, x, cfg), copies, note
        if variant == GEMV_WX:
            xt = x.t()
            outs = [torch.empty((n, m), device=dev, dtype=w.dtype) for _ in ws]
            return [(lambda a=a, o=o: torch.mm(a, xt, out=o)) for a, o in zip(ws, outs)], copies, note
        outs = [torch.empty((m, n), device=dev, dtype=w.dtype) for _ in ws]
        return [(lambda a=a, o=o: torch.mm(x, a.t(), out=o)) for a, o in zip(ws, outs)], copies, note
    if be.dtype == FP8:
        if n % 16 or k % 16:
            raise _Skip(f"torch._scaled_mm needs N and K divisible by 16 (N={n}, K={k})")
        sw = nv.e4m3_scale(w.float().abs().amax())
        sx = nv.e4m3_scale(x.float().abs().amax())
        w8 = (w.float() / sw).to(torch.float8_e4m3fn)
        x8 = (x.float() / sx).to(torch.float8_e4m3fn)
        del w
        if variant == fp8block.LABEL:  # the quantisation of x in the timed call, as the kernel level runs it
            fw = lp.quantize_fp8(w8.float() * sw, block=True)
            mms = [fp8block.BlockScaledMm(fw if i == 0 else lp.Fp8Weight(fw.data.clone(), fw.scales.clone(), True), m,
                                          dev) for i in range(copies)]
            return [(lambda mm=mm: mm(x)) for mm in mms], copies, "bf16 activation quantised 1x128 in the call"
        if variant is not None and variant.startswith((FP8_GEMV, FP8_BLOCK_GEMV, FP8_MMA_PREFIX)):
            block = fp8_variant_block(variant)
            fw = lp.quantize_fp8(w8.float() * sw, block=block)
            gs = [fp8_gemv(variant, fw if i == 0 else lp.Fp8Weight(fw.data.clone(), fw.scales.clone(), block), m, dev)
                  for i in range(copies)]
            return [(lambda g=g: g(x)) for g in gs], copies, f"{gs[0].label}; bf16 activation (weight-only)"
        ws = _copies_of(w8, copies)
        return [(lambda a=a: torch._scaled_mm(x8, a.t(), sx, sw, out_dtype=torch.bfloat16)) for a in ws], copies, \
            "activation quantised outside the timed call"
    if be.dtype == NVFP4:
        if k % nv.BLOCK:
            raise _Skip(f"NVFP4 needs K divisible by 16 (K={k})")
        q = nv.quantize_nvfp4(w)
        del w
        if variant is not None and variant.startswith((FP4_GEMV, FP4_WIDE)):
            cfg = variant_config(variant)
            if not cfg.fits(k):
                raise _Skip(f"the tensor-core NVFP4 GEMV needs K % {cfg.k_multiple} == 0 (K={k})")
            gs = [fp4_gemv(variant, q if i == 0 else _clone_q(q), m, dev) for i in range(copies)]
            return [(lambda g=g: g(x)) for g in gs], copies, gs[0].label
        if be.label == nv.WeightOnlyGemm.label:
            # the earlier kernel (v1) as the baseline the Triton GEMVs are held against
            gemms = [nv.WeightOnlyGemm(q if i == 0 else _clone_q(q), m, dev, variant="v1") for i in range(copies)]
            return [(lambda g=g: g(x)) for g in gemms], copies, f"plan {gemms[0].plan}"
        if be.label == nv.ScaledMmNvfp4.label:
            mms = [nv.ScaledMmNvfp4(q if i == 0 else _clone_q(q), x) for i in range(copies)]
            return list(mms), copies, "activation quantised and per-tensor scales applied outside the timed call"
        # CPU reference: dequantise then matmul, every call
        return [lambda: x.float() @ nv.dequantize_nvfp4(q).t()], 1, "reference path: dequantises on every call"
    raise _Skip(f"unknown dtype {be.dtype}")


def _clone_q(q: nv.NVFP4Tensor) -> nv.NVFP4Tensor:
    return nv.NVFP4Tensor(q.packed.clone(), q.block_scales.clone(), q.tensor_scale.clone(), q.shape)


class _Skip(Exception):
    pass


def check_case(env: BenchEnv, be: Backend, m: int, n: int, k: int, seed: int = 1) -> dict[str, Any]:
    """Relative error of one backend against its fp32 reference on fresh random inputs."""
    dev = env.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    w = torch.randn((n, k), generator=gen, device=dev)
    x = torch.randn((m, k), generator=gen, device=dev).to(torch.bfloat16)
    if be.dtype == BF16:
        out = torch.mm(x, w.to(torch.bfloat16).t())
        ref = x.float() @ w.to(torch.bfloat16).float().t()
        tol = 1e-2
    elif be.dtype == FP32:
        out = torch.mm(x.float(), w.t())
        ref = x.double() @ w.double().t()
        tol = 1e-5
    elif be.dtype == FP8:
        sw = nv.e4m3_scale(w.abs().amax())
        sx = nv.e4m3_scale(x.float().abs().amax())
        w8 = (w / sw).to(torch.float8_e4m3fn)
        x8 = (x.float() / sx).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(x8, w8.t(), sx, sw, out_dtype=torch.bfloat16)
        ref = (x8.float() * sx) @ (w8.float() * sw).t()
        tol = 1e-2
    else:
        q = nv.quantize_nvfp4(w)
        ref = nv.reference_mm(x, q)
        if be.label == nv.WeightOnlyGemm.label:
            out = nv.WeightOnlyGemm(q, m, dev)(x)
            tol = 1e-2
        elif be.label == nv.ScaledMmNvfp4.label:
            mm = nv.ScaledMmNvfp4(q, x)
            out = mm.result()
            xq_ref = nv.dequantize_nvfp4(mm.xq)  # W4A4: the reference uses the quantised activation too
            ref = xq_ref @ nv.dequantize_nvfp4(q).t()
            tol = 2e-2
        else:
            out = x.float() @ nv.dequantize_nvfp4(q).t()
            tol = 1e-5
    err = nv.relative_error(out, ref)
    return {"dtype": be.dtype, "backend": be.label, "M": m, "N": n, "K": k, "rel_err": err, "tolerance": tol,
            "pass": bool(math.isfinite(err) and err <= tol)}


CHECK_CALLS = 3  # calls a check makes on the same inputs, the worst kept: a split's sums left behind or a race shows


def check_variant(env: BenchEnv, be: Backend, variant: str, m: int, n: int, k: int, seed: int = 1) -> dict[str, Any]:
    """One of our Triton GEMVs against dequantise-then-matmul (fp32) on fresh random inputs, the worst of
    CHECK_CALLS calls (an intermittent race in a split's cast showed in some calls only: lowprec._zero_loaded)."""
    row: dict[str, Any] = {"dtype": be.dtype, "backend": variant, "M": m, "N": n, "K": k}
    try:
        dev = env.device
        gen = torch.Generator(device=dev).manual_seed(seed)
        w = torch.randn((n, k), generator=gen, device=dev)
        x = torch.randn((m, k), generator=gen, device=dev).to(torch.bfloat16)
        if variant.startswith((FP4_GEMV, FP4_WIDE)):
            q = nv.quantize_nvfp4(w)
            fn, ref = fp4_gemv(variant, q, m, dev), nv.reference_mm(x, q)
        elif variant == fp8block.LABEL:
            fn = fp8block.BlockScaledMm(lp.quantize_fp8(w, block=True), m, dev)
            ref = fn.reference(x)
        else:
            fw = lp.quantize_fp8(w, block=fp8_variant_block(variant))
            fn, ref = fp8_gemv(variant, fw, m, dev), x.float() @ lp.dequantize_fp8(fw).t()
        errs = [nv.relative_error(fn(x), ref) for _ in range(CHECK_CALLS)]
        err = max(errs) if all(math.isfinite(e) for e in errs) else math.nan  # (max() would drop a later NaN)
        row.update(rel_err=err, tolerance=1e-2, **{"pass": bool(math.isfinite(err) and err <= 1e-2)})
    except Exception as exc:
        row.update(error=describe(exc, REASON_CHARS), **{"pass": False})
    return row


# --------------------------------------------------------------------------- the stage


def run_gemm_bench(env: BenchEnv, shapes: list[GemmShape], m_values: list[int], backends: list[Backend] | None = None,
                   checks: bool = True, log: Callable[[str], None] = print) -> tuple[pd.DataFrame, dict[str, Any]]:
    chosen, skipped = choose_backends(env)
    if backends is not None:
        chosen = backends
    flush = L2Flusher(env.device) if env.is_gpu else CpuCacheFlusher()
    rows: list[dict[str, Any]] = []
    check_rows: list[dict[str, Any]] = []
    not_quantised: set[str] = set()
    groups = unique_shapes(shapes)
    from .launch import PlainReads, latency_floor  # same stage

    floor = latency_floor(env)
    floor_us = (floor.get("one_row_gemv_us") or {}).get("value")
    reads = PlainReads(env, flush)
    for be in chosen:
        failed_check = False
        for (n, k), names in groups.items():
            if not env.is_gpu and n * k > env.cpu_max_weight_elements:
                for s in names:
                    skipped.append(skip(f"{s.name} {be.dtype}", f"weight {n}x{k} = {n * k} elements exceeds "
                                        f"microbench.cpu_max_weight_elements={env.cpu_max_weight_elements} on a CPU host"))
                continue
            if be.dtype in (FP8, NVFP4) and not any(s.quantizable for s in names):
                not_quantised.update(s.name for s in names)  # not a skip: no format stores these quantised
                continue
            if checks and env.is_gpu:
                for m in sorted({m_values[0], m_values[-1]}):
                    try:
                        c = check_case(env, be, m, n, k)
                    except Exception as exc:
                        c = {"dtype": be.dtype, "backend": be.label, "M": m, "N": n, "K": k,
                             "error": describe(exc, REASON_CHARS), "pass": False}
                    check_rows.append(c)
                    failed_check |= not c["pass"]
            for m in m_values:
                case = f"{names[0].name} {be.dtype} M={m} ({n}x{k})"
                label = be.label
                watch = ClockWatch(env.device).start()  # the case's candidates, timed under which clocks
                try:
                    fns, copies, note = build_case(env, be, m, n, k)
                    t = measure(fns, env.device, env.warmup, env.iters, flush=flush, cpu_budget_s=env.cpu_budget_s,
                                graphs=env.graphs)
                    tried = {be.label: t}
                    names_tried = []
                    if env.is_gpu and be.dtype == BF16 and m == 1:
                        # a GEMV: time both operand orders and our Triton GEMV tiles too (chosen at run time)
                        names_tried = [GEMV_WX] + ([gemv_kernel.label(c) for c in gemv_kernel.CONFIGS]
                                                   if gemv_kernel.available(env.device) else [])
                    ours = (lowprec_variants(env, be, m, k) + block_mm_variants(env, be, m, n, k)
                            + fp8_mma_variants(env, be, m, k))
                    names_tried += ours
                    for variant in names_tried:
                        del fns
                        fns = []
                        try:
                            fns, copies, _ = build_case(env, be, m, n, k, variant=variant)
                            tried[variant] = measure(fns, env.device, env.warmup, env.iters, flush=flush,
                                                     graphs=env.graphs)
                        except Exception as exc:  # a candidate that fails to build or run is left out, not fatal
                            skipped.append(skip(f"{case} {variant}", describe(exc, REASON_CHARS)))
                            if env.is_gpu:
                                torch.cuda.synchronize()
                    if len(tried) > 1:
                        label = min(tried, key=lambda name: tried[name].device_us)
                        t = tried[label]
                        others = ", ".join(f"{name} {r.device_us:.2f} us" for name, r in tried.items() if name != label)
                        note = f"fastest of: {others}"
                        if checks and label in ours:  # the winner, checked at this M
                            c = check_variant(env, be, label, m, n, k)
                            check_rows.append(c)
                            failed_check |= not c["pass"]
                except _Skip as exc:
                    skipped.append(skip(case, str(exc)))
                    continue
                except torch.OutOfMemoryError as exc:
                    skipped.append(skip(case, f"out of memory: {describe(exc, REASON_CHARS)}"))
                    if env.is_gpu:
                        torch.cuda.empty_cache()
                    continue
                except Exception as exc:
                    skipped.append(skip(case, describe(exc, REASON_CHARS)))
                    if env.is_gpu:
                        torch.cuda.synchronize()
                    continue
                del fns
                watch.stop()
                nb = bytes_moved(be.dtype, m, n, k, be.label)
                fl = flops(m, n, k)
                bw = gbps(nb, t.device_us)
                for s in names:
                    rows.append({
                        "name": s.name, "dtype": be.dtype, "backend": label, "M": m, "N": n, "K": k,
                        **t.columns(), "gbps": bw, "tflops": tflops(fl, t.device_us),
                        "frac_of_copy_bw": fraction(bw, env.copy_gbps), "bytes": nb, "flops": fl, "group": s.group,
                        "layers": s.layers, "per_layer": s.per_layer, "quantizable": s.quantizable, "copies": copies,
                        "note": "; ".join(x for x in (note, t.note) if x), "latency_floor_us": floor_us,
                        **reads.columns(nb, t.device_us),
                        **watch.columns(),
                    })
                log(f"gemm {case}: {t.device_us:.2f} us ({t.method}), eager {t.eager.median_us:.2f} us, "
                    f"{bw or 0:.0f} GB/s")
            if env.is_gpu:
                torch.cuda.empty_cache()
        if failed_check:
            skipped.append(skip(f"{be.dtype} check", f"{be.label} disagreed with its reference on at least one shape "
                                "(see checks); its timings are kept but flagged"))
    df = pd.DataFrame(rows, columns=COLUMNS)
    out = gemm_summary(env, df, chosen, skipped + reads.skipped, check_rows)
    out["not_quantised"] = sorted(not_quantised)
    out["latency_floor"] = floor
    out["plain_read_method"] = reads.method
    return df, out


def gemm_summary(env: BenchEnv, df: pd.DataFrame, chosen: list[Backend], skipped: list[dict[str, str]],
                 check_rows: list[dict[str, Any]]) -> dict[str, Any]:
    dtypes: dict[str, Any] = {}
    for be in chosen:
        sub = df[df["dtype"] == be.dtype].drop_duplicates(subset=["M", "N", "K"])
        if sub.empty:
            dtypes[be.dtype] = {"backend": be.label, "status": "unavailable", "why": "no case ran"}
            continue
        by_m: dict[str, Any] = {}
        for m, g in sub.groupby("M"):
            time_col = "gpu_us" if env.is_gpu else "eager_us"
            total_t = float(g[time_col].sum())
            agg = gbps(float(g["bytes"].sum()), total_t)
            by_m[str(int(m))] = {
                "frac_of_copy_bw_median": _nanmedian(g["frac_of_copy_bw"]),
                "gbps_median": _nanmedian(g["gbps"]),
                "gbps_aggregate": agg,
                "frac_of_copy_bw_aggregate": fraction(agg, env.copy_gbps),
                "frac_of_plain_read_median": _nanmedian(g["frac_of_plain_read"]),
                "shapes": int(len(g)),
                **step_totals(df[(df["dtype"] == be.dtype) & (df["M"] == m)], time_col, env.copy_gbps),
            }
        checks = [c for c in check_rows if c.get("dtype") == be.dtype and c.get("backend") == be.label]
        labels = sorted(set(sub["backend"]))
        dtypes[be.dtype] = {
            "backend": labels[0] if len(labels) == 1 else " | ".join(labels) + " (fastest per shape)",
            "status": "measured",
            "timing": str(sub["timing"].iloc[0]),
            "by_m": by_m,
            "checks_passed": all(c.get("pass") for c in checks) if checks else None,
        }
    ran = int(len(df))
    return summary(
        "microbench.gemm",
        env,
        backend="; ".join(_backend_said(b, df) for b in chosen),
        skipped=skipped,
        ran=ran,
        copy_gbps=env.copy_gbps,
        copy_gbps_status="measured" if env.copy_gbps else "unavailable: memory.json has no copy_gbps",
        dtypes=dtypes,
        checks=check_rows,
        definitions={
            "gpu_us": "GPU time per call: CUDA-graph replay over rotating weight copies larger than 2x L2 (median)",
            "eager_us": "one isolated eager call, launch to completion (perf_counter around fn(); synchronize())",
            "eager_loop_us": "wall time per call of back-to-back eager calls (CPU launch-bound when kernels are short)",
            "gbps": "bytes (weight+scales, activation, output in the stored format) / (gpu_us, or eager_us on CPU)",
            "frac_of_copy_bw": "gbps / memory.json copy_gbps",
            "plain_read_us": "time of a plain read of the row's bytes at this size (plain_read_method), measured as "
                             "the row is timed: what its bytes alone cost, ramp-up and tail included",
            "frac_of_plain_read": "plain_read_us / gpu_us (eager_us on CPU): 1.0 moves the bytes as fast as a plain "
                                  "read of them",
            "by_m.<M>.step_*": "the dense GEMMs of one decode step at M (every named row's time x layers x "
                               "per_layer, routed experts left out): step_gemm_us measured, step_plain_read_us a "
                               "plain read of their bytes, step_at_copy_bw_us their bytes at copy bandwidth",
        },
    )


def _backend_said(be: Backend, df: pd.DataFrame) -> str:
    """A dtype's backend as the rows keep it: the library's, or it and the other candidates (our Triton GEMVs, the
    swapped operand order) where one of those was faster on some shape (the report's heading says this)."""
    kept = set(df.loc[df["dtype"] == be.dtype, "backend"])
    if kept and kept != {be.label}:
        return f"{be.dtype}: the fastest per shape of {be.label} and the other candidates (each row's backend)"
    return f"{be.dtype}: {be.label}"


STEP_EXCLUDES = ("routed_expert",)  # a decode step runs top-k of them, not every one the rows count (moe.csv has those)


def step_totals(rows: pd.DataFrame, time_col: str, copy_gbps: float | None) -> dict[str, Any]:
    """The dense GEMMs of one decode step at this M, from every named row (each shape's time x layers x per_layer,
    the routed experts left out): their time, a plain read of their bytes, and their bytes at copy bandwidth. What
    lies between the first two is the GEMM kernels' own; between the last two, what those sizes cost as a plain
    read. A total is None where a row it needs has no figure (no partial sums)."""
    rows = rows[~rows["group"].isin(STEP_EXCLUDES)]
    times = rows["layers"] * rows["per_layer"]

    def total(col: str) -> float | None:
        v = pd.to_numeric(rows[col], errors="coerce") * times
        return float(v.sum()) if len(v) and v.notna().all() else None

    nbytes = float((rows["bytes"] * times).sum()) if len(rows) else None
    return {"step_gemm_us": total(time_col), "step_plain_read_us": total("plain_read_us"),
            "step_at_copy_bw_us": nbytes / copy_gbps / 1e3 if nbytes and copy_gbps else None,
            "step_gemm_rows": int(len(rows)), "step_groups": sorted(set(rows["group"]))}


def _nanmedian(s: pd.Series) -> float | None:
    a = pd.to_numeric(s, errors="coerce").to_numpy(dtype=float)
    a = a[np.isfinite(a)]
    return float(np.median(a)) if a.size else None
