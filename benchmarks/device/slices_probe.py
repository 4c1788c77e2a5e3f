"""Probe (H200): the K-sliced NVFP4 GEMV forms with the K split forced off, against the defaults, at M=1 on the
narrow long-K shapes where a split is left (is it the split's finishing chain or the slicing that costs?).

    PYTHONPATH=workflow python3 benchmarks/device/slices_probe.py            # every form, CUDA-graph replay
    PYTHONPATH=workflow python3 benchmarks/device/slices_probe.py one N K I  # a few eager calls of CFGS[I], for ncu
    bash benchmarks/device/ncu_slices.sh                                     # ncu on four of them

What it found (2026-12-01, H200, read 4460 GB/s): the split stays. 7168x18432: 2 slices with a split of 4 22.8 us,
the best unsplit form (4 slices, 4 steps an iteration) 24.4, 8 slices 25.6, 16 slices 30.4; 4096x14336: 12.2
against 13.2 at best unsplit. Unsplit, these shapes have too few warps in flight (448 tiles), and more slices a
program did not make up for it. ncu (ncu_slices.sh; eager, cold L2): the schedulers issue 0.60-0.64 instructions a
cycle at 62-63% of peak DRAM throughput, so at full bandwidth the loop would need about one a cycle: the decode's
instruction count, not the memory pipeline, is what holds the steady state near 0.9 of read bandwidth.
Again on the small shapes (2026-12-01, read 4388 GB/s, after the one-fence finish), where the split's finish costs
about 1 us of a 6-7 us call (finish_probe.py): no unsplit form wins it back. 6144x4096: the split default (t=40)
7.14 us, the best unsplit (4 slices, 4 steps) 7.29, 8 slices 8.96, 1 step an iteration 9.9-11.5; 4096x4096: 5.98
against 6.23; 24576x1536: the unsplit 2 slices 7.98 (the default there already).
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
from decode_gap.microbench.common import BenchEnv  # noqa: E402
from decode_gap.microbench import memory  # noqa: E402

G = lp.GemvConfig
CFGS = [lp.FP4_MMA_DEFAULT, lp.FP4_MMA_KS2, lp.FP4_MMA_KS2_WIDE,
        G(32, 128, 4, mma=True, evict=True, bx=True, split=1, slices=2),
        G(32, 256, 4, mma=True, evict=True, bx=True, split=1, slices=2),
        G(16, 128, 4, mma=True, evict=True, bx=True, split=1, slices=4),
        G(16, 256, 4, mma=True, evict=True, bx=True, split=1, slices=4),
        G(32, 128, 8, mma=True, evict=True, bx=True, split=1, slices=4),
        G(16, 128, 8, mma=True, evict=True, bx=True, split=1, slices=8),
        G(16, 256, 8, mma=True, evict=True, bx=True, split=1, slices=8),
        G(16, 128, 16, mma=True, evict=True, bx=True, split=1, slices=16),
        G(16, 64, 8, mma=True, evict=True, bx=True, split=1, slices=8),
        G(32, 64, 8, mma=True, evict=True, bx=True, split=1, slices=4),
        G(16, 64, 4, mma=True, evict=True, bx=True, split=1, slices=4),
        G(64, 128, 4, mma=True, evict=True, bx=True, warps_per_sm=40)]


def main() -> None:
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=2, iters=30, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    print(f"read {read:.0f} GB/s")
    for n, k in [(6144, 4096), (4096, 4096), (4096, 14336), (7168, 18432), (24576, 1536)]:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        x = torch.randn((1, k), device=dev, dtype=torch.bfloat16)
        ref = nv.reference_mm(x, q)
        nb = ld.nvfp4_call_bytes(n, k, 1)
        qs = ld.nvfp4_copies(q, dev)
        for c in CFGS:
            if k % c.k_multiple:
                continue
            g = lp.Nvfp4Gemv(q, 1, dev, c, out_dtype=torch.float32)
            g(x)
            err = nv.relative_error(g(x), ref)
            _, us, _ = ld.best_of(env, ld.fp4_builders(qs, x, dev, [c]), nb)
            print(f"{n:>6}x{k:<6} {us:7.2f} us {nb / us / 1e3 / read:5.3f}r err {err:.1e}  {g.label}", flush=True)


def one(n: int, k: int, index: int, calls: int = 3) -> None:
    """A few eager calls of CFGS[index] at N x K (for ncu: `ncu -k regex:fp4_mma -s 2 -c 1 python3 ... one N K I`)."""
    dev = torch.device("cuda")
    q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
    x = torch.randn((1, k), device=dev, dtype=torch.bfloat16)
    g = lp.Nvfp4Gemv(q, 1, dev, CFGS[index], out_dtype=torch.float32)
    print(g.label)
    for _ in range(calls):
        g(x)
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1:2] == ["one"]:
        one(*(int(v) for v in sys.argv[2:5]))
    else:
        main()
