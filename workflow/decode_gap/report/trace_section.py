"""Report section: one decode step from the profiler trace (trace.json).

A timeline of the median step (kernels on a time axis, coloured by category, idle gaps visible), time per
category beside the kernel-level simulation's components, the top kernels, and per-rank skew. Reads only
trace.json and simulate.json (the trace records which kernel-level components each category covers).
"""

from __future__ import annotations

import re
from typing import Any

import altair as alt
import pandas as pd

from ..provenance import MEASURED, MODELLED
from . import charts as ch
from .data import Bundle, Fig, fmt_num, num

CATEGORY_COLORS = {
    "GEMM bf16": "#2563eb", "GEMM fp8": "#1d4ed8", "GEMM fp4": "#1e3a8a", "GEMM fp16": "#3b82f6",
    "GEMM fp32": "#60a5fa", "GEMM int8": "#93c5fd", "GEMM dtype?": "#6366f1", "grouped/MoE GEMM": "#7c3aed",
    "attention": "#f59e0b", "MoE routing/top-k/permute": "#db2777", "all-reduce / NCCL": "#dc2626",
    "norm/activation/elementwise": "#0f766e", "sampling": "#65a30d", "memcpy/memset": "#0891b2",
    "other": "#94a3b8",
}


def timeline_chart(df: pd.DataFrame, wall_ms: float | None) -> alt.LayerChart:
    """Kernels of one step as bars on a µs axis (one row per stream); white space is GPU idle."""
    df = ch._need(df, "start_us", "dur_us", "category", "stream", what="step timeline").copy()
    df["end_us"] = df["start_us"] + df["dur_us"].clip(lower=0.05)  # keep sub-ns kernels visible
    df["stream"] = df["lane"] if "lane" in df.columns else "stream " + df["stream"].astype(str)
    cats = [c for c in CATEGORY_COLORS if c in set(df["category"])] + sorted(set(df["category"]) - set(CATEGORY_COLORS))
    color = alt.Color("category:N", scale=alt.Scale(domain=cats, range=[CATEGORY_COLORS.get(c, "#64748b") for c in cats]),
                      legend=alt.Legend(title=None, orient="bottom", columns=4))
    x_max = max(float(df["end_us"].max()), (wall_ms or 0) * 1e3)
    bars = alt.Chart(df).mark_bar(cornerRadiusEnd=0, height=16).encode(
        x=alt.X("start_us:Q", title="µs from the step's start", scale=alt.Scale(domain=[0, x_max])),
        x2="end_us:Q",
        y=alt.Y("stream:N", title=None),
        color=color,
        tooltip=["name:N", "category:N", alt.Tooltip("dur_us:Q", format=".1f", title="µs"),
                 alt.Tooltip("start_us:Q", format=".1f", title="start µs")],
    )
    return bars.properties(width=ch.WIDTH, height=max(40, 26 * df["stream"].nunique()))


def category_rows(doc_cats: dict[str, Any], details: dict[str, Any], kernel_components: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    """Trace ms/step per kernel-level group beside the kernel level's matching components."""
    kc: dict[str, float | None] = {}
    for c in kernel_components or []:
        if isinstance(c, dict) and c.get("name"):
            name = re.sub(r"\s*\(.*\)$", "", str(c["name"]))  # "attention (KV 512)" is the attention component
            kc[name] = num(c.get("graph_ms")) if num(c.get("graph_ms")) is not None else num(c.get("ms"))
    groups: dict[str, dict[str, Any]] = {}
    for cat, ms in (doc_cats or {}).items():
        comps = (details.get(cat) or {}).get("kernel_level_components") or []
        key = "GEMM (all dtypes)" if cat.startswith("GEMM ") else cat
        g = groups.setdefault(key, {"group": key, "trace_ms": 0.0, "cats": [], "components": comps})
        g["trace_ms"] += num(ms) or 0.0
        g["cats"].append(cat)
    rows = []
    for g in sorted(groups.values(), key=lambda g: -g["trace_ms"]):
        vals = [kc[n] for n in g["components"] if kc.get(n) is not None]
        kl = sum(vals) if vals else None
        rows.append({"group": g["group"], "detail": ", ".join(g["cats"]) if len(g["cats"]) > 1 else "",
                     "trace": fmt_num(g["trace_ms"]), "kernel": fmt_num(kl) if kl is not None else "—",
                     "components": ", ".join(g["components"]) or "— (not in the kernel level)",
                     "ratio": f"{g['trace_ms'] / kl:.2f}×" if kl else "—"})
    return rows


def overhead_rows(b: Any, po: dict[str, Any], src: str) -> dict[str, Any]:
    """The traced step against the unprofiled step of the same process: raw, the profiler's measured costs,
    corrected (trace.json `profiler_overhead`)."""
    if po.get("status") != "ok":
        return {"ok": False, "why": po.get("why") or "not in trace.json"}
    prov = po.get("provenance") or {}

    def f(key: str, label: str, status: str = MEASURED, unit: str = "ms") -> tuple[str, Fig]:
        v = num(po.get(key))
        why = "" if v is not None else ("not applied" if prov.get(key) == "not applied" else "not in trace.json")
        return label, b.fig(f"trace: {label}", Fig(v, unit, status if v is not None else "unavailable", src, why))

    rng = po.get("kernel_cost_ms_range") or []
    return {
        "ok": True,
        "rows": [f("busy_plus_idle_ms", "busy + idle, as traced"),
                 f("unprofiled_step_ms", "unprofiled step (same process, before profiling)"),
                 f("host_excess_ms", "profiler's host-side cost (time outside the GPU span, over unprofiled)"),
                 f("kernel_cost_ms", "profiler's GPU cost per step (kernels × calibrated cost)", MODELLED),
                 f("busy_plus_corrected_idle_ms", "busy + corrected idle", MODELLED)],
        "ratio_raw": f"{num(po.get('ratio_raw')):.3f}" if num(po.get("ratio_raw")) is not None else "—",
        "ratio": f"{num(po.get('ratio_corrected')):.3f}" if num(po.get("ratio_corrected")) is not None else "—",
        "within": bool(po.get("within_tolerance")), "within_raw": bool(po.get("within_tolerance_raw")),
        "tolerance": f"{(num(po.get('tolerance')) or 0.05) * 100:.0f}%",
        "per_kernel": (f"{num(po.get('per_kernel_us')):.3f} µs per kernel"
                       + (f" (calibration range {fmt_num(num(rng[0]))}–{fmt_num(num(rng[1]))} ms per step)"
                          if len(rng) == 2 else "")) if num(po.get("per_kernel_us")) is not None else "",
        "basis": po.get("basis", ""),
    }


def trace_section(b: Any, bundle: Bundle) -> dict[str, Any]:
    doc = bundle.doc("trace")
    s: dict[str, Any] = {"id": "trace", "title": "Decode step from the profiler trace", "ok": doc.usable,
                         "why": doc.why, "rel": doc.rel}
    if not doc.usable:
        return s
    d = doc.data or {}
    src = f"{doc.rel}: {d.get('method', '')}"

    def fig(key: str, label: str, unit: str = "ms") -> Fig:
        v = num(d.get(key))
        f = Fig(v, unit, MEASURED if v is not None else "unavailable", src, "" if v is not None else "not in trace.json")
        return b.fig(f"trace: {label}", f)

    s["partial"] = doc.state == "partial"
    s["reason"] = d.get("reason", "")
    s["source"] = d.get("source") or {}
    s["figs"] = [("step wall (median)", fig("step_ms_median", "step")),
                 ("GPU busy (union of kernels)", fig("gpu_busy_ms_median", "busy")),
                 ("GPU idle", fig("gpu_idle_ms_median", "idle")),
                 ("kernels per step", fig("kernels_per_step_median", "kernels per step", "")),
                 ("step start to next start", fig("period_ms_median", "period"))]
    s["figs"] += [("GPU span (first to last GPU op)", fig("gpu_span_ms_median", "GPU span")),
                  ("launch wait (step start to first GPU op)", fig("launch_wait_ms_median", "launch wait")),
                  ("cudaGraphLaunch call (under the profiler)", fig("graph_launch_ms_median", "graph launch"))]
    s["overhead"] = overhead_rows(b, d.get("profiler_overhead") or {}, src)
    frac = num(d.get("gpu_idle_fraction"))
    s["idle_pct"] = f"{frac * 100:.0f}%" if frac is not None else "—"
    s["method"] = d.get("method", "")
    s["steps_used"] = d.get("steps_used")
    s["notes"] = d.get("notes") or []
    tl = d.get("timeline") or {}
    kern = pd.DataFrame(tl.get("kernels") or [])
    s["timeline_chart"] = b.chart(
        f"One decode step (step {tl.get('step', '?')}, {fmt_num(num(tl.get('wall_ms')))} ms)", timeline_chart, kern,
        num(tl.get("wall_ms")),
        caption=f"{doc.rel} timeline: kernels by category on each stream; white space is GPU idle (CPU, launch or "
                f"framework time)" + (" · first kernels only" if tl.get("truncated") else ""))
    sim = bundle.doc("simulate")
    comps = sim.get("kernel", "components", default=[]) if sim.usable else []
    s["categories"] = category_rows(d.get("categories") or {}, d.get("categories_detail") or {}, comps)
    s["kernel_level_why"] = "" if comps else (sim.why or f"{sim.rel} has no kernel-level components")
    s["top"] = [{"name": k.get("name", ""), "category": k.get("category", ""), "ms": fmt_num(num(k.get("ms_per_step"))),
                 "calls": fmt_num(num(k.get("calls_per_step"))), "mean_us": fmt_num(num(k.get("mean_us"))),
                 "share": f"{num(k.get('share')) * 100:.1f}%" if num(k.get("share")) is not None else "—"}
                for k in d.get("top_kernels") or [] if isinstance(k, dict)]
    ranks = [r for r in d.get("ranks") or [] if isinstance(r, dict)]
    s["ranks"] = [{"rank": r.get("rank"), "step": fmt_num(num(r.get("step_ms_median"))),
                   "busy": fmt_num(num(r.get("gpu_busy_ms_median"))), "idle": fmt_num(num(r.get("gpu_idle_ms_median"))),
                   "allreduce": fmt_num(num(r.get("allreduce_ms_per_step"))),
                   "kernels": fmt_num(num(r.get("kernels_per_step_median"))),
                   "slowest": r.get("rank") == d.get("slowest_rank")} for r in ranks] if len(ranks) > 1 else []
    s["skew"] = fmt_num(num(d.get("rank_skew_ms")))
    return s
