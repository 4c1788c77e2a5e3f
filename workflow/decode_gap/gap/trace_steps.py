"""The server's own decode step, from its profiler trace (trace.json), as waterfall steps after the kernel level.

Used when the engine level cannot run the server's engine in-process (vLLM, SGLang, TGI): the trace replaces the
launch- and framework-overhead checkpoints. With K the kernel level, S_c its components, T_g the trace's kernel
time per kernel-level group, B busy and I idle per step (W = B + I), the steps are

    kernel level: time between its kernels   sum(S_c) - K      (graph replay gaps of the simulation)
    kernels slower than simulated: g          T_g - S_g         (per group the simulation has)
    kernels the simulation does not have      sum T_g           (groups with no simulated component)
    simulated kernels not in the trace        -sum S_c          (components no trace group covers)
    stream overlap                            B - sum T         (kernels on several streams at once)
    GPU idle between kernels                  I                 (CPU, launch or framework bound)

so that K plus the steps is exactly W, the trace's step.
"""

from __future__ import annotations

from typing import Any

from .rows import _num, _row
from .hosts import _flag_negative

SRC = "trace.json, simulate.json (kernel level)"


def usable_trace(trace: dict | None) -> tuple[dict | None, str]:
    if not trace:
        return None, "no trace (config key 'trace' or simulate.engine_trace)"
    if trace.get("status") != "ok" or trace.get("device") != "gpu":
        return None, f"trace.json: {trace.get('reason') or 'no GPU kernels in the trace'}"
    wf = trace.get("waterfall") or {}
    if _num(wf.get("step_ms")) is None or _num(wf.get("gpu_busy_ms")) is None:
        return None, "trace.json has no step time"
    return wf, ""


def _component_ms(c: dict) -> float | None:
    v = _num(c.get("graph_ms"))
    return v if v is not None else _num(c.get("ms"))


def trace_rows(wf: dict, kern: dict, k_ms: float, source_kind: str) -> tuple[list[dict[str, Any]], float]:
    """The rows from the kernel level (k_ms) to the trace's step; returns (rows, W)."""
    comps = {c["name"]: _component_ms(c) for c in kern.get("components") or []
             if isinstance(c, dict) and c.get("name") and _component_ms(c) is not None}
    groups = {g: float(v) for g, v in (wf.get("kernel_ms_by_group") or {}).items() if _num(v) is not None}
    mapping = wf.get("kernel_level_components") or {}
    busy, idle = float(wf["gpu_busy_ms"]), float(_num(wf.get("gpu_idle_ms")) or 0.0)
    step = float(wf["step_ms"])
    # The profiler's own cost sits in the trace's idle (launch wait, per-kernel CUPTI cost), not in the server's
    # untraced step: take it out where the trace carries a measured correction, else say it is in there.
    corrected = _num(wf.get("gpu_idle_ms_corrected"))
    if corrected is not None:
        raw, idle = idle, max(0.0, corrected)
        step -= raw - idle
        idle_note = f"corrected for the profiler's measured cost (raw {raw:.3f} ms; trace.json profiler_overhead)"
    else:
        wait = _num(wf.get("launch_wait_ms"))
        idle_note = "raw: includes the profiler's own cost" + (
            f" (of it, {wait:.3f} ms waiting for cudaGraphLaunch under the profiler)" if wait else "")
    rows = [_row("kernel level: time between its kernels", sum(comps.values()) - k_ms, SRC, "measured",
                 note="the kernel level's components summed, less its whole step (graph replay gaps)")]
    covered: set[str] = set()
    missing_ms = 0.0
    for g, t in sorted(groups.items(), key=lambda kv: -kv[1]):
        names = [n for n in mapping.get(g, []) if n in comps]
        if not names:
            missing_ms += t
            continue
        covered.update(names)
        s = sum(comps[n] for n in names)
        rows.append(_row(f"kernels slower than simulated: {g}", t - s, SRC, "measured",
                         note=f"{t:.3f} ms per step in the trace vs {s:.3f} ms at the kernel level "
                              f"({', '.join(names)})" + (f": {t / s:.1f}x" if s > 0 else "")))
        _flag_negative(rows[-1], f"the kernel level's {g} ({s:.3f} ms) is slower than the server's ({t:.3f} ms)")
    rows.append(_row("kernels the simulation does not have", missing_ms, "trace.json", "measured",
                     note="trace kernel groups with no kernel-level component"))
    uncovered = {n: v for n, v in comps.items() if n not in covered}
    if uncovered:
        rows.append(_row("simulated kernels not in the trace", -sum(uncovered.values()), SRC, "measured",
                         note=", ".join(sorted(uncovered))))
        _flag_negative(rows[-1], f"simulated components with no kernel in the trace: {', '.join(sorted(uncovered))}")
    rows.append(_row("stream overlap", busy - sum(groups.values()), "trace.json", "measured",
                     note="GPU busy (union of kernel intervals) less the kernels' summed time"))
    rows.append(_row("GPU idle between kernels (CPU, launch or framework)", idle, "trace.json",
                     "modelled" if corrected is not None else "measured",
                     note=(f"{idle / step:.0%} of the {source_kind} step; " if step else "") + idle_note))
    return rows, step
