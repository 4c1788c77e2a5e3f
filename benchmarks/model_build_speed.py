"""Speed of deriving a model from transformers' own graph (issue 18 item 9): GLM-5 (744B) on the meta device.

Prints, for a cold process without the spec cache: the import of torch + transformers, AutoConfig, the
meta-device build and classification, and the roofline itself; then the same card through the per-config-hash
cache (what every later Snakemake invocation pays). A benchmark, not a test: it prints figures and ratios and
never fails on time.

    .venv/bin/python benchmarks/model_build_speed.py [config/models/glm-5.json]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = r"""
import sys, time, json
sys.path.insert(0, {workflow!r})
t0 = time.perf_counter()
import torch, transformers
t1 = time.perf_counter()
from decode_gap.model import load_model_card
from decode_gap.model.graph import _CACHE
from decode_gap.hardware import resolve_hardware
from decode_gap.roofline import compute_roofline
t2 = time.perf_counter()
spec = load_model_card({card!r})
t3 = time.perf_counter()
hw = resolve_hardware("h200", {hw!r})
compute_roofline(spec, hw, "nvfp4", tp=8, context_len=1)
t4 = time.perf_counter()
print(json.dumps({{"import_torch_transformers_s": t1 - t0, "import_decode_gap_s": t2 - t1, "load_card_s": t3 - t2,
                  "meta_build_s": spec.build_seconds, "roofline_s": t4 - t3, "total_s": t4 - t0}}))
"""

HIT = r"""
import sys, time, json
sys.path.insert(0, {workflow!r})
t0 = time.perf_counter()
from decode_gap.model import load_model_card
spec = load_model_card({card!r})
t1 = time.perf_counter()
print(json.dumps({{"cached_load_s": t1 - t0, "imported_torch": "torch" in sys.modules}}))
"""


def run(code: str, env: dict) -> dict:
    import json

    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    card = str(Path(sys.argv[1]).resolve()) if len(sys.argv) > 1 else str(REPO / "config/models/glm-5.json")
    fmt = dict(workflow=str(REPO / "workflow"), card=card, hw=str(REPO / "config/hardware"))
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "DECODE_GAP_MODEL_CACHE": cache}
        cold = run(PROBE.format(**fmt), env)
        hit = run(HIT.format(**fmt), env)
    print(f"card: {card}")
    for k, v in cold.items():
        print(f"  cold {k:30s} {v:8.3f} s")
    print(f"  cache hit load_model_card        {hit['cached_load_s']:8.3f} s (torch imported: {hit['imported_torch']})")
    print(f"  ratio meta build / roofline      {cold['meta_build_s'] / max(cold['roofline_s'], 1e-9):8.1f}")
    print(f"  ratio cold load / cached load    {cold['load_card_s'] / max(hit['cached_load_s'], 1e-9):8.1f}")


if __name__ == "__main__":
    main()
