"""The roofline section: the datasheet, the per-component times and the bound, from roofline.json."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...provenance import MODELLED
from .. import charts as ch
from ..data import Bundle, fig_field, find_col, fmt_bytes, fmt_num, num
from .common import Builder, _cols, _label, df_table, shown


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
    # the per-device figures of a CPU run are its host's, not a GPU's (the fields keep their names)
    hw = doc.get("hardware")
    device = "CPU" if isinstance(hw, dict) and hw.get("kind") == "cpu" else "GPU"
    s["figs"] = [(label.replace("/ GPU", f"/ {device}"), b.fig(label, fig_field(doc, key, unit, MODELLED)))
                 for key, label, unit in ROOFLINE_FIGS]
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
        s["chart"] = b.chart(f"Where the bytes of one decode step go (per {device})" if is_bytes
                             else "Roofline components", ch.roofline_components, cdf, value, label,
                             f"MB per token per {device}" if is_bytes else value,
                             caption=f"modelled · {table.rel if table.usable else doc.rel}")
    fmts = {c: (lambda v: fmt_bytes(num(v))) for c in df.columns if "bytes" in c.lower()}
    fmts.update({c: (lambda v: fmt_num(num(v) / 1e9) + " G" if num(v) is not None else "—")
                 for c in df.columns if "flops" in c.lower()})
    # the columns that fit an A4 page: bytes_total stands for bytes + scale_bytes (the CSV keeps all of them);
    # a column empty in every row is left out, and the long notes go under the table, not into a narrow column
    wanted = [c for c in ("component", "group", "dtype", "params", "bytes_total", "share", "flops", "t_memory_ms",
                          "replicated") if c in df.columns and any(map(shown, df[c]))]
    s["table"] = df_table(df, _cols(df, tuple(wanted)) or None, formats=fmts)
    s["table_notes"] = ([(str(r.get("component", "")), str(r["note"])) for _, r in df.iterrows()
                         if shown(r["note"])] if "note" in df.columns else [])
    s["table_rel"] = table.rel if table.usable else doc.rel
    return s
