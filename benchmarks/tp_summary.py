"""Print the TP figures of one results tree: all-reduce at the model's message size (eager and graph), the
kernel-level step (eager and graph) with its all-reduce component, and the roofline's communication floor.

    python benchmarks/tp_summary.py results/<hw-rev>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {"_missing": str(exc)}


def _fig(d: dict, key: str) -> str:
    v = d.get(key)
    if isinstance(v, dict):
        if v.get("value") is None:
            return f"unavailable ({v.get('why', '?')})"
        return f"{v['value']:.2f} {v.get('unit', '')}".strip()
    return "—" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))


def main(res: Path) -> int:
    ar = _load(res / "microbench" / "allreduce.json")
    k = _load(res / "simulate" / "kernel.json")
    roof = _load(res / "roofline.json")
    print(f"== {res.name}")
    print(f"all-reduce: world {ar.get('world_size')} {ar.get('backend')} on {ar.get('device', '?')}; "
          f"model message {ar.get('model_message_bytes', roof.get('allreduce_message_bytes'))} B")
    for m in ("eager", "graph"):
        print(f"  at the model's message size, {m}: {_fig(ar.get('figures', ar), f'allreduce_us_at_model_size_{m}')}")
    csv = res / "microbench" / "allreduce.csv"
    if csv.exists():
        import pandas as pd

        df = pd.read_csv(csv)
        cols = [c for c in ("size", "mode", "time_us", "time_min_us", "time_p99_us", "busbw") if c in df]
        print(df[cols].to_string(index=False))
    print(f"kernel level: world {k.get('world_size')} on {k.get('device')}: eager {_fig(k, 'eager_ms')} ms, "
          f"graph {_fig(k, 'graph_ms')} ms; all-reduce mode {k.get('allreduce', {}).get('mode')}")
    for c in k.get("components", []):
        if c["name"] == "all-reduce":
            print(f"  all-reduce component: {c.get('status')} eager {c.get('eager_ms')} ms, graph {c.get('graph_ms')} ms "
                  f"({k.get('allreduce', {}).get('collectives_per_token')} per token)")
    print(f"roofline: t_memory {_fig(roof, 't_memory_ms')} ms, comm floor {_fig(roof, 't_comm_floor_ms')} ms "
          f"({roof.get('allreduces_per_token')} all-reduces of {roof.get('allreduce_message_bytes')} B)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
