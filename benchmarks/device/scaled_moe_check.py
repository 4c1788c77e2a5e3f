"""Device check (sm90): the moe stage's row-scaled fp8 experts (moe.scaled_grouped_fn, torch._scaled_grouped_mm with
a scale a row from nvfp4.quantize_e4m3_groups) against the same experts in bf16 (moe.grouped_fn), DeepSeek-V3's and
GLM-5's routed experts at M = 1, 4 and 16; prints the relative error (e4m3 keeps 3 mantissa bits: a few % is right,
NaN or ~1 is a broken scale).

    PYTHONPATH=workflow python3 benchmarks/device/scaled_moe_check.py
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
WORST = 0.08  # relative error past which the check fails


def main() -> int:
    env = BenchEnv(device=torch.device("cuda"), warmup=1, iters=1)
    failed = 0
    for card in ("deepseek-v3", "glm-5"):
        shape = shapes.moe_shape(load_model_card(REPO / "config/models" / f"{card}.json"), 8)
        for m in (1, 4, 16):
            es = moe.ExpertSet(env, shape, m)
            ref = moe.grouped_fn(es)().float()
            err = ((moe.scaled_grouped_fn(es)().float() - ref).norm() / ref.norm()).item()
            ok = err == err and err < WORST
            failed += not ok
            print(f"scaled moe {card} TP8 M={m} experts={es.experts_hit}: rel err {err:.4f} {'ok' if ok else 'FAIL'}")
    print(f"scaled moe checks: {'all passed' if not failed else f'{failed} FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
