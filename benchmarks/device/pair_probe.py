"""Probe (H200): the NVFP4 tensor-core GEMV with two 16-row tiles a warp against one x load a step (GemvConfig.pair)
beside the default plan, at M = 16, 8 and 1 on the mid-sized shapes and an lm_head.

    PYTHONPATH=workflow python3 benchmarks/device/pair_probe.py [M ...]      # default: 16 8 1

Why: at M = 16 each warp of the one-tile forms loads 2 KB of x a step beside 512 bytes of weight and 64 of scales,
and the form that shares x through shared memory (xshare) pays two barriers and 10% more instructions a step for it.
A warp with two tiles loads x once for both: half the x loads, x registers and loop bookkeeping a weight byte, with
no barrier, in 100 registers (sm_90, kernel_resources.py) where the one-tile form takes 72. Each form is checked
against dequantise-then-matmul first, x changing each call.
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

SHAPES = [(28672, 4096), (7168, 18432), (6144, 4096), (4096, 14336), (36864, 7168), (24576, 6144), (6144, 16384),
          (128256, 4096), (129280, 7168), (154880, 6144)]


def one_wave(cfg: lp.GemvConfig, n: int, k: int, dev) -> lp.GemvConfig | None:
    """cfg with its K split cut to what one wave holds (the programs an SM from the compiled registers), where its
    own plan overflows one wave and the cut still splits."""
    g = lp.Nvfp4Gemv(nv.quantize_nvfp4(torch.zeros((n, k), device=dev)), 16, dev, cfg)
    g(torch.zeros((16, k), device=dev, dtype=torch.bfloat16))
    fits = lp.resident_programs(g.compiled, cfg.warps, dev) or 4
    places, programs = fits * lp.sm_count(dev), g.grid[0]
    cut = places // programs
    print(f"  {cfg.name}: {g.compiled.n_regs} registers, {fits} programs an SM, grid {g.grid}", flush=True)
    return replace(cfg, split=cut) if g.split * programs > places and cut > 1 else None


def check(q, m: int, k: int, dev, forms: dict) -> None:
    deq = nv.dequantize_nvfp4(q)
    x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
    for name, c in forms.items():
        g = lp.Nvfp4Gemv(q, m, dev, c)
        errs = []
        for _ in range(3):
            x.normal_()
            errs.append(nv.relative_error(g(x), x.float() @ deq.t()))
        print(f"check M={m} {name} {c.name}: rel err {max(errs):.2e} {'ok' if max(errs) < 2e-2 else 'FAILED'}",
              flush=True)


def main(ms: list[int]) -> None:
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=30, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    print(f"read {read:.0f} GB/s", flush=True)
    for n, k in SHAPES:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        qs = ld.nvfp4_copies(q, dev)
        fits = [one_wave(c, n, k, dev) for c in (lp.FP4_MMA_TP, replace(lp.FP4_MMA_TP, block_k=64))]
        for m in ms:
            default = lp.fp4_config_for(m, k, dev, n)
            forms = {"default": default, **{c.name: c for c in lp.FP4_MMA_PAIR}}
            forms.update({f"one wave {c.name}": c for c in fits if c is not None})
            if m > 8:
                forms["xj"] = lp.FP4_MMA_XJ
            forms = {name: c for name, c in forms.items() if k % c.k_multiple == 0}
            check(q, m, k, dev, forms)
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            _, _, times = ld.best_of(env, ld.fp4_builders(qs, x, dev, list(forms.values())),
                                     ld.nvfp4_call_bytes(n, k, m))
            nb = nv.nvfp4_bytes(n, k)
            for name, us in times.items():
                us = us if us is not None else ld.RESULTS["errors"].get(name, "error")
                tag = " (default)" if name == default.name else ""
                fr = f"{nb / (us * 1e-6) / (read * 1e9):.2f} r" if isinstance(us, float) else ""
                print(f"{n:>6}x{k:<6} M={m:<2} {name + tag:<58} "
                      f"{us if isinstance(us, str) else f'{us:7.2f} us'} {fr}", flush=True)
        qs = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [16, 8, 1])
