"""The levers: what to change, ranked by the milliseconds each one saves, with its evidence."""

from __future__ import annotations

from typing import Any

from .attribute import _num
from .levels import one_rank_allreduce


def _step(waterfall: list[dict], name: str) -> dict | None:
    return next((r for r in waterfall if r["name"] == name and r["ms"] is not None), None)


def comm_floor(allreduce: dict, roof: dict) -> dict[str, Any]:
    """The communication floor per token: the all-reduces a token needs, each at the latency measured at the
    model's message size (CUDA graph when measured, else eager) when the micro-benchmark ran at world size > 1;
    else the roofline's modelled floor (latency from the hardware spec + bytes over the link)."""
    n = _num(roof.get("allreduces_per_token"))
    figs = allreduce.get("figures") if isinstance(allreduce.get("figures"), dict) else {}
    world = _num(allreduce.get("world_size")) or 1
    per_op = {m: _num(figs.get(f"allreduce_us_at_model_size_{m}")) for m in ("eager", "graph")}
    out: dict[str, Any] = {"allreduces_per_token": n, "per_op_us": per_op,
                           "eager_ms": None, "graph_ms": None, "modelled_ms": _num(roof.get("t_comm_floor_ms"))}
    if n and world > 1:
        for m, us in per_op.items():
            if us is not None:
                out[f"{m}_ms"] = n * us / 1000.0
    best = out["graph_ms"] if out["graph_ms"] is not None else out["eager_ms"]
    if best is not None:
        mode = "CUDA graph" if out["graph_ms"] is not None else "eager"
        us = per_op["graph" if out["graph_ms"] is not None else "eager"]
        out.update(floor_ms=best, floor_status="measured",
                   floor_basis=f"{n:.0f} x {us:.1f} us measured at the model's message size, {mode}, "
                               f"{world:.0f} ranks")
    elif out["modelled_ms"] is not None:
        out.update(floor_ms=out["modelled_ms"], floor_status="modelled",
                   floor_basis=(roof.get("provenance") or {}).get("t_comm_floor_ms") or "roofline.json")
    else:
        out.update(floor_ms=None, floor_status="unavailable", floor_basis="")
    if out["eager_ms"] is not None and out["graph_ms"] is not None:
        out["graph_saves_ms"] = out["eager_ms"] - out["graph_ms"]
    return out


def gemm_step_split(gemm: dict, roof: dict) -> str:
    """What the gemm stage says of one decode step's dense GEMMs in the run's weight format and batch
    (gemm.json by_m.<M>.step_*): their measured time against a plain read of their bytes (the part that is the
    GEMM kernels' own) and against their bytes at copy bandwidth (what their sizes cost); "" where it has no such
    figures (older results, a format the stage does not time)."""
    # the gemm stage times both FP8 scalings under one dtype, fp8 (the fastest form a shape kept)
    fmt = {"fp8-block": "fp8"}.get(roof.get("weight_format"), roof.get("weight_format"))
    batch = _num(roof.get("batch_size"))
    dt = (gemm.get("dtypes") or {}).get(fmt) or {}
    step = (dt.get("by_m") or {}).get(str(int(batch))) if batch is not None else None
    if not step or _num(step.get("step_gemm_us")) is None or _num(step.get("step_plain_read_us")) is None:
        return ""
    gemm_ms, read_ms = step["step_gemm_us"] / 1e3, step["step_plain_read_us"] / 1e3
    text = (f"the step's {fmt} dense GEMMs (M={int(batch)}, {step.get('step_gemm_rows')} of them x their layers) take "
            f"{gemm_ms:.3f} ms against {read_ms:.3f} ms for a plain read of their bytes, so {gemm_ms - read_ms:.3f} "
            f"ms is the GEMM kernels' own")
    if _num(step.get("step_at_copy_bw_us")) is not None:
        text += (f" and {read_ms - step['step_at_copy_bw_us'] / 1e3:.3f} ms what their sizes cost over copy "
                 f"bandwidth (fusing kernels, not tuning them, wins that back)")
    return text + " (microbench/gemm.json, measured)"


# the kernel level's routed experts against the MoE stage's row times the MoE layers: past this ratio either way the
# step calls the kernel differently from the micro-benchmark (the NVFP4 fused MoE's align over the model's 256-expert
# table spilled, 2.45x the stage's row, which held only the experts hit)
LEVEL_MISMATCH = 1.5


def _experts_step(moe: dict, roof: dict) -> tuple[str, float, float, int, int] | None:
    """(kernel name, its ms and a plain read's ms a step, M, MoE layers) of the routed experts' kernel in the run's
    weight format (moe.json at the run's batch, times its MoE layers: the kernel the kernel level runs, the fused MoE
    for NVFP4 and for fp8 above batch 1, else the grouped GEMV); None where moe.json has no such pair."""
    fmt, batch = str(roof.get("weight_format") or ""), _num(roof.get("batch_size"))
    entry = (moe.get("by_m") or {}).get(str(int(batch))) if batch is not None else None
    layers = _num((moe.get("shape") or {}).get("moe_layers"))
    impls = [("grouped_gemv", "grouped GEMV"), ("fused_moe", "fused MoE")]
    for impl, what in impls[::-1] if fmt == "nvfp4" else impls:
        key = f"experts_{impl}_{fmt.replace('-', '_')}"
        kernel_us, read_us = (_num(entry.get(f"{key}{part}")) if entry else None for part in ("_us", "_plain_read_us"))
        if layers and kernel_us is not None and read_us is not None:
            return what, kernel_us * layers / 1e3, read_us * layers / 1e3, int(batch), int(layers)
    return None


def experts_level_mismatch(moe: dict, roof: dict, kern: dict | None) -> str:
    """A sentence where the kernel level's routed experts (CUDA graph, scaled to every layer) and the MoE stage's row
    times the MoE layers differ by more than LEVEL_MISMATCH either way: the same kernel, called differently, so the
    difference is in the call (expert table, routing, buffers), not in the kernel; "" where they agree or either is
    missing."""
    step = _experts_step(moe, roof)
    comp = next((c for c in (kern or {}).get("components") or [] if c.get("name") == "routed experts"), None)
    level_ms = _num((comp or {}).get("graph_ms"))
    if step is None or level_ms is None or step[1] <= 0 or level_ms <= 0:
        return ""
    ratio = level_ms / step[1]
    if 1 / LEVEL_MISMATCH <= ratio <= LEVEL_MISMATCH:
        return ""
    return (f"the kernel level's routed experts take {level_ms:.3f} ms a step, {ratio:.2f}x the {step[1]:.3f} ms "
            f"that the MoE stage's {step[0]} row predicts for its {step[4]} MoE layers at M={step[3]}: the two call "
            f"the same kernel differently (the model's whole expert table and its router's choices against the "
            f"experts hit alone), so look at the call before the kernel")


def experts_step_split(moe: dict, roof: dict, kern: dict | None = None) -> str:
    """The routed experts' kernel of one decode step (_experts_step) against a plain read of the selected experts'
    bytes, and where the kernel level disagrees with it, that (experts_level_mismatch); "" where moe.json has no such
    pair."""
    step = _experts_step(moe, roof)
    if step is None:
        return ""
    what, kernel_ms, read_ms, batch, layers = step
    text = (f"the routed experts' {what} ({roof.get('weight_format')}, M={batch}, x {layers} MoE layers) takes "
            f"{kernel_ms:.3f} ms against {read_ms:.3f} ms for a plain read of the selected experts' bytes "
            f"(microbench/moe.json, measured)")
    mismatch = experts_level_mismatch(moe, roof, kern)
    return text + (f"; but {mismatch}" if mismatch else "")


def attention_step_split(att: dict, memory: dict, roof: dict) -> str:
    """What the attention stage says of one decode step's attention at the run's context and batch (attention.json
    best.<case>, the fastest backend of each, times its layers): its time against its KV-cache bytes at copy
    bandwidth, and which kernels were fastest; "" where the stage has no such cases (older results, skipped)."""
    shape, best = att.get("shape") or {}, att.get("best") or {}
    batch, length = _num(roof.get("batch_size")), _num(roof.get("context_len"))
    layers = _num(shape.get("layers"))
    if batch is None or length is None or not layers or not best:
        return ""
    b, n = int(batch), int(length)
    if shape.get("kind") == "gqa":
        sliding = int(shape.get("sliding_layers") or 0)
        window = int(shape.get("sliding_window") or n)
        cases = [("sdpa", n, layers - sliding), ("sdpa-sliding", min(n, window), sliding)]
    else:
        topk = int(shape.get("index_topk") or 0) if shape.get("index_heads") else 0
        cases = [("mla-absorbed-sparse", topk, layers) if topk and n > topk else ("mla-absorbed", n, layers)]
        cases += [("dsa-indexer", n, layers)] if topk else []
    copy = _num(memory.get("copy_gbps"))
    total_us, at_copy_us, kernels = 0.0, 0.0, []
    for name, rows, count in cases:
        if count <= 0:
            continue
        e = best.get(f"{name} B={b} L={rows}")
        if not e or _num(e.get("us")) is None:
            return ""
        total_us += e["us"] * count
        at_copy_us += e["us"] * (_num(e.get("gbps")) or 0.0) / copy * count if copy else 0.0
        if e.get("best_backend") not in kernels:
            kernels.append(e.get("best_backend"))
    text = (f"decode attention at {n} tokens (B={b}, x its layers) takes {total_us / 1e3:.3f} ms on the fastest "
            f"kernels measured ({', '.join(map(str, kernels))})")
    if copy:
        text += f" against {at_copy_us / 1e3:.3f} ms for its bytes at copy bandwidth"
    return text + " (microbench/attention.json, measured)"


def rank_levers(waterfall, kern, eng, inputs, server_graphs: bool, roof: dict, ar_ms: float | None,
                unmeasured: str = "") -> list[dict]:
    """The levers, largest saving first. `unmeasured`: why nothing tells how the server launches its kernels
    (steps.server_unmeasured), which leaves the kernel level's launch overhead a saving for eager servers only."""
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
    elif unmeasured and not server_graphs and kern and _num(kern.get("eager_ms")) is not None \
            and _num(kern.get("graph_ms")) is not None and kern["eager_ms"] > kern["graph_ms"]:
        add("capture CUDA graphs, if the server launches its kernels eagerly", None,
            f"kernel level: eager {kern['eager_ms']:.3f} ms vs one CUDA graph {kern['graph_ms']:.3f} ms per step "
            f"({kern.get('layers_simulated')} of {kern.get('layers_total')} layers simulated, scaled); a server "
            "that captures CUDA graphs (vLLM, SGLang and TGI by default) pays none of it",
            status=f"unavailable: {unmeasured}", source="simulate.json (kernel level)")
    if eng and _num(eng.get("eager_ms")) is not None and _num(eng.get("graph_ms")) is not None:
        d = eng["eager_ms"] - eng["graph_ms"]
        if d > 0:
            add("static KV cache + compile (CUDA graphs)", d,
                f"engine level ({eng.get('engine')}): eager {eng['eager_ms']:.3f} ms vs static cache + "
                f"torch.compile {eng['graph_ms']:.3f} ms per token", source="simulate.json (engine level)")
    kshape = _step(waterfall, "lost bandwidth: kernels at decode shapes")
    if kshape and kshape["ms"] > 0:
        ev = (f"kernel level in CUDA graphs takes {kshape['ms']:.3f} ms more than streaming its bytes at the "
              f"measured bandwidth (decode GEMVs, attention, norms and routing below streaming speed)")
        for split in (gemm_step_split(inputs.get("gemm") or {}, roof),
                      experts_step_split(inputs.get("moe") or {}, roof, kern),
                      attention_step_split(inputs.get("attention") or {}, inputs.get("memory") or {}, roof)):
            ev += f"; {split}" if split else ""
        add("decode kernels at streaming bandwidth (fused / better-tuned GEMV, attention, MoE kernels)",
            kshape["ms"], ev, source="simulate.json (kernel level), microbench/gemm.json, microbench/moe.json, "
                                     "microbench/attention.json")
    fw = _step(waterfall, "framework overhead")
    if fw and fw["ms"] > 0 and not fw.get("absorbs"):
        add("leaner framework step (fewer host-side ops per layer, fused kernels)", fw["ms"],
            f"engine level {eng.get('serving_ms') or eng.get('eager_ms'):.3f} ms vs the same kernels "
            f"{'in graphs' if server_graphs else 'eagerly'} at the kernel level", source="simulate.json")
    # no kernel level to split the engine's step by (stand-in weights, or none ran): one lever for the whole of it
    whole = next((r for r in waterfall if "lost bandwidth: kernels at decode shapes" in (r.get("absorbs") or [])
                  and r["name"].endswith("framework overhead") and (r.get("ms") or 0) > 0), None)
    if whole and eng:
        k = kern or {}
        why = ((k.get("stand_in") if k.get("format_match") is False else k.get("reason"))
               or "the kernel level did not run")
        add("the engine's decode step at streaming bandwidth (its kernels, launches and host work)", whole["ms"],
            f"engine level ({eng.get('engine')}) takes {whole['ms']:.3f} ms a token beyond its bytes at the measured "
            f"bandwidth; which share is kernels, launches or host work is not split here: {why}",
            source="simulate.json (engine level), roofline.json, microbench/memory.json")
    loop = _step(waterfall, "server overhead: completion loop")
    if loop and loop["ms"] > 0:
        add("lighter completion loop (sampling on the device / fewer Python steps per token)", loop["ms"],
            f"in-process completion loop spends {loop['ms']:.3f} ms per token beyond the engine's eval "
            f"(sampling over the vocabulary, detokenisation, chunk building)", source="simulate.json (engine level)")
    http = _step(waterfall, "server overhead: HTTP/SSE streaming")
    if http and http["ms"] > 0:
        add("cheaper streaming path (batch chunks, faster JSON/SSE)", http["ms"], http.get("note", ""),
            source="simulate.json (server calibration)")
    one_rank = one_rank_allreduce(inputs.get("allreduce") or {}, roof, int(roof.get("tp") or 1))
    if ar_ms and ar_ms > 0 and one_rank:
        add("faster all-reduce (one-shot / custom all-reduce, NVLS, or fewer TP ranks)", None,
            f"all-reduce modelled at {ar_ms:.3f} ms per token: {one_rank}",
            status="unavailable: the all-reduce was not measured at tp ranks, so its step is the datasheet's floor "
                   "and nothing is left to save against it; measure it on tp GPUs (microbench.allreduce.world_size)",
            source="microbench/allreduce.json, roofline.json")
    elif ar_ms and ar_ms > 0:
        comm = comm_floor(inputs.get("allreduce") or {}, roof)
        floor = comm["floor_ms"]
        saves = ar_ms - floor if floor is not None and ar_ms > floor else None
        add("faster all-reduce (one-shot / custom all-reduce, NVLS, or fewer TP ranks)", saves,
            f"all-reduce costs {ar_ms:.3f} ms per token" +
            (f" against a {floor:.3f} ms floor ({comm['floor_basis']})" if floor is not None else ""),
            status=comm["floor_status"] if saves is not None else (
                "unavailable: no all-reduce floor to compare with" if floor is None
                else "unavailable: the all-reduce already runs at its floor"),
            source="microbench/allreduce.json, roofline.json")
    idle = _step(waterfall, "GPU idle between kernels (CPU, launch or framework)")
    if idle and idle["ms"] > 0:
        add(f"keep the GPU busy: GPU idle {idle.get('note') or ''} (CUDA graphs / a leaner step / overlap the host)",
            idle["ms"], "the server's own trace: time between kernels in its decode step", source="trace.json")
    for r in waterfall:
        if r["name"].startswith("kernels slower than simulated: ") and r["ms"] is not None and r["ms"] > 0:
            g = r["name"].split(": ", 1)[1]
            add(f"faster {g} kernels in the server (its kernels against the kernel level)", r["ms"],
                r.get("note", ""), source="trace.json, simulate.json (kernel level)")
    contention = _step(waterfall, "CPU contention: the engine under live load")
    if contention and contention["ms"] > 0:
        add("give the server's compute threads their own cores (fewer threads than cores, client elsewhere)",
            contention["ms"], contention.get("note", ""), source="live/summary.json, simulate.json (engine level)")
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


