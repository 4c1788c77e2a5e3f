"""Probe (H200): torch._scaled_mm with DeepSeek-style block scales (x: 1x128 per token, W: 128x128) at decode sizes:
does cuBLAS take M = 1..16, how close is it to dequantise-then-matmul, and its time beside per-tensor _scaled_mm and
our block-scaled GEMV (CUDA-graph replay, median us).

    PYTHONPATH=workflow python3 benchmarks/device/blockmm_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels.fp8block import quantize_act_reference as act_quant  # noqa: E402  (torch ops: timed as such)
from decode_gap.microbench.timing import time_graph  # noqa: E402


def main() -> None:
    dev = torch.device("cuda")
    print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
    for n, k in ((2112, 7168), (24576, 1536), (7168, 2048), (36864, 7168), (7168, 18432), (4096, 512)):
        w = lp.quantize_fp8(torch.randn(n, k, device=dev) * 0.02, block=True)
        kb = k // 128
        l4 = -(-kb // 4) * 4
        sw = torch.zeros((w.scales.shape[0], l4), device=dev)
        sw[:, :kb] = w.scales
        sb = sw.t()  # [L4, N/128], stride (1, L4)
        for m in (1, 2, 4, 8, 16, 64):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            xq, sx = act_quant(x)
            sa = sx.t().contiguous().t()
            ref = (xq.float() * sx.repeat_interleave(128, -1)) @ lp.dequantize_fp8(w).t()
            try:
                y = torch._scaled_mm(xq, w.data.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
                err = ((y.float() - ref).norm() / ref.norm()).item()
                us = time_graph([lambda: torch._scaled_mm(xq, w.data.t(), scale_a=sa, scale_b=sb,
                                                          out_dtype=torch.bfloat16)], 3, 20, dev).median_us
            except Exception as exc:
                print(f"{n}x{k} M={m}: block _scaled_mm {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            one = torch.ones((), device=dev)
            pt = time_graph([lambda: torch._scaled_mm(xq, w.data.t(), scale_a=one, scale_b=one,
                                                      out_dtype=torch.bfloat16)], 3, 20, dev).median_us
            quant = time_graph([lambda: act_quant(x)], 3, 20, dev).median_us
            gv = ""
            if m <= 16:
                g = lp.DenseGemv(w, m, dev)
                gerr = ((g(x).float() - x.float() @ lp.dequantize_fp8(w).t()).norm() / ref.norm()).item()
                gv = f", our gemv {time_graph([lambda: g(x)], 3, 20, dev).median_us:.1f} (err {gerr:.1e})"
            print(f"{n}x{k} M={m}: block {us:.1f} us err {err:.1e}, per-tensor {pt:.1f}, torch act quant {quant:.1f}{gv}",
                  flush=True)


if __name__ == "__main__":
    main()
