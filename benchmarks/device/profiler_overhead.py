#!/usr/bin/env python3
"""Where torch.profiler's cost sits in a traced decode step, on one GPU, in one process (issue 13's 5% check).

    python3 benchmarks/device/profiler_overhead.py OUT_DIR [--card config/models/llama-1b-random.json]

Same model, same CUDA graph, same process:
  graph: the unprofiled step (perf_counter wall, and CUDA events around the graph replay) against profiled steps
         with CPU+CUDA (record_shapes on/off), CUDA only, CUDA only with experimental options, and CPU only;
         each profiled trace is analysed by the trace stage (busy, idle, kernels, in-step gaps, kernel durations).
  calib: CUDA graphs of N tiny / medium kernels, CUDA-event span per replay unprofiled vs profiled: the
         profiler's cost per graph kernel, at two kernel sizes and two N (is it a per-kernel constant?).
  eager: the eager step unprofiled vs CPU+CUDA vs CUDA only (steps found by the kernel period).
  hwtrace: in a child process, CUPTI's hardware-trace switch (cuptiActivityEnableHWTrace) tried through ctypes.
Writes OUT_DIR/overhead_<parts>.json (raw numbers) and a few small gzipped traces. It reports; it asserts nothing.
Run each part in its own process (--parts graph, calib, eager, hwtrace): a device-side assert poisons the process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "workflow"))

RESULT: dict = {}
SLEEP_CYCLES = 10_000_000  # ~5 ms at H200 clocks: longer than a profiled launch of 1000 graph nodes
OUT = Path(".")
TAG = "all"


def save() -> None:
    (OUT / f"overhead_{TAG}.json").write_text(json.dumps(RESULT, indent=1, default=str))


def pct(xs):
    from decode_gap.timing import percentiles

    vals = [x for x in xs if x is not None]
    return percentiles(vals) if vals else None


def guarded(name):
    def deco(fn):
        def run(*a, **k):
            t0 = time.time()
            try:
                RESULT[name] = fn(*a, **k)
            except Exception as exc:  # one failed part must not lose the others
                RESULT[name] = {"error": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()[-2500:]}
            RESULT.setdefault("_seconds", {})[name] = round(time.time() - t0, 1)
            print(f"[{name}] {time.time() - t0:.1f} s", json.dumps(RESULT[name], default=str)[:1500], flush=True)
            save()
        return run
    return deco


def trace_stats(path: Path) -> dict:
    """The trace stage's figures plus the in-step gap and kernel-duration spread."""
    import numpy as np

    from decode_gap.trace.analyze import analyze_path

    res, _ = analyze_path(path)
    keys = ("method", "steps_found", "steps_used", "step_ms_median", "period_ms_median", "gpu_busy_ms_median",
            "gpu_idle_ms_median", "kernels_per_step_median", "kernel_ms_per_step", "between_steps_ms_median")
    out = {k: res.get(k) for k in keys}
    bi = (res["gpu_busy_ms_median"] or 0) + (res["gpu_idle_ms_median"] or 0)
    out["busy_plus_idle_ms"] = bi
    tl = res.get("timeline") or {}
    ks = sorted(tl.get("kernels") or [], key=lambda k: k["start_us"])
    if ks:
        st = np.array([k["start_us"] for k in ks])
        du = np.array([k["dur_us"] for k in ks])
        gaps = st[1:] - (st[:-1] + du[:-1])
        out["timeline_gaps_us"] = pct(gaps.tolist())
        out["timeline_gaps_under_3us_sum_ms"] = float(gaps[gaps < 3].sum() / 1e3)
        out["timeline_gaps_over_3us_sum_ms"] = float(gaps[gaps >= 3].sum() / 1e3)
        out["timeline_kernel_dur_us"] = pct(du.tolist())
        out["timeline_first_kernel_us"] = float(st[0])
        out["timeline_gpu_span_ms"] = float((st[-1] + du[-1] - st[0]) / 1e3)
    return out


def graph_part(card: str, out: Path) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from decode_gap.simulate.engine_trace import _Graph, build_model
    from decode_gap.timing import back_to_back_us

    model, cfg = build_model(card, None, "cuda", torch.bfloat16)
    # a cache far longer than the steps run here: a position past its end trips index_copy_'s bound check
    g = _Graph(model, 32, 1024, "cuda")
    if g.graph is None:
        raise RuntimeError(f"no manual CUDA graph: {g.backend}")
    res: dict = {"backend": g.backend, "layers": cfg.num_hidden_layers}

    step = g.step  # the engine level's own graph step (CUDA events around the replay when given)

    def queued_ms(m):  # replays queued back to back behind a sleep kernel: the graph's own GPU span, in ms
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        return [u / 1e3 for u in back_to_back_us(g.graph.replay, m)]

    def timed(n, annotate=False):
        walls, evs = [], []
        for _ in range(n):
            ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if annotate:
                with record_function("decode_step"):
                    step(ev)
            else:
                step(ev)
            walls.append((time.perf_counter() - t0) * 1e3)
            evs.append(ev)
        torch.cuda.synchronize()
        return walls, [a.elapsed_time(b) for a, b in evs]

    for _ in range(10):
        step()
    w, e = timed(200)
    res["unprofiled"] = {"step_wall_ms": pct(w), "graph_gpu_ms": pct(e)}
    # back-to-back replays (no host step between): the graph's own GPU span
    res["unprofiled"]["graph_b2b_gpu_ms"] = pct(queued_ms(100))
    save()

    variants = {
        "cpu_cuda_shapes": dict(acts=["CPU", "CUDA"], record_shapes=True, annotate=True),
        "cpu_cuda": dict(acts=["CPU", "CUDA"], record_shapes=False, annotate=True),
        "cuda_only": dict(acts=["CUDA"], record_shapes=False, annotate=True, keep="h200_llama1b_graph_cudaonly"),
        "cuda_only_noann": dict(acts=["CUDA"], record_shapes=False, annotate=False),
        "cuda_only_noextcorr": dict(acts=["CUDA"], record_shapes=False, annotate=True,
                                    exp=dict(disable_external_correlation=True)),
        "cpu_only": dict(acts=["CPU"], record_shapes=False, annotate=True),
    }
    for name, v in variants.items():
        try:
            kw = {}
            if v.get("exp"):
                kw["experimental_config"] = torch._C._profiler._ExperimentalConfig(**v["exp"])
            acts = [getattr(ProfilerActivity, a) for a in v["acts"]]
            with profile(activities=acts, record_shapes=v["record_shapes"], **kw) as prof:
                timed(3, v["annotate"])  # the profiler's own first-step warm-up
                w, e = timed(20, v["annotate"])
                b2b = []
                # queued replays: the graph's own GPU span under the profiler
                if "CUDA" in v["acts"] and v["annotate"] and not v.get("keep"):
                    b2b = queued_ms(20)
                if v.get("keep"):
                    prof.add_metadata_json("decode_gap_unprofiled", json.dumps(res["unprofiled"]))
            path = out / f"{v.get('keep') or 'tmp_' + name}.json.gz"
            prof.export_chrome_trace(str(path))
            row = {"step_wall_ms": pct(w), "graph_gpu_ms": pct(e), "trace_mb": round(path.stat().st_size / 1e6, 3)}
            if b2b:
                row["graph_b2b_gpu_ms"] = pct(b2b)
            if "CUDA" in v["acts"]:
                try:
                    row["trace"] = trace_stats(path)
                except Exception as exc:
                    row["trace"] = {"error": f"{type(exc).__name__}: {exc}"}
            if not v.get("keep"):
                path.unlink()
            res[name] = row
        except Exception as exc:
            res[name] = {"error": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()[-1500:]}
        print(name, json.dumps(res[name], default=str)[:600], flush=True)
        save()
    w, e = timed(100)  # does CUPTI leave a cost behind once the profiler stopped?
    res["unprofiled_after"] = {"step_wall_ms": pct(w), "graph_gpu_ms": pct(e)}
    u = res["unprofiled"]["step_wall_ms"]["median"]
    ug = res["unprofiled"]["graph_gpu_ms"]["median"]
    res["summary"] = {n: {"wall_over_unprof": r["step_wall_ms"]["median"] / u,
                          "graph_gpu_over_unprof": r["graph_gpu_ms"]["median"] / ug,
                          "busy_plus_idle_over_unprof": (r.get("trace") or {}).get("busy_plus_idle_ms", 0) / u}
                      for n, r in res.items() if isinstance(r, dict) and "step_wall_ms" in r and n != "unprofiled"}
    return res


def _calib_graph(kind: str, n: int):
    import torch

    if kind == "tiny":
        x = torch.zeros(1, device="cuda")
        fns = [lambda: x.add_(1.0)] * n
    else:  # medium: 8 MB read + 8 MB write per kernel
        x = torch.ones(4 * 2**20, device="cuda", dtype=torch.bfloat16)
        fns = [lambda: x.mul_(1.0)] * n
    from decode_gap.timing import capture_graph

    return capture_graph(fns), x


def calib_part(out: Path) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from decode_gap.timing import graph_spans_us

    res = {}
    for kind, n in (("tiny", 1000), ("tiny", 200), ("medium", 400)):
        g, _x = _calib_graph(kind, n)

        def spans(m):  # ms: the graph's own GPU span, not the (profiled, slower) cudaGraphLaunch call
            return [u / 1e3 for u in graph_spans_us(g, m, SLEEP_CYCLES)]

        spans(5)
        row = {"n": n, "unprofiled_ms": pct(spans(30))}
        for name, acts in (("cuda_only", [ProfilerActivity.CUDA]),
                           ("cpu_cuda", [ProfilerActivity.CPU, ProfilerActivity.CUDA])):
            with profile(activities=acts) as prof:
                spans(2)
                s = spans(10)
            keep = kind == "tiny" and n == 200 and name == "cuda_only"
            path = out / ("h200_calib_graph_tiny200.json.gz" if keep else f"tmp_calib_{kind}{n}_{name}.json.gz")
            prof.export_chrome_trace(str(path))
            r = {"profiled_ms": pct(s)}
            try:
                from decode_gap.trace.load import read_trace

                ev = read_trace(path).events
                k = ev[ev["cat"] == "kernel"].sort_values("ts")
                gaps = (k["ts"].to_numpy()[1:] - k["end"].to_numpy()[:-1])
                r["kernels"] = int(len(k))
                r["kernel_dur_us"] = pct(k["dur"].tolist())
                r["gap_us"] = pct([x for x in gaps.tolist() if x < 50])
            except Exception as exc:
                r["trace_error"] = str(exc)
            r["per_kernel_cost_us"] = (r["profiled_ms"]["median"] - row["unprofiled_ms"]["median"]) * 1e3 / n
            if not keep:
                path.unlink()
            row[name] = r
        row["unprofiled_per_kernel_us"] = row["unprofiled_ms"]["median"] * 1e3 / n
        res[f"{kind}{n}"] = row
        print(kind, n, json.dumps(row, default=str)[:800], flush=True)
    # eager launches of tiny kernels: the profiler's host-side cost per launch
    x = torch.zeros(1, device="cuda")

    def eager(n=1000):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    for _ in range(3):
        eager()
    e = {"unprofiled_ms": pct([eager() for _ in range(10)])}
    for name, acts in (("cuda_only", [ProfilerActivity.CUDA]),
                       ("cpu_cuda", [ProfilerActivity.CPU, ProfilerActivity.CUDA])):
        with profile(activities=acts):
            eager()
            e[name] = {"profiled_ms": pct([eager() for _ in range(5)])}
        e[name]["per_launch_cost_us"] = (e[name]["profiled_ms"]["median"] - e["unprofiled_ms"]["median"])
    res["eager_tiny1000"] = e
    return res


def eager_part(card: str, out: Path) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from decode_gap.simulate.engine_trace import _Eager, build_model

    model, _ = build_model(card, None, "cuda", torch.bfloat16)
    r = _Eager(model, 32, "cuda")

    def timed(n, annotate):
        walls = []
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if annotate:
                with record_function("decode_step"):
                    r.step()
            else:
                r.step()
            walls.append((time.perf_counter() - t0) * 1e3)
        return walls

    timed(3, False)
    res = {"unprofiled_before": {"step_wall_ms": pct(timed(20, False))}}
    for name, acts, ann, shapes, keep in (
            ("cpu_cuda_shapes", ["CPU", "CUDA"], True, True, None),
            ("cuda_only_noann", ["CUDA"], False, False, "h200_llama1b_eager_cudaonly"),
            ("cpu_cuda", ["CPU", "CUDA"], True, False, None)):
        try:
            with profile(activities=[getattr(ProfilerActivity, a) for a in acts], record_shapes=shapes) as prof:
                timed(2, ann)
                w = timed(8, ann)
            path = out / f"{keep or 'tmp_eager_' + name}.json.gz"
            prof.export_chrome_trace(str(path))
            row = {"step_wall_ms": pct(w), "trace_mb": round(path.stat().st_size / 1e6, 3)}
            try:
                row["trace"] = trace_stats(path)
            except Exception as exc:
                row["trace"] = {"error": f"{type(exc).__name__}: {exc}"}
            if not keep:
                path.unlink()
            res[name] = row
        except Exception as exc:
            res[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print("eager", name, json.dumps(res[name], default=str)[:600], flush=True)
        save()
    res["unprofiled_after"] = {"step_wall_ms": pct(timed(20, False))}
    return res


HW_CHILD = r"""
import ctypes, json, sys, time, torch
from torch.profiler import profile, ProfilerActivity
out = {}
with profile(activities=[ProfilerActivity.CUDA]):
    torch.zeros(1, device='cuda').add_(1)
libs = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcupti' in l})
out['libcupti'] = libs
if libs:
    lib = ctypes.CDLL(libs[0])
    try:
        out['enable_hw_trace_rc'] = int(lib.cuptiActivityEnableHWTrace(ctypes.c_uint8(1)))
    except AttributeError as e:
        out['enable_hw_trace_rc'] = 'symbol missing: ' + str(e)
x = torch.zeros(1, device='cuda')
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3): x.add_(1)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for _ in range(1000): x.add_(1.0)
def spans(m):
    r = []
    for _ in range(m):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(); a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        r.append(a.elapsed_time(b))
    return sorted(r)[len(r) // 2]
spans(5)
out['unprofiled_ms'] = spans(20)
with profile(activities=[ProfilerActivity.CUDA]) as p:
    spans(2)
    out['profiled_ms'] = spans(10)
ks = [e for e in p.events() if str(e.device_type).endswith('CUDA')]
out['kernel_events'] = len(ks)
print(json.dumps(out))
"""


def hw_part() -> dict:
    p = subprocess.run([sys.executable, "-c", HW_CHILD], capture_output=True, text=True, timeout=90)
    last = (p.stdout.strip().splitlines() or [""])[-1]
    try:
        return {"rc": p.returncode, **json.loads(last)}
    except ValueError:
        return {"rc": p.returncode, "tail": (p.stdout + p.stderr)[-1500:]}


def main() -> None:
    global OUT, TAG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--card", default=str(REPO / "config/models/llama-1b-random.json"))
    ap.add_argument("--parts", default="graph,calib,eager,hwtrace")
    args = ap.parse_args()
    OUT = Path(args.out_dir)
    OUT.mkdir(parents=True, exist_ok=True)
    import torch

    RESULT["env"] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                     "cuda": torch.version.cuda, "card": args.card}
    parts = args.parts.split(",")
    TAG = "_".join(parts) if len(parts) < 4 else "all"
    if "graph" in parts:
        guarded("graph")(graph_part)(args.card, OUT)
    if "calib" in parts:
        guarded("calib")(calib_part)(OUT)
    if "eager" in parts:
        guarded("eager")(eager_part)(args.card, OUT)
    if "hwtrace" in parts:
        guarded("hwtrace")(hw_part)()
    save()
    print(f"wrote {OUT}/overhead_{TAG}.json", flush=True)


if __name__ == "__main__":
    main()
