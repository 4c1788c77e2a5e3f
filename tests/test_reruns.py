"""Reruns that follow system changes: change one fingerprint component at a time (DECODE_GAP_FP_<COMPONENT>)
and assert, through Snakemake's dry run, exactly which rules it plans. Then a real rerun archives a second run,
its report says what changed, and the `compare` target renders the two archived runs.

Runs the real Snakemake on a temporary copy of the repository. Test double: the stage scripts other than the
report's (render_report, archive_report, compare_runs) are replaced by tests/stub_stage.py's skipped-summary writer,
because what is under test is the DAG's rerun planning, which depends on the rules' params and inputs only, not
on what the stages compute (that is tested by each stage's own tests and by test_pipeline_e2e.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from decode_gap.fingerprint import COMPONENTS, ENV_PREFIX, STAGE_COMPONENTS

REPO = Path(__file__).resolve().parents[1]
HWREV = "rerun-test"
OWN_SCRIPTS = {"render_report.py", "archive_report.py", "compare_runs.py"}
STUB_SOURCE = (Path(__file__).with_name("stub_stage.py")).read_text()  # the test double, pasted into each script
CONFIG = ["--config", "endpoint=http://127.0.0.1:9/v1", "weight_format=bf16", "hardware=cpu",
          f"hardware_revision={HWREV}"]
BASE_FP = {"kernel": "6.8.12-4-pve", "driver": "570.124.06", "cuda": "12.8", "torch": "2.11.0", "nccl": "2.26.2",
           "governor": "schedutil", "tunables": "numa_balancing=1", "pcie": "0000:18:00.0:32.0GT/sx16:mrr=512:mps=256",
           "gpu": "gpu0:pm=0,pl_w=600,app_sm_mhz=1980", "server": "http://127.0.0.1:9/v1|model="}

# Every rule of the workflow, by the fingerprint part its params carry ("" = none; "*" = the whole fingerprint).
RULE_STAGE = {
    "collect_audit": "audit",
    "compute_roofline": "roofline",
    "measure_memory": "microbench", "bench_allreduce": "microbench", "bench_gemm": "microbench",
    "bench_moe": "microbench", "bench_attention": "microbench", "bench_launch": "microbench",
    "simulate_kernel": "simulate", "simulate_engine": "simulate", "calibrate_server": "simulate",
    "record_engine_trace": "simulate",
    "measure_live": "live",
    "merge_simulation": "", "attribute_gap": "*", "assemble_gguf": "", "analyze_trace": "", "trace": "",
    "record_engine_trace": "",  # opt-in (simulate.engine_trace): not in this DAG
    "render_report": "*", "archive_report": "*", "compare_runs": "",
    # targets
    "all": "", "audit": "", "roofline": "", "microbench": "", "simulate": "", "live": "", "report": "", "compare": "",
}
# Rules that only consume other rules' outputs: they run again whenever an input is rebuilt.
DOWNSTREAM = {
    "merge_simulation": {"simulate_kernel", "simulate_engine", "calibrate_server"},
    "simulate_kernel": {"bench_allreduce"},
    "bench_gemm": {"measure_memory"},
    "attribute_gap": {"compute_roofline", "measure_memory", "bench_allreduce", "bench_gemm", "bench_moe", "bench_launch",
                      "merge_simulation", "measure_live", "collect_audit"},
    "report": {"render_report", "archive_report"},
}

pytestmark = pytest.mark.e2e


def _snakemake(work: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 900):
    full = {**os.environ, **{ENV_PREFIX + k.upper(): v for k, v in BASE_FP.items()}, **(env or {})}
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=work, env=full, capture_output=True,
                          text=True, timeout=timeout)


def _planned(work: Path, env: dict[str, str] | None = None) -> set[str]:
    proc = _snakemake(work, "--dry-run", "--cores", "1", "report", *CONFIG, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    if "Nothing to be done" in out:
        return set()
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m.group(1) for m in re.finditer(r"^([a-z_][a-z0-9_]*)\s+\d+\s*$", table, re.M)}


def _expected(component: str, rules: set[str]) -> set[str]:
    direct = {r for r, st in RULE_STAGE.items() if r in rules and (
        st == "*" or (st and component in STAGE_COMPONENTS[st]))}
    # only rules that build `report` (assemble_gguf is not needed with an endpoint set, record_engine_trace only
    # with simulate.engine_trace on)
    wanted = set(direct)
    changed = True
    while changed:
        changed = False
        for rule, deps in DOWNSTREAM.items():
            if rule in rules and rule not in wanted and deps & wanted:
                wanted.add(rule)
                changed = True
    return wanted - {"assemble_gguf", "compare_runs", "record_engine_trace"}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    dst = tmp_path_factory.mktemp("reruns") / "repo"
    shutil.copytree(REPO, dst, ignore=shutil.ignore_patterns(
        ".venv", "results", ".snakemake", ".git", ".whl", "__pycache__", ".pytest_cache", "devrun", "resources",
        "tests"))
    shutil.rmtree(dst / "report" / "archive", ignore_errors=True)
    (dst / "report" / "archive").mkdir()
    for script in (dst / "workflow" / "scripts").glob("*.py"):
        if script.name not in OWN_SCRIPTS:
            script.write_text(STUB_SOURCE + "\n\nwrite_stub(snakemake)  # noqa: F821\n")
    proc = _snakemake(dst, "--cores", "2", "report", *CONFIG)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return dst


@pytest.fixture(scope="module")
def workflow_rules(work):
    proc = _snakemake(work, "--list-rules", *CONFIG)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rules = {ln.strip() for ln in proc.stdout.splitlines() if re.fullmatch(r"\s*[a-z_][a-z0-9_]*\s*", ln)}
    unknown = rules - set(RULE_STAGE)
    assert not unknown, f"new rule(s) {sorted(unknown)}: classify them in RULE_STAGE/DOWNSTREAM of {__file__}"
    return rules


def test_no_change_plans_nothing(work):
    assert _planned(work) == set()


@pytest.mark.parametrize("component", COMPONENTS)
def test_one_component_change_plans_exactly_the_affected_rules(work, workflow_rules, component):
    planned = _planned(work, {ENV_PREFIX + component.upper(): BASE_FP[component] + "-changed"})
    assert planned == _expected(component, workflow_rules)
    assert "compute_roofline" not in planned  # the roofline depends on model, hardware and config only
    assert {"collect_audit", "render_report", "archive_report"} <= planned


def test_kernel_change_plans_the_stages_the_issue_names(work, workflow_rules):
    planned = _planned(work, {ENV_PREFIX + "KERNEL": "6.14.11-2-pve"})
    must = {"collect_audit", "measure_memory", "bench_allreduce", "bench_gemm", "bench_moe", "bench_attention",
            "bench_launch", "simulate_kernel", "simulate_engine", "merge_simulation", "measure_live", "attribute_gap",
            "render_report", "archive_report"}
    assert must <= planned and "compute_roofline" not in planned


def test_report_code_change_rerenders_and_measures_nothing(work):
    """The report package's Python is an input of render_report, as its templates are: a change to how the result
    files are read re-renders the report (Snakemake's code trigger covers the rule's script only), and no stage
    measures again. Snakemake compares an input's checksum, not only its mtime, so the module gets a comment line
    for the dry run; its bytes and mtime are put back."""
    from decode_gap.report.sections import microbench

    src = Path(microbench.__file__)
    text, st = src.read_bytes(), src.stat()
    try:
        src.write_bytes(text + b"# test_reruns: a change to the report's code\n")
        assert _planned(work) == {"render_report", "archive_report", "report"}
    finally:
        src.write_bytes(text)
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _planned(work) == set()


def test_server_change_reruns_only_audit_live_and_after(work):
    planned = _planned(work, {ENV_PREFIX + "SERVER": "http://127.0.0.1:9/v1|model=other"})
    assert not {r for r in planned if r.startswith(("bench_", "simulate_", "measure_memory", "compute_"))}
    assert {"collect_audit", "measure_live", "attribute_gap", "render_report", "archive_report"} <= planned


def test_real_rerun_archives_second_run_and_reports_the_change(work):
    env = {ENV_PREFIX + "KERNEL": "6.14.11-2-pve"}
    proc = _snakemake(work, "--cores", "2", "report", *CONFIG, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = sorted(p for p in (work / "report" / "archive" / HWREV).iterdir() if p.is_dir())
    assert len(runs) == 2
    first, second = (json.loads((r / "run.json").read_text()) for r in runs)
    assert first["fingerprint"]["kernel"] == "6.8.12-4-pve" and second["fingerprint"]["kernel"] == "6.14.11-2-pve"
    html = (work / "results" / HWREV / "report.html").read_text()
    since = html.split('id="since"', 1)[1].split('id="provenance"', 1)[0]
    assert "6.8.12-4-pve" in since and "6.14.11-2-pve" in since and runs[0].name in since
    receipt = json.loads((work / "results" / HWREV / "archive.json").read_text())
    assert receipt["run_id"] == runs[1].name
    index = (work / "report" / "archive" / HWREV / "index.html").read_text()
    assert runs[0].name in index and runs[1].name in index
    # and now nothing is left to do with the new kernel
    assert _planned(work, env) == set()


def test_compare_target(work):
    proc = _snakemake(work, "--cores", "1", "compare", "--config", "run_a=previous", "run_b=latest", *CONFIG[1:],
                      env={ENV_PREFIX + "KERNEL": "6.14.11-2-pve"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = list((work / "results" / "compare").glob("*.html"))
    assert len(out) == 1 and out[0].with_suffix(".pdf").exists()
    html = out[0].read_text()
    assert "Run comparison" in html and "6.8.12-4-pve" in html and "6.14.11-2-pve" in html


def test_compare_bad_spec_is_one_line(work):
    proc = _snakemake(work, "--cores", "1", "compare", "--config", "run_a=nope", "run_b=latest", *CONFIG[1:])
    assert proc.returncode != 0
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("decode-gap: error")]
    assert len(lines) == 1 and "'nope' not found" in lines[0]
    assert "Traceback" not in proc.stderr
