"""All-reduce, one rank's process: join the group (file store, or env:// under torchrun), time every size eager
and as a CUDA graph, write rank<r>.json (or rank<r>.error.json). See allreduce.py."""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..errors import REASON_CHARS, describe
from ..timing import back_to_back_us, capture_graph, warm_on_side_stream

MODULE = "decode_gap.microbench.allreduce"  # `python -m` runs one rank (allreduce._main)
ENV_INIT = "env://"  # job.json's init_method under torchrun


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
        out["eager_us"] = back_to_back_us(lambda: dist.all_reduce(buf), iters, device)
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
            out["graph_us"] = [t / reps for t in back_to_back_us(graph.replay, max(iters // 2, 3), device)]
            del graph
        except Exception as exc:  # recorded as a skipped case by the parent
            out["graph_error"] = describe(exc, REASON_CHARS)
    return out




def _write_error(job: dict[str, Any], rank: int, exc: BaseException) -> None:
    err = {**_where(rank, int(os.environ.get("LOCAL_RANK", rank)), job.get("backend", "")),
           "error": describe(exc, 300)}
    try:
        Path(job["out_dir"], f"rank{rank}.error.json").write_text(json.dumps(err))
    except OSError:
        pass
