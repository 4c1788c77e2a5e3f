"""Engine level, transformers: the architecture's own implementation from the model card with random weights,
`generate` eager and with a compiled static cache, and the bare forward step (see engine.py)."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from ..errors import DecodeGapError, REASON_CHARS, describe
from ..host import usable_cores
from .engine_common import (
    EngineSettings,
    _cpu_device,
    _per_token,
    _pool,
    not_measured,
)
from .timing import spread

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
    import inspect

    import torch
    from transformers import DynamicCache

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
            out["graph_reason"] = f"static cache + compile failed: {describe(exc, REASON_CHARS)}"
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
