"""Probe (H200): the fp8 weight-only tensor-core GEMV (kernels/fp8mma.py) at M = 2-16 against what runs there now:
per-tensor `torch._scaled_mm` on a quantised x, and for 128x128 block scales kernels/fp8block.py (x quantised 1x128
in the call, then cuBLAS's blockwise `_scaled_mm`); beside a plain read of the fp8 bytes.

    PYTHONPATH=workflow python3 benchmarks/device/fp8mma_probe.py [M,M...] [NxK,NxK...] [form,form...]

Per shape, scale kind and M: each form checked against dequantise-then-matmul (relative to the largest output, 2e-2),
then us a call in CUDA-graph replay over rotating weight copies (lowprec_device.gpu_us), the fraction of read
bandwidth on the fp8 bytes and the time over the plain read's.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

import lowprec_device as ld  # noqa: E402
from decode_gap.kernels import fp8block  # noqa: E402
from decode_gap.kernels import fp8mma as fm  # noqa: E402
from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.microbench import memory  # noqa: E402
from decode_gap.microbench.common import BenchEnv  # noqa: E402
from decode_gap.microbench.timing import rotating_copies  # noqa: E402

# DeepSeek-V3 (block scales): fused_qkv_a, o_proj TP8, dense gate_up, dense down, q_b, TP8 gate_up; Llama-3.1-8B
# (per-tensor): qkv, o_proj, gate_up, down
BLOCK_SHAPES = [(2112, 7168), (7168, 2048), (36864, 7168), (7168, 18432), (24576, 1536), (4608, 7168)]
# the plan, then variants: the split doubled and halved, x of a step loaded before its own MMA, x rows past M read
# as row M-1 or masked (whichever the plan does not)
FORMS = [("plan", {}), ("split x2", {"split": 2}), ("split /2", {"split": 0.5}), ("x in place", {"x_ahead": False}),
         ("x clamped", {"xclamp": True}), ("x masked", {"xclamp": False})]
TENSOR_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


def main() -> None:
    dev = torch.device("cuda")
    ms = [int(v) for v in sys.argv[1].split(",")] if sys.argv[1:] else [1, 4, 8, 16]
    only = {tuple(int(v) for v in nk.split("x")) for nk in sys.argv[2].split(",")} if sys.argv[2:] else None
    forms = [f for f in FORMS if f[0] in sys.argv[3].split(",")] if sys.argv[3:] else FORMS
    env = BenchEnv(device=dev, warmup=3, iters=40, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    print(f"read {read:.0f} GB/s", flush=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    cases = [(s, True) for s in BLOCK_SHAPES] + [(s, False) for s in TENSOR_SHAPES]
    for (n, k), block in cases:
        if only and (n, k) not in only:
            continue
        w = lp.quantize_fp8(torch.randn((n, k), generator=gen, device=dev) * 0.02, block=block)
        copies = rotating_copies(n * k, dev)
        ws = [w] + [lp.Fp8Weight(w.data.clone(), w.scales.clone(), block) for _ in range(copies - 1)]
        nbytes = n * k + 4 * w.scales.numel()
        plain = ld.plain_read_us(env, nbytes)
        for m in ms:
            x = torch.randn((m, k), generator=gen, device=dev).to(torch.bfloat16)
            ref = x.float() @ lp.dequantize_fp8(w).t()
            tol = 2e-2 * ref.abs().max().item()
            rows = {}
            for form, kw in forms:
                kw = dict(kw)
                if "split" in kw:  # a factor on the form's own plan
                    base = fm.Fp8MmaGemv(w, m, dev, **{a: v for a, v in kw.items() if a != "split"}).split
                    kw["split"] = max(1, round(base * kw["split"]))
                try:
                    gs = [fm.Fp8MmaGemv(v, m, dev, **kw) for v in ws]
                    err = max((gs[0](x).float() - ref).abs().max().item() for _ in range(2))
                    c = gs[0].compiled
                    name = f"tc {form} split={gs[0].split} ({c.n_regs} regs, {c.n_spills} spills)"
                    if err > tol:
                        rows[name] = f"check failed ({err:.3g} > {tol:.3g})"
                        continue
                    rows[name] = ld.gpu_us([lambda g=g: g(x) for g in gs], env)
                except Exception as exc:  # a form that does not compile or run here: say so, time the rest
                    rows[form] = f"{type(exc).__name__}: {str(exc)[:300]}"
            if m == 1:
                gs = [lp.DenseGemv(v, 1, dev) for v in ws]
                rows[f"cuda-core gemv {gs[0].cfg.name}"] = ld.gpu_us([lambda g=g: g(x) for g in gs], env)
            if block and m > 1 and not fp8block.refusal(n, k):
                mms = [fp8block.BlockScaledMm(v, m, dev) for v in ws]
                err = (mms[0](x).float() - mms[0].reference(x).float()).abs().max().item()
                rows[f"cublas block (quantise x in the call; err {err:.2g})"] = ld.gpu_us(
                    [lambda mm=mm: mm(x) for mm in mms], env)
            one = torch.ones((), device=dev)
            xq = (x.float() / max(x.float().abs().max().item() / 448, 1e-12)).to(torch.float8_e4m3fn)
            rows["scaled_mm per-tensor (x quantised before)"] = ld.gpu_us(
                [lambda v=v: torch._scaled_mm(xq, v.data.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                 for v in ws], env)
            kind = "block" if block else "tensor"
            print(f"== {n}x{k} {kind} M={m}  plain read {plain:.2f} us ({nbytes / plain / 1e3 / read:.2f})", flush=True)
            for name, us in sorted(rows.items(), key=lambda kv: kv[1] if isinstance(kv[1], float) else 1e9):
                if isinstance(us, float):
                    print(f"   {us:8.2f} us  {nbytes / us / 1e3 / read:.2f} of read  {us / plain:.2f}x read  {name}")
                else:
                    print(f"   {name}: {us}")


if __name__ == "__main__":
    main()
