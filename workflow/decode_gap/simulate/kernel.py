"""Kernel level: one decode step of the configured model as one GPU sees it after TP sharding.

Real tensors of the per-GPU shapes (random weights: timing does not depend on their values) run through the
kernels a decode step launches: the embedding row; per layer the norms, the attention projections (or MLA in its
absorbed decode form, with the DSA indexer where the card has one), attention over the KV length (on a GPU, as
engines fuse them: the rotary embedding one Triton kernel, GQA's qk-norm, rope and cache writes one kernel, and
GQA's and MLA's attention split-KV decode kernels where they beat torch's SDPA / bmm + softmax for the step's shape,
both timed at build: `kernels.attention`, `kernel_choices`; the norms one Triton kernel each with the residual add
fused in: `kernels.norm`), the
all-reduces, the router (its GEMM, then the scoring and top-k as one Triton kernel on a GPU, as engines fuse it:
`kernels.routing`) and the shared plus top-k routed experts (or the dense MLP); the final norm, the lm_head
and sampling. The step runs eagerly and as one captured CUDA graph; eager minus graph is the launch overhead.

Layers: `simulate.layers` of them ("auto": what fits in GPU memory, a few on a CPU), keeping the model's mix of
layer kinds (dense/MoE MLP, full/sliding attention). Each kind is timed as its own segment and scaled by
(layers of that kind) / (simulated layers of that kind); the head (embedding, final norm, lm_head, sampling) is
timed once. The result records the layers simulated and the scale.

All-reduce: with a world size above 1 (tp GPUs present, or gloo ranks on a CPU) the real collective runs inside
the step (torch.distributed). With one rank and tp > 1 the measured all-reduce time at the model's message size
(microbench/allreduce.json) times the collectives per token is added as a `modelled` component.

Weight formats: bf16 runs as bf16; fp8 runs `torch._scaled_mm` (per-tensor scales) where the device has it, and
above batch 1 its routed experts a fused MoE over the token-expert pairs sorted by expert (`kernels.fusedmoe`, Triton
fp8 dots, as engines' fused_moe_kernel; else `torch._scaled_grouped_mm`); at batch 1 each linear shape runs the
fastest of `torch._scaled_mm`, our per-tensor Triton GEMV (`kernels.lowprec.DenseGemv`) and the tensor-core one, and
the routed experts our grouped fp8 GEMV over each token's selected experts (on tensor cores,
`kernels.fp8mma.GroupedFp8Mma`, where H and I are multiples of 128; else `kernels.lowprec.GroupedExperts`). fp8-block
at batch 1 runs our 128x128 block-scaled Triton GEMVs (`kernels.lowprec.DenseGemv` with the scales applied to x, and
the grouped GEMV over each token's selected experts, chosen as for fp8), which the H200 runs level with the
per-tensor ones; above batch 1 its linears quantise the
activation per 1x128 group (Triton) and run `torch._scaled_mm` with the block scales (cuBLAS blockwise scaling, sm90
with CUDA 12.9+; `kernels.fp8block`), and its routed experts the fused MoE with the block scales. At every batch up to
16 rows each fp8 linear shape also times our tensor-core GEMV on x in bf16 (`kernels.fp8mma`, per-tensor or block
scales) and runs the fastest (each timed once a shape at build: `kernel_choices`); a block-scaled shape cuBLAS refuses
runs that GEMV. Where none of these runs here, the per-tensor kernels on the same bytes, which it says. NVFP4 runs the
micro-benchmarks' weight-only Triton kernels: the linears through `kernels.nvfp4.WeightOnlyGemm`, the routed experts
through the NVFP4 fused MoE over the token-expert pairs sorted by expert (`kernels.fp4moe`, each expert hit read once
a step, sm89+; where it does not run, the grouped NVFP4 GEMV once a token, `kernels.lowprec.GroupedExperts`). A
format the kernel level cannot run here (GGUF quants, NVFP4 without a kernel, fp8 on a CPU) runs a stand-in dtype and
says so (`format_match: false`); the gap attribution then keeps the kernel level off its chain.

Modules: formats.py (capability probes), layers.py (tensors, linear and expert layers), step.py (the op list of
one decode step); this one measures the step and is the entry point (`simulate_kernel`, one process per rank).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import DecodeGapError, REASON_CHARS, describe
from ..model import ModelSpec
from ..timing import ClockWatch, capture_graph
from .formats import _probe_grouped, _torch, probe_formats  # noqa: F401 - re-exported
from .layers import Experts, Linear  # noqa: F401 - re-exported
from .shapes import StepShapes, kv_row_bytes, layer_bytes, plan_layers, step_shapes
from .step import DecodeStep, Op  # noqa: F401 - re-exported
from .timing import L2Flusher, spread, time_cpu, time_cuda

HEAD_COMPONENTS = ("embedding", "final norm", "lm_head", "sampling")
COMPONENT_ORDER = (
    "embedding", "norms", "attention projections", "attention", "all-reduce", "mlp", "router",
    "shared expert", "routed experts", "final norm", "lm_head", "sampling",
)


@dataclass
class KernelSettings:
    tp: int = 1
    ep: int = 1
    batch: int = 1
    context_len: int = 512
    weight_format: str = "bf16"
    kv_cache_dtype: str = "auto"
    layers: int | str = "auto"
    sampling: str = "greedy"
    warmup: int = 3
    iters: int = 20
    device: str = "auto"  # auto | cpu | cuda
    memory_fraction: float = 0.8  # of free GPU memory the weights may take
    cpu_auto_layers: int = 4
    allreduce_us: float | None = None  # measured all-reduce at the model's message size (one rank, tp > 1)
    allreduce_source: str = ""
    allreduce_why: str = ""
    ranks: int | None = None  # None: tp ranks when the host has them (tp GPUs, or gloo on a CPU), else 1
    timeout_s: float = 3600.0  # every rank is stopped past it (a hung collective never blocks the DAG)




# ----------------------------------------------------------------------------------------------------------
# measuring


def _measure(step: DecodeStep, select, settings: KernelSettings, flusher, on_gpu: bool, barrier) -> dict[str, Any]:
    run = step.runner(select)
    if not on_gpu:
        samples = time_cpu(run, settings.warmup, settings.iters, before=barrier)
        return {"eager": spread(samples), "graph": None}
    eager = time_cuda(run, settings.warmup, settings.iters, flusher, before=barrier)
    out: dict[str, Any] = {"eager": spread(eager), "graph": None}
    try:
        g = capture_graph([run])
        with ClockWatch(step.device) as watch:  # the GPU's clocks while the replays are timed (as the gemm stage)
            graph = time_cuda(g.replay, settings.warmup, settings.iters, flusher, before=barrier)
        out["graph"] = spread(graph)
        out["graph_clock"] = watch.columns()
        del g
    except Exception as exc:
        out["graph_error"] = describe(exc, REASON_CHARS)
    return out


def step_clock(measures: list[dict[str, Any]]) -> dict[str, Any]:
    """What the GPU's clocks did while the step's segments were replayed in CUDA graphs (the replays graph_ms
    adds up): the largest share of a segment's timing held down by the power or thermal cap, the caps named, the
    lowest SM clock at a segment's end. Every figure None where NVML cannot say (a CPU host, no driver library)."""
    clocks = [m["graph_clock"] for m in measures if m.get("graph_clock")]
    fracs = [c["clock_capped_frac"] for c in clocks if c.get("clock_capped_frac") is not None]
    mhz = [c["sm_clock_mhz"] for c in clocks if c.get("sm_clock_mhz") is not None]
    by = sorted({b for c in clocks for b in str(c.get("clock_capped_by") or "").split("+") if b})
    return {"capped_frac": max(fracs) if fracs else None, "capped_by": "+".join(by),
            "sm_clock_mhz_min": min(mhz) if mhz else None, "segments": len(clocks),
            "source": "NVML clock violation counters over each segment's CUDA-graph replays"}


def _median(m: dict | None) -> float | None:
    return None if not m else m.get("median_ms")


def _device_name(device: str) -> str:
    torch = _torch()
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    from ..host import cpu_model

    return f"cpu: {cpu_model()}"


def _fits(shapes: StepShapes, fmt: dict, device: str, settings: KernelSettings, world: int = 1) -> int | None:
    """Layers that fit in the device memory budget ("auto"), or the CPU's small default."""
    torch = _torch()
    # bytes a weight value takes while the layers are built (nvfp4: its bf16 scratch at init)
    wb = {"fp8": 1.0, "fp8-gemv": 1.0, "fp8-block": 1.0, "fp8-block-mm": 1.0, "bf16": 2.0, "fp32": 4.0,
          "nvfp4-wo": 2.0}[fmt["linear"]]
    ab = {"bf16": 2.0, "fp32": 4.0}[fmt["activations"]]
    per = max(layer_bytes(shapes, k, wb, ab, shapes.context_len + 1) for k in shapes.kinds)
    head = (1 if shapes.spec.tie_embeddings else 2) * shapes.vocab * shapes.spec.hidden * ab
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        budget = free * settings.memory_fraction - head - 2 * 1024**3
    else:
        import psutil

        budget = psutil.virtual_memory().available * 0.4 / max(1, world) - head  # ranks share the host memory
        return max(0, min(settings.cpu_auto_layers, int(budget // per))) if budget > 0 else 0
    return max(0, int(budget // per))


def simulate_rank(spec: ModelSpec, settings: KernelSettings, device: str, group=None) -> dict[str, Any]:
    """Build and time the step on this rank. Rank 0's dict is the result."""
    torch = _torch()
    on_gpu = device.startswith("cuda")
    if on_gpu:
        torch.cuda.set_device(torch.device(device))
    torch.manual_seed(0)
    shapes = step_shapes(spec, settings.tp, settings.ep, settings.batch, settings.context_len)
    fmt = probe_formats(settings.weight_format, device, settings.batch)
    if fmt.get("experts_stand_in") and spec.is_moe:
        failed = f": {fmt['experts_failed']}" if fmt.get("experts_failed") else ""
        fmt = {**fmt, "format_match": False,
               "stand_in": f"routed experts run bf16 stand-in weights (no grouped {settings.weight_format} kernel "
                           f"here{failed})"}
    odd = sorted({k.split("/")[1] for k in shapes.kinds if k.split("/")[1] in ("linear", "unknown", "none")})
    if odd:  # the step has kernels for softmax attention only: say so, and keep this level off the gap's chain
        fmt = {**fmt, "format_match": False,
               "stand_in": "; ".join(filter(None, [fmt.get("stand_in"),
                                                   f"{', '.join(odd)} attention layers run standard attention as a "
                                                   "stand-in (no kernel here for their state update)"]))}
    fits = _fits(shapes, fmt, device, settings, group.size() if group is not None else 1)
    if fits is not None and fits < len(shapes.kinds) and settings.layers == "auto":
        raise DecodeGapError(
            f"simulate: not even one layer of each kind of {spec.name} fits on {device} "
            f"(budget allows {fits}); set simulate.layers or use a larger device"
        )
    plan = plan_layers(shapes, settings.layers, fits)
    world = group.size() if group is not None else 1
    barrier: Callable[[], None] = (lambda: torch.distributed.barrier(group=group)) if group is not None else (lambda: None)
    with torch.inference_mode():
        step = DecodeStep(shapes, plan, fmt, device, settings.context_len, settings.sampling,
                          group=group if world > 1 else None)
        flusher = L2Flusher(device) if on_gpu else None
        # one full step first so that every buffer (routing ids, logits) holds valid values
        step.runner(lambda op: True)()
        if on_gpu:
            torch.cuda.synchronize()
        full = _measure(step, lambda op: True, settings, flusher, on_gpu, barrier)
        segments = {}
        for seg in ["head"] + list(plan):
            segments[seg] = _measure(step, lambda op, s=seg: op.segment == s, settings, flusher, on_gpu, barrier)
        comp: dict[tuple[str, str], dict] = {}
        for c in COMPONENT_ORDER:
            for seg in ["head"] + list(plan):
                if any(op.component == c and op.segment == seg for op in step.ops):
                    comp[(c, seg)] = _measure(step, lambda op, c=c, s=seg: op.component == c and op.segment == s,
                                              settings, flusher, on_gpu, barrier)
    counts = shapes.kinds
    scale_by_kind = {k: counts[k] / plan[k] for k in plan}

    def scaled(mode: str, table: dict[str, dict]) -> float | None:
        total = 0.0
        for seg, m in table.items():
            v = _median(m.get(mode))
            if v is None:
                return None
            total += v * (1.0 if seg == "head" else scale_by_kind[seg])
        return total

    eager_ms = scaled("eager", segments)
    graph_ms = scaled("graph", segments) if on_gpu else None
    graph_errors = sorted({m["graph_error"] for m in [full, *segments.values(), *comp.values()] if m.get("graph_error")})
    components = []
    for c in COMPONENT_ORDER:
        parts = {seg: m for (cc, seg), m in comp.items() if cc == c}
        if not parts:
            continue
        e = scaled("eager", parts)
        g = scaled("graph", parts) if on_gpu else None
        components.append({
            "name": c, "ms": g if g is not None else e, "eager_ms": e, "graph_ms": g, "status": "measured",
            "source": "simulate_kernel: " + ("CUDA-graph replay" if g is not None else "eager wall time") +
                      (f" over {world} ranks ({'nccl' if on_gpu else 'gloo'})" if c == "all-reduce" else ""),
        })
    # one rank standing for tp GPUs: the collectives are modelled from the measured all-reduce
    allreduce = {"mode": "none", "collectives_per_token": shapes.collectives_per_token}
    if world > 1:
        allreduce.update(mode="real", world_size=world, backend="nccl" if on_gpu else "gloo")
    elif settings.tp > 1:
        if settings.allreduce_us is not None:
            ms = shapes.collectives_per_token * settings.allreduce_us / 1000.0
            components.append({
                "name": "all-reduce", "ms": ms, "eager_ms": ms, "graph_ms": ms if on_gpu else None,
                "status": "modelled",
                "source": f"{settings.allreduce_source}: {shapes.collectives_per_token} x "
                          f"{settings.allreduce_us:.2f} us (measured all-reduce at the model's message size)",
            })
            allreduce.update(mode="modelled", us_each=settings.allreduce_us, ms=ms, source=settings.allreduce_source)
            eager_ms = eager_ms + ms if eager_ms is not None else None
            graph_ms = graph_ms + ms if graph_ms is not None else None
        else:
            allreduce.update(mode="unavailable", why=settings.allreduce_why or "no all-reduce measurement")
            components.append({"name": "all-reduce", "ms": None, "eager_ms": None, "graph_ms": None,
                               "status": "unavailable", "why": allreduce["why"], "source": "microbench/allreduce.json"})
    layers_total = spec.layers
    layers_sim = sum(plan.values())
    kv_read = sum(
        shapes.batch * (min(settings.context_len + 1, spec.sliding_window) if k.endswith("sliding") else settings.context_len + 1)
        * kv_row_bytes(shapes, {"bf16": 2, "fp32": 4}[fmt["activations"]]) * n
        for k, n in counts.items()
    )
    backend = (f"torch {torch.__version__} " + ("CUDA eager + CUDA graph" if on_gpu else "CPU eager") +
               f"; linear {fmt['linear']}" + (f"; MoE {step.moe_backend}" if step.moe_backend else "") +
               (f"; routing {step.routing_impl}" if step.routing_impl else "") +
               "; attention " + step.attention_impl + ("; rope and rms norms triton fused" if step.fused else ""))
    graph_reason = None
    if not on_gpu:
        graph_reason = "CUDA graphs need a GPU: on a CPU the step runs eagerly only"
    elif graph_ms is None:
        graph_reason = "CUDA-graph capture failed: " + "; ".join(graph_errors)
    result = {
        "stage": "simulate_kernel",
        "status": "ok",
        "device": _device_name(device),
        "backend": backend,
        "model": spec.name,
        "tp": settings.tp, "ep": settings.ep, "batch_size": settings.batch, "context_len": settings.context_len,
        "weight_format": settings.weight_format,
        "dtypes": {"linear": fmt["linear"], "activations": fmt["activations"], "kv_cache": fmt["activations"],
                   **({"experts": step.experts_kind} if spec.is_moe else {})},
        "format_match": fmt["format_match"],
        "stand_in": fmt["stand_in"],
        "moe_backend": step.moe_backend or None,
        "sampling": settings.sampling,
        "eager_ms": eager_ms,
        "graph_ms": graph_ms,
        "graph_reason": graph_reason,
        "launch_overhead_ms": (eager_ms - graph_ms) if (eager_ms is not None and graph_ms is not None) else None,
        "components": components,
        "components_sum_ms": sum(c["ms"] for c in components if c["ms"] is not None),
        "layers_total": layers_total,
        "layers_simulated": layers_sim,
        "scale": layers_total / layers_sim,
        "scale_by_kind": scale_by_kind,
        "layers_by_kind": {k: {"total": counts[k], "simulated": plan[k]} for k in plan},
        "raw": {"layers": layers_sim, "eager": full["eager"], "graph": full["graph"]},
        "clock": step_clock(list(segments.values())),
        "segments": {seg: {"eager": m["eager"], "graph": m["graph"],
                           "scale": 1.0 if seg == "head" else scale_by_kind[seg]} for seg, m in segments.items()},
        "allreduce": allreduce,
        "bytes_per_step_simulated": step.weight_bytes + step.kv_bytes,
        "kv_bytes_per_step": kv_read,
        "world_size": world,
        "settings": {"warmup": settings.warmup, "iters": settings.iters, "layers": settings.layers,
                     "l2_flush": bool(on_gpu)},
        "notes": list(shapes.notes) + ([fmt["note"]] if fmt.get("note") else []) +
                 ([step.experts_note] if step.experts_note else []) +
                 ([step.shared_note] if step.shared_note else []) +
                 ([step.picker.summary("linears")] if step.picker and step.picker.records else []) +
                 ([step.attn_picker.summary("decode attention")] if step.attn_picker and step.attn_picker.records
                  else []),
        "kernel_choices": [r for p in (step.picker, step.attn_picker) if p for r in p.records],
        "skipped": [],
        "provenance": {
            "eager_ms": "measured: eager step, " + ("CUDA events from an idle GPU" if on_gpu else "wall time") +
                        (", scaled by layer kind" if layers_sim < layers_total else ""),
            "graph_ms": ("measured: CUDA-graph replay, CUDA events" if graph_ms is not None
                         else f"unavailable: {graph_reason}"),
        },
    }
    if not fmt["format_match"]:
        result["skipped"].append({"case": f"{settings.weight_format} kernels", "reason": fmt["stand_in"]})
    if graph_reason:
        result["skipped"].append({"case": "CUDA graph", "reason": graph_reason})
    return result


# ----------------------------------------------------------------------------------------------------------
# entry point (one rank, or several through torch.distributed)


RANK_MODULE = "decode_gap.simulate.kernel_rank"


def rank_body(rank: int, job: dict[str, Any]) -> None:
    """One rank of the simulated step (started by `decode_gap.ranks.launch`); rank 0 writes the result."""
    import torch
    import torch.distributed as dist

    from ..ranks import load_payload, write_result

    spec, settings = load_payload(job)
    world, backend = job["world_size"], job["backend"]
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "gloo":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    else:
        torch.cuda.set_device(rank)
    kwargs = {"device_id": torch.device(device)} if backend == "nccl" else {}
    dist.init_process_group(backend, init_method=job["init_method"], rank=rank, world_size=world, **kwargs)
    try:
        result = simulate_rank(spec, settings, device, group=dist.group.WORLD)
        if rank == 0:
            write_result(job, rank, result)
    finally:
        dist.destroy_process_group()


def pick_device(settings: KernelSettings) -> str:
    torch = _torch()
    if settings.device == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda:0"
    if settings.device == "cuda":
        raise DecodeGapError("config field 'simulate.device': cuda requested but torch sees no GPU")
    return "cpu"


def simulate_kernel(spec: ModelSpec, settings: KernelSettings) -> dict[str, Any]:
    """Run the kernel level: one rank, or `tp` ranks with the real all-reduce when that many are available."""
    torch = _torch()
    device = pick_device(settings)
    world = 1
    if settings.ranks is not None:
        world = settings.ranks if settings.ranks in (1, settings.tp) else 1
    elif settings.tp > 1:
        if device.startswith("cuda") and torch.cuda.device_count() >= settings.tp:
            world = settings.tp
        elif not device.startswith("cuda"):
            world = settings.tp  # gloo ranks on the CPU
    if world == 1:
        return simulate_rank(spec, settings, device)
    from ..ranks import launch

    backend = "nccl" if device.startswith("cuda") else "gloo"
    results = launch(RANK_MODULE, {"backend": backend}, world, settings.timeout_s, "simulate_kernel",
                     payload=(spec, settings))
    if 0 not in results:
        raise DecodeGapError(f"simulate_kernel: rank 0 of {world} exited without writing the step's result")
    return results[0]
