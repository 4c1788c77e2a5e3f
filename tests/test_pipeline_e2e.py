"""End to end: the real `snakemake --cores 2 report` on a small config, against the real embedded llama.cpp server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
SECTIONS = ["Audit", "Roofline", "Micro-benchmarks", "Simulation", "Live", "Gap"]
SECRET = "sk-e2e-secret-do-not-leak-12345"

pytestmark = pytest.mark.e2e


def _copy_repo(dst: Path, src: Path = REPO) -> Path:
    """A clean copy of the clone `src`, whatever the README's main job left in it (results/, resources/,
    report/archive/<run>/, .snakemake/): only the assembled GGUF is reused."""
    patterns = shutil.ignore_patterns(".venv", "results", ".snakemake", ".whl", ".git", "__pycache__", "devrun",
                                      ".pytest_cache")

    def ignore(folder: str, names: list[str]) -> set[str]:
        # the clone's own resources/ (models, logs) is left out; only its models come back, below
        top = {"resources"} if Path(folder) == src else set()
        return set(patterns(folder, names)) | (top & set(names))

    shutil.copytree(src, dst, ignore=ignore)
    archive = dst / "report" / "archive"
    for child in archive.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
    models = src / "resources" / "models"
    if models.exists():  # reuse the assembled GGUF instead of assembling 250 MB again
        shutil.copytree(models, dst / "resources" / "models")
    return dst


def test_copy_repo_after_the_readme_main_job(tmp_path):
    """The README's order (setup, main job, tests) in one clone: what the main job leaves must not break the
    copy (it once copied resources/ twice: FileExistsError, issue 17)."""
    src = tmp_path / "clone"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "results", ".snakemake", "resources",
                                                             "__pycache__", ".pytest_cache", "devrun", ".whl"))
    for d in src.glob("report/archive/*"):
        if d.is_dir():
            shutil.rmtree(d)
    # what `snakemake --cores all report` leaves in the clone
    (src / "resources" / "models").mkdir(parents=True)
    (src / "resources" / "models" / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"GGUF stand-in")
    (src / "resources" / "logs").mkdir()
    (src / "resources" / "logs" / "assemble_gguf.log").write_text("assembled\n")
    (src / "results" / "cpu-host" / "live").mkdir(parents=True)
    (src / "results" / "cpu-host" / "report.html").write_text("<html></html>")
    (src / "report" / "archive" / "cpu-host" / "run-1").mkdir(parents=True)
    (src / ".snakemake" / "metadata").mkdir(parents=True)
    dst = _copy_repo(tmp_path / "copy", src)
    assert (dst / "resources" / "models" / "gemma-3-270m-q4_k_m.gguf").read_bytes() == b"GGUF stand-in"
    assert not (dst / "resources" / "logs").exists() and not (dst / "results").exists()
    assert not (dst / ".snakemake").exists() and not any(p.is_dir() for p in (dst / "report" / "archive").iterdir())
    assert (dst / "Snakefile").is_file() and (dst / "workflow" / "decode_gap" / "live" / "runner.py").is_file()
    # a second copy (another test module, or a rerun) works too
    assert _copy_repo(tmp_path / "copy2", src).is_dir()


def _run(workdir: Path, *args: str, env: dict | None = None, timeout: int = 1500) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [*SNAKEMAKE, *args], cwd=workdir, capture_output=True, text=True, timeout=timeout, env=full_env
    )


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (run setup.sh)")
    work = _copy_repo(tmp_path_factory.mktemp("e2e") / "repo")
    env = {"DECODE_GAP_E2E_TOKEN": SECRET, "NCCL_DEBUG": "WARN"}
    proc = _run(work, "--cores", "2", "report", "--configfile", "tests/e2e/small.yaml", env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = [p for p in (work / "results").iterdir() if p.is_dir()]
    assert len(results) == 1
    return work, results[0], env


def test_report_files_exist_and_pdf_has_sections(pipeline):
    pypdf = pytest.importorskip("pypdf")
    _, res, _ = pipeline
    html = (res / "report.html").read_text(encoding="utf-8")
    pdf = res / "report.pdf"
    assert pdf.stat().st_size > 10_000
    text = "\n".join(page.extract_text() or "" for page in pypdf.PdfReader(str(pdf)).pages)
    for section in SECTIONS:
        assert section.lower() in text.lower(), f"PDF lacks section {section}"
        assert section.lower() in html.lower(), f"HTML lacks section {section}"


def test_charts_are_embedded(pipeline):
    _, res, _ = pipeline
    html = (res / "report.html").read_text(encoding="utf-8")
    # interactive charts: Vega-Lite specs and the runtime inline (no network needed)
    assert "vega-lite" in html.lower() and "<script" in html
    assert "cdn.jsdelivr" not in html and "unpkg.com" not in html
    pypdf = pytest.importorskip("pypdf")
    reader = pypdf.PdfReader(str(res / "report.pdf"))
    text = "\n".join(page.extract_text() or "" for page in reader.pages)
    # charts are drawn as vector graphics (SVG from vl-convert): their axis titles are text in the PDF
    assert len(reader.pages) >= 3
    assert "ms per token" in text


def test_every_stage_wrote_its_summary(pipeline):
    _, res, _ = pipeline
    for rel in ["audit.json", "roofline.json", "microbench/memory.json", "microbench/allreduce.csv", "microbench/gemm.csv",
                "simulate.json", "live/summary.json", "gap.json"]:
        assert (res / rel).exists(), rel
    live = json.loads((res / "live" / "summary.json").read_text())
    assert live["levels"] and live["levels"][0]["completed"] > 0


def test_archive_copy(pipeline):
    work, res, _ = pipeline
    receipt = json.loads((res / "archive.json").read_text())
    runs = [p for p in (work / "report" / "archive" / res.name).iterdir() if p.is_dir()]
    assert len(runs) == 1
    assert (runs[0] / "report.html").exists() and (runs[0] / "report.pdf").exists()
    assert runs[0].name in json.dumps(receipt)


def test_no_secret_anywhere(pipeline):
    work, res, _ = pipeline
    for root in (res, work / "report" / "archive"):
        for path in root.rglob("*"):
            if path.is_file() and path.suffix in {".json", ".html", ".csv", ".log", ".txt"}:
                assert SECRET not in path.read_text(encoding="utf-8", errors="replace"), path


def test_second_run_plans_nothing(pipeline):
    work, _, env = pipeline
    proc = _run(work, "--cores", "2", "report", "--configfile", "tests/e2e/small.yaml", "-n", env=env)
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_bad_config_one_line_and_archive_untouched(pipeline):
    work, res, env = pipeline
    before = sorted(str(p) for p in (work / "report" / "archive").rglob("*"))
    report_mtime = (res / "report.pdf").stat().st_mtime
    proc = _run(work, "--cores", "2", "report", "--configfile", "tests/e2e/small.yaml", "--config", "tp=two", env=env)
    assert proc.returncode != 0
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("decode-gap: error")]
    assert lines == ["decode-gap: error: --config: field 'tp': 'two' is not of type 'integer'"]
    assert "Traceback" not in proc.stderr
    assert sorted(str(p) for p in (work / "report" / "archive").rglob("*")) == before
    assert (res / "report.pdf").stat().st_mtime == report_mtime
