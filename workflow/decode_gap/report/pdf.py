"""The PDF through weasyprint (charts are SVG images made by vl-convert), written atomically."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path


def write_pdf(html: str, path: str | os.PathLike, base_url: str | os.PathLike | None = None) -> None:
    from weasyprint import HTML

    # weasyprint logs every CSS property it ignores; keep the rule's log to real problems
    for name in ("weasyprint", "fontTools"):
        logging.getLogger(name).setLevel(logging.ERROR)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        HTML(string=html, base_url=str(base_url or path.parent)).write_pdf(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
