"""The roofline of one decode step: bytes, FLOPs, the floors they imply, and roofline.json (the package
docstring has the definitions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..hardware import HardwareSpec
from ..model import ModelSpec, parameter_counts
from .kv import attention_flops_per_sequence, kv_component, kv_dtype
from .weights import WEIGHT_FORMATS, WeightFormat, weight_components


def allreduces_per_step(spec: ModelSpec, tp: int) -> int:
    """Two per layer under TP (after attention, after the MLP/MoE), none at TP1; the seeds counted 2 x 78 = 156."""
    return 0 if tp <= 1 else 2 * spec.layers


def allreduce_time_us(message_bytes: float, tp: int, latency_us: float, link_gbps: float | None) -> float:
    """One all-reduce: latency + ring bytes over the link (2 (tp-1)/tp x message / bandwidth)."""
    bw = (message_bytes * 2 * (tp - 1) / tp / (link_gbps * 1e9) * 1e6) if link_gbps else 0.0
    return latency_us + bw


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

    weight_bytes, per_layout, rows_by_layout, components = weight_components(
        spec, fmt, keep, layout, tp, ep, batch, gguf_path, provenance)
    kv_row, kv_rows, unknown, kv_how = kv_component(spec, context_len, tp, kvd, batch, provenance)
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
