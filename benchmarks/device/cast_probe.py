"""Probe (H200): the NVFP4 bf16 tensor-core GEMV's K split with its fp32 sums cast by a kernel behind it, launched
as a programmatic dependent that the GEMV lets start once its programs are past their loops (GemvConfig.cast: no
counter), against the same form with its last split casting the sums after an acq_rel counter: the plan's form and
the other split forms, on the small TP8 shapes where that finish is a large share of a call, and the issue's
Llama-3.1-8B shapes.

    PYTHONPATH=workflow python3 benchmarks/device/cast_probe.py [M,M...] [NxK,NxK...]

Per shape and M: us a call (CUDA-graph replay, rotating weight copies), the fraction of read bandwidth, the error
against dequantise-then-matmul for each form, and the worst error over 200 calls with x changing (a race between the
cast and the sums would show as a call far off).

What it found (2026-12-04, H200, read 4383-4462 GB/s), us a call, the last split casting / the cast kernel, same
form and split: at M=1 2624x6144 5.89 / 5.72, 6144x2048 5.33 / 5.08, 6144x4096 7.39 / 7.16, 4096x14336 (K slices)
11.82 / 11.55, stream-K 7168x18432 22.67 / 20.65; at M=8 2624x6144 6.58 / 6.03, 6144x2048 6.05 / 5.64, 6144x4096
7.86 / 7.49; at M=16 6144x2048 8.29 / 6.97, 36864x7168 (stream-K) 53.33 / 52.31, 28672x4096 (split 2) 25.91 /
26.01. Faster everywhere but that last, level; the worst of 200 calls 2.5e-3 against 1.7e-3 for one call on x
itself (x times 1-7 rounded to bf16 against an unrounded reference). In the kernel level's step it lost at batch 1
(fp4_config_for has the figures), so the plan casts this way above M=1 only.
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

# GLM-5 TP8 (fused_qkv_a, q_b, indexer wq_b, o_proj, dense down, dense gate_up), DeepSeek-V3 TP8 (fused_qkv_a,
# o_proj), Llama-3.1-8B (qkv, o_proj, down, gate_up)
SHAPES = [(2624, 6144), (2048, 2048), (4096, 2048), (6144, 2048), (6144, 1536), (3072, 6144), (2112, 7168),
          (7168, 2048), (6144, 4096), (4096, 4096), (4096, 14336), (28672, 4096)]


def main() -> None:
    dev = torch.device("cuda")
    ms = [int(v) for v in sys.argv[1].split(",")] if sys.argv[1:] else [1, 8]
    shapes = [tuple(int(v) for v in nk.split("x")) for nk in sys.argv[2].split(",")] if sys.argv[2:] else SHAPES
    env = BenchEnv(device=dev, warmup=3, iters=40, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    env.extra["read_gbps"] = read
    print(f"read {read:.0f} GB/s", flush=True)
    for n, k in shapes:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        qs = ld.nvfp4_copies(q, dev)
        for m in ms:
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            nb = ld.nvfp4_call_bytes(n, k, m)
            ref = nv.reference_mm(x, q)
            base = lp.fp4_config_for(m, k, dev, n)
            if m > 8:  # x shared a program: in place, an iteration ahead, stream-K
                others = (lp.FP4_MMA_XS, lp.FP4_MMA_XS_AHEAD, lp.FP4_MMA_BX_SK_XS)
            else:  # the K-split forms (two K slices a tile, 2 or 4 steps an iteration), and stream-K
                others = (lp.FP4_MMA_DEFAULT, lp.FP4_MMA_KS2, lp.FP4_MMA_KS2_WIDE, lp.FP4_MMA_BX_40, lp.FP4_MMA_BX_SK)
            # each form with the last split casting (cast off) and with the cast kernel behind it (cast on)
            cfgs = [c for b in dict.fromkeys((base,) + others) if b.fits(k)
                    for c in (replace(b, cast=False), replace(b, cast=True))]
            read_us = ld.plain_read_us(env, nb)
            print(f"{n:>6}x{k:<6} M={m:<2} plain read {read_us:6.2f} us {nb / read_us / 1e3 / read:5.3f}r",
                  flush=True)
            for c in cfgs:
                g = lp.Nvfp4Gemv(q, m, dev, c)
                if c.cast and not g.cast:
                    continue  # no K split: nothing to cast (the same kernel as with cast off)
                g(x)
                err = nv.relative_error(g(x).float(), ref)
                worst = err
                if c.cast:
                    for i in range(200):
                        xi = x * (1 + (i % 7))
                        worst = max(worst, nv.relative_error(g(xi).float(), ref * (1 + (i % 7))))
                fns = [(lambda gg=gg: gg(x)) for gg in [lp.Nvfp4Gemv(qq, m, dev, c) for qq in qs]]
                us = ld.gpu_us(fns, env)
                print(f"{n:>6}x{k:<6} M={m:<2} {us:7.2f} us {nb / us / 1e3 / read:5.3f}r  split={g.split:<3} "
                      f"kernels={g.kernels} err {err:.1e} worst {worst:.1e}  {c.name}", flush=True)
                fns = None
        qs = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
