"""Per decode step: wall span, GPU busy (union of kernel intervals), GPU idle, kernels, time by category, top
kernels, and per-rank skew. Writes the trace.json contract (config/README.md#trace).

Tooling: pandas over the trace events. HolisticTraceAnalysis (0.5.0) installs, but it splits iterations only at
`ProfilerStep#` annotations (not vLLM's, SGLang's or decode_step), and its wheel requires jupyterlab, plotly,
pydot and pytest at run time; the figures needed here are a few vectorised group-bys over the same events.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DecodeGapError
from ..provenance import skipped_stage
from . import categories as C
from .load import GPU_CATS, RUNTIME_CATS, Trace, read_traces
from .steps import annotated_steps, periodic_steps

SOURCES = ("file", "engine-level", "server-profile")
PROFILER_NOTE = ("times are under torch.profiler: an eager step's CPU side is slower than unprofiled (every op is "
                 "recorded), so GPU idle of an eager trace is an upper bound; kernel durations are not affected")


@dataclass
class Options:
    step_annotation: str = "decode_step"
    top_n: int = 15
    max_steps_json: int = 200
    timeline_max: int = 3000


def _median(x: Any) -> float | None:
    a = np.asarray(x, dtype=float)
    a = a[np.isfinite(a)]
    return float(np.median(a)) if a.size else None


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def _work(tr: Trace) -> tuple[pd.DataFrame, str]:
    """The timed work items: GPU kernels/memcpy/memset, or (CPU-only trace) the top-level CPU ops."""
    ev = tr.events
    gpu = ev[ev["cat"].isin(GPU_CATS)]
    if not gpu.empty:
        k = gpu[["cat", "name", "pid", "tid", "ts", "dur", "end", "corr", "ext"]].copy()
        rt = ev[ev["cat"].isin(RUNTIME_CATS) & ev["corr"].notna()].drop_duplicates("corr")
        launch = pd.Series(rt["ts"].to_numpy(), index=rt["corr"].to_numpy())
        k["launch_ts"] = k["corr"].map(launch)
        types = tr.meta.get("_input_types", {})
        k["types"] = k["ext"].map(types) if types else ""
        cat = C.classify_frame(k["name"], k["types"])
        memc = k["cat"].isin({"gpu_memcpy", "gpu_memset", "memcpy", "memset"})
        k["category"] = cat.where(~memc, C.MEMCPY)
        return k.sort_values("ts").reset_index(drop=True), "gpu"
    ops = ev[ev["cat"] == "cpu_op"].copy()
    if ops.empty:
        raise DecodeGapError(f"trace {tr.path}: holds neither GPU kernels nor CPU ops")
    # top-level ops of each thread (inside no other op): their names say what the time is for (aten::linear is a
    # GEMM whatever its children are called), and their union is the time the CPU spends in operators
    ops = ops.sort_values(["pid", "tid", "ts", "dur"], ascending=[True, True, True, False])
    thread = ops["pid"] + "/" + ops["tid"]
    prev_end = ops["end"].groupby(thread).cummax().groupby(thread).shift(1)
    leaf = ops[~(ops["ts"] < prev_end.fillna(-np.inf))].copy()
    leaf["launch_ts"] = leaf["ts"]
    leaf["types"] = leaf["ext"].map(tr.meta.get("_input_types", {})).fillna("")
    leaf["category"] = C.classify_frame(leaf["name"], leaf["types"])
    return leaf.sort_values("ts").reset_index(drop=True), "cpu"


def _union_per_step(step: np.ndarray, ts: np.ndarray, end: np.ndarray) -> pd.Series:
    """Length of the union of [ts, end) per step (arrays sorted by step, then ts)."""
    df = pd.DataFrame({"step": step, "ts": ts, "end": end})
    prev = df.groupby("step")["end"].cummax().groupby(df["step"]).shift(1)
    lo = np.maximum(df["ts"].to_numpy(), prev.fillna(-np.inf).to_numpy())
    df["add"] = np.clip(df["end"].to_numpy() - lo, 0.0, None)
    return df.groupby("step")["add"].sum()


def _assign(work: pd.DataFrame, ev: pd.DataFrame, opts: Options, kind: str
            ) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(work with a `step` column, steps frame with start/end windows, method)."""
    found = annotated_steps(ev, opts.step_annotation)
    thread = work["pid"] + "/" + work["tid"]
    if kind == "cpu":  # CPU ops: the thread that runs the steps (collective and pool threads overlap it)
        main = found[0]["thread"].iloc[0] if found is not None else thread.value_counts().idxmax()
        work = work[thread == main]
    if found is not None:
        win, method = found
        s, e = win["cpu_start"].to_numpy(), win["cpu_end"].to_numpy()
        for col in ("launch_ts", "ts"):  # by the CPU call that launched it; by GPU time when launches are missing
            t = work[col].to_numpy(dtype=float)
            idx = np.searchsorted(s, t, side="right") - 1
            ok = (idx >= 0) & np.isfinite(t)
            ok[ok] &= t[ok] <= e[idx[ok]]
            if ok.any():
                break
        work = work.assign(step=np.where(ok, idx, -1))
        steps = pd.DataFrame({"start": s, "cpu_end": e})
        return work, steps, method
    w = work.sort_values("ts").reset_index(drop=True)
    starts, period = periodic_steps(w["name"].to_numpy(), w["ts"].to_numpy())  # raises: no steps
    step = np.full(len(w), -1)
    for i, st in enumerate(starts):
        if st + period <= len(w):
            step[st:st + period] = i
    w["step"] = step
    first = w[w["step"] >= 0].groupby("step")["ts"].min()
    steps = pd.DataFrame({"start": first.to_numpy(), "cpu_end": first.to_numpy()})
    return w, steps, f"periodic kernel sequence ({period} kernels per step)"


def analyze_trace(tr: Trace, opts: Options | None = None) -> tuple[dict[str, Any], pd.DataFrame]:
    """One rank's trace -> (summary dict, per-kernel-name table)."""
    opts = opts or Options()
    work, kind = _work(tr)
    try:
        work, steps, method = _assign(work, tr.events, opts, kind)
    except DecodeGapError as exc:
        raise DecodeGapError(f"trace {tr.path}: {exc}") from None
    periodic = method.startswith("periodic")
    inside = work[work["step"] >= 0]
    if inside.empty:
        raise DecodeGapError(f"trace {tr.path}: steps found by {method}, but no "
                             f"{'kernel' if kind == 'gpu' else 'CPU op'} falls inside one")
    inside = inside.sort_values(["step", "ts"])
    g = inside.groupby("step")
    n = len(steps)
    kmin = g["ts"].min().reindex(range(n))
    kmax = g["end"].max().reindex(range(n))
    busy = _union_per_step(inside["step"].to_numpy(), inside["ts"].to_numpy(), inside["end"].to_numpy())
    st = steps.copy()
    st["kernels"] = g.size().reindex(range(n)).fillna(0).astype(int).to_numpy()
    st["t0"] = np.fmin(st["start"].to_numpy(), kmin.to_numpy())
    st["t1"] = np.fmax(st["cpu_end"].to_numpy(), kmax.to_numpy())
    nxt = np.append(st["start"].to_numpy()[1:], np.nan)
    st["period_ms"] = (nxt - st["start"].to_numpy()) / 1e3
    if periodic:  # no CPU window: a step runs from its first kernel to the next step's first kernel
        st["t1"] = np.where(np.isfinite(nxt), nxt, st["t1"])
    st["wall_ms"] = (st["t1"] - st["t0"]) / 1e3
    st["busy_ms"] = busy.reindex(range(n)).fillna(0.0).to_numpy() / 1e3
    st["idle_ms"] = st["wall_ms"] - st["busy_ms"]
    st["between_ms"] = st["period_ms"] - st["wall_ms"]
    by_cat = inside.groupby(["step", "category"])["dur"].sum().unstack(fill_value=0.0).reindex(range(n)).fillna(0.0) / 1e3
    if periodic and n > 1 and not np.isfinite(nxt[-1]):
        st = st.iloc[:-1]  # the last step's cycle is unknown
    used = st[st["kernels"] > 0]
    med_wall = _median(used["wall_ms"])
    steady = used[used["wall_ms"] <= 2 * med_wall] if med_wall else used  # warm-up and stalls out of the means
    sk = inside[inside["step"].isin(steady.index)]
    ns = max(len(steady), 1)
    cats = (by_cat.loc[steady.index].mean() if len(steady) else by_cat.mean()).sort_values(ascending=False)
    kernel_total = float(cats.sum())
    per_name = sk.groupby("name").agg(count=("dur", "size"), total_us=("dur", "sum"), mean_us=("dur", "mean"),
                                      category=("category", "first")).reset_index()
    per_name["ms_per_step"] = per_name["total_us"] / 1e3 / ns
    per_name["per_step"] = per_name["count"] / ns
    per_name["share"] = per_name["ms_per_step"] / kernel_total if kernel_total > 0 else np.nan
    per_name = per_name.sort_values("total_us", ascending=False).reset_index(drop=True)
    top = [{"name": r.name[:200], "category": r.category, "ms_per_step": _r(r.ms_per_step),
            "calls_per_step": _r(r.per_step, 2), "mean_us": _r(r.mean_us, 2), "share": _r(r.share)}
           for r in per_name.head(opts.top_n).itertuples()]
    details = {}
    for cat, ms in cats.items():
        sel = sk[sk["category"] == cat]
        details[cat] = {"ms_per_step": _r(ms), "share_of_kernel_time": _r(ms / kernel_total) if kernel_total else None,
                        "kernels_per_step": _r(len(sel) / ns, 2),
                        "kernel_level_components": C.KERNEL_LEVEL.get(C.kernel_level_group(cat), [])}
    groups: dict[str, float] = {}
    for cat, ms in cats.items():
        key = C.kernel_level_group(cat)
        groups[key] = groups.get(key, 0.0) + float(ms)
    # the step nearest the median wall, as a timeline
    tl: dict[str, Any] = {}
    if len(steady):
        pick = int((steady["wall_ms"] - med_wall).abs().idxmin())
        ks = inside[inside["step"] == pick].head(opts.timeline_max)
        t0 = float(st.loc[pick, "t0"])
        tl = {"step": pick, "wall_ms": _r(st.loc[pick, "wall_ms"]), "busy_ms": _r(st.loc[pick, "busy_ms"]),
              "cpu_window_ms": [_r((st.loc[pick, "start"] - t0) / 1e3), _r((st.loc[pick, "cpu_end"] - t0) / 1e3)],
              "kernels": [{"name": nm[:120], "category": c, "start_us": round(float(a - t0), 3),
                           "dur_us": round(float(d), 3), "stream": s,
                           "lane": f"{'stream' if kind == 'gpu' else 'thread'} {s}"}
                          for nm, c, a, d, s in zip(ks["name"], ks["category"], ks["ts"], ks["dur"], ks["tid"])],
              "truncated": int(st.loc[pick, "kernels"]) > opts.timeline_max}
    step_rows = [{"index": int(i), "start_ms": _r((r.t0 - st["t0"].iloc[0]) / 1e3, 3), "wall_ms": _r(r.wall_ms),
                  "busy_ms": _r(r.busy_ms), "idle_ms": _r(r.idle_ms), "kernels": int(r.kernels),
                  "period_ms": _r(r.period_ms), "steady": bool(i in steady.index),
                  "categories": {c: _r(v) for c, v in by_cat.loc[i].items() if v > 0}}
                 for i, r in st.head(opts.max_steps_json).iterrows()]
    busy_med, wall_med = _median(used["busy_ms"]), med_wall
    out = {
        "rank": tr.rank, "file": tr.path, "kind": kind, "method": method,
        "steps_found": int(len(st)), "steps_used": int(len(steady)),
        "step_ms_median": _r(wall_med), "period_ms_median": _r(_median(used["period_ms"])),
        "gpu_busy_ms_median": _r(busy_med), "gpu_idle_ms_median": _r(_median(used["idle_ms"])),
        "gpu_idle_fraction": _r(_median(used["idle_ms"] / used["wall_ms"])),
        "between_steps_ms_median": _r(_median(used["between_ms"])),
        "kernels_per_step_median": _r(_median(used["kernels"]), 1),
        "kernel_ms_per_step": _r(kernel_total),
        "kernels_outside_steps": int((work["step"] < 0).sum()),
        "categories": {c: _r(v) for c, v in cats.items()},
        "categories_detail": details,
        "kernel_level_groups": {k: _r(v) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_kernels": top, "steps": step_rows, "timeline": tl,
    }
    table = per_name.assign(rank=tr.rank)[["rank", "name", "category", "count", "per_step", "total_us", "mean_us",
                                           "ms_per_step", "share"]]
    return out, table


def analyze_path(path: str | Path, source: str = "file", opts: Options | None = None
                 ) -> tuple[dict[str, Any], pd.DataFrame]:
    """Analyse a trace file or a directory of per-rank traces; raise DecodeGapError (one line) on bad input."""
    if source not in SOURCES:
        raise DecodeGapError(f"trace source {source!r}: expected one of {', '.join(SOURCES)}")
    traces = read_traces(path)
    results, tables = [], []
    for tr in traces:
        res, tab = analyze_trace(tr, opts)
        results.append(res)
        tables.append(tab)
    primary = max(results, key=lambda r: r["step_ms_median"] or 0.0)
    gpu = primary["kind"] == "gpu"
    ranks = [{k: r[k] for k in ("rank", "file", "method", "steps_used", "step_ms_median", "gpu_busy_ms_median",
                                "gpu_idle_ms_median", "kernels_per_step_median", "kernel_ms_per_step")}
             | {"allreduce_ms_per_step": r["categories"].get(C.ALLREDUCE, 0.0)} for r in results]
    walls = [r["step_ms_median"] for r in results if r["step_ms_median"] is not None]
    files = [r["file"] for r in results]
    label = f"{len(files)} file(s)" if len(files) > 1 else files[0]
    how = f"measured: torch.profiler trace {label}, {primary['steps_used']} steps by {primary['method']}"
    out: dict[str, Any] = {
        "stage": "trace",
        "status": "ok" if gpu else "partial",
        "source": {"kind": source, "path": str(path), "files": files},
        "backend": "pandas",
        "engine": engine_of(primary["method"]),
        "device": "gpu" if gpu else "cpu",
        "primary_rank": primary["rank"],
        **{k: primary[k] for k in ("method", "steps_found", "steps_used", "step_ms_median", "period_ms_median",
                                   "gpu_busy_ms_median", "gpu_idle_ms_median", "gpu_idle_fraction",
                                   "between_steps_ms_median", "kernels_per_step_median", "kernel_ms_per_step",
                                   "kernels_outside_steps", "categories", "categories_detail",
                                   "kernel_level_groups", "top_kernels", "steps", "timeline")},
        "ranks": ranks,
        "slowest_rank": primary["rank"] if len(results) > 1 else None,
        "rank_skew_ms": _r(max(walls) - min(walls)) if len(walls) > 1 else None,
        "notes": [PROFILER_NOTE],
        "provenance": {k: how for k in ("step_ms_median", "gpu_busy_ms_median", "gpu_idle_ms_median",
                                        "kernels_per_step_median", "categories", "top_kernels")},
        "skipped": [],
    }
    if not gpu:
        out["reason"] = ("no GPU events in the trace (a CPU-only profile): the CPU ops were analysed instead; "
                         "busy = time inside top-level aten ops, idle = Python/framework time between them")
    out["waterfall"] = waterfall_inputs(out)
    return out, pd.concat(tables, ignore_index=True)


def engine_of(method: str) -> str | None:
    """The engine whose own annotations framed the steps (None: a user annotation or the kernel period)."""
    for key, name in (("vLLM", "vllm"), ("SGLang", "sglang")):
        if method.startswith(key):
            return name
    return None


def waterfall_inputs(res: dict[str, Any]) -> dict[str, Any]:
    """What the gap waterfall takes from a trace (ms per step of the primary rank)."""
    g = res.get("kernel_level_groups") or {}
    return {"step_ms": res.get("step_ms_median"), "gpu_busy_ms": res.get("gpu_busy_ms_median"),
            "gpu_idle_ms": res.get("gpu_idle_ms_median"), "gpu_idle_fraction": res.get("gpu_idle_fraction"),
            "kernel_ms_by_group": g, "kernel_level_components": {k: C.KERNEL_LEVEL.get(k, []) for k in g},
            "basis": "trace" if res.get("device") == "gpu" else "trace (CPU ops)"}


def stage_result(path: str, source: str = "file", opts: Options | None = None
                 ) -> tuple[dict[str, Any], pd.DataFrame]:
    """The stage's output: the analysis, or a `skipped` summary with the one-line reason (the DAG goes on)."""
    empty = pd.DataFrame(columns=["rank", "name", "category", "count", "per_step", "total_us", "mean_us",
                                  "ms_per_step", "share"])
    if not path:
        return skipped_stage("trace", "no trace configured (config key 'trace': a torch.profiler Chrome trace "
                                      "or a directory of per-rank traces)", source=None, skipped=[]), empty
    try:
        return analyze_path(path, source, opts)
    except DecodeGapError as exc:
        return skipped_stage("trace", str(exc), source={"kind": source, "path": str(path)}, skipped=[]), empty
