"""Shared pieces of the report sections: the Builder (charts and placed figures), table and label helpers."""

from __future__ import annotations

import json
import math
from typing import Any, Callable

import pandas as pd

from ...errors import describe
from .. import charts as ch
from ..data import Doc, Fig, fmt_num, num


META_KEYS = {"stage", "status", "reason", "findings", "provenance", "skipped", "fixture", "device", "backend",
             "not_checked", "summary", "unavailable", "params"}


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
            return {"why": f"chart failed: {describe(exc)}", "title": title}
        ref = ChartRef(id=f"chart-{len(self.charts) + 1}", title=title, caption=caption, spec=spec)
        self.charts.append(ref)
        return ref


def shown(value: Any) -> bool:
    """A cell worth printing: not empty, NaN, False or a dash (a column of none such is left out)."""
    if value is None or (isinstance(value, float) and value != value):
        return False
    return str(value).strip() not in ("", "—", "-", "nan", "None", "False")

