"""The waterfall chain: checkpoints from the roofline to the live ITL (the package docstring explains the model).

attribute() runs the steps in gap/steps.py along the chain, then closes it against the live ITL here."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .hosts import _flag_negative, _measured_on, explained_fraction, identity_text
from .levels import Levels, gather_levels, live_itl, live_level, load_input
from .rows import RESIDUAL, START, STEP, TOTAL, _num, _row, _unavail  # trace_steps, levers import _num/_row here
from .steps import (SRC_KERNEL, Checkpoints, allreduce_step, completion_loop_step, contention_step, http_step,
                    level_checkpoints, roofline_steps, trace_steps, walk_checkpoints)


def attribute(inputs: dict[str, dict | None], why: dict[str, str] | None = None,
              hardware_revision: str | None = None) -> dict[str, Any]:
    """Build gap.json from the loaded stage files (any of them may be None; `why` says why).

    `hardware_revision`: the results directory's revision; a level recorded under another one is refused.
    """
    lv = gather_levels(dict(inputs), dict(why or {}), hardware_revision)
    waterfall: list[dict[str, Any]] = []
    notes: list[str] = []

    roofline_ms, t_peak = roofline_steps(lv, waterfall)
    chain = sum(r["ms"] for r in waterfall if r["ms"] is not None)
    have_chain = roofline_ms is not None
    ar_ms = allreduce_step(lv, waterfall)
    if ar_ms is not None:
        chain += ar_ms
    cp = level_checkpoints(lv)
    chain, reached, last_level = walk_checkpoints(cp.rows, waterfall, chain, have_chain)
    if cp.launch_note:
        waterfall.append(_row("launch overhead", 0.0, SRC_KERNEL, "modelled", note=cp.launch_note))
    w_ms = trace_steps(lv, cp, waterfall, notes, chain, reached)
    trace_used = w_ms is not None
    if trace_used:
        chain = w_ms
    contention_ms = contention_step(lv, cp.e_serv, reached, waterfall)
    if contention_ms is not None:
        chain += contention_ms
    loop_ms = completion_loop_step(lv, waterfall)
    if loop_ms is not None:
        chain += loop_ms
    http_ms = http_step(lv, contention_ms, waterfall)
    if http_ms is not None:
        chain += http_ms
    predicted = chain if reached else None

    basis = "engine" if (lv.eng is not None and cp.e_serv is not None) else "trace" if trace_used else (
        "kernel" if cp.kernel_ok and (cp.k_graph or cp.k_eager) else ("roofline" if have_chain else None))
    c = _close(lv, waterfall, notes, predicted, basis)
    from .levers import comm_floor, experts_level_mismatch, rank_levers  # levers.py imports _num from here

    mismatch = experts_level_mismatch(lv.inputs.get("moe") or {}, lv.roof, lv.kern)
    if mismatch:
        notes.append(mismatch[0].upper() + mismatch[1:])
    levers = rank_levers(waterfall, lv.kern, lv.eng, lv.inputs, cp.server_graphs, lv.roof, ar_ms, cp.unmeasured)
    communication = comm_floor(lv.ar, lv.roof) if lv.tp > 1 else None
    unexplained = _unexplained_component(waterfall, c, last_level)
    headline = _headline(lv, c, roofline_ms, levers, unexplained)
    return _gap_json(lv, cp, c, waterfall, notes, roofline_ms=roofline_ms, t_peak=t_peak, levers=levers,
                     headline=headline, communication=communication, hardware_revision=hardware_revision)


# ----------------------------------------------------------------------------------------------------------
# closing the chain against the live ITL


@dataclass
class Closure:
    """The prediction set against the live ITL."""

    predicted: float | None
    level: dict | None  # the live level used (concurrency 1, else the lowest)
    lwhy: str  # why the live level is missing or not concurrency 1
    itl: float | None
    itl_key: str
    residual: float | None
    sum_check: dict[str, Any] | None
    inconsistencies: list[dict[str, Any]]
    inconsistent_ms: float
    explained: float | None
    closure: float | None
    closure_basis: str | None  # the highest level the prediction rests on: engine, trace, kernel or roofline


def _live_steps(lv: Levels, waterfall: list[dict[str, Any]], notes: list[str], predicted: float | None
                ) -> tuple[dict | None, str, float | None, str, float | None, dict[str, Any] | None]:
    """(8) the unexplained residual and the live ITL rows; returns (level, why, itl, itl field, residual, sum check)."""
    level, lwhy = live_level(lv.live)
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
        waterfall.append(_unavail("unexplained residual", lwhy or lv.why.get("live") or "no live ITL or no prediction",
                                  "live/summary.json"))
    waterfall.append(_row("live ITL", itl, f"live/summary.json ({itl_key}, concurrency "
                          f"{(level or {}).get('concurrency', '?')})" if itl is not None else "live/summary.json",
                          "measured" if itl is not None else "unavailable", TOTAL,
                          why=None if itl is not None else (lwhy or lv.why.get("live"))))
    sum_check = None
    if itl is not None and residual is not None:
        total = sum(r["ms"] for r in explained_steps) + residual
        sum_check = {"sum_of_steps_ms": total, "live_itl_ms": itl, "exact": math.isclose(total, itl, rel_tol=0, abs_tol=1e-9)}
    return level, lwhy, itl, itl_key, residual, sum_check


def _place_bars(waterfall: list[dict[str, Any]]) -> None:
    """Cumulative positions for the chart."""
    run = 0.0
    for r in waterfall:
        if r["kind"] in (START, STEP, RESIDUAL) and r["ms"] is not None:
            r["from_ms"] = run
            run += r["ms"]
            r["to_ms"] = run


def _close(lv: Levels, waterfall: list[dict[str, Any]], notes: list[str], predicted: float | None,
           closure_basis: str | None) -> Closure:
    """The residual, the live ITL, where each step was measured, and the explained fraction and closure ratio."""
    level, lwhy, itl, itl_key, residual, sum_check = _live_steps(lv, waterfall, notes, predicted)
    _place_bars(waterfall)
    for r in waterfall:
        r["measured_on"] = _measured_on(r["source"], lv.ids, lv.refused)
    inconsistencies = [{"step": r["name"], **r["inconsistency"]} for r in waterfall if r.get("inconsistent")]
    inconsistent_ms = sum(i["ms"] for i in inconsistencies if i["step"] != "unexplained residual")
    # |residual| + every inconsistent millisecond count against it: offsetting steps never raise it
    explained = explained_fraction(residual, itl, inconsistent_ms)
    closure = predicted / itl if (predicted is not None and itl) else None
    return Closure(predicted=predicted, level=level, lwhy=lwhy, itl=itl, itl_key=itl_key, residual=residual,
                   sum_check=sum_check, inconsistencies=inconsistencies, inconsistent_ms=inconsistent_ms,
                   explained=explained, closure=closure, closure_basis=closure_basis)


def _unexplained_component(waterfall: list[dict[str, Any]], c: Closure, last_level: str) -> str | None:
    """What the residual most likely is, when closure fails: inconsistent levels, over-prediction, levels not
    measured, or time outside every measured level."""
    residual, explained, closure = c.residual, c.explained, c.closure
    if not (residual is not None and (explained is None or explained < 0.85 or abs(closure - 1) > 0.15)):
        return None
    absorbed = {n for r in waterfall for n in r.get("absorbs", [])}
    missing = [r["name"] for r in waterfall if r["status"] == "unavailable" and r["kind"] == STEP
               and r["name"] not in absorbed and not r["name"].startswith("lost bandwidth: memory")]
    if c.inconsistent_ms > 0:
        return ("inconsistent levels: " + "; ".join(
            f"{i['what']} (likely: {i['likely_cause']})" for i in c.inconsistencies
            if i["step"] != "unexplained residual"))
    if residual < 0:
        return ("over-prediction: the measured levels add up to more than the live ITL; "
                "the largest modelled step is the suspect")
    if missing:
        return "not measured: " + ", ".join(missing)
    return (f"{residual:.2f} ms per token outside every measured level (live ITL minus "
            f"{last_level} and the server-overhead model)")


# ----------------------------------------------------------------------------------------------------------
# gap.json


def _headline(lv: Levels, c: Closure, roofline_ms: float | None, levers: list[dict[str, Any]],
              unexplained: str | None) -> dict[str, Any]:
    itl, closure, explained, inconsistencies = c.itl, c.closure, c.explained, c.inconsistencies
    return {
        "efficiency": (roofline_ms / itl) if (roofline_ms is not None and itl) else None,
        "efficiency_basis": "roofline_ms / live_itl_ms",
        "explained_fraction": explained,
        "closure_ratio": closure,
        "closure_basis": c.closure_basis,
        "closure_pass": (closure is not None and abs(closure - 1) <= 0.15 and explained is not None and explained >= 0.85
                         and c.closure_basis in ("engine", "trace")),
        "gap_x": (itl / roofline_ms) if (roofline_ms and itl) else None,
        "top_levers": levers[:3],
        "unexplained_component": unexplained,
        "negative_residual": bool(c.residual is not None and c.residual < 0),
        "inconsistencies": inconsistencies,
        "inconsistent_ms": c.inconsistent_ms,
        "inconsistency_note": (
            f"{len(inconsistencies)} inconsistent step{'s' if len(inconsistencies) != 1 else ''} "
            f"({sum(i['ms'] for i in inconsistencies):.3f} ms per token, a lower level measured slower than a "
            "higher one): a finding, not counted as explained" if inconsistencies else None),
        "refused_levels": lv.refused,
        "measured_on": identity_text(lv.ref) if lv.ref.get("device") else None,
    }


def _gap_json(lv: Levels, cp: Checkpoints, c: Closure, waterfall: list[dict[str, Any]], notes: list[str], *,
              roofline_ms: float | None, t_peak: float | None, levers: list[dict[str, Any]],
              headline: dict[str, Any], communication: dict[str, Any] | None,
              hardware_revision: str | None) -> dict[str, Any]:
    itl, predicted, kern, eng = c.itl, c.predicted, lv.kern, lv.eng
    engine_ms = cp.e_serv if eng is not None else None
    kernel_ms = (cp.k_graph if (cp.server_graphs and cp.k_graph is not None) else cp.k_eager) if kern else None
    observed_server = (itl - engine_ms) if (itl is not None and engine_ms is not None) else None
    complete = itl is not None and predicted is not None
    return {
        "stage": "gap",
        "status": "ok" if complete else "partial",
        "reason": None if complete else
        ("; ".join(v for v in (lv.why.get("live"), lv.why.get("roofline"), c.lwhy) if v) or "live ITL or roofline missing"),
        "engine": lv.engine_name,
        "roofline_ms": roofline_ms,
        "kernel_ms": kernel_ms,
        "kernel_graph_ms": cp.k_graph if kern else None,
        "engine_ms": engine_ms,
        "engine_graph_ms": _num((eng or {}).get("graph_ms")),
        "predicted_ms": predicted,
        "live_itl_ms": itl,
        "communication_floor": communication,
        "live_itl_field": c.itl_key or None,
        "residual_ms": c.residual,
        "explained_fraction": c.explained,
        "closure_ratio": c.closure,
        "observed_server_overhead_ms": observed_server,
        "observed_server_overhead_note": "live ITL - engine level: circular (for comparison only, never used "
                                         "in the prediction)",
        "waterfall": waterfall,
        "sum_check": c.sum_check,
        "levers": levers,
        "headline": headline,
        "levels": {
            "roofline_ms": roofline_ms, "kernel_graph_ms": cp.k_graph if kern else None,
            "kernel_eager_ms": cp.k_eager if kern else None, "kernel_comparable": bool(cp.kernel_ok),
            "engine_ms": engine_ms, "live_itl_ms": itl,
        },
        "inputs_unavailable": {k: v for k, v in lv.why.items() if v},
        "hardware_revision": hardware_revision,
        "measured_on": {"run": lv.ref, "levels": lv.ids},
        "refused_levels": lv.refused,
        "notes": notes,
        "provenance": {
            "roofline_ms": "modelled: roofline.json t_memory_ms" if t_peak is not None else
                           "modelled from measured: bytes / measured bandwidth",
            "live_itl_ms": f"measured: live/summary.json {c.itl_key}" if itl is not None else "unavailable",
            "predicted_ms": "modelled from measured levels (engine + server-overhead model)",
            "residual_ms": "measured: live ITL - predicted",
        },
        "skipped": [],
    }


def attribute_files(paths: dict[str, str | Path | None], *, hardware_revision: str | None = None,
                    fingerprint: dict[str, str] | None = None,
                    run_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load the stage files named in `paths` (roofline, memory, allreduce, gemm, moe, attention, launch, simulate,
    live, audit, trace).

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
