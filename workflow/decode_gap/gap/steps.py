"""The waterfall's steps from the roofline to the predicted ITL. Each step function appends its rows to the
waterfall and returns the milliseconds it adds to the chain (None when it adds none)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .hosts import _flag_negative
from .levels import UNKNOWN_ENGINES, Levels, live_itl, live_level, one_rank_allreduce
from .rows import START, _num, _row, _unavail

GRAPH_ENGINES = {"vllm", "sglang", "tgi"}  # serve with captured CUDA graphs by default
SRC_KERNEL = "simulate.json (kernel level)"
SRC_ENGINE = "simulate.json (engine level)"
LEVEL_LABEL = {"lost bandwidth: kernels at decode shapes": "the kernel level (CUDA graph)",
               "launch overhead": "the kernel level (eager)", "framework overhead": "the engine level"}

Checkpoint = tuple[str, "float | None", str, str, str]  # (name, value, source, status, why)


# ----------------------------------------------------------------------------------------------------------
# (1-3) roofline, memory ceiling, all-reduce


def roofline_steps(lv: Levels, waterfall: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(1) the roofline and (2) the memory ceiling; returns (roofline_ms, the datasheet-peak time)."""
    roof, mem, why = lv.roof, lv.mem, lv.why
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
    return roofline_ms, t_peak


def allreduce_step(lv: Levels, waterfall: list[dict[str, Any]]) -> float | None:
    """(3) the all-reduces: the kernel level's own, else the micro-benchmark's latency x the roofline's count."""
    ar_ms, ar_row = None, None
    if lv.tp <= 1:
        ar_ms = 0.0
        ar_row = _row("all-reduce", 0.0, "roofline.json", "modelled", note="tp=1: no all-reduce")
    else:
        kc = next((c for c in (lv.kern or {}).get("components", []) if c.get("name") == "all-reduce"), None)
        if kc and kc.get("ms") is not None:
            ar_ms = float(kc["ms"])
            ar_row = _row("all-reduce", ar_ms, SRC_KERNEL, kc.get("status", "measured"), note=kc.get("source"),
                          one_rank=True if lv.kern.get("allreduce_note") else None)
        else:
            us = _num(lv.ar.get("allreduce_us_at_model_size"))
            n = _num(lv.roof.get("allreduces_per_token"))
            one_rank = one_rank_allreduce(lv.ar, lv.roof, lv.tp)
            if one_rank and us is not None and n is not None and _num(lv.roof["t_comm_floor_ms"]) > us * n / 1000.0:
                ar_ms = _num(lv.roof["t_comm_floor_ms"])
                ar_row = _row("all-reduce", ar_ms, "roofline.json, microbench/allreduce.json", "modelled",
                              note=f"{one_rank}; the measured call: {n:.0f} x {us:.2f} us", one_rank=True)
            elif us is not None and n is not None:
                ar_ms = us * n / 1000.0
                ar_row = _row("all-reduce", ar_ms, "microbench/allreduce.json, roofline.json", "modelled",
                              note=f"{n:.0f} all-reduces x {us:.2f} us measured at the model's message size")
            else:
                ar_row = _unavail("all-reduce", lv.why.get("allreduce") or "no all-reduce measurement",
                                  "microbench/allreduce.json")
    waterfall.append(ar_row)
    return ar_ms


# ----------------------------------------------------------------------------------------------------------
# (4-6) kernel level, launch overhead, framework overhead: checkpoints


@dataclass
class Checkpoints:
    """The kernel- and engine-level checkpoints, and the level times the rest of the gap reads."""

    rows: list[Checkpoint]
    launch_note: str | None  # a modelled zero launch overhead (the server captures CUDA graphs)
    server_graphs: bool
    kernel_ok: Any  # the kernel level ran the run's format (simulate.json format_match)
    k_graph: float | None
    k_eager: float | None
    e_serv: float | None
    k_level: float | None
    use_trace: bool
    unmeasured: str  # why nothing tells how the server launches its kernels, or "" (server_unmeasured)


def server_unmeasured(lv: Levels) -> str:
    """Why nothing tells how the server launches its kernels ("" where something does): no engine named or
    identified, no live ITL and no trace of the server's step. Then the kernel level's eager launches are not the
    server's: one that captures CUDA graphs (vLLM, SGLang, TGI by default) does not pay them."""
    level, lwhy = live_level(lv.live)
    itl = live_itl(level)[0] if level else None
    if lv.engine_name not in UNKNOWN_ENGINES or itl is not None or lv.trace_wf is not None:
        return ""
    return f"the server was not measured ({lv.why.get('live') or lwhy}) and no engine is named"


def _kernel_checkpoints(lv: Levels, server_graphs: bool, unmeasured: str) -> tuple[list[Checkpoint], str | None, Any,
                                                                                   float | None, float | None]:
    """The kernel level at decode shapes and its launch overhead: (rows, launch_note, kernel_ok, graph, eager).
    `unmeasured` (server_unmeasured): the eager launches are the kernel level's, not the server's."""
    kern, why, engine_name = lv.kern, lv.why, lv.engine_name
    checkpoints: list[Checkpoint] = []
    kernel_ok = kern is not None and kern.get("format_match", True)
    k_graph = _num((kern or {}).get("graph_ms"))
    k_eager = _num((kern or {}).get("eager_ms"))
    if kern is None:
        kwhy = why.get("kernel") or why.get("simulate") or "kernel level unavailable"
    elif not kernel_ok:
        kwhy = f"kernel level ran stand-in kernels: {kern.get('stand_in', '')}"
    else:
        kwhy = ""
    src_k = SRC_KERNEL
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
        if unmeasured and kernel_ok and k_eager is not None and k_graph is not None:
            checkpoints.append(("launch overhead", None, src_k, "unavailable",
                                f"{unmeasured}: whether it launches its kernels eagerly is unknown (the kernel "
                                f"level: eager {k_eager:.3f} ms, one CUDA graph {k_graph:.3f} ms)"))
        elif kernel_ok and k_eager is not None and k_graph is not None:
            checkpoints.append(("launch overhead", k_eager, src_k, "measured", ""))
        elif kernel_ok and k_eager is not None:
            checkpoints.append(("launch overhead", k_eager, src_k, "measured",
                                f"{kern.get('graph_reason') or 'no graph time'}: eager kernels with their launches"))
        else:
            checkpoints.append(("launch overhead", None, src_k, "unavailable",
                                kwhy or (kern or {}).get("graph_reason") or "no eager kernel time"))
        launch_note = None
    return checkpoints, launch_note, kernel_ok, k_graph, k_eager


def level_checkpoints(lv: Levels) -> Checkpoints:
    """The checkpoints after the all-reduce: kernel level, launches, engine level (or the server's trace)."""
    eng, engine_name = lv.eng, lv.engine_name
    server_graphs = engine_name in GRAPH_ENGINES
    unmeasured = server_unmeasured(lv)
    checkpoints, launch_note, kernel_ok, k_graph, k_eager = _kernel_checkpoints(lv, server_graphs, unmeasured)
    e_serv = _num((eng or {}).get("serving_ms"))
    if e_serv is None:
        e_serv = _num((eng or {}).get("eager_ms"))
    if eng is not None and e_serv is not None:
        checkpoints.append(("framework overhead", e_serv, SRC_ENGINE, "measured", ""))
    else:
        checkpoints.append(("framework overhead", None, SRC_ENGINE, "unavailable",
                            lv.why.get("engine") or f"engine level not measured for {engine_name}"))
    # A trace of the server's own step and no engine level (vLLM, SGLang, TGI): the trace's anatomy replaces the
    # launch- and framework-overhead checkpoints after the kernel level (gap/trace_steps.py).
    k_level = k_graph if (server_graphs and k_graph is not None) else (k_eager if k_eager is not None else k_graph)
    use_trace = lv.trace_wf is not None and kernel_ok and k_level is not None and not (eng is not None and e_serv is not None)
    if use_trace:
        checkpoints = [c for c in checkpoints if c[0] == "lost bandwidth: kernels at decode shapes"]
        launch_note = None
        if not server_graphs and k_graph is not None and k_eager is not None:
            checkpoints.append(("launch overhead", k_eager, SRC_KERNEL, "measured", ""))
    return Checkpoints(rows=checkpoints, launch_note=launch_note, server_graphs=server_graphs, kernel_ok=kernel_ok,
                       k_graph=k_graph, k_eager=k_eager, e_serv=e_serv, k_level=k_level, use_trace=use_trace,
                       unmeasured=unmeasured)


def walk_checkpoints(checkpoints: list[Checkpoint], waterfall: list[dict[str, Any]], chain: float,
                     have_chain: bool) -> tuple[float, bool, str]:
    """One step per measured checkpoint: its value minus the chain so far; an unavailable checkpoint is listed
    and absorbed by the next measured one. Returns (chain, reached any level, the last level's name)."""
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
                                      f"than {LEVEL_LABEL[name]} ({value:.3f} ms) above it")
        chain = value
        reached = True
        pending = []
        last_level = name
        last_label = LEVEL_LABEL[name]
    return chain, reached, last_level


def trace_steps(lv: Levels, cp: Checkpoints, waterfall: list[dict[str, Any]], notes: list[str], chain: float,
                reached: bool) -> float | None:
    """The server trace's anatomy after the kernel level; returns the trace's step time W (the new chain) when used."""
    from .trace_steps import trace_rows  # lazily: trace_steps imports _num/_row from attribute.py

    if cp.use_trace and reached and abs(chain - cp.k_level) < 1e-9:
        src_kind = ((lv.inputs.get("trace") or {}).get("source") or {}).get("kind", "server")
        rows, w_ms = trace_rows(lv.trace_wf, lv.kern, cp.k_level, src_kind)
        waterfall.extend(rows)
        return w_ms  # exact by construction; avoids float drift
    if lv.trace_wf is None and lv.eng is None and lv.kern is not None:
        notes.append(f"no server trace: {lv.trace_why}")
    return None


# ----------------------------------------------------------------------------------------------------------
# (6b-7) CPU contention and the server-overhead model (never from the live ITL)


def contention_step(lv: Levels, e_serv: float | None, reached: bool, waterfall: list[dict[str, Any]]) -> float | None:
    """(6b) CPU contention: the engine as the live server ran it. The embedded server's own eval time per token,
    read from its log during the live run (live/summary.json server_eval), against the same llama.cpp eval time
    in-process alone (the engine level). Measured, and independent of the ITL it helps predict."""
    eng, live = lv.eng, lv.live
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
    elif eng is not None and (live or {}).get("embedded"):
        sev = (live or {}).get("server_eval") or {}
        waterfall.append(_unavail("CPU contention: the engine under live load",
                                  sev.get("why") or "the live server's own eval time was not read",
                                  "live/summary.json (server_eval)"))
    return contention_ms


def completion_loop_step(lv: Levels, waterfall: list[dict[str, Any]]) -> float | None:
    """(7a) the server library's own per-token loop in-process, less the engine's eval inside it."""
    eng = lv.eng
    loop = (eng or {}).get("loop") or {}
    loop_ms = _num(loop.get("overhead_ms")) if eng else None
    if loop_ms is not None:
        waterfall.append(_row("server overhead: completion loop", loop_ms, SRC_ENGINE, "measured",
                              note=loop.get("source")))
        _flag_negative(waterfall[-1], f"the completion loop is {-loop_ms:.3f} ms per token faster than the eval inside it")
    else:
        waterfall.append(_unavail("server overhead: completion loop",
                                  lv.why.get("engine") or f"no in-process loop for {lv.engine_name}", SRC_ENGINE))
    return loop_ms


def _corun_http_ms(lv: Levels, contention_ms: float | None, waterfall: list[dict[str, Any]]) -> float | None:
    """HTTP/SSE streaming from the engine level's co-run: the loop's slowdown beside a loopback stream (None,
    and no row, when the engine level has no co-run)."""
    eng = lv.eng
    loop = (eng or {}).get("loop") or {}
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
    if eng is None or c_delta is None:
        return None
    http_ms = c_delta
    waterfall.append(_row(
        "server overhead: HTTP/SSE streaming", http_ms, "simulate.json (engine level, co-run)", "measured",
        note=f"completion loop while a loopback SSE stream ({corun.get('stack') or 'HTTP'}) and a streaming "
             f"client share the host" + (f": {c_tok:.3f} vs {a_tok:.3f} ms/token alone" if c_tok and a_tok else "")
             + " (median of alternating pairs)"
             + (f", less its eval slowdown {eval_part:.3f} ms (counted as CPU contention above)"
                if contention_ms is not None and eval_part is not None else "")))
    _flag_negative(waterfall[-1], f"the loop with a stream beside it is {-http_ms:.3f} ms per token faster than alone")
    return http_ms


def _calibration_http_ms(lv: Levels, waterfall: list[dict[str, Any]]) -> float | None:
    """HTTP/SSE streaming from the loopback calibration's CPU time per chunk (no model)."""
    srv = lv.srv
    s_cpu = _num(srv.get("server_cpu_per_chunk_ms"))
    c_cpu = _num(srv.get("client_cpu_per_chunk_ms"))
    saturated = bool((lv.eng or {}).get("cpu_saturated"))
    if s_cpu is None:
        return None
    http_ms = s_cpu + (c_cpu or 0.0 if saturated else 0.0)
    waterfall.append(_row(
        "server overhead: HTTP/SSE streaming", http_ms, "simulate.json (server calibration)", "measured",
        note=f"loopback {srv.get('stack')} without a model: server CPU {s_cpu:.3f} ms/chunk" +
             (f" + client CPU {c_cpu:.3f} ms/chunk (the engine occupies every core)" if saturated and c_cpu is not None
              else " (the client runs on free cores)")))
    return http_ms


def http_step(lv: Levels, contention_ms: float | None, waterfall: list[dict[str, Any]]) -> float | None:
    """(7b) HTTP/SSE streaming: the co-run where the engine ran beside a stream, else the loopback calibration."""
    http_ms = _corun_http_ms(lv, contention_ms, waterfall)
    if http_ms is None and lv.srv is not None:
        http_ms = _calibration_http_ms(lv, waterfall)
    if http_ms is None:
        waterfall.append(_unavail("server overhead: HTTP/SSE streaming", lv.why.get("server") or
                                  "no HTTP calibration", "simulate.json (server calibration)"))
    return http_ms
