"""Build the report's template context from a Bundle of stage files (and the archive, for history).

Every section is a dict with `id`, `title`, `ok` and, when not ok, `why` (printed "not measured: <why>").
A section never raises on odd stage content: a missing field is a missing figure, not a crash.

One module per report section; this package re-exports their names so that
`from decode_gap.report.sections import build_context, compare_context` keeps working.
"""

from .common import META_KEYS, ChartRef, df_table, Builder
from .headline import headline_section, closure_verdict, levers_list
from .audit import audit_facts, audit_section
from .roofline import ROOFLINE_FIGS, roofline_section
from .microbench import (memory_sub, SLOW_BELOW, kernel_reading, gemm_frame, gemm_sub, allreduce_sub, comm_floor_text,
                         eager_graph_sub, moe_sub, attention_sub, microbench_section)
from .simulation import WATERFALL_TOTAL, waterfall_frame, waterfall_hosts, simulation_section
from .live import LIVE_STATS, LIVE_METRICS, chunk_itls, itl_hist_frame, timeline_frame, live_section
from .since import TREND_METRICS, delta_row, findings_delta, findings_brief, since_section
from .appendix import sources_rows, provenance_section
from .context import build_context
from .compare import compare_context

__all__ = [
    "Builder", "ChartRef", "LIVE_METRICS", "LIVE_STATS", "META_KEYS", "ROOFLINE_FIGS", "SLOW_BELOW",
    "TREND_METRICS", "WATERFALL_TOTAL", "allreduce_sub", "attention_sub", "audit_facts", "audit_section",
    "build_context", "chunk_itls", "closure_verdict", "comm_floor_text", "compare_context", "delta_row",
    "df_table", "eager_graph_sub", "findings_brief", "findings_delta", "gemm_frame", "gemm_sub",
    "headline_section", "itl_hist_frame", "kernel_reading", "levers_list", "live_section", "memory_sub",
    "microbench_section", "moe_sub", "provenance_section", "roofline_section", "simulation_section",
    "since_section", "sources_rows", "timeline_frame", "waterfall_frame", "waterfall_hosts",
]
