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

Modules: engine_llama.py (llama.cpp), engine_hf.py (transformers), engine_common.py (settings and shared
helpers), engine_trace.py (a profiler trace of one step); this one picks the engine and is the entry point.
"""

from __future__ import annotations

from typing import Any

from .engine_common import (  # noqa: F401 - re-exported
    NOT_MEASURED,
    EngineSettings,
    not_measured,
)
from .engine_hf import measure_transformers
from .engine_llama import measure_llama_cpp


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


def simulate_engine(s: EngineSettings) -> dict[str, Any]:
    if s.engine == "none":
        return not_measured("none", "disabled by simulate.engine: none")
    if s.engine == "llama.cpp":
        return measure_llama_cpp(s)
    if s.engine == "transformers":
        return measure_transformers(s)
    return not_measured(s.engine, NOT_MEASURED.get(s.engine, NOT_MEASURED["other"]))
