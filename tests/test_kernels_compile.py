"""The kernel level's small Triton kernels compile for a Hopper (sm_90) and a Blackwell (sm_100) target without a GPU.

The CPU interpreter runs a kernel's Python, not its compilation, so a kernel can pass every interpreter test and
still fail to compile on the GPU (a variable retyped inside a branch did, on the H200). Triton compiles for a named
target without a device (its bundled ptxas), which is what this checks; benchmarks/lowprec_device.py runs them."""

import inspect

import re

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from decode_gap.kernels import attention, fp4moe, fp4wide, fp8block, fp8mma, fusedmoe, norm, routing, topk  # noqa: E402
from decode_gap.kernels.compiled import (ARCH_LIMITS, compile_for, loop_instructions, programs_per_sm,  # noqa: E402
                                         with_defaults)

FLOAT_ARGS = {"scale", "eps", "w_scale"}
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
    (attention._index_score_kernel, {"ID": 128, "BLOCK_H": 32, "BLOCK_T": 64, "F32_DOTS": False, "SCALED": False,
                                     "Q_SCALED": False}, {"q", "keys", "kscale", "qscale", "wts", "out"}),
    # FP8 keys (DeepSeek-V3.2's indexer cache) and their scales, bf16 queries
    (attention._index_score_kernel, {"ID": 128, "BLOCK_H": 32, "BLOCK_T": 64, "F32_DOTS": False, "SCALED": True,
                                     "Q_SCALED": False},
     {"q": "*bf16", "keys": "*fp8e4nv", "kscale": "*fp32", "qscale": "*fp32", "wts": "*fp32", "out": "*fp32"}),
    # FP8 queries too (the reference's form): an FP8 by FP8 dot
    (attention._index_score_kernel, {"ID": 128, "BLOCK_H": 32, "BLOCK_T": 64, "F32_DOTS": False, "SCALED": True,
                                     "Q_SCALED": True},
     {"q": "*fp8e4nv", "keys": "*fp8e4nv", "kscale": "*fp32", "qscale": "*fp32", "wts": "*fp32", "out": "*fp32"}),
    (attention._mla_prepare_kernel, {"LORA": 512, "HALF": 32},
     {"q_lat", "q_pe", "kv", "cache", "qq", "pos", "cos", "sin", "kvn"}),
    (attention._index_prepare_kernel, {"ID": 128, "HALF": 32, "FP8": False, "LOG_ID": 7, "ROUND": False},
     {"q", "k", "cache", "kscale", "q_out", "qscale", "pos", "cos", "sin", "kw", "kb"}),
    (attention._index_prepare_kernel, {"ID": 128, "HALF": 32, "FP8": True, "LOG_ID": 7, "ROUND": False},
     {"q": "*bf16", "k": "*bf16", "cache": "*fp8e4nv", "kscale": "*fp32", "q_out": "*fp8e4nv", "qscale": "*fp32",
      "pos": "*i64", "cos": "*bf16", "sin": "*bf16", "kw": "*bf16", "kb": "*bf16"}),
    (norm._rms_kernel, {"ADD": True, "BLOCK": 8192}, {"x", "res", "w", "out", "sum_out"}),
    (routing._route_kernel, {"BLOCK_E": 256, "K": 8, "BLOCK_K": 8, "N_GROUP": 8, "TOPK_GROUP": 4, "SIGMOID": True,
                             "HAS_BIAS": True, "NORM": True}, {"logits", "bias", "out_w", "out_ids"}),
    # the shared expert's column (SGLang's shared-experts fusion)
    (routing._route_kernel, {"BLOCK_E": 256, "K": 8, "BLOCK_K": 16, "N_GROUP": 1, "TOPK_GROUP": 1, "SIGMOID": True,
                             "HAS_BIAS": True, "NORM": True, "SHARED": True}, {"logits", "bias", "out_w", "out_ids"}),
    (topk._topk_kernel, {"BITS": topk.BITS, "BLOCK_T": topk.MAX_ROW}, {"scores": "*fp32", "out": "*i32"}),
    (topk._topk_kernel, {"BITS": topk.BITS, "BLOCK_T": topk.MAX_ROW, "TAIL": topk.MAX_TAIL},
     {"scores": "*fp32", "out": "*i32"}),
    (topk._topk_count_kernel, {"P": 2, "DIGIT": topk.DIGIT, "KEYBITS": 32, "CHUNK": topk.CHUNK, "PDL": True},
     {"scores": "*fp32", "hist": "*i32"}),
    (topk._topk_emit_kernel, {"PASSES": 32 // topk.DIGIT, "DIGIT": topk.DIGIT, "CHUNK": topk.CHUNK, "PDL": True},
     {"scores": "*fp32", "hist": "*i32", "out": "*i32"}),
    (fp8block._act_quant_kernel, {"GROUPS": 4, "ROUND": False}, {"x": "*bf16", "q": "*fp8e4nv", "s": "*fp32"}),
    (fusedmoe._align_kernel, {"P2": 64, "E2": 512, "NB2": 128, "BM": 16},
     {"ids": "*i32", "sorted_pairs": "*i32", "block_expert": "*i32"}),
    (fusedmoe._align_atomic_kernel, {"CH": 1024, "E2": 512, "NB2": 1024, "BM": 8, "DEPS": True},
     {"ids": "*i32", "sorted_pairs": "*i32", "block_expert": "*i32", "cursor": "*i32"}),
    (fusedmoe._moe_gemm_kernel, {"TOP_K": 8, "A_BY_TOKEN": True, "MUL_W": False, "BM": 16, "BN": 64,
                                 "DOT_F32": False, "STAGES": 3, "ATOMIC": False},
     {"a": "*fp8e4nv", "a_s": "*fp32", "w": "*fp8e4nv", "w_s": "*fp32", "c": "*bf16", "sorted_pairs": "*i32",
      "block_expert": "*i32", "route_w": "*fp32"}),
    (fusedmoe._moe_gemm_kernel, {"TOP_K": 8, "A_BY_TOKEN": True, "MUL_W": False, "BM": 16, "BN": 128,
                                 "DOT_F32": False, "STAGES": 3, "ATOMIC": True},
     {"a": "*fp8e4nv", "a_s": "*fp32", "w": "*fp8e4nv", "w_s": "*fp32", "c": "*fp32", "sorted_pairs": "*i32",
      "block_expert": "*i32", "route_w": "*fp32"}),
    (fusedmoe._silu_mul_quant_kernel, {"GROUPS": 4, "ZERO": False}, {"h": "*bf16", "q": "*fp8e4nv", "s": "*fp32"}),
    (fusedmoe._silu_mul_quant_kernel, {"GROUPS": 4, "ZERO": True}, {"h": "*fp32", "q": "*fp8e4nv", "s": "*fp32"}),
    # the NVFP4 fused MoE: gate_up stored at blocks of 8 pairs, down added with routing weights at blocks of 16
    (fp4moe._fp4_moe_kernel, {"X_DIV": 8, "O_DIV": 1, "WARPS": 4, "UNROLL": 2, "BM": 8, "ATOMIC": False,
                              "ROW_WEIGHT": False, "USE_ASM": True, "EV": "evict_first", "PDL": True, "EPI": 0,
                              "MB": 16}, fp4moe.POINTER_TYPES),
    (fp4moe._fp4_moe_kernel, {"X_DIV": 1, "O_DIV": 8, "WARPS": 4, "UNROLL": 2, "BM": 16, "ATOMIC": True,
                              "ROW_WEIGHT": True, "USE_ASM": True, "EV": "evict_first", "EPI": 0, "MB": 16},
     fp4moe.POINTER_TYPES),
    # down by pair (fp4moe.DOWN_BY_PAIR): each pair's weighted row stored in bf16, two tiles a warp
    (fp4moe._fp4_moe_kernel, fp4moe.block_constexprs(False, 1, top_k=8, m=64, pair=True, by_pair=True,
                                                      epilogue=False),
     {**fp4moe.POINTER_TYPES, "out_ptr": "*bf16"}),
    # the epilogues: gate_up's SiLU-and-mul from the registers (no split) and by the completing split (at 16 pairs a
    # block: two MMAs' columns), down's cast by the program completing a tile group
    (fp4moe._fp4_moe_kernel, {"X_DIV": 8, "O_DIV": 1, "WARPS": 4, "UNROLL": 2, "BM": 16, "ATOMIC": False,
                              "ROW_WEIGHT": False, "USE_ASM": True, "EV": "evict_first", "PDL": True, "EPI": 1,
                              "MB": 8}, fp4moe.POINTER_TYPES),
    (fp4moe._fp4_moe_kernel, {"X_DIV": 8, "O_DIV": 1, "WARPS": 4, "UNROLL": 2, "BM": 16, "ATOMIC": True,
                              "ROW_WEIGHT": False, "USE_ASM": True, "EV": "evict_first", "PDL": True, "EPI": 1,
                              "MB": 8}, fp4moe.POINTER_TYPES),
    (fp4moe._fp4_moe_kernel, {"X_DIV": 1, "O_DIV": 8, "WARPS": 4, "UNROLL": 2, "BM": 8, "ATOMIC": True,
                              "ROW_WEIGHT": True, "USE_ASM": True, "EV": "evict_first", "PDL": True, "EPI": 2,
                              "MB": 16}, fp4moe.POINTER_TYPES),
    # one token's gate_up (a tile's K range over 4 warps) and down (4 experts a warp each), summed in the program
    (fp4moe._fp4_moe_token_kernel, {"TILES": 1, "SLICES": 4, "KS": 4, "GATE_UP": True, "UNROLL": 2, "USE_ASM": True,
                                    "EV": "evict_first", "PDL": True}, fp4moe.POINTER_TYPES),
    (fp4moe._fp4_moe_token_kernel, {"TILES": 1, "SLICES": 4, "KS": 1, "GATE_UP": False, "UNROLL": 2,
                                    "USE_ASM": True, "EV": "evict_first", "PDL": True}, fp4moe.POINTER_TYPES),
    # the fp8 tensor-core GEMV (its inline asm: cvt.rn.f16x2.e4m3x2 and mma.sync): a K split's fp32 sums with block
    # scales, one warp a tile (M <= 8), and the bf16 store with the per-tensor scale, two warps a tile (M = 9-16)
    (fp8mma._fp8_mma_kernel, {"WARPS": 4, "XWARP": False, "BLOCK_SCALES": True, "ATOMIC": True, "DEPS": True,
                              "USE_ASM": True, "XAHEAD": True, "XCLAMP": False, "GROUPED": False, "ROW_WEIGHT": False},
     {"w_ptr": "*i32", "s_ptr": "*fp32", "x_ptr": "*bf16", "xw_ptr": "*i32", "out_ptr": "*fp32"}),
    (fp8mma._fp8_mma_kernel, {"WARPS": 4, "XWARP": True, "BLOCK_SCALES": False, "ATOMIC": False, "DEPS": False,
                              "USE_ASM": True, "XAHEAD": True, "XCLAMP": True, "GROUPED": False, "ROW_WEIGHT": False},
     {"w_ptr": "*i32", "s_ptr": "*fp32", "x_ptr": "*bf16", "xw_ptr": "*i32", "out_ptr": "*bf16"}),
    # grouped (GroupedFp8Mma's down): an expert a slot through ids, the slot's routing weight on its sums
    (fp8mma._fp8_mma_kernel, {"WARPS": 4, "XWARP": False, "BLOCK_SCALES": True, "ATOMIC": True, "DEPS": True,
                              "USE_ASM": True, "XAHEAD": True, "XCLAMP": True, "GROUPED": True, "ROW_WEIGHT": True},
     {"w_ptr": "*i32", "s_ptr": "*fp32", "x_ptr": "*bf16", "xw_ptr": "*i32", "out_ptr": "*fp32", "ids_ptr": "*i32",
      "rw_ptr": "*fp32"}),
    # NVFP4 above 16 rows: 32 rows of x a program against each decoded tile, a K split's fp32 sums (4 steps an
    # iteration) and the bf16 store (2)
    (fp4wide._fp4_wide_kernel, {"WARPS": 4, "UNROLL": 4, "ATOMIC": True, "USE_ASM": True, "EV": "", "DEPS": True},
     {"x_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*i16", "ts_ptr": "*fp32", "out_ptr": "*fp32"}),
    (fp4wide._fp4_wide_kernel, {"WARPS": 4, "UNROLL": 2, "ATOMIC": False, "USE_ASM": True, "EV": "evict_first",
                                "DEPS": False},
     {"x_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*i16", "ts_ptr": "*fp32", "out_ptr": "*bf16"}),
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


@pytest.mark.parametrize("arch", [90, 100, 120])
@pytest.mark.parametrize("fn,consts,pointers", CASES, ids=[c[0].fn.__name__ + ("-rows" if c[1].get("HAS_ROWS") else "")
                                                             + ("-split" if c[1].get("ATOMIC") or c[1].get("ZERO")
                                                                else "") for c in CASES])
def test_kernel_compiles_for_the_gpu(fn, consts, pointers, arch):
    consts = with_defaults(fn, consts)  # as a launch passes them
    src = ASTSource(fn=fn, signature=_signature(fn, consts, pointers), constexprs=consts)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32))
    assert compiled.asm.get("cubin"), f"{fn.fn.__name__}: no cubin for sm_{arch}"


@pytest.mark.parametrize("block_m,dot", [(16, "tt.dot"), (64, "warp_group_dot")])
def test_fused_moe_gemm_pipelines_its_loads_on_hopper(block_m, dot):
    """The block-scaled fused MoE's K loop (tl.range, 3 stages) loads through cp.async into a ring of shared buffers,
    with the 16-byte alignment Triton's launcher proves for pointers and strides at run time: the weight streams
    instead of each load waiting on the one before (which a plain `range` compiled to here). BLOCK_M 64 lowers to
    wgmma."""
    fn, consts, pointers = next(c for c in CASES if c[0] is fusedmoe._moe_gemm_kernel)
    consts = {**consts, "BM": block_m, "STAGES": 3}
    # aligned: the pointers and the strides; the sizes as they come
    ttgir = compile_for(fn, consts, pointers, 90, 4, unaligned=("P", "N", "K", "groups_per_split")).ttgir
    assert "async_copy_global_to_local" in ttgir and f"{dot} " in ttgir


def test_the_split_sums_are_zeroed_after_every_thread_loaded_them():
    """lowprec._zero_loaded: the cast of the split-K sums (lowprec, fp8mma, fp4moe, fp4wide) stores its zeros after a
    barrier, past every thread's load of the sums (without it an H200 returned zeros: lowprec._zero_loaded's
    docstring). The PTX, compiled for sm_90, has the barrier between the sums' loads and the zero stores."""
    from decode_gap.kernels import lowprec

    ptx = compile_for(lowprec._cast_zero_kernel, {"BLOCK": 1024, "PDL": True}, {"acc_ptr": "*fp32", "out_ptr": "*bf16"},
                      90, 4, unaligned=("N",)).ptx
    body = ptx[ptx.index("ld.global"):]
    assert "bar.sync" in body and body.index("bar.sync") < body.index("st.global.b32")


def test_the_align_sorts_its_largest_batch_in_registers_without_spilling():
    """fusedmoe's align holds every pair's key in one program's registers: at MAX_PAIRS (8192: 1024 tokens at top-8)
    over 256 experts, in align_warps' 16 warps, sm_90's compiled kernel uses no stack (a spill would be local memory
    traffic in a kernel on every MoE call's critical path; the first align's [pairs, experts] tiles spilled)."""
    p2 = fusedmoe.MAX_PAIRS
    consts = {"P2": p2, "E2": 512, "NB2": fusedmoe._pow2(fusedmoe.max_blocks(p2, 256, 8)), "BM": 8, "DEPS": True}
    pointers = {"ids": "*i32", "sorted_pairs": "*i32", "block_expert": "*i32"}
    kernel = compile_for(fusedmoe._align_kernel, consts, pointers, 90, fusedmoe.align_warps(p2), unaligned=("P",))
    assert kernel.stack == 0, kernel.registers
    consts = {"CH": fusedmoe.ALIGN_CHUNK, "E2": 512, "NB2": consts["NB2"], "BM": 8, "DEPS": True}
    atomic = compile_for(fusedmoe._align_atomic_kernel, consts, {**pointers, "cursor": "*i32"}, 90,
                         fusedmoe.ALIGN_ATOMIC_WARPS, unaligned=("P",))
    assert atomic.stack == 0 and "atom.global" in atomic.ptx, atomic.registers


@pytest.mark.parametrize("arch,gemms", [(90, "all"), (100, "gate_up split"), (120, "gate_up split")])
@pytest.mark.parametrize("block_m", [8, 16])
@pytest.mark.parametrize("pair", [False, True])
def test_the_fused_moe_block_kernel_holds_the_warps_its_split_plan_counts(arch, gemms, block_m, pair):
    """fp4moe splits gate_up for whole waves where its warps overflow what the SMs hold at once, counted by
    RESIDENT_WARPS (RESIDENT_WARPS_PAIR for two tiles a warp) at 8 and 16 pairs a block. The block kernel, compiled as
    a call launches it above one token (fp4moe.block_constexprs) for Hopper, B200 and RTX PRO 6000 Blackwell, holds
    exactly that many warps an SM, with no stack: more registers would make the plan's waves too long, fewer would
    leave SMs idle."""
    forms = {"gate_up unsplit": (True, 1, True), "gate_up split": (True, 3, False),
             "down": (False, 1, fp4moe.CAST_EPILOGUE)}
    resident = (fp4moe.RESIDENT_WARPS_PAIR if pair else fp4moe.RESIDENT_WARPS)[block_m]
    for name, (gate_up, split, epilogue) in forms.items():
        if gemms not in ("all", name):
            continue
        consts = fp4moe.block_constexprs(gate_up, split, top_k=8, m=32, block_m=block_m, epilogue=epilogue,
                                         pair=pair)
        kernel = compile_for(fp4moe._fp4_moe_kernel, consts, fp4moe.POINTER_TYPES, arch, consts["WARPS"],
                             unaligned=("P", "M_TOK", "steps_per_split"))
        assert kernel.stack == 0, (name, kernel.registers)
        assert kernel.programs_per_sm * consts["WARPS"] == resident, (name, kernel.registers)


def test_the_main_loop_is_measured_from_the_backward_branch():
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0020*/                   HMMA.16816.F32.BF16 R8, R12, R14, R8 ;
        /*0030*/                   IADD3 R4, R4, 0x200, RZ ;
        /*0040*/              @P0 BRA 0x10 ;
        /*0050*/                   STG.E desc[UR4][R6.64], R8 ;
        /*0060*/                   BRA 0x60;
        /*0070*/                   EXIT ;
"""
    assert loop_instructions(sass) == 4  # 0x10..0x40; the self-branch at the end is one instruction
    assert loop_instructions("        /*0000*/                   EXIT ;") == 0


def test_a_block_kernel_with_two_tiles_a_warp_issues_fewer_instructions_a_tile():
    """The pair form decodes two tiles against one set of x loads: its main loop holds twice the MMAs in fewer than
    twice the instructions (sm_90: 317 against 171 at 8 pairs a block, down)."""
    loops = {}
    for pair in (False, True):
        consts = fp4moe.block_constexprs(False, 1, top_k=8, m=32, block_m=8, pair=pair)
        kernel = compile_for(fp4moe._fp4_moe_kernel, consts, fp4moe.POINTER_TYPES, 90, consts["WARPS"],
                             unaligned=("P", "M_TOK", "steps_per_split"))
        loops[pair] = kernel.loop
    assert 0 < loops[False] < loops[True] < 2 * loops[False], loops


def test_a_walking_down_keeps_its_registers_at_sixteen_pairs_a_block_and_adds_little_to_an_iteration():
    """down's pair walking tile groups (fp4moe WALK), the form for 320 tokens (blocks of 16 pairs), compiled for sm_90:
    no stack, the same 128 registers (4 programs an SM) as a group a program, and its loop's loads-and-MMAs path
    (the group's store, taken once a group, aside) at most a tenth longer than the one-group loop (sm_90: 364 against
    350 instructions; its counters and the next group's pointers)."""
    kernels = {}
    for walk in (1, 2):
        consts = fp4moe.block_constexprs(False, 1, top_k=8, m=320, block_m=16, epilogue=False, pair=True, walk=walk)
        kernels[walk] = compile_for(fp4moe._fp4_moe_kernel, consts, fp4moe.POINTER_TYPES, 90, consts["WARPS"],
                                    unaligned=("P", "M_TOK", "steps_per_split"))
    assert kernels[2].stack == 0 and kernels[2].registers == kernels[1].registers == 128, kernels[2].registers
    sass = "\n".join(f"/*{i * 16:04x}*/ {ins} ;" for i, ins in enumerate(kernels[2].sass))
    hmma = [i for i, ins in enumerate(kernels[2].sass) if ins.startswith("HMMA")]
    # the loop's first instruction: the backward branch's target; its MMA path ends at the branch past the store
    start = max(int(m.group(1), 16) // 16 for m in re.finditer(r"BRA\s+0x([0-9a-f]+)", sass)
                if int(m.group(1), 16) // 16 <= hmma[0])
    skip = next(i for i, ins in enumerate(kernels[2].sass) if i > hmma[-1] and "BRA" in ins)
    assert skip - start <= 1.1 * kernels[1].loop, (skip - start, kernels[1].loop)


def test_programs_an_sm_holds_follow_the_occupancy_rules():
    # registers allocated 256 a warp: 56 a thread -> 1792 a warp, 7168 a program of 4 warps, 9 of 65536
    assert programs_per_sm(56, 4) == 9
    assert programs_per_sm(57, 4) == 8  # 64 a thread after rounding
    assert programs_per_sm(32, 4, limits=ARCH_LIMITS[120]) == 12  # sm_120: 48 warps an SM, not the registers' 16
    assert programs_per_sm(32, 4) == 16
    assert programs_per_sm(32, 1) == 32  # the program limit
    assert programs_per_sm(32, 4, shared=64 * 1024) == 3  # 228 KiB of shared memory
    assert programs_per_sm(255, 32) == 1  # never fewer than one


def _jit_functions():
    import importlib
    import pkgutil

    import decode_gap.kernels as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"decode_gap.kernels.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, triton.runtime.jit.JITFunction) and obj.__module__ == module.__name__:
                yield name, obj


def test_no_jit_helper_called_from_a_kernel_has_a_string_default():
    """Triton 3.6 (the device's, with torch 2.11) passes a called @triton.jit function's unpassed defaults as
    values, and a string one fails the compile ("'str' object has no attribute 'type'"); Triton 3.9 here accepts
    it. The x ring's "" defaults on _fp4_mma_loop took the NVFP4 fused MoE and grouped GEMV off an H100 that way,
    so the step ran bf16 experts (2026-12-06). A kernel launched from Python may keep string defaults."""
    jits = dict(_jit_functions())
    sources = {name: inspect.getsource(fn.fn) for name, fn in jits.items()}
    offenders = []
    for name, fn in jits.items():
        strings = [p.name for p in inspect.signature(fn.fn).parameters.values() if isinstance(p.default, str)]
        callers = [c for c, src in sources.items() if c != name and re.search(rf"\b{name}\(", src)]
        if strings and callers:
            offenders.append(f"{name} ({', '.join(strings)}) called from {', '.join(callers)}")
    assert not offenders, offenders
