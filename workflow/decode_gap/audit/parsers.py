"""Pure parsers for the text (and bytes) that system tools print. No I/O here: every function takes the text.

Each parser is tested on fixture text captured from the real tool (tests/fixtures/audit/).
"""

from __future__ import annotations

import re
from typing import Any

from ..host import GTS_BY_CODE, parse_pcie_config  # noqa: F401  (one PCIe capability walk, shared with the fingerprint)

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# PCIe generation by per-lane transfer rate (GT/s).
GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
# The Link Capabilities / Link Status speed field: encoded value -> GT/s.


# ---------------------------------------------------------------- kernel, OS, CPU


def parse_cmdline(text: str) -> dict[str, str]:
    """/proc/cmdline -> {param: value}; a bare flag gets "" (e.g. {"quiet": ""}). Arguments after `--` go to init."""
    out: dict[str, str] = {}
    for token in text.split():
        if token == "--":
            break
        key, sep, value = token.partition("=")
        out[key] = value if sep else ""
    return out


DEEP_CSTATE_LATENCY_US = 10  # exit latency above this is a "deep" idle state (C1E is 10 us on Intel)


def max_cstate_params(cmdline: dict[str, str]) -> dict[str, str]:
    """The C-state limits a kernel command line sets (processor.max_cstate, intel_idle.max_cstate, idle=...)."""
    keys = ("processor.max_cstate", "intel_idle.max_cstate", "idle", "cpuidle.off", "amd_pstate", "intel_pstate")
    return {k: cmdline[k] for k in keys if k in cmdline}


def iommu_params(cmdline: dict[str, str]) -> dict[str, str]:
    keys = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict")
    return {k: cmdline[k] for k in keys if k in cmdline}


def parse_os_release(text: str) -> dict[str, str]:
    """/etc/os-release (KEY="value" lines) -> dict."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip().strip('"').strip("'")
    return out


def parse_lscpu(text: str) -> dict[str, Any]:
    """`lscpu` (the default `Field: value` output) -> dict with typed sockets/numa_nodes/cpus and the raw fields."""
    raw: dict[str, str] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, _, value = line.partition(":")
        raw.setdefault(key.strip(), value.strip())

    def _int(key: str) -> int | None:
        try:
            return int(raw[key])
        except (KeyError, ValueError):
            return None

    return {
        "model": raw.get("Model name"),
        "vendor": raw.get("Vendor ID"),
        "cpus": _int("CPU(s)"),
        "sockets": _int("Socket(s)"),
        "cores_per_socket": _int("Core(s) per socket"),
        "threads_per_core": _int("Thread(s) per core"),
        "numa_nodes": _int("NUMA node(s)"),
        "hypervisor": raw.get("Hypervisor vendor"),
        "raw": raw,
    }


def parse_thp(text: str) -> str | None:
    """`always [madvise] never` -> "madvise" (the bracketed, selected value)."""
    match = re.search(r"\[([^\]]+)\]", text)
    return match.group(1) if match else (text.strip() or None)


def kernel_version_tuple(release: str) -> tuple[int, ...] | None:
    """ "6.8.0-45-generic" -> (6, 8, 0); "6.14.11-2-pve" -> (6, 14, 11); None when no version leads the string."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", release or "")
    if not match:
        return None
    return tuple(int(p) for p in match.group(1).split("."))


def version_less(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    n = max(len(a), len(b))
    return tuple(a) + (0,) * (n - len(a)) < tuple(b) + (0,) * (n - len(b))


# ---------------------------------------------------------------- PCIe


def parse_link_speed(text: str) -> float | None:
    """sysfs current_link_speed / max_link_speed ("16.0 GT/s PCIe", "8 GT/s", "2.5 GT/s") -> GT/s."""
    match = re.search(r"([\d.]+)\s*GT/s", text or "")
    return float(match.group(1)) if match else None


def pcie_gen(gts: float | None) -> int | None:
    """Per-lane rate (GT/s) -> PCIe generation (16 GT/s -> 4)."""
    if gts is None:
        return None
    return GEN_BY_GTS.get(round(gts, 1))


def normalize_bdf(bus_id: str) -> str:
    """ "00000000:18:00.0" (NVML) or "18:00.0" (lspci without -D) -> "0000:18:00.0" (sysfs)."""
    bus_id = bus_id.strip().lower()
    parts = bus_id.split(":")
    if len(parts) == 2:
        return "0000:" + bus_id
    if len(parts) == 3:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    return bus_id


_LSPCI_HEAD = re.compile(r"^([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7] ")
_LNK = re.compile(r"Speed\s+([\d.]+)GT/s(\s*\(([^)]*)\))?,\s*Width\s+x(\d+)(\s*\(([^)]*)\))?")


def parse_lspci_vvv(text: str) -> dict[str, dict[str, Any]]:
    """`lspci -vvv` (with or without -D) -> {bdf: {...}} for every device block.

    Per device: `description` (the header after the BDF), `class` ("3D controller"...), `vendor_nvidia`,
    `devcap_max_payload`, `max_payload`, `max_read_req` (bytes, from DevCtl), `lnkcap_speed_gts`,
    `lnkcap_width`, `lnksta_speed_gts`, `lnksta_width`, `speed_downgraded`, `width_downgraded`,
    `capabilities_access_denied` (lspci run without root prints `<access denied>`).
    """
    devices: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    section = ""
    for line in text.splitlines():
        if _LSPCI_HEAD.match(line):
            bdf, _, desc = line.partition(" ")
            cls, _, rest = desc.partition(": ")
            current = {
                "description": desc.strip(),
                "class": cls.strip(),
                "vendor_nvidia": "NVIDIA" in rest,
                "capabilities_access_denied": False,
            }
            devices[normalize_bdf(bdf)] = current
            section = ""
            continue
        if current is None:
            continue
        stripped = line.strip()
        if "Capabilities: <access denied>" in stripped:
            current["capabilities_access_denied"] = True
            continue
        if stripped.startswith(("DevCap:", "DevCtl:", "DevSta:", "LnkCap:", "LnkSta:", "LnkCtl:")):
            section = stripped.split(":", 1)[0]
        elif stripped.startswith(
            ("Capabilities:", "Kernel ", "DevCap2:", "DevCtl2:", "LnkCap2:", "LnkCtl2:", "LnkSta2:")
        ):
            section = stripped.split(":", 1)[0]
        mps = re.search(r"MaxPayload (\d+) bytes", stripped)
        if mps and section == "DevCap":
            current.setdefault("devcap_max_payload", int(mps.group(1)))
        elif mps and section == "DevCtl":
            current.setdefault("max_payload", int(mps.group(1)))
        mrrs = re.search(r"MaxReadReq (\d+) bytes", stripped)
        if mrrs and section == "DevCtl":
            current.setdefault("max_read_req", int(mrrs.group(1)))
        link = _LNK.search(stripped)
        if link and section in ("LnkCap", "LnkSta"):
            key = "lnkcap" if section == "LnkCap" else "lnksta"
            if f"{key}_speed_gts" not in current:
                current[f"{key}_speed_gts"] = float(link.group(1))
                current[f"{key}_width"] = int(link.group(4))
                if key == "lnksta":
                    current["speed_downgraded"] = "downgraded" in (link.group(3) or "")
                    current["width_downgraded"] = "downgraded" in (link.group(6) or "")
        if stripped.startswith("Kernel driver in use:"):
            current["driver"] = stripped.split(":", 1)[1].strip()
    return devices


def parse_lspci_hexdump(text: str) -> bytes:
    """`lspci -xxx` / `-xxxx` hex dump ("00: de 10 33 23 ...") -> the config-space bytes of the first device."""
    data = bytearray()
    for line in text.splitlines():
        match = re.match(r"^\s*([0-9a-fA-F]{2,3}):((?:\s[0-9a-fA-F]{2})+)\s*$", line)
        if not match:
            if data and _LSPCI_HEAD.match(line):
                break
            continue
        offset = int(match.group(1), 16)
        values = bytes(int(b, 16) for b in match.group(2).split())
        if offset != len(data):
            data.extend(b"\xff" * max(0, offset - len(data)))
        data[offset : offset + len(values)] = values
    return bytes(data)


# ---------------------------------------------------------------- nvidia-smi


def _smi_tree(text: str) -> dict[str, Any]:
    """Indented `Key : Value` lines -> nested dict. A section is a key without a value; the first duplicate wins."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("="):
            continue
        line = raw.replace("\t", "    ")
        indent = len(line) - len(line.lstrip(" "))
        key, sep, value = line.strip().partition(" : ")
        if not sep and line.strip().endswith(":"):
            key, value = line.strip()[:-1], ""
        key, value = key.strip(), value.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value or sep:
            parent.setdefault(key, value)
        else:
            node: dict[str, Any] = {}
            if key not in parent:
                parent[key] = node
            stack.append((indent, parent[key] if isinstance(parent[key], dict) else node))
    return root


def _num(value: Any) -> float | None:
    match = re.search(r"-?[\d.]+", str(value or ""))
    if not match or str(value).strip().upper() in ("N/A", "[N/A]"):
        return None
    try:
        return float(match.group(0))
    except ValueError:
        return None


def _int(value: Any) -> int | None:
    num = _num(value)
    return int(num) if num is not None else None


def _get(tree: dict[str, Any], *path: str) -> Any:
    node: Any = tree
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def parse_nvidia_smi_q(text: str) -> dict[str, Any]:
    """`nvidia-smi -q` -> {"driver_version", "cuda_version", "gpus": [...]}, one dict per GPU in output order.

    Per GPU: bus_id (sysfs form), name, persistence_mode (bool), pstate, memory_total_mib, power_limit_w,
    default_power_limit_w, clocks_mhz {sm, memory, graphics}, max_clocks_mhz, applications_clocks_mhz,
    pcie_gen_current/max, pcie_width_current/max. Missing values are None.
    """
    tree = _smi_tree(text)
    gpus = []
    for key, node in tree.items():
        if not key.startswith("GPU ") or not isinstance(node, dict):
            continue
        power = _get(node, "GPU Power Readings") or _get(node, "Power Readings") or {}
        link = _get(node, "PCI", "GPU Link Info") or {}
        gen = link.get("PCIe Generation") or {}
        width = link.get("Link Width") or {}
        persistence = str(node.get("Persistence Mode", "")).strip().lower()

        def clocks(section: str) -> dict[str, int | None]:
            sec = node.get(section) or {}
            return {"graphics": _int(sec.get("Graphics")), "sm": _int(sec.get("SM")), "memory": _int(sec.get("Memory"))}

        gpus.append(
            {
                "bus_id": normalize_bdf(key.split(" ", 1)[1]),
                "name": node.get("Product Name"),
                "persistence_mode": {"enabled": True, "disabled": False}.get(persistence),
                "pstate": node.get("Performance State"),
                "memory_total_mib": _int(_get(node, "FB Memory Usage", "Total")),
                "power_limit_w": _num(
                    power.get("Current Power Limit") or power.get("Enforced Power Limit") or power.get("Power Limit")
                ),
                "default_power_limit_w": _num(power.get("Default Power Limit")),
                "max_power_limit_w": _num(power.get("Max Power Limit")),
                "clocks_mhz": clocks("Clocks"),
                "max_clocks_mhz": clocks("Max Clocks"),
                "applications_clocks_mhz": clocks("Applications Clocks"),
                "pcie_gen_current": _int(gen.get("Current")),
                "pcie_gen_max": _int(gen.get("Max")),
                "pcie_gen_device_max": _int(gen.get("Device Max")),
                "pcie_gen_host_max": _int(gen.get("Host Max")),
                "pcie_width_current": _int(width.get("Current")),
                "pcie_width_max": _int(width.get("Max")),
                "minor_number": _int(node.get("Minor Number")),
            }
        )
    return {
        "driver_version": tree.get("Driver Version"),
        "cuda_version": tree.get("CUDA Version"),
        "attached_gpus": _int(tree.get("Attached GPUs")),
        "gpus": gpus,
    }


def parse_nvidia_smi_topo(text: str) -> dict[str, Any]:
    """`nvidia-smi topo -m` -> {"devices", "matrix": {row: {col: link}}, "affinity": {row: {...}}, "nics", "legend"}.

    Columns are tab separated (empty cells kept); ANSI escapes are stripped.
    """
    text = ANSI_RE.sub("", text)
    lines = text.splitlines()
    header: list[str] | None = None
    matrix: dict[str, dict[str, str]] = {}
    affinity: dict[str, dict[str, str]] = {}
    legend: dict[str, str] = {}
    nics: dict[str, str] = {}
    devices: list[str] = []
    for line in lines:
        if header is None and "\t" in line and re.search(r"\bGPU0\b", line):
            header = [c.strip() for c in line.split("\t")]
            devices = [c for c in header[1:] if re.fullmatch(r"(GPU|NIC|mlx\d*_|NVS)\w*", c)]
            continue
        if header is not None and re.match(r"^(GPU\d+|NIC\d+|mlx\w+)\t", line):
            cells = [c.strip() for c in line.split("\t")]
            row = cells[0]
            matrix[row] = dict(zip(devices, cells[1 : 1 + len(devices)]))
            # The affinity columns follow; nvidia-smi prints an extra empty cell among them, so skip empties.
            attrs = [c for c in header[1 + len(devices) :] if c]
            affinity[row] = dict(zip(attrs, [c for c in cells[1 + len(devices) :] if c]))
            continue
        legend_match = re.match(r"^\s+(X|SYS|NODE|PHB|PXB|PIX|NV#|NV\d+)\s+=\s+(.*)$", line)
        if legend_match:
            legend[legend_match.group(1)] = legend_match.group(2).strip()
            continue
        nic_match = re.match(r"^\s+(NIC\d+):\s+(\S+)", line)
        if nic_match:
            nics[nic_match.group(1)] = nic_match.group(2)
    if header is None:
        raise ValueError("no GPU0 column header in `nvidia-smi topo -m` output")
    return {"devices": devices, "matrix": matrix, "affinity": affinity, "nics": nics, "legend": legend}


def gpu_pair_links(topo: dict[str, Any]) -> dict[str, str]:
    """GPU-to-GPU links of a parsed topology, each unordered pair once: {"GPU0-GPU1": "NV18", ...}."""
    gpus = [d for d in topo.get("devices", []) if d.startswith("GPU")]
    out = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            link = topo.get("matrix", {}).get(a, {}).get(b)
            if link:
                out[f"{a}-{b}"] = link
    return out


def parse_nvlink_status(text: str) -> dict[str, list[dict[str, Any]]]:
    """`nvidia-smi nvlink -s` -> {"GPU0": [{"link": 0, "active": True, "gbps": 26.562}, ...]}."""
    out: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] | None = None
    for line in text.splitlines():
        gpu = re.match(r"^GPU (\d+):", line)
        if gpu:
            current = out.setdefault(f"GPU{gpu.group(1)}", [])
            continue
        link = re.match(r"^\s+Link (\d+):\s*(.*)$", line)
        if link and current is not None:
            value = link.group(2).strip()
            inactive = "inactive" in value.lower()
            speed = None if inactive else _num(value)
            current.append({"link": int(link.group(1)), "active": not inactive, "gbps": speed})
    return out
