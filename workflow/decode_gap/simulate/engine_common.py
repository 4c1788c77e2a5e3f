"""Engine level: settings, the engines not measured in-process, and helpers shared by the llama.cpp and
transformers measurements (see engine.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import schema_defaults
from ..settings import LiveSettings
from .timing import spread

_SIM = schema_defaults("simulate")

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
    """The engine level's run; the defaults of config keys are the schema's (the prompt shape is the live
    section's, parsed once in the core: `LiveSettings`)."""

    engine: str = "auto"
    model_card: str = ""
    gguf: str = ""
    weight_format: str = "bf16"
    input_len: int = LiveSettings.input_len
    max_tokens: int = LiveSettings.max_tokens
    repeats: int = _SIM["engine_repeats"]
    warmup: int = 1
    threads: int = LiveSettings.threads
    n_ctx: int = 2048
    device: str = "auto"
    memory_fraction: float = _SIM["memory_fraction"]
    compile: bool = _SIM["engine_compile"]
    temperature: float = 0.0
    corun: bool = True
    notes: list[str] = field(default_factory=list)




def _per_token(stamps_ns: list[int]) -> list[float]:
    return [(b - a) / 1e6 for a, b in zip(stamps_ns, stamps_ns[1:])]


def _pool(runs: list[list[float]]) -> list[float]:
    return [x for r in runs for x in r]


def _cpu_device() -> str:
    from ..host import cpu_model

    return f"cpu: {cpu_model()}"



def _median(samples: list[float]) -> float | None:
    return spread(samples)["median_ms"]



def not_measured(engine: str, why: str, **extra: Any) -> dict[str, Any]:
    return {
        "stage": "simulate_engine", "status": "skipped", "reason": f"engine level not measured: {why}",
        "engine": engine, "eager_ms": None, "graph_ms": None, "serving_ms": None,
        "graph_reason": why, "skipped": [{"case": f"engine level ({engine})", "reason": why}],
        "provenance": {"eager_ms": f"unavailable: {why}", "graph_ms": f"unavailable: {why}"}, **extra,
    }
