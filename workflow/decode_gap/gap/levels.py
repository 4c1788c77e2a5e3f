"""The stage files the waterfall reads, with every level measured on another host refused."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import metrics
from ..io import read_stage_json
from .hosts import DEVICE_LEVELS, foreign, identity, run_identity
from .rows import _num


def load_input(path: str | Path | None) -> tuple[dict | None, str]:
    """(data, why-not): the core reader (decode_gap.io.read_stage_json), a skipped stage counting as missing."""
    return read_stage_json(path)


UNKNOWN_ENGINES = {"none", "unknown"}  # what the stages record when no engine is named or identified


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


@dataclass
class Levels:
    """The levels one waterfall may subtract: all from the run's host (refused ones are None, `why` says why)."""

    inputs: dict[str, dict | None]
    why: dict[str, str]
    roof: dict
    sim: dict  # simulate.json as read: the engine's name is taken from it even when its engine level is refused
    kern: dict | None
    eng: dict | None
    srv: dict | None
    mem: dict
    ar: dict
    live: dict | None
    trace_wf: dict | None
    trace_why: str
    ids: dict[str, dict | None]
    ref: dict[str, Any]
    refused: dict[str, str]
    engine_name: str
    tp: int


def _simulate_levels(sim: dict, why: dict[str, str]) -> tuple[dict | None, dict | None, dict | None]:
    """simulate.json's kernel, engine and server levels; a skipped one is None with its reason in `why`."""
    kern = sim.get("kernel") if isinstance(sim.get("kernel"), dict) else None
    eng = sim.get("engine") if isinstance(sim.get("engine"), dict) else None
    srv = sim.get("server") if isinstance(sim.get("server"), dict) else None
    if kern and kern.get("status") == "skipped":
        why["kernel"], kern = f"kernel level skipped: {kern.get('reason', '')}", None
    if eng and eng.get("status") == "skipped":
        why["engine"], eng = eng.get("reason", "engine level not measured"), None
    if srv and srv.get("status") != "ok":
        why["server"], srv = f"HTTP calibration skipped: {srv.get('reason', '')}", None
    return kern, eng, srv


def _identities(inputs: dict[str, dict | None], kern: dict | None, eng: dict | None, srv: dict | None,
                live: dict | None) -> dict[str, dict | None]:
    return {
        "memory": identity(inputs.get("memory"), "microbench/memory.json"),
        "allreduce": identity(inputs.get("allreduce"), "microbench/allreduce.json"),
        "gemm": identity(inputs.get("gemm"), "microbench/gemm.json"),
        "moe": identity(inputs.get("moe"), "microbench/moe.json"),
        "attention": identity(inputs.get("attention"), "microbench/attention.json"),
        "launch": identity(inputs.get("launch"), "microbench/launch.json"),
        "kernel": identity(kern, "simulate/kernel.json"),
        "engine": identity(eng, "simulate/engine.json"),
        "server": identity(srv, "simulate/server.json"),
        "live": identity(live, "live/summary.json"),
        "trace": identity(inputs.get("trace"), "trace.json"),
    }


def one_rank_allreduce(ar: dict, roof: dict, tp: int) -> str:
    """Why the measured all-reduce cannot stand for tp ranks, or "": it ran at fewer ranks than tp (one GPU standing
    for TP: a 1-rank all-reduce moves no byte between GPUs, its time is the call's alone) and the roofline models the
    tp-rank all-reduces from the datasheet (t_comm_floor_ms)."""
    ran = _num(ar.get("measured_world_size"))
    model = _num(roof.get("t_comm_floor_ms"))
    if tp <= 1 or ran is None or ran >= tp or not model:
        return ""
    # the model's arithmetic, not its citation (roofline.json keeps that)
    basis = str((roof.get("provenance") or {}).get("t_comm_floor_ms") or "roofline.json t_comm_floor_ms")
    basis = basis.split("; latency from")[0]
    return (f"the all-reduce was measured at {ran:.0f} rank{'s' if ran != 1 else ''}, not tp={tp}: a call that moves "
            f"no byte between GPUs; the roofline's {model:.3f} ms stands instead ({basis})")


def _kernel_with_modelled_allreduce(kern: dict | None, ar: dict, roof: dict, tp: int) -> dict | None:
    """The kernel level with its collectives modelled from the datasheet where one GPU stood for tp and its
    all-reduce came from a measurement at fewer ranks (one_rank_allreduce): the component becomes the roofline's
    t_comm_floor_ms, and the step times move by the difference (the kernels' own time unchanged). Only ever longer:
    a measurement above the datasheet's floor stays."""
    why = one_rank_allreduce(ar, roof, tp)
    comps = (kern or {}).get("components") or []
    kc = next((c for c in comps if c.get("name") == "all-reduce" and c.get("status") == "modelled"), None)
    model = _num(roof.get("t_comm_floor_ms"))
    if not why or kc is None or _num(kc.get("ms")) is None or model <= kc["ms"]:
        return kern
    delta = model - kc["ms"]
    note = f"{why}; the kernel level had added {kc['ms']:.3f} ms of 1-rank calls"
    new_kc = {**kc, "ms": model, "eager_ms": model, "graph_ms": model if kc.get("graph_ms") is not None else None,
              "source": note}
    out = {**kern, "components": [new_kc if c is kc else c for c in comps], "allreduce_note": note}
    for key in ("eager_ms", "graph_ms"):
        if _num(kern.get(key)) is not None:
            out[key] = kern[key] + delta
    return out


def gather_levels(inputs: dict[str, dict | None], why: dict[str, str], hardware_revision: str | None) -> Levels:
    """Split simulate.json into its levels and refuse every level measured on another device or hardware
    revision than the run's. `inputs` and `why` are the caller's copies: refused inputs become None here."""
    roof = inputs.get("roofline") or {}
    sim = inputs.get("simulate") or {}
    kern, eng, srv = _simulate_levels(sim, why)
    live = inputs.get("live")
    from .trace_steps import usable_trace  # lazily: trace_steps imports _num/_row from attribute.py

    trace_wf, trace_why = usable_trace(inputs.get("trace"))

    # never mix hosts: refuse every level measured on another device or hardware revision than the run's
    ids = _identities(inputs, kern, eng, srv, live)
    ref = run_identity(ids, hardware_revision)
    refused = {k: r for k, i in ids.items() if (r := foreign(i, ref, k in DEVICE_LEVELS))}
    for key, reason in refused.items():
        why[key] = f"refused: {reason}; levels from different hosts are never subtracted"
        if key in ("kernel", "engine", "server"):
            kern, eng, srv = (None if key == "kernel" else kern, None if key == "engine" else eng,
                              None if key == "server" else srv)
        else:
            inputs[key] = None
    live = inputs.get("live")
    if "trace" in refused:
        trace_wf, trace_why = None, why["trace"]
    # the first level that names a real engine: simulate.engine "none" (or a live stage that could not tell) must not
    # hide the server the live stage identified
    named = [n for n in ((eng or {}).get("engine"), (sim.get("engine") or {}).get("engine"), (live or {}).get("engine"))
             if n and n not in UNKNOWN_ENGINES]
    engine_name = named[0] if named else "unknown"
    tp = int(roof.get("tp") or (kern or {}).get("tp") or 1)
    kern = _kernel_with_modelled_allreduce(kern, inputs.get("allreduce") or {}, roof, tp)
    return Levels(inputs=inputs, why=why, roof=roof, sim=sim, kern=kern, eng=eng, srv=srv,
                  mem=inputs.get("memory") or {}, ar=inputs.get("allreduce") or {}, live=live,
                  trace_wf=trace_wf, trace_why=trace_why, ids=ids, ref=ref, refused=refused,
                  engine_name=engine_name, tp=tp)
