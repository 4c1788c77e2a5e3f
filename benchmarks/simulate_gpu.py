#!/usr/bin/env python3
"""GPU validation of the simulation levels (issue 5): kernel level eager vs one CUDA graph, engine level.

Usage: python3 benchmarks/simulate_gpu.py OUT_DIR [--budget-s 270] [--cases a,b] [--workflow DIR]
Runs, each in its own process with a time limit inside the budget, and writes one JSON each to OUT_DIR:
  kernel_llama1b.json     the random-weight ~1B Llama (config/models/llama-1b-random.json), bf16, TP1, all layers
  engine_llama1b.json     transformers on the same card: generate() eager vs static cache + torch.compile
  kernel_dsv3_tp8.json    DeepSeek-V3 per-GPU shapes of a TP8 deployment, fp8, on one GPU (all-reduce not run)
  kernel_glm5_tp1.json    GLM-5 (MLA + DSA indexer + 256 experts), fp8, TP1, layers that fit, scaled
  kernel_llama8b_fp8.json Llama-3.1-8B, fp8, TP1 (only with --cases; kernel_llama8b_fp8_b8: 8 rows a step,
                          kernel_llama8b_fp8_32k: a 32768-token context; also kernel_llama70b_tp8 and
                          kernel_qwen3_moe_fp8, GQA with qk-norm and 128 experts; kernel_glm5_tp1_4k / _32k: GLM-5
                          at 4096 / 32768 tokens, where its indexer keeps 2048 of them; kernel_dsv3_tp8_block_b8 /
                          _fp8_b8: DeepSeek-V3 TP8 at 8 rows a step, fp8-block / fp8; kernel_glm5_tp8_nvfp4 / _b8:
                          the seeds' GLM-5-NVFP4 TP8 per-GPU shapes at 1 and 8 rows a step (_4k: at 4096
                          tokens, the indexer's top-k on the path); kernel_glm5_tp1_nvfp4:
                          GLM-5-NVFP4 at TP1, layers that fit, scaled; kernel_glm5_tp8_nvfp4_b12 / _b32 and
                          kernel_llama8b_nvfp4_b32: NVFP4 at 12 / 32 rows a step)
The kernel cases run a 512-token context unless named otherwise.
--cases picks cases by name; --workflow imports decode_gap from another checkout's workflow/ (e.g. `git archive` of
an older commit) to time the kernel level before and after a change on the same machine.
Prints a table of eager / graph / launch overhead per case. It reports; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = [
    ("kernel_llama1b", "kernel", dict(model="llama-1b-random.json", weight_format="bf16", tp=1), 70),
    ("engine_llama1b", "engine", dict(model="llama-1b-random.json", weight_format="bf16"), 150),
    ("kernel_dsv3_tp8", "kernel", dict(model="deepseek-v3.json", weight_format="fp8", tp=8, ranks=1), 90),
    ("kernel_glm5_tp1", "kernel", dict(model="glm-5.json", weight_format="fp8", tp=1), 90),
]
EXTRA = [("kernel_llama8b_fp8", "kernel", dict(model="llama-3.1-8b.json", weight_format="fp8", tp=1), 70),
         ("kernel_llama8b_fp8_b8", "kernel", dict(model="llama-3.1-8b.json", weight_format="fp8", tp=1, batch=8), 70),
         ("kernel_llama8b_fp8_32k", "kernel",
          dict(model="llama-3.1-8b.json", weight_format="fp8", tp=1, context_len=32768), 70),
         ("kernel_llama70b_tp8", "kernel", dict(model="llama-3.1-70b.json", weight_format="fp8", tp=8, ranks=1), 90),
         ("kernel_qwen3_moe_fp8", "kernel", dict(model="qwen3-30b-a3b.json", weight_format="fp8", tp=1), 90),
         ("kernel_glm5_tp1_4k", "kernel", dict(model="glm-5.json", weight_format="fp8", tp=1, context_len=4096), 120),
         ("kernel_glm5_tp1_32k", "kernel", dict(model="glm-5.json", weight_format="fp8", tp=1, context_len=32768), 120),
         ("kernel_dsv3_tp8_block", "kernel", dict(model="deepseek-v3.json", weight_format="fp8-block", tp=8, ranks=1),
          120),
         ("kernel_dsv3_tp8_block_b16", "kernel",
          dict(model="deepseek-v3.json", weight_format="fp8-block", tp=8, ranks=1, batch=16), 120),
         ("kernel_dsv3_tp8_block_b8", "kernel",
          dict(model="deepseek-v3.json", weight_format="fp8-block", tp=8, ranks=1, batch=8), 120),
         ("kernel_dsv3_tp8_fp8_b8", "kernel",
          dict(model="deepseek-v3.json", weight_format="fp8", tp=8, ranks=1, batch=8), 120),
         ("kernel_glm5_tp8_nvfp4", "kernel", dict(model="glm-5.json", weight_format="nvfp4", tp=8, ranks=1), 150),
         ("kernel_glm5_tp8_nvfp4_b8", "kernel",
          dict(model="glm-5.json", weight_format="nvfp4", tp=8, ranks=1, batch=8), 150),
         ("kernel_glm5_tp1_nvfp4", "kernel", dict(model="glm-5.json", weight_format="nvfp4", tp=1), 150),
         # the same at a 4096-token context, where DSA's indexer keeps 2048 of its 4097 rows (the top-k on the path)
         ("kernel_glm5_tp8_nvfp4_4k", "kernel",
          dict(model="glm-5.json", weight_format="nvfp4", tp=8, ranks=1, context_len=4096), 150),
         # NVFP4 at 12 rows a step: the linears through the M = 9-16 plan (lowprec._m16_plan: tile pairs, the ring)
         ("kernel_glm5_tp8_nvfp4_b12", "kernel",
          dict(model="glm-5.json", weight_format="nvfp4", tp=8, ranks=1, batch=12), 150),
         # NVFP4 above 16 rows a step: the linears through kernels/fp4wide
         ("kernel_glm5_tp8_nvfp4_b32", "kernel",
          dict(model="glm-5.json", weight_format="nvfp4", tp=8, ranks=1, batch=32), 150),
         ("kernel_llama8b_nvfp4_b32", "kernel", dict(model="llama-3.1-8b.json", weight_format="nvfp4", tp=1, batch=32),
          90)]


def child(kind: str, args: dict, out: str, workflow: Path) -> None:
    sys.path.insert(0, str(workflow))
    from decode_gap.io import write_json
    from decode_gap.model import load_model_card

    card = REPO / "config" / "models" / args["model"]
    if kind == "kernel":
        from decode_gap.simulate.kernel import KernelSettings, simulate_kernel

        s = KernelSettings(tp=args["tp"], weight_format=args["weight_format"], context_len=args.get("context_len", 512),
                           layers="auto",
                           ranks=args.get("ranks"), warmup=3, iters=20, batch=args.get("batch", 1))
        write_json(out, simulate_kernel(load_model_card(card), s))
    else:
        from decode_gap.simulate.engine import EngineSettings, simulate_engine

        s = EngineSettings(engine="transformers", model_card=str(card), weight_format=args["weight_format"],
                           input_len=32, max_tokens=64, repeats=3, warmup=1)
        write_json(out, simulate_engine(s))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget-s", type=float, default=270.0)
    ap.add_argument("--cases", default="", help="comma-separated case names (default: the four above)")
    ap.add_argument("--workflow", type=Path, default=REPO / "workflow", help="the decode_gap package's parent")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "ARGS", "OUT"))
    a = ap.parse_args()
    if a.child:
        child(a.child[0], json.loads(a.child[1]), a.child[2], a.workflow.resolve())
        return 0
    wanted = [c for c in a.cases.split(",") if c]
    cases = [c for c in CASES + EXTRA if c[0] in wanted] if wanted else CASES
    unknown = sorted(set(wanted) - {c[0] for c in cases})
    if unknown:
        print(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(c[0] for c in CASES + EXTRA)}")
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + a.budget_s
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name, kind, args, limit in cases:
        left = deadline - time.monotonic()
        if left < 20:
            print(f"{name}: skipped, {left:.0f} s of the budget left", flush=True)
            continue
        out = a.out / f"{name}.json"
        t0 = time.monotonic()
        try:
            p = subprocess.run([sys.executable, __file__, str(a.out), "--workflow", str(a.workflow), "--child", kind,
                                json.dumps(args), str(out)],
                               env=env, timeout=min(limit, left - 5), capture_output=True, text=True)
            tail = (p.stderr or "").strip().splitlines()[-3:]
            status = "ok" if p.returncode == 0 else f"rc={p.returncode}: {' | '.join(tail)}"
        except subprocess.TimeoutExpired:
            status = "timed out"
        print(f"{name}: {status} in {time.monotonic() - t0:.0f} s", flush=True)
        if out.is_file():
            r = json.loads(out.read_text())
            keys = ("eager_ms", "graph_ms", "launch_overhead_ms", "layers_simulated", "layers_total", "scale",
                    "moe_backend", "format_match", "backend", "graph_reason", "forward_ms", "generate_overhead_ms",
                    "device")
            print(json.dumps({k: r.get(k) for k in keys if k in r}), flush=True)
            if kind == "kernel":
                print("  components:", ", ".join(f"{c['name']}={c['ms']:.3f}" for c in r.get("components", [])
                                                   if c.get("ms") is not None), flush=True)
                for ch in r.get("kernel_choices", []):
                    print(f"  {ch['shape']}: {ch['chosen']} " + " ".join(f"{k}={v}" for k, v in ch["us"].items()),
                          flush=True)
            else:
                for run in r.get("runs", []):
                    print("  graph_compile_s:", run.get("graph_compile_s"), "eager:", run.get("eager"),
                          "graph:", run.get("graph"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
