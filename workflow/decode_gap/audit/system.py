"""The audit's host and tunables sections (CPU, memory, NUMA, governors, idle states, IOMMU, ...)."""

from __future__ import annotations

import platform
from collections import Counter
from pathlib import Path
from typing import Any

from . import parsers as P
from .fields import first, is_ok, na, ok, value
from .probe import Probe, _file_field, _lscpu, _tool_field

# ---------------------------------------------------------------- host


def _cpuinfo_model(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("model name") or line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return None


def _count_unique(probe: Probe, pattern: str) -> dict[str, Any]:
    files = probe.glob(pattern)
    if not files:
        return na(f"no /{pattern}", "/" + pattern)
    vals = set()
    for f in files:
        try:
            vals.add(f.read_text().strip())
        except OSError:
            continue
    return ok(len(vals), "/" + pattern) if vals else na(f"/{pattern} unreadable", "/" + pattern)


def _count_dirs(probe: Probe, pattern: str) -> dict[str, Any]:
    found = [p for p in probe.glob(pattern) if p.is_dir()]
    return ok(len(found), "/" + pattern) if found else na(f"no /{pattern}", "/" + pattern)


def collect_host(probe: Probe) -> dict[str, Any]:
    def uname() -> dict[str, Any]:
        return ok(platform.release(), "uname") if probe.live else na("not the live root", "uname")

    def os_name(text: str) -> str:
        rel = P.parse_os_release(text)
        name = rel.get("PRETTY_NAME") or " ".join(filter(None, [rel.get("NAME"), rel.get("VERSION")]))
        if not name:
            raise ValueError("no PRETTY_NAME or NAME")
        return name

    def psutil_count(logical: bool) -> dict[str, Any]:
        if not probe.live:
            return na("not the live root", "psutil")
        import psutil

        n = psutil.cpu_count(logical=logical)
        return ok(n, "psutil.cpu_count") if n else na("psutil cannot count cores here", "psutil.cpu_count")

    def hypervisor() -> dict[str, Any]:
        lscpu = _lscpu(probe, "hypervisor")
        if is_ok(lscpu):
            return lscpu
        info = _file_field(probe, "/proc/cpuinfo", lambda t: "hypervisor" in t.split())
        if is_ok(info):
            # The cpuinfo flag says "a hypervisor is present", not which one.
            return ok("present (vendor unknown)" if info["value"] else "none", "/proc/cpuinfo flags")
        return first(lambda: lscpu, lambda: info)

    return {
        "kernel_release": first(lambda: _file_field(probe, "/proc/sys/kernel/osrelease"), uname),
        "kernel_cmdline": _file_field(probe, "/proc/cmdline"),
        "os": first(
            lambda: _file_field(probe, "/etc/os-release", os_name),
            lambda: ok(platform.platform(), "platform.platform") if probe.live else na("not the live root"),
        ),
        "cpu_model": first(
            lambda: _file_field(probe, "/proc/cpuinfo", _cpuinfo_model),
            lambda: _lscpu(probe, "model"),
        ),
        "sockets": first(
            lambda: _count_unique(probe, "sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id"),
            lambda: _lscpu(probe, "sockets"),
        ),
        "numa_nodes": first(
            lambda: _count_dirs(probe, "sys/devices/system/node/node[0-9]*"),
            lambda: _lscpu(probe, "numa_nodes"),
        ),
        "logical_cpus": first(lambda: psutil_count(True), lambda: _lscpu(probe, "cpus")),
        "physical_cores": first(
            lambda: psutil_count(False),
            lambda: _tool_field(
                probe, ["lscpu"], lambda t: (lambda d: d["sockets"] * d["cores_per_socket"])(P.parse_lscpu(t))
            ),
        ),
        "hypervisor": hypervisor(),
    }


# ---------------------------------------------------------------- tunables


def _governors(probe: Probe, name: str) -> dict[str, Any]:
    pattern = f"sys/devices/system/cpu/cpu[0-9]*/cpufreq/{name}"
    files = probe.glob(pattern)
    if not files:
        policy = probe.glob(f"sys/devices/system/cpu/cpufreq/policy[0-9]*/{name}")
        files, pattern = policy, f"sys/devices/system/cpu/cpufreq/policy*/{name}"
    if not files:
        return na(f"no /{pattern} (no cpufreq driver: a VM, or the BIOS owns frequency scaling)", "/" + pattern)
    counts = Counter()
    for f in files:
        try:
            counts[f.read_text().strip()] += 1
        except OSError:
            continue
    if not counts:
        return na(f"/{pattern} unreadable", "/" + pattern)
    field = ok(next(iter(counts)) if len(counts) == 1 else "mixed", "/" + pattern)
    field["per_cpu"] = dict(counts)
    return field


def _cpuidle_states(probe: Probe) -> dict[str, Any]:
    base = "sys/devices/system/cpu/cpu0/cpuidle"
    states = sorted(probe.glob(f"{base}/state[0-9]*"), key=lambda p: int(p.name[5:]))
    if not states:
        return na(f"no /{base}/state* (cpuidle not exposed: a VM or container, or idle=poll)", "/" + base)
    cpus = probe.glob("sys/devices/system/cpu/cpu[0-9]*/cpuidle")
    out = []
    for st in states:

        def rd(name: str, st: Path = st) -> str | None:
            try:
                return (st / name).read_text().strip()
            except OSError:
                return None

        latency = rd("latency")
        disabled_cpus = 0
        for c in cpus:
            try:
                disabled_cpus += (c / st.name / "disable").read_text().strip() == "1"
            except OSError:
                pass
        out.append(
            {
                "state": st.name,
                "name": rd("name"),
                "desc": rd("desc"),
                "latency_us": int(latency) if latency and latency.isdigit() else None,
                "disabled_cpus": disabled_cpus,
                "cpus": len(cpus),
            }
        )
    return ok(out, f"/{base}/state*/{{name,desc,latency}}, /sys/devices/system/cpu/cpu*/cpuidle/state*/disable")


def _iommu(probe: Probe, cmdline: dict[str, str]) -> dict[str, Any]:
    cls = probe.path("sys/class/iommu")
    groups = probe.path("sys/kernel/iommu_groups")
    if not cls.is_dir() and not groups.is_dir():
        return na("no /sys/class/iommu or /sys/kernel/iommu_groups", "/sys/class/iommu")
    units = sorted(p.name for p in probe.glob("sys/class/iommu/*") if not p.name.startswith("."))
    types = Counter()
    for t in probe.glob("sys/kernel/iommu_groups/[0-9]*/type"):
        try:
            types[t.read_text().strip()] += 1
        except OSError:
            continue
    params = P.iommu_params(cmdline)
    if not units and not types:
        mode = "off (no IOMMU units visible)"
    elif types and set(types) <= {"identity"}:
        mode = "passthrough"
    elif types:
        mode = "translated" if "identity" not in types else "mixed"
    else:
        mode = "on"
    if not types and params.get("iommu") == "pt":
        mode = "passthrough (iommu=pt)"
    return ok(
        {"mode": mode, "units": units, "group_types": dict(types), "cmdline": params},
        "/sys/class/iommu, /sys/kernel/iommu_groups/*/type, /proc/cmdline",
    )


def collect_tunables(probe: Probe) -> dict[str, Any]:
    cmd = _file_field(probe, "/proc/cmdline", P.parse_cmdline)
    cmdline = value(cmd, {}) or {}
    module_limits = {}
    for mod in ("processor", "intel_idle"):
        try:
            module_limits[mod] = int(probe.read(f"/sys/module/{mod}/parameters/max_cstate"))
        except (OSError, ValueError):
            pass
    max_cstate = (
        ok(
            {"cmdline": P.max_cstate_params(cmdline), "module_parameters": module_limits},
            "/proc/cmdline, /sys/module/{processor,intel_idle}/parameters/max_cstate",
        )
        if is_ok(cmd)
        else cmd
    )
    return {
        "cpufreq_governor": _governors(probe, "scaling_governor"),
        "cpufreq_driver": _governors(probe, "scaling_driver"),
        "amd_pstate_status": _file_field(probe, "/sys/devices/system/cpu/amd_pstate/status"),
        "numa_balancing": _file_field(probe, "/proc/sys/kernel/numa_balancing", int),
        "cpuidle_driver": _file_field(probe, "/sys/devices/system/cpu/cpuidle/current_driver"),
        "cpuidle_states": _cpuidle_states(probe),
        "max_cstate": max_cstate,
        "transparent_hugepages": _file_field(probe, "/sys/kernel/mm/transparent_hugepage/enabled", P.parse_thp),
        "transparent_hugepages_defrag": _file_field(probe, "/sys/kernel/mm/transparent_hugepage/defrag", P.parse_thp),
        "iommu": _iommu(probe, cmdline),
    }
