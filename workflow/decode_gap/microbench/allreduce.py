"""All-reduce over real torch.distributed: one process per rank, NCCL on GPUs, gloo on CPU.

Output follows nccl-tests: size (bytes), count (elements), type, redop, root, time_us, algbw and busbw in
GB/s (1e9 bytes/s), with algbw = size / time and busbw = algbw * 2(n-1)/n, and `wrong` (nccl-tests'
#wrong: elements that differ from the expected sum in a check op before timing). As in nccl-tests, the
timed ops run in place, back to back, on the same buffer. Each op is timed on each rank (CUDA events on
a GPU, perf_counter with gloo); an op's time is the slowest rank's, and time_us is the median over ops.
`mode` is `eager` or `graph` (ops captured in a CUDA graph and replayed; NCCL only).

A rank that fails takes the others down: the parent watches every rank, terminates the rest at the first
failure, and raises one line naming the rank and its error; a rank that hangs past the deadline is killed
the same way. No process outlives the call.

Across nodes (`microbench.allreduce.nodes > 1`, inside a SLURM job): `launch_multinode` writes job.json on the
shared filesystem (under the rule's output directory), starts one `torchrun` per node with `srun`
(`decode_gap.fleet.multinode_command`, c10d rendezvous on the allocation's first host), and each rank joins
through `env://` (torchrun's RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT). Ranks write the same rank files,
so the CSV and JSON have the same shape as on one node; the JSON adds `nodes`, `ranks_per_node` and `hosts`.
A rank that fails writes rank<r>.error.json first, so the one-line error names its rank, host and reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, DecodeGapError
from ..provenance import measured, unavailable
from ..ranks import launch
from ..timing import capture_graph, warm_on_side_stream
from .timing import stats_us

COLUMNS = [
    "size", "count", "type", "redop", "root", "time_us", "algbw", "busbw", "wrong", "mode", "placement",
    "world_size", "backend", "source", "time_min_us", "time_p99_us", "iters", "model_size",
]

DTYPE_NAMES = {"bfloat16": 2, "float": 4, "half": 2}
MODULE = "decode_gap.microbench.allreduce"
ENV_INIT = "env://"  # job.json's init_method under torchrun


def busbw_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor 2(n-1)/n (0 for one rank)."""
    return 2.0 * (world_size - 1) / world_size if world_size > 0 else 0.0


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    return size_bytes / (time_us * 1e-6) / 1e9 if time_us > 0 else float("nan")


def size_sweep(min_bytes: int, max_bytes: int, elem: int) -> list[int]:
    """Powers of two from min_bytes to max_bytes (nccl-tests -f 2), rounded to whole elements."""
    sizes = []
    s = max(min_bytes, elem)
    while s <= max_bytes:
        sizes.append(s - s % elem)
        s *= 2
    return sorted(set(sizes))


# --------------------------------------------------------------------------- the rank process


def _rank_main(rank: int, job: dict[str, Any]) -> None:
    """Body of one rank (runs in its own process). Writes rank<r>.json into job['out_dir'].

    Started by `launch_ranks`, the rank meets the others through a file store; under torchrun
    (job['init_method'] == 'env://'), through torchrun's environment, on GPU LOCAL_RANK of its node.
    """
    import torch
    import torch.distributed as dist

    backend = job["backend"]
    world = job["world_size"]
    launched = job.get("init_method") == ENV_INIT
    local_rank = rank
    if launched:
        local_rank = int(os.environ["LOCAL_RANK"])
        if int(os.environ["WORLD_SIZE"]) != world:
            raise RuntimeError(f"torchrun started {os.environ['WORLD_SIZE']} ranks, job.json wants {world}")
        Path(job["out_dir"], f"rank{rank}.where.json").write_text(json.dumps(_where(rank, local_rank, backend)))
    if job.get("fail_rank") == rank:  # used by the tests: a real failure on one rank
        raise RuntimeError(f"injected failure on rank {rank}")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    timeout = timedelta(seconds=job["op_timeout_s"])
    if launched:
        dist.init_process_group(backend, init_method=ENV_INIT, timeout=timeout)
    else:
        dist.init_process_group(backend, init_method=job["init_method"], rank=rank, world_size=world, timeout=timeout)
    try:
        if job.get("hang_rank") == rank:  # used by the tests: this rank never joins the collectives
            time.sleep(3600)
        dtype = {"bfloat16": torch.bfloat16, "float": torch.float32, "half": torch.float16}[job["type"]]
        elem = torch.tensor([], dtype=dtype).element_size()
        results = []
        for size in job["sizes"]:
            count = max(size // elem, 1)
            results.append(_one_size(rank, world, device, dtype, count, job))
        Path(job["out_dir"], f"rank{rank}.json").write_text(json.dumps(results))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _where(rank: int, local_rank: int, backend: str) -> dict[str, Any]:
    return {"rank": rank, "local_rank": local_rank, "host": socket.gethostname(),
            "device": f"cuda:{local_rank}" if backend == "nccl" else "cpu"}


def _one_size(rank, world, device, dtype, count, job) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    gpu = device.type == "cuda"
    warmup, iters = job["warmup"], job["iters"]
    # correctness: each rank holds rank+1, the sum is n(n+1)/2 everywhere (exact in bf16 for small n)
    buf = torch.full((count,), float(rank + 1), dtype=dtype, device=device)
    dist.all_reduce(buf)
    expect = world * (world + 1) / 2
    wrong = int((buf.float() != expect).sum().item())
    # timing data: random values, reduced in place again and again (as nccl-tests does)
    buf.copy_(torch.rand(count, dtype=torch.float32, device=device).to(dtype))
    for _ in range(warmup):
        dist.all_reduce(buf)
    out: dict[str, Any] = {"count": count, "bytes": count * buf.element_size(), "wrong": wrong}
    dist.barrier()
    if gpu:
        torch.cuda.synchronize(device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            starts[i].record()
            dist.all_reduce(buf)
            ends[i].record()
        torch.cuda.synchronize(device)
        out["eager_us"] = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    else:
        samples = []
        for _ in range(iters):
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            samples.append((time.perf_counter() - t0) * 1e6)
        out["eager_us"] = samples
    if gpu and job.get("graph", True):
        try:
            reps = job.get("graph_ops", 10)
            def op() -> None:
                dist.all_reduce(buf)

            warm_on_side_stream([op], device, warmup=2)
            graph = capture_graph([op] * reps, device, warmup=0)
            graph.replay()
            torch.cuda.synchronize(device)
            dist.barrier()
            n = max(iters // 2, 3)
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            for i in range(n):
                starts[i].record()
                graph.replay()
                ends[i].record()
            torch.cuda.synchronize(device)
            out["graph_us"] = [s.elapsed_time(e) * 1e3 / reps for s, e in zip(starts, ends)]
            del graph
        except Exception as exc:  # recorded as a skipped case by the parent
            out["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return out


# --------------------------------------------------------------------------- the parent


def launch_ranks(job: dict[str, Any], world_size: int, timeout_s: float) -> list[list[dict[str, Any]]]:
    """One process per rank through the shared launcher (`decode_gap.ranks`); each rank's results, by rank."""
    per_rank = launch(MODULE, job, world_size, timeout_s, "all-reduce")
    missing = [r for r in range(world_size) if r not in per_rank]
    if missing:
        raise DecodeGapError(f"all-reduce: rank {missing[0]} of {world_size} exited without writing its results")
    return [per_rank[r] for r in range(world_size)]


def launch_multinode(
    job: dict[str, Any],
    layout: Any,
    work_dir: str | Path,
    timeout_s: float,
    *,
    gpus: bool,
    env: dict[str, str] | None = None,
    hosts: list[str] | None = None,
    launcher: list[str] | None = None,
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """All ranks of `layout` (a fleet.AllreduceLayout) through srun + torchrun; each rank's results and where it ran.

    `work_dir` must be on the filesystem every node sees (the rule's output directory); it is emptied first,
    so no rank file of an earlier run counts. `env`, `hosts` and `launcher` go to `fleet.multinode_command`
    (the SLURM job's own by default). A failure or a launch past `timeout_s` is one DecodeGapError line naming
    the failed rank, its host and its error; `fleet.run_launch` stops the launch first.
    """
    from .. import fleet

    work = Path(work_dir).resolve()
    job_path = work / "job.json"
    cmd = fleet.multinode_command(layout, module=MODULE, module_args=[str(job_path)], gpus=gpus, env=env,
                                  hosts=hosts, launcher=launcher)  # first: outside a SLURM job, nothing is written
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    job = {**job, "out_dir": str(work), "init_method": ENV_INIT, "world_size": layout.world_size,
           "nodes": layout.nodes}
    job_path.write_text(json.dumps(job))
    try:
        fleet.run_launch(cmd, timeout_s=timeout_s, env=env)
    except DecodeGapError as exc:
        raise DecodeGapError(_multinode_failure(work, layout, _short_launch_error(str(exc)))) from None
    out, missing = [], []
    for r in range(layout.world_size):
        path = work / f"rank{r}.json"
        if path.exists():
            out.append(json.loads(path.read_text()))
        else:
            missing.append(r)
    if missing:
        raise DecodeGapError(_multinode_failure(work, layout, "the launch exited 0"))
    return out, _read_where(work, layout.world_size)


def _read_where(work: Path, world: int) -> list[dict[str, Any]]:
    where = []
    for r in range(world):
        try:
            where.append(json.loads(Path(work, f"rank{r}.where.json").read_text()))
        except (OSError, ValueError):
            where.append({"rank": r, "host": "?"})
    return where


def _short_launch_error(text: str) -> str:
    """fleet.run_launch's message without the whole command line (the log has it)."""
    m = re.match(r"^(.*?(?:exited with status -?\d+|did not finish within \d+ s|not found))", text)
    return m.group(1) if m else text.splitlines()[0][:300]


def _multinode_failure(work: Path, layout: Any, launch_error: str) -> str:
    """One line: the first rank that reported an error (rank, host, error), else the ranks without results."""
    world = layout.world_size
    where = {w["rank"]: w.get("host", "?") for w in _read_where(work, world)}
    errors = []
    for path in work.glob("rank*.error.json"):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    head = f"all-reduce across {layout.nodes} nodes ({world} ranks)"
    if errors:
        first = min(errors, key=lambda e: e["rank"])
        more = f" (and {len(errors) - 1} other rank(s))" if len(errors) > 1 else ""
        return (f"{head}: rank {first['rank']} on node {first.get('host', '?')} failed: {first['error']}{more}; "
                f"{launch_error}; the other ranks were stopped")
    missing = [r for r in range(world) if not Path(work, f"rank{r}.json").exists()]
    named = ", ".join(f"{r} ({where.get(r, '?')})" for r in missing[:8]) + (" ..." if len(missing) > 8 else "")
    return f"{head}: {launch_error}; rank(s) without results: {named or 'none'} (rank logs: the rule's log)"


def merge_ranks(per_rank: list[list[dict[str, Any]]], sizes: list[int], world: int, backend: str, type_name: str,
                model_bytes: int | None) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """nccl-tests rows from every rank's per-op times: an op takes as long as its slowest rank."""
    rows, skipped = [], []
    factor = busbw_factor(world)
    for i, _ in enumerate(sizes):
        first = per_rank[0][i]
        for mode, key in (("eager", "eager_us"), ("graph", "graph_us")):
            if key not in first:
                if mode == "graph" and "graph_error" in first:
                    skipped.append({"case": f"graph {first['bytes']} B", "reason": first["graph_error"]})
                continue
            per_op = np.max(np.array([r[i][key] for r in per_rank], dtype=float), axis=0)
            st = stats_us(per_op)
            alg = algbw_gbps(first["bytes"], st.median_us)
            rows.append({
                "size": first["bytes"], "count": first["count"], "type": type_name, "redop": "sum", "root": -1,
                "time_us": st.median_us, "algbw": alg, "busbw": alg * factor,
                "wrong": int(sum(r[i]["wrong"] for r in per_rank)), "mode": mode, "placement": "in-place",
                "world_size": world, "backend": backend, "source": "torch.distributed", "time_min_us": st.min_us,
                "time_p99_us": st.p99_us, "iters": st.n, "model_size": bool(model_bytes and first["bytes"] == model_bytes),
            })
    return rows, skipped


# --------------------------------------------------------------------------- nccl-tests


def parse_nccl_tests(text: str, world: int) -> list[dict[str, Any]]:
    """Rows of `all_reduce_perf` output (out-of-place and in-place columns) in this module's schema."""
    rows = []
    for line in text.splitlines():
        tok = line.split()
        if len(tok) < 12 or line.lstrip().startswith("#") or not tok[0].isdigit():
            continue
        has_root = len(tok) >= 13
        head = 5 if has_root else 4
        size, count, type_name, redop = int(tok[0]), int(tok[1]), tok[2], tok[3]
        root = int(tok[4]) if has_root else -1
        for placement, off in (("out-of-place", head), ("in-place", head + 4)):
            try:
                t, alg, bus = float(tok[off]), float(tok[off + 1]), float(tok[off + 2])
            except (ValueError, IndexError):
                continue
            wrong_tok = tok[off + 3] if off + 3 < len(tok) else "N/A"
            rows.append({
                "size": size, "count": count, "type": type_name, "redop": redop, "root": root, "time_us": t,
                "algbw": alg, "busbw": bus, "wrong": int(wrong_tok) if wrong_tok.isdigit() else None,
                "mode": "eager", "placement": placement, "world_size": world, "backend": "nccl",
                "source": "nccl-tests", "time_min_us": None, "time_p99_us": None, "iters": None, "model_size": False,
            })
    return rows


def run_nccl_tests(world: int, min_bytes: int, max_bytes: int, warmup: int, iters: int, timeout_s: float,
                   binary: str | None = None) -> tuple[list[dict[str, Any]], dict[str, str] | None]:
    exe = binary or shutil.which("all_reduce_perf")
    if not exe:
        return [], {"case": "nccl-tests", "reason": "all_reduce_perf (nccl-tests) is not on the PATH"}
    cmd = [exe, "-b", str(min_bytes), "-e", str(max_bytes), "-f", "2", "-g", str(world), "-d", "bfloat16",
           "-w", str(warmup), "-n", str(iters), "-c", "1"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [], {"case": "nccl-tests", "reason": f"{' '.join(cmd)} did not finish within {timeout_s:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return [], {"case": "nccl-tests", "reason": f"all_reduce_perf exited {proc.returncode}: {tail[0][:200]}"}
    rows = parse_nccl_tests(proc.stdout, world)
    if not rows:
        return [], {"case": "nccl-tests", "reason": "all_reduce_perf printed no result rows"}
    return rows, None


# --------------------------------------------------------------------------- the stage


def run_allreduce_bench(
    world_size: int,
    model_bytes: int,
    settings: dict[str, Any],
    warmup: int,
    iters: int,
    device_name: str,
    gpu_count: int,
    log=print,
    **test_hooks: Any,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Measure at `world_size` ranks when the host can (GPUs: one per rank; CPU: gloo processes), else the
    1-rank floor; the figure at the model's message size is labelled either way."""
    ar = settings
    gpu = gpu_count > 0
    backend = "nccl" if gpu else "gloo"
    type_name = "bfloat16"
    elem = DTYPE_NAMES[type_name]
    skipped: list[dict[str, str]] = []
    max_bytes = int(ar["max_bytes"]) if gpu else min(int(ar["max_bytes"]), int(ar.get("cpu_max_bytes", 8 * 2**20)))
    if not gpu and int(ar["max_bytes"]) > max_bytes:
        skipped.append({"case": f"sizes above {max_bytes} B",
                        "reason": f"CPU host: sizes capped at microbench.allreduce.cpu_max_bytes={max_bytes}"})
    sizes = size_sweep(int(ar["min_bytes"]), max_bytes, elem)
    if model_bytes not in sizes:
        sizes = sorted(set(sizes) | {model_bytes})

    nodes = int(ar.get("nodes") or 1)
    if nodes > 1:
        return _run_multinode(world_size, nodes, model_bytes, ar, sizes, skipped, warmup, iters, device_name, gpu,
                              log, test_hooks)

    run_world = world_size
    multi_why = None
    if world_size == 1:
        multi_why = "one GPU/process only (world size 1: tp=1 and microbench.allreduce.world_size unset)"
    elif gpu and world_size > gpu_count:
        multi_why = f"needs {world_size} GPUs, this host has {gpu_count}"
        run_world = 1
    if multi_why:
        skipped.append({"case": f"all-reduce at world size {world_size}", "reason": multi_why})

    job = {"backend": backend, "sizes": sizes, "warmup": warmup, "iters": iters, "type": type_name,
           "op_timeout_s": min(float(ar.get("timeout_s", 300)), 120.0), "graph": gpu, **test_hooks}
    t0 = time.time()
    per_rank = launch_ranks(job, run_world, float(ar.get("timeout_s", 300)))
    log(f"all-reduce: {run_world} rank(s), {backend}, {len(sizes)} sizes in {time.time() - t0:.1f} s")
    rows, graph_skips = merge_ranks(per_rank, sizes, run_world, backend, type_name, model_bytes)
    skipped.extend(graph_skips)
    if not gpu:
        skipped.append({"case": "graph mode", "reason": "CUDA graphs need a GPU (gloo on CPU runs eager only)"})

    nccl_rows: list[dict[str, Any]] = []
    if gpu and ar.get("nccl_tests", True):
        nccl_rows, why = run_nccl_tests(run_world, int(ar["min_bytes"]), max_bytes, warmup, iters,
                                        float(ar.get("timeout_s", 300)))
        if why:
            skipped.append(why)
    elif not gpu:
        skipped.append({"case": "nccl-tests", "reason": "nccl-tests needs GPUs"})

    df = pd.DataFrame(rows + nccl_rows, columns=COLUMNS)
    out = allreduce_summary(df, world_size, run_world, backend, model_bytes, multi_why, skipped, device_name)
    out["nodes"] = 1
    return df, out


def _run_multinode(world_size: int, nodes: int, model_bytes: int, ar: dict[str, Any], sizes: list[int],
                   skipped: list[dict[str, str]], warmup: int, iters: int, device_name: str, gpu: bool, log,
                   test_hooks: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The stage across `nodes` nodes of a SLURM job: srun + torchrun, then the same rows and summary as one node.

    ar['work_dir'] (set by the rule's script: a folder under its output directory) holds job.json and the rank
    files; ar['launch'] may carry `env`, `hosts` and `launcher` for `launch_multinode`.
    """
    from .. import fleet

    layout = fleet.layout_of(world_size, nodes)
    if not ar.get("work_dir"):
        raise ConfigError("microbench.allreduce.nodes > 1: no work_dir on the shared filesystem (the bench_allreduce "
                          "script sets it under the rule's output directory)")
    backend = "nccl" if gpu else "gloo"
    type_name = "bfloat16"
    timeout_s = float(ar.get("timeout_s", 300))
    job = {"backend": backend, "sizes": sizes, "warmup": warmup, "iters": iters, "type": type_name,
           "op_timeout_s": min(timeout_s, 120.0), "graph": gpu, **test_hooks}
    t0 = time.time()
    per_rank, where = launch_multinode(job, layout, ar["work_dir"], timeout_s, gpus=gpu, **(ar.get("launch") or {}))
    hosts = sorted({w.get("host", "?") for w in where})
    log(f"all-reduce: {layout.world_size} rank(s) on {layout.nodes} nodes ({', '.join(hosts)}), {backend}, "
        f"{len(sizes)} sizes in {time.time() - t0:.1f} s")
    rows, graph_skips = merge_ranks(per_rank, sizes, layout.world_size, backend, type_name, model_bytes)
    skipped.extend(graph_skips)
    if not gpu:
        skipped.append({"case": "graph mode", "reason": "CUDA graphs need a GPU (gloo on CPU runs eager only)"})
    skipped.append({"case": "nccl-tests", "reason": "all_reduce_perf -g runs on one node; across nodes it needs an "
                                                      "MPI build under mpirun (not run)"})
    df = pd.DataFrame(rows, columns=COLUMNS)
    out = allreduce_summary(df, world_size, layout.world_size, backend, model_bytes, None, skipped, device_name)
    out.update(nodes=layout.nodes, ranks_per_node=layout.per_node, hosts=hosts)
    seen: set[int] = set()
    for fig in out["figures"].values():  # the multi-GPU figure may be the headline's own dict: label it once
        if fig.get("status") == "measured" and id(fig) not in seen:
            seen.add(id(fig))
            fig["source"] = f"{fig['source']}, across {layout.nodes} nodes ({layout.per_node} per node)"
    return df, out


def allreduce_summary(df: pd.DataFrame, world_size: int, run_world: int, backend: str, model_bytes: int,
                      multi_why: str | None, skipped: list[dict[str, str]], device_name: str) -> dict[str, Any]:
    ours = df[(df["source"] == "torch.distributed") & (df["size"] == model_bytes)]
    by_mode = {m: float(g["time_us"].iloc[0]) for m, g in ours.groupby("mode")}
    headline_mode = "graph" if "graph" in by_mode else "eager"
    floor = run_world == 1
    src = (f"torch.distributed {backend}, {run_world} rank(s), {model_bytes} B (hidden x batch x 2 B), "
           f"{headline_mode}, median" + (" - the 1-rank floor" if floor else ""))
    figures: dict[str, Any] = {}
    if headline_mode in by_mode:
        figures["allreduce_us_at_model_size"] = measured(by_mode[headline_mode], "us", src)
    else:
        figures["allreduce_us_at_model_size"] = unavailable("no measurement at the model's message size", "us")
    for m in ("eager", "graph"):
        figures[f"allreduce_us_at_model_size_{m}"] = (
            measured(by_mode[m], "us", src.replace(headline_mode, m)) if m in by_mode
            else unavailable("graph capture needs NCCL on a GPU" if m == "graph" else "not measured", "us")
        )
    if multi_why:
        figures["allreduce_us_at_model_size_multi_gpu"] = unavailable(multi_why, "us")
    else:
        figures["allreduce_us_at_model_size_multi_gpu"] = figures["allreduce_us_at_model_size"]
    wrong = int(pd.to_numeric(df.loc[df["source"] == "torch.distributed", "wrong"], errors="coerce").fillna(0).sum())
    status = "ok" if not skipped else "partial"
    out = {
        "stage": "microbench.allreduce",
        "status": status,
        "device": device_name,
        "backend": backend,
        "world_size": world_size,
        "measured_world_size": run_world,
        "model_bytes": model_bytes,
        "allreduce_us_at_model_size": figures["allreduce_us_at_model_size"]["value"],
        "figures": figures,
        "wrong_elements": wrong,
        "busbw_formula": "busbw = algbw * 2(n-1)/n; algbw = size / time_us / 1e3 (GB/s)",
        "skipped": skipped,
    }
    if status != "ok":
        out["reason"] = "; ".join(sorted({s["reason"] for s in skipped})[:3])
    if wrong:
        out["status"] = "partial"
        out["reason"] = f"{wrong} elements disagreed with the expected sum; " + out.get("reason", "")
    return out


def _main(argv: list[str]) -> int:
    """Entry point of one rank: `python -m decode_gap.microbench.allreduce <job.json> [<rank>]`.

    Without a rank argument the rank is $RANK (torchrun sets it, with LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT).
    """
    if not argv:
        print("usage: python -m decode_gap.microbench.allreduce <job.json> [<rank>]", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    if len(argv) > 1:
        rank = int(argv[1])
    elif os.environ.get("RANK", "").isdigit():
        rank = int(os.environ["RANK"])
    else:
        print(f"{argv[0]}: no rank argument and $RANK is not set (start it with torchrun)", file=sys.stderr)
        return 2
    try:
        _rank_main(rank, job)
    except BaseException as exc:
        if job.get("init_method") == ENV_INIT:  # the launcher only sees an exit status: leave the reason
            _write_error(job, rank, exc)
        raise
    return 0


def _write_error(job: dict[str, Any], rank: int, exc: BaseException) -> None:
    text = str(exc).strip().splitlines()
    err = {**_where(rank, int(os.environ.get("LOCAL_RANK", rank)), job.get("backend", "")),
           "error": f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__}
    try:
        Path(job["out_dir"], f"rank{rank}.error.json").write_text(json.dumps(err))
    except OSError:
        pass


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
