"""The audit collector: replayed captured hosts, this host for real, redaction of secrets."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from decode_gap.audit import parsers as P  # noqa: E402
from decode_gap.audit.collect import Probe, ToolUnavailable, collect_audit  # noqa: E402
from decode_gap.audit.fields import REDACTED, env_snapshot, field_text, is_ok  # noqa: E402

FIX = Path(__file__).parent / "fixtures" / "audit"


class ReplayRunner:
    """Test double for `run_command`: answers tool calls with fixture text captured from the real tools.

    A tool not in the table behaves as on a host without it (ToolUnavailable "X not on PATH").
    """

    def __init__(self, table: dict[tuple[str, ...], str]):
        self.table = table
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv):
        self.calls.append(tuple(argv))
        if tuple(argv) in self.table:
            name = self.table[tuple(argv)]
            return "" if name == "" else (FIX / name).read_text()
        raise ToolUnavailable(f"{argv[0]} not on PATH")


def host_root(tmp_path: Path, name: str, config_hex: dict[str, str] | None = None) -> Path:
    """Copy a fixture host tree; write each GPU's binary sysfs `config` from a captured hex dump."""
    root = tmp_path / name
    shutil.copytree(FIX / name, root)
    for bdf, hexfile in (config_hex or {}).items():
        (root / "sys/bus/pci/devices" / bdf / "config").write_bytes(P.parse_lspci_hexdump((FIX / hexfile).read_text()))
    return root


H200_TOOLS = {
    ("nvidia-smi", "-q"): "nvidia_smi_q_h200.txt",
    ("nvidia-smi", "topo", "-m"): "nvidia_smi_topo_h200.txt",
    ("nvidia-smi", "nvlink", "-s"): "",
    ("lscpu",): "lscpu_h200vm.txt",
}
UNTUNED_TOOLS = {
    ("nvidia-smi", "-q"): "nvidia_smi_q_h100x2.txt",
    ("nvidia-smi", "topo", "-m"): "nvidia_smi_topo_h100x2_sys.txt",
    ("nvidia-smi", "nvlink", "-s"): "nvidia_smi_nvlink_s_h100.txt",
    ("lspci", "-D", "-vvv"): "lspci_vvv_h100x2.txt",
    ("lscpu",): "lscpu_epyc9654_2s.txt",
}


def replay(tmp_path, name, tools, config_hex=None, env=None, params=None):
    probe = Probe(
        root=host_root(tmp_path, name, config_hex),
        runner=ReplayRunner(tools),
        env=env or {},
        use_nvml=False,
        use_torch=False,
    )
    return collect_audit({"min_kernel": "6.8", **(params or {})}, probe)


def test_replay_of_the_h200_machine_matches_what_the_collector_wrote_there(tmp_path):
    """The H200 capture, replayed here, gives the GPU, PCIe and topology fields the collector wrote on the H200."""
    got = replay(tmp_path, "host_h200vm", H200_TOOLS, {"0000:00:06.0": "pcie_config_h200.hex"})
    there = json.loads((FIX / "h200_audit_smi.json").read_text())
    assert got["gpus"] == there["gpus"]
    assert got["topology"]["matrix"]["value"]["matrix"] == there["topology"]["matrix"]["value"]["matrix"]
    for key in ("kernel_release", "kernel_cmdline", "os", "cpu_model", "sockets", "numa_nodes"):
        assert got["host"][key]["value"] == there["host"][key]["value"], key
    for key in ("numa_balancing", "transparent_hugepages", "cpufreq_governor", "cpuidle_states"):
        assert got["tunables"][key].get("value") == there["tunables"][key].get("value"), key
    assert got["device"] == "NVIDIA H200 x1" and got["findings"] == there["findings"] == []
    pcie = got["gpus"]["devices"][0]["pcie"]
    assert pcie["max_read_req_bytes"] == {
        "value": 4096,
        "source": "sysfs /sys/bus/pci/devices/0000:00:06.0/config (PCIe capability)",
    }
    # The VM has no cpufreq and no cpuidle states: said so, with the path tried.
    gov = got["tunables"]["cpufreq_governor"]
    assert gov["status"] == "unavailable" and "scaling_governor" in gov["why"]
    assert "tunables.cpuidle_states" in got["unavailable"]
    assert {n["id"] for n in got["not_checked"]} == {"cpu-governor", "cpufreq-driver", "deep-cstates"}


def test_h200_nvml_and_smi_paths_agree_on_the_gpu():
    """On the H200 the collector ran twice, through NVML and through `nvidia-smi -q`: same facts, other sources."""
    nvml = json.loads((FIX / "h200_audit_nvml.json").read_text())["gpus"]["devices"][0]
    smi = json.loads((FIX / "h200_audit_smi.json").read_text())["gpus"]["devices"][0]
    assert nvml["name"]["source"].startswith("nvml") and smi["name"]["source"] == "nvidia-smi -q"
    for key in (
        "name",
        "memory_total_mib",
        "persistence_mode",
        "pstate",
        "power_limit_w",
        "clocks_mhz",
        "max_clocks_mhz",
    ):
        assert nvml[key]["value"] == smi[key]["value"], key


def test_untuned_host_every_field_has_a_source(tmp_path):
    got = replay(tmp_path, "host_untuned", UNTUNED_TOOLS)
    assert got["stage"] == "audit" and got["status"] == "ok"
    host, tun, gpus = got["host"], got["tunables"], got["gpus"]
    assert host["kernel_release"] == {"value": "6.8.12-4-pve", "source": "/proc/sys/kernel/osrelease"}
    assert host["cpu_model"]["value"] == "AMD EPYC 9654 96-Core Processor"
    assert host["sockets"]["value"] == 2 and host["numa_nodes"]["value"] == 2
    assert host["logical_cpus"] == {"value": 384, "source": "lscpu"}  # not psutil: this is not the live root
    assert tun["cpufreq_governor"]["value"] == "mixed"
    assert tun["cpufreq_governor"]["per_cpu"] == {"schedutil": 3, "performance": 1}
    assert tun["cpufreq_driver"]["value"] == "acpi-cpufreq" and tun["numa_balancing"]["value"] == 1
    assert [s["name"] for s in tun["cpuidle_states"]["value"]] == ["POLL", "C1", "C2"]
    assert tun["max_cstate"]["value"] == {"cmdline": {}, "module_parameters": {"processor": 8}}
    assert tun["transparent_hugepages"]["value"] == "always"
    assert tun["iommu"]["value"]["mode"] == "passthrough" and tun["iommu"]["value"]["units"] == ["ivhd0", "ivhd1"]
    assert gpus["count"] == {"value": 2, "source": "nvidia-smi -q"}
    assert gpus["driver"]["value"] == "550.54.15" and gpus["cuda_driver"]["value"] == "12.4"
    bad = gpus["devices"][1]
    assert bad["bus_id"] == "0000:2a:00.0" and bad["persistence_mode"]["value"] is False
    assert bad["pcie"]["link_speed_current_gts"] == {
        "value": 16.0,
        "source": "sysfs /sys/bus/pci/devices/0000:2a:00.0/current_link_speed",
    }
    assert bad["pcie"]["link_gen_current"]["value"] == 4 and bad["pcie"]["link_width_current"]["value"] == 8
    assert bad["pcie"]["max_read_req_bytes"] == {"value": 512, "source": "lspci -vvv"}
    assert bad["nvlink"]["value"][17] == {"link": 17, "active": False, "gbps": None}
    assert got["topology"]["matrix"]["value"]["gpu_pairs"] == {"GPU0-GPU1": "SYS"}


def test_untuned_host_findings(tmp_path):
    got = replay(tmp_path, "host_untuned", UNTUNED_TOOLS)
    by_id = {f["id"]: f for f in got["findings"]}
    assert set(by_id) == {
        "cpu-governor",
        "cpufreq-driver",
        "numa-balancing",
        "deep-cstates",
        "pcie-max-read-req",
        "pcie-link-width-downtrained",
        "pcie-link-speed-downtrained",
        "persistence-mode",
        "topology-cross-numa",
    }  # kernel 6.8.12 meets the default audit.min_kernel 6.8
    assert got["findings"][0]["id"] == "pcie-link-width-downtrained"  # critical first
    assert got["summary"] == {"critical": 1, "warning": 7, "info": 1, "total": 9}
    assert "0000:18:00.0 0000:2a:00.0" in by_id["pcie-max-read-req"]["fix"]
    assert "setpci" in by_id["pcie-max-read-req"]["fix"]
    assert "x8 of x16" in by_id["pcie-link-width-downtrained"]["evidence"]
    for f in got["findings"]:
        assert set(f) == {"id", "severity", "title", "evidence", "fix"} and f["fix"] and f["evidence"]


def test_untuned_host_with_a_newer_minimum_kernel(tmp_path):
    got = replay(tmp_path, "host_untuned", UNTUNED_TOOLS, params={"min_kernel": "6.14"})
    (kernel,) = [f for f in got["findings"] if f["id"] == "kernel-too-old"]
    assert kernel["severity"] == "warning" and kernel["evidence"].startswith("kernel 6.8.12-4-pve")
    assert "< audit.min_kernel 6.14" in kernel["evidence"] and "backports" in kernel["fix"]  # Debian


def test_tuned_host_has_no_findings(tmp_path):
    tools = dict(H200_TOOLS)
    tools[("lscpu",)] = "lscpu_epyc9654_2s.txt"
    got = replay(tmp_path, "host_tuned", tools, {"0000:00:06.0": "pcie_config_h200.hex"})
    assert got["findings"] == [] and got["not_checked"] == []
    assert got["summary"]["total"] == 0
    assert got["tunables"]["max_cstate"]["value"]["cmdline"] == {
        "processor.max_cstate": "1",
        "intel_idle.max_cstate": "1",
    }


def test_lspci_without_root_falls_back_to_sysfs(tmp_path):
    tools = dict(H200_TOOLS)
    tools[("lspci", "-D", "-vvv")] = "lspci_vvv_nonroot.txt"
    got = replay(tmp_path, "host_h200vm", tools)  # no sysfs config either: MaxReadReq is unavailable, with both whys
    dev = {d["bus_id"]: d for d in got["gpus"]["devices"]}
    assert set(dev) == {"0000:00:06.0", "0000:18:00.0"}
    mrrs = dev["0000:18:00.0"]["pcie"]["max_read_req_bytes"]
    assert mrrs["status"] == "unavailable" and "needs root" in mrrs["why"]
    assert "config" in dev["0000:00:06.0"]["pcie"]["max_read_req_bytes"]["why"]
    assert dev["0000:18:00.0"]["name"]["source"] == "lspci -vvv"


def test_nothing_readable_at_all(tmp_path):
    """An empty root and no tools: the audit still succeeds, and every field says why it is unavailable."""
    (tmp_path / "empty").mkdir()
    got = collect_audit(
        {}, Probe(root=tmp_path / "empty", runner=ReplayRunner({}), env={}, use_nvml=False, use_torch=False)
    )
    assert got["status"] == "ok" and got["findings"] == []
    assert got["gpus"]["count"]["status"] == "unavailable"
    assert "lspci: lspci not on PATH" in got["gpus"]["count"]["why"]
    assert len(got["unavailable"]) >= 15
    assert all(v.startswith("unavailable: ") for v in got["unavailable"].values())
    assert field_text(got["host"]["kernel_release"]).startswith("unavailable: ")
    assert {n["id"] for n in got["not_checked"]} >= {
        "cpu-governor",
        "numa-balancing",
        "kernel-too-old",
        "persistence-mode",
    }


def test_disabled_stage_is_skipped():
    got = collect_audit({"enabled": False})
    assert got["status"] == "skipped" and got["reason"] == "disabled in config (stages.audit)"
    assert got["findings"] == [] and got["summary"]["total"] == 0


def test_this_host_for_real(tmp_path):
    """The real collector on this machine (a VM without GPUs): it succeeds, and most GPU fields are unavailable."""
    got = collect_audit({"min_kernel": "6.8"})
    json.dumps(got)  # serialisable
    assert got["stage"] == "audit" and got["status"] == "ok"
    assert is_ok(got["host"]["kernel_release"]) and is_ok(got["host"]["cpu_model"])
    assert is_ok(got["software"]["python"]) and is_ok(got["software"]["torch"])
    assert got["host"]["logical_cpus"]["value"] == os.cpu_count()
    for f in got["findings"]:
        assert f["severity"] in ("critical", "warning", "info") and f["fix"]
    assert set(got["summary"]) == {"critical", "warning", "info", "total"}
    for path, why in got["unavailable"].items():
        assert why.startswith("unavailable: ") and len(why) > len("unavailable: "), path


# ---------------------------------------------------------------- secrets

SECRET = "s3cr3t-Value-9f8e7d6c5b4a"


def test_env_snapshot_redacts_secret_names_and_values():
    env = {
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "TORCH_HF_TOKEN": SECRET,
        "NCCL_SOCKET_PASSWORD": SECRET,
        "CUDA_API_KEY": SECRET,
        "TORCH_AUTH_HEADER": SECRET,
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "TORCH_EXTRA": "hf_abcdefghijklmnopqrstuvwx",  # a Hugging Face token under an innocent name
        "HOME": "/root",
        "OPENAI_API_KEY": SECRET,
    }
    snap = env_snapshot(env)
    assert snap["NCCL_DEBUG"] == "INFO" and snap["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert snap["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    for name in ("TORCH_HF_TOKEN", "NCCL_SOCKET_PASSWORD", "CUDA_API_KEY", "TORCH_AUTH_HEADER", "TORCH_EXTRA"):
        assert snap[name] == REDACTED, name
    assert "HOME" not in snap and "OPENAI_API_KEY" not in snap


def test_no_secret_value_reaches_audit_json(tmp_path):
    """Secrets in the environment, the cmdline and tool output: none of them appears anywhere in audit.json."""
    env = {
        "NCCL_DEBUG": "WARN",
        "TORCH_HF_TOKEN": SECRET,
        "CUDA_SECRET": SECRET + "2",
        "NCCL_IB_PASSWORD": SECRET + "3",
        "MY_SERVER_KEY": SECRET + "4",  # named by api_key_env
        "DECODE_GAP_API": SECRET + "5",
    }
    root = host_root(tmp_path, "host_untuned")
    # A secret leaking through a source the audit copies verbatim (the kernel cmdline).
    cmdline = root / "proc/cmdline"
    cmdline.write_text(cmdline.read_text().strip() + f" foo.token={SECRET} key={SECRET}5\n")
    probe = Probe(root=root, runner=ReplayRunner(UNTUNED_TOOLS), env=env, use_nvml=False, use_torch=False)
    audit = collect_audit({"min_kernel": "6.8", "api_key_env": "DECODE_GAP_API"}, probe)
    out = tmp_path / "audit.json"
    from decode_gap.io import write_json

    write_json(out, audit)
    text = out.read_text()
    assert SECRET not in text
    for name in ("TORCH_HF_TOKEN", "CUDA_SECRET", "NCCL_IB_PASSWORD"):
        assert audit["env"]["value"][name] == REDACTED
    assert audit["env"]["value"]["NCCL_DEBUG"] == "WARN"
    assert REDACTED in audit["host"]["kernel_cmdline"]["value"]


@pytest.mark.parametrize("name", ["TORCH_HF_TOKEN", "NCCL_SECRET_X", "CUDA_PRIVATE_KEY", "TORCH_CREDENTIALS"])
def test_secret_in_the_real_environment_never_lands(monkeypatch, name):
    monkeypatch.setenv(name, SECRET)
    audit = collect_audit({"min_kernel": "6.8"}, Probe(use_torch=False))
    assert SECRET not in json.dumps(audit)
    assert audit["env"]["value"][name] == REDACTED
