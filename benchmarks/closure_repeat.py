#!/usr/bin/env python3
"""Back-to-back remeasurements of the default run's closure (issue 12): does the verdict hold run after run?

    python benchmarks/closure_repeat.py [N] [-- extra snakemake args]

Each round forces the levels the closure compares to be measured again (the live stage, the engine and kernel
levels, the HTTP calibration), then re-attributes the gap, and prints the closure ratio, the explained fraction,
the live ITL, the engine level and the CPU-contention step. Run it on a quiet host after one main job. It prints
ratios; it asserts nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORCE = ["measure_live", "simulate_engine", "simulate_kernel", "calibrate_server"]


def _gap_files() -> list[Path]:
    return sorted(REPO.glob("results/*/gap.json"), key=lambda p: p.stat().st_mtime)


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv and argv[0].isdigit() else 5
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    rows = []
    for i in range(1, n + 1):
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "all", "attribute_gap", "--forcerun",
                               *FORCE, *extra], cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"round {i}: snakemake failed:\n{proc.stderr[-2000:]}")
            return 1
        gap = json.loads(_gap_files()[-1].read_text())
        h = gap["headline"]
        step = {r["name"]: r for r in gap["waterfall"]}
        cont = step.get("CPU contention: the engine under live load", {}).get("ms")
        rows.append((i, h["closure_ratio"], h["explained_fraction"], gap["live_itl_ms"], gap.get("engine_ms"), cont,
                     h["closure_pass"], time.time() - t0))
        r = rows[-1]
        print(f"round {i}: closure {r[1]:.3f}  explained {r[2]:.3f}  live ITL {r[3]:.2f} ms  engine {r[4]:.2f} ms  "
              f"contention {'—' if r[5] is None else f'{r[5]:.2f} ms'}  {'PASS' if r[6] else 'FAIL'}  ({r[7]:.0f} s)",
              flush=True)
    passed = sum(1 for r in rows if r[6])
    print(f"{passed} of {len(rows)} rounds pass (closure within ±15%, at least 85% explained)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
