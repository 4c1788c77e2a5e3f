"""KV cache (and fixed recurrent state) per token, per layer, for every attention kind, from the fields
transformers itself uses (`layer_types`, `sliding_window`, `attention_chunk_size`, MLA ranks, linear-attention
head sizes) and the layer's own projections in the meta-device graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .graph import Graph, safe_attr

# layer_types values transformers uses -> our kind
_TYPE_KIND = {
    "full_attention": "full",
    "attention": "full",
    "global_attention": "full",
    "sliding_attention": "sliding",
    "local_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
    "mamba": "linear",
    "mamba2": "linear",
}


@dataclass(frozen=True)
class LayerAttention:
    """One decoder layer's attention as the KV cache sees it (unsharded)."""

    index: int
    kind: str  # full | sliding | chunked | mla | linear | none | unknown
    kv_per_token: int = 0  # cache elements one token adds to this layer (K+V, or MLA latent + rope key)
    window: int = 0  # sliding/chunked: the most tokens kept (0: uncapped)
    kv_heads: int = 0  # the shard unit under TP (GQA: KV heads; MLA: 0, every rank holds the whole latent)
    state: int = 0  # linear attention / SSM: fixed per-sequence state elements (recurrent + conv)
    state_heads: int = 0  # the shard unit of the state under TP
    indexer_dim: int = 0  # DSA lightning-indexer key per token (FP8), 0 when absent
    index_topk: int = 0
    why: str = ""  # unknown kinds: what is missing


def _cfg(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = safe_attr(cfg, n)
        if v is not None:
            return v
    return default


def _state_layer(cfg: Any, i: int, lin: dict[str, int], others: dict[str, tuple[int, ...]]) -> LayerAttention:
    """Fixed-size state of a linear-attention or SSM layer: recurrent state plus the causal-conv window."""
    conv = next((s for n, s in others.items() if n.endswith("conv1d.weight") and len(s) == 3), None)
    conv_state = conv[0] * (conv[2] - 1) if conv else 0
    vh = _cfg(cfg, "linear_num_value_heads")
    if vh:  # Gated DeltaNet (Qwen3-Next): S is [v_heads, k_head_dim, v_head_dim]
        kd, vd = _cfg(cfg, "linear_key_head_dim"), _cfg(cfg, "linear_value_head_dim")
        if kd and vd:
            return LayerAttention(i, "linear", state=vh * kd * vd + conv_state, state_heads=vh)
    lac = _cfg(cfg, "linear_attn_config")
    lac = lac if isinstance(lac, dict) else {}
    nh = lac.get("num_heads") or _cfg(cfg, "linear_num_heads")
    hd = lac.get("head_dim") or _cfg(cfg, "linear_head_dim")
    if nh and hd:  # Kimi Delta Attention: S is [heads, head_dim, head_dim]
        return LayerAttention(i, "linear", state=nh * hd * hd + conv_state, state_heads=nh)
    a_log = next((s for n, s in others.items() if n.endswith("A_log")), None)
    if a_log is not None and len(a_log) == 2:  # Mamba-1: h is [d_inner, d_state], A_log has that shape
        return LayerAttention(i, "linear", state=a_log[0] * a_log[1] + conv_state, state_heads=a_log[0])
    ds = _cfg(cfg, "mamba_d_state", "ssm_state_size", "state_size", "mamba_ssm_state_size")
    out_in = next((s[1] for n, s in others.items() if n.endswith("out_proj.weight") and len(s) == 2), None)
    if a_log is not None and len(a_log) == 1 and ds and out_in:
        # Mamba-2: h is [heads, head_dim, d_state] = d_inner x d_state; d_inner is out_proj's input width
        return LayerAttention(i, "linear", state=out_in * ds + conv_state, state_heads=a_log[0])
    heads = _cfg(cfg, "num_attention_heads") or 0
    hd = _cfg(cfg, "head_dim") or ((_cfg(cfg, "hidden_size") or 0) // heads if heads else 0)
    if a_log is None and any(k.startswith("attn.qkv_proj:") for k in lin) and heads and hd:
        # plain linear attention (e.g. MiniMax lightning attention): S = sum k v^T, head_dim x head_dim per head
        return LayerAttention(i, "linear", state=heads * hd * hd + conv_state, state_heads=heads)
    return LayerAttention(i, "unknown", why=f"layer {i}: a recurrent/linear-attention layer whose state size "
                                               "this code does not know")


def layer_attention(graph: Graph) -> tuple[LayerAttention, ...]:
    cfg = graph.config
    L = graph.layers
    types = safe_attr(cfg, "layer_types")
    types = list(types) if types and len(types) == L else None
    heads = _cfg(cfg, "num_attention_heads", default=0) or 0
    kv_heads = _cfg(cfg, "num_key_value_heads", default=heads) or heads
    head_dim = _cfg(cfg, "head_dim", default=None) or (((safe_attr(cfg, "hidden_size") or 0) // heads) if heads else 0)
    window = _cfg(cfg, "sliding_window", default=0) or 0
    all_sliding = types is None and window and _cfg(cfg, "use_sliding_window", default=True) is not False
    chunk = _cfg(cfg, "attention_chunk_size", default=0) or 0
    by_layer: dict[int, dict[str, int]] = {}
    others: dict[int, dict[str, tuple[int, ...]]] = {}
    for w in graph.weights:
        if w.layer is None or w.block != "attention":
            continue
        if w.linear:
            by_layer.setdefault(w.layer, {})[f"{w.linear}:{w.part.lower()}"] = w.n
        others.setdefault(w.layer, {})[w.name] = w.shape
    out = []
    for i in range(L):
        lin = by_layer.get(i, {})
        t = types[i] if types else None
        kind = _TYPE_KIND.get(t, "unknown") if t else None
        names = {k.split(":")[0] for k in lin}
        if any(n.endswith(".kv_a_proj") for n in names):
            latent = _cfg(cfg, "kv_lora_rank", default=0) + _cfg(cfg, "qk_rope_head_dim", default=0)
            idx = _cfg(cfg, "index_head_dim", default=0) if any(".indexer." in n for n in names) else 0
            out.append(LayerAttention(i, "mla", kv_per_token=latent, indexer_dim=idx or 0,
                                      index_topk=(_cfg(cfg, "index_topk", default=0) or 0) if idx else 0))
            continue
        if "attn.qkv_proj" in names and kind in (None, "full", "sliding", "chunked"):
            k = next((v for key, v in lin.items() if key.split(":")[1] in ("k_proj", "wk", "key", "k", "key_proj", "k_lin")), None)
            v = next((v for key, v in lin.items() if key.split(":")[1] in ("v_proj", "wv", "value", "v", "value_proj", "v_lin")), None)
            kvh = kv_heads
            if k is not None and v is not None:
                per_tok = k + v
                kvh = k // head_dim if head_dim and k % head_dim == 0 else kv_heads
            else:
                per_tok = 2 * kv_heads * head_dim
            if kind is None:
                kind = "sliding" if all_sliding else "full"
            win = {"sliding": window, "chunked": chunk}.get(kind, 0)
            if kind in ("sliding", "chunked") and not win:
                kind, win = "full", 0
            out.append(LayerAttention(i, kind, kv_per_token=per_tok, window=win, kv_heads=kvh))
            continue
        if kind == "linear" or (names and "attn.qkv_proj" not in names):
            out.append(_state_layer(cfg, i, lin, others.get(i, {})))
            continue
        if not names:
            out.append(LayerAttention(i, "none"))
            continue
        out.append(LayerAttention(i, "unknown", why=f"layer {i}: layer type {t!r} is not one this code models"))
    return tuple(out)


def index_key_bytes(index_head_dim: int) -> int:
    """Bytes a DSA indexer's key takes in its cache a token: FP8 codes and one fp32 scale (DeepSeek-V3.2's and
    GLM-5's cache)."""
    return index_head_dim + 4


def kv_shard(la: LayerAttention, tp: int) -> float:
    """Share of a layer's cache/state one TP rank holds (heads split as the engines split them)."""
    if la.kind == "mla":
        return 1.0
    units = la.state_heads if la.kind == "linear" else la.kv_heads
    if tp <= 1 or not units:
        return 1.0
    return (-(-units // tp)) / units
