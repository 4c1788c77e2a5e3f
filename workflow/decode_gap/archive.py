"""The per-hardware-revision archive of every successful report.

Layout (`config.archive.dir`, default `report/archive`):

    <archive>/<hw-rev>/<run-id>/          one run; never modified once written
        report.html, report.pdf
        run.json                          run id, hw-rev, UTC time, fingerprint, headline figures, findings, files
        fingerprint.json
        audit.json, roofline.json, microbench/..., simulate.json, live/..., gap.json   (the stage files)
    <archive>/<hw-rev>/index.html         the runs of this revision with fingerprints and headline numbers
    <archive>/index.html                  the hardware revisions

A run id is the UTC time `YYYYMMDDTHHMMSS.ffffffZ` (microseconds, bumped when taken, so unique even within
one second); ids sort chronologically. An entry is built in a hidden temporary directory and renamed into
place, so a run killed halfway leaves no half-written entry and the index only ever lists whole runs.
A corrupt or foreign entry is skipped with a warning naming it; it never aborts the report.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable

from .errors import DecodeGapError, describe
from .io import write_json

RUN_ID_RE = re.compile(r"^\d{8}T\d{6}\.\d{6}Z$")
RUN_ID_FORMAT = "%Y%m%dT%H%M%S.%fZ"
RUN_META = "run.json"
FINGERPRINT_FILE = "fingerprint.json"
TMP_PREFIX = ".tmp-"
SCHEMA = 1
TEXT_SUFFIXES = {".json", ".csv", ".html", ".txt", ".log"}


def new_run_id(now: datetime | None = None) -> str:
    return (now or datetime.now(timezone.utc)).strftime(RUN_ID_FORMAT)


def run_id_time(run_id: str) -> datetime | None:
    try:
        return datetime.strptime(run_id, RUN_ID_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def _bump(run_id: str) -> str:
    t = run_id_time(run_id) or datetime.now(timezone.utc)
    return new_run_id(t + timedelta(microseconds=1))


@dataclass
class ArchivedRun:
    path: Path
    meta: dict[str, Any]

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id", self.path.name))

    @property
    def hw_rev(self) -> str:
        return str(self.meta.get("hw_rev", self.path.parent.name))

    @property
    def label(self) -> str:
        return f"{self.hw_rev}/{self.run_id}"

    @property
    def fingerprint(self) -> dict[str, str]:
        fp = self.meta.get("fingerprint")
        return {str(k): str(v) for k, v in fp.items()} if isinstance(fp, dict) else {}

    @property
    def headline(self) -> dict[str, Any]:
        h = self.meta.get("headline")
        return h if isinstance(h, dict) else {}

    @property
    def findings(self) -> list[dict[str, Any]]:
        f = self.meta.get("findings")
        return [x for x in f if isinstance(x, dict)] if isinstance(f, list) else []

    @property
    def created(self) -> str:
        t = run_id_time(self.run_id)
        return t.strftime("%Y-%m-%d %H:%M:%S UTC") if t else str(self.meta.get("created_utc", ""))


@dataclass
class Listing:
    runs: list[ArchivedRun] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _warn(listing: Listing, message: str) -> None:
    listing.warnings.append(message)
    print(f"decode-gap: warning: {message}", file=sys.stderr, flush=True)


def read_entry(path: Path, hw_rev: str | None = None) -> tuple[ArchivedRun | None, str | None]:
    """(run, None) for a valid entry, else (None, why it is skipped)."""
    if not path.is_dir():
        return None, f"foreign archive entry {path}: not a run directory"
    if not RUN_ID_RE.match(path.name):
        return None, f"foreign archive entry {path}: '{path.name}' is not a run id (YYYYMMDDTHHMMSS.ffffffZ)"
    meta_path = path / RUN_META
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"corrupt archive entry {path}: {RUN_META} is missing"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"corrupt archive entry {path}: {RUN_META} is unreadable ({describe(exc, 100, with_type=False)})"
    if not isinstance(meta, dict) or not isinstance(meta.get("fingerprint"), dict):
        return None, f"corrupt archive entry {path}: {RUN_META} has no fingerprint"
    if meta.get("run_id") != path.name:
        return None, f"foreign archive entry {path}: {RUN_META} names run '{meta.get('run_id')}'"
    if hw_rev is not None and meta.get("hw_rev") != hw_rev:
        return None, f"foreign archive entry {path}: it belongs to hardware revision '{meta.get('hw_rev')}'"
    return ArchivedRun(path, meta), None


def list_runs(archive_dir: str | os.PathLike, hw_rev: str, warn: bool = True) -> Listing:
    """The valid runs of one hardware revision, oldest first; corrupt or foreign entries become warnings."""
    listing = Listing()
    hw_dir = Path(archive_dir) / hw_rev
    if not hw_dir.is_dir():
        return listing
    for child in sorted(hw_dir.iterdir()):
        if child.name.startswith(".") or child.name in ("index.html", "README.md"):
            continue  # in-progress temporary entries, the index itself
        run, why = read_entry(child, hw_rev)
        if run is None:
            if warn:
                _warn(listing, why or f"skipped {child}")
            else:
                listing.warnings.append(why or f"skipped {child}")
            continue
        listing.runs.append(run)
    listing.runs.sort(key=lambda r: r.run_id)
    return listing


def hardware_revisions(archive_dir: str | os.PathLike) -> list[str]:
    d = Path(archive_dir)
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))


def file_hashes(files: dict[str, str | os.PathLike]) -> dict[str, str]:
    """Archive-relative name -> sha256 of those of `files` (name -> path here) that exist, as entries record them."""
    return {rel: _sha256(Path(src)) for rel, src in files.items() if Path(src).is_file()}


def holds_files(run: "ArchivedRun", hashes: dict[str, str]) -> bool:
    """True where the entry holds every file of `hashes` (file_hashes) byte for byte: a report rendered again from the
    same stage files, not a new measurement. No hashes hold nothing."""
    recorded = {f.get("path"): f.get("sha256") for f in run.meta.get("files", []) if isinstance(f, dict)}
    return bool(hashes) and all(recorded.get(rel) == sha for rel, sha in hashes.items())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_tmp(hw_dir: Path) -> None:
    """Remove temporary entries left by a killed archive run (their process is gone)."""
    for child in hw_dir.glob(f"{TMP_PREFIX}*"):
        pid = child.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(child, ignore_errors=True)


def archive_run(
    archive_dir: str | os.PathLike,
    hw_rev: str,
    files: dict[str, str | os.PathLike],
    fingerprint: dict[str, str],
    meta: dict[str, Any] | None = None,
    scrub: Any = None,
    now: datetime | None = None,
) -> ArchivedRun:
    """Copy `files` (archive-relative name -> source path; missing sources are skipped) into a new entry.

    `scrub(text) -> (text, count)` is applied to text files on the way in. Returns the new run.
    """
    if not hw_rev or "/" in hw_rev or hw_rev.startswith("."):
        raise DecodeGapError(f"hardware revision '{hw_rev}' cannot name an archive directory")
    hw_dir = Path(archive_dir) / hw_rev
    if hw_dir.exists() and not hw_dir.is_dir():
        raise DecodeGapError(f"archive: {hw_dir} is a file, not a directory of runs (config key 'archive.dir')")
    hw_dir.mkdir(parents=True, exist_ok=True)
    clean_stale_tmp(hw_dir)
    run_id = new_run_id(now)
    while (hw_dir / run_id).exists():
        run_id = _bump(run_id)
    tmp = hw_dir / f"{TMP_PREFIX}{run_id}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        listed = []
        redactions = 0
        for rel, src in sorted(files.items()):
            src = Path(src)
            if not src.is_file():
                continue
            rel_path = Path(rel)
            if rel_path.is_absolute() or ".." in rel_path.parts or rel in (RUN_META, FINGERPRINT_FILE):
                raise DecodeGapError(f"archive: refusing to store '{rel}' (outside the entry or reserved)")
            dst = tmp / rel_path
            dst.parent.mkdir(parents=True, exist_ok=True)
            if scrub is not None and src.suffix in TEXT_SUFFIXES:
                text, n = scrub(src.read_text(encoding="utf-8", errors="replace"))
                redactions += n
                dst.write_text(text, encoding="utf-8")
            else:
                shutil.copyfile(src, dst)
            listed.append({"path": rel_path.as_posix(), "bytes": dst.stat().st_size, "sha256": _sha256(dst)})
        if redactions:
            print(f"decode-gap: warning: archive: redacted {redactions} secret value(s) from copied files",
                  file=sys.stderr)
        write_json(tmp / FINGERPRINT_FILE, fingerprint)
        created = run_id_time(run_id) or datetime.now(timezone.utc)
        record = {
            "schema": SCHEMA,
            "run_id": run_id,
            "hw_rev": hw_rev,
            "created_utc": created.isoformat().replace("+00:00", "Z"),
            **(meta or {}),
            "fingerprint": fingerprint,
            "files": listed,
        }
        write_json(tmp / RUN_META, record)
        mask = os.umask(0)
        os.umask(mask)
        for f in tmp.rglob("*"):  # atomic writes create 0600 files; an archive is for reading
            if f.is_file():
                os.chmod(f, 0o644 & ~mask)
        for attempt in range(20):
            final = hw_dir / run_id
            if not final.exists():
                try:
                    os.rename(tmp, final)
                    break
                except OSError:
                    if not final.exists():
                        raise
            run_id = _bump(run_id)
            record["run_id"] = run_id
            write_json(tmp / RUN_META, record)
        else:  # pragma: no cover - 20 collisions in a row
            raise DecodeGapError(f"archive: could not find a free run id under {hw_dir}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ArchivedRun(final, record)


def resolve(spec: str, archive_dir: str | os.PathLike, default_hw: str | None = None) -> ArchivedRun:
    """Find an archived run from what a user types after `run_a=` / `run_b=` (see config/README.md#report-and-archive).

    Accepted: a path to an entry; `<hw-rev>/<run-id>`; `<run-id>` (searched in every revision);
    `latest`, `previous` or `latest~N` (this host's revision), or `<hw-rev>/latest` etc.
    """
    spec = (spec or "").strip()
    archive_dir = Path(archive_dir)
    if not spec:
        raise DecodeGapError("no archived run named: give run_a=<hw-rev>/<run-id> run_b=<hw-rev>/<run-id>")
    p = Path(spec)
    if (p / RUN_META).is_file():
        run, why = read_entry(p.resolve())
        if run is None:
            raise DecodeGapError(f"archived run '{spec}': {why}")
        return run
    hw, _, rid = spec.rpartition("/")
    hw = hw or default_hw or ""
    rel = re.fullmatch(r"(latest|previous)(?:~(\d+))?", rid)
    if rel:
        if not hw:
            raise DecodeGapError(f"archived run '{spec}': name the hardware revision, e.g. <hw-rev>/{rid}")
        runs = list_runs(archive_dir, hw, warn=False).runs
        back = int(rel.group(2) or 0) + (1 if rel.group(1) == "previous" else 0)
        if back >= len(runs):
            raise DecodeGapError(
                f"archived run '{spec}': {archive_dir}/{hw} holds {len(runs)} run(s), not enough for {rid}")
        return runs[-1 - back]
    if "/" in spec:
        run, why = read_entry(archive_dir / spec.rpartition("/")[0] / rid, spec.rpartition("/")[0])
        if run is None:
            raise DecodeGapError(f"archived run '{spec}' not found in {archive_dir} ({why})")
        return run
    found = [r for h in hardware_revisions(archive_dir) for r in list_runs(archive_dir, h, warn=False).runs
             if r.run_id == spec]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise DecodeGapError(f"archived run '{spec}' exists under several hardware revisions: "
                             + ", ".join(r.label for r in found) + "; use <hw-rev>/<run-id>")
    raise DecodeGapError(f"archived run '{spec}' not found in {archive_dir} "
                         "(use <hw-rev>/<run-id>, a path to an entry, or latest/previous; see the archive index.html)")


def slug(run: ArchivedRun) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{run.hw_rev}_{run.run_id}")


def fingerprint_changes(runs: Iterable[ArchivedRun]) -> list[set[str]]:
    """For each run (in order), the fingerprint components that differ from the run before it."""
    out, prev = [], None
    for r in runs:
        fp = r.fingerprint
        out.append(set() if prev is None else {k for k in set(fp) | set(prev) if fp.get(k) != prev.get(k)})
        prev = fp
    return out


@dataclass
class CompareTarget:
    """What the `compare` target needs at DAG-build time: the two specs, their runs and the output slug."""

    spec_a: str = ""
    spec_b: str = ""
    run_a: ArchivedRun | None = None
    run_b: ArchivedRun | None = None

    @property
    def slug(self) -> str:
        if self.run_a and self.run_b:
            return f"{slug(self.run_a)}--vs--{slug(self.run_b)}"
        return "missing-run_a-and-run_b"

    @property
    def inputs(self) -> dict[str, str]:
        if not (self.run_a and self.run_b):
            return {}
        return {"a": str(self.run_a.path / RUN_META), "b": str(self.run_b.path / RUN_META)}


def compare_target(config: dict[str, Any], archive_dir: str | os.PathLike, hw_rev: str) -> CompareTarget:
    """`--config run_a=... run_b=...` (Snakemake's --config needs keys of 2+ characters; `a`/`b` work in a
    config file). Resolves the runs only when both are given; a bad spec raises a one-line DecodeGapError."""
    spec_a = str(config.get("run_a") or config.get("a") or "")
    spec_b = str(config.get("run_b") or config.get("b") or "")
    target = CompareTarget(spec_a, spec_b)
    if spec_a and spec_b:
        target.run_a = resolve(spec_a, archive_dir, hw_rev)
        target.run_b = resolve(spec_b, archive_dir, hw_rev)
    return target
