"""Results measured on one host, rendered on another (issue 15), through the real Snakemake `render` target.

The results tree is `tests/copied_results.py`'s H200 tree (synthetic figures, every level naming an NVIDIA H200,
every file older than the code, as a tar from the GPU host leaves them). Rendering it here must run no measuring
rule, change no stage file, and give the same numbers and the same verdict as the GPU host's gap.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from copied_results import FINGERPRINT, GPU, make_tree
from decode_gap.fingerprint import COMPONENTS
from decode_gap.report.data import files_in_dir, headline, headline_json, load_bundle

REPO = Path(__file__).resolve().parents[1]
HWREV = "h200-copied"
RENDER_RULES = {"render_report", "archive_report", "render"}

pytestmark = pytest.mark.e2e


def _snakemake(work: Path, *args: str):
    # this host's fingerprint differs from the measuring host's in every component
    env = {**os.environ, **{f"DECODE_GAP_FP_{c.upper()}": f"render-host-{c}" for c in COMPONENTS}}
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=work, capture_output=True,
                          text=True, timeout=900, env=env)


def _state(d: Path) -> dict[str, tuple[str, float]]:
    return {str(p.relative_to(d)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime)
            for p in sorted(d.rglob("*")) if p.is_file()}


def _rules_run(out: str) -> set[str]:
    return set(re.findall(r"^(?:local)?rule (\w+):", out, re.M))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    dst = tmp_path_factory.mktemp("render") / "repo"
    shutil.copytree(REPO, dst, ignore=shutil.ignore_patterns(
        ".venv", "results", ".snakemake", ".git", ".whl", "__pycache__", ".pytest_cache", "devrun", "resources",
        "tests"))
    shutil.rmtree(dst / "report" / "archive", ignore_errors=True)
    (dst / "report" / "archive").mkdir()
    # the kernel level measured slower than the engine level: an inconsistency the report must show as one
    make_tree(dst / "results", HWREV, kernel={"eager_ms": 41.5})
    return dst


def test_render_runs_no_measuring_rule_and_keeps_every_number(work):
    tree = work / "results" / HWREV
    before = _state(tree)
    gap = json.loads((tree / "gap.json").read_text())
    expected = headline_json(headline(load_bundle(files_in_dir(tree))))

    # even forcing every job, the DAG of `render` holds rendering rules only
    forced = _snakemake(work, "render", "--config", f"hardware_revision={HWREV}", "--forceall", "--dry-run")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert _rules_run(forced.stdout + forced.stderr) == RENDER_RULES

    proc = _snakemake(work, "render", "--config", f"hardware_revision={HWREV}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert _rules_run(out) == RENDER_RULES, out[-3000:]

    after = _state(tree)
    assert {k: v for k, v in after.items() if k in before} == before  # no stage file rewritten or touched
    assert set(after) - set(before) <= {"report.html", "report.pdf", "archive.json", "logs/render_report.log",
                                        "logs/archive_report.log"}

    receipt = json.loads((tree / "archive.json").read_text())
    entry = Path(receipt["entry"]) if Path(receipt["entry"]).is_absolute() else work / receipt["entry"]
    run = json.loads((entry / "run.json").read_text())
    assert run["headline"] == expected  # the same figures as the GPU host's files give
    assert run["headline"]["explained_fraction"]["value"] == pytest.approx(gap["explained_fraction"] * 100)
    assert run["headline"]["closure_ratio"]["value"] == gap["closure_ratio"]
    assert json.loads((entry / "fingerprint.json").read_text()) == FINGERPRINT  # the measuring host's
    assert (entry / "gap.json").read_bytes() == (tree / "gap.json").read_bytes()

    html = (tree / "report.html").read_text()
    assert "NVIDIA H200 SXM (fixture)" in html  # datasheet from roofline.json, not from this host
    assert f"{GPU}, rev {HWREV}" in html  # where the levels were measured
    inc = gap["headline"]["inconsistencies"]
    assert len(inc) == 1 and inc[0]["step"] == "framework overhead"
    assert "inconsistent step" in html and "likely cause" in html


def test_render_refuses_a_missing_stage_file_in_one_line(work, tmp_path):
    rev = "h200-incomplete"
    make_tree(work / "results", rev)
    (work / "results" / rev / "live" / "chunks.parquet").unlink()
    proc = _snakemake(work, "render", "--config", f"hardware_revision={rev}", "--dry-run")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    errors = [line for line in out.splitlines() if "decode-gap: error" in line]
    assert errors == [f"decode-gap: error: render: results/{rev}/live/chunks.parquet is missing: copy the whole "
                      f"results/{rev}/ directory from the measuring host (render never measures)"]
    assert not _rules_run(out)


def test_measuring_rules_refuse_a_tree_from_another_host(work):
    """`report` (the measuring target) on the copied H200 tree: refused in one line, nothing planned or run."""
    proc = _snakemake(work, "report", "--config", f"hardware_revision={HWREV}", "--dry-run")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    errors = [line for line in out.splitlines() if "decode-gap: error" in line]
    assert len(errors) == 1 and f"results/{HWREV}/ was measured on {GPU}" in errors[0], out[-2000:]
    assert f"snakemake --cores 1 render --config hardware_revision={HWREV}" in errors[0]
    assert not _rules_run(out)
