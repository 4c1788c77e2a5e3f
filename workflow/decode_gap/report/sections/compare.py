"""The compare report: two archived runs side by side."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pandas as pd

from ... import __version__
from ...provenance import MEASURED, MODELLED
from .. import charts as ch
from ..data import HEADLINE, Bundle, Fig, audit_findings, fig_field, first_key, fmt_num, headline, live_levels, num
from .common import Builder
from .headline import levers_list
from .microbench import gemm_frame
from .simulation import waterfall_frame
from .since import delta_row, findings_brief, findings_delta
from .appendix import provenance_section
from .context import _subtitle


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
