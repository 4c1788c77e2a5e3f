"""The simulation and gap section: the waterfall from gap.json and the simulated levels."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

from ...provenance import MEASURED, MODELLED
from .. import charts as ch
from ..data import HEADLINE_LABELS, Bundle, Doc, Fig, first_key, fmt_num, num, one_rank_allreduce_step
from .common import Builder
from .headline import kernel_stand_in, levers_list
from .microbench import CAPPED_FROM


WATERFALL_TOTAL = ("live", "itl", "total", "server level")


def _host(measured_on: str) -> str:
    """The device part of a waterfall row's `measured_on`."""
    return measured_on.split(", rev ")[0].replace(" (device not visible to the client)", "").removeprefix("NVIDIA ")


HOST_MARKS = ("†", "‡", "§", "¶")  # after a bar's value: measured on another device than most steps


def _device(step: dict[str, Any]) -> str:
    """The device a drawn step was measured on, "" where it names none ("not recorded", a modelled "no host")."""
    on = step["measured_on"]
    return "" if step["ms"] is None or not on or on.startswith(("not recorded", "no host")) else _host(on)


def waterfall_hosts(frame: pd.DataFrame) -> str:
    """The caption's words for where the waterfall's steps were measured (waterfall_frame's labels and marks)."""
    usual = frame.attrs.get("usual_host", "")
    if not usual:
        return "where each step was measured: section 5's table"
    others = "".join(f"; {mark} on {host}" for mark, host in frame.attrs.get("other_hosts", []))
    return f"measured on {usual}{others}"


def waterfall_frame(steps: list[dict[str, Any]]) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Steps -> bars with start/end: the base (roofline), increments, the residual, the total (live ITL) last.

    gap.json marks each step's `kind` (start, step, residual, total); without it the first step is the base and a
    step named like "live ITL" the total. A step without ms stays in the table (with its why), not in the chart.
    """
    parsed = []
    for i, st in enumerate(steps):
        if not isinstance(st, dict):
            continue
        name = str(first_key(st, "name", "step", "label") or f"step {i + 1}")
        ms = num(first_key(st, "ms", "value", "ms_per_token"))
        status = str(st.get("status") or st.get("provenance") or "")
        status = status.split(":")[0].strip().lower() if status else ""
        kind = str(st.get("kind", "")).lower()
        note = " ".join(str(x) for x in (st.get("why"), st.get("note")) if x)
        inc = st.get("inconsistency") if st.get("inconsistent") and isinstance(st.get("inconsistency"), dict) else None
        parsed.append({"name": name, "ms": ms, "absorbs": st.get("absorbs") or [],
                       "source": str(st.get("source", "") or ""), "status": status,
                       "kind": kind, "note": note, "measured_on": str(st.get("measured_on") or ""),
                       "inconsistency": (f"inconsistent: {inc.get('what', '')}; likely cause: "
                                         f"{inc.get('likely_cause', '')}; not counted as explained") if inc else ""})
    if not parsed:
        return pd.DataFrame(), []

    def is_total(p: dict[str, Any], i: int) -> bool:
        if p["kind"]:
            return p["kind"] == "total"
        return i > 0 and any(w in p["name"].lower() for w in WATERFALL_TOTAL) and "residual" not in p["name"].lower()

    def is_residual(p: dict[str, Any]) -> bool:
        return p["kind"] == "residual" or (not p["kind"] and ("residual" in p["name"].lower()
                                                              or "unexplained" in p["name"].lower()))

    starts = [p for p in parsed if p["kind"] == "start"]
    base = starts[0] if starts else parsed[0]
    totals = [p for i, p in enumerate(parsed) if p is not base and is_total(p, i)]
    incs = [p for p in parsed if p is not base and p not in totals]
    incs.sort(key=lambda p: is_residual(p))  # the residual goes last, just before the total
    rows, cur = [], 0.0
    ordered = [base, *incs, *totals]
    # the caption names the device most steps were measured on, and each other device after a mark, which a bar
    # measured there carries: a device's name after a bar ("· cpu: Intel(R) Xeon(R)…") ran past the plot and
    # widened the headline chart past the PDF page
    for p in ordered:
        p["device"] = "" if p is base else _device(p)
    hosts = [p["device"] for p in ordered if p["device"]]
    usual = Counter(hosts).most_common(1)[0][0] if hosts else ""
    others = list(dict.fromkeys(h for h in hosts if h != usual))
    marks = {h: HOST_MARKS[i] if i < len(HOST_MARKS) else f"*{i + 1}" for i, h in enumerate(others)}
    for p in ordered:
        ms = p["ms"]
        if ms is None:
            p["kind_label"] = "unavailable"
            continue
        if p is base or p in totals:
            start, end, kind = 0.0, ms, "roofline / live"
            cur = ms if p is base else cur
        else:
            start, end = cur, cur + ms
            cur = end
            kind = ("inconsistent" if p["inconsistency"] else "residual" if is_residual(p)
                    else (MODELLED if p["status"].startswith(MODELLED) else MEASURED))
        p["kind_label"] = kind
        label = f"{'+' if p in incs and ms >= 0 else ''}{fmt_num(ms)} ms"
        if p["inconsistency"]:
            label += " inconsistent"
        if p["device"] in marks:
            label += f" {marks[p['device']]}"
        # a step that absorbed unavailable ones names them all: the chart's axis gets its gist, the table the name
        step = ("engine step beyond its bytes"
                if p["absorbs"] and p["name"].endswith("framework overhead") else p["name"])
        rows.append({"step": step, "start": min(start, end), "end": max(start, end), "ms": ms,
                     "right": max(start, end), "label": label,
                     "kind": kind, "source": p["source"], "measured_on": p["measured_on"]})
    frame = pd.DataFrame(rows)
    frame.attrs["usual_host"] = usual
    frame.attrs["other_hosts"] = [(marks[h], h) for h in others]
    return frame, ordered


def _where(gap: Doc, level: str) -> str:
    """Where gap.json says a level was measured (device, hardware revision), 'refused' when it was refused."""
    ident = gap.get("measured_on", "levels", level) if gap.usable else None
    if not isinstance(ident, dict):
        return "not recorded"
    text = ", ".join(str(x) for x in (ident.get("device") or "device not recorded",
                                      f"rev {ident['hardware_revision']}" if ident.get("hardware_revision") else "")
                     if x)
    refused = gap.get("refused_levels", default={}) or {}
    return text + (" (refused: another host)" if isinstance(refused, dict) and level in refused else "")


def step_clock_note(clock: Any) -> str:
    """A line under the kernel level when its CUDA-graph replays ran under the GPU's power or thermal cap for at
    least CAPPED_FROM of a segment's timing (simulate/kernel.json `clock`); empty otherwise or where not recorded."""
    frac = num(clock.get("capped_frac")) if isinstance(clock, dict) else None
    if frac is None or frac < CAPPED_FROM:
        return ""
    caps = " and ".join(str(clock.get("capped_by") or "power").split("+"))
    mhz = num(clock.get("sm_clock_mhz_min"))
    return (f"The kernel-level step's CUDA-graph replays ran with the GPU's clocks held down by its {caps} cap for up "
            f"to {frac * 100:.0f}% of a segment's timing" + (f" (SM clock {mhz:.0f} MHz)" if mhz is not None else "")
            + ": the step time includes the lower clock, as a server's under the same load would (measured, NVML).")


def simulation_section(b: Builder, bundle: Bundle, figs: dict[str, Fig]) -> dict[str, Any]:
    sim, gap = bundle.doc("simulate"), bundle.doc("gap")
    s: dict[str, Any] = {"id": "simulation", "title": "Gap attribution and simulation",
                         "ok": sim.usable or gap.usable,
                         "why": "; ".join(x for x in {sim.why, gap.why} if x) or "no simulation or gap file",
                         "device": sim.device, "sim_why": sim.why, "gap_why": gap.why}
    if not s["ok"]:
        return s
    # waterfall
    steps = gap.get("waterfall", default=[]) if gap.usable else []
    wdf, ordered = waterfall_frame(steps if isinstance(steps, list) else [])
    live = figs["live_itl_ms"]
    if len(wdf):
        s["waterfall_frame"] = wdf
        s["waterfall_chart"] = b.chart("", ch.waterfall, wdf,
                                       caption=f"{gap.rel}: waterfall · teal measured, indigo modelled, red residual, "
                                               f"amber inconsistent · {waterfall_hosts(wdf)}")
        s["waterfall_rows"] = [{"name": p["name"], "ms": fmt_num(p["ms"]) if p["ms"] is not None else "unavailable",
                                "share": (f"{p['ms'] / live.value * 100:.1f}%" if p["ms"] is not None and live.ok
                                          and live.value else "—"),
                                "status": p.get("status") or "", "kind": p.get("kind_label", ""),
                                "source": p["source"], "note": p.get("note", ""),
                                "measured_on": p.get("measured_on", ""),
                                "inconsistency": p.get("inconsistency", "")} for p in ordered]
    else:
        s["waterfall_why"] = gap.why or f"{gap.rel} has no waterfall"
    s["gap_figs"] = [(HEADLINE_LABELS[k], figs[k]) for k in ("efficiency", "explained_fraction", "closure_ratio")]
    if gap.data:
        hl = gap.get("headline", default={}) or {}
        s["unexplained"] = str(hl.get("unexplained_component") or gap.get("unexplained_component", default="") or "")
        # no closure ratio (no live ITL or no prediction): closure is not checked, which is not a failure
        s["closure_pass"] = (hl.get("closure_pass") if isinstance(hl, dict) and num(hl.get("closure_ratio")) is not None
                             else None)
        s["negative_residual"] = bool(hl.get("negative_residual")) if isinstance(hl, dict) else False
        s["inconsistency_note"] = str(hl.get("inconsistency_note") or "") if isinstance(hl, dict) else ""
        refused = gap.get("refused_levels", default={}) or {}
        s["refused"] = [f"{k}: {v}" for k, v in refused.items()] if isinstance(refused, dict) else []
        s["measured_on"] = str(hl.get("measured_on") or "") if isinstance(hl, dict) else ""
        notes = gap.get("notes", default=[]) or []
        s["gap_notes"] = [str(n) for n in notes] if isinstance(notes, list) else [str(notes)]
        if gap.state == "partial" and gap.why:
            s["gap_notes"].insert(0, f"partial: {gap.why}")
    s["levers"] = levers_list(gap)
    # the levels side by side
    lv_rows, lv_chart = [], []
    roof = figs["roofline_ms"]
    if roof.ok:
        lv_chart.append({"level": "roofline", "variant": "modelled", "ms": roof.value, "source": roof.source})
    for level, label in (("kernel", "kernel level"), ("engine", "engine level")):
        e, g = figs[f"{level}_eager_ms"], figs[f"{level}_graph_ms"]
        name = str(sim.get(level, "engine", default="") or "") if level == "engine" else ""
        row = {"level": label + (f" ({name})" if name else ""), "eager": e, "graph": g,
               "where": _where(gap, level),
               "diff": fmt_num(e.value - g.value) + " ms" if e.ok and g.ok else "—",
               "why": "" if (e.ok or g.ok) else (e.why or g.why)}
        lv_rows.append(row)
        for variant, f in (("eager", e), ("graph", g)):
            if f.ok:
                lv_chart.append({"level": row["level"], "variant": variant, "ms": f.value, "source": f.source})
    if live.ok:
        lv_chart.append({"level": "server (live ITL)", "variant": "live", "ms": live.value, "source": live.source})
    s["level_rows"] = lv_rows
    s["live_fig"] = live
    s["live_where"] = _where(gap, "live")
    if len(lv_chart) >= 2:
        s["levels_chart"] = b.chart("The levels side by side", ch.levels, pd.DataFrame(lv_chart),
                                    caption="roofline (modelled), kernel and engine level (measured, eager and graph), "
                                            "server level (live ITL)")
    else:
        s["levels_why"] = "fewer than two levels measured"
    s["launch_overhead"] = (figs["kernel_eager_ms"].value - figs["kernel_graph_ms"].value
                            if figs["kernel_eager_ms"].ok and figs["kernel_graph_ms"].ok else None)
    # engine minus kernel is the framework's only where both ran the run's weights: a stand-in kernel level (fp32 for
    # a GGUF file, say) moves other bytes through other kernels
    s["kernel_stand_in"] = kernel_stand_in(bundle)
    both = figs["engine_eager_ms"].ok and figs["kernel_eager_ms"].ok
    s["framework_overhead"] = (figs["engine_eager_ms"].value - figs["kernel_eager_ms"].value
                               if both and not s["kernel_stand_in"] else None)
    s["framework_overhead_why"] = ("not computed: the kernel level ran stand-in weights, not the run's format"
                                   if both and s["kernel_stand_in"] else "")
    # kernel components
    comps = sim.get("kernel", "components", default=[]) if sim.usable else []
    crow = []
    for c in comps if isinstance(comps, list) else []:
        if isinstance(c, dict):
            ms = num(first_key(c, "ms", "value", "time_ms"))
            status = str(first_key(c, "status", "provenance", "label") or MEASURED).split(":")[0].strip().lower()
            crow.append({"name": str(first_key(c, "name", "component") or "?"), "ms": ms,
                         "status": status if status in (MEASURED, MODELLED) else MEASURED})
    total = sum(c["ms"] for c in crow if c["ms"] is not None)
    s["components"] = [{**c, "ms_t": fmt_num(c["ms"]), "share": f"{c['ms'] / total * 100:.1f}%" if total and c["ms"] is not None else "—"}
                       for c in sorted(crow, key=lambda c: -(c["ms"] or 0))]
    s["components_total"] = fmt_num(total) if crow else None
    s["components_clock"] = "CUDA graph" if figs["kernel_graph_ms"].ok else "eager"
    if crow:
        s["components_chart"] = b.chart("", ch.components,
                                        pd.DataFrame([c for c in crow if c["ms"] is not None]),
                                        caption=f"{sim.rel}: kernel.components")
    else:
        s["components_why"] = sim.get("kernel", "reason", default="") if sim.usable else sim.why
        s["components_why"] = s["components_why"] or f"{sim.rel} lists no kernel components"
    kern = sim.get("kernel", default={}) if sim.usable else {}
    s["scaling"] = None
    if isinstance(kern, dict) and (kern.get("layers_simulated") is not None or kern.get("scale") is not None):
        s["scaling"] = {"layers": kern.get("layers_simulated"), "scale": fmt_num(num(kern.get("scale")))}
    s["engine_reason"] = str(sim.get("engine", "reason", default="") or "") if sim.usable else ""
    s["kernel_backend"] = str(sim.get("kernel", "backend", default="") or "") if sim.usable else ""
    s["kernel_clock_note"] = step_clock_note(sim.get("kernel", "clock", default=None) if sim.usable else None)
    notes = kern.get("notes") if isinstance(kern, dict) else None  # which kernels ran (e.g. fp8 GEMV choices)
    s["kernel_notes"] = [str(n) for n in notes] if isinstance(notes, list) else []
    # one GPU standing for tp: the gap counts the datasheet's all-reduces, not the kernel level's 1-rank calls
    ar_step = one_rank_allreduce_step(gap)
    if ar_step and num(ar_step.get("ms")) is not None:
        s["kernel_notes"].append(f"The gap counts the all-reduces at {fmt_num(num(ar_step['ms']))} ms, not this "
                                 f"table's: {ar_step['note']}.")
    s["engine_backend"] = str(sim.get("engine", "backend", default="") or "") if sim.usable else ""
    return s
