"""Trace stage: real CPU torch.profiler fixtures, Kineto-format GPU test doubles, and one-line bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import kineto_trace_double as kd
from decode_gap.errors import DecodeGapError
from decode_gap.trace import categories as C
from decode_gap.trace.analyze import Options, analyze_path, stage_result
from decode_gap.trace.load import read_trace

FIX = Path(__file__).parent / "fixtures" / "trace"
ANNOTATED = FIX / "cpu_eager_decode_step.json.gz"
UNANNOTATED = FIX / "cpu_eager_unannotated.json.gz"
TP2 = FIX / "tp2"


# ------------------------------------------------------------------ real CPU traces (torch.profiler, this repo)
def test_real_cpu_trace_with_decode_step_annotations():
    res, table = analyze_path(ANNOTATED)
    assert res["method"] == "annotation 'decode_step'"
    assert res["steps_found"] == 6
    assert res["status"] == "partial" and "no GPU events" in res["reason"]
    for s in res["steps"]:
        assert s["busy_ms"] + s["idle_ms"] == pytest.approx(s["wall_ms"], abs=1e-3)
        assert 0 < s["busy_ms"] <= s["wall_ms"]
    # a transformers Llama step: linear layers are GEMMs, SDPA is attention, argmax is sampling
    assert {"GEMM fp32", "attention", "sampling"} <= set(res["categories"])
    names = {k["name"] for k in res["top_kernels"]}
    assert "aten::linear" in names and "aten::scaled_dot_product_attention" in names
    # 2 layers x 7 projections + lm_head
    linear = table[table["name"] == "aten::linear"]
    assert float(linear["per_step"].iloc[0]) == 15
    assert res["waterfall"]["basis"] == "trace (CPU ops)"


def test_real_cpu_trace_without_annotations_steps_from_the_period():
    ann, _ = analyze_path(ANNOTATED)
    res, _ = analyze_path(UNANNOTATED)
    assert res["method"].startswith("periodic")
    assert res["steps_used"] >= 3
    assert res["kernels_per_step_median"] == ann["kernels_per_step_median"]


def test_real_two_rank_gloo_traces():
    res, table = analyze_path(TP2)
    assert [r["rank"] for r in res["ranks"]] == [0, 1]
    assert res["slowest_rank"] in (0, 1)
    walls = [r["step_ms_median"] for r in res["ranks"]]
    assert res["rank_skew_ms"] == pytest.approx(max(walls) - min(walls), abs=1e-3)
    assert res["step_ms_median"] == max(walls)
    assert all(r["allreduce_ms_per_step"] > 0 for r in res["ranks"])  # 4 real all_reduce calls per step
    assert set(table["rank"]) == {0, 1}


# ------------------------------------------------------------------ GPU traces: Kineto-format test double
def test_gpu_eager_busy_is_kernel_union_and_idle_the_rest(tmp_path):
    path = kd.write(tmp_path / "eager.json", kd.build(steps=5))
    res, _ = analyze_path(path)
    assert res["status"] == "ok" and res["device"] == "gpu"
    assert res["steps_used"] == 5
    assert res["kernels_per_step_median"] == len(kd.STEP_KERNELS) + 1  # + the D2H memcpy
    assert res["gpu_busy_ms_median"] == pytest.approx(kd.expected_busy_us() / 1e3, abs=1e-4)
    assert res["gpu_idle_ms_median"] == pytest.approx(res["step_ms_median"] - res["gpu_busy_ms_median"], abs=1e-4)
    for name, cat, dur, _ in kd.STEP_KERNELS:
        assert res["categories"][cat] >= dur / 1e3 - 1e-6
    assert res["categories"][C.MEMCPY] == pytest.approx(0.0015)
    assert res["categories"]["GEMM bf16"] == pytest.approx(0.010)  # dtype from the launching op's Input type
    assert res["categories"]["GEMM fp8"] == pytest.approx(0.012)  # dtype from the kernel name
    assert res["timeline"]["kernels"] and res["timeline"]["kernels"][0]["start_us"] >= 0


def test_gpu_graph_replay_kernels_follow_their_graph_launch(tmp_path):
    # kernels run after the CPU annotation would have ended; they belong to the step by correlation id
    path = kd.write(tmp_path / "graph.json.gz", kd.build(steps=4, graph=True, lag_us=5, host_tail_us=0.0))
    res, _ = analyze_path(path)
    assert res["kernels_outside_steps"] == 0
    assert res["kernels_per_step_median"] == len(kd.STEP_KERNELS) + 1


def test_gpu_overlapping_streams_count_once(tmp_path):
    # the second kernel (another stream) starts 1 us before the first one (2 us long) ends
    path = kd.write(tmp_path / "ov.json", kd.build(steps=3, graph=True, overlap_us=6.0, gap_us=5.0))
    res, _ = analyze_path(path)
    busy = kd.expected_busy_us() - 1.0
    assert res["gpu_busy_ms_median"] == pytest.approx(busy / 1e3, abs=1e-4)
    assert res["kernel_ms_per_step"] == pytest.approx(kd.expected_busy_us() / 1e3, abs=1e-4)


def test_gpu_steps_from_vllm_annotations(tmp_path):
    path = kd.write(tmp_path / "vllm.json", kd.build(steps=4, annotation=None, vllm=True))
    res, _ = analyze_path(path)
    assert res["method"].startswith("vLLM") and res["engine"] == "vllm"
    assert res["steps_used"] == 4


def test_gpu_steps_from_sglang_run_batch(tmp_path):
    path = kd.write(tmp_path / "sgl-TP-0.trace.json.gz", kd.build(steps=4, annotation=None, sglang=True))
    res, _ = analyze_path(path)
    assert res["method"].startswith("SGLang") and res["engine"] == "sglang"
    assert res["ranks"][0]["rank"] == 0  # from SGLang's file name


def test_gpu_steps_from_periodic_kernels(tmp_path):
    path = kd.write(tmp_path / "bare.json", kd.build(steps=6, annotation=None))
    res, _ = analyze_path(path)
    assert res["method"] == f"periodic kernel sequence ({len(kd.STEP_KERNELS) + 1} kernels per step)"
    assert res["steps_used"] >= 4


def test_custom_step_annotation(tmp_path):
    path = kd.write(tmp_path / "t.json", kd.build(steps=3, annotation="my_step"))
    res, _ = analyze_path(path, opts=Options(step_annotation="my_step"))
    assert res["method"] == "annotation 'my_step'"


def test_ranks_from_distributed_info(tmp_path):
    d = tmp_path / "ranks"
    d.mkdir()
    kd.write(d / "a.json", kd.build(steps=3, rank=1, gap_us=20))
    kd.write(d / "b.json", kd.build(steps=3, rank=0))
    res, _ = analyze_path(d)
    assert {r["rank"] for r in res["ranks"]} == {0, 1}
    assert res["slowest_rank"] == 1


# ------------------------------------------------------------------ categories
@pytest.mark.parametrize("name,cat,types", [(n, c, t) for n, c, _, t in kd.STEP_KERNELS] + [
    ("fused_moe_kernel", C.MOE_GEMM, ""),
    ("void moe_align_block_size_kernel<int>", C.MOE_ROUTING, ""),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>", C.ALLREDUCE, ""),
    ("Memset (Device)", C.MEMCPY, ""),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024>", C.SAMPLING, ""),
    ("cutlass3x_sm100_bstensorop_s256x128x64gemm_block_scaled_ue4m3xe2m1_ue4m3xe2m1_f32_bf16", "GEMM fp4", ""),
    ("void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>", C.ELEMENTWISE, ""),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "GEMM dtype?", ""),
])
def test_classify(name, cat, types):
    assert C.classify(name, types) == cat


# ------------------------------------------------------------------ bad input: one line, stage unavailable
def _bad(tmp_path, name: str, raw: bytes) -> dict:
    p = tmp_path / name
    p.write_bytes(raw)
    res, table = stage_result(str(p))
    assert res["status"] == "skipped" and table.empty
    assert "\n" not in res["reason"] and str(p) in res["reason"]
    return res


def test_truncated_json(tmp_path):
    raw = json.dumps(kd.build(steps=2)).encode()
    assert "not valid JSON" in _bad(tmp_path, "t.json", raw[: len(raw) // 2])["reason"]


def test_truncated_gzip(tmp_path):
    raw = ANNOTATED.read_bytes()
    assert "gzip" in _bad(tmp_path, "t.json.gz", raw[: len(raw) // 2])["reason"]


def test_foreign_json(tmp_path):
    assert "not a Chrome trace" in _bad(tmp_path, "f.json", b'{"model": "llama", "layers": 2}')["reason"]


def test_no_recognisable_steps(tmp_path):
    ev = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": i * 10.0, "dur": 5.0,
           "args": {}} for i in range(40)]
    assert "no recognisable decode steps" in _bad(tmp_path, "n.json", json.dumps({"traceEvents": ev}).encode())[
        "reason"]


def test_no_ops_at_all(tmp_path):
    ev = [{"ph": "i", "name": "x", "pid": 1, "tid": 1, "ts": 1.0}]
    assert "neither GPU kernels nor CPU ops" in _bad(tmp_path, "e.json",
                                                     json.dumps({"traceEvents": ev}).encode())["reason"]


def test_missing_path_and_empty_dir(tmp_path):
    res, _ = stage_result(str(tmp_path / "nope.json"))
    assert res["status"] == "skipped" and "does not exist" in res["reason"]
    res, _ = stage_result(str(tmp_path))
    assert res["status"] == "skipped" and "holds no .json" in res["reason"]
    res, _ = stage_result("")
    assert res["status"] == "skipped" and "config key 'trace'" in res["reason"]


def test_read_trace_errors_are_decode_gap_errors(tmp_path):
    p = tmp_path / "x.json.gz"
    p.write_bytes(gzip.compress(b"[1, 2"))
    with pytest.raises(DecodeGapError):
        read_trace(p)
