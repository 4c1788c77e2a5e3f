"""The levers: what to change, ranked by the milliseconds each one saves, with its evidence."""

from __future__ import annotations

from typing import Any

from .attribute import _num


def _step(waterfall: list[dict], name: str) -> dict | None:
    return next((r for r in waterfall if r["name"] == name and r["ms"] is not None), None)


def rank_levers(waterfall, kern, eng, inputs, server_graphs: bool, roof: dict, ar_ms: float | None) -> list[dict]:
    levers: list[dict[str, Any]] = []

    def add(name, saves, evidence, status="measured", source=""):
        levers.append({"name": name, "saves_ms": saves, "saves_status": status, "evidence": evidence,
                       "source": source})

    launch = _step(waterfall, "launch overhead")
    if launch and not server_graphs and (launch["ms"] or 0) > 0 and kern and kern.get("graph_ms") is not None:
        add("capture CUDA graphs", launch["ms"],
            f"kernel level: eager {kern['eager_ms']:.3f} ms vs one CUDA graph {kern['graph_ms']:.3f} ms per step "
            f"({kern.get('layers_simulated')} of {kern.get('layers_total')} layers simulated, scaled)",
            source="simulate.json (kernel level)")
    if eng and _num(eng.get("eager_ms")) is not None and _num(eng.get("graph_ms")) is not None:
        d = eng["eager_ms"] - eng["graph_ms"]
        if d > 0:
            add("static KV cache + compile (CUDA graphs)", d,
                f"engine level ({eng.get('engine')}): eager {eng['eager_ms']:.3f} ms vs static cache + "
                f"torch.compile {eng['graph_ms']:.3f} ms per token", source="simulate.json (engine level)")
    kshape = _step(waterfall, "lost bandwidth: kernels at decode shapes")
    if kshape and kshape["ms"] > 0:
        gemm = inputs.get("gemm") or {}
        worst = gemm.get("worst_frac_of_copy_bw") or gemm.get("min_frac_of_copy_bw")
        ev = (f"kernel level in CUDA graphs takes {kshape['ms']:.3f} ms more than streaming its bytes at the "
              f"measured bandwidth (decode GEMVs, attention, norms and routing below streaming speed)")
        if isinstance(worst, (int, float)):
            ev += f"; worst decode GEMM reaches {worst:.0%} of copy bandwidth (microbench/gemm.json)"
        add("decode kernels at streaming bandwidth (fused / better-tuned GEMV, attention, MoE kernels)",
            kshape["ms"], ev, source="simulate.json (kernel level), microbench/gemm.json")
    fw = _step(waterfall, "framework overhead")
    if fw and fw["ms"] > 0 and not fw.get("absorbs"):
        add("leaner framework step (fewer host-side ops per layer, fused kernels)", fw["ms"],
            f"engine level {eng.get('serving_ms') or eng.get('eager_ms'):.3f} ms vs the same kernels "
            f"{'in graphs' if server_graphs else 'eagerly'} at the kernel level", source="simulate.json")
    loop = _step(waterfall, "server overhead: completion loop")
    if loop and loop["ms"] > 0:
        add("lighter completion loop (sampling on the device / fewer Python steps per token)", loop["ms"],
            f"in-process completion loop spends {loop['ms']:.3f} ms per token beyond the engine's eval "
            f"(sampling over the vocabulary, detokenisation, chunk building)", source="simulate.json (engine level)")
    http = _step(waterfall, "server overhead: HTTP/SSE streaming")
    if http and http["ms"] > 0:
        add("cheaper streaming path (batch chunks, faster JSON/SSE)", http["ms"], http.get("note", ""),
            source="simulate.json (server calibration)")
    if ar_ms and ar_ms > 0:
        floor = _num(roof.get("t_comm_floor_ms"))
        saves, status = (ar_ms - floor, "modelled") if floor is not None and ar_ms > floor else (None, "unavailable")
        add("faster all-reduce (one-shot / custom all-reduce, NVLS, or fewer TP ranks)", saves,
            f"all-reduce costs {ar_ms:.3f} ms per token" + (f" against a {floor:.3f} ms floor" if floor is not None else ""),
            status=status if saves is not None else "unavailable: no all-reduce floor to compare with",
            source="microbench/allreduce.json, roofline.json")
    audit = inputs.get("audit") or {}
    for f in audit.get("findings") or []:
        if not isinstance(f, dict) or f.get("severity") not in ("critical", "warning"):
            continue
        levers.append({
            "name": f"{f.get('title', f.get('id', 'audit finding'))}",
            "saves_ms": None,
            "saves_status": "unavailable: the audit finds the setting; no measurement here gives its milliseconds",
            "evidence": f"{f.get('evidence', '')} (fix: {f.get('fix', '')})",
            "source": f"audit.json ({f.get('id')}, {f.get('severity')})",
        })
    levers.sort(key=lambda l: (l["saves_ms"] is None, -(l["saves_ms"] or 0.0)))
    for i, l in enumerate(levers, 1):
        l["rank"] = i
    return levers


