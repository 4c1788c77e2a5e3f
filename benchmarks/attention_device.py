#!/usr/bin/env python3
"""Decode attention: torch's kernels against the kernel level's split-KV Triton kernels, per model and context.

Usage (from the repository root):
    PYTHONPATH=workflow python3 benchmarks/attention_device.py --out $OUT [--contexts 512,4096,32768] [--batches 1,8]
Runs the attention micro-benchmark (decode_gap.microbench.attention, as the pipeline's `microbench` stage does:
CUDA-graph replay after an L2 flush, min / median / p99) at each model's per-GPU heads, writes attention.csv, and
prints one line per case: the fastest torch backend, the Triton kernel, their ratio, and each one's fraction of the
measured copy bandwidth. On a CPU host only torch runs (a smoke test of the script). It reports; it asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

import pandas as pd  # noqa: E402

from decode_gap.io import write_table  # noqa: E402
from decode_gap.microbench import attention, memory, shapes  # noqa: E402
from decode_gap.microbench.common import BenchEnv, pick_device  # noqa: E402
from decode_gap.model import load_model_card  # noqa: E402

MODELS = "llama-3.1-8b:1,llama-3.1-70b:8,qwen3-30b-a3b:1,gemma-3-270m:1,deepseek-v3:8,glm-5:1"  # card:TP


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--contexts", default="512,4096,32768")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--models", default=MODELS, help="config/models cards with their TP, as card:tp,...")
    a = ap.parse_args()
    dev = pick_device()
    env = BenchEnv(device=dev, warmup=5, iters=30)
    env.copy_gbps = memory.measure_memory(env)["copy_gbps"]
    print(f"device {dev}, copy bandwidth {env.copy_gbps:.0f} GB/s", flush=True)
    contexts = [int(x) for x in a.contexts.split(",")]
    batches = [int(x) for x in a.batches.split(",")]
    frames = []
    for item in a.models.split(","):
        name, tp = item.split(":")[0], int(item.split(":")[1]) if ":" in item else 1
        shape = shapes.attention_shape(load_model_card(REPO / "config" / "models" / f"{name}.json"), tp=tp)
        df, summary = attention.run_attention_bench(env, shape, contexts, batches, log=lambda s: None)
        df.insert(0, "model", f"{name} TP{tp}")
        frames.append(df)
        for s in summary["skipped"]:
            print(f"  {name}: skipped {s['case']}: {s['reason']}")
    table = pd.concat(frames, ignore_index=True)
    a.out.mkdir(parents=True, exist_ok=True)
    write_table(a.out / "attention.csv", table)
    col = "gpu_us" if env.is_gpu else "eager_us"
    print("| model | case | B | L | torch best | us | frac | triton us | frac | torch / triton |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (model, case, b, length), g in table.groupby(["model", "name", "batch", "context_len"], sort=False):
        torch_rows = g[~g["backend"].str.startswith("triton")]
        tri = g[g["backend"].str.startswith("triton")]
        best = torch_rows.loc[torch_rows[col].idxmin()] if not torch_rows.empty else None
        t = tri.iloc[0] if not tri.empty else None
        cells = [model, case, str(b), str(length)]
        cells += [best["backend"], f"{best[col]:.1f}", f"{best['frac_of_copy_bw']:.2f}"] if best is not None \
            else ["-", "-", "-"]
        cells += [f"{t[col]:.1f}", f"{t['frac_of_copy_bw']:.2f}"] if t is not None else ["-", "-"]
        cells.append(f"{best[col] / t[col]:.2f}" if best is not None and t is not None else "-")
        print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
