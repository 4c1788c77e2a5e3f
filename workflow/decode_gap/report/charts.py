"""Altair charts for the report. Each builder returns an altair chart, or raises NoChart(why).

The renderer turns a chart into inline Vega-Lite JSON (HTML, interactive) or SVG through vl-convert (PDF).
Charts receive tidy pandas frames prepared by `sections`; they never read stage files themselves.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

FONT = "Liberation Sans, Helvetica, Arial, DejaVu Sans, sans-serif"
INK = "#0f172a"
MUTED = "#64748b"
GRID = "#e2e8f0"
MEASURED = "#0f766e"
MODELLED = "#6366f1"
UNAVAILABLE = "#94a3b8"
RESIDUAL = "#dc2626"
INCONSISTENT = "#f59e0b"  # a negative step: a finding, never an explanation
TOTAL = "#334155"
PALETTE = ["#2563eb", "#f59e0b", "#0f766e", "#dc2626", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#64748b",
           "#ea580c", "#4338ca", "#a16207"]  # twelve: the MoE chart draws ten implementations
WIDTH = 620  # fits an A4 page with 18 mm margins at 96 dpi

THEME: dict[str, Any] = {
    "font": FONT,
    "background": "white",
    "padding": 6,
    "view": {"stroke": None, "continuousWidth": WIDTH, "continuousHeight": 240},
    "axis": {
        "labelFontSize": 11, "titleFontSize": 11, "titleFontWeight": "normal", "titleColor": "#334155",
        "labelColor": "#475569", "gridColor": GRID, "domainColor": "#94a3b8", "tickColor": "#94a3b8",
        "labelLimit": 220, "titlePadding": 8,
    },
    "legend": {"labelFontSize": 11, "titleFontSize": 11, "titleFontWeight": "normal", "titleColor": "#334155",
               "labelColor": "#334155", "symbolSize": 80, "labelLimit": 260},
    "title": {"fontSize": 13, "fontWeight": 600, "anchor": "start", "color": INK, "subtitleColor": MUTED,
              "subtitleFontSize": 11, "offset": 10},
    "header": {"labelFontSize": 11, "labelColor": "#334155", "titleFontSize": 11, "labelFontWeight": 600},
    "range": {"category": PALETTE},
    "bar": {"cornerRadiusEnd": 2},
    "line": {"strokeWidth": 2},
    "point": {"size": 40, "filled": True},
    "text": {"fontSize": 11, "color": "#334155"},
}


LEGEND_LABEL_LIMIT = 260  # px, THEME's legend labelLimit
LEGEND_CHAR_PX = 6.5  # an 11 px label's average character width
LEGEND_ENTRY_PX = 34  # the symbol, its gap and the space after an entry


def wrapped_legend(labels, width: int = WIDTH) -> alt.Legend:
    """A legend over the plot whose entries wrap into as many columns as `width` holds. A top legend otherwise
    lays every entry out in one row: ten MoE implementations ran past the HTML figure (cut off) and shrank the
    whole chart to fit the PDF page."""
    longest = max((len(str(v)) for v in labels), default=1)
    entry = min(longest * LEGEND_CHAR_PX, LEGEND_LABEL_LIMIT) + LEGEND_ENTRY_PX
    return alt.Legend(orient="top", columns=max(1, min(len(labels), int(width // entry))))


class NoChart(Exception):
    """The chart cannot be drawn; the message says why (shown as 'not measured: <why>')."""


def _need(df: pd.DataFrame | None, *cols: str, what: str = "chart") -> pd.DataFrame:
    if df is None or len(df) == 0:
        raise NoChart(f"no data for the {what}")
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise NoChart(f"the {what} needs column(s) {', '.join(missing)}")
    return df


def to_spec(chart: alt.TopLevelMixin) -> dict[str, Any]:
    spec = chart.to_dict()
    config = dict(THEME)
    config.update(spec.get("config", {}))
    spec["config"] = config
    return spec


# --------------------------------------------------------------------------------------------- roofline
def roofline_components(df: pd.DataFrame, value: str, label: str, unit_title: str) -> alt.Chart:
    """Horizontal bars, one per component, largest first; coloured by group."""
    df = _need(df, label, value, what="roofline breakdown").copy()
    df = df[pd.to_numeric(df[value], errors="coerce").fillna(0) > 0]
    if df.empty:
        raise NoChart("every component is zero")
    df[value] = pd.to_numeric(df[value])
    total = df[value].sum()
    df["share"] = df[value] / total
    color = "group" if "group" in df.columns else label
    # largest first as a list: sort="-x" on both layers made Vega-Lite warn of conflicting sorts (bar and text)
    order = df.sort_values(value, ascending=False, kind="stable")[label].tolist()
    base = alt.Chart(df).encode(
        y=alt.Y(f"{label}:N", sort=order, title=None),
        x=alt.X(f"{value}:Q", title=unit_title),
        tooltip=[alt.Tooltip(f"{label}:N"), alt.Tooltip(f"{value}:Q", format=",.4~g"),
                 alt.Tooltip("share:Q", format=".1%")],
    )
    bars = base.mark_bar(height={"band": 0.7}).encode(color=alt.Color(f"{color}:N", legend=None))
    text = base.mark_text(align="left", dx=4).encode(text=alt.Text("share:Q", format=".1%"))
    return (bars + text).properties(width=WIDTH - 240, height=max(60, 26 * len(df)))


# --------------------------------------------------------------------------------------------- micro-benchmarks
def gemm_m1_bandwidth(df: pd.DataFrame, copy_gbps: float | None) -> alt.Chart:
    """Achieved GB/s per shape at the smallest M, one bar per dtype; dashed rule at the measured copy bandwidth."""
    df = _need(df, "shape", "dtype", "gbps", what="GEMM bandwidth chart")
    gpu = "gpu_us" in df.columns and pd.to_numeric(df["gpu_us"], errors="coerce").notna().any()
    bars = alt.Chart(df).mark_bar().encode(
        y=alt.Y("shape:N", title=None, sort=None),
        yOffset=alt.YOffset("dtype:N"),
        x=alt.X("gbps:Q", title=f"achieved GB/s ({'GPU time' if gpu else 'wall time'})", axis=alt.Axis(tickCount=5)),
        color=alt.Color("dtype:N", title="dtype", legend=wrapped_legend(df["dtype"].unique())),
        tooltip=["shape:N", "dtype:N", "backend:N", alt.Tooltip("gbps:Q", format=",.0f"),
                 alt.Tooltip("gpu_us:Q", format=",.2f", title="GPU µs"),
                 alt.Tooltip("eager_us:Q", format=",.2f", title="eager µs")],
    )
    layers = [bars]
    if copy_gbps:
        rule_df = pd.DataFrame({"copy": [copy_gbps], "label": [f"copy {copy_gbps:,.0f} GB/s"]})
        layers.append(alt.Chart(rule_df).mark_rule(strokeDash=[5, 4], color=RESIDUAL).encode(x="copy:Q"))
        layers.append(alt.Chart(rule_df).mark_text(align="right", baseline="bottom", dx=-3, dy=-2,
                                                   color=RESIDUAL, fontSize=10)
                      .encode(x="copy:Q", y=alt.value(0), text="label:N"))
    n = df["shape"].nunique() * max(1, df["dtype"].nunique())
    return alt.layer(*layers).properties(width=WIDTH - 240, height=max(80, 14 * n))


def gemm_m_sweep(df: pd.DataFrame, copy_gbps: float | None) -> alt.Chart:
    """GB/s against M, one panel per shape, one line per dtype."""
    df = _need(df, "shape", "dtype", "M", "gbps", what="GEMM M sweep")
    base = alt.Chart(df).encode(
        x=alt.X("M:Q", scale=alt.Scale(type="log", base=2), axis=alt.Axis(values=sorted(df["M"].unique().tolist())),
                title="M (tokens)"),
        y=alt.Y("gbps:Q", title="GB/s"),
        color=alt.Color("dtype:N", title="dtype", legend=wrapped_legend(df["dtype"].unique())),
        tooltip=["shape:N", "dtype:N", "M:Q", alt.Tooltip("gbps:Q", format=",.0f"),
                 alt.Tooltip("tflops:Q", format=",.2f") if "tflops" in df.columns else "M:Q"],
    )
    chart = base.mark_line(point=True)
    if copy_gbps:
        chart = chart + alt.Chart(df).mark_rule(strokeDash=[5, 4], color=RESIDUAL, opacity=0.6).encode(
            y=alt.datum(copy_gbps))
    cols = 3
    # each panel its own x axis: a wrapped facet draws the last row's axis under an empty cell too
    return chart.properties(width=(WIDTH - 60) // cols - 20, height=120).facet(
        facet=alt.Facet("shape:N", title=None, header=alt.Header(labelLimit=200)), columns=cols
    ).resolve_axis(x="independent")


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks spanning [lo, hi] for a log axis."""
    import math

    if not (lo > 0 and hi > 0):
        return []
    out = []
    for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0 ** e
            if lo / 1.5 <= v <= hi * 1.5:
                out.append(v)
    return out if len(out) <= 9 else [v for v in out if str(v).lstrip("0.").startswith("1")]


SIZE_LABELS = ("datum.value >= 1073741824 ? (datum.value/1073741824) + ' GiB' : datum.value >= 1048576 ? "
               "(datum.value/1048576) + ' MiB' : datum.value >= 1024 ? (datum.value/1024) + ' KiB' : datum.value + ' B'")


def allreduce(df: pd.DataFrame, model_bytes: float | None) -> alt.HConcatChart:
    """nccl-tests style: latency and bus bandwidth against message size (log-log)."""
    df = _need(df, "size", "time_us", what="all-reduce chart")
    sizes = [v for v in (8, 512, 32768, 2097152, 134217728, 8589934592)
             if df["size"].min() / 2 <= v <= df["size"].max() * 2] or None
    x = alt.X("size:Q", scale=alt.Scale(type="log", base=2), title="message size",
              axis=alt.Axis(labelExpr=SIZE_LABELS, values=sizes))
    has_series = "series" in df.columns
    color = (alt.Color("series:N", title=None, legend=wrapped_legend(df["series"].unique(), WIDTH // 2),
                       scale=alt.Scale(range=[PALETTE[0], MEASURED])) if has_series else alt.value(PALETTE[0]))
    tips = [alt.Tooltip("size:Q", format=",", title="bytes")] + ([alt.Tooltip("series:N")] if has_series else [])
    lat = alt.Chart(df).mark_line(point=True).encode(
        x=x, y=alt.Y("time_us:Q", scale=alt.Scale(type="log"), title="time per op (µs, log)",
                     axis=alt.Axis(values=_log_ticks(df["time_us"].min(), df["time_us"].max()) or None)),
        color=color, tooltip=tips + [alt.Tooltip("time_us:Q", format=",.2f")],
    )
    layers = [lat]
    if model_bytes:
        layers.append(alt.Chart(pd.DataFrame({"b": [model_bytes], "t": ["model message"]}))
                      .mark_rule(strokeDash=[4, 3], color=MUTED).encode(x="b:Q", tooltip=["t:N", "b:Q"]))
    left = alt.layer(*layers).properties(width=WIDTH // 2 - 60, height=200)
    if "busbw" not in df.columns:
        return alt.hconcat(left)
    bw = alt.Chart(df).mark_line(point=True).encode(
        x=x, y=alt.Y("busbw:Q", title="busbw (GB/s)"), color=color,
        tooltip=tips + [alt.Tooltip("busbw:Q", format=",.2f")] + (
            [alt.Tooltip("algbw:Q", format=",.2f")] if "algbw" in df.columns else []),
    ).properties(width=WIDTH // 2 - 60, height=200)
    return alt.hconcat(left, bw, spacing=36)


def _shown(domain: list[str], rng: list[str], values) -> alt.Scale:
    """A colour scale over the categories the data holds, each keeping its colour: a legend lists no series that
    drew nothing (a CPU run has no graph bars, a stream no multi-token chunk)."""
    present = {str(v) for v in values}
    kept = [(d, r) for d, r in zip(domain, rng) if d in present] or list(zip(domain, rng))
    return alt.Scale(domain=[d for d, _ in kept], range=[r for _, r in kept])


def eager_vs_graph(df: pd.DataFrame, unit: str = "µs") -> alt.LayerChart:
    """Dumbbell per case: graph (GPU) time to eager time; the bar between them is the launch overhead."""
    df = _need(df, "case", "mode", "value", what="eager vs graph chart")
    df = df[df["value"] > 0]
    if df.empty:
        raise NoChart("no positive times")
    wide = df.pivot_table(index="case", columns="mode", values="value", aggfunc="first").reset_index()
    order = df["case"].drop_duplicates().tolist()
    log = df["value"].max() / df["value"].min() > 30
    xs = alt.Scale(type="log") if log else alt.Scale(zero=True)
    xaxis = alt.Axis(values=_log_ticks(df["value"].min(), df["value"].max()) or None) if log else alt.Axis()
    y = alt.Y("case:N", sort=order, title=None)
    rule = alt.Chart(wide).mark_rule(color="#cbd5e1", strokeWidth=5).encode(
        y=y, x=alt.X("graph:Q", scale=xs, title=f"time per call ({unit}{', log scale' if log else ''})", axis=xaxis),
        x2="eager:Q")
    pts = alt.Chart(df).mark_point(filled=True, size=90, opacity=1).encode(
        y=y, x=alt.X("value:Q", scale=xs),
        color=alt.Color("mode:N", title=None, sort=["graph", "eager"],
                        scale=_shown(["graph", "eager"], [MEASURED, "#f59e0b"], df["mode"]),
                        legend=alt.Legend(orient="top")),
        tooltip=["case:N", "mode:N", alt.Tooltip("value:Q", format=",.2f", title=unit)])
    return alt.layer(rule, pts).properties(width=WIDTH - 300, height=max(60, 24 * len(order)))


def moe_loop_vs_grouped(df: pd.DataFrame) -> alt.Chart:
    df = _need(df, "M", "time_us", "impl", what="MoE chart")
    return alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("M:Q", scale=alt.Scale(type="log", base=2), axis=alt.Axis(values=sorted(df["M"].unique().tolist())),
                title="M (tokens)"),
        y=alt.Y("time_us:Q", title="GPU time (µs)"),
        color=alt.Color("impl:N", title=None, legend=wrapped_legend(df["impl"].unique())),
        tooltip=["impl:N", "M:Q", alt.Tooltip("time_us:Q", format=",.2f")],
    ).properties(width=WIDTH - 120, height=200)


# --------------------------------------------------------------------------------------------- gap
def waterfall(df: pd.DataFrame) -> alt.Chart:
    """Horizontal waterfall: base (roofline), increments, residual, total (live ITL)."""
    df = _need(df, "step", "start", "end", "kind", what="waterfall")
    domain = ["roofline / live", "measured", "modelled", "residual", "inconsistent"]
    rng = [TOTAL, MEASURED, MODELLED, RESIDUAL, INCONSISTENT]
    order = df["step"].tolist()
    base = alt.Chart(df).encode(y=alt.Y("step:N", sort=order, title=None, axis=alt.Axis(labelLimit=230)))
    bars = base.mark_bar(height={"band": 0.68}).encode(
        x=alt.X("start:Q", title="ms per token"), x2="end:Q",
        color=alt.Color("kind:N", title=None, scale=_shown(domain, rng, df["kind"]),
                        legend=alt.Legend(orient="top")),
        tooltip=["step:N", alt.Tooltip("ms:Q", format=",.3f"), "source:N", "kind:N"]
        + (["measured_on:N"] if "measured_on" in df.columns else []),
    )
    text = base.mark_text(align="left", dx=4).encode(x=alt.X("right:Q"), text="label:N")
    # padding: room for the labels at both ends when the PDF's font runs wider than the one vl-convert measured with
    return (bars + text).properties(width=WIDTH - 300, height=max(80, 30 * len(df)),
                                    padding={"left": 40, "right": 110, "top": 6, "bottom": 6})


def levels(df: pd.DataFrame) -> alt.LayerChart:
    """The stack of levels side by side: roofline, kernel, engine (eager and graph), server (live ITL)."""
    df = _need(df, "level", "variant", "ms", what="levels chart").copy()
    df["bar"] = df["level"] + " · " + df["variant"]
    df["label"] = df["ms"].map(lambda v: f"{v:,.2f} ms" if v < 100 else f"{v:,.0f} ms")
    order = df["bar"].tolist()
    base = alt.Chart(df).encode(y=alt.Y("bar:N", sort=order, title=None))
    bars = base.mark_bar(height={"band": 0.7}).encode(
        x=alt.X("ms:Q", title="ms per token"),
        color=alt.Color("variant:N", title=None, legend=alt.Legend(orient="top"),
                        scale=_shown(["modelled", "eager", "graph", "live"], [MODELLED, "#f59e0b", MEASURED, TOTAL],
                                     df["variant"])),
        tooltip=["level:N", "variant:N", alt.Tooltip("ms:Q", format=",.3f"), "source:N"])
    text = base.mark_text(align="left", dx=4).encode(x="ms:Q", text="label:N")
    return (bars + text).properties(width=WIDTH - 300, height=max(60, 26 * len(df)))


def components(df: pd.DataFrame) -> alt.Chart:
    df = _need(df, "name", "ms", "status", what="component chart")
    return alt.Chart(df).mark_bar(height={"band": 0.7}).encode(
        y=alt.Y("name:N", sort="-x", title=None),
        x=alt.X("ms:Q", title="ms per step"),
        color=alt.Color("status:N", title=None, legend=alt.Legend(orient="top"),
                        scale=_shown(["measured", "modelled"], [MEASURED, MODELLED], df["status"])),
        tooltip=["name:N", alt.Tooltip("ms:Q", format=",.3f"), "status:N"],
    ).properties(width=WIDTH - 240, height=max(60, 24 * len(df)))


# --------------------------------------------------------------------------------------------- live
def itl_histogram(df: pd.DataFrame) -> alt.Chart:
    """Pre-binned ITL histograms, per chunk and per token, side by side."""
    df = _need(df, "view", "bin_start", "bin_end", "count", what="ITL histogram")
    return alt.Chart(df).mark_bar(color=PALETTE[0], cornerRadiusEnd=0, binSpacing=0).encode(
        x=alt.X("bin_start:Q", bin="binned", title="inter-token latency (ms)"), x2="bin_end:Q",
        y=alt.Y("count:Q", title="count"),
        color=alt.Color("view:N", title=None, legend=None, scale=alt.Scale(range=[PALETTE[0], MEASURED])),
        tooltip=["view:N", alt.Tooltip("bin_start:Q", format=",.2f", title="from ms"),
                 alt.Tooltip("bin_end:Q", format=",.2f", title="to ms"), "count:Q"],
    ).properties(width=WIDTH // 2 - 50, height=170).facet(
        column=alt.Column("view:N", title=None, sort=["per chunk", "per token"]))


def request_timeline(df: pd.DataFrame) -> alt.Chart:
    """One request: each token's latency against its index; multi-token chunks stand out."""
    df = _need(df, "token", "ms", "chunk_tokens", what="request timeline")
    return alt.Chart(df).mark_bar(width={"band": 0.8}, cornerRadiusEnd=0).encode(
        x=alt.X("token:O", title="output token", axis=alt.Axis(labelAngle=0, values=[
            int(t) for t in df["token"] if int(t) == 1 or int(t) % 8 == 0])),
        y=alt.Y("ms:Q", title="ms (TTFT, then per-token ITL)"),
        color=alt.Color("kind:N", title=None, legend=alt.Legend(orient="top"),
                        scale=_shown(["first token (TTFT)", "1-token chunk", "multi-token chunk"],
                                     [TOTAL, PALETTE[0], "#f59e0b"], df["kind"])),
        tooltip=["token:O", alt.Tooltip("ms:Q", format=",.2f"), "chunk:Q", "chunk_tokens:Q",
                 alt.Tooltip("t_ms:Q", format=",.1f", title="since request start (ms)")],
    ).properties(width=WIDTH - 80, height=190)


def throughput(df: pd.DataFrame) -> alt.LayerChart:
    """Output throughput against concurrency, with the median per-token ITL on a second axis."""
    df = _need(df, "concurrency", "output_throughput", what="throughput chart")
    x = alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2),
              axis=alt.Axis(values=sorted(df["concurrency"].unique().tolist())), title="concurrency")
    tput = alt.Chart(df).mark_line(point=True, color=PALETTE[0]).encode(
        x=x, y=alt.Y("output_throughput:Q", title="output throughput (tok/s)", axis=alt.Axis(titleColor=PALETTE[0])),
        tooltip=["concurrency:Q", alt.Tooltip("output_throughput:Q", format=",.1f")])
    if "itl" not in df.columns or df["itl"].isna().all():
        return tput.properties(width=WIDTH - 140, height=200)
    itl = alt.Chart(df).mark_line(point=True, color="#f59e0b", strokeDash=[5, 3]).encode(
        x=x, y=alt.Y("itl:Q", title="median ITL per token (ms)", axis=alt.Axis(titleColor="#f59e0b")),
        tooltip=["concurrency:Q", alt.Tooltip("itl:Q", format=",.2f")])
    return alt.layer(tput, itl).resolve_scale(y="independent").properties(width=WIDTH - 140, height=200)


# --------------------------------------------------------------------------------------------- history
def trend(df: pd.DataFrame) -> alt.Chart:
    """Headline metrics over this revision's runs, one small panel per metric."""
    df = _need(df, "run", "metric", "value", "current", what="trend chart")
    order = df["run"].drop_duplicates().tolist()
    base = alt.Chart(df).encode(
        x=alt.X("run:N", sort=order, title=None, axis=alt.Axis(labels=False, ticks=False)),
        y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
        tooltip=["run:N", "metric:N", alt.Tooltip("value:Q", format=",.3~f"), "change:N"],
    )
    line = base.mark_line(color=PALETTE[0])
    pts = base.mark_point(filled=True, size=55).encode(
        color=alt.Color("current:N", title=None, legend=alt.Legend(orient="top"),
                        scale=alt.Scale(domain=["earlier run", "this run"], range=[PALETTE[0], RESIDUAL])))
    # x axes per panel: a wrapped facet otherwise draws the last row's axis under an empty cell
    return (line + pts).properties(width=(WIDTH - 60) // 3 - 24, height=110).facet(
        facet=alt.Facet("metric:N", title=None, sort=df["metric"].drop_duplicates().tolist()),
        columns=3).resolve_scale(y="independent").resolve_axis(x="independent")


def compare_bars(df: pd.DataFrame, unit: str) -> alt.Chart:
    """Two runs side by side per item."""
    df = _need(df, "item", "run", "value", what="comparison chart")
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("item:N", title=None, sort=None),
        yOffset=alt.YOffset("run:N", sort=["A", "B"]),
        x=alt.X("value:Q", title=unit),
        color=alt.Color("run:N", title=None, sort=["A", "B"], scale=alt.Scale(domain=["A", "B"], range=[PALETTE[0], "#f59e0b"]),
                        legend=alt.Legend(orient="top")),
        tooltip=["item:N", "run:N", alt.Tooltip("value:Q", format=",.3f")],
    ).properties(width=WIDTH - 240, height=max(60, 30 * df["item"].nunique()))
