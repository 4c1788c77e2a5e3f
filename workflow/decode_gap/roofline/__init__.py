"""Roofline of one decode step: bytes and FLOPs per GPU, and the floors they imply.

Definitions (per decode step, i.e. one new token for each of `batch` sequences; at batch 1 per token):
- weight bytes: every linear layer read once (routed experts: the expected number of distinct experts the batch
  hits), plus block-scale bytes, norms and one embedding row per sequence;
- KV bytes: the cache read at the context length (GQA: K and V of this GPU's KV heads; MLA: the latent cache,
  which every TP rank reads whole; DSA: the indexer keys of the whole context plus index_topk latent rows);
- t_memory = bytes / bandwidth, t_compute = FLOPs / peak rate, t_comm_floor = all-reduces x latency,
  t_floor = max(t_memory, t_compute) + t_comm_floor.

Layout `even` splits every weight evenly over the TP group: the theoretical minimum, and the arithmetic the
seeds' investigation used. Layout `engine` follows SGLang/vLLM sharding, where MLA's A projections, the DSA
indexer and the router are replicated on every rank; both are always reported, the configured one heads.
"""

from .compute import allreduce_time_us, allreduces_per_step, components_table, compute_roofline
from .kv import KV_BYTES, attention_flops_per_sequence, kv_bytes_per_sequence, kv_dtype, kv_layer_breakdown
from .weights import WEIGHT_FORMATS, WeightFormat, gguf_tensor_bytes

__all__ = ["KV_BYTES", "WEIGHT_FORMATS", "WeightFormat", "allreduce_time_us", "allreduces_per_step",
           "attention_flops_per_sequence", "components_table", "compute_roofline", "gguf_tensor_bytes",
           "kv_bytes_per_sequence", "kv_dtype", "kv_layer_breakdown"]
