"""Device probe: where the kernel level's decode step spends its time, kernel by kernel. Builds the step as
`simulate_kernel` does (a few layers of each kind), then for each component (attention, routed experts, norms, ...)
captures that component's ops as one CUDA graph, times its replays after an L2 flush, and profiles ten replays to
list its kernels, each with its mean GPU time a layer (the profiler's CUDA times; the graph's time less their sum
is what the gaps between kernels cost). It answers which small kernels a fusion would remove before one is written.
Kernels launched as programmatic dependents (the top-k's passes, the NVFP4 MoE's) start before the kernel ahead of
them ends and wait inside, so their times overlap: their sum can pass the graph's.

H200 (2026-12-05), GLM-5-NVFP4 TP8 at a 4096-token context, 1 row, a layer: attention 65.3 us in 15 launches, of
which the indexer's top-k (2048 of 4097, the multi-pass form: four count launches and one emit) overlapped for 41 us
of kernel time; the MLA decode 7.1 + 2.2 (combine), the indexer's scores 2.2, each fused prepare 1.5-1.6.
H100 80GB HBM3 (2026-12-07, --batch 16 --context 4096 --components attention): 82.7 us a layer (min 82.0, p99 84.9)
in 13 launches, kernels 76.1: the MLA decode 21.6 + 3.9 (combine), the top-k 20.7 (the one-program radix select with
its tail), the indexer's two NVFP4 projections (wq_b, wk) 8.1 with their two casts 2.3, its scores 5.4, its bf16
weights_proj 4.5 + 1.5 (cuBLAS split-K and its reduce), the W_UK batched GEMV 3.5, the two fused prepares 2.5 + 2.2.
So the attention stage's kernels (the scores, the top-k and the MLA decode) are 51.6 of the 82.7; the rest is the
indexer's projections and casts (16.3), the W_UK GEMV, the prepares and 6.6 us of gaps.

    PYTHONPATH=workflow python3 benchmarks/device/step_profile.py [--model glm-5.json] [--format nvfp4] [--tp 8]
        [--batch 1] [--context 512] [--layers 4] [--components attention,router] [--workflow DIR]

It reports; it asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def kernel_rows(graph, replays: int = 10) -> list[tuple[str, int, float]]:
    """(kernel name, launches a replay, mean µs a replay) of a captured graph, from the profiler's CUDA events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            total[ev.name] += ev.device_time
            count[ev.name] += 1
    return sorted(((n, count[n] // replays, total[n] / replays) for n in total), key=lambda r: -r[2])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="glm-5.json")
    ap.add_argument("--format", default="nvfp4")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--components", default="", help="comma-separated (default: all)")
    ap.add_argument("--workflow", type=Path, default=REPO / "workflow", help="the decode_gap package's parent")
    a = ap.parse_args()
    sys.path.insert(0, str(a.workflow.resolve()))
    import torch

    from decode_gap.model import load_model_card
    from decode_gap.simulate.formats import probe_formats
    from decode_gap.simulate.shapes import plan_layers, step_shapes
    from decode_gap.simulate.step import DecodeStep
    from decode_gap.simulate.timing import L2Flusher, spread, time_cuda
    from decode_gap.timing import capture_graph

    spec = load_model_card(REPO / "config" / "models" / a.model)
    device = "cuda:0"
    torch.manual_seed(0)
    shapes = step_shapes(spec, a.tp, 1, a.batch, a.context)
    fmt = probe_formats(a.format, device, a.batch)
    plan = plan_layers(shapes, a.layers, None)
    with torch.inference_mode():
        step = DecodeStep(shapes, plan, fmt, device, a.context, "greedy")
        step.runner(lambda op: True)()
        torch.cuda.synchronize()
        flusher = L2Flusher(device)
        wanted = [c for c in a.components.split(",") if c]
        names = list(dict.fromkeys(op.component for op in step.ops))
        print(f"{spec.name} {a.format} TP{a.tp}, {a.batch} row(s), {a.context}-token context, layers {plan}; "
              f"{torch.cuda.get_device_name()}; attention: {step.attention_impl}")
        for r in step.attn_picker.records if step.attn_picker else ():  # each candidate's time at build
            print(f"  picked {r['chosen']} for {r['shape']}: {r['us']}")
        for comp in names:
            if wanted and comp not in wanted:
                continue
            segs = {op.segment for op in step.ops if op.component == comp}
            layers = sum(plan.get(s, 1) for s in segs)  # "head" ops run once
            g = capture_graph([step.runner(lambda op, c=comp: op.component == c)])
            t = spread(time_cuda(g.replay, 3, 20, flusher))
            rows = kernel_rows(g)
            busy = sum(us for _, _, us in rows)
            med, lo, hi = (t[f"{k}_ms"] * 1e3 / layers for k in ("median", "min", "p99"))
            print(f"\n== {comp}: graph {med:.1f} us a layer (min {lo:.1f}, p99 {hi:.1f}; {layers} layer(s)), "
                  f"kernels {busy / layers:.1f} us, "
                  f"{sum(n for _, n, _ in rows) / layers:.1f} launches a layer")
            for name, n, us in rows:
                print(f"  {us / layers:7.2f} us  x{n / layers:4.1f}  {name[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
