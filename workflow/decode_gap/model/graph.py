"""The model's own graph: config.json through `transformers.AutoConfig`, the causal LM built on the meta device
(no memory, no weights), and one record per parameter with its shape, layer and role.

Family-specific knowledge is limited to the names below that the module graph cannot tell: which linear leaf names
are the Q/K/V or gate/up halves of a fused projection (for TP sharding) and which config fields hold top-k.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, describe

MIN_TRANSFORMERS = "5.0"  # fused 3-D expert tensors and `layer_types` on every config

ROLES = ("attention", "mlp", "routed_expert", "shared_expert", "router", "norm", "embedding", "lm_head", "bias",
         "other", "mtp")

# top-k lives under several names; the first one present (and non-null) on the config wins
TOP_K_FIELDS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k_experts",
                "num_selected_experts", "router_top_k", "top_k")
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
MTP_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "n_mtp_layers")

_MLP_SCOPES = {"mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "mlp_block", "ff", "feedforward"}
_ATTN_SCOPES = {"self_attn", "attention", "attn", "self_attention", "mixer_attn"}
_QKV = {"q_proj", "k_proj", "v_proj", "qkv_proj", "query_key_value", "c_attn", "wqkv", "qkv", "query", "key",
        "value", "wq", "wk", "wv", "q", "k", "v", "in_proj_qkv", "query_proj", "key_proj", "value_proj", "q_lin",
        "k_lin", "v_lin", "qkv_proj_fused"}
_O = {"o_proj", "out_proj", "dense", "c_proj", "wo", "o", "output", "out", "out_lin", "o_lin"}
_WRAPPERS = {"linear", "layer", "module", "base_layer", "proj"}  # a wrapper whose parent names the projection


def _is_attention_scope(scope: str) -> bool:
    s = scope.lower()
    if s in _ATTN_SCOPES:
        return True
    return ("attn" in s or "attention" in s) and not any(x in s for x in ("linear", "cross", "mamba", "ssm", "conv"))
_UP = {"gate_proj", "up_proj", "w1", "w3", "fc1", "c_fc", "gate_up_proj", "dense_h_to_4h", "wi", "wi_0", "wi_1",
       "fc_in", "input_linear", "gate_up", "up", "gate"}
_DOWN = {"down_proj", "w2", "fc2", "c_proj", "dense_4h_to_h", "fc_out", "output_linear", "down", "wo"}
_ROUTER = {"gate", "router", "gating", "gate_network", "router_gate", "switch", "classifier"}


@dataclass(frozen=True)
class Weight:
    """One parameter of the built model."""

    name: str
    shape: tuple[int, ...]
    numel: int
    layer: int | None  # decoder-layer index; None outside the layer stack
    role: str  # one of ROLES
    block: str  # what it belongs to: attention | mlp | routed_expert | shared_expert | router | model
    linear: str = ""  # canonical linear name (e.g. "attn.qkv_proj") when it is a weight matrix
    part: str = ""  # the leaf name inside a fused canonical linear (q_proj, k_proj, gate_proj, ...)
    n: int = 0  # out features of one copy
    k: int = 0  # in features of one copy
    copies: int = 1  # experts in a fused 3-D tensor
    expert: int = -1  # expert index of a per-expert module
    input_table: bool = False  # the input embedding table


@dataclass(frozen=True)
class Graph:
    """What the meta-device build tells: every parameter, and facts of the built model."""

    config: Any  # the (text) PretrainedConfig the model was built from
    model_class: str
    weights: tuple[Weight, ...]
    layers: int
    tied: bool
    experts: int
    top_k: int
    transformers_version: str
    build_seconds: float
    transformers_count: int = 0  # model.num_parameters(): transformers' own count, to check ours against


def transformers_module():
    try:
        import transformers
    except ModuleNotFoundError as exc:  # pragma: no cover - a core dependency
        if exc.name != "transformers":  # installed, but one of its own imports failed: say which
            raise ConfigError(f"transformers cannot be imported: {exc}") from None
        raise ConfigError(f"transformers is not installed: decode-gap needs transformers>={MIN_TRANSFORMERS} "
                          "(pip install -U transformers)") from None
    except ImportError as exc:  # installed, but broken (e.g. a dependency of the wrong version)
        raise ConfigError(f"transformers cannot be imported: {describe(exc, 300, with_type=False)}") from None
    from packaging.version import Version

    if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
        raise ConfigError(f"transformers {transformers.__version__} is too old: decode-gap needs "
                          f"transformers>={MIN_TRANSFORMERS} (pip install -U transformers)")
    return transformers


@functools.lru_cache(maxsize=1)
def _arch_to_model_type() -> dict[str, str]:
    from transformers.models.auto import modeling_auto

    out: dict[str, str] = {}
    for name in dir(modeling_auto):
        if name.endswith("_MAPPING_NAMES") and name != "CONFIG_MAPPING_NAMES":
            for mt, cls in getattr(modeling_auto, name).items():
                for c in (cls if isinstance(cls, (list, tuple)) else [cls]):
                    out.setdefault(c, mt)
    for mt, cls in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():  # causal LM wins
        out[cls] = mt
    return out


def auto_config(cfg: dict, path: str):
    """The config transformers' model code sees: aliases resolved, defaults filled."""
    tf = transformers_module()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else "?"
    mt = cfg.get("model_type") or _arch_to_model_type().get(arch)
    if not mt:
        raise ConfigError(f"{path}: neither 'model_type' nor a known 'architectures' entry ({arch!r}) names a model "
                          f"transformers {tf.__version__} knows")
    if mt not in CONFIG_MAPPING_NAMES:
        wrote = cfg.get("transformers_version")
        newer = (f"the file was written by transformers {wrote}: pip install 'transformers>={wrote}'" if wrote
                 else "a model newer than this transformers needs pip install -U transformers")
        raise ConfigError(f"{path}: model_type '{mt}' ({arch}) is unknown to transformers {tf.__version__}: check "
                          f"its spelling; {newer}")
    kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    verbosity = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()  # config validation warnings are not the user's problem here
    try:
        return tf.AutoConfig.for_model(mt, **kwargs)
    except Exception as exc:
        raise ConfigError(f"{path}: transformers {tf.__version__} cannot read this config ({mt}): "
                          f"{describe(exc, 300)}") from None
    finally:
        tf.logging.set_verbosity(verbosity)


def safe_attr(cfg: Any, name: str) -> Any:
    """getattr that also survives configs whose per-layer attributes refuse a global read (they raise)."""
    try:
        return getattr(cfg, name, None)
    except Exception:
        return None


def _first_field(cfg: Any, names: tuple[str, ...]) -> Any:
    for n in names:
        v = safe_attr(cfg, n)
        if v is not None and not isinstance(v, bool):
            return v
    return None


def config_hash(config: Any) -> str:
    blob = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(f"{type(config).__name__}\n{blob}".encode()).hexdigest()


_CACHE: dict[str, Graph] = {}


def build_graph(config: Any, path: str) -> Graph:
    """Build the causal LM on the meta device and classify every parameter (cached per config hash)."""
    tf = transformers_module()
    import torch

    text = config
    get_text = getattr(config, "get_text_config", None)
    if get_text is not None:
        try:
            text = get_text(decoder=True)
        except TypeError:
            text = get_text()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    build_cfg = text if getattr(text, "model_type", None) in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else config
    key = config_hash(build_cfg)
    if key in _CACHE:
        return _CACHE[key]
    t0 = time.perf_counter()
    verbosity = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()
    try:
        with torch.device("meta"):
            model = tf.AutoModelForCausalLM.from_config(build_cfg)
    except Exception as exc:
        arch = (getattr(config, "architectures", None) or [type(build_cfg).__name__])[0]
        raise ConfigError(f"{path}: transformers {tf.__version__} cannot build {arch} from this config: "
                          f"{describe(exc, 300)}") from None
    finally:
        tf.logging.set_verbosity(verbosity)
    graph = _classify(model, build_cfg, time.perf_counter() - t0, tf.__version__)
    _CACHE[key] = graph
    return graph


def _layer_stack(model) -> tuple[str, int]:
    """The decoder layers: the longest ModuleList that is not a list of experts."""
    import torch.nn as nn

    best, n = "", 0
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > n and "expert" not in name.rsplit(".", 1)[-1]:
            if name.count(".") <= 3:
                best, n = name, len(mod)
    return best, n


def _is_linear(mod) -> bool:
    import torch.nn as nn

    return isinstance(mod, nn.Linear) or type(mod).__name__ in ("Conv1D",) or type(mod).__name__.endswith("Linear")


def _is_norm(mod, leaf_owner: str) -> bool:
    cls = type(mod).__name__.lower()
    return "norm" in cls or bool(re.search(r"(^|_)(ln|norm|layernorm|rmsnorm)(_|\d|$)", leaf_owner.lower()))


def _classify(model, cfg, seconds: float, version: str) -> Graph:
    import torch.nn as nn

    modules = dict(model.named_modules())
    inp = model.get_input_embeddings()
    out = model.get_output_embeddings()
    tied = out is not None and inp is not None and out.weight is inp.weight
    stack, n_layers = _layer_stack(model)
    hidden = safe_attr(cfg, "hidden_size") or (inp.weight.shape[1] if inp is not None else 0)
    experts_cfg = _first_field(cfg, EXPERT_FIELDS) or 0
    top_k = _first_field(cfg, TOP_K_FIELDS) or 0
    n_cfg_layers = safe_attr(cfg, "num_hidden_layers") or n_layers
    weights: list[Weight] = []

    for name, p in model.named_parameters():
        owner_name, _, leaf = name.rpartition(".")
        owner = modules.get(owner_name)
        shape = tuple(int(s) for s in p.shape)
        numel = int(p.numel())
        layer = None
        rel = name
        if stack and name.startswith(stack + "."):
            idx, _, rel = name[len(stack) + 1:].partition(".")
            layer = int(idx) if idx.isdigit() else None
        parts = rel.split(".")
        if inp is not None and p is inp.weight:
            weights.append(Weight(name, shape, numel, None, "embedding", "model", input_table=True))
            continue
        if out is not None and getattr(out, "bias", None) is not None and p is out.bias:
            weights.append(Weight(name, shape, numel, None, "bias", "lm_head"))
            continue
        if out is not None and p is out.weight:
            weights.append(Weight(name, shape, numel, None, "lm_head", "model", "lm_head", "", shape[0], shape[1]))
            continue
        if isinstance(owner, nn.Embedding):
            weights.append(Weight(name, shape, numel, layer, "embedding", "model"))
            continue
        if layer is None:
            role = "norm" if owner is not None and _is_norm(owner, owner_name.rsplit(".", 1)[-1]) else "other"
            if "mtp" in name.lower():
                role = "mtp"
            weights.append(Weight(name, shape, numel, None, role, "model"))
            continue
        mtp = layer >= n_cfg_layers or "mtp" in name.lower()
        scope = parts[0] if len(parts) > 1 else ""
        in_mlp = scope in _MLP_SCOPES or "expert" in rel or "moe" in scope
        if len(parts) == 2 and scope.lower() in (_UP | _DOWN) - {"gate", "out", "output"}:
            in_mlp = True  # MLP projections straight under the layer (OPT's fc1/fc2)
        owner_leaf = owner_name.rsplit(".", 1)[-1]
        # block: routed experts, shared experts, router, dense MLP, or the token mixer (attention or its kin)
        if "shared_expert" in rel or "shared_mlp" in rel:
            block = "shared_expert"
        elif in_mlp and owner_leaf in _ROUTER and experts_cfg and shape[0] == experts_cfg:
            block = "router"
        elif in_mlp and ("experts" in parts or (len(shape) == 3 and experts_cfg and shape[0] == experts_cfg)):
            block = "routed_expert"
        elif in_mlp:
            block = "mlp"
        else:
            block = "attention"
        is_bias = leaf == "bias" or leaf.endswith("_bias")
        if owner is not None and not _is_linear(owner) and _is_norm(owner, owner_leaf):
            role = "norm"
        elif block == "routed_expert" and not is_bias and (
                len(shape) == 3 or (len(shape) == 2 and owner is not None and _is_linear(owner))):
            role = "routed_expert"
        elif is_bias and (block in ("routed_expert", "router") or (owner is not None and _is_linear(owner))):
            role = "bias"
        elif leaf == "weight" and len(shape) == 2 and (block == "router" or (owner is not None and _is_linear(owner))):
            role = block
        else:
            role = "other"
        if mtp:
            weights.append(Weight(name, shape, numel, layer, "mtp", block))
            continue
        if role not in ("attention", "mlp", "routed_expert", "shared_expert", "router"):
            weights.append(Weight(name, shape, numel, layer, role, block))
            continue
        # a weight matrix: its canonical linear name and its [n, k] per copy
        copies, expert = 1, -1
        if len(shape) == 3:
            copies, a, b = shape
            down = (leaf in _DOWN or "down" in leaf or "output" in leaf or leaf.startswith("w2"))
            # transformers stores fused experts as [E, out, in]; a few models as [E, in, out]
            if down:
                n, k = (a, b) if a == hidden else (b, a)
            else:
                n, k = (a, b) if b == hidden else (b, a)
            part = leaf
        else:
            n, k = shape
            if type(owner).__name__ == "Conv1D":  # GPT-2 style [in, out]
                n, k = k, n
            part = owner_leaf
            if part.lower() in _WRAPPERS and len(parts) >= 3:
                part = parts[-3]
            if block == "routed_expert":
                expert = next((int(x) for x in parts if x.isdigit()), -1)
        linear = _canonical(block, scope, parts, part)
        weights.append(Weight(name, shape, numel, layer, role, block, linear, part, n, k, copies, expert=expert))

    mla_layers = {w.layer for w in weights if w.linear.endswith(".kv_a_proj")}
    if mla_layers:
        weights = [dataclasses.replace(w, linear="attn.q_proj") if (w.layer in mla_layers and w.linear == "attn.qkv_proj") else w for w in weights]
    experts = experts_cfg
    fused = [w.copies for w in weights if w.role == "routed_expert" and w.copies > 1]
    if fused:
        experts = Counter(fused).most_common(1)[0][0]
    return Graph(cfg, type(model).__name__, tuple(weights), n_layers, tied, int(experts or 0), int(top_k or 0),
                 version, seconds, int(model.num_parameters()))


def _canonical(block: str, scope: str, parts: list[str], part: str) -> str:
    prefix = {"mlp": "mlp", "shared_expert": "moe.shared", "routed_expert": "moe.expert", "router": "moe.router"}
    if block == "router":
        return "moe.router"
    if block in prefix:
        if part in _DOWN:
            return f"{prefix[block]}.down_proj"
        if part in _UP:
            return f"{prefix[block]}.gate_up_proj"
        return f"{prefix[block]}.{part}"
    # the token mixer: standard attention keeps the names the other stages know
    head = "attn" if _is_attention_scope(scope) else (scope or "attn")
    if "indexer" in parts:
        return f"{head}.indexer.{part}"
    if part == "kv_a_proj_with_mqa":
        return f"{head}.kv_a_proj"
    if part in ("q_a_proj", "q_b_proj", "kv_b_proj", "kv_a_proj"):
        return f"{head}.{part}"
    if head == "attn" and part.lower() in _QKV:
        return "attn.qkv_proj"
    if head == "attn" and part.lower() in _O:
        return "attn.o_proj"
    return f"{head}.{part}"
