"""Registers, spills, shared memory, SASS length, main-loop length and programs an SM of the NVFP4 tensor-core GEMV
forms (with --dense the bf16 / FP8 CUDA-core GEMV forms, with --moe the NVFP4 fused MoE's block kernel), compiled for a
GPU architecture without a GPU (Triton's own ptxas and cuobjdump, from its wheel: decode_gap.kernels.compiled).

What a kernel change does to the compiled code, checked on a CPU host before spending device time: a form that
spills or grows its SASS is unlikely to be faster; a change meant to leave a form alone must leave these figures
alone, and with --sass-dir its SASS too (one file a form, addresses stripped: diff two checkouts' folders; the
FP8 block-scales-on-x refactor left all seven dense forms' SASS identical). This is not a timing: the device
benchmark (lowprec_device.py) measures.

    python benchmarks/kernel_resources.py [--arch 90|100|120] [--dense | --moe] [--sass-dir DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
import triton  # noqa: E402

from decode_gap.kernels import fp4moe  # noqa: E402
from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels.compiled import compile_for  # noqa: E402

POINTERS = {"xp_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*i16", "ts_ptr": "*fp32", "out_ptr": "*fp32",
            "x_ptr": "*bf16", "fin_ptr": "*bf16", "cnt_ptr": "*i32"}


def forms() -> dict[str, dict]:
    """The constexprs of each form as Nvfp4Gemv launches it on the shapes it won (M=1, and M=9-16 with its second MMA
    set): K split (ATOMIC) but for the 4-step lm_head forms; a one-kernel form packs x itself and finishes its split,
    a bf16 form (bx) reads x as it is and finishes its split."""
    out = {}
    for cfg in (lp.FP4_MMA_CONFIGS + lp.FP4_MMA_CHAINED + lp.FP4_MMA_XJIT + lp.FP4_MMA_XSHARE + lp.FP4_MMA_XRING
                + lp.FP4_MMA_PAIR):
        unsplit = cfg.slices != 1  # a sliced form runs without a K split where it wins
        for block_m in (1, 16):
            out[f"{cfg.name} M={'1' if block_m == 1 else '9-16'}"] = dict(
                WARPS=cfg.warps, BLOCK_M=block_m, UNROLL=cfg.block_k // 64,
                ATOMIC=(cfg.warps_per_sm != 18 or cfg.stream) and not unsplit, USE_ASM=True,
                EV="evict_first" if cfg.evict else "", PDL=not (cfg.one_kernel or cfg.bx) or cfg.chain,
                SELF_PACK=cfg.one_kernel,
                FINISH=((cfg.one_kernel or cfg.bx) and cfg.warps_per_sm != 18 or cfg.stream) and not unsplit, BX=cfg.bx,
                STREAM=cfg.stream, SLICES=cfg.slices, DEPS=cfg.chain, XJIT=cfg.xjit, XS=cfg.xshare, PAIR=cfg.pair,
                **lp.xring_constexprs(cfg.xring, cfg.block_k // 64))
    return out


DENSE_POINTERS = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "ids_ptr": "*i32", "rw_ptr": "*fp32",
                  "out_ptr": "*fp32", "fin_ptr": "*bf16", "cnt_ptr": "*i32"}


def dense_forms() -> dict[str, dict]:
    """The constexprs of the dense / grouped CUDA-core GEMVs (_dense_gemv_kernel) at M=1, as DenseGemv and
    GroupedExperts launch them: per-tensor FP8 (the bf16 form is the same code without a scale), 128x128 block
    scales summed per column block or applied to x, a K split that finishes itself or not, ragged K."""
    base = dict(BLOCK_M=1, HAS_IDS=False, PAIRED=False, ROW_WEIGHT=False, USE_ASM=True, EVEN_N=True, WARPS=4,
                XSCALE=False)
    split = dict(ATOMIC=True, FINISH=True)
    whole = dict(ATOMIC=False, FINISH=False)
    return {
        "fp8 per-tensor BN=8,BK=2048 split": {**base, **split, "SCALE": 1, "BLOCK_N": 8, "BLOCK_K": 2048, "EVEN_K": True},
        "fp8 per-tensor BN=4,BK=2048": {**base, **whole, "SCALE": 1, "BLOCK_N": 4, "BLOCK_K": 2048, "EVEN_K": True},
        "bf16 BN=8,BK=1024 split ragged K": {**base, **split, "SCALE": 0, "BLOCK_N": 8, "BLOCK_K": 1024,
                                             "EVEN_K": False},
        "fp8 blocks BN=8,BK=1024 split": {**base, **split, "SCALE": 2, "BLOCK_N": 8, "BLOCK_K": 1024, "EVEN_K": True},
        "fp8 blocks on x BN=8,BK=2048 split": {**base, **split, "SCALE": 2, "BLOCK_N": 8, "BLOCK_K": 2048,
                                               "EVEN_K": True, "XSCALE": True},
        "fp8 blocks on x BN=8,BK=1024 ragged K": {**base, **whole, "SCALE": 2, "BLOCK_N": 8, "BLOCK_K": 1024,
                                                  "EVEN_K": False, "XSCALE": True},
        "grouped fp8 blocks on x, gate+up paired": {**base, **whole, "SCALE": 2, "BLOCK_N": 8, "BLOCK_K": 2048,
                                                    "EVEN_K": True, "XSCALE": True, "HAS_IDS": True,
                                                    "PAIRED": True},
    }


def moe_forms() -> dict[str, dict]:
    """The NVFP4 fused MoE's block kernel (fp4moe._fp4_moe_kernel) as Nvfp4FusedMoe launches it on an sm90+ GPU
    above one token (fp4moe.block_constexprs): gate_up unsplit (the activation from its registers) or split over K
    (fp32 sums), and down, at blocks of 8 and 16 pairs, one tile a warp and two (pair), and down's pair walking tile
    groups a program as it runs by default (fp4moe.DOWN_WALK at the block's pairs). fp4moe.RESIDENT_WARPS (and
    RESIDENT_WARPS_PAIR) is these programs an SM times 4 (the walk's own line says what it holds)."""
    out = {}
    for pair in (False, True):
        for bm in (8, 16):
            for name, gate_up, split, epi in (("gate_up unsplit", True, 1, True), ("gate_up split", True, 3, False),
                                              ("down", False, 1, fp4moe.CAST_EPILOGUE)):
                out[f"fp4moe {name} BM={bm}{' pair' if pair else ''}"] = fp4moe.block_constexprs(
                    gate_up, split, top_k=8, m=32, block_m=bm, epilogue=epi, pair=pair)
            if pair:
                walk = fp4moe.DOWN_WALK[bm]
                out[f"fp4moe down BM={bm} pair walk={walk}"] = fp4moe.block_constexprs(
                    False, 1, top_k=8, m=32, block_m=bm, epilogue=False, pair=True, walk=walk)
    return out


def compile_form(const: dict, arch: int, sass_to: Path | None = None) -> dict:
    const = dict(const)
    moe = "X_DIV" in const
    dense = "SCALE" in const
    fn = fp4moe._fp4_moe_kernel if moe else lp._dense_gemv_kernel if dense else lp._fp4_mma_kernel
    warps = const.pop("WARPS") if dense else const["WARPS"]
    if moe:
        pointers = fp4moe.POINTER_TYPES
    elif dense:
        pointers = {**DENSE_POINTERS, "w_ptr": "*bf16"} if const["SCALE"] == 0 else DENSE_POINTERS
    else:
        pointers = POINTERS
    kernel = compile_for(fn, const, pointers, arch, warps)
    if sass_to is not None:
        sass_to.write_text("\n".join(kernel.sass) + "\n")
    return {"registers": kernel.registers, "stack": kernel.stack, "shared": kernel.shared,
            "sass_instructions": len(kernel.sass), "loop": kernel.loop, "programs_per_sm": kernel.programs_per_sm}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90,
                    help="compute capability x 10 (90: Hopper, 100: B200, 120: RTX PRO 6000 Blackwell)")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--dense", action="store_true", help="the bf16 / FP8 CUDA-core GEMVs instead of the NVFP4 ones")
    group.add_argument("--moe", action="store_true", help="the NVFP4 fused MoE's block kernel instead")
    ap.add_argument("--sass-dir", type=Path, help="write each form's SASS here (addresses stripped), to diff")
    args = ap.parse_args()
    if args.sass_dir:
        args.sass_dir.mkdir(parents=True, exist_ok=True)
    print(f"triton {triton.__version__}, sm_{args.arch}")
    print(f"{'form':44s} {'regs':>5s} {'stack':>6s} {'shared':>7s} {'SASS':>6s} {'loop':>5s} {'programs/SM':>12s}")
    for name, const in (dense_forms() if args.dense else moe_forms() if args.moe else forms()).items():
        try:
            to = args.sass_dir / (re.sub(r"[^A-Za-z0-9=.-]+", "_", name) + ".sass") if args.sass_dir else None
            r = compile_form(const, args.arch, to)
            print(f"{name:44s} {r['registers']:5d} {r['stack']:6d} {r['shared']:7d} {r['sass_instructions']:6d} "
                  f"{r['loop']:5d} {r['programs_per_sm']:12d}")
        except Exception as exc:  # one form failing to compile is a finding, not the end of the listing
            print(f"{name:44s} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
