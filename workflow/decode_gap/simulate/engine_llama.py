"""Engine level, llama.cpp: llama-cpp-python's in-process `Llama` on the GGUF with the server's settings; its own
eval timing, and the completion loop's overhead measured without HTTP (see engine.py)."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from ..errors import DecodeGapError
from ..host import usable_cores
from ..prompts import random_words
from .engine_common import (
    EngineSettings,
    _cpu_device,
    _median,
    not_measured,
)
from .timing import spread

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
        alone_iv, co_iv, deltas, eval_deltas = [], [], [], []
        with CoRun(pace_ms=pace) as co:
            for rep in range(s.repeats):
                prompt = random_words(s.input_len, seed=7000 + rep)
                a_iv, a_ev = _completion_loop(llm, prompt, n_new, s.temperature)[:2]
                if not co.start_client():
                    break
                try:
                    c_iv, c_ev = _completion_loop(llm, prompt, n_new, s.temperature)[:2]
                finally:
                    co.stop_client()
                if a_iv and c_iv:
                    alone_iv += a_iv
                    co_iv += c_iv
                    deltas.append(_median(c_iv) - _median(a_iv))
                    # the part of the delta inside llama.cpp's eval: contention, which the live server's own
                    # eval time (live/summary.json server_eval) measures directly when it is known
                    eval_deltas.append(_median(c_ev) - _median(a_ev))
            if co.error:
                corun["why"] = co.error
        if deltas:
            corun.update(per_token_ms=_median(co_iv), alone_per_token_ms=_median(alone_iv),
                         delta_ms=_median(deltas), deltas_ms=deltas, eval_delta_ms=_median(eval_deltas),
                         intervals=spread(co_iv), pace_ms=pace,
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
