"""The audit's GPU and topology sections: NVML, `nvidia-smi -q` as the fallback, sysfs and `lspci` for PCIe."""

from __future__ import annotations

import re
from typing import Any, Callable

from ..errors import describe
from . import parsers as P
from .fields import first, na, ok
from .probe import Probe, ToolUnavailable, _tool_field

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA compatible controller, 3D controller


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
            whys.append(f"nvml: {describe(exc, 300, with_type=False)}")
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
