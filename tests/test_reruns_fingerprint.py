"""The environment fingerprint: overrides, per-stage parts, the PCIe Device Control parser, and the diff."""

from __future__ import annotations

import struct

from decode_gap import fingerprint as fp


def _config_space(devctl: int, status_caps: bool = True) -> bytes:
    data = bytearray(4096)
    data[0:4] = struct.pack("<HH", 0x10DE, 0x2335)
    data[0x06] = 0x10 if status_caps else 0
    data[0x34] = 0x60
    data[0x60:0x62] = bytes([0x01, 0x68])   # power management capability, next at 0x68
    data[0x68:0x6A] = bytes([0x10, 0x00])   # PCI Express capability, end of list
    data[0x68 + 8:0x68 + 10] = devctl.to_bytes(2, "little")
    return bytes(data)


def test_pcie_devctl_parses_max_read_request_and_payload(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_bytes(_config_space((2 << 12) | (1 << 5)))  # MaxReadReq 512, MaxPayload 256
    assert fp._pcie_devctl(cfg) == ("512", "256")
    cfg.write_bytes(_config_space((5 << 12) | (0 << 5)))  # 4096, 128
    assert fp._pcie_devctl(cfg) == ("4096", "128")
    cfg.write_bytes(_config_space(0)[:64])                # non-root: only the header is readable
    assert fp._pcie_devctl(cfg) == ("n/a", "n/a")
    cfg.write_bytes(_config_space(0, status_caps=False))
    assert fp._pcie_devctl(cfg) == ("n/a", "n/a")
    assert fp._pcie_devctl(tmp_path / "absent") == ("n/a", "n/a")


def test_every_component_is_measured_and_overridable(monkeypatch):
    base = fp.measure_components(server="srv")
    assert set(base) == set(fp.COMPONENTS) and all(isinstance(v, str) and v for v in base.values())
    for name in fp.COMPONENTS:
        monkeypatch.setenv(fp.ENV_PREFIX + name.upper(), f"override-{name}")
    assert fp.measure_components(server="srv") == {n: f"override-{n}" for n in fp.COMPONENTS}


def test_stage_parts():
    comps = {n: n.upper() for n in fp.COMPONENTS}
    assert fp.for_stage(comps, "roofline") == {}
    assert set(fp.for_stage(comps, "audit")) == set(fp.COMPONENTS)
    assert "server" not in fp.for_stage(comps, "microbench") and "server" not in fp.for_stage(comps, "simulate")
    assert set(fp.for_stage(comps, "live")) == set(fp.for_stage(comps, "microbench")) | {"server"}
    assert {"pcie", "gpu", "kernel"} <= set(fp.for_stage(comps, "microbench"))


def test_diff():
    assert fp.diff({"kernel": "6.8", "nccl": "2.21"}, {"kernel": "6.14", "nccl": "2.21", "pcie": "x"}) == [
        {"component": "kernel", "before": "6.8", "after": "6.14"},
        {"component": "pcie", "before": "—", "after": "x"},
    ]


def test_cluster_dag_uses_the_node_record_from_fleet_detect(tmp_path, monkeypatch):
    """A cluster DAG is built on the submit host: its rerun triggers compare against the node's recorded fingerprint."""
    for name in fp.COMPONENTS:
        monkeypatch.delenv(fp.ENV_PREFIX + name.upper(), raising=False)
    local, basis = fp.for_dag(tmp_path / "h200-x", "srv", cluster=False)
    assert basis == "this host" and local == fp.measure_components(server="srv")

    missing, basis = fp.for_dag(tmp_path / "h200-x", "srv", cluster=True)
    assert basis.startswith("the submit host") and "fleet detect" in basis and missing["server"] == "srv"

    node = {k: f"node-{k}" for k in fp.COMPONENTS if k != "server"}
    where = fp.record_node(tmp_path, {"host": "gpu07", "hardware_revision": "h200-x", "fingerprint": node})
    assert where == tmp_path / "h200-x" / fp.NODE_RECORD
    recorded, basis = fp.for_dag(tmp_path / "h200-x", "srv", cluster=True)
    assert basis.startswith("node gpu07") and recorded == {**node, "server": "srv"}
    # a driver upgrade on the nodes, recorded again, changes exactly the driver part the stages depend on
    fp.record_node(tmp_path, {"host": "gpu07", "hardware_revision": "h200-x", "fingerprint": {**node, "driver": "590"}})
    again, _ = fp.for_dag(tmp_path / "h200-x", "srv", cluster=True)
    assert fp.diff(recorded, again) == [{"component": "driver", "before": "node-driver", "after": "590"}]

    (tmp_path / "h200-x" / fp.NODE_RECORD).write_text("{not json")
    _, basis = fp.for_dag(tmp_path / "h200-x", "srv", cluster=True)
    assert basis.startswith("the submit host")
