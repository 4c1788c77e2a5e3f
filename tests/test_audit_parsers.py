"""Audit parsers on fixture text from the real tools (tests/fixtures/audit/README.md says which are captures)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from decode_gap.audit import parsers as P  # noqa: E402

FIX = Path(__file__).parent / "fixtures" / "audit"


def text(name: str) -> str:
    return (FIX / name).read_text()


def test_cmdline_and_cstate_params():
    cmd = P.parse_cmdline(text("host_tuned/proc/cmdline"))
    assert cmd["intel_idle.max_cstate"] == "1" and cmd["quiet"] == ""
    assert P.max_cstate_params(cmd) == {"processor.max_cstate": "1", "intel_idle.max_cstate": "1"}
    assert P.iommu_params(cmd) == {"iommu": "pt", "intel_iommu": "on"}
    # Arguments after "--" belong to init, not the kernel (the H200 VM's cmdline has them).
    vm = P.parse_cmdline(text("host_h200vm/proc/cmdline"))
    assert "pci" in vm and "--firecracker-init" not in vm and "--auth-required" not in vm


def test_os_release_and_thp():
    assert P.parse_os_release(text("host_h200vm/etc/os-release"))["PRETTY_NAME"] == "Ubuntu 24.04.3 LTS"
    assert P.parse_thp("always [madvise] never") == "madvise"
    assert P.parse_thp(text("host_untuned/sys/kernel/mm/transparent_hugepage/enabled")) == "always"
    assert P.parse_thp("always defer defer+madvise [madvise] never") == "madvise"


@pytest.mark.parametrize(
    "name, sockets, nodes, cpus, model, hyper",
    [
        ("lscpu_h200vm.txt", 1, 1, 16, "Intel(R) Xeon(R) Processor", "KVM"),  # captured on the H200 machine
        ("lscpu_epyc9654_2s.txt", 2, 2, 384, "AMD EPYC 9654 96-Core Processor", None),
    ],
)
def test_lscpu(name, sockets, nodes, cpus, model, hyper):
    got = P.parse_lscpu(text(name))
    assert (got["sockets"], got["numa_nodes"], got["cpus"], got["model"], got["hypervisor"]) == (
        sockets,
        nodes,
        cpus,
        model,
        hyper,
    )


def test_kernel_versions():
    assert P.kernel_version_tuple("6.8.12-4-pve") == (6, 8, 12)
    assert P.kernel_version_tuple("6.18.44-fc-v657-gpu") == (6, 18, 44)
    assert P.kernel_version_tuple("4.4.0") == (4, 4, 0)
    assert P.kernel_version_tuple("unknown") is None
    assert P.version_less((6, 8, 12), (6, 14)) and not P.version_less((6, 8, 0), (6, 8))
    assert P.version_less((6, 7, 99), (6, 8)) and not P.version_less((6, 18, 44), (6, 8))


def test_link_speed_and_generation():
    assert P.parse_link_speed("32.0 GT/s PCIe") == 32.0
    assert P.parse_link_speed("8 GT/s") == 8.0
    assert P.parse_link_speed("2.5 GT/s PCIe") == 2.5
    assert P.parse_link_speed("Unknown") is None
    assert [P.pcie_gen(x) for x in (2.5, 5.0, 8.0, 16.0, 32.0, 64.0)] == [1, 2, 3, 4, 5, 6]
    assert P.normalize_bdf("00000000:2A:00.0") == "0000:2a:00.0"
    assert P.normalize_bdf("18:00.0") == "0000:18:00.0"


def test_lspci_vvv_gpus_bridges_and_downgraded_link():
    devs = P.parse_lspci_vvv(text("lspci_vvv_h100x2.txt"))
    assert set(devs) == {"0000:17:00.0", "0000:18:00.0", "0000:2a:00.0", "0000:2b:00.0"}
    ok = devs["0000:18:00.0"]
    assert ok["class"] == "3D controller" and ok["vendor_nvidia"] and ok["driver"] == "nvidia"
    assert (ok["devcap_max_payload"], ok["max_payload"], ok["max_read_req"]) == (256, 256, 512)
    assert (ok["lnkcap_speed_gts"], ok["lnkcap_width"], ok["lnksta_speed_gts"], ok["lnksta_width"]) == (
        32.0,
        16,
        32.0,
        16,
    )
    assert not ok["speed_downgraded"] and not ok["width_downgraded"]
    bad = devs["0000:2a:00.0"]
    assert (bad["lnksta_speed_gts"], bad["lnksta_width"]) == (16.0, 8)
    assert bad["speed_downgraded"] and bad["width_downgraded"]
    # LnkCap2/LnkCtl2 ("Target Link Speed: 32GT/s") must not overwrite LnkSta.
    assert bad["lnkcap_speed_gts"] == 32.0
    assert devs["0000:17:00.0"]["class"] == "PCI bridge" and not devs["0000:17:00.0"]["vendor_nvidia"]
    assert devs["0000:2b:00.0"]["class"] == "Bridge"


def test_lspci_without_root_says_access_denied():
    devs = P.parse_lspci_vvv(text("lspci_vvv_nonroot.txt"))
    dev = devs["0000:18:00.0"]
    assert dev["capabilities_access_denied"] and "max_read_req" not in dev


def test_pcie_config_space_captured_on_h200():
    cfg = P.parse_lspci_hexdump(text("pcie_config_h200.hex"))
    assert len(cfg) == 4096 and cfg[:4] == bytes.fromhex("de103523")  # NVIDIA 0x2335 (H200)
    got = P.parse_pcie_config(cfg)
    assert got["capability_offset"] == 0x60
    assert (got["max_read_req"], got["max_payload"], got["devcap_max_payload"]) == (4096, 256, 256)
    assert (got["lnkcap_speed_gts"], got["lnkcap_width"], got["lnksta_speed_gts"], got["lnksta_width"]) == (
        32.0,
        16,
        32.0,
        16,
    )


def test_pcie_config_low_read_request_and_short_read():
    cfg = bytearray(P.parse_lspci_hexdump(text("pcie_config_h200.hex")))
    cfg[0x68:0x6A] = (0x2134).to_bytes(2, "little")  # DevCtl: MaxReadReq field 2 -> 512 bytes, MPS 1 -> 256
    cfg[0x72:0x74] = (0x1084).to_bytes(2, "little")  # LnkSta: 16 GT/s, x8
    got = P.parse_pcie_config(bytes(cfg))
    assert (got["max_read_req"], got["lnksta_speed_gts"], got["lnksta_width"]) == (512, 16.0, 8)
    with pytest.raises(ValueError, match="needs root"):
        P.parse_pcie_config(bytes(cfg[:64]))  # what a non-root read of sysfs config returns


def test_nvidia_smi_q_captured_on_h200():
    got = P.parse_nvidia_smi_q(text("nvidia_smi_q_h200.txt"))
    assert (got["driver_version"], got["cuda_version"], got["attached_gpus"]) == ("580.159.04", "13.0", 1)
    (g,) = got["gpus"]
    assert g["bus_id"] == "0000:00:06.0" and g["name"] == "NVIDIA H200"
    assert g["persistence_mode"] is True and g["pstate"] == "P0"
    assert g["memory_total_mib"] == 143771
    assert (g["power_limit_w"], g["default_power_limit_w"]) == (700.0, 700.0)
    assert g["clocks_mhz"] == {"graphics": 345, "sm": 345, "memory": 3201}
    assert g["max_clocks_mhz"] == {"graphics": 1980, "sm": 1980, "memory": 3201}
    assert (g["pcie_gen_current"], g["pcie_gen_max"], g["pcie_width_current"], g["pcie_width_max"]) == (5, 5, 16, 16)
    assert g["pcie_gen_host_max"] is None  # "N/A" inside the VM


def test_nvidia_smi_q_two_gpus():
    got = P.parse_nvidia_smi_q(text("nvidia_smi_q_h100x2.txt"))
    assert got["driver_version"] == "550.54.15" and len(got["gpus"]) == 2
    a, b = got["gpus"]
    assert (a["bus_id"], b["bus_id"]) == ("0000:18:00.0", "0000:2a:00.0")
    assert a["persistence_mode"] is False and b["name"] == "NVIDIA H100 80GB HBM3"
    assert (b["pcie_gen_current"], b["pcie_gen_max"], b["pcie_width_current"], b["pcie_width_max"]) == (4, 5, 8, 16)


def test_topology_captured_on_h200():
    got = P.parse_nvidia_smi_topo(text("nvidia_smi_topo_h200.txt"))
    assert got["devices"] == ["GPU0"] and got["matrix"] == {"GPU0": {"GPU0": "X"}}
    # nvidia-smi prints an empty cell between NUMA Affinity and GPU NUMA ID; it must not shift the columns.
    assert got["affinity"]["GPU0"] == {"CPU Affinity": "0-15", "NUMA Affinity": "0", "GPU NUMA ID": "N/A"}
    assert got["legend"]["NV#"].startswith("Connection traversing a bonded set")
    assert P.gpu_pair_links(got) == {}


def test_topology_8_gpu_nvlink_with_nics():
    got = P.parse_nvidia_smi_topo(text("nvidia_smi_topo_hgx_h100x8.txt"))
    assert got["devices"] == [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(4)]
    pairs = P.gpu_pair_links(got)
    assert len(pairs) == 28 and set(pairs.values()) == {"NV18"}
    assert got["matrix"]["GPU0"]["NIC0"] == "PXB" and got["matrix"]["NIC3"]["GPU7"] == "PXB"
    assert got["affinity"]["GPU5"] == {"CPU Affinity": "56-111,168-223", "NUMA Affinity": "1", "GPU NUMA ID": "N/A"}
    assert got["nics"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1", "NIC2": "mlx5_2", "NIC3": "mlx5_3"}


def test_topology_8_gpu_pcie_across_numa():
    pairs = P.gpu_pair_links(P.parse_nvidia_smi_topo(text("nvidia_smi_topo_pcie_x8.txt")))
    assert sum(v == "SYS" for v in pairs.values()) == 16 and sum(v == "NODE" for v in pairs.values()) == 12


def test_topology_rejects_other_text():
    with pytest.raises(ValueError, match="GPU0"):
        P.parse_nvidia_smi_topo("No devices were found\n")


def test_nvlink_status():
    got = P.parse_nvlink_status(text("nvidia_smi_nvlink_s_h100.txt"))
    assert set(got) == {"GPU0", "GPU1"} and len(got["GPU0"]) == 18
    assert got["GPU0"][0] == {"link": 0, "active": True, "gbps": 26.562}
    assert got["GPU1"][17] == {"link": 17, "active": False, "gbps": None}
    assert P.parse_nvlink_status("") == {}  # the single H200 VM prints nothing
