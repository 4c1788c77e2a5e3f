"""Walk every causal-LM architecture the installed transformers maps: a small config of each (the family's
defaults with 4 decoder layers), built through decode-gap's own path (AutoConfig, meta device), then the roofline
at TP2, the micro-benchmark shapes and the kernel-level step shapes. Used by tests/test_model_walk.py and
benchmarks/model_walk.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LAYERS = 4


def small_config(model_type: str, shrink: bool = True) -> dict[str, Any]:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type)
    d = cfg.to_dict()
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    target = d
    if text is not cfg:
        key = next((k for k, v in d.items() if isinstance(v, dict) and v.get("model_type") == text.model_type), None)
        if key is None:
            key = "text_config" if isinstance(d.get("text_config"), dict) else None
        target = d[key] if key else d
    amap = getattr(type(text), "attribute_map", {}) or {}
    layers_key = amap.get("num_hidden_layers", "num_hidden_layers")
    if shrink and isinstance(target.get(layers_key), int) and target[layers_key] > LAYERS:
        target[layers_key] = LAYERS
        for k in ("layer_types", "mlp_layer_types", "layers_block_type", "hybrid_override_pattern"):
            v = target.get(k)
            if isinstance(v, list):
                target[k] = v[:LAYERS]
            elif isinstance(v, str) and k == "hybrid_override_pattern":
                target[k] = v[:LAYERS]
    d["model_type"] = model_type
    d.setdefault("architectures", None)
    if not d["architectures"]:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        d["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return d


def walk_one(model_type: str) -> dict[str, Any]:
    from decode_gap.errors import ConfigError
    from decode_gap.hardware import resolve_hardware
    from decode_gap.microbench import shapes as mshapes
    from decode_gap.model import parameter_counts, spec_from_dict
    from decode_gap.roofline import compute_roofline
    from decode_gap.simulate.shapes import step_shapes

    t0 = time.perf_counter()
    row: dict[str, Any] = {"model_type": model_type}
    try:
        d = small_config(model_type)
    except Exception as exc:  # the family's own defaults do not make a config: transformers' reason
        row.update(status="no-config", why=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return row
    try:
        spec = spec_from_dict(d, f"<{model_type}>")
        row["layers"] = f"{LAYERS} (shrunk)"
    except ConfigError:
        # some families validate per-layer lists against the layer count: their defaults, unshrunk
        try:
            spec = spec_from_dict(small_config(model_type, shrink=False), f"<{model_type}>")
            row["layers"] = "family default"
        except ConfigError as exc:
            row.update(status="no-build", why=str(exc))
            return row
    counts = parameter_counts(spec)
    hw = resolve_hardware("h200", REPO / "config" / "hardware")
    r = compute_roofline(spec, hw, "bf16", tp=2, context_len=64)
    gs = mshapes.gemm_shapes(spec, tp=2)
    mshapes.attention_shape(spec, tp=2)
    mshapes.moe_shape(spec, tp=2)
    sh = step_shapes(spec, tp=2)
    row.update(
        status="ok", model_class=spec.model_class, params_total=counts["params_total"],
        transformers_count=spec.transformers_count, params_active=counts["params_active"],
        kinds=sorted({a.kind for a in spec.attention}), kv_unavailable=r["kv_unavailable_layers"],
        gemms=len(gs), layer_kinds=sorted(set(sh.layer_kinds)), t_comm_floor_ms=r["t_comm_floor_ms"],
        roles=sorted({w.role for w in spec.weights}), seconds=time.perf_counter() - t0,
    )
    return row


def walk_all() -> list[dict[str, Any]]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return [walk_one(mt) for mt in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)]


# Scaled-down configs of the families the issue names (every size small; the fields each family's code reads)
_BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2,
         "pad_token_id": 0, "tie_word_embeddings": False}
FAMILIES: dict[str, dict[str, Any]] = {
    "mixtral": {**_BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "deepseek_v2": {**_BASE, "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                    "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": None, "qk_nope_head_dim": 16,
                    "qk_rope_head_dim": 8, "v_head_dim": 16, "first_k_dense_replace": 1, "n_routed_experts": 8,
                    "num_experts_per_tok": 2, "n_shared_experts": 2, "moe_intermediate_size": 32,
                    "n_group": 1, "topk_group": 1},
    "gpt_oss": {**_BASE, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "intermediate_size": 64,
                "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"] * 2},
    "llama4": {**_BASE, "architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "num_local_experts": 4,
               "num_experts_per_tok": 1, "intermediate_size_mlp": 256, "interleave_moe_layer_step": 2,
               "attention_chunk_size": 8},
    "gemma2": {**_BASE, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "sliding_window": 8,
               "tie_word_embeddings": True},
    "phi3": {**_BASE, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "num_key_value_heads": 4,
             "sliding_window": 16},
    "qwen3_next": {**_BASE, "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "num_experts": 4,
                   "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
                   "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
                   "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "full_attention_interval": 4},
    "olmoe": {**_BASE, "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "num_experts": 4,
              "num_experts_per_tok": 2},
}
