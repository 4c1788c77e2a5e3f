"""The import contracts of docs/architecture.md (pyproject's [tool.importlinter]) hold: stages are independent,
the report imports no stage, and the package never imports snakemake."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "importlinter.cli"]
    # workflow/ first on the path, so the contracts check this checkout's package, not an installed copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "workflow"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([*cmd, "--no-cache", str(ROOT / "pyproject.toml")], cwd=ROOT / "workflow", env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
