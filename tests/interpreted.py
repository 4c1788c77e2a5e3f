"""Run a snippet of Python under Triton's CPU interpreter, in a subprocess (the interpreter is chosen when Triton is
imported, so it cannot be switched on inside the test process): the snippet prints "ok" when its checks pass."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_interpreted(code: str, timeout: int = 900) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]
