"""Entry points the rule scripts call: render a run's report, archive it, render the archive index, compare two runs."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from .. import __version__
from .. import archive as arc
from ..config import public_run_config
from ..errors import DecodeGapError
from ..io import atomic_write_text, write_json
from .data import STAGE_FILES, Bundle, Fig, audit_findings, files_in_dir, headline, headline_json, load_bundle
from .pdf import write_pdf
from .render import render, template_dir
from ..secrets import scrub_text, secret_values
from .sections import build_context, compare_context

def _readable(*paths: str | os.PathLike) -> None:
    """Reports and indexes are meant to be opened and shared: rw-r--r-- within the umask (atomic writes make 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    for p in paths:
        try:
            os.chmod(p, 0o644 & ~mask)
        except OSError:
            pass


def run_config(config: dict[str, Any], bundle: Bundle | None = None) -> dict[str, Any]:
    """The measuring run's configuration (gap.json keeps it); this host's config only for a tree without it."""
    kept = bundle.doc("gap").get("run_config") if bundle is not None else None
    return dict(kept) if isinstance(kept, dict) and kept else public_run_config(config)


def datasheet(bundle: Bundle) -> dict[str, Any]:
    """Datasheet ceilings of the measured hardware, as roofline.json recorded them on the measuring host
    (never resolved on the rendering host: a report rendered elsewhere is the same report). Empty when unknown."""
    hw = bundle.doc("roofline").get("hardware")
    if not isinstance(hw, dict):
        return {}
    peaks = hw.get("peak_tflops") if isinstance(hw.get("peak_tflops"), dict) else {}
    return {"name": str(hw.get("name") or hw.get("key") or ""), "memory_bandwidth_gbps": hw.get("memory_bandwidth_gbps"),
            "peak_tflops": dict(peaks)}


def render_run(files: dict[str, str], html_path: str | os.PathLike, pdf_path: str | os.PathLike, *, hw_rev: str,
               fingerprint: dict[str, str], config: dict[str, Any], archive_dir: str | os.PathLike,
               templates: Iterable[str] | None = None) -> dict[str, Any]:
    """Render results/<hw-rev>/report.{html,pdf} from the stage files alone; history comes from the archive."""
    tdir = template_dir(templates)
    bundle = load_bundle(files)
    listing = arc.list_runs(archive_dir, hw_rev)
    # an entry holding these very stage files under the same fingerprint is this run rendered before (render mode, a
    # template change): not an earlier run, so neither the comparison nor the trend counts it. A changed fingerprint
    # is a new run even where no stage reran (what changed in the environment is the comparison's point)
    stage = arc.file_hashes({rel: files[name] for name, rel in STAGE_FILES.items() if files.get(name)})
    fp = {str(k): str(v) for k, v in (fingerprint or {}).items()}  # as an entry's run.json reads back
    history = [r for r in listing.runs if not (r.fingerprint == fp and arc.holds_files(r, stage))]
    notes, again = list(listing.warnings), len(listing.runs) - len(history)
    if again:
        notes.append(f"{again} earlier {'entries hold' if again > 1 else 'entry holds'} these same stage files (this "
                     "run rendered before): left out of the comparison and the trend")
    empty = (f"archive {archive_dir}/{hw_rev} holds no earlier run" if not listing.runs
             else f"archive {archive_dir}/{hw_rev} holds only this run's renders")
    ctx = build_context(bundle, hw_rev=hw_rev, fingerprint=fingerprint, run_config=run_config(config, bundle),
                        datasheet=datasheet(bundle), history=history, history_warnings=notes,
                        archive_note="" if history else empty)
    secrets = secret_values(names=[config.get("api_key_env", "")])
    html = render("report.html.j2", ctx, "html", tdir, secrets)
    pdf_html = render("report.html.j2", ctx, "pdf", tdir, secrets)
    write_pdf(pdf_html, pdf_path, base_url=tdir)
    atomic_write_text(html_path, html)
    _readable(html_path, pdf_path)
    return ctx


def _rel_to_results(path: str, results_dir: Path) -> str:
    p = Path(path)
    try:
        return p.resolve().relative_to(results_dir.resolve()).as_posix()
    except ValueError:
        return p.name


def archive_report(*, html: str, pdf: str, stage_files: Iterable[str], receipt: str | os.PathLike, hw_rev: str,
                   fingerprint: dict[str, str], config: dict[str, Any], archive_dir: str | os.PathLike,
                   templates: Iterable[str] | None = None) -> arc.ArchivedRun:
    """Copy the report, the stage files and the fingerprint into a new archive entry; refresh the indexes."""
    results_dir = Path(html).parent
    files = {"report.html": html, "report.pdf": pdf}
    for f in stage_files:
        files[_rel_to_results(f, results_dir)] = f
    by_name = {name: files.get(rel) for name, rel in STAGE_FILES.items()}
    bundle = load_bundle(by_name)
    figs = headline(bundle)
    findings = [{"id": f["id"], "severity": f["severity"], "title": f["title"], "evidence": f["evidence"]}
                for f in audit_findings(bundle.doc("audit"))]
    secrets = secret_values(names=[config.get("api_key_env", "")])
    meta = {"decode_gap_version": __version__, "headline": headline_json(figs), "findings": findings,
            "config": run_config(config, bundle), "report": "report.html"}
    run = arc.archive_run(archive_dir, hw_rev, files, fingerprint, meta, scrub=lambda t: scrub_text(t, secrets))
    index = write_indexes(archive_dir, hw_rev, templates)
    write_json(receipt, {
        "stage": "archive", "status": "ok", "run_id": run.run_id, "hw_rev": hw_rev,
        "entry": str(run.path), "index": str(index), "created_utc": run.meta.get("created_utc"),
        "files": [f["path"] for f in run.meta.get("files", [])],
    })
    return run


def write_indexes(archive_dir: str | os.PathLike, hw_rev: str, templates: Iterable[str] | None = None) -> Path:
    """Render <archive>/<hw-rev>/index.html (its runs) and <archive>/index.html (the revisions), atomically."""
    tdir = template_dir(templates)
    listing = arc.list_runs(archive_dir, hw_rev)
    changes = arc.fingerprint_changes(listing.runs)
    rows = []
    keys = ("roofline_ms", "live_itl_ms", "efficiency", "explained_fraction", "peak_output_throughput", "findings")
    for run, changed in zip(listing.runs, changes):
        head = {k: Fig.from_json(run.headline.get(k)) for k in keys}
        rows.append({"run_id": run.run_id, "created": run.created, "href": f"{run.run_id}/report.html",
                     "pdf": f"{run.run_id}/report.pdf" if (run.path / "report.pdf").exists() else "",
                     "fingerprint": sorted(run.fingerprint.items()), "changed": changed, "head": head,
                     "findings": len(run.findings)})
    rows.reverse()  # newest first
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ctx = {"title": f"decode-gap archive · {hw_rev}", "hw_rev": hw_rev, "rows": rows, "warnings": listing.warnings,
           "version": __version__, "generated": now, "charts": []}
    path = Path(archive_dir) / hw_rev / "index.html"
    atomic_write_text(path, render("archive_index.html.j2", ctx, "html", tdir, secrets=[]))
    _readable(path)
    revs = []
    for rev in arc.hardware_revisions(archive_dir):
        runs = arc.list_runs(archive_dir, rev, warn=False).runs
        revs.append({"hw_rev": rev, "runs": len(runs), "latest": runs[-1].created if runs else "—",
                     "href": f"{rev}/index.html"})
    atomic_write_text(Path(archive_dir) / "index.html",
                      render("archive_root.html.j2", {"title": "decode-gap archive", "revs": revs, "version": __version__,
                                                      "generated": now, "charts": []}, "html", tdir, secrets=[]))
    _readable(Path(archive_dir) / "index.html")
    return path


def render_compare(spec_a: str, spec_b: str, html_path: str | os.PathLike, pdf_path: str | os.PathLike, *,
                   archive_dir: str | os.PathLike, default_hw: str | None = None,
                   templates: Iterable[str] | None = None) -> dict[str, Any]:
    if not spec_a or not spec_b:
        raise DecodeGapError("config keys 'run_a' and 'run_b' are required: snakemake --cores 1 compare "
                             "--config run_a=<hw-rev>/<run-id> run_b=<hw-rev>/<run-id> (or latest / previous)")
    run_a = arc.resolve(spec_a, archive_dir, default_hw)
    run_b = arc.resolve(spec_b, archive_dir, default_hw)
    tdir = template_dir(templates)
    out_dir = Path(html_path).parent
    links = {k: os.path.relpath(r.path / "report.html", out_dir) for k, r in (("a", run_a), ("b", run_b))}
    ctx = compare_context(run_a, run_b, load_bundle(files_in_dir(run_a.path)), load_bundle(files_in_dir(run_b.path)),
                          links=links)
    secrets = secret_values()
    html = render("compare.html.j2", ctx, "html", tdir, secrets)
    pdf_html = render("compare.html.j2", ctx, "pdf", tdir, secrets)
    write_pdf(pdf_html, pdf_path, base_url=tdir)
    atomic_write_text(html_path, html)
    _readable(html_path, pdf_path)
    return ctx


__all__ = ["render_run", "archive_report", "write_indexes", "render_compare", "run_config"]
