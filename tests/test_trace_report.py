"""The trace section of the report: timeline chart, categories beside the kernel level, top kernels, rank skew."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from decode_gap.io import write_json
from decode_gap.report.data import files_in_dir, load_bundle
from decode_gap.report.render import render
from decode_gap.report.sections import build_context
from decode_gap.trace.analyze import analyze_path, stage_result

FIX = Path(__file__).resolve().parent / "fixtures"
FP = {"kernel": "6.14", "driver": "570", "cuda": "12.8", "torch": "2.11", "nccl": "2.26", "governor": "performance",
      "tunables": "", "server": ""}


def _render(stage_dir: Path) -> tuple[str, dict]:
    ctx = build_context(load_bundle(files_in_dir(stage_dir)), hw_rev="test-rev", fingerprint=FP)
    return render("report.html.j2", ctx, "html"), ctx


def _section(html: str) -> str:
    return html.split('<section id="trace"')[1].split("</section>")[0]


def test_trace_section_with_two_ranks_and_kernel_level():
    html, ctx = _render(FIX / "report" / "h200x2")
    sec = _section(html)
    assert "Decode step from the profiler trace" in sec and "not measured" not in sec
    chart = next(c for c in ctx["charts"] if c["title"].startswith("One decode step"))
    spec = json.loads(re.search(rf'id="{chart["id"]}-spec">(.*?)</script>', html, re.S).group(1))
    assert spec["mark"]["type"] == "bar" and spec["encoding"]["x2"]["field"] == "end_us"
    # categories beside the kernel level's components (simulate.json of the fixture)
    assert "GEMM (all dtypes)" in sec and "attention projections" in sec and "×" in sec
    assert "Top kernels" in sec and "nvjet_tst" in sec
    assert "(slowest)" in sec and "skew" in sec
    assert ctx["trace"]["ok"]


def test_cpu_trace_renders_partial_with_reason(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(FIX / "report" / "h200x2", d)
    res, _ = analyze_path(FIX / "trace" / "cpu_eager_decode_step.json.gz")
    write_json(d / "trace.json", res)
    sec = _section(_render(d)[0])
    assert "no GPU events" in sec and "aten::scaled_dot_product_attention" in sec


def test_unavailable_trace_says_why(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(FIX / "report" / "h200x2", d)
    res, _ = stage_result(str(tmp_path / "missing.json.gz"))
    write_json(d / "trace.json", res)
    sec = _section(_render(d)[0])
    assert "not measured" in sec and "does not exist" in sec


def test_traced_against_unprofiled_step(tmp_path):
    # the H200 graph trace with the same process's unprofiled reference: raw and corrected ratios, measured
    # profiler costs and the basis (tests/test_trace_profiler_overhead.py builds the block)
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import test_trace_profiler_overhead as ovh

    d = tmp_path / "run"
    shutil.copytree(FIX / "report" / "h200x2", d)
    src = ovh._with_engine(ovh.OVH / "h200_llama1b_graph_cudaonly.json.gz", tmp_path / "g.json.gz",
                           ovh._graph_engine())
    res, _ = stage_result(str(src), "engine-level")
    write_json(d / "trace.json", res)
    sec = _section(_render(d)[0])
    po = res["profiler_overhead"]
    assert f"= {po['ratio_raw']:.3f} as traced" in sec and "(outside 5%)" in sec
    assert f"{po['ratio_corrected']:.3f} corrected" in sec and "(within 5%)" in sec
    assert "profiler&#39;s host-side cost" in sec or "profiler's host-side cost" in sec
    assert "fig-modelled" in sec and "µs per kernel" in sec and "cudaGraphLaunch call" in sec


def test_trace_without_reference_says_the_comparison_is_unavailable():
    sec = _section(_render(FIX / "report" / "h200x2")[0])
    assert "Traced against unprofiled step: unavailable" in sec
