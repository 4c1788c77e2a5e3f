"""Rendering the report: self-contained interactive HTML, a PDF with every section and its charts, robustness
to stub / malformed / hostile stage files, escaping of server-supplied text, and no secret in the output.

Stage files come from tests/fixtures/report/ (synthetic fixtures, see make_fixtures.py; not measurements).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from decode_gap.report.build import render_run
from decode_gap.report.data import files_in_dir, load_bundle
from decode_gap.report.render import environment, render
from decode_gap.report.sections import build_context

FIX = Path(__file__).resolve().parent / "fixtures" / "report"
FP = {"kernel": "6.14.11", "driver": "570.124.06", "cuda": "12.8", "torch": "2.11.0", "nccl": "2.26.2",
      "governor": "performance", "tunables": "numa_balancing=0", "server": "http://127.0.0.1:8000/v1|model="}
SECTIONS = ["Headline", "System audit", "Roofline", "Micro-benchmarks", "Gap attribution and simulation",
            "Live streaming measurement", "Since last run", "Provenance"]


def _html(stage_dir: Path, **kw) -> tuple[str, dict]:
    ctx = build_context(load_bundle(files_in_dir(stage_dir)), hw_rev="test-rev", fingerprint=FP, **kw)
    return render("report.html.j2", ctx, "html"), ctx


@pytest.fixture(scope="module")
def full():
    return _html(FIX / "h200x2")


def test_autoescape_is_on():
    env = environment()
    assert env.autoescape is True
    assert env.from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"


def test_html_has_every_section_and_interactive_charts(full):
    html, ctx = full
    for title in SECTIONS:
        assert title in html, title
    assert "not measured" not in html.split('id="since"')[0]  # every stage of the fixture is there
    specs = re.findall(r'<script type="application/json" id="(chart-\d+)-spec">(.*?)</script>', html, re.S)
    assert len(specs) == len(ctx["charts"]) >= 12
    for _, body in specs:
        spec = json.loads(body)
        assert "vega-lite" in spec["$schema"] and ("data" in spec or "datasets" in spec)
    # the runtime is inlined: offline, no CDN, no external script
    assert "vegaEmbed" in html and "window.vegaEmbed" in html
    assert not re.search(r'<script[^>]+src=', html)
    assert "cdn.jsdelivr" not in html and "unpkg.com" not in html
    for needle in ("waterfall", "per token", "per chunk", "busbw", "loop", "grouped", "eager"):
        assert needle in html


def test_headline_and_levers_rendered(full):
    html, ctx = full
    h = ctx["headline"]
    assert h["figs"]["roofline_ms"].ok and h["figs"]["live_itl_ms"].ok
    assert len(h["levers"]) == 3 and h["levers"][0]["name"] == "static KV cache + torch.compile"
    assert "Top levers" in html and "static KV cache + torch.compile" in html
    # provenance labels on figures
    assert 'class="fig fig-measured"' in html and 'class="fig fig-modelled"' in html
    assert ctx["provenance"]["counts"]["measured"] > 0 and ctx["provenance"]["counts"]["modelled"] > 0


def test_stub_stages_say_not_measured():
    html, ctx = _html(FIX / "stubbed")
    for s in ctx["sections"]:
        assert not s["ok"], s["id"]
    assert html.count("not measured:</strong> not implemented yet") >= 5
    assert ctx["provenance"]["counts"]["measured"] == 0


def test_missing_directory_renders(tmp_path):
    html, ctx = _html(tmp_path)  # no stage file at all
    assert "audit.json was not produced" in html and "roofline.json was not produced" in html


def test_malformed_and_odd_stage_files_do_not_crash(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(FIX / "h200x2", d)
    (d / "audit.json").write_text("{truncated")
    (d / "gap.json").write_text(json.dumps({"status": "ok", "waterfall": "not a list", "levers": [1, None, "x"],
                                            "live_itl_ms": "fast"}))
    (d / "simulate.json").write_text(json.dumps({"status": "ok", "kernel": {"components": [{"ms": "?"}, 5]},
                                                 "engine": None}))
    (d / "live" / "summary.json").write_text(json.dumps({"status": "ok", "levels": [{"concurrency": "1"}, "junk"]}))
    (d / "microbench" / "gemm.csv").write_text("name,dtype\nx,bf16\n")
    (d / "microbench" / "allreduce.csv").write_text("foo,bar\n1,2\n")
    (d / "live" / "chunks.parquet").write_bytes(b"garbage")
    html, ctx = _html(d)
    assert "audit.json is not valid JSON" in html
    assert ctx["audit"]["ok"] is False
    assert "lacks size/time_us columns" in html
    assert ctx["live"]["ok"]  # a level without statistics still renders a row
    assert "live/chunks.parquet cannot be read" in html


def test_kernel_level_notes_say_which_kernels_ran(tmp_path):
    """The kernel level's notes (e.g. which fp8 kernel each linear shape kept) appear under its component table;
    a notes field that is not a list is left out."""
    d = tmp_path / "run"
    shutil.copytree(FIX / "h200x2", d)
    sim = json.loads((d / "simulate.json").read_text())
    line = "fp8 linears: lowprec.DenseGemv on 3 of 4 shapes, torch._scaled_mm on 1 of 4 shapes"
    sim["kernel"]["notes"] = [line]
    (d / "simulate.json").write_text(json.dumps(sim))
    html, ctx = _html(d)
    assert ctx["simulation"]["kernel_notes"] == [line] and line in html
    sim["kernel"]["notes"] = "not a list"
    (d / "simulate.json").write_text(json.dumps(sim))
    assert _html(d)[1]["simulation"]["kernel_notes"] == []


def test_server_text_is_escaped(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(FIX / "h200x2", d)
    summary = json.loads((d / "live" / "summary.json").read_text())
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    summary["server"] = {"engine": evil, "headers": {"server": evil}}
    summary["errors"] = [{"reason": evil, "count": 2}]
    (d / "live" / "summary.json").write_text(json.dumps(summary))
    audit = json.loads((d / "audit.json").read_text())
    audit["findings"][0]["evidence"] = evil
    (d / "audit.json").write_text(json.dumps(audit))
    html, _ = _html(d)
    assert evil not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(" in html


def test_no_secret_in_html(tmp_path, monkeypatch):
    d = tmp_path / "run"
    shutil.copytree(FIX / "h200x2", d)
    secret = "sk-test-SECRET-value-0123456789"
    monkeypatch.setenv("MY_SERVER_KEY_ENV", secret)
    summary = json.loads((d / "live" / "summary.json").read_text())
    summary["server"]["echo"] = f"Bearer {secret}"
    (d / "live" / "summary.json").write_text(json.dumps(summary))
    ctx = build_context(load_bundle(files_in_dir(d)), hw_rev="test-rev", fingerprint=FP,
                        run_config={"endpoint": "http://u:pass@127.0.0.1:8000/v1", "api_key_env": "MY_SERVER_KEY_ENV"})
    html = render("report.html.j2", ctx, "html", extra_secret_names=["MY_SERVER_KEY_ENV"])
    assert secret not in html and "[redacted]" in html
    assert "u:pass@" not in html


def test_render_run_writes_html_and_pdf_with_sections_and_charts(tmp_path):
    pypdf = pytest.importorskip("pypdf")
    out = tmp_path / "results" / "test-rev"
    render_run(files_in_dir(FIX / "h200x2"), out / "report.html", out / "report.pdf", hw_rev="test-rev",
               fingerprint=FP, config={"model": "config/models/qwen3-30b-a3b.json", "tp": 2, "hardware": "h200"},
               archive_dir=tmp_path / "archive")
    html = (out / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "vegaEmbed" in html
    reader = pypdf.PdfReader(str(out / "report.pdf"))
    assert len(reader.pages) >= 6
    text = "\n".join(p.extract_text() or "" for p in reader.pages)
    for title in SECTIONS:
        assert title.lower() in re.sub(r"\s+", " ", text).lower(), title
    # charts are embedded as vector drawings (SVG from vl-convert): their axis titles are PDF text
    for axis in ("ms per token", "achieved GB/s", "busbw (GB/s)", "inter-token latency (ms)", "M (tokens)"):
        assert axis in text, axis
    assert "first archived run" in text
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporary file


def test_real_cpu_capture_renders(tmp_path):
    """cpu-real/ is a capture of a real small run on the CPU-only CI host: the stages' actual output format."""
    html, ctx = _html(FIX / "cpu-real", datasheet={"name": "CPU (measured)"})
    assert "gemma-3-270m" in ctx["subtitle"] and "{" not in ctx["subtitle"]
    for key in ("audit", "roofline", "microbench", "simulation", "live"):
        assert ctx[key]["ok"], key
    assert ctx["headline"]["figs"]["live_itl_ms"].ok
    assert ctx["live"]["client_overhead"].ok  # a {median, p99, ...} dict in the real summary
    assert ctx["live"].get("hist_chart", {}).get("spec") and ctx["live"].get("timeline_chart", {}).get("spec")
    subs = {s["title"]: s for s in ctx["microbench"]["subs"]}
    assert subs["All-reduce"]["ok"] and subs["All-reduce"]["chart"].get("spec")
    assert "no graph time" in subs["Eager against CUDA graph"]["chart"]["why"]  # CPU: CUDA graphs need a GPU
    assert not subs["MoE: routing, per-expert loop against grouped GEMM"]["ok"]  # Gemma has no MoE layers
    assert len(ctx["charts"]) >= 8 and "Appendix: audit details" in html


def test_datasheet_comes_from_roofline_json_never_from_this_host(monkeypatch):
    """A report rendered on another host is the same report: no `hardware: auto` resolution while rendering."""
    from decode_gap import hardware
    from decode_gap.report.build import datasheet

    def probe(*a, **k):  # pragma: no cover - failing is the point
        raise AssertionError("the report probed the host")

    monkeypatch.setattr(hardware, "resolve_hardware", probe)
    real = datasheet(load_bundle(files_in_dir(FIX / "cpu-real")))
    assert real == {"name": "CPU (measured)", "memory_bandwidth_gbps": None, "peak_tflops": {}}
    assert datasheet(load_bundle({})) == {}


def _svg_width(spec: dict) -> float:
    from decode_gap.report.render import chart_svg

    return float(re.search(r'<svg[^>]*width="([0-9.]+)"', chart_svg(spec)).group(1))


# A4 less 18 mm margins is 657 px at 96 dpi; the widest chart of the fixture (the trace's step) is 688
PAGE_PX = 700


def test_every_chart_fits_the_page(full):
    _, ctx = full
    specs = [(chart["title"], chart["spec"]) for chart in ctx["charts"] if chart.get("spec")]
    assert len(specs) >= 12
    for title, spec in specs:
        assert _svg_width(spec) <= PAGE_PX, title


def test_a_legend_of_many_entries_wraps_instead_of_widening_the_chart():
    """Ten MoE implementations in one legend row made the chart 1241 px wide: cut off in the HTML figure, shrunk to
    half size on the PDF page."""
    import pandas as pd

    from decode_gap.report import charts as ch

    impls = ["fused_moe fp8", "fused_moe fp8-block", "fused_moe nvfp4", "grouped_gemv bf16", "grouped_gemv fp8",
             "grouped_gemv fp8-block", "grouped_gemv nvfp4", "grouped_mm bf16", "loop bf16", "scaled_grouped_mm fp8"]
    df = pd.DataFrame([{"M": m, "time_us": 10.0 * (i + 1) * m, "impl": s} for i, s in enumerate(impls) for m in (1, 8)])
    assert _svg_width(ch.to_spec(ch.moe_loop_vs_grouped(df))) <= PAGE_PX
    legend = ch.wrapped_legend(["a", "b"])
    assert legend.columns == 2 and legend.orient == "top"
    long = ["x" * 200] * 3  # labels past the limit, which cuts them at 260 px
    assert ch.wrapped_legend(long).columns == 2 and ch.wrapped_legend(long, 400).columns == 1


def test_a_chart_taller_than_a_page_keeps_its_title_on_its_page(tmp_path):
    """A facet grid of 17 shapes was taller than an A4 page: its title stood alone on one page, the chart on the
    next. The PDF caps a chart's height so that it fits beside its title."""
    pypdf = pytest.importorskip("pypdf")
    from decode_gap.report.pdf import write_pdf

    ctx = build_context(load_bundle(files_in_dir(FIX / "h200x2")), hw_rev="test-rev", fingerprint=FP)
    chart = next(c for c in ctx["charts"] if c.get("spec") and c.get("title"))
    chart["spec"] = {**chart["spec"], "height": 1600}  # about 420 mm at 96 dpi
    pdf = tmp_path / "tall.pdf"
    write_pdf(render("report.html.j2", ctx, "pdf"), pdf)
    pages = [re.sub(r"\s+", " ", p.extract_text() or "") for p in pypdf.PdfReader(str(pdf)).pages]
    title = re.sub(r"\s+", " ", chart["title"])
    holding = [i for i, text in enumerate(pages) if title in text]
    assert holding, title
    # the title's page holds more than the title and the running footer: the chart's own axis labels
    alone = re.sub(r"decode-gap · test-rev|page \d+ of \d+", "", pages[holding[0]]).replace(title, "").strip()
    assert len(alone) > 40, pages[holding[0]]
