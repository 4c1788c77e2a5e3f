"""Probe (H100/H200): the NVFP4 tensor-core GEMV at M = 9-16 with x staged whole in shared memory, beside the plan.

    PYTHONPATH=workflow python3 benchmarks/device/stage_probe.py [--ms 16,12,9] [--shapes 28672x4096,...]
        [--rounds 3] [--geometries 8:16:4:4:64,...]

Why: ncu put M = 9-16's loss to M = 8 at the barrier of the forms that share x across a program (2.9 cycles of
barrier stall an issued instruction against 0.46 for the K-sliced form at M = 8; lowprec.FP4_MMA_XRING's comment),
and three forms that moved the wait elsewhere lost. This one takes the wait out of the loop. The K steps are cut into
ranges of R steps (R x 2304 bytes of x rows 0-15, at most 48 KB: a static shared array); each program owns one range
and copies that range of x into shared memory once (cp.async), then meets its warps at one barrier, and from there
runs stream-K over its share of the range's (16-row tile group, iteration) units with no barrier: the weights in a
register double buffer that runs across tile-group boundaries, x's fragments read from the stage, the sums added
(fp32 atomics) where a tile group's range ends, and cast by lowprec.cast_zero behind it as the plan's K split is.
x crosses L2 once a program, not once a program and split as in the ring's form.

Geometry WARPS:R:PPS: WARPS warps a program (tile groups of WARPS tiles), R steps a range, PPS programs an SM; the
grid is G ranges x floor(SMs x PPS / G) programs each (an SM short of a whole count idles). Each form is checked
against dequantise-then-matmul (x changing each call) before it is timed; the plan's own form is timed beside it in
the same rotated rounds (CUDA graph, L2 flushed by rotating copies larger than it). It reports; it asserts nothing.
Geometry WARPS:R:PPS:CHUNKS:MAXNREG adds the stage's copies in CHUNKS commit groups (1, 2 or 4), the one the program
starts in first, each waited for (a barrier) as the program's first pass over the range reaches it, and a register
cap (maxnreg) where the programs an SM would not fit.

What it found (H100 80GB HBM3, 2026-12-07, read 3107 GB/s, 3 rotated rounds, every form checked: 0 failed), us, the
plan against the best geometry: M = 16: 28672x4096 26.76 / 27.75 (8:16:4, 4 chunks, maxnreg 64), 7168x18432 27.38 /
28.69, 36864x7168 (stream-K) 61.73 / 62.12, 24576x6144 33.52 / 35.26, 6144x16384 22.00 / 22.69; M = 9: 25.75 / 24.96
(8:16:3, 1 chunk), 27.38 / 27.39, 58.82 / 58.13, 32.86 / 32.40, 22.02 / 21.92. An earlier run (read 3161 GB/s, the
stage waited for whole, rows past M copied as row M - 1) put it 2-7% behind on 13 of the 14 cases (28672x4096 M=16
26.03 / 27.43; ahead on 6144x4096 at M=16, 9.51 / 9.34). So the barrier out of the loop did not make up for what the
form pays instead: behind by 0.6-5.2% at M = 16, level to 3% ahead at M = 9, where its rows past M are zero-filled and
not read; copying the stage in chunks gained nothing (-2% to +6% against one chunk, the losses at M = 9). Not taken
into the plan; nor was the zero-fill in the ring's own copies, timed the same day (lowprec.FP4_MMA_XRING's comment).
With --l2 on an H200 (later that day, read 4466 GB/s, 2 rounds, 28672x4096 M=16), us, as it runs / with no DRAM
traffic: the plan 25.37 / 22.90, 8:16:4:4:64 26.61 / 24.93, 8:16:3:1:0 26.67 / 24.30: its loop costs more than the
plan's, so the H100's verdict holds where memory does not hide the loop.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

import ablate_probe  # noqa: E402
import lowprec_device as ld  # noqa: E402
from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402
from decode_gap.kernels.lowprec import (  # noqa: E402
    XR_ROW, XR_SLOT, _fp4_mma_steps, _fp4_mma_wloads, _fp4_mma_with_ring, _store_sums, _xr_wait_asm, _XR_RING_CONS,
    _XR_SLOT)
from decode_gap.kernels.nvfp4 import tl, triton  # noqa: E402

STAGE_MAX = 48 * 1024  # a static shared array's limit
_COPY_CONS = tl.constexpr("=r,=r,=r,=r,r,r,r,r,l,l,l,l,r,r,r,r")


def _stage_asm(steps: int) -> str:
    return (f"{{ .shared .align 16 .b8 xstage[{steps * _XR_SLOT}]; mov.u32 $0, xstage; mov.u32 $1, xstage; "
            "mov.u32 $2, xstage; mov.u32 $3, xstage; }")


def _copy_asm(copies: int, stride_steps: int) -> str:
    """A thread's 16 bytes of `copies` steps, stride_steps apart (shared $4, global $8; $12 bytes read, the rest
    zeros: 0 for x rows past M), one commit group."""
    lines = [f"cp.async.ca.shared.global [$4+{c * stride_steps * _XR_SLOT}], [$8+{c * stride_steps * 128}], 16, $12;"
             for c in range(copies)]
    return " ".join(["{"] + lines + ["cp.async.commit_group;", "mov.u32 $0, 0; mov.u32 $1, 0; mov.u32 $2, 0;",
                                     "mov.u32 $3, 0; }"])


@triton.jit
def _flush(out_ptr, acc0, acc1, acc2, acc3, ts, tg, w, g, qq, M, stride_om, WARPS: tl.constexpr):
    e = tl.arange(0, 4)[None, :]
    rows = ((tg * WARPS + w) * 16 + g)[:, None] + 8 * (e // 2)
    ms = (2 * qq)[:, None] + e % 2
    op = out_ptr + ms * stride_om + rows
    _store_sums(op, (acc0 + acc1) * ts, ms < M, True)
    _store_sums(op + 8 * stride_om, (acc2 + acc3) * ts, ms + 8 < M, True)


@triton.jit
def _stage_run(j0, j1, u1, w_now, acc0, acc1, acc2, acc3, wl, sl, rd, out_ptr, ts, w, g, qq, M, stride_wt, stride_st,
               stride_om, T: tl.constexpr, RI: tl.constexpr, WARPS: tl.constexpr, U: tl.constexpr,
               EV: tl.constexpr):
    """Units [j0, j1) of the program's range (which ends at u1), the weights of j0 in w_now: the next unit's
    weights loaded before this one's math, a tile group's sums added where its range ends."""
    for j in range(j0, j1):
        jn = tl.minimum(j + 1, u1 - 1)
        tgn = jn // RI
        itn = jn - tgn * RI
        wn = _fp4_mma_wloads(wl + tgn * WARPS * stride_wt + itn * U * 128,
                             sl + tgn * WARPS * stride_st + itn * U * 32, U, EV)
        tg = j // RI
        it = j - tg * RI
        a = _fp4_mma_with_ring(w_now, rd + it * (U * XR_SLOT), U)
        acc0, acc1, acc2, acc3 = _fp4_mma_steps(a, U, T, True, acc0, acc1, acc2, acc3, True)
        if (it == RI - 1) | (j == u1 - 1):
            _flush(out_ptr, acc0, acc1, acc2, acc3, ts, tg, w, g, qq, M, stride_om, WARPS)
            acc0 = tl.zeros((T, 4), dtype=tl.float32)
            acc1 = tl.zeros((T, 4), dtype=tl.float32)
            acc2 = tl.zeros((T, 4), dtype=tl.float32)
            acc3 = tl.zeros((T, 4), dtype=tl.float32)
        w_now = wn
    return w_now, acc0, acc1, acc2, acc3


@triton.jit
def _stage_kernel(xp_ptr, w_ptr, s_ptr, ts_ptr, out_ptr, M, NT, PG, stride_xm, stride_wt, stride_st, stride_om,
                  R: tl.constexpr, WARPS: tl.constexpr, U: tl.constexpr, EV: tl.constexpr, STAGE: tl.constexpr,
                  COPY: tl.constexpr, NCH: tl.constexpr, WAIT0: tl.constexpr, WAIT1: tl.constexpr,
                  WAIT2: tl.constexpr, WAIT3: tl.constexpr, DEPS: tl.constexpr):
    T: tl.constexpr = 32 * WARPS
    RI: tl.constexpr = R // U  # iterations a range
    CI: tl.constexpr = RI // NCH  # iterations a chunk of the stage (one commit group)
    pid = tl.program_id(0)
    kr = pid // PG  # the program's K range, and its place among the range's programs
    p = pid - kr * PG
    total = (NT // WARPS) * RI
    u0 = (p * total) // PG
    u1 = ((p + 1) * total) // PG
    i0 = kr * R
    ts = tl.load(ts_ptr) * 16384.0
    t, w, lane, g, qq = lp._lanes(0, T, 1)  # w: the lane's warp, its tile in a tile group
    c4 = tl.arange(0, 4)
    wl = w_ptr + (w.to(tl.int64) * stride_wt)[:, None] + (lane * 4 + i0 * 128)[:, None] + c4[None, :]
    sl = s_ptr + w.to(tl.int64) * stride_st + lane + i0 * 32
    # the stage: thread t copies 16 bytes of x row (t % 128) // 8 at word 4 (t % 8) of steps t // 128 + c WARPS / 4,
    # in NCH chunks (commit groups), the chunk the program starts in first and the rest in the order it reads them
    zero = tl.load(wl, mask=(t < 0)[:, None], other=0)
    base = tl.inline_asm_elementwise(STAGE, _XR_RING_CONS, [zero], dtype=tl.int32, is_pure=False, pack=4)
    tt = t % 128
    row = tt // 8
    sub = t // 128
    wr = base + (sub * XR_SLOT + row * XR_ROW + (tt % 8) * 16)[:, None]
    src = xp_ptr + (tl.minimum(row, M - 1) * stride_xm + (i0 + sub) * 32 + (tt % 8) * 4)[:, None] + zero
    size = tl.where(row < M, 16, 0)[:, None] + zero  # rows past M: zeros, nothing read
    tg = u0 // RI
    it0 = u0 - tg * RI
    c0 = it0 // CI
    for c in tl.static_range(NCH):
        ch = (c0 + c) % NCH
        tl.inline_asm_elementwise(COPY, _COPY_CONS, [wr + ch * (CI * U * XR_SLOT), src + ch * (CI * U * 32), size],
                                  dtype=tl.int32, is_pure=False, pack=4)
    rd = base + (g * XR_ROW + qq * 32)[:, None]
    w_now = _fp4_mma_wloads(wl + tg * WARPS * stride_wt + it0 * U * 128, sl + tg * WARPS * stride_st + it0 * U * 32,
                            U, EV)
    acc0 = tl.zeros((T, 4), dtype=tl.float32)
    acc1 = tl.zeros((T, 4), dtype=tl.float32)
    acc2 = tl.zeros((T, 4), dtype=tl.float32)
    acc3 = tl.zeros((T, 4), dtype=tl.float32)
    j0 = u0
    for c in tl.static_range(NCH):  # the first pass over the range: each chunk waited for as the program reaches it
        if c == 0:
            tl.inline_asm_elementwise(WAIT0, _XR_RING_CONS, [rd], dtype=tl.int32, is_pure=False, pack=4)
        elif c == 1:
            tl.inline_asm_elementwise(WAIT1, _XR_RING_CONS, [rd], dtype=tl.int32, is_pure=False, pack=4)
        elif c == 2:
            tl.inline_asm_elementwise(WAIT2, _XR_RING_CONS, [rd], dtype=tl.int32, is_pure=False, pack=4)
        else:
            tl.inline_asm_elementwise(WAIT3, _XR_RING_CONS, [rd], dtype=tl.int32, is_pure=False, pack=4)
        j1 = tl.minimum(u0 + (c0 + c + 1) * CI - it0, u1)
        w_now, acc0, acc1, acc2, acc3 = _stage_run(j0, j1, u1, w_now, acc0, acc1, acc2, acc3, wl, sl, rd, out_ptr,
                                                   ts, w, g, qq, M, stride_wt, stride_st, stride_om, T, RI, WARPS, U,
                                                   EV)
        j0 = tl.maximum(j0, j1)
    w_now, acc0, acc1, acc2, acc3 = _stage_run(j0, u1, u1, w_now, acc0, acc1, acc2, acc3, wl, sl, rd, out_ptr, ts,
                                               w, g, qq, M, stride_wt, stride_st, stride_om, T, RI, WARPS, U, EV)
    if DEPS:
        tl.extra.cuda.gdc_launch_dependents()


class StageGemv:
    """One call: _stage_kernel into fp32 sums, then lowprec.cast_zero (a programmatic dependent) into bf16."""

    def __init__(self, q: nv.NVFP4Tensor, m: int, dev, warps: int, r: int, pps: int, chunks: int = 1,
                 regs: int = 0, u: int = 2, l2: bool = False):
        n, k = q.shape
        self.words, self.scales = lp.repack_mma(q, bx=True)
        nt, nsteps = self.words.shape[0], self.words.shape[1]
        if (nt % warps or nsteps % r or r % u or r * _XR_SLOT > STAGE_MAX or chunks not in (1, 2, 4)
                or (r // u) % chunks or (r // chunks) % (warps // 4)):
            raise ValueError(f"geometry {warps}:{r}:{pps} does not fit {n}x{k}")
        self.q, self.m, self.r, self.warps, self.u = q, m, r, warps, u
        self.l2 = l2  # every tile group reads tile group 0's weights and scales (from L2): the loop's own time
        ranges = nsteps // r
        self.pg = max(1, lp.sm_count(dev) * pps // ranges)
        self.grid = (ranges * self.pg,)
        self.acc = torch.zeros((m, n), dtype=torch.float32, device=dev)
        self.out = torch.empty((m, n), dtype=torch.bfloat16, device=dev)
        self.pdl = lp.pdl_supported(dev)
        waits = {f"WAIT{c}": _xr_wait_asm(chunks - 1 - c) if c < chunks else "" for c in range(4)}
        self.consts = dict(STAGE=_stage_asm(r), COPY=_copy_asm(r // chunks // (warps // 4), warps // 4),
                           NCH=chunks, **waits, **({"maxnreg": regs} if regs else {}))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xp = lp.bf16_pairs(x)
        self.compiled = _stage_kernel[self.grid](
            xp, self.words, self.scales, self.q.tensor_scale, self.acc, self.m, self.words.shape[0], self.pg,
            xp.stride(0), 0 if self.l2 else self.words.stride(0), 0 if self.l2 else self.scales.stride(0),
            self.acc.stride(0), R=self.r,
            WARPS=self.warps, U=self.u, EV="evict_first", DEPS=self.pdl, num_warps=self.warps, **self.consts)
        lp.cast_zero(self.acc, self.out, self.pdl)
        return self.out


def check(q, m: int, k: int, dev, geometries) -> list:
    """The geometries whose calls match dequantise-then-matmul over three x (a missed range or flush would show)."""
    deq = nv.dequantize_nvfp4(q)
    x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
    ok = []
    for geo in geometries:
        try:
            s = StageGemv(q, m, dev, *geo)
        except ValueError as exc:
            print(f"  skip {exc}")
            continue
        errs = []
        for _ in range(3):
            x.normal_()
            errs.append(nv.relative_error(s(x), x.float() @ deq.t()))
        regs = getattr(s.compiled, "n_regs", None)
        good = max(errs) < 2e-2
        print(f"  check M={m} stage {geo}: grid {s.grid[0]} ({s.pg} a range), {regs} registers, rel err "
              f"{max(errs):.2e} {'ok' if good else 'FAILED'}", flush=True)
        if good:
            ok.append(geo)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="16,12,9")
    ap.add_argument("--shapes", default="28672x4096,7168x18432,36864x7168,24576x6144,6144x16384,4096x14336,"
                                        "6144x4096")
    ap.add_argument("--geometries", default="8:16:4:4:64,8:16:4:1:64,8:16:3:4:0,8:16:3:1:0,16:16:1:4:0,8:8:4:4:64",
                    help="WARPS:R:PPS[:CHUNKS[:MAXNREG]] each")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--l2", action="store_true",
                    help="also time the plan and each geometry with no DRAM traffic (ablate_probe's L2 way)")
    a = ap.parse_args()
    dev, env, read = ablate_probe.gpu_bench(30)
    print(f"{torch.cuda.get_device_name(dev)}: read {read:.0f} GB/s", flush=True)
    geos = [tuple(int(v) for v in s.split(":")) for s in a.geometries.split(",")]
    for n, k, q, qs in ablate_probe.weights(a.shapes.split(","), dev):
        nb = nv.nvfp4_bytes(n, k)
        for m in (int(v) for v in a.ms.split(",")):
            ok = check(q, m, k, dev, geos)
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            plan = lp.fp4_config_for(m, k, dev, n)
            builders = ld.fp4_builders(qs, x, dev, [plan])
            for geo in ok:
                for l2 in (False, True) if a.l2 else (False,):
                    builders[f"stage {geo}" + (" L2" if l2 else "")] = ablate_probe.copies_builder(
                        lambda qq, geo=geo, l2=l2: StageGemv(qq, m, dev, *geo, l2=l2), qs, x)
            if a.l2:
                builders[f"{plan.name} L2"] = ablate_probe.plan_l2(qs, m, dev, plan, x)
            times = ld.rotated_times(env, builders, a.rounds)
            ablate_probe.print_times(times, plan.name, n, k, m, nb, read)


if __name__ == "__main__":
    main()
