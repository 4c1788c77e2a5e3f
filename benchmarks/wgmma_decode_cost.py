"""What a wgmma form of the NVFP4 weight-only GEMM above 16 rows would issue, compiled without a GPU (issue 14).

fp4wide's GEMM (M > 16) decodes each weight in registers straight into mma.sync operands and reads about half a plain
read's speed; its docstring says reaching the read would take wgmma. This compiles the simplest wgmma form for sm_90:
Triton's tl.dot with the weight as the A operand ("swap AB": y^T = W x^T, so the 64-row wgmma tile is weight rows and
the 17-64 rows of x are its N), the weight decoded in plain Triton (E2M1 bits placed into fp16, times the E4M3 block
scale, to bf16), x^T from shared memory, the packed weight pipelined through shared memory (cp.async) by Triton. It
prints whether Triton lowered the dot to wgmma, the registers, and the instructions of each kernel's main loop per
weight byte a thread loads (decode_gap.kernels.compiled.loop_instructions), beside fp4wide's default form.

Read on 2026-12-05 (triton 3.9.0, sm_90): the tl.dot form lowers to wgmma with cp.async loads (205 registers at 128
weight rows x 32 rows of x x 128 values), but its loop issues 1190 instructions for 64 weight bytes a thread (18.6 a
byte: an F2F a value for fp16 -> bf16, the nibbles unpacked one to an int16) against fp4wide's 241 for 32 (7.5, with
its 32 MMAs). A kernel bound by issuing its decode would run about 2.5x slower, so this form is not worth device
time; a wgmma form needs the packed decode (lowprec's asm: 2 values an operation into bf16 pairs) feeding the
register A operand, which Triton's tl.dot does not take from inline asm. No GPU time is spent here.
Marlin's shift decode in fp16 (benchmarks/device/wgmma_probe.py) brought the tl.dot form to 10.4-10.9 instructions a
byte, still staged through shared memory; timed on an H100 (2026-12-05) it lost to fp4wide by 1.2-1.7x at 16-64 rows.

    python benchmarks/wgmma_decode_cost.py [--arch 90]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from decode_gap.kernels import fp4wide  # noqa: E402
from decode_gap.kernels.compiled import compile_for  # noqa: E402


@triton.jit
def _fp4_dot_kernel(x_ptr, wq_ptr, ws_ptr, ts_ptr, out_ptr, M, N, K, k_per_split, stride_xm, stride_wq, stride_ws,
                    stride_om, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    """out[M, N] += x W^T over K range pid 1 (fp32 atomics): W packed E2M1 [N, K/2] with E4M3 scales [N, K/16]."""
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    offs_m = tl.program_id(2) * BM + tl.arange(0, BM)
    k0s = tl.program_id(1) * k_per_split
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    wrow = wq_ptr + offs_n.to(tl.int64)[:, None] * stride_wq
    srow = ws_ptr + offs_n.to(tl.int64)[:, None] * stride_ws
    xcol = x_ptr + tl.minimum(offs_m, M - 1)[None, :] * stride_xm
    for k0 in tl.range(k0s, tl.minimum(k0s + k_per_split, K), BK, num_stages=STAGES):
        c = tl.load(wrow + (k0 // 2 + tl.arange(0, BK // 2))[None, :]).to(tl.int16)
        s = tl.load(srow + (k0 // 16 + tl.arange(0, BK // 16))[None, :]).to(tl.float16)
        lo = (((c & 7) << 9) | ((c & 8) << 12)).to(tl.float16, bitcast=True)  # 2^-14 x the E2M1 value
        hi = ((((c >> 4) & 7) << 9) | (((c >> 4) & 8) << 12)).to(tl.float16, bitcast=True)
        w = tl.reshape(tl.join(lo, hi), (BN, BK // 16, 16)) * s[:, :, None]
        acc = tl.dot(tl.reshape(w, (BN, BK)).to(tl.bfloat16), tl.load(xcol + (k0 + tl.arange(0, BK))[:, None]), acc)
    om = (offs_m[None, :] < M) & (offs_n[:, None] < N)
    tl.atomic_add(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], acc * (tl.load(ts_ptr) * 16384.0),
                  mask=om, sem="relaxed")


DOT_POINTERS = {"x_ptr": "*bf16", "wq_ptr": "*u8", "ws_ptr": "*fp8e4nv", "ts_ptr": "*fp32", "out_ptr": "*fp32"}
WIDE_POINTERS = {"x_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*i16", "ts_ptr": "*fp32", "out_ptr": "*fp32"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    arch = ap.parse_args().arch
    print(f"triton {triton.__version__}, sm_{arch}")
    print(f"{'form':<58} {'regs':>5} {'stack':>6} {'wgmma':>6} {'loop':>6} {'B/thread':>9} {'per byte':>9}")
    rows = []
    for bn, bm, bk in ((128, 32, 128), (64, 32, 256), (128, 64, 128)):
        k = compile_for(_fp4_dot_kernel, dict(BN=bn, BM=bm, BK=bk, STAGES=3), DOT_POINTERS, arch, 4)
        rows.append((f"tl.dot (wgmma) BN={bn} BM={bm} BK={bk}", k, bn * bk // 2 / 128,
                     "warp_group_dot" in k.ttgir))
    cfg = fp4wide.WIDE_DEFAULT
    unroll = cfg.block_k // 64
    k = compile_for(fp4wide._fp4_wide_kernel, dict(WARPS=cfg.warps, UNROLL=unroll, ATOMIC=True, USE_ASM=True,
                                                   EV="evict_first", DEPS=True), WIDE_POINTERS, arch, cfg.warps)
    rows.append((f"fp4wide {cfg.name} (mma.sync, 32 rows)", k, 16 * unroll, False))
    for name, k, nbytes, wgmma in rows:
        print(f"{name:<58} {k.registers:>5} {k.stack:>6} {'yes' if wgmma else 'no':>6} {k.loop:>6} {nbytes:>9.0f} "
              f"{k.loop / nbytes:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
