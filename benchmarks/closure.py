#!/usr/bin/env python3
"""Closure: does the engine level plus the measured server-overhead model predict the live ITL?

Usage: benchmarks/closure.py RESULTS_DIR [--recompute]
  RESULTS_DIR is results/<hw-rev> of a finished run (gap.json, or the stage files with --recompute).

Prints the live ITL at concurrency 1, the engine level, the server-overhead model (completion loop + HTTP/SSE,
both measured without looking at the live stream), the predicted ITL, closure ratio = predicted / live and the
explained fraction = 1 - (|residual| + every inconsistent, negative step) / live. Targets (issue 5): closure within +-15 %, explained >= 85 %.
It only reports; nothing here is tuned to pass. Exit code 0 when both targets hold, 1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from decode_gap.gap import attribute_files  # noqa: E402
from decode_gap.io import read_json  # noqa: E402

STAGE_FILES = {
    "roofline": "roofline.json", "memory": "microbench/memory.json", "allreduce": "microbench/allreduce.json",
    "gemm": "microbench/gemm.json", "launch": "microbench/launch.json", "simulate": "simulate.json",
    "live": "live/summary.json", "audit": "audit.json",
}


def fmt(v, unit=" ms", digits=3):
    return "n/a" if v is None else f"{v:.{digits}f}{unit}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--recompute", action="store_true", help="rebuild the attribution from the stage files")
    args = ap.parse_args(argv)
    d = args.results
    if args.recompute or not (d / "gap.json").is_file():
        if not (d / "simulate.json").is_file():
            print(f"closure: {d}: neither gap.json nor simulate.json found", file=sys.stderr)
            return 2
        gap = attribute_files({k: d / v for k, v in STAGE_FILES.items()}, hardware_revision=d.name)
    else:
        gap = read_json(d / "gap.json")
    h = gap.get("headline") or {}
    w = {r["name"]: r for r in gap.get("waterfall") or []}
    loop = (w.get("server overhead: completion loop") or {}).get("ms")
    http = (w.get("server overhead: HTTP/SSE streaming") or {}).get("ms")
    closure, explained = gap.get("closure_ratio"), gap.get("explained_fraction")
    print(f"results            {d}")
    print(f"engine             {gap.get('engine')}")
    print(f"roofline           {fmt(gap.get('roofline_ms'))}")
    print(f"kernel level       {fmt(gap.get('kernel_ms'))}  (comparable: {(gap.get('levels') or {}).get('kernel_comparable')})")
    print(f"engine level       {fmt(gap.get('engine_ms'))}")
    print(f"server model       loop {fmt(loop)} + HTTP/SSE {fmt(http)}")
    print(f"predicted ITL      {fmt(gap.get('predicted_ms'))}")
    print(f"live ITL           {fmt(gap.get('live_itl_ms'))}  ({gap.get('live_itl_field')})")
    print(f"residual           {fmt(gap.get('residual_ms'))}")
    print(f"closure ratio      {fmt(closure, '', 3)}   (target 0.85 .. 1.15, basis: {h.get('closure_basis')})")
    print(f"explained fraction {fmt(explained, '', 3)}   (target >= 0.85)")
    print(f"efficiency         {fmt(h.get('efficiency'), '', 4)}   (roofline / live)")
    if (gap.get("measured_on") or {}).get("run"):
        print(f"measured on        {h.get('measured_on')}")
    for level, why in (gap.get("refused_levels") or {}).items():
        print(f"refused            {level}: {why}")
    if h.get("inconsistency_note"):
        print(f"inconsistent       {h['inconsistency_note']}")
    if h.get("unexplained_component"):
        print(f"unexplained        {h['unexplained_component']}")
    ok = (closure is not None and abs(closure - 1) <= 0.15 and explained is not None and explained >= 0.85
          and h.get("closure_basis") == "engine")
    print("CLOSURE", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
