"""Device probe (H200): the routed experts at M=1 in fp8, the grouped CUDA-core GEMV (lowprec.GroupedExperts, each
of its forms) against the grouped tensor-core GEMV (fp8mma.GroupedFp8Mma), per-expert and 128x128 block scales,
beside a plain read of the selected experts' bytes; every tensor-core form checked against the dequantised
reference first.

    PYTHONPATH=workflow python3 benchmarks/device/grouped_fp8_probe.py [TP,...] [warps,...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.kernels import fp8mma  # noqa: E402
from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402
from decode_gap.microbench import moe, shapes  # noqa: E402
from decode_gap.microbench.common import BenchEnv  # noqa: E402
from decode_gap.microbench.launch import PlainReads  # noqa: E402
from decode_gap.microbench.timing import L2Flusher  # noqa: E402
from decode_gap.model import load_model_card  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    tps = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1]
    warps = [int(w) for w in sys.argv[2].split(",")] if len(sys.argv) > 2 else [4]
    env = BenchEnv(device=torch.device("cuda"), warmup=5, iters=30)
    flush, reads = L2Flusher(env.device), PlainReads(env)
    for card in ("deepseek-v3", "glm-5"):
        spec = load_model_card(REPO / "config/models" / f"{card}.json")
        for tp in tps:
            shape = shapes.moe_shape(spec, tp)
            es = moe.ExpertSet(env, shape, 1)
            base = {"M": 1, "top_k": shape.top_k, "experts_hit": es.experts_hit, "rows": 1, "H": shape.hidden,
                    "I": shape.inter}
            for fmt in ("fp8", "fp8-block"):
                timed = []
                g = moe.grouped_gemv(es, fmt)
                for forms in lp.grouped_alternatives(g):
                    g.cfg13, g.cfg2 = forms
                    row = moe._time_row(env, flush, "x", "g", fmt, g.label, lambda: g(es.x), g.weight_bytes(), 0,
                                        base, [], lambda s: None)
                    timed.append((g.label[:70], row["gpu_us"] if row else None, g.weight_bytes()))
                g = None
                block = fmt == "fp8-block"
                q13, q2 = lp.quantize_fp8(es.w13, block), lp.quantize_fp8(es.w2, block)
                ids = torch.arange(es.experts_hit, dtype=torch.int32, device=env.device)
                for w in warps:
                    tc = fp8mma.GroupedFp8Mma(q13, q2, ids, es.row_weights, env.device, warps=w)
                    ref = lp.reference_experts(es.x, lp.dequantize_fp8(q13), lp.dequantize_fp8(q2), ids,
                                               es.row_weights)
                    err = max(nv.relative_error(tc(es.x).float(), ref) for _ in range(3))
                    row = moe._time_row(env, flush, "x", "g", fmt, tc.label, lambda: tc(es.x), tc.weight_bytes(), 0,
                                        base, [], lambda s: None)
                    timed.append((f"{tc.label[:90]} w={w} err={err:.1e}", row["gpu_us"] if row else None,
                                  tc.weight_bytes()))
                    tc = None
                q13 = q2 = None
                for label, us, nb in timed:
                    plain = reads.columns(nb, us or 1.0).get("plain_read_us")
                    frac = f"{plain / us:.2f}" if us and plain else "-"
                    print(f"{card} TP{tp} {fmt} {es.experts_hit} experts | {label} | "
                          f"{us if us is None else round(us, 1)} us | plain read {plain and round(plain, 1)} | {frac}",
                          flush=True)
            es = None
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
