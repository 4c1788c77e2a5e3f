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
from typing import Any


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


# ------------------------------------------------------------------ PCI config space (audit and fingerprint)
GTS_BY_CODE = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def parse_pcie_config(config: bytes) -> dict[str, Any]:
    """PCI config space (sysfs `config`, read as root) -> the PCI Express capability's fields.

    Walks the capability list from 0x34 to capability ID 0x10 and decodes Device Capabilities (max payload
    supported), Device Control (MaxPayload, MaxReadReq: 128 << field), Link Capabilities and Link Status
    (speed code -> GT/s, width). Raises ValueError when the bytes are too short (a non-root read gives 64)
    or have no PCIe capability.
    """
    if len(config) < 0x40:
        raise ValueError(f"config space has {len(config)} bytes; the capability list needs root to read")
    if not (int.from_bytes(config[6:8], "little") & 0x10):
        raise ValueError("device has no capability list")
    ptr = config[0x34] & 0xFC
    seen = set()
    while ptr and ptr not in seen:
        seen.add(ptr)
        if ptr + 0x14 > len(config):
            raise ValueError(f"config space has {len(config)} bytes; the capability at {ptr:#x} needs root to read")
        cap_id, nxt = config[ptr], config[ptr + 1] & 0xFC
        if cap_id == 0x10:
            devcap = int.from_bytes(config[ptr + 4 : ptr + 8], "little")
            devctl = int.from_bytes(config[ptr + 8 : ptr + 10], "little")
            lnkcap = int.from_bytes(config[ptr + 0x0C : ptr + 0x10], "little")
            lnksta = int.from_bytes(config[ptr + 0x12 : ptr + 0x14], "little")
            return {
                "capability_offset": ptr,
                "devcap_max_payload": 128 << (devcap & 0x7),
                "max_payload": 128 << ((devctl >> 5) & 0x7),
                "max_read_req": 128 << ((devctl >> 12) & 0x7),
                "lnkcap_speed_gts": GTS_BY_CODE.get(lnkcap & 0xF),
                "lnkcap_width": (lnkcap >> 4) & 0x3F,
                "lnksta_speed_gts": GTS_BY_CODE.get(lnksta & 0xF),
                "lnksta_width": (lnksta >> 4) & 0x3F,
            }
        ptr = nxt
    raise ValueError("no PCI Express capability (ID 0x10) in the capability list")
