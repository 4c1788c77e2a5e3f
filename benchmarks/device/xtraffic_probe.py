"""Probe (H200): why the NVFP4 tensor-core GEMV runs at about half of read bandwidth at M = 9-16, where M <= 8 runs
at three quarters; and which wide form should be the M=1 default on the lm_heads.

    PYTHONPATH=workflow python3 benchmarks/device/xtraffic_probe.py            # M = 1, 8, 16: x distinct or one row
    PYTHONPATH=workflow python3 benchmarks/device/xtraffic_probe.py m1         # M=1: the wide and sliced forms
    PYTHONPATH=workflow python3 benchmarks/device/xtraffic_probe.py m16        # M = 16, 8: the plan, the forms
    PYTHONPATH=workflow python3 benchmarks/device/xtraffic_probe.py one N K M FORM [shared]   # one call, for ncu
                                                                               # (benchmarks/device/ncu_xtraffic.sh)

At M = 16 every warp loads, per 64-value step, 2 KB of x (16 rows x 64 values in bf16, for both MMA sets) from L1
or L2 beside 512 bytes of weight and 64 of scales: four times the weight's bytes, where M <= 8 loads 1 KB and M=1
one line a quad column. The default run also times the same kernels on an x whose 16 rows are one row (`expand`:
stride 0, so the lanes of a quad column share an address, as at M=1); the sums are still the product, and the
difference in time is what x's distinct addresses cost.

What it found (2026-12-01, H200, read 4458 GB/s, us a call):
  28672x4096  M=8 19.8; M=16 xj 27.8 (x one row 25.8), stream-K 29.3 (26.5)
  7168x18432  M=8 23.9; M=16 xj 28.6 (27.8), stream-K 30.7 (28.4)
  36864x7168  M=8 41.4; M=16 stream-K 58.0 (54.0)
So x's addresses cost 1-4 us of the 6-17 us between M=8 and M=16. ncu (--clock-control none, 28672x4096, the xj K
split): the M=16 loop issues as many instructions as M=8 and M=1 (11.5M, 11.0M, 10.9M), at 0.37 issued warps a
scheduler against 0.60 and 0.61, with as many warps resident (6.6 a scheduler against 6.3); the difference is
stalls, most of them long-scoreboard (x's loads, made in the iteration that uses them: 12.1 cycles an issued
instruction against 6.8 at M=8; 7.3 with x one row) and a little more tensor-pipe and fixed-latency waiting (two
MMA sets a step).
What did help: x loaded once a program and shared by its warps (GemvConfig.xshare: one 16-byte load a thread a
step, the fragments through shared memory), the default at M = 9-16 since. The m16 run (read 4458 GB/s), M=16, the
plan before against the plan now, us: 28672x4096 27.8 -> 25.9, 7168x18432 28.9 -> 28.2, 6144x4096 10.4 -> 9.7,
4096x14336 15.6 -> 15.3, 36864x7168 58.5 -> 53.8, 24576x6144 35.5 -> 32.7, 6144x16384 23.8 -> 22.5, 128256x4096
103.8 -> 100.0. At M=8 no form with it beat the default on any of the eight shapes (6144x4096 8.07 against 8.02 us,
28672x4096 22.0 against 19.7 for the K-sliced default), so it stays at M = 9-16. ncu on it (28672x4096, M=16, the same metrics): long-scoreboard 3.2 cycles an
issued instruction for 11.8, the barriers of the layout conversion 2.0 for 0.8, shared-memory waits 0.9 for 0.1;
10% more instructions (12.6M), issued at 0.55 warps a scheduler for 0.38. Converting an iteration's two chunks at
once ([16, 64]) compiled to the same barriers and shared-memory traffic in 79 registers for 70: not kept.
Tried and not kept:
  - weights and scales loaded through L2 only (ld.global.cg, so that L1 keeps x): L1's hit rate stayed at 83%, and
    every form but the non-evict-first fp16 wide one got slower (28672x4096 M=16 27.5 -> 37.6 us, M=1 19.1 -> 20.2;
    the fp16 wide form on the lm_heads 83.8 -> 75.9, what evict-first gives it as well);
  - Triton's own software pipeline (tl.range num_stages 2-4 over the loop, which compiles the 16-byte loads to
    cp.async copies into shared memory, 48 registers for 55 at M=1): correct, and 5-20 times slower on every shape
    (28672x4096 M=1 19.1 us -> hundreds; 6144x4096 7.4 -> 87-111).
The m1 run (read 4455 GB/s): the fp16 wide form, the lm_heads' default until then, lost to the bf16 wide form on all
three lm_heads (Llama-3.1-8B 128256x4096 83.8 against 74.3, DeepSeek-V3 129280x7168 144.0 against 126.5, GLM-5
154880x6144 152.8 against 134.1); the 4-step K-sliced form took 76.1, 127.4 and 130.7. The bf16 wide form is the
default there since (FP4_MMA_BX_WIDE).
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

CFGS = {"xj": lp.FP4_MMA_XJ, "sk": lp.FP4_MMA_BX_SK, "bx": lp.FP4_MMA_DEFAULT, "ks2": lp.FP4_MMA_KS2,
        "xs": lp.FP4_MMA_XS, "xr2": lp.FP4_MMA_XRING[0], "xr3": lp.FP4_MMA_XRING[1]}


def x_for(m: int, k: int, dev, shared: bool) -> torch.Tensor:
    if shared:
        return torch.randn((1, k), device=dev, dtype=torch.bfloat16).expand(m, k)
    return torch.randn((m, k), device=dev, dtype=torch.bfloat16)


def builders(qs, m, k, dev, shared: bool, cfgs: dict) -> dict:
    x = x_for(m, k, dev, shared)
    tag = " x one row" if shared else ""
    return {f"M={m} {name}{tag}": (lambda c=c: [(lambda g=g: g(x)) for g in [lp.Nvfp4Gemv(q, m, dev, c) for q in qs]])
            for name, c in cfgs.items()}


def check(q, m: int, k: int, dev, cfgs: dict) -> None:
    """Each form against dequantise-then-matmul, x changing each call (a missed split would show)."""
    deq = nv.dequantize_nvfp4(q)
    x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
    for name, c in cfgs.items():
        g = lp.Nvfp4Gemv(q, m, dev, c)
        errs = []
        for _ in range(3):
            x.normal_()
            errs.append(nv.relative_error(g(x), x.float() @ deq.t()))
        print(f"check M={m} {name} {c.name}: rel err {max(errs):.2e} {'ok' if max(errs) < 2e-2 else 'FAILED'}")


def one(n: int, k: int, m: int, cfg: str, shared: bool) -> None:
    dev = torch.device("cuda")
    q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
    g = lp.Nvfp4Gemv(q, m, dev, CFGS[cfg])
    x = x_for(m, k, dev, shared)
    for _ in range(5):
        g(x)
    torch.cuda.synchronize()
    print(g.label)


def print_rows(n: int, k: int, rows: dict, read: float) -> None:
    nb = nv.nvfp4_bytes(n, k)
    for name, us in rows.items():
        fr = f"{nb / (us * 1e-6) / (read * 1e9):.2f} r" if isinstance(us, float) else ""
        print(f"{n:>6}x{k:<6} {name:<56} {us if isinstance(us, str) else f'{us:7.2f} us'} {fr}", flush=True)


def main() -> None:
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=30, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    print(f"read {read:.0f} GB/s")
    for n, k in [(28672, 4096), (7168, 18432), (36864, 7168)]:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        qs = ld.nvfp4_copies(q, dev)
        rows = {}
        for m in (8, 16):
            cfgs = {"default": lp.fp4_config_for(m, k, dev, n)}
            if m == 16:
                cfgs.update({"xj": lp.FP4_MMA_XJ, "sk": lp.FP4_MMA_BX_SK})
            check(q, m, k, dev, cfgs)
            for shared in (False, True):
                _, _, times = ld.best_of(env, builders(qs, m, k, dev, shared, cfgs), ld.nvfp4_call_bytes(n, k, m))
                rows.update(times)
        print_rows(n, k, rows, read)
        qs = None
        torch.cuda.empty_cache()


def m1_wide() -> None:
    """M=1: the wide forms (fp16, bf16, bf16 evict-first) and the K-sliced ones, on the lm_heads and mid-sized
    shapes."""
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=30, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    print(f"read {read:.0f} GB/s")
    forms = {"fp16 wide": lp.FP4_MMA_WIDE, "bf16 wide": lp.FP4_MMA_BX_WIDE, "ks2": lp.FP4_MMA_KS2,
             "ks2 wide": lp.FP4_MMA_KS2_WIDE, "bf16": lp.FP4_MMA_DEFAULT}
    for n, k in [(128256, 4096), (154880, 6144), (129280, 7168), (36864, 7168), (28672, 4096)]:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        check(q, 1, k, dev, forms)
        qs = ld.nvfp4_copies(q, dev)
        x = torch.randn((1, k), device=dev, dtype=torch.bfloat16)
        _, _, times = ld.best_of(env, ld.fp4_builders(qs, x, dev, list(forms.values())), ld.nvfp4_call_bytes(n, k, 1))
        default = lp.fp4_config_for(1, k, dev, n).name
        print_rows(n, k, {f"M=1 {name}{' (default)' if name == default else ''}": us for name, us in times.items()},
                   read)
        qs = None
        torch.cuda.empty_cache()


def m16_forms(ms=(16, 8)) -> None:
    """M = 16 (and 8): the default plan against the earlier forms and those with x loaded once a program (xshare), on
    the eight mid-sized shapes."""
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=30, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    print(f"read {read:.0f} GB/s")
    for n, k in [(28672, 4096), (7168, 18432), (6144, 4096), (4096, 14336), (36864, 7168), (24576, 6144),
                 (6144, 16384), (128256, 4096)]:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        qs = ld.nvfp4_copies(q, dev)
        for m in ms:
            default = lp.fp4_config_for(m, k, dev, n)
            forms = {"default": default, "xj": lp.FP4_MMA_XJ, "sk": lp.FP4_MMA_BX_SK, "bx": lp.FP4_MMA_DEFAULT,
                     "ks2": lp.FP4_MMA_KS2, "ks2 xj": replace(lp.FP4_MMA_KS2, xjit=True),
                     **{f"xshare {i}": c for i, c in enumerate(lp.FP4_MMA_XSHARE)}}
            forms = {name: c for name, c in forms.items()
                     if k % c.k_multiple == 0 and (name == "default" or c != default)}
            check(q, m, k, dev, forms)
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            _, _, times = ld.best_of(env, ld.fp4_builders(qs, x, dev, list(forms.values())),
                                     ld.nvfp4_call_bytes(n, k, m))
            print_rows(n, k, {f"M={m} {name}{' (default)' if name == default.name else ''}": us
                              for name, us in times.items()}, read)
        qs = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "m16":
        m16_forms()
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        one(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], len(sys.argv) > 6)
    elif len(sys.argv) > 1 and sys.argv[1] == "m1":
        m1_wide()
    else:
        main()
