"""Probe (H200): what the K split's finishing chain costs the NVFP4 tensor-core GEMV at M=1, on the narrow long-K
shapes that still need a split (is the gap to the floor bound in the finish, or in the loop?).

    PYTHONPATH=workflow python3 benchmarks/device/finish_probe.py [finish]   # finish: the default launch only

The same compiled loop and grid, launched three ways (the last two give wrong sums: they are timed, never used):
  finish  the default: fp32 sums added with atomics, a fence and a counter, the last split casting them;
  atomic  the atomics alone (no fence, no counter, no cast);
  store   every split storing its sums over the others' (no atomics at all).
Beside them, the split counts that the warps-an-SM rule would pick at other targets, and the unsplit form.

What it found (2026-12-01, H200, read 4467 GB/s; us a call, finish / atomic / store):
  7168x18432 split 3  23.3 / - / 22.1; split 8  23.5 / 20.4 / 20.4
  6144x16384 split 4  17.5 / 16.2 / 16.1
  4096x14336 split 5  12.3 / 10.9 / 10.8; split 6  12.3 / 10.7 / 10.7
  6144x4096  split 8   7.8 / - / 6.4;     4096x4096 split 11  6.4 / - / 5.0
The atomics cost nothing; the fence, the counter and the last split's read and cast cost 1.3-3.1 us a call,
more with more splits. With one fence a program (the barrier, then one thread's acq_rel add: _split_finish now)
instead of one a thread, the next machine (read 4384 GB/s, store times within 1%): 7168x18432 23.1 (split 3),
6144x16384 17.2, 4096x14336 11.9, 6144x4096 7.4 (split 8), 4096x4096 6.0 (split 11): 0.2-0.45 us a call less, and
300 calls a shape with x changing each call gave no wrong sum (a missed split would show as an error near
1/split). The unsplit form is far slower (32.2, 28.6, 22.5 us on the first three). With the cheaper finish, the
splits again (`finish` mode, 18-96 warps an SM, 1, 2 and 4 steps an iteration): the default rule's form is the
fastest or within 1% on four shapes; on 7168x18432 the 2-step bx form at 36 warps an SM (split 11) took 22.3 us
against the default's 23.2 (the benchmark's sweep, which keeps the fastest, already finds such forms).
Tried against it (commit bec27ac, reverted): the splits of a group as one thread-block cluster (sm90), their sums
added in rank 0's shared memory, with a cluster barrier (st.shared::cluster; sm90 compiles the barrier's release to
MEMBAR.ALL.GPU) or with st.async completing an mbarrier's bytes (no membar). Correct on the H200, but no faster:
7168x18432 in clusters of 3 22.3 us (0.95 faster than the finish), 6144x16384 clusters of 3 18.4 (0.8 slower than
the finish with a split of 4), clusters of 4 21.0-21.2 (the clusters no longer fit one wave), 4096x14336 12.9
against 12.3, 6144x4096 7.4 against 7.5, 4096x4096 6.3 against 6.4; the asynchronous stores 0-1 us better than the
barrier.
Tried against it too (commit 806babb, reverted; its probe benchmarks/device/radd_probe.py): the splits' sums added
in bf16 straight into the output, zeroed by a kernel the GEMV launched behind as a programmatic dependent (its loop
before the wait), so no fp32 sums, counter or cast: what SGLang's Marlin does on sm90 for narrow, long-K GEMMs
(use_atomic_add). sm_90 compiles it to red.global.add.noftz.bf16, one 2-byte address a value, and the splits
contend there: H200 (2026-12-04, read 4383 GB/s), us, the default plan / the same split adding in bf16, M = 1 and
8: 2624x6144 (split 16) 5.87 / 20.60 and 6.53 / 33.21, 6144x2048 (8) 5.36 / 11.61 and 5.94 / 21.00, 6144x4096
(8) 7.38 / 12.94 and 7.92 / 22.27, 4096x14336 (the K-sliced form, split 5) 11.83 / 15.17 and 12.39 / 18.70,
28672x4096 (split 2) 20.40 / 21.64: slower everywhere, more so with more splits and rows of x; and the bf16 sums
were 2-4x further from dequantise-then-matmul (error 3.9e-3 to 7.5e-3 against 1.6e-3 to 1.7e-3; 200 calls each,
no call far off).
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
WAYS = (("finish", True, True), ("atomic", True, False), ("store", False, False))
if sys.argv[1:2] == ["finish"]:
    WAYS = WAYS[:1]


def launcher(g: lp.Nvfp4Gemv, x: torch.Tensor, atomic: bool, finish: bool):
    """g's own launch (Nvfp4Gemv.mma_args) with the split's epilogue chosen (bf16 forms only: x is its own B
    operand)."""
    args = {**g.mma_args(x), "ATOMIC": atomic, "FINISH": finish, "PDL": False, "DEPS": False}
    args.pop("launch_pdl", None)
    if not finish:
        args["cnt_ptr"] = args["out_ptr"]
    return lambda: lp._fp4_mma_kernel[g.grid](**args)


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
        cfgs = [replace(base, warps_per_sm=w) for base in (default, lp.FP4_MMA_KS2, lp.FP4_MMA_DEFAULT)
                for w in (18, 27, 36, 48, 64, 96) if not k % base.k_multiple]
        for c in cfgs:
            gs = [lp.Nvfp4Gemv(qq, 1, dev, c) for qq in qs]
            for g in gs[:1]:
                g(x)
                g(x)
                err = nv.relative_error(g(x).float(), nv.reference_mm(x, q))
            for way, atomic, finish in WAYS:
                if gs[0].split == 1 and way != "finish":
                    continue
                us = ld.gpu_us([launcher(g, x, atomic, finish) if way != "finish" else (lambda g=g: g(x))
                                for g in gs], env)
                print(f"{n:>6}x{k:<6} {way:6s} {us:7.2f} us {nb / us / 1e3 / read:5.3f}r  split={gs[0].split:<3}"
                      f" grid={gs[0].grid} err {err:.1e}  {c.name}", flush=True)
            gs = None
        g = lp.Nvfp4Gemv(q, 1, dev, default)
        ref = nv.reference_mm(x, q)
        errs = []
        for i in range(300):  # a race in the finish shows as a call that misses a split's sums
            xi = x * (1 + (i % 7))
            errs.append(nv.relative_error(g(xi).float(), ref * (1 + (i % 7))))
        print(f"{n:>6}x{k:<6} 300 calls: worst error {max(errs):.2e}", flush=True)
        for c in (replace(default, split=1),):
            _, us, _ = ld.best_of(env, ld.fp4_builders(qs, x, dev, [c]), nb)
            print(f"{n:>6}x{k:<6} unsplit {us:7.2f} us {nb / us / 1e3 / read:5.3f}r  {c.name}", flush=True)
        qs = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
