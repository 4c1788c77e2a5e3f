"""Engine level, opt-in: record a torch.profiler trace of N decode steps of the transformers engine.

The model is the card's architecture with random weights (`AutoModelForCausalLM.from_config`), as the engine
level times it. Each decode step (one token: forward over the KV cache, greedy pick, host read of the token,
as `generate` does) runs inside `record_function("decode_step")`, so the trace stage finds the steps by that
annotation (eager on a GPU: CUDA activity only, no annotation; the stage finds the steps by the kernel period).
`mode="graph"` captures one step as a CUDA graph over a static cache and replays it (GPU only). The same steps
are timed without the profiler first, so the trace's step time can be compared with it.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from ..errors import DecodeGapError, REASON_CHARS, describe
from ..timing import capture_graph, warm_on_side_stream

ANNOTATION = "decode_step"


def build_model(card: str | Path | dict[str, Any], layers: int | None, device: str, dtype: Any):
    """A random-weight causal LM from a config.json path (or a config dict), optionally with fewer layers."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    if isinstance(card, dict):
        cfg = LlamaConfig(**card) if card.get("model_type", "llama") == "llama" else AutoConfig.for_model(**card)
    else:
        cfg = AutoConfig.from_pretrained(str(card))
    if layers:
        cfg.num_hidden_layers = int(layers)
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = list(cfg.layer_types)[: int(layers)]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval(), cfg


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


class _Eager:
    """Decode with the dynamic cache: one forward per token."""

    def __init__(self, model, prompt_len: int, device: str):
        import torch
        from transformers import DynamicCache

        self.model = model
        ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), device=device)
        self.cache = DynamicCache()
        with torch.inference_mode():
            out = model(input_ids=ids, past_key_values=self.cache, use_cache=True)
        self.tok = out.logits[:, -1:].argmax(-1)

    def step(self, ev: tuple | None = None) -> int:
        import torch

        with torch.inference_mode():
            if ev is not None:
                ev[0].record()
            out = self.model(input_ids=self.tok, past_key_values=self.cache, use_cache=True)
            self.tok = out.logits[:, -1:].argmax(-1)
            if ev is not None:
                ev[1].record()
        return int(self.tok.item())  # the host reads the token, as a streaming server does


class _Graph:
    """One decode step over a static cache, captured once as a CUDA graph and replayed per token."""

    def __init__(self, model, prompt_len: int, max_len: int, device: str):
        import torch
        from transformers import StaticCache

        self.model = model
        self.forward = model
        self.backend = "torch.cuda.graph (manual capture)"
        # keywords only: transformers 4.x takes batch/device/dtype, 5.x sizes its layers at the first update
        self.cache = StaticCache(config=model.config, max_cache_len=max_len, max_batch_size=1, device=device,
                                 dtype=model.dtype)
        ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), device=device)
        with torch.inference_mode():
            out = model(input_ids=ids, past_key_values=self.cache, cache_position=torch.arange(prompt_len, device=device),
                        use_cache=True)
        self.ids = out.logits[:, -1:].argmax(-1).clone()
        self.pos = torch.tensor([prompt_len], device=device)
        self.at, self.max_len = prompt_len, max_len
        with torch.inference_mode():
            warm_on_side_stream([self._forward])  # before capture (allocator, lazy init)
        try:
            with torch.inference_mode():
                self.graph = capture_graph([self._capture_forward], warmup=0)
        except Exception as exc:  # the model's mask code synced during capture: let torch.compile cut the graph
            self.graph = None
            self.backend = (f"torch.compile mode=reduce-overhead (manual capture failed: "
                            f"{describe(exc, 120)})")
            self.forward = torch.compile(model, mode="reduce-overhead")
            with torch.inference_mode():
                for _ in range(3):  # compile, record, then replay
                    self.out = self._forward()

    def _capture_forward(self) -> None:
        self.out = self._forward()

    def _forward(self):
        logits = self.forward(input_ids=self.ids, past_key_values=self.cache, cache_position=self.pos,
                              use_cache=True).logits
        return logits[:, -1:].argmax(-1)

    def step(self, ev: tuple | None = None) -> int:
        import torch

        with torch.inference_mode():
            if ev is not None:
                ev[0].record()
            if self.graph is not None:
                self.graph.replay()
            else:
                self.out = self._forward()
            if ev is not None:
                ev[1].record()
            self.ids.copy_(self.out)
            if self.at + 1 < self.max_len:  # past the cache's end, keep rewriting the last slot
                self.at += 1
                self.pos.add_(1)
        return int(self.ids.item())


# Measured on an H200 (benchmarks/device/profiler_overhead.py, torch 2.11 / CUPTI 13): under torch.profiler with
# CUDA activity, (1) cudaGraphLaunch of an 832-node graph takes ~0.6 ms on the host and the graph starts only
# when it returns, so the GPU waits; (2) every graph kernel costs ~0.16-0.26 µs more on the GPU (CUPTI's
# per-kernel timestamps); (3) the kernels stay slower after the profiler stops, so the unprofiled reference is
# timed before any profiling in the process. Eager: CPU-op recording adds ~7-24% to the step, CUDA-only ~0.3%.
CALIBRATION_KERNELS = 200
_SLEEP_CYCLES = 10_000_000  # ~5 ms at H200 clocks: the host launches the graph while the GPU still sleeps


def profiler_calibration(n: int = CALIBRATION_KERNELS, reps: int = 20) -> dict[str, Any]:
    """The profiler's GPU cost per CUDA-graph kernel on this GPU: graphs of `n` tiny and `n` medium elementwise
    kernels, each replay's GPU span (CUDA events, the GPU kept busy while the host launches) unprofiled, then
    under torch.profiler (CUDA activity). Run it after the unprofiled reference and before the capture."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..timing import capture_graph, graph_spans_us, percentiles

    def spans(g, m):  # ms
        return [u / 1e3 for u in graph_spans_us(g, m, _SLEEP_CYCLES)]

    cases: dict[str, Any] = {}
    for kind in ("tiny", "medium"):
        if kind == "tiny":  # ~1 µs kernels, the launch-bound end of a decode step
            x = torch.zeros(1, device="cuda")
            g = capture_graph([lambda: x.add_(1.0)] * n)
        else:  # ~3.7 µs kernels (8 MB read + 8 MB write)
            x = torch.ones(4 * 2**20, device="cuda", dtype=torch.bfloat16)
            g = capture_graph([lambda: x.mul_(1.0)] * n)
        spans(g, 3)
        un = percentiles(spans(g, reps))["median"]
        with profile(activities=[ProfilerActivity.CUDA]):
            spans(g, 2)
            pr = percentiles(spans(g, max(reps // 2, 5)))["median"]
        cases[kind] = {"unprofiled_ms": un, "profiled_ms": pr, "per_kernel_us": (pr - un) * 1e3 / n,
                       "unprofiled_per_kernel_us": un * 1e3 / n}
    per = [c["per_kernel_us"] for c in cases.values()]
    return {"per_kernel_us": sum(per) / len(per), "per_kernel_us_range": [min(per), max(per)], "kernels": n,
            "applies_to": "cuda-graph kernels", "cases": cases,
            "method": f"CUDA graphs of {n} tiny and {n} medium kernels: GPU span per replay (CUDA events) under "
                      "torch.profiler (CUDA activity) minus unprofiled, per kernel; the mean of the two sizes"}


def record_engine_trace(card: str | Path | dict[str, Any], out_path: str | Path, *, steps: int = 8,
                        warmup: int = 3, timed: int = 20, mode: str = "eager", layers: int | None = None,
                        device: str = "auto", dtype: str = "auto", prompt_len: int = 32,
                        annotate: bool = True, calibrate: bool = True) -> dict[str, Any]:
    """Profile `steps` decode steps into `out_path` (.json.gz); return what ran and the unprofiled step times.

    On a GPU: the unprofiled reference (step wall, and the GPU span of its work by CUDA events) is timed
    first; then, in graph mode, the profiler's per-kernel cost (`profiler_calibration`); eager steps are
    recorded with CUDA activity only (CPU-op recording slows an eager step by 7-24%; the trace stage finds the
    steps by the kernel period). The trace carries the reference and the calibration under the top-level key
    `decode_gap_engine`, so the trace stage can compare and correct without importing this stage.
    """
    import json

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from ..timing import percentiles

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if mode == "graph" and not device.startswith("cuda"):
        raise DecodeGapError("engine trace mode 'graph' needs a CUDA GPU (CUDA-graph replay)")
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    cuda = device.startswith("cuda")
    model, cfg = build_model(card, layers, device, getattr(torch, dtype))
    total = prompt_len + warmup + timed + steps + 8
    runner = _Eager(model, prompt_len, device) if mode == "eager" else _Graph(model, prompt_len, total, device)
    for _ in range(warmup):
        runner.step()
    samples, events = [], []
    for _ in range(timed):  # unprofiled step time, for comparison with the trace (before any profiling)
        ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
        _sync(device)
        t0 = time.perf_counter()
        runner.step(ev)
        samples.append((time.perf_counter() - t0) * 1e3)
        events.append(ev)
    _sync(device)
    spans = [a.elapsed_time(b) for a, b in events] if cuda else []
    calibration = None
    if cuda and mode == "graph" and calibrate:
        try:
            calibration = profiler_calibration()
        except Exception as exc:  # the trace goes on without it; the trace stage says the correction is unavailable
            calibration = {"error": describe(exc)}
    cuda_only = cuda and mode == "eager"
    acts = [ProfilerActivity.CUDA] if cuda_only else [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    annotate = annotate and not cuda_only  # no CPU activity, no annotation events
    engine = {"mode": mode, "activities": [a.name for a in acts], "annotation": ANNOTATION if annotate else None,
              "unprofiled_step_ms": percentiles(samples),
              "unprofiled_gpu_span_ms": percentiles(spans) if spans else None,
              "profiler_calibration": calibration, "torch": torch.__version__,
              "dtype": dtype,  # the model's one dtype: names the GEMMs whose kernel names carry none (nvjet)
              "note": "unprofiled figures timed in the same process before any profiling"}
    with profile(activities=acts, record_shapes=not cuda_only) as prof:
        for _ in range(steps):
            if annotate:
                with record_function(ANNOTATION):
                    runner.step()
            else:  # no annotation: the trace stage must find the steps from the kernel sequence
                runner.step()
        _sync(device)
        prof.add_metadata_json("decode_gap_engine", json.dumps(engine, default=str))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out))  # torch gzips when the name ends in .gz
    return {"path": str(out), "mode": mode, "device": device, "dtype": dtype, "steps": steps,
            "layers": cfg.num_hidden_layers, "annotation": ANNOTATION if annotate else None,
            "activities": engine["activities"], "graph_backend": getattr(runner, "backend", None),
            "unprofiled_step_ms_median": statistics.median(samples), "unprofiled_step_ms": samples,
            "unprofiled_gpu_span_ms_median": statistics.median(spans) if spans else None,
            "profiler_calibration": calibration, "torch": torch.__version__}


def engine_trace_stage(params: dict[str, Any], trace_out: str, json_out: str) -> dict[str, Any]:
    """Rule record_engine_trace: the engine level's decode steps under torch.profiler (graph replay on a GPU).

    A model transformers cannot build here leaves an empty trace and a `skipped` summary with the reason; the
    trace stage then reports that reason, and the DAG goes on.
    """
    import gzip
    import json

    from ..io import write_json
    from ..provenance import skipped_stage

    sim = params.get("simulate") or {}
    layers = sim.get("layers")
    layers = int(layers) if isinstance(layers, int) else None
    try:
        import torch

        mode = "graph" if torch.cuda.is_available() else "eager"
        if mode == "eager" and layers is None:
            layers = 2  # a CPU host: a few layers show the step's anatomy; the figure is the trace's, not the model's
        info = record_engine_trace(params["model"], trace_out, steps=int(sim.get("engine_trace_steps", 8)),
                                   mode=mode, layers=layers)
        result = {"stage": "record_engine_trace", "status": "ok", **info}
    except Exception as exc:  # any build or capture failure is a case this host cannot run, never a crash
        why = f"engine trace not recorded: {describe(exc, REASON_CHARS)}"
        Path(trace_out).parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(trace_out, "wt") as f:
            json.dump({"traceEvents": [], "decode_gap_skipped": why}, f)
        result = skipped_stage("record_engine_trace", why)
    result["hardware_revision"] = params.get("hardware_revision")
    write_json(json_out, result)
    return result
