"""What one GPU computes in one decode step, derived from the model card and `model.linear_layers()`.

The linear shapes come from `decode_gap.model.linear_layers` (the one place the sharding rules live); this module
adds what a decode step needs beyond the GEMMs: per-GPU head counts, the layer pattern (dense or MoE MLP, full or
sliding attention), the collectives per token, and the bytes a layer holds (to decide how many layers fit).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..model import LinearLayer, ModelSpec, index_key_bytes, linear_layers, shard_count

# bytes per stored weight element for the dtypes the kernel level can run
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0}


@dataclass(frozen=True)
class StepShapes:
    """Per-GPU dimensions of one decode step after TP/EP sharding."""

    spec: ModelSpec
    tp: int
    ep: int
    batch: int
    context_len: int
    linears: dict[str, LinearLayer]
    heads: int  # attention heads on this GPU
    kv_heads: int  # KV heads on this GPU (GQA); MLA: 1 latent head
    head_dim: int
    vocab: int  # lm_head rows on this GPU (vocab-parallel)
    experts: int  # routed experts held on this GPU
    top_k: int  # routed experts one token runs on this GPU
    moe_inter: int
    shared_inter: int
    dense_inter: int
    layer_kinds: tuple[str, ...]  # one per layer: "<mlp>/<attention>", e.g. "moe/full", "dense/sliding"
    collectives_per_token: int
    notes: list[str] = field(default_factory=list)

    @property
    def kinds(self) -> Counter:
        return Counter(self.layer_kinds)


def _mlp_pattern(spec: ModelSpec) -> list[str]:
    """dense, moe or none for each layer index, as the meta-device graph holds them (model.ModelSpec.layer_mlp)."""
    if spec.layer_mlp and len(spec.layer_mlp) == spec.layers:
        return list(spec.layer_mlp)
    return ["dense"] * spec.dense_layers + ["moe"] * spec.moe_layers


# model.kv kinds -> the kernel level's attention kinds (chunked attention is capped at its chunk like a window)
_ATTN_KIND = {"full": "full", "mla": "full", "sliding": "sliding", "chunked": "sliding", "linear": "linear",
              "none": "none", "unknown": "unknown"}


def _attention_pattern(spec: ModelSpec) -> list[str]:
    if spec.attention and len(spec.attention) == spec.layers:
        return [_ATTN_KIND.get(a.kind, "unknown") for a in spec.attention]
    return ["full"] * spec.layers


def step_shapes(spec: ModelSpec, tp: int = 1, ep: int = 1, batch: int = 1, context_len: int = 512) -> StepShapes:
    lin = {l.name: l for l in linear_layers(spec, tp=tp, ep=ep, batch=batch)}
    notes: list[str] = []
    if spec.mla:
        heads = lin["attn.o_proj"].k // spec.v_head_dim if "attn.o_proj" in lin else shard_count(spec.heads, tp)
        kv_heads = 1
        head_dim = spec.kv_lora_rank + spec.qk_rope_head_dim
    else:
        head_dim = spec.head_dim
        if "attn.o_proj" in lin and "attn.qkv_proj" in lin and head_dim and lin["attn.o_proj"].k % head_dim == 0:
            heads = lin["attn.o_proj"].k // head_dim
            kv_heads = (lin["attn.qkv_proj"].n // head_dim - heads) // 2
        else:  # no standard attention projections (e.g. an SSM): the config's head counts, sharded
            heads, kv_heads = shard_count(spec.heads, tp), shard_count(spec.kv_heads, tp)
    experts = top_k = moe_inter = shared_inter = 0
    if spec.is_moe:
        gu = lin.get("moe.expert.gate_up_proj") or next(
            l for l in lin.values() if l.group == "routed_expert" and l.k == spec.hidden)
        experts = gu.per_layer
        moe_inter = gu.n // 2 if gu.name.endswith("gate_up_proj") else gu.n
        top_k = spec.top_k if ep == 1 else max(1, math.ceil(spec.top_k / ep))
        if ep > 1:
            notes.append(f"ep={ep}: each GPU runs ceil(top_k/ep)={top_k} of its {experts} experts per token (modelled spread)")
        if "moe.shared.gate_up_proj" in lin:
            shared_inter = lin["moe.shared.gate_up_proj"].n // 2
    dense_inter = lin["mlp.gate_up_proj"].n // 2 if "mlp.gate_up_proj" in lin else 0
    kinds = tuple(f"{m}/{a}" for m, a in zip(_mlp_pattern(spec), _attention_pattern(spec)))
    odd = sorted({k for k in kinds if k.split("/")[1] in ("linear", "unknown") or k.split("/")[0] == "none"})
    if odd:
        notes.append(f"layer kinds {', '.join(odd)}: shapes derived from the model graph; see model.kv for their state")
    # Collectives per token under TP: after attention and after the MLP in every layer, one for the
    # vocab-parallel embedding and one gather of the vocab-parallel logits.
    collectives = 2 * spec.layers + 2 if tp > 1 else 0
    return StepShapes(
        spec=spec, tp=tp, ep=ep, batch=batch, context_len=context_len, linears=lin, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, vocab=lin["lm_head"].n, experts=experts, top_k=top_k,
        moe_inter=moe_inter, shared_inter=shared_inter, dense_inter=dense_inter, layer_kinds=kinds,
        collectives_per_token=collectives, notes=notes,
    )


def linear_names_for(shapes: StepShapes, kind: str) -> list[str]:
    """The linear layers a layer of `kind` holds (names from model.linear_layers)."""
    mlp, attn = kind.split("/")
    # standard attention (GQA, MLA) lives under "attn."; linear-attention/SSM mixers keep their own prefix
    names = [n for n, l in shapes.linears.items() if l.group == "attention" and n.startswith("attn.") == (attn != "linear")]
    if mlp == "dense":
        names += [n for n, l in shapes.linears.items() if l.group == "mlp"]
    elif mlp == "moe":
        names += [n for n, l in shapes.linears.items() if l.group in ("router", "shared_expert", "routed_expert")]
    return names


def layer_bytes(shapes: StepShapes, kind: str, weight_bytes: float, act_bytes: float, kv_len: int) -> float:
    """Bytes one layer of `kind` holds on this GPU: all its weights (every expert) plus its KV cache."""
    total = 0.0
    for name in linear_names_for(shapes, kind):
        l = shapes.linears[name]
        per_elem = weight_bytes if l.quantizable else act_bytes
        total += l.n * l.k * l.per_layer * per_elem
    total += shapes.batch * kv_len * kv_row_bytes(shapes, act_bytes)
    return total


def kv_row_bytes(shapes: StepShapes, act_bytes: float) -> float:
    """KV-cache bytes one token adds per layer on this GPU: K and V (GQA) or the latent row (MLA) in the activations'
    dtype, and a DSA indexer's key in FP8 with its 4-byte scale (as the kernel level caches it)."""
    spec = shapes.spec
    if spec.mla:
        return ((spec.kv_lora_rank + spec.qk_rope_head_dim) * act_bytes
                + (index_key_bytes(spec.index_head_dim) if spec.index_heads else 0))
    return 2 * shapes.kv_heads * shapes.head_dim * act_bytes


def plan_layers(shapes: StepShapes, requested: int | str, fits: int | None) -> dict[str, int]:
    """How many layers of each kind to simulate: `requested` total ("auto": `fits`), at least one of each kind.

    The simulated layers keep the model's mix of kinds; each kind's time is later scaled by its own ratio.
    """
    counts = shapes.kinds
    total = shapes.spec.layers
    if requested == "auto":
        want = total if fits is None else min(total, fits)
    else:
        if not isinstance(requested, int) or requested < 1:
            raise ConfigError(f"config field 'simulate.layers': expected a positive integer or 'auto', got {requested!r}")
        want = min(total, requested)
    want = max(want, len(counts))
    if want >= total:
        return dict(counts)
    plan = {k: 1 for k in counts}
    left = want - len(plan)
    # hand out the rest in proportion to each kind's share (largest remainder)
    shares = {k: counts[k] / total * want - 1 for k in counts}
    extra = {k: max(0, min(counts[k] - 1, int(math.floor(s)))) for k, s in shares.items()}
    for k in extra:
        give = min(extra[k], left)
        plan[k] += give
        left -= give
    for k in sorted(counts, key=lambda k: shares[k] - math.floor(shares[k]), reverse=True):
        if left <= 0:
            break
        if plan[k] < counts[k]:
            plan[k] += 1
            left -= 1
    return plan
