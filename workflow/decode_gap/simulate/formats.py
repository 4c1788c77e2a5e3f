"""Kernel level: what this device can run for a weight format (capability probes: fp8 scaled mm, grouped mm,
NVFP4), and the stand-in dtype it runs otherwise (see kernel.py)."""

from __future__ import annotations

from typing import Any

from ..errors import describe

# expert kinds that run our grouped GEMV over the experts each token selects (one call a token)
GROUPED_GEMV_KINDS = ("nvfp4", "fp8-block", "fp8-gemv")

# ----------------------------------------------------------------------------------------------------------
# capability probes


def _torch():
    import torch

    return torch


def probe_formats(weight_format: str, device: str, batch: int = 1) -> dict[str, Any]:
    """Decide the dtypes the kernel level runs for `weight_format` on `device` at `batch` rows a step, by trying
    them."""
    torch = _torch()
    on_gpu = device.startswith("cuda")
    act = "bf16" if on_gpu else ("bf16" if weight_format == "bf16" else "fp32")
    info: dict[str, Any] = {"activations": act, "linear": act, "format_match": True, "stand_in": ""}
    if weight_format == "bf16":
        return info
    if weight_format in ("fp8", "fp8-block") and on_gpu:
        try:
            w = torch.randn(32, 64, device=device).to(torch.float8_e4m3fn)
            one = torch.ones((), device=device)
            try:
                x = torch.randn(1, 64, device=device).to(torch.float8_e4m3fn)
                torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            except Exception:  # some builds want M padded to 16 rows, as engines do for decode
                x = torch.randn(16, 64, device=device).to(torch.float8_e4m3fn)
                torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                info["pad_m"] = 16
            info["linear"] = "fp8"
            block = weight_format == "fp8-block"
            if batch == 1 and _probe_fp8_gemvs(device, block):
                kind = "fp8-block" if block else "fp8-gemv"
                info.update(linear=kind, experts=kind, note=(
                    "fp8-block linears run, shape by shape, the faster of our 128x128 block-scaled Triton GEMVs "
                    "(decode_gap.kernels.lowprec.DenseGemv, the scales applied to x, and the tensor-core "
                    "decode_gap.kernels.fp8mma, x in bf16; both timed once a shape at build) and routed experts the "
                    "grouped GEMV with the same scales (on tensor cores, decode_gap.kernels.fp8mma.GroupedFp8Mma, "
                    "where H and I are whole 128-value blocks)"
                    if block else
                    "fp8 linears run, shape by shape, the fastest of torch._scaled_mm and our per-tensor Triton GEMVs "
                    "(decode_gap.kernels.lowprec.DenseGemv on CUDA cores, decode_gap.kernels.fp8mma on tensor "
                    "cores; each timed once a shape at build, as engines pick tactics); routed experts the grouped "
                    "fp8 GEMV over each token's selected experts (on tensor cores, decode_gap.kernels.fp8mma."
                    "GroupedFp8Mma, where H and I are whole 128-value blocks)"))
            elif batch != 1:
                moe = _probe_fused_moe(device, block)
                info["experts"] = ("fp8-block-moe" if block else "fp8-moe") if moe else "fp8"
                experts = (f"routed experts the fp8 fused MoE ({'128x128 block' if block else 'per-expert'} weight "
                           "scales; decode_gap.kernels.fusedmoe: the pairs sorted by expert, Triton fp8 dots, as "
                           "engines' fused_moe_kernel)" if moe else
                           "routed experts torch._scaled_grouped_mm with per-tensor scales" +
                           (" (the same bytes but for the scales)" if block else ""))
                if not block:
                    info["note"] = (f"fp8 linears at {batch} rows a step run, shape by shape, the faster of "
                                    "torch._scaled_mm and our tensor-core GEMV on x in bf16 (decode_gap.kernels."
                                    f"fp8mma, up to 16 rows; both timed once a shape at build); {experts}")
                elif not (why_not := _block_mm_why_not(device)):
                    info.update(linear="fp8-block-mm", note=(
                        f"fp8-block linears at {batch} rows a step run, shape by shape, the faster of the "
                        "activation's 1x128 quantisation (Triton) and torch._scaled_mm with the 128x128 block scales "
                        "(cuBLAS blockwise scaling; decode_gap.kernels.fp8block) and our tensor-core GEMV on x in "
                        "bf16 (decode_gap.kernels.fp8mma, up to 16 rows; both timed once a shape at build); "
                        f"{experts}"))
                else:
                    info["note"] = (f"fp8-block linears run with per-tensor scales (at {batch} rows a step cuBLAS's "
                                    f"blockwise scaling did not run here ({why_not}) and our block-scaled GEMVs run "
                                    f"on CUDA cores); {experts}")
            elif block:
                info["note"] = "fp8-block runs with per-tensor scales (the block-scaled GEMV failed here)"
            return info
        except Exception as exc:  # no fp8 tensor cores (sm < 89) or no kernel
            why = f"torch._scaled_mm fp8 failed here ({describe(exc, 120)})"
    elif weight_format == "nvfp4" and on_gpu:
        try:
            from ..kernels import nvfp4 as nv

            q = nv.quantize_nvfp4(torch.randn(64, 64, device=device))
            nv.WeightOnlyGemm(q, 1, device)(torch.randn(1, 64, device=device, dtype=torch.bfloat16))
            info["linear"] = "nvfp4-wo"
            failed: list[str] = []  # why each experts' kernel did not run here, for the stand-in's note
            if _probe_fused_nvfp4(device, failed):
                info["experts"] = "nvfp4-moe"
                info["note"] = ("nvfp4 linears run the micro-benchmarks' nvfp4-weight-only Triton kernel "
                                "(decode_gap.kernels.nvfp4); routed experts the NVFP4 fused MoE (decode_gap.kernels."
                                "fp4moe: the pairs sorted by expert, each expert hit read once a step, decoded onto "
                                "bf16 tensor cores)")
                return info
            if _probe_grouped_nvfp4(device, failed):
                info["experts"] = "nvfp4"
                info["note"] = ("nvfp4 linears run the micro-benchmarks' nvfp4-weight-only Triton kernel "
                                "(decode_gap.kernels.nvfp4); routed experts the grouped NVFP4 GEMV over the experts "
                                "each token selects (decode_gap.kernels.lowprec.GroupedExperts, one call a token: "
                                "the fused MoE did not run here)")
                return info
            info["experts"] = "bf16"
            info["note"] = ("nvfp4 linears run the micro-benchmarks' nvfp4-weight-only Triton kernel "
                            "(decode_gap.kernels.nvfp4); routed experts run bf16")
            info["experts_stand_in"] = True
            info["experts_failed"] = "; ".join(failed)
            return info
        except Exception as exc:
            why = f"nvfp4-weight-only kernel failed here ({describe(exc, 120)})"
    elif on_gpu:
        why = f"no kernel for {weight_format} weights at the kernel level on this GPU"
    else:
        why = f"{weight_format} weights have no torch CPU kernel here"
    info.update(format_match=False, stand_in=f"{why}: {act} stand-in weights (bytes and kernels differ from {weight_format})")
    return info


def _probe_fp8_gemvs(device: str, block: bool) -> bool:
    """Whether our FP8 GEMVs (per-tensor or 128x128 block scales) run here at M=1 (Triton on a GPU with fp8): a
    dense 64 x 256 and a grouped pair of two experts of 128 rows, each finite."""
    torch = _torch()
    try:
        from ..kernels import lowprec as lp

        if not lp.available(device):
            return False
        x = torch.randn(1, 256, device=device, dtype=torch.bfloat16)
        dense = lp.DenseGemv(lp.quantize_fp8(torch.randn(64, 256, device=device), block=block), 1, device)
        g = lp.grouped_from_bf16("fp8-block" if block else "fp8", torch.randn(2, 256, 256, device=device),
                                 torch.randn(2, 256, 128, device=device), torch.tensor([1, 0], device=device),
                                 torch.ones(2, device=device), device)
        return bool(torch.isfinite(dense(x)).all() and torch.isfinite(g(x)).all())
    except Exception:  # no Triton, no fp8 conversion on this GPU, or no kernel
        return False


def _probe_fused_moe(device: str, block: bool) -> bool:
    """Whether the fp8 fused MoE (Triton fp8 dots, sm89+) runs here with block (else per-expert) weight scales and
    agrees with dequantise-then-matmul: four experts of 256 x 128, two tokens choosing two each."""
    torch = _torch()
    try:
        from ..kernels import fusedmoe
        from ..kernels import lowprec as lp

        if not lp.available(device):
            return False
        w13 = lp.quantize_fp8(torch.randn(4, 256, 128, device=device), block=block)
        w2 = lp.quantize_fp8(torch.randn(4, 128, 128, device=device), block=block)
        moe = fusedmoe.FusedMoe(w13, w2, 2, 2, device)
        x = torch.randn(2, 128, device=device, dtype=torch.bfloat16)
        ids = torch.tensor([[0, 3], [3, 1]], dtype=torch.int32, device=device)
        w = torch.full((2, 2), 0.5, device=device)
        ref = moe.reference(x, ids, w)
        return bool(((moe(x, ids, w).float() - ref).norm() / ref.norm()).item() < 2e-2)
    except Exception:  # no Triton, no fp8 dots on this GPU, or no kernel
        return False


def _block_mm_why_not(device: str) -> str:
    """"" where cuBLAS's blockwise-scaled fp8 GEMM (with our activation quantisation) runs here, else why not."""
    try:
        from ..kernels import fp8block

        return fp8block.why_not(device)
    except Exception as exc:  # an fp8-less torch build
        return describe(exc)


def _nvfp4_probe_experts(device: str):
    """Four NVFP4 experts (gate_up 128 x 64, down 64 x 64) where the tensor-core NVFP4 forms can run here, else
    None."""
    torch = _torch()
    from ..kernels import lowprec as lp
    from ..kernels import nvfp4 as nv

    if not (lp.available(device) and lp.grouped_mma_fits(64, 64, device)):
        return None
    return ([nv.quantize_nvfp4(torch.randn(128, 64, device=device)) for _ in range(4)],
            [nv.quantize_nvfp4(torch.randn(64, 64, device=device)) for _ in range(4)])


def _failed(why: list[str] | None, kernel: str, exc: BaseException | str) -> bool:
    """False, with why `kernel` did not run appended to `why` (one line)."""
    if why is not None:
        text = exc if isinstance(exc, str) else describe(exc)
        why.append(f"{kernel}: {text}")
    return False


def _probe_fused_nvfp4(device: str, why: list[str] | None = None) -> bool:
    """Whether the NVFP4 fused MoE (bf16 tensor-core form, sm89+) runs here and agrees with dequantise-then-matmul:
    four experts, two tokens choosing two each (the align), and one token (its ids read as the blocks' experts).
    Where not, the reason goes into `why`."""
    torch = _torch()
    try:
        from ..kernels import fp4moe

        if (experts := _nvfp4_probe_experts(device)) is None:
            return _failed(why, "the NVFP4 fused MoE", "needs Triton and tensor cores of sm89 or later")
        w13, w2 = experts
        d13, d2 = fp4moe.dequantized(w13), fp4moe.dequantized(w2)
        x = torch.randn(2, 64, device=device, dtype=torch.bfloat16)
        ids = torch.tensor([[0, 3], [3, 1]], dtype=torch.int32, device=device)
        w = torch.full((2, 2), 0.5, device=device)
        for m in (2, 1):
            moe = fp4moe.Nvfp4FusedMoe(w13, w2, m, 2, device)
            ref = fp4moe.reference(x[:m], ids[:m], w[:m], lambda e: (d13[e], d2[e]))
            err = ((moe(x[:m], ids[:m], w[:m]).float() - ref).norm() / ref.norm()).item()
            if not err < 2e-2:
                return _failed(why, "the NVFP4 fused MoE", f"{m} token(s): relative error {err:.3g} against "
                                                           "dequantise-then-matmul")
        return True
    except Exception as exc:  # no Triton, an older GPU, or no kernel
        return _failed(why, "the NVFP4 fused MoE", exc)


def _probe_grouped_nvfp4(device: str, why: list[str] | None = None) -> bool:
    """Whether the grouped NVFP4 GEMV (tensor-core form, sm89+) runs here: four experts, two selected. Where not,
    the reason goes into `why`."""
    torch = _torch()
    try:
        from ..kernels import lowprec as lp

        if (experts := _nvfp4_probe_experts(device)) is None:
            return _failed(why, "the grouped NVFP4 GEMV", "needs Triton and tensor cores of sm89 or later")
        w13, w2 = experts
        g = lp.GroupedExperts("nvfp4", w13, w2, torch.tensor([0, 2], device=device), torch.ones(2, device=device),
                              device)
        if not torch.isfinite(g(torch.randn(1, 64, device=device, dtype=torch.bfloat16))).all():
            return _failed(why, "the grouped NVFP4 GEMV", "a sum that is not finite")
        return True
    except Exception as exc:  # no Triton, an older GPU, or no kernel
        return _failed(why, "the grouped NVFP4 GEMV", exc)


# the fused MoEs' K granularity: NVFP4's MMA steps are 64 values, fp8's activation groups 128
FUSED_K_MULTIPLE = {"nvfp4-moe": 64, "fp8-moe": 128, "fp8-block-moe": 128}
FUSED_FALLBACK = {"nvfp4-moe": "nvfp4", "fp8-moe": "fp8", "fp8-block-moe": "fp8"}


def fused_moe_fallback(kind: str, hidden: int, inter: int) -> str:
    """The expert kind a step runs for the per-GPU shapes: a fused MoE (probe_formats found it running) where
    hidden and the per-GPU intermediate size are whole multiples of its K granularity, else what ran before it (the
    grouped NVFP4 GEMV, whose CUDA-core form takes any K; fp8's `torch._scaled_grouped_mm`). Qwen3-30B-A3B at TP8
    has 96 intermediate rows a GPU."""
    step = FUSED_K_MULTIPLE.get(kind)
    return kind if step is None or (hidden % step == 0 and inter % step == 0) else FUSED_FALLBACK[kind]


def _probe_grouped(device: str, linear: str) -> str:
    """MoE expert kernel: grouped GEMM (reads only the experts hit) where it runs, else gather + bmm; NVFP4 and fp8
    experts run the grouped GEMV at batch 1, fp8 above it the fused MoE, NVFP4 the fused MoE at every batch, where
    probe_formats found them running."""
    torch = _torch()
    if linear in GROUPED_GEMV_KINDS:  # our grouped GEMVs (probe_formats found them running)
        return "grouped_gemv"
    if linear in ("fp8-block-moe", "fp8-moe", "nvfp4-moe"):  # probe_formats found it running
        return "fused_moe"
    if not device.startswith("cuda"):
        return "loop"
    try:
        E, K, N = 4, 64, 32
        offs = torch.tensor([1, 1, 2, 2], dtype=torch.int32, device=device)
        if linear == "fp8":
            x = torch.randn(2, K, device=device).to(torch.float8_e4m3fn)
            w = torch.randn(E, N, K, device=device).to(torch.float8_e4m3fn)
            torch._scaled_grouped_mm(x, w.transpose(-2, -1), torch.ones(2, device=device),
                                     torch.ones(E, N, device=device), offs=offs, out_dtype=torch.bfloat16)
            return "scaled_grouped_mm"
        x = torch.randn(2, K, device=device, dtype=torch.bfloat16)
        w = torch.randn(E, N, K, device=device, dtype=torch.bfloat16)
        torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        return "grouped_mm"
    except Exception:
        return "gather"
