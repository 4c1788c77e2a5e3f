"""Cheap host identity, read while Snakemake builds the DAG (so: no torch import, no slow probes)."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class HostIdentity:
    gpu_names: tuple[str, ...]
    cpu_model: str
    driver: str | None

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def _gpus_from_nvml() -> tuple[tuple[str, ...], str | None] | None:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # no driver library, or no GPU: the caller falls back
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        names = []
        for i in range(count):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else name)
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        return tuple(names), driver
    finally:
        pynvml.nvmlShutdown()


def _gpus_from_smi() -> tuple[tuple[str, ...], str | None] | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    rows = [r.split(",") for r in out.strip().splitlines() if r.strip()]
    if not rows:
        return None
    return tuple(r[0].strip() for r in rows), rows[0][1].strip() if len(rows[0]) > 1 else None


@lru_cache(maxsize=1)
def host_identity() -> HostIdentity:
    found = _gpus_from_nvml() or _gpus_from_smi() or ((), None)
    return HostIdentity(gpu_names=found[0], cpu_model=cpu_model(), driver=found[1])


def _slug(text: str) -> str:
    text = re.sub(r"\(R\)|\(TM\)|\bCPU\b|@.*$|\bProcessor\b", "", text, flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def hardware_revision(identity: HostIdentity | None = None, override: str = "") -> str:
    """Readable slug of the hardware (GPU model x count, CPU model) plus a short hash of the whole identity."""
    if override:
        return override
    ident = identity or host_identity()
    if ident.gpu_names:
        gpu = _slug(ident.gpu_names[0].replace("NVIDIA", ""))
        head = f"{gpu}x{ident.gpu_count}"
    else:
        head = "cpu"
    cpu = "-".join(_slug(ident.cpu_model).split("-")[:4])
    digest = hashlib.sha256("|".join([*ident.gpu_names, ident.cpu_model]).encode()).hexdigest()[:6]
    return f"{head}-{cpu}-{digest}"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container or `taskset` may give fewer)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def free_port() -> int:
    """A loopback TCP port free at the time of asking (for a server this process starts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
