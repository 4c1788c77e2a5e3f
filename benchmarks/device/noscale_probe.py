"""Probe (H200): what the bf16 NVFP4 GEMV's per-value block-scale multiply costs at M=1: the default forms timed as
they are and with the 16 fma.rn.bf16x2 a step (and the scale conversion they feed, then dead) taken out of the asm
(wrong sums, timed only). An upper bound on what applying the scales after the MMA could win.

    PYTHONPATH=workflow python3 benchmarks/device/noscale_probe.py          # runs both variants, one process each

What it found (2026-12-02, H200; us a call, base / without the scale multiply, each over the plain read):
  128256x4096 82.5 (1.23x) / 72.8 (1.08x); 28672x4096 20.9 (1.23x) / 19.8 (1.17x); 24576x6144 23.0-23.7 / 22.8;
  7168x18432 23.0 (1.23x) / 21.1 (1.13x); 6144x16384 17.4 / 16.7; 4096x14336 11.8 / 11.4; 6144x4096 7.4 / 7.0.
  (This machine ran the base forms slower than ablate_probe's: 82.5 against 75.8 us on the lm_head.)
So the 16 multiplies a step and the scale conversion, 22 of the loop's 79 instructions a step (sm_90 SASS), cost
2-5% on the mid-sized shapes and 8-12% on the lm_head and 7168x18432. Applying the scales after the MMA instead
would need x masked by column (one block a column, M=1 only), fp32 scales and 4 FMAs a step (about 10 of the 22
back), and x packed to fp16 by a kernel, as the fp16 form does (an E2M1 x 2^-126 bf16 times x underflows fp32): at
most about half of this gain, less the packing, so it was not built.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

SHAPES = [(128256, 4096), (28672, 4096), (24576, 6144), (7168, 18432), (6144, 16384), (4096, 14336), (6144, 4096)]


def run(variant: str) -> None:
    import torch
    import triton.language as tl

    import lowprec_device as ld
    from decode_gap.kernels import lowprec as lp
    from decode_gap.kernels import nvfp4 as nv
    from decode_gap.microbench import launch
    from decode_gap.microbench.common import BenchEnv

    if variant == "noscale":  # before anything compiles: the kernel reads the constexpr at its first launch
        text = re.sub(r"fma\.rn\.bf16x2 (a\d), h, s[gh], nz;", r"mov.b32 \1, h;", lp._fp4_mma_asm(1, bx=True))
        lp._BX_MMA_ASM = tl.constexpr(text)
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=40, cpu_budget_s=0.05)
    reads = launch.PlainReads(env)
    for n, k in SHAPES:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        x = torch.randn((1, k), device=dev, dtype=torch.bfloat16)
        cfg = lp.fp4_config_for(1, k, dev, n)
        gs = [lp.Nvfp4Gemv(qq, 1, dev, cfg) for qq in ld.nvfp4_copies(q, dev)]
        for g in gs:
            g(x)
        err = nv.relative_error(gs[0](x).float(), nv.reference_mm(x, q))
        us = ld.gpu_us([(lambda g=g: g(x)) for g in gs], env)
        rd = reads.us(ld.nvfp4_call_bytes(n, k, 1))
        print(f"{variant:8s} {n:>6}x{k:<6} {cfg.name:38s} {us:7.2f} us  read {rd:6.2f}  {us / rd:4.2f}x  err {err:.1e}",
              flush=True)
        gs = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(sys.argv[1])
    else:
        for v in ("base", "noscale", "base"):
            with tempfile.TemporaryDirectory() as cache:
                subprocess.run([sys.executable, __file__, v], env={**os.environ, "TRITON_CACHE_DIR": cache}, check=False)
