"""Every audit finding rule, positive and negative, on small audit dicts; plus ordering and summary helpers."""

import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from decode_gap.audit import sort_findings, summarize  # noqa: E402
from decode_gap.audit.fields import field_text, na, ok  # noqa: E402
from decode_gap.audit.findings import evaluate  # noqa: E402


def states(*rows):
    return ok(
        [
            {"state": f"state{i}", "name": n, "desc": "", "latency_us": lat, "disabled_cpus": dis, "cpus": 4}
            for i, (n, lat, dis) in enumerate(rows)
        ],
        "/sys/devices/system/cpu/cpu0/cpuidle",
    )


def gpu(index=0, bdf="0000:18:00.0", mrrs=4096, speed=(32.0, 32.0), width=(16, 16), pm=True, pstate="P0"):
    return {
        "index": index,
        "bus_id": bdf,
        "name": ok("NVIDIA H100 80GB HBM3", "nvml"),
        "persistence_mode": ok(pm, "nvml") if pm is not None else na("nvml: Not Supported", "nvml"),
        "pstate": ok(pstate, "nvml") if pstate else na("nvml: Not Supported", "nvml"),
        "pcie": {
            "link_speed_current_gts": ok(speed[0], "sysfs current_link_speed") if speed else na("no sysfs"),
            "link_speed_max_gts": ok(speed[1], "sysfs max_link_speed") if speed else na("no sysfs"),
            "link_gen_current": na("no sysfs"),
            "link_gen_max": na("no sysfs"),
            "link_width_current": ok(width[0], "sysfs current_link_width") if width else na("no sysfs"),
            "link_width_max": ok(width[1], "sysfs max_link_width") if width else na("no sysfs"),
            "max_read_req_bytes": ok(mrrs, "lspci -vvv") if mrrs else na("lspci: lspci not on PATH", "lspci -vvv"),
        },
    }


GOOD = {
    "host": {
        "kernel_release": ok("6.14.11-2-pve", "/proc/sys/kernel/osrelease"),
        "os": ok("Debian GNU/Linux 12 (bookworm)", "/etc/os-release"),
        "cpu_model": ok("AMD EPYC 9654 96-Core Processor", "/proc/cpuinfo"),
        "numa_nodes": ok(2, "/sys/devices/system/node"),
    },
    "tunables": {
        "cpufreq_governor": dict(ok("performance", "/sys/.../scaling_governor"), per_cpu={"performance": 4}),
        "cpufreq_driver": dict(ok("amd-pstate-epp", "/sys/.../scaling_driver"), per_cpu={"amd-pstate-epp": 4}),
        "numa_balancing": ok(0, "/proc/sys/kernel/numa_balancing"),
        "cpuidle_states": states(("POLL", 0, 0), ("C1", 1, 0), ("C2", 18, 4)),  # C2 disabled on every CPU
        "max_cstate": ok({"cmdline": {}, "module_parameters": {}}, "/proc/cmdline"),
    },
    "gpus": {"count": ok(2, "nvml"), "devices": [gpu(0), gpu(1, "0000:2a:00.0")]},
    "topology": {"matrix": ok({"gpu_pairs": {"GPU0-GPU1": "NV18"}}, "nvidia-smi topo -m")},
}


def run(audit=None, min_kernel="6.8"):
    return evaluate(audit or GOOD, min_kernel=min_kernel)


def ids(result):
    return {f["id"] for f in result["findings"]}


def changed(path, value):
    audit = copy.deepcopy(GOOD)
    node = audit
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return audit


def test_good_host_has_no_findings_and_checks_everything():
    got = run()
    assert got == {"findings": [], "not_checked": []}


# ---------------------------------------------------------------- governor


@pytest.mark.parametrize(
    "counts, fires",
    [({"performance": 4}, False), ({"powersave": 4}, True), ({"schedutil": 2, "performance": 2}, True)],
)
def test_governor(counts, fires):
    field = dict(ok("performance" if len(counts) == 1 else "mixed", "/sys/x"), per_cpu=counts)
    if len(counts) == 1:
        field["value"] = next(iter(counts))
    got = run(changed(("tunables", "cpufreq_governor"), field))
    assert ("cpu-governor" in ids(got)) is fires
    if fires:
        (f,) = got["findings"]
        assert f["severity"] == "warning" and "performance" in f["fix"]


def test_governor_unavailable_is_not_checked():
    got = run(changed(("tunables", "cpufreq_governor"), na("no cpufreq", "/sys/x")))
    assert got["findings"] == [] and got["not_checked"][0]["id"] == "cpu-governor"
    assert "no cpufreq" in got["not_checked"][0]["why"]


@pytest.mark.parametrize(
    "model, driver, fires",
    [
        ("AMD EPYC 9654 96-Core Processor", "acpi-cpufreq", True),
        ("AMD EPYC 9654 96-Core Processor", "amd-pstate-epp", False),
        ("Intel(R) Xeon(R) Platinum 8480+", "acpi-cpufreq", False),
    ],
)
def test_cpufreq_driver(model, driver, fires):
    audit = changed(("tunables", "cpufreq_driver"), ok(driver, "/sys/x"))
    audit["host"]["cpu_model"] = ok(model, "/proc/cpuinfo")
    assert ("cpufreq-driver" in ids(run(audit))) is fires


# ---------------------------------------------------------------- NUMA balancing


@pytest.mark.parametrize("mode, nodes, severity", [(0, 2, None), (1, 2, "warning"), (2, 2, "warning"), (1, 1, "info")])
def test_numa_balancing(mode, nodes, severity):
    audit = changed(("tunables", "numa_balancing"), ok(mode, "/proc/sys/kernel/numa_balancing"))
    audit["host"]["numa_nodes"] = ok(nodes, "/sys")
    got = [f for f in run(audit)["findings"] if f["id"] == "numa-balancing"]
    assert [f["severity"] for f in got] == ([severity] if severity else [])
    if got:
        assert "sysctl -w kernel.numa_balancing=0" in got[0]["fix"]


# ---------------------------------------------------------------- C-states


@pytest.mark.parametrize(
    "rows, fires",
    [
        ([("POLL", 0, 0), ("C1", 1, 0), ("C2", 18, 0)], True),  # AMD acpi_idle, CC6 allowed
        ([("POLL", 0, 0), ("C1", 2, 0), ("C1E", 10, 0), ("C6", 170, 0)], True),  # Intel intel_idle
        ([("POLL", 0, 0), ("C1", 2, 0), ("C1E", 10, 0), ("C6", 170, 4)], False),  # C6 disabled everywhere
        ([("POLL", 0, 0), ("C1", 2, 0), ("C1E", 10, 0), ("C6", 170, 3)], True),  # ...but one CPU still has it
        ([("POLL", 0, 0), ("C1", 1, 0)], False),  # processor.max_cstate=1
        ([("POLL", 0, 0), ("haltpoll idle", 1, 0)], False),  # a haltpoll VM guest
    ],
)
def test_deep_cstates(rows, fires):
    got = run(changed(("tunables", "cpuidle_states"), states(*rows)))
    assert ("deep-cstates" in ids(got)) is fires
    if fires:
        (f,) = got["findings"]
        assert "max_cstate=1" in f["fix"] and "cpuidle/$s/disable" in f["fix"]


@pytest.mark.parametrize(
    "cmdline, result",
    [
        ({"processor.max_cstate": "1"}, "clean"),
        ({"intel_idle.max_cstate": "0"}, "clean"),
        ({"idle": "poll"}, "clean"),
        ({}, "not_checked"),
        ({"processor.max_cstate": "3"}, "not_checked"),
    ],
)
def test_deep_cstates_without_cpuidle_uses_the_cmdline(cmdline, result):
    audit = changed(("tunables", "cpuidle_states"), na("no cpuidle in sysfs", "/sys/x"))
    audit["tunables"]["max_cstate"] = ok({"cmdline": cmdline, "module_parameters": {}}, "/proc/cmdline")
    got = run(audit)
    assert got["findings"] == []
    assert [n["id"] for n in got["not_checked"]] == ([] if result == "clean" else ["deep-cstates"])


# ---------------------------------------------------------------- MaxReadReq


@pytest.mark.parametrize("mrrs, fires", [(4096, False), (2048, True), (512, True), (128, True)])
def test_max_read_req(mrrs, fires):
    audit = copy.deepcopy(GOOD)
    audit["gpus"]["devices"][1] = gpu(1, "0000:2a:00.0", mrrs=mrrs)
    got = run(audit)
    assert ("pcie-max-read-req" in ids(got)) is fires
    if fires:
        (f,) = got["findings"]
        assert f"MaxReadReq {mrrs} bytes" in f["evidence"] and "0000:18:00.0" not in f["fix"]
        assert "setpci -s $d CAP_EXP+08.w=5000:7000" in f["fix"] and "0000:2a:00.0" in f["fix"]


def test_max_read_req_unavailable_is_not_checked():
    audit = copy.deepcopy(GOOD)
    audit["gpus"]["devices"] = [gpu(0, mrrs=None)]
    got = run(audit)
    assert [n["id"] for n in got["not_checked"]] == ["pcie-max-read-req"]
    assert "lspci not on PATH" in got["not_checked"][0]["why"]


# ---------------------------------------------------------------- PCIe link


def test_width_downtrained_is_critical():
    audit = copy.deepcopy(GOOD)
    audit["gpus"]["devices"][1] = gpu(1, "0000:2a:00.0", width=(8, 16))
    (f,) = run(audit)["findings"]
    assert (f["id"], f["severity"]) == ("pcie-link-width-downtrained", "critical")
    assert "x8 of x16" in f["evidence"] and "0000:2a:00.0" in f["fix"]


@pytest.mark.parametrize("pstate, severity", [("P0", "warning"), ("P8", "info"), (None, "warning")])
def test_speed_downtrained_at_load_or_idle(pstate, severity):
    audit = copy.deepcopy(GOOD)
    audit["gpus"]["devices"][0] = gpu(0, speed=(2.5, 32.0), pstate=pstate)
    (f,) = run(audit)["findings"]
    assert (f["id"], f["severity"]) == ("pcie-link-speed-downtrained", severity)
    assert "2.5 GT/s of 32.0 GT/s" in f["evidence"]
    assert ("recheck under load" in f["evidence"]) is (severity == "info")


def test_speed_from_generation_when_sysfs_is_missing():
    audit = copy.deepcopy(GOOD)
    dev = gpu(0, speed=None)
    dev["pcie"]["link_gen_current"] = ok(4, "nvidia-smi -q")
    dev["pcie"]["link_gen_max"] = ok(5, "nvidia-smi -q")
    audit["gpus"]["devices"] = [dev]
    (f,) = run(audit)["findings"]
    assert f["id"] == "pcie-link-speed-downtrained" and "Gen4 of Gen5" in f["evidence"]


def test_link_unknown_is_not_checked():
    audit = copy.deepcopy(GOOD)
    audit["gpus"]["devices"] = [gpu(0, speed=None, width=None)]
    assert [n["id"] for n in run(audit)["not_checked"]] == ["pcie-link-downtrained"]


# ---------------------------------------------------------------- persistence mode


@pytest.mark.parametrize("pm, fires", [(True, False), (False, True)])
def test_persistence_mode(pm, fires):
    audit = copy.deepcopy(GOOD)
    audit["gpus"]["devices"][1] = gpu(1, "0000:2a:00.0", pm=pm)
    got = run(audit)
    assert ("persistence-mode" in ids(got)) is fires
    if fires:
        assert "nvidia-smi -pm 1" in got["findings"][0]["fix"] and "GPU1" in got["findings"][0]["evidence"]


def test_no_gpu_means_gpu_rules_are_not_checked():
    audit = copy.deepcopy(GOOD)
    audit["gpus"] = {"count": ok(0, "sysfs"), "devices": []}
    got = run(audit)
    assert {n["id"] for n in got["not_checked"]} == {"pcie-max-read-req", "pcie-link-downtrained", "persistence-mode"}


# ---------------------------------------------------------------- kernel


@pytest.mark.parametrize(
    "release, minimum, fires",
    [
        ("6.8.12-4-pve", "6.8", False),
        ("6.8.12-4-pve", "6.14", True),
        ("6.14.11-2-pve", "6.14", False),
        ("5.15.0-119-generic", "6.8", True),
        ("6.18.44-fc-v657-gpu", "6.8", False),
        ("4.4.0", "6.8", True),  # gVisor reports 4.4.0
    ],
)
def test_kernel_minimum(release, minimum, fires):
    got = run(changed(("host", "kernel_release"), ok(release, "/proc/sys/kernel/osrelease")), min_kernel=minimum)
    assert ("kernel-too-old" in ids(got)) is fires


@pytest.mark.parametrize(
    "os_name, snippet",
    [
        ("Ubuntu 24.04.3 LTS", "linux-generic-hwe"),
        ("Debian GNU/Linux 12 (bookworm)", "backports"),
        ("Rocky Linux 9.4 (Blue Onyx)", "dnf install kernel"),
        ("Arch Linux", "install a kernel >= 6.8"),
    ],
)
def test_kernel_fix_follows_the_distribution(os_name, snippet):
    audit = changed(("host", "kernel_release"), ok("5.15.0", "/proc"))
    audit["host"]["os"] = ok(os_name, "/etc/os-release")
    (f,) = run(audit)["findings"]
    assert snippet in f["fix"]


def test_unparseable_kernel_is_not_checked():
    got = run(changed(("host", "kernel_release"), ok("weird", "/proc")))
    assert [n["id"] for n in got["not_checked"]] == ["kernel-too-old"]


# ---------------------------------------------------------------- topology


@pytest.mark.parametrize("link, fires", [("NV18", False), ("NODE", False), ("SYS", True)])
def test_cross_numa_topology(link, fires):
    got = run(changed(("topology", "matrix"), ok({"gpu_pairs": {"GPU0-GPU1": link}}, "nvidia-smi topo -m")))
    assert [f["severity"] for f in got["findings"] if f["id"] == "topology-cross-numa"] == (["info"] if fires else [])


# ---------------------------------------------------------------- helpers for the report


def test_sort_and_summarize():
    fs = [
        {"id": "b", "severity": "info"},
        {"id": "z", "severity": "warning"},
        {"id": "a", "severity": "warning"},
        {"id": "c", "severity": "critical"},
    ]
    assert [f["id"] for f in sort_findings(fs)] == ["c", "a", "z", "b"]
    assert summarize(fs) == {"critical": 1, "warning": 2, "info": 1, "total": 4}
    assert summarize([]) == {"critical": 0, "warning": 0, "info": 0, "total": 0}


def test_field_text():
    assert field_text(ok(16, "sysfs")) == "16"
    assert field_text(na("no lspci", "lspci")) == "unavailable: no lspci"
    assert field_text(None) == "unavailable: not collected"
