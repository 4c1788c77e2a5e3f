"""Engine level: the forward step of the engine the server runs, timed in-process on the same model.

- transformers (`transformers serve` and other transformers-based servers): the architecture's own
  implementation, built from the model card (config.json) with random weights (`AutoModelForCausalLM.from_config`).
  Decoding runs `generate` with a per-token timestamping streamer, the loop such servers run: eagerly with the
  dynamic KV cache, and with a static cache, which `generate` compiles (torch.compile "reduce-overhead", i.e. CUDA
  graphs) on a GPU. A model that does not fit runs with fewer layers at two depths and is extrapolated linearly
  (modelled, recorded). The bare forward step (no generate loop) is recorded too.
- llama.cpp (the embedded llama-cpp-python server, or any llama.cpp server on the same GGUF): llama-cpp-python's
  in-process `Llama` on the GGUF with the server's settings (n_ctx, n_threads = cores). The engine figure is
  llama.cpp's own eval timing (`llama_perf_context`: t_eval_ms / n_eval). The same object then runs the server's
  completion loop (`create_completion(stream=True)` with the server's request defaults, temperature 0 as the live
  stage sends): its per-token interval minus llama.cpp's eval time during that loop is the completion-loop
  overhead (sampling over the vocabulary, detokenisation, chunk building), measured without any HTTP.
- SGLang, vLLM, TGI and others: not measured (their forward needs the engine's own runtime; ingesting their
  profiler traces comes later), with the reason.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DecodeGapError
from ..prompts import random_words
from .timing import spread

NOT_MEASURED = {
    "sglang": "SGLang's forward runs inside its own scheduler and model runner (CUDA graphs, custom kernels); "
              "timing it in-process needs the SGLang runtime. Ingesting its profiler trace comes later",
    "vllm": "vLLM's forward runs inside its engine core and model runner (CUDA graphs, custom kernels); timing it "
            "in-process needs the vLLM runtime. Ingesting its profiler trace comes later",
    "tgi": "TGI's forward runs in its Rust router + Python shard; timing it in-process needs the TGI runtime",
    "other": "no in-process model of this engine",
    "unknown": "the engine behind the endpoint is unknown at simulation time; set simulate.engine or live.engine",
}


@dataclass
class EngineSettings:
    engine: str = "auto"
    model_card: str = ""
    gguf: str = ""
    weight_format: str = "bf16"
    input_len: int = 32
    max_tokens: int = 64
    repeats: int = 3
    warmup: int = 1
    threads: int = 0
    n_ctx: int = 2048
    device: str = "auto"
    memory_fraction: float = 0.8
    compile: bool = True
    temperature: float = 0.0
    corun: bool = True
    notes: list[str] = field(default_factory=list)


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def resolve_engine(config: dict[str, Any]) -> tuple[str, str]:
    """(engine, why) from simulate.engine, the embedded server, live.engine and the weight format."""
    configured = (config.get("simulate") or {}).get("engine", "auto") or "auto"
    if configured != "auto":
        return configured, "config simulate.engine"
    if not config.get("endpoint"):
        return "llama.cpp", "the embedded server is llama-cpp-python (llama.cpp)"
    live_engine = (config.get("live") or {}).get("engine", "auto") or "auto"
    if live_engine != "auto":
        return live_engine, "config live.engine"
    if str(config.get("weight_format", "")).startswith("gguf"):
        return "llama.cpp", "a GGUF weight format is served by llama.cpp"
    return "unknown", "endpoint set, simulate.engine and live.engine are auto"


def _per_token(stamps_ns: list[int]) -> list[float]:
    return [(b - a) / 1e6 for a, b in zip(stamps_ns, stamps_ns[1:])]


def _pool(runs: list[list[float]]) -> list[float]:
    return [x for r in runs for x in r]


# ----------------------------------------------------------------------------------------------------------
# llama.cpp


def _llama_perf(llm) -> dict[str, float]:
    import llama_cpp

    d = llama_cpp.llama_perf_context(llm.ctx)
    return {"t_eval_ms": float(d.t_eval_ms), "n_eval": int(d.n_eval), "t_p_eval_ms": float(d.t_p_eval_ms),
            "n_p_eval": int(d.n_p_eval)}


def _llama_reset_perf(llm) -> None:
    import llama_cpp

    llama_cpp.llama_perf_context_reset(llm.ctx)


def _server_request_kwargs(prompt: str, max_tokens: int, temperature: float) -> tuple[dict[str, Any], str]:
    """The kwargs llama-cpp-python's server passes to create_completion for the live stage's request body."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "stream": True}
    try:
        from llama_cpp.server.types import CreateCompletionRequest

        req = CreateCompletionRequest(**body)
        kwargs = req.model_dump(exclude={"n", "best_of", "logit_bias_type", "user", "min_tokens"})
        kwargs.pop("model", None)
        return kwargs, "llama_cpp.server.types.CreateCompletionRequest defaults (as the server builds them)"
    except Exception:
        return body, "create_completion defaults (llama_cpp.server not importable)"


def _server_llama(gguf: str, n_ctx: int, threads: int):
    """The Llama object built the way llama-cpp-python's server builds it (its ModelSettings defaults, e.g.
    logits_all=True), with the embedded server's n_ctx and threads; a plain Llama when the server is absent."""
    from llama_cpp import Llama

    try:
        from llama_cpp.server.model import LlamaProxy
        from llama_cpp.server.settings import ModelSettings

        settings = ModelSettings(model=gguf, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
        return (LlamaProxy.load_llama_from_model_settings(settings),
                "llama_cpp.server ModelSettings (as the server loads it)")
    except ImportError:
        return (Llama(model_path=gguf, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False),
                "Llama() defaults (llama_cpp.server not importable)")


def _completion_loop(llm, prompt: str, n_new: int, temperature: float):
    """One create_completion(stream=True) as the server runs it: per token, the interval between chunks, llama.cpp's
    eval time inside it and their difference; plus the tokens generated."""
    llm.reset()
    kwargs, kwargs_src = _server_request_kwargs(prompt, n_new, temperature)
    _llama_reset_perf(llm)
    intervals, evals, overheads = [], [], []
    last_t, prev, n_tok = None, None, 0
    for _chunk in llm.create_completion(**kwargs):
        t = time.perf_counter_ns()
        cur = _llama_perf(llm)
        if last_t is not None:
            dn = cur["n_eval"] - prev["n_eval"]
            if dn > 0:
                dt = (t - last_t) / 1e6
                de = cur["t_eval_ms"] - prev["t_eval_ms"]
                intervals.append(dt / dn)
                evals.append(de / dn)
                overheads.append((dt - de) / dn)
                n_tok += dn
        last_t, prev = t, cur
    return intervals, evals, overheads, n_tok + 1, kwargs_src


def measure_llama_cpp(s: EngineSettings) -> dict[str, Any]:
    try:
        import llama_cpp
    except ImportError as exc:
        return not_measured("llama.cpp", f"llama-cpp-python is not importable ({exc}); install llama-cpp-python")
    gguf = Path(s.gguf)
    if not gguf.is_file():
        raise DecodeGapError(f"simulate_engine: GGUF {gguf} does not exist (config key 'gguf_path')")
    threads = s.threads if s.threads and s.threads > 0 else usable_cores()
    llm, how = _server_llama(str(gguf), s.n_ctx, threads)
    eval_wall: list[float] = []  # wall time per single-token decode (with the sync)
    eval_own: list[float] = []  # llama.cpp's own eval time per token
    loop_interval: list[float] = []  # completion loop: wall time per token between chunks
    loop_eval: list[float] = []  # llama.cpp's eval time per token inside those intervals
    loop_overhead: list[float] = []  # interval minus eval, per token
    loop_tokens: list[int] = []
    prefill_ms: list[float] = []
    kwargs_src = ""
    n_new = max(2, s.max_tokens)
    for rep in range(s.warmup + s.repeats):
        timed = rep >= s.warmup
        prompt = random_words(s.input_len, seed=5000 + rep)
        tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True)
        # (1) the engine step: llama_decode of one token at a time, timed by llama.cpp itself
        llm.reset()
        _llama_reset_perf(llm)
        llm.eval(tokens)
        llama_cpp.llama_synchronize(llm.ctx)  # llama.cpp books its timings when results are fetched
        prev = _llama_perf(llm)
        if timed:
            prefill_ms.append(prev["t_p_eval_ms"])
        tok = tokens[-1]
        for _ in range(n_new - 1):
            t0 = time.perf_counter_ns()
            llm.eval([tok])
            llama_cpp.llama_synchronize(llm.ctx)
            t1 = time.perf_counter_ns()
            cur = _llama_perf(llm)
            if timed and cur["n_eval"] > prev["n_eval"]:
                eval_wall.append((t1 - t0) / 1e6)
                eval_own.append((cur["t_eval_ms"] - prev["t_eval_ms"]) / (cur["n_eval"] - prev["n_eval"]))
            prev = cur
        # (2) the server's completion loop, in-process: eval + sampling + detokenise + chunk dicts
        iv, ev, ov, n_tok, kwargs_src = _completion_loop(llm, prompt, n_new, s.temperature)
        if timed:
            loop_interval += iv
            loop_eval += ev
            loop_overhead += ov
            loop_tokens.append(n_tok)
    # (3) the same loop with and without a paced loopback SSE stream + client sharing the host, alternating so
    # that both halves of each pair see the same background (no live server involved)
    corun: dict[str, Any] = {"per_token_ms": None}
    if s.corun and loop_interval:
        from .server import CoRun

        pace = _median(loop_interval)
        alone_iv, co_iv, deltas = [], [], []
        with CoRun(pace_ms=pace) as co:
            for rep in range(s.repeats):
                prompt = random_words(s.input_len, seed=7000 + rep)
                a_iv = _completion_loop(llm, prompt, n_new, s.temperature)[0]
                if not co.start_client():
                    break
                try:
                    c_iv = _completion_loop(llm, prompt, n_new, s.temperature)[0]
                finally:
                    co.stop_client()
                if a_iv and c_iv:
                    alone_iv += a_iv
                    co_iv += c_iv
                    deltas.append(_median(c_iv) - _median(a_iv))
            if co.error:
                corun["why"] = co.error
        if deltas:
            corun.update(per_token_ms=_median(co_iv), alone_per_token_ms=_median(alone_iv),
                         delta_ms=_median(deltas), deltas_ms=deltas, intervals=spread(co_iv), pace_ms=pace,
                         stack=co.stack_description,
                         source="completion loop with a loopback SSE server (no model) streaming one chunk per "
                                "engine step to a streaming client on the same host, minus the same loop without "
                                "them, in alternating pairs (median of the pair differences)")
    del llm
    gc.collect()
    eval_ms = _median(eval_own)
    loop_ms = _median(loop_interval)
    loop_eval_ms = _median(loop_eval)
    overhead = _median(loop_overhead)
    return {
        "stage": "simulate_engine",
        "status": "ok",
        "engine": "llama.cpp",
        "device": _cpu_device(),
        "backend": f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')} (ggml CPU), n_threads={threads}",
        "loaded_with": how,
        "model": str(gguf),
        "weight_format": s.weight_format,
        "format_match": True,
        "eager_ms": eval_ms,
        "graph_ms": None,
        "graph_reason": "llama.cpp's CPU backend has no graph mode to compare (its CUDA backend captures CUDA "
                        "graphs itself)",
        "serving_ms": eval_ms,
        "serving_mode": "eager",
        "step": {"own_timing": spread(eval_own), "wall": spread(eval_wall),
                 "source": "llama_perf_context t_eval_ms per single-token llama_decode (difference per step)"},
        "prefill_ms": (sum(prefill_ms) / len(prefill_ms)) if prefill_ms else None,
        "loop": {
            "per_token_ms": loop_ms,
            "eval_ms": loop_eval_ms,
            "overhead_ms": overhead,
            "intervals": spread(loop_interval),
            "overhead": spread(loop_overhead),
            "tokens_per_run": loop_tokens,
            "request": kwargs_src,
            "source": "Llama.create_completion(stream=True): per token, the interval between chunks minus "
                      "llama.cpp's own eval time inside it (medians)",
        },
        "corun": corun,
        "cpu_saturated": threads >= usable_cores(),
        "threads": threads,
        "cores": usable_cores(),
        "settings": {"input_len": s.input_len, "max_tokens": n_new, "repeats": s.repeats, "warmup": s.warmup,
                     "n_ctx": s.n_ctx, "temperature": s.temperature},
        "skipped": [{"case": "graph", "reason": "llama.cpp CPU backend: no graph mode"}],
        "provenance": {"eager_ms": "measured: median of llama.cpp's own eval time per token (llama_perf_context)",
                       "graph_ms": "unavailable: llama.cpp CPU backend has no graph mode",
                       "loop.overhead_ms": "measured: in-process completion loop minus llama.cpp eval"},
        "notes": list(s.notes),
    }


def _cpu_device() -> str:
    from ..host import cpu_model

    return f"cpu: {cpu_model()}"


# ----------------------------------------------------------------------------------------------------------
# transformers


class _Stamps:
    """A transformers streamer that only timestamps each new token (generate calls put() once for the prompt)."""

    def __init__(self) -> None:
        self.stamps: list[int] = []
        self.calls = 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls > 1:  # the first put is the prompt
            self.stamps.append(time.perf_counter_ns())

    def end(self) -> None:
        pass


def _hf_config(card: str, layers: int | None):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(card)
    if hasattr(cfg, "quantization_config"):
        try:
            delattr(cfg, "quantization_config")
        except AttributeError:
            cfg.quantization_config = None
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    if layers is not None and layers < text.num_hidden_layers:
        full = text.num_hidden_layers
        text.num_hidden_layers = layers
        lt = getattr(text, "layer_types", None)
        if lt:
            text.layer_types = list(lt)[:layers]
        for key in ("first_k_dense_replace",):
            if getattr(text, key, None) and getattr(text, key) >= layers:
                setattr(text, key, max(0, min(getattr(text, key), layers - 1)))
        if getattr(text, "mlp_only_layers", None):
            text.mlp_only_layers = [i for i in text.mlp_only_layers if i < layers]
        del full
    return cfg


def _param_bytes(card: str, dtype) -> tuple[int, int, int]:
    """(total bytes, bytes per decoder layer, layers) of the model built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = _hf_config(card, None)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    esize = torch.tensor([], dtype=dtype).element_size()
    total = sum(p.numel() for p in m.parameters()) * esize
    layers = cfg.get_text_config().num_hidden_layers
    layer_params = {}
    for name, p in m.named_parameters():
        parts = name.split(".")
        if "layers" in parts:
            i = int(parts[parts.index("layers") + 1])
            layer_params[i] = layer_params.get(i, 0) + p.numel()
    per_layer = max(layer_params.values()) * esize if layer_params else total
    return total, per_layer, layers


def _generate_runs(model, s: EngineSettings, device: str, static: bool) -> tuple[list[list[float]], dict]:
    import torch

    vocab = model.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(0)
    runs, info = [], {}
    n_new = max(2, s.max_tokens)
    for rep in range(s.warmup + s.repeats + (1 if static else 0)):  # a static cache compiles on its first run
        ids = torch.randint(3, vocab, (1, s.input_len), generator=g).to(device)
        st = _Stamps()
        kw = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, streamer=st,
                  attention_mask=torch.ones_like(ids), pad_token_id=0)
        if static:
            kw["cache_implementation"] = "static"
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, **kw)
        if rep == 0:
            info["first_run_s"] = time.perf_counter() - t0
        if rep >= s.warmup + (1 if static else 0):
            runs.append(_per_token(st.stamps))
    return runs, info


def _forward_runs(model, s: EngineSettings, device: str) -> list[list[float]]:
    """The bare decode step: model forward with a dynamic cache + argmax, synchronised per token."""
    import torch
    from transformers import DynamicCache

    import inspect

    vocab = model.config.get_text_config().vocab_size
    # transformers 5.x renames the forward's past_key_values to cache
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    runs = []
    for rep in range(s.warmup + s.repeats):
        ids = torch.randint(3, vocab, (1, s.input_len)).to(device)
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            out = model(input_ids=ids, use_cache=True, **{key: cache})
            tok = out.logits[:, -1:].argmax(-1)
            stamps = [time.perf_counter_ns()]
            for _ in range(max(2, s.max_tokens) - 1):
                out = model(input_ids=tok, use_cache=True, **{key: cache})
                tok = out.logits[:, -1:].argmax(-1)
                tok.cpu()  # the server needs the token on the host every step
                stamps.append(time.perf_counter_ns())
        if rep >= s.warmup:
            runs.append(_per_token(stamps))
    return runs


def _median(samples: list[float]) -> float | None:
    return spread(samples)["median_ms"]


def _measure_transformers_model(s: EngineSettings, device: str, dtype, layers: int | None) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = _hf_config(s.model_card, layers)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    out: dict[str, Any] = {"class": type(model).__name__,
                           "layers": cfg.get_text_config().num_hidden_layers}
    eager_runs, _ = _generate_runs(model, s, device, static=False)
    out["eager"] = spread(_pool(eager_runs))
    out["forward"] = spread(_pool(_forward_runs(model, s, device)))
    out["graph"] = None
    if not device.startswith("cuda"):
        out["graph_reason"] = "CUDA graphs (static cache + torch.compile reduce-overhead) need a GPU"
    elif not s.compile:
        out["graph_reason"] = "disabled by simulate.engine_compile: false"
    elif not getattr(model, "_can_compile_fullgraph", True) and not getattr(model, "_supports_static_cache", True):
        out["graph_reason"] = f"{type(model).__name__} does not support a static cache"
    else:
        try:
            runs, info = _generate_runs(model, s, device, static=True)
            out["graph"] = spread(_pool(runs))
            out["graph_compile_s"] = info.get("first_run_s")
        except Exception as exc:
            out["graph_reason"] = f"static cache + compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    del model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def measure_transformers(s: EngineSettings) -> dict[str, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        return not_measured("transformers", f"transformers is not importable ({exc})")
    if not s.model_card or not Path(s.model_card).is_file():
        raise DecodeGapError(f"simulate_engine: model card {s.model_card!r} not found (config key 'model')")
    on_gpu = torch.cuda.is_available() and s.device != "cpu"
    device = "cuda:0" if on_gpu else "cpu"
    if s.weight_format == "bf16" or on_gpu:
        dtype = torch.bfloat16
    else:
        dtype = torch.float32
    fmt_match = s.weight_format == "bf16"
    stand_in = "" if fmt_match else (
        f"{s.weight_format} weights: transformers runs {str(dtype).replace('torch.', '')} weights here "
        f"(from_config builds unquantised layers)")
    total, per_layer, layers = _param_bytes(s.model_card, dtype)
    if on_gpu:
        free, _ = torch.cuda.mem_get_info()
        budget = free * s.memory_fraction - 2 * 1024**3
    else:
        import psutil

        budget = psutil.virtual_memory().available * 0.4
    depths: list[int | None]
    extrapolated = None
    if total <= budget:
        depths = [None]
    else:
        fit = int((budget - (total - per_layer * layers)) // per_layer)
        if fit < 2:
            return not_measured("transformers", f"{Path(s.model_card).name} does not fit on {device} even with 2 "
                                                f"layers ({total / 1e9:.1f} GB at full depth)", device=device)
        hi = min(fit, layers)
        lo = max(1, hi // 2)
        depths = [lo, hi]
        extrapolated = {"depths": [lo, hi], "layers": layers}
    results = [_measure_transformers_model(s, device, dtype, d) for d in depths]

    def at_depth(key: str, field: str = "median_ms") -> float | None:
        vals = [(r[key] or {}).get(field) if r.get(key) else None for r in results]
        if any(v is None for v in vals):
            return None
        if extrapolated is None:
            return vals[0]
        (lo, hi), (a, b) = extrapolated["depths"], vals
        slope = (b - a) / (hi - lo)
        return b + slope * (layers - hi)

    eager_ms, graph_ms, forward_ms = at_depth("eager"), at_depth("graph"), at_depth("forward")
    last = results[-1]
    graph_reason = last.get("graph_reason")
    dev_name = torch.cuda.get_device_name(0) if on_gpu else _cpu_device()
    prov_kind = "modelled: linear extrapolation in layers from " + \
        f"{extrapolated['depths']} of {layers} layers" if extrapolated else "measured"
    res = {
        "stage": "simulate_engine",
        "status": "ok",
        "engine": "transformers",
        "device": dev_name,
        "backend": f"transformers {transformers.__version__}, torch {torch.__version__}, {last['class']}, "
                   f"{str(dtype).replace('torch.', '')}, sdpa",
        "model": s.model_card,
        "weight_format": s.weight_format,
        "format_match": fmt_match,
        "stand_in": stand_in,
        "eager_ms": eager_ms,
        "graph_ms": graph_ms,
        "graph_reason": graph_reason if graph_ms is None else None,
        "serving_ms": eager_ms,
        "serving_mode": "eager",
        "forward_ms": forward_ms,
        "generate_overhead_ms": (eager_ms - forward_ms) if (eager_ms is not None and forward_ms is not None) else None,
        "runs": results,
        "extrapolated": extrapolated,
        "loop": {"per_token_ms": eager_ms, "eval_ms": eager_ms, "overhead_ms": 0.0,
                 "source": "transformers servers run generate() itself; its per-token time is the engine figure"},
        "cpu_saturated": not on_gpu,
        "threads": torch.get_num_threads(),
        "cores": usable_cores(),
        "settings": {"input_len": s.input_len, "max_tokens": max(2, s.max_tokens), "repeats": s.repeats,
                     "warmup": s.warmup, "compile": s.compile},
        "skipped": ([{"case": "static cache + compile", "reason": graph_reason}] if graph_ms is None else []) +
                   ([{"case": f"{s.weight_format} weights", "reason": stand_in}] if stand_in else []),
        "provenance": {
            "eager_ms": f"{prov_kind}: generate() per-token interval (streamer timestamps), dynamic cache",
            "graph_ms": (f"{prov_kind}: generate() with cache_implementation='static' (auto torch.compile, "
                         "reduce-overhead CUDA graphs)" if graph_ms is not None else f"unavailable: {graph_reason}"),
        },
        "notes": list(s.notes) + ["transformers serve runs generate() eagerly unless configured otherwise"],
    }
    return res


# ----------------------------------------------------------------------------------------------------------


def not_measured(engine: str, why: str, **extra: Any) -> dict[str, Any]:
    return {
        "stage": "simulate_engine", "status": "skipped", "reason": f"engine level not measured: {why}",
        "engine": engine, "eager_ms": None, "graph_ms": None, "serving_ms": None,
        "graph_reason": why, "skipped": [{"case": f"engine level ({engine})", "reason": why}],
        "provenance": {"eager_ms": f"unavailable: {why}", "graph_ms": f"unavailable: {why}"}, **extra,
    }


def simulate_engine(s: EngineSettings) -> dict[str, Any]:
    if s.engine == "none":
        return not_measured("none", "disabled by simulate.engine: none")
    if s.engine == "llama.cpp":
        return measure_llama_cpp(s)
    if s.engine == "transformers":
        return measure_transformers(s)
    return not_measured(s.engine, NOT_MEASURED.get(s.engine, NOT_MEASURED["other"]))
