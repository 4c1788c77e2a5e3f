"""The trace stage through the real Snakemake pipeline: a real trace, and bad input that leaves the DAG going."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "trace"
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    dst = tmp_path_factory.mktemp("trace") / "repo"
    shutil.copytree(REPO, dst, ignore=shutil.ignore_patterns(
        ".venv", "results", ".snakemake", ".git", ".whl", "__pycache__", ".pytest_cache", "devrun", "resources",
        "tests", "archive"))
    return dst


def _run(work: Path, trace: str, rev: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "trace", "--config", f"trace={trace}",
                           f"hardware_revision={rev}"], cwd=work, capture_output=True, text=True, timeout=600)
    out = work / "results" / rev / "trace.json"
    return proc, (json.loads(out.read_text()) if out.exists() else {})


def test_real_trace_directory(work):
    proc, res = _run(work, str(FIX / "tp2"), "t-ok")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert res["stage"] == "trace" and res["steps_used"] >= 3 and len(res["ranks"]) == 2
    csv = (work / "results" / "t-ok" / "trace_kernels.csv").read_text()
    assert "c10d::allreduce_" in csv


def test_truncated_trace_is_unavailable_and_the_dag_goes_on(work, tmp_path):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "cat": "kernel"'))
    proc, res = _run(work, str(bad), "t-bad")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert res["status"] == "skipped" and str(bad) in res["reason"] and "not valid JSON" in res["reason"]
    log = (work / "results" / "t-bad" / "logs" / "analyze_trace.log").read_text()
    assert log.strip().splitlines()[-1].startswith("trace: unavailable:")
