"""Trace analysis speed (issue 13 item 7): a 100 MB torch.profiler trace analyses in under 60 s on the 2-core CI host.

A benchmark, not a test: it synthesizes a Kineto-format GPU trace of the requested size (the test double in
tests/kineto_trace_double.py: per step, a decode_step annotation, one cpu_op + cudaLaunchKernel per kernel and the
kernels linked by correlation id, as eager torch writes them, wrapped in 3 Python-stack events as SGLang's
with_stack=True profile records them), times `analyze_path` on it, and prints the time and its ratio to the
target. It never fails on time.

    .venv/bin/python benchmarks/trace_speed.py              # 100 MB, plain JSON
    .venv/bin/python benchmarks/trace_speed.py --mb 20 --gz # smaller, gzipped
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "workflow"), str(REPO / "tests")]

import kineto_trace_double as kd  # noqa: E402
from decode_gap.trace.analyze import analyze_path  # noqa: E402

TARGET_S = 60.0


def synthesize(path: Path, mb: float) -> tuple[int, int, float]:
    """Write a trace of about `mb` MB of JSON; return (steps, events, JSON MB before any gzip)."""
    layer = kd.STEP_KERNELS[1:6]
    names = kd.STEP_KERNELS[:1] + layer * 32 + kd.STEP_KERNELS[6:]  # a 32-layer step, ~160 kernels
    one = kd.build(steps=1, names=names, python_stack=3)
    per_step = len(json.dumps(one["traceEvents"]).encode())
    steps = max(3, int(mb * 1e6 / per_step))
    data = kd.build(steps=steps, names=names, python_stack=3)
    kd.write(path, data)
    return steps, len(data["traceEvents"]), steps * per_step / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--gz", action="store_true", help="write the trace gzipped (.json.gz)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("big.json.gz" if args.gz else "big.json")
        t0 = time.perf_counter()
        steps, events, size = synthesize(path, args.mb)  # the target is about JSON size, gzipped or not
        print(f"synthesized {size:.1f} MB of JSON ({path.stat().st_size / 1e6:.1f} MB on disk, {events} events, "
              f"{steps} steps) in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        res, table = analyze_path(path)
        took = time.perf_counter() - t0
    print(f"analysed in {took:.1f} s: {res['steps_used']} steps, {res['kernels_per_step_median']} kernels/step, "
          f"step {res['step_ms_median']} ms, busy {res['gpu_busy_ms_median']} ms")
    print(f"target {TARGET_S:.0f} s for 100 MB; this run: {took:.1f} s for {size:.1f} MB "
          f"-> {took / TARGET_S * 100 / max(size, 1e-9):.2f} x the target scaled to 100 MB "
          f"({'within' if took * 100 / max(size, 1e-9) <= TARGET_S else 'OVER'} target)")


if __name__ == "__main__":
    main()
