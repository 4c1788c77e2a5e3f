"""nccl-tests' `all_reduce_perf`: run it where it is on the PATH and parse its table into allreduce.csv rows."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

# --------------------------------------------------------------------------- nccl-tests


def parse_nccl_tests(text: str, world: int) -> list[dict[str, Any]]:
    """Rows of `all_reduce_perf` output (out-of-place and in-place columns) in this module's schema."""
    rows = []
    for line in text.splitlines():
        tok = line.split()
        if len(tok) < 12 or line.lstrip().startswith("#") or not tok[0].isdigit():
            continue
        has_root = len(tok) >= 13
        head = 5 if has_root else 4
        size, count, type_name, redop = int(tok[0]), int(tok[1]), tok[2], tok[3]
        root = int(tok[4]) if has_root else -1
        for placement, off in (("out-of-place", head), ("in-place", head + 4)):
            try:
                t, alg, bus = float(tok[off]), float(tok[off + 1]), float(tok[off + 2])
            except (ValueError, IndexError):
                continue
            wrong_tok = tok[off + 3] if off + 3 < len(tok) else "N/A"
            rows.append({
                "size": size, "count": count, "type": type_name, "redop": redop, "root": root, "time_us": t,
                "algbw": alg, "busbw": bus, "wrong": int(wrong_tok) if wrong_tok.isdigit() else None,
                "mode": "eager", "placement": placement, "world_size": world, "backend": "nccl",
                "source": "nccl-tests", "time_min_us": None, "time_p99_us": None, "iters": None, "model_size": False,
            })
    return rows


def run_nccl_tests(world: int, min_bytes: int, max_bytes: int, warmup: int, iters: int, timeout_s: float,
                   binary: str | None = None) -> tuple[list[dict[str, Any]], dict[str, str] | None]:
    exe = binary or shutil.which("all_reduce_perf")
    if not exe:
        return [], {"case": "nccl-tests", "reason": "all_reduce_perf (nccl-tests) is not on the PATH"}
    cmd = [exe, "-b", str(min_bytes), "-e", str(max_bytes), "-f", "2", "-g", str(world), "-d", "bfloat16",
           "-w", str(warmup), "-n", str(iters), "-c", "1"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [], {"case": "nccl-tests", "reason": f"{' '.join(cmd)} did not finish within {timeout_s:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return [], {"case": "nccl-tests", "reason": f"all_reduce_perf exited {proc.returncode}: {tail[0][:200]}"}
    rows = parse_nccl_tests(proc.stdout, world)
    if not rows:
        return [], {"case": "nccl-tests", "reason": "all_reduce_perf printed no result rows"}
    return rows, None
