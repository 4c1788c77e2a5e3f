"""The report context: every section in order, the subtitle and the run's metadata."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ... import __version__
from .. import charts as ch
from ..data import HEADLINE_LABELS, Bundle, headline
from ...secrets import redact_url
from ..trace_section import trace_section
from .common import Builder, _label, _short
from .headline import headline_section
from .audit import audit_section
from .roofline import roofline_section
from .microbench import microbench_section
from .simulation import simulation_section, waterfall_hosts
from .live import live_section
from .since import since_section
from .appendix import provenance_section, sources_rows


def build_context(bundle: Bundle, *, hw_rev: str, fingerprint: dict[str, str], run_config: dict[str, Any] | None = None,
                  datasheet: dict[str, Any] | None = None, history: list[Any] | None = None,
                  history_warnings: list[str] | None = None, archive_note: str = "", mode: str = "html",
                  generated: datetime | None = None) -> dict[str, Any]:
    b = Builder(mode)
    figs = headline(bundle)
    head = headline_section(b, bundle, figs)
    audit = audit_section(b, bundle)
    roof = roofline_section(b, bundle)
    micro = microbench_section(b, bundle, datasheet or {})
    sim = simulation_section(b, bundle, figs)
    if sim.get("waterfall_frame") is not None:
        wdf = sim.pop("waterfall_frame")
        head["waterfall_chart"] = b.chart("Where the time of one token goes: roofline → live ITL", ch.waterfall, wdf,
                                          caption="gap.json waterfall · teal measured, indigo modelled, red residual, "
                                                  "amber inconsistent (a lower level measured slower: not explained) · "
                                                  f"{waterfall_hosts(wdf)} · details in section 5")
    live = live_section(b, bundle)
    trace = trace_section(b, bundle)  # issue 13: report/templates/trace_section.html.j2
    since = since_section(b, hw_rev, fingerprint, figs, audit.get("findings", []), history or [],
                          history_warnings or [], archive_note)
    prov = provenance_section(b)
    cfg = dict(run_config or {})
    if cfg.get("endpoint"):
        cfg["endpoint"] = redact_url(str(cfg["endpoint"]))
    devices = sorted({d.device for d in bundle.docs.values() if d.device})
    generated = generated or datetime.now(timezone.utc)
    return {
        "mode": mode,
        "title": "decode-gap report",
        "hw_rev": hw_rev,
        "generated": generated.strftime("%Y-%m-%d %H:%M UTC"),
        "version": __version__,
        "config": [(k, _short(v, 120)) for k, v in cfg.items() if v not in (None, "", [], {})],
        "model": cfg.get("model", ""),
        "subtitle": _subtitle(cfg, bundle, (datasheet or {}).get("name", "")),
        "devices": devices,
        "fingerprint": fingerprint,
        "headline": head,
        "labels": HEADLINE_LABELS,
        "sections": [audit, roof, micro, sim, live, trace, since],
        "audit": audit, "roofline": roof, "microbench": micro, "simulation": sim, "live": live, "trace": trace,
        "since": since,
        "provenance": prov,
        "sources": sources_rows(bundle),
        "charts": b.charts,
    }


def _subtitle(cfg: dict[str, Any], bundle: Bundle, hw_name: str = "") -> str:
    roof = bundle.doc("roofline")
    model = _label(roof.get("model", default="") or cfg.get("model", "") or "")
    model = model.rsplit("/", 1)[-1].removesuffix(".json")
    parts = [model, _label(roof.get("weight_format", default="") or cfg.get("weight_format", "") or "")]
    hw = _label(roof.get("hardware", default="") or cfg.get("hardware", "") or "")
    if hw in ("", "auto") and hw_name:
        hw = hw_name
    tp = roof.get("tp", default=None) or cfg.get("tp")
    if hw:
        parts.append(hw + (f" · TP{tp}" if tp else ""))
    return " · ".join(p for p in parts if p)
