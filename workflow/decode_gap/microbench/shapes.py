"""Per-GPU shapes for the micro-benchmarks, all derived from `decode_gap.model` (sharding lives there).

GEMM convention everywhere: y[M, N] = x[M, K] @ W[N, K]^T (a Linear layer's weight is [out=N, in=K]).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..model import LinearLayer, ModelSpec, linear_layers, shard_count


@dataclass(frozen=True)
class GemmShape:
    name: str
    group: str
    n: int
    k: int
    layers: int = 1
    per_layer: int = 1
    active_per_token: float = 1.0
    quantizable: bool = True

    @property
    def params(self) -> int:
        return self.n * self.k

    @classmethod
    def from_layer(cls, lin: LinearLayer) -> "GemmShape":
        return cls(lin.name, lin.group, lin.n, lin.k, lin.layers, lin.per_layer, lin.active_per_token, lin.quantizable)


def gemm_shapes(spec: ModelSpec, tp: int = 1, ep: int = 1, batch: int = 1) -> list[GemmShape]:
    """Every per-GPU linear layer of one decode step (one row per layer name, shapes may repeat)."""
    return [GemmShape.from_layer(lin) for lin in linear_layers(spec, tp=tp, ep=ep, batch=batch)]


def unique_shapes(shapes: list[GemmShape]) -> dict[tuple[int, int], list[GemmShape]]:
    """Shapes grouped by (N, K): one measurement serves every layer name with that shape."""
    out: dict[tuple[int, int], list[GemmShape]] = {}
    for s in shapes:
        out.setdefault((s.n, s.k), []).append(s)
    return out


@dataclass(frozen=True)
class MoeShape:
    """Routed experts as one GPU sees them."""

    hidden: int
    experts_total: int
    experts_local: int  # experts this rank holds (all of them with TP, experts/ep with EP)
    top_k: int
    inter: int  # per-GPU expert intermediate size (sharded by tp unless ep > 1)
    scoring: str  # sigmoid | softmax
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    shared_inter: int = 0  # per-GPU shared-expert intermediate (0: none)
    moe_layers: int = 0


def moe_shape(spec: ModelSpec, tp: int = 1, ep: int = 1) -> MoeShape | None:
    if not spec.is_moe:
        return None
    raw = spec.raw or {}
    if ep > 1:
        inter, local = spec.moe_intermediate, spec.experts // ep
    else:
        inter, local = shard_count(spec.moe_intermediate, tp), spec.experts
    n_group = int(raw.get("n_group") or 1)
    if n_group < 1 or spec.experts % n_group:
        n_group = 1
    return MoeShape(
        hidden=spec.hidden,
        experts_total=spec.experts,
        experts_local=local,
        top_k=spec.top_k,
        inter=inter,
        scoring=spec.scoring,
        n_group=n_group,
        topk_group=int(raw.get("topk_group") or 1) if n_group > 1 else 1,
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        routed_scaling_factor=float(raw.get("routed_scaling_factor") or 1.0),
        shared_inter=_shared_inter(spec, tp),
        moe_layers=spec.moe_layers,
    )


def _shared_inter(spec: ModelSpec, tp: int) -> int:
    """Per-GPU shared-expert intermediate, from the derived shapes (Qwen2-MoE-style shared experts have their own width)."""
    gu = next((l for l in linear_layers(spec, tp=tp) if l.name == "moe.shared.gate_up_proj"), None)
    return gu.n // 2 if gu is not None else 0


@dataclass(frozen=True)
class AttentionShape:
    kind: str  # gqa | mla
    heads: int  # per GPU
    kv_heads: int  # per GPU (1 latent head for MLA)
    head_dim: int
    layers: int
    sliding_layers: int = 0
    sliding_window: int = 0
    # MLA (absorbed form): q_nope is absorbed into the latent space
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DSA indexer (GLM-5, DeepSeek-V3.2)
    index_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def attention_shape(spec: ModelSpec, tp: int = 1) -> AttentionShape:
    heads = shard_count(spec.heads, tp)
    if spec.mla:
        return AttentionShape(
            kind="mla",
            heads=heads,
            kv_heads=1,
            head_dim=spec.kv_lora_rank + spec.qk_rope_head_dim,
            layers=spec.layers,
            kv_lora_rank=spec.kv_lora_rank,
            qk_nope_head_dim=spec.qk_nope_head_dim,
            qk_rope_head_dim=spec.qk_rope_head_dim,
            v_head_dim=spec.v_head_dim,
            index_heads=spec.index_heads,
            index_head_dim=spec.index_head_dim,
            index_topk=spec.index_topk,
        )
    return AttentionShape(
        kind="gqa",
        heads=heads,
        kv_heads=shard_count(spec.kv_heads, tp),
        head_dim=spec.head_dim,
        layers=spec.layers,
        sliding_layers=spec.sliding_layers,
        sliding_window=spec.sliding_window,
    )


def allreduce_model_bytes(spec: ModelSpec, batch: int = 1, dtype_bytes: int = 2) -> int:
    """The all-reduce a TP decode step issues after attention and after the MLP: hidden x batch x dtype."""
    return int(spec.hidden * batch * dtype_bytes)


def allreduces_per_step(spec: ModelSpec) -> int:
    """All-reduces per decode step under TP (one after attention, one after the MLP/MoE, per layer)."""
    return 2 * spec.layers


def world_size(config: dict[str, Any]) -> int:
    ws = (config.get("microbench") or {}).get("allreduce", {}) or {}
    value = ws.get("world_size") or config.get("tp", 1) or 1
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"config field 'microbench.allreduce.world_size': expected a positive integer, got {value!r}")
    return value
