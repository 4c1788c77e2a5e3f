"""The kernel level's small Triton kernels compile for a Hopper (sm_90) and a Blackwell (sm_100) target without a GPU.

The CPU interpreter runs a kernel's Python, not its compilation, so a kernel can pass every interpreter test and
still fail to compile on the GPU (a variable retyped inside a branch did, on the H200). Triton compiles for a named
target without a device (its bundled ptxas), which is what this checks; benchmarks/lowprec_device.py runs them."""

import inspect

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from decode_gap.kernels import attention, fp8block, norm, routing, topk  # noqa: E402

FLOAT_ARGS = {"scale", "eps"}
FP32_POINTERS = {"part", "lse", "wts", "logits", "bias", "out_w"}
INT_POINTERS = {"pos": "*i64", "out_ids": "*i32", "rows": "*i32"}

CASES = [
    (attention._rope_kernel, {"HALF": 32, "BLOCK": 32}, {"x", "cos", "sin", "out"}),
    (attention._mla_split_kernel, {"LORA": 512, "ROPE": 64, "BLOCK_H": 16, "BLOCK_T": 32, "HAS_ROWS": False,
                                   "F32_DOTS": False}, {"q", "kv", "part", "lse", "rows"}),
    (attention._mla_split_kernel, {"LORA": 512, "ROPE": 64, "BLOCK_H": 16, "BLOCK_T": 32, "HAS_ROWS": True,
                                   "F32_DOTS": False}, {"q", "kv", "part", "lse", "rows"}),
    (attention._combine_kernel, {"BLOCK_S": 16, "BLOCK_W": 128}, {"part", "lse", "out"}),
    (attention._gqa_split_kernel, {"D": 128, "BLOCK_H": 16, "BLOCK_T": 64, "F32_DOTS": False},
     {"q", "k", "v", "part", "lse"}),
    (attention._qkv_rope_append_kernel, {"HALF": 64, "NORM": True},
     {"qkv", "q_out", "kc", "vc", "pos", "cos", "sin", "qn", "kn"}),
    (attention._index_score_kernel, {"ID": 128, "BLOCK_H": 32, "BLOCK_T": 64, "F32_DOTS": False},
     {"q", "keys", "wts", "out"}),
    (norm._rms_kernel, {"ADD": True, "BLOCK": 8192}, {"x", "res", "w", "out", "sum_out"}),
    (routing._route_kernel, {"BLOCK_E": 256, "K": 8, "BLOCK_K": 8, "N_GROUP": 8, "TOPK_GROUP": 4, "SIGMOID": True,
                             "HAS_BIAS": True, "NORM": True}, {"logits", "bias", "out_w", "out_ids"}),
    (topk._topk_kernel, {"BITS": topk.BITS, "BLOCK_T": topk.MAX_ROW}, {"scores": "*fp32", "out": "*i32"}),
    (topk._topk_count_kernel, {"P": 2, "DIGIT": topk.DIGIT, "KEYBITS": 32, "CHUNK": topk.CHUNK, "PDL": True},
     {"scores": "*fp32", "hist": "*i32"}),
    (topk._topk_emit_kernel, {"PASSES": 32 // topk.DIGIT, "DIGIT": topk.DIGIT, "CHUNK": topk.CHUNK, "PDL": True},
     {"scores": "*fp32", "hist": "*i32", "out": "*i32"}),
    (fp8block._act_quant_kernel, {"GROUPS": 4}, {"x": "*bf16", "q": "*fp8e4nv", "s": "*fp32"}),
]


def _signature(fn, consts: dict, pointers: set | dict) -> dict:
    sig = {}
    for name in inspect.signature(fn.fn).parameters:
        if name in consts:
            sig[name] = "constexpr"
        elif isinstance(pointers, dict) and name in pointers:  # a kernel whose pointer types differ by name
            sig[name] = pointers[name]
        elif name in pointers:
            sig[name] = INT_POINTERS.get(name) or ("*fp32" if name in FP32_POINTERS else "*bf16")
        else:
            sig[name] = "fp32" if name in FLOAT_ARGS else "i32"
    return sig


@pytest.mark.parametrize("arch", [90, 100])
@pytest.mark.parametrize("fn,consts,pointers", CASES, ids=[c[0].fn.__name__ + ("-rows" if c[1].get("HAS_ROWS") else "") for c in CASES])
def test_kernel_compiles_for_the_gpu(fn, consts, pointers, arch):
    src = ASTSource(fn=fn, signature=_signature(fn, consts, pointers), constexprs=consts)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32))
    assert compiled.asm.get("cubin"), f"{fn.fn.__name__}: no cubin for sm_{arch}"
