"""Weight bytes one GPU reads per decode step: the weight formats, each linear layer's bytes under the even
and engine layouts, and the exact tensor sizes of a GGUF file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..model import LinearLayer, ModelSpec, expected_distinct_experts, extra_params, linear_layers, norm_params

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


def _layer_bytes(lin: LinearLayer, fmt: WeightFormat, keep_bf16: set[str]) -> tuple[float, float, str]:
    """(weight bytes, scale bytes, dtype) of one copy of a linear layer."""
    if not lin.quantizable or lin.group in keep_bf16 or fmt.name == "bf16":
        return lin.params * 2.0, 0.0, "bf16"
    scale = lin.params * fmt.scale_bytes_per_param + fmt.per_tensor_scale_bytes
    return lin.params * fmt.bytes_per_param, scale, fmt.name


def _replicated(lin: LinearLayer, spec: ModelSpec) -> bool:
    """Layers that the engine layout does not shard: their per-GPU shape equals the full shape."""
    return lin.replicated or lin.group == "router"


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


def weight_components(spec: ModelSpec, fmt: WeightFormat, keep: set[str], layout: str, tp: int, ep: int, batch: int,
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
