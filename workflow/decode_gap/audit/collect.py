"""Collect the host audit: every field with its source, or "unavailable: <why>" where a source cannot be read.

Sources, in order of preference where several can answer: sysfs/procfs, then tools (`lspci -vvv`, `lscpu`,
`nvidia-smi`), NVML through nvidia-ml-py (`pynvml`) for GPUs with `nvidia-smi -q` as the fallback, then psutil.
Nothing here raises for a missing source: in a VM or container most are missing, and the audit says so.
`Probe(root=...)` reads a fake root and `Probe(runner=...)` answers tool calls from fixture text, so tests can
replay a captured host.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping

from ..provenance import skipped_stage
from . import parsers as P
from .parsers import DEEP_CSTATE_LATENCY_US  # noqa: F401 - re-exported; collect and findings share it
from .fields import env_snapshot, first, is_ok, na, ok, scrub, secret_values, unavailable_map, value

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA compatible controller, 3D controller


class ToolUnavailable(Exception):
    """A tool is missing, failed, or timed out; the message is the one-line why."""


def run_command(argv: list[str], timeout: float = 20.0) -> str:
    """Run a system tool and return its stdout; raise ToolUnavailable with a one-line reason otherwise."""
    if not shutil.which(argv[0]):
        raise ToolUnavailable(f"{argv[0]} not on PATH")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ToolUnavailable(f"`{' '.join(argv)}` timed out after {timeout:.0f} s") from None
    except OSError as exc:
        raise ToolUnavailable(f"`{' '.join(argv)}`: {exc}") from None
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise ToolUnavailable(f"`{' '.join(argv)}` exited {proc.returncode}: {msg[0] if msg else 'no output'}")
    return proc.stdout


class Probe:
    """Where the audit reads from: a filesystem root, a tool runner, the environment, NVML and torch switches."""

    def __init__(
        self,
        root: str | os.PathLike = "/",
        runner: Callable[[list[str]], str] = run_command,
        env: Mapping[str, str] | None = None,
        use_nvml: bool = True,
        use_torch: bool = True,
    ):
        self.root = Path(root)
        self.runner = runner
        self.env = dict(os.environ if env is None else env)
        self.use_nvml = use_nvml
        self.use_torch = use_torch
        self._tool_cache: dict[tuple[str, ...], str | ToolUnavailable] = {}

    @property
    def live(self) -> bool:
        """True when reading this host's own root (psutil, platform and uname then describe the same host)."""
        return self.root == Path("/")

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def read(self, rel: str) -> str:
        return self.path(rel).read_text(encoding="utf-8", errors="replace").strip()

    def read_bytes(self, rel: str) -> bytes:
        return self.path(rel).read_bytes()

    def glob(self, pattern: str) -> list[Path]:
        return sorted(self.root.glob(pattern.lstrip("/")))

    def tool(self, argv: list[str]) -> str:
        key = tuple(argv)
        if key not in self._tool_cache:
            try:
                self._tool_cache[key] = self.runner(argv)
            except ToolUnavailable as exc:
                self._tool_cache[key] = exc
        got = self._tool_cache[key]
        if isinstance(got, ToolUnavailable):
            raise got
        return got


def _file_field(probe: Probe, rel: str, convert: Callable[[str], Any] = lambda s: s) -> dict[str, Any]:
    try:
        text = probe.read(rel)
    except FileNotFoundError:
        return na(f"{rel} does not exist", rel)
    except OSError as exc:
        return na(f"{rel}: {exc.strerror or exc}", rel)
    try:
        return ok(convert(text), rel)
    except (ValueError, TypeError) as exc:
        return na(f"{rel}: cannot parse {text[:40]!r}: {exc}", rel)


def _tool_field(probe: Probe, argv: list[str], extract: Callable[[str], Any]) -> dict[str, Any]:
    source = " ".join(argv)
    try:
        text = probe.tool(argv)
    except ToolUnavailable as exc:
        return na(str(exc), source)
    try:
        got = extract(text)
    except (ValueError, KeyError, TypeError) as exc:
        return na(f"`{source}`: cannot parse: {exc}", source)
    return ok(got, source) if got is not None else na(f"`{source}` does not report it", source)


def _lscpu(probe: Probe, key: str) -> dict[str, Any]:
    return _tool_field(probe, ["lscpu"], lambda t: P.parse_lscpu(t)[key])


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


# ---------------------------------------------------------------- GPUs


def _s(x: Any) -> Any:
    return x.decode() if isinstance(x, bytes) else x


def nvml_gpus() -> dict[str, Any]:
    """GPUs through NVML (nvidia-ml-py). Raises when NVML cannot start; per-attribute failures become None."""
    import pynvml

    pynvml.nvmlInit()
    try:
        errors: dict[str, str] = {}

        def get(label: str, fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except pynvml.NVMLError as exc:
                errors.setdefault(label, f"nvml: {exc}")
                return None

        cuda = get("cuda_driver", pynvml.nvmlSystemGetCudaDriverVersion_v2)
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            pci = get("bus_id", lambda: pynvml.nvmlDeviceGetPciInfo(h))
            mem = get("memory_total_mib", lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
            pm = get("persistence_mode", lambda: pynvml.nvmlDeviceGetPersistenceMode(h))
            pstate = get("pstate", lambda: pynvml.nvmlDeviceGetPerformanceState(h))
            limit = get("power_limit_w", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h))
            default = get("default_power_limit_w", lambda: pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h))

            def clocks(fn: Callable[[Any, int], int], label: str) -> dict[str, Any]:
                return {
                    "graphics": get(label, lambda: fn(h, pynvml.NVML_CLOCK_GRAPHICS)),
                    "sm": get(label, lambda: fn(h, pynvml.NVML_CLOCK_SM)),
                    "memory": get(label, lambda: fn(h, pynvml.NVML_CLOCK_MEM)),
                }

            nvlink = []
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    state = pynvml.nvmlDeviceGetNvLinkState(h, link)
                except pynvml.NVMLError as exc:
                    if link == 0:
                        errors.setdefault("nvlink", f"nvml: {exc}")
                    break
                nvlink.append({"link": link, "active": bool(state), "gbps": None})
            gpus.append(
                {
                    "index": i,
                    "bus_id": P.normalize_bdf(_s(pci.busId)) if pci else None,
                    "name": _s(get("name", lambda: pynvml.nvmlDeviceGetName(h))),
                    "memory_total_mib": mem.total // 2**20 if mem else None,
                    "persistence_mode": None if pm is None else bool(pm),
                    "pstate": None if pstate is None else f"P{pstate}",
                    "power_limit_w": None if limit is None else limit / 1000,
                    "default_power_limit_w": None if default is None else default / 1000,
                    "clocks_mhz": clocks(pynvml.nvmlDeviceGetClockInfo, "clocks_mhz"),
                    "max_clocks_mhz": clocks(pynvml.nvmlDeviceGetMaxClockInfo, "max_clocks_mhz"),
                    "applications_clocks_mhz": clocks(pynvml.nvmlDeviceGetApplicationsClock, "applications_clocks_mhz"),
                    "pcie_gen_current": get("pcie", lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
                    "pcie_gen_max": get("pcie", lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                    "pcie_width_current": get("pcie", lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
                    "pcie_width_max": get("pcie", lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)),
                    "nvlink": nvlink if nvlink or "nvlink" not in errors else None,
                    "errors": dict(errors),
                }
            )
            errors.clear()
        return {
            "driver_version": _s(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
            "gpus": gpus,
        }
    finally:
        pynvml.nvmlShutdown()


def _gpu_tool(probe: Probe) -> tuple[dict[str, Any] | None, str, list[str]]:
    """GPUs from NVML, else `nvidia-smi -q`: (parsed, source, reasons the earlier sources failed)."""
    whys = []
    if probe.use_nvml:
        try:
            return nvml_gpus(), "nvml (nvidia-ml-py)", whys
        except ImportError:
            whys.append("nvml: nvidia-ml-py (pynvml) not installed")
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            whys.append(f"nvml: {exc or type(exc).__name__}")
    else:
        whys.append("nvml: not used")
    try:
        parsed = P.parse_nvidia_smi_q(probe.tool(["nvidia-smi", "-q"]))
        for i, g in enumerate(parsed["gpus"]):
            g["index"] = i
        return parsed, "nvidia-smi -q", whys
    except ToolUnavailable as exc:
        whys.append(f"nvidia-smi: {exc}")
    return None, "", whys


def _sysfs_gpus(probe: Probe) -> tuple[dict[str, dict[str, Any]], str | None]:
    base = probe.path("sys/bus/pci/devices")
    if not base.is_dir():
        return {}, "no /sys/bus/pci/devices (no PCI bus visible: a container or a paravirtual VM)"
    out = {}
    for dev in sorted(base.iterdir()):
        try:
            vendor = (dev / "vendor").read_text().strip()
            cls = (dev / "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and cls.startswith(GPU_CLASSES):
            out[dev.name] = {"dir": dev, "rel": f"/sys/bus/pci/devices/{dev.name}"}
    return out, None


def _sysfs_pci(probe: Probe, dev: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Link speed/width and the config-space PCIe fields of one sysfs PCI device: (values, why per missing key)."""
    d, rel = dev["dir"], dev["rel"]
    vals: dict[str, Any] = {}
    whys: dict[str, str] = {}
    for name in ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width", "numa_node"):
        try:
            text = (d / name).read_text().strip()
        except OSError as exc:
            whys[name] = f"{rel}/{name}: {exc.strerror or 'unreadable'}"
            continue
        if "speed" in name:
            parsed = P.parse_link_speed(text)
        else:
            parsed = int(text) if re.fullmatch(r"-?\d+", text) else None
        if parsed is None:
            whys[name] = f"{rel}/{name} reads {text!r}"
        else:
            vals[name] = parsed
    try:
        cfg = P.parse_pcie_config((d / "config").read_bytes())
        vals.update({f"cfg_{k}": v for k, v in cfg.items()})
    except OSError as exc:
        whys["config"] = f"{rel}/config: {exc.strerror or 'unreadable'}"
    except ValueError as exc:
        whys["config"] = f"{rel}/config: {exc}"
    return vals, whys


def _lspci(probe: Probe) -> tuple[dict[str, dict[str, Any]], str | None]:
    try:
        text = probe.tool(["lspci", "-D", "-vvv"])
    except ToolUnavailable as exc:
        return {}, f"lspci: {exc}"
    devs = {
        bdf: d
        for bdf, d in P.parse_lspci_vvv(text).items()
        if d["vendor_nvidia"] and d["class"].startswith(("3D controller", "VGA compatible controller"))
    }
    return devs, None


Candidate = tuple[str, Any, "str | None"]  # (source, value or None, why it is missing)


def _pick(candidates: list[Candidate]) -> dict[str, Any]:
    """The first candidate with a value, else unavailable with every candidate's why."""
    whys, sources = [], []
    for source, val, why in candidates:
        if val is not None:
            return ok(val, source)
        sources.append(source)
        whys.append(why or f"{source}: no value")
    return na("; ".join(dict.fromkeys(whys)), ", ".join(dict.fromkeys(sources)))


class _GpuSources:
    """Every place one GPU's facts can come from (GPU tool, sysfs files, sysfs config, lspci), with whys."""

    def __init__(
        self,
        probe: Probe,
        bdf: str,
        tool: dict[str, Any],
        tool_source: str,
        tool_why: str | None,
        sysfs: dict[str, dict[str, Any]],
        sysfs_why: str | None,
        lspci: dict[str, dict[str, Any]],
        lspci_why: str | None,
    ):
        self.bdf = bdf
        self.gpu = tool
        self.errors = tool.get("errors", {})
        self.tool_source = tool_source or "nvml"
        self.tool_why = None if tool else tool_why
        self.rel = sysfs[bdf]["rel"] if bdf in sysfs else f"/sys/bus/pci/devices/{bdf}"
        self.sys_vals, self.sys_whys = _sysfs_pci(probe, sysfs[bdf]) if bdf in sysfs else ({}, {})
        self.sys_missing = sysfs_why or (None if bdf in sysfs else f"{self.rel} not present")
        self.lspci_dev = lspci.get(bdf, {})
        if lspci_why:
            self.lspci_missing = lspci_why
        elif self.lspci_dev.get("capabilities_access_denied"):
            self.lspci_missing = "lspci -vvv: capabilities <access denied> (needs root)"
        else:
            self.lspci_missing = None if self.lspci_dev else f"lspci: {bdf} not listed"

    # one candidate per source
    def sysfs(self, name: str) -> Candidate:
        return (f"sysfs {self.rel}/{name}", self.sys_vals.get(name), self.sys_missing or self.sys_whys.get(name))

    def config(self, name: str) -> Candidate:
        why = self.sys_missing or self.sys_whys.get("config")
        return (f"sysfs {self.rel}/config (PCIe capability)", self.sys_vals.get(f"cfg_{name}"), why)

    def lspci(self, name: str) -> Candidate:
        return ("lspci -vvv", self.lspci_dev.get(name), self.lspci_missing or f"lspci -vvv: no {name} for {self.bdf}")

    def tool(self, name: str, label: str | None = None) -> Candidate:
        why = self.errors.get(label or name) or self.tool_why or f"{self.tool_source} does not report {name}"
        return (self.tool_source, self.gpu.get(name), why)

    @staticmethod
    def gen(c: Candidate) -> Candidate:
        return (c[0], P.pcie_gen(c[1]), c[2])

    # fields
    def field(self, name: str) -> dict[str, Any]:
        return _pick([self.tool(name)])

    def clocks(self, name: str) -> dict[str, Any]:
        val = self.gpu.get(name) or {}
        if any(v is not None for v in val.values()):
            return ok(val, self.tool_source)
        return _pick([(self.tool_source, None, self.tool(name)[2])])

    def name(self) -> dict[str, Any]:
        if not self.gpu and self.lspci_dev:
            return ok(self.lspci_dev["description"].split(": ", 1)[-1], "lspci -vvv")
        return self.field("name")

    def pcie(self) -> dict[str, Any]:
        s, c, l, t, g = self.sysfs, self.config, self.lspci, self.tool, self.gen
        return {
            "link_speed_current_gts": _pick([s("current_link_speed"), l("lnksta_speed_gts"), c("lnksta_speed_gts")]),
            "link_speed_max_gts": _pick([s("max_link_speed"), l("lnkcap_speed_gts"), c("lnkcap_speed_gts")]),
            "link_gen_current": _pick(
                [
                    g(s("current_link_speed")),
                    g(l("lnksta_speed_gts")),
                    g(c("lnksta_speed_gts")),
                    t("pcie_gen_current", "pcie"),
                ]
            ),
            "link_gen_max": _pick(
                [g(s("max_link_speed")), g(l("lnkcap_speed_gts")), g(c("lnkcap_speed_gts")), t("pcie_gen_max", "pcie")]
            ),
            "link_width_current": _pick(
                [s("current_link_width"), l("lnksta_width"), c("lnksta_width"), t("pcie_width_current", "pcie")]
            ),
            "link_width_max": _pick(
                [s("max_link_width"), l("lnkcap_width"), c("lnkcap_width"), t("pcie_width_max", "pcie")]
            ),
            "max_read_req_bytes": _pick([l("max_read_req"), c("max_read_req")]),
            "max_payload_bytes": _pick([l("max_payload"), c("max_payload")]),
            "max_payload_supported_bytes": _pick([l("devcap_max_payload"), c("devcap_max_payload")]),
            "numa_node": _pick([s("numa_node")]),
        }


def collect_gpus(probe: Probe) -> dict[str, Any]:
    """GPUs from NVML or nvidia-smi, joined by PCI address with sysfs and lspci (which also find GPUs alone)."""
    tool, tool_source, tool_whys = _gpu_tool(probe)
    sysfs, sysfs_why = _sysfs_gpus(probe)
    lspci, lspci_why = _lspci(probe)
    tool_gpus = tool["gpus"] if tool else []
    tool_why = "; ".join(tool_whys) or None
    by_bdf = {g["bus_id"]: g for g in tool_gpus if g.get("bus_id")}
    bdfs = list(by_bdf) + [b for b in [*sysfs, *lspci] if b not in by_bdf]
    bdfs = list(dict.fromkeys(bdfs))

    devices = []
    for position, bdf in enumerate(bdfs):
        src = _GpuSources(probe, bdf, by_bdf.get(bdf, {}), tool_source, tool_why, sysfs, sysfs_why, lspci, lspci_why)
        index = src.gpu.get("index", position)
        if src.gpu.get("nvlink") is not None:
            nvlink = ok(src.gpu["nvlink"], src.tool_source)
        else:
            nvlink = first(
                lambda: _nvlink_smi(probe, index),
                lambda: na(src.errors.get("nvlink") or src.tool_why or "no NVLink data", src.tool_source),
            )
        devices.append(
            {
                "index": index,
                "bus_id": bdf,
                "name": src.name(),
                "memory_total_mib": src.field("memory_total_mib"),
                "persistence_mode": src.field("persistence_mode"),
                "pstate": src.field("pstate"),
                "clocks_mhz": src.clocks("clocks_mhz"),
                "max_clocks_mhz": src.clocks("max_clocks_mhz"),
                "applications_clocks_mhz": src.clocks("applications_clocks_mhz"),
                "power_limit_w": src.field("power_limit_w"),
                "default_power_limit_w": src.field("default_power_limit_w"),
                "pcie": src.pcie(),
                "nvlink": nvlink,
            }
        )

    if tool:
        count = ok(len(tool_gpus), tool_source)
    elif bdfs:
        count = ok(len(bdfs), "sysfs /sys/bus/pci/devices" if sysfs else "lspci -vvv")
    elif sysfs_why is None:
        count = ok(0, "sysfs /sys/bus/pci/devices (no NVIDIA display/3D controller)")
    else:
        count = na("; ".join(filter(None, [tool_why, sysfs_why, lspci_why])), "nvml, nvidia-smi, sysfs, lspci")

    def version(key: str) -> dict[str, Any]:
        if tool and tool.get(key):
            return ok(tool[key], tool_source)
        return na(tool_why or f"{tool_source} does not report it", tool_source or "nvml, nvidia-smi")

    return {
        "count": count,
        "driver": version("driver_version"),
        "cuda_driver": version("cuda_version"),
        "devices": devices,
    }


def _nvlink_smi(probe: Probe, index: int) -> dict[str, Any]:
    def extract(text: str) -> Any:
        parsed = P.parse_nvlink_status(text)
        return parsed.get(f"GPU{index}", [])

    return _tool_field(probe, ["nvidia-smi", "nvlink", "-s"], extract)


def collect_topology(probe: Probe) -> dict[str, Any]:
    def extract(text: str) -> dict[str, Any]:
        parsed = P.parse_nvidia_smi_topo(text)
        parsed["gpu_pairs"] = P.gpu_pair_links(parsed)
        parsed["text"] = P.ANSI_RE.sub("", text).rstrip()
        return parsed

    return {
        "matrix": _tool_field(probe, ["nvidia-smi", "topo", "-m"], extract),
        "nvlink": _tool_field(probe, ["nvidia-smi", "nvlink", "-s"], P.parse_nvlink_status),
    }


# ---------------------------------------------------------------- software and environment


def _dist(*names: str) -> dict[str, Any]:
    for name in names:
        try:
            return ok(importlib.metadata.version(name), f"pip metadata: {name}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return na(f"none of {', '.join(names)} installed", "pip metadata")


def collect_software(probe: Probe) -> dict[str, Any]:
    out: dict[str, Any] = {"python": ok(platform.python_version(), "platform.python_version")}
    nccl_dists = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
    if not probe.use_torch:
        why = "torch import not used"
        out.update(
            torch=na(why, "torch"), torch_cuda=na(why, "torch"), cuda_available=na(why, "torch"), nccl=na(why, "torch")
        )
        return out
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        why = f"import torch: {type(exc).__name__}: {exc}"
        out.update(torch=na(why, "torch"), torch_cuda=na(why, "torch"), cuda_available=na(why, "torch"))
        out["nccl"] = first(lambda: _dist(*nccl_dists))
        return out
    out["torch"] = ok(torch.__version__, "torch.__version__")
    out["torch_cuda"] = (
        ok(torch.version.cuda, "torch.version.cuda")
        if torch.version.cuda
        else na("torch is a CPU build", "torch.version.cuda")
    )
    avail = bool(torch.cuda.is_available())
    out["cuda_available"] = ok(avail, "torch.cuda.is_available")

    def nccl_torch() -> dict[str, Any]:
        if not avail:
            return na("no CUDA device visible to torch", "torch.cuda.nccl.version")
        v = torch.cuda.nccl.version()
        if isinstance(v, int):  # older torch: 22105 -> 2.21.5
            v = (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)
        return ok(".".join(str(p) for p in v), "torch.cuda.nccl.version")

    out["nccl"] = first(nccl_torch, lambda: _dist(*nccl_dists))
    return out


# ---------------------------------------------------------------- whole audit


def device_label(gpus: dict[str, Any], host: dict[str, Any]) -> str:
    names = [value(d["name"]) for d in gpus["devices"] if value(d["name"])]
    if names:
        return f"{names[0]} x{len(gpus['devices'])}"
    return f"cpu: {value(host['cpu_model'], 'unknown')}"


def collect_audit(
    params: Mapping[str, Any] | None = None,
    probe: Probe | None = None,
    now: _dt.datetime | None = None,
) -> dict[str, Any]:
    """The whole audit.json body (findings included). `params`: {"min_kernel", "api_key_env", "enabled"}."""
    from .findings import evaluate, summarize

    params = dict(params or {})
    probe = probe or Probe()
    if not params.get("enabled", True):
        why = "disabled in config (stages.audit)"
        return skipped_stage(
            "audit",
            why,
            findings=[],
            not_checked=[],
            summary=summarize([]),
            unavailable={},
            skipped=[{"case": "audit", "reason": why}],
        )
    host = collect_host(probe)
    gpus = collect_gpus(probe)
    audit: dict[str, Any] = {
        "stage": "audit",
        "status": "ok",
        "reason": "",
        "device": device_label(gpus, host),
        "collected_at": (now or _dt.datetime.now(_dt.timezone.utc)).isoformat(timespec="seconds"),
        "host": host,
        "tunables": collect_tunables(probe),
        "gpus": gpus,
        "topology": collect_topology(probe),
        "software": collect_software(probe),
        "env": ok(
            env_snapshot(probe.env), "environment (NCCL_*, CUDA_*, TORCH_*, PYTORCH_*; secret-looking names redacted)"
        ),
        "params": {"min_kernel": str(params.get("min_kernel", "6.8"))},
        "skipped": [],
    }
    result = evaluate(audit, min_kernel=audit["params"]["min_kernel"])
    audit["findings"] = result["findings"]
    audit["not_checked"] = result["not_checked"]
    audit["summary"] = summarize(result["findings"])
    audit["unavailable"] = unavailable_map(audit)
    api_env = params.get("api_key_env") or ""
    return scrub(audit, secret_values(probe.env, extra_names=(api_env,) if api_env else ()))

