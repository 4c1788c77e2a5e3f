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
# busy + idle against the unprofiled step: within this fraction, the trace accounts for the whole step
STEP_TOLERANCE = 0.05
GRAPH_NOTE = ("CUDA graphs under torch.profiler (CUPTI): cudaGraphLaunch takes far longer than unprofiled "
              "(graph_launch_ms) and the graph starts only as it returns, and each graph kernel costs ~0.2 µs more "
              "on the GPU; the GPU span and profiler_overhead separate these from the step's own idle time")
PROFILER_NOTE = ("times are under torch.profiler: with CPU activity an eager step's CPU side is slower than "
                 "unprofiled (every op is recorded: +7-24% on an H200), so GPU idle of such a trace is an upper "
                 "bound; each kernel's duration plus the gap after it grows by ~0.2 µs (CUPTI), which matters only "
                 "where the GPU is the bottleneck (CUDA graphs)")


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
        # A graph-replayed kernel has no CPU op, and cuBLAS' nvjet GEMMs carry no dtype in their names: an
        # engine-level trace knows the one dtype its model was built in (its metadata says so), a server's does not.
        weights = str(_engine_meta(tr).get("dtype") or "")
        if weights:
            k["types"] = k["types"].fillna("").replace("", weights) if types else weights
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
    st["gpu_span_ms"] = (kmax.to_numpy() - kmin.to_numpy()) / 1e3  # first GPU op's start to the last one's end
    # step start to its first GPU op: the launch the GPU waits for (periodic steps start at a kernel: none)
    st["launch_wait_ms"] = np.nan if periodic else (kmin.to_numpy() - st["start"].to_numpy()) / 1e3
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
                  "period_ms": _r(r.period_ms), "gpu_span_ms": _r(r.gpu_span_ms),
                  "launch_wait_ms": _r(r.launch_wait_ms), "steady": bool(i in steady.index),
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
        "gpu_span_ms_median": _r(_median(used["gpu_span_ms"])),
        "launch_wait_ms_median": _r(_median(used["launch_wait_ms"])),
        "graph_launch_ms_median": _r(_median(tr.runtime.loc[tr.runtime["name"] == "cudaGraphLaunch", "dur"] / 1e3)),
        "kernel_ms_per_step": _r(kernel_total),
        "kernels_outside_steps": int((work["step"] < 0).sum()),
        "categories": {c: _r(v) for c, v in cats.items()},
        "categories_detail": details,
        "kernel_level_groups": {k: _r(v) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_kernels": top, "steps": step_rows, "timeline": tl,
    }
    out["profiler_overhead"] = profiler_overhead(out, _engine_meta(tr))
    table = per_name.assign(rank=tr.rank)[["rank", "name", "category", "count", "per_step", "total_us", "mean_us",
                                           "ms_per_step", "share"]]
    return out, table


def _engine_meta(tr: Trace) -> dict[str, Any]:
    """What the engine level wrote into its own trace (`decode_gap_engine`); empty for a user's or server's."""
    engine = tr.meta.get("decode_gap_engine")
    return engine if isinstance(engine, dict) else {}


def profiler_overhead(res: dict[str, Any], engine: dict[str, Any]) -> dict[str, Any]:
    """The traced step against the unprofiled step of the same process, raw and corrected for the profiler.

    `engine` is the trace's `decode_gap_engine` metadata (the engine level writes it): the unprofiled step wall
    and its GPU span (CUDA events), timed before any profiling, and the profiler's measured GPU cost per CUDA-graph
    kernel. Corrected idle = idle - host excess - kernels x per-kernel cost, where host excess = the traced step's
    time outside its GPU span minus the unprofiled step's (under CUPTI, cudaGraphLaunch holds the GPU back) and
    the kernel cost applies to CUDA-graph steps only (an eager step's GPU waits on the CPU, which hides it).
    """
    busy, idle, step = res.get("gpu_busy_ms_median"), res.get("gpu_idle_ms_median"), res.get("step_ms_median")
    span, kernels = res.get("gpu_span_ms_median"), res.get("kernels_per_step_median")
    raw = busy + idle if busy is not None and idle is not None else None
    out: dict[str, Any] = {"busy_plus_idle_ms": _r(raw), "launch_wait_ms": res.get("launch_wait_ms_median"),
                           "graph_launch_ms": res.get("graph_launch_ms_median"), "tolerance": STEP_TOLERANCE}
    un = (engine.get("unprofiled_step_ms") or {}).get("median")
    if raw is None or not un:
        out.update(status="unavailable", why="the trace carries no unprofiled reference step (the engine level "
                   "records one under 'decode_gap_engine'); a user's or server's trace cannot be compared")
        return out
    us = (engine.get("unprofiled_gpu_span_ms") or {}).get("median")
    host_u = un - us if us is not None else None
    graph = engine.get("mode") == "graph"
    # graph steps only: an eager step's kernels are spread over its CPU time, so its GPU span says nothing
    # about a host-side profiler cost (CUDA-only recording keeps that cost small, and the raw ratio shows it)
    excess = max(step - span - host_u, 0.0) if graph and None not in (host_u, step, span) else None
    cal = engine.get("profiler_calibration") or {}
    per = cal.get("per_kernel_us") if graph and isinstance(cal.get("per_kernel_us"), (int, float)) else None
    cost = kernels * per / 1e3 if per is not None and kernels else 0.0
    rng = cal.get("per_kernel_us_range") if per is not None else None
    idle_c = idle - (excess or 0.0) - cost
    corrected = busy + idle_c
    ratio_raw, ratio = raw / un, corrected / un
    applied = "host excess and per-kernel cost" if per is not None else ("host excess" if excess else "none")
    out.update({
        "status": "ok", "unprofiled_step_ms": _r(un), "unprofiled_gpu_span_ms": _r(us),
        "unprofiled_host_ms": _r(host_u), "traced_host_ms": _r(step - span) if None not in (step, span) else None,
        "host_excess_ms": _r(excess), "per_kernel_us": _r(per), "per_kernel_us_range": rng,
        "kernel_cost_ms": _r(cost),
        "kernel_cost_ms_range": [_r(kernels * v / 1e3) for v in rng] if rng and kernels else None,
        "gpu_idle_ms_corrected": _r(idle_c), "busy_plus_corrected_idle_ms": _r(corrected),
        "ratio_raw": _r(ratio_raw), "ratio_corrected": _r(ratio),
        "within_tolerance_raw": bool(abs(ratio_raw - 1) <= STEP_TOLERANCE),
        "within_tolerance": bool(abs(ratio - 1) <= STEP_TOLERANCE),
        "calibration": {k: cal.get(k) for k in ("per_kernel_us", "per_kernel_us_range", "kernels", "method",
                                                 "cases", "error") if k in cal} or None,
        "corrections": applied,
        "basis": ("busy + corrected idle against the unprofiled step wall of the same process (timed before any "
                  "profiling)" + (": corrected idle = idle - host excess (the traced step's time outside its GPU "
                                   "span minus the unprofiled one's, measured) - kernels x the profiler's per-kernel "
                                   "GPU cost " + ("(measured calibration, CUDA-graph kernels)" if per is not None
                                                  else "(not applied: no calibration in the trace)")
                                   if graph else "; an eager step is not corrected: its GPU waits on the CPU, "
                                   "recorded with CUDA activity only")),
        "provenance": {"ratio_raw": "measured", "host_excess_ms": "measured" if excess is not None else "not applied",
                       "kernel_cost_ms": "modelled from a measured calibration" if per is not None else "not applied",
                       "gpu_idle_ms_corrected": "modelled: measured idle less measured profiler costs"},
    })
    return out


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
                                   "gpu_span_ms_median", "launch_wait_ms_median", "graph_launch_ms_median",
                                   "profiler_overhead",
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
    po = primary["profiler_overhead"]
    out["gpu_idle_ms_corrected_median"] = po.get("gpu_idle_ms_corrected")
    out["provenance"]["gpu_idle_ms_corrected_median"] = (
        "modelled: measured idle less the profiler's measured costs (profiler_overhead)" if po["status"] == "ok"
        else f"unavailable: {po['why']}")
    if primary.get("graph_launch_ms_median") is not None:
        out["notes"].append(GRAPH_NOTE)
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
            "gpu_idle_ms_corrected": res.get("gpu_idle_ms_corrected_median"),
            # under the profiler a CUDA graph starts only when cudaGraphLaunch returns: part of the idle is that
            "launch_wait_ms": res.get("launch_wait_ms_median"), "graph_launch_ms": res.get("graph_launch_ms_median"),
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
