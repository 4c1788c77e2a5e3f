"""Probe (issue 14): the NVFP4 tensor-core GEMV with its weights through a ring of cp.async stages in shared memory
(lowprec._cp_prologue / _cp_wloads, the loop's CPA constexpr), against its register double buffer.

Why: at M = 9-16 the default forms hold 70-125 registers, so 4-7 programs an SM (16-28 warps), each with two
iterations' weights in registers: about 2 KB a warp in flight. A copy into shared memory holds no register while
it is in flight, so a ring of D steps keeps D x 512 bytes a warp in flight with fewer registers (sm_90 SASS of the
x-in-place form at M = 9-16: 72 -> 62 registers, but 15 more instructions a step: the copy's address, slot and
wait, and three NOPs the compiler puts before each copy). Each thread reads back only what it copied, so no barrier.

For each shape and M, the default form (fp4_config_for), its x-in-place K-split form (xj, no stream-K: the ring
is in that loop only) and that form with rings of 3 and 7 steps, each checked against dequantise-then-matmul, then
timed (CUDA-graph replay over rotating weight copies) beside a plain read of the bytes.

    PYTHONPATH=workflow python3 benchmarks/device/cpasync_probe.py [M,...] [NxK,...]
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

SHAPES = [(28672, 4096), (6144, 4096), (4096, 14336), (7168, 18432), (128256, 4096)]


class RingGemv:
    """lowprec.Nvfp4Gemv launched with its weights through a ring of `depth` cp.async stages."""

    def __init__(self, gemv, depth: int):
        from decode_gap.kernels import lowprec as lp

        self.gemv, self.extra = gemv, lp.cp_constexprs(depth, gemv.cfg.warps)
        gemv.mma_args = self._args(gemv.mma_args)

    def _args(self, base):
        return lambda x: {**base(x), **self.extra}

    def __call__(self, x):
        return self.gemv(x)


def main() -> None:
    import torch

    import lowprec_device as ld
    from decode_gap.kernels import lowprec as lp
    from decode_gap.kernels import nvfp4 as nv
    from decode_gap.microbench import launch
    from decode_gap.microbench.common import BenchEnv

    ms = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [16, 1]
    shapes = ([tuple(int(v) for v in s.split("x")) for s in sys.argv[2].split(",")] if len(sys.argv) > 2
              else SHAPES)
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=40, cpu_budget_s=0.05)
    reads = launch.PlainReads(env)
    print(torch.cuda.get_device_name(dev), flush=True)
    for n, k in shapes:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        copies = ld.nvfp4_copies(q, dev)
        for m in ms:
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            ref = nv.reference_mm(x, q)
            base = lp.fp4_config_for(m, k, dev, n)
            xj = dataclasses.replace(base, xjit=True, stream=False, pair=False, xshare=False)
            forms = [(base.name, base, 0), (xj.name, xj, 0), (xj.name + ",cp3", xj, 3), (xj.name + ",cp7", xj, 7)]
            rd = reads.us(ld.nvfp4_call_bytes(n, k, m))
            for name, cfg, depth in forms:
                try:
                    gs = [lp.Nvfp4Gemv(c, m, dev, cfg) for c in copies]
                    calls = [RingGemv(g, depth) if depth else g for g in gs]
                    for c in calls:
                        c(x)
                    err = nv.relative_error(calls[0](x).float(), ref)
                    us = ld.gpu_us([(lambda c=c: c(x)) for c in calls], env)
                    regs = getattr(gs[0].compiled, "n_regs", "?")
                    print(f"M={m:<2} {n:>6}x{k:<6} {name:44s} {us:7.2f} us  read {rd:6.2f}  {us / rd:4.2f}x  "
                          f"err {err:.1e}  regs {regs}  {'ok' if err < 2e-2 else 'FAILED'}", flush=True)
                except Exception as e:  # a form that does not build here is reported, not fatal
                    print(f"M={m:<2} {n:>6}x{k:<6} {name:44s} error: {type(e).__name__}: {str(e)[:200]}", flush=True)
                gs = calls = None
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
