"""Device probe: where the gemm stage's wall time goes on a model's shapes (a fresh machine compiles every Triton
candidate on its first call).

    PYTHONPATH=workflow python3 benchmarks/device/gemm_stage_time.py CONFIG.yaml [M,M,...]

Each candidate's wall time is split into building it (weights quantised and copied), its first call (Triton's
compile when the kernel is new to this process, then one run) and the timing itself; the sums are printed by dtype,
M and candidate kind, largest first, then the stage's total.

What it found (2026-12-04, H200, fresh machine, DeepSeek-V3 fp8-block config, M = 1-64): the stage took 165 s for
238 rows; first calls 71 s (the NVFP4 tensor-core candidates at M = 2-16 38 s of it: 432 candidates, 12 forms a
shape and M), timing 52 s, building 19 s, the rest (checks, floors, plain reads) 23 s. The whole pipeline on that
config (benchmarks/device/h200-dsv3.yaml, attribute_gap + microbench, 16 jobs, Triton's cache warm from that run)
then took 241 s.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402
import yaml  # noqa: E402

from decode_gap.config import repo_path  # noqa: E402
from decode_gap.microbench import gemm, shapes  # noqa: E402
from decode_gap.microbench.common import env_from_settings, microbench_settings  # noqa: E402
from decode_gap.model import load_model_card  # noqa: E402

SPENT: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
CURRENT: dict[str, object] = {}


def kind(variant: str | None) -> str:
    if not variant:
        return "library"
    return variant.split(" (")[0].split(" m,")[0].split(" BN=")[0][:40]


def main() -> None:
    config = yaml.safe_load(Path(sys.argv[1]).read_text())
    repo = Path(__file__).resolve().parents[2]
    spec = load_model_card(repo_path(repo, config["model"]))
    settings = microbench_settings(config)
    ms = [int(m) for m in sys.argv[2].split(",")] if len(sys.argv) > 2 else settings["m_values"]
    env = env_from_settings(settings, copy_gbps=None)
    build, measure = gemm.build_case, gemm.measure

    def timed_build(env_, be, m, n, k, seed=0, variant=None):
        t0 = time.perf_counter()
        out = build(env_, be, m, n, k, seed=seed, variant=variant)
        CURRENT.update(key=(be.dtype, "M=1" if m == 1 else "M=2-16" if m <= 16 else "M>16", kind(variant)),
                       build=time.perf_counter() - t0)
        return out

    def timed_measure(fns, device, *a, **kw):
        t0 = time.perf_counter()
        fns[0]()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        out = measure(fns, device, *a, **kw)
        slot = SPENT[CURRENT["key"]]
        slot[0] += CURRENT["build"]
        slot[1] += t1 - t0
        slot[2] += time.perf_counter() - t1
        slot[3] += 1
        return out

    gemm.build_case, gemm.measure = timed_build, timed_measure
    t0 = time.perf_counter()
    df, out = gemm.run_gemm_bench(env, shapes.gemm_shapes(spec, int(config.get("tp", 1)), int(config.get("ep", 1)),
                                                            int(config.get("batch_size", 1))), ms, log=lambda s: None)
    total = time.perf_counter() - t0
    print(f"stage {total:.1f} s, {len(df)} rows, M {ms}")
    print("dtype | M | candidate kind | cases | build s | first call s | timing s")
    for key, (b, f, t, n) in sorted(SPENT.items(), key=lambda kv: -sum(kv[1][:3])):
        print(f"{' | '.join(key)} | {n} | {b:.1f} | {f:.1f} | {t:.1f}")
    acc = [sum(v[i] for v in SPENT.values()) for i in range(3)]
    print(f"sum: build {acc[0]:.1f} s, first calls {acc[1]:.1f} s, timing {acc[2]:.1f} s, "
          f"rest (checks, floors, plain reads) {total - sum(acc):.1f} s")


if __name__ == "__main__":
    main()
