"""Build the report's template context from a Bundle of stage files (and the archive, for history).

Every section is a dict with `id`, `title`, `ok` and, when not ok, `why` (printed "not measured: <why>").
A section never raises on odd stage content: a missing field is a missing figure, not a crash.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np
import pandas as pd

from .. import __version__
from ..fingerprint import diff as fp_diff
from ..provenance import MEASURED, MODELLED, UNAVAILABLE
from . import charts as ch
from .data import (HEADLINE, HEADLINE_BETTER, HEADLINE_LABELS, SEVERITY_RANK, Bundle, Doc, Fig, Table,
                   audit_findings, dig, fig_field, find_col, first_key, fmt_bytes, fmt_num, fmt_size, headline, live_levels,
                   num, parse_provenance, unavailable_fig)
from ..secrets import REDACTED, SECRET_NAME, redact_url
from .trace_section import trace_section

META_KEYS = {"stage", "status", "reason", "findings", "provenance", "skipped", "fixture", "device", "backend",
             "not_checked", "summary", "unavailable", "params"}


# --------------------------------------------------------------------------------------------- helpers
class ChartRef(dict):
    """A chart in the context: id, title, caption, spec (Vega-Lite); the renderer adds svg for the PDF."""


def df_table(df: pd.DataFrame, columns: list[tuple[str, str]] | None = None, max_rows: int | None = None,
             formats: dict[str, Callable[[Any], str]] | None = None) -> dict[str, Any]:
    """A DataFrame as {'columns', 'numeric', 'rows'} of display strings (for the `table` macro)."""
    formats = formats or {}
    if columns is None:
        columns = [(c, c) for c in df.columns]
    columns = [(k, label) for k, label in columns if k in df.columns]
    rows = []
    view = df if max_rows is None else df.head(max_rows)
    numeric = [pd.api.types.is_numeric_dtype(df[k]) for k, _ in columns]
    for _, r in view.iterrows():
        row = []
        for (k, _), isnum in zip(columns, numeric):
            v = r[k]
            if k in formats:
                row.append(formats[k](v))
            elif isnum:
                row.append(fmt_num(num(v)) if num(v) is not None else "—")
            else:
                row.append("—" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
        rows.append(row)
    return {"columns": [label for _, label in columns], "numeric": numeric, "rows": rows,
            "truncated": max_rows is not None and len(df) > max_rows, "total": len(df)}


def _numeric(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
    df = df.copy()
    for c in cols:
        if c in df.columns:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def _short(value: Any, limit: int = 160) -> str:
    if isinstance(value, (dict, list)):
        text = json.dumps(value, sort_keys=True, default=str)
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cols(df: pd.DataFrame, wanted: tuple[str, ...]) -> list[tuple[str, str]] | None:
    """The wanted columns that exist (all columns when none of them does)."""
    cols = [(c, c) for c in wanted if c in df.columns]
    return cols or None


def _label(value: Any, limit: int = 80) -> str:
    """A readable label for a config-like value: a dict's name (or key, or path), else the value itself."""
    if isinstance(value, dict):
        for k in ("name", "key", "path", "id"):
            if value.get(k):
                return _short(value[k], limit)
    return _short(value, limit)


def _skipped_rows(*docs: Doc) -> list[dict[str, str]]:
    rows = []
    for d in docs:
        for s in d.skipped_cases:
            rows.append({"file": d.rel, **s})
    return rows


class Builder:
    """Collects charts and every figure placed in the report (for the provenance legend)."""

    def __init__(self, mode: str = "html") -> None:
        self.mode = mode
        self.charts: list[ChartRef] = []
        self.figs: list[tuple[str, Fig]] = []

    def fig(self, label: str, f: Fig) -> Fig:
        self.figs.append((label, f))
        return f

    def chart(self, title: str, build: Callable[..., Any], *args: Any, caption: str = "", **kw: Any) -> dict[str, Any]:
        try:
            chart = build(*args, **kw)
            spec = ch.to_spec(chart)
        except ch.NoChart as exc:
            return {"why": str(exc), "title": title}
        except Exception as exc:  # a chart must never take the report down
            return {"why": f"chart failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", "title": title}
        ref = ChartRef(id=f"chart-{len(self.charts) + 1}", title=title, caption=caption, spec=spec)
        self.charts.append(ref)
        return ref


# --------------------------------------------------------------------------------------------- headline
def headline_section(b: Builder, bundle: Bundle, figs: dict[str, Fig]) -> dict[str, Any]:
    for key, label, _, _ in HEADLINE:
        b.fig(label, figs[key])
    gap = bundle.doc("gap")
    levers = levers_list(gap)
    roof, itl, eff = figs["roofline_ms"], figs["live_itl_ms"], figs["efficiency"]
    if roof.ok and itl.ok:
        summary = (f"Decode runs at {itl.text()}/token against a roofline floor of {roof.text()}: "
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
    else:
        summary = f"The roofline could not be computed ({roof.why})."
    hl = gap.get("headline", default={}) if gap.usable else {}
    measured_on = str(hl.get("measured_on") or "") if isinstance(hl, dict) else ""
    return {"id": "headline", "title": "Headline", "ok": True, "figs": figs, "summary": summary,
            "measured_on": measured_on,
            "levers": levers[:3], "levers_why": "" if levers else (gap.why or "gap.json lists no levers")}


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


# --------------------------------------------------------------------------------------------- audit
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


# --------------------------------------------------------------------------------------------- roofline
ROOFLINE_FIGS = [
    ("weight_bytes_per_token_per_gpu", "Weight bytes / token / GPU", "B"),
    ("kv_bytes_per_token_per_gpu", "KV-cache bytes / token / GPU", "B"),
    ("bytes_per_token_per_gpu", "Total bytes / token / GPU", "B"),
    ("t_memory_ms", "Memory-bound time", "ms"),
    ("t_compute_ms", "Compute bound", "ms"),
    ("t_comm_floor_ms", "Communication floor", "ms"),
    ("t_floor_ms", "Roofline floor", "ms"),
    ("tokens_per_s_ceiling", "Tokens/s ceiling", "tok/s"),
]


def roofline_section(b: Builder, bundle: Bundle) -> dict[str, Any]:
    doc = bundle.doc("roofline")
    s: dict[str, Any] = {"id": "roofline", "title": "Roofline", "ok": doc.usable, "why": doc.why, "rel": doc.rel}
    if not doc.usable:
        return s
    s["figs"] = [(label, b.fig(label, fig_field(doc, key, unit, MODELLED))) for key, label, unit in ROOFLINE_FIGS]
    params = []
    for key, label in (("params_total", "Parameters, total"), ("params_active", "Parameters, active per token")):
        f = fig_field(doc, key, "", MODELLED)
        params.append((label, b.fig(label, f.scaled(1e-9, "billion") if f.ok else f)))
    s["params"] = params
    setup = []
    for key in ("model", "weight_format", "hardware", "tp", "ep", "batch_size", "context_len", "kv_cache_dtype"):
        v = doc.get(key)
        if v not in (None, "", {}):
            setup.append((key, _label(v)))
    s["setup"] = setup
    table = bundle.table("roofline_components")
    df = table.df if table.usable else None
    if df is None and isinstance(doc.get("components"), list) and doc.get("components"):
        try:
            df = pd.DataFrame([c for c in doc.get("components") if isinstance(c, dict)])
        except Exception:
            df = None
    if df is None or len(df) == 0:
        s["components_why"] = table.why or "roofline.json has no component table"
        return s
    label = find_col(df, "component", "name", "layer", "item") or next(
        (c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])), None)
    numeric_cols = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]
    value = next((c for c in numeric_cols if "bytes" in c.lower()), None) or next(
        (c for c in numeric_cols if c.lower().endswith("_ms")), None) or (numeric_cols[0] if numeric_cols else None)
    if label is None or value is None:
        s["components_why"] = f"{table.rel} has no component name or numeric column"
    else:
        is_bytes = "bytes" in value.lower()
        cdf = df[[c for c in (label, value, "group") if c in df.columns]].copy()
        if is_bytes:
            cdf[value] = pd.to_numeric(cdf[value], errors="coerce") / 1e6
        s["chart"] = b.chart("Where the bytes of one decode step go (per GPU)" if is_bytes else "Roofline components",
                             ch.roofline_components, cdf, value, label,
                             "MB per token per GPU" if is_bytes else value,
                             caption=f"modelled · {table.rel if table.usable else doc.rel}")
    fmts = {c: (lambda v: fmt_bytes(num(v))) for c in df.columns if "bytes" in c.lower()}
    fmts.update({c: (lambda v: fmt_num(num(v) / 1e9) + " G" if num(v) is not None else "—")
                 for c in df.columns if "flops" in c.lower()})
    # the columns that fit an A4 page: bytes_total stands for bytes + scale_bytes (the CSV keeps all of them)
    s["table"] = df_table(df, _cols(df, ("component", "group", "dtype", "params", "bytes_total", "share", "flops",
                                         "t_memory_ms", "replicated", "note")) or None, formats=fmts)
    s["table_rel"] = table.rel if table.usable else doc.rel
    return s


# --------------------------------------------------------------------------------------------- micro-benchmarks
def _sub(title: str, doc: Doc | None, table: Table | None) -> dict[str, Any]:
    ok_doc = doc is None or doc.usable
    ok_tab = table is None or table.usable
    why = ""
    if doc is not None and not doc.usable:
        why = doc.why
    elif table is not None and not table.usable:
        why = table.why
    return {"title": title, "ok": ok_doc and ok_tab, "why": why,
            "device": doc.device if doc else "", "backend": doc.backend if doc else "",
            "skipped": doc.skipped_cases if doc else [], "rel": table.rel if table else (doc.rel if doc else "")}


def _table_sub(bundle: Bundle, title: str, json_key: str, table_key: str) -> tuple[dict[str, Any], Doc, Table]:
    """The opening every micro-benchmark table section shares: the sidecar JSON's labels, then usable or why not."""
    doc, t = bundle.doc(json_key), bundle.table(table_key)
    s = _sub(title, doc if doc.state != "missing" else None, t)
    if not t.usable:
        s["ok"], s["why"] = False, (doc.why if doc.state == "skipped" else t.why)
        return s, doc, t
    s["ok"] = True
    if doc.state in ("skipped", "partial"):
        s["note"] = doc.why
    return s, doc, t


def memory_sub(b: Builder, bundle: Bundle, datasheet: dict[str, Any]) -> dict[str, Any]:
    doc = bundle.doc("memory")
    s = _sub("Memory and compute ceilings", doc, None)
    if not doc.usable:
        return s
    rows = []
    ds_bw = num(datasheet.get("memory_bandwidth_gbps"))
    for key, label in (("copy_gbps", "Copy bandwidth"), ("read_gbps", "Read bandwidth")):
        f = b.fig(label, fig_field(doc, key, "GB/s", MEASURED))
        rows.append({"metric": label, "fig": f, "datasheet": f"{fmt_num(ds_bw)} GB/s" if ds_bw else "—",
                     "pct": f"{f.value / ds_bw * 100:.0f}%" if f.ok and ds_bw else "—"})
    peaks = doc.get("peak_tflops", default={})
    ds_peaks = datasheet.get("peak_tflops") or {}
    if isinstance(peaks, dict):
        for dtype, raw in peaks.items():
            f = fig_field(Doc("memory", doc.rel, doc.path, {"v": raw, "provenance": {}}, "ok"), "v", "TFLOP/s", MEASURED)
            f.source = f"{doc.rel}: peak_tflops.{dtype}"
            b.fig(f"Peak {dtype} matmul", f)
            ds = num(ds_peaks.get(dtype)) if isinstance(ds_peaks, dict) else None
            rows.append({"metric": f"Peak {dtype} matmul", "fig": f, "datasheet": f"{fmt_num(ds)} TFLOP/s" if ds else "—",
                         "pct": f"{f.value / ds * 100:.0f}%" if f.ok and ds else "—"})
    s["rows"] = rows
    return s


SLOW_BELOW = 0.5  # below half the measured bandwidth a figure is our kernel's, not the hardware's ceiling (issue 14)


def kernel_reading(frac: Any, gpu_us: Any = None, floor_us: Any = None, nbytes: Any = None,
                   copy_gbps: float | None = None) -> str:
    """How to read one kernel's bandwidth figure: a ceiling, a small latency-bound kernel (moving its bytes at
    full bandwidth takes less than the measured per-kernel floor), or our slow kernel."""
    f = num(frac)
    if f is None:
        return "—"
    pct = f"{f * 100:.0f}% of bandwidth"
    if f >= SLOW_BELOW:
        return f"ceiling ({pct})"
    floor, nb = num(floor_us), num(nbytes)
    if floor is not None and nb is not None and copy_gbps and nb / copy_gbps / 1e3 < floor:
        return f"small kernel, latency bound (floor {fmt_num(floor)} µs; {pct})"
    return f"our kernel is slow here ({pct})"


def gemm_frame(bundle: Bundle) -> pd.DataFrame | None:
    t = bundle.table("gemm")
    if not t.usable:
        return None
    df = _numeric(t.df, "M", "N", "K", "gpu_us", "eager_us", "gbps", "tflops", "frac_of_copy_bw")
    if "name" not in df.columns or "dtype" not in df.columns:
        return None
    n = df["N"].astype("Int64").astype(str) if "N" in df.columns else ""
    k = df["K"].astype("Int64").astype(str) if "K" in df.columns else ""
    df["shape"] = df["name"].astype(str) + ("  " + n + "×" + k if "N" in df.columns and "K" in df.columns else "")
    return df


def gemm_sub(b: Builder, bundle: Bundle, copy_gbps: float | None) -> dict[str, Any]:
    doc, t = bundle.doc("gemm_json"), bundle.table("gemm")
    s = _sub("Decode GEMMs at the model's per-GPU shapes", doc if doc.state != "missing" else None, t)
    if doc.state == "skipped" and not t.usable:
        s["ok"], s["why"] = False, doc.why
    df = gemm_frame(bundle) if t.usable else None
    if df is None:
        if t.usable:
            s["ok"], s["why"] = False, f"{t.rel} lacks the name/dtype columns"
        return s
    s["ok"] = True
    if "gbps" in df.columns and "M" in df.columns:
        m_min = df["M"].min()
        m1 = df[df["M"] == m_min].dropna(subset=["gbps"])
        s["chart_m1"] = b.chart(f"Achieved bandwidth per shape at M={fmt_num(m_min)}", ch.gemm_m1_bandwidth, m1, copy_gbps,
                                caption=f"measured · {t.rel} · dashed: measured copy bandwidth")
        if df["M"].nunique() > 1:
            s["chart_sweep"] = b.chart("Achieved bandwidth against M", ch.gemm_m_sweep, df.dropna(subset=["gbps"]),
                                       copy_gbps, caption=f"measured · {t.rel}")
        m1 = m1.assign(reading=[kernel_reading(r.get("frac_of_copy_bw"), r.get("gpu_us"), r.get("latency_floor_us"),
                                               r.get("bytes"), copy_gbps) for _, r in m1.iterrows()])
        cols = [("name", "shape"), ("dtype", "dtype"), ("backend", "backend"), ("N", "N"), ("K", "K"),
                ("gpu_us", "GPU µs"), ("latency_floor_us", "latency floor µs"), ("eager_us", "eager µs"),
                ("gbps", "GB/s"), ("tflops", "TFLOP/s"), ("frac_of_copy_bw", "of copy BW"), ("reading", "reading")]
        pct = {"frac_of_copy_bw": lambda v: f"{num(v) * 100:.0f}%" if num(v) is not None else "—",
               "N": lambda v: f"{int(num(v)):,}" if num(v) is not None else "—",
               "K": lambda v: f"{int(num(v)):,}" if num(v) is not None else "—"}
        s["table_m1"] = df_table(m1, cols, formats=pct)
        s["m_min"] = fmt_num(m_min)
        s["table_all"] = df_table(df.drop(columns=["shape"]), formats=pct)
    else:
        s["table_all"] = df_table(df.drop(columns=["shape"]))
    return s


def allreduce_sub(b: Builder, bundle: Bundle) -> dict[str, Any]:
    s, doc, t = _table_sub(bundle, "All-reduce", "allreduce_json", "allreduce")
    s["world_size"] = doc.get("world_size") if doc.data else None
    if not s["ok"]:
        return s
    df = _numeric(t.df, "size", "count", "time_us", "algbw", "busbw", "graph_time_us", "world_size")
    size = find_col(df, "size", "bytes", "size_bytes")
    tcol = find_col(df, "time_us", "time", "us")
    if size is None or tcol is None:
        s["ok"], s["why"] = False, f"{t.rel} lacks size/time_us columns"
        return s
    plot = df.rename(columns={size: "size", tcol: "time_us"})
    if s["world_size"] is None and "world_size" in plot.columns and plot["world_size"].notna().any():
        s["world_size"] = fmt_num(num(plot["world_size"].dropna().iloc[0]))
    graph = find_col(plot, "graph_time_us", "graph_us")
    if graph:
        eager = plot.assign(series="CUDA events (eager)")
        g = plot.assign(series="CUDA graph", time_us=plot[graph])
        if "algbw" in plot.columns:
            g["algbw"] = g["size"] / g["time_us"] / 1e3
            ratio = plot["busbw"] / plot["algbw"] if "busbw" in plot.columns else 1
            g["busbw"] = g["algbw"] * ratio
        plot = pd.concat([eager, g], ignore_index=True)
    elif "mode" in plot.columns or "source" in plot.columns:
        src = plot["source"].astype(str) if "source" in plot.columns else pd.Series("", index=plot.index)
        mode = plot["mode"].astype(str) if "mode" in plot.columns else pd.Series("", index=plot.index)
        place = plot["placement"].astype(str) if "placement" in plot.columns else pd.Series("", index=plot.index)
        plot = plot.assign(series=[
            (f"nccl-tests {pl}" if sr == "nccl-tests" else f"{'CUDA graph' if md == 'graph' else md or 'eager'}")
            for sr, md, pl in zip(src, mode, place)])
    model = doc.get("model_message") if doc.data else None
    model_bytes = num(dig(model, "bytes")) if isinstance(model, dict) else None
    model_time = num(dig(model, "time_us")) if isinstance(model, dict) else None
    if model_bytes is None and "model_size" in df.columns:
        hit = df[df["model_size"].astype(str).str.lower().isin(["true", "1"])]
        if len(hit):
            model_bytes = num(hit[size].iloc[0])
            model_time = num(hit[tcol].min())
    if model_time is None and doc.data:
        model_time = num(doc.get("allreduce_us_at_model_size"))
    s["model_message"] = ({"bytes": fmt_size(model_bytes), "time": fmt_num(model_time)} if model_bytes else None)
    s["comm_floor"] = comm_floor_text(bundle.doc("gap"))
    s["chart"] = b.chart("All-reduce latency and bus bandwidth", ch.allreduce, plot.dropna(subset=["time_us"]),
                         model_bytes, caption=f"measured · {t.rel}" + (" · dotted: the model's message size" if model_bytes else ""))
    cols = [(c, c) for c in ("size", "count", "type", "redop", "mode", "placement", "source", "time_us",
                             "graph_time_us", "algbw", "busbw", "wrong") if c in df.columns]
    s["table"] = df_table(df, cols or None, formats={"size": lambda v: fmt_size(num(v))})
    return s


def comm_floor_text(gap: Doc) -> str:
    """The all-reduces a token needs at the measured latency, eager against CUDA graph (gap.json)."""
    c = gap.get("communication_floor") if gap.usable else None
    if not isinstance(c, dict) or not c.get("allreduces_per_token"):
        return ""
    n = num(c.get("allreduces_per_token"))
    parts = [f"{fmt_num(n)} all-reduces"]
    for mode, label in (("eager", "eager"), ("graph", "in a CUDA graph")):
        ms, us = num(c.get(f"{mode}_ms")), num((c.get("per_op_us") or {}).get(mode))
        if ms is not None and us is not None:
            parts.append(f"{label} {fmt_num(us)} µs each = {fmt_num(ms)} ms")
    if num(c.get("graph_saves_ms")) is not None:
        parts.append(f"graphs save {fmt_num(num(c['graph_saves_ms']))} ms per token")
    if num(c.get("modelled_ms")) is not None:
        parts.append(f"modelled floor {fmt_num(num(c['modelled_ms']))} ms (roofline.json)")
    return "; ".join(parts) + "."


def eager_graph_sub(b: Builder, bundle: Bundle) -> dict[str, Any]:
    """launch.csv (wide: case/eager_us/graph_us, or long: kernel/mode/per_kernel_us) and each GEMM's eager_us
    against its gpu_us: what a server without CUDA graphs pays per launch."""
    doc, t = bundle.doc("launch_json"), bundle.table("launch")
    s = _sub("Eager against CUDA graph", doc if doc.state != "missing" else None, t)
    rows = []
    if t.usable:
        df = t.df
        case = find_col(df, "case", "kernel", "name", "what")
        eager = find_col(df, "eager_us", "eager")
        graph = find_col(df, "graph_us", "graph", "graphed_us")
        mode = find_col(df, "mode")
        value = find_col(df, "per_kernel_us", "time_us", "us")
        if case and eager and graph:
            for _, r in df.iterrows():
                rows.append({"case": str(r[case]), "eager": num(r[eager]), "graph": num(r[graph]), "src": t.rel})
        elif case and mode and value:
            for name, grp in df.groupby(case, sort=False):
                by = {str(m): num(v) for m, v in zip(grp[mode], grp[value])}
                label = str(name)
                rows.append({"case": f"launch: {label}", "eager": by.get("eager"), "graph": by.get("graph"),
                             "sync": by.get("eager-sync"), "src": t.rel})
    gdf = gemm_frame(bundle)
    if gdf is not None and {"eager_us", "gpu_us", "M"} <= set(gdf.columns):
        m1 = gdf[gdf["M"] == gdf["M"].min()]
        dtype = "bf16" if "bf16" in set(m1["dtype"]) else m1["dtype"].iloc[0] if len(m1) else None
        for _, r in m1[m1["dtype"] == dtype].iterrows():
            rows.append({"case": f"GEMM {r['shape']} {dtype} M={fmt_num(num(r['M']))}", "eager": num(r["eager_us"]),
                         "graph": num(r["gpu_us"]), "src": bundle.table("gemm").rel})
    rows = [r for r in rows if r["eager"] is not None]
    if not rows:
        s["ok"] = False
        s["why"] = (doc.why if doc.state == "skipped" else t.why) or "no case has an eager time"
        return s
    s["ok"] = True
    pairs = [r for r in rows if r["graph"] is not None]
    if pairs:
        long = pd.DataFrame([{"case": r["case"], "mode": m, "value": r[m]} for r in pairs for m in ("eager", "graph")])
        s["chart"] = b.chart("Eager launch against CUDA-graph replay", ch.eager_vs_graph, long,
                             caption="measured · microbench/launch.csv (per launch / per graph node) and gemm.csv "
                                     "(eager against GPU time)")
    else:
        reasons = [c["reason"] for c in (doc.skipped_cases if doc.data else []) if "graph" in c["case"].lower()]
        s["chart"] = {"title": "Eager launch against CUDA-graph replay",
                      "why": "no graph time: " + (reasons[0] if reasons else "CUDA graphs were not captured")}
    s["has_sync"] = any(r.get("sync") is not None for r in rows)
    s["rows"] = [{**r, "eager_t": fmt_num(r["eager"]), "graph_t": fmt_num(r["graph"]), "sync_t": fmt_num(r.get("sync")),
                  "overhead": fmt_num(r["eager"] - r["graph"]) if r["graph"] is not None else "—",
                  "ratio": f"{r['eager'] / r['graph']:.1f}×" if r["graph"] else "—"} for r in rows]
    return s


def moe_sub(b: Builder, bundle: Bundle) -> dict[str, Any]:
    s, doc, t = _table_sub(bundle, "MoE: routing, per-expert loop against grouped GEMM", "moe_json", "moe")
    if not s["ok"]:
        return s
    df = t.df
    impl = find_col(df, "impl", "method", "variant", "kernel", "mode")
    mcol = find_col(df, "M", "m", "tokens", "batch")
    tcol = find_col(df, "gpu_us", "time_us", "us", "graph_us")
    if impl and mcol and tcol:
        plot = df.copy()
        case = find_col(df, "case", "stage", "part")
        name = find_col(df, "name")
        if case and (plot[case].astype(str) == "experts").any():
            plot = plot[plot[case].astype(str) == "experts"]
        elif name and (plot[name].astype(str) == "moe.experts").any():
            plot = plot[plot[name].astype(str) == "moe.experts"]
        else:
            plot = plot[plot[impl].astype(str) != "routing"]
        plot = plot.copy()
        dt = find_col(plot, "dtype")
        if dt and plot[dt].nunique() > 1:
            plot[impl] = plot[impl].astype(str) + " " + plot[dt].astype(str)
        plot = _numeric(plot.rename(columns={mcol: "M", tcol: "time_us", impl: "impl"}), "M", "time_us")
        s["chart"] = b.chart("Expert GEMMs: per-expert loop against grouped kernel", ch.moe_loop_vs_grouped,
                             plot.dropna(subset=["M", "time_us"]), caption=f"measured · {t.rel} (GPU time)")
    else:
        s["chart"] = {"why": f"{t.rel} lacks impl/M/gpu_us columns", "title": "MoE"}
    if "frac_of_copy_bw" in df.columns:  # routing rows are not bandwidth kernels: no reading for them
        df = df.assign(reading=[kernel_reading(r.get("frac_of_copy_bw")) if str(r.get("impl")) != "routing" else ""
                                for _, r in df.iterrows()])
    s["table"] = df_table(df, _cols(df, ("case", "name", "impl", "dtype", "backend", "M", "top_k", "experts_active",
                                         "experts_hit", "gpu_us", "eager_us", "gbps", "frac_of_copy_bw", "reading",
                                         "note")))
    return s


def attention_sub(b: Builder, bundle: Bundle) -> dict[str, Any]:
    s, doc, t = _table_sub(bundle, "Attention decode", "attention_json", "attention")
    if not s["ok"]:
        return s
    s["table"] = df_table(t.df, _cols(t.df, ("kind", "name", "backend", "batch", "context_len", "heads", "kv_heads",
                                             "head_dim", "gpu_us", "eager_us", "gbps", "frac_of_copy_bw", "note")))
    return s


def microbench_section(b: Builder, bundle: Bundle, datasheet: dict[str, Any]) -> dict[str, Any]:
    mem = memory_sub(b, bundle, datasheet)
    copy = num(bundle.doc("memory").get("copy_gbps")) if bundle.doc("memory").usable else None
    subs = [mem, gemm_sub(b, bundle, copy), allreduce_sub(b, bundle), eager_graph_sub(b, bundle),
            moe_sub(b, bundle), attention_sub(b, bundle)]
    docs = [bundle.doc(n) for n in ("memory", "gemm_json", "allreduce_json", "moe_json", "attention_json", "launch_json")]
    ok = any(s["ok"] for s in subs)
    why = ""
    if not ok:
        reasons = sorted({d.why for d in docs if d.why})
        why = "; ".join(reasons) if reasons else "no micro-benchmark file was produced"
    devices = sorted({d.device for d in docs if d.device})
    return {"id": "microbench", "title": "Micro-benchmarks", "ok": ok, "why": why, "subs": subs,
            "devices": devices, "skipped": _skipped_rows(*docs)}


# --------------------------------------------------------------------------------------------- simulation + gap
WATERFALL_TOTAL = ("live", "itl", "total", "server level")


def _short_host(measured_on: str) -> str:
    """The device part of a waterfall row's `measured_on`, short enough for a bar label (the table has it all)."""
    text = measured_on.split(", rev ")[0].replace(" (device not visible to the client)", "")
    return _label(text.removeprefix("NVIDIA "), 22)


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
        parsed.append({"name": name, "ms": ms, "source": str(st.get("source", "") or ""), "status": status,
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
        if p["measured_on"] and p is not base:
            label += f" · {_short_host(p['measured_on'])}"
        rows.append({"step": p["name"], "start": min(start, end), "end": max(start, end), "ms": ms,
                     "right": max(start, end), "label": label,
                     "kind": kind, "source": p["source"], "measured_on": p["measured_on"]})
    return pd.DataFrame(rows), ordered


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
                                               "amber inconsistent · the device each step was measured on")
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
        s["closure_pass"] = hl.get("closure_pass") if isinstance(hl, dict) else None
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
    s["framework_overhead"] = (figs["engine_eager_ms"].value - figs["kernel_eager_ms"].value
                               if figs["engine_eager_ms"].ok and figs["kernel_eager_ms"].ok else None)
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
    s["engine_backend"] = str(sim.get("engine", "backend", default="") or "") if sim.usable else ""
    return s


# --------------------------------------------------------------------------------------------- live
LIVE_STATS = ("mean", "median", "std", "p90", "p99", "min", "max")
LIVE_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL (per chunk)"), ("itl_per_token", "ITL per token"),
                ("e2el", "E2E latency"))


def chunk_itls(chunks: pd.DataFrame, concurrency: float | None) -> tuple[pd.DataFrame | None, str]:
    """Per-chunk gaps (with their token counts) from the chunk records of one concurrency level."""
    rid = find_col(chunks, "request_id", "request", "req_id", "rid", "request_index", "id")
    if rid is None:
        return None, "chunks.parquet has no request id column"
    tcol, scale = None, 1.0
    for names, sc in ((("t_ms", "arrival_ms", "time_ms", "t_rel_ms", "since_start_ms", "ms"), 1.0),
                      (("t_ns", "arrival_ns", "time_ns", "perf_counter_ns", "timestamp_ns", "ns"), 1e-6),
                      (("t_us", "arrival_us", "time_us"), 1e-3),
                      (("t_s", "arrival_s", "time_s", "t", "timestamp"), 1e3)):
        tcol = find_col(chunks, *names)
        if tcol:
            scale = sc
            break
    tok = find_col(chunks, "tokens", "n_tokens", "token_count", "num_tokens", "output_tokens")
    df = chunks
    warm = find_col(df, "warmup", "is_warmup")
    if warm:
        df = df[~df[warm].astype(bool)]
    conc = find_col(df, "concurrency", "level")
    if conc and concurrency is not None:
        df = df[pd.to_numeric(df[conc], errors="coerce") == concurrency]
    if len(df) == 0:
        return None, f"no chunk records at concurrency {fmt_num(concurrency)}"
    if tcol is None:
        gapc = find_col(df, "itl_ms", "gap_ms", "delta_ms")
        if gapc is None:
            return None, "chunks.parquet has no arrival time column"
        out = pd.DataFrame({"request": df[rid], "gap_ms": pd.to_numeric(df[gapc], errors="coerce"),
                            "tokens": pd.to_numeric(df[tok], errors="coerce") if tok else 1.0,
                            "t_ms": np.nan})
        return out.dropna(subset=["gap_ms"]), ""
    df = df.assign(_t=pd.to_numeric(df[tcol], errors="coerce") * scale,
                   _n=pd.to_numeric(df[tok], errors="coerce").fillna(1) if tok else 1.0)
    idx = find_col(df, "chunk_index", "index", "seq", "chunk")
    df = df.sort_values([rid, idx] if idx else [rid, "_t"])
    df["gap_ms"] = df.groupby(rid)["_t"].diff()
    return pd.DataFrame({"request": df[rid], "gap_ms": df["gap_ms"], "tokens": df["_n"], "t_ms": df["_t"]}), ""


def itl_hist_frame(gaps: pd.DataFrame, bins: int = 40) -> pd.DataFrame:
    g = gaps.dropna(subset=["gap_ms"])
    g = g[g["tokens"] > 0]
    per_chunk = g["gap_ms"].to_numpy(dtype=float)
    per_token = np.repeat((g["gap_ms"] / g["tokens"]).to_numpy(dtype=float), g["tokens"].astype(int).clip(lower=1))
    if per_chunk.size == 0:
        return pd.DataFrame()
    hi = float(np.percentile(np.concatenate([per_chunk, per_token]), 99.5))
    lo = float(min(per_chunk.min(), per_token.min()))
    if hi <= lo:
        hi = lo + 1.0
    edges = np.linspace(lo, hi, bins + 1)
    rows = []
    for view, arr in (("per chunk", per_chunk), ("per token", per_token)):
        counts, _ = np.histogram(np.clip(arr, lo, hi), bins=edges)
        rows += [{"view": view, "bin_start": float(a), "bin_end": float(c), "count": int(n)}
                 for a, c, n in zip(edges[:-1], edges[1:], counts)]
    return pd.DataFrame(rows)


def _request_ttft(requests: pd.DataFrame | None, request: Any) -> float | None:
    if requests is None or len(requests) == 0:
        return None
    rid = find_col(requests, "request_id", "request", "req_id", "rid", "request_index", "id")
    col = find_col(requests, "ttft_ms")
    if rid is None or col is None:
        return None
    hit = requests[requests[rid].astype(str) == str(request)]
    return num(hit[col].iloc[0]) if len(hit) else None


def timeline_frame(chunks: pd.DataFrame, requests: pd.DataFrame | None, concurrency: float | None
                   ) -> tuple[pd.DataFrame | None, str, str]:
    gaps, why = chunk_itls(chunks, concurrency)
    if gaps is None:
        return None, why, ""
    if gaps["t_ms"].isna().all():
        return None, "chunks.parquet has no arrival times", ""
    # the request with the median end-to-end time
    last = gaps.groupby("request")["t_ms"].max().dropna()
    if last.empty:
        return None, "no complete request", ""
    chosen = last.sort_values().index[len(last) // 2]
    one = gaps[gaps["request"] == chosen].sort_values("t_ms")
    rows, token = [], 0
    first_t = one["t_ms"].iloc[0]
    ttft = _request_ttft(requests, chosen)
    if ttft is None:
        # chunk times relative to the request start give the TTFT directly; absolute clocks do not
        ttft = float(first_t) if 0 <= first_t < 600_000 else 0.0
    for i, (_, r) in enumerate(one.iterrows()):
        n = int(max(1, r["tokens"] if not pd.isna(r["tokens"]) else 1))
        if i == 0:
            rows.append({"token": 1, "ms": ttft, "chunk": 0, "chunk_tokens": n, "t_ms": r["t_ms"],
                         "kind": "first token (TTFT)"})
            token = 1
            for extra in range(1, n):
                token += 1
                rows.append({"token": token, "ms": 0.0, "chunk": 0, "chunk_tokens": n, "t_ms": r["t_ms"],
                             "kind": "first token (TTFT)"})
            continue
        per = r["gap_ms"] / n
        for _ in range(n):
            token += 1
            rows.append({"token": token, "ms": per, "chunk": i, "chunk_tokens": n, "t_ms": r["t_ms"],
                         "kind": "multi-token chunk" if n > 1 else "1-token chunk"})
    return pd.DataFrame(rows), "", str(chosen)


def live_section(b: Builder, bundle: Bundle) -> dict[str, Any]:
    doc = bundle.doc("live")
    s: dict[str, Any] = {"id": "live", "title": "Live streaming measurement", "ok": doc.usable, "why": doc.why,
                         "device": doc.device, "rel": doc.rel}
    if doc.state == "skipped" and doc.data:
        s["errors"] = _errors(doc.data)
    if not doc.usable:
        return s
    d = doc.data or {}
    server = d.get("server")
    if isinstance(server, dict):
        s["server"] = [(str(k), _short(v, 200)) for k, v in server.items()]
    elif server:
        s["server"] = [("identity", _short(server, 200))]
    else:
        s["server"] = []
    setup = []
    for key in ("endpoint", "api", "model", "engine", "engine_version", "token_count_method", "backend"):
        v = d.get(key)
        if v:
            setup.append((key, redact_url(str(v)) if key == "endpoint" else _short(v, 160)))
    s["setup"] = setup
    co = d.get("client_overhead_us")
    if isinstance(co, dict) and "status" not in co and num(first_key(co, "median", "mean")) is not None:
        f = Fig(num(first_key(co, "median", "mean")), "µs", MEASURED,
                f"{doc.rel}: client_overhead_us.median" + (f" (p99 {fmt_num(num(co.get('p99')))} µs)"
                                                          if num(co.get("p99")) is not None else ""))
    else:
        f = fig_field(doc, "client_overhead_us", "µs", MEASURED)
    s["client_overhead"] = b.fig("Client overhead per chunk", f)
    levels = live_levels(doc)
    if not levels:
        s["ok"], s["why"] = False, f"{doc.rel} has no concurrency levels"
        s["errors"] = _errors(d)
        return s
    rows = []
    for lv in levels:
        def g(k: str) -> str:
            return fmt_num(num(lv.get(k)))
        rows.append({"c": fmt_num(num(lv.get("concurrency"))), "completed": g("completed"), "failed": g("failed"),
                     "ttft_med": g("median_ttft_ms"), "ttft_p99": g("p99_ttft_ms"), "tpot_med": g("median_tpot_ms"),
                     "itl_med": g("median_itl_ms"), "itl_p99": g("p99_itl_ms"),
                     "itlt_med": g("median_itl_per_token_ms"), "itlt_p99": g("p99_itl_per_token_ms"),
                     "e2el_med": g("median_e2el_ms"), "otput": g("output_throughput"), "rtput": g("request_throughput"),
                     "failed_n": num(lv.get("failed")) or 0})
    s["rows"] = rows
    # per-token figures not counted per chunk (issue 17): the basis beside every per-token figure
    basis = d.get("itl_per_token_basis")
    s["itl_note"] = (f"{basis}: {d.get('itl_per_token_note')}" if basis and basis != "exact" and
                     d.get("itl_per_token_note") else "")
    side = (levels[0].get("server_side") or {}).get("metrics") if isinstance(levels[0].get("server_side"), dict) else None
    vs = (side or {}).get("vs_client") or {}
    if num(vs.get("server_ms")) is not None:
        s["server_side"] = (f"{fmt_num(num(vs['server_ms']))} ms ({vs.get('server_metric')}) against the client's "
                            f"{fmt_num(num(vs.get('client_ms')))} ms: streaming path "
                            f"{fmt_num(num(vs.get('streaming_path_ms')))} ms (concurrency {fmt_num(num(levels[0].get('concurrency')))})")
    elif isinstance(side, dict) and side.get("why"):
        s["server_side"] = f"unavailable: {_short(side['why'], 160)}"
    if num(levels[0].get("median_server_eval_ms_per_token")) is not None:
        s["server_eval"] = (f"{fmt_num(num(levels[0]['median_server_eval_ms_per_token']))} ms median, from the embedded "
                            "server's own log (llama_perf_context)")
    details = []
    for lv in levels:
        table = []
        for key, label in LIVE_METRICS:
            vals = [fmt_num(num(lv.get(f"{st}_{key}_ms"))) for st in LIVE_STATS]
            if any(v != "—" for v in vals):
                table.append({"metric": label, "vals": vals})
        details.append({"c": fmt_num(num(lv.get("concurrency"))), "table": table,
                        "completed": fmt_num(num(lv.get("completed"))), "failed": fmt_num(num(lv.get("failed")))})
    s["details"] = details
    s["stats"] = LIVE_STATS
    tdf = pd.DataFrame([{"concurrency": num(lv.get("concurrency")), "output_throughput": num(lv.get("output_throughput")),
                         "itl": num(first_key(lv, "median_itl_per_token_ms", "median_tpot_ms", "median_itl_ms"))}
                        for lv in levels]).dropna(subset=["concurrency", "output_throughput"])
    if len(tdf) >= 1:
        s["throughput_chart"] = b.chart("Output throughput against concurrency", ch.throughput, tdf,
                                        caption=f"measured · {doc.rel}: levels[].output_throughput, "
                                                "median_itl_per_token_ms")
    else:
        s["throughput_why"] = "no level reports output_throughput"
    lowest = num(levels[0].get("concurrency"))
    s["lowest"] = fmt_num(lowest)
    chunks = bundle.table("live_chunks")
    if chunks.usable:
        gaps, why = chunk_itls(chunks.df, lowest)
        if gaps is not None and len(gaps.dropna(subset=["gap_ms"])):
            s["hist_chart"] = b.chart(f"Inter-token latency at concurrency {fmt_num(lowest)}: per chunk and per token",
                                      ch.itl_histogram, itl_hist_frame(gaps),
                                      caption=f"measured · {chunks.rel}; per token spreads a multi-token chunk's gap "
                                              "over its tokens; values above p99.5 are drawn in the last bin")
        else:
            s["hist_why"] = why or "no inter-chunk gaps"
        tl, why, chosen = timeline_frame(chunks.df, bundle.table("live_requests").df, lowest)
        if tl is not None and len(tl):
            s["timeline_chart"] = b.chart(f"One request, token by token (request {chosen}, median E2E at "
                                          f"concurrency {fmt_num(lowest)})", ch.request_timeline, tl,
                                          caption=f"measured · {chunks.rel} · token 1 is the TTFT; a multi-token chunk's gap is spread over its tokens")
        else:
            s["timeline_why"] = why
    else:
        s["hist_why"] = s["timeline_why"] = chunks.why
    s["errors"] = _errors(d)
    return s


def _errors(d: dict[str, Any]) -> list[dict[str, str]]:
    errs = d.get("errors") or []
    out = []
    if isinstance(errs, dict):
        errs = [{"reason": k, "count": v} for k, v in errs.items()]
    for e in errs if isinstance(errs, list) else []:
        if isinstance(e, dict):
            out.append({"reason": _short(first_key(e, "reason", "error", "message") or e, 300),
                        "count": fmt_num(num(e.get("count")) or 1)})
        else:
            out.append({"reason": _short(e, 300), "count": "1"})
    return out


# --------------------------------------------------------------------------------------------- since last run
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


# --------------------------------------------------------------------------------------------- sources + provenance
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


# --------------------------------------------------------------------------------------------- the report
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
        head["waterfall_chart"] = b.chart("Where the time of one token goes: roofline → live ITL", ch.waterfall,
                                          sim.pop("waterfall_frame"),
                                          caption="gap.json waterfall · teal measured, indigo modelled, red residual, "
                                                  "amber inconsistent (a lower level measured slower: not explained) · "
                                                  "where each step was measured after its value · details in section 5")
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


# --------------------------------------------------------------------------------------------- compare
def compare_context(run_a: Any, run_b: Any, bundle_a: Bundle, bundle_b: Bundle, mode: str = "html",
                    links: dict[str, str] | None = None) -> dict[str, Any]:
    """Side-by-side context of two archived runs (any hardware revisions)."""
    b = Builder(mode)
    fa, fb = headline(bundle_a), headline(bundle_b)
    for k, label, *_ in HEADLINE:
        b.fig(f"A: {label}", fa[k])
        b.fig(f"B: {label}", fb[k])
    deltas = [delta_row(k, fa[k], fb[k]) for k, *_ in HEADLINE]
    comps = sorted(set(run_a.fingerprint) | set(run_b.fingerprint))
    fp_rows = [{"component": c, "a": run_a.fingerprint.get(c, "—"), "b": run_b.fingerprint.get(c, "—"),
                "changed": run_a.fingerprint.get(c) != run_b.fingerprint.get(c)} for c in comps]
    findings = findings_delta(findings_brief(audit_findings(bundle_a.doc("audit"))),
                              findings_brief(audit_findings(bundle_b.doc("audit"))))
    for r in findings:
        r["change"] = {"new": "only in B", "resolved": "only in A", "still present": "in both"}.get(r["change"], r["change"])
    # charts: levels and waterfall of both runs, GEMM bandwidth at the smallest M, live throughput
    def level_rows(figs: dict[str, Fig], tag: str) -> list[dict[str, Any]]:
        out = []
        for k, item in (("roofline_ms", "roofline"), ("kernel_graph_ms", "kernel, graph"), ("kernel_eager_ms", "kernel, eager"),
                        ("engine_graph_ms", "engine, graph"), ("engine_eager_ms", "engine, eager"),
                        ("live_itl_ms", "server (live ITL)")):
            if figs[k].ok:
                out.append({"item": item, "run": tag, "value": figs[k].value})
        return out
    ldf = pd.DataFrame(level_rows(fa, "A") + level_rows(fb, "B"))
    charts = {}
    if len(ldf):
        charts["levels"] = b.chart("Levels: roofline, kernel, engine, server", ch.compare_bars, ldf, "ms per token",
                                   caption="A blue, B amber")
    wrows = []
    for tag, bun in (("A", bundle_a), ("B", bundle_b)):
        wdf, _ = waterfall_frame(bun.doc("gap").get("waterfall", default=[]) if bun.doc("gap").usable else [])
        for _, r in wdf.iterrows():
            wrows.append({"item": r["step"], "run": tag, "value": r["ms"]})
    if wrows:
        charts["waterfall"] = b.chart("Waterfall steps", ch.compare_bars, pd.DataFrame(wrows), "ms per token",
                                      caption="gap.json waterfall of each run")
    grows = []
    for tag, bun in (("A", bundle_a), ("B", bundle_b)):
        gdf = gemm_frame(bun)
        if gdf is not None and {"M", "gbps"} <= set(gdf.columns):
            m1 = gdf[gdf["M"] == gdf["M"].min()]
            for _, r in m1.iterrows():
                if num(r["gbps"]) is not None:
                    grows.append({"item": f"{r['shape']} {r['dtype']}", "run": tag, "value": num(r["gbps"])})
    if grows:
        charts["gemm"] = b.chart("Decode GEMM bandwidth at the smallest M", ch.compare_bars, pd.DataFrame(grows),
                                 "achieved GB/s", caption="microbench/gemm.csv of each run")
    live_rows = []
    for tag, bun in (("A", bundle_a), ("B", bundle_b)):
        for lv in live_levels(bun.doc("live")):
            live_rows.append({"run": tag, "c": fmt_num(num(lv.get("concurrency"))),
                              "itl": fmt_num(num(first_key(lv, "median_itl_per_token_ms", "median_tpot_ms"))),
                              "ttft": fmt_num(num(lv.get("median_ttft_ms"))),
                              "tput": fmt_num(num(lv.get("output_throughput"))),
                              "failed": fmt_num(num(lv.get("failed")))})
    tput = [{"item": f"concurrency {r['c']}", "run": r["run"], "value": num(r["tput"].replace(",", ""))}
            for r in live_rows if r["tput"] != "—"]
    if tput:
        charts["throughput"] = b.chart("Output throughput per concurrency", ch.compare_bars, pd.DataFrame(tput),
                                       "tok/s", caption="live/summary.json of each run")
    side = []
    for key, label, unit in (("t_floor_ms", "roofline floor", "ms"), ("t_memory_ms", "memory-bound time", "ms"),
                             ("t_comm_floor_ms", "communication floor", "ms"),
                             ("bytes_per_token_per_gpu", "bytes / token / GPU", "B")):
        side.append({"label": label, "a": fig_field(bundle_a.doc("roofline"), key, unit, MODELLED),
                     "b": fig_field(bundle_b.doc("roofline"), key, unit, MODELLED)})
    for key, label in (("copy_gbps", "copy bandwidth"), ("read_gbps", "read bandwidth")):
        side.append({"label": label, "a": fig_field(bundle_a.doc("memory"), key, "GB/s", MEASURED),
                     "b": fig_field(bundle_b.doc("memory"), key, "GB/s", MEASURED)})
    for r in side:
        b.fig(f"A: {r['label']}", r["a"])
        b.fig(f"B: {r['label']}", r["b"])
    return {
        "mode": mode, "title": "decode-gap comparison", "page_label": f"A {run_a.run_id} vs B {run_b.run_id}",
        "a": {"label": run_a.label, "hw_rev": run_a.hw_rev, "run_id": run_a.run_id, "created": run_a.created,
              "subtitle": _subtitle(run_a.meta.get("config") or {}, bundle_a), "link": (links or {}).get("a", "")},
        "b": {"label": run_b.label, "hw_rev": run_b.hw_rev, "run_id": run_b.run_id, "created": run_b.created,
              "subtitle": _subtitle(run_b.meta.get("config") or {}, bundle_b), "link": (links or {}).get("b", "")},
        "same_hw": run_a.hw_rev == run_b.hw_rev,
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "version": __version__,
        "deltas": deltas, "fp_rows": fp_rows, "findings": findings, "side": side, "live_rows": live_rows,
        "levers": {"A": levers_list(bundle_a.doc("gap"))[:3], "B": levers_list(bundle_b.doc("gap"))[:3]},
        "compare_charts": charts, "charts": b.charts, "provenance": provenance_section(b),
    }
