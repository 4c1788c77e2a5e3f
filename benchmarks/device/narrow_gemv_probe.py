"""Probe (H100/H200): bf16 GEMVs at M=1 on narrow shapes (a MoE router, the DSA indexer's head weights), our
CUDA-core GEMV (lowprec.DenseGemv) at its default block and at shorter K blocks (more K splits, more programs)
against cuBLAS both ways round; each checked against an fp32 matmul. CUDA-graph replay over rotating weights
(median us).

    PYTHONPATH=workflow python3 benchmarks/device/narrow_gemv_probe.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.microbench.timing import rotating_copies, time_graph  # noqa: E402

dev = torch.device("cuda")
print(torch.cuda.get_device_name(dev))
for n, k in [(256, 6144), (32, 6144), (256, 7168), (64, 6144), (160, 5120), (1024, 6144)]:
    cells = []
    nc = rotating_copies(n * k * 2, dev)
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(nc)]
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x.float(), ws[0].float())
    cands = {"F.linear": [lambda w=w: torch.nn.functional.linear(x, w) for w in ws],
             "mm swapped": [lambda w=w: torch.mm(w, x.t()).t() for w in ws]}
    for cfg in [None, (8, 512, 4), (4, 512, 4), (8, 256, 4), (4, 1024, 4), (16, 512, 4), (8, 1024, 4), (2, 512, 2),
                (4, 256, 2)]:
        try:
            gs = [lp.DenseGemv(w, 1, dev, cfg=None if cfg is None else lp.GemvConfig(*cfg), out_dtype=torch.bfloat16)
                  for w in ws]
        except Exception as exc:  # noqa: BLE001 - a block this shape or GPU does not take: named in the line
            cells.append(f"{cfg}: {type(exc).__name__}")
            continue
        err = (gs[0](x).float() - ref).abs().max().item() / ref.abs().max().item()
        name = "default" if cfg is None else "x".join(map(str, cfg))
        cands[f"{name} split={gs[0].split}{'' if err < 1e-2 else ' WRONG'}"] = [lambda g=g: g(x) for g in gs]
    for name, fns in cands.items():
        us = time_graph(fns, 3, 30, dev).median_us
        cells.append(f"{name} {us:.2f}")
    print(f"{n}x{k}: " + " | ".join(cells), flush=True)
