"""Device probe (H200): the split-K sums' cast (lowprec.cast_zero: out = acc cast, acc left at zero) called many times,
alone and behind fp4wide's split GEMM on the shapes where it read zeros (x row 16 at M=17, the grid's last tile
groups), counting calls whose output differs from the reference. It found the race lowprec._zero_loaded closes.

    PYTHONPATH=workflow python3 benchmarks/device/cast_race_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.kernels import fp4wide  # noqa: E402
from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402


def main() -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    m, n = 17, 19360
    acc = torch.randn((m, n), device=dev)
    out = torch.empty((m, n), device=dev, dtype=torch.bfloat16)
    want = acc.to(torch.bfloat16)
    bad = 0
    for it in range(2000):
        a = acc.clone()
        lp.cast_zero(a, out, it % 2 == 0)  # with and without the programmatic-dependent launch
        bad += int(not torch.equal(out, want) or bool(a.abs().max() > 0))
    print(f"cast_zero alone: {bad} of 2000 calls wrong", flush=True)
    for n, k, m in [(19360, 2048, 17), (19360, 6144, 17), (28704, 4096, 17), (28672, 4096, 32)]:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
        ref = nv.reference_mm(x, q)
        g = fp4wide.Nvfp4WideGemm(q, m, dev)
        wrong = sum(int(((g(x).float() - ref).abs() > 0.05 * ref.abs().max()).any()) for _ in range(100))
        print(f"{n}x{k} M={m} wide gemm (split {g.split}): {wrong} of 100 calls wrong", flush=True)


if __name__ == "__main__":
    main()
