"""The waterfall chain: checkpoints from the roofline to the live ITL (the package docstring explains the model)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .. import metrics
from ..io import read_stage_json
from ..provenance import figure_value
from .hosts import (DEVICE_LEVELS, _flag_negative, _measured_on, explained_fraction, foreign, identity,
                    identity_text, run_identity)

STEP, START, TOTAL, RESIDUAL = "step", "start", "total", "residual"
GRAPH_ENGINES = {"vllm", "sglang", "tgi"}  # serve with captured CUDA graphs by default


# ----------------------------------------------------------------------------------------------------------
# inputs


def load_input(path: str | Path | None) -> tuple[dict | None, str]:
    """(data, why-not): the core reader (decode_gap.io.read_stage_json), a skipped stage counting as missing."""
    return read_stage_json(path)


def _num(value: Any) -> float | None:
    """A number, or the value of a labelled figure that is not unavailable (decode_gap.provenance.figure_value)."""
    return figure_value(value)


def live_level(live: dict | None) -> tuple[dict | None, str]:
    """The concurrency-1 level (else the lowest concurrency) of live/summary.json."""
    if not live:
        return None, "live/summary.json unavailable"
    levels = [lv for lv in live.get("levels") or [] if isinstance(lv, dict) and lv.get("completed", 1)]
    if not levels:
        return None, "live/summary.json has no completed level"
    levels.sort(key=lambda lv: lv.get("concurrency", 1e9))
    return levels[0], "" if levels[0].get("concurrency") == 1 else f"no concurrency-1 level; used {levels[0].get('concurrency')}"


def live_itl(level: dict) -> tuple[float | None, str]:
    return metrics.live_itl(level, _num)


# ----------------------------------------------------------------------------------------------------------
# the chain


def _row(name: str, ms: float | None, source: str, status: str, kind: str = STEP, **extra: Any) -> dict[str, Any]:
    row = {"name": name, "ms": ms, "source": source, "status": status, "kind": kind}
    row.update({k: v for k, v in extra.items() if v is not None})
    return row


def _unavail(name: str, why: str, source: str) -> dict[str, Any]:
    return _row(name, None, source, "unavailable", why=why)


def attribute(inputs: dict[str, dict | None], why: dict[str, str] | None = None,
              hardware_revision: str | None = None) -> dict[str, Any]:
    """Build gap.json from the loaded stage files (any of them may be None; `why` says why).

    `hardware_revision`: the results directory's revision; a level recorded under another one is refused.
    """
    why = dict(why or {})
    inputs = dict(inputs)
    roof = inputs.get("roofline") or {}
    mem = inputs.get("memory") or {}
    ar = inputs.get("allreduce") or {}
    sim = inputs.get("simulate") or {}
    kern = sim.get("kernel") if isinstance(sim.get("kernel"), dict) else None
    eng = sim.get("engine") if isinstance(sim.get("engine"), dict) else None
    srv = sim.get("server") if isinstance(sim.get("server"), dict) else None
    if kern and kern.get("status") == "skipped":
        why["kernel"], kern = f"kernel level skipped: {kern.get('reason', '')}", None
    if eng and eng.get("status") == "skipped":
        why["engine"], eng = eng.get("reason", "engine level not measured"), None
    if srv and srv.get("status") != "ok":
        why["server"], srv = f"HTTP calibration skipped: {srv.get('reason', '')}", None
    live = inputs.get("live")
    from .trace_steps import trace_rows, usable_trace  # lazily: trace_steps imports _num/_row from here

    trace_wf, trace_why = usable_trace(inputs.get("trace"))

    # never mix hosts: refuse every level measured on another device or hardware revision than the run's
    ids = {
        "memory": identity(inputs.get("memory"), "microbench/memory.json"),
        "allreduce": identity(inputs.get("allreduce"), "microbench/allreduce.json"),
        "gemm": identity(inputs.get("gemm"), "microbench/gemm.json"),
        "launch": identity(inputs.get("launch"), "microbench/launch.json"),
        "kernel": identity(kern, "simulate/kernel.json"),
        "engine": identity(eng, "simulate/engine.json"),
        "server": identity(srv, "simulate/server.json"),
        "live": identity(live, "live/summary.json"),
        "trace": identity(inputs.get("trace"), "trace.json"),
    }
    ref = run_identity(ids, hardware_revision)
    refused = {k: r for k, i in ids.items() if (r := foreign(i, ref, k in DEVICE_LEVELS))}
    for key, reason in refused.items():
        why[key] = f"refused: {reason}; levels from different hosts are never subtracted"
        if key in ("kernel", "engine", "server"):
            kern, eng, srv = (None if key == "kernel" else kern, None if key == "engine" else eng,
                              None if key == "server" else srv)
        else:
            inputs[key] = None
    mem = inputs.get("memory") or {}
    ar = inputs.get("allreduce") or {}
    live = inputs.get("live")
    if "trace" in refused:
        trace_wf, trace_why = None, why["trace"]
    engine_name = (eng or {}).get("engine") or ((sim.get("engine") or {}).get("engine")) or (live or {}).get("engine") or "unknown"
    tp = int(roof.get("tp") or (kern or {}).get("tp") or 1)

    waterfall: list[dict[str, Any]] = []
    notes: list[str] = []

    # (1) roofline
    bytes_tok = _num(roof.get("bytes_per_token_per_gpu"))
    read_bw = _num(mem.get("read_gbps")) or None
    bw_name = "read_gbps"
    if read_bw is None:
        read_bw, bw_name = _num(mem.get("copy_gbps")), "copy_gbps"
    t_peak = _num(roof.get("t_memory_ms"))
    t_meas = bytes_tok / (read_bw * 1e9) * 1e3 if (bytes_tok and read_bw) else None
    roofline_ms = t_peak
    if t_peak is not None:
        waterfall.append(_row("roofline (weights + KV at datasheet bandwidth)", t_peak, "roofline.json",
                              "modelled", START, note=(roof.get("provenance") or {}).get("t_memory_ms")))
    elif t_meas is not None:
        roofline_ms = t_meas
        waterfall.append(_row("roofline (weights + KV at measured bandwidth)", t_meas,
                              "roofline.json, microbench/memory.json", "modelled", START,
                              note=f"modelled from measured: no datasheet bandwidth for this hardware, so bytes / "
                                   f"measured {bw_name} {read_bw:.1f} GB/s"))
    else:
        waterfall.append(_unavail("roofline", why.get("roofline") or "roofline.json has neither t_memory_ms nor "
                                  "bytes with a measured bandwidth", "roofline.json"))
    # (2) lost bandwidth: the memory ceiling
    if t_peak is not None and t_meas is not None:
        waterfall.append(_row("lost bandwidth: memory ceiling", t_meas - t_peak, "microbench/memory.json", "modelled",
                              note=f"bytes / measured {bw_name} {read_bw:.0f} GB/s - bytes / datasheet "
                                   f"{_num((roof.get('hardware') or {}).get('memory_bandwidth_gbps')) or 0:.0f} GB/s"))
        _flag_negative(waterfall[-1], f"the roofline at datasheet bandwidth ({t_peak:.3f} ms) is slower than at the "
                                      f"measured bandwidth ({t_meas:.3f} ms)")
    elif t_peak is None and t_meas is not None:
        waterfall.append(_row("lost bandwidth: memory ceiling", None, "microbench/memory.json", "unavailable",
                              why="no datasheet peak: the roofline already uses the measured bandwidth"))
    else:
        waterfall.append(_unavail("lost bandwidth: memory ceiling", why.get("memory") or "no measured bandwidth",
                                  "microbench/memory.json"))
    chain = sum(r["ms"] for r in waterfall if r["ms"] is not None)
    have_chain = roofline_ms is not None

    # (3) all-reduce
    ar_ms, ar_row = None, None
    if tp <= 1:
        ar_ms = 0.0
        ar_row = _row("all-reduce", 0.0, "roofline.json", "modelled", note="tp=1: no all-reduce")
    else:
        kc = next((c for c in (kern or {}).get("components", []) if c.get("name") == "all-reduce"), None)
        if kc and kc.get("ms") is not None:
            ar_ms = float(kc["ms"])
            ar_row = _row("all-reduce", ar_ms, "simulate.json (kernel level)", kc.get("status", "measured"),
                          note=kc.get("source"))
        else:
            us = _num(ar.get("allreduce_us_at_model_size"))
            n = _num(roof.get("allreduces_per_token"))
            if us is not None and n is not None:
                ar_ms = us * n / 1000.0
                ar_row = _row("all-reduce", ar_ms, "microbench/allreduce.json, roofline.json", "modelled",
                              note=f"{n:.0f} all-reduces x {us:.2f} us measured at the model's message size")
            else:
                ar_row = _unavail("all-reduce", why.get("allreduce") or "no all-reduce measurement",
                                  "microbench/allreduce.json")
    waterfall.append(ar_row)
    if ar_ms is not None:
        chain += ar_ms

    # (4-6) kernel level, launch overhead, framework overhead: checkpoints
    server_graphs = engine_name in GRAPH_ENGINES
    checkpoints: list[tuple[str, float | None, str, str, str]] = []  # (name, value, source, status, why)
    level_label = {"lost bandwidth: kernels at decode shapes": "the kernel level (CUDA graph)",
                   "launch overhead": "the kernel level (eager)", "framework overhead": "the engine level"}
    kernel_ok = kern is not None and kern.get("format_match", True)
    k_graph = _num((kern or {}).get("graph_ms"))
    k_eager = _num((kern or {}).get("eager_ms"))
    if kern is None:
        kwhy = why.get("kernel") or why.get("simulate") or "kernel level unavailable"
    elif not kernel_ok:
        kwhy = f"kernel level ran stand-in kernels: {kern.get('stand_in', '')}"
    else:
        kwhy = ""
    src_k = "simulate.json (kernel level)"
    if kernel_ok and k_graph is not None:
        checkpoints.append(("lost bandwidth: kernels at decode shapes", k_graph, src_k, "measured", ""))
    elif kernel_ok and k_eager is not None:
        checkpoints.append(("lost bandwidth: kernels at decode shapes", None, src_k, "unavailable",
                            f"no CUDA-graph time ({kern.get('graph_reason')}); the eager step below includes launches"))
    else:
        checkpoints.append(("lost bandwidth: kernels at decode shapes", None, src_k, "unavailable", kwhy))
    if server_graphs:
        launch_note = f"{engine_name} captures CUDA graphs: launch overhead is not paid"
    else:
        if kernel_ok and k_eager is not None and k_graph is not None:
            checkpoints.append(("launch overhead", k_eager, src_k, "measured", ""))
        elif kernel_ok and k_eager is not None:
            checkpoints.append(("launch overhead", k_eager, src_k, "measured",
                                f"{kern.get('graph_reason') or 'no graph time'}: eager kernels with their launches"))
        else:
            checkpoints.append(("launch overhead", None, src_k, "unavailable",
                                kwhy or (kern or {}).get("graph_reason") or "no eager kernel time"))
        launch_note = None
    e_serv = _num((eng or {}).get("serving_ms"))
    if e_serv is None:
        e_serv = _num((eng or {}).get("eager_ms"))
    src_e = "simulate.json (engine level)"
    if eng is not None and e_serv is not None:
        checkpoints.append(("framework overhead", e_serv, src_e, "measured", ""))
    else:
        checkpoints.append(("framework overhead", None, src_e, "unavailable",
                            why.get("engine") or f"engine level not measured for {engine_name}"))
    # A trace of the server's own step and no engine level (vLLM, SGLang, TGI): the trace's anatomy replaces the
    # launch- and framework-overhead checkpoints after the kernel level (gap/trace_steps.py).
    k_level = k_graph if (server_graphs and k_graph is not None) else (k_eager if k_eager is not None else k_graph)
    use_trace = trace_wf is not None and kernel_ok and k_level is not None and not (eng is not None and e_serv is not None)
    if use_trace:
        checkpoints = [c for c in checkpoints if c[0] == "lost bandwidth: kernels at decode shapes"]
        launch_note = None
        if not server_graphs and k_graph is not None and k_eager is not None:
            checkpoints.append(("launch overhead", k_eager, src_k, "measured", ""))
    # without a roofline the chain starts at zero and the first measured level absorbs it
    pending: list[str] = [] if have_chain else ["roofline"]
    last_level = "roofline + all-reduce"
    last_label = "the roofline at measured bandwidth + all-reduce"
    reached = have_chain
    for name, value, source, status, cwhy in checkpoints:
        if value is None:
            waterfall.append(_unavail(name, cwhy, source))
            pending.append(name)
            continue
        label = " + ".join(pending + [name]) if pending else name
        extra = {"absorbs": pending[:]} if pending else {}
        if cwhy:
            extra["note"] = cwhy
        waterfall.append(_row(label, value - chain, source, status, **extra))
        _flag_negative(waterfall[-1], f"{last_label} ({chain:.3f} ms) is {chain - value:.3f} ms per token slower "
                                      f"than {level_label[name]} ({value:.3f} ms) above it")
        chain = value
        reached = True
        pending = []
        last_level = name
        last_label = level_label[name]
    if launch_note:
        waterfall.append(_row("launch overhead", 0.0, src_k, "modelled", note=launch_note))
    trace_used = False
    if use_trace and reached and abs(chain - k_level) < 1e-9:
        src_kind = ((inputs.get("trace") or {}).get("source") or {}).get("kind", "server")
        rows, w_ms = trace_rows(trace_wf, kern, k_level, src_kind)
        for r in rows:
            waterfall.append(r)
            chain += r["ms"]
        chain = w_ms  # exact by construction; avoids float drift
        trace_used = True
    elif trace_wf is None and eng is None and kern is not None:
        notes.append(f"no server trace: {trace_why}")

    # (6b) CPU contention: the engine as the live server ran it. The embedded server's own eval time per token,
    # read from its log during the live run (live/summary.json server_eval), against the same llama.cpp eval time
    # in-process alone (the engine level). Measured, and independent of the ITL it helps predict.
    level0, _ = live_level(live)
    s_eval = _num((level0 or {}).get("median_server_eval_ms_per_token"))
    contention_ms = None
    if s_eval is not None and eng is not None and e_serv is not None and reached:
        contention_ms = s_eval - e_serv
        waterfall.append(_row(
            "CPU contention: the engine under live load", contention_ms, "live/summary.json (server's own log), "
            "simulate.json (engine level)", "measured",
            note=f"the live server's own eval {s_eval:.3f} ms/token (llama_perf_context, median over the "
                 f"concurrency-{(level0 or {}).get('concurrency')} requests) against {e_serv:.3f} ms/token in-process "
                 f"alone: its compute threads share {(eng or {}).get('cores', '?')} cores with the HTTP loop and the "
                 "streaming client"))
        _flag_negative(waterfall[-1], f"the live server's own eval ({s_eval:.3f} ms) is faster than the engine "
                                      f"level alone ({e_serv:.3f} ms)")
        chain += contention_ms
    elif eng is not None and (live or {}).get("embedded"):
        sev = (live or {}).get("server_eval") or {}
        waterfall.append(_unavail("CPU contention: the engine under live load",
                                  sev.get("why") or "the live server's own eval time was not read",
                                  "live/summary.json (server_eval)"))

    # (7) server overhead model: completion loop + HTTP/SSE streaming (never from the live ITL)
    loop = (eng or {}).get("loop") or {}
    loop_ms = _num(loop.get("overhead_ms")) if eng else None
    if loop_ms is not None:
        waterfall.append(_row("server overhead: completion loop", loop_ms, src_e, "measured",
                              note=loop.get("source")))
        _flag_negative(waterfall[-1], f"the completion loop is {-loop_ms:.3f} ms per token faster than the eval inside it")
        chain += loop_ms
    else:
        waterfall.append(_unavail("server overhead: completion loop",
                                  why.get("engine") or f"no in-process loop for {engine_name}", src_e))
    http_ms = None
    corun = (eng or {}).get("corun") or {}
    c_tok = _num(corun.get("per_token_ms"))
    a_tok = _num(corun.get("alone_per_token_ms"))
    if a_tok is None:
        a_tok = _num(loop.get("per_token_ms"))
    c_delta = _num(corun.get("delta_ms"))
    if c_delta is None and c_tok is not None and a_tok is not None:
        c_delta = c_tok - a_tok
    eval_part = _num(corun.get("eval_delta_ms"))
    if eng is not None and c_delta is not None and contention_ms is not None and eval_part is not None:
        # the co-run's eval slowdown is contention, already measured above from the live server itself
        c_delta = c_delta - eval_part
    if eng is not None and c_delta is not None:
        http_ms = c_delta
        waterfall.append(_row(
            "server overhead: HTTP/SSE streaming", http_ms, "simulate.json (engine level, co-run)", "measured",
            note=f"completion loop while a loopback SSE stream ({corun.get('stack') or 'HTTP'}) and a streaming "
                 f"client share the host" + (f": {c_tok:.3f} vs {a_tok:.3f} ms/token alone" if c_tok and a_tok else "")
                 + " (median of alternating pairs)"
                 + (f", less its eval slowdown {eval_part:.3f} ms (counted as CPU contention above)"
                    if contention_ms is not None and eval_part is not None else "")))
        _flag_negative(waterfall[-1], f"the loop with a stream beside it is {-http_ms:.3f} ms per token faster than alone")
        chain += http_ms
    elif srv is not None:
        s_cpu = _num(srv.get("server_cpu_per_chunk_ms"))
        c_cpu = _num(srv.get("client_cpu_per_chunk_ms"))
        saturated = bool((eng or {}).get("cpu_saturated"))
        if s_cpu is not None:
            http_ms = s_cpu + (c_cpu or 0.0 if saturated else 0.0)
            waterfall.append(_row(
                "server overhead: HTTP/SSE streaming", http_ms, "simulate.json (server calibration)", "measured",
                note=f"loopback {srv.get('stack')} without a model: server CPU {s_cpu:.3f} ms/chunk" +
                     (f" + client CPU {c_cpu:.3f} ms/chunk (the engine occupies every core)" if saturated and c_cpu is not None
                      else " (the client runs on free cores)")))
            chain += http_ms
    if http_ms is None:
        waterfall.append(_unavail("server overhead: HTTP/SSE streaming", why.get("server") or
                                  "no HTTP calibration", "simulate.json (server calibration)"))
    predicted = chain if reached else None

    # (8) live and residual
    level, lwhy = live_level(live)
    itl, itl_key = live_itl(level) if level else (None, "")
    if lwhy and level:
        notes.append(lwhy)
    residual = (itl - predicted) if (itl is not None and predicted is not None) else None
    explained_steps = [r for r in waterfall if r["ms"] is not None]
    if residual is not None:
        waterfall.append(_row("unexplained residual", residual, "live/summary.json - predicted", "measured", RESIDUAL,
                              negative=residual < 0 or None,
                              note=("negative: the levels predict more than the live server takes" if residual < 0
                                    else None)))
        _flag_negative(waterfall[-1], f"the predicted {predicted:.3f} ms per token is {-residual:.3f} ms slower than "
                                      f"the live ITL {itl:.3f} ms")
    else:
        waterfall.append(_unavail("unexplained residual", lwhy or why.get("live") or "no live ITL or no prediction",
                                  "live/summary.json"))
    waterfall.append(_row("live ITL", itl, f"live/summary.json ({itl_key}, concurrency "
                          f"{(level or {}).get('concurrency', '?')})" if itl is not None else "live/summary.json",
                          "measured" if itl is not None else "unavailable", TOTAL,
                          why=None if itl is not None else (lwhy or why.get("live"))))
    # cumulative positions for the chart
    run = 0.0
    for r in waterfall:
        if r["kind"] in (START, STEP, RESIDUAL) and r["ms"] is not None:
            r["from_ms"] = run
            run += r["ms"]
            r["to_ms"] = run
    sum_check = None
    if itl is not None and residual is not None:
        total = sum(r["ms"] for r in explained_steps) + residual
        sum_check = {"sum_of_steps_ms": total, "live_itl_ms": itl, "exact": math.isclose(total, itl, rel_tol=0, abs_tol=1e-9)}

    for r in waterfall:
        r["measured_on"] = _measured_on(r["source"], ids, refused)
    inconsistencies = [{"step": r["name"], **r["inconsistency"]} for r in waterfall if r.get("inconsistent")]
    inconsistent_ms = sum(i["ms"] for i in inconsistencies if i["step"] != "unexplained residual")
    # |residual| + every inconsistent millisecond count against it: offsetting steps never raise it
    explained = explained_fraction(residual, itl, inconsistent_ms)
    closure = predicted / itl if (predicted is not None and itl) else None
    closure_basis = "engine" if (eng is not None and e_serv is not None) else "trace" if trace_used else (
        "kernel" if kernel_ok and (k_graph or k_eager) else ("roofline" if have_chain else None))
    engine_ms = e_serv if eng is not None else None
    kernel_ms = (k_graph if (server_graphs and k_graph is not None) else k_eager) if kern else None
    observed_server = (itl - engine_ms) if (itl is not None and engine_ms is not None) else None

    from .levers import comm_floor, rank_levers  # here, not at the top: levers.py imports _num from this module

    levers = rank_levers(waterfall, kern, eng, inputs, server_graphs, roof, ar_ms)
    communication = comm_floor(ar, roof) if tp > 1 else None
    unexplained_component = None
    if residual is not None and (explained is None or explained < 0.85 or abs(closure - 1) > 0.15):
        absorbed = {n for r in waterfall for n in r.get("absorbs", [])}
        missing = [r["name"] for r in waterfall if r["status"] == "unavailable" and r["kind"] == STEP
                   and r["name"] not in absorbed and not r["name"].startswith("lost bandwidth: memory")]
        if inconsistent_ms > 0:
            unexplained_component = ("inconsistent levels: " + "; ".join(
                f"{i['what']} (likely: {i['likely_cause']})" for i in inconsistencies
                if i["step"] != "unexplained residual"))
        elif residual < 0:
            unexplained_component = ("over-prediction: the measured levels add up to more than the live ITL; "
                                     "the largest modelled step is the suspect")
        elif missing:
            unexplained_component = "not measured: " + ", ".join(missing)
        else:
            unexplained_component = (f"{residual:.2f} ms per token outside every measured level (live ITL minus "
                                     f"{last_level} and the server-overhead model)")
    headline = {
        "efficiency": (roofline_ms / itl) if (roofline_ms is not None and itl) else None,
        "efficiency_basis": "roofline_ms / live_itl_ms",
        "explained_fraction": explained,
        "closure_ratio": closure,
        "closure_basis": closure_basis,
        "closure_pass": (closure is not None and abs(closure - 1) <= 0.15 and explained is not None and explained >= 0.85
                         and closure_basis in ("engine", "trace")),
        "gap_x": (itl / roofline_ms) if (roofline_ms and itl) else None,
        "top_levers": levers[:3],
        "unexplained_component": unexplained_component,
        "negative_residual": bool(residual is not None and residual < 0),
        "inconsistencies": inconsistencies,
        "inconsistent_ms": inconsistent_ms,
        "inconsistency_note": (
            f"{len(inconsistencies)} inconsistent step{'s' if len(inconsistencies) != 1 else ''} "
            f"({sum(i['ms'] for i in inconsistencies):.3f} ms per token, a lower level measured slower than a "
            "higher one): a finding, not counted as explained" if inconsistencies else None),
        "refused_levels": refused,
        "measured_on": identity_text(ref) if ref.get("device") else None,
    }
    return {
        "stage": "gap",
        "status": "ok" if (itl is not None and predicted is not None) else "partial",
        "reason": None if (itl is not None and predicted is not None) else
        ("; ".join(v for v in (why.get("live"), why.get("roofline"), lwhy) if v) or "live ITL or roofline missing"),
        "engine": engine_name,
        "roofline_ms": roofline_ms,
        "kernel_ms": kernel_ms,
        "kernel_graph_ms": k_graph if kern else None,
        "engine_ms": engine_ms,
        "engine_graph_ms": _num((eng or {}).get("graph_ms")),
        "predicted_ms": predicted,
        "live_itl_ms": itl,
        "communication_floor": communication,
        "live_itl_field": itl_key or None,
        "residual_ms": residual,
        "explained_fraction": explained,
        "closure_ratio": closure,
        "observed_server_overhead_ms": observed_server,
        "observed_server_overhead_note": "live ITL - engine level: circular (for comparison only, never used "
                                         "in the prediction)",
        "waterfall": waterfall,
        "sum_check": sum_check,
        "levers": levers,
        "headline": headline,
        "levels": {
            "roofline_ms": roofline_ms, "kernel_graph_ms": k_graph if kern else None,
            "kernel_eager_ms": k_eager if kern else None, "kernel_comparable": bool(kernel_ok),
            "engine_ms": engine_ms, "live_itl_ms": itl,
        },
        "inputs_unavailable": {k: v for k, v in why.items() if v},
        "hardware_revision": hardware_revision,
        "measured_on": {"run": ref, "levels": ids},
        "refused_levels": refused,
        "notes": notes,
        "provenance": {
            "roofline_ms": "modelled: roofline.json t_memory_ms" if t_peak is not None else
                           "modelled from measured: bytes / measured bandwidth",
            "live_itl_ms": f"measured: live/summary.json {itl_key}" if itl is not None else "unavailable",
            "predicted_ms": "modelled from measured levels (engine + server-overhead model)",
            "residual_ms": "measured: live ITL - predicted",
        },
        "skipped": [],
    }


def attribute_files(paths: dict[str, str | Path | None], *, hardware_revision: str | None = None,
                    fingerprint: dict[str, str] | None = None,
                    run_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load the stage files named in `paths` (roofline, memory, allreduce, gemm, launch, simulate, live, audit).

    `fingerprint` and `run_config` (decode_gap.config.public_run_config): the measuring host's environment and
    settings, kept so a report rendered elsewhere shows them and not the rendering host's.
    """
    inputs, why = {}, {}
    for key, path in paths.items():
        inputs[key], why[key] = load_input(path)
    result = attribute(inputs, why, hardware_revision=hardware_revision)
    result["inputs"] = {k: str(v) for k, v in paths.items() if v}
    if fingerprint is not None:
        result["fingerprint"] = dict(fingerprint)
    if run_config is not None:
        result["run_config"] = dict(run_config)
    return result
