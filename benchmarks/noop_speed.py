"""No-op speed (issue 6 item 5): how long `snakemake --cores all report` takes when nothing changed.

Target: under 3 s on a 2-core machine. This is a benchmark, not a test: it prints the figures and the ratio
to the target and never fails on time.

    .venv/bin/python benchmarks/noop_speed.py                  # in the repository, after a complete run
    .venv/bin/python benchmarks/noop_speed.py --directory DIR  # another working directory with a complete run
    .venv/bin/python benchmarks/noop_speed.py --repeat 5 -- --configfile tests/e2e/small.yaml

It first checks with a dry run that nothing is planned (else it says so and stops: time a no-op, not a run),
then runs the real command `--repeat` times and reports min / median / max wall time, plus the import time of
snakemake itself and the time to build the DAG (`--dry-run`), which bound what a no-op can cost.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TARGET_S = 3.0
REPO = Path(__file__).resolve().parents[1]


def _time(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return time.perf_counter() - t0, proc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--directory", type=Path, default=REPO, help="working directory with a complete run")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("extra", nargs="*", help="extra snakemake arguments (after --)")
    args = ap.parse_args(argv)
    snake = [sys.executable, "-m", "snakemake"]
    base = [*snake, "--cores", "all", "report", *args.extra]
    if args.directory.resolve() != REPO:
        base += ["--snakefile", str(REPO / "Snakefile"), "--directory", str(args.directory)]

    dry_s, proc = _time([*base, "--dry-run"], args.directory)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        print(out[-2000:])
        print("noop_speed: the dry run failed; fix the pipeline first")
        return 1
    if "Nothing to be done" not in out:
        print(out[-2000:])
        print("noop_speed: jobs are planned, so this is not a no-op; run `snakemake --cores all report` first")
        return 1

    imp_s, _ = _time([sys.executable, "-c", "import snakemake.api, snakemake.workflow"], args.directory)
    times = []
    for _ in range(max(1, args.repeat)):
        t, proc = _time(base, args.directory)
        if proc.returncode != 0:
            print((proc.stdout + proc.stderr)[-2000:])
            return 1
        times.append(t)
    arr = np.asarray(times)
    med = float(np.median(arr))
    print(f"no-op `snakemake --cores all report` in {args.directory} on {os.cpu_count()} cores, {len(times)} runs:")
    print(f"  wall time   min {arr.min():.2f} s   median {med:.2f} s   max {arr.max():.2f} s")
    print(f"  dry run (DAG build) {dry_s:.2f} s; importing snakemake alone {imp_s:.2f} s")
    print(f"  ratio to the {TARGET_S:.0f} s target: {med / TARGET_S:.2f}  ({'met' if med < TARGET_S else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
