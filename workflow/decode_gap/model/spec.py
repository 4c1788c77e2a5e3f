"""Model cards: a Hugging Face config.json turned into the shapes one GPU sees in a decode step.

The config is read through `transformers.AutoConfig` and the model is built on the meta device (`graph.py`);
every weight, its layer and its role come from that graph. Everything downstream (roofline, GEMM shapes,
simulation) derives from `ModelSpec` and `linear_layers()`, so the sharding rules live in one place.
(About 530 lines, kept whole on purpose: the card, its per-config-hash cache and the sharding rules read best
together, and splitting them would scatter the one place the sharding rules live.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .graph import MTP_FIELDS, Graph, Weight, auto_config, build_graph, safe_attr
from .kv import LayerAttention, layer_attention


@dataclass(frozen=True)
class LinearLayer:
    """One weight matrix as a single GPU holds it after sharding: y[M, n] = x[M, k] @ W[k, n]."""

    name: str  # e.g. "attn.qkv_proj", "moe.expert.gate_up_proj"
    group: str  # attention | mlp | shared_expert | routed_expert | router | lm_head
    n: int
    k: int
    layers: int  # how many layers hold one
    per_layer: int = 1  # copies per layer (experts)
    active_per_token: float = 1.0  # copies read per token per layer (top-k experts)
    quantizable: bool = True  # the router and the DSA indexer's head weights stay in bf16 in every format
    replicated: bool = False  # the engine layout keeps it whole on every TP rank

    @property
    def params(self) -> int:
        return self.n * self.k


@dataclass(frozen=True)
class LinearTemplate:
    """A canonical linear of the unsharded model, as derived from the meta-device graph."""

    name: str
    group: str
    n: int
    k: int
    layers: int
    per_layer: int
    parts: tuple[tuple[str, int], ...]  # (leaf name, out features) of the projections fused into it
    layer_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    path: str
    architecture: str
    family: str  # llama | gemma3 | qwen3_moe | deepseek_v3: the kernel-level simulation's layer flavour
    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tie_embeddings: bool
    # MLA (DeepSeek-V2/V3, GLM-5, Kimi)
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
    # sliding-window (and chunked) layers: count and window
    sliding_layers: int = 0
    sliding_window: int = 0
    qk_norm: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # derived from the meta-device graph
    model_type: str = ""
    model_class: str = ""
    weights: tuple[Weight, ...] = field(default=(), repr=False, compare=False)
    linears: tuple[LinearTemplate, ...] = field(default=(), repr=False, compare=False)
    attention: tuple[LayerAttention, ...] = field(default=(), repr=False, compare=False)
    layer_mlp: tuple[str, ...] = field(default=(), repr=False, compare=False)  # dense | moe | none per layer
    mtp_layers: int = 0
    transformers_version: str = ""
    build_seconds: float = 0.0
    transformers_count: int = 0

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def is_moe(self) -> bool:
        return self.moe_layers > 0

    @property
    def name(self) -> str:
        return Path(self.path).stem if self.path else self.architecture


def load_model_card(path: str | Path) -> ModelSpec:
    """Parse a Hugging Face config.json. Errors name the file and the field (or transformers' reason), in one line."""
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


_REQUIRED = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads")


def spec_from_dict(cfg: dict, path: str = "<config>") -> ModelSpec:
    archs = cfg.get("architectures")
    if not archs or not isinstance(archs, list):
        raise ConfigError(f"{path}: field 'architectures' is missing")
    # the fields the text model must have: named here, in one line, before transformers fills a default
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    for key in _REQUIRED:
        if key in text and (not isinstance(text[key], int) or isinstance(text[key], bool) or text[key] <= 0):
            raise ConfigError(f"{path}: field '{key}' must be a positive integer, got {text[key]!r}")
    if "model_type" not in cfg:
        # without model_type transformers would fill every size from the family's defaults: a card needs them
        for key in _REQUIRED:
            if key not in text:
                raise ConfigError(f"{path}: field '{key}' is missing (needed for {archs[0]})")
    key = cache_key(cfg)
    spec = _cache_get(key)
    if spec is None:
        config = auto_config(cfg, path)
        graph = build_graph(config, path)
        spec = _spec_from_graph(graph, archs[0], path)
        _cache_put(key, spec)
    return dataclasses.replace(spec, path=path)


# ---- cache of derived specs per config hash: every Snakemake invocation resolves the model card at parse time,
# and importing torch + transformers and building the graph costs seconds; a hit costs a pickle load.
_MEMO: dict[str, ModelSpec] = {}


def _code_version() -> str:
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _transformers_version() -> str:
    import sys

    mod = sys.modules.get("transformers")
    if mod is not None:
        return str(getattr(mod, "__version__", "?"))
    try:
        from importlib.metadata import version

        return version("transformers")
    except Exception:
        return "absent"


def cache_key(cfg: dict) -> str:
    blob = json.dumps(cfg, sort_keys=True, default=str)
    return hashlib.sha256(f"{_transformers_version()}|{_code_version()}|{blob}".encode()).hexdigest()


def cache_dir() -> Path | None:
    """$DECODE_GAP_MODEL_CACHE, else $XDG_CACHE_HOME/decode-gap/models (~/.cache/...); 'off' disables it."""
    env = os.environ.get("DECODE_GAP_MODEL_CACHE")
    if env == "off":
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "decode-gap" / "models"


def _cache_get(key: str) -> ModelSpec | None:
    if key in _MEMO:
        return _MEMO[key]
    d = cache_dir()
    if d is None:
        return None
    try:
        with open(d / f"{key}.pickle", "rb") as fh:
            spec = pickle.load(fh)
    except Exception:  # absent, unreadable or stale: rebuild
        return None
    if not isinstance(spec, ModelSpec):
        return None
    _MEMO[key] = spec
    return spec


def _cache_put(key: str, spec: ModelSpec) -> None:
    _MEMO[key] = spec
    d = cache_dir()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{key}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(spec, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, d / f"{key}.pickle")
    except OSError:  # a read-only home is no error: the next run builds again
        pass


def _attr(cfg: Any, *names: str, default: Any = 0) -> Any:
    for n in names:
        v = safe_attr(cfg, n)
        if v is not None:
            return v
    return default


def _templates(weights: tuple[Weight, ...]) -> tuple[LinearTemplate, ...]:
    # per layer (and per expert): sum the fused parts of each canonical linear
    per: dict[tuple, dict] = {}
    order: list[tuple] = []
    for w in weights:
        if not w.linear or w.role == "mtp":
            continue
        key = (w.layer, w.linear, w.expert)
        if key not in per:
            per[key] = {"group": w.role if w.role != "lm_head" else "lm_head", "k": w.k, "parts": [],
                        "copies": w.copies}
            order.append(key)
        entry = per[key]
        if w.k != entry["k"]:  # not fusable: keep it as its own linear
            key2 = (w.layer, f"{w.linear}.{w.part}", w.expert)
            per.setdefault(key2, {"group": entry["group"], "k": w.k, "parts": [], "copies": w.copies})
            if key2 not in order:
                order.append(key2)
            per[key2]["parts"].append((w.part, w.n))
            continue
        entry["parts"].append((w.part, w.n))
    # per-expert modules: one copy per expert index
    layer_lin: dict[tuple, dict] = {}
    lorder: list[tuple] = []
    for key in order:
        layer, name, expert = key
        e = per[key]
        lk = (layer, name)
        if lk not in layer_lin:
            layer_lin[lk] = {**e, "parts": tuple(e["parts"]), "n": sum(n for _, n in e["parts"]), "experts": set()}
            lorder.append(lk)
        if expert >= 0:
            layer_lin[lk]["experts"].add(expert)
    groups: dict[tuple, list[int]] = {}
    gorder: list[tuple] = []
    for lk in lorder:
        layer, name = lk
        e = layer_lin[lk]
        per_layer = len(e["experts"]) if e["experts"] else e["copies"]
        gk = (name, e["group"], e["n"], e["k"], per_layer, e["parts"])
        if gk not in groups:
            groups[gk] = []
            gorder.append(gk)
        groups[gk].append(-1 if layer is None else layer)
    # one name per shape: the most common keeps the name, others get "#2", "#3" (rare: varying widths)
    by_name: dict[str, list[tuple]] = {}
    for gk in gorder:
        by_name.setdefault(gk[0], []).append(gk)
    out = []
    for gk in gorder:
        name, group, n, k, per_layer, parts = gk
        ranked = sorted(by_name[name], key=lambda g: -len(groups[g]))
        rank = ranked.index(gk)
        label = name if rank == 0 else f"{name}#{rank + 1}"
        ids = tuple(i for i in groups[gk] if i >= 0)
        out.append(LinearTemplate(label, group, n, k, max(1, len(groups[gk])), per_layer, parts, ids))
    return tuple(out)


_GROUP_ORDER = {"attention": 0, "mlp": 1, "router": 2, "shared_expert": 3, "routed_expert": 4, "lm_head": 5}


def _spec_from_graph(g: Graph, arch: str, path: str) -> ModelSpec:
    cfg = g.config
    w = g.weights
    templates = _templates(w)
    inp = next((x for x in w if x.input_table), None)
    if g.tied and inp is not None and not any(t.group == "lm_head" for t in templates):
        # a tied head reads the embedding table as its weight: one GEMM, no extra parameters
        templates += (LinearTemplate("lm_head", "lm_head", inp.shape[0], inp.shape[1], 1, 1, (("lm_head", inp.shape[0]),)),)
    templates = tuple(sorted(templates, key=lambda t: _GROUP_ORDER.get(t.group, 9)))
    L = g.layers
    att = layer_attention(g)
    moe_ids = {x.layer for x in w if x.role == "routed_expert" and x.layer is not None}
    mlp_ids = {x.layer for x in w if x.role == "mlp" and x.layer is not None}
    layer_mlp = tuple("moe" if i in moe_ids else ("dense" if i in mlp_ids else "none") for i in range(L))
    heads = int(_attr(cfg, "num_attention_heads", default=0) or 0)
    hidden = int(_attr(cfg, "hidden_size", default=0) or 0)
    kv_heads = int(_attr(cfg, "num_key_value_heads", default=heads) or heads)
    head_dim = int(_attr(cfg, "head_dim", default=0) or ((hidden // heads) if heads else 0))
    vocab = inp.shape[0] if inp is not None else int(_attr(cfg, "vocab_size"))

    def first(name: str) -> LinearTemplate | None:
        return next((t for t in templates if t.name == name), None)

    down = first("mlp.down_proj")
    intermediate = down.k if down else int(_attr(cfg, "intermediate_size", default=0) or 0)
    mla = any(a.kind == "mla" for a in att)
    exp_down = first("moe.expert.down_proj")
    shared_down = first("moe.shared.down_proj")
    moe_inter = exp_down.k if exp_down else int(_attr(cfg, "moe_intermediate_size", default=0) or 0)
    shared = 0
    if shared_down:
        shared = max(1, round(shared_down.k / moe_inter)) if moe_inter else 1
    sliding = [a for a in att if a.kind in ("sliding", "chunked")]
    has_indexer = any(".indexer." in t.name for t in templates)
    qk_norm = any(x.role == "norm" and x.block == "attention" and x.name.rsplit(".", 2)[-2] in
                  ("q_norm", "k_norm", "q_layernorm", "k_layernorm") for x in w)
    mt = safe_attr(cfg, "model_type") or ""
    family = ("deepseek_v3" if mla else "gemma3" if mt.startswith("gemma") else
              "qwen3_moe" if moe_ids else "llama")
    mtp = int(next((safe_attr(cfg, f) for f in MTP_FIELDS if safe_attr(cfg, f)), 0) or 0)
    raw = json.loads(json.dumps(cfg.to_dict(), default=str))  # plain JSON types only (the spec is cached)
    raw.setdefault("architectures", [arch])
    return ModelSpec(
        path=path, architecture=arch, family=family, hidden=hidden, layers=L, vocab=vocab, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate, tie_embeddings=g.tied,
        mla=mla,
        q_lora_rank=int(_attr(cfg, "q_lora_rank") or 0) if mla else 0,
        kv_lora_rank=int(_attr(cfg, "kv_lora_rank") or 0) if mla else 0,
        qk_nope_head_dim=int(_attr(cfg, "qk_nope_head_dim") or 0) if mla else 0,
        qk_rope_head_dim=int(_attr(cfg, "qk_rope_head_dim") or 0) if mla else 0,
        v_head_dim=int(_attr(cfg, "v_head_dim") or 0) if mla else 0,
        index_heads=int(_attr(cfg, "index_n_heads") or 0) if has_indexer else 0,
        index_head_dim=int(_attr(cfg, "index_head_dim") or 0) if has_indexer else 0,
        index_topk=int(_attr(cfg, "index_topk") or 0) if has_indexer else 0,
        moe_layers=len(moe_ids), experts=g.experts if moe_ids else 0, top_k=g.top_k if moe_ids else 0,
        shared_experts=shared, moe_intermediate=moe_inter if moe_ids else 0,
        scoring=str(_attr(cfg, "scoring_func", default="softmax") or "softmax"),
        sliding_layers=len(sliding), sliding_window=sliding[0].window if sliding else 0, qk_norm=qk_norm,
        raw=raw, model_type=mt, model_class=g.model_class, weights=w, linears=templates, attention=att,
        layer_mlp=layer_mlp, mtp_layers=mtp, transformers_version=g.transformers_version,
        build_seconds=g.build_seconds, transformers_count=g.transformers_count,
    )


def shard_count(value: int, tp: int) -> int:
    """Per-rank share of `value` heads/units under tensor parallelism `tp`.

    ceil: a dimension smaller than tp is replicated rather than vanishing (e.g. 8 KV heads at TP16)."""
    return max(1, -(-value // tp))




def expected_distinct_experts(experts: int, top_k: int, batch: int) -> float:
    """Expected number of distinct experts hit by `batch` tokens, each choosing top_k of `experts` uniformly."""
    if experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** batch)


_Q_PARTS = {"q_proj", "wq", "query", "q", "query_proj", "q_lin"}
_KV_PARTS = {"k_proj", "v_proj", "wk", "wv", "key", "value", "k", "v"}


def _by_units(dim: int, units: int, tp: int) -> int:
    """Shard `dim` made of `units` equal heads: ceil(units / tp) heads per rank."""
    if units and dim % units == 0:
        return shard_count(units, tp) * (dim // units)
    return shard_count(dim, tp)


def _shard_template(t: LinearTemplate, spec: ModelSpec, tp: int, ep: int, batch: int) -> LinearLayer:
    name, n, k, h = t.name, t.n, t.k, spec.hidden
    base = name.split("#")[0]
    if t.group == "routed_expert":
        if ep > 1:
            per_rank = max(1, t.per_layer // ep)
            active = expected_distinct_experts(t.per_layer, spec.top_k, batch) / ep
        else:
            per_rank = t.per_layer
            active = expected_distinct_experts(t.per_layer, spec.top_k, batch)
            n, k = _col_or_row(t, tp, h)
        return LinearLayer(name, t.group, n, k, t.layers, per_rank, active)
    if t.group == "router":
        return LinearLayer(name, t.group, n, k, t.layers, quantizable=False, replicated=tp > 1)
    if t.group == "lm_head":
        return LinearLayer(name, t.group, shard_count(n, tp), k, t.layers)
    replicated = base.endswith((".q_a_proj", ".kv_a_proj")) or ".indexer." in base or n < tp
    quant = not base.endswith(".indexer.weights_proj")
    if replicated:
        return LinearLayer(name, t.group, n, k, t.layers, quantizable=quant, replicated=tp > 1)
    if t.group == "attention":
        mla_heads = spec.heads if spec.mla else 0
        if base == "attn.qkv_proj":
            if len(t.parts) > 1:
                n = sum(_by_units(pn, spec.heads if p.lower() in _Q_PARTS else spec.kv_heads, tp) for p, pn in t.parts)
            elif n == (spec.heads + 2 * spec.kv_heads) * spec.head_dim:
                n = (shard_count(spec.heads, tp) + 2 * shard_count(spec.kv_heads, tp)) * spec.head_dim
            else:
                n = shard_count(n, tp)
            return LinearLayer(name, t.group, n, k, t.layers)
        if base == "attn.o_proj":
            return LinearLayer(name, t.group, n, _by_units(k, spec.heads, tp), t.layers)
        if base in ("attn.q_proj", "attn.q_b_proj", "attn.kv_b_proj"):
            return LinearLayer(name, t.group, _by_units(n, mla_heads or spec.heads, tp), k, t.layers)
    n, k = _col_or_row(t, tp, h)
    return LinearLayer(name, t.group, n, k, t.layers)


def _col_or_row(t: LinearTemplate, tp: int, hidden: int) -> tuple[int, int]:
    """Column-parallel (split n) for up-projections, row-parallel (split k) for projections back to hidden."""
    if t.name.split("#")[0].endswith("gate_up_proj") and t.n % 2 == 0:
        return 2 * shard_count(t.n // 2, tp), t.k
    if t.n == hidden and t.k != hidden:
        return t.n, shard_count(t.k, tp)
    return shard_count(t.n, tp), t.k


def linear_layers(spec: ModelSpec, tp: int = 1, ep: int = 1, batch: int = 1) -> list[LinearLayer]:
    """Per-GPU linear layers of one decode step under tensor parallelism `tp` (and expert parallelism `ep`).

    Sharding follows SGLang/vLLM: QKV and gate/up are column-parallel, o_proj and down are row-parallel,
    MLA's low-rank A projections, the DSA indexer and the router are replicated, the lm_head is vocab-parallel.
    With ep > 1 experts are whole on their rank and the active ones spread over ep ranks. MLA's q_a and kv_a
    projections, which read the same hidden state, are one GEMM (`fuse_mla_a_projections`).
    """
    return fuse_mla_a_projections([_shard_template(t, spec, tp, ep, batch) for t in spec.linears])


MLA_FUSED_A = "fused_qkv_a_proj"


def fuse_mla_a_projections(layers: list[LinearLayer]) -> list[LinearLayer]:
    """MLA's q_a_proj and kv_a_proj (both [*, hidden], replicated) as the one GEMM SGLang and vLLM load them into
    (`fused_qkv_a_proj_with_mqa`, `fused_qkv_a_proj`): rows [q_lora_rank | kv_lora_rank + rope], in q_a's place.

    The bytes are the same; a step runs one GEMV a layer where it ran two (GLM-5 TP8: 2048x6144 and 576x6144, each
    latency-bound on its own; H200, NVFP4: 6.0 us fused against 5.3 + 3.8 apart). llama.cpp and TGI run the two
    apart: one launch more a layer over the same bytes. Pairs that differ in K, layer count or format stay apart."""
    by_name = {l.name: l for l in layers}
    fused: dict[str, LinearLayer | None] = {}
    for l in layers:
        head, q_a, rest = l.name.partition(".q_a_proj")
        kv = by_name.get(f"{head}.kv_a_proj{rest}") if q_a and rest[:1] in ("", "#") else None
        if kv is None or (kv.k, kv.layers, kv.quantizable, kv.replicated) != (l.k, l.layers, l.quantizable,
                                                                               l.replicated):
            continue
        fused[l.name] = dataclasses.replace(l, name=f"{head}.{MLA_FUSED_A}{rest}", n=l.n + kv.n)
        fused[kv.name] = None
    return [fused.get(l.name, l) for l in layers if fused.get(l.name, l) is not None]


def _decode_weights(spec: ModelSpec) -> list[Weight]:
    return [w for w in spec.weights if w.role != "mtp"]


def norm_params(spec: ModelSpec) -> int:
    """Parameters of the norm layers, counted for the totals and read once per step."""
    return sum(w.numel for w in _decode_weights(spec) if w.role == "norm")


def extra_params(spec: ModelSpec, batch: int = 1) -> dict[str, float]:
    """Parameters read per decode step outside the linear layers and norms (unsharded):
    `bias` (linear biases; routed-expert biases only for the experts the batch hits), `other` (attention sinks,
    convolution and SSM parameters, ...) and `embedding_rows` (one row of every embedding table per sequence)."""
    frac = expected_distinct_experts(spec.experts, spec.top_k, batch) / spec.experts if spec.experts else 1.0
    bias = other = rows = 0.0
    for w in _decode_weights(spec):
        if w.role == "bias":
            bias += w.numel * (frac if w.block == "routed_expert" else 1.0)
        elif w.role == "other":
            other += w.numel * (frac if w.block == "routed_expert" else 1.0)
        elif w.role == "embedding":
            rows += (w.shape[-1] if len(w.shape) > 1 else 1) * batch
    return {"bias": bias, "other": other, "embedding_rows": rows}


def mtp_params(spec: ModelSpec) -> tuple[int, str]:
    """Parameters of the MTP / next-n layers, and how they were counted."""
    built = sum(w.numel for w in spec.weights if w.role == "mtp")
    if built:
        return built, "built by transformers (counted in params_total)"
    if not spec.mtp_layers:
        return 0, "no MTP layers in the config"
    last = spec.layers - 1
    layer = sum(w.numel for w in spec.weights if w.layer == last)
    h = spec.hidden
    # one decoder layer like the last one, eh_proj [h, 2h] and enorm/hnorm/final norm; embedding and head shared
    per = layer + 2 * h * h + 3 * h
    return spec.mtp_layers * per, (f"modelled: transformers does not build the {spec.mtp_layers} MTP layer(s) "
                                   f"('{next(f for f in MTP_FIELDS if spec.raw.get(f))}'); each counted as one "
                                   "decoder layer like the last one + eh_proj + 3 norms, embedding and head shared")


def parameter_counts(spec: ModelSpec) -> dict[str, Any]:
    """Parameter counts of the whole model, unsharded, in both publishers' conventions.

    params_total: every parameter transformers builds (its own count). params_active: the total minus the routed
    experts a token does not use, embedding table included (Mistral, Qwen, DeepSeek). params_active_non_embedding:
    the same without the input embedding table (OpenAI); a table tied to the lm_head stays, it is read as the head.
    MTP layers are in the total when transformers builds them and never in the active counts.
    """
    total = sum(w.numel for w in spec.weights)
    routed = sum(w.numel for w in spec.weights if w.block == "routed_expert" and w.role != "mtp")
    mtp_built = sum(w.numel for w in spec.weights if w.role == "mtp")
    inactive = routed * (1 - spec.top_k / spec.experts) if spec.experts else 0.0
    active = total - mtp_built - inactive
    embed = sum(w.numel for w in spec.weights if w.input_table)
    mtp, mtp_how = mtp_params(spec)
    return {
        "params_total": int(total),
        "params_active": int(round(active)),
        "params_active_non_embedding": int(round(active - (0 if spec.tie_embeddings else embed))),
        "params_embedding": int(embed),
        "params_routed_experts": int(routed),
        "params_mtp": int(mtp),
        "params_mtp_note": mtp_how,
        "params_total_with_mtp": int(total + (0 if mtp_built else mtp)),
    }


def role_counts(spec: ModelSpec) -> dict[str, int]:
    """Parameters per role (attention, mlp, routed_expert, ... , mtp)."""
    c: Counter = Counter()
    for w in spec.weights:
        c[w.role] += w.numel
    return dict(c)
