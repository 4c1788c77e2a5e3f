"""Device probe (H200): NVFP4 weight-only above 16 rows. Each form of kernels/fp4wide (checked against dequantise-then-
matmul first) beside the first weight-only kernel (nvfp4.WeightOnlyGemm v1, what M > 16 ran before), bf16 torch.mm on
the same shape, and a plain read of the NVFP4 bytes; CUDA-graph replay over rotating weight copies.

    PYTHONPATH=workflow python3 benchmarks/device/wide_probe.py [M,...] [NxK,...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.kernels import fp4wide  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402
from decode_gap.microbench.common import BenchEnv  # noqa: E402
from decode_gap.microbench.launch import PlainReads  # noqa: E402
from decode_gap.microbench.timing import rotating_copies, time_graph  # noqa: E402

FORMS = fp4wide.WIDE_CONFIGS  # the gemm stage's forms (add others here to try them beside these)
SHAPES = "28672x4096,4096x14336,6144x4096,36864x7168,7168x18432,24576x6144,2112x7168"


def clone(q: nv.NVFP4Tensor) -> nv.NVFP4Tensor:
    return nv.NVFP4Tensor(q.packed.clone(), q.block_scales.clone(), q.tensor_scale.clone(), q.shape)


def main() -> None:
    ms = [int(m) for m in sys.argv[1].split(",")] if len(sys.argv) > 1 else [17, 24, 32, 48, 64]
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[2] if len(sys.argv) > 2 else SHAPES).split(",")]
    dev = torch.device("cuda")
    env = BenchEnv(device=dev, warmup=5, iters=30)
    reads = PlainReads(env)
    torch.manual_seed(0)
    for n, k in shapes:
        w = torch.randn((n, k), device=dev, dtype=torch.bfloat16)
        q = nv.quantize_nvfp4(w)
        nb = nv.nvfp4_bytes(n, k)
        copies = rotating_copies(nb, dev)
        qs = [q] + [clone(q) for _ in range(copies - 1)]
        wb = [w] + [w.clone() for _ in range(rotating_copies(2 * n * k, dev) - 1)]
        for m in ms:
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            ref = nv.reference_mm(x, q)
            times = {}
            for cfg in FORMS:
                gs = [fp4wide.Nvfp4WideGemm(qq, m, dev, cfg) for qq in qs]
                err = max(nv.relative_error(gs[0](x).float(), ref) for _ in range(3))
                us = time_graph([lambda g=g: g(x) for g in gs], 3, 20, dev).median_us
                c = gs[0].compiled
                regs = f"{c.n_regs}r{'+' + str(c.n_spills) + 's' if c.n_spills else ''}"
                times[f"{cfg.name} split={gs[0].split} {regs} err={err:.1e}"] = us
                gs = None
            v1 = [nv.WeightOnlyGemm(qq, m, dev, variant="v1") for qq in qs]
            times["v1"] = time_graph([lambda g=g: g(x) for g in v1], 3, 20, dev).median_us
            v1 = None
            times["bf16 torch.mm"] = time_graph([lambda a=a: torch.mm(x, a.t()) for a in wb], 3, 20, dev).median_us
            plain = reads.columns(nb, 1.0).get("plain_read_us")
            best = min(v for key, v in times.items() if key not in ("v1", "bf16 torch.mm"))
            flop_tf = 2 * m * n * k / best / 1e6
            print(f"{n}x{k} M={m} plain read {plain:.1f} us | best wide {best:.1f} us ({plain / best:.2f} of read, "
                  f"{flop_tf:.0f} TFLOPS) | " + " | ".join(f"{key} {v:.1f}" for key, v in times.items()), flush=True)
        qs = wb = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
