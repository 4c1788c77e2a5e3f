"""Probe (H100/H200): the NVFP4 GEMV at M = 9-16 on Hopper's wgmma, the decoded tile as its A operand from
registers and x as its B operand from the shared ring, beside the plan's mma.sync ring form.

    PYTHONPATH=workflow python3 benchmarks/device/wgmma_rs_probe.py [--ms 16,9] [--shapes 28672x4096,...]
        [--rounds 3] [--l2]

Why: with no DRAM traffic the plan's loop at M = 16 takes 1.13-1.36x M = 8's (lowprec.FP4_MMA_XRING's comment,
ablate_probe), which caps it at about 0.75 of a plain read on an H200. At M = 16 each warp reads x's B fragments out
of shared memory itself (four 16-byte loads a step: 2 KB a warp a step, four times the weight's bytes) and feeds each
decoded tile to two mma.sync. Here a program's 4 warps are one warpgroup: each step's four 16-value chunks are decoded
as the plan decodes them (lowprec._fp4_mma_asm's bf16 form, the same registers) and go to four
wgmma.mma_async.m64n16k16 with the 64 rows' A fragments from registers; the tensor cores read x's 16 x 16 B tile from
shared memory once for the warpgroup. No x fragment loads, four MMA instructions a step for eight. x must sit in the
ring in wgmma's core-matrix layout, in the K order the decode gives (a lane's 16 values of a row are one scale
block, so a chunk's K slots are x words 8q + 2 chunk + h, q = 0..3): 4-byte cp.async copies, four a thread a step,
for one of 16 bytes. The wait: cp.async.wait_group, a proxy fence (the copies are generic-proxy writes that wgmma
reads through the async proxy), the barrier; every step's wgmmas committed and waited for in its own asm block.

The K split, grid and the cast kernel behind it are the plan's (its Nvfp4Gemv's, shapes where the plan is the ring's K
split). Each form is checked against dequantise-then-matmul first (and the descriptor's two strides tried both ways
there: the one that checks is timed); then it and the plan are timed in rotated rounds (CUDA graph, L2 flushed by
rotating copies), with --l2 also both with every tile reading tile 0's weights (no DRAM traffic: the loop's time).
It reports; it asserts nothing.

What it found (H200, 2026-12-07, read 4463 GB/s, 3 rotated rounds), us: both forms checked on every case (1.66-1.67e-3,
the descriptor's LBO 128 bytes the first tried), then 1.7-2.1x slower than the plan, with DRAM traffic or without it:
28672x4096 M=16 42.84 / 25.41 (no DRAM traffic: 42.10 / 23.02), M=9 40.41 / 24.73; 7168x18432 M=16 56.93 / 26.85, M=9
50.28 / 26.69; 4096x14336 M=16 29.94 / 14.28, M=9 25.95 / 14.23; both steps under one wait (68 registers) within 1% of
one step a block. sm_90 SASS: 113 instructions a step for the plan's 100 (the four-byte copies, the descriptors in
uniform registers, the fence, arrive and wait). Left out.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

import ablate_probe  # noqa: E402
import lowprec_device as ld  # noqa: E402
from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402
from decode_gap.kernels.lowprec import _fp4_mma_wloads, _store_sums, _XR_RING_CONS  # noqa: E402
from decode_gap.kernels.nvfp4 import tl, triton  # noqa: E402

SLOT = 2048  # one step's x tile in the ring: 4 chunks x 2 (8-row groups) x 2 (K halves) core matrices of 128 bytes
CORE = 128
_COPY_CONS = tl.constexpr("=r,=r,=r,=r,r,r,r,r,l,l,l,l")
_MATH_CONS = tl.constexpr(",".join(["=f"] * 8 + ["r"] * 10 + [str(i) for i in range(8)]))


def ring_asm(sets: int, steps: int) -> str:
    return (f"{{ .shared .align 128 .b8 wgring[{sets * steps * SLOT}]; mov.u32 $0, wgring; mov.u32 $1, wgring; "
            "mov.u32 $2, wgring; mov.u32 $3, wgring; }")


def copy_asm(steps: int) -> str:
    """Thread t's four x words of `steps` steps (words 8q + c of its row, q = 0..3, at shared $4 + 4q; the global $8
    at word c), one commit group."""
    lines = [f"cp.async.ca.shared.global [$4+{u * SLOT + 4 * q}], [$8+{u * 128 + 32 * q}], 4;"
             for u in range(steps) for q in range(4)]
    return " ".join(["{"] + lines + ["cp.async.commit_group;", "mov.u32 $0, 0; mov.u32 $1, 0; mov.u32 $2, 0;",
                                     "mov.u32 $3, 0; }"])


def wait_asm(pending: int) -> str:
    return (f"{{ cp.async.wait_group {pending}; fence.proxy.async.shared::cta; bar.sync 0; mov.u32 $0, 0; "
            "mov.u32 $1, 0; mov.u32 $2, 0; mov.u32 $3, 0; }")


def _decode_lines(chunk0: int, words: int, scales: int) -> list[str]:
    """lowprec's bf16 decode of a step's four chunks (its asm for one x set, without the MMAs), each chunk's A
    fragment in registers of its own (a{chunk0 + c}0-3), the step's words at $words.. and scales at $scales.."""
    renumber = {8: words, 9: words + 1, 10: words + 2, 11: words + 3, 12: scales, 13: scales + 1}
    body, chunk, decode = [], chunk0, []
    for line in lp._fp4_mma_asm(1, bx=True).split("\n"):
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        if line.startswith("mma.sync"):
            decode += [re.sub(r"\ba([0-3])\b", rf"a{chunk}\1", x) for x in body]
            body, chunk = [], chunk + 1
        else:
            body.append(re.sub(r"\$(\d+)\b", lambda mt: f"${renumber.get(int(mt.group(1)), int(mt.group(1)))}", line))
    return decode


def math_asm(sbo: int, steps: int = 1) -> str:
    """`steps` steps (1 or 2): lowprec's bf16 decode of each step's four chunks (the same operand numbers for the
    first: $0-$7 the sums, $8-$11 the words, $12-$13 the scales; a second step's words and scales follow), then a
    fence and a wgmma a chunk on the B tile at descriptor $D (its low word: the address and the other stride; `sbo`
    the high word; a second step's tile one ring step on), committed and waited for once."""
    d = 14 if steps == 1 else 20
    decode = _decode_lines(0, 8, 12) + (_decode_lines(4, 14, 18) if steps == 2 else [])
    chunks = 4 * steps
    acc = "{" + ",".join(f"${i}" for i in range(8)) + "}"
    regs = ", ".join(f"a{c}{i}" for c in range(chunks) for i in range(4))
    lows = ", ".join(f"l{c}" for c in range(chunks))
    descs = ", ".join(f"d{c}" for c in range(chunks))
    lines = ["{", f".reg .b32 t, u, h, sc, sg, sh, nz, dh, {lows}, {regs};", ".reg .b16 l, z;",
             f".reg .b64 {descs};", ".reg .pred p;", *decode, f"mov.b32 dh, {sbo >> 4};"]
    for c in range(chunks):  # chunk c of the step at 512 bytes a chunk, the next step 2048 bytes on
        lines += [f"add.u32 l{c}, ${d}, {(c // 4 * SLOT + c % 4 * 512) >> 4};", f"mov.b64 d{c}, {{l{c}, dh}};"]
    lines += ["setp.ne.b32 p, 1, 0;", "wgmma.fence.sync.aligned;"]
    lines += [f"wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {acc}, {{a{c}0,a{c}1,a{c}2,a{c}3}}, d{c}, p, 1, "
              "1, 0;" for c in range(chunks)]
    lines += ["wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 0;", "}"]
    return "\n".join(lines)


_MATH2_CONS = tl.constexpr(",".join(["=f"] * 8 + ["r"] * 16 + [str(i) for i in range(8)]))


@triton.jit
def _math(w, dlo, acc0, acc2, MATH: tl.constexpr):
    s = tl.broadcast_to(w[1][:, None], (128, 4))
    return tl.inline_asm_elementwise(MATH, _MATH_CONS, [w[0], s, dlo, acc0, acc2], dtype=(tl.float32, tl.float32),
                                     is_pure=True, pack=4)


@triton.jit
def _math2(w0, w1, dlo, acc0, acc2, MATH: tl.constexpr):
    s0 = tl.broadcast_to(w0[1][:, None], (128, 4))
    s1 = tl.broadcast_to(w1[1][:, None], (128, 4))
    return tl.inline_asm_elementwise(MATH, _MATH2_CONS, [w0[0], s0, w1[0], s1, dlo, acc0, acc2],
                                     dtype=(tl.float32, tl.float32), is_pure=True, pack=4)


@triton.jit
def _wg_kernel(xp_ptr, w_ptr, s_ptr, ts_ptr, out_ptr, M, steps_per_split, NSTEPS, stride_xm, stride_wt, stride_st,
               stride_om, U: tl.constexpr, XR: tl.constexpr, EV: tl.constexpr, RING: tl.constexpr,
               COPY: tl.constexpr, WAIT: tl.constexpr, DRAIN: tl.constexpr, MATH: tl.constexpr, LBO: tl.constexpr,
               DEPS: tl.constexpr, TWO: tl.constexpr = False):
    T: tl.constexpr = 128
    SET: tl.constexpr = U * 2048
    tg = tl.program_id(0)
    i0 = tl.program_id(1) * steps_per_split
    i1 = tl.minimum(i0 + steps_per_split, NSTEPS)
    t, tile, lane, g, qq = lp._lanes(tg * 4, T, 1)
    tile = tile.to(tl.int64)
    c4 = tl.arange(0, 4)
    wb = w_ptr + (tile * stride_wt)[:, None] + (lane * 4)[:, None] + c4[None, :]
    sb = s_ptr + tile * stride_st + lane
    ts = tl.load(ts_ptr) * 16384.0
    zero = tl.load(wb + i0 * 128, mask=(t < 0)[:, None], other=0)
    ring = tl.inline_asm_elementwise(RING, _XR_RING_CONS, [zero], dtype=tl.int32, is_pure=False, pack=4)
    # thread t copies x row n = t // 8, chunk c = (t % 8) // 2, K half h = t % 2: words 8q + 2c + h, q = 0..3, into
    # row n % 8 of core matrix (c, n // 8, h)
    n = t // 8
    c = (t % 8) // 2
    h = t % 2
    wr = ring + ((c * 4 + (n // 8) * 2 + h) * 128 + (n % 8) * 16)[:, None]
    src = xp_ptr + (tl.minimum(n, M - 1) * stride_xm + 2 * c + h)[:, None] + zero
    dlo = ((ring >> 4) + (LBO >> 4) * 65536)  # the descriptor's low word at the ring's start
    w_now = _fp4_mma_wloads(wb + i0 * 128, sb + i0 * 32, U, EV)
    for d in tl.static_range(XR - 1):
        tl.inline_asm_elementwise(COPY, _COPY_CONS, [wr + d * SET, src + tl.minimum(i0 + d * U, i1 - U) * 32],
                                  dtype=tl.int32, is_pure=False, pack=4)
    acc0 = tl.zeros((T, 4), dtype=tl.float32)
    acc2 = tl.zeros((T, 4), dtype=tl.float32)
    cur = 0
    last = (XR - 1) * SET
    for i in range(i0, i1, U):
        j = tl.minimum(i + U, i1 - U)
        wn = _fp4_mma_wloads(wb + j * 128, sb + j * 32, U, EV)
        tl.inline_asm_elementwise(WAIT, _XR_RING_CONS, [zero], dtype=tl.int32, is_pure=False, pack=4)
        tl.inline_asm_elementwise(COPY, _COPY_CONS, [wr + last, src + tl.minimum(i + (XR - 1) * U, i1 - U) * 32],
                                  dtype=tl.int32, is_pure=False, pack=4)
        if TWO:  # both steps in one asm block: one fence and one wait for eight wgmma
            acc0, acc2 = _math2(w_now[0], w_now[1], dlo + (cur >> 4), acc0, acc2, MATH)
        else:
            acc0, acc2 = _math(w_now[0], dlo + (cur >> 4), acc0, acc2, MATH)
        if U >= 2 and not TWO:
            acc0, acc2 = _math(w_now[1], dlo + ((cur + 2048) >> 4), acc0, acc2, MATH)
        if U >= 4:
            acc0, acc2 = _math(w_now[2], dlo + ((cur + 4096) >> 4), acc0, acc2, MATH)
            acc0, acc2 = _math(w_now[3], dlo + ((cur + 6144) >> 4), acc0, acc2, MATH)
        w_now = wn
        last = cur
        cur = tl.where(cur == (XR - 1) * SET, 0, cur + SET)
    tl.inline_asm_elementwise(DRAIN, _XR_RING_CONS, [zero], dtype=tl.int32, is_pure=False, pack=4)
    e = tl.arange(0, 4)[None, :]
    rows = (tile * 16 + g)[:, None] + 8 * (e // 2)
    ms = (2 * qq)[:, None] + e % 2
    op = out_ptr + ms * stride_om + rows
    _store_sums(op, acc0 * ts, ms < M, True)
    _store_sums(op + 8 * stride_om, acc2 * ts, ms + 8 < M, True)
    if DEPS:
        tl.extra.cuda.gdc_launch_dependents()


class WgmmaGemv:
    """One call: _wg_kernel into the plan's fp32 sums over its K split, then lowprec.cast_zero into bf16."""

    def __init__(self, plan: lp.Nvfp4Gemv, lbo: int, l2: bool = False, sets: int = 2, two: bool = False):
        self.p, self.lbo, self.l2, self.sets = plan, lbo, l2, sets
        u = plan.steps
        two = two and u == 2
        self.consts = dict(U=u, XR=sets, EV="evict_first", RING=ring_asm(sets, u), COPY=copy_asm(u),
                           WAIT=wait_asm(sets - 2), DRAIN=lp._XR_DRAIN.value,
                           MATH=math_asm(256 if lbo == 128 else 128, 2 if two else 1), LBO=lbo, TWO=two)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        p = self.p
        xp = lp.bf16_pairs(x)
        self.compiled = _wg_kernel[(p.grid[0], p.grid[1])](
            xp, p.words, p.scales, p.q.tensor_scale, p.acc, p.m, p.per, p.words.shape[1], xp.stride(0),
            0 if self.l2 else p.words.stride(0), 0 if self.l2 else p.scales.stride(0), p.acc.stride(0),
            DEPS=p.cast_pdl, num_warps=4, **self.consts)
        lp.cast_zero(p.acc, p.out, p.cast_pdl)
        return p.out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="16,9")
    ap.add_argument("--shapes", default="28672x4096,7168x18432,4096x14336,24576x6144,6144x16384")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--l2", action="store_true", help="also time both with no DRAM traffic")
    a = ap.parse_args()
    dev, env, read = ablate_probe.gpu_bench(30)
    print(f"{torch.cuda.get_device_name(dev)}: read {read:.0f} GB/s", flush=True)
    for n, k, q, qs in ablate_probe.weights(a.shapes.split(","), dev):
        shape = f"{n}x{k}"
        nb = nv.nvfp4_bytes(n, k)
        deq = nv.dequantize_nvfp4(q)
        for m in (int(v) for v in a.ms.split(",")):
            plan = lp.fp4_config_for(m, k, dev, n)
            if not (plan.xring and not plan.stream and plan.warps == 4):
                print(f"{shape} M={m}: the plan is {plan.name}, not the ring's K split; skipped")
                continue
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            good = {}  # form name: (the descriptor's LBO that checked, both steps in one asm block)
            for name, two in (("wgmma", False), ("wgmma 2 steps a block", True)):
                for lbo in (128, 256):
                    try:
                        wg = WgmmaGemv(lp.Nvfp4Gemv(q, m, dev, plan), lbo, two=two)
                        err = max(nv.relative_error(wg(x.normal_()), x.float() @ deq.t()) for _ in range(3))
                    except Exception as exc:  # a probe: a compile or launch failure is its finding
                        print(f"{shape} M={m} {name} LBO {lbo}: failed: {str(exc).splitlines()[-1][:300]}",
                              flush=True)
                        continue
                    regs = getattr(wg.compiled, "n_regs", None)
                    ok = err < 2e-2
                    print(f"{shape} M={m} {name} LBO {lbo}: {regs} registers, rel err {err:.2e} "
                          f"{'ok' if ok else 'WRONG'}", flush=True)
                    if ok:
                        good[name] = (lbo, two)
                        break
            builders = ld.fp4_builders(qs, x, dev, [plan])
            if a.l2:
                builders[f"{plan.name} L2"] = ablate_probe.plan_l2(qs, m, dev, plan, x)
            for name, (lbo, two) in good.items():
                for l2 in (False, True) if a.l2 else (False,):
                    builders[name + (" L2" if l2 else "")] = ablate_probe.copies_builder(
                        lambda qq, lbo=lbo, two=two, l2=l2: WgmmaGemv(lp.Nvfp4Gemv(qq, m, dev, plan), lbo, l2, two=two),
                        qs, x)
            times = ld.rotated_times(env, builders, a.rounds)
            ablate_probe.print_times(times, plan.name, n, k, m, nb, read)


if __name__ == "__main__":
    main()
