"""Probe (H200): where the NVFP4 tensor-core GEMV's time over a plain read of its bytes goes, by taking the DRAM
traffic away from its operands one at a time (the same compiled loop, grid and launch; the sums are wrong and
never used, only timed).

    PYTHONPATH=workflow python3 benchmarks/device/ablate_probe.py [--m 1 8 16] [--forms plan ring3 ...]
        [--shapes 28672x4096 ...]

Each shape runs the plan's form at each M (fp4_config_for; with --forms, the forms named, the cast kernel behind
their K split above M=1) four ways, through the kernel's own strides:
  base   as the GEMV runs;
  s-L2   every tile reads tile 0's block scales (scale stride 0): the scales come from L2, the weights from DRAM;
  w-L2   every tile reads tile 0's weights (weight stride 0): the weights come from L2, the scales from DRAM;
  L2     both: the loop's decode and MMAs with no DRAM traffic but x's, the time the instructions alone take.
Beside them, a plain read of the call's bytes (launch.plain_read). Rotating copies of the weight past the L2 as the
benchmark's GEMV rows use.

If `L2` comes close to the plain read, the loop's instructions, not its memory traffic, hold it back; if `s-L2` is
clearly faster than `base`, the scales' own small loads (64 bytes a warp a step, their own stream) cost DRAM
efficiency beyond their 11% of the bytes.

What it found (2026-12-02, H200, read 4381 GB/s; us a call, and over the plain read):
  shape        form                        read   base         s-L2         w-L2         L2
  128256x4096  m,BN=64,BK=256,w=4,t=18,bx  69.08  75.81 1.10x  77.19 1.12x  66.48 0.96x  60.29 0.87x
  28672x4096   ...,ef,t=27,bx,ks=2         17.21  19.43 1.13x  19.36 1.12x  16.98 0.99x  16.46 0.96x
  24576x6144   ...,BK=256,t=18,bx,ks=2     21.58  22.30 1.03x  22.28 1.03x  20.24 0.94x  19.59 0.91x
  7168x18432   ...,BK=256,t=18,bx,ks=2     19.12  22.85 1.19x  22.86 1.20x  21.09 1.10x  21.09 1.10x
  6144x16384   ...,BK=256,t=18,bx,ks=2     14.86  17.26 1.16x  17.21 1.16x  15.43 1.04x  15.39 1.04x
  4096x14336   ...,BK=256,t=18,bx,ks=2      9.51  11.95 1.26x  11.88 1.25x  10.40 1.09x  10.43 1.10x
  6144x4096    m,BN=64,BK=128,...,t=27,bx   5.05   7.37 1.46x   7.38 1.46x   6.33 1.25x   6.33 1.25x
A second machine (read 4377 GB/s, after mma_args) agreed within 2% on every cell but one: the lm_head's s-L2 took
68.97 us against its base 74.45 (1.01x against 1.09x), where the first machine's took 1.4 us longer than its base.
So on the mid-sized shapes the scales' loads cost nothing beyond their bytes (s-L2 within 0.1 us of base); on the
lm_head, served from L2 they took 11% of the bytes off a kernel that was then as fast as the read on one machine and
not on the other: not a finding either way. With no weight traffic at all
the loop still takes 0.87-0.96 of the read's time on the wide shapes and 1.04-1.25 on the narrow and small ones
(the split's finish, about 1 us, included): the instructions a byte, not the memory, hold the kernel back, and the
time a call takes is close to its instruction time plus part of its transfer. noscale_probe.py measures the largest
single part of those instructions.
At M = 1, 8 and 16 (2026-12-07, the plan's forms; an H100 80GB HBM3 and an H200, the same day), the L2 way took the
same time on both cards (28672x4096 M=16: 23.00 us on the H100, 22.96 on the H200), the SMs' own time, so an H100
measures it too; at M=16 it was 1.12-1.36x M=8's and 1.18x the H200's plain read on 28672x4096 (the table and
ncu_ablate.sh's stall reasons: lowprec's comment "Why an H100 cannot show what M = 9-16 loses on the H200").
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

import lowprec_device as ld  # noqa: E402
from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402
from decode_gap.microbench import launch, memory  # noqa: E402
from decode_gap.microbench.common import BenchEnv  # noqa: E402

SHAPES = [(128256, 4096), (28672, 4096), (24576, 6144), (7168, 18432), (6144, 16384), (4096, 14336), (6144, 4096)]
# forms by name beside the plan (--forms), each with the cast kernel behind its K split above M=1, as the plan runs
FORMS = {"ring3": replace(lp.FP4_MMA_XS_RING, xring=3), "xs": lp.FP4_MMA_XS, "ahead": lp.FP4_MMA_XS_AHEAD,
         "sk": lp.FP4_MMA_SK_RING, "pairs": lp.FP4_MMA_TP, "sliced": lp.FP4_MMA_KS2, "sliced4": lp.FP4_MMA_KS2_WIDE,
         "ring4": replace(lp.FP4_MMA_XS_RING, block_k=256, warps_per_sm=18),
         "ring1": replace(lp.FP4_MMA_XS_RING, block_k=64)}
WAYS = {"base": (True, True), "s-L2": (True, False), "w-L2": (False, True), "L2": (False, False)}


def launcher(g: lp.Nvfp4Gemv, x: torch.Tensor, w_stride: bool, s_stride: bool):
    """g's own launch (Nvfp4Gemv.mma_args) with the weight or scale stride between tiles set to 0, and the cast
    kernel behind it where the form has one (it zeroes the split's sums for the next call)."""
    args = g.mma_args(x)
    args.update(stride_wt=args["stride_wt"] if w_stride else 0, stride_st=args["stride_st"] if s_stride else 0)

    def call():
        lp._fp4_mma_kernel[g.grid](**args)
        if g.cast:
            lp.cast_zero(g.acc, g.out, g.cast_pdl)
    return call


def gpu_bench(iters: int) -> tuple:
    """The probes' GPU, bench settings (`iters` replays a timing) and measured read bandwidth in GB/s."""
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=iters, cpu_budget_s=0.05)
    return dev, env, memory.measure_memory(env)["read_gbps"]


def weights(shapes, dev):
    """For each "NxK" of `shapes`: (n, k, a random NVFP4 weight, it and enough copies to rotate past the L2), the
    copies freed once the caller moves on (the list emptied in place: the caller's name for it still points at it),
    before the next shape's are made."""
    for shape in shapes:
        n, k = (int(v) for v in shape.split("x"))
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        qs = ld.nvfp4_copies(q, dev)
        yield n, k, q, qs
        qs.clear()
        torch.cuda.empty_cache()


def copies_builder(make, qs: list, x: torch.Tensor):
    """A builder (lowprec_device.rotated_times) of calls on x, one a weight copy, each made by make(copy)."""
    return lambda: [(lambda g=g: g(x)) for g in [make(qq) for qq in qs]]


def plan_l2(qs: list, m: int, dev, plan: lp.GemvConfig, x: torch.Tensor):
    """A builder of the plan's calls the L2 way (no DRAM traffic), one a weight copy: the probes' --l2 rows."""
    return lambda: [launcher(lp.Nvfp4Gemv(qq, m, dev, plan), x, False, False) for qq in qs]


def print_times(times: dict, plan_name: str, n: int, k: int, m: int, nbytes: int, read_gbps: float) -> None:
    """A probe's rotated rounds (lowprec_device.rotated_times), fastest first, each with its share of the read."""
    for name, us in sorted(times.items(), key=lambda kv: kv[1] if isinstance(kv[1], float) else 1e9):
        tag = " (plan)" if name == plan_name else ""
        fr = f"{nbytes / (us * 1e-6) / (read_gbps * 1e9):.3f} of read" if isinstance(us, float) else str(us)
        print(f"{n:>6}x{k:<6} M={m:<2} {name + tag:<50} {us if not isinstance(us, float) else f'{us:7.2f} us'} {fr}",
              flush=True)


def form_config(form: str, m: int, k: int, n: int, dev) -> lp.GemvConfig:
    """The plan's form for the call, or the one FORMS names with the cast kernel behind its split above M=1."""
    if form == "plan":
        return lp.fp4_config_for(m, k, dev, n)
    return lp.with_cast(FORMS[form]) if m > 1 else FORMS[form]


def profile(args, dev) -> None:
    """Each shape, M and form run 4 times one way (args.profile), on one copy of the weight: for ncu
    (benchmarks/device/ncu_ablate.sh), which takes the third call of the GEMV kernel."""
    for n, k in (tuple(int(v) for v in s.split("x")) for s in args.shapes):
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        for m in args.m:
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            for form in args.forms:
                cfg = form_config(form, m, k, n, dev)
                g = lp.Nvfp4Gemv(q, m, dev, cfg)
                call = launcher(g, x, *WAYS[args.profile])
                for _ in range(4):
                    call()
                torch.cuda.synchronize(dev)
                print(f"{n}x{k} M={m} {form} {cfg.name} {args.profile}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1], help="rows of x (the plan's form at each)")
    ap.add_argument("--forms", nargs="+", default=["plan"], choices=["plan", *FORMS], help="forms to run")
    ap.add_argument("--shapes", nargs="+", default=[f"{n}x{k}" for n, k in SHAPES], help="NxK")
    ap.add_argument("--profile", choices=list(WAYS), help="only run each form this way, untimed (under ncu)")
    args = ap.parse_args()
    if args.profile:
        profile(args, torch.device("cuda"))
        return
    dev, env, read = gpu_bench(40)
    reads = launch.PlainReads(env)
    print(f"{torch.cuda.get_device_name(dev)}: read {read:.0f} GB/s; plain read: {reads.method}")
    for n, k, q, copies in weights(args.shapes, dev):
        for m in args.m:
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            nb = ld.nvfp4_call_bytes(n, k, m)
            for form in args.forms:
                cfg = form_config(form, m, k, n, dev)
                if not cfg.bx:
                    print(f"{n}x{k} M={m}: form {cfg.name} is not a bf16 form; skipped")
                    continue
                gs = [lp.Nvfp4Gemv(qq, m, dev, cfg) for qq in copies]
                for g in gs:
                    g(x)
                err = nv.relative_error(gs[0](x).float(), nv.reference_mm(x, q))
                read_us = reads.us(nb)
                line = [f"{n:>6}x{k:<6} M={m:<2} {form:7s} {cfg.name:44s} err {err:.1e} | read {read_us:6.2f}"]
                for way, (w_stride, s_stride) in WAYS.items():
                    us = ld.gpu_us([launcher(g, x, w_stride, s_stride) for g in gs], env)
                    line.append(f"{way} {us:6.2f} ({us / read_us:4.2f}x)")
                print("  ".join(line), flush=True)
                gs = None


if __name__ == "__main__":
    main()
