"""A results/<hw-rev>/ tree to render, possibly copied from the host that measured it (the `render` target).

Reads files only: the hardware revision comes from the config, the fingerprint from gap.json (written on the
measuring host), and nothing about the rendering host is probed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DecodeGapError
from .data import OPTIONAL_STAGE_FILES, STAGE_FILES

# What the report reads, plus the server calibration the archive keeps beside it.
ARCHIVED_FILES: tuple[str, ...] = (*STAGE_FILES.values(), "simulate/server.json")
OPTIONAL_FILES: frozenset[str] = frozenset(STAGE_FILES[n] for n in OPTIONAL_STAGE_FILES)


def present_files(d: str | Path, rels=ARCHIVED_FILES) -> list[str]:
    """`rels` less the optional files a copied tree lacks."""
    return [rel for rel in rels if rel not in OPTIONAL_FILES or (Path(d) / rel).is_file()]


@dataclass
class CopiedResults:
    hardware_revision: str
    path: Path
    fingerprint: dict[str, str] = field(default_factory=dict)


def _revisions(results: Path) -> list[str]:
    return sorted(p.parent.name for p in results.glob("*/gap.json"))


def copied_results(results: str | Path, hw_rev: str) -> CopiedResults:
    """The tree results/<hw_rev>/ with every file the report and archive read; one-line error otherwise."""
    results = Path(results)
    if not hw_rev:
        have = _revisions(results)
        raise DecodeGapError("config field 'hardware_revision' is required: the results/<hw-rev>/ directory to "
                             "render (" + (f"results/ holds: {', '.join(have)}" if have else "results/ holds none")
                             + ")")
    d = results / hw_rev
    if not d.is_dir():
        raise DecodeGapError(f"results/{hw_rev}/ does not exist: copy it from the measuring host")
    missing = [rel for rel in ARCHIVED_FILES if rel not in OPTIONAL_FILES and not (d / rel).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DecodeGapError(f"results/{hw_rev}/{missing[0]} is missing{more}: copy the whole results/{hw_rev}/ "
                             "directory from the measuring host (render never measures)")
    try:
        gap = json.loads((d / "gap.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DecodeGapError(f"results/{hw_rev}/gap.json cannot be read ({type(exc).__name__})") from None
    rev = gap.get("hardware_revision") if isinstance(gap, dict) else None
    if rev and rev != hw_rev:
        raise DecodeGapError(f"results/{hw_rev}/gap.json was written for hardware revision {rev}: render "
                             f"results/{rev}/ instead (a revision's files are never mixed with another's)")
    fingerprint = gap.get("fingerprint") if isinstance(gap, dict) else None
    return CopiedResults(hw_rev, d, {str(k): str(v) for k, v in (fingerprint or {}).items()})


def measured_elsewhere(results_dir: str | Path, host_devices: list[str]) -> str:
    """Why the measuring rules must not write into results_dir from this host ('' when they may).

    A tree whose gap.json says its levels ran on a device this host does not have came from another machine:
    re-measuring any stage into it would mix hosts in one waterfall.
    """
    d = Path(results_dir)
    try:
        gap = json.loads((d / "gap.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    run = ((gap.get("measured_on") or {}).get("run") or {}) if isinstance(gap, dict) else {}
    device = run.get("device") if isinstance(run, dict) else None
    if not device or device in host_devices:
        return ""
    return (f"{d.as_posix()}/ was measured on {device}, which this host ({', '.join(host_devices)}) does not have: "
            f"render it with `snakemake --cores 1 render --config hardware_revision={d.name}`, or measure this host "
            "under another hardware_revision")
