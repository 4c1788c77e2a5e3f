"""TP > 1 through the real pipeline: every rule plans at tp 1, 2 and 4, and the CPU pipeline runs at tp=2
(two gloo ranks inside the simulated step and the all-reduce benchmark) through to the report.

Ranks are started as importable modules (decode_gap.ranks), so a rank never re-runs a Snakemake script, whose
`snakemake` object exists only in the parent (the crash this guards against: NameError in every spawned rank).
"""

from __future__ import annotations

import json
import re

import pytest

from test_pipeline_e2e import _copy_repo, _run

pytestmark = pytest.mark.e2e

RULES_AT_TP = ("compute_roofline", "bench_allreduce", "simulate_kernel", "attribute_gap", "render_report")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return _copy_repo(tmp_path_factory.mktemp("tp") / "repo")


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_every_rule_plans_at_tp(work, tp):
    proc = _run(work, "--cores", "2", "report", "-n", "--configfile", "tests/e2e/small.yaml", "--config", f"tp={tp}",
                timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for rule in RULES_AT_TP:
        assert re.search(rf"\b{rule}\b", out), f"tp={tp}: {rule} not planned"


def test_tp2_pipeline_on_cpu_with_real_gloo_ranks(work):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (run setup.sh)")
    proc = _run(work, "--cores", "2", "report", "--configfile", "tests/e2e/small.yaml", "--config", "tp=2")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = next(p for p in (work / "results").iterdir() if p.is_dir())
    kernel = json.loads((res / "simulate" / "kernel.json").read_text())
    assert kernel["status"] == "ok", kernel.get("reason")
    assert kernel["world_size"] == 2
    assert kernel["allreduce"]["mode"] == "real" and kernel["allreduce"]["backend"] == "gloo"
    ar = [c for c in kernel["components"] if c["name"] == "all-reduce"]
    assert ar and ar[0]["status"] == "measured" and ar[0]["ms"] > 0
    allreduce = json.loads((res / "microbench" / "allreduce.json").read_text())
    assert allreduce["world_size"] == 2 and allreduce["backend"] == "gloo"
    roofline = json.loads((res / "roofline.json").read_text())
    assert roofline["tp"] == 2 and roofline["allreduces_per_token"] > 0
    assert (res / "report.pdf").stat().st_size > 10_000
    html = (res / "report.html").read_text(encoding="utf-8")
    assert "TP2" in html  # the header names the TP degree
