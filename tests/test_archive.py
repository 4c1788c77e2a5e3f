"""The per-hardware-revision archive: unique run ids, no overwrite, atomic entries, corrupt/foreign entries skipped
with a warning, the index, resolving `a=`/`b=` specs, and the "since last run" history.

Stage files come from tests/fixtures/report/ (synthetic fixtures, see make_fixtures.py; not measurements).
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from decode_gap import archive as arc
from decode_gap.errors import DecodeGapError
from decode_gap.report import build
from decode_gap.report.data import STAGE_FILES, files_in_dir, load_bundle
from decode_gap.report.sections import build_context

FIX = Path(__file__).resolve().parent / "fixtures" / "report"
FP = {"kernel": "6.8.12", "driver": "570.124.06", "cuda": "12.8", "torch": "2.11.0", "nccl": "2.26.2",
      "governor": "schedutil", "tunables": "numa_balancing=1", "server": "none"}
NOW = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc)


def _files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "report.html").write_text("<html>r</html>")
    (tmp_path / "report.pdf").write_bytes(b"%PDF-1.7 fake")
    return {"report.html": str(tmp_path / "report.html"), "report.pdf": str(tmp_path / "report.pdf"),
            "audit.json": str(FIX / "h200x2" / "audit.json"),
            "microbench/gemm.csv": str(FIX / "h200x2" / "microbench" / "gemm.csv"),
            "live/summary.json": str(tmp_path / "absent.json")}  # a missing source is skipped


def test_run_ids_sort_and_are_unique_within_one_second(tmp_path):
    a = arc.archive_run(tmp_path / "ar", "rev1", _files(tmp_path), FP, now=NOW)
    b = arc.archive_run(tmp_path / "ar", "rev1", _files(tmp_path), FP, now=NOW)
    c = arc.archive_run(tmp_path / "ar", "rev1", _files(tmp_path), FP, now=NOW)
    ids = [a.run_id, b.run_id, c.run_id]
    assert len(set(ids)) == 3 and ids == sorted(ids)
    assert all(arc.RUN_ID_RE.match(i) for i in ids)
    assert a.run_id == "20260102T030405.123456Z"
    entry = tmp_path / "ar" / "rev1" / a.run_id
    assert sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*") if p.is_file()) == [
        "audit.json", "fingerprint.json", "microbench/gemm.csv", "report.html", "report.pdf", "run.json"]
    meta = json.loads((entry / "run.json").read_text())
    assert meta["run_id"] == a.run_id and meta["hw_rev"] == "rev1" and meta["fingerprint"] == FP
    assert {f["path"] for f in meta["files"]} >= {"report.html", "audit.json"} and all(len(f["sha256"]) == 64
                                                                                        for f in meta["files"])
    assert json.loads((entry / "fingerprint.json").read_text()) == FP


def test_nothing_is_overwritten(tmp_path):
    first = arc.archive_run(tmp_path / "ar", "rev1", _files(tmp_path), FP, now=NOW)
    before = {p: p.read_bytes() for p in first.path.rglob("*") if p.is_file()}
    (tmp_path / "report.html").write_text("<html>second</html>")
    second = arc.archive_run(tmp_path / "ar", "rev1", _files(tmp_path), dict(FP, kernel="6.14.11"), now=NOW)
    assert second.path != first.path
    assert {p: p.read_bytes() for p in first.path.rglob("*") if p.is_file()} == before
    # an existing (even empty) directory with the chosen id is never replaced
    taken = arc.new_run_id(NOW)
    assert (tmp_path / "ar" / "rev1" / taken).exists()


def test_killed_run_leaves_no_entry(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = shutil.copyfile

    def dying_copy(src, dst, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # the process is stopped halfway through the copy
        return real(src, dst, *a, **k)

    monkeypatch.setattr(arc.shutil, "copyfile", dying_copy)
    with pytest.raises(KeyboardInterrupt):
        arc.archive_run(tmp_path / "ar", "rev1", _files(tmp_path), FP, now=NOW)
    hw_dir = tmp_path / "ar" / "rev1"
    assert list(hw_dir.iterdir()) == []  # no entry, no temporary directory
    assert arc.list_runs(tmp_path / "ar", "rev1").runs == []


def test_stale_tmp_of_dead_process_is_cleaned_and_ignored(tmp_path):
    hw_dir = tmp_path / "ar" / "rev1"
    stale = hw_dir / f"{arc.TMP_PREFIX}20250101T000000.000000Z-999999999"
    stale.mkdir(parents=True)
    (stale / "report.html").write_text("half")
    listing = arc.list_runs(tmp_path / "ar", "rev1")
    assert listing.runs == [] and listing.warnings == []  # hidden: never listed, never warned about
    arc.archive_run(tmp_path / "ar", "rev1", _files(tmp_path), FP, now=NOW)
    assert not stale.exists()


def test_corrupt_and_foreign_entries_are_skipped_with_a_warning(tmp_path, capsys):
    root = tmp_path / "ar"
    good = arc.archive_run(root, "rev1", _files(tmp_path), FP, now=NOW)
    hw = root / "rev1"
    (hw / "notes").mkdir()                                   # foreign: not a run id
    (hw / "stray.txt").write_text("x")                       # foreign: not a directory
    (hw / "20250101T000000.000000Z").mkdir()                 # corrupt: no run.json
    bad = hw / "20250101T000001.000000Z"
    bad.mkdir()
    (bad / "run.json").write_text("{broken")                 # corrupt: unreadable run.json
    other = hw / "20250101T000002.000000Z"
    shutil.copytree(good.path, other)
    meta = json.loads((other / "run.json").read_text())
    meta.update(run_id=other.name, hw_rev="another-rev")
    (other / "run.json").write_text(json.dumps(meta))        # foreign: another hardware revision
    listing = arc.list_runs(root, "rev1")
    assert [r.run_id for r in listing.runs] == [good.run_id]
    joined = "\n".join(listing.warnings)
    for name in ("notes", "stray.txt", "20250101T000000.000000Z", "20250101T000001.000000Z", "20250101T000002.000000Z"):
        assert name in joined, name
    assert "decode-gap: warning:" in capsys.readouterr().err
    # the report and the index still build
    ctx = build_context(load_bundle(files_in_dir(FIX / "h200x2")), hw_rev="rev1", fingerprint=FP,
                        history=listing.runs, history_warnings=listing.warnings)
    assert ctx["since"]["ok"] and len(ctx["since"]["warnings"]) == 5
    index = build.write_indexes(root, "rev1")
    html = index.read_text()
    assert good.run_id in html and "skipped: corrupt archive entry" in html and "notes" in html


def test_index_lists_runs_with_fingerprints_and_headline(tmp_path):
    root = tmp_path / "ar"
    res = tmp_path / "results" / "rev1"
    for name, fp in (("h200x2-before", FP), ("h200x2", dict(FP, kernel="6.14.11", governor="performance"))):
        shutil.rmtree(res, ignore_errors=True)
        shutil.copytree(FIX / name, res)
        (res / "report.html").write_text("<html></html>")
        (res / "report.pdf").write_bytes(b"%PDF")
        run = build.archive_report(html=str(res / "report.html"), pdf=str(res / "report.pdf"),
                                   stage_files=[str(res / r) for r in STAGE_FILES.values()],
                                   receipt=res / "archive.json", hw_rev="rev1", fingerprint=fp,
                                   config={"model": "m.json", "endpoint": "http://k:s@127.0.0.1:1/v1"}, archive_dir=root)
        receipt = json.loads((res / "archive.json").read_text())
        assert receipt["run_id"] == run.run_id and receipt["entry"] == str(run.path)
        assert "live/chunks.parquet" in receipt["files"] and "microbench/gemm.csv" in receipt["files"]
    runs = arc.list_runs(root, "rev1").runs
    assert len(runs) == 2
    assert runs[-1].headline["live_itl_ms"]["status"] == "measured"
    assert runs[-1].meta["config"]["endpoint"] == "http://127.0.0.1:1/v1"
    html = (root / "rev1" / "index.html").read_text()
    assert html.index(runs[1].run_id) < html.index(runs[0].run_id)  # newest first
    assert "6.14.11" in html and "fp-item changed" in html and "39.3 ms" in html
    assert "rev1/index.html" in (root / "index.html").read_text()
    # since last run, from the archive: fingerprint diff, deltas, findings, trend
    ctx = build_context(load_bundle(files_in_dir(FIX / "h200x2")), hw_rev="rev1",
                        fingerprint=dict(FP, kernel="6.15.0", governor="performance"), history=runs)
    s = ctx["since"]
    assert s["ok"] and s["prev_id"] == runs[-1].run_id
    assert [d["component"] for d in s["fp_diff"]] == ["kernel"]
    itl = next(d for d in s["deltas"] if d["key"] == "live_itl_ms")
    assert itl["verdict"] == "same"
    assert "trend_chart" in s and s["n_runs"] == 3


def test_resolve_specs(tmp_path, monkeypatch):
    root = tmp_path / "ar"
    r1 = arc.archive_run(root, "rev1", _files(tmp_path), FP, now=NOW)
    r2 = arc.archive_run(root, "rev1", _files(tmp_path), FP)
    r3 = arc.archive_run(root, "rev2", _files(tmp_path), FP)
    assert arc.resolve("latest", root, "rev1").run_id == r2.run_id
    assert arc.resolve("previous", root, "rev1").run_id == r1.run_id
    assert arc.resolve("latest~1", root, "rev1").run_id == r1.run_id
    assert arc.resolve("rev2/latest", root, "rev1").run_id == r3.run_id
    assert arc.resolve(f"rev1/{r1.run_id}", root).run_id == r1.run_id
    assert arc.resolve(r3.run_id, root).hw_rev == "rev2"
    assert arc.resolve(str(r2.path), root).run_id == r2.run_id
    monkeypatch.chdir(tmp_path)
    assert arc.resolve(os.path.relpath(r2.path, tmp_path), root).run_id == r2.run_id
    for bad, msg in (("rev1/20990101T000000.000000Z", "not found"), ("nope", "not found"),
                     ("latest~5", "not enough"), ("", "give run_a=")):
        with pytest.raises(DecodeGapError, match=msg):
            arc.resolve(bad, root, "rev1")


def test_compare_renders_side_by_side_across_revisions(tmp_path):
    pypdf = pytest.importorskip("pypdf")
    root = tmp_path / "ar"
    runs = []
    for name, rev in (("h200x2-before", "h200-old"), ("h200x2", "h200-new")):
        res = tmp_path / "results" / rev
        shutil.copytree(FIX / name, res)
        (res / "report.html").write_text("<html></html>")
        (res / "report.pdf").write_bytes(b"%PDF")
        runs.append(build.archive_report(html=str(res / "report.html"), pdf=str(res / "report.pdf"),
                                         stage_files=[str(res / r) for r in STAGE_FILES.values()],
                                         receipt=res / "archive.json", hw_rev=rev,
                                         fingerprint=dict(FP, kernel=rev), config={}, archive_dir=root))
    out = tmp_path / "results" / "compare"
    ctx = build.render_compare("h200-old/latest", f"h200-new/{runs[1].run_id}", out / "c.html", out / "c.pdf",
                               archive_dir=root)
    assert not ctx["same_hw"]
    assert [r["component"] for r in ctx["fp_rows"] if r["changed"]] == ["kernel"]
    html = (out / "c.html").read_text()
    assert "Across hardware revisions" in html and "h200-old/" in html and "h200-new/" in html
    assert {"levels", "waterfall", "gemm", "throughput"} <= set(ctx["compare_charts"])
    text = "\n".join(p.extract_text() or "" for p in pypdf.PdfReader(str(out / "c.pdf")).pages)
    assert "Run comparison" in text and "Headline metrics" in text and "ms per token" in text
    with pytest.raises(DecodeGapError, match="'run_a' and 'run_b' are required"):
        build.render_compare("", "x", out / "d.html", out / "d.pdf", archive_dir=root)


def test_a_render_again_of_the_same_stage_files_is_not_an_earlier_run(tmp_path, monkeypatch):
    """Render mode and a template change re-archive the same measurements: an entry holding the very stage files
    being rendered, under the same fingerprint, is left out of the "since last run" comparison and the trend, with a
    note; an entry of other measurements, or of another fingerprint, stays."""
    stage = {rel: str(FIX / "h200x2" / rel) for rel in STAGE_FILES.values() if (FIX / "h200x2" / rel).is_file()}
    before = {rel: str(FIX / "h200x2-before" / rel) for rel in STAGE_FILES.values()
              if (FIX / "h200x2-before" / rel).is_file()}
    again = arc.archive_run(tmp_path, "rev", stage, FP)
    older = arc.archive_run(tmp_path, "rev", before, FP)
    hashes = arc.file_hashes(stage)
    assert arc.holds_files(again, hashes) and not arc.holds_files(older, hashes) and not arc.holds_files(again, {})

    seen = {}
    monkeypatch.setattr(build, "write_pdf", lambda *a, **k: None)  # the PDF is not what this checks
    monkeypatch.setattr(build, "build_context", lambda bundle, **kw: seen.update(kw) or {})
    monkeypatch.setattr(build, "render", lambda *a, **k: "<html></html>")
    build.render_run(files_in_dir(FIX / "h200x2"), tmp_path / "out" / "report.html", tmp_path / "out" / "report.pdf",
                     hw_rev="rev", fingerprint=FP, config={}, archive_dir=tmp_path)
    assert [r.run_id for r in seen["history"]] == [older.run_id]
    assert seen["history_warnings"][-1].startswith("1 earlier entry holds these same stage files")
    # the same stage files under another fingerprint (a kernel upgrade that reran no stage) are an earlier run
    build.render_run(files_in_dir(FIX / "h200x2"), tmp_path / "out" / "report.html", tmp_path / "out" / "report.pdf",
                     hw_rev="rev", fingerprint={**FP, "kernel": "6.14.11"}, config={}, archive_dir=tmp_path)
    assert [r.run_id for r in seen["history"]] == [again.run_id, older.run_id]
