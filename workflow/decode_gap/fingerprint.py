"""Environment fingerprint, computed cheaply while Snakemake builds the DAG.

Each rule takes only the components that can change its result as a param, so Snakemake's
params rerun trigger reruns exactly the stages a kernel, driver or tunable change invalidates.
Any component can be replaced for a rehearsal or a test with DECODE_GAP_FP_<COMPONENT> (upper case),
e.g. DECODE_GAP_FP_KERNEL=6.14.11. Components: kernel, driver, cuda, torch, nccl, governor, tunables (NUMA
balancing, THP, scaling driver, C-state/IOMMU cmdline), pcie (per NVIDIA GPU: link speed and width, MaxReadReq,
MaxPayload), gpu (per GPU: persistence mode, power limit, application SM clock), server.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import re
from pathlib import Path

from .host import host_identity, parse_pcie_config
from .io import write_json

COMPONENTS = ("kernel", "driver", "cuda", "torch", "nccl", "governor", "tunables", "pcie", "gpu", "server")
HOST = ("kernel", "driver", "cuda", "torch", "nccl", "governor", "tunables", "pcie", "gpu")

# Which components each stage depends on (the roofline depends on none: model, hardware and config only).
STAGE_COMPONENTS = {
    "roofline": (),
    "audit": COMPONENTS,
    "microbench": HOST,
    "simulate": HOST,
    "live": (*HOST, "server"),
}

ENV_PREFIX = "DECODE_GAP_FP_"
# On a cluster the DAG is built on the submit host; `fleet detect` records the node type's fingerprint here.
NODE_RECORD = "node_fingerprint.json"


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


def _pcie_devctl(config_path: Path) -> tuple[str, str]:
    """MaxReadReq and MaxPayload from the PCIe capability's Device Control register in sysfs config space.

    Only root can read past the first 64 bytes; then both are 'n/a' (the audit reads them with lspci instead).
    """
    try:
        cap = parse_pcie_config(config_path.read_bytes())
    except (OSError, ValueError):
        return "n/a", "n/a"
    return str(cap["max_read_req"]), str(cap["max_payload"])


def _pcie() -> str:
    """Link speed and width, MaxReadReq and MaxPayload of every NVIDIA display/3D device (sysfs; no subprocess)."""
    parts = []
    for dev in sorted(Path("/sys/bus/pci/devices").glob("*")):
        if _read(str(dev / "vendor")) != "0x10de" or not (_read(str(dev / "class")) or "").startswith("0x03"):
            continue
        speed = (_read(str(dev / "current_link_speed")) or "n/a").replace(" PCIe", "").replace(" ", "")
        width = _read(str(dev / "current_link_width")) or "n/a"
        mrr, mps = _pcie_devctl(dev / "config")
        parts.append(f"{dev.name}:{speed}x{width}:mrr={mrr}:mps={mps}")
    return ";".join(parts) or "none"


def _gpu_settings() -> str:
    """Persistence mode, power limit and application SM clock of each GPU (NVML), the settings that move results."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # no driver library or no GPU
        return "none"
    parts = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            vals = []
            for label, call in (
                ("pm", lambda: pynvml.nvmlDeviceGetPersistenceMode(h)),
                ("pl_w", lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h) // 1000),
                ("app_sm_mhz", lambda: pynvml.nvmlDeviceGetApplicationsClock(h, pynvml.NVML_CLOCK_SM)),
            ):
                try:
                    vals.append(f"{label}={call()}")
                except Exception:
                    vals.append(f"{label}=n/a")
            parts.append(f"gpu{i}:" + ",".join(vals))
    except Exception:
        return "n/a"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return ";".join(parts) or "none"


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
        "pcie": _pcie(),
        "gpu": _gpu_settings(),
        "server": server or "none",
    }
    return _overridden(values)


def _overridden(values: dict[str, str]) -> dict[str, str]:
    for name in COMPONENTS:
        override = os.environ.get(ENV_PREFIX + name.upper())
        if override is not None:
            values[name] = override
    return values


def record_node(results_dir: str | os.PathLike, identity: dict) -> Path:
    """Keep a node's fingerprint (from `fleet identify`) beside its revision's results, for cluster DAGs."""
    path = Path(results_dir) / identity["hardware_revision"] / NODE_RECORD
    write_json(path, {"host": identity.get("host", ""), "components": identity["fingerprint"]})
    return path


def for_dag(res_dir: str | os.PathLike, server: str, cluster: bool) -> tuple[dict[str, str], str]:
    """The fingerprint the rules' rerun triggers compare against, and where it was taken.

    A local run measures this host. A cluster run builds its DAG on the submit host, which is not the node
    measured: it uses the node record that `fleet detect` wrote, and says so when there is none.
    """
    if not cluster:
        return measure_components(server), "this host"
    record = Path(res_dir) / NODE_RECORD
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
        values = {k: str(data["components"].get(k, "none")) for k in COMPONENTS}
    except (OSError, ValueError, KeyError, AttributeError):
        return measure_components(server), (
            f"the submit host (no readable {record}: `python -m decode_gap.fleet detect` records the node's)"
        )
    values["server"] = server or "none"
    return _overridden(values), f"node {data.get('host') or '?'} ({record}, written by fleet detect)"


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
