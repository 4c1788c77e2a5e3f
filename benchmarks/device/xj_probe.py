"""Probe (H200): at M = 16, the K split with x loaded in place (FP4_MMA_XJ) with its split capped so that its grid
fits one wave, against stream-K (FP4_MMA_BX_SK), on the shapes where the uncapped split overflows one wave.

    PYTHONPATH=workflow python3 benchmarks/device/xj_probe.py
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


def main() -> None:
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=30, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    print(f"read {read:.0f} GB/s")
    for n, k, splits in [(36864, 7168, (1, 2)), (24576, 6144, (1, 2, 3)), (6144, 16384, (4, 6, 8, 9, 10)),
                         (28672, 4096, (1, 2))]:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        x = torch.randn((16, k), device=dev, dtype=torch.bfloat16)
        nb = ld.nvfp4_call_bytes(n, k, 16)
        cfgs = [lp.FP4_MMA_BX_SK, lp.FP4_MMA_XJ] + [replace(lp.FP4_MMA_XJ, split=s) for s in splits]
        _, _, times = ld.best_of(env, ld.fp4_builders(ld.nvfp4_copies(q, dev), x, dev, cfgs), nb)
        for name, us in times.items():
            print(f"{n:>6}x{k:<6} M=16 {us if isinstance(us, str) else f'{us:7.2f} us'}  {name}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
