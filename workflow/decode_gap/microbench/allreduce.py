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

Modules: allreduce_rank.py (one rank's process), allreduce_launch.py (starting the ranks, one line per failure),
nccl_tests.py (all_reduce_perf); this one is the stage: sizes, merged rows, the summary and the rank entry point.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..provenance import measured, unavailable
from ..ranks import rank_main
from .allreduce_launch import (  # noqa: F401 - re-exported
    _multinode_failure,
    _read_where,
    _short_launch_error,
    launch_multinode,
    launch_ranks,
)
from .allreduce_rank import ENV_INIT, MODULE, _one_size, _rank_main, _where, _write_error  # noqa: F401 - re-exported
from .nccl_tests import parse_nccl_tests, run_nccl_tests  # noqa: F401 - re-exported
from .timing import stats_us

COLUMNS = [
    "size", "count", "type", "redop", "root", "time_us", "algbw", "busbw", "wrong", "mode", "placement",
    "world_size", "backend", "source", "time_min_us", "time_p99_us", "iters", "model_size",
]

DTYPE_NAMES = {"bfloat16": 2, "float": 4, "half": 2}


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
        multi_why = ("one GPU/process only (world size 1, from microbench.allreduce.world_size or tp): a one-rank "
                     "all-reduce moves no byte between devices")
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
    def body(rank: int, job: dict[str, Any]) -> None:
        try:
            _rank_main(rank, job)
        except BaseException as exc:
            if job.get("init_method") == ENV_INIT:  # the launcher only sees an exit status: leave the reason
                _write_error(job, rank, exc)
            raise

    return rank_main(body, argv)


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
