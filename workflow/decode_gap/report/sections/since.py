"""The "since last run" section: deltas of headline figures and findings against the archived run."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...fingerprint import diff as fp_diff
from .. import charts as ch
from ..data import HEADLINE, HEADLINE_BETTER, HEADLINE_LABELS, SEVERITY_RANK, Fig, fmt_num, unavailable_fig
from .common import Builder


TREND_METRICS = ("live_itl_ms", "roofline_ms", "efficiency", "peak_output_throughput", "kernel_graph_ms",
                 "engine_eager_ms", "copy_gbps", "explained_fraction", "ttft_ms")


def delta_row(key: str, before: Fig, after: Fig) -> dict[str, Any]:
    better = HEADLINE_BETTER.get(key, "none")
    row = {"key": key, "label": HEADLINE_LABELS.get(key, key), "before": before, "after": after,
           "delta": "—", "pct": "—", "verdict": "same"}
    if before.ok and after.ok:
        d = after.value - before.value
        unit = "pp" if after.unit == "%" else after.unit
        row["delta"] = f"{'+' if d > 0 else ''}{fmt_num(d)} {unit}".strip() if d else "0"
        if before.value:
            row["pct"] = f"{'+' if d > 0 else ''}{d / abs(before.value) * 100:.1f}%"
        rel = abs(d) / abs(before.value) if before.value else (1.0 if d else 0.0)
        if rel > 0.02 and better != "none":
            row["verdict"] = "better" if (d < 0) == (better == "lower") else "worse"
        elif rel > 0.02:
            row["verdict"] = "changed"
    elif before.ok != after.ok:
        row["verdict"] = "changed"
        row["delta"] = "now measured" if after.ok else "no longer available"
    return row


def findings_delta(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, str]]:
    b = {str(f.get("id")): f for f in before}
    a = {str(f.get("id")): f for f in after}
    rows = []
    for fid in sorted(set(a) | set(b), key=lambda k: (SEVERITY_RANK.get(str((a.get(k) or b.get(k)).get("severity")), 5), k)):
        fa, fb = a.get(fid), b.get(fid)
        if fa and not fb:
            change = "new"
        elif fb and not fa:
            change = "resolved"
        elif str(fa.get("severity")) != str(fb.get("severity")):
            change = f"severity {fb.get('severity')} → {fa.get('severity')}"
        else:
            change = "still present"
        ref = fa or fb
        rows.append({"id": fid, "severity": str(ref.get("severity", "")), "title": str(ref.get("title", "")),
                     "change": change, "evidence_before": str((fb or {}).get("evidence", "")),
                     "evidence_after": str((fa or {}).get("evidence", ""))})
    return rows


def findings_brief(findings: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"id": f["id"], "severity": f["severity"], "title": f.get("title", ""), "evidence": f.get("evidence", "")}
            for f in findings]


def since_section(b: Builder, hw_rev: str, fingerprint: dict[str, str], figs: dict[str, Fig],
                  findings: list[dict[str, Any]], history: list[Any], history_warnings: list[str],
                  archive_note: str = "") -> dict[str, Any]:
    s: dict[str, Any] = {"id": "since", "title": "Since last run", "ok": bool(history),
                         "warnings": history_warnings, "archive_note": archive_note}
    if not history:
        s["why"] = f"this is the first archived run on hardware revision {hw_rev}" + (
            f" ({archive_note})" if archive_note else "")
        return s
    prev = history[-1]
    s["prev_id"] = prev.run_id
    s["prev_created"] = prev.created
    s["fp_diff"] = fp_diff(prev.fingerprint, fingerprint)
    prev_figs = {k: Fig.from_json(prev.headline.get(k)) for k, *_ in HEADLINE}
    s["deltas"] = [delta_row(k, prev_figs[k], figs[k]) for k, *_ in HEADLINE]
    s["findings"] = findings_delta(prev.findings, findings_brief(findings))
    # trend over this revision's runs (earlier ones from the archive, then this run)
    rows = []
    runs = [(r.run_id, r.headline, r.fingerprint) for r in history] + [
        ("this run", {k: f.to_json() for k, f in figs.items()}, fingerprint)]
    prev_fp = None
    for i, (rid, head, fpv) in enumerate(runs):
        change = ", ".join(f"{c['component']}: {c['before']} → {c['after']}"
                           for c in fp_diff(prev_fp, fpv)) if prev_fp is not None else "first run"
        prev_fp = fpv
        for k in TREND_METRICS:
            f = Fig.from_json(head.get(k)) if isinstance(head, dict) else unavailable_fig("")
            if f.ok:
                rows.append({"run": f"{i + 1}: {rid}", "metric": f"{HEADLINE_LABELS[k]} ({f.unit})".replace(" ()", ""),
                             "value": f.value, "current": "this run" if rid == "this run" else "earlier run",
                             "change": change or "no fingerprint change"})
    tdf = pd.DataFrame(rows)
    if len(runs) >= 2 and len(tdf):
        s["trend_chart"] = b.chart(f"Trend over the {len(runs)} runs of {hw_rev}", ch.trend, tdf,
                                   caption="archived runs of this hardware revision, oldest first; red: this run")
    s["n_runs"] = len(runs)
    return s
