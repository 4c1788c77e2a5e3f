"""A results/<hw-rev>/ tree as an H200 host would hand it over, for the render tests.

Built from the synthetic report fixture `tests/fixtures/report/h200x2/` (not a measurement, its files say so):
every level names the GPU device and the hardware revision, gap.json is written by the real gap stage on those
files (with the measuring host's fingerprint), and every file gets an mtime older than the code, as a tar from
another machine would.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from decode_gap.gap import attribute_files

FIX = Path(__file__).resolve().parent / "fixtures" / "report" / "h200x2"
GPU = "NVIDIA H200"
OLD = 1_000_000_000  # 2001-09-09: older than any code in the checkout
FINGERPRINT = {"kernel": "6.8.0-h200-fixture", "driver": "570.124.06", "cuda": "12.8", "torch": "2.8.0"}
H200_SHEET = {"key": "h200", "name": "NVIDIA H200 SXM (fixture)", "kind": "gpu", "memory_bandwidth_gbps": 4800,
              "peak_tflops": {"bf16": 989, "fp8": 1979}}


def _edit(path: Path, **fields) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data, indent=1))


def make_tree(results: Path, hw_rev: str, *, kernel: dict | None = None, memory_device: str = GPU) -> Path:
    """results/<hw_rev>/ from the H200 fixture; `kernel` overrides kernel-level fields (device, eager_ms, ...)."""
    d = results / hw_rev
    shutil.copytree(FIX, d)
    _edit(d / "roofline.json", hardware=H200_SHEET)
    _edit(d / "microbench" / "memory.json", device=memory_device)
    sim = json.loads((d / "simulate.json").read_text())
    sim["kernel"].update({"device": GPU, "hardware_revision": hw_rev, "status": "ok", "format_match": True,
                          **(kernel or {})})
    sim["engine"].update(device=GPU, hardware_revision=hw_rev, status="ok", serving_ms=sim["engine"]["eager_ms"])
    sim["server"] = {"stage": "calibrate_server", "status": "ok", "device": "cpu: Intel Xeon Platinum 8480+ (fixture)",
                     "hardware_revision": hw_rev, "stack": "starlette", "server_cpu_per_chunk_ms": 0.21,
                     "client_cpu_per_chunk_ms": 0.06}
    (d / "simulate.json").write_text(json.dumps(sim, indent=1))
    (d / "simulate" / "server.json").write_text(json.dumps(sim["server"], indent=1))
    _edit(d / "live" / "summary.json", device="server at 127.0.0.1 (device not visible to the client)")
    keys = {"roofline": "roofline.json", "memory": "microbench/memory.json", "allreduce": "microbench/allreduce.json",
            "gemm": "microbench/gemm.json", "launch": "microbench/launch.json", "simulate": "simulate.json",
            "live": "live/summary.json", "audit": "audit.json"}
    gap = attribute_files({k: d / rel for k, rel in keys.items()}, hardware_revision=hw_rev, fingerprint=FINGERPRINT)
    gap["inputs"] = {k: f"results/{hw_rev}/{rel}" for k, rel in keys.items()}
    (d / "gap.json").write_text(json.dumps(gap, indent=1))
    for p in d.rglob("*"):
        os.utime(p, (OLD, OLD))
    return d
