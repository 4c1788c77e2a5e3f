"""Device probe (H200): the MoE stage at M=1 (microbench.moe.run_moe_bench) on DeepSeek-V3 at TP8 and GLM-5 at TP8 and
TP1: its grouped GEMV and fused MoE rows, as the stage keeps them (the fastest form, the others in the note).

    PYTHONPATH=workflow python3 benchmarks/device/moe_m1_probe.py

What it found (2026-12-04, H200), us against a plain read of the selected experts' bytes: DeepSeek-V3 TP8 fp8-block
16.2 (12.3; the tensor-core form at 8 warps), fp8 16.6, nvfp4 grouped 15.4 (7.6; 25.9 with gate_up's split fixed at
2), nvfp4 fused 14.2; GLM-5 TP8 fp8-block 14.7 (11.0), nvfp4 grouped 14.4 (6.9; 22.0 before), fused 12.5; GLM-5
TP1 fp8-block 72.9 (69.0), fp8 76.7, nvfp4 grouped 51.6 (40.8), fused 50.5.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.microbench import moe, shapes  # noqa: E402
from decode_gap.microbench.common import BenchEnv  # noqa: E402
from decode_gap.model import load_model_card  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    env = BenchEnv(device=torch.device("cuda"), warmup=5, iters=30)
    for card, tp in (("deepseek-v3", 8), ("glm-5", 8), ("glm-5", 1)):
        spec = load_model_card(REPO / "config/models" / f"{card}.json")
        df, out = moe.run_moe_bench(env, shapes.moe_shape(spec, tp), [1], log=lambda s: None)
        for _, r in df[df.impl.isin(["grouped_gemv", "fused_moe"])].iterrows():
            print(card, f"TP{tp}", r["dtype"], r["impl"], round(r["gpu_us"], 1), round(r["plain_read_us"], 1),
                  round(r["frac_of_plain_read"], 2), r["kernels"], r["backend"][:95], "|", str(r["note"])[:160],
                  flush=True)
        print("skipped:", [s for s in out["skipped"] if "grouped" in s["case"] or "fused" in s["case"]])


if __name__ == "__main__":
    main()
