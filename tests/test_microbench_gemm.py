"""GEMM harness arithmetic and the CPU paths (fp32/bf16 torch.mm, the NVFP4 reference), timing stats."""

import math

import pytest
import torch

from decode_gap.microbench import gemm, timing
from decode_gap.kernels import nvfp4 as nv
from decode_gap.microbench.common import BenchEnv
from decode_gap.microbench.shapes import GemmShape


def test_rate_formulas():
    assert timing.gbps(4e9, 1e6) == pytest.approx(4.0)  # 4 GB in 1 s
    assert timing.gbps(2_000, 1.0) == pytest.approx(2.0)  # 2 kB in 1 us = 2 GB/s
    assert timing.tflops(2e12, 1e6) == pytest.approx(2.0)
    assert timing.fraction(3000.0, 4000.0) == pytest.approx(0.75)
    assert timing.gbps(1, 0) is None and timing.fraction(1.0, None) is None


def test_bytes_and_flops_per_dtype():
    m, n, k = 4, 256, 6144
    assert gemm.flops(m, n, k) == 2 * m * n * k
    assert gemm.bytes_moved("bf16", m, n, k) == 2 * (n * k + m * k + m * n)
    assert gemm.bytes_moved("fp32", m, n, k) == 4 * (n * k + m * k + m * n)
    assert gemm.bytes_moved("fp8", m, n, k) == n * k + 4 + m * k + 4 + 2 * m * n
    wo = gemm.bytes_moved("nvfp4", m, n, k, "nvfp4-weight-only")
    assert wo == n * k // 2 + n * k // 16 + 4 + 2 * m * k + 2 * m * n
    w4a4 = gemm.bytes_moved("nvfp4", m, n, k, nv.ScaledMmNvfp4.label)
    assert w4a4 == nv.nvfp4_bytes(n, k) + nv.nvfp4_bytes(m, k) + 2 * m * n


def test_stats_are_numpy_percentiles():
    st = timing.stats_us(list(range(1, 101)))
    assert (st.min_us, st.median_us, st.n) == (1.0, 50.5, 100)
    assert st.p99_us == pytest.approx(99.01)


def test_rotating_copies_is_one_on_cpu():
    assert timing.rotating_copies(1000, "cpu") == 1


def test_cpu_gemm_bench_rows_and_summary():
    env = BenchEnv(device=torch.device("cpu"), warmup=1, iters=3, cpu_budget_s=0.02, copy_gbps=10.0,
                   cpu_max_weight_elements=100_000)
    shapes = [GemmShape("attn.o_proj", "attention", 64, 128), GemmShape("mlp.down_proj", "mlp", 64, 128),
              GemmShape("moe.router", "router", 32, 64, quantizable=False), GemmShape("lm_head", "lm_head", 1000, 1000)]
    df, js = gemm.run_gemm_bench(env, shapes, [1, 4], log=lambda s: None)
    assert list(df.columns[:11]) == ["name", "dtype", "backend", "M", "N", "K", "gpu_us", "eager_us", "gbps", "tflops",
                                     "frac_of_copy_bw"]
    assert set(df["dtype"]) == {"fp32", "bf16", "nvfp4"}
    assert df["gpu_us"].isna().all() and (df["timing"] == timing.CPU_WALL).all()
    for _, r in df.iterrows():
        nb = gemm.bytes_moved(r["dtype"], r["M"], r["N"], r["K"], r["backend"])
        assert r["bytes"] == nb
        assert r["gbps"] == pytest.approx(nb / r["eager_us"] / 1e3)
        assert r["tflops"] == pytest.approx(2 * r["M"] * r["N"] * r["K"] / r["eager_us"] / 1e6)
        assert r["frac_of_copy_bw"] == pytest.approx(r["gbps"] / 10.0)
    # o_proj and down_proj share a shape: measured once, reported under both names
    a = df[(df["name"] == "attn.o_proj")].set_index(["dtype", "M"])["eager_us"]
    b = df[(df["name"] == "mlp.down_proj")].set_index(["dtype", "M"])["eager_us"]
    assert a.equals(b)
    assert "moe.router" not in set(df[df["dtype"] == "nvfp4"]["name"]) and "moe.router" in js["not_quantised"]
    assert any("lm_head" in s["case"] and "cpu_max_weight_elements" in s["reason"] for s in js["skipped"])
    assert any(s["case"] == "fp8" for s in js["skipped"])
    assert js["status"] == "partial" and js["dtypes"]["bf16"]["backend"] == "torch.mm"
    assert set(js["dtypes"]["fp32"]["by_m"]) == {"1", "4"}
    m1 = js["dtypes"]["fp32"]["by_m"]["1"]
    assert 0 < m1["frac_of_copy_bw_median"] and math.isfinite(m1["gbps_aggregate"])
    # every row beside a measured plain read of its own bytes (torch.sum's wall time on a CPU host), one a size
    assert (df["plain_read_us"] > 0).all() and js["plain_read_method"].startswith("torch.sum")
    assert (df["frac_of_plain_read"] == df["plain_read_us"] / df["eager_us"]).all()
    assert 0 < m1["frac_of_plain_read_median"]


def test_plain_read_times_the_bytes_it_is_given():
    """The yardstick a kernel's time reads against: a measured read of the same bytes (wall time on a CPU host)."""
    from decode_gap.microbench.launch import plain_read

    env = BenchEnv(device=torch.device("cpu"), warmup=1, iters=5, cpu_budget_s=0.05)
    small, large = plain_read(env, 4096), plain_read(env, 64 * 2**20)
    assert 0 < small.min_us <= small.median_us and large.n >= 3
    assert large.median_us > small.median_us  # 64 MiB is not read in the time of 4 KiB


def test_cpu_reference_check_passes():
    env = BenchEnv(device=torch.device("cpu"))
    for be in gemm.choose_backends(env)[0]:
        c = gemm.check_case(env, be, 3, 32, 64)
        assert c["pass"], c


@pytest.mark.skipif(not gemm.lp.HAVE_TRITON, reason="the Triton GEMV candidates need Triton")
def test_every_gemv_candidate_name_resolves_to_its_form():
    """Each candidate the stage offers on a GPU (lowprec_variants) builds from its name (variant_config): a form in
    a candidate list that the lookup does not hold was left out of every timing, as a skip, until 2026-12-01."""
    from types import SimpleNamespace

    gpu = SimpleNamespace(is_gpu=True)
    cases = [(gemm.Backend(gemm.NVFP4, nv.WeightOnlyGemm.label), m) for m in (1, 2, 8, 16)]
    cases += [(gemm.Backend(gemm.FP8, "torch._scaled_mm"), 1)]
    seen = 0
    for be, m in cases:
        for variant in gemm.lowprec_variants(gpu, be, m, 4096):
            prefix = variant.rsplit(" ", 1)[0]
            assert f"{prefix} {gemm.variant_config(variant).name}" == variant
            seen += 1
    stage = gemm.lp.FP4_STAGE_CONFIGS + gemm.lp.FP4_STAGE_CONFIGS_M
    assert seen >= len(gemm.lp.FP4_STAGE_CONFIGS) + 3 * len(gemm.lp.FP4_STAGE_CONFIGS_M) + 6
    # the M = 9-16 forms are offered, as the plan runs them above M=1 (the K split's sums cast by a kernel behind)
    cast = gemm.lp.with_cast
    assert cast(gemm.lp.FP4_MMA_XS) in stage and cast(gemm.lp.FP4_MMA_XJ) in stage
    assert cast(gemm.lp.FP4_MMA_TP) in stage  # and tile pairs (the lm_heads' plan at M = 9-16)
    # at M=1 both: the last split casting (what the plan runs there) and the cast kernel
    assert gemm.lp.FP4_MMA_DEFAULT in stage and cast(gemm.lp.FP4_MMA_DEFAULT) in stage
    fp8 = gemm.lowprec_variants(gpu, gemm.Backend(gemm.FP8, "torch._scaled_mm"), 1, 4096)
    assert all(f"{gemm.FP8_BLOCK_GEMV} {c.name}" in fp8 for c in gemm.lp.DENSE_BLOCK_XSCALE)  # block scales on x
    with pytest.raises(gemm.DecodeGapError, match="no GEMV form is named"):
        gemm.variant_config(f"{gemm.FP4_GEMV} m,BN=1")


def test_a_gemv_form_that_does_not_fit_k_is_no_candidate():
    """GLM-5's 6144x256 expert down: the 512-value K-sliced forms do not fit K=256, and were listed among the cases
    the host could not run (the H200 report, 2026-12-03) though another form ran the shape."""
    from types import SimpleNamespace

    gpu = SimpleNamespace(is_gpu=True)
    be = gemm.Backend(gemm.NVFP4, nv.WeightOnlyGemm.label)
    for m in (1, 8):
        offered = [gemm.variant_config(v) for v in gemm.lowprec_variants(gpu, be, m, 256)]
        assert offered and all(not c.mma or 256 % c.k_multiple == 0 for c in offered)
        assert len(offered) < len(gemm.lowprec_variants(gpu, be, m, 4096))


def test_cpu_moe_expert_rows_carry_a_plain_read_of_their_bytes():
    """The MoE stage's expert rows beside a plain read of their bytes (as the gemm stage's); routing pieces are not
    bandwidth kernels and get none."""
    from decode_gap.microbench.moe import run_moe_bench
    from decode_gap.microbench.shapes import MoeShape

    env = BenchEnv(device=torch.device("cpu"), warmup=1, iters=3, cpu_budget_s=0.02, copy_gbps=10.0)
    shape = MoeShape(hidden=64, experts_total=8, experts_local=8, top_k=2, inter=32, scoring="softmax")
    df, js = run_moe_bench(env, shape, [1, 2], log=lambda s: None)
    experts, routing = df[df["impl"] != "routing"], df[df["impl"] == "routing"]
    # the fused MoE (fp8 above batch 1, NVFP4 at every batch) needs sm89+: said, never faked
    assert {s["case"] for s in js["skipped"] if "sm89+" in s["reason"]} >= {"fused_moe M=1", "fused_moe M=2"}
    assert not experts.empty and (experts["plain_read_us"] > 0).all() and experts["frac_of_plain_read"].notna().all()
    assert routing["plain_read_us"].isna().all() and js["plain_read_method"].startswith("torch.sum")
    # no CUDA graphs here, so no per-kernel floor: the column is empty, the summary says why
    assert experts["latency_floor_us"].isna().all() and js["latency_floor"]["one_row_gemv_us"]["value"] is None


def test_an_expert_rows_floor_is_its_kernels_times_the_one_row_gemv_floor():
    from decode_gap.microbench.moe import expert_floor_us

    assert expert_floor_us(5, 2.46) == 5 * 2.46  # the NVFP4 fused MoE's five kernels
    assert expert_floor_us(None, 2.46) is None and expert_floor_us(5, None) is None
    assert expert_floor_us(float("nan"), 2.46) is None


def test_a_plain_read_that_cannot_be_timed_says_why_and_leaves_the_row(monkeypatch):
    """Out of memory or a failed capture: the row's plain-read columns stay empty and the stage's skipped list
    names the size and the reason (never a made-up figure)."""
    from decode_gap.microbench import launch

    def refuse(env, nbytes, flush=None):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(launch, "plain_read", refuse)
    reads = launch.PlainReads(BenchEnv(device=torch.device("cpu")))
    assert reads.columns(4096, 10.0) == {"plain_read_us": None, "frac_of_plain_read": None}
    reads.columns(4096, 12.0)  # one attempt a size
    assert len(reads.skipped) == 1 and reads.skipped[0]["case"] == "plain read of 4096 bytes"
    assert "out of memory" in reads.skipped[0]["reason"]


def test_step_totals_weigh_each_named_gemm_by_its_layers_and_leave_the_routed_experts_out():
    import pandas as pd

    rows = pd.DataFrame({"group": ["attention", "mlp", "routed_expert", "lm_head"], "layers": [78, 3, 75, 1],
                         "per_layer": [1, 1, 256, 1], "gpu_us": [10.0, 20.0, 5.0, 100.0],
                         "plain_read_us": [8.0, 18.0, 4.0, 90.0], "bytes": [4e7, 8e7, 1e7, 4e8]})
    t = gemm.step_totals(rows, "gpu_us", 4000.0)
    assert t["step_gemm_us"] == 78 * 10 + 3 * 20 + 100 and t["step_plain_read_us"] == 78 * 8 + 3 * 18 + 90
    assert t["step_at_copy_bw_us"] == pytest.approx((78 * 4e7 + 3 * 8e7 + 4e8) / 4000.0 / 1e3)
    assert t["step_gemm_rows"] == 3 and t["step_groups"] == ["attention", "lm_head", "mlp"]
    # one row without a plain read: no partial total
    assert gemm.step_totals(rows.assign(plain_read_us=[8.0, None, 4.0, 90.0]), "gpu_us", 4000.0)[
        "step_plain_read_us"] is None


def test_moe_stage_keeps_the_fastest_grouped_form_and_names_one_that_failed():
    """The MoE stage times each of a grouped GEMV's forms (lowprec.grouped_alternatives: the default bf16 pair, then
    its down at 4 steps an iteration) and keeps the fastest row; a form that fails is named as itself in the stage's
    skipped list, and the row another form gave stays. (The timing itself needs a GPU: a stand-in timer here.)"""
    from decode_gap.kernels import lowprec as lp
    from decode_gap.microbench.moe import fastest_form

    torch.manual_seed(0)
    e, h, i = 3, 128, 256
    w13 = (torch.randn(e, 2 * i, h) * 0.1).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i) * 0.1).to(torch.bfloat16)
    g = lp.grouped_from_bf16("nvfp4", w13, w2, torch.tensor([0, 2]), torch.rand(2), "cpu")
    assert len(lp.grouped_alternatives(g)) == 2

    def timer(us_by_down):
        def time_form(failed):
            us = us_by_down[g.cfg2.block_k]
            if us is None:
                failed.append({"case": "moe.experts grouped_gemv M=1", "reason": "RuntimeError: no"})
                return None
            return {"backend": g.label, "gpu_us": us}
        return time_form

    skipped: list = []
    best = fastest_form(g, timer({128: 53.2, 256: 51.6}), skipped)
    assert best["gpu_us"] == 51.6 and "down m,BN=64,BK=256" in best["backend"] and best["kernels"] == g.kernels
    assert best["note"].startswith("fastest of: ") and best["note"].endswith("BK=128,w=4,ef,bx) 53.20 us")
    assert not skipped
    best = fastest_form(g, timer({128: 59.7, 256: 62.9}), skipped)
    assert best["gpu_us"] == 59.7 and "BK=128,w=4,ef,bx)" in best["backend"]
    best = fastest_form(g, timer({128: 59.7, 256: None}), skipped)
    assert best["gpu_us"] == 59.7 and len(skipped) == 1 and "BK=256" in skipped[0]["case"]
    assert g.cfg2 == lp.FP4_GROUPED_BX_2  # left in the form that won
    assert fastest_form(g, timer({128: None, 256: None}), []) is None


def test_block_scaled_mm_is_a_candidate_only_above_batch_1_on_a_gpu_that_has_it(monkeypatch):
    """fp8's candidates above M=1 include cuBLAS's blockwise-scaled call where it runs and takes the shape; on a CPU,
    at M=1 (our GEMVs' place) or for a shape it refuses (K not whole groups of 512), none. Our tensor-core GEMV
    (kernels/fp8mma) is a candidate at M = 1-16, per-tensor and block-scaled, where K is whole 128-value blocks."""
    from decode_gap.microbench import gemm

    gpu = BenchEnv(device=torch.device("cpu"), warmup=1, iters=1, cpu_budget_s=0.01)
    fp8 = gemm.Backend(gemm.FP8, "torch._scaled_mm(e4m3, per-tensor scales)")
    assert gemm.block_mm_variants(gpu, fp8, 8, 2048, 7168) == []  # a CPU host
    assert gemm.fp8_mma_variants(gpu, fp8, 8, 7168) == []
    monkeypatch.setattr(BenchEnv, "is_gpu", property(lambda self: True))
    monkeypatch.setattr(gemm.fp8block, "supported", lambda device: True)
    assert gemm.block_mm_variants(gpu, fp8, 8, 2048, 7168) == [gemm.fp8block.LABEL]
    assert gemm.block_mm_variants(gpu, fp8, 1, 2048, 7168) == []
    assert gemm.block_mm_variants(gpu, fp8, 8, 2048, 640) == []
    mma = [gemm.FP8_MMA_GEMV_TENSOR, gemm.FP8_MMA_GEMV] if gemm.lp.HAVE_TRITON else []
    assert gemm.fp8_mma_variants(gpu, fp8, 1, 640) == mma and gemm.fp8_mma_variants(gpu, fp8, 16, 7168) == mma
    assert gemm.fp8_mma_variants(gpu, fp8, 17, 7168) == [] and gemm.fp8_mma_variants(gpu, fp8, 8, 576) == []
    assert gemm.fp8_mma_variants(gpu, gemm.Backend(gemm.BF16, "torch.mm"), 8, 7168) == []
    assert gemm.block_mm_variants(gpu, gemm.Backend(gemm.BF16, "torch.mm"), 8, 2048, 7168) == []


def test_the_summary_backend_says_when_rows_kept_another_candidate_than_the_library_kernel():
    import pandas as pd

    df = pd.DataFrame({"dtype": ["bf16", "bf16", "fp8"], "backend": ["torch.mm", "triton gemv (BLOCK_N=8)", "x"]})
    assert gemm._backend_said(gemm.Backend("bf16", "torch.mm"), df) == (
        "bf16: the fastest per shape of torch.mm and the other candidates (each row's backend)")
    assert gemm._backend_said(gemm.Backend("fp32", "torch.mm"), df) == "fp32: torch.mm"
