"""The report's reading of a kernel's bandwidth figure (issue 14): ceiling, latency-bound small kernel, or ours slow."""

from decode_gap.report.sections import kernel_reading


def test_below_half_the_bandwidth_is_our_kernel_not_the_ceiling():
    assert kernel_reading(0.97) == "ceiling (97% of bandwidth)"
    assert kernel_reading(0.5) == "ceiling (50% of bandwidth)"
    assert kernel_reading(0.36) == "our kernel is slow here (36% of bandwidth)"
    assert kernel_reading(None) == "—"


def test_a_small_kernel_under_the_latency_floor_is_latency_bound():
    # 8.3 MB at 4250 GB/s is 1.95 us, under a 2.5 us per-kernel floor: the shape cannot reach half the bandwidth
    assert kernel_reading(0.24, 7.9, 2.47, 8_300_000, 4250.0).startswith("small kernel, latency bound (floor 2.47 µs")
    # 235 MB takes 55 us at full bandwidth: far above the floor, so a low fraction is our kernel; the floor would
    # still allow 96% (55.3 / (55.3 + 2.47))
    assert kernel_reading(0.4, 140.0, 2.47, 235_000_000, 4250.0) == (
        "our kernel is slow here (40% of bandwidth; at most 96% with the 2.47 µs floor, modelled)")
    # a mid-sized call (an NVFP4 6144x4096, 14.2 MB: 3.3 us at full bandwidth): ours still, but capped at 57%
    assert kernel_reading(0.35, 9.5, 2.47, 14_200_000, 4250.0) == (
        "our kernel is slow here (35% of bandwidth; at most 57% with the 2.47 µs floor, modelled)")
    # no floor measured (CPU host, older gemm.csv): the 50% rule alone
    assert kernel_reading(0.24, 7.9, None, 8_300_000, 4250.0) == "our kernel is slow here (24% of bandwidth)"


def test_a_measured_plain_read_of_the_same_bytes_decides_the_reading():
    """With a plain read of the row's bytes measured (gemm.csv plain_read_us), the reading compares the kernel with
    what its size allows (the read, or the one-row GEMV floor where that is slower) and says what the read reaches
    on the same yardstick; the modelled floor is not used."""
    # a 2 MB call (an NVFP4 576x6144) as fast as a plain read of its bytes allows (2.9 us against 2.6): latency bound
    assert kernel_reading(0.15, 2.9, 2.47, 2_000_000, 4250.0, 2.6) == (
        "small kernel, latency bound (a plain read of its bytes: 17%)")
    # the same call at 4.19 us takes 1.6 times the read: the kernel's, though even the read stays under half
    assert kernel_reading(0.11, 4.19, 2.47, 2_000_000, 4250.0, 2.6) == (
        "our kernel is slow here (11% of bandwidth; a plain read of its bytes: 18%)")
    # the H200's NVFP4 o_proj 4096x4096 (9.4 MB): the kernel 6.03 us, a plain read 3.98 us, which reaches 56%. The
    # modelled floor put the call at 47% at most and read it as latency bound; measured, the kernel's 37% is ours
    assert kernel_reading(0.37, 6.03, 2.47, 9_400_000, 4250.0) == (
        "small kernel, latency bound (floor 2.47 µs; 37% of bandwidth)")
    assert kernel_reading(0.37, 6.03, 2.47, 9_400_000, 4250.0, 3.98) == (
        "our kernel is slow here (37% of bandwidth; a plain read of its bytes: 56%)")
    # above half the bandwidth too: the H200's NVFP4 7168x18432 reaches 73%, but a plain read of its bytes takes
    # 18.76 us against the kernel's 22.46 (1.20x), so the 73% is not the hardware's ceiling
    assert kernel_reading(0.73, 22.46, 2.47, 74_300_000, 4250.0, 18.76) == (
        "our kernel is slow here (73% of bandwidth; a plain read of its bytes: 87%)")
    # within 85% of the read's speed it is the ceiling (GLM-5 24576x6144: 22.08 us against 21.33)
    assert kernel_reading(0.86, 22.08, 2.47, 85_000_000, 4250.0, 21.33) == "ceiling (86% of bandwidth)"
    # a torch backend's slow kernel is torch's, not ours
    assert kernel_reading(0.22, 7.48, 2.45, 7_000_000, 4250.0, 3.51, "torch.mm(W, x^T)") == (
        "torch's kernel is slow here (22% of bandwidth; a plain read of its bytes: 47%)")
    # an empty plain read (older results, a failed capture) falls back to the floor
    assert kernel_reading(0.35, 9.5, 2.47, 14_200_000, 4250.0, float("nan")).endswith("floor, modelled)")


def test_a_tiny_call_is_held_to_the_one_row_gemv_floor_where_that_is_slower_than_the_read():
    """0.44 MB (GLM-5's indexer wk, NVFP4 128x6144): a plain read takes 1.84 us, under the 2.45 us one-row GEMV
    floor, so the floor is what the size allows."""
    assert kernel_reading(0.04, 2.7, 2.45, 440_000, 4250.0, 1.84) == (
        "small kernel, latency bound (floor 2.45 µs; 4% of bandwidth)")
    assert kernel_reading(0.036, 2.99, 2.45, 440_000, 4250.0, 1.84) == (
        "our kernel is slow here (4% of bandwidth; 1.22× the 2.45 µs one-row GEMV floor)")


def test_gemm_m1_table_shows_the_plain_read_and_names_its_method(tmp_path):
    import json
    import shutil
    from pathlib import Path

    import pandas as pd

    from decode_gap.report.data import files_in_dir, load_bundle
    from decode_gap.report.sections.common import Builder
    from decode_gap.report.sections.microbench import gemm_sub

    tree = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "report" / "h200x2", tree)
    gemm, js = tree / "microbench" / "gemm.csv", tree / "microbench" / "gemm.json"
    sub = gemm_sub(Builder(), load_bundle(files_in_dir(tree)), 4250.0)
    assert "plain read µs" not in sub["table_m1"]["columns"] and "plain_read" not in sub  # results before it
    df = pd.read_csv(gemm)
    df.assign(plain_read_us=df["gpu_us"] * 0.8).to_csv(gemm, index=False)
    js.write_text(json.dumps({**json.loads(js.read_text()), "plain_read_method": "a streaming Triton read"}))
    sub = gemm_sub(Builder(), load_bundle(files_in_dir(tree)), 4250.0)
    cols = sub["table_m1"]["columns"]
    assert "plain read µs" in cols and sub["plain_read"] == "a streaming Triton read"
    assert {r[cols.index("× plain read")] for r in sub["table_m1"]["rows"]} == {"1.25×"}  # 1 / 0.8
    readings = [r[cols.index("reading")] for r in sub["table_m1"]["rows"]]
    # every kernel takes 1.25 times its plain read here: none is the ceiling, and the legend says why
    assert readings and all(r == "—" or "is slow here" in r for r in readings)
    assert any("a plain read of its bytes" in r for r in readings) and sub["reading_legend"].startswith("Reading:")


def test_the_floor_bound_is_the_transfer_over_transfer_plus_floor():
    from decode_gap.metrics import floor_bound_fraction

    assert floor_bound_fraction(4_250_000, 4250.0, 1.0) == 0.5  # 1 us of transfer, 1 us of floor
    assert floor_bound_fraction(4_250_000, 4250.0, 0.0) == 1.0
    assert floor_bound_fraction(None, 4250.0, 1.0) is None and floor_bound_fraction(1e6, 4250.0, None) is None


def test_gemm_clock_note_names_the_cases_under_the_power_cap():
    import pandas as pd

    from decode_gap.report.sections.microbench import clock_note

    df = pd.DataFrame({"dtype": ["bf16", "nvfp4", "nvfp4"], "clock_capped_frac": [0.0, 0.6, None],
                       "clock_capped_by": ["", "power", ""], "sm_clock_mhz": [1980, 1740, None]})
    note = clock_note(df)
    assert note.startswith("1 of 3 cases (1 nvfp4)") and "power cap" in note and "1740 MHz" in note
    assert clock_note(df.assign(clock_capped_frac=0.0)) == "" and clock_note(df.drop(columns="clock_capped_frac")) == ""


def test_gemm_m1_table_says_one_latency_floor_once_and_lets_kernel_names_wrap(tmp_path):
    """The M=1 GEMM table fits a PDF page: a latency floor the same for every row (one a run) goes into the
    caption instead of a column, and a backend's config name ("m,BN=64,...") may wrap after its commas."""
    import shutil
    from pathlib import Path

    import pandas as pd

    from decode_gap.report.data import files_in_dir, load_bundle
    from decode_gap.report.sections.common import Builder
    from decode_gap.report.sections.microbench import gemm_sub

    tree = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "report" / "h200x2", tree)
    gemm = tree / "microbench" / "gemm.csv"
    df = pd.read_csv(gemm)
    df["backend"] = "triton nvfp4 gemv m,BN=64,BK=128,w=4,ef,t=27,bx"
    df.assign(latency_floor_us=2.45).to_csv(gemm, index=False)
    sub = gemm_sub(Builder(), load_bundle(files_in_dir(tree)), 4250.0)
    assert sub["m1_floor"] == "2.45" and "latency floor µs" not in sub["table_m1"]["columns"]
    backend = sub["table_m1"]["rows"][0][sub["table_m1"]["columns"].index("backend")]
    assert backend.replace("\u200b", "") == "triton nvfp4 gemv m,BN=64,BK=128,w=4,ef,t=27,bx" and ",\u200bBN=64" in backend
    # floors that differ between rows keep their column
    df.assign(latency_floor_us=[2.45 + 0.01 * i for i in range(len(df))]).to_csv(gemm, index=False)
    sub = gemm_sub(Builder(), load_bundle(files_in_dir(tree)), 4250.0)
    assert "m1_floor" not in sub and "latency floor µs" in sub["table_m1"]["columns"]


def test_every_gemm_case_table_explains_the_forms_of_every_m(tmp_path):
    """The M=1 table's legend names the M=1 forms only; the HTML's table of every case also holds the M = 9-16 ones
    (xs, sk), so its own legend names those too."""
    import shutil
    from pathlib import Path

    import pandas as pd

    from decode_gap.report.data import files_in_dir, load_bundle
    from decode_gap.report.sections.common import Builder
    from decode_gap.report.sections.microbench import gemm_sub

    tree = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "report" / "h200x2", tree)
    gemm = tree / "microbench" / "gemm.csv"
    df = pd.read_csv(gemm)
    m1 = df["M"] == df["M"].min()
    df["backend"] = "triton nvfp4 gemv m,BN=64,BK=128,w=4,ef,t=27,bx"
    df.loc[~m1, "backend"] = "triton nvfp4 gemv m,BN=64,BK=128,w=4,ef,t=27,bx,xj,xs"
    df.to_csv(gemm, index=False)
    sub = gemm_sub(Builder(), load_bundle(files_in_dir(tree)), 4250.0)
    assert (~m1).any() and "xs:" not in sub["form_legend"] and "bx:" in sub["form_legend"]
    assert "xs: x loaded once a program" in sub["form_legend_all"] and "xj:" in sub["form_legend_all"]


def test_gemm_section_reads_the_runs_batch_size_as_well_as_m1(tmp_path):
    """A run at batch 16 decodes with M=16 GEMMs: beside the M=1 table, the section reads the sweep's M=16 rows the
    same way (reading, legend); at batch 1 there is no second table."""
    import json
    import shutil
    from pathlib import Path

    import pandas as pd

    from decode_gap.report.data import files_in_dir, load_bundle
    from decode_gap.report.sections.common import Builder
    from decode_gap.report.sections.microbench import gemm_sub

    tree = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "report" / "h200x2", tree)
    gemm = tree / "microbench" / "gemm.csv"
    df = pd.read_csv(gemm)
    df.loc[df["M"] == 16, "backend"] = "triton nvfp4 gemv m,BN=64,BK=128,w=4,ef,t=27,bx,xj,xs"
    df.to_csv(gemm, index=False)
    sub = gemm_sub(Builder(), load_bundle(files_in_dir(tree)), 4250.0)
    assert "table_batch" not in sub  # the fixture's run is at batch 1
    roofline = tree / "roofline.json"
    doc = json.loads(roofline.read_text())
    roofline.write_text(json.dumps({**doc, "batch_size": 16}))
    sub = gemm_sub(Builder(), load_bundle(files_in_dir(tree)), 4250.0)
    assert sub["m_batch"] == "16" and len(sub["table_batch"]["rows"]) == int((df["M"] == 16).sum())
    assert "reading" in sub["table_batch"]["columns"] and "xs: x loaded once" in sub["form_legend_batch"]
    roofline.write_text(json.dumps({**doc, "batch_size": 3}))  # not swept: no table rather than a wrong one
    assert "table_batch" not in gemm_sub(Builder(), load_bundle(files_in_dir(tree)), 4250.0)


def test_kernel_level_step_says_when_its_replays_ran_under_the_power_cap():
    """simulate/kernel.json `clock`: the largest capped share over the segments' graph replays, the caps, the lowest
    SM clock; the report's line under the kernel level appears from 10% of a segment's timing, never on a CPU host."""
    from decode_gap.report.sections.simulation import step_clock_note
    from decode_gap.simulate.kernel import step_clock

    segs = [{"graph_clock": {"clock_capped_frac": 0.3, "clock_capped_by": "power", "sm_clock_mhz": 1755}},
            {"graph_clock": {"clock_capped_frac": 0.02, "clock_capped_by": "thermal", "sm_clock_mhz": 1980}},
            {"graph": None}]  # a segment whose graph failed: no clock
    clock = step_clock(segs)
    assert (clock["capped_frac"], clock["capped_by"], clock["sm_clock_mhz_min"], clock["segments"]) == (
        0.3, "power+thermal", 1755, 2)
    note = step_clock_note(clock)
    assert "power and thermal cap for up to 30%" in note and "1755 MHz" in note
    assert step_clock_note({**clock, "capped_frac": 0.05}) == ""
    cpu = step_clock([{"graph": None}])  # a CPU host: nothing recorded, nothing said
    assert cpu["capped_frac"] is None and step_clock_note(cpu) == "" and step_clock_note(None) == ""


def test_gemv_config_names_are_explained_once_under_the_table():
    """The backend column names a Triton GEMV (NVFP4, FP8, grouped) by its config ("m,BN=64,...,bx,sk"): a line under the M=1 table
    says what each part that occurs means, and nothing where no such kernel ran."""
    from decode_gap.report.sections.microbench import gemv_form_legend

    legend = gemv_form_legend(["torch.mm", "triton nvfp4 gemv m,BN=64,BK=128,w=4,ef,t=27,bx,sk",
                                "triton nvfp4 gemv m,BN=32,BK=128,w=4,ef,t=27,bx,ks=2",
                                "triton nvfp4 gemv m,BN=64,BK=128,w=4,ef,t=27,bx,xj,xs,ck",
                                "triton nvfp4 gemv m,BN=128,BK=128,w=4,ef,t=14,bx,xj,tp"])
    assert "tp: two 16-row tiles a warp" in legend
    assert "m: tensor cores" in legend and "sk: stream-K" in legend and "bx: bf16" in legend
    assert "ks: K slices" in legend and "xj: x loaded in the iteration" in legend and "xs: x loaded once" in legend
    assert "ck: the K split's sums cast by a second kernel" in legend
    assert "1k:" not in legend and "a: CUDA-core" not in legend  # parts that do not occur are not explained
    assert gemv_form_legend(["torch.mm", "triton gemv (BLOCK_N=4, BLOCK_K=2048, warps=4)"]) == ""
    # FP8's block scales on x, and the grouped forms' two configs (the MoE table says the same under it)
    fp8 = gemv_form_legend(["triton fp8 gemv (128x128 block scales) BN=8,BK=1024,w=4,xb"])
    assert "xb: FP8 128x128 block scales applied to x" in fp8 and "BN: rows a program" in fp8 and "m:" not in fp8
    grouped = gemv_form_legend(["triton grouped gemv nvfp4 (gate_up m,BN=64,BK=128,w=4,s=2,ef,bx, down m,BN=64,"
                                "BK=256,w=4,ef,bx)", "torch._grouped_mm"])
    assert "m: tensor cores" in grouped and "s: K splits" in grouped and "xb" not in grouped


def test_moe_table_reads_expert_rows_against_their_plain_read(tmp_path):
    """The MoE table, as the GEMM table: an expert row with a plain read of its bytes shows it and its time over
    it; the routing pieces get no reading."""
    import shutil
    from pathlib import Path

    import pandas as pd

    from decode_gap.report.data import files_in_dir, load_bundle
    from decode_gap.report.sections.common import Builder
    from decode_gap.report.sections.microbench import moe_sub

    tree = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "report" / "h200x2", tree)
    moe = tree / "microbench" / "moe.csv"
    df = pd.read_csv(moe)
    experts = df["impl"] != "router+softmax+topk+permute"
    df = df.assign(impl=df["impl"].where(experts, "routing"), bytes=58_000_000,
                   frac_of_copy_bw=(58_000_000 / df["gpu_us"] / 1e3 / 4250.0).where(experts),
                   plain_read_us=(df["gpu_us"] / 2).where(experts))
    df.to_csv(moe, index=False)
    table = moe_sub(Builder(), load_bundle(files_in_dir(tree)), 4250.0)["table"]
    cols = table["columns"]
    by_impl = {r[cols.index("impl")]: r for r in table["rows"]}
    assert by_impl["routing"][cols.index("reading")] == "" and by_impl["routing"][cols.index("× plain read")] == "—"
    assert by_impl["loop"][cols.index("× plain read")] == "2.00×" and "plain read µs" in cols


def test_moe_names_may_wrap_after_dots_and_underscores():
    """The MoE table's name and impl columns wrap ("moe.experts", "scaled_grouped_mm"), so the reading column keeps
    a phrase a line in the PDF; a missing value is a dash."""
    from decode_gap.report.sections.microbench import _breakable_name

    assert _breakable_name("moe.experts") == "moe.\u200bexperts"
    assert _breakable_name("scaled_grouped_mm") == "scaled_\u200bgrouped_\u200bmm"
    assert _breakable_name(None) == "—" and _breakable_name(float("nan")) == "—"


def test_moe_expert_rows_are_held_to_the_floor_of_their_kernels(tmp_path):
    """An expert row with a kernel count and its floor (moe.csv latency_floor_us: kernels x the one-row GEMV floor)
    reads as latency bound where its time is within reach of that floor, and names the floor of its kernels where
    it is slow against it; the legend says how the floor is made (moe.json latency_floor)."""
    import json
    import shutil
    from pathlib import Path

    import pandas as pd

    from decode_gap.report.data import files_in_dir, load_bundle
    from decode_gap.report.sections.common import Builder
    from decode_gap.report.sections.microbench import moe_sub

    tree = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "report" / "h200x2", tree)
    moe = tree / "microbench" / "moe.csv"
    df = pd.read_csv(moe)
    df = df[df["impl"] != "router+softmax+topk+permute"].head(2).reset_index(drop=True)
    # DeepSeek-V3 TP8 at batch 1 (H200): the NVFP4 fused MoE's five kernels, and a 32-kernel per-expert loop
    df = df.assign(impl=["fused_moe", "loop"], backend=["triton fused MoE", "torch.mm per expert"],
                   gpu_us=[14.0, 113.2], bytes=[24_772_672, 86_000_000], plain_read_us=[7.1, 19.3],
                   kernels=[5, 32], latency_floor_us=[5 * 2.46, 32 * 2.46])
    df["frac_of_copy_bw"] = df["bytes"] / df["gpu_us"] / 1e3 / 4250.0
    df.to_csv(moe, index=False)
    js = tree / "microbench" / "moe.json"
    doc = json.loads(js.read_text())
    doc["latency_floor"] = {"one_row_gemv_us": {"value": 2.46, "unit": "us", "status": "measured"}}
    js.write_text(json.dumps(doc))
    sub = moe_sub(Builder(), load_bundle(files_in_dir(tree)), 4250.0)
    cols = sub["table"]["columns"]
    by_impl = {r[cols.index("impl")].replace("\u200b", ""): r[cols.index("reading")] for r in sub["table"]["rows"]}
    assert by_impl["fused_moe"].startswith("small kernel, latency bound (floor 12.3 µs")
    assert by_impl["loop"].startswith("torch's kernel is slow here") and "the 78.7 µs floor of its 32 kernels" in \
        by_impl["loop"]
    assert "An expert row's floor is its kernel launches times the one-row GEMV floor (2.46 µs a kernel)" in \
        sub["reading_legend"]


def test_a_read_faster_than_memory_says_its_bytes_came_from_cache():
    # a CPU run that left small weights in the cache: the plain read of them reached 333% of the bandwidth
    assert kernel_reading(1.96, 78.6, None, None, 30.0, 46.2, "torch.mm") == (
        "torch's kernel is slow here (196% of bandwidth; a plain read of its bytes: 333%, faster than memory: "
        "from cache)")


def test_the_cpu_nvfp4_reference_is_not_read_as_a_slow_kernel():
    assert kernel_reading(0.01, 4177.0, None, None, 30.0, 9.11, "nvfp4-reference (dequantise + torch.mm fp32)") == (
        "reference path, not a decode kernel (1% of bandwidth): no NVFP4 kernel runs on this host")
