"""Hardware specs from config/hardware/*.yaml, chosen by name or detected from the GPU name."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, describe
from .host import HostIdentity, host_identity

MEASURE = "measure"


@dataclass(frozen=True)
class HardwareSpec:
    key: str  # file stem
    name: str
    kind: str  # gpu | cpu
    arch: str
    memory_bandwidth_gbps: float | None  # None: measure it
    peak_tflops: dict[str, float] = field(default_factory=dict)
    interconnect: dict[str, Any] = field(default_factory=dict)
    memory_gb: float | None = None
    source: str = ""
    path: str = ""

    @property
    def needs_measurement(self) -> bool:
        return self.memory_bandwidth_gbps is None

    def allreduce_latency(self) -> tuple[float | None, str]:
        """(latency of one small all-reduce in us, where it comes from) from the interconnect entry.

        None when the spec has none or says 'measure' (then the micro-benchmark's figure is the only source)."""
        ic = self.interconnect if isinstance(self.interconnect, dict) else {}
        value = ic.get("allreduce_latency_us")
        source = str(ic.get("allreduce_latency_source") or "")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value), f"hardware spec {self.key}: interconnect.allreduce_latency_us ({source or 'no source given'})"
        why = "the spec says 'measure'" if value == MEASURE else "the spec has no interconnect.allreduce_latency_us"
        return None, why


def _number_or_none(value: Any, where: str) -> float | None:
    if value == MEASURE or value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    raise ConfigError(f"{where}: expected a positive number or '{MEASURE}', got {value!r}")


def load_hardware_file(path: Path) -> HardwareSpec:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({describe(exc, 300, with_type=False)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping")
    for key in ("name", "kind", "memory_bandwidth_gbps"):
        if key not in data:
            raise ConfigError(f"{path}: field '{key}' is missing")
    ic = data.get("interconnect") or {}
    if not isinstance(ic, dict):
        raise ConfigError(f"{path}: field 'interconnect' must be a mapping")
    if "allreduce_latency_us" in ic:
        _number_or_none(ic["allreduce_latency_us"], f"{path}: field 'interconnect.allreduce_latency_us'")
        if ic["allreduce_latency_us"] != MEASURE and not ic.get("allreduce_latency_source"):
            raise ConfigError(f"{path}: field 'interconnect.allreduce_latency_source' is missing (cite where the "
                              "latency comes from)")
    peaks = {
        dt: v
        for dt, raw in (data.get("peak_tflops") or {}).items()
        if (v := _number_or_none(raw, f"{path}: field 'peak_tflops.{dt}'")) is not None
    }
    return HardwareSpec(
        key=path.stem,
        name=data["name"],
        kind=data["kind"],
        arch=str(data.get("arch", "")),
        memory_bandwidth_gbps=_number_or_none(data["memory_bandwidth_gbps"], f"{path}: field 'memory_bandwidth_gbps'"),
        peak_tflops=peaks,
        interconnect=data.get("interconnect") or {},
        memory_gb=data.get("memory_gb"),
        source=data.get("source", ""),
        path=str(path),
    )


def available(hw_dir: Path) -> list[str]:
    return sorted(p.stem for p in hw_dir.glob("*.yaml"))


def resolve_hardware(name: str, hw_dir: str | Path, identity: HostIdentity | None = None) -> HardwareSpec:
    """`name` is a file stem in hw_dir, or 'auto' (match the first GPU's name; CPU spec when there is none)."""
    hw_dir = Path(hw_dir)
    if name != "auto":
        path = hw_dir / f"{name}.yaml"
        if not path.exists():
            raise ConfigError(
                f"config field 'hardware': no spec named '{name}' in {hw_dir}/ (available: {', '.join(available(hw_dir))}, auto)"
            )
        return load_hardware_file(path)
    ident = identity or host_identity()
    if not ident.gpu_names:
        return load_hardware_file(hw_dir / "cpu.yaml")
    gpu = ident.gpu_names[0]
    for stem in available(hw_dir):
        path = hw_dir / f"{stem}.yaml"
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if any(m.lower() in gpu.lower() for m in data.get("match") or []):
            return load_hardware_file(path)
    # An unknown GPU: no datasheet, so every rate is measured.
    return HardwareSpec(key="unknown-gpu", name=gpu, kind="gpu", arch="", memory_bandwidth_gbps=None,
                        source=f"no spec in {hw_dir}/ matches '{gpu}': rates are measured")
