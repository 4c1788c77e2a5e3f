"""The stage entry points the Snakemake scripts call, on this CPU host with a small config."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from decode_gap.microbench import stages

REPO = Path(__file__).resolve().parents[1]


def config(**mb):
    return {"model": "config/models/gemma-3-270m.json", "tp": 1, "ep": 1, "batch_size": 1, "context_len": 64,
            "microbench": {"warmup": 1, "iters": 3, "cpu_case_budget_s": 0.02, "cpu_m_values": [1],
                           "cpu_max_weight_elements": 3_000_000, "attention": {"context_lens": [64]}, **mb}}


def test_memory_then_gemm_attention_launch_moe(tmp_path):
    cfg = config()
    mem = tmp_path / "memory.json"
    m = stages.run_stage("memory", cfg, None, str(mem), repo=REPO, log=lambda s: None)
    data = json.loads(mem.read_text())
    assert data["copy_gbps"] > 0 and data["read_gbps"] > 0 and data["peak_tflops"]["fp32"] > 0
    assert data["figures"]["copy_gbps"]["status"] == "measured" and m["stage"] == "microbench.memory"

    for stage in ("gemm", "attention", "launch", "moe"):
        csv, js = tmp_path / f"{stage}.csv", tmp_path / f"{stage}.json"
        out = stages.run_stage(stage, cfg, str(csv), str(js), memory_json=str(mem), repo=REPO, log=lambda s: None)
        summary = json.loads(js.read_text())
        assert summary["stage"] == f"microbench.{stage}" and summary["device"].startswith("cpu")
        assert {"status", "backend", "skipped"} <= set(summary)
        assert out["status"] == summary["status"]
        assert csv.exists()

    g = pd.read_csv(tmp_path / "gemm.csv")
    assert not g.empty and g["frac_of_copy_bw"].notna().all()
    assert any("lm_head" in s["case"] for s in json.loads((tmp_path / "gemm.json").read_text())["skipped"])
    a = pd.read_csv(tmp_path / "attention.csv")
    assert set(a["name"]) == {"sdpa", "sdpa-sliding"} and set(a["context_len"]) == {64}
    launch = json.loads((tmp_path / "launch.json").read_text())
    k = launch["kernels"]["aten add_ (1 element)"]
    assert k["eager_launch_us"] > 0 and k["graph_node_us"] is None
    assert launch["figures"]["aten add_ (1 element)"]["graph_node_us"]["status"] == "unavailable"
    moe = json.loads((tmp_path / "moe.json").read_text())
    assert moe["status"] == "skipped" and "no MoE" in moe["skipped"][0]["reason"]


def test_disabled_stage_writes_skipped_files(tmp_path):
    cfg = {**config(), "stages": {"microbench": False}}
    stages.run_stage("gemm", cfg, str(tmp_path / "g.csv"), str(tmp_path / "g.json"), repo=REPO)
    assert json.loads((tmp_path / "g.json").read_text())["status"] == "skipped"
    assert list(pd.read_csv(tmp_path / "g.csv").columns)[:3] == ["name", "dtype", "backend"]


def test_attention_cases_time_the_same_work_through_the_triton_kernels_in_the_interpreter():
    """The attention stage's Triton rows (GQA split-KV, MLA split-KV dense and over DSA's selected rows, indexer
    scores and radix select) build and run the kernels of `kernels.attention` and `kernels.topk` and count the same bytes as the torch rows of the same case; on a GPU the stage times both
    (here the CPU interpreter only runs them)."""
    code = r"""
import torch
from decode_gap.microbench import attention as A
from decode_gap.microbench.common import BenchEnv
from decode_gap.microbench.shapes import AttentionShape
env = BenchEnv(device=torch.device("cpu"))
for args in ((1, 8, 2, 32, 40), (2, 4, 4, 16, 33)):
    (fn_t, bytes_t), (fn_s, bytes_s) = A.sdpa_case(env, *args, "triton"), A.sdpa_case(env, *args, None)
    assert bytes_t == bytes_s and fn_t().shape == fn_s().squeeze(2).shape
mla = AttentionShape(kind="mla", heads=4, kv_heads=1, head_dim=48, layers=2, kv_lora_rank=32, qk_nope_head_dim=16,
                     qk_rope_head_dim=16, v_head_dim=16, index_heads=2, index_head_dim=16, index_topk=8)
for case in (A.mla_case, A.indexer_case):
    (fn_t, bytes_t), (fn_s, bytes_s) = case(env, mla, 1, 40, True), case(env, mla, 1, 40, False)
    assert bytes_t == bytes_s and fn_t().shape == fn_s().shape, case.__name__
# DSA: the sparse MLA over 8 of 40 rows, read through indices (Triton) or gathered (torch); the indexer's selection
(fn_t, bytes_t), (fn_s, bytes_s) = A.mla_case(env, mla, 1, 8, True, context=40), A.mla_case(env, mla, 1, 8, context=40)
assert bytes_t == bytes_s and fn_t().shape == fn_s().shape == (1, 4, 16)
assert A.indexer_case(env, mla, 2, 40, True)[0]().shape == A.indexer_case(env, mla, 2, 40)[0]().shape == (2, 8)
print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_moe_rows_keep_the_faster_form_and_name_the_other_and_the_tensor_core_form_says_where_it_cannot_run():
    import torch

    from decode_gap.microbench import moe
    from decode_gap.microbench.common import BenchEnv
    from decode_gap.microbench.shapes import MoeShape

    a = {"backend": "cuda cores", "gpu_us": 96.1, "note": ""}
    b = {"backend": "tensor cores", "gpu_us": 84.7, "note": "graph"}
    best = moe._fastest_of(a, b)
    assert best["backend"] == "tensor cores" and best["note"] == "graph; fastest of: cuda cores 96.10 us"
    c = {"backend": "wider", "gpu_us": 80.0, "note": ""}
    assert moe._fastest_of(best, c)["note"] == "fastest of: tensor cores 84.70 us, cuda cores 96.10 us"
    assert moe._fastest_of(None, a) is a and moe._fastest_of(a, None) is a and moe._fastest_of(None, None) is None
    env = BenchEnv(device=torch.device("cpu"))
    shape = MoeShape(hidden=256, experts_total=8, experts_local=8, top_k=2, inter=64, scoring="softmax")
    es = moe.ExpertSet(env, shape, 1)
    skipped: list = []
    assert moe.grouped_fp8_mma_row(env, es, "fp8-block", lambda tc: {"gpu_us": 1.0}, skipped) is None
    assert "I=64" in skipped[0]["reason"] and "tensor-core" in skipped[0]["case"]  # I not whole 128-value blocks
