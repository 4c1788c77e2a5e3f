"""Read the stage files the report shows, tolerating any that are missing, skipped, partial or malformed.

Nothing here raises on bad stage content: a file that cannot be used becomes a `why` string that the
report prints as "not measured: <why>". Every number that reaches the report is a `Fig`, labelled
measured / modelled / unavailable (decode_gap.provenance), with its source.

Kept as one module (about 550 lines) on purpose: the readers (Doc, Table, Bundle) and the headline figures
built on them are the report's one reading of the stage files, imported by name from `data` by every section,
the archive, compare and the tests; a split would only move names behind re-exports.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from ..errors import describe
from ..metrics import live_itl
from ..provenance import MEASURED, MODELLED, UNAVAILABLE

# Stage files, by the names render_report's input uses, relative to results/<hw-rev>/ (and to an archive entry).
STAGE_FILES: dict[str, str] = {
    "audit": "audit.json",
    "roofline": "roofline.json",
    "roofline_components": "roofline_components.csv",
    "memory": "microbench/memory.json",
    "allreduce": "microbench/allreduce.csv",
    "allreduce_json": "microbench/allreduce.json",
    "gemm": "microbench/gemm.csv",
    "gemm_json": "microbench/gemm.json",
    "moe": "microbench/moe.csv",
    "moe_json": "microbench/moe.json",
    "attention": "microbench/attention.csv",
    "attention_json": "microbench/attention.json",
    "launch": "microbench/launch.csv",
    "launch_json": "microbench/launch.json",
    "simulate": "simulate.json",
    "live": "live/summary.json",
    "live_requests": "live/requests.parquet",
    "live_chunks": "live/chunks.parquet",
    "gap": "gap.json",
    "trace": "trace.json",
}

# Stage files a results tree may lack (measured before that stage existed): render mode renders without them and
# the report says the stage was not produced. A full run always produces them.
OPTIONAL_STAGE_FILES: frozenset[str] = frozenset({"trace"})

STATUSES = (MEASURED, MODELLED, UNAVAILABLE)


# --------------------------------------------------------------------------------------------- numbers
def num(value: Any) -> float | None:
    """A finite float from a JSON value (numbers, numeric strings, provenance dicts), else None."""
    if isinstance(value, dict) and "value" in value:
        value = value["value"]
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        v = float(value)
    elif isinstance(value, str):
        try:
            v = float(value.strip())
        except ValueError:
            return None
    elif hasattr(value, "item"):  # numpy scalar
        try:
            v = float(value.item())
        except (TypeError, ValueError):
            return None
    else:
        return None
    return v if math.isfinite(v) else None


def fmt_num(v: float | None, digits: int | None = None) -> str:
    """Readable number: thousands separators, 3-4 significant digits, no scientific notation for usual sizes."""
    if v is None:
        return "—"
    if digits is not None:
        return f"{v:,.{digits}f}"
    a = abs(v)
    if a == 0:
        return "0"
    if float(v).is_integer() and a < 1e15:
        return f"{int(v):,}"
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a >= 0.001:
        return f"{v:.3g}"
    return f"{v:.2e}"


def fmt_bytes(v: float | None) -> str:
    if v is None:
        return "—"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= div:
            return f"{fmt_num(v / div)} {unit}"
    return f"{fmt_num(v)} B"


def fmt_size(v: float | None) -> str:
    """Message sizes the way nccl-tests users read them: binary units (8 B, 32 KiB, 64 MiB)."""
    if v is None:
        return "—"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= div:
            return f"{fmt_num(v / div)} {unit}"
    return f"{fmt_num(v)} B"


def parse_provenance(text: Any) -> tuple[str, str]:
    """'measured: copy bandwidth from microbench' -> ('measured', 'copy bandwidth from microbench')."""
    if isinstance(text, dict):
        return str(text.get("status", "")), str(text.get("source") or text.get("why") or "")
    if not isinstance(text, str):
        return "", ""
    head, _, rest = text.partition(":")
    head = head.strip().lower()
    if head in STATUSES:
        return head, rest.strip()
    return "", text.strip()


@dataclass
class Fig:
    """One figure as the report shows it: value, unit, measured/modelled/unavailable, source, why."""

    value: float | None
    unit: str = ""
    status: str = UNAVAILABLE
    source: str = ""
    why: str = ""

    @property
    def ok(self) -> bool:
        return self.value is not None and self.status != UNAVAILABLE

    def text(self, digits: int | None = None) -> str:
        if not self.ok:
            return "unavailable"
        unit = self.unit
        if unit == "%":
            return f"{fmt_num(self.value, digits)}%"
        if unit == "B":
            return fmt_bytes(self.value)
        if unit == "x":
            return f"{fmt_num(self.value, digits)}×"
        if unit in ("", "count") and float(self.value).is_integer():
            return f"{int(self.value):,}"
        return f"{fmt_num(self.value, digits)} {unit}".strip()

    def scaled(self, factor: float, unit: str) -> "Fig":
        return Fig(None if self.value is None else self.value * factor, unit, self.status, self.source, self.why)

    def to_json(self) -> dict[str, Any]:
        out = {"value": self.value, "unit": self.unit, "status": self.status if self.ok else UNAVAILABLE,
               "source": self.source}
        if not self.ok:
            out["why"] = self.why or "not available"
        return out

    @classmethod
    def from_json(cls, d: Any) -> "Fig":
        if not isinstance(d, dict):
            return unavailable_fig("not recorded")
        return cls(num(d.get("value")), str(d.get("unit", "")), str(d.get("status", UNAVAILABLE)),
                   str(d.get("source", "")), str(d.get("why", "")))

    def __str__(self) -> str:  # pragma: no cover - debugging aid
        return self.text()


def unavailable_fig(why: str, unit: str = "", source: str = "") -> Fig:
    return Fig(None, unit, UNAVAILABLE, source, why)


# --------------------------------------------------------------------------------------------- documents
@dataclass
class Doc:
    """A stage JSON: its data when usable, else why not."""

    name: str
    rel: str
    path: str | None
    data: dict[str, Any] | None = None
    state: str = "missing"  # ok | partial | skipped | missing | invalid
    why: str = ""

    @property
    def usable(self) -> bool:
        return self.data is not None and self.state in ("ok", "partial")

    def get(self, *keys: str, default: Any = None) -> Any:
        return dig(self.data, *keys, default=default)

    @property
    def device(self) -> str:
        return str(self.get("device", default="") or "")

    @property
    def backend(self) -> str:
        b = self.get("backend", default="")
        if isinstance(b, dict):
            return ", ".join(f"{k}: {v}" for k, v in b.items())
        return str(b or "")

    @property
    def skipped_cases(self) -> list[dict[str, str]]:
        out = []
        for item in self.get("skipped", default=[]) or []:
            if isinstance(item, dict):
                out.append({"case": str(item.get("case", item.get("name", "?"))),
                            "reason": str(item.get("reason", item.get("why", "")))})
            elif isinstance(item, str):
                out.append({"case": item, "reason": ""})
        return out


@dataclass
class Table:
    """A stage table (CSV or Parquet): its rows when usable, else why not."""

    name: str
    rel: str
    path: str | None
    df: pd.DataFrame | None = None
    why: str = ""

    @property
    def usable(self) -> bool:
        return self.df is not None and len(self.df) > 0


def dig(data: Any, *keys: Any, default: Any = None) -> Any:
    cur = data
    for k in keys:
        if isinstance(cur, dict) and k in cur:
            cur = cur[k]
        elif isinstance(cur, list) and isinstance(k, int) and -len(cur) <= k < len(cur):
            cur = cur[k]
        else:
            return default
    return cur


def load_doc(name: str, path: str | os.PathLike | None, rel: str | None = None) -> Doc:
    rel = rel or STAGE_FILES.get(name, name)
    if not path or not Path(path).is_file():
        return Doc(name, rel, str(path) if path else None, None, "missing", f"{rel} was not produced")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError) as exc:
        return Doc(name, rel, str(path), None, "invalid", f"{rel} cannot be read ({exc.__class__.__name__})")
    except json.JSONDecodeError as exc:
        return Doc(name, rel, str(path), None, "invalid", f"{rel} is not valid JSON (line {exc.lineno}: {exc.msg})")
    if not isinstance(data, dict):
        return Doc(name, rel, str(path), None, "invalid", f"{rel} is not a JSON object")
    status = str(data.get("status", "ok") or "ok").lower()
    if status == "skipped":
        reason = str(data.get("reason") or "skipped by the stage")
        return Doc(name, rel, str(path), data, "skipped", reason)
    if status in ("error", "failed"):
        reason = str(data.get("reason") or data.get("error") or "the stage failed")
        return Doc(name, rel, str(path), data, "skipped", reason)
    return Doc(name, rel, str(path), data, "partial" if status == "partial" else "ok",
               str(data.get("reason", "")) if status == "partial" else "")


def load_table(name: str, path: str | os.PathLike | None, rel: str | None = None) -> Table:
    rel = rel or STAGE_FILES.get(name, name)
    if not path or not Path(path).is_file():
        return Table(name, rel, str(path) if path else None, None, f"{rel} was not produced")
    try:
        if str(path).endswith(".parquet"):
            df = pd.read_parquet(path)
        else:
            df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return Table(name, rel, str(path), None, f"{rel} has no rows")
    except Exception as exc:  # any unreadable table is reported, never fatal
        return Table(name, rel, str(path), None, f"{rel} cannot be read ({describe(exc, 120, with_type=False)})")
    if len(df) == 0:
        return Table(name, rel, str(path), df, f"{rel} has no rows")
    df.columns = [str(c).strip() for c in df.columns]
    return Table(name, rel, str(path), df, "")


@dataclass
class Bundle:
    """Every stage file of one run, loaded."""

    docs: dict[str, Doc] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)

    def doc(self, name: str) -> Doc:
        return self.docs.get(name) or Doc(name, STAGE_FILES.get(name, name), None, None, "missing",
                                          f"{STAGE_FILES.get(name, name)} was not produced")

    def table(self, name: str) -> Table:
        return self.tables.get(name) or Table(name, STAGE_FILES.get(name, name), None, None,
                                              f"{STAGE_FILES.get(name, name)} was not produced")


def load_bundle(files: dict[str, str | os.PathLike | None]) -> Bundle:
    """`files`: stage name -> path (names as in STAGE_FILES; unknown names are ignored)."""
    b = Bundle()
    for name, rel in STAGE_FILES.items():
        path = files.get(name)
        if rel.endswith(".json"):
            b.docs[name] = load_doc(name, path, rel)
        else:
            b.tables[name] = load_table(name, path, rel)
    return b


def files_in_dir(directory: str | os.PathLike) -> dict[str, str]:
    """The stage files of a results/<hw-rev>/ directory or an archive entry."""
    d = Path(directory)
    return {name: str(d / rel) for name, rel in STAGE_FILES.items()}


# --------------------------------------------------------------------------------------------- figures
def fig_field(doc: Doc, key: str, unit: str, default_status: str, path: Iterable[str] = ()) -> Fig:
    """A labelled figure from a stage JSON field; the stage's `provenance` map decides the label."""
    src = f"{doc.rel}: {'.'.join([*path, key])}"
    if not doc.usable:
        return unavailable_fig(doc.why, unit, src)
    container = doc.get(*path) if path else doc.data
    raw = dig(container, key)
    if isinstance(raw, dict) and raw.get("status") in STATUSES:
        f = Fig(num(raw.get("value")), str(raw.get("unit") or unit), raw["status"], str(raw.get("source") or src),
                str(raw.get("why", "")))
        if f.value is None and f.status != UNAVAILABLE:
            f.status, f.why = UNAVAILABLE, f.why or f"{key} has no value"
        return f
    value = num(raw)
    prov_map = dig(container, "provenance") if isinstance(dig(container, "provenance"), dict) else doc.get("provenance")
    status, detail = parse_provenance(dig(prov_map, key)) if isinstance(prov_map, dict) else ("", "")
    if value is None:
        why = detail if status == UNAVAILABLE and detail else (f"{key} missing in {doc.rel}" if raw is None
                                                                else f"{key} is not a number in {doc.rel}")
        return unavailable_fig(why, unit, src)
    if status == UNAVAILABLE:
        return unavailable_fig(detail or f"{doc.rel} marks {key} unavailable", unit, src)
    return Fig(value, unit, status or default_status, f"{src}" + (f" ({detail})" if detail else ""))


def first_key(d: dict[str, Any] | None, *keys: str) -> Any:
    if not isinstance(d, dict):
        return None
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    return None


def find_col(df: pd.DataFrame | None, *candidates: str) -> str | None:
    """First column named like one of the candidates (case-insensitive)."""
    if df is None:
        return None
    lower = {c.lower(): c for c in df.columns}
    for cand in candidates:
        if cand.lower() in lower:
            return lower[cand.lower()]
    return None


def one_rank_allreduce_step(gap: Doc) -> dict[str, Any] | None:
    """gap.json's all-reduce step where it stands in for an all-reduce measured at fewer ranks than tp (its
    `one_rank` mark: the roofline's datasheet model), else None."""
    steps = gap.get("waterfall", default=[]) if gap.usable else []
    return next((st for st in (steps if isinstance(steps, list) else []) if isinstance(st, dict)
                 and st.get("name") == "all-reduce" and st.get("one_rank")), None)


# --------------------------------------------------------------------------------------------- live levels
def live_levels(doc: Doc) -> list[dict[str, Any]]:
    levels = doc.get("levels", default=[]) if doc.usable else []
    if isinstance(levels, dict):  # tolerate {"1": {...}, "2": {...}}
        levels = [dict(v, concurrency=v.get("concurrency", k)) for k, v in levels.items() if isinstance(v, dict)]
    out = [lv for lv in levels if isinstance(lv, dict)]
    return sorted(out, key=lambda lv: num(lv.get("concurrency")) or 0)


def lowest_level(doc: Doc) -> dict[str, Any] | None:
    levels = live_levels(doc)
    for lv in levels:
        if num(lv.get("concurrency")) == 1:
            return lv
    return levels[0] if levels else None


def live_itl_fig(bundle: Bundle) -> Fig:
    gap = bundle.doc("gap")
    f = fig_field(gap, "live_itl_ms", "ms", MEASURED)
    if f.ok:
        return f
    live = bundle.doc("live")
    if not live.usable:
        return unavailable_fig(live.why, "ms", live.rel)
    lv = lowest_level(live)
    if lv is None:
        return unavailable_fig(f"{live.rel} has no concurrency levels", "ms", live.rel)
    c = lv.get("concurrency")
    v, key = live_itl(lv, num)  # the same choice as the gap's (decode_gap.metrics)
    if v is not None:
        return Fig(v, "ms", MEASURED, f"{live.rel}: levels[concurrency={c}].{key}")
    return unavailable_fig(f"{live.rel} level {c} has no ITL statistics", "ms", live.rel)


def _ratio(a: Fig, b: Fig, unit: str, source: str, scale: float = 1.0) -> Fig:
    if not a.ok or not b.ok or not b.value:
        why = a.why if not a.ok else b.why if not b.ok else "division by zero"
        return unavailable_fig(why, unit, source)
    status = MEASURED if a.status == MEASURED and b.status == MEASURED else MODELLED
    return Fig(a.value / b.value * scale, unit, status, source)


def _fraction_pct(f: Fig) -> Fig:
    """Fractions (0-1) become percent; values already above 1.5 are taken as percent."""
    if not f.ok:
        return Fig(None, "%", f.status, f.source, f.why)
    v = f.value * 100 if abs(f.value) <= 1.5 else f.value
    return Fig(v, "%", f.status, f.source, f.why)


# The headline metrics, in order: key, label, unit, which direction is better.
HEADLINE = [
    ("roofline_ms", "Roofline floor", "ms/token", "lower"),
    ("tokens_per_s_ceiling", "Ceiling", "tok/s", "higher"),
    ("live_itl_ms", "Live ITL per token (lowest concurrency)", "ms", "lower"),
    ("live_tokens_per_s", "Live single-stream decode rate", "tok/s", "higher"),
    ("efficiency", "Efficiency (roofline ÷ live)", "%", "higher"),
    ("gap_factor", "Gap (live ÷ roofline)", "x", "lower"),
    ("explained_fraction", "Explained by named components", "%", "higher"),
    ("closure_ratio", "Closure (predicted ÷ live)", "", "none"),
    ("ttft_ms", "Median TTFT (lowest concurrency)", "ms", "lower"),
    ("peak_output_throughput", "Peak output throughput", "tok/s", "higher"),
    ("kernel_eager_ms", "Kernel-level step, eager", "ms", "lower"),
    ("kernel_graph_ms", "Kernel-level step, CUDA graph", "ms", "lower"),
    ("engine_eager_ms", "Engine-level step, eager", "ms", "lower"),
    ("engine_graph_ms", "Engine-level step, graph/compiled", "ms", "lower"),
    ("copy_gbps", "Copy bandwidth", "GB/s", "higher"),
    ("findings", "Audit findings", "", "lower"),
]
HEADLINE_LABELS = {k: label for k, label, _, _ in HEADLINE}
HEADLINE_BETTER = {k: better for k, _, _, better in HEADLINE}


def roofline_fig(bundle: Bundle) -> Fig:
    f = fig_field(bundle.doc("roofline"), "t_floor_ms", "ms", MODELLED)
    if f.ok:
        return f
    g = fig_field(bundle.doc("gap"), "roofline_ms", "ms", MODELLED)
    return g if g.ok else f


def headline(bundle: Bundle) -> dict[str, Fig]:
    """The run's headline figures (the same ones the archive index, the deltas and the trend use)."""
    roof = bundle.doc("roofline")
    gap = bundle.doc("gap")
    live = bundle.doc("live")
    sim = bundle.doc("simulate")
    out: dict[str, Fig] = {}
    out["roofline_ms"] = roofline_fig(bundle)
    ceiling = fig_field(roof, "tokens_per_s_ceiling", "tok/s", MODELLED)
    if not ceiling.ok and out["roofline_ms"].ok and out["roofline_ms"].value:
        ceiling = Fig(1000.0 / out["roofline_ms"].value, "tok/s", out["roofline_ms"].status,
                      "1000 ÷ roofline floor")
    out["tokens_per_s_ceiling"] = ceiling
    itl = live_itl_fig(bundle)
    out["live_itl_ms"] = itl
    out["live_tokens_per_s"] = (Fig(1000.0 / itl.value, "tok/s", itl.status, f"1000 ÷ ({itl.source})")
                                if itl.ok and itl.value else unavailable_fig(itl.why, "tok/s"))
    eff = fig_field(gap, "efficiency", "", MODELLED)
    out["efficiency"] = _fraction_pct(eff) if eff.ok else _ratio(
        out["roofline_ms"], itl, "%", "roofline floor ÷ live ITL", 100.0)
    out["gap_factor"] = _ratio(itl, out["roofline_ms"], "x", "live ITL ÷ roofline floor")
    out["explained_fraction"] = _fraction_pct(fig_field(gap, "explained_fraction", "", MODELLED))
    out["closure_ratio"] = fig_field(gap, "closure_ratio", "", MODELLED)
    lv = lowest_level(live) if live.usable else None
    if lv is not None:
        v = num(first_key(lv, "median_ttft_ms", "mean_ttft_ms"))
        out["ttft_ms"] = (Fig(v, "ms", MEASURED, f"{live.rel}: levels[concurrency={lv.get('concurrency')}].median_ttft_ms")
                          if v is not None else unavailable_fig("no TTFT statistics", "ms", live.rel))
        peaks = [(num(x.get("output_throughput")), x.get("concurrency")) for x in live_levels(live)]
        peaks = [p for p in peaks if p[0] is not None]
        out["peak_output_throughput"] = (
            Fig(max(peaks)[0], "tok/s", MEASURED,
                f"{live.rel}: max output_throughput (at concurrency {max(peaks)[1]})")
            if peaks else unavailable_fig("no output_throughput in any level", "tok/s", live.rel))
    else:
        why = live.why if not live.usable else f"{live.rel} has no concurrency levels"
        out["ttft_ms"] = unavailable_fig(why, "ms", live.rel)
        out["peak_output_throughput"] = unavailable_fig(why, "tok/s", live.rel)
    out["kernel_eager_ms"] = fig_field(sim, "eager_ms", "ms", MEASURED, ("kernel",))
    out["kernel_graph_ms"] = fig_field(sim, "graph_ms", "ms", MEASURED, ("kernel",))
    out["engine_eager_ms"] = fig_field(sim, "eager_ms", "ms", MEASURED, ("engine",))
    out["engine_graph_ms"] = fig_field(sim, "graph_ms", "ms", MEASURED, ("engine",))
    for key in ("kernel_eager_ms", "kernel_graph_ms", "engine_eager_ms", "engine_graph_ms"):
        f = out[key]
        level = key.split("_")[0]
        reason = sim.get(level, "reason") if sim.usable else None
        if not f.ok and reason:
            f.why = str(reason)
    out["copy_gbps"] = fig_field(bundle.doc("memory"), "copy_gbps", "GB/s", MEASURED)
    # a level the gap stage refused (measured on another host) never sits beside this run's figures
    refused = gap.get("refused_levels") if gap.usable else None
    for level, keys in (("kernel", ("kernel_eager_ms", "kernel_graph_ms")),
                        ("engine", ("engine_eager_ms", "engine_graph_ms")), ("memory", ("copy_gbps",))):
        if isinstance(refused, dict) and refused.get(level):
            for key in keys:
                out[key] = unavailable_fig(f"refused by gap.json: {refused[level]}", out[key].unit, out[key].source)
    audit = bundle.doc("audit")
    findings = audit.get("findings") if audit.usable else None
    out["findings"] = (Fig(float(len(findings)), "", MEASURED, f"{audit.rel}: findings")
                       if isinstance(findings, list) else
                       unavailable_fig(audit.why or f"{audit.rel} has no findings list", "", audit.rel))
    return out


def headline_json(figs: dict[str, Fig]) -> dict[str, dict[str, Any]]:
    return {k: f.to_json() for k, f in figs.items()}


def audit_findings(doc: Doc) -> list[dict[str, Any]]:
    """Findings normalised to id, severity, title, evidence, fix (strings), most severe first."""
    raw = doc.get("findings", default=[]) if doc.usable else []
    out = []
    for i, f in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(f, dict):
            continue
        evidence = f.get("evidence", "")
        if isinstance(evidence, (dict, list)):
            evidence = json.dumps(evidence, sort_keys=True)
        fix = f.get("fix", "")
        if isinstance(fix, list):
            fix = "\n".join(str(x) for x in fix)
        out.append({
            "id": str(f.get("id", f"finding-{i + 1}")),
            "severity": str(f.get("severity", "info")).lower(),
            "title": str(first_key(f, "title", "message", "summary", "rule") or ""),
            "evidence": str(evidence or ""),
            "fix": str(fix or ""),
            "source": str(f.get("source", "") or ""),
        })
    return sorted(out, key=lambda f: (SEVERITY_RANK.get(f["severity"], 5), f["id"]))


SEVERITY_RANK = {"critical": 0, "high": 1, "error": 1, "warning": 2, "medium": 2, "warn": 2, "low": 3, "info": 4}
