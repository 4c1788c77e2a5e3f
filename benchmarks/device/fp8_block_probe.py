"""Probe (H200): the FP8 GEMV with 128x128 block scales at M=1, its tiles against the per-tensor form's and against
torch._scaled_mm (per-tensor, and with block scales where this torch has them on this GPU).

    PYTHONPATH=workflow python3 benchmarks/device/fp8_block_probe.py [--scaled-mm]

Why: on the full benchmark the block-scaled GEMV trailed the per-tensor one by 3-10% on the mid-sized shapes
(Llama-3.1-8B gate_up 31.7 against 28.8 us), though its SASS is about as long. Its tiles stopped at 1024 columns an
iteration where the per-tensor form wins with 2048; and `xb` (GemvConfig.xscale) applies the scales of the
program's one 128-row block to x, once for all rows, instead of summing every row's 128-column blocks apart. Each
form is checked against dequantise-then-matmul first.

What it found (2026-12-01, H200, read 4458 GB/s, us a call; the first run at 4381 GB/s agreed within 3%):
  block tiles BN=8,BK=1024 (the default) / best with xb / per-tensor BN=8,BK=2048
  28672x4096 31.6 / 31.6 (16x1024 xb) / 28.9;  36864x7168 64.5 / 66.7 / 65.6;  24576x6144 39.5 / 39.7 / 37.5
  7168x18432 36.7 (36.4 at 16x512) / 35.2 (16x1024 xb, 0.84 r) / 33.1;  6144x16384 29.9 / 27.9 / 25.7
  4096x14336 18.8 / 17.8 / 20.6;  6144x4096 9.9 / 9.3 (8x2048 xb) / 8.5;  128256x4096 123.3 / 125.9 / 116.4
  Larger tiles without xb (8x2048, 16x1024) were slower than 8x1024 on every shape. So the xb forms join the
  candidates (lowprec.DENSE_BLOCK_XSCALE) and none replaces the default.
  4-row forms with xb (the per-tensor form's 4x2048 wins 4096x14336 there, 16.7 against 20.8 us): 2026-12-02, read
  4385 GB/s, 4x2048 xb / 4x1024 xb / the best block form: 28672x4096 33.2 / 35.4 / 31.9, 36864x7168 83.0 / 78.3 /
  65.3, 24576x6144 41.5 / 46.3 / 40.1, 6144x16384 30.9 / 37.0 / 28.2, 4096x14336 18.8 / 21.3 / 18.0, 6144x4096 9.7 /
  11.0 / 9.3: neither won a shape, so neither joins the candidates.
  x's scales gathered a value at a time onto the per-tensor form's 2-D tile (xb now; 2026-12-02, read 4386 GB/s),
  the block form 8x1024 / the 3-D xb at best / gathered at best / per-tensor at best: 28672x4096 31.8 / 31.9 / 29.4
  (8x2048, 0.91 r) / 29.2; 36864x7168 65.3 / 67.7 / 64.9 (8x1024) / 66.3; 24576x6144 39.9 / 40.1 / 37.9 (8x1024) /
  36.9; 7168x18432 36.8 / 35.5 / 34.1 / 33.3; 6144x16384 29.9 / 28.1 / 26.7 / 26.2; 4096x14336 18.8 / 18.0 / 17.6
  (8x1024) / 16.7; 6144x4096 9.8 / 9.3 / 8.8 / 8.6; 128256x4096 132.1 / 130.0 / 118.5 (1.01 r) / 118.4. Gathered
  4x2048, 16x1024 and 4x4096 won nothing. So the gathered form replaces the 3-D one, its 8x2048 and 8x1024 tiles
  are the candidates (lowprec.DENSE_BLOCK_XSCALE) and 8x2048 the default at M=1.
  torch._scaled_mm with block scales: at M=1 no scale layout works (cuBLAS: CUBLAS_STATUS_NOT_SUPPORTED, or "Invalid
  scaling configuration"); at M=16, x's scales outer-dim-major and w's a [K/128, N/128] view of [N/128, K/128]:
  28672x4096 35.1 us (0.75 r), 36864x7168 76.9, 24576x6144 45.7, 7168x18432 43.9, 6144x16384 38.5, 4096x14336 26.6,
  6144x4096 14.6, 128256x4096 188.4 (0.39-0.77 r): the block GEMV at M=1 is faster on every shape.
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
from decode_gap.microbench import memory  # noqa: E402
from decode_gap.microbench.common import BenchEnv  # noqa: E402

SHAPES = [(28672, 4096), (36864, 7168), (24576, 6144), (7168, 18432), (6144, 16384), (4096, 14336), (6144, 4096),
          (128256, 4096)]
G = lp.GemvConfig
# the block form's two best tiles, then block scales on x at the per-tensor form's tiles and others
BLOCK = lp.DENSE_BLOCK_CONFIGS[:2] + tuple(
    G(bn, bk, 4, xscale=True) for bn, bk in ((8, 2048), (8, 1024), (4, 2048), (16, 1024), (4, 4096)))


def scaled_mm_block(x: torch.Tensor, w: torch.Tensor):
    """torch._scaled_mm with 1x128 scales on x and 128x128 on w: the first scale layout this torch accepts (tried in
    turn: x's scales outer-dim-major or not, w's [K/128, N/128] or [N/128, K/128], each contiguous or a transposed
    view), or why none is."""
    m, k = x.shape
    n = w.shape[0]
    x8 = x.to(torch.float8_e4m3fn)
    w8 = w.to(torch.float8_e4m3fn)
    dev = x.device
    sas = {"sa [M,K/128]": torch.ones((m, k // 128), device=dev),
           "sa [M,K/128] outer-major": torch.ones((k // 128, m), device=dev).t()}
    sbs = {"sb [K/128,N/128]": torch.ones((k // 128, n // 128), device=dev),
           "sb [K/128,N/128] view of [N/128,K/128]": torch.ones((n // 128, k // 128), device=dev).t(),
           "sb [N/128,K/128]": torch.ones((n // 128, k // 128), device=dev),
           "sb [N/128,K/128] view of [K/128,N/128]": torch.ones((k // 128, n // 128), device=dev).t()}
    why = []
    for an, sa in sas.items():
        for bn, sb in sbs.items():
            try:
                make = lambda w8, sa=sa, sb=sb: (lambda: torch._scaled_mm(x8, w8.t(), sa, sb,  # noqa: E731
                                                                          out_dtype=torch.bfloat16))
                make(w8)()
                return make, f"{an}, {bn}"
            except Exception as exc:  # noqa: BLE001 - a probe: report why
                why.append(f"{an}, {bn}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
    return None, "; ".join(sorted(set(w.split(": ", 1)[1] for w in why)))


def main() -> None:
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=3, iters=30, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    print(f"read {read:.0f} GB/s, torch {torch.__version__}", flush=True)
    for n, k in SHAPES:
        w = torch.randn((n, k), device=dev, dtype=torch.bfloat16)
        x = torch.randn((1, k), device=dev, dtype=torch.bfloat16)
        nb = n * k + 2 * k + 2 * n
        copies = ld.rotating_copies(n * k, dev)
        fb, ft = lp.quantize_fp8(w, True), lp.quantize_fp8(w, False)
        ref = x.float() @ lp.dequantize_fp8(fb).t()
        forms = {}
        for c in BLOCK:
            g = lp.DenseGemv(fb, 1, dev, c)
            err = max(nv.relative_error(g(x), ref) for _ in range(2))
            print(f"check {n}x{k} block {c.name}: rel err {err:.2e} {'ok' if err < 2e-2 else 'FAILED'}", flush=True)
            forms[f"block {c.name}"] = (fb, c)
        forms["tensor BN=8,BK=2048,w=4"] = (ft, lp.DENSE_CONFIGS[0])
        forms["tensor BN=4,BK=2048,w=4"] = (ft, lp.DENSE_CONFIGS[2])
        bld = {}
        for name, (f, c) in forms.items():
            fs = [f] + [lp.Fp8Weight(f.data.clone(), f.scales.clone(), f.block) for _ in range(copies - 1)]
            bld[name] = lambda fs=fs, c=c: [(lambda g=g: g(x)) for g in [lp.DenseGemv(ff, 1, dev, c) for ff in fs]]
        w8s = [w.to(torch.float8_e4m3fn) for _ in range(copies)]
        for mm in (1, 16) if "--scaled-mm" in sys.argv else ():
            make, how = scaled_mm_block(x.expand(mm, k).contiguous(), w)
            label = f"_scaled_mm blocks M={mm} ({how if make else 'unavailable'})"
            if make is not None:
                bld[label] = lambda make=make: [make(w8) for w8 in w8s]
            else:
                print(f"{n}x{k} {label}: {how}", flush=True)
        _, _, times = ld.best_of(env, bld, nb)
        for name, us in times.items():
            us = us if us is not None else ld.RESULTS["errors"].get(name, "error")
            fr = f"{nb / (us * 1e-6) / (read * 1e9):.2f} r" if isinstance(us, float) else ""
            print(f"{n:>6}x{k:<6} {name:<60} {us if isinstance(us, str) else f'{us:7.2f} us'} {fr}", flush=True)
        w = fb = ft = w8s = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
