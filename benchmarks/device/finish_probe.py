"""Probe (H200): what the K split's finishing chain costs the NVFP4 tensor-core GEMV at M=1, on the narrow long-K
shapes that still need a split (is the gap to the floor bound in the finish, or in the loop?).

    PYTHONPATH=workflow python3 benchmarks/device/finish_probe.py

The same compiled loop and grid, launched three ways (the last two give wrong sums: they are timed, never used):
  finish  the default: fp32 sums added with atomics, a fence and a counter, the last split casting them;
  atomic  the atomics alone (no fence, no counter, no cast);
  store   every split storing its sums over the others' (no atomics at all).
Beside them, the split counts that the warps-an-SM rule would pick at other targets, and the unsplit form.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

import lowprec_device as ld  # noqa: E402
from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402
from decode_gap.microbench import memory  # noqa: E402
from decode_gap.microbench.common import BenchEnv  # noqa: E402

SHAPES = [(7168, 18432), (6144, 16384), (4096, 14336), (6144, 4096), (4096, 4096)]


def launcher(g: lp.Nvfp4Gemv, x: torch.Tensor, atomic: bool, finish: bool):
    """g's kernel on g's buffers with the split's epilogue chosen (bf16 forms only: x is its own B operand)."""
    xp = lp.bf16_pairs(x)
    target = g.acc if g.acc is not None else g.out
    out_dt = g.out

    def call():
        lp._fp4_mma_kernel[g.grid](
            xp, g.words, g.scales, g.q.tensor_scale, target, g.m, g.n, g.words.shape[0], g.per, g.words.shape[1],
            xp.stride(0), g.words.stride(0), g.scales.stride(0), target.stride(0), x, x.stride(0), out_dt,
            out_dt.stride(0), g.cnt if finish else target, WARPS=g.cfg.warps, BLOCK_M=g.block_m, UNROLL=g.steps,
            ATOMIC=atomic, USE_ASM=True, EV=lp._evict(g.cfg), PDL=False, SELF_PACK=False, FINISH=finish, BX=True,
            STREAM=False, SLICES=g.cfg.slices, DEPS=False, num_warps=g.cfg.warps)
    return call


def main() -> None:
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=40, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    print(f"read {read:.0f} GB/s")
    for n, k in SHAPES:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        x = torch.randn((1, k), device=dev, dtype=torch.bfloat16)
        nb = ld.nvfp4_call_bytes(n, k, 1)
        qs = ld.nvfp4_copies(q, dev)
        default = lp.fp4_config_for(1, k, dev, n)
        cfgs = [replace(default, warps_per_sm=w) for w in (14, 18, 20, 27, 36, 48)]
        for c in cfgs:
            gs = [lp.Nvfp4Gemv(qq, 1, dev, c) for qq in qs]
            for g in gs[:1]:
                g(x)
                g(x)
                err = nv.relative_error(g(x).float(), nv.reference_mm(x, q))
            for way, atomic, finish in (("finish", True, True), ("store", False, False)):
                if gs[0].split == 1 and way != "finish":
                    continue
                us = ld.gpu_us([launcher(g, x, atomic, finish) if way != "finish" else (lambda g=g: g(x))
                                for g in gs], env)
                print(f"{n:>6}x{k:<6} {way:6s} {us:7.2f} us {nb / us / 1e3 / read:5.3f}r  split={gs[0].split:<3}"
                      f" grid={gs[0].grid} err {err:.1e}  {c.name}", flush=True)
            gs = None
        for c in [replace(default, cluster=cl, warps_per_sm=w) for cl in (1, 2) for w in (14, 18, 20, 27, 36, 48)]:
            g = lp.Nvfp4Gemv(q, 1, dev, c)
            g(x)
            err = nv.relative_error(g(x).float(), nv.reference_mm(x, q))
            err2 = nv.relative_error(g(x).float(), nv.reference_mm(x, q))
            _, us, times = ld.best_of(env, ld.fp4_builders(qs, x, dev, [c]), nb)
            print(f"{n:>6}x{k:<6} cluster {us or float('nan'):7.2f} us {nb / (us or 1e9) / 1e3 / read:5.3f}r "
                  f"err {err:.1e}/{err2:.1e} {g.label} {ld.RESULTS['errors'] if us is None else ''}", flush=True)
        for c in (replace(default, split=1),):
            _, us, _ = ld.best_of(env, ld.fp4_builders(qs, x, dev, [c]), nb)
            print(f"{n:>6}x{k:<6} unsplit {us:7.2f} us {nb / us / 1e3 / read:5.3f}r  {c.name}", flush=True)
        qs = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
