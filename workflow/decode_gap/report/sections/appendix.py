"""The sources and provenance appendix: every stage file read and every placed figure's label."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...provenance import MEASURED, MODELLED, UNAVAILABLE
from ..data import Bundle
from .common import Builder, _short


def sources_rows(bundle: Bundle) -> list[dict[str, str]]:
    rows = []
    for name, d in bundle.docs.items():
        rows.append({"file": d.rel, "state": d.state, "device": d.device, "backend": _short(d.backend, 80),
                     "why": d.why})
    for name, t in bundle.tables.items():
        rows.append({"file": t.rel, "state": "ok" if t.usable else ("missing" if t.df is None and "not produced" in t.why
                                                                     else "empty"),
                     "device": "", "backend": "", "why": "" if t.usable else t.why})
    return sorted(rows, key=lambda r: r["file"])


def provenance_section(b: Builder) -> dict[str, Any]:
    counts = Counter(f.status if f.ok else UNAVAILABLE for _, f in b.figs)
    seen, unavailable = set(), []
    for label, f in b.figs:
        if not f.ok and label not in seen:
            seen.add(label)
            unavailable.append({"label": label, "why": f.why or "not available"})
    return {"counts": {k: counts.get(k, 0) for k in (MEASURED, MODELLED, UNAVAILABLE)}, "unavailable": unavailable}
