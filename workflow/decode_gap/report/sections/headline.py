"""The headline section: the figures that answer the question, the closure verdict and the levers."""

from __future__ import annotations

from typing import Any

from ...provenance import MEASURED, UNAVAILABLE
from ..data import HEADLINE, Bundle, Doc, Fig, first_key, fmt_num, num, parse_provenance
from .common import Builder, _short


def headline_section(b: Builder, bundle: Bundle, figs: dict[str, Fig]) -> dict[str, Any]:
    for key, label, _, _ in HEADLINE:
        b.fig(label, figs[key])
    gap = bundle.doc("gap")
    levers = levers_list(gap)
    roof, itl, eff = figs["roofline_ms"], figs["live_itl_ms"], figs["efficiency"]
    # the floor of a hardware with no datasheet bandwidth (a CPU) is the gap's: the bytes at the measured read
    measured_floor = roof.ok and roof.source.startswith(bundle.doc("gap").rel)
    basis = " (the step's bytes at the measured bandwidth)" if measured_floor else ""
    if roof.ok and itl.ok:
        summary = (f"Decode runs at {itl.text()}/token against a roofline floor of {roof.text()}{basis}: "
                   f"{eff.text()} efficiency, a {figs['gap_factor'].text()} gap.")
        if figs["explained_fraction"].ok:
            summary += f" {figs['explained_fraction'].text()} of the live ITL is attributed to named components."
        hl = gap.get("headline", default={}) if gap.usable else {}
        if isinstance(hl, dict) and hl.get("inconsistency_note"):
            summary += f" {str(hl['inconsistency_note'])[:1].upper()}{str(hl['inconsistency_note'])[1:]}."
        if isinstance(hl, dict) and hl.get("closure_pass") is not None and hl.get("closure_ratio") is not None:
            summary += " " + closure_verdict(gap, hl)
        refused = gap.get("refused_levels", default={}) if gap.usable else {}
        if isinstance(refused, dict) and refused:
            summary += (f" Refused, measured on another host: {', '.join(refused)} level"
                        f"{'s' if len(refused) > 1 else ''}.")
    elif roof.ok:
        summary = (f"The roofline floor is {roof.text()}/token ({figs['tokens_per_s_ceiling'].text()}); "
                   f"the live decode latency was not measured ({itl.why}).")
        graph = figs["kernel_graph_ms"]
        if graph.ok and roof.value and not kernel_stand_in(bundle):  # what the run did measure: the kernels alone
            summary += (f" The kernels alone take {graph.text()} a step in one CUDA graph, "
                        f"{graph.value / roof.value:.1f}× the floor (the kernel level).")
    else:
        summary = f"The roofline could not be computed ({roof.why})."
    hl = gap.get("headline", default={}) if gap.usable else {}
    measured_on = str(hl.get("measured_on") or "") if isinstance(hl, dict) else ""
    return {"id": "headline", "title": "Headline", "ok": True, "figs": figs, "summary": summary,
            "measured_on": measured_on,
            "floor_label": "Floor at measured bandwidth" if measured_floor else "Theoretical floor",
            "kernel_stand_in": kernel_stand_in(bundle),
            "levers": levers[:3], "levers_why": "" if levers else (gap.why or "gap.json lists no levers")}


def kernel_stand_in(bundle: Bundle) -> str:
    """Why the kernel level's step is not the run's (simulate.json: stand-in weights of another format), or ""."""
    sim = bundle.doc("simulate")
    if not sim.usable or sim.get("kernel", "format_match", default=True) is not False:
        return ""
    return str(sim.get("kernel", "stand_in", default="") or "stand-in weights, not the run's format")


def closure_verdict(gap: Doc, hl: dict[str, Any]) -> str:
    """The closure verdict in the headline: pass or fail, by how much, on which basis (issue 12)."""
    ratio = num(hl.get("closure_ratio"))
    residual, itl = num(gap.get("residual_ms")), num(gap.get("live_itl_ms"))
    basis = hl.get("closure_basis") or "?"
    size = (f"; residual {residual:+.2f} ms per token ({residual / itl:+.0%} of the live ITL)"
            if residual is not None and itl else "")
    if hl.get("closure_pass"):
        return f"Closure passes: the levels predict the live ITL (ratio {ratio:.2f}, basis {basis}{size})."
    return (f"Closure fails: ratio {ratio:.2f} (pass: within ±15% with at least 85% explained), "
            f"basis {basis}{size}.")


def levers_list(gap: Doc) -> list[dict[str, Any]]:
    raw = gap.get("levers", default=[]) if gap.usable else []
    out = []
    for lv in raw if isinstance(raw, list) else []:
        if not isinstance(lv, dict):
            continue
        ms = num(first_key(lv, "ms_saved", "saves_ms", "saved_ms", "delta_ms", "ms", "savings_ms"))
        ev = lv.get("evidence", "")
        if isinstance(ev, (dict, list)):
            ev = _short(ev, 400)
        status, detail = parse_provenance(str(lv.get("saves_status") or lv.get("status") or ""))
        out.append({"name": str(first_key(lv, "name", "lever", "title") or "lever"), "ms": ms,
                    "ms_text": f"−{fmt_num(ms)} ms" if ms is not None else "saving not quantified",
                    "status": (status or MEASURED) if ms is not None else UNAVAILABLE,
                    "why": detail if ms is None else "",
                    "evidence": str(ev or ""), "source": str(lv.get("source", "") or "")})
    out.sort(key=lambda x: -(x["ms"] if x["ms"] is not None else -1))
    return out
