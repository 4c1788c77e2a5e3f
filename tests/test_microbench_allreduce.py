"""All-reduce over real torch.distributed (gloo, 2 processes on CPU), failure handling, nccl-tests parsing."""

import os
import subprocess

import pytest

from decode_gap.errors import DecodeGapError
from decode_gap.microbench import allreduce as ar
from decode_gap.microbench.common import DEFAULTS

SETTINGS = {**DEFAULTS["allreduce"], "min_bytes": 8, "max_bytes": 4096, "timeout_s": 120}


def test_busbw_formula_and_sweep():
    assert ar.busbw_factor(1) == 0.0
    assert ar.busbw_factor(2) == 1.0
    assert ar.busbw_factor(8) == pytest.approx(1.75)
    assert ar.algbw_gbps(1_000_000, 100.0) == pytest.approx(10.0)  # 1 MB in 100 us = 10 GB/s
    assert ar.size_sweep(8, 64, 2) == [8, 16, 32, 64]
    assert ar.size_sweep(1, 8, 4) == [4, 8]


def test_gloo_two_ranks_sum_and_nccl_columns():
    model_bytes = 640 * 2  # Gemma-3-270M hidden x batch 1 x bf16
    df, js = ar.run_allreduce_bench(2, model_bytes, SETTINGS, warmup=1, iters=5, device_name="cpu", gpu_count=0,
                                    log=lambda s: None)
    for col in ("size", "count", "type", "redop", "root", "time_us", "algbw", "busbw", "mode", "world_size", "backend",
                "time_min_us", "time_p99_us"):
        assert col in df.columns
    assert set(df["backend"]) == {"gloo"} and set(df["world_size"]) == {2} and set(df["mode"]) == {"eager"}
    assert (df["wrong"] == 0).all()  # every element summed to 1 + 2 on both ranks
    assert model_bytes in set(df["size"]) and df["model_size"].sum() == 1
    for _, r in df.iterrows():
        assert r["count"] * 2 == r["size"]
        assert r["algbw"] == pytest.approx(r["size"] / r["time_us"] / 1e3)
        assert r["busbw"] == pytest.approx(r["algbw"] * 2 * (2 - 1) / 2)
        assert r["time_min_us"] <= r["time_us"] <= r["time_p99_us"]
    assert js["stage"] == "microbench.allreduce" and js["measured_world_size"] == 2
    fig = js["figures"]["allreduce_us_at_model_size"]
    assert fig["status"] == "measured" and fig["value"] == js["allreduce_us_at_model_size"] > 0
    assert any(s["case"] == "graph mode" for s in js["skipped"])


def test_world_size_one_is_the_floor_and_says_multi_gpu_is_unavailable():
    df, js = ar.run_allreduce_bench(1, 16, {**SETTINGS, "max_bytes": 64}, 1, 3, "cpu", 0, log=lambda s: None)
    assert js["measured_world_size"] == 1 and (df["busbw"] == 0).all()
    assert js["figures"]["allreduce_us_at_model_size"]["status"] == "measured"
    multi = js["figures"]["allreduce_us_at_model_size_multi_gpu"]
    assert multi["status"] == "unavailable" and "one GPU/process only" in multi["why"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_failing_rank_stops_the_others_and_is_named(monkeypatch):
    started = []
    real_popen = subprocess.Popen

    def spy(*a, **k):
        p = real_popen(*a, **k)
        started.append(p)
        return p

    monkeypatch.setattr(subprocess, "Popen", spy)
    with pytest.raises(DecodeGapError, match=r"rank 1 of 2 failed .*injected failure on rank 1"):
        ar.run_allreduce_bench(2, 16, SETTINGS, 1, 2, "cpu", 0, log=lambda s: None, fail_rank=1)
    assert len(started) == 2 and all(p.poll() is not None for p in started)
    assert not any(_alive(p.pid) for p in started)


def test_a_hung_rank_hits_the_deadline_and_every_rank_is_stopped(monkeypatch):
    started = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(real_popen(*a, **k)) or started[-1])
    with pytest.raises(DecodeGapError, match=r"did not finish within 25 s"):
        ar.run_allreduce_bench(2, 16, {**SETTINGS, "timeout_s": 25}, 1, 2, "cpu", 0, log=lambda s: None, hang_rank=1)
    assert all(p.poll() is not None for p in started)


NCCL_TESTS_OUTPUT = """\
# nThread 1 nGpus 2 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             4  bfloat16     sum      -1    10.21    0.00    0.00      0     9.87    0.00    0.00      0
        1024           512  bfloat16     sum      -1    11.50    0.09    0.09      0    11.02    0.09    0.09      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.045
"""


def test_parse_nccl_tests_output():
    """The text is a test double: a sample in nccl-tests' documented all_reduce_perf format (no GPU here)."""
    rows = ar.parse_nccl_tests(NCCL_TESTS_OUTPUT, world=2)
    assert len(rows) == 4
    first = rows[0]
    assert (first["size"], first["count"], first["type"], first["redop"], first["root"]) == (8, 4, "bfloat16", "sum", -1)
    assert first["time_us"] == 10.21 and first["placement"] == "out-of-place" and first["source"] == "nccl-tests"
    assert rows[3]["placement"] == "in-place" and rows[3]["time_us"] == 11.02 and rows[3]["wrong"] == 0
