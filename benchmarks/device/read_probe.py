"""Probe (H200): how long a plain read of exactly an NVFP4 GEMV's bytes takes, beside the GEMV itself, at M=1.

    PYTHONPATH=workflow python3 benchmarks/device/read_probe.py

Why: the issue's target is a fraction of the read bandwidth measured over 2 GiB (microbench.memory), and the report
bounds a call below that with a modelled latency floor (metrics.floor_bound_fraction). A 30-75 MB call may not reach
the 2 GiB figure even as a plain read: ramp-up and the last wave's tail are a larger share of it. This times reads of
the same bytes (rotating copies, CUDA-graph replay, as the GEMVs are timed): torch's sum (the read bandwidth's own
method) and the streaming Triton read the gemm stage now times (microbench.launch.plain_read: 16-byte loads,
xor-folded, one store a program) over a sweep of grids, and the NVFP4 GEMV forms the gemm stage times, so that each
GEMV's time reads against what its bytes alone cost.

What it found (2026-12-02, H200, read 4454 GB/s over 2 GiB), M=1, us and fraction of read bandwidth, the best plain
read / the fastest GEMV form, and the GEMV over the read:
  Llama-3.1-8B 6144x4096 (14.2 MB) 5.05, 0.63 / 7.28, 0.44: 1.44x; 4096x4096 3.98, 0.53 / 6.03, 0.35: 1.51x;
  28672x4096 16.82, 0.88 / 18.38, 0.81: 1.09x; 4096x14336 9.23, 0.80 / 11.77, 0.63: 1.27x; 128256x4096 67.29,
  0.99 / 74.16, 0.89: 1.10x. DeepSeek-V3 36864x7168 35.46, 0.94 / 38.43, 0.87: 1.08x; 7168x18432 18.76, 0.89 /
  22.46, 0.74: 1.20x; 129280x7168 116.49, 1.00 / 125.77, 0.93: 1.08x. GLM-5 24576x6144 21.33, 0.89 / 22.08, 0.86:
  1.04x; 6144x16384 14.62, 0.87 / 17.27, 0.74: 1.18x; 154880x6144 118.85, 1.01 / 129.64, 0.93: 1.09x.
So a plain read of a mid-sized call's bytes reaches 0.80-0.89 of the 2 GiB figure, and 0.53-0.63 on the 9-14 MB
shapes: the issue's 0.85 is out of reach for 4096x14336 even as a plain read. The wide shapes' GEMVs run within
4-10% of the read; the narrow long-K ones (a K split) 18-27% over it. torch's sum took 1.06-2.8x the Triton read
(9.7 against 4.0 us on 4096x4096), so it would understate a mid-sized read; the best of the twelve grids was 8 or 16
programs an SM (launch.PLAIN_READ_GRIDS), within 2% of each other.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

import lowprec_device as ld  # noqa: E402
from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402
from decode_gap.microbench import launch, memory  # noqa: E402
from decode_gap.microbench.common import BenchEnv  # noqa: E402
from decode_gap.microbench.timing import rotating_copies  # noqa: E402

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096), (36864, 7168), (7168, 18432),
          (129280, 7168), (24576, 6144), (6144, 16384), (154880, 6144)]


def main() -> None:
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=30, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    sms = lp.sm_count(dev)
    print(f"read {read:.0f} GB/s, {sms} SMs", flush=True)
    for n, k in SHAPES:
        nb = nv.nvfp4_bytes(n, k)
        bufs = [torch.randint(-2**31, 2**31 - 1, (nb // 4,), dtype=torch.int32, device=dev)
                for _ in range(rotating_copies(nb, dev))]
        times = {"torch sum": ld.gpu_us([(lambda b=b: b.view(torch.float32).sum()) for b in bufs], env)}
        for per_sm in (2, 4, 8, 16):
            for block in (1024, 2048, 4096):
                times[f"triton {per_sm}/SM BLOCK={block}"] = ld.gpu_us(
                    [launch.read_call(b, per_sm * sms, block) for b in bufs], env)
        bufs = None
        best_read = min(times, key=times.get)
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        qs = ld.nvfp4_copies(q, dev)
        x = torch.randn((1, k), device=dev, dtype=torch.bfloat16)
        cfgs = [c for c in lp.FP4_STAGE_CONFIGS if c.mma]
        _, _, gemv = ld.best_of(env, ld.fp4_builders(qs, x, dev, cfgs), ld.nvfp4_call_bytes(n, k, 1))
        qs = None
        torch.cuda.empty_cache()
        gemv = {name: us for name, us in gemv.items() if isinstance(us, float)}
        best_gemv = min(gemv, key=gemv.get)

        def r(us: float) -> str:
            return f"{us:7.2f} us {nb / us / 1e3 / read:.2f} r"

        print(f"{n:>6}x{k:<6} {nb / 1e6:6.1f} MB  torch sum {r(times['torch sum'])}  best read {r(times[best_read])}"
              f" ({best_read})  gemv {r(gemv[best_gemv])} ({best_gemv})  gemv/read "
              f"{gemv[best_gemv] / times[best_read]:.2f}", flush=True)
        for name, us in sorted(times.items(), key=lambda kv: kv[1])[:4]:
            print(f"    {name:<28} {r(us)}", flush=True)


if __name__ == "__main__":
    main()
