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

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .hardware import HardwareSpec
from .model import (
    LinearLayer,
    ModelSpec,
    expected_distinct_experts,
    extra_params,
    kv_shard,
    linear_layers,
    norm_params,
    parameter_counts,
)

# bytes per weight element, and scale bytes per element, by format
_FP32_TENSOR_SCALE = 4.0


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bytes_per_param: float
    scale_bytes_per_param: float  # block scales, amortised per element
    per_tensor_scale_bytes: float
    compute_dtype: str  # the tensor-core rate the math runs at, when the hardware has it
    description: str


WEIGHT_FORMATS = {
    "bf16": WeightFormat("bf16", 2.0, 0.0, 0.0, "bf16", "bfloat16"),
    "fp8": WeightFormat("fp8", 1.0, 0.0, _FP32_TENSOR_SCALE, "fp8", "FP8 E4M3 with one FP32 scale per tensor"),
    "fp8-block": WeightFormat(
        "fp8-block", 1.0, 4.0 / (128 * 128), 0.0, "fp8", "FP8 E4M3 with one FP32 scale per 128x128 block"
    ),
    "nvfp4": WeightFormat(
        "nvfp4", 0.5, 1.0 / 16, _FP32_TENSOR_SCALE, "fp4",
        "NVFP4: 4-bit E2M1, one FP8 E4M3 scale per 16 elements, one FP32 scale per tensor",
    ),
    # Without the file: Q4_K (4.5 bits per weight: 144 bytes per 256-element super-block) for the bulk.
    "gguf-q4_k_m": WeightFormat("gguf-q4_k_m", 144 / 256, 0.0, 0.0, "bf16", "GGUF Q4_K_M (Q4_K bulk, 4.5 bits/weight)"),
}

KV_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


def kv_dtype(config_value: str, weight_format: str) -> str:
    if config_value and config_value != "auto":
        return config_value
    return "fp16" if weight_format.startswith("gguf") else "bf16"


def _layer_bytes(lin: LinearLayer, fmt: WeightFormat, keep_bf16: set[str]) -> tuple[float, float, str]:
    """(weight bytes, scale bytes, dtype) of one copy of a linear layer."""
    if not lin.quantizable or lin.group in keep_bf16 or fmt.name == "bf16":
        return lin.params * 2.0, 0.0, "bf16"
    scale = lin.params * fmt.scale_bytes_per_param + fmt.per_tensor_scale_bytes
    return lin.params * fmt.bytes_per_param, scale, fmt.name


def _replicated(lin: LinearLayer, spec: ModelSpec) -> bool:
    """Layers that the engine layout does not shard: their per-GPU shape equals the full shape."""
    return lin.replicated or lin.group == "router"


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
                per_seq = ctx * la.kv_per_token * b + (context_len * (la.indexer_dim + 4) if la.indexer_dim else 0)
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


def allreduces_per_step(spec: ModelSpec, tp: int) -> int:
    """Two per layer under TP (after attention, after the MLP/MoE), none at TP1; the seeds counted 2 x 78 = 156."""
    return 0 if tp <= 1 else 2 * spec.layers


def allreduce_time_us(message_bytes: float, tp: int, latency_us: float, link_gbps: float | None) -> float:
    """One all-reduce: latency + ring bytes over the link (2 (tp-1)/tp x message / bandwidth)."""
    bw = (message_bytes * 2 * (tp - 1) / tp / (link_gbps * 1e9) * 1e6) if link_gbps else 0.0
    return latency_us + bw


_GGUF_GROUPS = [
    (re.compile(r"^token_embd\."), "embedding"),
    (re.compile(r"^output\.weight"), "lm_head"),
    (re.compile(r"norm"), "norms"),
    (re.compile(r"ffn_gate_inp"), "router"),
    (re.compile(r"_shexp"), "shared_expert"),
    (re.compile(r"_exps"), "routed_expert"),
    (re.compile(r"\.attn_|\.attn\."), "attention"),
    (re.compile(r"\.ffn_"), "mlp"),
]


def gguf_tensor_bytes(path: str | Path) -> list[dict[str, Any]]:
    """Exact per-tensor sizes and types from a GGUF file header (read with the `gguf` package)."""
    try:
        import gguf
    except ImportError:  # pragma: no cover - gguf is a declared dependency
        raise ConfigError("the 'gguf' package is needed to read GGUF files (pip install gguf)") from None
    try:
        reader = gguf.GGUFReader(str(path))
    except FileNotFoundError:
        raise ConfigError(f"{path}: GGUF file not found (config key 'gguf_path')") from None
    except Exception as exc:
        raise ConfigError(f"{path}: not a readable GGUF file ({exc})") from None
    rows = []
    for t in reader.tensors:
        group = next((g for rx, g in _GGUF_GROUPS if rx.search(t.name)), "other")
        rows.append({"name": t.name, "type": t.tensor_type.name, "bytes": int(t.n_bytes), "elements": int(t.n_elements), "group": group})
    return rows


def _component_rows_from_gguf(spec: ModelSpec, tensors: list[dict[str, Any]], batch: int, tp: int) -> list[dict[str, Any]]:
    by_group: dict[str, dict[str, Any]] = {}
    tied = not any(t["group"] == "lm_head" for t in tensors)
    for t in tensors:
        group = t["group"]
        read = float(t["bytes"])
        if group == "embedding":
            row_bytes = t["bytes"] / max(1, spec.vocab)
            if tied:
                # the tied output head reads the whole table; the embedding row is one more row
                add = {"component": "lm_head (tied token_embd)", "group": "lm_head", "bytes": read / tp,
                       "params": t["elements"] / tp, "dtype": t["type"]}
                _accumulate(by_group, add)
            read = row_bytes * batch
            _accumulate(by_group, {"component": "embedding rows", "group": "embedding", "bytes": read,
                                   "params": spec.hidden * batch, "dtype": t["type"]})
            continue
        if group == "routed_expert":
            share = expected_distinct_experts(spec.experts, spec.top_k, batch) / max(1, spec.experts)
            read *= share
        _accumulate(by_group, {"component": group, "group": group, "bytes": read / tp,
                               "params": t["elements"] / tp, "dtype": t["type"]})
    return list(by_group.values())


def _accumulate(acc: dict[str, dict[str, Any]], row: dict[str, Any]) -> None:
    key = row["component"]
    if key not in acc:
        acc[key] = {**row, "dtype": {row["dtype"]}, "scale_bytes": 0.0}
    else:
        acc[key]["bytes"] += row["bytes"]
        acc[key]["params"] += row["params"]
        acc[key]["dtype"].add(row["dtype"])


def _layout_rows(spec: ModelSpec, fmt: WeightFormat, keep: set[str], lay: str, tp: int, ep: int,
                 batch: int) -> list[dict[str, Any]]:
    """The weight components one GPU reads per decode step under layout `lay` (even or engine)."""
    lins = linear_layers(spec, tp=1 if lay == "even" else tp, ep=1 if lay == "even" else ep, batch=batch)
    rows = []
    for lin in lins:
        w, s, dtype = _layer_bytes(lin, fmt, keep)
        copies = lin.layers * lin.active_per_token
        divisor = tp if lay == "even" else 1
        if lay == "engine" and lin.group == "routed_expert" and ep > 1:
            copies = lin.layers * lin.active_per_token  # already spread over ep ranks
        rows.append({
            "component": lin.name, "group": lin.group, "dtype": dtype,
            "n": lin.n, "k": lin.k, "copies_read": copies,
            "params": lin.params * copies / divisor,
            "bytes": w * copies / divisor, "scale_bytes": s * copies / divisor,
            "replicated": lay == "engine" and _replicated(lin, spec) and tp > 1,
        })
    norms = norm_params(spec)
    rows.append({"component": "norms", "group": "norms", "dtype": "bf16", "n": 0, "k": 0, "copies_read": 1,
                 "params": norms, "bytes": norms * 2.0, "scale_bytes": 0.0, "replicated": True})
    extra = extra_params(spec, batch)
    rows.append({"component": "embedding rows", "group": "embedding", "dtype": "bf16", "n": spec.hidden, "k": 1,
                 "copies_read": batch, "params": extra["embedding_rows"], "bytes": extra["embedding_rows"] * 2.0,
                 "scale_bytes": 0.0, "replicated": True})
    # linear biases and the parameters that are no matrix (sinks, convolutions, SSM A/D): bf16, split over TP
    for comp, key in (("biases", "bias"), ("other parameters", "other")):
        if extra[key]:
            rows.append({"component": comp, "group": "norms", "dtype": "bf16", "n": 0, "k": 0, "copies_read": 1,
                         "params": extra[key] / tp, "bytes": extra[key] * 2.0 / tp, "scale_bytes": 0.0,
                         "replicated": False})
    return rows


def _weight_components(spec: ModelSpec, fmt: WeightFormat, keep: set[str], layout: str, tp: int, ep: int, batch: int,
                       gguf_path: str | None, provenance: dict[str, str]
                       ) -> tuple[float, dict[str, float], dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Weight bytes per GPU per decode step: (bytes, bytes per layout, rows per layout, the reported components).
    With a GGUF file its exact tensor sizes replace the modelled ones (both layouts)."""
    rows_by_layout = {lay: _layout_rows(spec, fmt, keep, lay, tp, ep, batch) for lay in ("even", "engine")}
    per_layout = {lay: sum(r["bytes"] + r["scale_bytes"] for r in rows) for lay, rows in rows_by_layout.items()}
    if fmt.name.startswith("gguf") and gguf_path:
        tensors = gguf_tensor_bytes(gguf_path)
        gguf_rows = _component_rows_from_gguf(spec, tensors, batch, tp)
        for r in gguf_rows:
            r["dtype"] = "+".join(sorted(r["dtype"]))
        weight_bytes = sum(r["bytes"] for r in gguf_rows)
        per_layout = {"even": weight_bytes, "engine": weight_bytes}
        provenance["weight_bytes_per_token_per_gpu"] = f"modelled: exact tensor sizes from {gguf_path}"
        return weight_bytes, per_layout, rows_by_layout, gguf_rows
    provenance["weight_bytes_per_token_per_gpu"] = (
        f"modelled: {fmt.description}; layout '{layout}'; kept in bf16: {', '.join(sorted(keep)) or 'none'}"
    )
    return per_layout[layout], per_layout, rows_by_layout, rows_by_layout[layout]


def _kv_component(spec: ModelSpec, context_len: int, tp: int, kvd: str, batch: int, provenance: dict[str, str]
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


def _flops(spec: ModelSpec, linear_rows: list[dict[str, Any]], components: list[dict[str, Any]], context_len: int,
           tp: int, batch: int) -> float:
    """FLOPs per GPU per decode step: 2 per weight element per sequence, plus attention over the context.
    Sets each component's own `flops`."""
    linear_params_per_gpu = sum(r["params"] for r in linear_rows if r["group"] not in ("norms", "embedding"))
    attn_flops = attention_flops_per_sequence(spec, context_len, tp) * batch
    flops = 2.0 * linear_params_per_gpu * batch + attn_flops
    for r in components:
        if r["group"] == "kv_cache":
            r["flops"] = attn_flops
        elif r["group"] in ("norms", "embedding"):
            r["flops"] = 0.0
        else:
            r["flops"] = 2.0 * r.get("params", 0) * batch
    return flops


def _memory_floor(hardware: HardwareSpec, total_bytes: float, engine_bytes: float,
                  provenance: dict[str, str]) -> tuple[float | None, float | None]:
    """(t_memory, t_memory under the engine layout) at the datasheet bandwidth; None without one."""
    bw = hardware.memory_bandwidth_gbps
    if bw:
        provenance["t_memory_ms"] = f"modelled: bytes / datasheet bandwidth {bw:g} GB/s ({hardware.source or hardware.key})"
        return total_bytes / (bw * 1e9) * 1e3, engine_bytes / (bw * 1e9) * 1e3
    provenance["t_memory_ms"] = (
        f"unavailable: hardware '{hardware.key}' has no datasheet bandwidth; the gap stage applies the "
        "measured bandwidth from microbench/memory.json"
    )
    return None, None


def _compute_floor(hardware: HardwareSpec, fmt: WeightFormat, flops: float,
                   provenance: dict[str, str]) -> tuple[float | None, str]:
    """(t_compute, the dtype whose datasheet peak it uses): the format's rate where the hardware has it, else bf16."""
    compute_dtype = fmt.compute_dtype if fmt.compute_dtype in hardware.peak_tflops else "bf16"
    peak = hardware.peak_tflops.get(compute_dtype)
    if peak:
        provenance["t_compute_ms"] = f"modelled: FLOPs / datasheet {compute_dtype} peak {peak:g} TFLOP/s"
        return flops / (peak * 1e12) * 1e3, compute_dtype
    provenance["t_compute_ms"] = f"unavailable: no datasheet {compute_dtype} peak for '{hardware.key}' (measured by microbench)"
    return None, compute_dtype


@dataclass(frozen=True)
class _Comm:
    """The all-reduces of one decode step and the communication floor they imply."""

    n: int
    msg_bytes: int
    link: float | None
    lat_us: float | None
    lat_source: str
    per_ar_us: float | None
    t_comm: float | None

    def fields(self, tp: int) -> dict[str, Any]:
        n = self.n
        return {
            "allreduces_per_token": n,
            "allreduce_message_bytes": self.msg_bytes,
            "allreduce_latency_us": self.lat_us if n else None,
            "allreduce_latency_source": self.lat_source if n else None,
            "allreduce_link_gbps": self.link if n else None,
            "allreduce_us_each": self.per_ar_us,
            # the bytes-over-link term alone: a measured latency L gives t_comm = n x (L + this) without this module
            "allreduce_bandwidth_us_each": (allreduce_time_us(self.msg_bytes, tp, 0.0, self.link) if n else None),
        }


def _comm_floor(spec: ModelSpec, hardware: HardwareSpec, tp: int, batch: int, allreduce_latency_us: float | None,
                allreduce_latency_source: str | None, provenance: dict[str, str]) -> _Comm:
    n_ar = allreduces_per_step(spec, tp)
    msg_bytes = spec.hidden * batch * 2
    link = hardware.interconnect.get("bandwidth_gbps") if isinstance(hardware.interconnect, dict) else None
    link = float(link) if isinstance(link, (int, float)) and not isinstance(link, bool) and link > 0 else None
    spec_lat, spec_lat_source = hardware.allreduce_latency()
    if allreduce_latency_us is not None:
        lat_us, lat_source = float(allreduce_latency_us), allreduce_latency_source or "config roofline.allreduce_latency_us"
    else:
        lat_us, lat_source = spec_lat, spec_lat_source
    per_ar_us = None
    if n_ar == 0:
        t_comm = 0.0
        provenance["t_comm_floor_ms"] = "modelled: TP1 has no all-reduce"
    elif lat_us is None:
        t_comm = None
        provenance["t_comm_floor_ms"] = (
            f"unavailable: no all-reduce latency for '{hardware.key}' ({lat_source}); measured by microbench/allreduce"
        )
    else:
        per_ar_us = allreduce_time_us(msg_bytes, tp, lat_us, link)
        t_comm = n_ar * per_ar_us / 1e3
        bw_note = f" + {msg_bytes} B ring at {link:g} GB/s" if link else " (no link bandwidth in the spec: latency only)"
        provenance["t_comm_floor_ms"] = (
            f"{'measured' if lat_source.startswith('measured') else 'modelled'}: {n_ar} all-reduces x "
            f"({lat_us:g} us latency{bw_note}); latency from {lat_source}"
        )
    return _Comm(n=n_ar, msg_bytes=msg_bytes, link=link, lat_us=lat_us, lat_source=lat_source, per_ar_us=per_ar_us,
                 t_comm=t_comm)


def _step_floor(t_memory: float | None, t_compute: float | None, t_comm: float | None, batch: int,
                provenance: dict[str, str]) -> tuple[float | None, str | None, float | None]:
    """(t_floor, bound, tokens/s ceiling): max(t_memory, t_compute) + t_comm_floor."""
    bound = None
    if t_memory is not None or t_compute is not None:
        t_floor = max(x for x in (t_memory, t_compute) if x is not None) + (t_comm or 0.0)
        bound = "memory" if (t_memory or 0) >= (t_compute or 0) else "compute"
        tokens_per_s = batch * 1e3 / t_floor if t_floor > 0 else None
        provenance["t_floor_ms"] = "modelled: max(t_memory, t_compute) + t_comm_floor" + (
            " (t_comm_floor unavailable: counted as 0 here)" if t_comm is None else "")
    else:
        t_floor = tokens_per_s = None
        provenance["t_floor_ms"] = "unavailable: no datasheet rates for this hardware; see gap.json for the measured-bandwidth floor"
    provenance["tokens_per_s_ceiling"] = provenance["t_floor_ms"]
    return t_floor, bound, tokens_per_s


def _add_shares(components: list[dict[str, Any]], total_bytes: float, bw: float | None) -> None:
    """Each component's bytes with scales, its share of the step's bytes and its time at the datasheet bandwidth."""
    for r in components:
        r["bytes_total"] = r["bytes"] + r.get("scale_bytes", 0.0)
        r["share"] = r["bytes_total"] / total_bytes if total_bytes else 0.0
        if bw:
            r["t_memory_ms"] = r["bytes_total"] / (bw * 1e9) * 1e3


def _model_identity(spec: ModelSpec) -> dict[str, Any]:
    return {"name": spec.name, "architecture": spec.architecture, "path": spec.path,
            "model_type": spec.model_type, "transformers_class": spec.model_class,
            "transformers_version": spec.transformers_version, "mtp_layers": spec.mtp_layers,
            "mtp_note": "MTP / next-n layers are not read in plain decode" if spec.mtp_layers else None}


def _param_fields(spec: ModelSpec) -> dict[str, Any]:
    """roofline.json's parameter counts, with the convention each count follows."""
    counts = parameter_counts(spec)
    return {
        "params_total": counts["params_total"],
        "params_active": counts["params_active"],
        "params_active_non_embedding": counts["params_active_non_embedding"],
        "params_embedding": counts["params_embedding"],
        "params_mtp": counts["params_mtp"],
        "params_total_with_mtp": counts["params_total_with_mtp"],
        "params_conventions": {
            "params_total": f"every parameter transformers {spec.transformers_version} builds for "
                            f"{spec.model_class} (its own count)",
            "params_active": "total minus the routed experts a token does not use, embedding table included "
                             "(Mistral, Qwen, DeepSeek convention)",
            "params_active_non_embedding": "params_active without the input embedding table (OpenAI convention)"
                                           + ("; the table is tied to the lm_head and stays" if spec.tie_embeddings else ""),
            "params_mtp": counts["params_mtp_note"] + "; never read in plain decode",
        },
    }


def compute_roofline(
    spec: ModelSpec,
    hardware: HardwareSpec,
    weight_format: str,
    tp: int = 1,
    ep: int = 1,
    batch: int = 1,
    context_len: int = 512,
    kv_cache_dtype: str = "auto",
    layout: str = "even",
    keep_bf16: tuple[str, ...] = (),
    allreduce_latency_us: float | None = None,
    gguf_path: str | None = None,
    allreduce_latency_source: str | None = None,
) -> dict[str, Any]:
    """The roofline of one decode step. `allreduce_latency_us` overrides the hardware spec's modelled latency
    (e.g. the micro-benchmark's measured one; say where it came from in `allreduce_latency_source`, which is
    labelled measured when it starts with 'measured')."""
    if weight_format not in WEIGHT_FORMATS:
        raise ConfigError(f"config field 'weight_format': unknown format '{weight_format}' (known: {', '.join(WEIGHT_FORMATS)})")
    if layout not in ("even", "engine"):
        raise ConfigError(f"config field 'roofline.layout': '{layout}' is not one of even, engine")
    fmt = WEIGHT_FORMATS[weight_format]
    keep = set(keep_bf16)
    kvd = kv_dtype(kv_cache_dtype, weight_format)
    provenance: dict[str, str] = {}

    weight_bytes, per_layout, rows_by_layout, components = _weight_components(
        spec, fmt, keep, layout, tp, ep, batch, gguf_path, provenance)
    kv_row, kv_rows, unknown, kv_how = _kv_component(spec, context_len, tp, kvd, batch, provenance)
    components = components + [kv_row]
    kv_bytes = kv_row["bytes"]
    total_bytes = weight_bytes + kv_bytes
    flops = _flops(spec, rows_by_layout[layout], components, context_len, tp, batch)

    bw = hardware.memory_bandwidth_gbps
    t_memory, t_memory_engine = _memory_floor(hardware, total_bytes, per_layout["engine"] + kv_bytes, provenance)
    t_compute, compute_dtype = _compute_floor(hardware, fmt, flops, provenance)
    comm = _comm_floor(spec, hardware, tp, batch, allreduce_latency_us, allreduce_latency_source, provenance)
    t_floor, bound, tokens_per_s = _step_floor(t_memory, t_compute, comm.t_comm, batch, provenance)
    _add_shares(components, total_bytes, bw)
    return {
        "stage": "roofline",
        "status": "ok",
        "model": _model_identity(spec),
        "weight_format": weight_format,
        "weight_format_description": fmt.description,
        "hardware": {
            "key": hardware.key, "name": hardware.name, "kind": hardware.kind,
            "memory_bandwidth_gbps": bw, "peak_tflops": hardware.peak_tflops, "interconnect": hardware.interconnect,
        },
        "tp": tp, "ep": ep, "batch_size": batch, "context_len": context_len, "kv_cache_dtype": kvd,
        "layout": layout, "keep_bf16": sorted(keep),
        **_param_fields(spec),
        "weight_bytes_per_token_per_gpu": weight_bytes,
        "kv_bytes_per_token_per_gpu": kv_bytes,
        "bytes_per_token_per_gpu": total_bytes,
        "weight_bytes_even_layout_per_gpu": per_layout["even"],
        "weight_bytes_engine_layout_per_gpu": per_layout["engine"],
        "replicated_weight_bytes_per_gpu": per_layout["engine"] - per_layout["even"],
        "t_memory_engine_layout_ms": t_memory_engine,
        "flops_per_token_per_gpu": flops,
        "compute_dtype": compute_dtype,
        "t_memory_ms": t_memory,
        "t_compute_ms": t_compute,
        "t_comm_floor_ms": comm.t_comm,
        "t_floor_ms": t_floor,
        "bound": bound,
        "tokens_per_s_ceiling": tokens_per_s,
        **comm.fields(tp),
        "kv_layers": kv_rows,
        "kv_unavailable_layers": sum(r["layers"] for r in unknown),
        "kv_note": kv_how,
        "provenance": provenance,
        "components": components,
    }


def components_table(result: dict[str, Any]):
    """The per-component table as a DataFrame (written as roofline_components.csv)."""
    import pandas as pd

    cols = ["component", "group", "dtype", "params", "bytes", "scale_bytes", "bytes_total", "share", "flops", "t_memory_ms", "replicated", "note"]
    df = pd.DataFrame(result["components"])
    for c in cols:
        if c not in df.columns:
            df[c] = None
    return df[cols]
