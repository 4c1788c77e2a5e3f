"""Walk every causal-LM architecture the installed transformers maps (tests/model_walk.py) and print how many
build on the meta device and run the roofline, the ones with some KV unavailable, and each failure's reason.

    .venv/bin/python benchmarks/model_walk.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "workflow"), str(REPO / "tests")]

from model_walk import walk_all  # noqa: E402


def main() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    t0 = time.perf_counter()
    rows = walk_all()
    took = time.perf_counter() - t0
    ok = [r for r in rows if r["status"] == "ok"]
    print(f"transformers {transformers.__version__}: {len(ok)} of {len(rows)} causal-LM architectures work "
          f"({took:.1f} s)")
    partial = [r for r in ok if r["kv_unavailable"]]
    print(f"{len(partial)} of them with the KV of some layers unavailable: "
          + ", ".join(r["model_type"] for r in partial))
    for r in rows:
        if r["status"] != "ok":
            print(f"  FAIL {r['model_type']}: {r['why']}")


if __name__ == "__main__":
    main()
