"""GPU validation of the micro-benchmarks (issue 4 item 7): every GPU path at DeepSeek-V3 / GLM-5 shapes.

Run on a GPU host from the repository root:
    PYTHONPATH=workflow python3 benchmarks/microbench_device.py --out $OUT
Writes every stage file (memory.json, allreduce/gemm/moe/attention/launch .csv + .json) per model into a
tarball `microbench.tar.gz`, plus `summary.json`, and prints the bars last:
- copy bandwidth >= 4.0 TB/s;
- bf16 GEMV 18432x7168 at M=1 reaches >= 90% of the measured copy bandwidth in GPU time;
- the small GEMM 256x6144 at M=1 shows its GPU time and its eager time (> 20 us expected).
Also checks the NVFP4 weight-only Triton kernel against dequantise-then-matmul at awkward shapes.
On a CPU host it runs the same code at tiny settings (a smoke test of the script itself).
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

import torch  # noqa: E402

from decode_gap.io import write_json, write_table  # noqa: E402
from decode_gap.model import load_model_card  # noqa: E402
from decode_gap.microbench import allreduce, attention, gemm, launch, memory, moe, shapes  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402
from decode_gap.microbench.common import DEFAULTS, BenchEnv, pick_device  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def section(name, fn, results, errors):
    t0 = time.time()
    try:
        results[name] = fn()
    except Exception as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        if torch.cuda.is_available():
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
    log(f"section {name}: {time.time() - t0:.1f} s")


def nvfp4_checks(env: BenchEnv) -> list[dict]:
    """Triton weight-only NVFP4 vs the fp32 reference at awkward shapes and every kernel variant."""
    out = []
    cases = [(256, 6144), (576, 7168), (18432, 7168), (100, 528), (7168, 2048)]
    ms = [1, 2, 3, 8, 16, 17, 33, 64]
    if not env.is_gpu:
        cases, ms = [(40, 96)], [1, 3]
    for n, k in cases:
        gen = torch.Generator(device=env.device).manual_seed(n + k)
        w = torch.randn((n, k), generator=gen, device=env.device)
        q = nv.quantize_nvfp4(w)
        wd = nv.dequantize_nvfp4(q)
        for m in ms:
            x = torch.randn((m, k), generator=gen, device=env.device).to(torch.bfloat16)
            ref = x.float() @ wd.t()
            for variant in ("v1", "v2"):
                row = {"N": n, "K": k, "M": m, "variant": variant}
                try:
                    g32 = nv.WeightOnlyGemm(q, m, env.device, out_dtype=torch.float32, variant=variant)
                    g32.out.fill_(float("nan"))  # poison: every element must be written
                    y32 = g32(x)
                    row["rel_err_fp32_out"] = nv.relative_error(y32, ref)
                    y16 = nv.WeightOnlyGemm(q, m, env.device, variant=variant)(x)
                    row["rel_err_bf16_out"] = nv.relative_error(y16, ref)
                    row["plan"] = str(g32.plan)
                    row["pass"] = row["rel_err_fp32_out"] < 1e-4 and row["rel_err_bf16_out"] < 1e-2
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    row["pass"] = False
                out.append(row)
    return out


def nvfp4_variant_timing(env: BenchEnv) -> list[dict]:
    """GPU time of the two kernel variants on the bar shape and a small one (graph replay, rotating copies)."""
    from decode_gap.microbench.timing import measure, rotating_copies

    rows = []
    for n, k in ((18432, 7168), (256, 6144), (4096, 7168)):
        w = torch.randn((n, k), device=env.device)
        q = nv.quantize_nvfp4(w)
        copies = rotating_copies(nv.nvfp4_bytes(n, k), env.device)
        qs = [q] + [nv.NVFP4Tensor(q.packed.clone(), q.block_scales.clone(), q.tensor_scale.clone(), q.shape)
                    for _ in range(copies - 1)]
        for m in (1, 16):
            x = torch.randn((m, k), device=env.device).to(torch.bfloat16)
            for variant in ("v1", "v2"):
                try:
                    gs = [nv.WeightOnlyGemm(qq, m, env.device, variant=variant) for qq in qs]
                    t = measure([(lambda g=g: g(x)) for g in gs], env.device, env.warmup, env.iters)
                    nb = nv.nvfp4_bytes(n, k) + 2 * m * k + 2 * m * n
                    rows.append({"N": n, "K": k, "M": m, "variant": variant, "gpu_us": t.device_us,
                                 "eager_us": t.eager.median_us, "gbps": nb / t.device_us / 1e3,
                                 "frac_of_copy_bw": (nb / t.device_us / 1e3) / env.copy_gbps if env.copy_gbps else None})
                except Exception as exc:
                    rows.append({"N": n, "K": k, "M": m, "variant": variant, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out-microbench")
    ap.add_argument("--models", default="deepseek-v3,glm-5")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device()
    gpu = device.type == "cuda"
    env = BenchEnv(device=device, warmup=args.warmup, iters=args.iters if gpu else 3, cpu_budget_s=0.05)
    log(f"device {env.device_name} {env.sm} torch {torch.__version__} triton={nv.HAVE_TRITON}")
    results: dict = {}
    errors: dict = {}
    stage_dir = Path(tempfile.mkdtemp(prefix="microbench-"))

    def do_memory():
        m = memory.measure_memory(env) if gpu else memory.measure_memory(env, cpu_bytes=32 * 2**20, cpu_mm=256)
        write_json(stage_dir / "memory.json", m)
        env.copy_gbps = m["copy_gbps"]
        return {k: m[k] for k in ("copy_gbps", "read_gbps", "peak_tflops", "skipped")}

    section("memory", do_memory, results, errors)
    section("nvfp4_checks", lambda: nvfp4_checks(env), results, errors)
    if gpu:
        section("nvfp4_variants", lambda: nvfp4_variant_timing(env), results, errors)

    bars = [shapes.GemmShape("bar.gemv_18432x7168", "validation", 18432, 7168),
            shapes.GemmShape("bar.small_256x6144", "validation", 256, 6144, quantizable=False)]
    for i, name in enumerate(args.models.split(",")):
        spec = load_model_card(REPO / "config" / "models" / f"{name}.json")
        mdir = stage_dir / name
        mdir.mkdir(exist_ok=True)
        m_values = [1, 2, 4, 8, 16, 32, 64] if gpu else [1, 2]

        def do_gemm(spec=spec, mdir=mdir, m_values=m_values, first=(i == 0)):
            sh = shapes.gemm_shapes(spec) + (bars if first else [])
            if not gpu:
                sh = [s for s in sh if s.n * s.k <= 4_000_000][:2] + ([shapes.GemmShape("bar.tiny", "validation", 64, 128)])
            df, js = gemm.run_gemm_bench(env, sh, m_values, log=lambda s: None)
            write_table(mdir / "gemm.csv", df)
            write_json(mdir / "gemm.json", js)
            return {"dtypes": js["dtypes"], "skipped": js["skipped"], "checks_failed": [c for c in js["checks"] if not c.get("pass")],
                    "rows": len(df), "bars": df[df["name"].str.startswith("bar.")][
                        ["name", "dtype", "backend", "M", "gpu_us", "gpu_p99_us", "eager_us", "eager_loop_us", "gbps",
                         "frac_of_copy_bw", "timing"]].to_dict("records")}

        def do_moe(spec=spec, mdir=mdir, m_values=m_values):
            shp = shapes.moe_shape(spec)
            if not gpu:
                shp = shapes.MoeShape(hidden=64, experts_total=16, experts_local=16, top_k=2, inter=32, scoring=shp.scoring,
                                      n_group=shp.n_group if 16 % shp.n_group == 0 else 1, topk_group=min(shp.topk_group, 2))
            df, js = moe.run_moe_bench(env, shp, m_values, log=lambda s: None)
            write_table(mdir / "moe.csv", df)
            write_json(mdir / "moe.json", js)
            return {"by_m": js["by_m"], "skipped": js["skipped"]}

        def do_attention(spec=spec, mdir=mdir):
            shp = shapes.attention_shape(spec)
            lens = [512, 4096, 16384] if gpu else [64]
            df, js = attention.run_attention_bench(env, shp, lens, [1], log=lambda s: None)
            write_table(mdir / "attention.csv", df)
            write_json(mdir / "attention.json", js)
            return {"best": js["best"], "skipped": js["skipped"]}

        section(f"{name}.gemm", do_gemm, results, errors)
        section(f"{name}.moe", do_moe, results, errors)
        section(f"{name}.attention", do_attention, results, errors)

        def do_allreduce(spec=spec, mdir=mdir):
            s = {**DEFAULTS["allreduce"], "timeout_s": 120}
            if not gpu:
                s["max_bytes"] = 4096
            df, js = allreduce.run_allreduce_bench(1, shapes.allreduce_model_bytes(spec, 1), s, args.warmup,
                                                   args.iters if gpu else 3, env.device_name,
                                                   torch.cuda.device_count() if gpu else 0, log=log)
            write_table(mdir / "allreduce.csv", df)
            write_json(mdir / "allreduce.json", js)
            return {"figures": js["figures"], "skipped": js["skipped"],
                    "rows": df[["size", "mode", "time_us", "time_p99_us", "algbw", "busbw", "wrong"]].to_dict("records")}

        if i == 0:
            section(f"{name}.allreduce", do_allreduce, results, errors)

    def do_launch():
        df, js = launch.run_launch_bench(env, gemm_nk=(256, 6144), log=log)
        write_table(stage_dir / "launch.csv", df)
        write_json(stage_dir / "launch.json", js)
        return {"kernels": js["kernels"], "rows": df.to_dict("records"), "skipped": js["skipped"]}

    section("launch", do_launch, results, errors)

    # ---- bars
    copy = (results.get("memory") or {}).get("copy_gbps")
    bar_rows = (results.get("deepseek-v3.gemm") or results.get(f"{args.models.split(',')[0]}.gemm") or {}).get("bars", [])

    def bar(name, m=1, dtype="bf16"):
        for r in bar_rows:
            if r["name"] == name and r["M"] == m and r["dtype"] == dtype:
                return r
        return None

    gemv, small = bar("bar.gemv_18432x7168"), bar("bar.small_256x6144")
    verdict = {
        "copy_gbps": copy,
        "bar_copy_ge_4000_gbps": bool(copy and copy >= 4000),
        "gemv_18432x7168_m1": gemv,
        "bar_gemv_ge_90pct_copy": bool(gemv and gemv.get("frac_of_copy_bw") and gemv["frac_of_copy_bw"] >= 0.9),
        "small_256x6144_m1": small,
        "bar_small_eager_gt_20us": bool(small and small.get("eager_us") and small["eager_us"] > 20),
        "nvfp4_checks_pass": all(r.get("pass") for r in results.get("nvfp4_checks", [])) if results.get("nvfp4_checks") else None,
    }
    summary = {"device": env.device_name, "sm": env.sm, "torch": torch.__version__, "verdict": verdict,
               "results": results, "errors": errors}
    write_json(out_dir / "summary.json", summary)
    with tarfile.open(out_dir / "microbench.tar.gz", "w:gz") as tar:
        tar.add(stage_dir, arcname="microbench")
    for r in results.get("nvfp4_variants", []):
        print("nvfp4", json.dumps(r, default=str))
    print(json.dumps(verdict, indent=1, default=str))
    print("errors:", json.dumps(errors, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
