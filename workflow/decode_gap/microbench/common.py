"""What every micro-benchmark shares: the settings, the device, and the shape of its summary JSON."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import schema_defaults, with_defaults
from ..errors import ConfigError
from ..host import cpu_model

# The schema's defaults (the one place they are written); `allreduce.world_size` null means tp.
DEFAULTS: dict[str, Any] = schema_defaults("microbench")


def microbench_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The `microbench` section with the schema's defaults filled in (the schema validated the types)."""
    out = with_defaults("microbench", config.get("microbench"))
    if not out["m_values"] or any(not isinstance(m, int) or m < 1 for m in out["m_values"]):
        raise ConfigError(f"config field 'microbench.m_values': expected positive integers, got {out['m_values']!r}")
    return out


def m_values_for(settings: dict[str, Any], env: "BenchEnv") -> list[int]:
    """M values to sweep: `m_values` on a GPU, `cpu_m_values` on a CPU host (CPU GEMMs are slow)."""
    values = settings["m_values"] if env.is_gpu else settings.get("cpu_m_values") or settings["m_values"]
    return sorted({int(m) for m in values})


@dataclass
class BenchEnv:
    """Where and how a micro-benchmark runs."""

    device: torch.device
    warmup: int = 5
    iters: int = 30
    cpu_budget_s: float = 0.25
    graphs: bool = True
    cpu_max_weight_elements: int = 200_000_000
    copy_gbps: float | None = None  # measured copy bandwidth (memory.json), for frac_of_copy_bw
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def capability(self) -> tuple[int, int] | None:
        return torch.cuda.get_device_capability(self.device) if self.is_gpu else None

    @property
    def sm(self) -> str:
        cap = self.capability
        return f"sm{cap[0]}{cap[1]}" if cap else "cpu"

    @property
    def device_name(self) -> str:
        return device_name(self.device)

    @property
    def backend(self) -> str:
        if self.is_gpu:
            return f"cuda {torch.version.cuda} / torch {torch.__version__} ({self.sm})"
        n = torch.get_num_threads()
        return f"cpu / torch {torch.__version__} ({n} thread{'s' if n != 1 else ''})"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu: {cpu_model() or platform.processor() or 'unknown'}"


def pick_device(prefer_gpu: bool = True) -> torch.device:
    if prefer_gpu and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def env_from_settings(settings: dict[str, Any], device: torch.device | None = None, copy_gbps: float | None = None) -> BenchEnv:
    device = device or pick_device()
    return BenchEnv(
        device=device,
        warmup=int(settings["warmup"]),
        iters=int(settings["iters"]),
        cpu_budget_s=float(settings.get("cpu_case_budget_s", 0.25)),
        graphs=bool(settings.get("graphs", True)),
        cpu_max_weight_elements=int(settings["cpu_max_weight_elements"]),
        copy_gbps=copy_gbps,
    )


def summary(stage: str, env: BenchEnv, backend: str, skipped: list[dict[str, str]], ran: int, **extra: Any) -> dict[str, Any]:
    """A stage JSON: ok when every case ran, partial when some were skipped, skipped when none ran."""
    if ran == 0:
        status = "skipped"
    elif skipped:
        status = "partial"
    else:
        status = "ok"
    out: dict[str, Any] = {"stage": stage, "status": status}
    if status != "ok":
        reasons = sorted({s["reason"] for s in skipped})
        out["reason"] = "; ".join(reasons[:4]) + (" ..." if len(reasons) > 4 else "") if reasons else "nothing ran"
    out.update({"device": env.device_name, "backend": backend, "torch": torch.__version__, "skipped": skipped})
    out.update(extra)
    return out


def skip(case: str, reason: str) -> dict[str, str]:
    return {"case": case, "reason": reason}


def read_copy_gbps(memory_json: str | Path | None) -> float | None:
    """copy_gbps from memory.json, or None (then frac_of_copy_bw is left empty)."""
    if not memory_json:
        return None
    from ..io import read_json

    try:
        data = read_json(memory_json)
    except (OSError, ValueError):
        return None
    value = data.get("copy_gbps")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None
