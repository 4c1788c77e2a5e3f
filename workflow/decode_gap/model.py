"""Model cards: a Hugging Face config.json turned into the shapes one GPU sees in a decode step.

Everything downstream (roofline, GEMM shapes, simulation) derives from `ModelSpec` and
`linear_layers()`, so the sharding rules live in one place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

# architecture name in config.json -> family that decides the layer layout
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "llama",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v3",
    "GlmMoeDsaForCausalLM": "deepseek_v3",
    "Gemma3ForCausalLM": "gemma3",
}


@dataclass(frozen=True)
class LinearLayer:
    """One weight matrix as a single GPU holds it after sharding: y[M, n] = x[M, k] @ W[k, n]."""

    name: str  # e.g. "attn.qkv_proj", "moe.expert.gate_up"
    group: str  # attention | mlp | shared_expert | routed_expert | router | lm_head
    n: int
    k: int
    layers: int  # how many layers hold one
    per_layer: int = 1  # copies per layer (experts)
    active_per_token: float = 1.0  # copies read per token per layer (top-k experts)
    quantizable: bool = True  # the router and the DSA indexer's head weights stay in bf16 in every format

    @property
    def params(self) -> int:
        return self.n * self.k


@dataclass(frozen=True)
class ModelSpec:
    path: str
    architecture: str
    family: str
    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tie_embeddings: bool
    # MLA (DeepSeek-V3, GLM-5)
    mla: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek sparse attention indexer (GLM-5, V3.2); 0 when absent
    index_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    # MoE
    moe_layers: int = 0
    experts: int = 0
    top_k: int = 0
    shared_experts: int = 0
    moe_intermediate: int = 0
    scoring: str = "softmax"
    # sliding-window layers (Gemma 3): count and window
    sliding_layers: int = 0
    sliding_window: int = 0
    qk_norm: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def is_moe(self) -> bool:
        return self.moe_layers > 0

    @property
    def name(self) -> str:
        return Path(self.path).stem if self.path else self.architecture


def _get(cfg: dict, key: str, path: str, default: Any = ...) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is not ...:
        return default
    raise ConfigError(f"{path}: field '{key}' is missing (needed for {cfg.get('architectures', ['?'])[0]})")


def load_model_card(path: str | Path) -> ModelSpec:
    """Parse a Hugging Face config.json. Errors name the file and the field, in one line."""
    path = str(path)
    try:
        with open(path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: model config.json not found (config key 'model')") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return spec_from_dict(cfg, path)


def spec_from_dict(cfg: dict, path: str = "<config>") -> ModelSpec:
    archs = cfg.get("architectures")
    if not archs or not isinstance(archs, list):
        raise ConfigError(f"{path}: field 'architectures' is missing")
    arch = archs[0]
    if cfg.get("text_config") and arch not in SUPPORTED_ARCHITECTURES:
        cfg = {**cfg["text_config"], "architectures": archs}
    family = SUPPORTED_ARCHITECTURES.get(arch)
    if family is None:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ConfigError(f"{path}: unknown architecture '{arch}' in field 'architectures'; supported: {supported}")

    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"):
        val = _get(cfg, key, path)
        if not isinstance(val, int) or val <= 0:
            raise ConfigError(f"{path}: field '{key}' must be a positive integer, got {val!r}")

    hidden = cfg["hidden_size"]
    layers = cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv_heads = _get(cfg, "num_key_value_heads", path, heads)
    head_dim = _get(cfg, "head_dim", path, hidden // heads)
    common = dict(
        path=path,
        architecture=arch,
        family=family,
        hidden=hidden,
        layers=layers,
        vocab=cfg["vocab_size"],
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", family == "gemma3")),
        raw=cfg,
    )

    if family == "llama":
        return ModelSpec(**common, intermediate=_get(cfg, "intermediate_size", path), qk_norm=arch.startswith("Qwen3"))

    if family == "gemma3":
        layer_types = cfg.get("layer_types")
        if layer_types:
            sliding = sum(1 for t in layer_types if t == "sliding_attention")
        else:
            pattern = cfg.get("sliding_window_pattern", 6)
            sliding = sum(1 for i in range(layers) if (i + 1) % pattern != 0)
        return ModelSpec(
            **common,
            intermediate=_get(cfg, "intermediate_size", path),
            sliding_layers=sliding,
            sliding_window=_get(cfg, "sliding_window", path, 0),
            qk_norm=True,
        )

    if family == "qwen3_moe":
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        step = cfg.get("decoder_sparse_step", 1) or 1
        experts = _get(cfg, "num_experts", path)
        moe_layers = sum(1 for i in range(layers) if i not in mlp_only and experts > 0 and (i + 1) % step == 0)
        return ModelSpec(
            **common,
            intermediate=_get(cfg, "intermediate_size", path),
            moe_layers=moe_layers,
            experts=experts,
            top_k=_get(cfg, "num_experts_per_tok", path),
            moe_intermediate=_get(cfg, "moe_intermediate_size", path),
            scoring="softmax",
            qk_norm=True,
        )

    # deepseek_v3 family: MLA + MoE with shared experts (DeepSeek-V3, GLM-5 with its DSA indexer)
    first_dense = _get(cfg, "first_k_dense_replace", path, 0)
    freq = cfg.get("moe_layer_freq", 1) or 1
    moe_layers = sum(1 for i in range(layers) if i >= first_dense and i % freq == 0)
    index_heads = cfg.get("index_n_heads", 0) or 0
    return ModelSpec(
        **common,
        intermediate=_get(cfg, "intermediate_size", path),
        mla=True,
        q_lora_rank=_get(cfg, "q_lora_rank", path, 0) or 0,
        kv_lora_rank=_get(cfg, "kv_lora_rank", path),
        qk_nope_head_dim=_get(cfg, "qk_nope_head_dim", path),
        qk_rope_head_dim=_get(cfg, "qk_rope_head_dim", path),
        v_head_dim=_get(cfg, "v_head_dim", path),
        index_heads=index_heads,
        index_head_dim=(cfg.get("index_head_dim", 0) or 0) if index_heads else 0,
        index_topk=(cfg.get("index_topk", 0) or 0) if index_heads else 0,
        moe_layers=moe_layers,
        experts=_get(cfg, "n_routed_experts", path),
        top_k=_get(cfg, "num_experts_per_tok", path),
        shared_experts=_get(cfg, "n_shared_experts", path, 0) or 0,
        moe_intermediate=_get(cfg, "moe_intermediate_size", path),
        scoring=cfg.get("scoring_func", "sigmoid"),
    )


def _shard(value: int, tp: int) -> int:
    # ceil: a dimension smaller than tp is replicated rather than vanishing (e.g. 8 KV heads at TP16)
    return max(1, -(-value // tp))


def expected_distinct_experts(experts: int, top_k: int, batch: int) -> float:
    """Expected number of distinct experts hit by `batch` tokens, each choosing top_k of `experts` uniformly."""
    if experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** batch)


def linear_layers(spec: ModelSpec, tp: int = 1, ep: int = 1, batch: int = 1) -> list[LinearLayer]:
    """Per-GPU linear layers of one decode step under tensor parallelism `tp` (and expert parallelism `ep`).

    Sharding follows SGLang/vLLM: QKV and gate/up are column-parallel, o_proj and down are row-parallel,
    MLA's low-rank A projections and the router are replicated, the lm_head is vocab-parallel.
    With ep > 1 experts are whole on their rank and the active ones spread over ep ranks.
    """
    out: list[LinearLayer] = []
    L, h = spec.layers, spec.hidden
    if spec.mla:
        heads = _shard(spec.heads, tp)
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        if spec.q_lora_rank:
            out.append(LinearLayer("attn.q_a_proj", "attention", spec.q_lora_rank, h, L))
            out.append(LinearLayer("attn.q_b_proj", "attention", heads * qk, spec.q_lora_rank, L))
        else:
            out.append(LinearLayer("attn.q_proj", "attention", heads * qk, h, L))
        out.append(
            LinearLayer("attn.kv_a_proj", "attention", spec.kv_lora_rank + spec.qk_rope_head_dim, h, L)
        )
        out.append(
            LinearLayer(
                "attn.kv_b_proj",
                "attention",
                heads * (spec.qk_nope_head_dim + spec.v_head_dim),
                spec.kv_lora_rank,
                L,
            )
        )
        out.append(LinearLayer("attn.o_proj", "attention", h, heads * spec.v_head_dim, L))
        if spec.index_heads:
            # DSA lightning indexer: replicated, small
            q_in = spec.q_lora_rank or h
            out.append(
                LinearLayer("attn.indexer.wq_b", "attention", spec.index_heads * spec.index_head_dim, q_in, L)
            )
            out.append(LinearLayer("attn.indexer.wk", "attention", spec.index_head_dim, h, L))
            out.append(LinearLayer("attn.indexer.weights_proj", "attention", spec.index_heads, h, L, quantizable=False))
    else:
        heads = _shard(spec.heads, tp)
        kv = _shard(spec.kv_heads, tp)
        out.append(LinearLayer("attn.qkv_proj", "attention", (heads + 2 * kv) * spec.head_dim, h, L))
        out.append(LinearLayer("attn.o_proj", "attention", h, heads * spec.head_dim, L))

    if spec.dense_layers:
        inter = _shard(spec.intermediate, tp)
        out.append(LinearLayer("mlp.gate_up_proj", "mlp", 2 * inter, h, spec.dense_layers))
        out.append(LinearLayer("mlp.down_proj", "mlp", h, inter, spec.dense_layers))

    if spec.is_moe:
        ml = spec.moe_layers
        out.append(LinearLayer("moe.router", "router", spec.experts, h, ml, quantizable=False))
        if spec.shared_experts:
            sh = _shard(spec.moe_intermediate * spec.shared_experts, tp)
            out.append(LinearLayer("moe.shared.gate_up_proj", "shared_expert", 2 * sh, h, ml))
            out.append(LinearLayer("moe.shared.down_proj", "shared_expert", h, sh, ml))
        if ep > 1:
            inter = spec.moe_intermediate
            per_rank = spec.experts // ep
            active = expected_distinct_experts(spec.experts, spec.top_k, batch) / ep
        else:
            inter = _shard(spec.moe_intermediate, tp)
            per_rank = spec.experts
            active = expected_distinct_experts(spec.experts, spec.top_k, batch)
        out.append(LinearLayer("moe.expert.gate_up_proj", "routed_expert", 2 * inter, h, ml, per_rank, active))
        out.append(LinearLayer("moe.expert.down_proj", "routed_expert", h, inter, ml, per_rank, active))

    out.append(LinearLayer("lm_head", "lm_head", _shard(spec.vocab, tp), h, 1))
    return out


def norm_params(spec: ModelSpec) -> int:
    """Parameters of the norm layers (RMSNorm weights), counted for the totals."""
    per_layer = 2 * spec.hidden
    if spec.mla:
        per_layer += spec.kv_lora_rank + (spec.q_lora_rank or 0)
        if spec.index_heads:
            per_layer += 2 * spec.index_head_dim  # indexer k_norm weight and bias
    if spec.family == "gemma3":
        per_layer += 2 * spec.hidden  # pre/post feedforward norms
    if spec.qk_norm and not spec.mla:
        per_layer += 2 * spec.head_dim
    return spec.layers * per_layer + spec.hidden


def parameter_counts(spec: ModelSpec) -> dict[str, int]:
    """Total and active (per token, batch 1) parameter counts of the whole model, unsharded."""
    layers = linear_layers(spec, tp=1, ep=1, batch=1)
    total = 0
    active = 0.0
    for lin in layers:
        total += lin.params * lin.layers * lin.per_layer
        active += lin.params * lin.layers * lin.active_per_token
    embed = spec.vocab * spec.hidden
    router_bias = spec.experts * spec.moe_layers if spec.family == "deepseek_v3" else 0
    extra = norm_params(spec) + router_bias
    if spec.tie_embeddings:
        # the lm_head is the embedding matrix: counted once in the total, read once per token
        total += extra
        active += extra
    else:
        total += embed + extra
        active += extra + spec.hidden  # one embedding row
    return {"params_total": int(total), "params_active": int(round(active)), "params_embedding": embed}
