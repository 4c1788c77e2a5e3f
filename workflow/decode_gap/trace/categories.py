"""Kernel (or CPU op) name -> the category a decode step spends time in.

Names seen in torch.profiler traces of eager PyTorch, cuBLAS/cuBLASLt (nvjet, sm90_xmma, cutlass), FlashAttention
/ FlashInfer / Triton, NCCL and vLLM/SGLang custom all-reduce and MoE kernels. The first matching rule wins, so
the more specific ones come first. Categories map onto the kernel-level simulation's components
(`KERNEL_LEVEL`) so the report can set trace time beside simulated time.
"""

from __future__ import annotations

import re

import pandas as pd

MEMCPY = "memcpy/memset"
ALLREDUCE = "all-reduce / NCCL"
ATTENTION = "attention"
MOE_GEMM = "grouped/MoE GEMM"
MOE_ROUTING = "MoE routing/top-k/permute"
SAMPLING = "sampling"
ELEMENTWISE = "norm/activation/elementwise"
OTHER = "other"
GEMM_PREFIX = "GEMM "

_I = re.I
RULES: list[tuple[str, re.Pattern]] = [
    (MEMCPY, re.compile(r"^memcpy|^memset|^aten::(copy_|to|_to_copy|fill_|zero_)$|cudaMemcpy", _I)),
    (ALLREDUCE, re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter|cross_device_reduce|custom_?ar|"
                           r"one_?shot|two_?shot|c10d::|gloo|lamport|\bmscclpp", _I)),
    (SAMPLING, re.compile(r"sampl|argmax|multinomial|top_?k_?top_?p|top_?p_|min_?p|exponential_|"
                          r"penalt|logits_?process|gumbel|aten::(max|sort)$|cumsum", _I)),
    (MOE_ROUTING, re.compile(r"moe_align|topk_?softmax|topkgating|grouped_?topk|biased_?grouped|moe_?sum|"
                             r"permute|expert_?(map|index|count)|router|gating|moe_?route|count_and_sort|"
                             r"sort_?tokens|aten::topk|gatherTopK|bitonicSort|radixSort", _I)),
    (MOE_GEMM, re.compile(r"fused_moe|moe_?gemm|grouped_?(gemm|mm)|group_?gemm|cutlass_?moe|_grouped_mm|"
                          r"MoeFC|moe_?mlp|deepgemm.*(grouped|masked)|ptgemm_grouped|experts?_gemm", _I)),
    (ATTENTION, re.compile(r"flash|fmha|attention|attn|paged|mla_|_mla|batchdecode|batchprefill|"
                           r"decode_?(kernel|attention)|merge_state|sdpa|scaled_dot_product|"
                           r"reshape_and_cache|kv_?cache|xqa|cutlass.*fmha|lean_?attn", _I)),
    ("GEMM", re.compile(r"gemm|gemv|cublas|cutlass|nvjet|xmma|matmul|_mm_|^mm_|triton_.*mm|splitkreduce|"
                        r"scaled_mm|cudnn.*conv|^aten::(mm|addmm|bmm|matmul|linear|_scaled_mm|baddbmm|"
                        r"mkldnn_linear|_weight_int\w*mm)$|sm\d+_.*(gemm|mma)|ampere_|hopper_|wgmma|dot_?product_?kernel|"
                        r"gemvx|gemv2|marlin|machete|fp8_?gemm|fp4_?gemm|nvfp4|w8a8|w4a|awq|gptq", _I)),
    (ELEMENTWISE, re.compile(r"norm|rms|silu|gelu|swiglu|act_and_mul|relu|sigmoid|tanh|softmax|rotary|rope|"
                             r"elementwise|vectorized|unrolled|reduce_kernel|index|embedding|cat|copy|fill|"
                             r"where|mul|add|div|pow|rsqrt|mean|sum|exp|neg|clamp|scatter|gather|masked|triton_|"
                             r"^aten::", _I)),
]

_DTYPE_RES = [
    ("fp4", re.compile(r"fp4|e2m1|nvfp4|mxf4|f4f4|_4bit", _I)),
    ("fp8", re.compile(r"fp8|e4m3|e5m2|f8f8|float8|qmma|_f8_", _I)),
    ("bf16", re.compile(r"bf16|bfloat16|c10::bfloat16", _I)),
    ("fp16", re.compile(r"fp16|f16f16|_h(16)?gemm|\bhalf\b|c10::half|s16816gemm", _I)),
    ("fp32", re.compile(r"fp32|f32f32|sgemm|\bfloat\b|tf32", _I)),
    ("int8", re.compile(r"int8|i8i8|igemm|s8", _I)),
]

# trace category -> kernel-level simulation components (simulate/kernel.json `components[].name`)
KERNEL_LEVEL = {
    "GEMM": ["attention projections", "mlp", "shared expert", "lm_head"],
    MOE_GEMM: ["routed experts"],
    ATTENTION: ["attention"],
    ALLREDUCE: ["all-reduce"],
    MOE_ROUTING: ["router"],
    SAMPLING: ["sampling"],
    ELEMENTWISE: ["norms", "final norm", "embedding"],
}


def gemm_dtype(name: str, input_types: str = "") -> str:
    for dtype, rx in _DTYPE_RES:
        if rx.search(name) or (input_types and rx.search(input_types)):
            return dtype
    return "dtype?"


def classify(name: str, input_types: str = "") -> str:
    for cat, rx in RULES:
        if rx.search(name):
            return GEMM_PREFIX + gemm_dtype(name, input_types) if cat == "GEMM" else cat
    return OTHER


def classify_frame(names: pd.Series, types: pd.Series | None = None) -> pd.Series:
    """Categories for a column of names (each distinct name/type pair is classified once)."""
    if types is None:
        types = pd.Series("", index=names.index)
    key = names.astype(str) + "\x00" + types.fillna("").astype(str)
    uniq = key.unique()
    lut = {}
    for k in uniq:
        n, t = k.split("\x00", 1)
        lut[k] = classify(n, t)
    return key.map(lut)


def kernel_level_group(category: str) -> str:
    return "GEMM" if category.startswith(GEMM_PREFIX) else category


def is_gemm(category: str) -> bool:
    return category.startswith(GEMM_PREFIX) or category == MOE_GEMM


__all__ = ["classify", "classify_frame", "gemm_dtype", "KERNEL_LEVEL", "kernel_level_group", "is_gemm"]
