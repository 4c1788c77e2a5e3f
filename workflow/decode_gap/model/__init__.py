"""Model cards from the model's own graph (transformers on the meta device); see spec.py, graph.py, kv.py."""

from .graph import MIN_TRANSFORMERS, Weight, build_graph, config_hash
from .kv import LayerAttention, index_key_bytes, kv_shard
from .spec import (
    MLA_FUSED_A,
    LinearLayer,
    LinearTemplate,
    ModelSpec,
    shard_count,
    expected_distinct_experts,
    extra_params,
    fuse_mla_a_projections,
    linear_layers,
    load_model_card,
    mtp_params,
    norm_params,
    parameter_counts,
    role_counts,
    spec_from_dict,
)

__all__ = [
    "MIN_TRANSFORMERS", "MLA_FUSED_A", "LayerAttention", "LinearLayer", "LinearTemplate", "ModelSpec", "Weight",
    "build_graph", "config_hash", "expected_distinct_experts", "extra_params", "fuse_mla_a_projections",
    "index_key_bytes", "kv_shard",
    "linear_layers",
    "load_model_card", "mtp_params", "norm_params", "parameter_counts", "role_counts", "shard_count",
    "spec_from_dict",
]
