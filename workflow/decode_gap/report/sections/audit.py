"""The system audit section: facts and findings from audit.json."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..data import SEVERITY_RANK, Bundle, audit_findings
from ...secrets import REDACTED, SECRET_NAME
from .common import Builder, META_KEYS, _short


def audit_facts(data: dict[str, Any], limit: int = 120) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []

    def add(key: str, value: Any, source: str = "") -> None:
        if SECRET_NAME.search(key.rsplit(".", 1)[-1]) and value not in ("", None, "<redacted>", REDACTED):
            value = REDACTED
        if isinstance(value, str) and "\n" in value.strip():
            rows.append({"key": key, "value": value[:4000], "pre": True, "source": _short(source, 120)})
        else:
            rows.append({"key": key, "value": _short(value), "source": _short(source, 120)})

    def walk(key: str, value: Any, depth: int) -> None:
        if len(rows) >= limit:
            return
        if isinstance(value, dict):
            if "value" in value and set(value) <= {"value", "source", "why", "status", "unit", "raw"}:
                v = value.get("value")
                add(key, v if v is not None else f"unavailable: {value.get('why', '')}", value.get("source", ""))
                return
            if depth >= 3:
                add(key, value)
                return
            for k, v in value.items():
                walk(f"{key}.{k}" if key else str(k), v, depth + 1)
        elif isinstance(value, list):
            if all(not isinstance(x, (dict, list)) for x in value):
                add(key, ", ".join(str(x) for x in value) if value else "—")
            elif depth >= 3:
                add(key, value)
            else:
                for i, x in enumerate(value[:16]):
                    walk(f"{key}[{i}]", x, depth + 1)
        else:
            add(key, "—" if value is None else value)

    for k, v in data.items():
        if k in META_KEYS:
            continue
        walk(str(k), v, 1)
    return rows


def audit_section(b: Builder, bundle: Bundle) -> dict[str, Any]:
    doc = bundle.doc("audit")
    s: dict[str, Any] = {"id": "audit", "title": "System audit", "ok": doc.usable, "why": doc.why,
                         "device": doc.device, "rel": doc.rel}
    if not doc.usable:
        return s
    findings = audit_findings(doc)
    s["findings"] = findings
    counts = Counter(f["severity"] for f in findings)
    s["counts"] = sorted(counts.items(), key=lambda kv: SEVERITY_RANK.get(kv[0], 5))
    s["facts"] = audit_facts(doc.data or {})
    nc = doc.get("not_checked", default=[]) or []
    s["not_checked"] = [{"id": str(x.get("id", "?")), "why": str(x.get("why", ""))} for x in nc if isinstance(x, dict)]
    s["partial"] = doc.state == "partial"
    return s
