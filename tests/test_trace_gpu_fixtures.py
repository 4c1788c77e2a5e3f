"""Real H200 torch.profiler traces (benchmarks/device/capture_traces.py, torch 2.11, random 1B Llama in
transformers): eager decode, CUDA-graph replay, and two NCCL ranks of a TP=2 step. The analysis must read them
as a user's trace: steps by the `decode_step` annotation, busy + idle = the step, categories, rank skew."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from decode_gap.trace.analyze import stage_result

GPU = Path(__file__).resolve().parent / "fixtures" / "trace" / "gpu"


@pytest.mark.parametrize("name", ["h200_llama1b_eager.json.gz", "h200_llama1b_graph.json.gz"])
def test_single_gpu_traces(name):
    r, kernels = stage_result(str(GPU / name), "file")
    assert r["status"] == "ok" and r["device"] == "gpu"
    assert r["method"] == "annotation 'decode_step'" and r["steps_used"] == 8
    assert math.isclose(r["gpu_busy_ms_median"] + r["gpu_idle_ms_median"], r["step_ms_median"], rel_tol=0.01)
    assert r["kernels_per_step_median"] > 500
    gemm = sum(v for k, v in r["categories"].items() if k.startswith("GEMM"))
    assert gemm > 0.5  # ms per step: the 1B model's bf16 weights, read once per token
    assert len(kernels) > 0


def test_eager_is_idle_and_graph_is_busy():
    eager, _ = stage_result(str(GPU / "h200_llama1b_eager.json.gz"), "file")
    graph, _ = stage_result(str(GPU / "h200_llama1b_graph.json.gz"), "file")
    # eager transformers leaves the GPU idle most of the step; graph replay keeps it busy
    assert eager["gpu_idle_ms_median"] / eager["step_ms_median"] > 0.9
    assert graph["gpu_busy_ms_median"] / graph["step_ms_median"] > 0.7


def test_two_nccl_ranks():
    r, _ = stage_result(str(GPU / "tp2"), "file")
    assert r["status"] == "ok" and len(r["ranks"]) == 2
    assert r["categories"].get("all-reduce / NCCL", 0) > 0
    assert r["rank_skew_ms"] is not None and r["rank_skew_ms"] >= 0


def test_capture_summary_matches_the_fixtures():
    # The device's own analysis (printed beside the unprofiled step) agrees with this host's.
    summary = json.loads((GPU / "capture_summary.json").read_text())
    graph = summary["captures"]["graph"]["analysis"]
    r, _ = stage_result(str(GPU / "h200_llama1b_graph.json.gz"), "file")
    assert math.isclose(r["step_ms_median"], graph["step_ms"], rel_tol=1e-3)


def test_engine_level_trace_names_the_dtype_of_gemms_whose_kernels_do_not(tmp_path):
    """cuBLAS' nvjet GEMMs carry no dtype in their names and graph-replayed kernels have no CPU op: a user's trace
    leaves them 'GEMM dtype?', while an engine-level trace knows its model's one dtype from its own metadata."""
    import gzip

    plain, _ = stage_result(str(GPU / "h200_llama1b_graph.json.gz"), "file")
    assert plain["categories"].get("GEMM dtype?", 0) > 0.5
    data = json.loads(gzip.decompress((GPU / "h200_llama1b_graph.json.gz").read_bytes()))
    data["decode_gap_engine"] = {"mode": "graph", "dtype": "bfloat16"}
    marked = tmp_path / "engine_trace.json.gz"
    marked.write_bytes(gzip.compress(json.dumps(data).encode()))
    r, _ = stage_result(str(marked), "engine-level")
    assert "GEMM dtype?" not in r["categories"]
    gemm = lambda cats: sum(v for k, v in cats.items() if k.startswith("GEMM"))  # noqa: E731
    assert math.isclose(gemm(r["categories"]), gemm(plain["categories"]), rel_tol=1e-6)
    assert r["categories"]["GEMM bf16"] >= plain["categories"].get("GEMM bf16", 0) + plain["categories"]["GEMM dtype?"] - 1e-6
