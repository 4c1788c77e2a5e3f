"""Audit findings: rules over the collected audit, each with severity, evidence and the command that fixes it.

A finding is `{"id", "severity": critical|warning|info, "title", "evidence", "fix"}`. A rule whose inputs are
unavailable on this host does not guess: it lands in `not_checked` as `{"id", "why"}`.
"""

from __future__ import annotations

from typing import Any, Callable

from . import parsers as P
from .fields import field_text, is_ok, value
from .parsers import DEEP_CSTATE_LATENCY_US

SEVERITIES = ("critical", "warning", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}
MIN_READ_REQ = 4096
IDLE_PSTATES_FROM = 5  # P5..P15 are idle/low-power performance states; the GPU drops its PCIe link speed there


def finding(id: str, severity: str, title: str, evidence: str, fix: str) -> dict[str, str]:
    assert severity in SEVERITIES, severity
    return {"id": id, "severity": severity, "title": title, "evidence": evidence, "fix": fix}


def sort_findings(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Most severe first (critical, warning, info), then by id: the order the report lists them in."""
    return sorted(findings, key=lambda f: (_RANK.get(f.get("severity"), len(SEVERITIES)), f.get("id", "")))


def summarize(findings: list[dict[str, Any]]) -> dict[str, int]:
    """Counts by severity: {"critical": n, "warning": n, "info": n, "total": n}."""
    out = {s: sum(1 for f in findings if f.get("severity") == s) for s in SEVERITIES}
    out["total"] = len(findings)
    return out


class NotChecked(Exception):
    """A rule's inputs are unavailable; the message says which and why."""


Rule = Callable[[dict[str, Any], dict[str, Any]], list[dict[str, str]]]
RULES: list[tuple[str, Rule]] = []


def rule(id: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES.append((id, fn))
        return fn

    return register


def _need(field: Any, what: str) -> Any:
    if not is_ok(field):
        raise NotChecked(f"{what} {field_text(field)}")
    return field["value"]


def _gpu_label(dev: dict[str, Any]) -> str:
    return f"GPU{dev.get('index')} ({dev.get('bus_id')})"


# ---------------------------------------------------------------- CPU and kernel


@rule("cpu-governor")
def _governor(audit: dict[str, Any], ctx: dict[str, Any]) -> list[dict[str, str]]:
    field = audit["tunables"]["cpufreq_governor"]
    _need(field, "cpufreq governor")
    counts = field.get("per_cpu") or {field["value"]: 1}
    bad = {g: n for g, n in counts.items() if g != "performance"}
    if not bad:
        return []
    total = sum(counts.values())
    shown = ", ".join(f"{g} on {n} of {total} CPUs" for g, n in bad.items())
    return [
        finding(
            "cpu-governor",
            "warning",
            "CPU frequency governor is not 'performance'",
            f"scaling_governor: {shown} ({field['source']}); the launch path of every decode step runs on the CPU",
            "echo performance | sudo tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor  "
            "# or: sudo cpupower frequency-set -g performance",
        )
    ]


@rule("cpufreq-driver")
def _cpufreq_driver(audit: dict[str, Any], ctx: dict[str, Any]) -> list[dict[str, str]]:
    driver = _need(audit["tunables"]["cpufreq_driver"], "cpufreq scaling driver")
    model = value(audit["host"]["cpu_model"], "") or ""
    if "AMD" in model.upper() and driver == "acpi-cpufreq":
        return [
            finding(
                "cpufreq-driver",
                "warning",
                "AMD CPU uses acpi-cpufreq instead of amd_pstate",
                f"scaling_driver: {driver} on {model} ({audit['tunables']['cpufreq_driver']['source']})",
                "add amd_pstate=active to GRUB_CMDLINE_LINUX in /etc/default/grub, then sudo update-grub && sudo reboot",
            )
        ]
    return []


@rule("numa-balancing")
def _numa_balancing(audit: dict[str, Any], ctx: dict[str, Any]) -> list[dict[str, str]]:
    field = audit["tunables"]["numa_balancing"]
    mode = _need(field, "kernel.numa_balancing")
    if mode == 0:
        return []
    nodes = value(audit["host"]["numa_nodes"])
    multi = nodes is None or nodes > 1
    return [
        finding(
            "numa-balancing",
            "warning" if multi else "info",
            "Automatic NUMA balancing is on",
            f"kernel.numa_balancing = {mode} ({field['source']}) on {nodes if nodes is not None else 'an unknown number of'}"
            f" NUMA node(s); page migrations stall the threads that feed the GPUs",
            "sudo sysctl -w kernel.numa_balancing=0 && echo 'kernel.numa_balancing = 0' | "
            "sudo tee /etc/sysctl.d/99-decode-gap.conf",
        )
    ]


@rule("deep-cstates")
def _deep_cstates(audit: dict[str, Any], ctx: dict[str, Any]) -> list[dict[str, str]]:
    tun = audit["tunables"]
    states_field = tun["cpuidle_states"]
    limits = value(tun["max_cstate"], {}) or {}
    cmd = limits.get("cmdline", {})
    if not is_ok(states_field):
        limited = any(
            cmd.get(k, "").isdigit() and int(cmd[k]) <= 1 for k in ("processor.max_cstate", "intel_idle.max_cstate")
        )
        if limited or cmd.get("idle") == "poll":
            return []
        raise NotChecked(f"cpuidle states {field_text(states_field)}; no max_cstate limit on the kernel cmdline")
    deep = [
        s
        for s in states_field["value"]
        if (s.get("name") or "").upper() != "POLL"
        and (s.get("latency_us") or 0) > DEEP_CSTATE_LATENCY_US
        and s.get("disabled_cpus", 0) < s.get("cpus", 1)
    ]
    if not deep:
        return []
    shown = ", ".join(
        f"{s['name']} ({s['latency_us']} us exit latency, enabled on {s['cpus'] - s['disabled_cpus']} of {s['cpus']} CPUs)"
        for s in deep
    )
    cmd_text = " ".join(f"{k}={v}" for k, v in cmd.items() if "cstate" in k) or "no max_cstate on the cmdline"
    return [
        finding(
            "deep-cstates",
            "warning",
            "Deep CPU C-states are allowed",
            f"enabled idle states deeper than {DEEP_CSTATE_LATENCY_US} us: {shown}; {cmd_text} "
            f"({states_field['source']}); waking a core adds latency to every kernel launch",
            f"for s in {' '.join(s['state'] for s in deep)}; do echo 1 | sudo tee /sys/devices/system/cpu/cpu*/cpuidle/$s/disable; "
            "done  # now; to persist add processor.max_cstate=1 intel_idle.max_cstate=1 to GRUB_CMDLINE_LINUX, "
            "sudo update-grub, reboot",
        )
    ]


def _kernel_fix(audit: dict[str, Any], minimum: str) -> str:
    os_name = (value(audit["host"]["os"], "") or "").lower()
    if "ubuntu" in os_name:
        return f"sudo apt install linux-generic-hwe-$(lsb_release -rs) && sudo reboot  # a kernel >= {minimum}"
    if "debian" in os_name:
        return f"sudo apt install -t $(lsb_release -cs)-backports linux-image-amd64 && sudo reboot  # a kernel >= {minimum}"
    if any(d in os_name for d in ("red hat", "rocky", "alma", "centos", "fedora")):
        return f"sudo dnf install kernel && sudo reboot  # a kernel >= {minimum} (ELRepo kernel-ml on EL)"
    return f"install a kernel >= {minimum} from your distribution and reboot"


@rule("kernel-too-old")
def _kernel(audit: dict[str, Any], ctx: dict[str, Any]) -> list[dict[str, str]]:
    field = audit["host"]["kernel_release"]
    release = _need(field, "kernel release")
    have = P.kernel_version_tuple(release)
    want = P.kernel_version_tuple(ctx["min_kernel"])
    if have is None or want is None:
        raise NotChecked(f"cannot compare kernel {release!r} with audit.min_kernel {ctx['min_kernel']!r}")
    if not P.version_less(have, want):
        return []
    return [
        finding(
            "kernel-too-old",
            "warning",
            f"Kernel older than {ctx['min_kernel']}",
            f"kernel {release} ({field['source']}) < audit.min_kernel {ctx['min_kernel']}",
            _kernel_fix(audit, ctx["min_kernel"]),
        )
    ]


# ---------------------------------------------------------------- GPUs and PCIe


def _devices(audit: dict[str, Any]) -> list[dict[str, Any]]:
    devs = audit["gpus"]["devices"]
    if not devs:
        raise NotChecked(f"no GPU found (GPU count {field_text(audit['gpus']['count'])})")
    return devs


@rule("pcie-max-read-req")
def _max_read_req(audit: dict[str, Any], ctx: dict[str, Any]) -> list[dict[str, str]]:
    devs = _devices(audit)
    seen, low = [], []
    for d in devs:
        f = d["pcie"]["max_read_req_bytes"]
        if is_ok(f):
            seen.append(d)
            if f["value"] < MIN_READ_REQ:
                low.append((d, f))
    if not seen:
        raise NotChecked("MaxReadReq " + field_text(devs[0]["pcie"]["max_read_req_bytes"]))
    if not low:
        return []
    shown = "; ".join(f"{_gpu_label(d)}: MaxReadReq {f['value']} bytes ({f['source']})" for d, f in low)
    bdfs = " ".join(d["bus_id"] for d, _ in low)
    return [
        finding(
            "pcie-max-read-req",
            "warning",
            f"PCIe MaxReadReq below {MIN_READ_REQ} bytes",
            f"{shown}; small read requests cut host-to-device and peer-to-peer PCIe throughput",
            f"for d in {bdfs}; do sudo setpci -s $d CAP_EXP+08.w=5000:7000; done  # 5 = 4096 bytes; "
            "not persistent: re-apply from a udev rule or systemd unit at boot",
        )
    ]


def _link_pair(d: dict[str, Any], kind: str) -> tuple[Any, Any, str, str, str] | None:
    """(current, max, source, current text, max text) of a GPU's link width or speed, or None if unknown."""
    pcie = d["pcie"]
    keys = {
        "width": [("link_width_current", "link_width_max", "x{}")],
        "speed": [
            ("link_speed_current_gts", "link_speed_max_gts", "{} GT/s"),
            ("link_gen_current", "link_gen_max", "Gen{}"),
        ],
    }[kind]
    for cur_key, max_key, fmt in keys:
        cur, mx = pcie[cur_key], pcie[max_key]
        if is_ok(cur) and is_ok(mx):
            return cur["value"], mx["value"], cur["source"], fmt.format(cur["value"]), fmt.format(mx["value"])
    return None


@rule("pcie-link-downtrained")
def _link(audit: dict[str, Any], ctx: dict[str, Any]) -> list[dict[str, str]]:
    devs = _devices(audit)
    widths, speeds, seen = [], [], False
    for d in devs:
        w = _link_pair(d, "width")
        s = _link_pair(d, "speed")
        seen = seen or bool(w or s)
        if w and w[0] < w[1]:
            widths.append((d, w))
        if s and s[0] < s[1]:
            speeds.append((d, s))
    if not seen:
        raise NotChecked("PCIe link " + field_text(devs[0]["pcie"]["link_width_current"]))
    out = []
    if widths:
        shown = "; ".join(f"{_gpu_label(d)}: {ct} of {mt} ({src})" for d, (_, _, src, ct, mt) in widths)
        bdfs = " ".join(d["bus_id"] for d, _ in widths)
        out.append(
            finding(
                "pcie-link-width-downtrained",
                "critical",
                "PCIe link trained narrower than the GPU supports",
                f"{shown}; lane count does not change with load, so bandwidth is lost all the time",
                f"for d in {bdfs}; do sudo lspci -vvv -s $d | grep -E 'LnkCap:|LnkSta:'; done  "
                "# then reseat the GPU/riser or fix the slot's bifurcation setting in the BIOS",
            )
        )
    if speeds:
        idle = []
        for d, _ in speeds:
            p = value(d["pstate"]) or ""
            idle.append(p.startswith("P") and p[1:].isdigit() and int(p[1:]) >= IDLE_PSTATES_FROM)
        all_idle = all(idle)
        shown = "; ".join(
            f"{_gpu_label(d)}: {ct} of {mt} ({src}), pstate {field_text(d['pstate'])}"
            for d, (_, _, src, ct, mt) in speeds
        )
        note = (
            "every such GPU is idle: GPUs lower their link speed in low-power states, so recheck under load"
            if all_idle
            else "at least one GPU is busy or its pstate is unknown, so the link is not just idling"
        )
        out.append(
            finding(
                "pcie-link-speed-downtrained",
                "info" if all_idle else "warning",
                "PCIe link running below its maximum speed",
                f"{shown}; {note}",
                "nvidia-smi --query-gpu=index,pstate,pcie.link.gen.current,pcie.link.gen.max,"
                "pcie.link.width.current,pcie.link.width.max --format=csv -l 1  # while a load runs; if still low, "
                "set the slot to its full PCIe generation in the BIOS and check the riser",
            )
        )
    return out


@rule("persistence-mode")
def _persistence(audit: dict[str, Any], ctx: dict[str, Any]) -> list[dict[str, str]]:
    devs = _devices(audit)
    known = [d for d in devs if is_ok(d["persistence_mode"])]
    if not known:
        raise NotChecked("persistence mode " + field_text(devs[0]["persistence_mode"]))
    off = [d for d in known if d["persistence_mode"]["value"] is False]
    if not off:
        return []
    shown = ", ".join(_gpu_label(d) for d in off)
    return [
        finding(
            "persistence-mode",
            "warning",
            "GPU persistence mode is off",
            f"persistence mode Disabled on {shown} ({off[0]['persistence_mode']['source']}); the driver tears "
            "the GPU state down between clients and the first CUDA call pays to rebuild it",
            "sudo nvidia-smi -pm 1  # or: sudo systemctl enable --now nvidia-persistenced",
        )
    ]


@rule("topology-cross-numa")
def _cross_numa(audit: dict[str, Any], ctx: dict[str, Any]) -> list[dict[str, str]]:
    field = audit["topology"]["matrix"]
    topo = _need(field, "GPU topology")
    pairs = topo.get("gpu_pairs", {})
    sys_pairs = [p for p, link in pairs.items() if link == "SYS"]
    if not sys_pairs:
        return []
    return [
        finding(
            "topology-cross-numa",
            "info",
            "Some GPU pairs talk across the CPU socket interconnect",
            f"{len(sys_pairs)} of {len(pairs)} GPU pairs are SYS (PCIe plus the inter-socket link), e.g. "
            f"{', '.join(sys_pairs[:4])} ({field['source']}); a tensor-parallel all-reduce across them is slower",
            "nvidia-smi topo -m  # keep each TP group on GPUs linked by NV# or PIX/PXB, "
            "e.g. CUDA_VISIBLE_DEVICES=0,1,2,3",
        )
    ]


def evaluate(audit: dict[str, Any], min_kernel: str = "6.8") -> dict[str, list[dict[str, str]]]:
    """Run every rule: {"findings": sorted findings, "not_checked": [{"id", "why"}]}."""
    ctx = {"min_kernel": str(min_kernel)}
    findings, not_checked = [], []
    for rid, fn in RULES:
        try:
            findings.extend(fn(audit, ctx))
        except NotChecked as exc:
            not_checked.append({"id": rid, "why": str(exc)})
    return {"findings": sort_findings(findings), "not_checked": not_checked}
