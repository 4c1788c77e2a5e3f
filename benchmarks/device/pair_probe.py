"""Probe (H200): the NVFP4 tensor-core GEMV with two 16-row tiles a warp against one x load a step (GemvConfig.pair)
beside the default plan, at M = 16, 8 and 1 on the mid-sized shapes and an lm_head.

    PYTHONPATH=workflow python3 benchmarks/device/pair_probe.py [M ...]      # default: 16 8 1

Why: at M = 16 each warp of the one-tile forms loads 2 KB of x a step beside 512 bytes of weight and 64 of scales,
and the form that shares x through shared memory (xshare) pays two barriers and 10% more instructions a step for it.
A warp with two tiles loads x once for both: half the x loads, x registers and loop bookkeeping a weight byte, with
no barrier, in 100 registers (sm_90, kernel_resources.py) where the one-tile form takes 72. Each form is checked
against dequantise-then-matmul first, x changing each call.

    PYTHONPATH=workflow python3 benchmarks/device/pair_probe.py extra [M ...]  # other M = 9-16 forms (EXTRA)

What it found (2026-12-01, H200, read 4383 GB/s, us a call; lowprec.FP4_MMA_TP's comment has more):
  M=16, the default before / tile pairs at best: the lm_heads 128256x4096 100.1 / 91.7, 129280x7168 189.7 / 177.5,
  154880x6144 197.7 / 183.1 (no split, several waves: the default there since); with a K split tile pairs lost on
  all seven mid-sized shapes (28672x4096 25.8 / 29.8 with the split cut to one wave, 36864x7168 53.7 / 61.9,
  4096x14336 15.2 / 16.8), four programs an SM being too few; M=8: 7168x18432 23.9 / 23.5, the rest lost; M=1 lost.
Two heads runs on the next machine (read 4460-4462 GB/s), M=16, tile pairs / x shared in place / x shared ahead:
  128256x4096 94.1 / 103.5 / 99.4 and 94.1 / 103.2 / 97.0; 129280x7168 192.6 / 177.7 / 172.2 and 182.8 / 176.6 /
  178.3; 154880x6144 202.5 / 168.2 / 180.3 and 202.3 / 170.9 / 186.7. M=12: 88.7 / 102.2 / 95.8, 161.0 / 177.0 /
  178.6, 167.2 / 174.2 / 181.4. So on the lm_heads the three forms trade places by shape, M and machine (summed over
  the heads at M = 12 and 16, within 0.5%); the gemm stage times them all. A third such run (read 4458 GB/s) agreed
  (190.1 / 181.3 / 166.2, 202.2 / 183.3 / 189.4). A heads run at M = 9, 12, 14, 16 on a machine reading 4386 GB/s,
  like the first two runs', put tile pairs first on all three heads at M = 12-16 (M=16: 89.7 / 104.7 / 101.8,
  170.6 / 186.0 / 188.1, 178.9 / 189.1 / 196.0), and at M=9 none won all three (DeepSeek-V3: the unshared bf16
  form, 168.8 against 173.9): which form wins the bigger heads at M=16 depends on the machine.
The extra run (read 4460 GB/s): one step an iteration (60-61 registers, 8 programs an SM) and 8-warp programs
sharing one x chunk lost to the default on every shape at M=16 (28672x4096 25.9 against 27.3 at best, 36864x7168
53.2 against 54.8, 6144x16384 22.7 against 24.2); more warps an SM did not make up for the extra steps' overhead.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

import lowprec_device as ld  # noqa: E402
from xtraffic_probe import check  # noqa: E402  (this folder is the script's: on sys.path)
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
    print(f"  {cfg.name}: {getattr(g.compiled, 'n_regs', None)} registers, {fits} programs an SM, grid {g.grid}",
          flush=True)
    return replace(cfg, split=cut) if g.split * programs > places and cut > 1 else None


# `extra` mode: other ways to fit more warps an SM at M = 9-16, one step an iteration (sm_90: 60-61 registers for
# 70-72, so 8 programs an SM for 7) and 8-warp programs sharing one x chunk
EXTRA = {"xs 1 step": replace(lp.FP4_MMA_XS, block_k=64), "xs 1 step t=32": replace(lp.FP4_MMA_XS, block_k=64,
                                                                                     warps_per_sm=32),
         "xj 1 step": replace(lp.FP4_MMA_XJ, block_k=64), "xs 8 warps": replace(lp.FP4_MMA_XS, warps=8, block_n=128),
         "xs 8 warps 1 step": replace(lp.FP4_MMA_XS, warps=8, block_n=128, block_k=64),
         "xs ahead 1 step": replace(lp.FP4_MMA_XS_AHEAD, block_k=64)}


# `heads` mode: the lm_heads at M = 9-16 (no K split), the forms the gemm stage times there
HEADS = {"tp": lp.FP4_MMA_TP, "xs in place": lp.FP4_MMA_XS, "xs ahead": lp.FP4_MMA_XS_AHEAD,
         "bx": lp.FP4_MMA_DEFAULT}


def sweep(ms: list[int], forms_for, shapes: list = SHAPES) -> None:
    """For each shape and M: the forms forms_for(n, k, m, dev) names (with "default", the plan's), each checked
    against dequantise-then-matmul (xtraffic_probe.check), then timed."""
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=30, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    print(f"read {read:.0f} GB/s", flush=True)
    for n, k in shapes:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        qs = ld.nvfp4_copies(q, dev)
        per_shape = forms_for(n, k, None, dev)  # built once a shape (the one-wave cut compiles and runs the form)
        for m in ms:
            forms = {name: c for name, c in {"default": lp.fp4_config_for(m, k, dev, n), **per_shape(m)}.items()
                     if k % c.k_multiple == 0}
            check(q, m, k, dev, forms)
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            _, _, times = ld.best_of(env, ld.fp4_builders(qs, x, dev, list(forms.values())),
                                     ld.nvfp4_call_bytes(n, k, m))
            show(n, k, m, times, forms["default"], read)
        qs = None
        torch.cuda.empty_cache()


def pair_forms(n: int, k: int, _m, dev):
    """The main run's forms: tile pairs (and each cut to one wave where its split overflows it), xj above M = 8."""
    fits = [one_wave(c, n, k, dev) for c in (lp.FP4_MMA_TP, replace(lp.FP4_MMA_TP, block_k=64))]
    return lambda m: {**{c.name: c for c in lp.FP4_MMA_PAIR}, **{f"one wave {c.name}": c for c in fits if c},
                      **({"xj": lp.FP4_MMA_XJ} if m > 8 else {})}


def show(n: int, k: int, m: int, times: dict, default: lp.GemvConfig, read: float) -> None:
    nb = nv.nvfp4_bytes(n, k)
    for name, us in times.items():
        us = us if us is not None else ld.RESULTS["errors"].get(name, "error")
        tag = " (default)" if name == default.name else ""
        fr = f"{nb / (us * 1e-6) / (read * 1e9):.2f} r" if isinstance(us, float) else ""
        print(f"{n:>6}x{k:<6} M={m:<2} {name + tag:<58} {us if isinstance(us, str) else f'{us:7.2f} us'} {fr}",
              flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["extra"]:
        sweep([int(a) for a in sys.argv[2:]] or [16], lambda *_: lambda m: EXTRA)
    elif sys.argv[1:2] == ["heads"]:
        sweep([int(a) for a in sys.argv[2:]] or [16, 12], lambda *_: lambda m: HEADS, SHAPES[-3:])
    else:
        sweep([int(a) for a in sys.argv[1:]] or [16, 8, 1], pair_forms)
