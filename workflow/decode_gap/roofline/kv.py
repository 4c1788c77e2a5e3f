"""KV-cache (and recurrent state) bytes and attention FLOPs one GPU reads and computes per decode step."""

from __future__ import annotations

from typing import Any

from ..model import ModelSpec, index_key_bytes, kv_shard

KV_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


def kv_dtype(config_value: str, weight_format: str) -> str:
    if config_value and config_value != "auto":
        return config_value
    return "fp16" if weight_format.startswith("gguf") else "bf16"


def kv_layer_breakdown(spec: ModelSpec, context_len: int, tp: int, dtype: str) -> list[dict[str, Any]]:
    """Per attention kind: layers, cache elements per token per layer, tokens read, bytes one GPU reads per sequence.

    GQA/MQA: K+V of this GPU's KV heads; MLA: the latent cache, whole on every rank (plus the DSA indexer's FP8
    keys over the whole context, and only index_topk latent rows); sliding/chunked: capped at the window;
    linear attention / SSM: the fixed per-sequence state, independent of the context; unknown: unavailable.
    """
    b = KV_BYTES[dtype]
    rows: dict[tuple, dict[str, Any]] = {}
    for la in spec.attention:
        key = (la.kind, la.kv_per_token, la.window, la.state, la.indexer_dim, la.why and "unknown")
        if key not in rows:
            share = kv_shard(la, tp)
            if la.kind == "mla":
                ctx = min(context_len, la.index_topk) if la.index_topk else context_len
                index_keys = context_len * index_key_bytes(la.indexer_dim) if la.indexer_dim else 0
                per_seq = ctx * la.kv_per_token * b + index_keys
                how = (f"MLA latent {la.kv_per_token}/token x ctx" if not la.index_topk else
                       f"MLA latent {la.kv_per_token} x min(ctx, index_topk={la.index_topk}) + DSA indexer FP8 keys "
                       f"({la.indexer_dim} + 4 B scale) x ctx") + ", whole on every rank"
            elif la.kind in ("full", "sliding", "chunked"):
                ctx = min(context_len, la.window) if la.window else context_len
                per_seq = ctx * la.kv_per_token * share * b
                how = f"K+V {la.kv_per_token}/token x {share:g} per GPU x " + (
                    f"min(ctx, {la.kind} window {la.window})" if la.window else "ctx")
            elif la.kind == "linear":
                ctx = 0
                per_seq = la.state * share * b
                how = f"fixed recurrent state {la.state} elements/sequence x {share:g} per GPU (independent of ctx)"
            elif la.kind == "none":
                ctx, per_seq, how = 0, 0.0, "no attention in this layer"
            else:
                ctx, per_seq, how = 0, None, f"unavailable: {la.why}"
            rows[key] = {"kind": la.kind, "layers": 0, "kv_per_token_per_layer": la.kv_per_token,
                         "window": la.window or None, "state_per_sequence": la.state or None,
                         "tokens_read": ctx, "bytes_per_sequence_per_layer": per_seq, "note": how}
        rows[key]["layers"] += 1
    return list(rows.values())


def kv_bytes_per_sequence(spec: ModelSpec, context_len: int, tp: int, dtype: str) -> tuple[float, str]:
    """KV-cache (and state) bytes one GPU reads for one sequence at `context_len`, and how they were counted.

    Layers of an unknown kind add nothing here; the note says so (their KV is unavailable)."""
    parts = kv_layer_breakdown(spec, context_len, tp, dtype)
    total = sum(r["layers"] * r["bytes_per_sequence_per_layer"] for r in parts
                if r["bytes_per_sequence_per_layer"] is not None)
    how = "; ".join(f"{r['layers']} {r['kind']} layer(s): {r['note']}" for r in parts)
    return total, how


def attention_flops_per_sequence(spec: ModelSpec, context_len: int, tp: int) -> float:
    heads = max(1, -(-spec.heads // tp)) if spec.heads else 0
    total = 0.0
    for la in spec.attention:
        if la.kind == "mla":
            ctx = min(context_len, spec.index_topk) if spec.index_topk else context_len
            # absorbed MLA: scores over latent+rope, values over the latent
            total += 2 * heads * ctx * (spec.kv_lora_rank + spec.qk_rope_head_dim) + 2 * heads * ctx * spec.kv_lora_rank
            if la.indexer_dim:
                total += 2 * spec.index_heads * spec.index_head_dim * context_len
        elif la.kind in ("full", "sliding", "chunked"):
            ctx = min(context_len, la.window) if la.window else context_len
            total += 4 * heads * spec.head_dim * ctx
        elif la.kind == "linear":
            total += 4 * la.state * kv_shard(la, tp)  # read-update-read of the state
    return total


def kv_component(spec: ModelSpec, context_len: int, tp: int, kvd: str, batch: int, provenance: dict[str, str]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], str]:
    """The KV-cache component row, the per-attention-kind rows, those of unknown kind, and how KV was counted."""
    kv_rows = kv_layer_breakdown(spec, context_len, tp, kvd)
    kv_seq, kv_how = kv_bytes_per_sequence(spec, context_len, tp, kvd)
    kv_bytes = kv_seq * batch
    unknown = [r for r in kv_rows if r["bytes_per_sequence_per_layer"] is None]
    if unknown:
        provenance["kv_bytes_per_token_per_gpu"] = (
            f"unavailable for {sum(r['layers'] for r in unknown)} layer(s): " + "; ".join(r["note"] for r in unknown)
            + "; bytes and floors count the other layers only")
    else:
        provenance["kv_bytes_per_token_per_gpu"] = f"modelled: {kv_how}"
    row = {"component": "kv_cache", "group": "kv_cache", "dtype": kvd, "params": 0,
           "bytes": kv_bytes, "scale_bytes": 0.0, "note": kv_how}
    return row, kv_rows, unknown, kv_how
