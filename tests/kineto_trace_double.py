"""Test double: synthetic torch.profiler (Kineto) Chrome traces of GPU decode steps.

No GPU here, so the GPU-side logic (kernels on a device pid, cudaLaunchKernel / cudaGraphLaunch runtime events
linked by `args.correlation`, kernels finishing after the CPU annotation, overlapping streams) is tested on traces
built in Kineto's own event format. Real GPU traces come from benchmarks/device/capture_traces.py on an H200.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

# (name, category-the-analyser-should-give, duration us, cpu op input types)
STEP_KERNELS = [
    ("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>",
     "norm/activation/elementwise", 2.0, ""),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "GEMM bf16", 10.0, "c10::BFloat16 c10::BFloat16"),
    ("flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t>>",
     "attention", 8.0, ""),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all-reduce / NCCL", 6.0, ""),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm/activation/elementwise", 3.0, ""),
    ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_segment_k_off",
     "GEMM fp8", 12.0, ""),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
     "unsigned int, long, 4>>(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>)",
     "sampling", 4.0, ""),
]


def build(steps: int = 5, *, graph: bool = False, annotation: str | None = "decode_step", gap_us: float = 5.0,
          launch_us: float = 4.0, host_tail_us: float = 30.0, lag_us: float = 20.0, overlap_us: float = 0.0,
          memcpy: bool = True, pid: int = 4242, names: list[tuple] | None = None,
          vllm: bool = False, sglang: bool = False, rank: int | None = None, python_stack: int = 0
          ) -> dict[str, Any]:
    """A trace of `steps` decode steps. Per step: the CPU launches every kernel (or one cudaGraphLaunch), the GPU runs
    them back to back with `gap_us` idle between kernels (the second kernel overlaps the first by `overlap_us` on
    another stream), then a D2H memcpy of the token; the CPU waits for it and spends `host_tail_us` after.
    `python_stack`: that many nested python_function events around each launch (with_stack=True traces)."""
    names = names or STEP_KERNELS
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
    ]
    t = 1_000_000.0
    corr = 100
    ext = 5000
    for s in range(steps):
        step_start = t
        cpu = t + 3.0
        gpu = t + lag_us
        if graph:
            corr += 1
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": pid, "tid": pid,
                       "ts": cpu, "dur": launch_us, "args": {"correlation": corr, "External id": ext}})
            cpu += launch_us
        for i, (name, _cat, dur, types) in enumerate(names):
            if not graph:
                corr += 1
                ext += 1
                ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm" if "gemm" in name or "nvjet" in name
                           else "aten::op", "pid": pid, "tid": pid, "ts": cpu, "dur": launch_us + 1,
                           "args": {"External id": ext, **({"Input type": types.split()} if types else {})}})
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": pid,
                           "ts": cpu + 0.5, "dur": launch_us, "args": {"correlation": corr, "External id": ext}})
                for depth in range(python_stack):
                    ev.append({"ph": "X", "cat": "python_function", "pid": pid, "tid": pid,
                               "name": f"torch/nn/modules/module.py({1700 + depth}): _call_impl",
                               "ts": cpu - 0.1 * (depth + 1), "dur": launch_us + 1 + 0.2 * (depth + 1),
                               "args": {"Python id": corr * 10 + depth, "Python parent id": corr * 10 + depth - 1}})
                cpu += launch_us + 1
            start = max(gpu, cpu + 1.0) if not graph else gpu
            stream = 7 if i != 1 else 13
            if i == 1 and overlap_us:
                start -= overlap_us
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start, "dur": dur,
                       "args": {"correlation": corr, "External id": ext, "device": 0, "stream": stream}})
            gpu = start + dur + gap_us
        if memcpy:
            corr += 1
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": pid, "tid": pid,
                       "ts": cpu, "dur": 2.0, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0,
                       "tid": 7, "ts": gpu, "dur": 1.5, "args": {"correlation": corr, "device": 0}})
            gpu += 1.5
        end = max(cpu, gpu) + host_tail_us
        if annotation:
            ev.append({"ph": "X", "cat": "user_annotation", "name": annotation, "pid": pid, "tid": pid,
                       "ts": step_start, "dur": end - step_start, "args": {"External id": ext}})
        if vllm:
            third = (end - step_start) / 3
            for j, ph in enumerate(("preprocess", "forward", "sample")):
                ev.append({"ph": "X", "cat": "user_annotation", "name": f"gpu_model_runner: {ph}", "pid": pid,
                           "tid": pid, "ts": step_start + j * third, "dur": third * 0.99, "args": {}})
        if sglang:
            ev.append({"ph": "X", "cat": "python_function", "name":
                       "sglang/srt/managers/scheduler.py(1712): run_batch", "pid": pid, "tid": pid,
                       "ts": step_start, "dur": end - step_start, "args": {}})
        t = end + 50.0  # the loop's own time between steps
    data: dict[str, Any] = {"schemaVersion": 1, "traceEvents": ev, "displayTimeUnit": "ms"}
    if rank is not None:
        data["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    return data


def write(path: str | Path, data: dict[str, Any]) -> Path:
    path = Path(path)
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    return path


def expected_busy_us(names: list[tuple] | None = None, memcpy: bool = True, overlap_us: float = 0.0) -> float:
    names = names or STEP_KERNELS
    return sum(d for _, _, d, _ in names) + (1.5 if memcpy else 0.0) - overlap_us
