"""Environment fingerprint, computed cheaply while Snakemake builds the DAG.

Each rule takes only the components that can change its result as a param, so Snakemake's
params rerun trigger reruns exactly the stages a kernel, driver or tunable change invalidates.
Any component can be replaced for a rehearsal or a test with DECODE_GAP_FP_<COMPONENT> (upper case),
e.g. DECODE_GAP_FP_KERNEL=6.14.11.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
from pathlib import Path

from .host import host_identity

COMPONENTS = ("kernel", "driver", "cuda", "torch", "nccl", "governor", "tunables", "server")

# Which components each stage depends on (the roofline depends on none: model, hardware and config only).
STAGE_COMPONENTS = {
    "roofline": (),
    "audit": COMPONENTS,
    "microbench": ("kernel", "driver", "cuda", "torch", "nccl", "governor", "tunables"),
    "simulate": ("kernel", "driver", "cuda", "torch", "nccl", "governor", "tunables"),
    "live": ("kernel", "driver", "cuda", "torch", "nccl", "governor", "tunables", "server"),
}

ENV_PREFIX = "DECODE_GAP_FP_"


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _torch_cuda() -> str | None:
    # Read torch/version.py instead of importing torch (an import costs seconds at every DAG build).
    spec = importlib.util.find_spec("torch")
    if not spec or not spec.origin:
        return None
    text = _read(str(Path(spec.origin).parent / "version.py")) or ""
    match = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return match.group(1) if match else "cpu"


def _tunables() -> str:
    parts = []
    for label, path in (
        ("numa_balancing", "/proc/sys/kernel/numa_balancing"),
        ("thp", "/sys/kernel/mm/transparent_hugepage/enabled"),
        ("driver", "/sys/devices/system/cpu/cpu0/cpufreq/scaling_driver"),
    ):
        parts.append(f"{label}={_read(path) or 'n/a'}")
    cmdline = _read("/proc/cmdline") or ""
    keep = [t for t in cmdline.split() if t.split("=")[0] in {"processor.max_cstate", "intel_idle.max_cstate", "amd_pstate", "iommu", "intel_iommu", "amd_iommu"}]
    parts.append("cmdline=" + ",".join(keep))
    return ";".join(parts)


def measure_components(server: str = "") -> dict[str, str]:
    ident = host_identity()
    values = {
        "kernel": platform.release(),
        "driver": ident.driver or "none",
        "cuda": _torch_cuda() or "none",
        "torch": _dist_version("torch") or "none",
        "nccl": _dist_version("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11") or "none",
        "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") or "n/a",
        "tunables": _tunables(),
        "server": server or "none",
    }
    for name in COMPONENTS:
        override = os.environ.get(ENV_PREFIX + name.upper())
        if override is not None:
            values[name] = override
    return values


def for_stage(components: dict[str, str], stage: str) -> dict[str, str]:
    return {k: components[k] for k in STAGE_COMPONENTS[stage]}


def diff(old: dict[str, str], new: dict[str, str]) -> list[dict[str, str]]:
    """Components that changed between two fingerprints, as rows (component, before, after)."""
    keys = sorted(set(old) | set(new))
    return [
        {"component": k, "before": old.get(k, "—"), "after": new.get(k, "—")}
        for k in keys
        if old.get(k) != new.get(k)
    ]
